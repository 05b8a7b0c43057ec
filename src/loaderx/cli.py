"""The ``loaderx`` command (also ``python -m loaderx``): look into, check,
compact, convert and benchmark stores from a shell.

    loaderx info PATH                  what a store, dataset or ArrayStore holds
    loaderx verify PATH                checks every record's checksum
    loaderx compact PATH               reclaims deleted and replaced records' bytes
    loaderx convert SRC.npy DST        a .npy file into a dense dataset
    loaderx convert 'SRC*.parquet' DST Parquet files into a column directory

PATH may also be a sharded dataset (a directory with ``manifest.msgpack``:
every shard, records named by their global index) or a column directory
written by ``loaderx.arrow.from_arrow`` (``columns.msgpack``: every column).
    loaderx bench                      quick figures for this machine
    loaderx doctor PATH                which stage bounds the DataLoader on PATH, and what to change

Output is for people; ``--json`` prints one JSON object for scripts instead,
an error included (``{"ok": false, "error": ..., "error_type": ...,
"exit_status": 2}``). Global options (``--json``) go before or after the
command alike. Exit status: 0 done, 1 ``verify`` found damage, 2 an error
(bad arguments, a path that is not a store, a store another process is
writing); a reader that closes the pipe early (``| head``) ends the command
quietly with 141, as SIGPIPE would.

Built on the standard library's ``argparse``: the command needs nothing the
library does not already depend on.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import json
import os
import platform
import re
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any, Callable, NoReturn

import numpy as np

from . import __version__
from ._arrayview import LazyArray, reading_store
from ._fs import OS_FS, DirectorySwap, OsFs
from ._remote_dataset import RemoteStore, is_remote
from .arraystore import MARKER_FILE, ArrayStore
from .arrow import COLUMNS_FILE, from_arrow, open_columns, read_listing
from .converter import from_numpy
from .dataloader import DataLoader, LoaderError
from .dataset import DenseDataset, RaggedDataset, read_schema
from .doctor import SECONDS_MAX, diagnose, doctor_text
from .sampler import Sampler
from .shards import MANIFEST_FILE, is_sharded, read_manifest, written_shards
from .zrecord import CODECS, CorruptStoreError, StoreLockedError, Zrecord, ZrecordError, is_store

__all__ = ["main"]

EXIT_OK = 0
EXIT_DAMAGED = 1
EXIT_ERROR = 2
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE  # what a shell reports for a command SIGPIPE ended
#: bench keeps its 12 KiB records in memory and writes two stores of them:
#: 2**18 records are 3 GiB of memory and 6 GiB of disk, past what a quick
#: figure needs (scripts/bench.py measures larger sets).
_BENCH_RECORDS_MAX = 1 << 18
_JSON_HELP = "print one JSON object instead of text (errors too)"
_LENGTHS_CHUNK = 1 << 20  # records per lengths() call when summing raw bytes
_DAMAGED_SHOWN = 50  # damaged indices printed by name; --json lists them all


class CommandError(Exception):
    """A failure the command reports in one line (exit status 2)."""


class _UsageError(Exception):
    """Bad arguments: raised by the parser instead of exiting, so that an
    error under ``--json`` is a JSON object too."""

    def __init__(self, parser: argparse.ArgumentParser, message: str) -> None:
        super().__init__(message)
        self.parser = parser


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _UsageError(self, message)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    as_json = "--json" in argv[: argv.index("--")] if "--" in argv else "--json" in argv
    try:
        try:
            args = _parser().parse_args(argv)
        except _UsageError as exc:
            if not as_json:
                exc.parser.print_usage(sys.stderr)
            return _fail(str(exc), as_json, "UsageError")
        if args.command is None:
            _parser().print_help(sys.stderr)
            return _fail(
                "give a command: info, verify, compact, convert, bench or doctor",
                as_json,
                "UsageError",
            )
        return _run(args)
    except BrokenPipeError:
        # The reader went away (`loaderx bench --json | head`): nothing more
        # to say to it. Point stdout at /dev/null so the interpreter's final
        # flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


def _run(args: argparse.Namespace) -> int:
    try:
        status: int = args.run(args)  # the subcommand's exit status
        return status
    except BrokenPipeError:
        raise
    except StoreLockedError as exc:
        advice = (
            ""
            if "another process" in str(exc)
            else " (another process is writing to this store: retry when it is done)"
        )
        return _fail(f"{exc}{advice}", args.json, type(exc).__name__)
    except (CommandError, ZrecordError, ValueError, OSError) as exc:
        return _fail(str(exc), args.json, type(exc).__name__)
    except KeyboardInterrupt:
        return _fail("interrupted", args.json, "KeyboardInterrupt")


def _fail(message: str, as_json: bool = False, kind: str = "CommandError") -> int:
    """Reports an error: one line on stderr, and under ``--json`` one JSON
    object on stdout, for scripts that read only that."""
    print(f"loaderx: error: {message}", file=sys.stderr)
    if as_json:
        print(
            json.dumps(
                {"ok": False, "error": message, "error_type": kind, "exit_status": EXIT_ERROR},
                indent=2,
            )
        )
        sys.stdout.flush()
    return EXIT_ERROR


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="loaderx",
        description="Inspect, verify, compact, convert, benchmark and diagnose loaderx stores.",
        epilog="Exit status: 0 done, 1 verify found damage, 2 error, 141 the reader closed the "
        "pipe. --json goes before or after the command.",
    )
    parser.add_argument("--version", action="version", version=f"loaderx {__version__}")
    parser.add_argument("--json", action="store_true", help=_JSON_HELP)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    common = _Parser(add_help=False)
    # SUPPRESS: a --json before the command is not reset by the command's own default.
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=_JSON_HELP)

    info = commands.add_parser(
        "info", parents=[common], help="what a store, dataset or ArrayStore holds"
    )
    info.add_argument("path", metavar="PATH")
    _add_cache_options(info)
    info.set_defaults(run=_run_info)
    verify = commands.add_parser(
        "verify", parents=[common], help="check every record's checksum (exit 1 on damage)"
    )
    verify.add_argument("path", metavar="PATH")
    _add_cache_options(verify)
    verify.set_defaults(run=_run_verify)
    compact = commands.add_parser(
        "compact", parents=[common], help="reclaim the bytes of deleted and replaced records"
    )
    compact.add_argument("path", metavar="PATH")
    compact.set_defaults(run=_run_compact)
    _add_convert(commands, common)
    bench = commands.add_parser(
        "bench", parents=[common], help="quick sampler, store and loader figures for this machine"
    )
    bench.add_argument(
        "--records", type=int, default=4000, help="12 KiB records in the store test (default 4000)"
    )
    bench.add_argument(
        "--dir",
        default=None,
        help="where to write the test stores (default: a temporary directory)",
    )
    bench.set_defaults(run=_run_bench)
    _add_doctor(commands, common)
    return parser


def _add_doctor(commands: Any, common: argparse.ArgumentParser) -> None:
    """The ``doctor`` command and its options."""
    doctor = commands.add_parser(
        "doctor",
        parents=[common],
        help="run the DataLoader on a dataset for a few seconds: which stage bounds it",
    )
    doctor.add_argument("path", metavar="DATASET", help="a dense or ragged dataset (or sharded)")
    doctor.add_argument("--batch-size", type=int, default=256, help="default 256")
    doctor.add_argument("--workers", type=int, default=4, help="num_workers (default 4)")
    doctor.add_argument("--seconds", type=float, default=3.0, help="run time (default 3)")
    doctor.add_argument(
        "--mode",
        choices=["sequential", "iid", "cyclic", "block"],
        default="iid",
        help="default iid",
    )
    doctor.add_argument(
        "--transform",
        default=None,
        metavar="MODULE:FUNCTION",
        help="the transform to time (importable from the current directory or PYTHONPATH)",
    )
    doctor.add_argument(
        "--transform-processes", action="store_true", help="run it with transform_processes=True"
    )
    doctor.add_argument(
        "--cold",
        action="store_true",
        help="drop the dataset's pages from the page cache before each batch (data larger "
        "than RAM)",
    )
    doctor.set_defaults(run=_run_doctor)


def _add_cache_options(command: argparse.ArgumentParser) -> None:
    """PATH may be a URL (s3://, gs://, az://, http(s)://, file://): its cache."""
    command.add_argument(
        "--cache-dir",
        default=None,
        help="for a URL: the cache directory (default: $LOADERX_CACHE_DIR, else "
        "$XDG_CACHE_HOME/loaderx, else ~/.cache/loaderx)",
    )
    command.add_argument(
        "--cache-bytes",
        type=int,
        default=None,
        help="for a URL: the cache's byte budget (default: the dataset plus one shard, at most "
        "a quarter of the free space); verify fetches one shard at a time",
    )


def _add_convert(commands: Any, common: argparse.ArgumentParser) -> None:
    """The ``convert`` command and its options."""
    convert = commands.add_parser(
        "convert",
        parents=[common],
        help="convert a .npy file into a dense dataset, or Parquet files into a column directory",
    )
    convert.add_argument(
        "source",
        metavar="SRC",
        help="a .npy file, or a .parquet file, a directory of them or a quoted glob "
        "('dir/*.parquet')",
    )
    convert.add_argument("target", metavar="DST")
    convert.add_argument(
        "--codec",
        choices=["auto", "auto-speed", *sorted(CODECS)],
        default="auto",
        help="record codec (default auto: .npy picks zstd or the byte-shuffled zstd_shuffleN, "
        "Parquet zstd; auto-speed: lz4 or lz4_shuffleN, faster to decode, larger)",
    )
    convert.add_argument(
        "--mode",
        choices=["w", "a", "x"],
        default="w",
        help="an existing DST: w replaces it (default), a appends (.npy only), x refuses",
    )
    convert.add_argument(
        "--columns",
        default=None,
        help="Parquet only: the columns to convert, comma separated (default: all)",
    )
    convert.add_argument(
        "--progress",
        action="store_true",
        help="show the progress bar on stderr even when it is not a terminal",
    )
    convert.set_defaults(run=_run_convert)


def _emit(
    args: argparse.Namespace, result: dict[str, Any], text: Callable[[dict[str, Any]], str]
) -> None:
    print(json.dumps(result, indent=2) if args.json else text(result))
    sys.stdout.flush()  # a closed pipe raises here, inside main, not at the interpreter's exit


def _plural(count: int, noun: str) -> str:
    """``1 array``, ``2 arrays``, ``1,000 records``."""
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


# ---- what a path is ------------------------------------------------------------


def _kind(path: str) -> str:
    """``arraystore``, ``sharded``, ``columns``, ``dense``, ``ragged`` or
    ``zrecord`` (a bare record store)."""
    if not os.path.exists(path):
        raise CommandError(f"'{path}' does not exist")
    if not os.path.isdir(path):
        raise CommandError(
            f"'{path}' is a file: a store is a directory (convert a .npy file with `loaderx "
            "convert`)"
        )
    if os.path.exists(os.path.join(path, MARKER_FILE)):
        return "arraystore"
    if is_sharded(path):
        return "sharded"
    if os.path.exists(os.path.join(path, COLUMNS_FILE)):
        return "columns"
    if written_shards(path) and not is_store(path):
        raise CommandError(
            f"'{path}' holds shards but no {MANIFEST_FILE}: an unfinished sharded conversion; "
            "finish it and run loaderx.shards.commit"
        )
    schema = read_schema(path)  # a dataset that lost its superblock is still one, a damaged one
    if schema is None and not is_store(path):
        raise CommandError(
            f"'{path}' is not a loaderx store, dataset or ArrayStore (it has no superblock or "
            f"{MARKER_FILE})"
        )
    return "zrecord" if schema is None else schema.kind


def _disk_bytes(path: str) -> int:
    """Allocated bytes of every file under ``path`` (what the store costs on disk)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except FileNotFoundError:
                pass  # removed while we walked: a writer compacting
    return total


def _raw_bytes(store: Zrecord, item_bytes: int | None) -> int:
    """Decoded bytes of every record: records x item bytes when they are all one
    size, else the sum of their lengths, a chunk of the index at a time."""
    count = len(store)
    if item_bytes is not None:
        return count * item_bytes
    total = 0
    for start in range(0, count, _LENGTHS_CHUNK):
        total += int(
            store.lengths(
                np.arange(start, min(count, start + _LENGTHS_CHUNK), dtype=np.uint64)
            ).sum()
        )
    return total


def _store_info(path: str, kind: str) -> dict[str, Any]:
    schema = read_schema(path) if kind != "zrecord" else None
    with Zrecord(path) as store:
        stats = store.stats()
        dictionary = store.has_dict()
        raw = _raw_bytes(
            store, schema.item_bytes if schema is not None and kind == "dense" else None
        )
    disk = _disk_bytes(path)
    info: dict[str, Any] = {"path": path, "kind": kind}
    if schema is not None:
        info.update(dtype=str(schema.dtype), item_shape=list(schema.item_shape), codec=schema.codec)
        if kind == "dense":
            info["shape"] = [stats["records"], *schema.item_shape]
    info.update(
        records=stats["records"],
        raw_bytes=raw,
        disk_bytes=disk,
        ratio=round(raw / disk, 4) if disk else None,
        layout=stats["layout"],
        generation=stats["generation"],
        reclaimable_bytes=stats["reclaimable"],
        dictionary=dictionary,
    )
    return info


def _arraystore_info(path: str) -> dict[str, Any]:
    with ArrayStore(path) as store:
        shapes = store.get_shape()
    arrays = []
    for name, shape in shapes.items():
        entry = _store_info(os.path.join(path, name), "dense")
        entry.update(name=name, shape=list(shape))
        arrays.append(entry)
    disk = _disk_bytes(path)
    raw = sum(entry["raw_bytes"] for entry in arrays)
    return {
        "path": path,
        "kind": "arraystore",
        "arrays": arrays,
        "raw_bytes": raw,
        "disk_bytes": disk,
        "ratio": round(raw / disk, 4) if disk else None,
    }


def _dataset_class(kind: str) -> type:
    return DenseDataset if kind == "dense" else RaggedDataset


def _sharded_info(path: str) -> dict[str, Any]:
    """The dataset the shards make: opening it checks the manifest against every shard."""
    schema = read_manifest(path).schema
    with _dataset_class(schema.kind)(path) as dataset:
        store = dataset.store
        stats = store.stats()
        dictionary = any(shard.has_dict() for shard in store.shards)
        raw = _raw_bytes(store, schema.item_bytes if schema.kind == "dense" else None)
    disk = _disk_bytes(path)
    info: dict[str, Any] = {
        "path": path,
        "kind": schema.kind,
        "sharded": True,
        "shards": stats["shards"],
        "dtype": str(schema.dtype),
        "item_shape": list(schema.item_shape),
        "codec": schema.codec,
    }
    if schema.kind == "dense":
        info["shape"] = [stats["records"], *schema.item_shape]
    info.update(
        records=stats["records"],
        raw_bytes=raw,
        disk_bytes=disk,
        ratio=round(raw / disk, 4) if disk else None,
        layout=stats["layout"],
        reclaimable_bytes=stats["reclaimable"],
        dictionary=dictionary,
    )
    return info


def _columns_info(path: str) -> dict[str, Any]:
    """Every column store of a ``from_arrow`` directory; opening them checks the listing."""
    opened = open_columns(path)
    kinds = {name: dataset.schema.kind for name, dataset in opened.items()}
    rows = len(next(iter(opened.values())))
    for dataset in opened.values():
        dataset.close()
    columns = [
        dict(_store_info(os.path.join(path, name), kind), name=name) for name, kind in kinds.items()
    ]
    disk = _disk_bytes(path)
    raw = sum(entry["raw_bytes"] for entry in columns)
    return {
        "path": path,
        "kind": "columns",
        "records": rows,
        "columns": columns,
        "raw_bytes": raw,
        "disk_bytes": disk,
        "ratio": round(raw / disk, 4) if disk else None,
    }


_INFO = {"arraystore": _arraystore_info, "sharded": _sharded_info, "columns": _columns_info}


# ---- info ------------------------------------------------------------------------


def _open_remote(args: argparse.Namespace) -> RemoteStore:
    if args.cache_bytes is not None and args.cache_bytes < 1:
        raise CommandError(f"--cache-bytes must be positive, got {args.cache_bytes}")
    return RemoteStore(args.path, "", cache_dir=args.cache_dir, cache_bytes=args.cache_bytes)


def _remote_info(args: argparse.Namespace) -> dict[str, Any]:
    """What the manifest (or the store) of a URL says; shards are not fetched."""
    with contextlib.closing(_open_remote(args)) as store:
        stats, schema = store.stats(), store.schema
    info: dict[str, Any] = {
        "path": args.path,
        "kind": schema.kind,
        "sharded": store.manifest is not None,
        "shards": stats["shards"],
        "dtype": str(schema.dtype),
        "item_shape": list(schema.item_shape),
        "codec": schema.codec,
        "records": stats["records"],
        "remote_bytes": stats["dataset_bytes"],
        "cache_dir": stats["cache_dir"],
        "cache_bytes": stats["cache_bytes"],
    }
    if schema.kind == "dense":
        info["shape"] = [stats["records"], *schema.item_shape]
    return info


def _remote_info_text(info: dict[str, Any]) -> str:
    rows = [
        ("kind", info["kind"]),
        ("shards", f"{info['shards']:,}" if info["sharded"] else "none (one store)"),
        ("dtype", info["dtype"]),
        ("item shape", str(tuple(info["item_shape"]))),
        ("codec", info["codec"]),
        ("records", f"{info['records']:,}"),
        ("in storage", _size(info["remote_bytes"])),
        ("cache", f"{info['cache_dir']} (budget {_size(info['cache_bytes'])})"),
    ]
    return f"{info['path']}: loaderx {info['kind']} dataset in object storage\n" + "\n".join(
        f"  {key:<12} {value}" for key, value in rows
    )


def _remote_verify(args: argparse.Namespace) -> dict[str, Any]:
    """Every shard of a URL fetched through the cache one at a time (within the
    budget) and checked; damaged records by global index, as for local shards."""
    with contextlib.closing(_open_remote(args)) as store:
        names = store.manifest.names if store.manifest is not None else ("",)
        entries: list[dict[str, Any]] = []
        for number, name in enumerate(names):
            where = f"{store.path}/{name}".rstrip("/")
            first = int(store.shard_start(number))
            try:
                damaged = store.verify_shard(number)
                entry: dict[str, Any] = {
                    "path": where,
                    "records": store.shard_rows(number),
                    "damaged": damaged,
                    "error": None,
                }
            except (ZrecordError, ValueError, OSError) as exc:
                entry = _unreadable(where, exc)
            entry["first_record"] = first
            entries.append(entry)
    ok = all(not entry["damaged"] and entry["error"] is None for entry in entries)
    result: dict[str, Any] = {"path": args.path, "ok": ok, "stores": entries}
    result["damaged"] = [index for entry in entries for index in entry["damaged"]]
    return result


def _run_info(args: argparse.Namespace) -> int:
    if is_remote(args.path):
        _emit(args, _remote_info(args), _remote_info_text)
        return EXIT_OK
    _refuse_cache_options(args)
    kind = _kind(args.path)
    info = _INFO[kind](args.path) if kind in _INFO else _store_info(args.path, kind)
    _emit(args, info, _info_text)
    return EXIT_OK


def _size(count: int | None) -> str:
    if count is None:
        return "-"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= scale:
            return f"{count / scale:,.1f} {unit}"
    return f"{count} B"


def _ratio(info: dict[str, Any]) -> str:
    return f"{info['ratio']:.2f}x" if info.get("ratio") else "-"


def _info_text(info: dict[str, Any]) -> str:
    if info["kind"] == "arraystore":
        lines = [
            f"{info['path']}: ArrayStore, {_plural(len(info['arrays']), 'array')}, "
            f"{_size(info['disk_bytes'])} on disk "
            f"({_ratio(info)})"
        ]
        for entry in info["arrays"]:
            lines.append(
                f"  {entry['name']}: {entry['dtype']} {tuple(entry['shape'])}, codec "
                f"{entry['codec']}, "
                f"{_size(entry['disk_bytes'])} on disk ({_ratio(entry)}), {entry['layout']} "
                "layout, "
                f"generation {entry['generation']}"
            )
        return "\n".join(lines)
    if info["kind"] == "columns":
        return _columns_text(info)
    title = {
        "dense": "loaderx dense dataset",
        "ragged": "loaderx ragged dataset",
        "zrecord": "zrecord store (no schema)",
    }
    rows = [("kind", info["kind"])]
    if info.get("sharded"):
        title = {kind: f"{name}, sharded" for kind, name in title.items()}
        rows.append(("shards", f"{info['shards']:,}"))
    if "dtype" in info:
        rows += [("dtype", info["dtype"]), ("item shape", str(tuple(info["item_shape"])))]
        if "shape" in info:
            rows.append(("shape", str(tuple(info["shape"]))))
        rows.append(("codec", info["codec"] + (" (with dictionary)" if info["dictionary"] else "")))
    rows += [
        ("records", f"{info['records']:,}"),
        ("raw bytes", _size(info["raw_bytes"])),
        ("on disk", f"{_size(info['disk_bytes'])} (compression ratio {_ratio(info)})"),
        ("layout", info["layout"]),
    ]
    if "generation" in info:  # a sharded dataset has one per shard
        rows.append(("generation", str(info["generation"])))
    rows.append(
        (
            "reclaimable",
            f"{_size(info['reclaimable_bytes'])} (loaderx compact)"
            if info["reclaimable_bytes"]
            else "0 B",
        )
    )
    return f"{info['path']}: {title[info['kind']]}\n" + "\n".join(
        f"  {key:<12} {value}" for key, value in rows
    )


def _columns_text(info: dict[str, Any]) -> str:
    lines = [
        f"{info['path']}: loaderx column directory, {_plural(len(info['columns']), 'column')} of "
        f"{_plural(info['records'], 'record')}, "
        f"{_size(info['disk_bytes'])} on disk ({_ratio(info)})"
    ]
    for entry in info["columns"]:
        if "shape" in entry:
            shape = f"{entry['dtype']} {tuple(entry['shape'])}"
        else:
            shape = f"ragged, records of {entry['dtype']}" + (
                f" items {tuple(entry['item_shape'])}" if entry["item_shape"] else ""
            )
        lines.append(
            f"  {entry['name']}: {shape}, codec {entry['codec']}, "
            f"{_size(entry['disk_bytes'])} on disk ({_ratio(entry)})"
        )
    return "\n".join(lines)


# ---- verify ----------------------------------------------------------------------


def _verify_store(path: str, kind: str) -> dict[str, Any]:
    """Every record's checksum; a store that cannot even be opened is damaged too."""
    opener = {"dense": DenseDataset, "ragged": RaggedDataset}.get(kind)
    try:
        if opener is None:
            with Zrecord(path) as store:
                return _verified(path, store)
        with opener(path) as dataset:
            return _verified(path, dataset.store)
    except (ZrecordError, ValueError, OSError) as exc:
        return _unreadable(path, exc)


def _verified(path: str, store: Any) -> dict[str, Any]:
    """The checksums of an open store, and what its superblock says: a
    damaged one (its last commits may be lost) is an error, a commit a crash
    cut short a note."""
    note = store.stats().get("fell_back_reason")
    try:
        damaged = store.verify()
    except CorruptStoreError as exc:  # a damaged superblock: no record index names what is lost
        return {
            "path": path,
            "records": len(store),
            "damaged": [],
            "error": str(exc),
            "superblock_damaged": True,
        }
    return {"path": path, "records": len(store), "damaged": damaged, "error": None, "note": note}


def _unreadable(path: str, exc: Exception) -> dict[str, Any]:
    return {"path": path, "records": None, "damaged": [], "error": f"{type(exc).__name__}: {exc}"}


def _verify_array(store: ArrayStore, name: str) -> dict[str, Any]:
    """One array of an ArrayStore, opened once, through the store: an array
    it lists but cannot read gets the store's own diagnosis."""
    path = os.path.join(store.path, name)
    try:
        lazy = store.load(name, lazy=True)
    except CorruptStoreError as exc:
        return dict(_unreadable(path, exc), name=name)
    assert isinstance(lazy, LazyArray)  # what load(lazy=True) returns
    try:
        entry = _verified(path, reading_store(lazy))
    except (ZrecordError, ValueError, OSError) as exc:
        entry = _unreadable(path, exc)
    return dict(entry, name=name)


def _verify_member(
    path: str, name: str, kind: str, expected: int, listed_in: str
) -> dict[str, Any]:
    """One shard or column: its checksums, and its record count against the listing's."""
    entry = dict(_verify_store(os.path.join(path, name), kind), name=name)
    if entry["error"] is None and entry["records"] != expected:
        entry["error"] = f"it holds {entry['records']:,} records but {listed_in} says {expected:,}"
    return entry


def _verify_sharded(path: str) -> list[dict[str, Any]]:
    """Every shard on its own, so one damaged shard does not hide the others;
    damaged records are named by their global index."""
    try:
        manifest = read_manifest(path)
    except (ValueError, OSError) as exc:
        return [_unreadable(path, exc)]
    stores, start = [], 0
    for name, count in zip(manifest.names, manifest.rows):
        entry = _verify_member(path, name, manifest.schema.kind, count, MANIFEST_FILE)
        shard_schema = read_schema(os.path.join(path, name)) if entry["error"] is None else None
        if shard_schema is not None and shard_schema != manifest.schema:
            entry["error"] = (
                f"it holds {shard_schema.describe()} but {MANIFEST_FILE} says "
                f"{manifest.schema.describe()}"
            )
        entry.update(first_record=start, damaged=[start + index for index in entry["damaged"]])
        stores.append(entry)
        start += count
    return stores


def _verify_columns(path: str) -> list[dict[str, Any]]:
    try:
        listing = read_listing(path)
    except (ValueError, OSError) as exc:
        return [_unreadable(path, exc)]
    return [
        _verify_member(path, entry["name"], entry["kind"], listing["rows"], COLUMNS_FILE)
        for entry in listing["columns"]
    ]


def _refuse_cache_options(args: argparse.Namespace) -> None:
    if args.cache_dir is not None or args.cache_bytes is not None:
        raise CommandError(
            f"--cache-dir and --cache-bytes are for URLs; '{args.path}' is a local path"
        )


def _run_verify(args: argparse.Namespace) -> int:
    if is_remote(args.path):
        result = _remote_verify(args)
        _emit(args, result, _verify_text)
        return EXIT_OK if result["ok"] else EXIT_DAMAGED
    _refuse_cache_options(args)
    try:
        kind = _kind(args.path)
    except ValueError as exc:  # a schema.msgpack that does not parse: damage, not a usage error
        kind = "damaged"
        stores = [
            {
                "path": args.path,
                "records": None,
                "damaged": [],
                "error": f"{type(exc).__name__}: {exc}",
            }
        ]
    if kind == "arraystore":
        with ArrayStore(args.path) as store:
            stores = [_verify_array(store, name) for name in store.get_member_list()]
    elif kind == "sharded":
        stores = _verify_sharded(args.path)
    elif kind == "columns":
        stores = _verify_columns(args.path)
    elif kind != "damaged":
        stores = [_verify_store(args.path, kind)]
    ok = all(not entry["damaged"] and entry["error"] is None for entry in stores)
    result = {"path": args.path, "ok": ok, "stores": stores}
    if kind == "sharded":  # the global indices of every damaged record, across shards
        result["damaged"] = [index for entry in stores for index in entry["damaged"]]
    _emit(args, result, _verify_text)
    return EXIT_OK if ok else EXIT_DAMAGED


def _verify_text(result: dict[str, Any]) -> str:
    lines = []
    for entry in result["stores"]:
        where = entry["path"]
        if "first_record" in entry and entry["records"]:
            last = entry["first_record"] + entry["records"] - 1
            where += f" (global records {entry['first_record']:,}..{last:,})"
        if entry.get("superblock_damaged"):
            lines.append(
                f"{where}: DAMAGED, opened at an older state than it committed: {entry['error']}"
            )
        elif entry["error"] is not None:
            lines.append(f"{where}: DAMAGED, cannot be read: {entry['error']}")
        elif entry["damaged"]:
            shown = ", ".join(map(str, entry["damaged"][:_DAMAGED_SHOWN]))
            more = (
                f" and {len(entry['damaged']) - _DAMAGED_SHOWN:,} more"
                if len(entry["damaged"]) > _DAMAGED_SHOWN
                else ""
            )
            lines.append(
                f"{where}: DAMAGED, {len(entry['damaged']):,} of {entry['records']:,} records fail "
                "their "
                f"checksum: {shown}{more}"
            )
        else:
            note = f" (note: {entry['note']})" if entry.get("note") else ""
            lines.append(f"{where}: ok, {_plural(entry['records'], 'record')} verified{note}")
    if "damaged" in result:
        shards = f"sharded dataset of {len(result['stores']):,} shards"
        damaged = result["damaged"]
        shown = ", ".join(map(str, damaged[:_DAMAGED_SHOWN])) + (
            " ..." if len(damaged) > _DAMAGED_SHOWN else ""
        )
        lines.append(
            f"{result['path']}: {shards}, "
            + (
                "ok"
                if result["ok"]
                else f"DAMAGED: {len(damaged):,} damaged records, global indices: "
                f"{shown or 'none (see above)'}"
            )
        )
    return "\n".join(lines)


# ---- compact ---------------------------------------------------------------------


def _run_compact(args: argparse.Namespace) -> int:
    kind = _kind(args.path)
    before = _disk_bytes(args.path)
    if kind == "arraystore":
        with ArrayStore(args.path) as store:
            store.compact()
    elif kind in ("sharded", "columns"):
        for member in _members(args.path, kind):
            with Zrecord(os.path.join(args.path, member)) as store:
                store.compact()
    else:
        with Zrecord(args.path) as store:
            store.compact()
    after = _disk_bytes(args.path)
    result = {
        "path": args.path,
        "disk_bytes_before": before,
        "disk_bytes_after": after,
        "reclaimed_bytes": max(0, before - after),
    }
    _emit(
        args,
        result,
        lambda r: (
            f"{r['path']}: compacted, {_size(r['disk_bytes_before'])} -> "
            f"{_size(r['disk_bytes_after'])} on disk ({_size(r['reclaimed_bytes'])} reclaimed)"
        ),
    )
    return EXIT_OK


def _members(path: str, kind: str) -> list[str]:
    """The shard or column stores to compact, after opening the whole dataset
    checked its listing against them: a damaged dataset is not touched.
    Compaction keeps every live record and its order, so the manifest's row
    counts stay true."""
    if kind == "sharded":
        manifest = read_manifest(path)
        with _dataset_class(manifest.schema.kind)(path):
            pass
        return list(manifest.names)
    opened = open_columns(path)
    for dataset in opened.values():
        dataset.close()
    return list(opened)


# ---- convert ---------------------------------------------------------------------


def _run_convert(args: argparse.Namespace) -> int:
    if _is_parquet_source(args.source):
        return _convert_parquet(args)
    if args.columns is not None:
        raise CommandError("--columns applies to a Parquet source only: a .npy file is one array")
    return _convert_npy(args)


def _is_parquet_source(source: str) -> bool:
    """A .parquet file, a directory (of .parquet files) or a glob; any other file is read as .npy
    (an existing file is never taken for a glob, whatever characters its name has)."""
    if os.path.isfile(source):
        return source.lower().endswith(".parquet")
    return (
        source.lower().endswith(".parquet")
        or os.path.isdir(source)
        or any(char in source for char in "*?[")
    )


_NPY_MAGIC = b"\x93NUMPY"
_ZIP_MAGIC = b"PK\x03\x04"  # an .npz archive


def _load_npy(source: str) -> Any:  # Any: an array, or the NpzFile the caller refuses
    """``np.load`` without pickles. NumPy takes a file without its header for
    a pickle and advises ``allow_pickle=True``, which would run the file's
    code: say what the file is instead, and never advise an unsafe load."""
    try:
        with open(source, "rb") as handle:
            head = handle.read(len(_NPY_MAGIC))
    except OSError as exc:
        raise CommandError(f"cannot read '{source}': {exc.strerror or exc}") from None
    if not head.startswith((_NPY_MAGIC, _ZIP_MAGIC)):
        raise CommandError(
            f"'{source}' is not a .npy file (it does not start with NumPy's header): "
            "give an array saved with np.save, or Parquet files"
        )
    try:
        return np.load(source, mmap_mode="r", allow_pickle=False)
    except ValueError as exc:
        if "pickle" not in str(exc) and "Python objects" not in str(exc):
            raise CommandError(f"cannot read '{source}' as a .npy file: {exc}") from None
        raise CommandError(
            f"'{source}' holds Python objects (pickled), which loaderx never loads: "
            "save a numeric, string or bytes array with np.save and convert that"
        ) from None
    except OSError as exc:
        raise CommandError(f"cannot read '{source}' as a .npy file: {exc}") from None


def _convert_npy(args: argparse.Namespace) -> int:
    source = _load_npy(args.source)
    if not isinstance(source, np.ndarray):
        source.close()
        raise CommandError(
            f"'{args.source}' is an .npz archive: convert one of its arrays, saved with np.save, "
            "at a time"
        )
    started = time.perf_counter()
    try:
        rows = from_numpy(
            args.target,
            source,
            codec=args.codec,
            mode=args.mode,
            progress=sys.stderr if args.progress else True,
        )
    except FileExistsError:  # the library's advice names its keyword: a CLI user needs the flag
        raise CommandError(
            f"'{args.target}' exists and --mode x refuses to replace it: give a new path, "
            "--mode w (the default) to replace it or --mode a to append to it"
        ) from None
    except ValueError as exc:
        if not str(exc).startswith("cannot append to"):
            raise
        raise CommandError(_cli_words(str(exc))) from None
    seconds = time.perf_counter() - started
    info = _store_info(args.target, "dense")
    result = {
        "source": args.source,
        "rows_written": rows,
        "seconds": round(seconds, 3),
        "store": info,
    }
    _emit(
        args,
        result,
        lambda r: (
            f"{r['source']} -> {info['path']}: {_plural(rows, 'row')} written in {seconds:.1f} s; "
            "the dataset holds "
            f"{_plural(info['records'], str(info['dtype']) + ' item')} of shape "
            f"{tuple(info['item_shape'])}, codec {info['codec']}, "
            f"{_size(info['raw_bytes'])} in {_size(info['disk_bytes'])} on disk ({_ratio(info)})"
        ),
    )
    return EXIT_OK


def _cli_words(message: str) -> str:
    """A converter's schema-mismatch advice in the command's terms: its
    ``pass codec='x'`` is ``--codec x`` here, and the schema= keyword has no
    flag (convert the array first)."""
    message = re.sub(r"pass codec='([a-z0-9_]+)'", r"pass --codec \1", message)
    return re.sub(
        r"\(pass schema=\{'dtype': '([^']+)'\} to convert\)",
        r"(save the array as \1 first)",
        message,
    )


def _convert_parquet(args: argparse.Namespace) -> int:
    """Parquet through ``loaderx.arrow.from_arrow``: one store per column,
    written beside the target and swapped in (``_write_columns``), so an
    existing column directory is replaced (``--mode w``) whole or not at all."""
    try:
        # optional dependency, imported only to fail early with the remedy
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise CommandError(
            "converting Parquet needs pyarrow: pip install 'loaderx[arrow]'"
        ) from None
    columns = (
        [name.strip() for name in args.columns.split(",") if name.strip()] if args.columns else None
    )
    target = args.target
    started = time.perf_counter()

    def write(staging: str) -> int:
        try:
            codec = (
                "zstd" if args.codec == "auto" else args.codec
            )  # the Arrow converter does not try the shuffle filter
            return from_arrow(
                staging,
                args.source,
                columns=columns,
                codec=codec,
                progress=sys.stderr if args.progress else True,
            )
        except TypeError as exc:  # a column type loaderx cannot store
            raise CommandError(f"{exc} (pick the other columns with --columns)") from None

    rows = _write_columns(target, args.mode, write, OS_FS)
    seconds = time.perf_counter() - started
    info = _columns_info(target)
    result = {
        "source": args.source,
        "rows_written": rows,
        "seconds": round(seconds, 3),
        "columns": info,
    }
    _emit(
        args,
        result,
        lambda r: (
            f"{r['source']} -> {target}: {_plural(rows, 'row')} written in {seconds:.1f} s\n"
            + _columns_text(info)
        ),
    )
    return EXIT_OK


def _write_columns(target: str, mode: str, write: Callable[[str], int], fs: OsFs) -> int:
    """Writes a column directory at ``target`` with ``write(path)`` (which
    returns the rows) through the one directory swap of ``_fs``, for a first
    conversion and a replacement alike: a killed or failed conversion leaves
    the old directory whole, and a second one at once gets StoreLockedError."""
    rows = 0
    with DirectorySwap(
        target, fs, lambda message: StoreLockedError(f"cannot convert: {message}")
    ) as swap:
        if fs.exists(target) and (not fs.isdir(target) or fs.listdir(target)):
            _check_replaceable(target, mode, fs)

        def build(staging: str) -> None:
            nonlocal rows
            rows = write(staging)

        swap.build(build)
        swap.commit()
    return rows


def _check_replaceable(target: str, mode: str, fs: OsFs) -> None:
    if mode == "a":
        raise CommandError(
            f"'{target}' exists and --mode a cannot append to a column directory: convert into a "
            "new directory"
        )
    if mode == "x":
        raise CommandError(
            f"'{target}' exists and --mode x refuses to replace it: give a new path, or --mode w "
            "(the default) to replace it"
        )
    if not fs.isfile(os.path.join(target, COLUMNS_FILE)):
        raise CommandError(
            f"'{target}' exists and is not a loaderx column directory (no {COLUMNS_FILE}): "
            "give a new or empty directory; only a column directory is replaced"
        )


# ---- bench -----------------------------------------------------------------------

_RECORD_FLOATS = 3072  # 12 KiB float32 records, as scripts/bench.py's store table
_BATCH = 256
_RUNS = 5


def _median_seconds(function: Callable[[], object], repeat: int) -> float:
    """Median over ``_RUNS`` runs of the time per call, each run ``repeat`` calls."""
    times = []
    for _ in range(_RUNS):
        started = time.perf_counter()
        for _ in range(repeat):
            function()
        times.append((time.perf_counter() - started) / repeat)
    return float(np.median(times))


def _bench_rows(count: int) -> np.ndarray:
    """Mildly compressible float32 rows: random sinusoids quantized to 2**-16."""
    rng = np.random.default_rng(0)
    grid = np.linspace(0.0, 1.0, _RECORD_FLOATS, dtype=np.float32)
    frequency = rng.uniform(1.0, 8.0, (count, 1)).astype(np.float32)
    rows = np.sin(frequency * grid * np.float32(2 * np.pi)) + rng.normal(
        0, 0.01, (count, _RECORD_FLOATS)
    ).astype(np.float32)
    quantized: np.ndarray = (np.round(rows * 65536) / 65536).astype(np.float32)
    return quantized


def _bench_sampler() -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    results = []
    for batch in (256, 1024):
        iid = Sampler(1_000_000, batch, "iid")
        cyclic = Sampler(1_000_000, batch, "cyclic")
        numpy_draw = functools.partial(rng.integers, 0, 1_000_000, batch)
        baseline = _median_seconds(numpy_draw, 2000)
        for name, function in (
            ("numpy default_rng().integers", numpy_draw),
            ("loaderx IID", iid.next),
            ("loaderx CYCLIC", cyclic.next),
        ):
            seconds = baseline if name.startswith("numpy") else _median_seconds(function, 2000)
            results.append(
                {
                    "sampler": name,
                    "batch": batch,
                    "us_per_batch": round(seconds * 1e6, 3),
                    "vs_default_rng": round(baseline / seconds, 2),
                }
            )
    return results


def _bench_store(root: str, rows: np.ndarray) -> list[dict[str, Any]]:
    positions = np.random.default_rng(1).integers(0, len(rows), (20, _BATCH))
    batches = positions.astype(np.uint64)
    out = np.empty((_BATCH, _RECORD_FLOATS), np.float32)
    reads = iter(range(1 << 62))

    def take() -> None:
        # mode="clip": with out=, the default mode="raise" copies through a buffer
        np.take(rows, positions[next(reads) % len(positions)], axis=0, out=out, mode="clip")

    take()  # fault the pages in first
    memory = _median_seconds(take, 20)
    results = [
        {
            "store": "numpy in memory (ceiling)",
            "write_mib_s": None,
            "gather_mib_s": round(out.nbytes / memory / 2**20),
            "ms_per_batch": round(memory * 1e3, 3),
            "disk_bytes": None,
            "ratio": None,
        }
    ]
    for codec in ("raw", "zstd"):
        path = os.path.join(root, f"store-{codec}")
        started = time.perf_counter()
        from_numpy(path, rows, codec=codec, progress=False)
        written = time.perf_counter() - started
        with DenseDataset(path) as dataset:
            dataset.gather_into(batches[0], out)
            if not np.array_equal(out, rows[batches[0].astype(np.intp)]):
                raise CommandError(f"bench: the {codec} store returned wrong rows")
            seconds = _median_seconds(
                lambda: dataset.gather_into(batches[next(reads) % len(batches)], out), 20
            )
        disk = _disk_bytes(path)
        results.append(
            {
                "store": f"loaderx {codec}",
                "write_mib_s": round(rows.nbytes / written / 2**20),
                "gather_mib_s": round(out.nbytes / seconds / 2**20),
                "ms_per_batch": round(seconds * 1e3, 3),
                "disk_bytes": disk,
                "ratio": round(rows.nbytes / disk, 2),
            }
        )
    return results


def _bench_loader(root: str) -> list[dict[str, Any]]:
    results = []
    for codec in ("raw", "zstd"):
        with DenseDataset(os.path.join(root, f"store-{codec}")) as dataset:
            with DataLoader({"x": dataset}, num_workers=4, batch_size=_BATCH) as loader:
                for _ in range(4):
                    next(loader)  # workers started, page cache warm
                seconds = _median_seconds(lambda: next(loader), 10)
        results.append(
            {
                "loader": f"loaderx {codec}",
                "batches_s": round(1 / seconds, 1),
                "mib_s": round(_BATCH * _RECORD_FLOATS * 4 / seconds / 2**20),
            }
        )
    return results


def _machine() -> dict[str, Any]:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as handle:
            model = next(
                (line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")),
                model,
            )
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu": model,
        "cores": cores,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "loaderx": __version__,
    }


def _run_bench(args: argparse.Namespace) -> int:
    if not _BATCH <= args.records <= _BENCH_RECORDS_MAX:
        raise CommandError(
            f"--records must be in {_BATCH}..{_BENCH_RECORDS_MAX:,} (at least one batch; at most "
            f"3 GiB of records in memory), got {args.records:,}"
        )
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="loaderx-bench-", dir=args.dir) as root:
        rows = _bench_rows(args.records)
        result = {
            "machine": _machine(),
            "sampler": _bench_sampler(),
            "store": _bench_store(root, rows),
            "store_source_bytes": rows.nbytes,
            "loader": _bench_loader(root),
        }
    result["seconds"] = round(time.perf_counter() - started, 1)
    _emit(args, result, _bench_text)
    return EXIT_OK


def _table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    cells = [
        [
            (
                "-"
                if row[key] is None
                else f"{row[key]:,}"
                if isinstance(row[key], (int, float))
                else str(row[key])
            )
            for key in columns
        ]
        for row in rows
    ]
    widths = [
        max(len(column), *(len(line[i]) for line in cells)) for i, column in enumerate(columns)
    ]
    lines = ["  ".join(column.ljust(width) for column, width in zip(columns, widths))]
    lines += ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)) for line in cells]
    return "\n".join(lines)


def _bench_text(result: dict[str, Any]) -> str:
    machine = result["machine"]
    stores = [
        dict(row, disk=_size(row["disk_bytes"]) if row["disk_bytes"] else None)
        for row in result["store"]
    ]
    return "\n\n".join(
        [
            f"machine: {machine['cpu']}, {machine['cores']} cores, Python {machine['python']}, "
            f"NumPy {machine['numpy']}, "
            f"loaderx {machine['loaderx']}",
            "sampler (indices over 0..1,000,000, one call per batch)\n"
            + _table(result["sampler"], ["sampler", "batch", "us_per_batch", "vs_default_rng"]),
            f"store ({_size(result['store_source_bytes'])} of 12 KiB float32 records, random "
            f"batches of {_BATCH}, "
            "warm page cache)\n"
            + _table(
                stores, ["store", "write_mib_s", "gather_mib_s", "ms_per_batch", "disk", "ratio"]
            ),
            f"loader (DataLoader, 4 workers, batches of {_BATCH})\n"
            + _table(result["loader"], ["loader", "batches_s", "mib_s"]),
            f"medians of {_RUNS} runs; {result['seconds']} s in all. Quick figures: "
            "scripts/bench.py in a source "
            "checkout compares against other libraries.",
        ]
    )


# ---- doctor ----------------------------------------------------------------------


def _load_transform(name: str) -> Callable[[Any], Any]:
    """``module:function`` imported (the current directory first on the path,
    as ``python -m`` has it)."""
    module_name, _, function_name = name.partition(":")
    if not module_name or not function_name:
        raise CommandError(f"--transform must be MODULE:FUNCTION, got {name!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise CommandError(
            f"--transform {name}: cannot import {module_name!r} ({exc}); run from its directory "
            "or add it to PYTHONPATH"
        ) from exc
    function = getattr(module, function_name, None)
    if not callable(function):
        raise CommandError(f"--transform {name}: {module_name} has no function {function_name!r}")
    return function  # type: ignore[no-any-return]


def _run_doctor(args: argparse.Namespace) -> int:
    if not 0 < args.seconds <= SECONDS_MAX:
        raise CommandError(f"--seconds must be in (0, {SECONDS_MAX:g}], got {args.seconds:g}")
    if args.transform_processes and args.transform is None:
        raise CommandError("--transform-processes needs --transform MODULE:FUNCTION")
    if not is_remote(args.path):
        kind = _kind(args.path)
        if kind not in ("dense", "ragged", "sharded"):
            raise CommandError(
                f"'{args.path}' is a {kind}: the doctor runs the DataLoader over a dense, ragged "
                "or sharded dataset (an ArrayStore's arrays are dense datasets: give one)"
            )
    transform = None if args.transform is None else _load_transform(args.transform)
    try:
        result = diagnose(
            args.path,
            batch_size=args.batch_size,
            workers=args.workers,
            seconds=args.seconds,
            mode=args.mode,
            transform=transform,
            transform_processes=args.transform_processes,
            cold=args.cold,
        )
    except LoaderError as exc:
        raise CommandError(f"the loader failed while the doctor ran it: {exc}") from exc
    _emit(args, result, doctor_text)
    return EXIT_OK
