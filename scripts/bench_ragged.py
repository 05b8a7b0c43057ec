"""The DataLoader for variable-length data: ragged gathers, packing, processes.

    python scripts/bench_ragged.py [--quick]

`bench_ragged`, `bench_packing` and `bench_processes` (quick) return the
markdown tables scripts/bench.py prints as its `ragged`, `packing` and
`processes` tables. For the ragged table: Documents are int32 token sequences with log-normal
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

from loaderx import (
    DataLoader,
    DenseDataset,
    Packing,
    RaggedDataset,
    Sampler,
    from_iterator,
    from_numpy,
)
from loaderx.packing import DOCUMENT_CHUNK
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


def _median_seconds(functions: dict, runs: int) -> tuple[dict[str, float], dict[str, float]]:
    """Median wall and CPU seconds per call. On a shared machine the process's
    CPU time (all its threads) is the steadier of the two: it leaves out the
    time spent waiting for a core."""
    wall: dict[str, list[float]] = {name: [] for name in functions}
    cpu: dict[str, list[float]] = {name: [] for name in functions}
    for _ in range(runs):
        for name, function in functions.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            function()
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    return (
        {name: statistics.median(values) for name, values in wall.items()},
        {name: statistics.median(values) for name, values in cpu.items()},
    )


def _gather_runner(reader, batches: np.ndarray):
    """One pass over all batches, each into a fresh buffer as the loader allocates it."""

    def run() -> None:
        for indices in batches:
            reader.read(indices, reader.allocate())

    return run


def _check(docs, dense_rows, ragged: RaggedReader, dense: DenseReader, indices: np.ndarray) -> None:
    got = ragged.read(indices)
    for record, index in zip(got, indices.tolist()):
        if not np.array_equal(record, docs[index]):
            raise AssertionError(f"ragged gather returned wrong tokens for record {index}")
    if not np.array_equal(
        dense.read(indices, dense.allocate()), dense_rows[indices.astype(np.int64)]
    ):
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
            with (
                RaggedDataset(root / f"ragged-{codec}") as ragged,
                DenseDataset(root / f"dense-{codec}") as dense,
            ):
                readers = RaggedReader(ragged), DenseReader(dense, BATCH)
                _check(docs, dense_rows, *readers, batches[0])
                seconds, cpu = _median_seconds(
                    {
                        "ragged": _gather_runner(readers[0], batches),
                        "dense": _gather_runner(readers[1], batches),
                    },
                    runs,
                )
            ragged_speed = ragged_bytes / seconds["ragged"] / 2**20
            dense_speed = dense_bytes / seconds["dense"] / 2**20
            cpu_ratio = (ragged_bytes / cpu["ragged"]) / (dense_bytes / cpu["dense"])
            rows.append(
                f"| {codec} | {dense_speed:,.0f} | {ragged_speed:,.0f} | "
                f"{ragged_speed / dense_speed:.2f}x | {cpu_ratio:.2f}x | "
                f"{seconds['dense'] / batch_count * 1e3:.3f} | "
                f"{seconds['ragged'] / batch_count * 1e3:.3f} |"
            )
    return (
        f"### ragged: gather of {count:,} token documents (log-normal, median {MEDIAN_TOKENS}, "
        f"mean {mean}) vs dense records of {mean} tokens, {batch_count} random batches of "
        f"{BATCH}\n\n"
        "| codec | dense MiB/s | ragged MiB/s | ragged / dense | ragged / dense (CPU time) | "
        "dense ms / batch | ragged ms / batch |\n"
        "|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n\n"
        f"Median of {runs} interleaved passes over all batches. Each batch goes into a fresh "
        "buffer as in the DataLoader: dense, one native gather into a (256, mean) array; "
        "ragged, one native call that looks up the lengths, writes the row offsets and gathers "
        "into one flat array (the front of a buffer of the largest batch so far), and a "
        "RaggedBatch of the two. MiB/s counts the token bytes each batch holds; the CPU-time "
        "ratio compares bytes per CPU second of the process (all threads), which a busy "
        "machine disturbs less than wall time."
    )


# ---- packing --------------------------------------------------------------------------

SEQ_LEN = 2048
PACK_ROWS = 16


def python_packer(dataset: RaggedDataset, rows: int, seq_len: int):
    """A plain Python concatenate-and-split packer over the same document order
    as loaderx's (chunks of the sampler's IID stream): token lists, per-token
    segment ids and positions, one (rows, seq_len) batch at a time."""
    chunk = min(DOCUMENT_CHUNK, len(dataset))
    documents = Sampler(len(dataset), chunk, Sampler.Mode.IID, seed=42)
    tokens: list = []
    documents_of: list = []  # per token: the number of the document it came from
    size = rows * seq_len
    read = 0
    while True:
        for document in dataset[documents.next()]:
            tokens.extend(document.tolist())
            documents_of.extend([read] * len(document))
            read += 1
            while len(tokens) >= size:
                segment_ids, positions = _row_segments(documents_of[:size], rows, seq_len)
                batch = {
                    "tokens": np.array(tokens[:size], dtype=np.int32).reshape(rows, seq_len),
                    "segment_ids": segment_ids,
                    "positions": positions,
                }
                del tokens[:size], documents_of[:size]
                yield batch


def _row_segments(documents_of: list, rows: int, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Segment ids and positions, restarting at every document and every row."""
    segment_ids, positions = [], []
    for row in range(rows):
        number, position, last = 0, 0, None
        for document in documents_of[row * seq_len : (row + 1) * seq_len]:
            if document != last:
                number, position, last = number + 1, 0, document
            segment_ids.append(number)
            positions.append(position)
            position += 1
    shape = (rows, seq_len)
    return np.array(segment_ids, dtype=np.int32).reshape(shape), np.array(
        positions, dtype=np.int32
    ).reshape(shape)


def _tokens_per_second(batches, count: int) -> float:
    next(batches)  # starts workers / fills buffers
    start = time.perf_counter()
    for _ in range(count):
        next(batches)
    return count * PACK_ROWS * SEQ_LEN / (time.perf_counter() - start)


def bench_packing(quick: bool) -> str:
    count, batches, runs = (3000, 5, 1) if quick else (30000, 40, 5)
    docs = documents(count)
    lengths = np.array([len(doc) for doc in docs])
    one_per_row = 1 - np.minimum(lengths, SEQ_LEN).sum() / (lengths.size * SEQ_LEN)
    samples: dict[str, list[float]] = {"loaderx": [], "python": [], "first_fit": []}
    first_fit_padding = []
    with tempfile.TemporaryDirectory(prefix="loaderx-bench-packing-") as temporary:
        from_iterator(Path(temporary) / "tokens", docs, codec="raw")
        with RaggedDataset(Path(temporary) / "tokens") as dataset:
            for _ in range(runs):
                with DataLoader(
                    {"tokens": dataset},
                    num_workers=2,
                    batch_size=PACK_ROWS,
                    packing=Packing(SEQ_LEN),
                ) as loader:
                    first = next(loader)
                    padding = float(
                        (first["segment_ids"] == 0).mean()
                    )  # a padded token has no segment
                    samples["loaderx"].append(_tokens_per_second(loader, batches))
                reference = next(python_packer(dataset, PACK_ROWS, SEQ_LEN))
                if not all(np.array_equal(first[name], reference[name]) for name in first):
                    raise AssertionError(
                        "the Python packer and loaderx disagree on the first batch"
                    )
                samples["python"].append(
                    _tokens_per_second(python_packer(dataset, PACK_ROWS, SEQ_LEN), batches)
                )
                first_fit = Packing(SEQ_LEN, Packing.Strategy.FIRST_FIT)
                with DataLoader(
                    {"tokens": dataset}, num_workers=2, batch_size=PACK_ROWS, packing=first_fit
                ) as loader:
                    padded = [
                        float((next(loader)["segment_ids"] == 0).mean()) for _ in range(batches)
                    ]
                    first_fit_padding.append(statistics.mean(padded))
                    samples["first_fit"].append(_tokens_per_second(loader, batches))
    speed = {name: statistics.median(values) for name, values in samples.items()}
    return (
        f"### packing: {count:,} token documents (log-normal, median {MEDIAN_TOKENS}, mean "
        f"{lengths.mean():.0f}, max {lengths.max():,}) into rows of {SEQ_LEN}, batches of "
        f"{PACK_ROWS} rows\n\n"
        "| packer | M tokens/s | padding | vs Python |\n"
        "|---|---|---|---|\n"
        f"| loaderx concat (DataLoader, 2 workers) | {speed['loaderx'] / 1e6:.1f} | {padding:.2%} "
        f"| {speed['loaderx'] / speed['python']:.1f}x |\n"
        f"| plain Python concat packer | {speed['python'] / 1e6:.1f} | 0.00% | 1.0x |\n"
        f"| loaderx first-fit, window 64 (DataLoader, 2 workers) | {speed['first_fit'] / 1e6:.1f} "
        f"| {statistics.median(first_fit_padding):.2%} | "
        f"{speed['first_fit'] / speed['python']:.1f}x |\n"
        f"| (one document per row, padded or cut to {SEQ_LEN}) | — | {one_per_row:.2%} | — |\n\n"
        f"Median of {runs} runs of {batches} batches each after a first batch (which starts the "
        "workers and is checked equal, tokens, segment ids and positions, to the Python packer's). "
        "Both read the same raw store in the same document order; the Python packer reads each "
        "chunk of 1024 documents with one RaggedDataset gather and packs with token lists. "
        f"First-fit keeps documents whole (cut only past {SEQ_LEN} tokens); its padding is the "
        f"mean over {batches} batches after its first; its tokens/s count every row token, padding "
        "included."
    )


# ---- transforms: threads vs processes ------------------------------------------------

PYTHON_WORK = {
    "small": 20_000,
    "large": 200_000,
}  # loop iterations: about 1 ms and 10 ms of pure Python


class PythonAugment:
    """A pure-Python transform (holds the GIL throughout) of ``work`` loop iterations."""

    def __init__(self, work: int):
        self.work = work

    def __call__(self, batch: dict) -> dict:
        total = 0
        for value in range(self.work):
            total += value * value % 7
        return {"x": batch["x"], "y": batch["y"], "checksum": total}


def _loader_seconds(
    directory: Path, transform, processes: bool, workers: int, batches: int
) -> float:
    streams = {"x": DenseDataset(directory / "x"), "y": DenseDataset(directory / "y")}
    try:
        with DataLoader(
            streams,
            num_workers=workers,
            batch_size=BATCH,
            transform=transform,
            transform_processes=processes,
        ) as loader:
            first = next(loader)  # starts the workers (and the processes)
            if first["checksum"] != transform({"x": None, "y": None})["checksum"]:
                raise AssertionError("the transform returned a wrong result")
            start = time.perf_counter()
            for _ in range(batches):
                next(loader)
            return (time.perf_counter() - start) / batches
    finally:
        for dataset in streams.values():
            dataset.close()


def _transform_ms(transform) -> float:
    start = time.perf_counter()
    for _ in range(10):
        transform({"x": None, "y": None})
    return (time.perf_counter() - start) / 10 * 1e3


def bench_processes(quick: bool) -> str:
    runs = 1 if quick else 5
    batch_counts = {"small": 10, "large": 2} if quick else {"small": 200, "large": 30}
    rows = np.random.default_rng(5).random((4096, 256), dtype=np.float32)
    configurations = [
        (size, workers, processes)
        for size in PYTHON_WORK
        for workers in (1, 2)
        for processes in (False, True)
    ]
    samples: dict = {configuration: [] for configuration in configurations}
    transforms = {size: PythonAugment(work) for size, work in PYTHON_WORK.items()}
    milliseconds = {size: _transform_ms(transform) for size, transform in transforms.items()}
    with tempfile.TemporaryDirectory(prefix="loaderx-bench-processes-") as temporary:
        directory = Path(temporary)
        from_numpy(directory / "x", rows, codec="raw")
        from_numpy(directory / "y", np.arange(len(rows), dtype=np.int64), codec="raw")
        for _ in range(runs):
            for size, workers, processes in configurations:
                samples[size, workers, processes].append(
                    _loader_seconds(
                        directory, transforms[size], processes, workers, batch_counts[size]
                    )
                )
    table = []
    for size, workers, processes in configurations:
        seconds = statistics.median(samples[size, workers, processes])
        threads = statistics.median(samples[size, workers, False])
        table.append(
            f"| {milliseconds[size]:.1f} | {'processes' if processes else 'threads'} | {workers} | "
            f"{1 / seconds:,.0f} | {seconds * 1e3:.2f} | {threads / seconds:.2f}x |"
        )
    return (
        "### processes: a pure-Python transform, threads vs worker processes, batches of "
        f"{BATCH} x (1 KiB float32 + int64 label)\n\n"
        "| transform ms (alone) | transform in | workers | batches/s | ms / batch "
        "| vs threads |\n"
        "|---|---|---|---|---|---|\n" + "\n".join(table) + "\n\n"
        f"Median of {runs} interleaved runs of {batch_counts['small']} (small transform) or "
        f"{batch_counts['large']} (large) batches, after a first batch that starts the workers "
        "(spawning processes takes most of a second, not timed). `transform ms` is the "
        "transform timed alone in the main thread before the runs. With processes each worker "
        "thread hands its batch to its own child through shared memory (a copy in, a copy of "
        "the result out, a pipe round trip)."
    )


if __name__ == "__main__":
    quick = "--quick" in sys.argv[1:]
    print(bench_ragged(quick))
    print()
    print(bench_packing(quick))
    print()
    print(bench_processes(quick))
