"""A simulated file system for ArrayStore's seam (loaderx._fs.OsFs): power
loss and I/O faults on cue.

The model. Directories and files live in memory under the mount ``/sim``
(a path that does not exist on the real disk, so a call that bypasses the
seam fails). Each name and each file has two states: what the process sees
(``entries``, ``data``) and what survives a power cut (``durable_entries``,
``durable_data``). Directory operations (create, mkdir, rename, exchange,
unlink, rmtree) change what the process sees at once and are queued per
directory; ``fsync_dir`` of that directory makes its queue durable. Writes
(``write_new``, and ``write_at`` at an offset of a file, created when
missing) are queued per file; ``fsync_file`` makes them durable. A rename or exchange
is one operation (both names change together), as the kernel does it within
one directory; ArrayStore renames only within its root.

``crash(seed)`` loses power: each queued directory operation is kept or
dropped independently (kept ones applied in order), each queued write is
dropped, kept, or torn at 512-byte sectors (each sector kept or not), and
what the process sees becomes what survived. Between ``arm_crash`` firing and
``crash`` every call raises ``PowerLoss``: nothing after the crash point
happens. Held locks die with the process.

Faults: ``fail(at=n, code=..., sticky=...)`` makes the n-th fallible call
(counted from when it was armed) raise ``OSError(code)``; sticky faults fail
every call from there until ``clear_faults``. A failed ``fsync_file`` drops
the file's queued writes for good (the page cache marks them clean, as Linux
does), so a retried fsync cannot make them durable; a failed ``fsync_dir``
leaves its queue as it was (kept or dropped at a crash).

Zrecord store directories are opaque blobs. ``build_store`` runs zrecord for
real, into a directory under ``workdir`` (zrecord syncs its own files, which
this model takes as durable once the build returned, the store's own
promise), and puts a blob node at the requested name, an entry of the
parent that stays queued until the parent is synced (a staged store's
build does not sync its parent). Calls on paths inside a blob go to that real
directory (reads; zrecord's own commits are outside this model), so
``real_path`` is where DenseDataset opens it. A build that fails leaves an
incomplete blob (a directory without a schema), as a half-written store
would be. Removing a directory tree queues the deletion of what it holds
(each directory's entries in that directory's queue; a blob's contents as one
queued deletion) and then its entry in the parent: a cut may keep the
deletions and drop a rename or exchange that moved the tree there, which is
how deleting a swap's leftover before the swap is durable loses data. Builds
given as ``functools.partial`` are memoised by their arguments (a store
directory is a pure function of the array and the codec; a ``generation``
argument, which differs per build and which the build records in the
store's schema file, is overlaid on the memoised store's schema file);
other callables (the converters' builds) run fresh each time. Locks may be
exclusive or shared, and may live inside a blob (a store's own ``lock``).
"""

from __future__ import annotations

import errno
import os
import random
import tempfile
import types

import msgpack
import numpy as np

MOUNT = "/sim"
SCHEMA_FILE = "schema.msgpack"  # loaderx.dataset.SCHEMA_FILE
SECTOR_BYTES = 512


class PowerLoss(BaseException):
    """The simulated power went out (a BaseException: nothing may catch it
    and carry on)."""


class SimFs:
    """Implements loaderx._fs.OsFs over the model in the module docstring."""

    removes_in_background = False  # every call in order, so crash points are reproducible

    def __init__(self, workdir: str, memo: dict):
        self.workdir = workdir
        self.memo = memo  # build arguments -> real store directory, shared across simulations
        self.next_inode = 2
        self.kinds = {1: "dir"}
        self.entries = {1: {}}  # directory inode -> {name: inode}, as the process sees it
        self.durable_entries = {1: {}}
        self.data = {}  # file inode -> bytes, as the process sees them
        self.durable_data = {}
        self.blobs = {}  # blob inode -> real directory
        self.pending_entries = []  # (directory inode, {name: inode or None}) in call order
        self.pending_writes = []  # (file inode, offset, bytes)
        self.locks = {}  # path -> "exclusive" or the number of shared holders
        self.gutted = set()  # blob inodes whose contents were deleted, as the process sees it
        self.durable_gutted = set()
        self.pending_guts = []  # blob inodes whose deletion is queued
        # blob inode -> {file name: bytes} written by the build beside the memoised store
        self.overlays = {}
        self.builds = 0  # builds run (memoised ones not counted)
        self.epoch = 0
        self.exchange_works = True
        self.dead = False
        self.crash_at = None
        self.mutations = 0  # calls that change something or sync: the crash points
        self.fallible = 0  # calls that can fail: the fault points
        self.fault = None  # (index, code, sticky)
        self.fallible_kinds = []  # kind of each fallible call since the fault counter was armed

    # ---- control

    def arm_crash(self, at: int | None) -> None:
        """Power is lost just before the ``at``-th mutating call from now."""
        self.mutations = 0
        self.crash_at = at

    def fail(self, at: int, code: int, sticky: bool = False) -> None:
        self.fallible = 0
        self.fallible_kinds = []
        self.fault = (at, code, sticky)

    def count_from_here(self) -> None:
        self.fallible = 0
        self.fallible_kinds = []
        self.mutations = 0

    def clear_faults(self) -> None:
        self.fault = None

    def crash(self, seed: int) -> None:
        """Power is lost: only what the model says survives (see the module docstring)."""
        rng = random.Random(seed)
        for inode, offset, payload in self.pending_writes:
            choice = rng.randrange(3)
            if choice == 1:
                self._write_durable(inode, offset, payload)
            elif choice == 2:
                for start in range(0, len(payload), SECTOR_BYTES):
                    if rng.random() < 0.5:
                        self._write_durable(
                            inode, offset + start, payload[start : start + SECTOR_BYTES]
                        )
        for directory, changes in self.pending_entries:
            if rng.random() < 0.5:
                self._apply(self.durable_entries[directory], changes)
        for inode in self.pending_guts:
            if rng.random() < 0.5:
                self.durable_gutted.add(inode)
        self.pending_entries, self.pending_writes, self.pending_guts = [], [], []
        self.gutted = set(self.durable_gutted)
        self.entries = {inode: dict(names) for inode, names in self.durable_entries.items()}
        self.data = dict(self.durable_data)
        self.locks.clear()
        self.epoch += 1
        self.dead = False
        self.crash_at = None

    # ---- bookkeeping

    def _mutation(self, kind: str) -> None:
        """Counts a call that changes or syncs something; loses power on cue."""
        if self.dead:
            raise PowerLoss()
        if self.crash_at is not None and self.mutations == self.crash_at:
            self.dead = True
            raise PowerLoss()
        self.mutations += 1
        self._fallible(kind)

    def _fallible(self, kind: str) -> None:
        if self.dead:
            raise PowerLoss()
        index = self.fallible
        self.fallible += 1
        self.fallible_kinds.append(kind)
        if self.fault is None:
            return
        at, code, sticky = self.fault
        if index == at or (sticky and index > at):
            raise OSError(
                code, f"cannot {kind} (simulated fault at call {index}): {os.strerror(code)}"
            )

    def _write_durable(self, inode: int, offset: int, payload: bytes) -> None:
        old = self.durable_data.get(inode, b"")
        if len(old) < offset:
            old += bytes(offset - len(old))
        self.durable_data[inode] = old[:offset] + payload + old[offset + len(payload) :]

    @staticmethod
    def _apply(names: dict, changes: dict) -> None:
        for name, inode in changes.items():
            if inode is None:
                names.pop(name, None)
            else:
                names[name] = inode

    def _change(self, directory: int, changes: dict) -> None:
        self._apply(self.entries[directory], changes)
        self.pending_entries.append((directory, changes))

    def _new_inode(self, kind: str) -> int:
        inode = self.next_inode
        self.next_inode += 1
        self.kinds[inode] = kind
        return inode

    def _parts(self, path: str) -> list:
        path = os.path.normpath(path)
        if path != MOUNT and not path.startswith(MOUNT + "/"):
            raise AssertionError(f"the simulated file system got a path outside {MOUNT}: {path}")
        return [part for part in path[len(MOUNT) :].split("/") if part]

    def _lookup(self, path: str):
        """(inode, real path inside a blob or None); inode None when absent."""
        inode = 1
        parts = self._parts(path)
        for position, part in enumerate(parts):
            if self.kinds[inode] == "blob":
                if inode in self.gutted:
                    return None, None
                real = os.path.join(self.blobs[inode], *parts[position:])
                return (inode, real) if os.path.lexists(real) else (None, None)
            if self.kinds[inode] != "dir":
                return None, None
            inode = self.entries[inode].get(part)
            if inode is None:
                return None, None
        if self.kinds[inode] == "blob":
            return inode, self._empty_dir() if inode in self.gutted else self.blobs[inode]
        return inode, None

    def _empty_dir(self) -> str:
        """A real empty directory: what a blob whose contents were deleted holds."""
        path = os.path.join(self.workdir, "gutted")
        os.makedirs(path, exist_ok=True)
        return path

    def _overlay(self, path: str):
        """The bytes of a file a build wrote beside a memoised store, or None."""
        parent, name = os.path.split(os.path.normpath(path))
        inode, real = self._lookup(parent)
        if inode is None or self.kinds.get(inode) != "blob" or inode in self.gutted:
            return None
        return self.overlays.get(inode, {}).get(name)

    def _parent(self, path: str):
        """(parent directory inode, name); FileNotFoundError without a parent."""
        parent, real = self._lookup(os.path.dirname(os.path.normpath(path)))
        if parent is None or real is not None or self.kinds[parent] != "dir":
            raise FileNotFoundError(errno.ENOENT, f"no directory for '{path}' in the simulation")
        return parent, os.path.basename(os.path.normpath(path))

    # ---- reads

    def listdir(self, path: str) -> list:
        self._fallible("list")
        inode, real = self._lookup(path)
        if real is not None:
            return os.listdir(real)
        if inode is None or self.kinds[inode] != "dir":
            raise FileNotFoundError(errno.ENOENT, f"cannot list '{path}': no such directory")
        return sorted(self.entries[inode])

    def exists(self, path: str) -> bool:
        if self.dead:
            raise PowerLoss()
        return self._lookup(path)[0] is not None

    def isdir(self, path: str) -> bool:
        if self.dead:
            raise PowerLoss()
        inode, real = self._lookup(path)
        if real is not None:
            return os.path.isdir(real)
        return inode is not None and self.kinds[inode] == "dir"

    def isfile(self, path: str) -> bool:
        if self.dead:
            raise PowerLoss()
        if self._overlay(path) is not None:
            return True
        inode, real = self._lookup(path)
        if real is not None:
            return os.path.isfile(real)
        return inode is not None and self.kinds[inode] == "file"

    def identity(self, path: str):
        self._fallible("stat")
        inode, real = self._lookup(path)
        if real is not None and self.kinds.get(inode) != "blob":
            return os.lstat(real).st_ino
        return inode

    def stat(self, path: str):
        self._fallible("stat")
        inode, real = self._lookup(path)
        if real is not None:
            return os.stat(real)
        if inode is None:
            raise FileNotFoundError(errno.ENOENT, f"cannot stat '{path}': no such file")
        return types.SimpleNamespace(
            st_size=len(self.data.get(inode, b"")), st_mtime=0.0, st_mtime_ns=0, st_ino=inode
        )

    def read_file(self, path: str, bytes_max: int) -> bytes:
        self._fallible("read")
        overlay = self._overlay(path)
        if overlay is not None:
            return overlay[:bytes_max]
        inode, real = self._lookup(path)
        if real is not None:
            with open(real, "rb") as handle:
                return handle.read(bytes_max)
        if inode is None or self.kinds[inode] != "file":
            raise FileNotFoundError(errno.ENOENT, f"cannot read '{path}': no such file")
        return self.data[inode][:bytes_max]

    def replaceable(self, path: str) -> bool:
        return True  # no mount points or permissions in the model

    def real_path(self, path: str) -> str:
        inode, real = self._lookup(path)
        if inode is None:
            raise FileNotFoundError(errno.ENOENT, f"no '{path}' in the simulation")
        if real is None:
            raise AssertionError(f"'{path}' is not a store directory in the simulation")
        return real

    # ---- writes

    def mkdir(self, path: str) -> None:
        self._mutation("mkdir")
        parent, name = self._parent(path)
        if name in self.entries[parent]:
            raise FileExistsError(errno.EEXIST, f"cannot create directory '{path}': it exists")
        inode = self._new_inode("dir")
        self.entries[inode], self.durable_entries[inode] = {}, {}
        self._change(parent, {name: inode})

    def write_new(self, path: str, payload: bytes) -> None:
        """A new inode at ``path`` (replacing any file there), bytes queued."""
        self._mutation("write")
        parent, name = self._parent(path)
        inode = self._new_inode("file")
        self.durable_data[inode] = b""
        self.data[inode] = bytes(payload)
        self._change(parent, {name: inode})
        self.pending_writes.append((inode, 0, bytes(payload)))

    def write_at(self, path: str, offset: int, payload: bytes) -> None:
        """``payload`` at byte ``offset`` of ``path`` (a new inode when
        missing, its entry queued), the bytes queued like any write."""
        self._mutation("write")
        parent, name = self._parent(path)
        inode = self.entries[parent].get(name)
        if inode is None:
            inode = self._new_inode("file")
            self.durable_data[inode] = b""
            self.data[inode] = b""
            self._change(parent, {name: inode})
        elif self.kinds[inode] != "file":
            raise IsADirectoryError(errno.EISDIR, f"cannot write '{path}': it is a directory")
        old = self.data[inode]
        if len(old) < offset:
            old += bytes(offset - len(old))
        self.data[inode] = old[:offset] + bytes(payload) + old[offset + len(payload) :]
        self.pending_writes.append((inode, offset, bytes(payload)))

    def rename(self, source: str, target: str) -> None:
        self._mutation("rename")
        parent, source_name = self._parent(source)
        target_parent, target_name = self._parent(target)
        assert parent == target_parent, "the model renames within one directory"
        inode = self.entries[parent].get(source_name)
        if inode is None:
            raise FileNotFoundError(errno.ENOENT, f"cannot rename '{source}': no such file")
        existing = self.entries[parent].get(target_name)
        if existing is not None and self.kinds[existing] != "file" and self._nonempty(existing):
            raise OSError(
                errno.ENOTEMPTY,
                f"cannot rename '{source}' to '{target}': the target is a non-empty directory",
            )
        self._change(parent, {source_name: None, target_name: inode})

    def _nonempty(self, inode: int) -> bool:
        if self.kinds[inode] == "blob":
            return True
        return bool(self.entries[inode])

    def exchange(self, source: str, target: str) -> bool:
        if not self.exchange_works:
            return False
        self._mutation("exchange")
        parent, source_name = self._parent(source)
        _, target_name = self._parent(target)
        names = self.entries[parent]
        if source_name not in names or target_name not in names:
            raise FileNotFoundError(
                errno.ENOENT, f"cannot swap '{source}' and '{target}': one is missing"
            )
        self._change(parent, {source_name: names[target_name], target_name: names[source_name]})
        return True

    def unlink(self, path: str) -> None:
        self._mutation("unlink")
        parent, name = self._parent(path)
        if name not in self.entries[parent]:
            raise FileNotFoundError(errno.ENOENT, f"cannot delete '{path}': no such file")
        self._change(parent, {name: None})

    def rmtree(self, path: str) -> None:
        """Unlinks what the tree holds (queued in each directory, as the
        kernel's unlinks are: a cut may keep them while dropping a rename
        that moved the tree), then its entry."""
        self._mutation("rmtree")
        parent, name = self._parent(path)
        inode = self.entries[parent].get(name)
        if inode is not None:
            self._empty(inode)
            self._change(parent, {name: None})

    def _empty(self, inode: int) -> None:
        if self.kinds[inode] == "blob":
            self.gutted.add(inode)
            self.pending_guts.append(inode)
        elif self.kinds[inode] == "dir":
            for child in list(self.entries[inode].values()):
                self._empty(child)
            if self.entries[inode]:
                self._change(inode, dict.fromkeys(self.entries[inode]))

    def build_store(self, path: str, build) -> None:
        self._mutation("build")
        parent, name = self._parent(path)
        if name in self.entries[parent]:
            raise FileExistsError(errno.EEXIST, f"cannot build a store at '{path}': it exists")
        inode = self._new_inode("blob")
        self._change(parent, {name: inode})
        self.blobs[inode] = self._empty_dir()  # incomplete until the build returns
        keywords = dict(getattr(build, "keywords", {}))
        generation = keywords.pop("generation", None)
        self.blobs[inode] = self._built(build, keywords)
        if generation is not None:
            # The one argument that differs per build: the build records it
            # in the schema file, so this build's schema file is the
            # memoised one's with it.
            schema = msgpack.unpackb(self._real_bytes(self.blobs[inode], SCHEMA_FILE), raw=False)
            self.overlays[inode] = {
                SCHEMA_FILE: msgpack.packb({**schema, "generation": generation}, use_bin_type=True)
            }

    @staticmethod
    def _real_bytes(directory: str, name: str) -> bytes:
        with open(os.path.join(directory, name), "rb") as handle:
            return handle.read()

    def _built(self, build, keywords: dict) -> str:
        """The real directory ``build`` writes: once per distinct argument
        set for a ``functools.partial``, fresh for any other callable."""
        if not hasattr(build, "func"):
            real = os.path.join(tempfile.mkdtemp(dir=self.workdir), "store")
            self.builds += 1
            build(real)
            return real
        key = (
            build.func.__qualname__,
            tuple((name, _fingerprint(value)) for name, value in sorted(keywords.items())),
        )
        if key not in self.memo:
            real = os.path.join(tempfile.mkdtemp(dir=self.workdir), "store")
            self.builds += 1
            build.func(real, *build.args, **keywords)
            self.memo[key] = real
        return self.memo[key]

    # ---- durability

    def fsync_file(self, path: str) -> None:
        inode, _ = self._lookup(path)
        try:
            self._mutation("fsync")
        except OSError:
            self.pending_writes = [write for write in self.pending_writes if write[0] != inode]
            raise
        if inode is None:
            raise FileNotFoundError(errno.ENOENT, f"cannot fsync '{path}': no such file")
        for write in [write for write in self.pending_writes if write[0] == inode]:
            self._write_durable(*write)
        self.pending_writes = [write for write in self.pending_writes if write[0] != inode]

    def fsync_dir(self, path: str) -> None:
        self._mutation("fsync")
        inode, real = self._lookup(path)
        if inode is None or real is not None or self.kinds[inode] != "dir":
            raise FileNotFoundError(
                errno.ENOENT, f"cannot fsync directory '{path}': no such directory"
            )
        self._sync_entries(inode)

    def _sync_entries(self, inode: int) -> None:
        for directory, changes in self.pending_entries:
            if directory == inode:
                self._apply(self.durable_entries[directory], changes)
        self.pending_entries = [change for change in self.pending_entries if change[0] != inode]

    # ---- the writer lock

    def lock(self, path: str, shared: bool = False):
        inode, real = self._lookup(os.path.dirname(os.path.normpath(path)))
        if real is not None:
            self._fallible("lock")  # a store's own lock file, inside a blob: zrecord's business
        else:
            parent, name = self._parent(path)
            if name not in self.entries[parent]:
                self.write_new(path, b"")
            else:
                self._fallible("lock")
        held = self.locks.get(path)
        if held == "exclusive" or (held is not None and not shared):
            raise BlockingIOError(errno.EWOULDBLOCK, f"'{path}' is locked")
        self.locks[path] = (held or 0) + 1 if shared else "exclusive"
        return (self.epoch, path)

    def unlock(self, handle) -> None:
        epoch, path = handle
        if epoch != self.epoch or path not in self.locks:
            return
        held = self.locks[path]
        if held == "exclusive" or held == 1:
            del self.locks[path]
        else:
            self.locks[path] = held - 1


def _fingerprint(value):
    if isinstance(value, np.ndarray):
        return (value.dtype.str, value.shape, value.tobytes())
    return value
