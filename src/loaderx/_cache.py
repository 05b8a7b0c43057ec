"""The unit cache: a local directory holding units (whole objects, byte
ranges of one, or directories of objects such as a shard's files) fetched
through an ``ObjectSource``, under a hard byte budget, evicting by the
schedule (Belady's MIN) when the future is known.

Invariants, each kept by the code named:

- **The budget.** The sizes of the files under the directory never sum to
  more than ``cache_bytes``. A download first *reserves*: it creates
  ``tmp/<name>.part`` already truncated to the unit's full length (a sparse
  file, so its apparent size counts at once) and only then fetches. The
  directory itself is the ledger: ``usage()`` sums ``units/`` and ``tmp/``,
  so processes sharing it need no other shared counter (``_reserve``).
- **Pins.** A reader holds ``flock(LOCK_SH)`` on the unit's file while it
  reads it; eviction takes ``LOCK_EX | LOCK_NB`` first and skips the unit
  when that fails, so nothing being read is deleted, by this process or
  another. Pins are taken and evictions made only under the directory lock
  (``lock``: ``flock(LOCK_EX)`` plus a thread lock), so the two never race.
- **Whole or absent.** A unit is written into its ``.part`` (whose
  ``LOCK_EX`` says a live downloader owns it), checked (length, SHA-256 when
  known), fsynced and renamed into ``units/``: no half unit is ever visible.
  A ``.part`` whose lock can be taken belongs to a dead process and is
  deleted (at open, and whenever it is met). Two processes never download
  the same unit at once: the second waits for the first's ``.part``.
- **Never stale.** A unit's file name hashes the source URL, the key, the
  object's version (etag, else size and mtime) and the range, so a changed
  object is a different unit; reads pass the etag, so a change mid-read
  fails (RemoteChangedError) rather than mixing versions.
- **Directory units** follow the same rules: the ``.part`` is a directory
  of sparse member files, locked and pinned through the directory's own
  descriptor, renamed into place as one; eviction renames it to
  ``tmp/<name>.dead`` (atomic) before deleting it, so a crash mid-deletion
  leaves no half unit in ``units/``. A *bundled* directory unit (a shard
  uploaded as one object) is fetched by one get of its bundle into memory,
  checked whole (length, SHA-256), and only then written into the member
  files its ``.part`` reserved; the members tile the bundle, so the
  reservation is exactly the bytes fetched.
- **Nothing outside.** The cache deletes only ``units/u-*`` and
  ``tmp/u-*.part`` / ``tmp/u-*.dead`` entries of its own directory.

Eviction: with a plan (the steps to come, each the units it reads together),
evict the unpinned unit whose next use is farthest (Belady's MIN: the fewest
fetches of any policy for equal-size units); units the plan never uses again
go first, least recently used first; without a plan, LRU. Prefetch fetches
the plan's next units in order on a small thread pool, and only into free
space or space held by units needed later than itself.
"""

from __future__ import annotations

import bisect
import concurrent.futures
import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import math
import os
import shutil
import threading
import time
from collections.abc import Iterator, Sequence

from ._fs import OS_FS
from ._remote import ObjectInfo, ObjectSource, RemoteError, RemoteIntegrityError, tiling_problem

UNITS_DIR = "units"
TMP_DIR = "tmp"
LOCK_FILE = "lock"
UNIT_PREFIX = "u-"
PART_SUFFIX = ".part"
DEAD_SUFFIX = ".dead"  # an evicted directory unit, renamed out of units/ before deletion
NEVER = math.inf  # the next use of a unit the plan does not read again
FETCH_ATTEMPTS = 3  # a short or corrupt body is fetched again this often in all
WAIT_SECONDS = 300.0  # the longest a reader waits for another's download or pin
POLL_SECONDS = 0.005
PREFETCH_THREADS = 2
PREFETCH_DEPTH_MAX = 64  # units ahead of the reader, at most
EWMA = 0.2  # weight of the newest sample in the average time per step


class CacheTooSmallError(ValueError):
    """``cache_bytes`` cannot hold what one step reads at once."""


class CacheHeadroomWarning(UserWarning):
    """The steps a loader reads at once need more than half of a remote
    dataset's ``cache_bytes``: it works, but eviction has little room to keep
    what the next steps read again, so shards are fetched more than once."""


class CacheBusyError(TimeoutError):
    """No space could be freed: every unit in the cache is pinned by a reader."""


@dataclasses.dataclass(frozen=True)
class Unit:
    """What the cache holds: ``length`` bytes of object ``key`` from
    ``start`` (``whole``: the whole object, fetched by one get), of the
    object's version ``version``; ``sha256`` (hex), when known, is checked.
    With ``members`` it is a directory: the whole objects under the prefix
    ``key``, each at its path below it (a shard's files, for a store that
    opens a directory), fetched, kept and evicted as one. With ``bundle`` as
    well, the members are ranges of that one object (a bundled shard: each
    member's ``start`` its offset there), fetched by one get of it, checked
    whole, then split into the member files."""

    key: str
    length: int
    version: str
    start: int = 0
    whole: bool = True
    etag: str | None = None
    sha256: str | None = None
    members: tuple[Unit, ...] = ()
    bundle: Unit | None = None

    def __hash__(self) -> int:
        # Computed once: a directory unit hashes all its members, and the
        # loader's plans hash every unit of hundreds of steps.
        cached: int | None = self.__dict__.get("_hash")
        if cached is None:
            cached = (
                hash(dataclasses.astuple(self))
                if not self.members
                else hash((self.key, self.length, self.version, self.members))
            )
            object.__setattr__(self, "_hash", cached)
        return cached

    def __getstate__(self) -> dict[str, object]:
        state = dict(self.__dict__)
        state.pop("_hash", None)  # str hashes differ between processes
        return state

    def name(self, url: str) -> str:
        """The unit's file name: a hash of everything that identifies its bytes
        (kept for the last ``url``: the prefetcher names every unit it looks at)."""
        cached: tuple[str, str] | None = self.__dict__.get("_name")
        if cached is not None and cached[0] == url:
            return cached[1]
        text = "\0".join(
            (
                url,
                self.key,
                self.version,
                str(self.start),
                str(self.length),
                "whole" if self.whole else "range",
            )
        )
        name = UNIT_PREFIX + hashlib.sha256(text.encode()).hexdigest()[:40]
        object.__setattr__(self, "_name", (url, name))
        return name


def object_unit(info: ObjectInfo, sha256: str | None = None) -> Unit:
    """The unit of a whole object, as ``head`` or ``list`` described it. A
    known digest is part of its version: a store without etags (plain HTTP)
    whose object changed at the same size is then another unit, never the
    stale copy."""
    version = info.version if sha256 is None else f"{info.version},sha256={sha256}"
    return Unit(info.key, info.size, version, 0, True, info.etag, sha256)


def range_unit(info: ObjectInfo, start: int, length: int, sha256: str | None = None) -> Unit:
    """The unit of ``length`` bytes of an object from ``start``."""
    if start < 0 or length <= 0 or start + length > info.size:
        raise ValueError(
            f"range {start}+{length} is not inside {info.key} "
            f"({info.size} bytes): give a non-empty range inside it"
        )
    return Unit(info.key, length, info.version, start, False, info.etag, sha256)


def directory_unit(
    prefix: str, infos: Sequence[ObjectInfo], sha256: dict[str, str] | None = None
) -> Unit:
    """The directory unit of the objects ``infos``, all under ``prefix``
    (their keys relative to the source); ``sha256`` maps keys to digests.
    An empty ``prefix`` is every object of the source (a store at its URL)."""
    prefix = prefix.strip("/")
    members = []
    for info in sorted(infos, key=lambda i: i.key):
        if not prefix:
            relative = info.key
        else:
            relative = info.key[len(prefix) + 1 :] if info.key.startswith(prefix + "/") else ""
        parts = relative.split("/")
        if not relative or any(part in ("", ".", "..") for part in parts):
            raise ValueError(
                f"object {info.key!r} is not a file under {prefix!r}: a "
                "directory unit holds only the objects below its prefix"
            )
        members.append(object_unit(info, (sha256 or {}).get(info.key)))
    if not members:
        raise ValueError(f"directory unit {prefix!r} has no objects: list its prefix first")
    version = hashlib.sha256(
        "\0".join(f"{m.key}\0{m.version}" for m in members).encode()
    ).hexdigest()
    return Unit(prefix, sum(m.length for m in members), version, members=tuple(members))


def bundle_unit(
    prefix: str, info: ObjectInfo, sha256: str, layout: dict[str, tuple[int, int]]
) -> Unit:
    """The directory unit of the bundle ``info`` (an object under ``prefix``
    of SHA-256 ``sha256``): the member files of ``layout`` (file name ->
    (offset, size) in the bundle), which must tile it from 0 to its end, so
    the unit's length, what it reserves, is the object's size."""
    problem = tiling_problem(layout, info.size)
    if problem is not None:
        raise ValueError(f"bundle {info.key!r}: {problem}")
    prefix = prefix.strip("/")
    members = [
        Unit(f"{prefix}/{member}", size, info.version, offset, False, info.etag)
        for member, (offset, size) in sorted(layout.items(), key=lambda item: (item[1][0], item[0]))
    ]
    whole = object_unit(info, sha256)
    text = "\0".join(
        [whole.key, whole.version] + [f"{m.key}@{m.start}+{m.length}" for m in members]
    )
    version = hashlib.sha256(f"bundle\0{text}".encode()).hexdigest()
    return Unit(prefix, info.size, version, members=tuple(members), bundle=whole)


class Plan:
    """The future access sequence: ``steps[i]`` are the units step ``i``
    reads (together: all pinned at once). ``next_use`` answers by bisection."""

    def __init__(self, steps: Sequence[Sequence[Unit]]):
        self.steps: list[tuple[Unit, ...]] = []
        self.uses: dict[Unit, list[int]] = {}
        self.extend(steps)

    def extend(self, steps: Sequence[Sequence[Unit]]) -> None:
        """Append more steps (the loader hands the plan over an epoch at a time)."""
        for units in steps:
            step = len(self.steps)
            unique = tuple(dict.fromkeys(units))
            self.steps.append(unique)
            for unit in unique:
                self.uses.setdefault(unit, []).append(step)

    def __len__(self) -> int:
        return len(self.steps)

    def next_use(self, unit: Unit, now: int) -> float:
        """The first step at or after ``now`` that reads ``unit``, or NEVER."""
        uses = self.uses.get(unit)
        if not uses:
            return NEVER
        at = bisect.bisect_left(uses, now)
        return uses[at] if at < len(uses) else NEVER

    def step_bytes(self, step: int) -> int:
        """The bytes step ``step`` needs resident at once."""
        return sum(unit.length for unit in self.steps[step])

    def largest_step(self) -> tuple[int, int]:
        """(step, bytes) of the step that needs the most bytes at once."""
        best = (0, 0)
        for step in range(len(self.steps)):
            need = self.step_bytes(step)
            if need > best[1]:
                best = (step, need)
        return best


@dataclasses.dataclass
class CacheStats:
    """What this process's cache did: ``fetches`` and ``bytes_fetched`` count
    downloads (refetches of bad bodies included), ``hits`` reads that found
    the unit resident, ``waits`` reads that waited for another's download."""

    fetches: int = 0
    bytes_fetched: int = 0
    hits: int = 0
    misses: int = 0
    waits: int = 0
    evictions: int = 0
    prefetches: int = 0
    prefetch_skips: int = 0
    refetches: int = 0
    fetch_seconds: float = 0.0


class LinkEstimate:
    """Latency and bandwidth of the store, fitted to the last SAMPLES fetches
    as ``seconds = latency + bytes / bandwidth`` (least squares). With units
    all of one size the two cannot be told apart; then ``seconds(n)`` is the
    mean fetch time, which is what the depth needs."""

    SAMPLES = 32

    def __init__(self) -> None:
        self.samples: list[tuple[int, float]] = []

    def add(self, size: int, seconds: float) -> None:
        self.samples.append((size, seconds))
        del self.samples[: -self.SAMPLES]

    def fit(self) -> tuple[float, float]:
        """(latency seconds, bandwidth bytes/s); bandwidth is inf when unknown."""
        count = len(self.samples)
        if count == 0:
            return 0.0, math.inf
        mean_n = sum(n for n, _ in self.samples) / count
        mean_t = sum(t for _, t in self.samples) / count
        spread = sum((n - mean_n) ** 2 for n, _ in self.samples)
        slope = (
            sum((n - mean_n) * (t - mean_t) for n, t in self.samples) / spread
            if spread > 0
            else 0.0
        )
        if slope <= 0:
            return mean_t, math.inf
        return max(0.0, mean_t - slope * mean_n), 1.0 / slope

    def seconds(self, size: int) -> float:
        """The expected time of fetching ``size`` bytes (0 before any sample)."""
        latency, bandwidth = self.fit()
        return latency + (size / bandwidth if bandwidth != math.inf else 0.0)


class Pin:
    """A reader's hold on a resident unit: its file cannot be evicted until
    ``release`` (or the end of a ``with`` block). ``read`` reads its bytes."""

    def __init__(self, cache: UnitCache, unit: Unit, path: str, fd: int):
        self.cache = cache
        self.unit = unit
        self.path = path
        self.fd = fd

    def read(self, offset: int = 0, length: int | None = None) -> bytes:
        """``length`` bytes of the unit from ``offset`` (default: to its end)."""
        if self.fd < 0:
            raise ValueError(f"the pin of {self.unit.key} was released: acquire it again")
        if self.unit.members:
            raise ValueError(
                f"{self.unit.key} is a directory unit: read its files under {self.path}"
            )
        count = self.unit.length - offset if length is None else length
        data = os.pread(self.fd, count, offset)
        if len(data) != count:
            raise RemoteIntegrityError(
                f"cached unit {self.path} is short ({len(data)} of {count} bytes at "
                f"{offset}); delete the cache directory and retry",
                self.path,
            )
        return data

    def release(self) -> None:
        """Let the unit be evicted again (closing the descriptor drops the lock)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
            self.cache.unpinned(self.unit)

    def __enter__(self) -> Pin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _try_lock(fd: int, mode: int) -> bool:
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
        return True
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return False
        raise


def _bytes_under(folder: str) -> int:
    """The sizes of the files under ``folder``, recursively (a file or
    directory deleted meanwhile by another process counts as gone)."""
    total = 0
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        total += _bytes_under(entry.path)
                    else:
                        total += entry.stat(follow_symlinks=False).st_size
                except FileNotFoundError:
                    continue
    except FileNotFoundError:
        return 0
    return total


def _remove(path: str) -> None:
    """Delete a file or a directory tree of the cache; gone already is fine."""
    OS_FS.rmtree(path)


def _reserve(part: str, unit: Unit) -> int:
    """Create the ``.part`` of ``unit`` at its full size (sparse) and return
    its descriptor holding LOCK_EX: a file, or for a directory unit a
    directory of its member files. Called under the directory lock, so no
    one sees it before it is locked."""
    if not unit.members:
        fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, unit.length)
        return fd
    os.mkdir(part)
    fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    for member, target in _targets(unit, fd, part):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as f:
            f.truncate(member.length)
    return fd


def _targets(unit: Unit, fd: int, part: str) -> list[tuple[Unit, str]]:
    """(member, its path in the ``.part``) of a directory unit; for a file
    unit [(unit, "")], meaning its bytes go to ``fd`` itself."""
    if not unit.members:
        return [(unit, "")]
    offset = len(unit.key) + 1 if unit.key else 0
    return [(m, os.path.join(part, *m.key[offset:].split("/"))) for m in unit.members]


class UnitCache:
    """Units of ``source`` cached under ``directory`` within ``cache_bytes``.

    ``plan`` (a Plan, or its steps) is the future: with it eviction is
    Belady's MIN and ``acquire(unit, step)`` prefetches what the next steps
    read; without it eviction is LRU and nothing is prefetched. Several
    UnitCache objects, in one process or several, may share ``directory``.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        cache_bytes: int,
        source: ObjectSource,
        *,
        plan: Plan | Sequence[Sequence[Unit]] | None = None,
        prefetch_threads: int = PREFETCH_THREADS,
        wait_seconds: float = WAIT_SECONDS,
        attempts: int = FETCH_ATTEMPTS,
        durable: bool = True,
    ):
        if cache_bytes <= 0:
            raise ValueError(f"cache_bytes must be positive, got {cache_bytes}")
        self.directory = os.fspath(directory)
        self.cache_bytes = int(cache_bytes)
        self.source = source
        self.url = source.url
        self.wait_seconds = wait_seconds
        self.attempts = max(1, attempts)
        self.durable = durable
        self.stats = CacheStats()
        self.plan: Plan | None = None
        self.now = 0
        self._units_dir = os.path.join(self.directory, UNITS_DIR)
        self._tmp_dir = os.path.join(self.directory, TMP_DIR)
        os.makedirs(self._units_dir, exist_ok=True)
        os.makedirs(self._tmp_dir, exist_ok=True)
        self._lock_fd = os.open(
            os.path.join(self.directory, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644
        )
        self._thread_lock = threading.RLock()
        self._lock_depth = 0
        self._names: dict[str, Unit] = {}  # file name -> unit, of units this cache has seen
        self._last_use: dict[str, int] = {}
        self._tick = 0
        self._pinned: dict[Unit, int] = {}  # pins this process holds, by unit
        self._read_now: set[Unit] = set()  # the units the current step has acquired
        self._in_flight: dict[str, threading.Event] = {}  # downloads of this process
        # Units whose prefetch failed: left to the reader's own acquire, which
        # fetches them (and raises), instead of a prefetch retried forever.
        self._prefetch_failed: set[str] = set()
        self.link = LinkEstimate()
        self._step_seconds = 0.0  # EWMA of the time between steps
        self._last_step_time: float | None = None
        self._threads = max(0, prefetch_threads)
        self._pool = (
            concurrent.futures.ThreadPoolExecutor(self._threads, "loaderx-prefetch")
            if self._threads
            else None
        )
        self._closed = False
        try:
            if plan is not None:
                self.set_plan(plan)
            with self.locked():
                self._clean_leftovers()
        except BaseException:
            self.close()  # the lock file and the pool of a cache that never opened
            raise

    # ---- the directory lock and the ledger

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """The directory lock: between threads (the RLock) and processes (flock,
        taken by the outermost holder only: one descriptor's flock does not nest)."""
        with self._thread_lock:
            self._lock_depth += 1
            if self._lock_depth == 1:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                self._lock_depth -= 1
                if self._lock_depth == 0:
                    fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def usage(self) -> int:
        """Bytes of the files under the directory (units and reservations),
        counted under the directory lock: two scans without it can count one
        eviction's victim in ``units/`` and its replacement's ``.part`` in
        ``tmp/`` both, a sum the directory never held."""
        # Closed: the lock file is gone, and no download of ours is under way.
        guard = self.locked() if self._lock_fd >= 0 else contextlib.nullcontext()
        with guard:
            return _bytes_under(self._units_dir) + _bytes_under(self._tmp_dir)

    def _clean_leftovers(self) -> None:
        """Delete the ``.part`` files no live process holds (a killed download)
        and the directory units an evictor renamed away but did not finish deleting."""
        with os.scandir(self._tmp_dir) as entries:
            names = [e.name for e in entries if e.name.startswith(UNIT_PREFIX)]
        for name in names:
            path = os.path.join(self._tmp_dir, name)
            if name.endswith(PART_SUFFIX):
                self._part_alive(path)
            elif name.endswith(DEAD_SUFFIX) and self._unheld(path):
                _remove(path)

    @staticmethod
    def _unheld(path: str) -> bool:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            return _try_lock(fd, fcntl.LOCK_EX)
        finally:
            os.close(fd)

    def _part_alive(self, path: str) -> bool:
        """Whether a live downloader holds the ``.part`` at ``path``; a dead
        one's is deleted. Called under the directory lock."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            if not _try_lock(fd, fcntl.LOCK_EX):
                return True
            _remove(path)
            return False
        finally:
            os.close(fd)

    # ---- the plan

    def set_plan(self, plan: Plan | Sequence[Sequence[Unit]], now: int = 0) -> None:
        """Use ``plan`` from step ``now`` on; CacheTooSmallError when one of its
        steps needs more than the budget at once."""
        plan = plan if isinstance(plan, Plan) else Plan(plan)
        step, need = plan.largest_step()
        if need > self.cache_bytes:
            raise CacheTooSmallError(
                f"cache_bytes={self.cache_bytes} is smaller than the {need} bytes step {step} "
                f"reads at once ({len(plan.steps[step])} units, the largest "
                f"{max(u.length for u in plan.steps[step])} bytes); give cache_bytes of at "
                f"least {need}, or smaller units"
            )
        with self._thread_lock:
            self.plan = plan
            self.now = now
            for unit in plan.uses:
                self._names[unit.name(self.url)] = unit

    def next_use(self, unit: Unit) -> float:
        """The next step that reads ``unit`` (NEVER without a plan); a unit this
        step already read is next needed after this step."""
        if self.plan is None:
            return NEVER
        done = unit in self._read_now and unit not in self._pinned
        return self.plan.next_use(unit, self.now + 1 if done else self.now)

    # ---- reading

    def acquire(self, unit: Unit, step: int | None = None) -> Pin:
        """A pin on ``unit``, fetched first if it is not resident. ``step`` is
        where the reader is in the plan (it drives eviction and prefetch)."""
        if unit.length > self.cache_bytes:
            raise CacheTooSmallError(
                f"cache_bytes={self.cache_bytes} is smaller than unit {unit.key} "
                f"({unit.length} bytes); give cache_bytes of at least {unit.length}"
            )
        if step is not None:
            self._advance(step)
        name = unit.name(self.url)
        with self._thread_lock:
            self._names[name] = unit
            self._prefetch_failed.discard(name)
        deadline = time.monotonic() + self.wait_seconds
        counted = False
        while True:
            pin, fd = self._pin_or_reserve(unit, name, demand=True)
            if pin is not None:
                if not counted:
                    self.stats.hits += 1
                self._pump()
                return pin
            if fd is not None:
                if not counted:
                    self.stats.misses += 1
                pin = self._download(unit, name, fd, keep=True)
                assert pin is not None
                self._pump()
                return pin
            counted = True
            self.stats.waits += 1
            self._wait_for(name, deadline, unit)

    def _advance(self, step: int) -> None:
        now = time.monotonic()
        with self._thread_lock:
            if step != self.now and self._last_step_time is not None:
                sample = (now - self._last_step_time) / max(1, abs(step - self.now))
                self._step_seconds = (
                    sample
                    if self._step_seconds == 0.0
                    else (1 - EWMA) * self._step_seconds + EWMA * sample
                )
            if step != self.now or self._last_step_time is None:
                self._last_step_time = now
                self._read_now.clear()
            self.now = step

    def _wait_for(self, name: str, deadline: float, unit: Unit) -> None:
        """Wait (bounded) for another's download of ``name``, or for a pin to go."""
        event = self._in_flight.get(name)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise CacheBusyError(
                f"waited {self.wait_seconds:.0f} s for {self.url}/{unit.key} in cache "
                f"{self.directory}: another process is downloading it or every unit is "
                "pinned by a reader; raise cache_bytes, or release pins sooner"
            )
        if event is not None:
            event.wait(min(remaining, 1.0))
        else:
            time.sleep(min(remaining, POLL_SECONDS))

    def _pin_or_reserve(self, unit: Unit, name: str, demand: bool) -> tuple[Pin | None, int | None]:
        """Under the directory lock: a pin when the unit is resident, else the
        descriptor of a fresh reservation (``.part``) when space could be made,
        else (None, None): someone is downloading it, or no space is free yet."""
        with self.locked():
            pin = self._pin_resident(unit, name, reader=demand)
            if pin is not None:
                return pin, None
            part = os.path.join(self._tmp_dir, name + PART_SUFFIX)
            if self._part_alive(part):
                return None, None
            if not demand and not self._earlier_ones_coming(unit):
                return None, None
            if not self._make_room(unit, demand):
                if demand:
                    self._raise_if_self_blocked(unit)
                return None, None
            fd = _reserve(part, unit)
            self._in_flight[name] = threading.Event()
            return None, fd

    def _earlier_ones_coming(self, unit: Unit) -> bool:
        """Whether every unit read before ``unit`` from now on is resident or
        being fetched: prefetches keep the plan's order, since one fetched
        past a unit that is missing could be evicted to make room for it."""
        assert self.plan is not None
        first = self.next_use(unit)
        if first == NEVER:
            return False
        for step in range(self.now, int(first)):
            for earlier in self.plan.steps[step]:
                name = earlier.name(self.url)
                if not (
                    os.path.exists(os.path.join(self._units_dir, name))
                    or os.path.exists(os.path.join(self._tmp_dir, name + PART_SUFFIX))
                ):
                    return False
        return True

    def _pin_resident(self, unit: Unit, name: str, reader: bool) -> Pin | None:
        path = os.path.join(self._units_dir, name)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        fcntl.flock(fd, fcntl.LOCK_SH)  # never blocks: evictors hold the directory lock
        return self._pinned_at(unit, name, path, fd, reader)

    def _pinned_at(self, unit: Unit, name: str, path: str, fd: int, reader: bool = True) -> Pin:
        self._tick += 1
        self._last_use[name] = self._tick
        self._pinned[unit] = self._pinned.get(unit, 0) + 1
        if reader:
            # Read at this step once released: only now, while it is pinned, so
            # it is never both unpinned and counted as needed after this step
            # before the reader had it.
            self._read_now.add(unit)
        try:
            os.utime(fd)  # the recency other processes' LRU sees
        except OSError:
            pass  # a read-only mount: recency is then this process's own
        return Pin(self, unit, path, fd)

    def unpinned(self, unit: Unit) -> None:
        """Called by Pin.release."""
        with self._thread_lock:
            count = self._pinned.get(unit, 0) - 1
            if count > 0:
                self._pinned[unit] = count
            else:
                self._pinned.pop(unit, None)

    def _raise_if_self_blocked(self, unit: Unit) -> None:
        """No other process can free what this one pins: fail now, not at the deadline."""
        own = sum(u.length for u in self._pinned)
        if own + unit.length > self.cache_bytes:
            raise CacheBusyError(
                f"cache_bytes={self.cache_bytes} cannot hold {self.url}/{unit.key} "
                f"({unit.length} bytes) next to the {own} bytes this process pins; "
                "release pins before acquiring more, or raise cache_bytes"
            )

    # ---- eviction

    def _make_room(self, unit: Unit, demand: bool) -> bool:
        """Evict until ``unit`` fits, or evict nothing. A prefetch of a unit
        first read at step t evicts only what MIN would evict at t: the
        units of farthest next use from t, and none of them read before t
        (else it waits: fetching early must not cost a fetch). Called under
        the directory lock."""
        free = self.cache_bytes - self.usage()
        if free >= unit.length:
            return True
        at = None if demand else self.next_use(unit)
        held: list[tuple[str, int]] = []  # (name, descriptor holding LOCK_EX)
        try:
            for name, size, needed_sooner in self._victims(at):
                if needed_sooner:
                    return False
                fd = self._lock_victim(name)
                if fd is None:
                    continue
                held.append((name, fd))
                free += size
                if free >= unit.length:
                    for victim, _ in held:
                        self._delete_unit(victim)
                    return True
            return False
        finally:
            for _, fd in held:
                os.close(fd)

    def _victims(self, at: float | None) -> list[tuple[str, int, bool]]:
        """(name, size, needed_sooner) of the unpinned resident units in
        eviction order: farthest next use first (from now, or from step
        ``at`` for a prefetch), NEVER first of all, ties least recently used
        first. ``needed_sooner``: read before (or at) step ``at``."""
        ranked = []
        with os.scandir(self._units_dir) as entries:
            for entry in entries:
                if not entry.name.startswith(UNIT_PREFIX):
                    continue
                try:
                    stat = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                unit = self._names.get(entry.name)
                if unit is not None and unit in self._pinned:
                    continue
                soonest = self.next_use(unit) if unit is not None else NEVER
                sooner = at is not None and soonest <= at
                key = soonest
                if at is not None and unit is not None and self.plan is not None:
                    after = self.plan.next_use(unit, int(at))
                    key = -1.0 if after == at else after  # read at ``at`` itself: keep
                recency = self._last_use.get(entry.name, 0)
                size = (
                    _bytes_under(entry.path)
                    if entry.is_dir(follow_symlinks=False)
                    else stat.st_size
                )
                ranked.append((-key, recency, stat.st_mtime_ns, entry.name, size, sooner))
        ranked.sort()
        return [(name, size, sooner) for _, _, _, name, size, sooner in ranked]

    def _delete_unit(self, name: str) -> None:
        """Delete resident unit ``name`` (its LOCK_EX held). A directory is
        first renamed out of ``units/`` (atomic), so a crash mid-deletion
        leaves no half unit there, only a ``.dead`` leftover in ``tmp/``."""
        path = os.path.join(self._units_dir, name)
        if os.path.isdir(path):
            dead = os.path.join(self._tmp_dir, name + DEAD_SUFFIX)
            os.rename(path, dead)
            shutil.rmtree(dead)
        else:
            os.unlink(path)
        self._last_use.pop(name, None)
        self.stats.evictions += 1

    def _lock_victim(self, name: str) -> int | None:
        """A descriptor holding LOCK_EX on unit ``name``, or None when a reader
        pins it (or it is gone)."""
        try:
            fd = os.open(os.path.join(self._units_dir, name), os.O_RDONLY)
        except FileNotFoundError:
            return None
        if _try_lock(fd, fcntl.LOCK_EX):
            return fd
        os.close(fd)
        return None

    # ---- fetching

    def _download(self, unit: Unit, name: str, fd: int, keep: bool) -> Pin | None:
        """Fetch ``unit`` into its reserved ``.part`` (``fd``, locked), check it,
        and rename it into place; a pin on it when ``keep``. On any failure the
        reservation is deleted and the error raised."""
        part = os.path.join(self._tmp_dir, name + PART_SUFFIX)
        path = os.path.join(self._units_dir, name)
        try:
            for target, data in self._bodies(unit, fd, part):
                written = os.open(target, os.O_WRONLY) if target else fd
                try:
                    os.pwrite(written, data, 0)
                    if self.durable:
                        os.fdatasync(written)
                finally:
                    if target:
                        os.close(written)
            with self.locked():
                os.rename(part, path)
                if not keep:
                    os.close(fd)
                    return None
                # Not atomic (unlock, then lock) but safe: evictions need the lock we hold.
                fcntl.flock(fd, fcntl.LOCK_SH)
                return self._pinned_at(unit, name, path, fd)
        except BaseException:
            with self.locked():
                _remove(part)
                try:
                    os.close(fd)
                except OSError:
                    pass  # already closed above
            raise
        finally:
            event = self._in_flight.pop(name, None)
            if event is not None:
                event.set()

    def _bodies(self, unit: Unit, fd: int, part: str) -> Iterator[tuple[str, bytes | memoryview]]:
        """(path in the ``.part``, or "" for ``fd`` itself; its checked bytes)
        of each file of ``unit``: a member at a time, or for a bundle all of
        them sliced out of its one checked fetch."""
        if unit.bundle is None:
            for member, target in _targets(unit, fd, part):
                yield target, self._fetch_checked(member)
            return
        body = memoryview(self._fetch_checked(unit.bundle))
        for member, target in _targets(unit, fd, part):
            yield target, body[member.start : member.start + member.length]

    def _fetch_checked(self, unit: Unit) -> bytes:
        """The unit's bytes, fetched again when short, long or of the wrong
        SHA-256, up to ``attempts`` times; then RemoteIntegrityError."""
        problem = ""
        for _ in range(self.attempts):
            began = time.monotonic()
            if unit.whole:
                data = self.source.get(unit.key, unit.etag)
            else:
                data = self.source.get_range(unit.key, unit.start, unit.length, unit.etag)
            self._record_fetch(len(data), time.monotonic() - began)
            problem = self._problem(unit, data)
            if not problem:
                return data
            self.stats.refetches += 1
        raise RemoteIntegrityError(
            f"{self.url}/{unit.key}: {problem} after {self.attempts} fetches; the object "
            "or the network corrupts it: check the object, then retry",
            f"{self.url}/{unit.key}",
        )

    @staticmethod
    def _problem(unit: Unit, data: bytes) -> str:
        if len(data) != unit.length:
            return f"received {len(data)} bytes where {unit.length} were expected"
        if unit.sha256 and hashlib.sha256(data).hexdigest() != unit.sha256:
            return "the SHA-256 of the bytes received is not the expected one"
        return ""

    def _record_fetch(self, size: int, seconds: float) -> None:
        with self._thread_lock:
            self.stats.fetches += 1
            self.stats.bytes_fetched += size
            self.stats.fetch_seconds += seconds
            self.link.add(size, seconds)

    # ---- prefetch

    def prefetch_depth(self, unit_bytes: int | None = None) -> int:
        """How many units ahead of the reader to fetch. One fetch of S bytes
        takes L + S / B (latency and bandwidth, fitted to the fetches made);
        the reader takes T per step (measured). By Little's law the fetches
        under way must cover one fetch's time at the reader's pace, so the
        depth is ceil((L + S / B) / T) + 1, at least 1 and at most
        PREFETCH_DEPTH_MAX; before anything is measured, the thread count.
        The budget bounds it too, by reservation: a prefetch that finds no
        room is not made."""
        if not self.link.samples or self._step_seconds == 0.0:
            return max(1, self._threads)
        if unit_bytes is None:
            unit_bytes = sum(n for n, _ in self.link.samples) // len(self.link.samples)
        depth = math.ceil(self.link.seconds(unit_bytes) / self._step_seconds) + 1
        return int(min(PREFETCH_DEPTH_MAX, max(1, depth)))

    def _pump(self) -> None:
        """Submit the plan's next non-resident units, in order, to the pool."""
        if self._pool is None or self.plan is None or self._closed:
            return
        with self._thread_lock:
            wanted = self._upcoming(self.prefetch_depth())
            busy = len(self._in_flight)
            for unit, name in wanted:
                if busy >= self._threads:
                    break
                if name in self._in_flight:
                    continue
                self._in_flight[name] = threading.Event()
                busy += 1
                self._pool.submit(self._prefetch_one, unit, name)

    def _upcoming(self, depth: int) -> list[tuple[Unit, str]]:
        assert self.plan is not None
        found: list[tuple[Unit, str]] = []
        seen: set[str] = set()
        for step in range(self.now, len(self.plan.steps)):
            for unit in self.plan.steps[step]:
                name = unit.name(self.url)
                if name in seen or name in self._prefetch_failed:
                    continue
                seen.add(name)
                if not os.path.exists(os.path.join(self._units_dir, name)):
                    found.append((unit, name))
                    if len(found) >= depth:
                        return found
        return found

    def _prefetch_one(self, unit: Unit, name: str) -> None:
        placeholder = self._in_flight.pop(name, None)
        try:
            pin, fd = self._pin_or_reserve(unit, name, demand=False)
            if pin is not None:
                pin.release()
                return
            if fd is None:
                self.stats.prefetch_skips += 1
                return
            self._download(unit, name, fd, keep=False)
            self.stats.prefetches += 1
        except (RemoteError, OSError):
            # The reader's own acquire fetches it again and raises the error.
            with self._thread_lock:
                self._prefetch_failed.add(name)
        finally:
            if placeholder is not None:
                placeholder.set()
        self._pump()

    def resident(self, unit: Unit) -> bool:
        """Whether ``unit`` is in the cache now."""
        return os.path.exists(os.path.join(self._units_dir, unit.name(self.url)))

    def close(self) -> None:
        """Stop prefetching (waiting for the downloads under way) and let go of the lock file."""
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def __enter__(self) -> UnitCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
