"""Zrecord: the persistent record store (Python side of zig/store.zig).

A record is a byte range. ``append`` takes records packed back to back in
one buffer, ``gather`` decodes a batch of records straight into a caller's
buffer on native threads with the GIL released. Every write commits
atomically; see the README's "Store format" section for the guarantees.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Iterable
from typing import Any, Callable, NamedTuple, cast

import numpy as np
import numpy.typing as npt

from ._checks import check_flag, check_int, check_verify
from ._errors import StoreFullError, StoreOSError, StoreReadOnlyError, ZrecordError
from ._fs import OS_FS, OsFs
from ._native import (
    LIMITS,
    STATUS,
    ChecksumError,
    CorruptStoreError,
    IndexOutOfRangeError,
    InvalidArgumentError,
    NoDictionaryError,
    StoreLockedError,
    check,
    ffi,
    lib,
)

__all__ = [
    "CODECS",
    "MAX_RECORD_LEN",
    "SHUFFLE_ELEMENT_BYTES",
    "THREADS_MAX",
    "ChecksumError",
    "CorruptStoreError",
    "IndexOutOfRangeError",
    "InvalidArgumentError",
    "DestinationOverlapError",
    "NoDictionaryError",
    "StoreClosedError",
    "StoreFullError",
    "StoreLockedError",
    "StoreOSError",
    "StoreReadOnlyError",
    "StoreReplacedError",
    "Zrecord",
    "ZrecordError",
]


class Codec(NamedTuple):
    """One codec of the core's table (zig/format.zig): its name and id, the
    element bytes it byte-shuffles records by (1: none), and whether it
    compresses with the store's trained dictionary."""

    name: str
    id: int
    element_bytes: int
    uses_dictionary: bool


def _codec_table() -> dict[str, Codec]:
    """The core's codecs, read once at import: the one definition is Zig's."""
    try:
        count = int(lib.lx_codec_count())
    except AttributeError:  # pragma: no cover - a stale build
        raise ImportError(
            "loaderx's native library has no codec table: rebuild loaderx with `pip install -e .`"
        ) from None
    table = {}
    name = ffi.new("char[64]")
    numbers = [ffi.new("uint32_t *") for _ in range(3)]
    for index in range(count):
        check(lib.lx_codec_get(index, name, len(name), *numbers))
        codec = Codec(
            ffi.string(name).decode(), int(numbers[0][0]), int(numbers[1][0]), bool(numbers[2][0])
        )
        table[codec.name] = codec
    return table


CODEC_TABLE = _codec_table()
#: Codec names and their ids: ``raw``, ``zstd``, ``zstd_dict``, ``lz4`` and
#: the byte-shuffled ``zstd_shuffleN`` / ``zstd_dict_shuffleN`` / ``lz4_shuffleN``.
CODECS = {codec.name: codec.id for codec in CODEC_TABLE.values()}
SHUFFLE_ELEMENT_BYTES = tuple(sorted({codec.element_bytes for codec in CODEC_TABLE.values()} - {1}))
MAX_RECORD_LEN = LIMITS["record_bytes_max"]
#: Native threads of one gather (0: one per core). The native pool has one
#: thread per core, so a larger cap only splits a call into more hand-offs;
#: 1024 is four times the cores of the largest common hosts.
THREADS_MAX = 1024
_VERIFY_CHUNK = 1 << 20
LAYOUTS = ("empty", "fixed", "indexed")  # lx_store_info.layout

_INFO_BYTES = ffi.sizeof("lx_store_info")
if lib.lx_store_info_bytes() != _INFO_BYTES:  # pragma: no cover - a stale build
    raise ImportError(
        f"lx_store_info is {lib.lx_store_info_bytes()} bytes in the library but "
        f"{_INFO_BYTES} in _abi.h: rebuild loaderx with `pip install -e .`"
    )


class StoreClosedError(ZrecordError, ValueError):
    """An operation on a closed ``Zrecord``."""


class DestinationOverlapError(InvalidArgumentError):
    """Two records of one ``gather`` would be decoded into overlapping byte
    ranges of the destination. A ``ZrecordError`` like the native checks of
    destination ranges, and a ``ValueError`` as an argument error."""


class StoreReplacedError(ZrecordError):
    """The store directory was replaced by another one (``ArrayStore.save``
    overwriting an array) since this handle opened it: its data is fine, the
    handle is stale."""


def codec_id(codec: str | int | np.integer[Any]) -> int:
    """The numeric id of a codec name (or id); ValueError for anything else."""
    if isinstance(codec, str) and codec in CODECS:
        return CODECS[codec]
    if (
        isinstance(codec, (int, np.integer))
        and not isinstance(codec, bool)
        and int(codec) in CODECS.values()
    ):
        return int(codec)
    raise InvalidArgumentError(f"unknown codec {codec!r}: use one of {sorted(CODECS)}")


def codec_parts(codec: str | int | np.integer[Any]) -> Codec:
    """The table entry of a codec name (or id); InvalidArgumentError if unknown."""
    value = codec_id(codec)
    return next(entry for entry in CODEC_TABLE.values() if entry.id == value)


def shuffled_codec(codec: str, element_bytes: int) -> str:
    """The name of ``codec`` ("zstd", "zstd_dict" or "lz4") with the
    byte-shuffle filter for ``element_bytes``-byte elements (2, 4 or 8): the
    table names it ``<codec>_shuffle<N>``."""
    base = CODEC_TABLE.get(codec)
    name = f"{codec}_shuffle{element_bytes}"
    if base is None or base.name == "raw" or base.element_bytes != 1 or name not in CODEC_TABLE:
        bases = sorted(
            entry.name for entry in CODEC_TABLE.values() if f"{entry.name}_shuffle2" in CODEC_TABLE
        )
        raise InvalidArgumentError(
            f"the shuffle filter applies to {', '.join(map(repr, bases))} with 2, 4 or 8-byte "
            f"elements, not {codec!r} with {element_bytes}-byte elements"
        )
    return name


def shuffle_bytes(record: npt.NDArray[np.uint8], element_bytes: int) -> npt.NDArray[np.uint8]:
    """``record`` (contiguous bytes) byte-shuffled by ``element_bytes`` as a
    shuffled codec compresses it (zig/shuffle.zig; bytes past the last whole
    element stay at the end)."""
    source = np.ascontiguousarray(record, dtype=np.uint8).reshape(-1)
    target = np.empty_like(source)
    pointer = ffi.from_buffer("uint8_t[]", source) if source.size else ffi.NULL
    out = ffi.from_buffer("uint8_t[]", target, require_writable=True) if source.size else ffi.NULL
    check(lib.lx_codec_shuffle(pointer, source.size, element_bytes, out))
    return target


def changed_rows(
    edited: npt.NDArray[np.uint8],
    original: npt.NDArray[np.uint8],
    row_bytes: int,
    pages: npt.NDArray[np.uint64],
    page_bytes: int,
) -> npt.NDArray[np.uint64]:
    """The rows (ascending, each once) where the flat contiguous bytes
    ``edited`` and ``original`` (whole rows of ``row_bytes``) differ, among
    the rows that overlap ``pages`` (ascending numbers of ``page_bytes``
    pages from the start), each compared whole (zig/changes.zig)."""
    assert edited.flags.c_contiguous and original.flags.c_contiguous
    rows = edited.size // row_bytes

    def call(*found: Any) -> None:
        edited_bytes = ffi.from_buffer("uint8_t[]", edited)
        original_bytes = ffi.from_buffer("uint8_t[]", original)
        check(lib.lx_changed_rows(edited_bytes, original_bytes, rows, row_bytes, *found))

    return changed_rows_with(call, rows, row_bytes, pages, page_bytes)


def changed_rows_with(
    call: Callable[..., None],
    rows: int,
    row_bytes: int,
    pages: npt.NDArray[np.uint64],
    page_bytes: int,
) -> npt.NDArray[np.uint64]:
    """Runs a native changed-rows call, ``call(pages, page_count,
    page_bytes, rows_out, capacity, count_out)``, with room for every row
    that ``pages`` overlap; returns the rows it found."""
    pages = np.ascontiguousarray(pages, dtype=np.uint64)
    capacity = min(rows, pages.size * (page_bytes // row_bytes + 2))
    out = np.empty(capacity, dtype=np.uint64)
    count = ffi.new("uint64_t *")
    if pages.size and rows:
        call(u64_pointer(pages), pages.size, page_bytes, u64_pointer(out), capacity, count)
    return out[: count[0]]


def encoded_bytes(src: Any, offsets: npt.ArrayLike, codec: str | int) -> int:
    """The bytes the records packed in ``src`` (as for ``append``) would take
    in a store with ``codec``, records that a frame does not shrink counted
    raw; nothing is written. Dictionary codecs need a store and are refused."""
    source, source_bytes = _read_buffer(src, "src")
    starts = _offsets(offsets, source_bytes)
    out = ffi.new("uint64_t *")
    check(
        lib.lx_encoded_bytes(
            source,
            source_bytes,
            u64_pointer(starts),
            starts.size,
            codec_id(codec),
            0,
            out,
        )
    )
    return int(out[0])


def as_indices(idxs: npt.ArrayLike, name: str = "indices") -> npt.NDArray[np.uint64]:
    """Indices as a contiguous uint64 array; IndexError for negative values."""
    if (
        type(idxs) is np.ndarray
        and idxs.dtype == np.uint64
        and idxs.ndim == 1
        and idxs.flags.c_contiguous
    ):
        return idxs  # the loader's hot path: nothing to convert or check
    if isinstance(idxs, (int, np.integer)) and not isinstance(idxs, bool):
        idxs = cast("npt.ArrayLike", [idxs])  # a list of one NumPy integer is array-like too
    array = np.asarray(idxs)
    if array.ndim != 1:
        raise InvalidArgumentError(f"{name} must be one-dimensional, got shape {array.shape}")
    if array.size == 0:
        return np.empty(0, dtype=np.uint64)
    if array.dtype.kind not in "iu":
        raise TypeError(f"{name} must be integers, got dtype {array.dtype}")
    if array.dtype.kind == "i" and array.min() < 0:
        raise IndexOutOfRangeError(
            f"negative index {int(array.min())} in {name}: zrecord indices run from 0 to len-1"
        )
    return np.ascontiguousarray(array, dtype=np.uint64)


def _read_buffer(source: Any, name: str) -> tuple[Any, int]:
    """A cffi uint8_t array over a C-contiguous bytes-like object, and its length."""
    if isinstance(source, np.ndarray):
        if not source.flags.c_contiguous:
            raise InvalidArgumentError(
                f"{name} must be C-contiguous: pass np.ascontiguousarray({name})"
            )
        return ffi.from_buffer("uint8_t[]", source), source.nbytes
    try:
        view = memoryview(source)
    except TypeError:
        raise TypeError(
            f"{name} must be a bytes-like object or a NumPy array, got {type(source).__name__}"
        ) from None
    if not view.c_contiguous:
        raise InvalidArgumentError(f"{name} must be C-contiguous")
    return ffi.from_buffer("uint8_t[]", view), view.nbytes


def _write_buffer(target: Any, name: str) -> tuple[Any, int]:
    """A cffi uint8_t array over a writable C-contiguous buffer, and its length."""
    if isinstance(target, np.ndarray):
        if not target.flags.c_contiguous:
            raise InvalidArgumentError(
                f"{name} must be C-contiguous: gather into a contiguous array, then copy"
            )
        if not target.flags.writeable:
            raise InvalidArgumentError(f"{name} is read-only")
        return ffi.from_buffer("uint8_t[]", target, require_writable=True), target.nbytes
    view = memoryview(target)
    if view.readonly:
        raise InvalidArgumentError(
            f"{name} is read-only: pass a bytearray or a writable NumPy array"
        )
    if not view.c_contiguous:
        raise InvalidArgumentError(f"{name} must be C-contiguous")
    return ffi.from_buffer("uint8_t[]", view, require_writable=True), view.nbytes


def _offsets(offsets: npt.ArrayLike, source_bytes: int) -> npt.NDArray[np.uint64]:
    # The ArrayStore's hot path (cached uint64 offsets): only the two ends to check.
    if (
        type(offsets) is np.ndarray
        and offsets.dtype == np.uint64
        and offsets.ndim == 1
        and offsets.size
        and offsets.flags.c_contiguous
        and offsets.item(0) == 0
        and offsets.item(-1) <= source_bytes
    ):
        return offsets
    array = np.asarray(offsets)
    if array.ndim != 1:
        raise InvalidArgumentError(f"offsets must be one-dimensional, got shape {array.shape}")
    if array.size == 0:
        raise InvalidArgumentError("empty batch: give at least one record (offsets is empty)")
    if array.dtype.kind not in "iu":
        raise TypeError(f"offsets must be integers, got dtype {array.dtype}")
    if array.dtype.kind == "i" and array.min() < 0:
        raise InvalidArgumentError("offsets must be non-negative")
    array = np.ascontiguousarray(array, dtype=np.uint64)
    if array[0] != 0:
        # Bytes before offsets[0] would belong to no record and be dropped.
        raise InvalidArgumentError(
            f"offsets[0] is {int(array[0])}, but records are packed from the start of the source: "
            "offsets must start at 0 (slice the source instead)"
        )
    # Non-decreasing offsets are checked by the core in the same pass that
    # measures the records (a NumPy pass here cost 0.5 ms per 500K records).
    if int(array[-1]) > source_bytes:
        raise InvalidArgumentError(
            f"offsets[-1] = {int(array[-1])} is past the end of the source ({source_bytes} bytes)"
        )
    return array


def gather_arguments(
    idxs: npt.ArrayLike,
    dst: Any,
    offsets: npt.ArrayLike | None,
    lengths: Callable[[npt.NDArray[np.uint64]], npt.NDArray[np.uint64]],
) -> tuple[npt.NDArray[np.uint64], Any, int, npt.NDArray[np.uint64] | None]:
    """A gather's checked arguments: uint64 indices, the target pointer and
    its bytes, and the target offsets as a uint64 array (None: records back
    to back), whose ranges must not overlap (``lengths`` gives the records'
    lengths). The caller keeps the arrays alive across the native call."""
    indices = as_indices(idxs)
    target, target_bytes = _write_buffer(dst, "dst")
    target_offsets = None
    if offsets is not None:
        target_offsets = np.ascontiguousarray(np.asarray(offsets), dtype=np.uint64)
        if target_offsets.shape != indices.shape:
            raise InvalidArgumentError(
                f"gather got {indices.size} indices but {target_offsets.size} offsets"
            )
        if indices.size > 1:
            _check_disjoint(lengths(indices), indices, target_offsets)
    return indices, target, target_bytes, target_offsets


def _check_disjoint(
    lengths: npt.NDArray[np.uint64],
    indices: npt.NDArray[np.uint64],
    starts: npt.NDArray[np.uint64],
) -> None:
    """DestinationOverlapError when two records' destination ranges overlap (the second
    would overwrite the first). Sorts only offsets that are not already
    increasing; empty records write nothing and never overlap."""
    positions = np.flatnonzero(lengths)
    starts, ends = starts[positions], starts[positions] + lengths[positions]
    if starts.size > 1 and np.any(starts[1:] < starts[:-1]):
        order = np.argsort(starts, kind="stable")
        positions, starts, ends = positions[order], starts[order], ends[order]
    # Sorted by start, a range overlapping any later one overlaps its successor.
    clashes = np.flatnonzero(ends[:-1] > starts[1:])
    if clashes.size:
        first, second = positions[clashes[0]], positions[clashes[0] + 1]
        raise DestinationOverlapError(
            f"gather destination ranges overlap: record {int(indices[first])} goes to bytes "
            f"[{int(starts[clashes[0]])}, {int(ends[clashes[0]])}) and record "
            f"{int(indices[second])} to "
            f"[{int(starts[clashes[0] + 1])}, {int(ends[clashes[0] + 1])}) of dst: give each "
            "record its own range"
        )


_FIRST_BYTE = ffi.new("uint64_t[1]")  # the offsets of one record that starts its src (read only)


def encode_buffer(data: Any, codec: str) -> memoryview:
    """The contiguous bytes ``data`` encoded with ``codec`` (one that needs no
    dictionary) as a record of that codec is stored: one zstd or LZ4 frame,
    of the bytes shuffled first for a shuffled codec. The caller keeps the
    raw bytes where the frame is not smaller."""
    source, source_bytes = _read_buffer(data, "data")
    value = codec_id(codec)
    bound = ffi.new("uint64_t *")
    check(lib.lx_codec_bound(value, source_bytes, bound))
    target = np.empty(max(int(bound[0]), 1), dtype=np.uint8)
    written = ffi.new("uint64_t *")
    out, capacity = _write_buffer(target, "target")
    check(lib.lx_codec_encode(value, source, source_bytes, out, capacity, written))
    return target.data[: written[0]]


def decode_buffer(payload: Any, codec: str, target: Any) -> None:
    """Decodes ``payload``, a frame ``encode_buffer`` wrote with ``codec``,
    into the writable buffer ``target``, which it must fill exactly:
    CorruptStoreError if it is not such a frame."""
    source, source_bytes = _read_buffer(payload, "payload")
    out, target_bytes = _write_buffer(target, "target")
    check(lib.lx_codec_decode(codec_id(codec), source, source_bytes, out, target_bytes))


def u64_pointer(array: npt.NDArray[np.uint64]) -> Any:
    return ffi.from_buffer("uint64_t[]", array) if array.size else ffi.NULL


class NativeHandle:
    """The lifetime of a native handle shared by ``Zrecord`` and
    ``ShardedStore``: every native call runs between ``_enter`` and
    ``_leave``, so ``close()`` waits for calls in flight on other threads and
    no call ever sees a freed handle. Subclasses free the handle in
    ``_release`` and name themselves in ``_closed_message``."""

    _handle: Any

    # The condition close() waits on while calls are in flight; made by the
    # close() that finds some, so an open pays nothing of threading.Condition.
    _state: threading.Condition | None = None

    def _init_lifetime(self) -> None:
        # A plain lock (entered in C) around the count: a call pays two lock
        # round trips and nothing of threading.Condition's Python code.
        self._lock = threading.Lock()
        self._active = 0
        self._closed = False

    def _closed_message(self) -> str:
        raise NotImplementedError

    def _release(self) -> None:
        raise NotImplementedError

    def _enter(self) -> Any:
        with self._lock:
            if self._closed:
                raise StoreClosedError(self._closed_message())
            self._active += 1
        return self._handle

    def _leave(self) -> None:
        with self._lock:
            self._active -= 1
            # close() sets _closed (and makes _state) under this lock before
            # it waits, so the last call to leave after that wakes it.
            if self._active == 0 and self._closed:
                assert self._state is not None
                self._state.notify_all()

    def _lengths_with(
        self, function: Callable[..., int], idxs: npt.ArrayLike
    ) -> npt.NDArray[np.uint64]:
        """The decoded lengths of records ``idxs``, from one native call."""
        indices = as_indices(idxs)
        out = np.empty(indices.size, dtype=np.uint64)
        if indices.size == 0:
            return out
        handle = self._enter()
        try:
            status = function(handle, u64_pointer(indices), indices.size, u64_pointer(out))
        finally:
            self._leave()
        check(status)
        return out

    def _gather_rows_with(
        self,
        function: Callable[..., int],
        indices: npt.NDArray[np.uint64],
        row_bytes: int,
        target: npt.NDArray[np.uint8] | None,
    ) -> tuple[int, npt.NDArray[np.int64]]:
        """One native ragged gather (zig/ragged.zig) of checked uint64
        ``indices``: the bytes the batch needs and the records' row offsets
        (``indices.size + 1``), packed from the start of ``target``. If the
        bytes exceed ``target`` (or it is None), nothing was read and the
        offsets are in bytes: call again with a larger target."""
        offsets = np.empty(indices.size + 1, dtype=np.int64)
        needed = ffi.new("uint64_t *")
        pointer = ffi.NULL if target is None else ffi.from_buffer("uint8_t[]", target)
        handle = self._enter()
        try:
            status = function(
                handle,
                u64_pointer(indices),
                indices.size,
                row_bytes,
                pointer,
                0 if target is None else target.nbytes,
                ffi.from_buffer("uint64_t[]", offsets),
                needed,
            )
        finally:
            self._leave()
        if status:
            check(status)
        return int(needed[0]), offsets

    def close(self) -> None:
        """Closes the handle (idempotent); waits for calls in flight on other threads."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._active:
                self._state = threading.Condition(self._lock)
                while self._active:
                    self._state.wait()
        self._release()

    def __del__(self) -> None:
        try:
            if not self._closed:
                self.close()
        except Exception:
            pass

    @property
    def closed(self) -> bool:
        return self._closed


class Zrecord(NativeHandle):
    """A zrecord store directory, opened (or created) at ``path``.

    ``codec`` is the default for ``append`` and ``replace``. Reads check
    record checksums by default wherever that costs little: every record of
    the indexed layout (compressed, ragged or mixed stores), where the
    checksum costs a fraction of the read. The fixed layout (raw records of
    one length, read straight from the mapping) is checked by 16 KiB blocks,
    which a read of a small record would hash whole, so it is not checked
    unless ``verify=True``; ``verify=True`` checks every read, ``verify=False``
    none (``verify()`` checks everything either way). ``threads`` caps the native
    threads a batch call uses (0: one per core). A non-empty directory that
    is not a store is refused unless ``create=True``. ``durable=False``
    defers every fsync to ``sync()`` and ``close()``: commits stay atomic
    through a process kill, and after a power loss the store opens at its
    last sync or a later commit whose bytes check out (README, "In-place
    replace, the journal and durability"). A pickled store is its path and
    options: unpickling opens it again.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        codec: str = "zstd",
        verify: bool | None = None,
        threads: int = 0,
        create: bool = False,
        durable: bool = True,
        *,
        _staged: bool = False,
        _existing: bool = False,
    ) -> None:
        path = os.fspath(path)
        verify = check_verify(verify)
        create, durable = check_flag("create", create), check_flag("durable", durable)
        threads = check_int("threads", threads, 0, THREADS_MAX)
        # _existing: the caller knows a store is there (a dataset read its
        # schema): the native open creates nothing, so no look-up first.
        if not create and not _existing:
            _refuse_foreign_directory(path)
        # _staged: a new store in a directory nobody opens until its owner
        # renames it into place (ArrayStore's saves) is created without
        # syncs; sync() makes it durable (the owner syncs the parent).
        extra = (lib.LX_OPEN_STAGED if _staged else 0) | (lib.LX_OPEN_EXISTING if _existing else 0)
        self._open(path, codec, verify, threads, durable, extra)

    @classmethod
    def _existing_store(
        cls, path: str, codec: str, verify: bool | None, threads: int, durable: bool
    ) -> Zrecord:
        """The store a dataset found by its schema: the options checked by
        the dataset, the codec by the schema, so the open checks none again
        (a lazy load opens one per array)."""
        store = cls.__new__(cls)
        store._open(path, codec, verify, threads, durable, lib.LX_OPEN_EXISTING)
        return store

    @classmethod
    def _beside(
        cls,
        path: str,
        file: str,
        bytes_max: int,
        verify: bool | None,
        threads: int,
        durable: bool,
    ) -> tuple[Zrecord, bytes, tuple[str, int, int]] | None:
        """The existing store at ``path`` (checked options, as ``_existing_store``)
        with the first ``bytes_max`` bytes of its directory's ``file``, both
        read through one directory handle in one native call: of one
        directory however the path is swapped meanwhile; and the store's
        ``layout()`` and record count. None where the directory has no
        ``file``. The caller sets the store's codec (``_set_codec``), from
        the file."""
        side = ffi.new("uint8_t[]", bytes_max)
        side_bytes = ffi.new("uint64_t *")
        identity = ffi.new("uint64_t[2]")
        info = ffi.new("lx_store_info *")
        handle = ffi.new("lx_store **")
        check(
            lib.lx_store_open_beside(
                path.encode(),
                threads,
                _open_flags(verify, durable),
                file.encode(),
                side,
                bytes_max,
                side_bytes,
                identity,
                info,
                handle,
            ),
            f"cannot open store '{path}'",
        )
        if handle[0] == ffi.NULL:
            return None
        store = cls.__new__(cls)
        store._handle = handle[0]
        store._opened(path, verify, threads, durable, (identity[0], identity[1]))
        shape = (LAYOUTS[info.layout], int(info.record_bytes), int(info.records))
        return store, ffi.buffer(side, side_bytes[0])[:], shape

    def _set_codec(self, codec: str) -> None:
        """The default codec of appends and replaces (a valid one)."""
        self._codec = codec_id(codec)
        self.codec = codec

    def _open(
        self, path: str, codec: str, verify: bool | None, threads: int, durable: bool, extra: int
    ) -> None:
        """The native open of checked options; ``extra``: the LX_OPEN_ flags
        beyond the checks and durability."""
        codec_number = codec_id(codec)
        handle = ffi.new("lx_store **")
        check(
            lib.lx_store_open(path.encode(), threads, _open_flags(verify, durable) | extra, handle),
            f"cannot open store '{path}'",
        )
        self._handle = handle[0]
        self._opened(path, verify, threads, durable, path_identity(path))
        self.codec, self._codec = codec, codec_number

    def _opened(
        self,
        path: str,
        verify: bool | None,
        threads: int,
        durable: bool,
        identity: tuple[int, int] | None,
    ) -> None:
        """The fields of a store whose native handle just opened (but its codec)."""
        self.path = path
        # None: the default checks (indexed layout); True/False: every read or none.
        self.verify_reads: bool | None = verify
        self.durable = durable
        self._threads = threads
        # Which directory this handle opened, to tell "replaced since" apart
        # from damage when a refresh finds no superblock.
        self._inode = identity
        self._reopen_hint = "Zrecord(path)"
        self._init_lifetime()

    @property
    def identity(self) -> tuple[int, int] | None:
        """The (device, inode) of the directory at ``path`` as this handle
        opened it (from the native open, or a stat just after it)."""
        return self._inode

    def __reduce__(self) -> tuple[type[Zrecord], tuple[str, str, bool | None, int, bool, bool]]:
        # A native handle cannot cross processes: a pickled store is its path
        # and options, opened again on unpickling (spawn/forkserver workers).
        if self._closed:
            raise TypeError(f"cannot pickle the closed store '{self.path}': pickle it while open")
        return (
            type(self),
            (self.path, self.codec, self.verify_reads, self._threads, False, self.durable),
        )

    def _closed_message(self) -> str:
        return f"store '{self.path}' is closed; open it again with {self._reopen_hint}"

    def _release(self) -> None:
        lib.lx_store_close(self._handle)
        self._handle = ffi.NULL

    def __enter__(self) -> Zrecord:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, function: Callable[..., int], *args: Any, context: str = "") -> None:
        handle = self._enter()
        try:
            check(function(handle, *args), context)
        finally:
            self._leave()

    # -- reads

    def __len__(self) -> int:
        handle = self._enter()
        try:
            return int(lib.lx_store_count(handle))
        finally:
            self._leave()

    def refresh(self) -> int:
        """Sees records committed by other processes since open; returns len()."""
        try:
            self._call(lib.lx_store_refresh)
        except CorruptStoreError as exc:
            identity = path_identity(self.path)
            if identity is None:  # nothing there: not damage, the directory went away
                raise FileNotFoundError(
                    errno.ENOENT,
                    f"'{self.path}' was deleted or moved since this handle opened it: "
                    "open the store at its new path (or write it again); this handle still reads "
                    "what it had",
                    self.path,
                ) from None
            if identity != self._inode:
                raise StoreReplacedError(
                    f"'{self.path}' was replaced by a new store (e.g. ArrayStore.save overwrote "
                    "the array) "
                    "since this handle opened it; the data is fine: open it again with "
                    f"{self._reopen_hint}",
                    exc.code,
                ) from None
            raise
        return len(self)

    def gather(self, idxs: npt.ArrayLike, dst: Any, offsets: npt.ArrayLike | None = None) -> None:
        """Decodes records ``idxs`` into ``dst``: record k at byte ``offsets[k]``.

        Without ``offsets`` the records must share one length L and land at
        ``k * L``. Raises IndexError for an index outside ``0..len-1``.
        """
        indices, target, target_bytes, target_offsets = gather_arguments(
            idxs, dst, offsets, self.lengths
        )
        if indices.size == 0:
            return
        offsets_pointer = ffi.NULL if target_offsets is None else u64_pointer(target_offsets)
        handle = self._enter()
        try:
            status = lib.lx_store_gather(
                handle, u64_pointer(indices), indices.size, target, target_bytes, offsets_pointer
            )
        finally:
            self._leave()
        if status:
            check(status)

    def lengths(self, idxs: npt.ArrayLike) -> npt.NDArray[np.uint64]:
        """The raw (decoded) byte length of each record in ``idxs``."""
        return self._lengths_with(lib.lx_store_lengths, idxs)

    def gather_rows(
        self,
        indices: npt.NDArray[np.uint64],
        row_bytes: int,
        target: npt.NDArray[np.uint8] | None,
    ) -> tuple[int, npt.NDArray[np.int64]]:
        """Records ``indices`` (a contiguous uint64 array) packed from the start
        of ``target`` in one native call; returns the bytes they need and their
        offsets in ``row_bytes``-byte rows (``len + 1``). If the bytes exceed
        ``target`` nothing was read and the offsets are in bytes; a record
        that is not whole rows raises ``InvalidArgumentError``."""
        return self._gather_rows_with(lib.lx_store_gather_rows, indices, row_bytes, target)

    def read(self, idx: int) -> bytes:
        """One record as bytes (a convenience over ``gather``)."""
        length = int(self.lengths([idx])[0])
        buffer = bytearray(length)
        self.gather([idx], buffer, [0])  # also for 0 bytes: a verified read checks it
        return bytes(buffer)

    def stats(self) -> dict[str, Any]:
        """The store's counters: ``records``, ``live_bytes``, ``chunk_bytes``,
        ``reclaimable``, ``layout``, ``record_bytes``, ``generation`` and
        ``fell_back`` (True when open found the newest superblock slot damaged
        and read the one before it)."""
        info = self._info()
        return {
            "records": info.records,
            "live_bytes": info.live_bytes,
            "chunk_bytes": info.chunk_bytes,
            "reclaimable": info.reclaimable,
            "layout": LAYOUTS[info.layout],
            "record_bytes": info.record_bytes,
            "generation": info.generation,
            # True when a superblock slot does not decode and open took the
            # other one: a commit cut short by a crash, or damage.
            "fell_back": bool(info.fell_back),
            # True when that is damage no crash leaves (a slot that held a
            # commit lost its magic, or a synced generation is gone): the
            # store may be older than its last commit; verify() raises and
            # writes are refused.
            "damaged": bool(info.damaged),
            "fell_back_reason": self._fall_back_reason(),
        }

    def layout(self) -> tuple[str, int]:
        """``stats()``'s ``layout`` and ``record_bytes``, in one native call
        (a dataset's open checks them)."""
        info = self._info()
        return LAYOUTS[info.layout], info.record_bytes

    def fixed_data_file(self) -> str | None:
        """The path of a fixed store's data file, in which record i is bytes
        ``[i, i + 1) * record_bytes`` (raw); None for another layout. It
        names the current generation's file: a later commit may write
        another."""
        return self._fixed_data_file(self._info())

    def _fixed_data_file(self, info: Any) -> str | None:
        if LAYOUTS[info.layout] != "fixed" or not info.data_file:
            return None
        return os.path.join(self.path, f"data-{info.data_file:016x}")

    def changed_rows(
        self, edited: npt.NDArray[np.uint8], pages: npt.NDArray[np.uint64], page_bytes: int
    ) -> npt.NDArray[np.uint64]:
        """``changed_rows`` (the module's) of ``edited``, records 0.. of this
        fixed store, against the committed records, compared through the
        store's own mapping (a replace of them that follows finds their
        blocks mapped); InvalidArgumentError for another layout."""
        assert edited.flags.c_contiguous
        row_bytes = max(1, self._info().record_bytes)

        def call(*found: Any) -> None:
            edited_bytes = ffi.from_buffer("uint8_t[]", edited)
            self._call(lib.lx_store_changed_rows, edited_bytes, edited.size, *found)

        return changed_rows_with(call, edited.size // row_bytes, row_bytes, pages, page_bytes)

    def open_records(self, count: int) -> int:
        """A read-only descriptor of the data file of a fixed store holding
        records ``0..count`` as they are (``fixed_data_file``), for a
        mapping of them; -1 for another layout or a shorter file. The
        caller closes it."""
        info = self._info()
        path = self._fixed_data_file(info)
        if path is None:
            return -1
        descriptor = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        if os.fstat(descriptor).st_size < count * info.record_bytes:
            os.close(descriptor)
            return -1
        return descriptor

    def _fall_back_reason(self) -> str | None:
        """Why open fell back or found damage, or None."""
        buffer = ffi.new("char[512]")
        handle = self._enter()
        try:
            lib.lx_store_fall_back_reason(handle, buffer, len(buffer))
        finally:
            self._leave()
        text: bytes = ffi.string(buffer)
        return text.decode("utf-8", "replace") or None

    def has_dict(self) -> bool:
        """Whether the store holds a trained zstd dictionary (for ``zstd_dict`` codecs)."""
        return bool(self._info().has_dict)

    def _info(self) -> Any:
        info = ffi.new("lx_store_info *")
        self._call(lib.lx_store_info_get, info)
        return info

    def verify(self) -> list[int]:
        """Checks every record's checksum; returns the indices of damaged
        records. Raises CorruptStoreError when the store opened past a
        damaged superblock (``stats()["damaged"]``): its last commits may be
        lost, which no record index can name."""
        damaged: list[int] = []
        if not len(self):
            self._call(lib.lx_store_verify, 0, 0, ffi.NULL, ffi.new("uint64_t *"))
        total = len(self)
        out = np.empty(min(total, _VERIFY_CHUNK), dtype=np.uint64)
        found = ffi.new("uint64_t *")
        for start in range(0, total, _VERIFY_CHUNK):
            end = min(total, start + _VERIFY_CHUNK)
            self._call(lib.lx_store_verify, start, end, u64_pointer(out), found)
            damaged.extend(int(i) for i in out[: found[0]])
        return damaged

    # -- writes

    def append(self, src: Any, offsets: npt.ArrayLike, codec: str | int | None = None) -> int:
        """Appends the records packed in ``src`` (record i starts at
        ``offsets[i]``, the last runs to the end); returns the first new index."""
        codec_value = self._codec if codec is None else codec_id(codec)
        source, source_bytes = _read_buffer(src, "src")
        starts = _offsets(offsets, source_bytes)
        first = ffi.new("uint64_t *")
        self._call(
            lib.lx_store_append,
            source,
            source_bytes,
            u64_pointer(starts),
            starts.size,
            codec_value,
            first,
        )
        return int(first[0])

    def replace(
        self,
        idxs: npt.ArrayLike,
        src: Any,
        offsets: npt.ArrayLike,
        codec: str | int | None = None,
    ) -> None:
        """Gives records ``idxs`` new contents, packed in ``src`` as for ``append``."""
        codec_value = self._codec if codec is None else codec_id(codec)
        indices = as_indices(idxs)
        source_bytes = _read_buffer(src, "src")[1]
        starts = _offsets(offsets, source_bytes)
        if starts.size != indices.size:
            raise InvalidArgumentError(
                f"replace got {indices.size} indices but {starts.size} records"
            )
        self.replace_checked(indices, src, source_bytes, starts, codec_value)

    def replace_checked(
        self,
        indices: npt.NDArray[np.uint64],
        src: Any,
        source_bytes: int,
        starts: npt.NDArray[np.uint64],
        codec: int | None = None,
    ) -> None:
        """``replace`` of arguments already converted: contiguous uint64
        ``indices`` and ``starts``, a C-contiguous ``src`` of
        ``source_bytes`` and a codec id (None: the store's). The native call
        checks the rest (ranges, lengths). ArrayStore's edits convert their
        rows themselves."""
        self._replace(
            u64_pointer(indices), indices.size, src, source_bytes, u64_pointer(starts), codec
        )

    def replace_record(self, index: int, src: Any, source_bytes: int) -> None:
        """``replace_checked`` of the one record ``index`` (an int >= 0)
        holding all ``source_bytes`` of ``src``, in the store's codec: a
        one-row edit's path, with no NumPy index or offset arrays (their
        calls dominate a single edit on cold caches)."""
        self._replace(ffi.new("uint64_t[1]", (index,)), 1, src, source_bytes, _FIRST_BYTE, None)

    def _replace(
        self, indices: Any, count: int, src: Any, source_bytes: int, starts: Any, codec: int | None
    ) -> None:
        handle = self._enter()
        try:
            status = lib.lx_store_replace(
                handle,
                indices,
                count,
                ffi.from_buffer("uint8_t[]", src),
                source_bytes,
                starts,
                self._codec if codec is None else codec,
            )
        finally:
            self._leave()
        check(status)

    def delete(self, idxs: npt.ArrayLike, keep_order: bool = False) -> None:
        """Deletes records ``idxs``. The tail fills the holes (the moved records
        keep their relative order), or with ``keep_order=True`` every survivor
        keeps its order. Live records are always ``0..len-1``."""
        indices = as_indices(idxs)
        if indices.size == 0:
            raise InvalidArgumentError("delete got no indices")
        handle = self._enter()
        try:
            status = lib.lx_store_delete(
                handle, u64_pointer(indices), indices.size, int(bool(keep_order))
            )
        finally:
            self._leave()
        check(status)

    def compact(self) -> None:
        """Reclaims the space of deleted and replaced records (crash-safe)."""
        self._call(lib.lx_store_compact)

    def sync(self) -> None:
        """Makes every commit so far durable (survives power loss). With
        ``durable=True`` they are already; with ``durable=False`` this is
        where the fsyncs happen (``close()`` does it too)."""
        self._call(lib.lx_store_sync)

    def train_dict(self, samples: Any, sizes: Iterable[int], target: int) -> int:
        """Trains the store's zstd dictionary from ``samples`` (sample i is
        ``sizes[i]`` bytes, back to back); returns the dictionary's size."""
        source, source_bytes = _read_buffer(samples, "samples")
        sample_sizes = np.ascontiguousarray(
            np.asarray(list(sizes) if not isinstance(sizes, np.ndarray) else sizes), dtype=np.uint64
        )
        if sample_sizes.size == 0:
            raise InvalidArgumentError("train_dict needs at least one sample")
        if int(sample_sizes.sum()) != source_bytes:
            raise InvalidArgumentError(
                f"sample sizes sum to {int(sample_sizes.sum())} but samples hold {source_bytes} "
                "bytes"
            )
        out = ffi.new("uint64_t *")
        self._call(
            lib.lx_store_train_dict,
            source,
            u64_pointer(sample_sizes),
            sample_sizes.size,
            int(target),
            out,
        )
        return int(out[0])

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self)} records"
        return f"Zrecord({self.path!r}, codec={self.codec!r}, {state})"


def _open_flags(verify: bool | None, durable: bool) -> int:
    """The LX_OPEN_ flags of a store's read checks and durability."""
    checks = (
        lib.LX_OPEN_VERIFY_INDEXED if verify is None else lib.LX_OPEN_VERIFY_ALL if verify else 0
    )
    return checks | (0 if durable else lib.LX_OPEN_DEFER_SYNC)


def path_identity(path: str) -> tuple[int, int] | None:
    """The (device, inode) of ``path``, or None when it is gone: which
    directory a path names now (a swap gives it another)."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return (stat.st_dev, stat.st_ino)


def _refuse_foreign_directory(path: str) -> None:
    """A directory holding other files is not ours to turn into a store. A
    creation killed before its superblock was linked in place leaves only
    the store's own ``lock`` and ``superblock.tmp-<pid>``: those never make
    the path unusable (the store is created among them)."""
    if is_store(path):
        return
    try:
        with os.scandir(path) as entries:
            # The first foreign entry decides: no full listing of a big directory.
            foreign = next(
                (entry for entry in entries if not is_creation_leftover(entry.name)), None
            )
    except OSError:
        return  # a new store, a file, no permission: the native open says what is wrong
    if foreign is not None:
        raise CorruptStoreError(
            f"'{path}' is a non-empty directory that is not a zrecord store (it has no "
            "superblock): "
            "give a new or empty directory, or pass create=True to make a store among its files",
            STATUS["not_a_store"],
        )


def is_creation_leftover(name: str) -> bool:
    """True for a file a store creation leaves before its superblock is in
    place (a killed one leaves them behind): ``lock``, ``superblock.tmp-<pid>``."""
    temporary = SUPERBLOCK_FILE + ".tmp-"
    return name == LOCK_FILE or (name.startswith(temporary) and name[len(temporary) :].isdigit())


# ---- a store's files, for the layers above (nothing above this module names one)

SUPERBLOCK_FILE = "superblock"  # zig/superblock.zig: its two slots; present once a store is created
LOCK_FILE = "lock"  # zig/store.zig: the writer's flock, and the readers' shared page
JOURNAL_PREFIX = "journal-"  # zig/journal.zig: an in-place replace commits here


def is_store(path: str, fs: OsFs = OS_FS) -> bool:
    """Whether ``path`` holds a created zrecord store (its superblock is in
    place). A directory of a killed creation holds only `is_creation_leftover`
    files and is not a store yet."""
    return fs.exists(os.path.join(path, SUPERBLOCK_FILE))


def lock_exclusive(path: str, what: str, fs: OsFs = OS_FS) -> int:
    """Takes the write lock of the store at ``path`` (the one a `Zrecord`
    writer holds) without waiting, so no writer appends while the caller
    replaces or removes it; StoreLockedError names ``what`` was refused.
    Release it with ``fs.unlock(handle)``."""
    try:
        return fs.lock(os.path.join(path, LOCK_FILE))
    except BlockingIOError:
        raise StoreLockedError(
            f"cannot {what} '{path}': another process (or handle) is writing to it; retry when it "
            "is done"
        ) from None


def modified_ns(path: str, fs: OsFs = OS_FS) -> int:
    """When the store at ``path`` last committed, in nanoseconds since the
    epoch: its superblock's or, after an in-place replace, a journal's mtime."""
    times = [fs.stat(os.path.join(path, SUPERBLOCK_FILE)).st_mtime_ns]
    for name in fs.listdir(path):
        if name.startswith(JOURNAL_PREFIX):
            try:
                times.append(fs.stat(os.path.join(path, name)).st_mtime_ns)
            except FileNotFoundError:  # a layout change deleted it just now
                pass
    return max(times)


def retire(path: str, fs: OsFs = OS_FS) -> None:
    """Makes the store at ``path`` stop being one before its files are removed:
    an open handle's ``refresh()`` then says it was replaced
    (StoreReplacedError) at once, and no open finds half a store."""
    try:
        fs.unlink(os.path.join(path, SUPERBLOCK_FILE))
    except FileNotFoundError:
        pass
