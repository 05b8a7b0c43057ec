"""Variable-length data: ragged gathers against dense ones of the same bytes.

    python scripts/bench_ragged.py [--quick]

`bench_ragged(quick)` returns the markdown table (scripts/bench.py prints it
as its `ragged` table). Documents are int32 token sequences with log-normal
lengths (median 300, sigma 1, clipped to 1..16384); the dense store holds as
many records of the mean length, so a batch of either moves the same bytes
on average. Every figure is the median of interleaved runs; each reader's
first batch is checked against the source.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

try:
    import loaderx  # noqa: F401
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from loaderx import DenseDataset, RaggedDataset, from_iterator, from_numpy
from loaderx.streams import DenseReader, RaggedReader

BATCH = 256
MEDIAN_TOKENS = 300
TOKENS_MAX = 16384


def document_lengths(count: int, seed: int = 0) -> np.ndarray:
    """Log-normal lengths, median 300, a long tail (sigma 1: the 99th percentile is ~3100)."""
    lengths = np.random.default_rng(seed).lognormal(np.log(MEDIAN_TOKENS), 1.0, count)
    return np.clip(np.rint(lengths), 1, TOKENS_MAX).astype(np.int64)


def documents(count: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed + 1)
    return [rng.integers(0, 50_000, n, dtype=np.int32) for n in document_lengths(count, seed)]


def _median_seconds(functions: dict, runs: int, repeats: int) -> dict[str, float]:
    samples: dict[str, list[float]] = {name: [] for name in functions}
    for _ in range(runs):
        for name, function in functions.items():
            start = time.perf_counter()
            for _ in range(repeats):
                function()
            samples[name].append((time.perf_counter() - start) / repeats)
    return {name: statistics.median(values) for name, values in samples.items()}


def _gather_runner(reader, batches: np.ndarray, dense: bool):
    """One pass over all batches, each into a fresh buffer as the loader does."""
    def run() -> None:
        for indices in batches:
            reader.read(indices, reader.allocate() if dense else None)
    return run


def _check(docs, dense_rows, ragged: RaggedReader, dense: DenseReader, indices: np.ndarray) -> None:
    got = ragged.read(indices)
    for record, index in zip(got, indices.tolist()):
        if not np.array_equal(record, docs[index]):
            raise AssertionError(f"ragged gather returned wrong tokens for record {index}")
    if not np.array_equal(dense.read(indices, dense.allocate()), dense_rows[indices.astype(np.int64)]):
        raise AssertionError("dense gather returned wrong rows")


def bench_ragged(quick: bool) -> str:
    count, batch_count, runs = (2000, 20, 3) if quick else (20000, 200, 7)
    docs = documents(count)
    mean = int(round(np.mean([len(doc) for doc in docs])))
    dense_rows = np.random.default_rng(3).integers(0, 50_000, (count, mean), dtype=np.int32)
    batches = np.random.default_rng(4).integers(0, count, (batch_count, BATCH)).astype(np.uint64)
    ragged_bytes = sum(int(sum(len(docs[i]) for i in batch.tolist())) * 4 for batch in batches)
    dense_bytes = batch_count * BATCH * mean * 4
    rows = []
    with tempfile.TemporaryDirectory(prefix="loaderx-bench-ragged-") as temporary:
        root = Path(temporary)
        for codec in ("raw", "zstd"):
            from_iterator(root / f"ragged-{codec}", docs, codec=codec)
            from_numpy(root / f"dense-{codec}", dense_rows, codec=codec)
            with RaggedDataset(root / f"ragged-{codec}") as ragged, DenseDataset(root / f"dense-{codec}") as dense:
                readers = RaggedReader(ragged), DenseReader(dense, BATCH)
                _check(docs, dense_rows, *readers, batches[0])
                seconds = _median_seconds({
                    "ragged": _gather_runner(readers[0], batches, dense=False),
                    "dense": _gather_runner(readers[1], batches, dense=True),
                }, runs, 1)
            ragged_speed = ragged_bytes / seconds["ragged"] / 2**20
            dense_speed = dense_bytes / seconds["dense"] / 2**20
            rows.append(f"| {codec} | {dense_speed:,.0f} | {ragged_speed:,.0f} | {ragged_speed / dense_speed:.2f}x "
                        f"| {seconds['dense'] / batch_count * 1e3:.3f} | {seconds['ragged'] / batch_count * 1e3:.3f} |")
    return (
        f"### ragged: gather of {count:,} token documents (log-normal, median {MEDIAN_TOKENS}, mean {mean}) "
        f"vs dense records of {mean} tokens, {batch_count} random batches of {BATCH}\n\n"
        "| codec | dense MiB/s | ragged MiB/s | ragged / dense | dense ms / batch | ragged ms / batch |\n"
        "|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n\n"
        f"Median of {runs} interleaved passes over all batches. Each batch goes into a fresh buffer as in the "
        "DataLoader: dense, one native gather into a (256, mean) array; ragged, one lengths lookup, one "
        "native gather with destination offsets into one flat array, and its offsets (a RaggedBatch). "
        "MiB/s counts the token bytes each batch holds."
    )


if __name__ == "__main__":
    print(bench_ragged("--quick" in sys.argv[1:]))
