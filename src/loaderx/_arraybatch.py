"""ArrayStore's batch modes: the edits of one ``with`` block, held in memory
until one commit at its end.

Invariant: nothing of a batch reaches the disk before its block ends; at the
end, the batch is one commit (``Plan``): all of it visible after, none of it
before, through a crash or power cut. ``Plan`` picks the commit:

- one array edited only in place (rows replaced, shape kept, nothing else
  changed): one ``replace`` of the changed rows on that array's store, the
  store's own atomic commit, O(rows changed);
- anything else (several arrays, a save, an append, a drop): one commit of
  `_arraycommit` that rewrites each changed array whole and drops the
  dropped ones, O(bytes of the changed arrays).

``MemoryBatch`` (``batch_mode``) holds each array it touched as a NumPy array.
``MappedBatch`` (``writable_batch_mode``) hands out arrays over a private
(copy-on-write) mapping of a file that holds the array as it was at its
first load: the store's own data file where it holds the rows as they are
(a fixed store with no dropped row: no copy at all; the batch holds the
write lock, so the file stays as it was until the commit), else an
anonymous in-memory file (``memfd``) the rows are copied into. The kernel
copies a page on its first write, so the pages that changed are the ones
no longer backed by the file,
which ``/proc/self/pagemap`` says (bit 61 clear on a present page, or the page
swapped out) without reading the data. Only the rows of those pages are
compared with the file's copy (natively, 32 bytes a compare: zig/changes.zig),
so finding the changes costs O(pages of the array / 512) pagemap bytes plus
O(pages written). Where the pagemap says
nothing (no procfs, another kernel), a probe at the first use finds that out
and the batch compares every row instead (exact, O(array)).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import numpy.typing as npt

from ._arrayview import OpenArray
from .zrecord import changed_rows

PAGE_BYTES = mmap.PAGESIZE
_PAGEMAP = "/proc/self/pagemap"
_PRESENT = np.uint64(1 << 63)
_SWAPPED = np.uint64(1 << 62)
_FILE_PAGE = np.uint64(1 << 61)
COMPARE_ROWS_BYTES = 16 << 20  # the full compare goes in chunks of this many bytes of rows


class ArrayStoreBatchError(RuntimeError):
    """A call that a batch mode does not allow: a second batch inside one
    (or in another thread), a call the batch cannot answer from memory, or
    an edit ``writable_batch_mode`` does not take."""


@dataclass
class Plan:
    """The one commit of a batch: ``rows`` (one array's changed row indices
    and their new rows, ``(n, *row_shape)``, for an in-place replace) or
    ``rewrite`` (arrays to write whole, with their codecs) plus ``drops``."""

    rows: dict[str, tuple[npt.NDArray[np.uint64], np.ndarray]] = field(default_factory=dict)
    rewrite: dict[str, tuple[np.ndarray, str]] = field(default_factory=dict)
    drops: list[str] = field(default_factory=list)
    # A rewritten array read from the disk: its open array, and which of its
    # rows the rewrite carries over unchanged (they must check out first).
    carried: dict[str, tuple[OpenArray, npt.NDArray[np.bool_]]] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not (self.rows or self.rewrite or self.drops)

    def settle(self, codecs: dict[str, str], whole: Callable[[str], np.ndarray]) -> None:
        """One array edited in place stays a replace; with anything else every
        array edited in place is rewritten too (``whole(name)``: the batch's
        whole array), so the batch is one commit."""
        if len(self.rows) == 1 and not self.rewrite and not self.drops:
            return
        for name in self.rows:
            self.rewrite[name] = (whole(name), codecs[name])
        self.rows = {}


class Carried:
    """Which rows of a batch's copy of an array still hold the bytes read
    from the disk: ``origin`` (the disk row of each row, -1 for a row the
    batch wrote), or while no append or row drop changed the rows, None
    and the ``written`` indices."""

    def __init__(self, entry: OpenArray) -> None:
        self.entry = entry
        self.rows = entry.length  # a 0-d array is one row
        self.origin: npt.NDArray[np.int64] | None = None
        self.written: list[npt.NDArray[np.uint64]] = []

    def wrote(self, indices: npt.NDArray[np.uint64]) -> None:
        if self.origin is None:
            self.written.append(indices)
        else:
            self.origin[indices.astype(np.intp)] = -1

    def reshaped(self, rows: int, deleted: npt.NDArray[np.uint64] | None) -> None:
        """The copy after rows were appended (now ``rows`` rows) or ``deleted``."""
        origin = self.origin
        if origin is None:
            origin = np.arange(self.rows, dtype=np.int64)
            for indices in self.written:
                origin[indices.astype(np.intp)] = -1
            self.written = []
        if deleted is not None:
            origin = np.delete(origin, deleted.astype(np.intp))
        else:
            origin = np.concatenate([origin, np.full(rows - origin.size, -1, dtype=np.int64)])
        self.origin = origin

    def mask(self) -> npt.NDArray[np.bool_]:
        """The disk rows the copy still holds unchanged."""
        if self.origin is None:
            kept = np.ones(self.rows, dtype=bool)
            for indices in self.written:
                kept[indices.astype(np.intp)] = False
            return kept
        kept = np.zeros(self.rows, dtype=bool)
        kept[self.origin[self.origin >= 0]] = True
        return kept


class Batch:
    """What both batch modes share: the owning thread, and the plan."""

    writable = False

    def __init__(self) -> None:
        self.thread = threading.get_ident()
        self.codecs: dict[str, str] = {}

    def owned(self) -> bool:
        return self.thread == threading.get_ident()

    def plan(self) -> Plan:
        """The batch's one commit."""
        raise NotImplementedError

    def replace_row(self, arrays: dict[str, Any], row: int) -> bool:
        """A replace of one row given at once, when the batch can keep it
        without the general checks; False otherwise (nothing done: the
        caller takes the general way, which says what is wrong)."""
        return False


class MemoryBatch(Batch):
    """``batch_mode``: each array the batch touched, whole in memory.

    ``arrays`` holds the batch's state of every touched name; ``edited``
    the row indices replaced in place (None once the array changed in any
    other way: it is then rewritten); ``dropped`` the names on disk that
    the batch dropped. ``pending`` holds the replaces of an array nothing
    else touched yet (its rows and their indices, O(rows)): it is read whole
    only when the batch reads it or changes it otherwise."""

    def __init__(self) -> None:
        super().__init__()
        self.arrays: dict[str, np.ndarray] = {}
        self.scalar: dict[str, bool] = {}
        self.edited: dict[str, list[npt.NDArray[np.uint64]] | None] = {}
        self.dropped: set[str] = set()
        self.pending: dict[str, Pending] = {}
        self.sources: dict[str, Carried] = {}  # the touched arrays as read from the disk

    def touch(self, entry: OpenArray) -> np.ndarray:
        """The batch's copy of the array ``entry`` (read whole on first touch,
        with its pending replaces applied)."""
        array = self.arrays.get(entry.name)
        if array is None:
            array = entry.read_all()
            self.arrays[entry.name] = array
            self.scalar[entry.name] = entry.scalar
            self.codecs[entry.name] = entry.dataset.codec
            self.edited[entry.name] = []
            self.sources[entry.name] = Carried(entry)
            pending = self.pending.pop(entry.name, None)
            if pending is not None:
                for indices, rows in pending.replaces():
                    self.replace(entry.name, indices, rows)
        return array

    def defer(
        self, entry: OpenArray, length: int, key: int | npt.NDArray[np.uint64], rows: np.ndarray
    ) -> None:
        """A replace of rows ``key`` (a row, or row indices) of ``entry``
        (``length`` rows), an array the batch holds no copy of."""
        pending = self.pending.get(entry.name)
        if pending is None:
            pending = self.pending[entry.name] = Pending(entry, length)
            self.codecs[entry.name] = entry.dataset.codec
        pending.add(key, rows)

    def replace_row(self, arrays: dict[str, Any], row: int) -> bool:
        # One array whose replaces are kept aside (its name was checked at
        # its first), a row in range, the batch's own thread: as `defer`.
        if not self.owned():
            return False
        ((name, rows),) = arrays.items()
        pending = self.pending.get(name)
        if pending is None or not 0 <= row < pending.length:
            return False
        pending.add(row, pending.entry.rows(rows, 1, "replace"))
        return True

    def save(self, name: str, array: np.ndarray, codec: str) -> None:
        self.arrays[name] = np.array(array, copy=True)  # the caller may change its array later
        self.scalar[name] = array.ndim == 0
        self.codecs[name] = codec
        self.edited[name] = None
        self.dropped.discard(name)  # a name dropped earlier in the batch: overwritten instead
        self.pending.pop(name, None)
        self.sources.pop(name, None)  # nothing of the disk's copy is carried

    def replace(self, name: str, indices: npt.NDArray[np.uint64], rows: np.ndarray) -> None:
        self.arrays[name][indices] = rows  # a repeated index: the last row wins, as in NumPy
        edited = self.edited[name]
        if edited is not None:
            edited.append(indices)
        source = self.sources.get(name)
        if source is not None:
            source.wrote(indices)

    def reshape(
        self, name: str, array: np.ndarray, deleted: npt.NDArray[np.uint64] | None = None
    ) -> None:
        """The array ``name`` after an append or a drop of the rows
        ``deleted``: rewritten at the end."""
        self.arrays[name] = array
        self.edited[name] = None
        source = self.sources.get(name)
        if source is not None:
            source.reshaped(len(array), deleted)

    def drop(self, name: str, on_disk: bool) -> None:
        tables = (self.arrays, self.scalar, self.edited, self.codecs, self.pending, self.sources)
        for table in tables:
            table.pop(name, None)
        if on_disk:
            self.dropped.add(name)

    def plan(self) -> Plan:
        plan = Plan(drops=sorted(self.dropped))
        for name, edited in self.edited.items():
            if edited is None:
                plan.rewrite[name] = (self.arrays[name], self.codecs[name])
            elif edited:
                indices = np.unique(np.concatenate(edited))
                plan.rows[name] = (indices, self.arrays[name][indices])
        for name, pending in self.pending.items():
            plan.rows[name] = pending.last_rows()
        plan.rows = {name: rows for name, rows in plan.rows.items() if rows[0].size}
        plan.settle(self.codecs, self.whole)
        for name in plan.rewrite:
            source = self.sources.get(name)
            if source is not None:
                plan.carried[name] = (source.entry, source.mask())
        return plan

    def whole(self, name: str) -> np.ndarray:
        """The batch's whole array ``name`` (read now if only pending)."""
        pending = self.pending.get(name)
        return self.arrays[name] if pending is None else self.touch(pending.entry)


class Pending:
    """The replaces of an array a batch holds no copy of, in order: each
    one's rows (a row index, or an index array) and their contents, copied
    (the caller may change its array before the batch ends)."""

    __slots__ = ("entry", "length", "keys", "rows")

    def __init__(self, entry: OpenArray, length: int):
        self.entry = entry
        self.length = length
        self.keys: list[int | npt.NDArray[np.uint64]] = []
        self.rows: list[np.ndarray] = []

    def add(self, key: int | npt.NDArray[np.uint64], rows: np.ndarray) -> None:
        self.keys.append(key)
        self.rows.append(rows.copy())

    def replaces(self) -> Iterator[tuple[npt.NDArray[np.uint64], np.ndarray]]:
        for key, rows in zip(self.keys, self.rows):
            yield _as_indices(key), rows

    def last_rows(self) -> tuple[npt.NDArray[np.uint64], np.ndarray]:
        """The rows the replaces in order leave: each index once, its last row."""
        if all(type(key) is int for key in self.keys):
            indices = np.array(self.keys, dtype=np.uint64)
        else:
            indices = np.concatenate([_as_indices(key) for key in self.keys])
        rows = np.concatenate(self.rows)
        unique, first_reversed = np.unique(indices[::-1], return_index=True)
        return unique, rows[indices.size - 1 - first_reversed]


def _as_indices(key: int | npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    return np.array([key], dtype=np.uint64) if isinstance(key, int) else key


class MappedBatch(Batch):
    """``writable_batch_mode``: each loaded array over a private mapping of
    its first-load copy (see the module docstring)."""

    writable = True

    def __init__(self) -> None:
        super().__init__()
        self.copies: dict[str, _MappedCopy] = {}
        self.scan = "pagemap" if pagemap_works() else "compare"

    def load(self, entry: OpenArray) -> np.ndarray:
        copy = self.copies.get(entry.name)
        if copy is None:
            copy = _MappedCopy(entry)
            self.copies[entry.name] = copy
            self.codecs[entry.name] = entry.dataset.codec
        return copy.array

    def plan(self) -> Plan:
        plan = Plan()
        for name, copy in self.copies.items():
            changed = copy.changed_rows(self.scan == "pagemap")
            if changed.size:
                array = copy.array.reshape(copy.rows, *copy.array.shape[1:])
                plan.rows[name] = (changed, array[changed])
        written = {name: changed for name, (changed, _) in plan.rows.items()}
        plan.settle(self.codecs, lambda name: self.copies[name].array)
        for name in plan.rewrite:  # every row was read from the disk
            copy = self.copies[name]
            kept = np.ones(copy.rows, dtype=bool)
            kept[written[name].astype(np.intp)] = False
            plan.carried[name] = (copy.entry, kept)
        return plan

    def close(self) -> None:
        """Makes the handed-out arrays read-only (later edits would be lost)
        and releases the copies' files."""
        for copy in self.copies.values():
            copy.close()
        self.copies.clear()


class _MappedCopy:
    """One array of a ``MappedBatch``: ``original`` (a shared mapping of the
    store's data file or of a memfd, the rows as at the first load) and
    ``array`` (a private mapping of the same file: what the caller edits)."""

    def __init__(self, entry: OpenArray) -> None:
        self.entry = entry
        self.rows = entry.length  # a 0-d array is one row
        self.row_bytes = entry.row_bytes
        self.fd, self.shared = -1, None
        self.store_file = False
        self.original: np.ndarray | None = None
        nbytes = self.rows * self.row_bytes
        if not nbytes:  # no byte to edit: a plain array
            self.array = np.zeros(entry.shape, dtype=entry.dataset.dtype)
            return
        try:
            self.fd = _open_rows_file(entry)
            self.store_file = self.fd >= 0
            if self.store_file:  # the store's own data file: no copy
                self.shared = mmap.mmap(self.fd, nbytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
                original = np.frombuffer(self.shared, dtype=np.uint8)
            else:
                self.fd = os.memfd_create(f"loaderx-batch-{entry.name[:40]}", os.MFD_CLOEXEC)
                os.ftruncate(self.fd, nbytes)
                self.shared = mmap.mmap(self.fd, nbytes, flags=mmap.MAP_SHARED)
                original = np.frombuffer(self.shared, dtype=np.uint8)
                entry.store.gather(entry.base_range(0, self.rows), original)
            private = mmap.mmap(
                self.fd, nbytes, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE
            )
        except BaseException:
            self.close()
            raise
        self.original = original.reshape(self.rows, self.row_bytes)
        self.array = np.frombuffer(private, dtype=entry.dataset.dtype).reshape(entry.shape)

    def changed_rows(self, use_pagemap: bool) -> npt.NDArray[np.uint64]:
        """The rows whose bytes differ from the first-load copy, exactly: the
        rows of the pages the pagemap says were written (or of every page)."""
        if self.original is None or self.shared is None:
            return np.zeros(0, dtype=np.uint64)
        rows = self.rows
        edited = self.array.reshape(rows, -1).view(np.uint8)
        if use_pagemap:
            flat = edited.reshape(-1)
            pages = written_pages(flat).astype(np.uint64)
            if self.store_file:  # through the store's mapping, which its replace reads next
                return self.entry.store.changed_rows(flat, pages, PAGE_BYTES)
            original = self.original.reshape(-1)
            return changed_rows(flat, original, self.row_bytes, pages, PAGE_BYTES)
        step = max(1, COMPARE_ROWS_BYTES // self.row_bytes)
        found = []
        for start in range(0, rows, step):
            end = min(rows, start + step)
            differ = np.any(edited[start:end] != self.original[start:end], axis=1)
            found.append(np.flatnonzero(differ) + start)
        return np.concatenate(found).astype(np.uint64)

    def close(self) -> None:
        array = getattr(self, "array", None)
        if array is not None:
            array.flags.writeable = False
        self.original = None
        if self.shared is not None:
            with contextlib.suppress(BufferError):  # a view still held: freed with it
                self.shared.close()
            self.shared = None
        if self.fd >= 0:
            os.close(self.fd)  # the mappings keep the file alive while arrays use them
            self.fd = -1


def _open_rows_file(entry: OpenArray) -> int:
    """A read-only descriptor of the store's data file when it holds the
    array's rows as they are (a fixed store: row i at ``i * row_bytes``, no
    row dropped), else -1 (the batch copies the rows into a memfd). The
    batch holds the write lock, so the file does not change before its
    commit; a commit never cuts a data file below a committed length, so
    the mapping of its rows stays valid while a view holds it."""
    if entry.scalar or entry.has_drops:
        return -1
    return entry.store.open_records(entry.length)


def written_pages(view: np.ndarray) -> npt.NDArray[np.int64]:
    """The pages of ``view`` (a C-contiguous array over a private mapping,
    from its start) that hold a private copy: written since mapped."""
    address = view.ctypes.data
    first = address // PAGE_BYTES
    last = (address + view.nbytes - 1) // PAGE_BYTES
    fd = os.open(_PAGEMAP, os.O_RDONLY | os.O_CLOEXEC)
    try:
        raw = os.pread(fd, (last - first + 1) * 8, first * 8)
    finally:
        os.close(fd)
    entries = np.frombuffer(raw, dtype=np.uint64)
    present_private = (entries & _PRESENT != 0) & (entries & _FILE_PAGE == 0)
    written = present_private | (entries & _SWAPPED != 0)
    return np.flatnonzero(written) + (first - address // PAGE_BYTES)


_PROBE: list[bool] = []


def pagemap_works() -> bool:
    """Whether the pagemap tells written pages of a private mapping apart
    (probed once: a page written, one read, one untouched)."""
    if not _PROBE:
        _PROBE.append(_probe_pagemap())
    return _PROBE[0]


def _probe_pagemap() -> bool:
    try:
        fd = os.memfd_create("loaderx-probe", os.MFD_CLOEXEC)
    except OSError:
        return False
    try:
        os.ftruncate(fd, 3 * PAGE_BYTES)
        private = mmap.mmap(fd, 3 * PAGE_BYTES, flags=mmap.MAP_PRIVATE)
        view = np.frombuffer(private, dtype=np.uint8)
        view[1 * PAGE_BYTES] = 1
        _ = int(view[2 * PAGE_BYTES])
        found = written_pages(view).tolist()
        del view
        private.close()
        return bool(found == [1])
    except OSError:
        return False
    finally:
        os.close(fd)
