"""The file-system seam of the Python layer: every file-system call that
ArrayStore, the small-file writer and the one directory swap make (the
swap's users: the converters' creation and overwrite, sharded datasets,
the CLI's conversion; see "the directory swap" below) goes through an
``OsFs``.

Tests swap in a simulated file system with the same methods (tests/simfs.py)
that loses power between any two calls and fails any call on cue, so the
order of renames and fsyncs that makes a commit durable is tested, not
assumed. Every OS error message of these calls is made here: an ``OSError``
that names the call, the path and the reason.

A zrecord store directory is opaque to this seam: ``build_store`` hands a
real path to a function that writes the whole store (zrecord does its own
I/O and fsyncs), and ``real_path`` says where an existing one can be opened.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import shutil
from typing import Any, Callable

from ._errors import class_for_errno

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _error(exc: OSError, what: str) -> OSError:
    """``exc`` re-raised with a message that says which call failed on which
    path: a StoreFullError or StoreReadOnlyError when its errno says so (one
    hierarchy with the native core's), else the same OSError subclass."""
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    store_class = class_for_errno(exc.errno)
    if store_class is not None:
        return store_class(f"cannot {what}: {reason}", errno=exc.errno)
    return type(exc)(exc.errno, f"cannot {what}: {reason}")


class OsFs:
    """The real file system (the production seam)."""

    # Garbage (the old directories of a finished commit) may be deleted on a
    # thread; the simulated disk says False, to stay deterministic.
    removes_in_background = True

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self._renameat2: Any = getattr(libc, "renameat2", None)  # a ctypes function, or None
        self.exchange_works = self._renameat2 is not None

    # ---- reads

    def listdir(self, path: str) -> list[str]:
        try:
            return os.listdir(path)
        except OSError as exc:
            raise _error(exc, f"list directory '{path}'") from None

    def exists(self, path: str) -> bool:
        return os.path.lexists(path)

    def isdir(self, path: str) -> bool:
        return os.path.isdir(path)  # through symlinks: a store's path may be one

    def isfile(self, path: str) -> bool:
        return os.path.isfile(path)

    def identity(self, path: str) -> int | None:
        """The inode number of ``path`` (stable across reboots on a local
        file system), or None when it does not exist."""
        try:
            return os.lstat(path).st_ino
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _error(exc, f"stat '{path}'") from None

    def stat(self, path: str) -> os.stat_result:
        try:
            return os.stat(path)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise _error(exc, f"stat '{path}'") from None

    def read_file(self, path: str, bytes_max: int) -> bytes:
        """At most ``bytes_max`` bytes of ``path``; FileNotFoundError when absent."""
        try:
            return read_at_most(path, bytes_max)
        except (FileNotFoundError, NotADirectoryError):
            raise
        except OSError as exc:
            raise _error(exc, f"read '{path}'") from None

    def real_path(self, path: str) -> str:
        """Where the store directory ``path`` can be opened by zrecord."""
        return path

    def replaceable(self, path: str) -> bool:
        """Whether the directory ``path`` can be swapped away: not a mount
        point, in a parent this process may write (for its lock file and
        the rename)."""
        parent = os.path.dirname(os.path.abspath(path))
        return os.access(parent, os.W_OK | os.X_OK) and not os.path.ismount(path)

    # ---- writes (durable only after the fsync named in each)

    def mkdir(self, path: str) -> None:
        """Creates a directory; durable after ``fsync_dir`` of its parent."""
        try:
            os.mkdir(path)
        except FileExistsError:
            raise
        except OSError as exc:
            raise _error(exc, f"create directory '{path}'") from None

    def write_new(self, path: str, payload: bytes) -> None:
        """Creates (or truncates) ``path`` holding ``payload``; the bytes are
        durable after ``fsync_file``, the name after ``fsync_dir``."""
        try:
            with open(path, "wb") as handle:
                handle.write(payload)
        except OSError as exc:
            raise _error(exc, f"write '{path}'") from None

    def write_at(self, path: str, offset: int, payload: bytes) -> None:
        """Writes ``payload`` at byte ``offset`` of ``path`` (created when
        missing, the rest kept) with one ``pwrite``; the bytes are durable
        after ``fsync_file``, a new name after ``fsync_dir``."""
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                view = memoryview(payload)
                done = 0
                while done < len(view):  # a regular file takes it whole but on a signal
                    done += os.pwrite(descriptor, view[done:], offset + done)
            finally:
                os.close(descriptor)
        except OSError as exc:
            raise _error(exc, f"write '{path}' at byte {offset}") from None

    def rename(self, source: str, target: str) -> None:
        try:
            os.rename(source, target)
        except OSError as exc:
            raise _error(exc, f"rename '{source}' to '{target}'") from None

    def exchange(self, source: str, target: str) -> bool:
        """Atomically swaps two existing paths (renameat2 RENAME_EXCHANGE);
        False where the kernel or file system cannot."""
        if not self.exchange_works:
            return False
        if (
            self._renameat2(
                _AT_FDCWD, os.fsencode(source), _AT_FDCWD, os.fsencode(target), _RENAME_EXCHANGE
            )
            == 0
        ):
            return True
        code = ctypes.get_errno()
        if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            self.exchange_works = False
            return False
        raise OSError(code, f"cannot swap '{source}' and '{target}': {os.strerror(code)}")

    def unlink(self, path: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise _error(exc, f"delete '{path}'") from None

    def rmtree(self, path: str) -> None:
        """Deletes a directory tree (or a file); absent is fine."""
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise _error(exc, f"delete '{path}'") from None

    def build_store(self, path: str, build: Callable[[str], None]) -> None:
        """Runs ``build(path)``, which writes a complete store directory at
        the new ``path`` and makes its contents durable before returning.
        Its entry in the parent is not synced: the caller syncs it when its
        commit needs that (ArrayStore fsyncs the parent once before a commit
        record that names several new directories)."""
        build(path)

    # ---- durability

    def fsync_file(self, path: str) -> None:
        _fsync(path, os.O_RDONLY, f"'{path}'")

    def fsync_dir(self, path: str) -> None:
        """Makes a directory's entries (new, renamed, deleted names) durable."""
        _fsync(path, os.O_RDONLY | os.O_DIRECTORY, f"directory '{path}'")

    # ---- the writer lock

    def lock(self, path: str, shared: bool = False) -> int:
        """Takes an exclusive (or ``shared``) flock on ``path`` (created if
        missing) without waiting: BlockingIOError when another holder has it
        (any holder, or an exclusive one for a shared lock)."""
        try:
            descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except PermissionError:
            raise
        except OSError as exc:
            raise _error(exc, f"open lock file '{path}'") from None
        try:
            fcntl.flock(descriptor, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BaseException:
            os.close(descriptor)
            raise
        return descriptor

    def unlock(self, handle: int) -> None:
        with contextlib.suppress(OSError):
            os.close(handle)  # closing releases the flock


_READ_PIECE_BYTES = 4096
_COPY_PIECE_BYTES = 1 << 20
FICLONE = 0x40049409  # ioctl(dst, FICLONE, src): <linux/fs.h>, _IOW(0x94, 9, int)
# errnos that say "this file system (or kernel) cannot", not "this copy failed"
_CANNOT = (errno.EOPNOTSUPP, errno.ENOTTY, errno.EINVAL, errno.EXDEV, errno.ENOSYS, errno.EBADF)


def copy_file(source: str, target: str) -> tuple[int, str]:
    """Copies the file ``source`` to the new file ``target`` and fsyncs it:
    a reflink (FICLONE: the blocks are shared, nothing is copied) where the
    file system supports it, else ``os.copy_file_range`` (the kernel copies,
    in place where it can), else reads and writes of 1 MiB. Returns the
    bytes and how (``"reflink"``, ``"copy_file_range"``, ``"read"``). Like
    zrecord's own I/O, this runs inside a store build, on real paths."""
    try:
        with open(source, "rb") as reading, open(target, "xb") as writing:
            size = os.fstat(reading.fileno()).st_size
            how = _copy_open(reading.fileno(), writing.fileno(), size)
            os.fsync(writing.fileno())
    except OSError as exc:
        raise _error(exc, f"copy '{source}' to '{target}'") from None
    return size, how


def _copy_open(reading: int, writing: int, size: int) -> str:
    """Copies ``size`` bytes from descriptor ``reading`` to ``writing``."""
    if size == 0:
        return "reflink"
    try:
        fcntl.ioctl(writing, FICLONE, reading)
        return "reflink"
    except OSError as exc:
        if exc.errno not in _CANNOT:
            raise
    copied = 0
    try:
        while copied < size:
            count = os.copy_file_range(reading, writing, size - copied)
            if count == 0:
                raise OSError(errno.EIO, f"the file ended after {copied} of {size} bytes")
            copied += count
        return "copy_file_range"
    except OSError as exc:
        if copied or exc.errno not in _CANNOT:
            raise
    while copied < size:
        piece = os.read(reading, min(_COPY_PIECE_BYTES, size - copied))
        if not piece:
            raise OSError(errno.EIO, f"the file ended after {copied} of {size} bytes")
        os.write(writing, piece)  # a regular file takes the whole piece
        copied += len(piece)
    return "read"


def read_at_most(path: str, bytes_max: int) -> bytes:
    """The first ``bytes_max`` bytes of ``path`` (all of a shorter file):
    small files (schemas, markers, manifests) in one ``read`` of a 4 KiB
    buffer, with no stat; asking for ``bytes_max`` at once would allocate,
    and map, that much per call."""
    descriptor = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        pieces = [os.read(descriptor, min(_READ_PIECE_BYTES, bytes_max))]
        total = len(pieces[0])
        while len(pieces[-1]) == _READ_PIECE_BYTES and total < bytes_max:
            pieces.append(os.read(descriptor, min(_READ_PIECE_BYTES, bytes_max - total)))
            total += len(pieces[-1])
    finally:
        os.close(descriptor)
    return b"".join(pieces)


def _fsync(path: str, flags: int, thing: str) -> None:
    try:
        descriptor = os.open(path, flags)
    except OSError as exc:
        raise _error(exc, f"open {thing} to fsync it") from None
    try:
        os.fsync(descriptor)
    except OSError as exc:
        raise _error(exc, f"fsync {thing} (its changes may not be on disk)") from None
    finally:
        os.close(descriptor)


def fsync_directory(path: str) -> None:
    """fsyncs the real directory ``path`` (its entries), for a store build."""
    _fsync(path, os.O_RDONLY | os.O_DIRECTORY, f"directory '{path}'")


OS_FS = OsFs()


def write_file_durable(path: str, payload: bytes, fs: OsFs = OS_FS) -> None:
    """Writes a new file and fsyncs it, not atomically: for a directory
    nobody reads until it is renamed into place. Its name is durable after
    an fsync of its directory."""
    fs.write_new(path, payload)
    fs.fsync_file(path)


def write_file_atomic(path: str, payload: bytes, fs: OsFs = OS_FS) -> None:
    """Writes a small file atomically and durably: a temporary file, fsync,
    rename over ``path``, then fsync of its directory. A crash leaves the old
    file or the new one, never a mix."""
    path = os.fspath(path)
    temporary = f"{path}.tmp-{os.getpid()}"
    try:
        fs.write_new(temporary, payload)
        fs.fsync_file(temporary)
        fs.rename(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            fs.unlink(temporary)
        raise
    fs.fsync_dir(os.path.dirname(path) or ".")


def make_dirs_durable(path: str, fs: OsFs = OS_FS) -> str | None:
    """Creates ``path`` and its missing ancestors, each made durable by an
    fsync of its parent (a new directory whose parent entry is not fsynced
    can vanish in a power cut, with everything in it). Returns the outermost
    directory it created (None: ``path`` existed), for a caller that fails
    later to remove."""
    path = os.path.abspath(path)
    if fs.isdir(path):
        return None
    parent = os.path.dirname(path)
    created = make_dirs_durable(parent, fs) if parent != path else None
    try:
        fs.mkdir(path)
    except FileExistsError:
        if not fs.isdir(path):
            raise
        return created
    fs.fsync_dir(parent)
    return created or path


# ---- the directory swap ------------------------------------------------------------
#
# The one protocol by which a complete new directory takes the place of an
# old one (or of nothing): converters' creation and overwrite, the CLI's
# conversion, shards and ArrayStore's arrays. Its names, beside the target
# ``<parent>/<name>``:
#
#   .new-<name>    the new directory, built whole and made durable before the swap
#   .prev-<name>   the old one, only where RENAME_EXCHANGE is missing (two renames)
#   .lock-<name>   an empty file whose flock the one writer replacing <name> holds
#                  (a lock inside <name> would be swapped away with it); never
#                  deleted, since deleting a lock file races its next holder
#
# The swap is ``renameat2(RENAME_EXCHANGE)``: atomic for readers and through a
# crash, after which ``.new-<name>`` holds the old contents. Where the kernel
# or file system lacks it, ``<name>`` is renamed to ``.prev-<name>`` and
# ``.new-<name>`` to ``<name>``: between the two (and after a crash there,
# until the next writer's leftover rule) ``<name>`` is missing, and readers
# open the old directory at ``.prev-<name>`` instead (``readable_path``).
#
# The one leftover rule, run by the holder of the target's lock before it
# builds: when ``<name>`` is missing and ``.prev-<name>`` exists, the swap was
# cut between its renames and the old directory is renamed back (the call was
# never acknowledged); every other ``.new-<name>`` and ``.prev-<name>`` is
# garbage of a finished or unfinished call and deleted. The old contents a
# swap replaced are deleted only once the swap itself is durable.

STAGING_PREFIX = ".new-"
ASIDE_PREFIX = ".prev-"
LOCK_PREFIX = ".lock-"


def parent_of(path: str) -> str:
    """The directory that holds ``path``."""
    return os.path.dirname(os.path.abspath(path))


def sibling(target: str, prefix: str) -> str:
    """``<parent>/<prefix><name>`` for ``target`` = ``<parent>/<name>``."""
    parent, name = os.path.split(os.path.abspath(target))
    assert name, f"a swap target needs a name: {target!r}"
    return os.path.join(parent, prefix + name)


def swap_in(staging: str, target: str, fs: OsFs = OS_FS) -> str | None:
    """Puts the complete, durable directory ``staging`` at ``target`` (both in
    one parent); returns the path that now holds the old contents, to delete
    once the swap is durable (``fsync_dir`` of the parent), or None when
    there were none. Not durable until that fsync."""
    assert os.path.dirname(os.path.abspath(staging)) == os.path.dirname(os.path.abspath(target))
    if not fs.exists(target):
        fs.rename(staging, target)
        return None
    if fs.exchange(staging, target):
        return staging
    aside = sibling(target, ASIDE_PREFIX)
    fs.rmtree(aside)
    fs.rename(target, aside)
    try:
        fs.rename(staging, target)
    except OSError:
        with contextlib.suppress(OSError):
            fs.rename(aside, target)  # else the next writer's clean_leftovers puts it back
        raise
    return aside


def readable_path(target: str, fs: OsFs = OS_FS) -> str:
    """Where a reader opens ``target``: ``target`` itself, or, while it is
    missing because a two-rename swap is (or was cut) between its renames,
    the old directory at ``.prev-<name>``, which is whole."""
    if fs.exists(target):
        return target
    aside = sibling(target, ASIDE_PREFIX)
    return aside if fs.isdir(aside) else target


def clean_leftovers(target: str, fs: OsFs = OS_FS, sync_first: bool = True) -> bool:
    """The one leftover rule (above) for ``target``, run under its writer's
    lock; True when it changed something (the caller syncs the parent).
    The parent is fsynced before anything is deleted (unless the caller just
    did, ``sync_first=False``): the swap that left ``.new-<name>`` holding
    the old contents may not be durable yet, and deleting them first could
    leave a power cut nothing."""
    staging, aside = sibling(target, STAGING_PREFIX), sibling(target, ASIDE_PREFIX)
    found = [leftover for leftover in (staging, aside) if fs.exists(leftover)]
    if not found:
        return False
    if sync_first:
        fs.fsync_dir(os.path.dirname(target))
    if aside in found and not fs.exists(target):
        fs.rename(aside, target)  # a two-rename swap cut short: the old contents come back
        found.remove(aside)
    for leftover in found:
        fs.rmtree(leftover)
    return True


class DirectorySwap:
    """One replacement (or creation) of the directory ``target``, under its
    ``.lock-<name>`` (taken without waiting: ``locked(message)`` is raised
    when another writer holds it):

        with DirectorySwap(target, fs, locked) as swap:
            ...check what is at target, under the lock...
            swap.build(write)    # fs.build_store(.new-<name>, write): complete and durable
            swap.commit()        # swap_in, fsync of the parent, delete the old

    Leaving the block without ``commit`` deletes the staging directory: the
    target is as it was."""

    def __init__(self, target: str, fs: OsFs, locked: Callable[[str], BaseException]) -> None:
        self.target = os.path.abspath(os.fspath(target))
        self.parent = os.path.dirname(self.target)
        self.staging = sibling(self.target, STAGING_PREFIX)
        self.fs = fs
        make_dirs_durable(self.parent, fs)
        try:
            self._handle = fs.lock(sibling(self.target, LOCK_PREFIX))
        except BlockingIOError:
            raise locked(
                f"'{target}' is being written by another process (or handle) right now; retry when "
                "it is done"
            ) from None
        try:
            if clean_leftovers(self.target, fs):
                fs.fsync_dir(self.parent)
        except BaseException:
            fs.unlock(self._handle)
            raise
        self.built = False
        self.committed = False

    def __enter__(self) -> DirectorySwap:
        return self

    def build(self, write: Callable[[str], None]) -> None:
        """Runs ``write(path)``, which writes the new directory whole at the
        new ``path`` and makes its contents durable."""
        assert not self.built and not self.committed
        self.built = True
        self.fs.build_store(self.staging, write)

    def commit(self) -> None:
        """Swaps the built directory in and makes that durable (the parent's
        fsync also makes the staging entry durable, which the swap renames),
        then deletes the old contents."""
        assert self.built and not self.committed
        self.fs.fsync_dir(self.parent)  # the staging entry, durable before the swap names it
        old = swap_in(self.staging, self.target, self.fs)
        self.committed = True
        self.fs.fsync_dir(self.parent)
        if old is not None:
            # Garbage now: a failure to delete it (a reader's open racing
            # the deletion) leaves it to the next writer's leftover rule.
            with contextlib.suppress(OSError):
                self.fs.rmtree(old)

    def __exit__(self, kind: object, error: object, traceback: object) -> None:
        try:
            if not self.committed:
                with contextlib.suppress(OSError):
                    self.fs.rmtree(self.staging)
        finally:
            self.fs.unlock(self._handle)


# ---- I/O statistics ------------------------------------------------------------------


class IoStats:
    """Counters of one ArrayStore since it was opened (``get_io_stats``).

    ``calls`` counts every call of the file-system seam and every native
    read or write of array rows; ``reads``/``bytes_read`` the seam's file
    reads and the native gathers (bytes: of the rows returned);
    ``writes``/``bytes_written`` the seam's file writes, each array
    directory built or cloned (bytes: its files' sizes) and each native
    row edit (bytes: of the rows given); ``syncs``
    the seam's fsyncs, each native ``sync()`` and each native row edit of a
    ``durable=True`` store (which syncs before it returns)."""

    FIELDS = ("bytes_read", "bytes_written", "reads", "writes", "syncs", "calls")

    def __init__(self) -> None:
        self.bytes_read = self.bytes_written = 0
        self.reads = self.writes = self.syncs = self.calls = 0

    def read(self, nbytes: int) -> None:
        self.calls += 1
        self.reads += 1
        self.bytes_read += nbytes

    def wrote(self, nbytes: int, synced: bool = False) -> None:
        self.calls += 1
        self.writes += 1
        self.bytes_written += nbytes
        self.syncs += int(synced)

    def synced(self) -> None:
        self.calls += 1
        self.syncs += 1

    def as_dict(self) -> dict[str, int]:
        return {field: getattr(self, field) for field in self.FIELDS}


class CountingFs:
    """A file-system seam that forwards every call to ``inner`` and counts
    it in ``stats`` (reads, writes and fsyncs by kind; see ``IoStats``)."""

    def __init__(self, inner: OsFs, stats: IoStats) -> None:
        self._inner = inner
        self._stats = stats

    def __getattr__(self, attribute: str) -> Any:
        value = getattr(self._inner, attribute)
        if not callable(value):
            return value
        stats = self._stats

        def counted(*args: Any, **kwargs: Any) -> Any:
            stats.calls += 1
            return value(*args, **kwargs)

        return counted

    # The calls of every array open, spelled out: no wrapper made per store.
    def real_path(self, path: str) -> str:
        self._stats.calls += 1
        return self._inner.real_path(path)

    def exists(self, path: str) -> bool:
        self._stats.calls += 1
        return self._inner.exists(path)

    def identity(self, path: str) -> int | None:
        self._stats.calls += 1
        return self._inner.identity(path)

    def read_file(self, path: str, bytes_max: int) -> bytes:
        payload = self._inner.read_file(path, bytes_max)
        self._stats.read(len(payload))
        return payload

    def write_new(self, path: str, payload: bytes) -> None:
        self._inner.write_new(path, payload)
        self._stats.wrote(len(payload))

    def write_at(self, path: str, offset: int, payload: bytes) -> None:
        self._inner.write_at(path, offset, payload)
        self._stats.wrote(len(payload))

    def build_store(self, path: str, build: Callable[[str], None]) -> None:
        self._inner.build_store(path, build)
        inner = self._inner
        files = [os.path.join(path, item) for item in inner.listdir(path)]
        self._stats.wrote(sum(inner.stat(file).st_size for file in files if inner.isfile(file)))

    def fsync_file(self, path: str) -> None:
        self._inner.fsync_file(path)
        self._stats.synced()

    def fsync_dir(self, path: str) -> None:
        self._inner.fsync_dir(path)
        self._stats.synced()
