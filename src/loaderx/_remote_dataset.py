"""Datasets in object storage, read through the unit cache (issue #25).

``RemoteStore`` is the store of a ``DenseDataset`` or ``RaggedDataset``
opened from a URL (``s3://``, ``gs://``, ``az://``, ``http(s)://``,
``file://``). It has the read side of ``ShardedStore`` (``len``, ``gather``,
``lengths``, ``gather_rows``, ``stats``, ``verify``, ``refresh``,
``close``, ``schema``, ``manifest``) over a ``UnitCache``:

- a sharded dataset: the manifest is read uncached and checked by
  ``sharded.parse_manifest``; each shard is one ``directory_unit`` of its
  objects (from one listing), or, when the manifest records the shard's
  bundle (one object of its files, ``Manifest.bundles``), one
  ``bundle_unit``: a single get per shard fetch. Every read maps its indices to shards (the
  manifest's cumulative rows), pins those shards (``UnitCache.acquire``
  with the loader's step, see ``reading_step``), gathers with one native
  call over just those shards (``sharded.BatchView``, indices remapped) and
  releases the pins when the batch is copied out;
- a single store (no manifest): one directory unit for the whole store,
  pinned while the dataset is open.

Invariants: a read touches only shards it pinned, and holds its pins only
for its own native call, so the pins held at once are the shards of the
reads in flight (the loader's in-flight steps); an open shard store is
reused only while its directory is the same one (same inode: a unit
evicted and fetched again is reopened); every byte was checked by the cache
(length, SHA-256 when the manifest records one) and by the store itself
(its checksums and sealed superblocks) before it is returned.

This module sits below ``dataset`` and above ``sharded``, ``_cache`` and
``_remote``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import threading
import warnings
from collections.abc import Iterator, Sequence
from typing import Any, Callable

import numpy as np
import numpy.typing as npt

from ._cache import (
    CacheHeadroomWarning,
    CacheTooSmallError,
    Pin,
    Plan,
    Unit,
    UnitCache,
    bundle_unit,
    directory_unit,
)
from ._remote import (
    ObjectInfo,
    ObjectSource,
    RemoteNotFoundError,
    RetryingSource,
    is_remote,
    open_source,
    parse_url,
)
from .schema import SCHEMA_FILE, Schema, read_schema
from .sharded import MANIFEST_FILE, BatchView, Manifest, ManifestError, parse_manifest
from .zrecord import (
    IndexOutOfRangeError,
    StoreClosedError,
    Zrecord,
    ZrecordError,
    as_indices,
    path_identity,
)

__all__ = [
    "CACHE_DIR_ENV",
    "RemoteStore",
    "default_cache_bytes",
    "default_cache_dir",
    "is_remote",
    "make_source",
    "LoaderPlan",
    "reading_step",
]

CACHE_DIR_ENV = "LOADERX_CACHE_DIR"
#: Of the cache file system's free space, the default budget takes at most this share.
FREE_SHARE = 4
#: Steps the loader plans ahead of the consumer; the plan is rebuilt from the
#: consumer's step every PLAN_STEPS // 2 steps, so its memory stays bounded.
PLAN_STEPS = 256
#: Above this share of cache_bytes taken by the steps in flight, the loader
#: warns (CacheHeadroomWarning): measured, 4 workers whose steps in flight
#: need the whole budget refetched 1.34x of the dataset per epoch.
HEADROOM_SHARE = 0.5
#: Frames from LoaderPlan's warning up to the user's DataLoader(...) call.
_WARN_STACKLEVEL = 5
#: Open shard stores kept while unpinned (a reopen costs a few file opens and maps);
#: past this the least recently used unpinned ones are closed, so a store never
#: holds many evicted (deleted but mapped) shards' files.
OPEN_SHARDS_MAX = 16
_STEP = threading.local()
_VIEW_SHARD = re.compile(r"shard (\d+):")


def make_source(url: str, storage_options: dict[str, Any] | None) -> ObjectSource:
    """The source a remote dataset reads through (tests replace this factory)."""
    return RetryingSource(open_source(url, storage_options))


@contextlib.contextmanager
def reading_step(step: int | None) -> Iterator[None]:
    """Reads in this thread belong to loader step ``step``: the cache pins
    with it, so eviction (Belady's MIN) and prefetch follow the loader's plan."""
    before = getattr(_STEP, "step", None)
    _STEP.step = step
    try:
        yield
    finally:
        _STEP.step = before


def default_cache_dir() -> str:
    """$LOADERX_CACHE_DIR, else $XDG_CACHE_HOME/loaderx, else ~/.cache/loaderx."""
    chosen = os.environ.get(CACHE_DIR_ENV)
    if chosen:
        return chosen
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = xdg if xdg else os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "loaderx")


def default_cache_bytes(dataset_bytes: int, step_bytes: int, directory: str) -> int:
    """The smaller of the dataset plus one step's need (every byte is then
    fetched once) and a quarter of the free space of ``directory``'s file
    system (a cache must not fill a disk that checkpoints share)."""
    usage = shutil.disk_usage(directory)
    return max(1, min(dataset_bytes + step_bytes, usage.free // FREE_SHARE))


def _dataset_directory(cache_dir: str, url: str) -> str:
    """The cache's directory for one dataset URL: each dataset has its own
    budget, and every process reading that URL shares it."""
    digest = hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:24]
    return os.path.join(cache_dir, f"d-{digest}")


class _Open:
    """A shard store opened on a pinned unit directory (``identity``: its
    device and inode), and how many reads use it now."""

    def __init__(self, store: Zrecord, path: str, identity: tuple[int, int]) -> None:
        self.store = store
        self.path = path
        self.identity = identity
        self.users = 0


class _Held:
    """A pin this store keeps on a shard, and how many reads use it now."""

    def __init__(self, pin: Pin) -> None:
        self.pin = pin
        self.users = 1


class RemoteStore:
    """The store of a dataset at ``url`` (see the module doc). ``kind`` is
    ``dense`` or ``ragged``; the cache lives in ``cache_dir`` (default
    ``default_cache_dir()``) under ``cache_bytes`` (default
    ``default_cache_bytes``)."""

    _reopen_hint: str

    def __init__(
        self,
        url: str,
        kind: str,
        verify: bool | None = None,
        threads: int = 0,
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_bytes: int | None = None,
        storage_options: dict[str, Any] | None = None,
        source: ObjectSource | None = None,
    ) -> None:
        self.path = url.rstrip("/")
        self._kind = kind
        self._verify = verify
        self._threads = threads
        self._lock = threading.Lock()
        self._open: dict[int, _Open] = {}
        self._held: dict[int, _Held] = {}
        self._closed = False
        self._single_pin: Pin | None = None
        self._plan_base = 0  # the loader step the cache's plan step 0 is
        self._evictions_seen = 0
        self.cache: UnitCache | None = None
        self.source = source if source is not None else make_source(self.path, storage_options)
        self.manifest: Manifest | None = None
        objects = self._objects()
        keys = {info.key for info in objects}
        if MANIFEST_FILE in keys:
            self.manifest = self.manifest or self._read_manifest()
            self.schema: Schema = self.manifest.schema
            self._check_kind(self.schema.kind, "a sharded")
            self.units = _shard_units(self.path, self.manifest, objects)
            rows = self.manifest.rows
        elif SCHEMA_FILE in keys:
            self.units = [directory_unit("", objects)]  # keys are relative to the store
            rows = ()
        else:
            raise RemoteNotFoundError(
                f"{self.path} holds no loaderx dataset (no {MANIFEST_FILE} or {SCHEMA_FILE} under "
                "it): check the URL, or write the dataset there first",
                self.path,
            )
        base = os.fspath(cache_dir) if cache_dir is not None else default_cache_dir()
        directory = _dataset_directory(base, self.path)
        os.makedirs(directory, exist_ok=True)
        largest = max(unit.length for unit in self.units)
        total = sum(unit.length for unit in self.units)
        budget = (
            default_cache_bytes(total, largest, directory) if cache_bytes is None else cache_bytes
        )
        self.cache_base = base  # the cache_dir given or defaulted
        self.cache_directory = directory  # this dataset's part of it
        self.cache_budget = budget
        self.cache = UnitCache(directory, budget, self.source)
        try:
            if self.manifest is None:
                self._open_single()
            else:
                self._row_starts = _starts(rows)
                self._rows = np.asarray(rows, dtype=np.uint64)
        except BaseException:
            self.close()
            raise

    # ---- opening

    def _objects(self) -> list[ObjectInfo]:
        """The dataset's objects: listed, or on a plain HTTP server (which
        cannot list) the files its manifest records, at their recorded sizes
        (each fetch is checked against the recorded SHA-256)."""
        if parse_url(self.path).scheme not in ("http", "https"):
            return self.source.list("")
        try:
            self.manifest = self._read_manifest()
        except RemoteNotFoundError:
            raise RemoteNotFoundError(
                f"{self.path} has no {MANIFEST_FILE}: over http(s) loaderx reads sharded "
                "datasets whose manifest records their files (written by loaderx 1.0 or later); "
                "serve a single store from object storage or file:// instead",
                self.path,
            ) from None
        if self.manifest.files is None:
            raise ManifestError(
                f"{self.path}/{MANIFEST_FILE} records no files, and an http(s) server cannot "
                "list them: commit the dataset again with this loaderx (shards.commit) or "
                "serve it from object storage or file://"
            )
        objects = [ObjectInfo(MANIFEST_FILE, 0, None)]
        bundles = self.manifest.bundles or {}
        for name, files in self.manifest.files.items():
            if name in bundles:
                objects.append(ObjectInfo(f"{name}/{bundles[name].file}", bundles[name].size, None))
                continue
            objects.extend(
                ObjectInfo(f"{name}/{file}", size, None) for file, (size, _) in files.items()
            )
        return objects

    def _read_manifest(self) -> Manifest:
        payload = self.source.get(MANIFEST_FILE)
        return parse_manifest(payload, f"{self.path}/{MANIFEST_FILE}", None)

    def _open_single(self) -> None:
        """Fetch and pin the one store for as long as the dataset is open."""
        assert self.cache is not None
        unit = self.units[0]
        if unit.length > self.cache.cache_bytes:
            raise CacheTooSmallError(
                f"cache_bytes={self.cache.cache_bytes} cannot hold {self.path} ({unit.length} "
                "bytes): a store without shards is cached whole. Write the dataset in shards "
                "(loaderx.shards), or raise cache_bytes"
            )
        self._single_pin = self.cache.acquire(unit)
        path = self._single_pin.path
        schema = read_schema(path)
        if schema is None:
            raise ManifestError(f"{self.path}: {SCHEMA_FILE} is missing from the fetched store")
        self._check_kind(schema.kind, "a")
        self.schema = schema
        store = Zrecord(path, codec=schema.codec, verify=self._verify, threads=self._threads)
        self._open[0] = _Open(store, path, _identity(self._single_pin))
        self._check_records(store, "the store")
        self._row_starts = _starts([len(store)])
        self._rows = np.asarray([len(store)], dtype=np.uint64)

    def _check_kind(self, kind: str, what: str) -> None:
        if self._kind and kind != self._kind:
            other = "RaggedDataset" if kind == "ragged" else "DenseDataset"
            raise ValueError(f"'{self.path}' is {what} {kind} dataset: open it with {other}")

    def _open_shard(self, number: int, pin: Pin) -> Zrecord:
        """The store of shard ``number`` in its pinned directory, checked
        against the manifest as a local shard is."""
        assert self.manifest is not None
        name, count = self.manifest.names[number], self.manifest.rows[number]
        shard_schema = read_schema(pin.path)
        if shard_schema is None:
            raise ManifestError(
                f"'{self.path}': shard {name!r} listed in the manifest is not a loaderx store "
                f"(no {SCHEMA_FILE}): the dataset is incomplete"
            )
        if shard_schema != self.schema:
            raise ManifestError(
                f"'{self.path}': shard {name!r} holds {shard_schema.describe()}, but the manifest "
                f"says {self.schema.describe()}"
            )
        try:
            store = Zrecord(
                pin.path, codec=self.schema.codec, verify=self._verify, threads=self._threads
            )
        except ZrecordError as exc:
            raise type(exc)(
                f"{self.path}/{name}: the shard's objects do not make a sound store ({exc}); the "
                "objects in storage are damaged: write the shard again"
            ) from exc
        try:
            if len(store) != count:
                raise ManifestError(
                    f"'{self.path}': shard {name!r} holds {len(store)} records but the manifest "
                    f"says {count}: the shard or the manifest was changed after commit"
                )
            self._check_records(store, f"shard {name!r}")
        except BaseException:
            store.close()
            raise
        return store

    def _check_records(self, store: Zrecord, what: str) -> None:
        """A dense store's records have the schema's size (checked per shard,
        as it is first opened, instead of over the whole dataset at open)."""
        if self.schema.kind != "dense":
            return
        stats = store.stats()
        if stats["layout"] == "fixed":
            sizes = {stats["record_bytes"]}
        elif stats["records"]:
            sizes = {int(n) for n in store.lengths([0, stats["records"] - 1])}
        else:
            return
        if sizes != {self.schema.item_bytes}:
            raise ValueError(
                f"'{self.path}': {what} holds records of {sorted(sizes)} bytes, but its schema "
                f"says {self.schema.item_bytes} bytes: the store does not match its schema"
            )

    # ---- pins and batch views

    def shards_of(self, indices: npt.NDArray[np.uint64]) -> npt.NDArray[np.intp]:
        """The shard number of each global index."""
        return np.searchsorted(self._row_starts, indices, side="right") - 1

    def units_of(self, indices: npt.NDArray[np.uint64]) -> list[Unit]:
        """The units a read of ``indices`` pins (for the loader's plan)."""
        if self.manifest is None:
            return [self.units[0]]
        return [self.units[int(s)] for s in np.unique(self.shards_of(indices))]

    def _acquire(self, numbers: Sequence[int]) -> list[Pin]:
        """Pins of shards ``numbers`` for one read, marked in use (``_release``).
        A pin outlives its read until a later read misses a shard: then the
        pins no read uses are released before the missing ones are acquired.
        So the pins held are those of the reads in flight plus, until the
        next miss, the last ones' (a random order keeps every shard pinned and
        pins nothing per batch), never more than the in-flight steps need."""
        assert self.cache is not None
        step = getattr(_STEP, "step", None)
        if step is not None:
            step -= self._plan_base  # the step's place in the plan the cache holds
        with self._lock:
            missing = [n for n in numbers if n not in self._held]
            for number in numbers:
                if number in self._held:
                    self._held[number].users += 1
            if missing:
                self._drop_unused(set(numbers))
        got: list[tuple[int, Pin]] = []
        try:
            for number in missing:
                got.append((number, self.cache.acquire(self.units[number], step)))
        except BaseException:
            for _, pin in got:
                pin.release()
            self._release([n for n in numbers if n not in missing])
            raise
        with self._lock:
            for number, pin in got:
                held = self._held.get(number)
                if held is None:
                    self._held[number] = _Held(pin)
                else:  # another thread's read pinned it meanwhile
                    pin.release()
                    held.users += 1
            return [self._held[n].pin for n in numbers]

    def _release(self, numbers: Sequence[int]) -> None:
        """The read of shards ``numbers`` is over (their pins stay, see ``_acquire``)."""
        with self._lock:
            for number in numbers:
                self._held[number].users -= 1

    def _drop_unused(self, keep: set[int]) -> None:
        """Under ``_lock``: release the pins no read uses, but those of ``keep``."""
        for number, held in list(self._held.items()):
            if held.users == 0 and number not in keep:
                held.pin.release()
                del self._held[number]

    def _stores_for(self, numbers: Sequence[int], pins: Sequence[Pin]) -> list[Zrecord]:
        """The open stores of shards ``numbers`` (pinned by ``pins``), opened
        again where the unit is a new directory; each marked in use."""
        stores: list[Zrecord] = []
        with self._lock:
            try:
                for number, pin in zip(numbers, pins):
                    entry = self._open.get(number)
                    identity = _identity(pin)
                    if entry is not None and entry.identity != identity:
                        assert entry.users == 0  # pinned by its users: never evicted meanwhile
                        entry.store.close()
                        entry = None
                    if entry is None:
                        entry = _Open(self._open_shard(number, pin), pin.path, identity)
                    self._open.pop(number, None)
                    self._open[number] = entry  # most recently used last
                    entry.users += 1
                    stores.append(entry.store)
            except BaseException:
                self._done_with(numbers[: len(stores)])
                raise
        return stores

    def _done_with(self, numbers: Sequence[int]) -> None:
        """Called under ``_lock``: the reads of ``numbers`` are over; close
        the least recently used unpinned stores past OPEN_SHARDS_MAX."""
        for number in numbers:
            self._open[number].users -= 1
        assert self.cache is not None
        if self.cache.stats.evictions != self._evictions_seen:
            # This process evicted units: close the stores of those no one uses
            # (their files are deleted but still mapped, outside the budget).
            self._evictions_seen = self.cache.stats.evictions
            for number, entry in list(self._open.items()):
                if entry.users == 0 and path_identity(entry.path) != entry.identity:
                    self._open.pop(number).store.close()
        spare = [n for n, e in self._open.items() if e.users == 0]
        for number in spare[: max(0, len(self._open) - OPEN_SHARDS_MAX)]:
            self._open.pop(number).store.close()

    @contextlib.contextmanager
    def _view(
        self, indices: npt.NDArray[np.uint64]
    ) -> Iterator[tuple[Any, npt.NDArray[np.uint64]]]:
        """(a store over the shards ``indices`` read, the indices remapped to
        it), pinned until the block ends."""
        if self._closed:
            raise_closed(self.path)
        if indices.size and int(indices.max()) >= len(self):
            bad = int(indices[np.argmax(indices >= len(self))])
            raise IndexOutOfRangeError(
                f"index {bad} is out of range for a dataset of {len(self)} records ({self.path})"
            )
        if self.manifest is None:
            yield self._open[0].store, indices
            return
        shard_of = self.shards_of(indices)
        numbers, inverse = np.unique(shard_of, return_inverse=True)
        chosen = [int(n) for n in numbers]
        self._check_read(chosen)
        pins = self._acquire(chosen)
        try:
            stores = self._stores_for(chosen, pins)
            try:
                starts = _starts(self._rows[numbers].tolist())
                remapped = indices - self._row_starts[shard_of] + starts[inverse]
                view = BatchView(stores, starts, self.schema.item_bytes, self.path)
                try:
                    yield view, remapped
                except ZrecordError as exc:
                    raise self._named(exc, chosen) from exc
                finally:
                    view.close()
            finally:
                with self._lock:
                    self._done_with(chosen)
        finally:
            self._release(chosen)

    def _check_read(self, chosen: list[int]) -> None:
        """One read pins all its shards at once: refuse one that cannot fit."""
        assert self.cache is not None
        need = sum(self.units[n].length for n in chosen)
        if need > self.cache.cache_bytes:
            raise CacheTooSmallError(
                f"this read of {self.path} touches {len(chosen)} shards ({need} bytes), which "
                f"are pinned together, but cache_bytes={self.cache.cache_bytes}: read fewer "
                "records at a time (a batch at a time, as the DataLoader does), or raise "
                "cache_bytes"
            )

    def _named(self, exc: ZrecordError, chosen: list[int]) -> ZrecordError:
        """``exc`` of a batch view, its "shard k" (k of the view) named as the
        dataset's shard object, so the error says which object is damaged."""
        assert self.manifest is not None
        names = self.manifest.names
        message = str(exc)
        found = _VIEW_SHARD.match(message)
        if found and int(found.group(1)) < len(chosen):
            where = f"{self.path}/{names[chosen[int(found.group(1))]]}"
            message = f"{where}:{message[found.end() :]}"
        else:
            message = f"{self.path} (shards {', '.join(names[n] for n in chosen)}): {message}"
        return type(exc)(message)

    # ---- the read side of ShardedStore

    def __len__(self) -> int:
        return int(self._row_starts[-1])

    def gather(self, idxs: npt.ArrayLike, dst: Any, offsets: npt.ArrayLike | None = None) -> None:
        """Decodes global records ``idxs`` into ``dst`` (see ``ShardedStore.gather``)."""
        indices = as_indices(idxs)
        if indices.size == 0:
            return
        with self._view(indices) as (view, remapped):
            view.gather(remapped, dst, offsets)

    def lengths(self, idxs: npt.ArrayLike) -> npt.NDArray[np.uint64]:
        """The decoded byte length of each global record in ``idxs``."""
        indices = as_indices(idxs)
        if indices.size == 0:
            return np.empty(0, dtype=np.uint64)
        with self._view(indices) as (view, remapped):
            lengths: npt.NDArray[np.uint64] = view.lengths(remapped)
            return lengths

    def gather_rows(
        self,
        indices: npt.NDArray[np.uint64],
        row_bytes: int,
        target: npt.NDArray[np.uint8] | None,
    ) -> tuple[int, npt.NDArray[np.int64]]:
        """``ShardedStore.gather_rows`` over global records."""
        indices = as_indices(indices)
        if indices.size == 0:
            return 0, np.zeros(1, dtype=np.int64)
        with self._view(indices) as (view, remapped):
            result: tuple[int, npt.NDArray[np.int64]] = view.gather_rows(
                remapped, row_bytes, target
            )
            return result

    def stats(self) -> dict[str, Any]:
        """What the manifest (or the open store) says, without fetching shards:
        ``records``, ``shards``, ``dataset_bytes`` (every object), ``cache_bytes``,
        ``cache_dir``; a single store adds its own stats."""
        assert self.cache is not None
        own = self._open[0].store.stats() if self.manifest is None else {}
        return {
            **own,
            "records": len(self),
            "shards": len(self.units) if self.manifest is not None else 0,
            "dataset_bytes": sum(unit.length for unit in self.units),
            "cache_bytes": self.cache.cache_bytes,
            "cache_dir": self.cache_directory,
        }

    def verify(self, progress: Callable[[int], None] | None = None) -> list[int]:
        """Every record's checksum, fetching one shard at a time within the
        budget; the global indices of damaged records."""
        damaged: list[int] = []
        for number in range(len(self.units)):
            if progress is not None:
                progress(number)
            damaged.extend(self.verify_shard(number))
        return damaged

    def shard_start(self, number: int) -> int:
        """The global index of shard ``number``'s first record."""
        return int(self._row_starts[number])

    def shard_rows(self, number: int) -> int:
        return int(self._rows[number])

    def verify_shard(self, number: int) -> list[int]:
        """The damaged global records of shard ``number`` (fetched, pinned, checked)."""
        if self.manifest is None:
            return self._open[0].store.verify()
        start = int(self._row_starts[number])
        pins = self._acquire([number])
        try:
            store = self._stores_for([number], pins)[0]
            try:
                return [start + index for index in store.verify()]
            finally:
                with self._lock:
                    self._done_with([number])
        finally:
            self._release([number])

    def refresh(self) -> int:
        """A remote dataset does not change while it is open; returns len()."""
        return len(self)

    @property
    def pinned_whole(self) -> bool:
        """A single store: its one unit is pinned while open, no plan needed."""
        return self.manifest is None

    def set_plan(self, plan: Plan, base: int) -> None:
        """Hand the cache the loader's plan, whose step 0 is loader step
        ``base`` (CacheTooSmallError if a step of it does not fit the budget)."""
        assert self.cache is not None
        with self._lock:
            self._plan_base = base
            self.cache.set_plan(plan, 0)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Close the shard stores, release the pins and the cache. Idempotent."""
        with self._lock:
            self._closed = True
            for entry in self._open.values():
                entry.store.close()
            self._open = {}
            for held in self._held.values():
                held.pin.release()
            self._held = {}
        if self._single_pin is not None:
            self._single_pin.release()
            self._single_pin = None
        if self.cache is not None:
            self.cache.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self)} records in {len(self.units)} units"
        return f"RemoteStore({self.path!r}, {state})"


def raise_closed(path: str) -> None:
    raise StoreClosedError(f"remote dataset '{path}' is closed; open it again")


def _identity(pin: Pin) -> tuple[int, int]:
    stat = os.fstat(pin.fd)
    return (stat.st_dev, stat.st_ino)


def _starts(rows: Sequence[int]) -> npt.NDArray[np.uint64]:
    starts = np.zeros(len(rows) + 1, dtype=np.uint64)
    np.cumsum(np.asarray(rows, dtype=np.uint64), out=starts[1:])
    return starts


def shard_sha256(manifest: Manifest, name: str) -> dict[str, str] | None:
    """A shard's file digests from the manifest's per-file ``(size, sha256)``
    map (``Manifest.files``), as directory_unit's key -> digest; None when
    the manifest records none (written before the map existed): the units
    then carry size checks, and the store's own checksums and sealed
    superblocks check the rest."""
    if manifest.files is None:
        return None
    return {f"{name}/{file}": entry[1] for file, entry in manifest.files[name].items()}


def _recorded(url: str, manifest: Manifest, name: str, infos: list[ObjectInfo]) -> list[ObjectInfo]:
    """The objects of shard ``name`` the manifest records, each at its
    recorded size (ManifestError naming the object otherwise); all of them
    when it records none. Objects it does not record are not fetched."""
    if manifest.files is None:
        return infos
    by_key = {info.key: info for info in infos}
    kept = []
    for file, (size, _) in sorted(manifest.files[name].items()):
        info = by_key.get(f"{name}/{file}")
        if info is None or info.size != size:
            found = "missing" if info is None else f"{info.size} bytes"
            raise ManifestError(
                f"'{url}/{name}/{file}' is {found}, but the manifest records {size} bytes: "
                "the dataset was changed after commit; write it again"
            )
        kept.append(info)
    return kept


def _bundled(url: str, manifest: Manifest, name: str, infos: list[ObjectInfo]) -> Unit:
    """The unit of bundled shard ``name``: one object, at its recorded size
    (ManifestError naming it otherwise), split into the recorded files."""
    assert manifest.bundles is not None and manifest.files is not None
    bundle = manifest.bundles[name]
    key = f"{name}/{bundle.file}"
    info = next((info for info in infos if info.key == key), None)
    if info is None or info.size != bundle.size:
        found = "missing" if info is None else f"{info.size} bytes"
        raise ManifestError(
            f"'{url}/{key}' is {found}, but the manifest records {bundle.size} bytes: the "
            "dataset was changed after commit; write it again"
        )
    if SCHEMA_FILE not in bundle.offsets:
        raise ManifestError(
            f"'{url}': shard {name!r} listed in the manifest is not a loaderx store (its "
            f"bundle has no {SCHEMA_FILE}): the dataset is incomplete"
        )
    files = manifest.files[name]
    layout = {file: (offset, files[file][0]) for file, offset in bundle.offsets.items()}
    return bundle_unit(name, info, bundle.sha256, layout)


def _shard_units(url: str, manifest: Manifest, objects: Sequence[ObjectInfo]) -> list[Unit]:
    """Each shard of ``manifest`` as the directory unit of its objects, or of
    its one bundle object (``Manifest.bundles``): fetched by one get."""
    by_shard: dict[str, list[ObjectInfo]] = {name: [] for name in manifest.names}
    for info in objects:
        head = info.key.split("/", 1)[0]
        if head in by_shard and "/" in info.key:
            by_shard[head].append(info)
    units = []
    bundles = manifest.bundles or {}
    for name in manifest.names:
        if name in bundles:
            units.append(_bundled(url, manifest, name, by_shard[name]))
            continue
        infos = _recorded(url, manifest, name, by_shard[name])
        if not any(info.key == f"{name}/{SCHEMA_FILE}" for info in infos):
            raise ManifestError(
                f"'{url}': shard {name!r} listed in the manifest is missing or not a loaderx "
                "store: the dataset is incomplete"
            )
        units.append(directory_unit(name, infos, shard_sha256(manifest, name)))
    return units


class LoaderPlan:
    """The loader's plan for its remote stores: ``reads(step)`` is a pure
    function of the step (the schedule's, or the mixer's, indices) returning
    ``[(store, indices)]``; each store's cache gets the units of the next
    PLAN_STEPS steps, from the consumer's step on. ``in_flight`` steps are
    read at once (the loader's worker threads): the union of any
    ``in_flight`` consecutive steps' units must fit each store's budget, or
    CacheTooSmallError when the plan is made (the loader's construction,
    ``load_state_dict``), never a hang. When it needs more than
    HEADROOM_SHARE of a budget, the first plan (the loader's construction)
    warns with CacheHeadroomWarning."""

    def __init__(
        self,
        stores: Sequence[RemoteStore],
        reads: Callable[[int], list[tuple[RemoteStore, npt.NDArray[np.uint64]]]],
        in_flight: int,
    ) -> None:
        self.stores = [store for store in stores if not store.pinned_whole]
        self.reads = reads
        self.in_flight = max(1, in_flight)
        self.base = -1

    def start(self, step: int) -> None:
        """Plan from ``step`` on (construction, ``load_state_dict``)."""
        if not self.stores:
            return
        steps: dict[int, list[list[Unit]]] = {id(store): [] for store in self.stores}
        for offset in range(PLAN_STEPS):
            touched: dict[int, list[Unit]] = {id(store): [] for store in self.stores}
            for store, indices in self.reads(step + offset):
                if id(store) in touched:
                    touched[id(store)].extend(store.units_of(indices))
            for key, units in touched.items():
                steps[key].append(units)
        building = self.base < 0
        for store in self.stores:
            planned = steps[id(store)]
            self._check_budget(store, planned, step, building)
            store.set_plan(Plan(planned), step)
        self.base = step

    def advance(self, step: int) -> None:
        """The consumer is at ``step``: plan further once half the plan is used."""
        if self.stores and step - self.base >= PLAN_STEPS // 2:
            self.start(step)

    def _check_budget(
        self, store: RemoteStore, planned: list[list[Unit]], first: int, building: bool
    ) -> None:
        """CacheTooSmallError when a window of in-flight steps does not fit the
        budget; when ``building`` (the first plan), CacheHeadroomWarning when
        one needs more than HEADROOM_SHARE of a budget that cannot hold the
        whole dataset (one that can never evicts)."""
        assert store.cache is not None
        budget = store.cache.cache_bytes
        most = (0, 0, 0)  # (bytes, step, shards) of the window that needs the most
        for at in range(len(planned)):
            window = {id(u): u for units in planned[at : at + self.in_flight] for u in units}
            need = sum(unit.length for unit in window.values())
            most = max(most, (need, first + at, len(window)))
            if need > budget:
                largest = max(unit.length for unit in window.values())
                # a random order reads about every shard each step: whole
                # shards then need the dataset's size (the remote guide)
                spread = len(window) * 2 > len(store.units) > 1
                raise CacheTooSmallError(
                    f"cache_bytes={budget} of {store.path} is smaller than the {need} bytes "
                    f"loader step {first + at} reads at once ({len(window)} of its "
                    f"{len(store.units)} shards, the largest {largest} bytes, with "
                    f"{self.in_flight} steps in flight): give cache_bytes of at least {need}, "
                    "fewer num_workers, a smaller batch, or smaller shards"
                    + (
                        "; or an order that reads a few shards per step (mode='block', or "
                        "'sequential') instead of this one, which reads most of them"
                        if spread
                        else ""
                    )
                )
        evicts = sum(unit.length for unit in store.units) > budget  # else nothing is refetched
        if building and evicts and most[0] > HEADROOM_SHARE * budget:
            warnings.warn(
                CacheHeadroomWarning(
                    f"the {self.in_flight} loader steps in flight over {store.path} read up to "
                    f"{most[0]} bytes at once ({most[2]} shards, at step {most[1]}): "
                    f"{most[0] / budget:.0%} of cache_bytes={budget}, so eviction has little "
                    "room to keep the shards the next steps read again, and fetches some of "
                    "them more than once per epoch (4 workers at exactly the budget fetched "
                    f"1.34x the dataset an epoch); give cache_bytes of at least {2 * most[0]}, "
                    "or fewer num_workers, a smaller batch or smaller shards"
                ),
                stacklevel=_WARN_STACKLEVEL,
            )
