"""ArrayStore: a directory of named NumPy arrays with in-place row edits.

The numpack operations (``save``, ``load``, lazy loads, ``getitem``,
``replace``, ``append``, ``drop``, ...) over zrecord stores. Layout::

    <root>/.arraystore.msgpack   {"format": "loaderx-arraystore", "version": 1}
    <root>/.lock                 flock(LOCK_EX) held by the one writing ArrayStore
    <root>/<name>/               a dense loaderx store (zrecord + schema.msgpack),
                                 one record per row along axis 0
    <root>/<name>/array.msgpack  only for 0-d arrays, stored as one scalar row
    <root>/.commit.msgpack       the commit record of a save or drop in flight
    <root>/.new-<name>  .prev-<name>  .drop-<name>  saves and drops in flight

The directory is the only list of arrays, so there is no catalogue to keep in
step with the data. Row edits are the store's atomic commits. One ``save`` or
``drop`` call is one commit, however many arrays it names:

1. ``save`` writes each new array whole into ``.new-<name>`` (zrecord makes
   its data and schema durable), then fsyncs the root once so those
   directory entries are durable too.
2. The commit record ``.commit.msgpack`` (checksummed: each saved name with
   the generation id of its new directory, a random id recorded in that
   directory's schema file, so it survives a copy of the store; and the
   dropped names) is written
   to a temporary file, fsynced, renamed into place and the root fsynced:
   that fsync is the commit point.
3. Each new directory is swapped in with the one directory swap of ``_fs``
   (``swap_in``: ``renameat2(RENAME_EXCHANGE)``, or where the kernel or file
   system lacks it two renames through ``.prev-<name>``), each dropped array
   is renamed to ``.drop-<name>``, the root is fsynced, the record deleted,
   and the old directories removed.

A call that saves or drops one array needs no record: one exchange or rename
of the root, fsynced (with ``durable=False`` at the next ``sync()``; what it
replaced is deleted only after that fsync, since a power cut can keep a
deletion and drop the rename before it).

A commit record left by a crash is replayed: the generation ids tell which
swaps happened (an exchange leaves both names in place), so each array ends
as the call's new contents. Without a record, leftovers follow the swap's one
rule (``_fs.clean_leftovers``: a ``.prev-<name>`` without ``<name>`` comes
back, every other ``.new-`` and ``.prev-`` is deleted, after an fsync of the
root), and every ``.drop-`` entry is deleted. A drop first makes sure no
``.prev-<name>`` of a dropped name can outlive it. (An ``.old-<name>`` whose
``<name>`` is missing was left by a crash in a loaderx from before the commit
record and is renamed back.) The first write of
an ArrayStore takes the root lock and does this; opening one does it too when
no writer holds the lock. Every file-system call goes through the seam in
``_fs.py``, which the tests replace with a simulated disk that loses power.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import secrets
import threading
import zlib
from typing import Any, Callable, Iterator, Mapping, Sequence, cast, overload

import msgpack
import numpy as np
import numpy.typing as npt

from ._checks import check_flag, check_int
from ._fs import ASIDE_PREFIX, OS_FS, STAGING_PREFIX, OsFs, clean_leftovers, make_dirs_durable, swap_in, write_file_atomic
from .converter import build_dense_store
from .dataset import SCHEMA_FILE, DenseDataset, StrPath, _int_index, _is_int, _record_indices
from ._errors import class_for_errno
from .zrecord import (
    CODECS, CorruptStoreError, StoreClosedError, StoreFullError, StoreLockedError, StoreOSError, StoreReadOnlyError, Zrecord,
)

__all__ = ["ArrayStore", "ArrayStoreFullError", "ArrayStoreIOError", "ArrayStoreReadOnlyError", "LazyArray"]

FORMAT_NAME = "loaderx-arraystore"
FORMAT_VERSION = 1
MARKER_FILE = ".arraystore.msgpack"
LOCK_FILE = ".lock"
ARRAY_FILE = "array.msgpack"  # only in the directory of a 0-d array
NAME_BYTES_MAX = 200  # leaves room for the ".drop-" prefix within NAME_MAX (255)
STREAM_BYTES = 64 << 20  # stream_load's default chunk, in bytes of rows
COMMIT_FILE = ".commit.msgpack"
COMMIT_FORMAT = "loaderx-arraystore-commit"
# Version 2 names each new directory by the generation id in its schema
# file; version 1 (read still) by its inode number, which a copy changes.
COMMIT_VERSION = 2
_STAGING = (".new-", ".prev-", ".drop-", ".old-")
_MARKER_BYTES_MAX = 1 << 16


class ArrayStoreIOError(StoreOSError):
    """A save or drop failed on a file-system error: an ``OSError`` with the
    ``errno``, and a ``StoreFullError`` or ``StoreReadOnlyError`` when the
    errno says so. ``outcome`` says what the call left: ``"unchanged"``
    (nothing changed), ``"committed"`` (the call is durable; finishing it
    failed and the next call retries that), or ``"unknown"`` (the fsync that
    commits it failed and taking it back failed too: after a reopen the call
    is applied entirely or not at all)."""

    def __new__(cls, code: int | None, message: str, outcome: str) -> "ArrayStoreIOError":
        if cls is ArrayStoreIOError:
            cls = _IO_ERROR_CLASSES.get(class_for_errno(code), cls)
        return OSError.__new__(cls, message)

    def __init__(self, code: int | None, message: str, outcome: str) -> None:
        store_class = class_for_errno(code) or StoreOSError
        StoreOSError.__init__(self, message, {StoreFullError: 8, StoreReadOnlyError: 7}.get(store_class, 3), code or None)
        self.outcome = outcome

    def __reduce__(self) -> tuple[type, tuple[int | None, str, str]]:  # type: ignore[override]
        return (ArrayStoreIOError, (self.errno, str(self), self.outcome))


class ArrayStoreFullError(ArrayStoreIOError, StoreFullError):
    """An ``ArrayStoreIOError`` of a full disk or quota (ENOSPC, EDQUOT, EFBIG)."""


class ArrayStoreReadOnlyError(ArrayStoreIOError, StoreReadOnlyError):
    """An ``ArrayStoreIOError`` of a place that cannot be written (EROFS, EACCES, EPERM)."""


_IO_ERROR_CLASSES: dict[type | None, type[ArrayStoreIOError]] = {
    StoreFullError: ArrayStoreFullError, StoreReadOnlyError: ArrayStoreReadOnlyError,
}


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
        self.durable = check_flag("durable", durable)  # durable="no" is truthy: refused, not taken as True
        self._fs = _fs  # the file-system seam; tests pass a simulated disk
        self._root_synced = True  # False after a rename of a non-durable one-array commit, until sync()
        # The deletion of the last commit record is not fsynced (a replay
        # finds every step done); a one-array commit must fsync it first, or a
        # power cut could keep its rename but the record too.
        self._record_unlinked = False
        self._lock = threading.RLock()
        self._arrays: dict[str, _Array] = {}
        self._lock_fd: int | None = None
        self._closed = False
        self._unfinished = False  # a commit or cleanup of this writer still to finish
        self._cleanup: threading.Thread | None = None  # deleting the last commit's leftovers
        # With durable=False: what one-array commits replaced, deleted only
        # once their renames are durable (the next fsync of the root), since
        # a power cut may keep a deletion and drop the rename before it.
        self._deferred: list[str] = []
        _open_root(self.path, _fs)
        _replay_if_unlocked(self.path, _fs)

    # ---- lifetime

    def close(self) -> None:
        """Makes every change durable, closes every array and releases the write lock."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._finish_cleanup()
                self._sync_arrays()
            finally:
                for entry in self._arrays.values():
                    entry.close()
                self._arrays.clear()
                if self._lock_fd is not None:
                    self._fs.unlock(self._lock_fd)
                    self._lock_fd = None

    def sync(self) -> None:
        """Makes every change so far durable (survives power loss); with
        ``durable=True`` they are already."""
        with self._lock:
            self._finish_cleanup()
            self._check_open()
            self._sync_arrays()

    def _sync_arrays(self) -> None:
        for entry in self._arrays.values():
            if entry.edited and not entry.closed:
                entry.store.sync()
                entry.edited = False
        if not self._root_synced:
            self._fs.fsync_dir(self.path)  # the renames of one-array saves and drops
            self._root_synced = True
        self._remove_deferred()

    def _remove_deferred(self) -> None:
        """Deletes what earlier one-array commits replaced (their renames are
        durable now: the caller fsynced the root)."""
        assert self._root_synced
        paths, self._deferred = self._deferred, []
        self._remove(paths)

    def _before_drop(self, drops: Sequence[str]) -> None:
        """Makes sure no ``.prev-<name>`` of a dropped name survives a power
        cut that keeps the drop: the swap's leftover rule would take it for
        a two-rename swap cut short and bring the old contents back."""
        if not drops:
            return
        stale = [path for path in (os.path.join(self.path, ASIDE_PREFIX + name) for name in drops) if self._fs.exists(path)]
        for path in stale:
            self._fs.rmtree(path)
        if stale or self._record_unlinked:
            self._fs.fsync_dir(self.path)  # also the deletions of the last commit's leftovers
            self._record_unlinked = False

    def _flush_deferred(self, saves: Sequence[str], drops: Sequence[str]) -> None:
        """Before a commit reuses a leftover name whose deletion waits for
        durability: makes the root durable and deletes them all."""
        leftovers = [STAGING_PREFIX + name for name in saves] + [ASIDE_PREFIX + name for name in [*saves, *drops]] + [".drop-" + name for name in drops]
        if {os.path.join(self.path, leftover) for leftover in leftovers} & set(self._deferred):
            self._fs.fsync_dir(self.path)
            self._root_synced = True
            self._remove_deferred()

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
        names = [item for item in fs.listdir(self.path) if not item.startswith(".") and _is_member(fs, os.path.join(self.path, item))]
        return sorted(names)

    def has_array(self, name: str) -> bool:
        """Whether an array called ``name`` exists (False for a name no array can have)."""
        self._check_open()
        if not _valid_name(name):
            return False
        return _is_member(self._fs, os.path.join(self.path, name))

    def __contains__(self, name: object) -> bool:
        return self.has_array(name)  # type: ignore[arg-type]  # has_array answers False for a non-str

    def __iter__(self) -> Iterator[str]:
        return iter(self.get_member_list())

    def __len__(self) -> int:
        return len(self.get_member_list())

    # ---- reads

    def load(self, name: str, lazy: bool = False) -> npt.NDArray[Any] | LazyArray:
        """The whole array (one native gather into a fresh array), or with
        ``lazy=True`` at once a ``LazyArray`` that reads only the rows asked for."""
        lazy = check_flag("lazy", lazy)
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
        entry = self._entry(name)
        if entry.scalar:
            raise IndexError(f"array '{name}' is 0-d: it has no rows; load it with load('{name}')")
        try:
            return entry.dataset[idx]
        except IndexError as exc:
            raise IndexError(f"array '{name}': {exc}") from None

    @overload
    def get_shape(self, name: None = None) -> dict[str, tuple[int, ...]]: ...
    @overload
    def get_shape(self, name: str) -> tuple[int, ...]: ...

    def get_shape(self, name: str | None = None) -> tuple[int, ...] | dict[str, tuple[int, ...]]:
        """The shape of ``name``, or a dict of the shapes of all arrays."""
        if name is not None:
            return self._entry(name).shape
        return {member: self._entry(member).shape for member in self.get_member_list()}

    def get_modify_time(self, name: str) -> float:
        """When ``name`` last changed, in seconds since the epoch (its last commit)."""
        self._require(name)
        root = os.path.join(self.path, name)
        times = [self._fs.stat(os.path.join(root, "superblock")).st_mtime]
        # An in-place replace commits in the journal, not the superblock.
        for item in self._fs.listdir(root):
            if item.startswith("journal-"):
                try:
                    times.append(self._fs.stat(os.path.join(root, item)).st_mtime)
                except FileNotFoundError:  # a layout change deleted it just now
                    pass
        return max(times)

    def get_metadata(self) -> dict[str, Any]:
        """The format, and for each array its shape, dtype, codec, logical and
        on-disk bytes and modify time."""
        arrays = {}
        for name in self.get_member_list():
            entry = self._entry(name)
            arrays[name] = {
                "shape": list(entry.shape),
                "dtype": entry.dataset.dtype.str,
                "codec": entry.dataset.codec,
                "nbytes": math.prod(entry.shape) * entry.dataset.dtype.itemsize,
                "disk_bytes": _tree_bytes(self._fs, entry.path),
                "modify_time": self.get_modify_time(name),
            }
        return {"format": FORMAT_NAME, "version": FORMAT_VERSION, "path": self.path, "arrays": arrays}

    def stream_load(self, name: str, buffer_size: int | None = None) -> Iterator[npt.NDArray[Any]]:
        """Iterates over ``name`` in chunks of at most ``buffer_size`` rows
        (default: 64 MiB of rows), each read with one gather."""
        entry = self._entry(name)
        if entry.scalar:
            raise ValueError(f"array '{name}' is 0-d: it has no rows to stream; load it with load('{name}')")
        if buffer_size is None:
            rows = max(1, STREAM_BYTES // max(entry.row_bytes, 1))
        else:
            # No upper bound: a chunk is never more than the array's rows.
            rows = check_int("buffer_size (rows)", buffer_size, 1)
        return _stream(entry, rows)

    def dataset(self, name: str) -> DenseDataset:
        """The array ``name`` as a new ``DenseDataset`` (for the ``DataLoader``).
        It reads the array as it is now; close it when done."""
        entry = self._entry(name)
        if entry.scalar:
            raise ValueError(f"array '{name}' is 0-d: a dataset needs rows")
        return DenseDataset(self._fs.real_path(entry.path))

    # ---- writes

    def save(self, arrays: Mapping[str, npt.ArrayLike], codec: str = "raw") -> None:
        """Creates or overwrites each named array (one record per row along
        axis 0). The call is one commit, durable when it returns: a crash or
        power cut leaves every named array old or every one new, never a mix.
        All names and arrays are checked before anything is written."""
        codec = _codec_name(codec)
        items = {name: _array_to_save(name, value) for name, value in _named(arrays, "save")}
        with self._lock:
            self._begin_write()
            self._commit(items, [], codec)

    def replace(self, arrays: Mapping[str, npt.ArrayLike], idx: Any) -> None:  # idx: as for DenseDataset[idx]
        """Gives rows ``idx`` (int, slice, list, int array or boolean mask) of
        each named array new contents, in place and atomically. ``arrays`` maps
        names to rows of shape ``(len(idx), *row_shape)``; a repeated index
        takes its last row."""
        items = _named(arrays, "replace")
        with self._lock:
            self._begin_write()
            plans = []
            for name, rows in items:
                entry = self._row_entry(name, "replace")
                indices = _row_indices(idx, len(entry.dataset), name)
                data = entry.rows(rows, indices.size, "replace")
                plans.append((entry, *_last_wins(indices, data, idx)))
            for entry, indices, data in plans:
                if indices.size:
                    entry.store.replace(indices, data, entry.offsets(indices.size))
                    entry.edited = True

    def append(self, arrays: Mapping[str, npt.ArrayLike]) -> None:
        """Appends rows to each named (existing) array."""
        items = _named(arrays, "append")
        with self._lock:
            self._begin_write()
            plans = []
            for name, rows in items:
                entry = self._row_entry(name, "append")
                plans.append((entry, entry.rows(rows, None, "append")))
            for entry, data in plans:
                if len(data):
                    entry.store.append(data, entry.offsets(len(data)))
                    entry.edited = True

    def drop(self, name: str | list[str] | tuple[str, ...], rows: Any = None) -> None:  # rows: as for DenseDataset[rows]
        """Drops arrays (a name or a list of names; one commit, durable when
        it returns), or with ``rows`` drops those rows of each named array,
        keeping the order of the rest."""
        names = list(dict.fromkeys([name] if isinstance(name, str) else _name_list(name)))
        with self._lock:
            self._begin_write()
            if rows is None:
                for member in names:
                    self._require(member)  # KeyError before any change
                self._commit({}, names, None)
                return
            plans = []
            for entry in [self._entry(member) for member in names]:
                if entry.scalar:
                    raise ValueError(f"array '{entry.name}' is 0-d: it has no rows to drop; drop the array with drop('{entry.name}')")
                plans.append((entry, _row_indices(rows, len(entry.dataset), entry.name)))
            for entry, indices in plans:
                if indices.size:
                    entry.store.delete(indices, keep_order=True)
                    entry.edited = True

    def compact(self) -> None:
        """Reclaims the space of replaced and dropped rows in every array."""
        with self._lock:
            self._begin_write()
            for name in self.get_member_list():
                self._entry(name).store.compact()

    def reset(self) -> None:
        """Drops every array."""
        with self._lock:
            self._begin_write()
            self._commit({}, self.get_member_list(), None)

    # ---- internals

    def _check_open(self) -> None:
        """Refuses a closed store; finishes a commit a fault interrupted
        (so reads after the fault clears see the committed state)."""
        if self._closed:
            raise StoreClosedError(f"ArrayStore '{self.path}' is closed; open it again with ArrayStore(path)")
        if self._unfinished:
            with self._lock:
                self._finish_cleanup()
                if self._unfinished and self._lock_fd is not None:
                    _recover(self.path, self._fs)
                    self._unfinished = False

    def _entry(self, name: str) -> "_Array":
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
            if entry is not None and self._lock_fd is not None:
                return entry
            path = os.path.join(self.path, name)
            inode = self._fs.identity(path)
            if entry is not None:
                if inode == entry.inode:
                    entry.store.refresh()
                    return entry
                self._forget(name)
            if inode is None:
                self._require(name)
            assert inode is not None  # _require raised otherwise
            try:
                entry = _Array.open(name, path, inode, self._fs, self.durable)
            except FileNotFoundError:  # gone since (KeyError), or its schema is: damage
                self._require(name)
                raise CorruptStoreError(
                    f"array '{name}' of ArrayStore '{self.path}' is damaged: its directory has no readable "
                    f"{SCHEMA_FILE}; restore the array from a copy, or drop('{name}') it", 4,
                ) from None
            self._arrays[name] = entry
            return entry

    def _require(self, name: str) -> None:
        """KeyError unless ``name`` is an array (without opening it)."""
        if not self.has_array(name):
            _check_name(name)
            raise KeyError(f"no array named {name!r} in ArrayStore '{self.path}' (it has {self.get_member_list()})")

    def _row_entry(self, name: str, what: str) -> "_Array":
        entry = self._entry(name)
        if entry.scalar:
            raise ValueError(f"cannot {what} rows of '{name}': it is a 0-d array; save a new value with save()")
        return entry

    def _forget(self, name: str) -> None:
        entry = self._arrays.pop(name, None)
        if entry is not None:
            entry.close()

    def _begin_write(self) -> None:
        """Takes the directory's write lock on first use, then finishes what a
        crashed writer left and revalidates handles opened as a reader."""
        self._finish_cleanup()
        self._check_open()
        if self._lock_fd is not None:
            return
        handle = _take_lock(self.path, self._fs)
        try:
            _recover(self.path, self._fs)
            for name in list(self._arrays):
                try:
                    self._entry(name)  # as a reader still: reopens or refreshes stale handles
                except KeyError:
                    pass  # dropped by another writer: _entry forgot it
        except BaseException:
            self._fs.unlock(handle)
            raise
        self._lock_fd = handle

    def _commit(self, saves: dict[str, npt.NDArray[Any]], drops: list[str], codec: str | None) -> None:
        """Saves ``saves`` and drops ``drops`` as one commit (the protocol of
        the module docstring). Raises ArrayStoreIOError on a file-system error,
        with what the call left."""
        if not saves and not drops:
            return
        what = _call_text(saves, drops)
        fs = self._fs
        try:
            self._flush_deferred(list(saves), drops)
            self._before_drop(drops)
        except OSError as exc:
            raise ArrayStoreIOError(exc.errno, f"{what} failed, nothing changed: {exc}", "unchanged") from exc
        identities = self._stage(saves, codec, what)
        for name in [*saves, *drops]:
            self._forget(name)
        if len(saves) + len(drops) == 1 and self._commit_one(next(iter([*saves, *drops])), bool(saves), what):
            return
        record = {"format": COMMIT_FORMAT, "version": COMMIT_VERSION, "save": identities, "drop": list(drops)}
        try:
            _write_commit_record(self.path, fs, record, what, staged=list(saves))
        except ArrayStoreIOError as exc:
            self._unfinished = exc.outcome == "unknown"  # the next call replays or discards the record
            raise
        self._record_unlinked = True
        try:
            _roll_forward(self.path, fs, record)
            self._root_synced = True  # its fsync made every earlier rename of the root durable too
            self._remove_deferred()
        except OSError as exc:
            try:
                _recover(self.path, fs)  # one more try from what the directory holds
            except OSError:
                self._unfinished = True
                raise ArrayStoreIOError(exc.errno, f"{what} is committed and durable, but finishing it failed: {exc}; the next call on this ArrayStore (or the next writer) finishes it", "committed") from exc
        self._remove_leftovers([".new-" + name for name in saves] + [".prev-" + name for name in saves] + [".drop-" + name for name in drops])

    def _stage(self, saves: dict[str, npt.NDArray[Any]], codec: str | None, what: str) -> dict[str, Any]:
        """Writes each array whole into ``.new-<name>``, its contents durable
        (see ``_write_array``; the commit syncs the entries in the root);
        returns each name's new directory identity. On failure the staging
        directories are removed and nothing has changed."""
        fs = self._fs
        identities = {}
        try:
            for name, array in saves.items():
                assert codec is not None  # only a drop, which saves nothing, commits without one
                staging = os.path.join(self.path, STAGING_PREFIX + name)
                fs.rmtree(staging)
                identities[name] = secrets.token_hex(16)
                fs.build_store(staging, functools.partial(_write_array, array=array, codec=codec, generation=identities[name]))
        except BaseException as exc:
            for name in saves:
                with contextlib.suppress(OSError):
                    fs.rmtree(os.path.join(self.path, ".new-" + name))
            if isinstance(exc, OSError) and not isinstance(exc, ArrayStoreIOError):
                raise ArrayStoreIOError(exc.errno, f"{what} failed, nothing changed: {exc}", "unchanged") from exc
            raise
        return identities

    def _commit_one(self, name: str, saving: bool, what: str) -> bool:
        """Commits a call that saves or drops one array with one rename (or
        exchange) of the root and one fsync of it (none with ``durable=False``
        until ``sync()``): a single rename needs no commit record. False when
        it cannot (an overwrite without RENAME_EXCHANGE): nothing changed."""
        fs, root = self._fs, self.path
        target = os.path.join(root, name)
        leftover = (".new-" if saving else ".drop-") + name
        other = os.path.join(root, leftover)
        undo: Callable[[], object]
        try:
            if self._record_unlinked:
                fs.fsync_dir(root)
                self._record_unlinked = False
            if not saving:
                fs.rmtree(other)
                fs.rename(target, other)
                undo = functools.partial(fs.rename, other, target)
            elif not fs.exists(target):
                fs.rename(other, target)
                undo = functools.partial(fs.rename, target, other)
                leftover = ""  # a new name: nothing was replaced
            elif fs.exchange(other, target):
                undo = functools.partial(fs.exchange, other, target)
            else:
                return False
        except OSError as exc:
            if saving:
                with contextlib.suppress(OSError):
                    fs.rmtree(other)
            raise ArrayStoreIOError(exc.errno, f"{what} failed, nothing changed: {exc}", "unchanged") from exc
        self._sync_rename(undo, what)
        self._remove_leftovers([leftover] if leftover else [])
        return True

    def _sync_rename(self, undo: Callable[[], object], what: str) -> None:
        """Makes the commit's rename durable; when that fails, takes it back
        durably (a retried fsync proves nothing about the failed one) or says
        that the outcome is unknown."""
        if not self.durable:
            self._root_synced = False
            return
        try:
            self._fs.fsync_dir(self.path)
        except OSError as cause:
            self._unfinished = True  # the staged directory is garbage now, whatever happens next
            _take_back(self.path, self._fs, undo, what, cause)
            raise ArrayStoreIOError(cause.errno, f"{what} failed, nothing changed: {cause}", "unchanged") from cause

    def _remove_leftovers(self, leftovers: list[str]) -> None:
        """Deletes the old directories of a finished commit, on a thread where
        the seam allows it (freeing a big array's blocks is most of a drop's
        time); every later write, ``sync()`` and ``close()`` waits for it
        first, so nothing races it for those names. On a failure the next
        call (or the next writer) deletes them."""
        paths = [os.path.join(self.path, leftover) for leftover in leftovers]
        if not paths:
            return
        if not self._root_synced:
            self._deferred.extend(paths)  # durable=False: the rename that made them garbage is not durable yet
            return
        if not self._fs.removes_in_background:
            self._remove(paths)
            return
        for path in paths:
            # At once, so that a stale handle's refresh() says the store was
            # replaced (StoreReplacedError) now, not when the thread gets there.
            with contextlib.suppress(OSError):
                self._fs.unlink(os.path.join(path, "superblock"))
        self._cleanup = threading.Thread(target=self._remove, args=(paths,), name="loaderx-arraystore-cleanup", daemon=True)
        self._cleanup.start()

    def _remove(self, paths: list[str]) -> None:
        for path in paths:
            try:
                self._fs.rmtree(path)
            except OSError:
                self._unfinished = True  # read under the lock after the join

    def _finish_cleanup(self) -> None:
        """Waits for the deletion of the last commit's leftovers."""
        if self._cleanup is not None:
            self._cleanup.join()
            self._cleanup = None


class LazyArray:
    """An array of an ArrayStore that reads only the rows asked for.

    ``shape``, ``dtype``, ``ndim``, ``len``; ``lazy[i]`` is one row,
    ``lazy[slice | list | int array | bool mask]`` (with optional trailing
    indices) an array read with one gather; ``np.asarray(lazy)`` loads all.
    It shows the array's current rows, edits included, and stops working
    (ValueError) once the array is overwritten or dropped or its ArrayStore
    closed.
    """

    def __init__(self, entry: "_Array"):
        self._entry = entry

    def _live(self) -> "_Array":
        if self._entry.closed:
            raise ValueError(f"this lazy array of '{self._entry.name}' is gone: the array was overwritten or dropped, or its ArrayStore closed; load it again")
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
        return entry.dataset[key]

    def __array__(self, dtype: npt.DTypeLike | None = None, copy: bool | None = None) -> npt.NDArray[Any]:
        array = self._live().read_all()
        return array if dtype is None else array.astype(dtype, copy=False)

    def __iter__(self) -> Iterator[Any]:
        entry = self._live()
        if entry.scalar:
            raise TypeError("iteration over a 0-d array")
        for chunk in _stream(entry, max(1, STREAM_BYTES // max(entry.row_bytes, 1))):
            yield from chunk

    def __repr__(self) -> str:
        if self._entry.closed:
            return f"LazyArray({self._entry.name!r}, gone)"
        return f"LazyArray({self._entry.name!r}, shape={self.shape}, dtype={self.dtype})"


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


class _Array:
    """One open array: its dataset (reads) and the dataset's store (writes)."""

    def __init__(self, name: str, path: str, inode: int, dataset: DenseDataset, scalar: bool):
        self.name = name
        self.path = path
        self.inode = inode
        self.dataset = dataset
        self.store = cast(Zrecord, dataset.store)  # an ArrayStore array is one store, never sharded
        self.scalar = scalar
        self.row_bytes = dataset.dtype.itemsize * math.prod(dataset.item_shape)
        self.edited = False  # a row edit since the last sync()

    @classmethod
    def open(cls, name: str, path: str, inode: int, fs: OsFs, durable: bool) -> "_Array":
        # Row edits go through the dataset's store handle, so with
        # durable=False that one handle defers its fsyncs.
        dataset = DenseDataset(fs.real_path(path), _durable=durable)
        try:
            scalar = _read_scalar_marker(path, dataset, fs)
        except BaseException:
            dataset.close()
            raise
        return cls(name, path, inode, dataset, scalar)

    @property
    def closed(self) -> bool:
        return self.dataset.closed

    def close(self) -> None:
        self.dataset.close()

    @property
    def shape(self) -> tuple[int, ...]:
        return () if self.scalar else (len(self.dataset), *self.dataset.item_shape)

    def read_all(self) -> np.ndarray:
        """The whole array: one gather into a fresh array of its shape."""
        out = self.read_rows(0, len(self.dataset))
        return out.reshape(()) if self.scalar else out

    def read_rows(self, start: int, end: int) -> np.ndarray:
        """Rows ``start..end`` with one gather (equal-length records need no
        offsets: row k lands at k times the row size)."""
        out = np.empty((end - start, *self.dataset.item_shape), dtype=self.dataset.dtype)
        if end > start and self.row_bytes:
            self.store.gather(np.arange(start, end, dtype=np.uint64), out)
        return out

    def offsets(self, count: int) -> np.ndarray:
        """Byte offsets of ``count`` packed rows (shared by every array with
        this row size: a fresh handle's first edit of a batch size seen
        before builds nothing)."""
        if count > _OFFSETS_CACHED_MAX:
            return np.arange(count, dtype=np.uint64) * np.uint64(self.row_bytes)
        return _row_offsets(count, self.row_bytes)

    def rows(self, rows: npt.ArrayLike, count: int | None, what: str) -> np.ndarray:
        """``rows`` as a C-contiguous ``(n, *item_shape)`` array of this
        array's dtype (``n == count`` when given); ValueError otherwise."""
        item_shape = self.dataset.item_shape
        array = np.asarray(rows)
        if array.shape == item_shape and count in (None, 1):
            array = array.reshape(1, *item_shape)  # one row given without its row axis
        if array.ndim != len(item_shape) + 1 or array.shape[1:] != item_shape or (count is not None and len(array) != count):
            expected = _shape_text("n" if count is None else str(count), item_shape)
            raise ValueError(f"cannot {what} rows of '{self.name}': got shape {array.shape}, expected {expected} (rows of shape {item_shape})")
        from_python = not isinstance(rows, (np.ndarray, np.generic))
        return np.ascontiguousarray(_cast(array, self.dataset.dtype, f"cannot {what} rows of '{self.name}'", from_python))


# ---- helpers ------------------------------------------------------------------


_OFFSETS_CACHED_MAX = 1 << 20  # rows: a cached offsets array holds at most 8 MiB, four of them 32 MiB


@functools.lru_cache(maxsize=4)
def _row_offsets(count: int, row_bytes: int) -> npt.NDArray[np.uint64]:
    """Read-only byte offsets of ``count`` rows of ``row_bytes`` packed back to back."""
    offsets = np.arange(count, dtype=np.uint64) * np.uint64(row_bytes)
    offsets.flags.writeable = False
    return offsets


def _shape_text(first: str, item_shape: tuple[int, ...]) -> str:
    parts = [first, *map(str, item_shape)]
    return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


def _stream(entry: _Array, rows: int) -> Iterator[npt.NDArray[Any]]:
    start = 0
    while True:
        end = min(start + rows, len(entry.dataset))
        if end <= start:
            return
        yield entry.read_rows(start, end)
        start = end


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


def _is_member(fs: OsFs, path: str) -> bool:
    """Whether the root's entry ``path`` is an array: its schema, or a store
    that lost its schema (a damaged array). A directory with neither is
    someone else's."""
    return fs.isfile(os.path.join(path, SCHEMA_FILE)) or fs.isfile(os.path.join(path, "superblock"))


def _valid_name(name: object) -> bool:
    return (
        isinstance(name, str)
        and name != ""
        and not name.startswith(".")
        and "/" not in name
        and "\\" not in name
        and "\0" not in name
        and len(name.encode("utf-8", "surrogatepass")) <= NAME_BYTES_MAX
    )


def _check_name(name: object) -> None:
    if not _valid_name(name):
        raise ValueError(
            f"invalid array name {name!r}: a name is a non-empty str of at most {NAME_BYTES_MAX} bytes, "
            "without '/', '\\' or NUL, not starting with '.'"
        )


def _codec_name(codec: str) -> str:
    if codec not in CODECS:
        raise ValueError(f"unknown codec {codec!r}: use one of {sorted(CODECS)}")
    return codec


def _array_to_save(name: str, value: npt.ArrayLike) -> np.ndarray:
    if isinstance(value, (str, bytes)):
        # A path or a mistyped value, not an array: np.asarray would make it a
        # 0-d string array and replace the array that had the name.
        raise TypeError(
            f"cannot save '{name}': got {type(value).__name__} {value[:40]!r}, not an array; save takes "
            f"{{name: array}} (a 0-d string array, if that is meant, is np.array({value[:40]!r}))"
        )
    array = value if isinstance(value, np.ndarray) else np.asarray(value)
    if array.dtype.hasobject:
        raise ValueError(f"cannot save '{name}': dtype {array.dtype} holds Python objects; convert it to a numeric, string or bytes dtype")
    return array


def _cast(array: np.ndarray, dtype: np.dtype, context: str, from_python: bool = False) -> np.ndarray:
    """``array`` as ``dtype``: equal, or a ``same_kind`` cast of numbers whose
    integer values fit; ValueError otherwise. Python ints (``from_python``)
    go into any integer dtype they fit: NumPy types them int64, which is not
    ``same_kind`` with unsigned dtypes."""
    source = array.dtype
    if source == dtype:
        return array
    numeric = source.kind in "biuf" and dtype.kind in "biuf"
    allowed = np.can_cast(source, dtype, "same_kind") if numeric else np.can_cast(source, dtype, "safe")
    allowed = allowed or (from_python and source.kind in "iu" and dtype.kind in "iu")
    if not allowed:
        raise ValueError(f"{context}: dtype {source} does not cast to the array's {dtype} (same_kind casting): convert it first")
    if dtype.kind in "iu" and source.kind in "iu" and not np.can_cast(source, dtype, "safe") and array.size:
        limits = np.iinfo(dtype)
        low, high = int(array.min()), int(array.max())
        if low < limits.min or high > limits.max:
            bad = low if low < limits.min else high
            raise ValueError(f"{context}: value {bad} does not fit in the array's {dtype}")
    return array.astype(dtype)


def _row_indices(key: Any, length: int, name: str) -> npt.NDArray[np.uint64]:
    """Row selector (int, slice, list, int array, bool mask; negative counts
    from the end) as flat uint64 indices; IndexError when out of range."""
    try:
        if _is_int(key):
            return np.array([_int_index(key, length)], dtype=np.uint64)
        indices, shape = _record_indices(key, length)
    except IndexError as exc:
        raise IndexError(f"array '{name}': {exc}") from None
    if len(shape) != 1:
        raise ValueError(f"array '{name}': give row indices as a flat list, got an index array of shape {shape}")
    return indices


def _last_wins(indices: npt.NDArray[np.uint64], data: npt.NDArray[Any], key: Any) -> tuple[npt.NDArray[np.uint64], npt.NDArray[Any]]:
    """Drops repeated indices but the last (NumPy's assignment order), since
    the store takes each record once per replace."""
    if isinstance(key, slice) or indices.size < 2 or np.all(indices[1:] > indices[:-1]):
        return indices, data
    reversed_unique, first_in_reversed = np.unique(indices[::-1], return_index=True)
    if reversed_unique.size == indices.size:
        return indices, data
    keep = indices.size - 1 - first_in_reversed
    return reversed_unique, np.ascontiguousarray(data[keep])


def _read_scalar_marker(path: str, dataset: DenseDataset, fs: OsFs) -> bool:
    if dataset.item_shape != () or len(dataset) != 1:
        return False  # only a one-row array of scalars can be a 0-d array: no open to find out
    file = os.path.join(path, ARRAY_FILE)
    try:
        payload = fs.read_file(file, _MARKER_BYTES_MAX + 1)
    except FileNotFoundError:
        return False
    try:
        data = msgpack.unpackb(payload, raw=False)
    except Exception as exc:
        raise ValueError(f"{file} is damaged: {exc}") from exc
    if not isinstance(data, dict) or data.get("shape") != [] or dataset.item_shape != () or len(dataset) != 1:
        raise ValueError(f"{file} says a 0-d array, but the store holds {len(dataset)} rows of shape {dataset.item_shape}: the array is damaged")
    return True


def _write_array(path: str, array: np.ndarray, codec: str, generation: str | None = None) -> None:
    """Writes ``array`` as a complete dense store at the new ``path``: data
    and schema durable when it returns (its entry in the root is synced by
    the commit); a 0-d array as one row and a marker. ``generation`` goes
    into its schema file: what a commit record names the directory by."""
    if array.ndim == 0:
        build_dense_store(path, array.reshape(1), codec, {ARRAY_FILE: msgpack.packb({"shape": []})}, generation)
    else:
        build_dense_store(path, array, codec, generation=generation)


def _generation(fs: OsFs, path: str) -> str | None:
    """The generation id in the schema file of the array directory ``path``
    (None when it has none, or no schema file)."""
    try:
        payload = fs.read_file(os.path.join(path, SCHEMA_FILE), _MARKER_BYTES_MAX + 1)
    except FileNotFoundError:
        return None  # any other error of the disk is the caller's to report
    try:
        data = msgpack.unpackb(payload, raw=False)
    except Exception:  # msgpack raises several types; a damaged schema names no generation, opening the array reports it
        return None
    generation = data.get("generation") if isinstance(data, dict) else None
    return generation if isinstance(generation, str) else None


def _is_directory(fs: OsFs, path: str, identity: str | int) -> bool:
    """True when the directory at ``path`` is the one a commit record names:
    by generation id (survives a copy), or by inode number (records of
    loaderx before generation ids)."""
    if isinstance(identity, str):
        return _generation(fs, path) == identity
    return fs.identity(path) == identity


def _call_text(saves: dict[str, npt.NDArray[Any]], drops: list[str]) -> str:
    if saves:
        return f"save of {sorted(saves)}"
    return f"drop of {sorted(drops)}"


def _open_root(path: str, fs: OsFs) -> None:
    """Creates the ArrayStore directory (durably: its parent is fsynced) or
    checks that ``path`` is one."""
    marker = os.path.join(path, MARKER_FILE)
    if fs.exists(path) and not fs.isdir(path):
        raise ValueError(f"'{path}' is a file, not an ArrayStore directory")
    created = make_dirs_durable(path, fs)
    try:
        payload = fs.read_file(marker, _MARKER_BYTES_MAX + 1)
    except FileNotFoundError:
        if any(not item.startswith(MARKER_FILE + ".tmp") for item in fs.listdir(path)):
            raise ValueError(f"'{path}' is a non-empty directory that is not an ArrayStore (it has no {MARKER_FILE}): give a new or empty directory") from None
        try:
            write_file_atomic(marker, msgpack.packb({"format": FORMAT_NAME, "version": FORMAT_VERSION}), fs)
        except OSError:
            if created is not None:  # a failed open (a full disk) leaves nothing it made
                with contextlib.suppress(OSError):
                    fs.rmtree(created)
            raise
        return
    try:
        data = msgpack.unpackb(payload, raw=False)
    except Exception as exc:
        raise ValueError(f"{marker} is damaged or not an ArrayStore marker: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT_NAME:
        raise ValueError(f"'{path}' is not an ArrayStore ({marker} names format {data.get('format') if isinstance(data, dict) else data!r})")
    version = data.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ValueError(f"{marker} has an invalid version {version!r}")
    if version > FORMAT_VERSION:
        raise ValueError(f"ArrayStore '{path}' has version {version}, newer than this loaderx understands ({FORMAT_VERSION}): upgrade loaderx")


def _take_lock(root: str, fs: OsFs) -> int:
    """The root's write lock, or StoreLockedError / StoreReadOnlyError."""
    try:
        return fs.lock(os.path.join(root, LOCK_FILE))
    except (PermissionError, StoreReadOnlyError) as exc:
        error = StoreReadOnlyError(f"cannot write ArrayStore '{root}': the directory is read-only (open it for reading only, or fix its permissions)", errno=exc.errno)
        error.outcome = "unchanged"  # type: ignore[attr-defined]
        raise error from None
    except BlockingIOError:
        raise StoreLockedError(f"ArrayStore '{root}' is open for writing by another ArrayStore (in this or another process); one writer at a time: close the other first") from None


def _replay_if_unlocked(root: str, fs: OsFs) -> None:
    """Finishes a commit a crashed writer left, so that readers see whole
    calls, when no live writer holds the lock (a live one finishes its own)."""
    if not fs.exists(os.path.join(root, COMMIT_FILE)):
        return
    try:
        handle = _take_lock(root, fs)
    except (StoreLockedError, StoreReadOnlyError):
        return
    try:
        _recover(root, fs)
    finally:
        fs.unlock(handle)


def _write_commit_record(root: str, fs: OsFs, record: dict[str, Any], what: str, staged: list[str]) -> None:
    """Makes ``record`` durable at ``COMMIT_FILE``: the commit point. On a
    failure the record is taken back (a failed fsync may have persisted it or
    not) and the staged directories removed, so nothing has changed."""
    payload = msgpack.packb(record)
    path = os.path.join(root, COMMIT_FILE)
    try:
        if staged:
            fs.fsync_dir(root)  # the staged directories' entries, durable before the record that names them
        write_file_atomic(path, payload + zlib.crc32(payload).to_bytes(4, "little"), fs)
    except OSError as exc:
        if fs.exists(path):
            _take_back(root, fs, lambda: fs.unlink(path), what, exc)  # renamed in place, the directory fsync failed
        for name in staged:
            with contextlib.suppress(OSError):
                fs.rmtree(os.path.join(root, ".new-" + name))
        raise ArrayStoreIOError(exc.errno, f"{what} failed, nothing changed: {exc}", "unchanged") from exc


def _take_back(root: str, fs: OsFs, undo: Callable[[], object], what: str, cause: OSError) -> None:
    """After the fsync that commits a call failed: undoes the commit durably
    (a retried fsync proves nothing about the failed one), or says that the
    outcome is unknown until the next writer replays or discards it."""
    try:
        undo()
        fs.fsync_dir(root)
    except OSError as exc:
        raise ArrayStoreIOError(
            cause.errno,
            f"{what} may or may not have taken effect: making it durable failed ({cause}) and taking it back failed ({exc}); "
            "reopen the ArrayStore once the disk works: the call is then applied entirely or not at all",
            "unknown",
        ) from cause


def _read_commit_record(root: str, fs: OsFs) -> dict[str, Any] | None:
    """The commit record in ``root``, None when there is none."""
    path = os.path.join(root, COMMIT_FILE)
    try:
        payload = fs.read_file(path, _MARKER_BYTES_MAX + 1)
    except FileNotFoundError:
        return None
    body, checksum = payload[:-4], payload[-4:]
    if len(payload) < 4 or zlib.crc32(body).to_bytes(4, "little") != checksum:
        raise CorruptStoreError(f"{path} is damaged (its checksum does not match); loaderx makes it durable before renaming it into place, so something else changed it: restore the ArrayStore from a backup")
    try:
        record = msgpack.unpackb(body, raw=False)
    except Exception as exc:
        raise CorruptStoreError(f"{path} passes its checksum but does not decode ({exc}): it was not written by this loaderx") from exc
    if not isinstance(record, dict) or record.get("format") != COMMIT_FORMAT or record.get("version") not in (1, COMMIT_VERSION):
        found = (record.get("format"), record.get("version")) if isinstance(record, dict) else (None, None)
        raise CorruptStoreError(f"{path} is not a commit record of this loaderx (format {found[0]!r}, version {found[1]!r}): upgrade loaderx")
    saves, drops = record.get("save"), record.get("drop")
    identity_type = int if record["version"] == 1 else str
    if (
        not isinstance(saves, dict)
        or not isinstance(drops, list)
        or not all(_valid_name(name) and type(identity) is identity_type for name, identity in saves.items())
        or not all(_valid_name(name) for name in drops)
    ):
        raise CorruptStoreError(f"{path} passes its checksum but its names or directory ids are invalid: it was not written by this loaderx")
    return record


def _roll_forward(root: str, fs: OsFs, record: dict[str, Any]) -> None:
    """Applies a durable commit record; each step is skipped when done, so a
    replay after a crash at any point ends in the same state. Deletes the
    record once the steps are durable; the old directories stay (leftovers)."""
    for name, identity in record["save"].items():
        _swap_in(root, fs, name, identity)
    for name in record["drop"]:
        target = os.path.join(root, name)
        if fs.exists(target):
            trash = os.path.join(root, ".drop-" + name)
            fs.rmtree(trash)
            fs.rename(target, trash)
    fs.fsync_dir(root)  # every step durable before the record goes
    # No fsync after this unlink: a record that survives a crash is replayed
    # and finds every step done, and the next commit's fsyncs persist it.
    fs.unlink(os.path.join(root, COMMIT_FILE))


def _swap_in(root: str, fs: OsFs, name: str, identity: str | int) -> None:
    """Puts the new directory of ``name`` (``identity``: see ``_is_directory``)
    in place with the one swap of ``_fs``, keeping the old one as
    ``.new-<name>`` or ``.prev-<name>``."""
    target = os.path.join(root, name)
    staging = os.path.join(root, STAGING_PREFIX + name)
    if _is_directory(fs, target, identity):
        return
    if not _is_directory(fs, staging, identity):
        raise CorruptStoreError(
            f"the commit record of ArrayStore '{root}' names the new directory of '{name}' ({identity!r}), but neither "
            f"'{name}' nor '.new-{name}' is it: something other than loaderx changed the directory during a commit; restore it from a backup"
        )
    swap_in(staging, target, fs)


def _recover(root: str, fs: OsFs) -> None:
    """Finishes what a crashed or failed writer left (see the module docstring)."""
    names = fs.listdir(root)  # one listing finds the record and the leftovers
    record = _read_commit_record(root, fs) if COMMIT_FILE in names else None
    if record is not None:
        _roll_forward(root, fs, record)  # fsyncs the root before it returns
        names = fs.listdir(root)
    temporaries = (MARKER_FILE + ".tmp", COMMIT_FILE + ".tmp")
    leftovers = [name for name in names if name.startswith(_STAGING + temporaries)]
    if not leftovers:
        return
    if record is None:
        # A swap of the writer that left these may not be durable yet
        # (durable=False, or a kill before its fsync): durable before any
        # deletion, which could otherwise leave a power cut nothing.
        fs.fsync_dir(root)
    swapped = set()
    for leftover in leftovers:
        path = os.path.join(root, leftover)
        if leftover.startswith((STAGING_PREFIX, ASIDE_PREFIX)):
            name = leftover[leftover.index("-") + 1 :]
            if name not in swapped:
                swapped.add(name)
                clean_leftovers(os.path.join(root, name), fs, sync_first=False)  # the one rule of _fs
        elif leftover.startswith(".old-") and not fs.exists(os.path.join(root, leftover[len(".old-"):])):
            fs.rename(path, os.path.join(root, leftover[len(".old-"):]))  # an older loaderx's swap cut short
        else:
            fs.rmtree(path)
    fs.fsync_dir(root)


def _tree_bytes(fs: OsFs, path: str) -> int:
    return sum(fs.stat(os.path.join(path, item)).st_size for item in fs.listdir(path) if fs.isfile(os.path.join(path, item)))
