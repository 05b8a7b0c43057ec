"""Writing loaderx stores: ``from_numpy`` (dense) and ``from_iterator`` (ragged).

Both stream their input in bounded chunks (``chunk_bytes`` of record bytes,
and at most ``chunk_bytes // 64`` records, per native append), so a
memory-mapped array or an endless-looking generator is never held whole.

A call is all or nothing. A new store (a first creation, or ``mode="w"``
over an old one) is written whole into ``.new-<name>`` beside the path and
swapped in with the one directory swap of ``_fs.DirectorySwap``, under the
path's ``.lock-<name>``: a second writer gets ``StoreLockedError``, every open
sees the old store whole or the new one whole, and a killed conversion leaves
only a staging directory the next one deletes. When an append fails, the
records it appended are deleted again. ``mode`` decides what an existing
store gets: ``"w"`` (the default) writes a new store beside it and swaps it
in only when complete,
``"a"`` appends after checking that the new data has the store's schema
(kind, dtype, item shape and codec; a mismatch raises ``ValueError`` before
anything is written), ``"x"`` refuses. So running a conversion twice never
doubles a dataset unless asked to.

``schema=`` forces the item schema instead of taking it from the data: a
mapping with ``dtype`` and/or ``item_shape`` (``kind`` may be given but must
match the function). A forced ``dtype`` converts the data with NumPy's
``same_kind`` casting (float64 to float32 is fine, float to int is refused);
a forced ``item_shape`` in ``from_numpy`` reshapes each row (the element
counts must agree). For ``from_iterator`` the forced schema also lets an empty
source create an empty store, and the item shape must match the records.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
from collections.abc import Iterable, Iterator
from typing import Any, Callable, TextIO

import msgpack
import numpy as np
import numpy.typing as npt

from ._checks import check_int
from ._fs import OS_FS, OsFs, copy_file, fsync_directory, read_at_most, write_file_durable
from ._remote import is_remote
from ._upload import SHARD_BYTES
from ._upload import write_store as write_remote_store
from ._writing import (
    CHUNK_BYTES as CHUNK_BYTES,
)
from ._writing import (
    CHUNK_BYTES_MAX as CHUNK_BYTES_MAX,
)
from ._writing import (
    DICT_BYTES as DICT_BYTES,
)
from ._writing import (
    DICT_BYTES_MAX as DICT_BYTES_MAX,
)
from ._writing import (
    DICT_BYTES_MIN as DICT_BYTES_MIN,
)
from ._writing import (
    RECORD_COST_BYTES,
    TRIAL_BYTES_MAX,
    TRIAL_RECORDS_MAX,
    Progress,
    Writer,
    auto_codec,
    codec_name,
    dense_samples,
    is_auto,
    packed_trial,
    shuffled_samples,
    train_dictionary,
    uses_dictionary,
    write_store,
)
from ._writing import (
    check_chunk_bytes as check_chunk_bytes,
)
from ._writing import (
    check_progress as check_progress,
)
from .schema import SCHEMA_FILE, Schema, StrPath, read_schema
from .zrecord import Zrecord

__all__ = ["from_iterator", "from_numpy", "CHUNK_BYTES_MAX"]


def from_numpy(
    path: StrPath,
    array: npt.ArrayLike,
    codec: str | int = "auto",
    chunk_bytes: int = CHUNK_BYTES,
    dict_size: int | None = None,
    schema: Schema | dict[str, Any] | None = None,
    progress: bool | TextIO = True,
    mode: str = "w",
    *,
    storage_options: dict[str, Any] | None = None,
    staging_dir: StrPath | None = None,
    shard_bytes: int | None = None,
    _fs: OsFs = OS_FS,
    _staged: bool = False,
) -> int:
    """Writes one dense record per row of ``array`` (along axis 0) to the store
    at ``path``; returns the rows written.

    ``mode`` says what happens to an existing store at ``path``: ``"w"``
    replaces it (atomically, when the new store is complete), ``"a"`` appends
    to it (its schema must match), ``"x"`` refuses with ``FileExistsError``.
    Every mode creates a store that does not exist yet.

    A 1-D array becomes scalar records (``item_shape == ()``). ``array`` may
    be a memory-mapped array (or any array-like with ``shape``, ``dtype`` and
    slicing, such as an HDF5 dataset): it is read ``chunk_bytes`` at a time.
    ``codec``: ``"auto"`` (the default: ``"zstd"``, or ``"zstd_shuffleN"`` for
    N = 2, 4 or 8-byte numbers when the shuffle shrinks a sample of rows by 3%;
    an existing store's codec when appending), ``"auto-speed"`` (that rule with
    ``"lz4"``/``"lz4_shuffleN"``: faster to decode, larger), ``"raw"`` (no
    per-record metadata), ``"zstd_dict"`` (a ``dict_size``-byte dictionary,
    112 KiB by default, trained from sample rows, kept for life), or any of
    ``CODECS``. ``progress=True`` shows a progress bar on a terminal when
    writing takes over a second; a stream (``progress=sys.stderr``) always gets
    it. A URL ``path`` ("Writing to object storage") gets a sharded dataset,
    uploaded in shards of ``shard_bytes`` (256 MiB) staged in ``staging_dir``.
    """
    if is_remote(path):
        _checked_options(codec, schema, mode, chunk_bytes, dict_size, progress)
        options = (chunk_bytes, dict_size, schema, progress)
        remote = {"storage_options": storage_options, "staging_dir": staging_dir}
        return _to_url(from_numpy, path, array, codec, options, mode, remote, shard_bytes)
    _no_shard_bytes(shard_bytes)
    codec, mode, chunk_bytes, dict_size = _checked_options(
        codec, schema, mode, chunk_bytes, dict_size, progress
    )
    source = _array_like(array)
    target = _dense_target(source, codec, schema)
    row_count, row_bytes = int(source.shape[0]), target.item_bytes
    rows_per_chunk = max(1, min(chunk_bytes // max(row_bytes, 1), chunk_bytes // RECORD_COST_BYTES))

    def rows(start: int, end: int) -> np.ndarray:
        block = np.asarray(source[start:end])
        if block.dtype != target.dtype:
            block = block.astype(target.dtype, casting="same_kind")
        return np.ascontiguousarray(block).reshape(end - start, *target.item_shape)

    if is_auto(codec):
        target = dataclasses.replace(
            target,
            codec=auto_codec(
                path, mode, target, lambda: _dense_trial(rows, row_count, row_bytes), codec
            ),
        )

    def fill(writer: Writer) -> int:
        return _write_dense(writer, rows, row_count, rows_per_chunk, dict_size, progress)

    return write_store(path, target, mode, fill, _fs, _staged)


def from_iterator(
    path: StrPath,
    source: Iterable[npt.ArrayLike],
    codec: str | int = "auto",
    chunk_bytes: int = CHUNK_BYTES,
    dict_size: int | None = None,
    schema: Schema | dict[str, Any] | None = None,
    progress: bool | TextIO = True,
    mode: str = "w",
    *,
    storage_options: dict[str, Any] | None = None,
    staging_dir: StrPath | None = None,
    shard_bytes: int | None = None,
    _fs: OsFs = OS_FS,
    _staged: bool = False,
) -> int:
    """Writes one ragged record per item of ``source`` to the store at
    ``path``; returns the records written. ``mode`` is as for ``from_numpy``
    (``"w"`` replaces an existing store, ``"a"`` appends, ``"x"`` refuses).

    A record is an array ``(rows, *item_shape)`` with any number of rows
    (zero included), or ``bytes`` (raw rows of the store's dtype; ``uint8``
    when the first record is bytes). The dtype and ``item_shape`` come from
    the first record (or from ``schema=``); a record of another dtype or row
    shape raises ``ValueError`` naming it, and nothing of the call is kept.
    ``codec``, ``chunk_bytes``, ``dict_size`` and ``progress`` are as for
    ``from_numpy`` (the dictionary is trained from the first chunk; ``"auto"``
    tries the shuffle filter on the first records, up to 64 or 4 MiB).
    ``path`` may be a URL, with ``storage_options``, ``staging_dir`` and
    ``shard_bytes`` (of record bytes) as for ``from_numpy``.
    """
    if is_remote(path):
        _checked_options(codec, schema, mode, chunk_bytes, dict_size, progress)
        options = (chunk_bytes, dict_size, schema, progress)
        remote = {"storage_options": storage_options, "staging_dir": staging_dir}
        return _to_url(from_iterator, path, source, codec, options, mode, remote, shard_bytes)
    _no_shard_bytes(shard_bytes)
    codec, mode, chunk_bytes, dict_size = _checked_options(
        codec, schema, mode, chunk_bytes, dict_size, progress
    )
    try:
        # Sized sources only: the others raise TypeError.
        total: int | None = len(source)  # type: ignore[arg-type]
    except TypeError:
        total = None
    iterator = iter(source)
    first = next(iterator, _END)
    decided = _ragged_target(path, first, codec, schema, mode)
    if decided is None:
        return 0  # an empty source appended to a ragged store
    target, forced_dtype = decided
    head: list[Any] = [] if first is _END else [first]
    if is_auto(codec):
        head = [_copy_record(item) for item in head] + _peek_records(iterator, head)
        target = dataclasses.replace(
            target,
            codec=auto_codec(
                path, mode, target, lambda: _ragged_trial(head, target, forced_dtype), codec
            ),
        )

    def fill(writer: Writer) -> int:
        records = itertools.chain(head, iterator)
        meter = Progress(progress, "from_iterator", total_records=total)
        return _write_ragged(writer, records, target, forced_dtype, chunk_bytes, dict_size, meter)

    return write_store(path, target, mode, fill, _fs, _staged)


def _to_url(
    convert: Callable[..., int],
    path: StrPath,
    data: Any,
    codec: str | int,
    options: tuple[Any, ...],
    mode: str,
    remote: dict[str, Any],
    shard_bytes: int | None,
) -> int:
    """A converter's write to a URL: the input cut into shards of about
    ``shard_bytes``, each staged by ``convert`` (with the first shard's
    codec, or the dataset's when appending, when ``codec`` is ``"auto"``)."""
    shard_bytes = check_int("shard_bytes", shard_bytes or SHARD_BYTES, 1, 1 << 62)

    def part(chunk: Any) -> Callable[[str, Schema | None], int]:
        def build(local: str, existing: Schema | None) -> int:
            chosen = existing.codec if existing is not None and codec == "auto" else codec
            return convert(local, chunk, chosen, *options, "x")

        return build

    chunks = (
        _dense_chunks(data, shard_bytes)
        if convert is from_numpy
        else _ragged_chunks(data, shard_bytes)
    )
    return write_remote_store(os.fspath(path), mode, map(part, chunks), **remote)


def _no_shard_bytes(shard_bytes: int | None) -> None:
    if shard_bytes is not None:
        raise ValueError(
            "shard_bytes applies to a URL target (it cuts the upload into shards); a local store "
            "is one store: write a sharded dataset with loaderx.shards.write_shard"
        )


def _dense_chunks(array: npt.ArrayLike, shard_bytes: int) -> Iterator[Any]:
    """Row slices of ``array`` of about ``shard_bytes`` each (at least one)."""
    source = _array_like(array)
    if not source.shape:
        yield source  # the converter refuses it, with its own message
        return
    row_bytes = max(1, math.prod(source.shape[1:]) * np.dtype(source.dtype).itemsize)
    per_shard = max(1, shard_bytes // row_bytes)
    for start in range(0, max(1, int(source.shape[0])), per_shard):
        yield source[start : start + per_shard]


def _ragged_chunks(records: Iterable[Any], shard_bytes: int) -> Iterator[Iterator[Any]]:
    """The records cut into runs of about ``shard_bytes`` (at least one run),
    each a lazy iterator that must be consumed before the next is taken."""
    iterator = iter(records)
    pending = [next(iterator, _END)]

    def run() -> Iterator[Any]:
        total = 0
        while pending[0] is not _END and total < shard_bytes:
            item = pending[0]
            yield item
            total += _record_bytes(item)
            pending[0] = next(iterator, _END)  # after the converter took the record

    yield run()
    while pending[0] is not _END:
        yield run()


def _checked_options(
    codec: str | int,
    schema: Schema | dict[str, Any] | None,
    mode: str,
    chunk_bytes: int,
    dict_size: int | None,
    progress: bool | TextIO,
) -> tuple[str, str, int, int]:
    """A converter's codec (a schema that names its codec is followed),
    mode, chunk bytes and dictionary size, checked before anything is read."""
    codec = codec_name(codec, allow_auto=True)
    if is_auto(codec) and isinstance(schema, dict) and "codec" in schema:
        codec = codec_name(schema["codec"])
    check_progress(progress)
    return codec, _mode(mode), check_chunk_bytes(chunk_bytes), _dict_size(dict_size, codec)


def _dense_target(source: Any, codec: str, schema: Schema | dict[str, Any] | None) -> Schema:
    """The schema ``from_numpy`` writes ``source`` with (``"zstd"`` stands in
    for ``"auto"`` until the trial decides)."""
    shape = tuple(int(size) for size in source.shape)
    if not shape:
        raise ValueError(
            "from_numpy writes one record per row along axis 0, so it needs an array of at least "
            "one dimension, got a 0-d array"
        )
    dtype = np.dtype(source.dtype)
    _check_dtype(dtype, "array")
    target = _forced_schema("dense", dtype, shape[1:], "zstd" if is_auto(codec) else codec, schema)
    if target.dtype != dtype and not np.can_cast(dtype, target.dtype, casting="same_kind"):
        raise ValueError(
            f"cannot convert {dtype} to the schema's {target.dtype} (only same-kind casts, e.g. "
            "float64 to float32)"
        )
    if math.prod(target.item_shape) != math.prod(shape[1:]):
        raise ValueError(
            f"rows of shape {shape[1:]} cannot be reshaped to the schema's item_shape "
            f"{target.item_shape}"
        )
    return target


def _write_dense(
    writer: Writer,
    rows: Callable[[int, int], np.ndarray],
    row_count: int,
    rows_per_chunk: int,
    dict_size: int,
    progress: bool | TextIO,
) -> int:
    """``from_numpy``'s writes: the dictionary first, then the rows chunk by chunk."""
    codec, row_bytes = writer.schema.codec, writer.schema.item_bytes
    if uses_dictionary(codec) and row_count and not writer.store.has_dict():
        samples = dense_samples(rows, row_count, row_bytes, dict_size)
        writer.train_dictionary(shuffled_samples(samples, row_bytes, codec), dict_size)
    meter = Progress(progress, "from_numpy", total_bytes=row_count * row_bytes)
    offsets = np.arange(min(rows_per_chunk, row_count), dtype=np.uint64) * np.uint64(row_bytes)
    for start in range(0, row_count, rows_per_chunk):
        end = min(row_count, start + rows_per_chunk)
        writer.append(rows(start, end), offsets[: end - start])
        meter.update(end, end * row_bytes)
    writer.commit()
    meter.finish(row_count, row_count * row_bytes)
    return row_count


def _ragged_target(
    path: StrPath,
    first: Any,
    codec: str,
    schema: Schema | dict[str, Any] | None,
    mode: str,
) -> tuple[Schema, bool] | None:
    """The schema ``from_iterator`` writes with, from its first record (``_END``
    for an empty source), and whether records are cast to its dtype; None
    when an empty source appends to a ragged store (nothing to write)."""
    stand_in = "zstd" if is_auto(codec) else codec
    if first is _END:
        if schema is None:
            existing = read_schema(path) if os.path.isdir(os.fspath(path)) else None
            if existing is not None and existing.kind == "ragged" and mode == "a":
                return None
            raise ValueError(
                "from_iterator got an empty source, so there is no record to infer the dtype and "
                "item shape from: pass schema={'dtype': ..., 'item_shape': ...} to create an empty "
                "store"
            )
        target = _forced_schema("ragged", None, None, stand_in, schema)
        forced_dtype = True
    else:
        record = _record_array(first, 0, None)
        target = _forced_schema("ragged", record.dtype, record.shape[1:], stand_in, schema)
        forced_dtype = isinstance(schema, Schema) or (
            isinstance(schema, dict) and "dtype" in schema
        )
    if target.item_bytes == 0:
        raise ValueError(
            f"rows of shape {target.item_shape} hold no bytes, so a ragged record could not tell "
            "its row count: give rows at least one element"
        )
    return target, forced_dtype


def _write_ragged(
    writer: Writer,
    records: Iterable[Any],
    target: Schema,
    cast: bool,
    chunk_bytes: int,
    dict_size: int,
    meter: Progress,
) -> int:
    """``from_iterator``'s writes: records packed into chunks (one that fills
    a chunk alone appended at once), the dictionary trained on the first."""
    packed = _PackedRecords(chunk_bytes, max(1, chunk_bytes // RECORD_COST_BYTES))
    count = written_bytes = 0

    def write(buffer: npt.NDArray[np.uint8], sizes: list[int]) -> None:
        nonlocal written_bytes
        if uses_dictionary(target.codec) and not writer.store.has_dict():
            ends = np.cumsum(sizes)
            samples = [buffer[end - size : end] for size, end in zip(sizes, ends.tolist())]
            writer.train_dictionary(shuffled_samples(samples, None, target.codec), dict_size)
        sizes_array = np.asarray(sizes, dtype=np.uint64)
        writer.append(buffer, np.cumsum(sizes_array) - sizes_array)
        written_bytes += buffer.size
        meter.update(count, written_bytes)

    for position, item in enumerate(records):
        record = _record_array(item, position, target, cast=cast)
        data = np.ascontiguousarray(record).reshape(-1).view(np.uint8)
        count += 1
        if packed.sizes and not packed.fits(data.size):
            write(*packed.take())
        if data.size >= chunk_bytes:
            write(data, [data.size])  # appended at once, so the source may reuse its buffer
        else:
            packed.add(data)  # copied, so the source may reuse its buffer
    if packed.sizes:
        write(*packed.take())
    writer.commit()
    meter.finish(count, written_bytes)
    return count


class _PackedRecords:
    """Ragged records copied back to back into one reused buffer, so a source
    that refills one array for every record is read correctly."""

    def __init__(self, capacity_bytes: int, capacity_records: int):
        self.buffer = np.empty(capacity_bytes, dtype=np.uint8)
        self.capacity_records = capacity_records
        self.sizes: list[int] = []
        self.used = 0

    def fits(self, size: int) -> bool:
        return self.used + size <= self.buffer.size and len(self.sizes) < self.capacity_records

    def add(self, data: np.ndarray) -> None:
        self.buffer[self.used : self.used + data.size] = data
        self.used += data.size
        self.sizes.append(data.size)

    def take(self) -> tuple[npt.NDArray[np.uint8], list[int]]:
        """The packed bytes and their sizes; the buffer is free again after
        the caller has written them."""
        packed = (self.buffer[: self.used], self.sizes)
        self.sizes, self.used = [], 0
        return packed


# ---- input checks ---------------------------------------------------------------

_END = object()


def _mode(mode: object) -> str:
    if mode not in ("w", "a", "x"):
        raise ValueError(
            "mode must be 'w' (create or overwrite), 'a' (create or append) or 'x' (create only), "
            f"got {mode!r}"
        )
    return mode


def _dict_size(dict_size: int | None, codec: str) -> int:
    if dict_size is None:
        return DICT_BYTES
    if not uses_dictionary(codec):
        raise ValueError(
            "dict_size only applies to codec='zstd_dict' (or a zstd_dict_shuffle codec), not "
            f"{codec!r}"
        )
    # The bounds are the core's (zig/format.zig): zstd cannot train below 256 B.
    return check_int("dict_size", dict_size, DICT_BYTES_MIN, DICT_BYTES_MAX)


def _check_dtype(dtype: np.dtype, what: str) -> None:
    if dtype.hasobject:
        raise TypeError(
            f"{what} has dtype {dtype}, which holds Python objects a store cannot hold: convert it "
            "to a numeric, string or bytes dtype first"
        )


def _array_like(array: npt.ArrayLike) -> Any:  # Any: an array, or a lazily sliced array-like
    """``array`` itself when it can be sliced lazily (NumPy arrays, memmaps,
    HDF5 or zarr arrays), else ``np.asarray(array)``."""
    if isinstance(array, np.ndarray):
        return array
    if hasattr(array, "shape") and hasattr(array, "dtype") and hasattr(array, "__getitem__"):
        return array
    return np.asarray(array)


def build_dense_store(
    path: str,
    array: np.ndarray,
    codec: str,
    files: dict[str, bytes] | None = None,
    generation: str | None = None,
) -> None:
    """Writes ``array`` (at least 1-d) as a dense store in the new directory
    ``path``, with ``files`` (name: bytes) beside it, for ArrayStore's staging.

    Fewer fsyncs than ``from_numpy``: nobody reads the directory until its
    owner renames it into place, so the schema needs no atomic rename, and
    the store is created staged (its empty superblock unsynced). The schema
    is written first and fsynced; the appends' commits and the closing
    ``sync()`` make the store and the directory's entries durable. The
    directory's own entry in ``path``'s parent is the owner's to sync (its
    commit fsyncs the parent). A raw array goes in as few appends as the
    per-call record bound allows (each append is one commit). ``generation``
    (an id its owner's commit record names it by, which survives a copy of
    the directory) is recorded in the schema file, which readers of the
    schema ignore."""
    schema = _forced_schema("dense", array.dtype, array.shape[1:], codec, None)
    os.mkdir(path)
    schema_fields = {
        **schema.to_dict(),
        **({"generation": generation} if generation is not None else {}),
    }
    for name, payload in {
        SCHEMA_FILE: msgpack.packb(schema_fields, use_bin_type=True),
        **(files or {}),
    }.items():
        write_file_durable(os.path.join(path, name), payload)
    with Zrecord(path, codec=codec, create=True, _staged=True) as store:
        row_count, row_bytes = len(array), schema.item_bytes

        def rows(start: int, end: int) -> np.ndarray:
            return np.ascontiguousarray(array[start:end])

        if codec == "zstd_dict" and row_count:
            train_dictionary(
                store, dense_samples(rows, row_count, row_bytes, DICT_BYTES), DICT_BYTES
            )
        per_append = CHUNK_BYTES // RECORD_COST_BYTES
        if codec != "raw" or not array.flags.c_contiguous:
            per_append = max(
                1, min(per_append, CHUNK_BYTES // max(row_bytes, 1))
            )  # bounds the encoded or copied chunk
        offsets = np.arange(min(per_append, row_count), dtype=np.uint64) * np.uint64(row_bytes)
        for start in range(0, row_count, per_append):
            end = min(row_count, start + per_append)
            store.append(rows(start, end), offsets[: end - start])
        store.sync()


def clone_array(
    path: str, source: str, version: object = None, generation: str | None = None
) -> None:
    """Writes a copy of the array directory ``source`` (a real path) at the
    new ``path``, each file by ``_fs.copy_file`` (a reflink where the file
    system has them) and fsynced, and the directory fsynced: complete and
    durable when it returns. The schema file is written anew with
    ``generation`` (what a commit record names the copy by). ``version``
    (ignored here) fingerprints the source, so that a simulated disk
    memoising builds by their arguments tells its states apart."""
    del version
    os.mkdir(path)
    for item in sorted(os.listdir(source)):
        origin = os.path.join(source, item)
        if item == SCHEMA_FILE or not os.path.isfile(origin):
            continue
        copy_file(origin, os.path.join(path, item))
    schema = msgpack.unpackb(read_at_most(os.path.join(source, SCHEMA_FILE), 1 << 16), raw=False)
    if not isinstance(schema, dict):
        raise ValueError(f"the schema file of '{source}' is damaged: it is not a map")
    fields = {**schema, **({"generation": generation} if generation is not None else {})}
    write_file_durable(os.path.join(path, SCHEMA_FILE), msgpack.packb(fields, use_bin_type=True))
    fsync_directory(path)


def _forced_schema(
    kind: str,
    dtype: npt.DTypeLike | None,
    item_shape: Iterable[int] | None,
    codec: str,
    schema: Schema | dict[str, Any] | None,
) -> Schema:
    """The schema of the data, with the fields ``schema`` forces."""
    if schema is not None:
        if isinstance(schema, Schema):
            schema = {"kind": schema.kind, "dtype": schema.dtype, "item_shape": schema.item_shape}
        if not isinstance(schema, dict):
            raise TypeError(
                "schema must be a dict with 'dtype' and/or 'item_shape', got "
                f"{type(schema).__name__}"
            )
        unknown = set(schema) - {"kind", "dtype", "item_shape", "codec"}
        if unknown:
            raise ValueError(
                f"schema has unknown keys {sorted(unknown)}: it takes 'dtype' and 'item_shape'"
            )
        if schema.get("kind", kind) != kind:
            raise ValueError(
                f"schema kind {schema['kind']!r} does not fit: "
                f"{'from_numpy' if kind == 'dense' else 'from_iterator'} writes {kind} stores"
            )
        if schema.get("codec", codec) != codec:
            raise ValueError(
                f"schema codec {schema['codec']!r} differs from codec={codec!r}: give the codec "
                "once"
            )
        if "dtype" in schema:
            dtype = np.dtype(schema["dtype"])
        if "item_shape" in schema:
            item_shape = tuple(schema["item_shape"])
    if dtype is None or item_shape is None:
        raise ValueError(
            "schema must give both 'dtype' and 'item_shape' when there is no data to take them from"
        )
    _check_dtype(np.dtype(dtype), "schema")
    return Schema(kind, np.dtype(dtype), tuple(item_shape), codec)


def _record_array(
    item: object, position: int, target: Schema | None, cast: bool = False
) -> npt.NDArray[Any]:
    """Record ``position`` of a ragged source as an array of rows; checked
    against ``target`` (the store's schema) when given."""
    if isinstance(item, (bytes, bytearray, memoryview)):
        raw = np.frombuffer(item, dtype=np.uint8)
        if target is None or (target.dtype == np.uint8 and target.item_shape == ()):
            return raw
        if raw.size % target.item_bytes:
            raise ValueError(
                f"record {position} is {raw.size} bytes, not a whole number of "
                f"{target.item_bytes}-byte rows ({target.dtype} items of shape "
                f"{target.item_shape})"
            )
        return raw.view(target.dtype).reshape(-1, *target.item_shape)
    record = item if isinstance(item, np.ndarray) else np.asarray(item)
    if record.ndim == 0:
        raise ValueError(
            f"record {position} is a scalar ({record.dtype}): a ragged record needs a leading row "
            "axis, e.g. np.atleast_1d(x)"
        )
    _check_dtype(record.dtype, f"record {position}")
    if target is None:
        return record
    if record.shape[1:] != target.item_shape:
        raise ValueError(
            f"record {position} has rows of shape {record.shape[1:]}, but the store's rows have "
            f"shape {target.item_shape}"
        )
    if record.dtype != target.dtype:
        if not cast or not np.can_cast(record.dtype, target.dtype, casting="same_kind"):
            raise ValueError(
                f"record {position} has dtype {record.dtype}, but the store's dtype is "
                f"{target.dtype}"
            )
        record = record.astype(target.dtype, casting="same_kind")
    return record


# ---- the trial records of codec="auto" ----------------------------------------------------------


def _trial_rows(row_count: int, row_bytes: int) -> tuple[int, int]:
    """How many rows the trial takes, and how many bytes of each."""
    per_row = min(row_bytes, TRIAL_BYTES_MAX)
    return min(row_count, TRIAL_RECORDS_MAX, max(1, TRIAL_BYTES_MAX // max(per_row, 1))), per_row


def _dense_trial(
    rows: Callable[[int, int], np.ndarray], row_count: int, row_bytes: int
) -> tuple[np.ndarray, np.ndarray]:
    """Rows spread evenly over the array (a long row: its first 4 MiB), packed."""
    count, per_row = _trial_rows(row_count, row_bytes)
    if count == 0 or per_row == 0:
        return np.empty(0, dtype=np.uint8), np.zeros(1, dtype=np.uint64)
    picks = np.unique(np.linspace(0, row_count - 1, count).astype(np.int64))
    packed = np.concatenate(
        [rows(int(row), int(row) + 1).reshape(-1).view(np.uint8)[:per_row] for row in picks]
    )
    return packed, np.arange(picks.size, dtype=np.uint64) * np.uint64(per_row)


def _peek_records(iterator: Iterator[Any], head: list[Any]) -> list[Any]:
    """Copies of the next records of ``iterator`` until the trial has enough
    (copies: a source may refill one buffer for every record)."""
    taken: list[Any] = []
    total = sum(_record_bytes(item) for item in head)
    while len(head) + len(taken) < TRIAL_RECORDS_MAX and total < TRIAL_BYTES_MAX:
        item = next(iterator, _END)
        if item is _END:
            break
        taken.append(_copy_record(item))
        total += _record_bytes(item)
    return taken


def _copy_record(item: Any) -> Any:
    """A record that stays as it is when the source refills its buffer."""
    if isinstance(item, (bytearray, memoryview)):
        return bytes(item)
    return np.array(item) if isinstance(item, np.ndarray) else item


def _record_bytes(item: Any) -> int:
    return (
        len(item)
        if isinstance(item, (bytes, bytearray, memoryview))
        else int(np.asarray(item).nbytes)
    )


def _ragged_trial(head: list[Any], target: Schema, cast: bool) -> tuple[np.ndarray, np.ndarray]:
    """The first records of a ragged source, packed (each cut to 4 MiB)."""
    return packed_trial(
        [
            np.ascontiguousarray(_record_array(item, position, target, cast=cast))
            .reshape(-1)
            .view(np.uint8)[:TRIAL_BYTES_MAX]
            for position, item in enumerate(head)
        ]
    )
