"""What BLOCK order costs in randomness and in training, and what it saves in cache.

    python scripts/bench_block.py [--shards 64] [--rows 1000] [--batch 256] [--epochs 2]

A dataset of `--shards` shards of `--rows` records each (only the indices:
no data is read for the first two tables), sampled with batches of
`--batch` for `--epochs` cycles in IID, CYCLIC and BLOCK order with
shards_per_block k = 1, 2, 4 and 8. Prints three Markdown tables:

1. Randomness: of consecutive samples in the stream, the share from the same
   shard and the mean and 90th percentile of |shard(i + 1) - shard(i)| (shards
   numbered in dataset order); distinct shards per batch (mean and max).
2. Cache: whole shards fetched over the epochs by a cache of C shards that
   evicts by Belady's MIN at batch granularity (each batch needs all its
   shards resident at once), for C = 1/8, 1/4 and 1/2 of the shards; "-"
   where one batch needs more than C shards. The data is fetched once at 1.0x.
3. Training: softmax regression in NumPy (fixed seed, SGD, learning rate
   0.5) on 10 Gaussian classes in 32 dimensions, the held-out loss at several
   steps and its mean over the last 100 steps (every 10th step): once with
   the records sorted by label before sharding, the worst case for a
   shard-local order (each shard holds one or two labels), and once with
   them shuffled before sharding (as a converter that shuffles writes them).
4. Sampler cost: microseconds per batch of CYCLIC and of BLOCK with the
   shards above and with 2^16 groups (its O(groups) layout per batch).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

try:
    import loaderx  # noqa: F401
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from loaderx import Sampler

SEED = 7
ORDERS = [("IID", "iid", None), ("CYCLIC", "cyclic", None)] + [
    (f"BLOCK k={k}", "block", k) for k in (1, 2, 4, 8)
]


def sampler(mode: str, per_block: int | None, shards: int, rows: int, batch: int) -> Sampler:
    options = (
        {} if per_block is None else {"groups": [rows] * shards, "shards_per_block": per_block}
    )
    return Sampler(shards * rows, batch, mode, seed=SEED, **options)


def shard_stream(order: Sampler, rows: int, steps: int) -> np.ndarray:
    """(steps, batch) shard numbers of the first steps batches."""
    return np.stack([order.batch(step) // rows for step in range(steps)]).astype(np.int64)


def randomness_row(name: str, shards_of: np.ndarray) -> str:
    flat = shards_of.reshape(-1)
    distance = np.abs(np.diff(flat))
    distinct = [np.unique(batch).size for batch in shards_of]
    return (
        f"| {name} | {np.mean(distance == 0):.3f} | {distance.mean():.1f} | "
        f"{np.percentile(distance, 90):.0f} | {np.mean(distinct):.1f} | {max(distinct)} |"
    )


def belady_fetches(shards_of: np.ndarray, capacity: int) -> int | None:
    """Whole-shard fetches of a cache of `capacity` shards under Belady's MIN, each
    batch's shards resident together; None when a batch needs more than capacity."""
    needs = [set(np.unique(batch).tolist()) for batch in shards_of]
    if max(len(need) for need in needs) > capacity:
        return None
    uses: dict[int, list[int]] = {}
    for step, need in enumerate(needs):
        for shard in need:
            uses.setdefault(shard, []).append(step)
    cursor = dict.fromkeys(uses, 0)
    resident: set[int] = set()
    fetches = 0
    for need in needs:
        for shard in need:
            cursor[shard] += 1  # uses[shard][cursor] is now its next use after this step
        missing = need - resident
        fetches += len(missing)
        overflow = len(resident) + len(missing) - capacity
        if overflow > 0:

            def next_use(shard: int) -> int:
                later = uses[shard]
                return later[cursor[shard]] if cursor[shard] < len(later) else 1 << 62

            victims = sorted(resident - need, key=next_use, reverse=True)[:overflow]
            resident.difference_update(victims)
        resident |= missing
    return fetches


def training_data(
    shards: int, rows: int, sort: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A training set (sorted by label if `sort`) and an unsorted held-out set of
    10 Gaussian classes in 32 dimensions, overlapping so the loss stays above 0."""
    generator = np.random.default_rng(SEED)
    centers = generator.normal(0.0, 1.0, size=(10, 32))

    def draw(count: int) -> tuple[np.ndarray, np.ndarray]:
        labels = generator.integers(0, 10, size=count)
        points = centers[labels] + generator.normal(0.0, 1.5, size=(count, 32))
        return points.astype(np.float32), labels

    points, labels = draw(shards * rows)
    order = np.argsort(labels, kind="stable") if sort else np.arange(labels.size)
    test_points, test_labels = draw(5000)
    return points[order], labels[order], test_points, test_labels


def loss(weights: np.ndarray, points: np.ndarray, labels: np.ndarray) -> float:
    logits = points @ weights
    logits -= logits.max(axis=1, keepdims=True)
    log_p = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    return float(-log_p[np.arange(labels.size), labels].mean())


def train(order: Sampler, data: tuple[np.ndarray, ...], checkpoints: list[int]) -> list[float]:
    """Held-out losses at the checkpoints of SGD on softmax regression (bias folded in)."""
    points, labels, test_points, test_labels = data
    weights = np.zeros((points.shape[1], 10))
    losses = []
    last = max(checkpoints)
    tail = []
    for step in range(last + 1):
        if step in checkpoints:
            losses.append(loss(weights, test_points, test_labels))
        if step > last - 100 and step % 10 == 0:
            tail.append(loss(weights, test_points, test_labels))
        batch = order.batch(step).astype(np.int64)
        x, y = points[batch], labels[batch]
        logits = x @ weights
        logits -= logits.max(axis=1, keepdims=True)
        probabilities = np.exp(logits)
        probabilities /= probabilities.sum(axis=1, keepdims=True)
        probabilities[np.arange(y.size), y] -= 1.0
        weights -= 0.5 * (x.T @ probabilities) / y.size
    return losses + [float(np.mean(tail))]


def training_table(args: argparse.Namespace, steps: int, sort: bool) -> None:
    data = training_data(args.shards, args.rows, sort)
    checkpoints = [0, 25, 50, 100, 200, steps - 1]
    print(f"\nrecords {'sorted by label' if sort else 'shuffled'} before sharding\n")
    print("| order | " + " | ".join(f"step {c}" for c in checkpoints) + " | last 100 |")
    print("|---|" + "---|" * (len(checkpoints) + 1))
    for name, mode, k in ORDERS:
        losses = train(sampler(mode, k, args.shards, args.rows, args.batch), data, checkpoints)
        print(f"| {name} | " + " | ".join(f"{value:.3f}" for value in losses) + " |")


def cost_table(args: argparse.Namespace) -> None:
    length = args.shards * args.rows
    rows = [
        ("CYCLIC", Sampler(length, args.batch, "cyclic", seed=SEED)),
        (f"BLOCK, {args.shards} groups", sampler("block", 4, args.shards, args.rows, args.batch)),
        (
            "BLOCK, 65536 groups",
            Sampler(1 << 20, args.batch, "block", seed=SEED, groups=[16] * (1 << 16)),
        ),
    ]
    print("\n| sampler | us per batch |")
    print("|---|---|")
    for name, order in rows:
        started = time.perf_counter()
        for step in range(2000):
            order.batch(step)
        print(f"| {name} | {(time.perf_counter() - started) / 2000 * 1e6:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", type=int, default=64)
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    steps = args.epochs * (args.shards * args.rows // args.batch)
    streams = {
        name: shard_stream(sampler(mode, k, args.shards, args.rows, args.batch), args.rows, steps)
        for name, mode, k in ORDERS
    }
    print(f"{args.shards} shards x {args.rows} records, batch {args.batch}, {steps} steps\n")
    print("| order | same shard | mean distance | p90 distance | shards/batch | max |")
    print("|---|---|---|---|---|---|")
    for name, shards_of in streams.items():
        print(randomness_row(name, shards_of))
    capacities = [max(1, args.shards * share // 8) for share in (1, 2, 4)]
    print("\n| order | " + " | ".join(f"cache {c} shards" for c in capacities) + " |")
    print("|---|" + "---|" * len(capacities))
    data_epochs = args.epochs * args.shards
    for name, shards_of in streams.items():
        cells = [belady_fetches(shards_of, capacity) for capacity in capacities]
        shown = ["-" if cell is None else f"{cell} ({cell / data_epochs:.2f}x)" for cell in cells]
        print(f"| {name} | " + " | ".join(shown) + " |")
    training_table(args, steps, sort=True)
    training_table(args, steps, sort=False)
    cost_table(args)


if __name__ == "__main__":
    main()
