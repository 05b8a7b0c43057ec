"""Conversion throughput: loaderx.ray.write_dataset on 1 and 2 Ray workers
against from_numpy in one process.

    python scripts/bench_ray.py [--quick] [--rows N] [--runs R]

The source is N rows of a 4 KiB float32 feature vector (quantized, so zstd
compresses it about 2x, like real features) and an int64 label, held in
memory: for from_numpy as two NumPy arrays, for Ray as 16 blocks put in the
object store before timing (ray.data.from_arrow). Each run converts both
columns with codec zstd into a fresh directory, timed to the commit, and is
checked against the source (in an untimed first run that also starts Ray's
workers). MB/s is source bytes (10^6) over the median of R runs,
interleaved across the three ways. Ray runs on a local cluster of
ray.init(num_cpus=2) started here; `workers` is write_dataset's
`concurrency`. Needs the [ray] extra.
"""

from __future__ import annotations

import argparse
import os
import shutil
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

from loaderx import DenseDataset, from_numpy

FEATURE_FLOATS = 1024
BLOCKS = 16


def source(rows: int) -> tuple:
    rng = np.random.default_rng(0)
    features = (rng.normal(size=(rows, FEATURE_FLOATS)) * 8).round().astype(np.float32)
    return features, np.arange(rows, dtype=np.int64)


def ray_blocks(ray, features, labels):
    """The source as BLOCKS Arrow blocks in Ray's object store."""
    import pyarrow as pa
    from ray.data.extensions import ArrowTensorArray

    bounds = np.linspace(0, len(labels), BLOCKS + 1).astype(np.int64).tolist()
    tables = [
        pa.table(
            {"features": ArrowTensorArray.from_numpy(features[a:b]), "label": pa.array(labels[a:b])}
        )
        for a, b in zip(bounds[:-1], bounds[1:])
    ]
    return ray.data.from_arrow(tables).materialize()


def convert_numpy(directory: Path, features, labels) -> None:
    from_numpy(directory / "features", features, progress=False)
    from_numpy(directory / "label", labels, progress=False)


def convert_ray(workers: int):
    def convert(directory: Path, dataset) -> None:
        from loaderx.ray import write_dataset

        write_dataset(dataset, directory, concurrency=workers)

    return convert


def check(directory: Path, features, labels) -> None:
    for name, expected in (("features", features), ("label", labels)):
        with DenseDataset(directory / name) as dataset:
            if not np.array_equal(dataset[:], expected):
                raise AssertionError(f"{directory}: column {name} differs from the source")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="8,192 rows, 1 run")
    parser.add_argument("--rows", type=int, default=65536)
    parser.add_argument("--runs", type=int, default=3)
    options = parser.parse_args(argv)
    rows, runs = (8192, 1) if options.quick else (options.rows, options.runs)
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    features, labels = source(rows)
    blocks = ray_blocks(ray, features, labels)
    ways = {
        "from_numpy, one process": lambda directory: convert_numpy(directory, features, labels),
        "loaderx.ray, 1 worker": lambda directory: convert_ray(1)(directory, blocks),
        "loaderx.ray, 2 workers": lambda directory: convert_ray(2)(directory, blocks),
    }
    seconds = {name: [] for name in ways}
    with tempfile.TemporaryDirectory(prefix="loaderx-bench-ray-") as temporary:
        # Run -1 is untimed: it starts Ray's worker processes (which then
        # import loaderx) and checks every way's output against the source.
        for run in range(-1, runs):
            for number, (name, convert) in enumerate(ways.items()):
                directory = Path(temporary) / f"{run}-{number}"
                start = time.perf_counter()
                convert(directory)
                elapsed = time.perf_counter() - start
                if run < 0:
                    check(directory, features, labels)
                else:
                    seconds[name].append(elapsed)
                shutil.rmtree(directory)
    ray.shutdown()
    total = features.nbytes + labels.nbytes
    print(
        f"### conversion: {rows:,} rows of {FEATURE_FLOATS * 4 // 1024} KiB float32 + int64 label "
        f"({total / 1e6:,.0f} MB), codec zstd, {os.cpu_count()} cores\n"
    )
    print("| way | MB/s | seconds |\n|---|---|---|")
    for name, values in seconds.items():
        median = statistics.median(values)
        print(f"| {name} | {total / 1e6 / median:,.0f} | {median:.2f} |")
    print(
        f"\nMedian of {runs} interleaved runs, each into a fresh directory and timed to the commit "
        f"(the manifests for Ray); the Ray source is {BLOCKS} blocks already in the object store."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
