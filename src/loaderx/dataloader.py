"""The endless, step-based DataLoader: deterministic, resumable, sharded.

Batch k is a pure function of the configuration and k: the schedule's
indices at step k (the sampler's step k, or read on from an elastic-resume
anchor: ``schedule.py``), each stream gathered at them with one native call
into a fresh array (``streams.py``; with ``weights``, one per source:
``mixing.py``), then ``transform``. So the k-th batch is the same for any
``num_workers`` and any thread timing, and a checkpoint is just the next
step. Packing (``packing.py``) is the one sequential stage: its plans are
made in step order as workers claim steps, and its state, the position in
the token stream after the last delivered batch, goes into the checkpoint.

Threading model. ``num_workers`` threads claim steps in order from a shared
counter, at most ``prefetch_size`` steps ahead of the consumer: a step is
*in flight* from its claim until the consumer takes it, so at most
``prefetch_size`` batches exist at once, and only the batches in flight are
allocated. A worker computes step k (the native calls release the GIL, so
workers overlap) and hands it over under the key k; the consumer takes step
k, in step order, whatever order the workers finish in. The workers start at
the first ``next()``, so ``load_state_dict`` can set the step before any work.
Every size (``num_workers``, ``prefetch_size``, the sampler's) has a range
checked in the constructor (``NUM_WORKERS_MAX``, ``PREFETCH_SIZE_MAX``).

``transform`` runs in the worker threads, concurrently (as in loaderx 0.9): it
must be thread-safe, and it is the collate step (a batch dict in, anything
out). An exception in a worker (the gather or the transform) is kept in its
step's slot and raised from ``next()`` when the consumer reaches that step,
as ``LoaderError`` chained to the original (``__cause__``); the loader is
closed then. ``close()`` wakes every thread and returns within about half a
second even when a transform is stuck (the thread then ends when the
transform returns, discarding its batch). Workers never hold a reference to
the DataLoader itself, so dropping an unclosed loader also stops them.

``num_workers=0`` computes each batch in the consumer's thread (for
debugging a transform). ``transform_processes=True`` runs the transform in
one child process per worker thread instead (``processes.py``), for Python
transforms that hold the GIL; everything else stays in the threads.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import threading
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Callable

import numpy as np
import numpy.typing as npt

from ._cache import CacheTooSmallError
from ._checks import check_flag, check_int, check_state_int
from ._remote_dataset import LoaderPlan, RemoteStore, reading_step
from ._trace import TRACE_BATCHES_MAX, Trace, consumer_name, write_chrome_trace
from .dataset import DenseDataset, RaggedDataset
from .mixing import Mixer, check_sources
from .packing import Packing, make_packer
from .processes import ProcessTransform, check_picklable
from .sampler import STEP_MAX, Sampler, equal_groups
from .schedule import ElasticError, Schedule, elastic_anchor
from .sharded import Manifest, ShardedStore
from .streams import RaggedBatch, reader_for

__all__ = [
    "DataLoader",
    "ElasticError",
    "LoaderError",
    "Packing",
    "RaggedBatch",
    "STATE_VERSION",
    "NUM_WORKERS_MAX",
    "PREFETCH_SIZE_MAX",
    "PROCESS_WORKERS_MAX",
    "TRACE_BATCHES_MAX",
]

#: Version 2 added the global batch and the anchor of an elastic resume;
#: version 1 states (no anchor) still load.
STATE_VERSION = 2
_STATE_VERSIONS = (1, 2)
#: At most this many batches in flight. prefetch_size is a memory budget
#: (every batch in flight is allocated): 1024 batches of 256 x 12 KiB records
#: are 3 GiB, and at a millisecond or more per batch they hide a stall of
#: over a second; past that a larger value only grows memory (10**6 took
#: 6.4 GB and 15 s before the first batch, 10**9 never got there).
PREFETCH_SIZE_MAX = 1024
#: Worker threads. At most prefetch_size steps are in flight, so a worker
#: beyond PREFETCH_SIZE_MAX never gets a step to compute; 1024 threads start
#: in about 0.25 s here (10**4 took 8.6 s to the first batch, 10**6 hung).
NUM_WORKERS_MAX = PREFETCH_SIZE_MAX
#: Worker processes (transform_processes=True): one spawned interpreter per
#: worker, each holding NumPy and the transform (tens of MB). A transform in
#: a process holds that process's GIL for all its time, so children past the
#: cores of a large host (128) only share those cores and cost memory.
PROCESS_WORKERS_MAX = 128
_WORKER_PREFIX = "loaderx-worker-"
_CLOSE_WAIT_SECONDS = 0.5
_STALL_CHECK_SECONDS = 1.0


class LoaderError(RuntimeError):
    """A batch could not be made; ``__cause__`` is the worker's exception and
    ``step`` the step it was computing."""

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


def _identity(batch: Any) -> Any:
    return batch


class _Stats:
    """Counters a long-running loader reports through ``DataLoader.stats()``.
    Stage times are summed over the workers (worker-seconds). With a trace
    (``trace_batches``), every interval summed is also kept in its ring."""

    def __init__(self, trace_batches: int = 0) -> None:
        self.lock = threading.Lock()
        self.batches = 0
        self.stall = 0.0
        self.stages = {"sample": 0.0, "gather": 0.0, "transform": 0.0}
        self.origin = time.perf_counter()
        self.trace = None if trace_batches == 0 else Trace(trace_batches, self.origin)

    def add_stages(self, step: int, *times: float) -> None:
        """Adds one batch's stage times, from the ``perf_counter`` readings
        ``times`` = (started, sampled[, gathered, finished]): sample only for
        a packer's plan, else sample, gather and transform."""
        with self.lock:
            for stage, start, end in zip(self.stages, times, times[1:]):
                self.stages[stage] += end - start
            if self.trace is not None:
                thread = threading.current_thread().name
                if not thread.startswith(_WORKER_PREFIX):
                    thread = consumer_name()
                for stage, start, end in zip(self.stages, times, times[1:]):
                    self.trace.add(thread, stage, step, start, end)

    def add_delivered(self, step: int, started: float, finished: float) -> None:
        with self.lock:
            self.batches += 1
            self.stall += finished - started
            if self.trace is not None:
                self.trace.add(consumer_name(), "wait", step, started, finished)

    def snapshot(self) -> dict[str, float]:
        with self.lock:
            return {
                "batches": self.batches,
                "stall_seconds": self.stall,
                **{f"{stage}_seconds": seconds for stage, seconds in self.stages.items()},
            }

    def trace_rings(self) -> dict[tuple[str, str], list[tuple[int, float, float]]] | None:
        """A copy of the trace's rings, or None when tracing is off."""
        with self.lock:
            return None if self.trace is None else self.trace.copy()


class _Batches:
    """What every step needs: the schedule, the stream readers and the
    transform. Computing a batch touches nothing mutable but the stats
    counters, so any thread may do it."""

    def __init__(
        self,
        schedule: Schedule,
        streams: dict[str, DenseDataset | RaggedDataset],
        transform: Callable[[Any], Any],
        stats: _Stats,
        packer: Any = None,
        mixer: Mixer | None = None,
    ) -> None:
        self.schedule = schedule
        self.transform = transform
        self.stats = stats
        self.packer = packer
        self.mixer = mixer
        self.readers = (
            []
            if packer or mixer
            else [
                (name, reader_for(dataset, schedule.sampler.batch_size))
                for name, dataset in streams.items()
            ]
        )

    def plan(self, step: int) -> Any:
        """The packer's plan of the next step (None without packing). Called in
        step order only: by the consumer inline, else under the pipeline lock
        as a worker claims its step."""
        if self.packer is None:
            return None
        started = time.perf_counter()
        plan = self.packer.plan()
        self.stats.add_stages(step, started, time.perf_counter())
        return plan

    def allocate(self) -> list[Any]:
        """Fresh output arrays for one batch, one per dense stream (None for ragged)."""
        return [reader.allocate() for _, reader in self.readers]

    def compute(
        self,
        step: int,
        plan: Any,
        indices: npt.NDArray[np.uint64],
        outputs: list[Any],
        transform: Callable[[Any], Any] | None = None,
    ) -> Any:
        """Batch ``step`` (with ``plan`` from ``plan()``) gathered into ``outputs``
        (from ``allocate``), then transformed (by ``transform`` when given: a
        worker's ``ProcessTransform``); or raises ``_StepFailure`` saying which
        stage failed."""
        started = sampled = time.perf_counter()
        try:
            with reading_step(step):  # a remote store's cache pins with the step
                batch, sampled = self._read(step, plan, indices, outputs, sampled)
        except BaseException as exc:
            raise _StepFailure(step, "reading the batch", exc) from exc
        gathered = time.perf_counter()
        try:
            result = (transform or self.transform)(batch)
        except BaseException as exc:
            raise _StepFailure(step, "transform", exc) from exc
        self.stats.add_stages(step, started, sampled, gathered, time.perf_counter())
        return result

    def _read(
        self, step: int, plan: Any, indices: npt.NDArray[np.uint64], outputs: list[Any], at: float
    ) -> tuple[Any, float]:
        """Batch ``step`` before its transform, and when its sampling ended."""
        sampled = at
        if plan is not None:
            batch = self.packer.read(plan)
        elif self.mixer is not None:
            choice, parts = self.mixer.sample(step)
            sampled = time.perf_counter()
            batch = self.mixer.read(choice, parts)
        else:
            self.schedule.indices(step, indices)
            sampled = time.perf_counter()
            batch = {
                name: reader.read(indices, out)
                for (name, reader), out in zip(self.readers, outputs)
            }
        return batch, sampled

    def remote_stores(self, streams: list[dict[str, DenseDataset | RaggedDataset]]) -> list[Any]:
        """The remote stores whose caches get a plan."""
        found = {
            id(dataset.store): dataset.store
            for source in streams
            for dataset in source.values()
            if isinstance(dataset.store, RemoteStore)
        }
        return list(found.values())

    def remote_reads(self, step: int) -> list[tuple[Any, npt.NDArray[np.uint64]]]:
        """[(remote store, indices)] step ``step`` reads: a pure function of the
        step. A packed loader's steps here are the packer's chunks of documents
        (the order it reads them in; how many a batch takes depends on lengths)."""
        if self.packer is not None:
            dataset = self.packer.dataset
            if not isinstance(dataset.store, RemoteStore):
                return []
            return [(dataset.store, self.packer.planned_reads(step))]
        if self.mixer is not None:
            _, parts = self.mixer.sample(step)
            return [
                (dataset.store, indices)
                for number, _, indices in parts
                for dataset in self.mixer.sources[number].values()
                if isinstance(dataset.store, RemoteStore)
            ]
        indices = np.empty(self.schedule.sampler.batch_size, dtype=np.uint64)
        self.schedule.indices(step, indices)
        return [
            (reader.dataset.store, indices)
            for _, reader in self.readers
            if isinstance(reader.dataset.store, RemoteStore)
        ]


class _StepFailure(Exception):
    def __init__(self, step: int, stage: str, error: BaseException) -> None:
        super().__init__(step, stage, error)
        self.step = step
        self.stage = stage
        self.error = error

    def loader_error(self) -> LoaderError:
        error = LoaderError(
            f"DataLoader batch {self.step}: {self.stage} raised {type(self.error).__name__}: "
            f"{self.error}",
            self.step,
        )
        error.__cause__ = self.error
        return error


class _Pipeline:
    """The worker threads and the slots they hand batches over in.

    Invariants (under ``lock``): ``next_step <= claimed <= next_step +
    capacity``; ``slots`` maps only finished steps ``next_step <= s <
    claimed`` to their entries; ``len(spare) + claimed - next_step <=
    capacity``, so at most ``capacity`` batches exist at once.

    Output arrays are allocated as they are needed, not ``capacity`` of them
    up front (``prefetch_size=10**6`` used to allocate 6.4 GB before the first
    batch). ``spare`` holds arrays for steps not yet claimed; the consumer's
    thread allocates them (one at the start, and one each time it takes a
    step, while fewer than ``num_workers`` wait and there is room), and
    frees them too, so in the steady state they come from one malloc arena:
    allocated in the workers, each multi-MiB batch came from a per-thread
    arena that glibc trimmed back to the kernel after every batch, and
    page-faulting it in again cost about as much as the gather. A worker
    that finds no spare (while the pipeline fills) allocates its own.
    """

    def __init__(
        self,
        batches: _Batches,
        num_workers: int,
        capacity: int,
        first_step: int,
        processes: bool = False,
    ) -> None:
        self.batches = batches
        self.capacity = capacity
        self.lock = threading.Lock()
        self.ready = threading.Condition(self.lock)  # the consumer waits for its step
        self.space = threading.Condition(self.lock)  # workers wait for room to claim
        self.num_workers = num_workers
        self.slots: dict[int, tuple[int, Any, _StepFailure | None, Any]] = {}
        self.spare: list[list[Any]] = [batches.allocate()]
        self.next_step = first_step
        self.claimed = first_step
        self.first_step = first_step
        self.closed = False
        # With processes, each thread hands its batches to its own child.
        self.runners: list[ProcessTransform] = []
        try:
            for _ in range(num_workers if processes else 0):
                self.runners.append(ProcessTransform(batches.transform))
        except BaseException:
            self._close_runners()
            raise
        self.threads = [
            threading.Thread(
                target=self._work,
                args=(self.runners[number] if processes else None,),
                name=f"{_WORKER_PREFIX}{number}",
                daemon=True,
            )
            for number in range(num_workers)
        ]
        for thread in self.threads:
            thread.start()

    def _work(self, runner: ProcessTransform | None) -> None:
        indices = np.empty(self.batches.schedule.sampler.batch_size, dtype=np.uint64)
        while True:
            with self.lock:
                while not self.closed and (
                    self.claimed >= self.next_step + self.capacity or self._first_in_flight()
                ):
                    self.space.wait()
                if self.closed:
                    return
                step = self.claimed
                self.claimed += 1
                outputs = self.spare.pop() if self.spare else None
                try:
                    plan = self.batches.plan(step)
                except BaseException as exc:
                    plan = _StepFailure(step, "planning the batch", exc)
            try:
                if isinstance(plan, _StepFailure):
                    raise plan
                if outputs is None:
                    outputs = self._allocate(step)
                entry: tuple[int, Any, _StepFailure | None, Any] | None = (
                    step,
                    self.batches.compute(step, plan, indices, outputs, runner),
                    None,
                    plan,
                )
            except _StepFailure as failure:
                entry = (step, None, failure, None)
            with self.lock:
                if self.closed:
                    return
                assert entry is not None and step not in self.slots
                self.slots[step] = entry
                self.ready.notify()
                if step == self.first_step:
                    self.space.notify_all()  # the prefetching may start
            entry = outputs = None

    def _first_in_flight(self) -> bool:
        """True while the first step is being computed: it runs alone, with all
        the native threads, so the first batch arrives after one batch's time
        rather than after ``num_workers`` batches computed side by side."""
        return (
            self.claimed > self.first_step
            and self.next_step == self.first_step
            and self.first_step not in self.slots
        )

    def _allocate(self, step: int) -> list[Any]:
        """A worker's own output arrays, when the consumer left no spare."""
        try:
            return self.batches.allocate()
        except BaseException as exc:
            raise _StepFailure(step, "allocating the batch", exc) from exc

    def take(self) -> tuple[Any, Any]:
        """The next step's batch and its plan, in step order; raises ``_StepFailure``."""
        with self.lock:
            while True:
                if self.closed:
                    raise RuntimeError("the DataLoader was closed")
                step = self.next_step
                if step in self.slots:
                    break
                if not self.ready.wait(_STALL_CHECK_SECONDS) and not any(
                    thread.is_alive() for thread in self.threads
                ):
                    raise RuntimeError(
                        "the DataLoader's worker threads are gone (was the interpreter shutting "
                        "down?)"
                    )
            entry_step, batch, failure, plan = self.slots[step]
            assert entry_step == step, (entry_step, step)
            if failure is not None:
                raise failure
            del self.slots[step]
            self.next_step = step + 1
            # Replaces the batch handed out while workers could use it, within the budget.
            if len(self.spare) < min(
                self.num_workers, self.capacity - (self.claimed - self.next_step)
            ):
                self.spare.append(self.batches.allocate())
            assert len(self.spare) + self.claimed - self.next_step <= self.capacity
            self.space.notify()
        return batch, plan

    def _close_runners(self) -> None:
        for runner in self.runners:
            runner.close()

    def queue_depth(self) -> int:
        """Batches ready and waiting for the consumer."""
        with self.lock:
            return len(self.slots)

    def close(self) -> None:
        with self.lock:
            if not self.closed:
                self.closed = True
                self.slots = {}
                self.spare = []
                self.space.notify_all()
                self.ready.notify_all()
        self._close_runners()
        deadline = time.monotonic() + _CLOSE_WAIT_SECONDS
        current = threading.current_thread()
        for thread in self.threads:
            if thread is not current:
                thread.join(max(0.0, deadline - time.monotonic()))


class DataLoader:
    """An endless iterator of batches ``transform({name: array})``.

    ``streams`` is ``{name: DenseDataset | RaggedDataset}`` of equal length;
    every stream is gathered at the same indices, so record i lines up across
    them. A dense stream's array is ``(batch_size, *item_shape)``, a ragged
    stream's a ``RaggedBatch`` (flat values plus offsets). ``mode`` is a
    ``Sampler.Mode`` (or its int: 0 SEQUENTIAL, 1 IID, 2 CYCLIC, 3 BLOCK) and ``seed``
    its seed; ``shard=(rank, world_size)`` gives this process its share of
    every global batch (``batch_size`` is the share). At most
    ``prefetch_size`` batches are in flight. Batch k is the sampler's step k
    for any ``num_workers``; ``state_dict()`` / ``load_state_dict()`` resume
    exactly, also with another world size or global batch where the mode
    allows it (see ``load_state_dict``).

    BLOCK mode's groups are the shards of the first sharded stream (every
    sharded stream must have the same shard row counts), or for single
    stores ``equal_groups(length)``: 64 contiguous ranges of equal size;
    ``shards_per_block`` (BLOCK only) is the number of groups per block.

    ``trace_batches=N`` (default 0, off) keeps the last N intervals of each
    worker and stage for ``trace(path)``, a Chrome trace of where the time went.
    """

    def __init__(
        self,
        streams: Mapping[str, DenseDataset | RaggedDataset]
        | Sequence[Mapping[str, DenseDataset | RaggedDataset]],
        num_workers: int = 4,
        batch_size: int = 256,
        prefetch_size: int = 4,
        mode: Sampler.Mode | int | str = 1,
        seed: int = 42,
        transform: Callable[[dict[str, Any]], Any] = _identity,
        shard: tuple[int, int] | None = None,
        packing: Packing | None = None,
        weights: Sequence[float] | npt.NDArray[np.floating[Any]] | None = None,
        transform_processes: bool = False,
        shards_per_block: int | None = None,
        trace_batches: int = 0,
    ) -> None:
        sources = None
        if weights is not None:
            sources = _check_sources(streams)
            streams = sources[0]
        self._streams = _check_streams(streams)
        self._num_workers = check_int("num_workers", num_workers, 0, NUM_WORKERS_MAX)
        self._prefetch_size = check_int("prefetch_size", prefetch_size, 1, PREFETCH_SIZE_MAX)
        self._processes = _check_transform(transform, transform_processes, self._num_workers)
        length = len(next(iter(self._streams.values())))
        blocks = _block_keywords(self._streams, mode, shards_per_block, length, sources)
        self._sampler = Sampler(length, batch_size, mode, seed=seed, shard=shard, **blocks)
        self._block_state = None if blocks.get("groups") is None else _block_state(self._sampler)
        self._stats = _Stats(check_int("trace_batches", trace_batches, 0, TRACE_BATCHES_MAX))
        packer = None
        if packing is not None:
            if sources is not None:
                raise ValueError(
                    "packing and weights do not combine yet: pack one ragged stream, or mix "
                    "unpacked sources"
                )
            name, dataset = _packed_stream(packing, self._streams)
            packer = make_packer(packing, name, dataset, self._sampler)
        mixer: Mixer | None = None
        if sources is not None:
            # weights is not None whenever sources is not
            mixer = Mixer(sources, weights, batch_size, mode, seed, shard)  # type: ignore[arg-type]
        self._batches = _Batches(
            Schedule(self._sampler), self._streams, transform, self._stats, packer, mixer
        )
        self._packing_state = None if packer is None else packer.state()
        self._step = 0
        self._plan = self._remote_plan(sources)
        self._plan_error: CacheTooSmallError | None = None
        self._pipeline: _Pipeline | None = None
        self._finalizer: weakref.finalize[[], DataLoader] | None = None
        self._indices: npt.NDArray[np.uint64] | None = None
        self._failure: _StepFailure | None = None
        self._closed = False

    def _remote_plan(self, sources: list[Any] | None) -> LoaderPlan:
        """Remote streams: their caches get the schedule's next steps (Belady's
        MIN evicts by it); a budget too small for the steps in flight fails here."""
        in_flight = min(max(1, self._num_workers), self._prefetch_size)
        plan = LoaderPlan(
            self._batches.remote_stores(sources or [self._streams]),
            self._batches.remote_reads,
            in_flight + (self._batches.packer is not None),  # and the chunk being planned
        )
        plan.start(self._plan_position())
        return plan

    def _plan_position(self) -> int:
        """Where the remote plan starts: the step, or a packer's next chunk."""
        packer = self._batches.packer
        return self._step if packer is None else packer.chunk_of(packer.state())

    # -- iteration ---------------------------------------------------------------

    def __iter__(self) -> DataLoader:
        return self

    def __next__(self) -> Any:
        if self._plan_error is not None:
            raise self._plan_error
        if self._failure is not None:
            raise self._failure.loader_error() from self._failure.error
        if self._closed:
            raise RuntimeError(
                "the DataLoader is closed: create a new one (load_state_dict resumes where this "
                "one was)"
            )
        started = time.perf_counter()
        try:
            batch, plan = self._take()
        except _StepFailure as failure:
            self.close()
            if not isinstance(failure.error, Exception):
                # KeyboardInterrupt, SystemExit: not a batch failure, so not a LoaderError. It
                # goes on as it was raised, its own cause kept and the internal wrapper hidden.
                raise failure.error from failure.error.__cause__
            self._failure = failure
            raise failure.loader_error() from failure.error
        self._stats.add_delivered(self._step, started, time.perf_counter())
        self._step += 1
        try:
            self._plan.advance(self._plan_position())
        except CacheTooSmallError as exc:
            self._plan_error = exc  # raised by the next next(), not instead of this batch
        if plan is not None:
            self._packing_state = plan.state_after
        return batch

    next = __next__

    def _take(self) -> tuple[Any, Any]:
        if self._num_workers == 0:
            if self._indices is None:
                self._indices = np.empty(self._sampler.batch_size, dtype=np.uint64)
            try:
                plan = self._batches.plan(self._step)
            except BaseException as exc:
                raise _StepFailure(self._step, "planning the batch", exc) from exc
            return self._batches.compute(
                self._step, plan, self._indices, self._batches.allocate()
            ), plan
        if self._pipeline is None:
            self._pipeline = _Pipeline(
                self._batches, self._num_workers, self._prefetch_size, self._step, self._processes
            )
            self._finalizer = weakref.finalize(self, self._pipeline.close)
        return self._pipeline.take()

    def __reduce__(self) -> tuple[Any, ...]:
        raise TypeError(
            "a DataLoader runs threads in this process and cannot be pickled: pass its datasets "
            "(they pickle as their paths) and its state_dict() to the other process and build a "
            "DataLoader there"
        )

    def __len__(self) -> int:
        raise TypeError(
            "a DataLoader is endless (step-based): it has no len(); count the steps you take"
        )

    # -- epochs (CYCLIC, BLOCK) -------------------------------------------------------

    def _cyclic_schedule(self) -> Schedule:
        if self._sampler.mode not in (Sampler.Mode.CYCLIC, Sampler.Mode.BLOCK):
            raise ValueError(
                "epochs exist in CYCLIC and BLOCK mode only (each cycle is one pass without "
                f"replacement); this loader samples {self._sampler.mode.name}"
            )
        if self._batches.packer is not None or self._batches.mixer is not None:
            raise ValueError(
                "a packed or mixed loader has no epochs: its batches are not whole passes over one "
                "dataset (count steps, or the packer's position in its state_dict)"
            )
        return self._batches.schedule

    @property
    def epoch(self) -> int:
        """CYCLIC, BLOCK: the epoch (cycle) of the batch the next ``next()`` returns."""
        return self._cyclic_schedule().epoch(self._step)

    @property
    def steps_per_epoch(self) -> int:
        """CYCLIC, BLOCK: batches in a whole epoch, ``length // (batch_size * world_size)``
        (the remaining ``length % (batch_size * world_size)`` records of each epoch
        are dropped, different ones each epoch, so every batch is whole)."""
        return self._cyclic_schedule().batches_per_cycle

    def one_epoch(self) -> Iterator[Any]:
        """CYCLIC, BLOCK: yields the batches left in the current epoch, then stops; the
        loader stays open, and the next call yields the next epoch."""
        schedule = self._cyclic_schedule()
        epoch = schedule.epoch(self._step)
        while schedule.epoch(self._step) == epoch:
            yield next(self)

    # -- observability -------------------------------------------------------------

    def stats(self) -> dict[str, float]:
        """Counters since this loader was created: ``batches`` delivered,
        ``stall_seconds`` the consumer spent inside ``next()`` waiting,
        ``queue_depth`` batches ready now, and ``sample_seconds``,
        ``gather_seconds``, ``transform_seconds`` summed over the workers."""
        pipeline = self._pipeline
        return {
            "step": self._step,
            **self._stats.snapshot(),
            "queue_depth": 0 if pipeline is None else pipeline.queue_depth(),
        }

    def trace(self, path: str | os.PathLike[str]) -> int:
        """Writes the trace, the last ``trace_batches`` intervals of each
        worker and stage (``sample``, ``gather``, ``transform``; the
        consumer's ``wait`` in ``next()``), to ``path`` as Chrome trace JSON
        (opens in Perfetto or chrome://tracing); returns the number of
        intervals written. Times are microseconds since the loader was made."""
        rings = self._stats.trace_rings()
        if rings is None:
            raise ValueError(
                "this DataLoader keeps no trace: create it with trace_batches=N (e.g. 256) to "
                "keep the last N intervals of each worker and stage"
            )
        return write_chrome_trace(path, rings, self._stats.origin)

    def cache_stats(self) -> dict[str, dict[str, float]]:
        """For each dataset this loader reads from a URL (by its URL): its
        cache's counters (``fetches``, ``bytes_fetched``, ``hits``, ``misses``,
        ``evictions``, ...), ``bytes_resident`` (the cache directory's files)
        and ``cache_bytes`` (its budget). Empty without remote datasets."""
        sources = self._batches.mixer.sources if self._batches.mixer else [self._streams]
        return {
            store.path: cache_state(store)
            for store in self._batches.remote_stores(sources)
            if store.cache is not None
        }

    # -- lifetime ------------------------------------------------------------------

    def close(self) -> None:
        """Stops the workers and drops prefetched batches; returns promptly. Idempotent."""
        self._closed = True
        if self._finalizer is not None:
            self._finalizer()

    @property
    def closed(self) -> bool:
        """True once ``close()`` ran (or a failed step closed the loader)."""
        return self._closed

    def __enter__(self) -> DataLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- checkpoints ----------------------------------------------------------------

    @property
    def step(self) -> int:
        """The step of the batch the next ``next()`` returns."""
        return self._step

    def state_dict(self) -> dict[str, Any]:
        """A small versioned dict: the next step, and the configuration it belongs to."""
        return {
            "version": STATE_VERSION,
            "step": self._step,
            "seed": self._sampler.seed,
            "mode": int(self._sampler.mode),
            "batch_size": self._sampler.batch_size,
            "shard": _shard_key(self._sampler.shard),
            "length": self._sampler.length,
            "global_batch": self._batches.schedule.global_batch,
            "anchor": self._batches.schedule.anchor,
            **({} if self._block_state is None else {"block": self._block_state}),
            **({} if self._packing_state is None else {"packing": self._packing_state}),
            **(
                {}
                if self._batches.mixer is None
                else {
                    "mixing": {
                        "weights": self._batches.mixer.weights.tolist(),
                        "lengths": self._batches.mixer.lengths,
                    }
                }
            ),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continues from ``state`` (from ``state_dict()``) with exactly the batch
        that would have come next. Call it on a loader that has not started.

        Seed, mode and length (and in BLOCK mode the groups and
        ``shards_per_block``) must match. The world size may differ as long as
        the global batch (``batch_size * world_size``) is the same: the global
        stream is then identical. A different global batch continues the same
        global order from the exact next sample in SEQUENTIAL, CYCLIC and BLOCK
        mode (elastic resume); in IID mode it raises ``ElasticError``. Pass the state
        as ``state_dict()`` returned it: this loader's own ``shard`` and
        ``batch_size`` apply, and a state whose ``batch_size`` or ``shard`` was
        edited (so that they no longer make its ``global_batch``) is refused.
        """
        if self._pipeline is not None or self._step != 0 or self._closed:
            raise RuntimeError(
                "load_state_dict must be called before iterating: create a new DataLoader and load "
                "the state into it"
            )
        if not isinstance(state, Mapping):
            raise TypeError(
                f"state must be a dict from DataLoader.state_dict(), got {type(state).__name__}"
            )
        if state.get("version") not in _STATE_VERSIONS:
            raise ValueError(
                f"state has version {state.get('version')!r}; this loaderx reads versions "
                f"{_STATE_VERSIONS}"
            )
        mine = self._sampler
        saved = _saved_sampler(state, mine)
        differences = [
            f"{key}={getattr(saved, key)!r} (this loader: {getattr(mine, key)!r})"
            for key in ("seed", "mode", "length")
            if getattr(saved, key) != getattr(mine, key)
        ]
        if differences:
            raise ValueError(
                "state was saved by a differently configured DataLoader: " + ", ".join(differences)
            )
        step = check_state_int("state step", state["step"], STEP_MAX)
        saved_schedule = Schedule(saved, state.get("anchor"))
        if saved_schedule.anchor is not None and saved_schedule.anchor["step"] > step:
            raise ValueError(
                f"state step {step} comes before its anchor's step "
                f"{saved_schedule.anchor['step']}: the state is damaged"
            )
        _check_global_batch(state, saved_schedule)
        _check_mixing(state, self._batches.mixer, saved_schedule)
        packer = self._batches.packer
        if (packer is None) != ("packing" not in state):
            raise ValueError(
                "state and loader disagree on packing: resume a packed loader's state with the "
                "same packing"
            )
        if packer is not None:
            # The packed stream is a token position, whatever the global batch.
            packer.load(state["packing"])
            self._packing_state = packer.state()
        else:
            anchor = elastic_anchor(saved_schedule, step, self._batches.schedule)
            self._batches.schedule = Schedule(mine, anchor)
        self._step = step
        self._plan.start(self._plan_position())

    def __repr__(self) -> str:
        names = ", ".join(self._streams)
        return (
            f"DataLoader([{names}], num_workers={self._num_workers}, "
            f"batch_size={self._sampler.batch_size}, prefetch_size={self._prefetch_size}, "
            f"mode={self._sampler.mode.name}, seed={self._sampler.seed}, "
            f"shard={self._sampler.shard}) at step {self._step}"
        )


def cache_state(store: RemoteStore) -> dict[str, float]:
    """A remote store's cache counters, resident bytes and budget."""
    assert store.cache is not None
    return {
        **dataclasses.asdict(store.cache.stats),
        "bytes_resident": store.cache.usage(),
        "cache_bytes": store.cache.cache_bytes,
    }


def _check_transform(transform: object, processes: object, num_workers: int) -> bool:
    """The transform and ``transform_processes`` checked; returns the flag."""
    if not callable(transform):
        raise TypeError(
            "transform must be callable (a batch dict in, a batch out), got "
            f"{type(transform).__name__}"
        )
    flag = check_flag("transform_processes", processes)
    if flag:
        if num_workers == 0:
            raise ValueError(
                "transform_processes=True runs the transform in the workers' processes: set "
                "num_workers >= 1"
            )
        check_int("num_workers with transform_processes=True", num_workers, 1, PROCESS_WORKERS_MAX)
        check_picklable(transform)
    return flag


def _saved_sampler(state: Mapping[str, Any], mine: Sampler) -> Sampler:
    """The sampler a state was saved with, rebuilt (which also validates it).
    A BLOCK state records its groups by digest: they must be this loader's."""
    missing = sorted({"step", "seed", "mode", "batch_size", "shard", "length"} - set(state))
    if missing:
        raise ValueError(f"state lacks {', '.join(missing)}")
    block = state.get("block")
    if (block is not None) != _is_block(state["mode"]):
        raise ValueError(
            f"state mode {state['mode']!r} and its BLOCK groups {block!r} disagree: the state is "
            "damaged"
        )
    keywords: dict[str, Any] = {}
    if block is not None:
        if mine.groups is None:
            raise ValueError(
                f"state was saved by a differently configured DataLoader: mode=BLOCK (this "
                f"loader: {mine.mode.name})"
            )
        if block != (mine_state := _block_state(mine)):
            raise ValueError(
                f"state was saved in BLOCK mode with groups {block!r}, this loader's are "
                f"{mine_state!r}: resume over the same shards with the same shards_per_block"
            )
        keywords = mine.block_options
    try:
        return Sampler(
            state["length"],
            state["batch_size"],
            state["mode"],
            seed=state["seed"],
            shard=state["shard"],
            **keywords,
        )
    except (TypeError, ValueError) as exc:
        raise ValueError(f"state does not describe a valid sampler: {exc}") from exc


def _is_block(mode: object) -> bool:
    """Whether ``mode`` (as a loader or state takes it) names BLOCK."""
    if isinstance(mode, str):
        return mode.upper() == Sampler.Mode.BLOCK.name
    return not isinstance(mode, bool) and mode == Sampler.Mode.BLOCK


def _block_keywords(
    streams: dict[str, DenseDataset | RaggedDataset],
    mode: object,
    shards_per_block: int | None,
    length: int,
    sources: object,
) -> dict[str, Any]:
    """The Sampler keywords of BLOCK mode's groups: the sharded streams' shards
    (which must agree), else ``equal_groups(length)``. Other modes get only a
    ``shards_per_block`` that was given, which the Sampler refuses."""
    if not _is_block(mode):
        return {} if shards_per_block is None else {"shards_per_block": shards_per_block}
    if sources is not None:
        raise ValueError(
            "mode BLOCK does not combine with weights yet: each source would need its own "
            "groups. Mix in mode CYCLIC or IID"
        )
    layouts = {  # a sharded dataset's shards, local or remote
        name: tuple(rows for rows in manifest.rows if rows > 0)
        for name, manifest in _manifests(streams).items()
    }
    if len(set(layouts.values())) > 1:
        found = ", ".join(f"{name}: {len(rows)} shards" for name, rows in layouts.items())
        raise ValueError(
            f"mode BLOCK reads the streams' shards together, but their shard row counts differ "
            f"({found}): write the streams with the same shards, or use mode CYCLIC"
        )
    groups = next(iter(layouts.values())) if layouts else equal_groups(length)
    return {"groups": groups, "shards_per_block": shards_per_block}


def _manifests(streams: Mapping[str, DenseDataset | RaggedDataset]) -> dict[str, Manifest]:
    """The manifests of the sharded streams (local or at a URL), by name."""
    found = {}
    for name, dataset in streams.items():
        store = dataset.store
        if isinstance(store, ShardedStore) or (
            isinstance(store, RemoteStore) and store.manifest is not None
        ):
            assert store.manifest is not None
            found[name] = store.manifest
    return found


def _block_state(sampler: Sampler) -> dict[str, Any]:
    """What a state records of a BLOCK sampler's groups: their number, a digest
    of their row counts, and the groups per block."""
    assert sampler.groups is not None
    rows = np.asarray(sampler.groups, dtype="<u8").tobytes()
    return {
        "groups": len(sampler.groups),
        "groups_sha256": hashlib.sha256(rows).hexdigest(),
        "shards_per_block": sampler.shards_per_block,
    }


def _check_global_batch(state: Mapping[str, Any], schedule: Schedule) -> None:
    """A state's ``global_batch`` is what its ``batch_size`` and ``shard`` made
    when it was saved. They disagree when someone edited the state, as an
    older README's Scaling-out recipe told users to: that is not needed, and
    with another global batch it would misplace the resume point."""
    recorded = state.get("global_batch", schedule.global_batch)
    if isinstance(recorded, bool) or not isinstance(recorded, (int, np.integer)):
        raise ValueError(
            f"state global_batch must be an int, got {recorded!r}: the state is damaged"
        )
    if recorded != schedule.global_batch:
        raise ValueError(
            f"state global_batch {recorded} is not its batch_size * world_size = "
            f"{schedule.global_batch}: its batch_size or shard was edited after state_dict() "
            "returned it. Load the state as saved: load_state_dict resumes on another world size "
            "or global batch by itself (elastic resume, exact in SEQUENTIAL, CYCLIC and BLOCK "
            "mode and with packing), from the loader's own shard and batch_size"
        )


def _check_streams(streams: object) -> dict[str, DenseDataset | RaggedDataset]:
    if not isinstance(streams, Mapping):
        raise TypeError(
            f"streams must be a dict {{name: DenseDataset or RaggedDataset}}, got "
            f"{type(streams).__name__}"
        )
    if not streams:
        raise ValueError(
            "streams is empty: give at least one {name: DenseDataset or RaggedDataset}"
        )
    for name, dataset in streams.items():
        if not isinstance(dataset, (DenseDataset, RaggedDataset)):
            raise ValueError(
                f"stream {name!r} must be a DenseDataset or a RaggedDataset, got "
                f"{type(dataset).__name__}"
            )
        if dataset.closed:
            raise ValueError(f"stream {name!r} is closed")
    lengths = {name: len(dataset) for name, dataset in streams.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(
            f"streams must have equal lengths (record i lines up across them), got {lengths}"
        )
    return dict(streams)


def _check_sources(sources: object) -> list[dict[str, DenseDataset | RaggedDataset]]:
    if isinstance(sources, Mapping) or not isinstance(sources, (list, tuple)):
        raise TypeError(
            f"with weights, streams must be a list of sources (one {{name: dataset}} dict each), "
            f"got {type(sources).__name__}"
        )
    return check_sources([_check_streams(source) for source in sources])


def _check_mixing(state: Mapping[str, Any], mixer: Mixer | None, saved: Schedule) -> None:
    """A mixed state resumes with the same sources; the weights may change."""
    if (mixer is None) != ("mixing" not in state):
        raise ValueError(
            "state and loader disagree on mixing: resume a mixed loader's state with the same "
            "sources"
        )
    if mixer is None:
        return
    lengths = state["mixing"].get("lengths") if isinstance(state["mixing"], Mapping) else None
    if lengths != mixer.lengths:
        raise ValueError(
            f"state was mixed from sources of lengths {lengths!r}, this loader's are "
            f"{mixer.lengths}"
        )
    if saved.global_batch != mixer.global_batch:
        raise ElasticError(
            f"a mixed state saved with global batch {saved.global_batch} cannot continue with "
            f"global batch {mixer.global_batch}: each sample's source is keyed by (step, position "
            "in the global batch). Keep batch_size * world_size"
        )


def _packed_stream(
    packing: object, streams: dict[str, DenseDataset | RaggedDataset]
) -> tuple[str, RaggedDataset]:
    """The one (name, RaggedDataset) a packed loader reads."""
    if not isinstance(packing, Packing):
        raise TypeError(
            f"packing must be a loaderx.Packing(seq_len, strategy), got {type(packing).__name__}"
        )
    (name, dataset), *others = streams.items()
    if others or not isinstance(dataset, RaggedDataset) or dataset.item_shape != ():
        found = ", ".join(
            f"{key}: {type(value).__name__} {value.item_shape}" for key, value in streams.items()
        )
        raise ValueError(
            "packing reads one ragged stream of scalar tokens ({name: RaggedDataset of 1-D "
            f"records}}): got streams {found}"
        )
    return name, dataset


def _shard_key(shard: Any) -> object:  # Any: a malformed shard is stored as given
    """A shard as a checkpoint stores it: None when unsharded, else [rank, world_size]."""
    if shard is None or isinstance(shard, (str, bytes)):
        return shard
    try:
        pair = [int(part) for part in shard]
    except (TypeError, ValueError):
        return shard
    return None if pair == [0, 1] else pair
