"""The endless, step-based DataLoader: deterministic, resumable, sharded.

Batch k is a pure function of the configuration and k: the sampler's
indices at step k (``Sampler.batch``), each stream gathered at them with one
native call into a fresh array, then ``transform``. So the k-th batch is the
same for any ``num_workers`` and any thread timing, and a checkpoint is just
the next step.

Threading model. ``num_workers`` threads claim steps in order from a shared
counter, at most ``prefetch_size`` steps ahead of the consumer: a step is
*in flight* from its claim until the consumer takes it, so at most
``prefetch_size`` batches exist at once. A worker computes step k (the native
calls release the GIL, so workers overlap) and puts it in slot
``k % prefetch_size``; the consumer takes slot ``k % prefetch_size`` for step
k, in step order, whatever order the workers finish in. The workers start at
the first ``next()``, so ``load_state_dict`` can set the step before any work.

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
debugging a transform).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Mapping

import numpy as np

from .dataset import DenseDataset, RaggedDataset
from .sampler import Sampler

__all__ = ["DataLoader", "LoaderError", "STATE_VERSION"]

STATE_VERSION = 1
_CLOSE_WAIT_SECONDS = 0.5
_STALL_CHECK_SECONDS = 1.0


class LoaderError(RuntimeError):
    """A batch could not be made; ``__cause__`` is the worker's exception and
    ``step`` the step it was computing."""

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


def _identity(batch):
    return batch


class _Batches:
    """What every step needs: the sampler, the streams and the transform.
    Computing a batch touches nothing mutable, so any thread may do it."""

    def __init__(self, sampler: Sampler, streams: dict, transform):
        self.sampler = sampler
        self.transform = transform
        self.streams = [
            (name, dataset, (sampler.batch_size, *dataset.item_shape), dataset.dtype)
            for name, dataset in streams.items()
        ]

    def allocate(self) -> list:
        """Fresh output arrays for one batch, one per stream."""
        return [np.empty(shape, dtype) for _, _, shape, dtype in self.streams]

    def compute(self, step: int, indices: np.ndarray, outputs: list):
        """Batch ``step`` gathered into ``outputs`` (from ``allocate``), then
        transformed; or raises ``_StepFailure`` saying which stage failed."""
        try:
            self.sampler.batch(step, indices)
            batch = {}
            for (name, dataset, _, _), out in zip(self.streams, outputs):
                dataset.gather_into(indices, out)
                batch[name] = out
        except BaseException as exc:
            raise _StepFailure(step, "reading the batch", exc) from exc
        try:
            return self.transform(batch)
        except BaseException as exc:
            raise _StepFailure(step, "transform", exc) from exc


class _StepFailure(Exception):
    def __init__(self, step: int, stage: str, error: BaseException):
        super().__init__(step, stage, error)
        self.step = step
        self.stage = stage
        self.error = error

    def loader_error(self) -> LoaderError:
        error = LoaderError(
            f"DataLoader batch {self.step}: {self.stage} raised {type(self.error).__name__}: {self.error}",
            self.step,
        )
        error.__cause__ = self.error
        return error


class _Pipeline:
    """The worker threads and the slots they hand batches over in.

    Invariants (under ``lock``): ``next_step <= claimed <= next_step +
    capacity``; a slot holds only step ``s`` with ``s % capacity`` its
    index and ``next_step <= s < claimed``; ``outputs[s % capacity]`` holds
    the arrays of each step ``claimed <= s < next_step + capacity``.

    The output arrays are allocated by the consumer's thread (when it starts
    the pipeline, and for step ``k + capacity`` when it takes step k), not by
    the workers. The consumer frees them too, so they come from one malloc
    arena: allocated in the workers, each multi-MiB batch came from a
    per-thread arena that glibc trimmed back to the kernel after every
    batch, and page-faulting it in again cost about as much as the gather.
    """

    def __init__(self, batches: _Batches, num_workers: int, capacity: int, first_step: int):
        self.batches = batches
        self.capacity = capacity
        self.lock = threading.Lock()
        self.ready = threading.Condition(self.lock)  # the consumer waits for its step
        self.space = threading.Condition(self.lock)  # workers wait for room to claim
        self.slots: list = [None] * capacity
        self.outputs: list = [batches.allocate() for _ in range(capacity)]
        self.next_step = first_step
        self.claimed = first_step
        self.closed = False
        self.threads = [
            threading.Thread(target=self._work, name=f"loaderx-worker-{number}", daemon=True)
            for number in range(num_workers)
        ]
        for thread in self.threads:
            thread.start()

    def _work(self) -> None:
        indices = np.empty(self.batches.sampler.batch_size, dtype=np.uint64)
        while True:
            with self.lock:
                while not self.closed and self.claimed >= self.next_step + self.capacity:
                    self.space.wait()
                if self.closed:
                    return
                step = self.claimed
                self.claimed += 1
                outputs = self.outputs[step % self.capacity]
                self.outputs[step % self.capacity] = None
            try:
                entry = (step, self.batches.compute(step, indices, outputs), None)
            except _StepFailure as failure:
                entry = (step, None, failure)
            with self.lock:
                if self.closed:
                    return
                self.slots[step % self.capacity] = entry
                self.ready.notify()
            entry = outputs = None

    def take(self):
        """The next step's batch, in step order; raises ``_StepFailure``."""
        with self.lock:
            while True:
                if self.closed:
                    raise RuntimeError("the DataLoader was closed")
                step = self.next_step
                index = step % self.capacity
                if self.slots[index] is not None:
                    break
                if not self.ready.wait(_STALL_CHECK_SECONDS) and not any(thread.is_alive() for thread in self.threads):
                    raise RuntimeError("the DataLoader's worker threads are gone (was the interpreter shutting down?)")
            entry_step, batch, failure = self.slots[index]
            assert entry_step == step, (entry_step, step)
            if failure is not None:
                raise failure
            self.slots[index] = None
            self.outputs[index] = self.batches.allocate()
            self.next_step = step + 1
            self.space.notify()
        return batch

    def close(self) -> None:
        with self.lock:
            if not self.closed:
                self.closed = True
                self.slots = [None] * self.capacity
                self.outputs = [None] * self.capacity
                self.space.notify_all()
                self.ready.notify_all()
        deadline = time.monotonic() + _CLOSE_WAIT_SECONDS
        current = threading.current_thread()
        for thread in self.threads:
            if thread is not current:
                thread.join(max(0.0, deadline - time.monotonic()))


class DataLoader:
    """An endless iterator of batches ``transform({name: array})``.

    ``streams`` is ``{name: DenseDataset}`` of equal length; every stream is
    gathered at the same indices, so record i lines up across them. Each
    array is ``(batch_size, *item_shape)``. ``mode`` is a ``Sampler.Mode``
    (or its int: 0 SEQUENTIAL, 1 IID, 2 CYCLIC) and ``seed`` its seed;
    ``shard=(rank, world_size)`` gives this process its share of every
    global batch (``batch_size`` is the share). At most ``prefetch_size``
    batches are in flight. Batch k is the sampler's step k for any
    ``num_workers``; ``state_dict()`` / ``load_state_dict()`` resume exactly.
    """

    def __init__(self, streams, num_workers=4, batch_size=256, prefetch_size=4, mode=1, seed=42,
                 transform=_identity, shard=None):
        self._streams = _check_streams(streams)
        self._num_workers = _count("num_workers", num_workers, minimum=0)
        self._prefetch_size = _count("prefetch_size", prefetch_size, minimum=1)
        if not callable(transform):
            raise TypeError(f"transform must be callable (a batch dict in, a batch out), got {type(transform).__name__}")
        length = len(next(iter(self._streams.values())))
        self._sampler = Sampler(length, batch_size, mode, seed=seed, shard=shard)
        self._batches = _Batches(self._sampler, self._streams, transform)
        self._step = 0
        self._pipeline = None
        self._finalizer = None
        self._indices = None
        self._failure = None
        self._closed = False

    # -- iteration ---------------------------------------------------------------

    def __iter__(self):
        return self

    def __next__(self):
        if self._failure is not None:
            raise self._failure.loader_error() from self._failure.error
        if self._closed:
            raise RuntimeError("the DataLoader is closed: create a new one (load_state_dict resumes where this one was)")
        try:
            batch = self._take()
        except _StepFailure as failure:
            self.close()
            if not isinstance(failure.error, Exception):
                raise failure.error  # KeyboardInterrupt, SystemExit: not a batch failure, so not a LoaderError
            self._failure = failure
            raise failure.loader_error() from failure.error
        self._step += 1
        return batch

    next = __next__

    def _take(self):
        if self._num_workers == 0:
            if self._indices is None:
                self._indices = np.empty(self._sampler.batch_size, dtype=np.uint64)
            return self._batches.compute(self._step, self._indices, self._batches.allocate())
        if self._pipeline is None:
            self._pipeline = _Pipeline(self._batches, self._num_workers, self._prefetch_size, self._step)
            self._finalizer = weakref.finalize(self, self._pipeline.close)
        return self._pipeline.take()

    def __reduce__(self) -> tuple:
        raise TypeError(
            "a DataLoader runs threads in this process and cannot be pickled: pass its datasets "
            "(they pickle as their paths) and its state_dict() to the other process and build a DataLoader there"
        )

    def __len__(self):
        raise TypeError("a DataLoader is endless (step-based): it has no len(); count the steps you take")

    # -- lifetime ------------------------------------------------------------------

    def close(self) -> None:
        """Stops the workers and drops prefetched batches; returns promptly. Idempotent."""
        self._closed = True
        if self._finalizer is not None:
            self._finalizer()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- checkpoints ----------------------------------------------------------------

    @property
    def step(self) -> int:
        """The step of the batch the next ``next()`` returns."""
        return self._step

    def state_dict(self) -> dict:
        """A small versioned dict: the next step, and the configuration it belongs to."""
        return {
            "version": STATE_VERSION,
            "step": self._step,
            "seed": self._sampler.seed,
            "mode": int(self._sampler.mode),
            "batch_size": self._sampler.batch_size,
            "shard": _shard_key(self._sampler.shard),
            "length": self._sampler.length,
        }

    def load_state_dict(self, state) -> None:
        """Continues from ``state`` (from ``state_dict()``) with exactly the batch
        that would have come next. Call it on a loader that has not started."""
        if self._pipeline is not None or self._step != 0 or self._closed:
            raise RuntimeError("load_state_dict must be called before iterating: create a new DataLoader and load the state into it")
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a dict from DataLoader.state_dict(), got {type(state).__name__}")
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"state has version {state.get('version')!r}; this loaderx reads version {STATE_VERSION}")
        mine = self.state_dict()
        missing = sorted(set(mine) - set(state))
        if missing:
            raise ValueError(f"state lacks {', '.join(missing)}")
        theirs = dict(state, shard=_shard_key(state["shard"]))
        differences = [
            f"{key}={theirs[key]!r} (this loader: {mine[key]!r})"
            for key in ("seed", "mode", "batch_size", "shard", "length")
            if theirs[key] != mine[key]
        ]
        if differences:
            raise ValueError("state was saved by a differently configured DataLoader: " + ", ".join(differences))
        step = state["step"]
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise ValueError(f"state step must be a non-negative int, got {step!r}")
        self._step = int(step)

    def __repr__(self) -> str:
        names = ", ".join(self._streams)
        return (
            f"DataLoader([{names}], num_workers={self._num_workers}, batch_size={self._sampler.batch_size}, "
            f"prefetch_size={self._prefetch_size}, mode={self._sampler.mode.name}, seed={self._sampler.seed}, "
            f"shard={self._sampler.shard}) at step {self._step}"
        )


def _check_streams(streams) -> dict:
    if not isinstance(streams, Mapping):
        raise TypeError(f"streams must be a dict {{name: DenseDataset}}, got {type(streams).__name__}")
    if not streams:
        raise ValueError("streams is empty: give at least one {name: DenseDataset}")
    for name, dataset in streams.items():
        if isinstance(dataset, RaggedDataset):
            raise ValueError(
                f"stream {name!r} is a RaggedDataset, but the DataLoader reads dense streams only: "
                "store fixed-shape (padded) records with from_numpy"
            )
        if not isinstance(dataset, DenseDataset):
            raise ValueError(f"stream {name!r} must be a DenseDataset, got {type(dataset).__name__}")
        if dataset.closed:
            raise ValueError(f"stream {name!r} is closed")
    lengths = {name: len(dataset) for name, dataset in streams.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"streams must have equal lengths (record i lines up across them), got {lengths}")
    return dict(streams)


def _shard_key(shard):
    """A shard as a checkpoint stores it: None when unsharded, else [rank, world_size]."""
    if shard is None or isinstance(shard, (str, bytes)):
        return shard
    try:
        pair = [int(part) for part in shard]
    except (TypeError, ValueError):
        return shard
    return None if pair == [0, 1] else pair


def _count(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return int(value)
