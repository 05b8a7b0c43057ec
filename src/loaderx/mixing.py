"""Weighted mixing: several sources (stream dicts of one layout) in one stream.

Every sample of a batch picks its source on its own: draw j of global batch k
takes source s with probability ``weights[s]``, by a counter-based hash of
(seed, k, j), so the choice is a pure function of (seed, step, position) and
the per-source counts over n samples are Binomial(n, weight). The record it
reads is source s's own sampler (its length, this loader's mode, seed and
shard) at the same step and position: a source's index stream never depends
on the weights or on the other sources, so changing the weights on resume
changes which source each later sample comes from, and nothing else.

In CYCLIC mode a source's samplers keep cycling at one cycle per
``length_s // G`` steps whatever its weight; the samples of a cycle that
went to other sources are skipped in that cycle (each cycle still reads no
record twice). Steps, not sources, are what a checkpoint counts.

One batch reads each stream with one native gather per source, at
destination offsets, straight into the batch's buffer.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import numpy.typing as npt

from .dataset import DenseDataset, RaggedDataset
from .sampler import Sampler
from .schedule import Schedule
from .streams import RaggedBatch

__all__ = ["Mixer", "check_weights"]

_MASK = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15
_GAMMA_STEP = 0xD1B54A32D192ED03
_DOMAIN = 0x3C6EF372FE94F82B  # keeps the choice stream apart from the samplers'


def _mix_scalar(value: int) -> int:
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK
    return value ^ (value >> 31)


def _mix(values: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """SplitMix64's finalizer on a uint64 array (arithmetic wraps modulo 2^64)."""
    values = values ^ (values >> np.uint64(30))
    values = values * np.uint64(0xBF58476D1CE4E5B9)
    values = values ^ (values >> np.uint64(27))
    values = values * np.uint64(0x94D049BB133111EB)
    return values ^ (values >> np.uint64(31))


def uniforms(seed: int, step: int, first: int, count: int) -> npt.NDArray[np.float64]:
    """Uniform floats in [0, 1) for draws first..first + count of global batch ``step``."""
    start = _mix_scalar((_mix_scalar(seed ^ _DOMAIN) + step * _GAMMA_STEP) & _MASK)
    counters = np.arange(first + 1, first + count + 1, dtype=np.uint64) * np.uint64(
        _GAMMA
    ) + np.uint64(start)
    return (_mix(counters) >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def check_weights(weights: npt.ArrayLike, count: int) -> npt.NDArray[np.float64]:
    """Weights as probabilities summing to 1; ValueError for anything else."""
    try:
        array = np.asarray(weights, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(
            f"weights must be a list of {count} non-negative numbers, got {weights!r}"
        ) from None
    if (
        array.shape != (count,)
        or not np.all(np.isfinite(array))
        or np.any(array < 0)
        or array.sum() <= 0
    ):
        raise ValueError(
            f"weights must be {count} non-negative finite numbers (one per source), not all 0; got "
            f"{weights!r}"
        )
    probabilities: npt.NDArray[np.float64] = array / array.sum()
    return probabilities


def check_sources(
    sources: list[dict[str, DenseDataset | RaggedDataset]],
) -> list[dict[str, DenseDataset | RaggedDataset]]:
    """The sources of a mixture: stream dicts with the same names and layouts."""
    if not sources:
        raise ValueError("a mixture needs at least one source ({name: dataset} dict)")
    first = sources[0]
    for number, source in enumerate(sources):
        if set(source) != set(first):
            raise ValueError(
                f"source {number} has streams {sorted(source)}, source 0 has {sorted(first)}: "
                "every source needs the same names"
            )
        for name, dataset in source.items():
            other = first[name]
            if (type(dataset), dataset.dtype, dataset.item_shape) != (
                type(other),
                other.dtype,
                other.item_shape,
            ):
                raise ValueError(
                    f"stream {name!r} of source {number} is a {type(dataset).__name__} of "
                    f"{dataset.dtype} {dataset.item_shape}, in source 0 a {type(other).__name__} "
                    f"of {other.dtype} {other.item_shape}: mixed sources must share each stream's "
                    "kind, dtype and item shape"
                )
    if "source" in first:
        raise ValueError("a mixed batch adds a 'source' array: rename the stream called 'source'")
    return sources


class Mixer:
    """Samples and reads mixed batches for one rank (see the module doc)."""

    def __init__(
        self,
        sources: list[dict[str, DenseDataset | RaggedDataset]],
        weights: npt.ArrayLike,
        batch_size: int,
        mode: Sampler.Mode | int | str,
        seed: int,
        shard: tuple[int, int] | None,
    ) -> None:
        self.sources = sources
        self.weights = check_weights(weights, len(sources))
        self.cumulative = np.cumsum(self.weights)
        self.seed = seed
        self.schedules = [
            Schedule(
                Sampler(len(next(iter(source.values()))), batch_size, mode, seed=seed, shard=shard)
            )
            for source in sources
        ]
        rank, world_size = self.schedules[0].sampler.shard
        self.share = batch_size
        self.first = rank * batch_size
        self.global_batch = batch_size * world_size

    @property
    def lengths(self) -> list[int]:
        return [schedule.length for schedule in self.schedules]

    def sample(self, step: int) -> tuple[np.ndarray, list[tuple[int, np.ndarray, np.ndarray]]]:
        """Each sample's source, and per source the rows it fills and their indices."""
        draws = uniforms(self.seed, step, self.first, self.share)
        choice = np.minimum(
            np.searchsorted(self.cumulative, draws, side="right"), len(self.sources) - 1
        )
        parts: list[tuple[int, np.ndarray, np.ndarray]] = []
        buffer = np.empty(self.share, dtype=np.uint64)
        for number, schedule in enumerate(self.schedules):
            rows = np.flatnonzero(choice == number)
            if rows.size:
                parts.append((number, rows, schedule.indices(step, buffer)[rows]))
        return choice.astype(np.int32), parts

    def read(
        self, choice: np.ndarray, parts: list[tuple[int, np.ndarray, np.ndarray]]
    ) -> dict[str, Any]:
        batch: dict[str, Any] = {}
        for name, dataset in self.sources[0].items():
            datasets = [source[name] for source in self.sources]
            if isinstance(dataset, RaggedDataset):
                # check_sources: every source's stream is of the first one's kind
                batch[name] = _read_ragged(cast("list[RaggedDataset]", datasets), parts, self.share)
            else:
                batch[name] = _read_dense(cast("list[DenseDataset]", datasets), parts, self.share)
        batch["source"] = choice
        return batch


def _read_dense(
    datasets: list[DenseDataset], parts: list[tuple[int, np.ndarray, np.ndarray]], share: int
) -> np.ndarray:
    first = datasets[0]
    out = np.empty((share, *first.item_shape), dtype=first.dtype)
    row_bytes = out.itemsize * int(np.prod(first.item_shape, dtype=np.int64))
    for number, rows, indices in parts:
        datasets[number].store.gather(indices, out, rows.astype(np.uint64) * np.uint64(row_bytes))
    return out


def _read_ragged(
    datasets: list[RaggedDataset], parts: list[tuple[int, np.ndarray, np.ndarray]], share: int
) -> RaggedBatch:
    first = datasets[0]
    rows_of = np.zeros(share, dtype=np.int64)
    for number, rows, indices in parts:
        rows_of[rows] = datasets[number]._row_counts(indices)
    offsets = np.zeros(share + 1, dtype=np.int64)
    np.cumsum(rows_of, out=offsets[1:])
    values = np.empty((int(offsets[-1]), *first.item_shape), dtype=first.dtype)
    row_bytes = first.schema.item_bytes
    if values.nbytes:
        for number, rows, indices in parts:
            datasets[number].store.gather(
                indices, values, (offsets[rows] * row_bytes).astype(np.uint64)
            )
    return RaggedBatch(values, offsets)
