"""ArrayStore's commit engine: which array directories an ArrayStore root holds.

Invariant: after any crash, power cut or failed call, each array named by a
``save`` or ``drop`` call is as before the call or as after it, all of them
the same way (never a mix), and the call was acknowledged only once it is
durable (``durable=False``: at the next ``sync()``). The root's own files::

    <root>/.arraystore.msgpack   the marker (an `_envelope`; version 1: a plain map)
    <root>/.lock                 flock(LOCK_EX) held by the one writing ArrayStore
    <root>/.commit.msgpack       the commit record of a save or drop in flight
    <root>/.new-<name>  .prev-<name>  .drop-<name>  saves and drops in flight
    <root>/.deletes-<name>       the delete log of <name>'s logical row drops
                                 (`_arraydrop`), tied to its directory's generation

Every other name not starting with ``.`` is an array directory. One call is
one commit, however many arrays it names:

1. Each new array is written whole into ``.new-<name>`` (zrecord makes its
   data and schema durable), then the root is fsynced once so those
   directory entries are durable too.
2. The commit record (an `_envelope`: each saved name with the generation
   id of its new directory, a random id recorded in that directory's
   schema file, so it survives a copy of the store; and the dropped names)
   is written to a temporary file, fsynced, renamed into place and the root
   fsynced: that fsync is the commit point.
3. Each new directory is swapped in with the one directory swap of ``_fs``
   (``swap_in``), each dropped array renamed to ``.drop-<name>``, the root
   fsynced, the record deleted, and the old directories removed.

A call that saves or drops one array needs no record: one exchange or rename
of the root, fsynced (with ``durable=False`` at the next ``sync()``; what it
replaced is deleted only after that fsync, since a power cut can keep a
deletion and drop the rename before it).

A commit record left by a crash is replayed: the generation ids tell which
swaps happened (an exchange leaves both names in place). Without a record,
leftovers follow the swap's one rule (``_fs.clean_leftovers``), and every
``.drop-`` entry is deleted. A drop first makes sure no ``.prev-<name>`` of a
dropped name can outlive it. (An ``.old-<name>`` whose ``<name>`` is missing
was left by a loaderx from before the commit record and is renamed back.)
Every file-system call goes through the seam in ``_fs.py``, which the tests
replace with a simulated disk that loses power.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import threading
import zlib
from collections.abc import Sequence
from typing import Any, Callable

from . import _envelope, zrecord
from ._arraydrop import DELETES_PREFIX, read_header
from ._envelope import EnvelopeError
from ._errors import class_for_errno
from ._fs import (
    ASIDE_PREFIX,
    STAGING_PREFIX,
    OsFs,
    clean_leftovers,
    make_dirs_durable,
    swap_in,
    write_file_atomic,
)
from ._native import CODES
from .dataset import SCHEMA_FILE
from .zrecord import (
    CorruptStoreError,
    StoreFullError,
    StoreLockedError,
    StoreOSError,
    StoreReadOnlyError,
)

FORMAT_NAME = "loaderx-arraystore"
# Version 2 seals the marker in an `_envelope`; version 1 (read still) was
# the plain map {"format", "version"}. A loaderx that reads only version 1
# refuses a version 2 root ("upgrade loaderx"): it could not read its
# commit records. Version 3 says the root may hold delete logs
# (`_arraydrop`): the first logical drop of a store seals its marker at 3,
# so that a loaderx reading at most version 2 refuses it instead of reading
# dropped rows. A new store starts at version 2.
FORMAT_VERSION = 3
CREATED_VERSION = 2
DELETES_VERSION = 3
MARKER_FILE = ".arraystore.msgpack"
LOCK_FILE = ".lock"
COMMIT_FILE = ".commit.msgpack"
COMMIT_FORMAT = "loaderx-arraystore-commit"
# Version 3 is an `_envelope`. Versions 1 and 2 (read still) are the msgpack
# record with a little-endian CRC32 trailer; version 1 names each new
# directory by its inode number, which a copy changes, version 2 (and 3) by
# the generation id in its schema file.
COMMIT_VERSION = 3
COMMIT_TRAILER_VERSION_MAX = 2
DROP_PREFIX = ".drop-"
OLD_PREFIX = ".old-"  # the aside name of a loaderx from before the commit record
NAME_BYTES_MAX = 200  # leaves room for the ".drop-" prefix within NAME_MAX (255)
METADATA_BYTES_MAX = 1 << 16
_LEFTOVERS = (STAGING_PREFIX, ASIDE_PREFIX, DROP_PREFIX, OLD_PREFIX)
_TEMPORARIES = (MARKER_FILE + ".tmp", COMMIT_FILE + ".tmp")
STATUS_CODES = {name: code for code, (name, _) in CODES.items()}  # the native table, by name


class ArrayStoreIOError(StoreOSError):
    """A save or drop failed on a file-system error: an ``OSError`` with the
    ``errno``, and a ``StoreFullError`` or ``StoreReadOnlyError`` when the
    errno says so. ``outcome`` says what the call left: ``"unchanged"``
    (nothing changed), ``"committed"`` (the call is durable; finishing it
    failed and the next call retries that), or ``"unknown"`` (the fsync that
    commits it failed and taking it back failed too: after a reopen the call
    is applied entirely or not at all)."""

    def __new__(cls, code: int | None, message: str, outcome: str) -> ArrayStoreIOError:
        if cls is ArrayStoreIOError:
            cls = _IO_ERROR_CLASSES.get(class_for_errno(code), cls)
        return OSError.__new__(cls, message)

    def __init__(self, code: int | None, message: str, outcome: str) -> None:
        store_class = class_for_errno(code) or StoreOSError
        status = _STATUS_OF_CLASS.get(store_class, "io")
        StoreOSError.__init__(self, message, STATUS_CODES[status], code or None)
        self.outcome = outcome

    def __reduce__(self) -> tuple[type, tuple[int | None, str, str]]:  # type: ignore[override]
        return (ArrayStoreIOError, (self.errno, str(self), self.outcome))


class ArrayStoreFullError(ArrayStoreIOError, StoreFullError):
    """An ``ArrayStoreIOError`` of a full disk or quota (ENOSPC, EDQUOT, EFBIG)."""


class ArrayStoreReadOnlyError(ArrayStoreIOError, StoreReadOnlyError):
    """An ``ArrayStoreIOError`` of a place that cannot be written (EROFS, EACCES, EPERM)."""


_STATUS_OF_CLASS = {StoreFullError: "no_space", StoreReadOnlyError: "read_only"}
_IO_ERROR_CLASSES: dict[type | None, type[ArrayStoreIOError]] = {
    StoreFullError: ArrayStoreFullError,
    StoreReadOnlyError: ArrayStoreReadOnlyError,
}


def unchanged(what: str, exc: OSError) -> ArrayStoreIOError:
    """The error of a call that failed before its commit point."""
    return ArrayStoreIOError(exc.errno, f"{what} failed, nothing changed: {exc}", "unchanged")


def valid_name(name: object) -> bool:
    """Whether ``name`` can name an array: no name of the root's own files
    (they start with ``.``) and no path."""
    return isinstance(name, str) and _valid_text(name)


@functools.lru_cache(maxsize=1024)  # every edit checks its names: a hit costs a dict lookup
def _valid_text(name: str) -> bool:
    return (
        name != ""
        and not name.startswith(".")
        and "/" not in name
        and "\\" not in name
        and "\0" not in name
        and len(name.encode("utf-8", "surrogatepass")) <= NAME_BYTES_MAX
    )


def is_member(fs: OsFs, path: str) -> bool:
    """Whether the root's entry ``path`` is an array: its schema, or a store
    that lost its schema (a damaged array). A directory with neither is
    someone else's."""
    return fs.isfile(os.path.join(path, SCHEMA_FILE)) or zrecord.is_store(path, fs)


# ---- the writer ---------------------------------------------------------------------


class Committer:
    """The commits of one ArrayStore on its root: the write lock (taken on
    the first write), each call's commit, and what it leaves to finish.

    Not thread-safe: the ArrayStore calls it under its own lock."""

    def __init__(self, root: str, fs: OsFs, durable: bool) -> None:
        self.root = root
        self.fs = fs
        self.durable = durable
        self.lock_handle: int | None = None
        self.root_synced = True  # False after a non-durable one-array commit's rename, until sync
        # The deletion of the last commit record is not fsynced (a replay
        # finds every step done); a one-array commit must fsync it first, or a
        # power cut could keep its rename but the record too.
        self.record_unlinked = False
        self.unfinished = False  # a commit or cleanup still to finish
        self.cleanup: threading.Thread | None = None  # deleting the last commit's leftovers
        # With durable=False: what one-array commits replaced, deleted only
        # once their renames are durable (the next fsync of the root), since
        # a power cut may keep a deletion and drop the rename before it.
        self.deferred: list[str] = []
        self.marker_version = CREATED_VERSION  # the root's marker, as open_root read it

    @property
    def writing(self) -> bool:
        """Whether this ArrayStore holds the root's write lock."""
        return self.lock_handle is not None

    def begin(self, revalidate: Callable[[], None]) -> None:
        """Takes the write lock on first use, then finishes what a crashed
        writer left and runs ``revalidate`` (still as a reader)."""
        if self.lock_handle is not None:
            return
        handle = take_lock(self.root, self.fs)
        try:
            recover(self.root, self.fs)
            revalidate()
        except BaseException:
            self.fs.unlock(handle)
            raise
        self.lock_handle = handle

    def release(self) -> None:
        """Releases the write lock (close)."""
        if self.lock_handle is not None:
            self.fs.unlock(self.lock_handle)
            self.lock_handle = None

    def settle(self) -> None:
        """Finishes a commit a fault interrupted, once the fault clears."""
        self.finish_cleanup()
        if self.unfinished and self.lock_handle is not None:
            recover(self.root, self.fs)
            self.unfinished = False

    def sync_root(self) -> None:
        """Makes the renames of one-array commits durable (``sync()``) and
        deletes what they replaced."""
        if not self.root_synced:
            self.fs.fsync_dir(self.root)
            self.root_synced = True
        self.remove_deferred()

    def remove_deferred(self) -> None:
        """Deletes what earlier one-array commits replaced (their renames are
        durable now: the caller fsynced the root)."""
        assert self.root_synced
        paths, self.deferred = self.deferred, []
        self.remove(paths)

    def commit(
        self,
        builds: dict[str, Callable[..., None]],
        drops: list[str],
        release: Callable[[list[str]], None],
    ) -> None:
        """Saves the arrays ``builds`` writes and drops ``drops`` as one
        commit (the protocol of the module docstring). Each build is a
        ``functools.partial`` that writes a whole array directory at the path
        it is given and records its ``generation`` keyword in its schema file.
        ``release(names)`` closes the caller's handles of those names before
        their directories move. Raises ArrayStoreIOError on a file-system
        error, with what the call left."""
        if not builds and not drops:
            return
        what = f"save of {sorted(builds)}" if builds else f"drop of {sorted(drops)}"
        try:
            self.flush_deferred(list(builds), drops)
            self.before_drop(drops)
        except OSError as exc:
            raise unchanged(what, exc) from exc
        identities = self.stage(builds, what)
        release([*builds, *drops])
        names = [*builds, *drops]
        if not (len(names) == 1 and self.commit_one(names[0], bool(builds), what)):
            self.commit_recorded(identities, drops, what)
        self.remove_logs(names)

    def remove_logs(self, names: list[str]) -> None:
        """Deletes the delete logs of arrays a commit replaced or dropped:
        stale now (they name the old directory's generation), so a cut that
        keeps the deletion and drops the swap before it would bring dropped
        rows back: deleted only once the swap is durable (``durable=False``:
        after the next fsync of the root). A failure leaves a stale log,
        which names nothing and which the next writer's recovery deletes."""
        paths = [os.path.join(self.root, DELETES_PREFIX + name) for name in names]
        paths = [path for path in paths if self.fs.exists(path)]
        if not self.root_synced:
            self.deferred.extend(paths)
            return
        for path in paths:
            with contextlib.suppress(OSError):
                self.fs.unlink(path)

    def before_log(self, name: str) -> None:
        """Before the first record of a new delete log of ``name``: seals the
        marker at version 3 (once per store), and makes sure no deferred
        deletion of an old log at that path can delete the new one."""
        if self.marker_version < DELETES_VERSION:
            marker = os.path.join(self.root, MARKER_FILE)
            try:
                write_file_atomic(marker, _envelope.seal(FORMAT_NAME, DELETES_VERSION, {}), self.fs)
            except OSError as exc:
                raise unchanged(f"drop of rows of '{name}'", exc) from exc
            self.marker_version = DELETES_VERSION
        if os.path.join(self.root, DELETES_PREFIX + name) in self.deferred:
            try:
                self.fs.fsync_dir(self.root)
            except OSError as exc:
                raise unchanged(f"drop of rows of '{name}'", exc) from exc
            self.root_synced = True
            self.remove_deferred()

    def commit_recorded(self, identities: dict[str, str], drops: list[str], what: str) -> None:
        """Commits through a commit record: every call of several arrays, and
        an overwrite of one where RENAME_EXCHANGE is missing."""
        content = {"save": identities, "drop": list(drops)}
        try:
            write_commit_record(self.root, self.fs, content, what, staged=list(identities))
        except ArrayStoreIOError as exc:
            self.unfinished = exc.outcome == "unknown"  # the next call replays or discards it
            raise
        self.record_unlinked = True
        try:
            roll_forward(self.root, self.fs, content)
            self.root_synced = True  # its fsync made every earlier rename of the root durable
            self.remove_deferred()
        except OSError as exc:
            try:
                recover(self.root, self.fs)  # one more try from what the directory holds
            except OSError:
                self.unfinished = True
                raise ArrayStoreIOError(
                    exc.errno,
                    f"{what} is committed and durable, but finishing it failed: {exc}; the next "
                    "call on this ArrayStore (or the next writer) finishes it",
                    "committed",
                ) from exc
        leftovers = [STAGING_PREFIX + name for name in identities]
        leftovers += [ASIDE_PREFIX + name for name in identities]
        self.remove_leftovers(leftovers + [DROP_PREFIX + name for name in drops])

    def stage(self, builds: dict[str, Callable[..., None]], what: str) -> dict[str, str]:
        """Writes each array whole into ``.new-<name>``, its contents durable
        (the commit syncs the entries in the root); returns each name's
        generation id. On failure the staging directories are removed and
        nothing has changed."""
        fs = self.fs
        identities = {}
        try:
            for name, build in builds.items():
                staging = os.path.join(self.root, STAGING_PREFIX + name)
                fs.rmtree(staging)
                identities[name] = secrets.token_hex(16)
                # A partial of the partial stays one flat partial, which the
                # simulated disk memoises by its arguments but `generation`.
                fs.build_store(staging, functools.partial(build, generation=identities[name]))
        except BaseException as exc:
            for name in builds:
                with contextlib.suppress(OSError):
                    fs.rmtree(os.path.join(self.root, STAGING_PREFIX + name))
            if isinstance(exc, OSError) and not isinstance(exc, ArrayStoreIOError):
                raise unchanged(what, exc) from exc
            raise
        return identities

    def commit_one(self, name: str, saving: bool, what: str) -> bool:
        """Commits a call that saves or drops one array with one rename (or
        exchange) of the root and one fsync of it (none with ``durable=False``
        until ``sync()``): a single rename needs no commit record. False when
        it cannot (an overwrite without RENAME_EXCHANGE): nothing changed.

        It calls ``fs.exchange`` itself rather than ``_fs.swap_in``: where
        the exchange is missing, the swap falls back to two renames through
        ``.prev-<name>``, which is not one atomic step, so this call must go
        through a commit record instead; and a failed fsync takes the
        exchange back with a second one, which the swap does not offer."""
        fs, root = self.fs, self.root
        target = os.path.join(root, name)
        leftover = (STAGING_PREFIX if saving else DROP_PREFIX) + name
        other = os.path.join(root, leftover)
        undo: Callable[[], object]
        try:
            if self.record_unlinked:
                fs.fsync_dir(root)
                self.record_unlinked = False
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
            raise unchanged(what, exc) from exc
        self.sync_rename(undo, what)
        self.remove_leftovers([leftover] if leftover else [])
        return True

    def sync_rename(self, undo: Callable[[], object], what: str) -> None:
        """Makes the commit's rename durable; when that fails, takes it back
        durably (a retried fsync proves nothing about the failed one) or says
        that the outcome is unknown."""
        if not self.durable:
            self.root_synced = False
            return
        try:
            self.fs.fsync_dir(self.root)
        except OSError as cause:
            self.unfinished = True  # the staged directory is garbage now, whatever happens next
            take_back(self.root, self.fs, undo, what, cause)
            raise unchanged(what, cause) from cause

    def before_drop(self, drops: Sequence[str]) -> None:
        """Makes sure no ``.prev-<name>`` of a dropped name survives a power
        cut that keeps the drop: the swap's leftover rule would take it for
        a two-rename swap cut short and bring the old contents back."""
        if not drops:
            return
        asides = [os.path.join(self.root, ASIDE_PREFIX + name) for name in drops]
        stale = [path for path in asides if self.fs.exists(path)]
        for path in stale:
            self.fs.rmtree(path)
        if stale or self.record_unlinked:
            self.fs.fsync_dir(self.root)  # also the deletions of the last commit's leftovers
            self.record_unlinked = False

    def flush_deferred(self, saves: Sequence[str], drops: Sequence[str]) -> None:
        """Before a commit reuses a leftover name whose deletion waits for
        durability: makes the root durable and deletes them all."""
        leftovers = [STAGING_PREFIX + name for name in saves]
        leftovers += [ASIDE_PREFIX + name for name in [*saves, *drops]]
        leftovers += [DROP_PREFIX + name for name in drops]
        if {os.path.join(self.root, leftover) for leftover in leftovers} & set(self.deferred):
            self.fs.fsync_dir(self.root)
            self.root_synced = True
            self.remove_deferred()

    def remove_leftovers(self, leftovers: list[str]) -> None:
        """Deletes the old directories of a finished commit, on a thread where
        the seam allows it (freeing a big array's blocks is most of a drop's
        time); every later write, ``sync()`` and ``close()`` waits for it
        first, so nothing races it for those names. On a failure the next
        call (or the next writer) deletes them."""
        paths = [os.path.join(self.root, leftover) for leftover in leftovers]
        if not paths:
            return
        if not self.root_synced:
            self.deferred.extend(paths)  # durable=False: the rename is not durable yet
            return
        if not self.fs.removes_in_background:
            self.remove(paths)
            return
        for path in paths:
            # At once, so that a stale handle's refresh() says the store was
            # replaced (StoreReplacedError) now, not when the thread gets there.
            with contextlib.suppress(OSError):
                zrecord.retire(path, self.fs)
        self.cleanup = threading.Thread(
            target=self.remove, args=(paths,), name="loaderx-arraystore-cleanup", daemon=True
        )
        self.cleanup.start()

    def remove(self, paths: list[str]) -> None:
        for path in paths:
            try:
                self.fs.rmtree(path)
            except OSError:
                self.unfinished = True  # read under the ArrayStore's lock after the join

    def finish_cleanup(self) -> None:
        """Waits for the deletion of the last commit's leftovers."""
        if self.cleanup is not None:
            self.cleanup.join()
            self.cleanup = None


# ---- the root -----------------------------------------------------------------------


def open_root(path: str, fs: OsFs) -> int:
    """Creates the ArrayStore directory (durably: its parent is fsynced) or
    checks that ``path`` is one; returns its marker's version."""
    marker = os.path.join(path, MARKER_FILE)
    if fs.exists(path) and not fs.isdir(path):
        raise ValueError(f"'{path}' is a file, not an ArrayStore directory")
    created = make_dirs_durable(path, fs)
    try:
        payload = fs.read_file(marker, METADATA_BYTES_MAX + 1)
    except FileNotFoundError:
        if any(not item.startswith(MARKER_FILE + ".tmp") for item in fs.listdir(path)):
            raise ValueError(
                f"'{path}' is a non-empty directory that is not an ArrayStore (it has no "
                f"{MARKER_FILE}): give a new or empty directory"
            ) from None
        try:
            write_file_atomic(marker, _envelope.seal(FORMAT_NAME, CREATED_VERSION, {}), fs)
        except OSError:
            if created is not None:  # a failed open (a full disk) leaves nothing it made
                with contextlib.suppress(OSError):
                    fs.rmtree(created)
            raise
        return CREATED_VERSION
    return check_marker(payload, path)


def check_marker(payload: bytes, path: str) -> int:
    """The version of the marker ``payload`` of the root ``path``; ValueError
    when it is not the marker of an ArrayStore this loaderx reads."""
    marker = os.path.join(path, MARKER_FILE)
    try:
        data = _envelope.unpack_map(payload)
        if _envelope.is_sealed(data):
            return _envelope.unseal(payload, FORMAT_NAME, FORMAT_VERSION)[0]
        version = _envelope.check_header(data, FORMAT_NAME, FORMAT_VERSION)
    except EnvelopeError as exc:
        raise ValueError(_marker_message(exc, marker, path)) from exc
    if version != 1:  # only version 1 was a plain map
        raise ValueError(f"{marker} is damaged: version {version} without its envelope")
    return version


def _marker_message(exc: EnvelopeError, marker: str, path: str) -> str:
    if exc.reason == _envelope.FORMAT:
        return f"'{path}' is not an ArrayStore ({marker} names format {exc.found!r})"
    if exc.reason == _envelope.VERSION:
        return f"{marker} has an invalid version {exc.found!r}"
    if exc.reason == _envelope.NEWER:
        return (
            f"ArrayStore '{path}' has version {exc.found}, newer than this loaderx understands "
            f"({FORMAT_VERSION}): upgrade loaderx"
        )
    if exc.reason == _envelope.UNREADABLE:
        return f"{marker} is damaged or not an ArrayStore marker: {exc}"
    return (
        f"{marker} is damaged ({exc}); loaderx writes it atomically, so something else "
        "changed it: restore the ArrayStore from a backup"
    )


def take_lock(root: str, fs: OsFs) -> int:
    """The root's write lock, or StoreLockedError / StoreReadOnlyError."""
    try:
        return fs.lock(os.path.join(root, LOCK_FILE))
    except (PermissionError, StoreReadOnlyError) as exc:
        error = StoreReadOnlyError(
            f"cannot write ArrayStore '{root}': the directory is read-only (open it for "
            "reading only, or fix its permissions)",
            errno=exc.errno,
        )
        error.outcome = "unchanged"  # type: ignore[attr-defined]
        raise error from None
    except BlockingIOError:
        raise StoreLockedError(
            f"ArrayStore '{root}' is open for writing by another ArrayStore (in this or "
            "another process); one writer at a time: close the other first"
        ) from None


def replay_if_unlocked(root: str, fs: OsFs) -> None:
    """Finishes a commit a crashed writer left, so that readers see whole
    calls, when no live writer holds the lock (a live one finishes its own)."""
    if not fs.exists(os.path.join(root, COMMIT_FILE)):
        return
    try:
        handle = take_lock(root, fs)
    except (StoreLockedError, StoreReadOnlyError):
        return
    try:
        recover(root, fs)
    finally:
        fs.unlock(handle)


def recover(root: str, fs: OsFs) -> None:
    """Finishes what a crashed or failed writer left (see the module docstring)."""
    names = fs.listdir(root)  # one listing finds the record and the leftovers
    record = read_commit_record(root, fs) if COMMIT_FILE in names else None
    if record is not None:
        roll_forward(root, fs, record)  # fsyncs the root before it returns
        names = fs.listdir(root)
    stale = stale_logs(root, fs, names)
    leftovers = [name for name in names if name.startswith(_LEFTOVERS + _TEMPORARIES)]
    if not leftovers and not stale:
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
                clean_leftovers(os.path.join(root, name), fs, sync_first=False)  # the one rule
        elif leftover.startswith(OLD_PREFIX) and not fs.exists(
            os.path.join(root, leftover[len(OLD_PREFIX) :])
        ):
            # An older loaderx's swap cut short.
            fs.rename(path, os.path.join(root, leftover[len(OLD_PREFIX) :]))
        else:
            fs.rmtree(path)
    for log in stale:  # after the fsync above: the swaps that made them stale are durable
        fs.unlink(os.path.join(root, log))
    fs.fsync_dir(root)


def stale_logs(root: str, fs: OsFs, names: list[str]) -> list[str]:
    """The delete logs in the listing ``names`` of ``root`` that name no
    array's directory any more: their array is gone, or their header names
    another generation (a torn header is left: the next drop overwrites it)."""
    stale = []
    for log in names:
        if not log.startswith(DELETES_PREFIX):
            continue
        target = os.path.join(root, log[len(DELETES_PREFIX) :])
        if not fs.exists(target):
            stale.append(log)
            continue
        head = read_header(fs.read_file(os.path.join(root, log), 1024), log)
        if head is not None and head[0] != generation_of(fs, target):
            stale.append(log)
    return stale


# ---- the commit record --------------------------------------------------------------


def write_commit_record(
    root: str, fs: OsFs, content: dict[str, Any], what: str, staged: list[str]
) -> None:
    """Makes the record ``content`` durable at ``COMMIT_FILE``: the commit
    point. On a failure the record is taken back (a failed fsync may have
    persisted it or not) and the staged directories removed, so nothing has
    changed."""
    path = os.path.join(root, COMMIT_FILE)
    try:
        if staged:
            fs.fsync_dir(root)  # the staged entries, durable before the record that names them
        write_file_atomic(path, _envelope.seal(COMMIT_FORMAT, COMMIT_VERSION, content), fs)
    except OSError as exc:
        if fs.exists(path):
            # Renamed in place, the directory fsync failed.
            take_back(root, fs, lambda: fs.unlink(path), what, exc)
        for name in staged:
            with contextlib.suppress(OSError):
                fs.rmtree(os.path.join(root, STAGING_PREFIX + name))
        raise unchanged(what, exc) from exc


def take_back(root: str, fs: OsFs, undo: Callable[[], object], what: str, cause: OSError) -> None:
    """After the fsync that commits a call failed: undoes the commit durably
    (a retried fsync proves nothing about the failed one), or says that the
    outcome is unknown until the next writer replays or discards it."""
    try:
        undo()
        fs.fsync_dir(root)
    except OSError as exc:
        raise ArrayStoreIOError(
            cause.errno,
            f"{what} may or may not have taken effect: making it durable failed ({cause}) and "
            f"taking it back failed ({exc}); reopen the ArrayStore once the disk works: the "
            "call is then applied entirely or not at all",
            "unknown",
        ) from cause


def read_commit_record(root: str, fs: OsFs) -> dict[str, Any] | None:
    """The content (``save``, ``drop``) of the commit record in ``root``,
    None when there is none."""
    path = os.path.join(root, COMMIT_FILE)
    try:
        payload = fs.read_file(path, METADATA_BYTES_MAX + 1)
    except FileNotFoundError:
        return None
    try:
        data = _envelope.unpack_map(payload)
    except EnvelopeError:  # a record with a CRC32 trailer never decodes whole
        data = None
    try:
        if data is not None and _envelope.is_sealed(data):
            version, content = _envelope.unseal(payload, COMMIT_FORMAT, COMMIT_VERSION)
        else:
            version, content = _read_trailer_record(payload)
    except EnvelopeError as exc:
        raise CorruptStoreError(_record_message(exc, path)) from exc
    _check_record(content, int if version == 1 else str, path)
    return content


def _read_trailer_record(payload: bytes) -> tuple[int, dict[str, Any]]:
    """The version and content of a record of versions 1 and 2: the record's
    msgpack map, then its CRC32, little-endian."""
    body, checksum = payload[:-4], payload[-4:]
    if len(payload) < 4 or zlib.crc32(body).to_bytes(4, "little") != checksum:
        raise EnvelopeError(_envelope.CHECKSUM, "its checksum does not match")
    try:
        record = _envelope.unpack_map(body)
    except EnvelopeError as exc:
        raise EnvelopeError(_envelope.BODY, str(exc)) from exc
    found = (record.get("format"), record.get("version"))
    if found[0] != COMMIT_FORMAT or found[1] not in range(1, COMMIT_TRAILER_VERSION_MAX + 1):
        raise EnvelopeError(_envelope.FORMAT, "not a commit record of this loaderx", found)
    return record["version"], record


def _record_message(exc: EnvelopeError, path: str) -> str:
    if exc.reason in (_envelope.CHECKSUM, _envelope.UNREADABLE):
        return (
            f"{path} is damaged (its checksum does not match); loaderx makes it durable before "
            "renaming it into place, so something else changed it: restore the ArrayStore "
            "from a backup"
        )
    if exc.reason == _envelope.BODY:
        return (
            f"{path} passes its checksum but does not decode ({exc}): it was not written by "
            "this loaderx"
        )
    # FORMAT, VERSION or NEWER: another format, or a record of a newer loaderx.
    if isinstance(exc.found, tuple):
        found = exc.found
    elif exc.reason == _envelope.FORMAT:
        found = (exc.found, None)
    else:
        found = (COMMIT_FORMAT, exc.found)
    return (
        f"{path} is not a commit record of this loaderx (format {found[0]!r}, version "
        f"{found[1]!r}): upgrade loaderx"
    )


def _check_record(content: dict[str, Any], identity_type: type, path: str) -> None:
    saves, drops = content.get("save"), content.get("drop")
    if (
        not isinstance(saves, dict)
        or not isinstance(drops, list)
        or not all(
            valid_name(name) and type(identity) is identity_type for name, identity in saves.items()
        )
        or not all(valid_name(name) for name in drops)
    ):
        raise CorruptStoreError(
            f"{path} passes its checksum but its names or directory ids are invalid: it was "
            "not written by this loaderx"
        )


def roll_forward(root: str, fs: OsFs, content: dict[str, Any]) -> None:
    """Applies a durable commit record; each step is skipped when done, so a
    replay after a crash at any point ends in the same state. Deletes the
    record once the steps are durable; the old directories stay (leftovers)."""
    for name, identity in content["save"].items():
        _swap_in_new(root, fs, name, identity)
    for name in content["drop"]:
        target = os.path.join(root, name)
        if fs.exists(target):
            trash = os.path.join(root, DROP_PREFIX + name)
            fs.rmtree(trash)
            fs.rename(target, trash)
    fs.fsync_dir(root)  # every step durable before the record goes
    # No fsync after this unlink: a record that survives a crash is replayed
    # and finds every step done, and the next commit's fsyncs persist it.
    fs.unlink(os.path.join(root, COMMIT_FILE))


def _swap_in_new(root: str, fs: OsFs, name: str, identity: str | int) -> None:
    """Puts the new directory of ``name`` (``identity``: see ``_is_directory``)
    in place with the one swap of ``_fs``, keeping the old one as
    ``.new-<name>`` or ``.prev-<name>``."""
    target = os.path.join(root, name)
    staging = os.path.join(root, STAGING_PREFIX + name)
    if _is_directory(fs, target, identity):
        return
    if not _is_directory(fs, staging, identity):
        raise CorruptStoreError(
            f"the commit record of ArrayStore '{root}' names the new directory of '{name}' "
            f"({identity!r}), but neither '{name}' nor '.new-{name}' is it: something other "
            "than loaderx changed the directory during a commit; restore it from a backup"
        )
    swap_in(staging, target, fs)


def _is_directory(fs: OsFs, path: str, identity: str | int) -> bool:
    """True when the directory at ``path`` is the one a commit record names:
    by generation id (survives a copy), or by inode number (records of
    loaderx before generation ids)."""
    if isinstance(identity, str):
        return generation_of(fs, path) == identity
    return fs.identity(path) == identity


def generation_of(fs: OsFs, path: str) -> str | None:
    """The generation id in the schema file of the array directory ``path``
    (None when it has none, or no schema file)."""
    try:
        payload = fs.read_file(os.path.join(path, SCHEMA_FILE), METADATA_BYTES_MAX + 1)
    except FileNotFoundError:
        return None  # any other error of the disk is the caller's to report
    try:
        data = _envelope.unpack_map(payload)
        if _envelope.is_sealed(data):  # a schema in an envelope: its fields are in the body
            data = _envelope.unpack_map(data["body"])
    except EnvelopeError:  # a damaged schema names no generation; opening the array reports it
        return None
    generation = data.get("generation")
    return generation if isinstance(generation, str) else None
