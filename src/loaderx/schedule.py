"""Which records step k reads: the sampler's global stream, read from an anchor.

A loader's global stream is a sequence of *positions*; every global batch
reads the next ``G = batch_size * world_size`` of them, and rank r reads its
share ``[r * b, (r + 1) * b)`` of each batch. What a position is depends on
the mode:

- SEQUENTIAL: a sample count P; the index is ``P mod length``.
- CYCLIC: a pair (cycle, offset); the index is the offset's image under the
  cycle's permutation, which depends on the seed, the cycle and the length,
  not on the batch size or the world size. A batch never straddles two
  cycles: when fewer than G positions remain in a cycle they are dropped.
- BLOCK: as CYCLIC; the cycle's stream also depends on the groups and
  ``shards_per_block``, still not on the batch size or the world size.
- IID: no positions; draw j of step k is keyed by (seed, k, j), so only the
  step carries over.

A fresh loader reads the native sampler's step k at step k. An *anchor*
(step, position) says that step ``anchor.step`` reads from that position on:
an elastic resume sets one when the global batch changes, so the new loader
continues the same global order at the exact position the old one stopped.
Steps past the anchor are still a pure function of the step.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ._checks import check_state_int
from .sampler import STEP_MAX, Sampler

__all__ = ["Schedule", "ElasticError"]

_SEQUENTIAL = Sampler.Mode.SEQUENTIAL
#: The modes whose positions are (cycle, offset).
_CYCLES = (Sampler.Mode.CYCLIC, Sampler.Mode.BLOCK)


class ElasticError(ValueError):
    """A state cannot be continued exactly with this loader's configuration."""


class Schedule:
    """Step -> this rank's record indices, for one sampler and one anchor."""

    def __init__(self, sampler: Sampler, anchor: Mapping[str, Any] | None = None) -> None:
        self.sampler = sampler
        self.length = sampler.length
        self.rank, self.world_size = sampler.shard
        self.global_batch = sampler.batch_size * self.world_size
        self.anchor = None if anchor is None else _check_anchor(anchor, sampler.mode, self.length)
        self._chunk_samplers: dict[int, Sampler] = {}

    # -- positions -----------------------------------------------------------------

    @property
    def batches_per_cycle(self) -> int:
        """CYCLIC, BLOCK: whole global batches in a cycle (the rest of a cycle is
        dropped)."""
        return self.length // self.global_batch

    def position(self, step: int) -> dict[str, int]:
        """Where the global stream stands before batch ``step``: ``{"cycle",
        "offset"}`` (CYCLIC, BLOCK: the samples of the cycle read so far, which may
        leave less than a batch) or ``{"position"}`` (SEQUENTIAL: a sample
        count modulo length); ``{}`` for IID."""
        mode = self.sampler.mode
        if mode in _CYCLES:
            if step == (0 if self.anchor is None else self.anchor["step"]):
                return (
                    {"cycle": 0, "offset": 0}
                    if self.anchor is None
                    else {"cycle": self.anchor["cycle"], "offset": self.anchor["offset"]}
                )
            # Just past the last batch read: a short tail is dropped only when
            # the next batch is read, so another global batch may still use it.
            cycle, offset = self._cyclic(step - 1)
            return {"cycle": cycle, "offset": offset + self.global_batch}
        if mode == _SEQUENTIAL:
            return {"position": self._sequential(step)}
        return {}

    def _since_anchor(self, step: int) -> int:
        assert self.anchor is not None  # called on an anchored schedule only
        since = step - self.anchor["step"]
        if since < 0:
            raise ValueError(
                f"step {step} comes before this loader's resume point {self.anchor['step']}"
            )
        return since

    def _cyclic(self, step: int) -> tuple[int, int]:
        if self.anchor is None:
            return divmod(step, self.batches_per_cycle)[0], (
                step % self.batches_per_cycle
            ) * self.global_batch
        since = self._since_anchor(step)
        # The anchor's cycle continues from its offset while whole batches fit.
        left = (self.length - self.anchor["offset"]) // self.global_batch
        if since < left:
            return self.anchor["cycle"], self.anchor["offset"] + since * self.global_batch
        cycles, batch = divmod(since - left, self.batches_per_cycle)
        return self.anchor["cycle"] + 1 + cycles, batch * self.global_batch

    def _sequential(self, step: int) -> int:
        start = 0 if self.anchor is None else self.anchor["position"]
        since = step if self.anchor is None else self._since_anchor(step)
        return (start + since * self.global_batch) % self.length

    def epoch(self, step: int) -> int:
        """CYCLIC, BLOCK: the cycle global batch ``step`` belongs to."""
        return self._cyclic(step)[0]

    # -- indices -------------------------------------------------------------------

    def indices(self, step: int, out: np.ndarray) -> np.ndarray:
        """This rank's indices of global batch ``step``, written into ``out``."""
        if self.anchor is None or self.sampler.mode not in (*_CYCLES, _SEQUENTIAL):
            return self.sampler.batch(step, out)
        share = self.sampler.batch_size
        if self.sampler.mode == _SEQUENTIAL:
            start = (self._sequential(step) + self.rank * share) % self.length
            np.add(np.arange(share, dtype=np.uint64), np.uint64(start), out=out)
            np.remainder(out, np.uint64(self.length), out=out)
            return out
        cycle, offset = self._cyclic(step)
        if offset % self.global_batch == 0:  # aligned: the sharded native step itself
            return self.sampler.batch(
                cycle * self.batches_per_cycle + offset // self.global_batch, out
            )
        return self._cyclic_positions(cycle, offset + self.rank * share, out)

    def _cyclic_positions(self, cycle: int, first: int, out: np.ndarray) -> np.ndarray:
        """Positions ``first..first + len(out)`` of ``cycle``'s permutation. BLOCK
        reads them with one native call; CYCLIC in chunks of g = gcd(first,
        len(out)) through an unsharded sampler of batch g, whose step s reads
        positions ``(s mod (length // g)) * g`` on of cycle ``s // (length // g)``:
        the same permutation, since it depends on the seed, cycle and length only."""
        if self.sampler.mode == Sampler.Mode.BLOCK:  # the native library reads any run
            return self.sampler.cycle_positions(cycle, first, out)
        chunk = math.gcd(first, out.size)
        sampler = self._chunk_samplers.get(chunk)
        if sampler is None:
            sampler = self.sampler.with_batch_size(chunk)
            self._chunk_samplers[chunk] = sampler
        base = cycle * (self.length // chunk) + first // chunk
        for part in range(out.size // chunk):
            sampler.batch(base + part, out[part * chunk : (part + 1) * chunk])
        return out


def _check_anchor(anchor: object, mode: Sampler.Mode, length: int) -> dict[str, int]:
    if not isinstance(anchor, Mapping):
        raise ValueError(f"state anchor must be a dict or None, got {type(anchor).__name__}")
    keys = {"step", "cycle", "offset"} if mode in _CYCLES else {"step", "position"}
    if mode not in (*_CYCLES, _SEQUENTIAL) or set(anchor) != keys:
        raise ValueError(
            f"state anchor {dict(anchor)!r} does not fit mode {Sampler.Mode(mode).name}"
        )
    # A step or cycle beyond STEP_MAX names a sampler step that does not exist.
    values = {key: check_state_int(f"state anchor {key}", anchor[key], STEP_MAX) for key in keys}
    # A cycle's offset may equal the length (the cycle read to its end).
    bound = values["offset"] if mode in _CYCLES else values["position"] + 1
    if bound > length:
        raise ValueError(f"state anchor {dict(anchor)!r} points past the dataset length {length}")
    return {key: int(value) for key, value in values.items()}


def elastic_anchor(saved: Schedule, step: int, target: Schedule) -> dict[str, int] | None:
    """The anchor that makes ``target`` read, from ``step`` on, what ``saved``
    would have read next; ElasticError where that cannot be exact."""
    if saved.global_batch == target.global_batch:
        return saved.anchor
    mode = saved.sampler.mode
    if mode not in (*_CYCLES, _SEQUENTIAL):
        raise ElasticError(
            f"an IID state saved with global batch {saved.global_batch} cannot continue with "
            f"global batch {target.global_batch}: IID draws are keyed by (step, position in the "
            "global batch), so no other global batch reproduces the stream. Keep batch_size * "
            "world_size, or start a new stream with a new seed"
        )
    return {"step": step, **saved.position(step)}
