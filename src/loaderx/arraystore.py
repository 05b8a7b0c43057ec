"""ArrayStore: a directory of named NumPy arrays with in-place row edits.

The numpack operations (``save``, ``load``, lazy loads, ``getitem``,
``replace``, ``append``, ``drop``, ...) over zrecord stores: each array is a
directory of the root, a dense loaderx store with one record per row along
axis 0 (`_arrayview` opens and reads one). Invariant: every argument of a
call is checked before anything is written, so a call refused for its input
changes nothing. A ``save`` or ``drop`` of whole arrays is one commit of
`_arraycommit`, which keeps the root's files and states the crash-safety
protocol; row edits (``replace``, ``append``, the in-place ``compact``)
are the store's own atomic commits, and ``drop(rows=...)`` is one record of
the array's delete log (`_arraydrop`), which every read goes through; a
``compact`` of an array with dropped rows rewrites it in one commit. A ``batch_mode`` or
``writable_batch_mode`` block (`_arraybatch`) holds its edits in memory
and ends in one of those two commits.

The directory is the only list of arrays, so there is no catalogue to keep in
step with the data. The first write of an ArrayStore takes the root's lock and
finishes what a crashed writer left; opening one does it too when no writer
holds the lock.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import math
import os
import threading
from collections.abc import Iterator, Mapping
from typing import Any, Callable, cast, overload

import numpy as np
import numpy.typing as npt

from . import _arrayio, zrecord
from ._arraybatch import ArrayStoreBatchError, Batch, MappedBatch, MemoryBatch, Pending
from ._arraycommit import COMMIT_FILE as COMMIT_FILE
from ._arraycommit import (
    FORMAT_NAME,
    NAME_BYTES_MAX,
    STATUS_CODES,
    ArrayStoreFullError,
    ArrayStoreIOError,
    ArrayStoreReadOnlyError,
    Committer,
    is_member,
    open_root,
    replay_if_unlocked,
    valid_name,
)
from ._arraycommit import LOCK_FILE as LOCK_FILE
from ._arraycommit import MARKER_FILE as MARKER_FILE
from ._arraydrop import log_path
from ._arrayio import CorruptPackError, RowSource
from ._arrayview import (
    STREAM_BYTES,
    LazyArray,
    OpenArray,
    coerce_rows,
    write_array,
)
from ._checks import check_flag, check_int
from ._fs import OS_FS, CountingFs, IoStats, OsFs
from ._indexing import int_index, is_int, record_indices
from .converter import clone_array
from .dataset import SCHEMA_FILE, DenseDataset, StrPath
from .zrecord import CODECS, CorruptStoreError, StoreClosedError

__all__ = [
    "ArrayStore",
    "ArrayStoreBatchError",
    "ArrayStoreFullError",
    "ArrayStoreIOError",
    "ArrayStoreReadOnlyError",
    "CorruptPackError",
    "LazyArray",
]


class ArrayStore:
    """A directory of named dense arrays, opened (or created) at ``path``.

    One record per row, raw by default (``save(..., codec=...)`` per call).
    Reading never locks; the first write takes the directory's lock until
    ``close()``, so one ArrayStore at a time writes (a second one raises
    ``StoreLockedError``). ``save``, ``replace``, ``drop`` and ``compact`` are
    durable when they return; ``append`` is atomic, and durable after
    ``sync()`` or ``close()`` (the store's own rule).

    ``replace`` and ``append`` take rows of the array's dtype, or of a dtype
    NumPy casts to it with ``same_kind`` casting (float64 into float32 is fine,
    float into int is refused); integers must fit the array's integer dtype.
    """

    def __init__(self, path: StrPath, durable: bool = True, *, _fs: OsFs = OS_FS) -> None:
        self.path = os.fspath(path)
        self._prefix = os.path.join(self.path, "")  # + name: os.path.join(self.path, name)
        # durable="no" is truthy: refused, not taken as True.
        self.durable = check_flag("durable", durable)
        self._io = IoStats()  # get_io_stats(): counted at the seam and around native calls
        # The file-system seam (tests pass a simulated disk), counting its calls.
        self._fs = _fs = cast(OsFs, CountingFs(_fs, self._io))
        self._lock = threading.RLock()
        self._arrays: dict[str, OpenArray] = {}
        self._closed = False
        self._batch: Batch | None = None  # the open batch_mode / writable_batch_mode block
        self._commits = Committer(self.path, _fs, self.durable)  # the writer's side
        self._commits.marker_version = open_root(self.path, _fs)
        replay_if_unlocked(self.path, _fs)

    # ---- lifetime

    def close(self) -> None:
        """Makes every change durable, closes every array and releases the write lock."""
        with self._lock:
            if self._closed:
                return
            self._refuse_in_batch("close()")
            self._closed = True
            try:
                self._commits.finish_cleanup()
                self._sync_arrays()
            finally:
                for entry in self._arrays.values():
                    entry.close()
                self._arrays.clear()
                self._commits.release()

    def sync(self) -> None:
        """Makes every change so far durable (survives power loss); with
        ``durable=True`` they are already."""
        with self._lock:
            self._refuse_in_batch("sync()")
            self._commits.finish_cleanup()
            self._check_open()
            self._sync_arrays()

    def _sync_arrays(self) -> None:
        for entry in self._arrays.values():
            if entry.edited and not entry.closed:
                entry.sync()
        self._commits.sync_root()  # the renames of one-array saves and drops

    @property
    def closed(self) -> bool:
        """True once ``close()`` ran."""
        return self._closed

    def __enter__(self) -> ArrayStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self)} arrays"
        return f"ArrayStore({self.path!r}, {state})"

    # ---- names

    def get_member_list(self) -> list[str]:
        """The names of the arrays, sorted. A damaged array counts too (its
        ``load`` raises CorruptStoreError), so that damage never makes an
        array vanish."""
        self._check_open()
        fs = self._fs
        items = [item for item in fs.listdir(self.path) if not item.startswith(".")]
        members = {item for item in items if is_member(fs, os.path.join(self.path, item))}
        batch = self._batch_now()
        if isinstance(batch, MemoryBatch):
            members = (members - batch.dropped) | set(batch.arrays)
        return sorted(members)

    def has_array(self, name: str) -> bool:
        """Whether an array called ``name`` exists (False for a name no array can have)."""
        self._check_open()
        if not valid_name(name):
            return False
        batch = self._batch_now()
        if isinstance(batch, MemoryBatch) and (name in batch.arrays or name in batch.dropped):
            return name in batch.arrays
        return is_member(self._fs, os.path.join(self.path, name))

    def __contains__(self, name: object) -> bool:
        # has_array answers False for a non-str.
        return self.has_array(name)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[str]:
        return iter(self.get_member_list())

    def __len__(self) -> int:
        return len(self.get_member_list())

    # ---- reads

    def load(self, name: str, lazy: bool = False) -> npt.NDArray[Any] | LazyArray:
        """The whole array (one native gather into a fresh array), or with
        ``lazy=True`` at once a ``LazyArray`` that reads only the rows asked for."""
        lazy = check_flag("lazy", lazy)
        batch = self._batch_now()
        if isinstance(batch, MemoryBatch):
            return self._batch_array(batch, name).copy()
        if isinstance(batch, MappedBatch):
            return batch.load(self._entry(name))
        entry = self._entry(name)
        return LazyArray(entry) if lazy else entry.read_all()

    def __getitem__(self, name: str) -> npt.NDArray[Any] | LazyArray:
        return self.load(name)

    @contextlib.contextmanager
    def mmap_mode(self) -> Iterator[_LazyLoading]:
        """``with store.mmap_mode() as view:`` ``view.load(name)`` is lazy (numpack 0.1)."""
        self._check_open()
        yield _LazyLoading(self)

    def getitem(self, name: str, idx: Any) -> Any:  # idx and the result: as DenseDataset[idx]
        """Rows of ``name``: an int gives one row, a slice, list, int array or
        boolean mask gives an array of rows, read with one gather."""
        array = self._batch_view(name)
        if array is not None:
            if array.ndim == 0:
                raise IndexError(
                    f"array '{name}' is 0-d: it has no rows; load it with load('{name}')"
                )
            try:
                return np.array(array[idx])
            except IndexError as exc:
                raise IndexError(f"array '{name}': {exc}") from None
        entry = self._entry(name)
        if entry.scalar:
            raise IndexError(f"array '{name}' is 0-d: it has no rows; load it with load('{name}')")
        try:
            return entry.get(idx)
        except IndexError as exc:
            raise IndexError(f"array '{name}': {exc}") from None

    @overload
    def get_shape(self, name: None = None) -> dict[str, tuple[int, ...]]: ...
    @overload
    def get_shape(self, name: str) -> tuple[int, ...]: ...

    def get_shape(self, name: str | None = None) -> tuple[int, ...] | dict[str, tuple[int, ...]]:
        """The shape of ``name``, or a dict of the shapes of all arrays."""
        if name is not None:
            array = self._batch_view(name)
            return self._entry(name).shape if array is None else array.shape
        return {member: self.get_shape(member) for member in self.get_member_list()}

    def get_modify_time(self, name: str) -> float:
        """When ``name`` last changed, in seconds since the epoch (its last commit)."""
        self._refuse_in_batch("get_modify_time()")
        self._require(name)
        modified = zrecord.modified_ns(os.path.join(self.path, name), self._fs)
        log = log_path(os.path.join(self.path, name))
        if self._fs.exists(log):  # the last logical drop
            modified = max(modified, self._fs.stat(log).st_mtime_ns)
        return modified / 1e9

    def get_metadata(self) -> dict[str, Any]:
        """The format, and for each array its shape, dtype, codec, logical and
        on-disk bytes and modify time."""
        self._refuse_in_batch("get_metadata()")
        arrays = {}
        for name in self.get_member_list():
            entry = self._entry(name)
            arrays[name] = {
                "shape": list(entry.shape),
                "dtype": entry.dataset.dtype.str,
                "codec": entry.dataset.codec,
                "nbytes": math.prod(entry.shape) * entry.dataset.dtype.itemsize,
                "disk_bytes": _tree_bytes(self._fs, entry.path)
                + (entry.log.size or 0 if entry.log is not None else 0),
                "modify_time": self.get_modify_time(name),
            }
        format_fields = {"format": FORMAT_NAME, "version": self._commits.marker_version}
        return {**format_fields, "path": self.path, "arrays": arrays}

    def get_io_stats(self) -> dict[str, int]:
        """What this ArrayStore did since it was opened: ``bytes_read``,
        ``bytes_written``, ``reads``, ``writes``, ``syncs`` and ``calls``,
        counted at the file-system seam and around the native calls that read
        or write rows (the ArrayStore guide says exactly what each counts)."""
        return self._io.as_dict()

    def stream_load(self, name: str, buffer_size: int | None = None) -> Iterator[npt.NDArray[Any]]:
        """Iterates over ``name`` in chunks of at most ``buffer_size`` rows
        (default: 64 MiB of rows), each read with one gather."""
        array = self._batch_view(name)
        if array is not None:
            return _stream_memory(name, array, buffer_size)
        entry = self._entry(name)
        if entry.scalar:
            raise ValueError(
                f"array '{name}' is 0-d: it has no rows to stream; load it with load('{name}')"
            )
        if buffer_size is None:
            rows = entry.default_stream_rows()
        else:
            # No upper bound: a chunk is never more than the array's rows.
            rows = check_int("buffer_size (rows)", buffer_size, 1)
        return entry.stream(rows)

    def dataset(self, name: str) -> DenseDataset:
        """The array ``name`` as a new ``DenseDataset`` (for the ``DataLoader``).
        It reads the array as it is now; close it when done."""
        if self._batch_view(name) is not None:
            raise ArrayStoreBatchError(
                f"dataset('{name}') reads the disk, which does not hold this batch's '{name}' "
                "yet: call it after the batch block"
            )
        entry = self._entry(name)
        if entry.scalar:
            raise ValueError(f"array '{name}' is 0-d: a dataset needs rows")
        if entry.has_drops:
            # A dataset reads the directory's records: the dropped rows go first.
            with self._lock:
                self._begin_write()
                self._rewrite_live(self._entry(name))
            entry = self._entry(name)
        return DenseDataset(self._fs.real_path(entry.path))

    # ---- writes

    def save(self, arrays: Mapping[str, npt.ArrayLike], codec: str = "raw") -> None:
        """Creates or overwrites each named array (one record per row along
        axis 0). The call is one commit, durable when it returns: a crash or
        power cut leaves every named array old or every one new, never a mix.
        All names and arrays are checked before anything is written."""
        codec = _codec_name(codec)
        items = {name: _array_to_save(name, value) for name, value in _named(arrays, "save")}
        batch = self._batch_now()
        if batch is not None:
            memory = self._memory_batch(batch, "save")
            for name, array in items.items():
                memory.save(name, array, codec)
            return
        with self._lock:
            self._begin_write()
            self._commit(_builds(items, codec), [])

    # idx: as for DenseDataset[idx]
    def replace(self, arrays: Mapping[str, npt.ArrayLike], idx: Any) -> None:
        """Gives rows ``idx`` (int, slice, list, int array or boolean mask) of
        each named array new contents, in place and atomically. ``arrays`` maps
        names to rows of shape ``(len(idx), *row_shape)``; a repeated index
        takes its last row."""
        batch = self._batch
        if (
            batch is not None
            and type(idx) is int
            and type(arrays) is dict
            and len(arrays) == 1
            and batch.replace_row(arrays, idx)  # the usual call in a batch: one row, at once
        ):
            return
        items = _named(arrays, "replace")
        batch = self._batch_now()
        if batch is not None:
            self._batch_replace(batch, items, idx)
            return
        with self._lock:
            self._begin_write()
            plans: list[tuple[OpenArray, int | npt.NDArray[np.uint64], np.ndarray]] = []
            for name, rows in items:
                entry = self._row_entry(name, "replace")
                row = _one_row(idx, entry.length, name)
                if row is not None:
                    plans.append((entry, row, entry.rows(rows, 1, "replace")))
                    continue
                indices = _many_rows(idx, entry.length, name)
                data = entry.rows(rows, indices.size, "replace")
                plans.append((entry, *_last_wins(indices, data, idx)))
            for entry, selected, data in plans:
                entry.replace(selected, data)

    def append(self, arrays: Mapping[str, npt.ArrayLike]) -> None:
        """Appends rows to each named (existing) array."""
        items = _named(arrays, "append")
        batch = self._batch_now()
        if batch is not None:
            memory = self._memory_batch(batch, "append")
            additions = [
                (name, _batch_rows(memory, self._batch_array(memory, name), name, rows))
                for name, rows in items
            ]
            for name, data in additions:
                memory.reshape(name, np.concatenate([memory.arrays[name], data]))
            return
        with self._lock:
            self._begin_write()
            plans = []
            for name, rows in items:
                entry = self._row_entry(name, "append")
                plans.append((entry, entry.rows(rows, None, "append")))
            for entry, data in plans:
                if len(data):
                    entry.append(data)

    # rows: as for DenseDataset[rows]
    def drop(self, name: str | list[str] | tuple[str, ...], rows: Any = None) -> None:
        """Drops arrays (a name or a list of names; one commit, durable when
        it returns), or with ``rows`` drops those rows of each named array,
        keeping the order of the rest: marked deleted in the array's delete
        log (one record per array, O(rows dropped), atomic; durable when it
        returns unless ``durable=False``), skipped by every read from then
        on; ``compact()`` reclaims their space."""
        names = list(dict.fromkeys([name] if isinstance(name, str) else _name_list(name)))
        batch = self._batch_now()
        if batch is not None:
            self._batch_drop(self._memory_batch(batch, "drop"), names, rows)
            return
        with self._lock:
            self._begin_write()
            if rows is None:
                for member in names:
                    self._require(member)  # KeyError before any change
                self._commit({}, names)
                return
            plans = []
            for entry in [self._entry(member) for member in names]:
                if entry.scalar:
                    raise ValueError(
                        f"array '{entry.name}' is 0-d: it has no rows to drop; drop the array "
                        f"with drop('{entry.name}')"
                    )
                plans.append((entry, *_drop_mask(rows, entry.length, entry.name)))
            for entry, doomed, count in plans:
                if count:
                    if entry.log is None or entry.log.end == 0:
                        # A new log: the marker says version 3 first, and a
                        # deletion of an old log of the name waiting for the
                        # root's fsync must not delete the new one.
                        self._commits.before_log(entry.name)
                    entry.drop(doomed, count, self._fs)
                    if entry.log is not None and entry.log.new_name:
                        # durable=False: the log's name becomes durable with the
                        # root's next fsync (sync() makes it).
                        entry.log.new_name = False
                        self._commits.root_synced = False

    def clone(self, src: str, dst: str) -> None:
        """Creates the array ``dst`` with the contents of ``src``: one commit
        like a ``save`` (a crash or power cut leaves no ``dst`` or the whole
        copy), durable when it returns (``durable=False``: at ``sync()``).
        Each file is a reflink where the file system supports them (the
        blocks are shared until either array changes), else a kernel copy
        of its bytes. FileExistsError when ``dst`` exists: drop it first."""
        _check_name(src)
        _check_name(dst)
        self._refuse_in_batch("clone()")  # one commit of its own
        with self._lock:
            self._begin_write()
            entry = self._entry(src)  # KeyError when there is none
            if self.has_array(dst):
                raise FileExistsError(
                    errno.EEXIST,
                    f"cannot clone '{src}' to '{dst}': ArrayStore '{self.path}' already has an "
                    f"array '{dst}'; drop('{dst}') it first, or clone to a new name",
                )
            if entry.has_drops:  # a copy of the live rows (the files hold dropped ones)
                self._commit({dst: _live_build(entry, f"clone '{src}' to '{dst}'")}, [])
                return
            if entry.edited:
                entry.sync()  # the copy starts from a durable source
            fs = self._fs
            files = sorted(fs.listdir(entry.path))
            version = tuple(
                (item, fs.stat(os.path.join(entry.path, item)).st_size) for item in files
            ) + (zrecord.modified_ns(entry.path, fs),)
            build = functools.partial(clone_array, source=fs.real_path(entry.path), version=version)
            self._commit({dst: build}, [])

    def compact(self) -> None:
        """Reclaims the space of replaced and dropped rows in every array: an
        array with dropped rows is rewritten with its live rows (one commit,
        like a ``save`` of it, which also deletes its delete log), every
        other array compacts in place (the store's own crash-safe compaction)."""
        self._refuse_in_batch("compact()")
        with self._lock:
            self._begin_write()
            for name in self.get_member_list():
                entry = self._entry(name)
                if entry.has_drops:
                    self._rewrite_live(entry)
                else:
                    entry.compact()

    def _rewrite_live(self, entry: OpenArray) -> None:
        """Rewrites ``entry``'s array with its live rows only: one commit."""
        self._commit({entry.name: _live_build(entry, f"compact ArrayStore '{self.path}'")}, [])

    def reset(self) -> None:
        """Drops every array."""
        batch = self._batch_now()
        if batch is not None:
            self._batch_drop(self._memory_batch(batch, "reset"), self.get_member_list(), None)
            return
        with self._lock:
            self._begin_write()
            self._commit({}, self.get_member_list())

    # ---- batch modes

    @contextlib.contextmanager
    def batch_mode(self) -> Iterator[ArrayStore]:
        """``with store.batch_mode():`` every read and edit inside goes to
        memory (each array touched is read whole once); the block's end is one
        atomic commit of all of it (nothing of the batch on disk before, all
        after). An exception inside discards the batch: nothing is written.
        See the ArrayStore guide for what the commit costs."""
        yield from self._batch_block(MemoryBatch(), "batch_mode")

    @contextlib.contextmanager
    def writable_batch_mode(self) -> Iterator[ArrayStore]:
        """``with store.writable_batch_mode():`` ``load(name)`` returns a
        writable array (the same one each time) whose edits are committed at
        the block's end as one atomic commit of only the rows that changed.
        ``replace`` works too; ``save``, ``append`` and ``drop`` do not (use
        ``batch_mode``). An exception inside discards the edits. After the
        block the arrays are read-only."""
        yield from self._batch_block(MappedBatch(), "writable_batch_mode")

    def _batch_block(self, batch: Batch, what: str) -> Iterator[ArrayStore]:
        with self._lock:
            if self._batch is not None:
                where = "this thread" if self._batch.owned() else "another thread"
                raise ArrayStoreBatchError(
                    f"cannot start {what}: ArrayStore '{self.path}' is already in a batch "
                    f"({where}); batches do not nest: finish the open one first"
                )
            self._begin_write()  # the write lock: nothing else changes the disk meanwhile
            self._batch = batch
        try:
            yield self
        except BaseException:
            self._end_batch(batch)  # discarded: a half-run batch is no state the caller meant
            raise
        try:
            with self._lock:
                plan = batch.plan()
                self._batch = None
                self._commit_plan(plan)
        finally:
            self._end_batch(batch)

    def _end_batch(self, batch: Batch) -> None:
        with self._lock:
            self._batch = None
            if isinstance(batch, MappedBatch):
                batch.close()

    def _commit_plan(self, plan: Any) -> None:  # Any: an _arraybatch.Plan
        """The batch's one commit: one in-place replace, or one commit of
        `_arraycommit` (rewrites and drops)."""
        if plan.empty:
            return
        self._begin_write()
        if plan.rows:
            ((name, (indices, rows)),) = plan.rows.items()
            entry = self._entry(name)
            data = np.ascontiguousarray(rows)
            entry.replace(indices, data)
            return
        for entry, carried in plan.carried.values():
            entry.require_sound(
                f"commit the batch of ArrayStore '{self.path}'",
                carried,
                "nothing of the batch was written (it is discarded)",
            )
        builds: dict[str, Callable[..., None]] = {
            name: functools.partial(write_array, array=array, codec=codec)
            for name, (array, codec) in plan.rewrite.items()
        }
        self._commit(builds, plan.drops)

    def _batch_now(self) -> Batch | None:
        """The open batch of this thread; ArrayStoreBatchError when another
        thread has one (its calls would mix with the batch)."""
        batch = self._batch
        if batch is not None and not batch.owned():
            raise ArrayStoreBatchError(
                f"ArrayStore '{self.path}' is in a batch of another thread: call it from that "
                "thread, or after its batch block ends"
            )
        return batch

    def _refuse_in_batch(self, what: str) -> None:
        if self._batch_now() is not None:
            raise ArrayStoreBatchError(
                f"{what} is not available inside a batch of ArrayStore '{self.path}': call it "
                "after the batch block"
            )

    def _memory_batch(self, batch: Batch, what: str) -> MemoryBatch:
        if not isinstance(batch, MemoryBatch):
            raise ArrayStoreBatchError(
                f"{what} is not available in writable_batch_mode (it edits arrays in place): "
                "edit the arrays load() returns, or use batch_mode"
            )
        return batch

    def _batch_array(self, batch: MemoryBatch, name: str) -> np.ndarray:
        """The batch's state of ``name`` (read whole on first touch); KeyError
        when the batch dropped it or there is none."""
        _check_name(name)
        array = batch.arrays.get(name)
        if array is None:
            self._require(name)  # knows the batch's drops
            array = batch.touch(self._entry(name))
        return array

    def _batch_view(self, name: str) -> np.ndarray | None:
        """The batch's array ``name`` when a batch holds it (reads answer from
        it), else None (reads go to the disk)."""
        batch = self._batch_now()
        if isinstance(batch, MemoryBatch):
            return self._batch_array(batch, name)
        if isinstance(batch, MappedBatch):
            copy = batch.copies.get(name)
            return None if copy is None else copy.array
        return None

    def _batch_replace(self, batch: Batch, items: list[tuple[str, Any]], idx: Any) -> None:
        """A replace inside ``batch``: every array's rows checked before any
        is kept, so a refused replace changes nothing."""
        plans: list[tuple[str, Any, Any, np.ndarray]] = []
        for name, rows in items:
            if isinstance(batch, MemoryBatch) and name not in batch.arrays:
                # No copy yet: kept as rows only (the disk does not change in a batch).
                held = batch.pending.get(name)
                entry, length = (held.entry, held.length) if held else self._pending_entry(name)
                key: int | npt.NDArray[np.uint64] | None = _one_row(idx, length, name)
                if key is None:
                    key = _many_rows(idx, length, name)
                count = 1 if isinstance(key, int) else key.size
                plans.append(
                    (name, held or (entry, length), key, entry.rows(rows, count, "replace"))
                )
                continue
            if isinstance(batch, MemoryBatch):
                array = self._batch_array(batch, name)
            else:
                assert isinstance(batch, MappedBatch)
                array = batch.load(self._row_entry(name, "replace"))
            if array.ndim == 0:
                raise ValueError(
                    f"cannot replace rows of '{name}': it is a 0-d array; save a new value "
                    "with save()"
                )
            indices = _row_indices(idx, len(array), name)
            data = coerce_rows(name, array.dtype, array.shape[1:], rows, indices.size, "replace")
            plans.append((name, array, indices, data))
        for name, target, indices, data in plans:
            if isinstance(target, Pending):
                target.add(indices, data)
            elif isinstance(target, tuple):
                assert isinstance(batch, MemoryBatch)
                batch.defer(target[0], target[1], indices, data)
            elif isinstance(batch, MemoryBatch):
                batch.replace(name, indices, data)
            else:
                target[indices] = data

    def _pending_entry(self, name: str) -> tuple[OpenArray, int]:
        """The open array ``name`` and its length, for the first replace a
        batch keeps aside."""
        self._require(name)  # knows the batch's drops
        entry = self._row_entry(name, "replace")
        return entry, entry.length

    def _batch_drop(self, batch: MemoryBatch, names: list[str], rows: Any) -> None:
        if rows is None:
            for member in names:
                self._require(member)  # KeyError before any change
            for member in names:
                on_disk = is_member(self._fs, os.path.join(self.path, member))
                batch.drop(member, on_disk)
            return
        plans = []
        for member in names:
            array = self._batch_array(batch, member)
            if array.ndim == 0:
                raise ValueError(
                    f"array '{member}' is 0-d: it has no rows to drop; drop the array "
                    f"with drop('{member}')"
                )
            plans.append((member, array, _row_indices(rows, len(array), member)))
        for member, array, indices in plans:
            if indices.size:
                batch.reshape(member, np.delete(array, indices.astype(np.intp), axis=0), indices)

    # ---- internals

    def _check_open(self) -> None:
        """Refuses a closed store; finishes a commit a fault interrupted
        (so reads after the fault clears see the committed state)."""
        if self._closed:
            raise StoreClosedError(
                f"ArrayStore '{self.path}' is closed; open it again with ArrayStore(path)"
            )
        if self._commits.unfinished:
            with self._lock:
                self._commits.settle()

    def _entry(self, name: str) -> OpenArray:
        """The open array ``name``; KeyError when there is none.

        The writer's handles are current by construction. A reader checks
        that the directory is still the one it opened (its open handle pins
        the inode, so the number cannot be reused) and refreshes the store
        to see other processes' commits.
        """
        _check_name(name)
        with self._lock:
            self._check_open()
            entry = self._arrays.get(name)
            if entry is not None and self._commits.writing:
                return entry
            path = self._prefix + name
            if entry is None:  # the usual first open: its directory's inode comes with it
                entry = OpenArray.open_usual(name, path, self._fs, self.durable, self._io)
                if entry is not None:
                    self._arrays[name] = entry
                    return entry
            inode = self._fs.identity(path)
            if entry is not None:
                if inode == entry.inode:
                    entry.refresh(self._fs)
                    return entry
                self._forget(name)
            if inode is None:
                self._require(name)
            assert inode is not None  # _require raised otherwise
            try:
                entry = OpenArray.open(name, path, inode, self._fs, self.durable, self._io)
            except FileNotFoundError:  # gone since (KeyError), or its schema is: damage
                self._require(name)
                raise CorruptStoreError(
                    f"array '{name}' of ArrayStore '{self.path}' is damaged: its directory has "
                    f"no readable {SCHEMA_FILE}; restore the array from a copy, or "
                    f"drop('{name}') it",
                    STATUS_CODES["corrupt"],
                ) from None
            self._arrays[name] = entry
            return entry

    def _require(self, name: str) -> None:
        """KeyError unless ``name`` is an array (without opening it)."""
        if not self.has_array(name):
            _check_name(name)
            raise KeyError(
                f"no array named {name!r} in ArrayStore '{self.path}' "
                f"(it has {self.get_member_list()})"
            )

    def _row_entry(self, name: str, what: str) -> OpenArray:
        entry = self._entry(name)
        if entry.scalar:
            raise ValueError(
                f"cannot {what} rows of '{name}': it is a 0-d array; save a new value with save()"
            )
        return entry

    def _forget(self, name: str) -> None:
        entry = self._arrays.pop(name, None)
        if entry is not None:
            entry.close()

    def _forget_all(self, names: list[str]) -> None:
        for name in names:
            self._forget(name)

    def _begin_write(self) -> None:
        """Takes the directory's write lock on first use, then finishes what a
        crashed writer left and revalidates handles opened as a reader."""
        self._commits.finish_cleanup()
        self._check_open()
        self._commits.begin(self._revalidate)

    def _revalidate(self) -> None:
        """Reopens or refreshes stale handles (run before this ArrayStore
        writes: ``_entry`` still treats it as a reader)."""
        for name in list(self._arrays):
            try:
                self._entry(name)
            except KeyError:
                pass  # dropped by another writer: _entry forgot it

    def _commit(self, builds: dict[str, Callable[..., None]], drops: list[str]) -> None:
        """Saves the arrays ``builds`` write and drops ``drops`` as one commit
        (see `_arraycommit`); ArrayStoreIOError on a file-system error."""
        self._commits.commit(builds, drops, self._forget_all)

    # ---- interchange (loaderx._arrayio: converters, DLPack, pack files)

    def import_(
        self,
        source: Any,  # a path or an in-memory object: see the docstring
        format: str | None = None,
        *,
        names: list[str] | None = None,
        codec: str = "raw",
    ) -> list[str]:
        """Saves the arrays of ``source`` in one commit (all or none) and
        returns their names, sorted. ``source`` is a file (``format`` from
        its suffix unless given: npy, npz, pt, safetensors, hdf5, zarr,
        parquet, feather, csv) or an object: a ``{name: array}`` dict whose
        values may be any DLPack producer (PyTorch, JAX tensors), a pandas
        DataFrame, an h5py File or Group, a zarr Group or a pyarrow Table.
        ``names`` picks arrays; files are read in bounded chunks of rows."""
        self._refuse_in_batch("import_()")  # one commit of its own
        codec = _codec_name(codec)
        return _arrayio.import_arrays(self, source, format, names, codec)

    def export(
        self,
        path: StrPath | None,
        format: str | None = None,
        *,
        names: list[str] | None = None,
        chunk_bytes: int = _arrayio.CHUNK_BYTES,
    ) -> Any:  # None, or the in-memory object of format "torch" or "pandas"
        """Writes the arrays (``names``, default all) to the file ``path``
        (written beside it, renamed into place when complete), reading
        ``chunk_bytes`` of rows at a time; ``export(None, "torch")`` returns
        ``{name: tensor}`` and ``export(None, "pandas")`` a DataFrame."""
        self._refuse_in_batch("export()")  # it reads the committed arrays
        chunk_bytes = _arrayio.check_chunk_bytes(chunk_bytes)
        chosen = self.get_member_list() if names is None else _name_list(names)
        arrays = {name: self._lazy(name) for name in chosen}
        return _arrayio.export_arrays(path, format, arrays, chunk_bytes)

    def pack(self, path: StrPath, *, chunk_bytes: int = _arrayio.CHUNK_BYTES) -> None:
        """Writes the whole store to the one file ``path``: zstd-compressed
        (byte-shuffled by the element size), every frame checksummed
        (SHA-256), streamed; ``unpack`` reads it."""
        self._refuse_in_batch("pack()")  # it reads the committed arrays
        chunk_bytes = _arrayio.check_chunk_bytes(chunk_bytes)
        arrays = {}
        for name in self.get_member_list():
            entry = self._entry(name)
            # The pack checksums what it reads: damage read here would pass its checks.
            entry.require_sound(f"pack ArrayStore '{self.path}'", outcome="no pack was written")
            arrays[name] = (LazyArray(entry), entry.dataset.codec)
        _arrayio.pack_store(os.fspath(path), arrays, chunk_bytes)

    @classmethod
    def unpack(cls, path: StrPath, dst: StrPath) -> ArrayStore:
        """Unpacks the pack file ``path`` into a new store at ``dst`` and opens
        it. Every frame is checked; a damaged file raises CorruptPackError
        and leaves nothing at ``dst``."""
        # Staged without a sync per array: close() makes it all durable before the rename.
        _arrayio.unpack_store(os.fspath(path), os.fspath(dst), lambda at: cls(at, durable=False))
        return cls(dst)

    def _lazy(self, name: str) -> LazyArray:
        return LazyArray(self._entry(name))


class _LazyLoading:
    """The view ``mmap_mode()`` yields: the store, with lazy ``load``."""

    def __init__(self, store: ArrayStore) -> None:
        self._store = store

    def load(self, name: str, lazy: bool = True) -> npt.NDArray[Any] | LazyArray:
        return self._store.load(name, lazy=lazy)

    def __getitem__(self, name: str) -> npt.NDArray[Any] | LazyArray:
        return self._store.load(name, lazy=True)

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._store, attribute)

    def __contains__(self, name: object) -> bool:
        return name in self._store

    def __iter__(self) -> Iterator[str]:
        return iter(self._store)

    def __len__(self) -> int:
        return len(self._store)


# ---- argument checks ----------------------------------------------------------------


def _named(arrays: Any, what: str) -> list[tuple[str, Any]]:  # Any: checked here
    """The ``(name, value)`` pairs of a ``{name: array}`` argument, names checked."""
    if not hasattr(arrays, "items"):
        raise TypeError(f"{what} takes a dict {{name: array}}, got {type(arrays).__name__}")
    items = list(arrays.items())
    for name, _ in items:
        _check_name(name)
    return items


def _name_list(names: str | list[str] | tuple[str, ...]) -> list[str]:
    if isinstance(names, (list, tuple)):
        for name in names:
            _check_name(name)
        return list(names)
    _check_name(names)
    return [names]


def _check_name(name: object) -> None:
    if not valid_name(name):
        raise ValueError(
            f"invalid array name {name!r}: a name is a non-empty str of at most "
            f"{NAME_BYTES_MAX} bytes, without '/', '\\' or NUL, not starting with '.'"
        )


def _builds(arrays: dict[str, np.ndarray], codec: str) -> dict[str, Callable[..., None]]:
    """The writer of each array's directory, for the commit to stage: a
    ``functools.partial``, which the simulated disk memoises by its arguments."""
    return {
        name: functools.partial(write_array, array=array, codec=codec)
        for name, array in arrays.items()
    }


def _live_build(entry: OpenArray, what: str) -> Callable[..., None]:
    """The build of a new directory holding ``entry``'s live rows: read
    whole when small, else in chunks of rows (a RowSource). Damaged live
    rows are refused first (``what``: the call, for the message)."""
    entry.require_sound(what)
    if entry.length * entry.row_bytes <= STREAM_BYTES:
        rows: Any = entry.read_all()
    else:
        dtype, shape = entry.dataset.dtype, entry.shape
        rows = RowSource(entry.name, dtype, shape, entry.read_rows)
    return functools.partial(write_array, array=rows, codec=entry.dataset.codec)


def _codec_name(codec: str) -> str:
    if codec not in CODECS:
        raise ValueError(f"unknown codec {codec!r}: use one of {sorted(CODECS)}")
    return codec


def _array_to_save(name: str, value: npt.ArrayLike) -> np.ndarray:
    if isinstance(value, (str, bytes)):
        # A path or a mistyped value, not an array: np.asarray would make it a
        # 0-d string array and replace the array that had the name.
        raise TypeError(
            f"cannot save '{name}': got {type(value).__name__} {value[:40]!r}, not an array; "
            f"save takes {{name: array}} (a 0-d string array, if that is meant, is "
            f"np.array({value[:40]!r}))"
        )
    if isinstance(value, RowSource):  # read in chunks by write_array, like an ndarray
        return value  # type: ignore[return-value]
    if not isinstance(value, (np.ndarray, LazyArray)) and hasattr(value, "__dlpack__"):
        value = _arrayio.from_dlpack(name, value)
    array = value if isinstance(value, np.ndarray) else np.asarray(value)
    if array.dtype.hasobject:
        raise ValueError(
            f"cannot save '{name}': dtype {array.dtype} holds Python objects; convert it to a "
            "numeric, string or bytes dtype"
        )
    return array


def _row_indices(key: Any, length: int, name: str) -> npt.NDArray[np.uint64]:
    """Row selector (int, slice, list, int array, bool mask; negative counts
    from the end) as flat uint64 indices; IndexError when out of range."""
    row = _one_row(key, length, name)
    if row is not None:
        return np.array([row], dtype=np.uint64)
    return _many_rows(key, length, name)


def _many_rows(key: Any, length: int, name: str) -> npt.NDArray[np.uint64]:
    """``_row_indices`` of a selector ``_one_row`` found not to be one row."""
    try:
        indices, shape = record_indices(key, length)
    except IndexError as exc:
        raise IndexError(f"array '{name}': {exc}") from None
    if len(shape) != 1:
        raise ValueError(
            f"array '{name}': give row indices as a flat list, got an index array of shape {shape}"
        )
    return indices


def _one_row(key: Any, length: int, name: str) -> int | None:
    """The row of a selector of one row (an int, or a list of one int) as
    for ``_row_indices``; None for any other selector."""
    if type(key) is int and 0 <= key < length:  # the usual row: none of the checks below
        return key
    if type(key) is list and len(key) == 1:
        key = key[0]
    if not is_int(key):
        return None
    try:
        return int_index(key, length)
    except IndexError as exc:
        raise IndexError(f"array '{name}': {exc}") from None


def _drop_mask(key: Any, length: int, name: str) -> tuple[npt.NDArray[np.bool_], int]:
    """The rows ``key`` selects (as for ``_row_indices``) as a mask of the
    array's ``length`` rows, and how many it marks (a repeat counts once).
    A flat int64 array is scattered as it is, no copy and no pass of its
    own: the scatter checks the range (NumPy counts a negative row from the
    end, as ``_row_indices`` does), and on an IndexError ``_row_indices``
    reads the selector again to say which row is out of range."""
    mask = np.zeros(length, dtype=bool)
    if isinstance(key, np.ndarray) and key.dtype == np.int64 and key.ndim == 1:
        try:
            mask[key] = True
        except IndexError:
            _row_indices(key, length, name)  # raises the store's IndexError
            raise
    else:
        mask[_row_indices(key, length, name).view(np.int64)] = True
    return mask, int(np.count_nonzero(mask))


def _last_wins(
    indices: npt.NDArray[np.uint64], data: npt.NDArray[Any], key: Any
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[Any]]:
    """Drops repeated indices but the last (NumPy's assignment order), since
    the store takes each record once per replace."""
    if isinstance(key, slice) or indices.size < 2 or np.all(indices[1:] > indices[:-1]):
        return indices, data
    reversed_unique, first_in_reversed = np.unique(indices[::-1], return_index=True)
    if reversed_unique.size == indices.size:
        return indices, data
    keep = indices.size - 1 - first_in_reversed
    return reversed_unique, np.ascontiguousarray(data[keep])


def _batch_rows(batch: MemoryBatch, array: np.ndarray, name: str, rows: Any) -> np.ndarray:
    """Rows to append to the batch's ``array`` ``name``, coerced and checked."""
    if array.ndim == 0:
        raise ValueError(
            f"cannot append rows of '{name}': it is a 0-d array; save a new value with save()"
        )
    return coerce_rows(name, array.dtype, array.shape[1:], rows, None, "append")


def _stream_memory(name: str, array: np.ndarray, buffer_size: int | None) -> Iterator[np.ndarray]:
    """``stream_load`` of a batch's array: copies of chunks of its rows."""
    if array.ndim == 0:
        raise ValueError(
            f"array '{name}' is 0-d: it has no rows to stream; load it with load('{name}')"
        )
    if buffer_size is None:
        row_bytes = array.itemsize * math.prod(array.shape[1:])
        rows = max(1, STREAM_BYTES // max(row_bytes, 1))
    else:
        rows = check_int("buffer_size (rows)", buffer_size, 1)
    return (array[start : start + rows].copy() for start in range(0, len(array), rows))


def _tree_bytes(fs: OsFs, path: str) -> int:
    files = [os.path.join(path, item) for item in fs.listdir(path)]
    return sum(fs.stat(file).st_size for file in files if fs.isfile(file))
