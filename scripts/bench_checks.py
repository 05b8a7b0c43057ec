"""The cost of checked reads: gather time with record checksums checked
(``verify=True``) against unchecked (``verify=False``), per codec and layout,
and what the default (``verify=None``) does. One run, every configuration
interleaved, medians of several timed repeats.

    python scripts/bench_checks.py [--repeats 7] [--mib 64]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np

from loaderx import Zrecord

BATCH = 256


def build(root: str, name: str, codec: str, lengths: np.ndarray, rng: np.random.Generator) -> str:
    """A store of records of ``lengths`` bytes: low-entropy bytes zstd shrinks."""
    path = os.path.join(root, name)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.uint64)
    source = (rng.integers(0, 16, int(lengths.sum()), dtype=np.uint8) * 3).astype(np.uint8)
    with Zrecord(path, codec=codec) as store:
        for start in range(0, lengths.size, 65536):  # bounded batches
            end = min(lengths.size, start + 65536)
            base = int(offsets[start])
            stop = int(offsets[end]) if end < lengths.size else source.size
            store.append(source[base:stop], offsets[start:end] - base)
    return path


def configurations(mib: int) -> list[tuple[str, str, np.ndarray]]:
    rng = np.random.default_rng(1)
    total = mib << 20
    ragged = rng.integers(200, 6000, total // 3100).astype(np.uint64)
    return [
        ("raw dense 64 B (fixed)", "raw", np.full(total // 64, 64, np.uint64)),
        ("raw dense 4 KiB (fixed)", "raw", np.full(total // 4096, 4096, np.uint64)),
        ("raw ragged (indexed)", "raw", ragged),
        ("zstd 64 B", "zstd", np.full(total // 64, 64, np.uint64)),
        ("zstd 4 KiB", "zstd", np.full(total // 4096, 4096, np.uint64)),
        ("zstd_shuffle4 4 KiB", "zstd_shuffle4", np.full(total // 4096, 4096, np.uint64)),
        ("zstd ragged", "zstd", ragged),
    ]


def gather_seconds(store: Zrecord, batches: list[np.ndarray], lengths: np.ndarray) -> float:
    """One pass over ``batches`` of random indices, decoded into one buffer."""
    start = time.perf_counter()
    for indices in batches:
        sizes = lengths[indices]
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.uint64)
        target = np.empty(int(sizes.sum()), np.uint8)
        store.gather(indices, target, offsets)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--mib", type=int, default=64, help="bytes of records per store, in MiB")
    parser.add_argument("--batches", type=int, default=200)
    args = parser.parse_args()
    rng = np.random.default_rng(2)
    print(
        f"checked reads: random batches of {BATCH}, {args.batches} batches per pass, "
        f"median of {args.repeats} passes, warm page cache, cpus={os.cpu_count()}"
    )
    print(
        "unchecked: verify=False; default: verify=None (checks the indexed layout); all: "
        "verify=True (every read, and lengths() too)"
    )
    print(
        f"{'store':26} {'layout':>8} {'stored/raw':>10} {'unchecked ms':>13} {'default ms':>11} "
        f"{'ratio':>6} {'all ms':>8} {'ratio':>6}"
    )
    with tempfile.TemporaryDirectory() as root:
        for label, codec, lengths in configurations(args.mib):
            path = build(
                root, label.replace(" ", "_").replace("(", "").replace(")", ""), codec, lengths, rng
            )
            handles = {verify: Zrecord(path, verify=verify) for verify in (False, True, None)}
            batches = [
                np.sort(rng.integers(0, lengths.size, BATCH)).astype(np.uint64)
                for _ in range(args.batches)
            ]
            times: dict[bool | None, list[float]] = {verify: [] for verify in handles}
            gather_seconds(handles[False], batches, lengths)  # warm the page cache
            for _ in range(args.repeats):
                for verify, store in handles.items():  # interleaved: drift hits all alike
                    times[verify].append(gather_seconds(store, batches, lengths))
            unchecked, default, checked = (statistics.median(times[v]) for v in (False, None, True))
            layout = handles[False].stats()["layout"]
            ratio_stored = handles[False].stats()["live_bytes"] / float(lengths.sum())
            print(
                f"{label:26} {layout:>8} {ratio_stored:10.2f} {unchecked * 1e3:13.1f} "
                f"{default * 1e3:11.1f} {default / unchecked:6.2f} {checked * 1e3:8.1f} "
                f"{checked / unchecked:6.2f}"
            )
            for store in handles.values():
                store.close()


if __name__ == "__main__":
    main()
