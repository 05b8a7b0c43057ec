"""Sharded datasets: a directory of independently written shard stores plus
a manifest that makes them one dataset.

Layout::

    dataset/
      manifest.msgpack     written last, atomically: the dataset exists once it does
      shard-00000/         a complete loaderx store (zrecord + schema.msgpack)
      shard-00001/
      ...

Any engine writes shards in parallel with ``write_shard(dataset, k, data)``
(each shard is written to a temporary directory and renamed into place, so a
shard directory is always complete), then one process calls ``commit``, which
checks every shard's schema and row count and writes the manifest. An
interrupted conversion has no manifest, so it is never mistaken for a
dataset; running it again skips the shards ``written_shards`` reports.

The manifest is never trusted: its checksum, version, shard names (relative,
inside the dataset directory after resolving symlinks, no duplicates) and
row counts (against the shards themselves) are checked on every open, and
each failure raises ``ManifestError`` saying what is wrong.

``DenseDataset`` and ``RaggedDataset`` open a sharded dataset like a single
store; a batch that spans shards is one native call (zig/shards.zig).
"""

from __future__ import annotations

import hashlib
import operator
import os
import re
from dataclasses import dataclass
from typing import Any, TextIO

import msgpack
import numpy as np
import numpy.typing as npt

from ._checks import check_flag
from ._fs import ASIDE_PREFIX, LOCK_PREFIX, OS_FS, STAGING_PREFIX, DirectorySwap, OsFs, clean_leftovers, make_dirs_durable, sibling, write_file_atomic
from ._native import check, ffi, lib
from .dataset import SCHEMA_FILE, Schema, StrPath, read_schema
from .zrecord import NativeHandle, StoreLockedError, Zrecord, _u64, gather_arguments

__all__ = [
    "MANIFEST_FILE",
    "ManifestError",
    "ShardedStore",
    "commit",
    "is_sharded",
    "read_manifest",
    "shard_name",
    "write_shard",
    "written_shards",
]

MANIFEST_FILE = "manifest.msgpack"
MANIFEST_FORMAT = "loaderx-shards"
MANIFEST_VERSION = 1
# Bounds what a damaged manifest can make us allocate or open: 2^20 shards
# (zig/shards.zig refuses more) at well under 256 bytes an entry.
SHARD_COUNT_MAX = 1 << 20
_MANIFEST_BYTES_MAX = 256 << 20
_SHARD_PATTERN = re.compile(r"shard-(\d{5,})")
_LEGACY_TEMPORARY_PREFIX = ".tmp-shard-"  # the temporaries of loaderx before the one swap


class ManifestError(ValueError):
    """A sharded dataset's manifest is damaged, hostile or disagrees with its shards."""


def shard_name(k: int) -> str:
    """The directory name of shard ``k``: ``shard-00042``."""
    return f"shard-{_shard_number(k):05d}"


def is_sharded(path: StrPath, *, _fs: OsFs = OS_FS) -> bool:
    """True when ``path`` is a committed sharded dataset (it has a manifest)."""
    return _fs.isfile(os.path.join(os.fspath(path), MANIFEST_FILE))


# ---- writing ------------------------------------------------------------------


def write_shard(
    dataset_dir: StrPath, k: int, data: Any, codec: str | int = "zstd",
    schema: Schema | dict[str, Any] | None = None, overwrite: bool = False, chunk_bytes: int | None = None,
    dict_size: int | None = None, progress: bool | TextIO = False, *, _fs: OsFs = OS_FS,
) -> int:
    """Writes shard ``k`` of the sharded dataset at ``dataset_dir``; returns its rows.

    ``data`` is a NumPy array (or array-like with ``shape``, ``dtype`` and
    slicing: one dense record per row, as ``from_numpy``) or any other
    iterable of arrays or ``bytes`` (one ragged record each, as
    ``from_iterator``; an object array of arrays counts as one). ``codec``,
    ``schema``, ``chunk_bytes`` and ``dict_size`` are those converters'.
    The shard is written whole into ``.new-shard-k`` and swapped into place
    (the one directory swap of ``_fs``), so ``shard-k`` is complete or
    absent. An existing shard raises ``FileExistsError`` unless
    ``overwrite=True`` (a retried task); a shard listed in the manifest is
    never overwritten. Safe to call from many processes at once for
    different ``k``; a second writer of the same ``k``, and any writer while
    ``commit`` runs, gets ``StoreLockedError``.
    """
    from .converter import CHUNK_BYTES, from_iterator, from_numpy

    dataset_dir = os.fspath(dataset_dir)
    name = shard_name(k)
    overwrite = check_flag("overwrite", overwrite)  # overwrite="no" is truthy: it replaced the shard
    _prepare_directory(dataset_dir, _fs)
    final = os.path.join(dataset_dir, name)
    options: dict[str, Any] = dict(codec=codec, chunk_bytes=CHUNK_BYTES if chunk_bytes is None else chunk_bytes, dict_size=dict_size, schema=schema, progress=progress)
    rows = 0

    def build(staging: str) -> None:
        nonlocal rows
        if _is_dense_source(data):
            rows = from_numpy(staging, data, **options, _staged=True)
        else:
            rows = from_iterator(staging, iter(data), **options, _staged=True)

    # Shared: many writers at once, but none while commit (exclusive) runs.
    commit_lock = _lock(_fs, sibling(os.path.join(dataset_dir, MANIFEST_FILE), LOCK_PREFIX), "write a shard of", dataset_dir, shared=True)
    try:
        with DirectorySwap(final, _fs, lambda message: StoreLockedError(f"cannot write shard {k}: {message}", 6)) as swap:
            if is_sharded(dataset_dir, _fs=_fs) and name in read_manifest(dataset_dir, _fs=_fs).names:
                raise FileExistsError(f"shard {k} of '{dataset_dir}' is committed in its manifest and cannot change: write new shards with higher numbers")
            if _fs.exists(final) and not overwrite:
                raise FileExistsError(f"shard {k} of '{dataset_dir}' already exists: skip it (see written_shards) or pass overwrite=True")
            swap.build(build)
            swap.commit()
    finally:
        _fs.unlock(commit_lock)
    return rows


def written_shards(dataset_dir: StrPath, *, _fs: OsFs = OS_FS) -> list[int]:
    """The shard numbers whose directories are complete (committed or not),
    sorted: what a resumed conversion can skip."""
    dataset_dir = os.fspath(dataset_dir)
    if not _fs.isdir(dataset_dir):
        return []
    found = []
    for entry in _fs.listdir(dataset_dir):
        match = _SHARD_PATTERN.fullmatch(entry)
        if match and _fs.isfile(os.path.join(dataset_dir, entry, SCHEMA_FILE)):
            found.append(int(match.group(1)))
    return sorted(found)


def commit(dataset_dir: StrPath, shard_count: int | None = None, *, _fs: OsFs = OS_FS) -> int:
    """Makes shards ``0..shard_count-1`` of ``dataset_dir`` one dataset by
    writing its manifest last and atomically; returns the total rows.

    Without ``shard_count`` every shard present is committed, and they must
    be numbered ``0..n-1`` without gaps. Every shard must have the first
    shard's schema (kind, dtype, item shape, codec). Committing again after
    writing more shards extends the dataset; committed shards keep their
    place. A damaged manifest is rewritten from the shards. Commit refuses
    with ``StoreLockedError`` while any ``write_shard`` on the dataset runs
    (so it never deletes a running writer's staging directory, nor commits a
    shard being replaced); it deletes the leftovers of killed writers. The
    manifest, and the dataset directory's entry in its parent, are durable
    when it returns.
    """
    dataset_dir = os.fspath(dataset_dir)
    if not _fs.isdir(dataset_dir):
        raise FileNotFoundError(f"no sharded dataset at '{dataset_dir}': write shards with loaderx.shards.write_shard first")
    handle = _lock(_fs, sibling(os.path.join(dataset_dir, MANIFEST_FILE), LOCK_PREFIX), "commit", dataset_dir, shared=False)
    try:
        _remove_leftovers(dataset_dir, _fs)
        numbers = _numbers_to_commit(dataset_dir, written_shards(dataset_dir, _fs=_fs), shard_count)
        names = [shard_name(number) for number in numbers]
        schema, rows = _inspect_shards(dataset_dir, names, _fs)
        if is_sharded(dataset_dir, _fs=_fs):
            try:
                old = read_manifest(dataset_dir, _fs=_fs)
            except ManifestError:
                old = None  # damaged: rewriting it from the shards is the remedy
            if old is not None:
                _check_extends(dataset_dir, old, names, rows)
        write_file_atomic(os.path.join(dataset_dir, MANIFEST_FILE), _pack_manifest(schema, names, rows), _fs)
        _fs.fsync_dir(os.path.dirname(os.path.abspath(dataset_dir)))  # the dataset's own entry, however it was made
    finally:
        _fs.unlock(handle)
    return sum(rows)


def _lock(fs: OsFs, path: str, what: str, dataset_dir: str, shared: bool) -> Any:  # Any: the seam's lock handle
    try:
        return fs.lock(path, shared=shared)
    except BlockingIOError:
        other = "commit is running on it" if shared else "write_shard is running on it"
        raise StoreLockedError(f"cannot {what} '{dataset_dir}' now: {other}; retry when it is done", 6) from None


def _prepare_directory(dataset_dir: str, fs: OsFs) -> None:
    if fs.exists(os.path.join(dataset_dir, SCHEMA_FILE)) or fs.exists(os.path.join(dataset_dir, "superblock")):
        raise ValueError(f"'{dataset_dir}' is a single loaderx store, not a sharded dataset: give a new or empty directory for the shards")
    if fs.exists(dataset_dir) and not fs.isdir(dataset_dir):
        raise ValueError(f"'{dataset_dir}' exists and is not a directory: give a directory for the sharded dataset")
    make_dirs_durable(dataset_dir, fs)  # a new directory's entry is durable only after an fsync of its parent


def _is_dense_source(data: object) -> bool:
    if isinstance(data, np.ndarray):
        return not data.dtype.hasobject
    return hasattr(data, "shape") and hasattr(data, "dtype") and hasattr(data, "__getitem__")


def _numbers_to_commit(dataset_dir: str, present: list[int], shard_count: int | None) -> list[int]:
    if shard_count is None:
        if not present:
            raise ValueError(f"'{dataset_dir}' has no complete shards to commit: write shards with write_shard first")
        shard_count = present[-1] + 1
    shard_count = operator.index(shard_count)
    if not 1 <= shard_count <= SHARD_COUNT_MAX:
        raise ValueError(f"shard_count must be 1 to {SHARD_COUNT_MAX}, got {shard_count}")
    missing = sorted(set(range(shard_count)) - set(present))
    if missing:
        shown = ", ".join(map(str, missing[:10])) + (" ..." if len(missing) > 10 else "")
        raise ValueError(f"cannot commit '{dataset_dir}': shards {shown} are missing or unfinished: write them (write_shard) and commit again")
    extra = [number for number in present if number >= shard_count]
    if extra:
        raise ValueError(f"cannot commit '{dataset_dir}': shard {extra[0]} exists beyond shard_count={shard_count}: delete it or commit with a larger shard_count")
    return list(range(shard_count))


def _inspect_shards(dataset_dir: str, names: list[str], fs: OsFs) -> tuple[Schema, list[int]]:
    """The common schema of the shards and their row counts; ValueError
    naming the first shard that disagrees with shard 0."""
    schema = None
    rows = []
    for name in names:
        path = fs.real_path(os.path.join(dataset_dir, name))
        shard_schema = read_schema(path)
        assert shard_schema is not None  # written_shards lists only shards with a schema file
        if schema is None:
            schema = shard_schema
        elif shard_schema != schema:
            raise ValueError(f"cannot commit '{dataset_dir}': {name} holds {shard_schema.describe()}, but {names[0]} holds {schema.describe()}: rewrite {name} with the same schema")
        with Zrecord(path, codec=shard_schema.codec) as store:
            rows.append(len(store))
    assert schema is not None  # names is never empty
    return schema, rows


def _check_extends(dataset_dir: str, old: Manifest, names: list[str], rows: list[int]) -> None:
    old_rows = list(old.rows)
    if names[: len(old.names)] != list(old.names) or rows[: len(old_rows)] != old_rows:
        raise ValueError(
            f"cannot commit '{dataset_dir}': its committed shards changed since the last commit "
            "(a committed shard is never rewritten): restore them or convert into a new directory"
        )


def _remove_leftovers(dataset_dir: str, fs: OsFs) -> None:
    """Applies the swap's leftover rule to every shard a killed writer left
    a staging or old directory of (commit holds the dataset's lock
    exclusively, so no writer runs), and deletes the temporaries of loaderx
    before the one swap (``.tmp-shard-*``)."""
    changed = False
    for entry in fs.listdir(dataset_dir):
        if entry.startswith(_LEGACY_TEMPORARY_PREFIX):
            fs.rmtree(os.path.join(dataset_dir, entry))
            changed = True
        for prefix in (STAGING_PREFIX, ASIDE_PREFIX):
            if entry.startswith(prefix) and _SHARD_PATTERN.fullmatch(entry[len(prefix):]):
                changed = clean_leftovers(os.path.join(dataset_dir, entry[len(prefix):]), fs) or changed
    if changed:
        fs.fsync_dir(dataset_dir)


def _shard_number(k: Any) -> int:  # Any: checked here
    try:
        number = operator.index(k)
    except TypeError:
        raise TypeError(f"shard number must be an int, got {type(k).__name__}") from None
    if not 0 <= number < SHARD_COUNT_MAX:
        raise ValueError(f"shard number must be 0 to {SHARD_COUNT_MAX - 1}, got {number}")
    return number


# ---- the manifest ---------------------------------------------------------------


@dataclass(frozen=True)
class Manifest:
    """A checked manifest: the schema and each shard's name and row count."""

    schema: Schema
    names: tuple[str, ...]
    rows: tuple[int, ...]

    @property
    def total_rows(self) -> int:
        return sum(self.rows)


def _pack_manifest(schema: Schema, names: list[str], rows: list[int]) -> bytes:
    shards = [{"name": name, "rows": int(count)} for name, count in zip(names, rows)]
    body = msgpack.packb({"schema": schema.to_dict(), "shards": shards, "rows": int(sum(rows))}, use_bin_type=True)
    envelope: bytes = msgpack.packb(
        {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "body": body, "sha256": hashlib.sha256(body).digest()},
        use_bin_type=True,
    )
    return envelope


def read_manifest(dataset_dir: StrPath, *, _fs: OsFs = OS_FS) -> Manifest:
    """The manifest of ``dataset_dir``, checked: checksum, version, schema,
    shard names confined to the directory, no duplicates, row counts that add
    up. (The row counts are checked against the shards when they are opened.)"""
    dataset_dir = os.fspath(dataset_dir)
    file = os.path.join(dataset_dir, MANIFEST_FILE)
    payload = _fs.read_file(file, _MANIFEST_BYTES_MAX + 1)
    if len(payload) > _MANIFEST_BYTES_MAX:
        raise ManifestError(f"{file} is over {_MANIFEST_BYTES_MAX} bytes: not a loaderx manifest")
    body = _unpack_envelope(file, payload)
    try:
        data = msgpack.unpackb(body, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types for bad bytes
        raise ManifestError(f"{file} has a valid checksum but an unreadable body ({exc}): it was not written by loaderx") from exc
    if not isinstance(data, dict) or not isinstance(data.get("shards"), list):
        raise ManifestError(f"{file} lists no shards: it was not written by loaderx")
    try:
        schema = Schema.from_dict(data.get("schema"), where=f"the schema in {file}")
    except ValueError as exc:
        raise ManifestError(str(exc)) from exc
    names, rows = _check_entries(dataset_dir, file, data["shards"])
    if data.get("rows") != sum(rows):
        raise ManifestError(f"{file} says {data.get('rows')!r} rows in total but its shards add up to {sum(rows)}: the manifest is damaged; run loaderx.shards.commit again")
    return Manifest(schema, tuple(names), tuple(rows))


def _unpack_envelope(file: str, payload: bytes) -> bytes:
    try:
        envelope = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types for bad bytes
        raise ManifestError(f"{file} is damaged or not a loaderx manifest ({exc}): run loaderx.shards.commit again to rewrite it from the shards") from exc
    if not isinstance(envelope, dict) or envelope.get("format") != MANIFEST_FORMAT:
        raise ManifestError(f"{file} is not a loaderx manifest (no format {MANIFEST_FORMAT!r})")
    version = envelope.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ManifestError(f"{file} has an invalid version {version!r}")
    if version > MANIFEST_VERSION:
        raise ManifestError(f"{file} has version {version}, newer than this loaderx reads ({MANIFEST_VERSION}): upgrade loaderx")
    body, digest = envelope.get("body"), envelope.get("sha256")
    if not isinstance(body, bytes) or not isinstance(digest, bytes) or hashlib.sha256(body).digest() != digest:
        raise ManifestError(f"{file} fails its checksum: the manifest is damaged; run loaderx.shards.commit again to rewrite it from the shards")
    return body


def _check_entries(dataset_dir: str, file: str, entries: list[Any]) -> tuple[list[str], list[int]]:
    if not 1 <= len(entries) <= SHARD_COUNT_MAX:
        raise ManifestError(f"{file} lists {len(entries)} shards; a dataset has 1 to {SHARD_COUNT_MAX}")
    root = os.path.realpath(dataset_dir)
    names: list[str] = []
    rows: list[int] = []
    seen: dict[str, int] = {}
    for position, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ManifestError(f"{file}: shard entry {position} is not a map")
        name, count = entry.get("name"), entry.get("rows")
        resolved = _confined(root, file, position, name)
        if resolved in seen:
            raise ManifestError(f"{file}: shard entry {position} ({name!r}) is the same directory as entry {seen[resolved]}: a shard may be listed once")
        seen[resolved] = position
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise ManifestError(f"{file}: shard entry {position} ({name!r}) has an invalid row count {count!r}")
        assert isinstance(name, str)  # _confined refused anything else
        names.append(name)
        rows.append(count)
    return names, rows


def _confined(root: str, file: str, position: int, name: object) -> str:
    """The real path of shard ``name``; ManifestError unless it is a
    relative path that stays inside the dataset directory ``root``."""
    if not isinstance(name, str) or not name or "\x00" in name:
        raise ManifestError(f"{file}: shard entry {position} has an invalid name {name!r}")
    if os.path.isabs(name) or name.startswith("\\"):
        raise ManifestError(f"{file}: shard entry {position} names an absolute path {name!r}; shard names are relative to the dataset directory")
    if any(part in ("", ".", "..") for part in name.split("/")):
        raise ManifestError(f"{file}: shard entry {position} name {name!r} has an empty, '.' or '..' component; shard names stay inside the dataset directory")
    resolved = os.path.realpath(os.path.join(root, name))
    if not resolved.startswith(root + os.sep):
        raise ManifestError(f"{file}: shard entry {position} ({name!r}) resolves to '{resolved}', outside the dataset directory (a symlink out?): refused")
    return resolved


# ---- reading ----------------------------------------------------------------------


class ShardedStore(NativeHandle):
    """The shards of a committed dataset read as one store of global rows.

    It offers the read side of ``Zrecord`` that datasets use (``len``,
    ``gather``, ``lengths``, ``stats``, ``verify``, ``refresh``, ``close``);
    ``gather`` and ``lengths`` are one native call for a whole batch, however
    many shards it touches. ``shards`` are the open shard stores (read them,
    do not write through them).
    """

    #: What a closed dataset's error message tells the user to open again.
    _reopen_hint: str

    def __init__(self, path: StrPath, kind: str, verify: bool | None = None, threads: int = 0) -> None:
        self.path = os.fspath(path)
        self._verify = verify
        self._threads = threads
        self._init_lifetime()
        self.shards: list[Zrecord] = []
        self._handle = ffi.NULL
        try:
            self._open(read_manifest(self.path), kind)
        except BaseException:
            self._close_shards()
            raise

    def _open(self, manifest: Manifest, kind: str) -> None:
        if manifest.schema.kind != kind:
            other = "RaggedDataset" if manifest.schema.kind == "ragged" else "DenseDataset"
            raise ValueError(f"'{self.path}' is a sharded {manifest.schema.kind} dataset: open it with {other}")
        self.schema = manifest.schema
        self.manifest = manifest
        for name, count in zip(manifest.names, manifest.rows):
            self.shards.append(self._open_shard(name, count))
        self._row_starts = np.zeros(len(self.shards) + 1, dtype=np.uint64)
        np.cumsum(np.asarray(manifest.rows, dtype=np.uint64), out=self._row_starts[1:])
        handles = ffi.new("lx_store *[]", [shard._handle for shard in self.shards])
        out = ffi.new("lx_shards **")
        check(lib.lx_shards_open(handles, ffi.cast("uint64_t *", ffi.from_buffer(self._row_starts)),
                                 len(self.shards), self._threads, out), f"cannot open sharded dataset '{self.path}'")
        self._handle = out[0]

    def _open_shard(self, name: str, count: int) -> Zrecord:
        path = os.path.join(self.path, name)
        shard_schema = read_schema(path) if os.path.isdir(path) else None
        if shard_schema is None:
            raise ManifestError(f"'{self.path}': shard {name!r} listed in the manifest is missing or not a loaderx store: the dataset is incomplete")
        if shard_schema != self.schema:
            raise ManifestError(f"'{self.path}': shard {name!r} holds {shard_schema.describe()}, but the manifest says {self.schema.describe()}")
        store = Zrecord(path, codec=self.schema.codec, verify=self._verify, threads=self._threads)
        held = len(store)
        if held != count:
            store.close()
            raise ManifestError(f"'{self.path}': shard {name!r} holds {held} records but the manifest says {count}: the shard or the manifest was changed after commit")
        return store

    def _closed_message(self) -> str:
        return f"sharded dataset '{self.path}' is closed; open it again"

    def _release(self) -> None:
        self._close_shards()

    def _close_shards(self) -> None:
        if self._handle != ffi.NULL:
            lib.lx_shards_close(self._handle)
            self._handle = ffi.NULL
        for shard in self.shards:
            shard.close()

    # -- reads

    def __len__(self) -> int:
        return int(self._row_starts[-1])

    def gather(self, idxs: npt.ArrayLike, dst: Any, offsets: npt.ArrayLike | None = None) -> None:
        """Decodes global records ``idxs`` into ``dst`` at byte ``offsets[k]``,
        or at ``k * L`` when all records are ``L`` bytes long (dense)."""
        indices, target, target_bytes, target_offsets = gather_arguments(idxs, dst, offsets, self.lengths)
        offsets_pointer = ffi.NULL if target_offsets is None else _u64(target_offsets)
        if indices.size == 0:
            return
        handle = self._enter()
        try:
            status = lib.lx_shards_gather(handle, _u64(indices), indices.size, target, target_bytes,
                                          offsets_pointer, self.schema.item_bytes)
        finally:
            self._leave()
        if status:
            check(status)

    def lengths(self, idxs: npt.ArrayLike) -> npt.NDArray[np.uint64]:
        """The decoded byte length of each global record in ``idxs``."""
        return self._lengths_with(lib.lx_shards_lengths, idxs)

    def gather_rows(
        self, indices: npt.NDArray[np.uint64], row_bytes: int, target: npt.NDArray[np.uint8] | None,
    ) -> tuple[int, npt.NDArray[np.int64]]:
        """``Zrecord.gather_rows`` over global records, one native call."""
        return self._gather_rows_with(lib.lx_shards_gather_rows, indices, row_bytes, target)

    def stats(self) -> dict[str, Any]:
        """The shards' stats added up; ``layout`` is ``fixed`` only when every
        non-empty shard is fixed with one record size."""
        parts = [shard.stats() for shard in self.shards]
        layouts = {(part["layout"], part["record_bytes"]) for part in parts if part["layout"] != "empty"}
        layout, record_bytes = layouts.pop() if len(layouts) == 1 else (("indexed", 0) if layouts else ("empty", 0))
        totals = {key: sum(part[key] for part in parts) for key in ("records", "live_bytes", "chunk_bytes", "reclaimable")}
        return {**totals, "layout": layout, "record_bytes": record_bytes, "shards": len(parts)}

    def verify(self) -> list[int]:
        """Checks every record's checksum; returns the global indices of damaged records."""
        damaged: list[int] = []
        for shard, start in zip(self.shards, self._row_starts[:-1].tolist()):
            damaged.extend(start + index for index in shard.verify())
        return damaged

    def refresh(self) -> int:
        """A committed sharded dataset does not change; returns len()."""
        return len(self)

    def __enter__(self) -> ShardedStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self)} records in {len(self.shards)} shards"
        return f"ShardedStore({self.path!r}, {state})"
