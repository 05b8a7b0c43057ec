"""One array of an ArrayStore, open: its directory, its reads, and the lazy view.

An array directory is a dense loaderx store, one record per row along axis
0; a 0-d array is one scalar row and ``array.msgpack`` (``{"shape": []}``).
Invariant: an `OpenArray` reads and edits exactly the directory it opened
(a `LazyArray` of it raises once it is closed, never reads another), and
rows given for an edit are coerced to the array's dtype and row shape
before any byte is written.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Iterator
from typing import Any, cast

import msgpack
import numpy as np
import numpy.typing as npt

from ._arraycommit import STATUS_CODES, ArrayStoreIOError, generation_of, unchanged
from ._arraydrop import DeleteLog, TakeBackFailed, kept_rows, log_path
from ._fs import IoStats, OsFs
from ._indexing import int_index, is_int, record_indices
from .converter import build_dense_store
from .dataset import DenseDataset
from .zrecord import CorruptStoreError, Zrecord

ARRAY_FILE = "array.msgpack"  # only in the directory of a 0-d array
ARRAY_FILE_BYTES_MAX = 1 << 16
STREAM_BYTES = 64 << 20  # a stream's default chunk, in bytes of rows
ALIGN_BYTES = 64  # a read's output starts at a multiple of this (see aligned_empty)
OFFSETS_CACHED_MAX = 1 << 20  # rows: a cached offsets array holds at most 8 MiB, four 32 MiB


class LiveRows:
    """The live rows of an array with drops: ``kept``, a mask of its base
    rows (True: live), their ``count``, and ``map``, the base row of each
    live row, built from the mask on first use (a drop does not pay for it;
    the first read, replace or slice after it does, once). Never changed
    once made: an edit makes a new one, so a read in flight keeps its own
    (two threads building ``map`` at once build the same array)."""

    __slots__ = ("_map", "count", "kept")

    def __init__(
        self,
        kept: npt.NDArray[np.bool_],
        count: int,
        live: npt.NDArray[np.uint64] | None = None,
    ) -> None:
        self.kept = kept
        self.count = count
        self._map = live

    @property
    def map(self) -> npt.NDArray[np.uint64]:
        live = self._map
        if live is None:
            live = np.flatnonzero(self.kept).view(np.uint64)  # non-negative int64: the same bits
            self._map = live
        return live

    def grown(self, base_rows: int, rows: int) -> LiveRows:
        """These live rows with the base rows ``base_rows..rows`` appended (live)."""
        kept = np.concatenate([self.kept, np.ones(rows - base_rows, dtype=bool)])
        live = self._map
        if live is not None:
            live = np.concatenate([live, np.arange(base_rows, rows, dtype=np.uint64)])
        return LiveRows(kept, self.count + rows - base_rows, live)


class OpenArray:
    """One open array: its dataset (reads) and the dataset's store (writes),
    and after a logical drop its delete log and live rows (`_arraydrop`).

    Rows are addressed logically: row i is base row ``live[i]`` of the store
    (``live`` None: every base row, row i is base row i). Every read and
    edit maps its rows with one NumPy index; ``length`` is the logical row
    count. ``live`` is built on first use after a drop (`LiveRows`)."""

    def __init__(
        self,
        name: str,
        path: str,
        inode: int,
        opened: tuple[DenseDataset, Zrecord, int],
        scalar: bool,
        durable: bool,
        stats: IoStats,
    ):
        # ``opened``: the dataset, its store (an ArrayStore array is one
        # store, never sharded) and the store's record count at open.
        dataset, store, count = opened
        self.name = name
        self.path = path
        self.inode = inode
        self.dataset = dataset
        self.store = store
        self.scalar = scalar
        self.row_bytes = dataset.dtype.itemsize * math.prod(dataset.item_shape)
        self.edited = False  # a row edit since the last sync()
        self.stats = stats  # the ArrayStore's counters
        self.durable = durable  # whether each row edit syncs before it returns (the store's option)
        self.base_rows = count  # the store's records, dropped ones included
        self.live_rows: LiveRows | None = None  # None: no drops, row i is base row i
        self.log: DeleteLog | None = None
        self.appended = False  # appends since the last sync (a drop record must not outlive them)

    @classmethod
    def open(
        cls, name: str, path: str, inode: int, fs: OsFs, durable: bool, stats: IoStats
    ) -> OpenArray:
        """The array at ``path``, whose directory had inode ``inode``."""
        # Row edits go through the dataset's store handle, so with
        # durable=False that one handle defers its fsyncs.
        dataset = DenseDataset(fs.real_path(path), _durable=durable)
        store = cast(Zrecord, dataset.store)
        return cls._around(name, path, inode, (dataset, store, len(store)), fs, durable, stats)

    @classmethod
    def open_usual(
        cls, name: str, path: str, fs: OsFs, durable: bool, stats: IoStats
    ) -> OpenArray | None:
        """``open`` of the usual case, in one native call that also gives the
        directory's inode (a lazy load of many arrays opens each); None, with
        nothing left open, otherwise (``open`` sorts it out)."""
        try:
            real = fs.real_path(path)
        except FileNotFoundError:
            return None
        opened = DenseDataset._of_array(real, durable)
        if opened is None:
            return None
        identity = opened[1].identity
        assert identity is not None  # the native open gives it
        return cls._around(name, path, identity[1], opened, fs, durable, stats)

    @classmethod
    def _around(
        cls,
        name: str,
        path: str,
        inode: int,
        opened: tuple[DenseDataset, Zrecord, int],
        fs: OsFs,
        durable: bool,
        stats: IoStats,
    ) -> OpenArray:
        """The open array around its open dataset (``opened``: as ``__init__``
        takes it; the dataset is closed on failure)."""
        dataset, _, count = opened
        try:
            # Only a one-row array of scalars can be a 0-d array.
            scalar = count == 1 and dataset.item_shape == () and _read_scalar_marker(path, fs)
            entry = cls(name, path, inode, opened, scalar, durable, stats)
            if not scalar and fs.exists(log_path(path)):
                entry.load_drops(fs)
        except BaseException:
            dataset.close()
            raise
        return entry

    def load_drops(self, fs: OsFs) -> None:
        """Reads the delete log (when there is one) into the live rows."""
        log = self.log
        if log is None:
            log = DeleteLog(log_path(self.path), fs, generation_of(fs, self.path), self.durable)
        self.base_rows = len(self.dataset)
        kept = kept_rows(self.base_rows, log.replay(self.base_rows))
        self.live_rows = None if kept is None else LiveRows(kept, int(np.count_nonzero(kept)))
        self.log = log

    def refresh(self, fs: OsFs) -> None:
        """A reader's view of the writer's commits since: the store's, and
        the delete log's when it changed (it only grows while the directory
        stays; a new directory is a new OpenArray)."""
        self.store.refresh()
        if self.scalar:
            return
        try:
            size: int | None = fs.stat(log_path(self.path)).st_size
        except FileNotFoundError:
            size = None
        if size != (None if self.log is None else self.log.size):
            self.load_drops(fs)
        elif len(self.dataset) != self.base_rows:
            self._grown()

    def _grown(self) -> None:
        """Appended base rows are live rows at the end."""
        rows = len(self.dataset)
        live = self.live_rows
        if live is not None and rows > self.base_rows:
            self.live_rows = live.grown(self.base_rows, rows)
        self.base_rows = rows

    @property
    def live(self) -> npt.NDArray[np.uint64] | None:
        """The base row of each row (built on first use after a drop); None: no drops."""
        live = self.live_rows
        return None if live is None else live.map

    @property
    def has_drops(self) -> bool:
        """Whether rows are dropped (``live`` is not None), without building ``live``."""
        return self.live_rows is not None

    @property
    def length(self) -> int:
        """The array's rows (a 0-d array: its one row). ``base_rows`` follows
        the store's count (open, ``refresh``, ``append``), so no native call."""
        live = self.live_rows
        return self.base_rows if live is None else live.count

    def to_base(self, indices: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
        """The base rows of the rows ``indices`` (in range)."""
        live = self.live
        if live is None:
            return indices
        return live[indices.astype(np.intp, copy=False)]

    def base_range(self, start: int, end: int) -> npt.NDArray[np.uint64]:
        """The base rows of rows ``start..end``, contiguous uint64."""
        live = self.live
        if live is None:
            return np.arange(start, end, dtype=np.uint64)
        return live[start:end]

    @property
    def closed(self) -> bool:
        return self.dataset.closed

    def damaged_rows(self) -> npt.NDArray[np.uint64]:
        """The rows (logical, ascending) whose records fail their checksums:
        every row of a damaged block (a dropped row is no row)."""
        base = np.array(self.store.verify(), dtype=np.uint64)
        live = self.live
        if live is None or not base.size:
            return base
        at = np.searchsorted(live, base)
        hit = at < live.size
        hit[hit] = live[at[hit]] == base[hit]
        return at[hit].astype(np.uint64)

    def require_sound(
        self,
        what: str,
        carried: npt.NDArray[np.bool_] | None = None,
        outcome: str = "nothing was changed",
    ) -> None:
        """CorruptStoreError unless every row a rewrite carries over from the
        disk checks out. A rewrite reads the rows without checking them (the
        raw layout checks by blocks, on ``verify()``) and gives them fresh
        checksums, so damage read here would pass every check after it.
        ``carried``: which rows the rewrite copies (None: all of them)."""
        damaged = self.damaged_rows()
        if carried is not None and damaged.size:
            damaged = damaged[carried[damaged.astype(np.intp)]]
        if not damaged.size:
            return
        shown = ", ".join(str(int(row)) for row in damaged[:8])
        more = f" and {damaged.size - 8} more" if damaged.size > 8 else ""
        rows = "row" if damaged.size == 1 else "rows"
        raise CorruptStoreError(
            f"cannot {what}: {rows} {shown}{more} of array '{self.name}' do not match their "
            "checksums (damaged on disk), and the rewrite would carry them over with new "
            f"ones; {outcome}. Replace those rows with good data (a replace of "
            "every row of a damaged block repairs it), drop them, or restore the array from "
            "a copy; verify() lists them",
            STATUS_CODES["corrupt"],
        )

    def close(self) -> None:
        self.dataset.close()

    @property
    def shape(self) -> tuple[int, ...]:
        return () if self.scalar else (self.length, *self.dataset.item_shape)

    def read_all(self) -> np.ndarray:
        """The whole array: one gather into a fresh array of its shape."""
        out = self.read_rows(0, self.length)
        return out.reshape(()) if self.scalar else out

    def read_rows(self, start: int, end: int) -> np.ndarray:
        """Rows ``start..end`` with one gather (equal-length records need no
        offsets: row k lands at k times the row size)."""
        out = aligned_empty((end - start, *self.dataset.item_shape), self.dataset.dtype)
        if end > start and self.row_bytes:
            self.store.gather(self.base_range(start, end), out)
            self.stats.read(out.nbytes)
        return out

    def get(self, key: Any) -> Any:  # key and the result: as for DenseDataset[key]
        """Rows ``key`` of the dataset, counted as one read."""
        live = self.live
        result = self.dataset[key] if live is None else self._get_live(key, live)
        self.stats.read(np.asarray(result).nbytes)
        return result

    def _get_live(self, key: Any, live: npt.NDArray[np.uint64]) -> Any:
        """``DenseDataset[key]``'s selection rules over the live rows ``live``."""
        rest = None
        if isinstance(key, tuple):
            if key and key[0] is Ellipsis:
                return self.read_all()[key]
            key, rest = (key[0], key[1:]) if key else (slice(None), ())
        if key is Ellipsis:
            key = slice(None)
        if is_int(key):
            row = live[int_index(key, live.size)]
            item = self._gather(np.array([row], dtype=np.uint64), (1,))[0]
            return item if rest is None else item[rest]
        if isinstance(key, slice):
            base = np.ascontiguousarray(live[key])
            shape: tuple[int, ...] = base.shape
        else:
            indices, shape = record_indices(key, live.size)
            base = live[indices.astype(np.intp, copy=False)]
        out = self._gather(base, shape)
        return out if rest is None else out[(slice(None),) * len(shape) + rest]

    def _gather(self, base: npt.NDArray[np.uint64], shape: tuple[int, ...]) -> np.ndarray:
        item_shape = self.dataset.item_shape
        out = np.empty((base.size, *item_shape), dtype=self.dataset.dtype)
        if base.size and self.row_bytes:
            self.store.gather(base, out)
        return out.reshape((*shape, *item_shape))

    # ---- row edits (each one native commit, counted in ``stats``)

    def replace(self, rows: int | npt.NDArray[np.uint64], data: np.ndarray) -> None:
        """Gives ``rows`` (in range, no repeats; an int: one row) the rows
        ``data`` in one native commit."""
        if isinstance(rows, int):
            live = self.live
            self.store.replace_record(rows if live is None else int(live[rows]), data, data.nbytes)
        elif rows.size:
            base = np.ascontiguousarray(self.to_base(rows), dtype=np.uint64)
            self.store.replace_checked(base, data, data.nbytes, self.offsets(rows.size))
        else:
            return
        self._edited(data.nbytes)

    def append(self, data: np.ndarray) -> None:
        try:
            self.store.append(data, self.offsets(len(data)))
        finally:  # a failure after the commit point may leave the rows appended
            if not self.closed:
                self._grown()
        self.appended = True
        self._edited(data.nbytes)

    def drop(self, doomed: npt.NDArray[np.bool_], count: int, fs: OsFs) -> None:
        """Drops the ``count`` rows set in ``doomed`` (a mask of the rows,
        which the drop takes over) logically: one record in the delete log
        (`_arraydrop`), durable when it returns unless ``durable=False``;
        nothing of the store changes. A mask, not sorted indices: O(rows),
        no sort (np.unique hashes slowly)."""
        if self.appended:
            self.sync()  # the rows the record names survive a power cut that keeps it
        if self.log is None:
            self.log = DeleteLog(
                log_path(self.path), fs, generation_of(fs, self.path), self.durable
            )
        live = self.live_rows
        # The record's bitmap of base rows: the mask itself, or its rows
        # placed at the kept base rows (no array of all of them).
        base = doomed if live is None else _base_mask(live, doomed, self.base_rows)
        what = f"drop of {count} rows of '{self.name}'"
        try:
            self.log.append(base, count, self.base_rows)
        except TakeBackFailed as failure:
            raise ArrayStoreIOError(
                failure.cause.errno,
                f"{what} may or may not have taken effect: writing its delete log failed "
                f"({failure.cause}) and taking the record back failed ({failure.second}); "
                "reopen the ArrayStore once the disk works: the drop is then applied entirely "
                "or not at all",
                "unknown",
            ) from failure.cause
        except OSError as exc:
            raise unchanged(what, exc) from exc
        # New live rows (a read in flight keeps the old ones): the kept base
        # rows' mask only, made in the record's bitmap; the map of live rows
        # is built when a read first needs it (`LiveRows`).
        kept = np.logical_not(base, out=base)
        if live is None:
            self.live_rows = LiveRows(kept, self.base_rows - count)
        else:
            self.live_rows = LiveRows(np.logical_and(kept, live.kept, out=kept), live.count - count)
        if not self.durable:
            self.edited = True

    def compact(self) -> None:
        self.store.compact()
        self.stats.wrote(0, synced=True)  # the native compaction syncs before it returns

    def sync(self) -> None:
        self.store.sync()
        self.stats.synced()
        if self.log is not None:
            self.log.sync()
        self.edited = self.appended = False

    def _edited(self, nbytes: int) -> None:
        self.edited = True
        self.stats.wrote(nbytes, synced=self.durable)

    def offsets(self, count: int) -> np.ndarray:
        """Byte offsets of ``count`` packed rows (shared by every array with
        this row size: a fresh handle's first edit of a batch size seen
        before builds nothing)."""
        if count > OFFSETS_CACHED_MAX:
            return np.arange(count, dtype=np.uint64) * np.uint64(self.row_bytes)
        return _row_offsets(count, self.row_bytes)

    def rows(self, rows: npt.ArrayLike, count: int | None, what: str) -> np.ndarray:
        """``rows`` as a C-contiguous ``(n, *item_shape)`` array of this
        array's dtype (``n == count`` when given); ValueError otherwise."""
        return coerce_rows(
            self.name, self.dataset.dtype, self.dataset.item_shape, rows, count, what
        )

    def stream(self, rows: int) -> Iterator[npt.NDArray[Any]]:
        """The array in chunks of at most ``rows`` rows, each one gather."""
        start = 0
        while True:
            end = min(start + rows, self.length)
            if end <= start:
                return
            yield self.read_rows(start, end)
            start = end

    def default_stream_rows(self) -> int:
        """The rows of a stream's default chunk (``STREAM_BYTES`` of rows)."""
        return max(1, STREAM_BYTES // max(self.row_bytes, 1))


class LazyArray:
    """An array of an ArrayStore that reads only the rows asked for.

    ``shape``, ``dtype``, ``ndim``, ``len``; ``lazy[i]`` is one row,
    ``lazy[slice | list | int array | bool mask]`` (with optional trailing
    indices) an array read with one gather; ``np.asarray(lazy)`` loads all.
    It shows the array's current rows, edits included, and stops working
    (ValueError) once the array is overwritten or dropped or its ArrayStore
    closed.
    """

    def __init__(self, entry: OpenArray):
        self._entry = entry

    def _live(self) -> OpenArray:
        if self._entry.closed:
            raise ValueError(
                f"this lazy array of '{self._entry.name}' is gone: the array was overwritten "
                "or dropped, or its ArrayStore closed; load it again"
            )
        return self._entry

    @property
    def name(self) -> str:
        """The array's name in its ArrayStore."""
        return self._entry.name

    @property
    def shape(self) -> tuple[int, ...]:
        """The array's current shape."""
        return self._live().shape

    @property
    def dtype(self) -> np.dtype:
        """The array's dtype."""
        return self._entry.dataset.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def __len__(self) -> int:
        shape = self.shape
        if not shape:
            raise TypeError("len() of a 0-d array")
        return shape[0]

    def __getitem__(self, key: Any) -> Any:  # key and the result: as for DenseDataset[key]
        entry = self._live()
        if entry.scalar:
            if key is Ellipsis or (isinstance(key, tuple) and key == ()):
                return entry.read_all()
            raise IndexError(f"array '{entry.name}' is 0-d: index it with [()] or [...]")
        return entry.get(key)

    def __array__(
        self, dtype: npt.DTypeLike | None = None, copy: bool | None = None
    ) -> npt.NDArray[Any]:
        array = self._live().read_all()
        return array if dtype is None else array.astype(dtype, copy=False)

    def __dlpack__(self, **kwargs: Any) -> Any:  # kwargs, the result: NumPy's __dlpack__
        """DLPack (``torch.from_dlpack(lazy)``, ``jax.numpy.from_dlpack(lazy)``):
        the array is read once into a NumPy array, whose memory the consumer
        then shares without a copy."""
        given = {key: value for key, value in kwargs.items() if value is not None}
        return self.__array__().__dlpack__(**given)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU, device 0: the rows are read into host memory

    def __iter__(self) -> Iterator[Any]:
        entry = self._live()
        if entry.scalar:
            raise TypeError("iteration over a 0-d array")
        for chunk in entry.stream(entry.default_stream_rows()):
            yield from chunk

    def __repr__(self) -> str:
        if self._entry.closed:
            return f"LazyArray({self._entry.name!r}, gone)"
        return f"LazyArray({self._entry.name!r}, shape={self.shape}, dtype={self.dtype})"


def reading_store(lazy: LazyArray) -> Zrecord:
    """The store handle a lazy view reads through: its ArrayStore's own, which
    the caller must not close. `loaderx verify` checks an array through it
    rather than opening the array's directory a second time."""
    return lazy._live().store


_CHUNK_ROWS = 1 << 16  # a drop maps rows to base rows this many at a time


def _base_mask(
    live: LiveRows, doomed: npt.NDArray[np.bool_], base_rows: int
) -> npt.NDArray[np.bool_]:
    """The bitmap of the base rows of the rows ``doomed`` marks (row i's
    mark at the i-th kept base row), a chunk of base rows at a time: a
    chunk without drops is one copy of its marks, any other one scatter
    through its kept rows (no map of all live rows; a boolean-mask
    assignment is several times slower on a random mask)."""
    mask = np.zeros(base_rows, dtype=bool)
    kept = live.kept
    row = 0  # the row of the chunk's first kept base row
    for start in range(0, base_rows, _CHUNK_ROWS):
        chunk = kept[start : start + _CHUNK_ROWS]
        count = int(np.count_nonzero(chunk))
        marks = doomed[row : row + count]
        if count == chunk.size:
            mask[start : start + count] = marks
        elif count:
            mask[start : start + chunk.size][np.flatnonzero(chunk)] = marks
        row += count
    return mask


def write_array(path: str, array: np.ndarray, codec: str, generation: str | None = None) -> None:
    """Writes ``array`` as a complete dense store at the new ``path``: data
    and schema durable when it returns (its entry in the root is synced by
    the commit); a 0-d array as one row and a marker. ``generation`` goes
    into its schema file: what a commit record names the directory by."""
    if array.ndim == 0:
        marker = {ARRAY_FILE: msgpack.packb({"shape": []})}
        build_dense_store(path, array.reshape(1), codec, marker, generation)
    else:
        build_dense_store(path, array, codec, generation=generation)


def coerce_rows(
    name: str,
    dtype: np.dtype,
    item_shape: tuple[int, ...],
    rows: npt.ArrayLike,
    count: int | None,
    what: str,
) -> np.ndarray:
    """``rows`` for the array ``name`` of ``dtype`` and ``item_shape``: a
    C-contiguous ``(n, *item_shape)`` array (``n == count`` when given);
    ValueError otherwise."""
    if type(rows) is np.ndarray and rows.dtype == dtype and rows.flags.c_contiguous:
        # An edit's usual rows: nothing to convert or check.
        shape = rows.shape
        if shape == item_shape:
            if count is None or count == 1:
                return rows[None]  # one row without its row axis, as it is
        elif (
            shape[1:] == item_shape
            and len(shape) == len(item_shape) + 1
            and (count is None or shape[0] == count)
        ):
            return rows
    array = np.asarray(rows)
    if array.shape == item_shape and count in (None, 1):
        array = array.reshape(1, *item_shape)  # one row given without its row axis
    if (
        array.ndim != len(item_shape) + 1
        or array.shape[1:] != item_shape
        or (count is not None and len(array) != count)
    ):
        expected = _shape_text("n" if count is None else str(count), item_shape)
        raise ValueError(
            f"cannot {what} rows of '{name}': got shape {array.shape}, expected "
            f"{expected} (rows of shape {item_shape})"
        )
    from_python = not isinstance(rows, (np.ndarray, np.generic))
    context = f"cannot {what} rows of '{name}'"
    return np.ascontiguousarray(_cast(array, dtype, context, from_python))


def _read_scalar_marker(path: str, fs: OsFs) -> bool:
    """Whether the one-row array of scalars at ``path`` is a 0-d array."""
    file = os.path.join(path, ARRAY_FILE)
    try:
        payload = fs.read_file(file, ARRAY_FILE_BYTES_MAX + 1)
    except FileNotFoundError:
        return False
    try:
        data = msgpack.unpackb(payload, raw=False)
    except Exception as exc:
        raise ValueError(f"{file} is damaged: {exc}") from exc
    if not isinstance(data, dict) or data.get("shape") != []:
        raise ValueError(
            f"{file} says a 0-d array, but the store holds one row of shape (): the "
            "array is damaged"
        )
    return True


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
    """``np.empty(shape, dtype)`` starting at a multiple of ``ALIGN_BYTES``:
    what DLPack consumers need to share the memory rather than copy it (JAX
    on CPU copies a buffer that is not 64-byte aligned; NumPy aligns to 16)."""
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.empty(nbytes + ALIGN_BYTES, dtype=np.uint8)
    skip = -raw.ctypes.data % ALIGN_BYTES
    return raw[skip : skip + nbytes].view(dtype).reshape(shape)


@functools.lru_cache(maxsize=4)
def _row_offsets(count: int, row_bytes: int) -> npt.NDArray[np.uint64]:
    """Read-only byte offsets of ``count`` rows of ``row_bytes`` packed back to back."""
    offsets = np.arange(count, dtype=np.uint64) * np.uint64(row_bytes)
    offsets.flags.writeable = False
    return offsets


def _shape_text(first: str, item_shape: tuple[int, ...]) -> str:
    parts = [first, *map(str, item_shape)]
    return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


def _cast(
    array: np.ndarray, dtype: np.dtype, context: str, from_python: bool = False
) -> np.ndarray:
    """``array`` as ``dtype``: equal, or a ``same_kind`` cast of numbers whose
    integer values fit; ValueError otherwise. Python ints (``from_python``)
    go into any integer dtype they fit: NumPy types them int64, which is not
    ``same_kind`` with unsigned dtypes."""
    source = array.dtype
    if source == dtype:
        return array
    numeric = source.kind in "biuf" and dtype.kind in "biuf"
    if numeric:
        allowed = np.can_cast(source, dtype, "same_kind")
    else:
        allowed = np.can_cast(source, dtype, "safe")
    allowed = allowed or (from_python and source.kind in "iu" and dtype.kind in "iu")
    if not allowed:
        raise ValueError(
            f"{context}: dtype {source} does not cast to the array's {dtype} (same_kind "
            "casting): convert it first"
        )
    integers = dtype.kind in "iu" and source.kind in "iu"
    if integers and not np.can_cast(source, dtype, "safe") and array.size:
        limits = np.iinfo(dtype)
        low, high = int(array.min()), int(array.max())
        if low < limits.min or high > limits.max:
            bad = low if low < limits.min else high
            raise ValueError(f"{context}: value {bad} does not fit in the array's {dtype}")
    return array.astype(dtype)
