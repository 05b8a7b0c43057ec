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

import contextlib
import dataclasses
import itertools
import math
import os
import sys
import time
from typing import Any, Callable, Iterable, Iterator, Literal, TextIO, cast

import msgpack
import numpy as np
import numpy.typing as npt

from ._checks import check_int
from ._fs import OS_FS, DirectorySwap, OsFs, write_file_durable
from ._native import LIMITS
from .schema import SCHEMA_FILE, Schema, StrPath, read_schema, write_schema
from .zrecord import CODECS, SHUFFLE_ELEMENT_BYTES, StoreLockedError, Zrecord, ZrecordError, codec_id, encoded_bytes, is_creation_leftover, shuffled_codec

__all__ = ["from_iterator", "from_numpy", "CHUNK_BYTES_MAX"]

MiB = 1 << 20
CHUNK_BYTES = 64 * MiB
#: chunk_bytes is a memory budget: a chunk of rows is read (and for
#: from_iterator a buffer of that size allocated) before each append. 4 GiB
#: is 64x the default, which already appends at disk speed; 10**15 asked
#: for a petabyte buffer.
CHUNK_BYTES_MAX = 4 << 30
DICT_BYTES = 112 * 1024
DICT_BYTES_MIN = LIMITS["dict_bytes_min"]
DICT_BYTES_MAX = LIMITS["dict_bytes_max"]
# Bounds the records per append (and so the native per-record state) when
# records are tiny: a chunk holds at most chunk_bytes // 64 records.
_RECORD_COST_BYTES = 64
# Dictionary training: samples of at most this many bytes each, about 100x
# the dictionary size in total (zstd's advice), and at least this many.
_SAMPLE_PIECE_BYTES = 128 * 1024
_SAMPLE_BUDGET_MAX = 32 * MiB
_SAMPLE_PIECES_MIN = 16
# codec="auto" tries the shuffle filter on at most this many records, of at
# most this many bytes in all, and keeps it when the sample shrinks by at
# least _SHUFFLE_GAIN_MIN (the measurements behind it: README, "Byte shuffle").
_TRIAL_RECORDS_MAX = 64
_TRIAL_BYTES_MAX = 4 * MiB
_SHUFFLE_GAIN_MIN = 0.03


def from_numpy(
    path: StrPath, array: npt.ArrayLike, codec: str | int = "auto", chunk_bytes: int = CHUNK_BYTES, dict_size: int | None = None,
    schema: Schema | dict[str, Any] | None = None, progress: bool | TextIO = True, mode: str = "w", *, _fs: OsFs = OS_FS, _staged: bool = False,
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
    ``codec`` is ``"auto"`` (the default: ``"zstd"``, or ``"zstd_shuffleN"``
    for numeric dtypes of N = 2, 4 or 8-byte elements when the byte-shuffle
    filter shrinks a sample of rows by at least 3%; an existing store's codec
    when appending), ``"zstd"``, ``"raw"`` (dense raw stores cost no
    per-record metadata), ``"zstd_dict"``, whose dictionary is trained from a
    sample of rows before the first write (``dict_size`` bytes, 112 KiB by
    default; a store keeps its first dictionary for life), or any of
    ``CODECS`` (``"zstd_shuffle4"``, ``"zstd_dict_shuffle8"``...). ``progress=True`` shows a
    progress bar on a terminal when writing takes more than a second; a text
    stream (``progress=sys.stderr``) gets the bar whether or not it is one.
    """
    codec = _codec_name(codec, allow_auto=True)
    if codec == "auto" and isinstance(schema, dict) and "codec" in schema:
        codec = _codec_name(schema["codec"])  # a schema that names its codec is followed
    mode = _mode(mode)
    chunk_bytes = check_chunk_bytes(chunk_bytes)
    dict_size = _dict_size(dict_size, codec)
    check_progress(progress)
    source = _array_like(array)
    shape = tuple(int(size) for size in source.shape)
    if not shape:
        raise ValueError("from_numpy writes one record per row along axis 0, so it needs an array of at least one dimension, got a 0-d array")
    dtype = np.dtype(source.dtype)
    _check_dtype(dtype, "array")
    target = _forced_schema("dense", dtype, shape[1:], "zstd" if codec == "auto" else codec, schema)
    if target.dtype != dtype and not np.can_cast(dtype, target.dtype, casting="same_kind"):
        raise ValueError(f"cannot convert {dtype} to the schema's {target.dtype} (only same-kind casts, e.g. float64 to float32)")
    if math.prod(target.item_shape) != math.prod(shape[1:]):
        raise ValueError(f"rows of shape {shape[1:]} cannot be reshaped to the schema's item_shape {target.item_shape}")
    row_count = shape[0]
    row_bytes = target.item_bytes
    rows_per_chunk = max(1, min(chunk_bytes // max(row_bytes, 1), chunk_bytes // _RECORD_COST_BYTES))

    def rows(start: int, end: int) -> np.ndarray:
        block = np.asarray(source[start:end])
        if block.dtype != target.dtype:
            block = block.astype(target.dtype, casting="same_kind")
        return np.ascontiguousarray(block).reshape(end - start, *target.item_shape)

    if codec == "auto":
        target = dataclasses.replace(target, codec=_auto_codec(path, mode, target, lambda: _dense_trial(rows, row_count, row_bytes)))
    def fill(writer: _Writer) -> int:
        if _uses_dictionary(target.codec) and row_count and not writer.store.has_dict():
            samples = _dense_samples(rows, row_count, row_bytes, dict_size)
            writer.train_dictionary(_shuffled_samples(samples, row_bytes, target.codec), dict_size)
        meter = _Progress(progress, "from_numpy", total_bytes=row_count * row_bytes)
        offsets = np.arange(min(rows_per_chunk, row_count), dtype=np.uint64) * np.uint64(row_bytes)
        for start in range(0, row_count, rows_per_chunk):
            end = min(row_count, start + rows_per_chunk)
            writer.append(rows(start, end), offsets[: end - start])
            meter.update(end, end * row_bytes)
        writer.commit()
        meter.finish(row_count, row_count * row_bytes)
        return row_count

    return _convert(path, target, mode, fill, _fs, _staged)


def from_iterator(
    path: StrPath, source: Iterable[npt.ArrayLike], codec: str | int = "auto", chunk_bytes: int = CHUNK_BYTES, dict_size: int | None = None,
    schema: Schema | dict[str, Any] | None = None, progress: bool | TextIO = True, mode: str = "w", *, _fs: OsFs = OS_FS, _staged: bool = False,
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
    """
    codec = _codec_name(codec, allow_auto=True)
    if codec == "auto" and isinstance(schema, dict) and "codec" in schema:
        codec = _codec_name(schema["codec"])  # a schema that names its codec is followed
    mode = _mode(mode)
    chunk_bytes = check_chunk_bytes(chunk_bytes)
    dict_size = _dict_size(dict_size, codec)
    check_progress(progress)
    try:
        total: int | None = len(source)  # type: ignore[arg-type]  # sized sources only: the others raise TypeError
    except TypeError:
        total = None
    iterator = iter(source)
    first = next(iterator, _END)
    if first is _END:
        if schema is None:
            existing = read_schema(path) if os.path.isdir(os.fspath(path)) else None
            if existing is not None and existing.kind == "ragged" and mode == "a":
                return 0
            raise ValueError("from_iterator got an empty source, so there is no record to infer the dtype and item shape from: pass schema={'dtype': ..., 'item_shape': ...} to create an empty store")
        target = _forced_schema("ragged", None, None, "zstd" if codec == "auto" else codec, schema)
        forced_dtype = True
    else:
        record = _record_array(first, 0, None)
        target = _forced_schema("ragged", record.dtype, record.shape[1:], "zstd" if codec == "auto" else codec, schema)
        forced_dtype = isinstance(schema, Schema) or (isinstance(schema, dict) and "dtype" in schema)
    if target.item_bytes == 0:
        raise ValueError(f"rows of shape {target.item_shape} hold no bytes, so a ragged record could not tell its row count: give rows at least one element")
    records_per_chunk = max(1, chunk_bytes // _RECORD_COST_BYTES)
    head: list[Any] = [] if first is _END else [first]
    if codec == "auto":
        head = [_copy_record(item) for item in head] + _peek_records(iterator, head)
        target = dataclasses.replace(target, codec=_auto_codec(path, mode, target, lambda: _ragged_trial(head, target, forced_dtype)))

    def fill(writer: _Writer) -> int:
        meter = _Progress(progress, "from_iterator", total_records=total)
        packed = _PackedRecords(chunk_bytes, records_per_chunk)
        count = written_bytes = 0

        def write(buffer: npt.NDArray[np.uint8], sizes: list[int]) -> None:
            nonlocal written_bytes
            if _uses_dictionary(target.codec) and not writer.store.has_dict():
                ends = np.cumsum(sizes)
                samples = [buffer[end - size : end] for size, end in zip(sizes, ends.tolist())]
                writer.train_dictionary(_shuffled_samples(samples, None, target.codec), dict_size)
            sizes_array = np.asarray(sizes, dtype=np.uint64)
            writer.append(buffer, np.cumsum(sizes_array) - sizes_array)
            written_bytes += buffer.size
            meter.update(count, written_bytes)

        for position, item in enumerate(itertools.chain(head, iterator)):
            record = _record_array(item, position, target, cast=forced_dtype)
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

    return _convert(path, target, mode, fill, _fs, _staged)


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


# ---- the write session --------------------------------------------------------


class _Writer:
    """One conversion's writes into one store: ``new`` a fresh store in a
    directory nobody reads yet (the staging directory of a ``DirectorySwap``),
    else the existing store at ``path`` appended to in place, whose records
    this call appended are deleted again on failure."""

    def __init__(self, path: str, schema: Schema, new: bool) -> None:
        self.path = path
        self.schema = schema
        existing = None if new else _existing_schema(path, OS_FS)
        if existing is not None and existing != schema:
            raise ValueError(_mismatch(path, existing, schema))
        self.new = existing is None  # a new store, or a bare Zrecord store without a schema yet
        # Commits skip their fsyncs: commit() syncs once at the end. A crash
        # before that leaves a new store without its schema (never swapped
        # in), and an existing one at its last synced state, so the call
        # stays all or nothing; each chunk's append no longer waits for its
        # own three fsyncs.
        self.store = Zrecord(path, codec=schema.codec, durable=False, create=new, _staged=new)
        self.first = len(self.store)
        self.appending = not new

    def __enter__(self) -> _Writer:
        return self

    def __exit__(self, kind: object, error: BaseException | None, traceback: object) -> Literal[False]:
        try:
            if error is not None and self.appending:
                self._roll_back()
        finally:
            self.store.close()
        return False

    def append(self, buffer: np.ndarray, offsets: np.ndarray) -> None:
        self.store.append(buffer, offsets)

    def train_dictionary(self, samples: list[npt.NDArray[np.uint8]], dict_size: int) -> None:
        _train_dictionary(self.store, samples, dict_size)

    def commit(self) -> None:
        """Data durable first, then the schema that makes it a loaderx store."""
        self.store.sync()
        if self.new:
            write_schema(self.path, self.schema)

    def _roll_back(self) -> None:
        """Deletes what this call appended to an existing store (a new one is
        its owner's to delete)."""
        try:
            end = len(self.store)
            if end > self.first:
                self.store.delete(np.arange(self.first, end, dtype=np.uint64), keep_order=True)
                self.store.sync()
        except Exception:
            pass  # the error that stopped the conversion is the one to report


def _convert(path: StrPath, schema: Schema, mode: str, fill: Callable[[_Writer], int], fs: OsFs, staged: bool) -> int:
    """Runs ``fill`` (the conversion's writes, ending with ``commit``) into
    the store ``mode`` asks for at ``path``: appended to in place (``"a"``
    on an existing store), or a new store built beside it and swapped in
    (a first creation, or ``"w"`` over an old store) under the path's lock,
    so that every open sees the old store whole or the new one whole.
    ``staged``: ``path`` is the new staging directory of a swap its caller
    runs (a shard's), written directly."""
    target = os.fspath(path)
    if staged:
        with _Writer(target, schema, new=True) as writer:
            return fill(writer)
    if mode == "a" and _store_state(target, fs) == "store":
        return _append_in_place(fs.real_path(target), schema, fill)
    if fs.exists(target) and not fs.replaceable(target) and _store_state(target, fs) == "fresh":
        return _create_in_place(target, schema, fill, fs)
    count = 0
    with DirectorySwap(target, fs, _locked) as swap:
        state = _store_state(target, fs)  # again, under the lock: another writer may have finished meanwhile
        if state == "store" and mode == "x":
            raise FileExistsError(
                f"'{target}' exists and is not empty: pass mode='w' to overwrite the store there or mode='a' to append to it"
            )
        if state == "store" and mode == "a":
            return _append_in_place(fs.real_path(target), schema, fill)
        old_lock = _lock_store(target, fs) if state == "store" else None
        try:
            def build(staging: str) -> None:
                nonlocal count
                with _Writer(staging, schema, new=True) as writer:
                    count = fill(writer)

            swap.build(build)
            swap.commit()
        finally:
            if old_lock is not None:
                fs.unlock(old_lock)
    return count


def _create_in_place(target: str, schema: Schema, fill: Callable[[_Writer], int], fs: OsFs) -> int:
    """A first creation in an empty directory that cannot be swapped away (a
    mount point, or a parent this process may not write): the store is
    written in place, as before the one swap, and a failure deletes what it
    wrote (the directory held nothing else, or only a killed creation's
    leftovers), as loaderx did before the one swap."""
    try:
        with _Writer(target, schema, new=True) as writer:
            return fill(writer)
    except BaseException:
        for name in fs.listdir(target):
            with contextlib.suppress(OSError):
                fs.rmtree(os.path.join(target, name))
        raise


def _append_in_place(target: str, schema: Schema, fill: Callable[[_Writer], int]) -> int:
    with _Writer(target, schema, new=False) as writer:
        return fill(writer)


def _locked(message: str) -> StoreLockedError:
    return StoreLockedError(f"cannot write the store: {message}", 6)


def _store_state(path: str, fs: OsFs) -> str:
    """``"fresh"`` (absent, empty, or only a killed creation's leftovers:
    ours to replace) or ``"store"``; ValueError for anything else, which is
    never replaced or deleted."""
    if not fs.exists(path):
        return "fresh"
    if not fs.isdir(path):
        raise ValueError(f"'{path}' exists and is not a directory: give a new or empty directory for the store")
    if fs.exists(os.path.join(path, "superblock")):
        return "store"
    names = fs.listdir(path)
    if all(is_creation_leftover(name) for name in names):
        return "fresh"
    raise ValueError(f"'{path}' is a non-empty directory that is not a loaderx store: give a new or empty directory, or an existing store")


def _lock_store(target: str, fs: OsFs) -> Any:  # Any: the seam's lock handle
    """Takes the write lock of the store ``target`` (zrecord's ``flock`` on its
    ``lock`` file), so no writer appends to a store being replaced."""
    try:
        return fs.lock(os.path.join(target, "lock"))
    except BlockingIOError:
        raise StoreLockedError(
            f"cannot overwrite '{target}': another process (or handle) is writing to it; retry when it is done", 6
        ) from None


def _existing_schema(path: str, fs: OsFs) -> Schema | None:
    """The schema of the store at ``path``, or None for an empty zrecord store
    without one; a clear error for anything else."""
    schema = read_schema(fs.real_path(path))
    if schema is not None:
        return schema
    with Zrecord(fs.real_path(path)) as store:
        count = len(store)
    if count:
        raise ValueError(
            f"'{path}' holds {count} records but no schema.msgpack (an interrupted conversion, or a bare Zrecord "
            "store): delete the directory and convert again, or read it with loaderx.Zrecord"
        )
    return None


def _mismatch(path: str, existing: Schema, new: Schema) -> str:
    hints = []
    if existing.kind != new.kind:
        hints.append(f"it is a {existing.kind} store (write it with {'from_numpy' if existing.kind == 'dense' else 'from_iterator'})")
    if existing.dtype != new.dtype:
        hints.append(f"its dtype is {existing.dtype.str}, the data's is {new.dtype.str} (pass schema={{'dtype': '{existing.dtype.str}'}} to convert)")
    if existing.item_shape != new.item_shape:
        hints.append(f"its item shape is {existing.item_shape}, the data's is {new.item_shape}")
    if existing.codec != new.codec:
        hints.append(f"it was written with codec={existing.codec!r}, this call uses {new.codec!r} (pass codec={existing.codec!r})")
    return f"cannot append to '{path}': the schema does not match, nothing was written: " + "; ".join(hints)


# ---- input checks ---------------------------------------------------------------

_END = object()


def _codec_name(codec: str | int, allow_auto: bool = False) -> str:
    """The codec's name (codecs may also be given by id); ValueError if unknown.
    ``"auto"`` passes when the converter picks the codec itself."""
    if allow_auto and codec == "auto":
        return "auto"
    value = codec_id(codec)
    return next(name for name, number in CODECS.items() if number == value)


def _mode(mode: object) -> str:
    if mode not in ("w", "a", "x"):
        raise ValueError(f"mode must be 'w' (create or overwrite), 'a' (create or append) or 'x' (create only), got {mode!r}")
    return mode


def check_chunk_bytes(value: Any) -> int:  # Any: checked here
    """``chunk_bytes`` of a converter: an int in 1..CHUNK_BYTES_MAX."""
    return check_int("chunk_bytes", value, 1, CHUNK_BYTES_MAX)


def check_progress(progress: Any) -> None:  # Any: checked here
    """``progress`` is True, False or a text stream (anything with ``write``):
    a string such as ``"yes"`` is refused, not taken as a truthy flag."""
    if not isinstance(progress, (bool, np.bool_)) and not callable(getattr(progress, "write", None)):
        raise TypeError(f"progress must be True, False or a text stream such as sys.stderr, got {type(progress).__name__} {progress!r}")


def _dict_size(dict_size: int | None, codec: str) -> int:
    if dict_size is None:
        return DICT_BYTES
    if not _uses_dictionary(codec):
        raise ValueError(f"dict_size only applies to codec='zstd_dict' (or a zstd_dict_shuffle codec), not {codec!r}")
    # The bounds are the core's (zig/format.zig): zstd cannot train below 256 B.
    return check_int("dict_size", dict_size, DICT_BYTES_MIN, DICT_BYTES_MAX)


def _check_dtype(dtype: np.dtype, what: str) -> None:
    if dtype.hasobject:
        raise TypeError(f"{what} has dtype {dtype}, which holds Python objects a store cannot hold: convert it to a numeric, string or bytes dtype first")


def _array_like(array: npt.ArrayLike) -> Any:  # Any: an array, or a lazily sliced array-like
    """``array`` itself when it can be sliced lazily (NumPy arrays, memmaps,
    HDF5 or zarr arrays), else ``np.asarray(array)``."""
    if isinstance(array, np.ndarray):
        return array
    if hasattr(array, "shape") and hasattr(array, "dtype") and hasattr(array, "__getitem__"):
        return array
    return np.asarray(array)


def build_dense_store(path: str, array: np.ndarray, codec: str, files: dict[str, bytes] | None = None, generation: str | None = None) -> None:
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
    schema_fields = {**schema.to_dict(), **({"generation": generation} if generation is not None else {})}
    for name, payload in {SCHEMA_FILE: msgpack.packb(schema_fields, use_bin_type=True), **(files or {})}.items():
        write_file_durable(os.path.join(path, name), payload)
    with Zrecord(path, codec=codec, create=True, _staged=True) as store:
        row_count, row_bytes = len(array), schema.item_bytes

        def rows(start: int, end: int) -> np.ndarray:
            return np.ascontiguousarray(array[start:end])

        if codec == "zstd_dict" and row_count:
            _train_dictionary(store, _dense_samples(rows, row_count, row_bytes, DICT_BYTES), DICT_BYTES)
        per_append = CHUNK_BYTES // _RECORD_COST_BYTES
        if codec != "raw" or not array.flags.c_contiguous:
            per_append = max(1, min(per_append, CHUNK_BYTES // max(row_bytes, 1)))  # bounds the encoded or copied chunk
        offsets = np.arange(min(per_append, row_count), dtype=np.uint64) * np.uint64(row_bytes)
        for start in range(0, row_count, per_append):
            end = min(row_count, start + per_append)
            store.append(rows(start, end), offsets[: end - start])
        store.sync()


def _forced_schema(
    kind: str, dtype: npt.DTypeLike | None, item_shape: Iterable[int] | None, codec: str,
    schema: Schema | dict[str, Any] | None,
) -> Schema:
    """The schema of the data, with the fields ``schema`` forces."""
    if schema is not None:
        if isinstance(schema, Schema):
            schema = {"kind": schema.kind, "dtype": schema.dtype, "item_shape": schema.item_shape}
        if not isinstance(schema, dict):
            raise TypeError(f"schema must be a dict with 'dtype' and/or 'item_shape', got {type(schema).__name__}")
        unknown = set(schema) - {"kind", "dtype", "item_shape", "codec"}
        if unknown:
            raise ValueError(f"schema has unknown keys {sorted(unknown)}: it takes 'dtype' and 'item_shape'")
        if schema.get("kind", kind) != kind:
            raise ValueError(f"schema kind {schema['kind']!r} does not fit: {'from_numpy' if kind == 'dense' else 'from_iterator'} writes {kind} stores")
        if schema.get("codec", codec) != codec:
            raise ValueError(f"schema codec {schema['codec']!r} differs from codec={codec!r}: give the codec once")
        if "dtype" in schema:
            dtype = np.dtype(schema["dtype"])
        if "item_shape" in schema:
            item_shape = tuple(schema["item_shape"])
    if dtype is None or item_shape is None:
        raise ValueError("schema must give both 'dtype' and 'item_shape' when there is no data to take them from")
    _check_dtype(np.dtype(dtype), "schema")
    return Schema(kind, np.dtype(dtype), tuple(item_shape), codec)


def _record_array(item: object, position: int, target: Schema | None, cast: bool = False) -> npt.NDArray[Any]:
    """Record ``position`` of a ragged source as an array of rows; checked
    against ``target`` (the store's schema) when given."""
    if isinstance(item, (bytes, bytearray, memoryview)):
        raw = np.frombuffer(item, dtype=np.uint8)
        if target is None or (target.dtype == np.uint8 and target.item_shape == ()):
            return raw
        if raw.size % target.item_bytes:
            raise ValueError(f"record {position} is {raw.size} bytes, not a whole number of {target.item_bytes}-byte rows ({target.dtype} items of shape {target.item_shape})")
        return raw.view(target.dtype).reshape(-1, *target.item_shape)
    record = item if isinstance(item, np.ndarray) else np.asarray(item)
    if record.ndim == 0:
        raise ValueError(f"record {position} is a scalar ({record.dtype}): a ragged record needs a leading row axis, e.g. np.atleast_1d(x)")
    _check_dtype(record.dtype, f"record {position}")
    if target is None:
        return record
    if record.shape[1:] != target.item_shape:
        raise ValueError(f"record {position} has rows of shape {record.shape[1:]}, but the store's rows have shape {target.item_shape}")
    if record.dtype != target.dtype:
        if not cast or not np.can_cast(record.dtype, target.dtype, casting="same_kind"):
            raise ValueError(f"record {position} has dtype {record.dtype}, but the store's dtype is {target.dtype}")
        record = record.astype(target.dtype, casting="same_kind")
    return record


# ---- the codec "auto" picks ----------------------------------------------------------


def _uses_dictionary(codec: str) -> bool:
    return codec.startswith("zstd_dict")


def _shuffle_element_bytes(dtype: np.dtype) -> int | None:
    """The element size the shuffle filter would use for ``dtype``: its item
    size for numbers (half of it for complex, two floats) when that is 2, 4 or
    8; None for bytes, strings, structured dtypes and 1-byte numbers."""
    if dtype.fields is not None or dtype.subdtype is not None or dtype.kind not in "iufcmM":
        return None
    element_bytes = dtype.itemsize // 2 if dtype.kind == "c" else dtype.itemsize
    return element_bytes if element_bytes in SHUFFLE_ELEMENT_BYTES else None


def _auto_codec(path: StrPath, mode: str, target: Schema, trial: Callable[[], tuple[np.ndarray, np.ndarray]]) -> str:
    """The codec ``codec="auto"`` picks: an existing store's own when
    appending to it; else ``zstd_shuffleN`` when the dtype has N-byte
    elements and shuffled records of the ``trial`` sample (packed bytes and
    offsets) take at least ``_SHUFFLE_GAIN_MIN`` less space than plain zstd
    frames; else ``zstd``."""
    if mode == "a" and os.path.isdir(os.fspath(path)):
        existing = read_schema(path)
        if existing is not None and existing.kind == target.kind:
            return existing.codec
    element_bytes = _shuffle_element_bytes(target.dtype)
    if element_bytes is None:
        return "zstd"
    packed, offsets = trial()
    if packed.size == 0:
        return "zstd"
    candidate = shuffled_codec("zstd", element_bytes)
    plain = encoded_bytes(packed, offsets, "zstd")
    shuffled = encoded_bytes(packed, offsets, candidate)
    return candidate if shuffled <= plain * (1 - _SHUFFLE_GAIN_MIN) else "zstd"


def _trial_rows(row_count: int, row_bytes: int) -> tuple[int, int]:
    """How many rows the trial takes, and how many bytes of each."""
    per_row = min(row_bytes, _TRIAL_BYTES_MAX)
    return min(row_count, _TRIAL_RECORDS_MAX, max(1, _TRIAL_BYTES_MAX // max(per_row, 1))), per_row


def _dense_trial(rows: Callable[[int, int], np.ndarray], row_count: int, row_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows spread evenly over the array (a long row: its first 4 MiB), packed."""
    count, per_row = _trial_rows(row_count, row_bytes)
    if count == 0 or per_row == 0:
        return np.empty(0, dtype=np.uint8), np.zeros(1, dtype=np.uint64)
    picks = np.unique(np.linspace(0, row_count - 1, count).astype(np.int64))
    packed = np.concatenate([rows(int(row), int(row) + 1).reshape(-1).view(np.uint8)[:per_row] for row in picks])
    return packed, np.arange(picks.size, dtype=np.uint64) * np.uint64(per_row)


def _peek_records(iterator: Iterator[Any], head: list[Any]) -> list[Any]:
    """Copies of the next records of ``iterator`` until the trial has enough
    (copies: a source may refill one buffer for every record)."""
    taken: list[Any] = []
    total = sum(_record_bytes(item) for item in head)
    while len(head) + len(taken) < _TRIAL_RECORDS_MAX and total < _TRIAL_BYTES_MAX:
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
    return len(item) if isinstance(item, (bytes, bytearray, memoryview)) else int(np.asarray(item).nbytes)


def _ragged_trial(head: list[Any], target: Schema, cast: bool) -> tuple[np.ndarray, np.ndarray]:
    """The first records of a ragged source, packed (each cut to 4 MiB)."""
    return _packed_trial([
        np.ascontiguousarray(_record_array(item, position, target, cast=cast)).reshape(-1).view(np.uint8)[:_TRIAL_BYTES_MAX]
        for position, item in enumerate(head)
    ])


def _packed_trial(pieces: list[npt.NDArray[np.uint8]]) -> tuple[np.ndarray, np.ndarray]:
    """A trial's records packed back to back and their starts (empty ones
    left out: they tell the codecs apart by nothing)."""
    pieces = [piece for piece in pieces if piece.size]
    if not pieces:
        return np.empty(0, dtype=np.uint8), np.zeros(1, dtype=np.uint64)
    sizes = np.fromiter((piece.size for piece in pieces), dtype=np.uint64, count=len(pieces))
    return np.concatenate(pieces), np.cumsum(sizes) - sizes


def _shuffle_record(record: npt.NDArray[np.uint8], element_bytes: int) -> npt.NDArray[np.uint8]:
    """``record`` byte-shuffled as zrecord stores it (bytes past the last whole
    element stay at the end)."""
    whole = record.size // element_bytes * element_bytes
    planes = record[:whole].reshape(-1, element_bytes).T.reshape(-1)
    return np.concatenate([planes, record[whole:]])


def _shuffled_samples(samples: list[npt.NDArray[np.uint8]], record_bytes: int | None, codec: str) -> list[npt.NDArray[np.uint8]]:
    """Dictionary samples as the shuffled codec compresses them: each record
    shuffled (``record_bytes``: the samples hold whole records of that length;
    None: each sample is one record)."""
    if "_shuffle" not in codec:
        return samples
    element_bytes = int(codec.rsplit("_shuffle", 1)[1])
    shuffled = []
    for sample in samples:
        records = [sample] if record_bytes is None else np.split(sample, max(1, sample.size // max(record_bytes, 1)))
        shuffled.append(np.concatenate([_shuffle_record(record, element_bytes) for record in records]))
    return shuffled


# ---- dictionary training ---------------------------------------------------------


def _dense_samples(
    rows: Callable[[int, int], npt.NDArray[Any]], row_count: int, row_bytes: int, dict_size: int,
) -> list[npt.NDArray[np.uint8]]:
    """Rows spread evenly over the array, about 100x ``dict_size`` bytes."""
    budget = min(100 * dict_size, _SAMPLE_BUDGET_MAX)
    wanted = min(row_count, max(1, budget // max(row_bytes, 1)))
    blocks = min(64, wanted)
    per_block = max(1, wanted // blocks)
    starts = np.linspace(0, row_count - per_block, blocks).astype(np.int64)
    return [rows(int(start), int(start) + per_block).reshape(-1).view(np.uint8) for start in np.unique(starts)]


def _train_dictionary(store: Zrecord, samples: list[npt.NDArray[np.uint8]], dict_size: int) -> None:
    """Trains the store's dictionary from byte ``samples`` cut into pieces, so
    that few large records still give zstd enough samples."""
    total = sum(sample.size for sample in samples)
    budget = min(100 * dict_size, _SAMPLE_BUDGET_MAX)
    piece_bytes = max(8, min(_SAMPLE_PIECE_BYTES, min(total, budget) // _SAMPLE_PIECES_MIN))
    pieces, used = [], 0
    for sample in samples:
        for start in range(0, sample.size, piece_bytes):
            piece = sample[start : start + piece_bytes]
            pieces.append(piece)
            used += piece.size
            if used >= budget:
                break
        if used >= budget:
            break
    if used < DICT_BYTES_MIN or len(pieces) < 8:
        raise ValueError(
            f"too little data to train a zstd dictionary ({used} bytes in {len(pieces)} samples): "
            "use codec='zstd' for data this small, or convert more rows"
        )
    target = max(DICT_BYTES_MIN, min(dict_size, used))
    sizes = np.fromiter((piece.size for piece in pieces), dtype=np.uint64, count=len(pieces))
    try:
        store.train_dict(np.concatenate(pieces), sizes, target)
    except ZrecordError as exc:
        raise ValueError(f"could not train a zstd dictionary from {used} bytes in {len(pieces)} samples ({exc}); use codec='zstd', or convert more varied rows") from exc


# ---- progress ----------------------------------------------------------------------


class _Progress:
    """A one-line progress bar: with ``progress=True`` on stderr, only when it
    is a terminal and once the work has taken more than a second; with a text
    stream (``progress=sys.stderr``), on that stream from the start."""

    delay_seconds = 1.0
    interval_seconds = 0.2

    def __init__(
        self, enabled: bool | TextIO, label: str, total_bytes: int | None = None, total_records: int | None = None,
    ) -> None:
        forced = hasattr(enabled, "write")
        self.stream: TextIO = cast(TextIO, enabled) if forced else sys.stderr  # forced: it has write()
        if forced:
            self.delay_seconds = 0.0
        try:
            self.enabled = forced or (bool(enabled) and self.stream is not None and self.stream.isatty())
        except (AttributeError, ValueError):
            self.enabled = False
        self.label = label
        self.total_bytes = total_bytes
        self.total_records = total_records
        self.started = time.monotonic()
        self.last = 0.0
        self.shown = False

    def update(self, records: int, done_bytes: int, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and (now - self.started < self.delay_seconds or now - self.last < self.interval_seconds):
            return
        self.last = now
        self.shown = True
        rate = done_bytes / max(now - self.started, 1e-9) / MiB
        if self.total_bytes:
            fraction = min(1.0, done_bytes / self.total_bytes)
            filled = int(fraction * 30)
            text = f"{self.label} [{'#' * filled}{'.' * (30 - filled)}] {fraction:4.0%} {done_bytes / MiB:,.0f}/{self.total_bytes / MiB:,.0f} MiB {rate:,.0f} MiB/s"
        else:
            of = f"/{self.total_records:,}" if self.total_records is not None else ""
            text = f"{self.label}: {records:,}{of} records, {done_bytes / MiB:,.0f} MiB, {rate:,.0f} MiB/s"
        self.stream.write("\r" + text)
        self.stream.flush()

    def finish(self, records: int, done_bytes: int) -> None:
        if self.shown or (self.enabled and not self.delay_seconds):
            self.update(records, done_bytes, force=True)
            self.stream.write("\n")
            self.stream.flush()

