"""Reading a sharded dataset: its manifest, checked, and its shards as one store.

Layout::

    dataset/
      manifest.msgpack     written last, atomically: the dataset exists once it does
      shard-00000/         a complete loaderx store (zrecord + schema.msgpack)
      shard-00001/
      ...

The manifest is never trusted: its checksum, version, shard names (relative,
inside the dataset directory after resolving symlinks, no duplicates) and
row counts (against the shards themselves) are checked on every open, and
each failure raises ``ManifestError`` saying what is wrong. Invariant: a
`ShardedStore` is open only over shards that agree with the manifest.

This module sits below ``loaderx.dataset`` (which opens a sharded dataset
like one store) and above ``schema`` and ``zrecord``; writing shards and the
manifest is ``loaderx.shards``'. A batch that spans shards is one native call
(zig/shards.zig).
"""

from __future__ import annotations

import hashlib
import operator
import os
import re
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
import numpy.typing as npt

from ._envelope import (
    CHECKSUM,
    FORMAT,
    NEWER,
    UNREADABLE,
    VERSION,
    EnvelopeError,
    check_header,
    checked_body,
    is_sealed,
    seal,
    unpack_map,
)
from ._fs import OS_FS, OsFs
from ._native import check, ffi, lib
from ._remote import RemoteNotFoundError, RetryingSource, is_remote, open_source, tiling_problem
from .schema import Schema, StrPath, read_schema
from .zrecord import NativeHandle, Zrecord, gather_arguments, u64_pointer

__all__ = [
    "MANIFEST_FILE",
    "MANIFEST_FORMAT",
    "MANIFEST_VERSION",
    "BUNDLE_FILE",
    "BUNDLE_VERSION",
    "Bundle",
    "SHARD_COUNT_MAX",
    "SHARD_PATTERN",
    "Manifest",
    "ManifestError",
    "BatchView",
    "ShardedStore",
    "ShardsView",
    "is_sharded",
    "numbers_to_commit",
    "pack_manifest",
    "parse_manifest",
    "read_manifest",
    "shard_name",
    "shard_number",
]

MANIFEST_FILE = "manifest.msgpack"
MANIFEST_FORMAT = "loaderx-shards"
# Version 2 is the envelope of loaderx._envelope (CRC32); version 1, which
# loaderx wrote before it, carried its body's SHA-256 and is still read.
MANIFEST_VERSION = 2
_SHA256_VERSION = 1
# Version 3 adds ``bundles``: shards uploaded as one object each. A manifest
# with bundles is sealed as version 3, so a loaderx that cannot read them says
# "upgrade" instead of looking for the shards' files one by one; one without
# is still sealed as version 2, readable by every loaderx since the envelope.
BUNDLE_VERSION = 3
# The one object of a bundled shard, under the shard's prefix: its files
# (the store's lock excepted) concatenated, at the offsets the manifest records.
BUNDLE_FILE = "shard.lxs"
# Bounds what a damaged manifest can make us allocate or open: zig/shards.zig's
# bound (2^20 shards, at well under 256 bytes an entry), read from the core.
SHARD_COUNT_MAX = int(lib.lx_shard_count_max())
_MANIFEST_BYTES_MAX = 256 << 20
SHARD_PATTERN = re.compile(r"shard-(\d{5,})")
# The optional ``files`` map (shard name -> {file name: [size, sha256 hex]}),
# which writers to object storage record and readers check fetched bytes
# against, is an added key: readers that predate it ignore it, so the
# version did not change. The ``bundles`` map (shard name -> {"file", "size",
# "sha256", "offsets": {file name: offset}}) came with version 3.
_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


class ManifestError(ValueError):
    """A sharded dataset's manifest is damaged, hostile or disagrees with its shards."""


def shard_name(k: int) -> str:
    """The directory name of shard ``k``: ``shard-00042``."""
    return f"shard-{shard_number(k):05d}"


def is_sharded(
    path: StrPath, *, storage_options: dict[str, Any] | None = None, _fs: OsFs = OS_FS
) -> bool:
    """True when ``path`` is a committed sharded dataset (it has a manifest).
    ``path`` may be a URL (``s3://``, ``gs://``, ``az://``, ``http(s)://``,
    ``file://``): then one ``head`` of its manifest object answers, with
    ``storage_options`` as the datasets take them."""
    if is_remote(path):
        source = RetryingSource(open_source(os.fspath(path).rstrip("/"), storage_options))
        try:
            source.head(MANIFEST_FILE)
        except RemoteNotFoundError:
            return False
        return True
    return _fs.isfile(os.path.join(os.fspath(path), MANIFEST_FILE))


def numbers_to_commit(
    where: str, present: list[int], shard_count: Any, absent: str, unfinished: str
) -> list[int]:  # Any: checked here
    """The shard numbers a commit of ``where`` lists: 0 to ``shard_count`` - 1
    (default: through the last of ``present``), each of them present;
    ValueError otherwise. ``absent`` and ``unfinished`` say in the messages
    what a missing shard is (not written; not uploaded)."""
    if shard_count is None:
        if not present:
            raise ValueError(
                f"{where} has no {absent} shards to commit: write shards with write_shard first"
            )
        shard_count = present[-1] + 1
    shard_count = operator.index(shard_count)
    if not 1 <= shard_count <= SHARD_COUNT_MAX:
        raise ValueError(f"shard_count must be 1 to {SHARD_COUNT_MAX}, got {shard_count}")
    missing = sorted(set(range(shard_count)) - set(present))
    if missing:
        shown = ", ".join(map(str, missing[:10])) + (" ..." if len(missing) > 10 else "")
        raise ValueError(
            f"cannot commit {where}: shards {shown} are {unfinished}: write them (write_shard) "
            "and commit again"
        )
    return list(range(shard_count))


def shard_number(k: Any) -> int:  # Any: checked here
    try:
        number = operator.index(k)
    except TypeError:
        raise TypeError(f"shard number must be an int, got {type(k).__name__}") from None
    if not 0 <= number < SHARD_COUNT_MAX:
        raise ValueError(f"shard number must be 0 to {SHARD_COUNT_MAX - 1}, got {number}")
    return number


# ---- the manifest ---------------------------------------------------------------


@dataclass(frozen=True)
class Bundle:
    """A shard stored as one object, ``<shard>/<file>``: its files
    concatenated, file ``f`` at ``offsets[f]`` (sizes from ``Manifest.files``,
    tiling the object: no gap, no overlap), ``size`` bytes whose SHA-256 is
    ``sha256`` (hex). One GET fetches the whole shard."""

    file: str
    size: int
    sha256: str
    offsets: dict[str, int]


@dataclass(frozen=True)
class Manifest:
    """A checked manifest: the schema and each shard's name and row count.
    ``files`` is ``{shard name: {file name: (size, sha256 hex)}}`` for every
    shard when the writer recorded it (datasets written to object storage),
    else None (local commits, and every manifest before it existed).
    ``bundles`` is ``{shard name: Bundle}`` for the shards uploaded as one
    object (writers to object storage since version 3), else None; a shard
    without one is one object per file."""

    schema: Schema
    names: tuple[str, ...]
    rows: tuple[int, ...]
    files: dict[str, dict[str, tuple[int, str]]] | None = None
    bundles: dict[str, Bundle] | None = None

    @property
    def total_rows(self) -> int:
        return sum(self.rows)


def read_manifest(dataset_dir: StrPath, *, _fs: OsFs = OS_FS) -> Manifest:
    """The manifest of ``dataset_dir``, checked: checksum, version, schema,
    shard names confined to the directory, no duplicates, row counts that add
    up. (The row counts are checked against the shards when they are opened.)"""
    dataset_dir = os.fspath(dataset_dir)
    file = os.path.join(dataset_dir, MANIFEST_FILE)
    payload = _fs.read_file(file, _MANIFEST_BYTES_MAX + 1)
    return parse_manifest(payload, file, os.path.realpath(dataset_dir))


def parse_manifest(payload: bytes, file: str, root: str | None = None) -> Manifest:
    """The manifest in ``payload`` (the bytes of ``file``, named in errors),
    checked as ``read_manifest`` does. ``root``: the dataset directory's real
    path, which every shard must resolve inside; None for a dataset in object
    storage, whose shard names are checked as text only."""
    if len(payload) > _MANIFEST_BYTES_MAX:
        raise ManifestError(f"{file} is over {_MANIFEST_BYTES_MAX} bytes: not a loaderx manifest")
    version, body = _unpack_envelope(file, payload)
    try:
        data = msgpack.unpackb(body, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types for bad bytes
        raise ManifestError(
            f"{file} has a valid checksum but an unreadable body ({exc}): it was not written by "
            "loaderx"
        ) from exc
    if not isinstance(data, dict) or not isinstance(data.get("shards"), list):
        raise ManifestError(f"{file} lists no shards: it was not written by loaderx")
    try:
        schema = Schema.from_dict(data.get("schema"), where=f"the schema in {file}")
    except ValueError as exc:
        raise ManifestError(str(exc)) from exc
    names, rows = _check_entries(root, file, data["shards"])
    if data.get("rows") != sum(rows):
        raise ManifestError(
            f"{file} says {data.get('rows')!r} rows in total but its shards add up to {sum(rows)}: "
            "the manifest is damaged; run loaderx.shards.commit again"
        )
    files = _check_files(file, names, data.get("files"))
    if (version == BUNDLE_VERSION) != ("bundles" in data):
        # The checksum covers the body, not the version: a flipped version
        # must not pass for a manifest of the other layout.
        has = "lists bundles" if "bundles" in data else "lists no bundles"
        raise ManifestError(
            f"{file} has version {version} but {has} (bundles come with version "
            f"{BUNDLE_VERSION} only): the manifest is damaged; commit the dataset again"
        )
    bundles = _check_bundles(file, files, data.get("bundles"))
    return Manifest(schema, tuple(names), tuple(rows), files, bundles)


def pack_manifest(
    schema: Schema,
    names: list[str],
    rows: list[int],
    files: dict[str, dict[str, tuple[int, str]]] | None = None,
    bundles: dict[str, Bundle] | None = None,
) -> bytes:
    """The sealed bytes of a manifest; ``files`` and ``bundles`` as
    ``Manifest``'s (version 3 when there are bundles, else 2)."""
    assert len(names) == len(rows) and (files is None or set(files) == set(names))
    assert not bundles or (files is not None and set(bundles) <= set(names))
    shards = [{"name": name, "rows": int(count)} for name, count in zip(names, rows)]
    content: dict[str, Any] = {"schema": schema.to_dict(), "shards": shards, "rows": int(sum(rows))}
    if files is not None:
        content["files"] = {
            name: {file: [int(size), digest] for file, (size, digest) in files[name].items()}
            for name in names
        }
    if not bundles:
        return seal(MANIFEST_FORMAT, MANIFEST_VERSION, content)
    content["bundles"] = {
        name: {
            "file": bundle.file,
            "size": int(bundle.size),
            "sha256": bundle.sha256,
            "offsets": {entry: int(at) for entry, at in bundle.offsets.items()},
        }
        for name, bundle in bundles.items()
    }
    return seal(MANIFEST_FORMAT, BUNDLE_VERSION, content)


def _check_files(
    file: str, names: list[str], found: object
) -> dict[str, dict[str, tuple[int, str]]] | None:
    """The manifest's ``files`` map checked entry by entry (None when absent):
    one map per listed shard, plain file names, sizes and SHA-256 digests."""
    if found is None:
        return None
    damaged = f"{file} has a damaged file list"
    if not isinstance(found, dict) or set(found) != set(names):
        raise ManifestError(f"{damaged}: it must map exactly the listed shards to their files")
    files: dict[str, dict[str, tuple[int, str]]] = {}
    for name in names:
        entries = found[name]
        if not isinstance(entries, dict) or not entries:
            raise ManifestError(f"{damaged}: shard {name!r} has no files")
        checked: dict[str, tuple[int, str]] = {}
        for entry, value in entries.items():
            if not isinstance(entry, str) or not _FILE_NAME.fullmatch(entry):
                raise ManifestError(f"{damaged}: shard {name!r} names an invalid file {entry!r}")
            size, digest = value if isinstance(value, list) and len(value) == 2 else (None, None)
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise ManifestError(f"{damaged}: {name}/{entry} has an invalid size {size!r}")
            if not isinstance(digest, str) or not _SHA256_HEX.fullmatch(digest):
                raise ManifestError(f"{damaged}: {name}/{entry} has an invalid SHA-256 {digest!r}")
            checked[entry] = (size, digest)
        files[name] = checked
    return files


def _check_bundles(
    file: str, files: dict[str, dict[str, tuple[int, str]]] | None, found: object
) -> dict[str, Bundle] | None:
    """The manifest's ``bundles`` map checked (None when absent): each of a
    listed shard, a plain file name, a size and SHA-256, and offsets of
    exactly the shard's files that tile the object from 0 to its size."""
    if found is None:
        return None
    damaged = f"{file} has a damaged bundle list"
    if not isinstance(found, dict) or files is None or not set(found) <= set(files):
        raise ManifestError(f"{damaged}: it must map listed shards (with files) to bundles")
    bundles: dict[str, Bundle] = {}
    for name, entry in found.items():
        entry = entry if isinstance(entry, dict) else {}
        bundle_file, size, digest = entry.get("file"), entry.get("size"), entry.get("sha256")
        offsets = entry.get("offsets")
        if not isinstance(bundle_file, str) or not _FILE_NAME.fullmatch(bundle_file):
            raise ManifestError(f"{damaged}: shard {name!r} has an invalid bundle file")
        if not isinstance(digest, str) or not _SHA256_HEX.fullmatch(digest):
            raise ManifestError(f"{damaged}: {name}/{bundle_file} has an invalid SHA-256")
        if not isinstance(offsets, dict) or set(offsets) != set(files[name]):
            raise ManifestError(
                f"{damaged}: {name}/{bundle_file} must give an offset for each of the shard's files"
            )
        if not all(isinstance(at, int) and not isinstance(at, bool) for at in offsets.values()):
            raise ManifestError(f"{damaged}: {name}/{bundle_file} has an invalid offset")
        layout = {member: (offsets[member], files[name][member][0]) for member in offsets}
        problem = tiling_problem(layout, size)
        if problem is not None:
            raise ManifestError(f"{damaged}: {name}/{bundle_file}: {problem}")
        total = sum(length for _, length in layout.values())  # == size: it tiles
        bundles[name] = Bundle(bundle_file, total, digest, dict(offsets))
    return bundles


def _unpack_envelope(file: str, payload: bytes) -> tuple[int, bytes]:
    """The manifest's version and body, its envelope checked (either layout)."""
    limit = BUNDLE_VERSION
    try:
        data = unpack_map(payload)
        legacy = "sha256" in data and not is_sealed(data)
        limit = _SHA256_VERSION if legacy else BUNDLE_VERSION
        version = check_header(data, MANIFEST_FORMAT, limit)
        if not legacy and version < MANIFEST_VERSION:  # no sealed layout had it
            raise EnvelopeError(VERSION, f"sealed with version {version}", version)
        return version, _sha256_body(data) if legacy else checked_body(data)
    except EnvelopeError as exc:
        raise ManifestError(_refusal(file, exc, limit)) from exc


def _sha256_body(data: dict[str, Any]) -> bytes:
    body, digest = data.get("body"), data.get("sha256")
    if (
        not isinstance(body, bytes)
        or not isinstance(digest, bytes)
        or hashlib.sha256(body).digest() != digest
    ):
        raise EnvelopeError(CHECKSUM, "the body fails its SHA-256")
    return body


def _refusal(file: str, exc: EnvelopeError, limit: int) -> str:
    """What a refused envelope means for a manifest, and what to do about it."""
    remedy = "run loaderx.shards.commit again to rewrite it from the shards"
    if exc.reason == UNREADABLE and exc.__cause__ is not None:  # not msgpack at all
        return f"{file} is damaged or not a loaderx manifest ({exc}): {remedy}"
    if exc.reason in (UNREADABLE, FORMAT):
        return f"{file} is not a loaderx manifest (no format {MANIFEST_FORMAT!r})"
    if exc.reason == VERSION:
        return f"{file} has an invalid version {exc.found!r}"
    if exc.reason == NEWER:
        return (
            f"{file} has version {exc.found}, newer than this loaderx reads ({limit}): "
            "upgrade loaderx"
        )
    return f"{file} fails its checksum: the manifest is damaged; {remedy}"


def _check_entries(root: str | None, file: str, entries: list[Any]) -> tuple[list[str], list[int]]:
    if not 1 <= len(entries) <= SHARD_COUNT_MAX:
        raise ManifestError(
            f"{file} lists {len(entries)} shards; a dataset has 1 to {SHARD_COUNT_MAX}"
        )
    names: list[str] = []
    rows: list[int] = []
    seen: dict[str, int] = {}
    for position, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ManifestError(f"{file}: shard entry {position} is not a map")
        name, count = entry.get("name"), entry.get("rows")
        resolved = _confined(root, file, position, name)
        if resolved in seen:
            raise ManifestError(
                f"{file}: shard entry {position} ({name!r}) is the same directory as entry "
                f"{seen[resolved]}: a shard may be listed once"
            )
        seen[resolved] = position
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise ManifestError(
                f"{file}: shard entry {position} ({name!r}) has an invalid row count {count!r}"
            )
        assert isinstance(name, str)  # _confined refused anything else
        names.append(name)
        rows.append(count)
    return names, rows


def _confined(root: str | None, file: str, position: int, name: object) -> str:
    """The real path of shard ``name`` (the name itself when ``root`` is
    None: object storage has no symlinks); ManifestError unless it is a
    relative path that stays inside the dataset directory ``root``."""
    if not isinstance(name, str) or not name or "\x00" in name:
        raise ManifestError(f"{file}: shard entry {position} has an invalid name {name!r}")
    if os.path.isabs(name) or name.startswith("\\"):
        raise ManifestError(
            f"{file}: shard entry {position} names an absolute path {name!r}; shard names are "
            "relative to the dataset directory"
        )
    if any(part in ("", ".", "..") for part in name.split("/")):
        raise ManifestError(
            f"{file}: shard entry {position} name {name!r} has an empty, '.' or '..' component; "
            "shard names stay inside the dataset directory"
        )
    if root is None:
        return name
    resolved = os.path.realpath(os.path.join(root, name))
    if not resolved.startswith(root + os.sep):
        raise ManifestError(
            f"{file}: shard entry {position} ({name!r}) resolves to '{resolved}', outside the "
            "dataset directory (a symlink out?): refused"
        )
    return resolved


# ---- reading ----------------------------------------------------------------------


class ShardsView(NativeHandle):
    """One native handle (zig/shards.zig) over open stores read as one store
    of global rows: ``gather``, ``lengths`` and ``gather_rows`` are one native
    call for a whole batch, however many stores it touches. It borrows the
    stores: close it before them. ``ShardedStore`` is one over every shard of
    a dataset; a remote dataset opens one per batch over the shards it pinned."""

    _item_bytes: int

    def _open_view(
        self, stores: list[Zrecord], row_starts: npt.NDArray[np.uint64], threads: int, where: str
    ) -> None:
        handles = ffi.new("lx_store *[]", [store._handle for store in stores])
        out = ffi.new("lx_shards **")
        check(
            lib.lx_shards_open(
                handles,
                u64_pointer(row_starts),
                len(stores),
                threads,
                out,
            ),
            f"cannot open sharded dataset '{where}'",
        )
        self._handle = out[0]

    def _close_view(self) -> None:
        if self._handle != ffi.NULL:
            lib.lx_shards_close(self._handle)
            self._handle = ffi.NULL

    def gather(self, idxs: npt.ArrayLike, dst: Any, offsets: npt.ArrayLike | None = None) -> None:
        """Decodes global records ``idxs`` into ``dst`` at byte ``offsets[k]``,
        or at ``k * L`` when all records are ``L`` bytes long (dense)."""
        indices, target, target_bytes, target_offsets = gather_arguments(
            idxs, dst, offsets, self.lengths
        )
        offsets_pointer = ffi.NULL if target_offsets is None else u64_pointer(target_offsets)
        if indices.size == 0:
            return
        handle = self._enter()
        try:
            status = lib.lx_shards_gather(
                handle,
                u64_pointer(indices),
                indices.size,
                target,
                target_bytes,
                offsets_pointer,
                self._item_bytes,
            )
        finally:
            self._leave()
        if status:
            check(status)

    def lengths(self, idxs: npt.ArrayLike) -> npt.NDArray[np.uint64]:
        """The decoded byte length of each global record in ``idxs``."""
        return self._lengths_with(lib.lx_shards_lengths, idxs)

    def gather_rows(
        self,
        indices: npt.NDArray[np.uint64],
        row_bytes: int,
        target: npt.NDArray[np.uint8] | None,
    ) -> tuple[int, npt.NDArray[np.int64]]:
        """``Zrecord.gather_rows`` over global records, one native call."""
        return self._gather_rows_with(lib.lx_shards_gather_rows, indices, row_bytes, target)


class BatchView(ShardsView):
    """A ``ShardsView`` over ``stores`` (open, and kept open by the caller
    until ``close``) holding ``row_starts`` rows each, for one batch."""

    def __init__(
        self, stores: list[Zrecord], row_starts: npt.NDArray[np.uint64], item_bytes: int, where: str
    ) -> None:
        self._init_lifetime()
        self._handle = ffi.NULL
        self._item_bytes = item_bytes
        self._where = where
        self._open_view(stores, row_starts, 0, where)

    def _closed_message(self) -> str:
        return f"the batch view of '{self._where}' is closed"

    def _release(self) -> None:
        self._close_view()


class ShardedStore(ShardsView):
    """The shards of a committed dataset read as one store of global rows.

    It offers the read side of ``Zrecord`` that datasets use (``len``,
    ``gather``, ``lengths``, ``stats``, ``verify``, ``refresh``, ``close``);
    ``gather`` and ``lengths`` are one native call for a whole batch, however
    many shards it touches. ``shards`` are the open shard stores (read them,
    do not write through them).
    """

    #: What a closed dataset's error message tells the user to open again.
    _reopen_hint: str

    def __init__(
        self, path: StrPath, kind: str, verify: bool | None = None, threads: int = 0
    ) -> None:
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
        if manifest.bundles:
            name = next(iter(manifest.bundles))
            raise ManifestError(
                f"'{self.path}' stores its shards as bundles (e.g. {name}/"
                f"{manifest.bundles[name].file}: one object per shard, as loaderx writes to "
                "object storage), which only the remote reader splits: open it as the URL "
                f"file://{os.path.abspath(self.path)} (read through the cache), or read it "
                "from the store it was downloaded from"
            )
        if manifest.schema.kind != kind:
            other = "RaggedDataset" if manifest.schema.kind == "ragged" else "DenseDataset"
            raise ValueError(
                f"'{self.path}' is a sharded {manifest.schema.kind} dataset: open it with {other}"
            )
        self.schema = manifest.schema
        self.manifest = manifest
        for name, count in zip(manifest.names, manifest.rows):
            self.shards.append(self._open_shard(name, count))
        self._row_starts = np.zeros(len(self.shards) + 1, dtype=np.uint64)
        np.cumsum(np.asarray(manifest.rows, dtype=np.uint64), out=self._row_starts[1:])
        self._item_bytes = self.schema.item_bytes
        self._open_view(self.shards, self._row_starts, self._threads, self.path)

    def _open_shard(self, name: str, count: int) -> Zrecord:
        path = os.path.join(self.path, name)
        shard_schema = read_schema(path) if os.path.isdir(path) else None
        if shard_schema is None:
            raise ManifestError(
                f"'{self.path}': shard {name!r} listed in the manifest is missing or not a loaderx "
                "store: the dataset is incomplete"
            )
        if shard_schema != self.schema:
            raise ManifestError(
                f"'{self.path}': shard {name!r} holds {shard_schema.describe()}, but the manifest "
                f"says {self.schema.describe()}"
            )
        store = Zrecord(path, codec=self.schema.codec, verify=self._verify, threads=self._threads)
        held = len(store)
        if held != count:
            store.close()
            raise ManifestError(
                f"'{self.path}': shard {name!r} holds {held} records but the manifest says "
                f"{count}: the shard or the manifest was changed after commit"
            )
        return store

    def _closed_message(self) -> str:
        return f"sharded dataset '{self.path}' is closed; open it again"

    def _release(self) -> None:
        self._close_shards()

    def _close_shards(self) -> None:
        self._close_view()
        for shard in self.shards:
            shard.close()

    # -- reads

    def __len__(self) -> int:
        return int(self._row_starts[-1])

    def stats(self) -> dict[str, Any]:
        """The shards' stats added up; ``layout`` is ``fixed`` only when every
        non-empty shard is fixed with one record size."""
        parts = [shard.stats() for shard in self.shards]
        layouts = {
            (part["layout"], part["record_bytes"]) for part in parts if part["layout"] != "empty"
        }
        layout, record_bytes = (
            layouts.pop() if len(layouts) == 1 else (("indexed", 0) if layouts else ("empty", 0))
        )
        totals = {
            key: sum(part[key] for part in parts)
            for key in ("records", "live_bytes", "chunk_bytes", "reclaimable")
        }
        return {**totals, "layout": layout, "record_bytes": record_bytes, "shards": len(parts)}

    def layout(self) -> tuple[str, int]:
        """``stats()``'s ``layout`` and ``record_bytes``."""
        stats = self.stats()
        return stats["layout"], stats["record_bytes"]

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
