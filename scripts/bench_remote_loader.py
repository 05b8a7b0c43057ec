"""The cache's own overhead: a DataLoader over a file:// remote dataset
against the same sharded dataset read in place.

    python scripts/bench_remote_loader.py [--runs R] [--mode IID|SEQUENTIAL] [--dir DIR]

20,000 x 12 KiB float32 records (compressible like the `store` table of
scripts/bench.py) in 16 shards. Each run is its own process (so its peak RSS
is its own), alternating local and remote (L R L R ...): a run reads one
warm-up epoch of batches (for the remote loader: the epoch that fills its
cache, whose budget holds the whole dataset), then times the next 200
batches of 256 (num_workers=2). Prints each run, the median batches/s of
each, the ratio of the medians (remote / local) and the peak RSS of each
(median over runs). Speed reports only: not a test.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

try:
    import loaderx
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import loaderx
from loaderx import shards

COUNT, FLOATS, SHARDS, BATCH, TIMED = 20000, 3072, 16, 256, 200


def build(root: Path) -> None:
    if (root / "data" / "manifest.msgpack").exists():
        return
    rng = np.random.default_rng(0)
    per = COUNT // SHARDS
    for k in range(SHARDS):
        rows = (rng.normal(size=(per, FLOATS)) * 4).round().astype(np.float32)
        shards.write_shard(root / "data", k, rows)
    shards.commit(root / "data")


def run(kind: str, root: Path, mode: str) -> dict[str, float]:
    if kind == "local":
        dataset = loaderx.DenseDataset(root / "data")
    else:
        dataset = loaderx.DenseDataset(f"file://{root / 'data'}", cache_dir=root / "cache")
    loader = loaderx.DataLoader({"x": dataset}, num_workers=2, batch_size=BATCH, mode=mode)
    for _ in range(COUNT // BATCH):  # one epoch: fills the remote cache
        next(loader)
    began = time.perf_counter()
    for _ in range(TIMED):
        next(loader)
    seconds = time.perf_counter() - began
    loader.close()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"batches_per_s": TIMED / seconds, "peak_rss": peak}


def gather_medians(root: Path, mode: str) -> None:
    """In one process, batch by batch in turn: the median milliseconds of a
    local and of a remote (warm cache) gather of the same indices."""
    local = loaderx.DenseDataset(root / "data")
    remote = loaderx.DenseDataset(f"file://{root / 'data'}", cache_dir=root / "cache")
    sampler = loaderx.Sampler(COUNT, BATCH, mode, seed=1)
    out = np.empty((BATCH, FLOATS), np.float32)
    times: dict[str, list[float]] = {"local": [], "remote": []}
    for step in range(400 + COUNT // BATCH):
        indices = sampler.batch(step)
        order = (local, remote) if step % 2 else (remote, local)
        for dataset in order:
            began = time.perf_counter()
            dataset.gather_into(indices, out)
            if step >= COUNT // BATCH:  # the first epoch fills the cache
                times["local" if dataset is local else "remote"].append(time.perf_counter() - began)
    medians = {kind: statistics.median(values) * 1e3 for kind, values in times.items()}
    print(
        f"gather, one process, {mode}: local {medians['local']:.3f} ms, remote "
        f"{medians['remote']:.3f} ms per batch of {BATCH} (median of 400 each), "
        f"overhead {medians['remote'] - medians['local']:+.3f} ms"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--mode", default="IID")
    parser.add_argument("--dir", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--gather", action="store_true", help="time single gathers in one process instead"
    )
    options = parser.parse_args(argv)
    if options.gather:
        root = Path(options.dir or tempfile.mkdtemp(prefix="bench-remote-"))
        build(root)
        gather_medians(root, options.mode)
        return 0
    if options.child:
        print(json.dumps(run(options.child, Path(options.dir), options.mode)))
        return 0
    root = Path(options.dir or tempfile.mkdtemp(prefix="bench-remote-"))
    build(root)
    results: dict[str, list[dict[str, float]]] = {"local": [], "remote": []}
    for number in range(options.runs):
        for kind in ("local", "remote"):
            out = subprocess.run(
                [sys.executable, __file__, "--child", kind, "--dir", str(root)]
                + ["--mode", options.mode],
                check=True,
                capture_output=True,
                text=True,
                timeout=600,
            ).stdout
            result = json.loads(out.strip().splitlines()[-1])
            results[kind].append(result)
            print(
                f"run {number} {kind:6} {result['batches_per_s']:8.1f} batches/s "
                f"peak RSS {result['peak_rss'] / 2**20:7.1f} MiB",
                flush=True,
            )
    medians = {
        kind: {
            key: statistics.median(r[key] for r in runs) for key in ("batches_per_s", "peak_rss")
        }
        for kind, runs in results.items()
    }
    ratio = medians["remote"]["batches_per_s"] / medians["local"]["batches_per_s"]
    for kind, median in medians.items():
        print(
            f"{kind:6} median {median['batches_per_s']:8.1f} batches/s, peak RSS "
            f"{median['peak_rss'] / 2**20:7.1f} MiB"
        )
    print(f"remote / local batches/s: {ratio:.3f} ({options.mode}, {options.runs} runs each)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
