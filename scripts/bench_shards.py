"""Gather across 64 shards against one store, alternating the two batch by batch.

    python scripts/bench_shards.py [--runs R] [--codec raw|zstd]

The records of the `store` table of scripts/bench.py (20,000 x 12 KiB
float32, compressible like it) as one store and as a sharded dataset of 64
shards; 400 random batches of 256. Each batch is gathered from both, in an
order that flips every run, so a burst of noise on a shared machine lands on
both alike. Prints the median milliseconds per batch of each and the ratio
of the medians (above 1: the shards are faster). The first batch of each is
checked against the source.
"""

from __future__ import annotations

import argparse
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

from loaderx import DenseDataset, from_numpy, shards

COUNT, FLOATS, BATCH, BATCHES, SHARDS = 20000, 3072, 256, 400, 64


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--codec", choices=["raw", "zstd"], default="zstd")
    options = parser.parse_args(argv)
    rows = (np.random.default_rng(0).normal(size=(COUNT, FLOATS)) * 4).round().astype(
        np.float32
    ) / 4
    batches = np.random.default_rng(1).integers(0, COUNT, (BATCHES, BATCH)).astype(np.uint64)
    out = np.empty((BATCH, FLOATS), np.float32)
    with tempfile.TemporaryDirectory(prefix="loaderx-bench-shards-") as temporary:
        root = Path(temporary)
        from_numpy(root / "single", rows, codec=options.codec, progress=False)
        bounds = np.linspace(0, COUNT, SHARDS + 1).astype(np.int64)
        for k in range(SHARDS):
            shards.write_shard(
                root / "sharded", k, rows[bounds[k] : bounds[k + 1]], codec=options.codec
            )
        shards.commit(root / "sharded")
        stores = [
            ("one store", DenseDataset(root / "single")),
            (f"{SHARDS} shards", DenseDataset(root / "sharded")),
        ]
        for _, dataset in stores:
            dataset.store.gather(batches[0], out)
            assert np.array_equal(out, rows[batches[0].astype(np.int64)])
        seconds = {name: [] for name, _ in stores}
        for run in range(options.runs):
            for indices in batches:
                for name, dataset in stores if run % 2 == 0 else stores[::-1]:
                    start = time.perf_counter()
                    dataset.store.gather(indices, out)
                    seconds[name].append(time.perf_counter() - start)
        for _, dataset in stores:
            dataset.close()
    medians = {name: statistics.median(values) * 1e3 for name, values in seconds.items()}
    single, sharded = medians.values()
    print(
        f"codec {options.codec}: "
        + ", ".join(f"{name} {value:.3f} ms" for name, value in medians.items())
        + f"; {SHARDS} shards at {single / sharded:.2f}x the speed of one store "
        f"(medians of {options.runs} x {BATCHES} batches of {BATCH})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
