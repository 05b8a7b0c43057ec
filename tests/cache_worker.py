"""A process reading units through a UnitCache that others share, for
tests/test_cache.py: ``python cache_worker.py MODE CACHE_DIR DATA_DIR BUDGET SEED STEPS``.

MODE ``read``: STEPS random units (a seeded order), each checked against its
expected bytes while pinned, and the cache directory measured against the
budget after every step; prints one JSON line of counts. MODE ``hang``: the
first fetch stalls (for the parent to SIGKILL this process mid-download).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys
import time

from loaderx import _cache, _remote

UNIT_COUNT = 12


def unit_bytes(index: int) -> bytes:
    """The deterministic content of unit ``index`` (sizes differ: 20 to 42 KiB)."""
    seed = hashlib.sha256(str(index).encode()).digest()
    return (seed * (1 + (20 + 2 * index) * 1024 // len(seed)))[: (20 + 2 * index) * 1024]


def write_data(data_dir: str) -> None:
    os.makedirs(data_dir, exist_ok=True)
    for index in range(UNIT_COUNT):
        with open(os.path.join(data_dir, f"unit-{index}"), "wb") as f:
            f.write(unit_bytes(index))


def bytes_under(directory: str) -> int:
    total = 0
    for root, _, files in os.walk(directory):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except FileNotFoundError:
                pass
    return total


def main() -> None:
    mode, cache_dir, data_dir, budget, seed, steps = sys.argv[1:7]
    source: _remote.ObjectSource = _remote.open_source(f"file://{data_dir}")
    if mode == "hang":
        stall = _remote.Fault(0, "delay", method="get", seconds=60)
        source = _remote.FaultySource(source, [stall])
    infos = {info.key: info for info in source.list()}
    units = [_cache.object_unit(infos[f"unit-{i}"]) for i in range(UNIT_COUNT)]
    order = random.Random(int(seed))
    sequence = [order.randrange(UNIT_COUNT) for _ in range(int(steps))]
    plan = [[units[i]] for i in sequence]
    over = 0
    with _cache.UnitCache(cache_dir, int(budget), source, plan=plan, wait_seconds=60) as cache:
        for step, index in enumerate(sequence):
            with cache.acquire(units[index], step) as pin:
                time.sleep(0.001)  # hold the pin while the other process evicts
                # By path, as the native store opens a file: the name must still be there.
                with open(pin.path, "rb") as f:
                    if f.read() != unit_bytes(index) or pin.read() != unit_bytes(index):
                        raise SystemExit(f"unit {index} read wrong bytes at step {step}")
            with cache.locked():  # a consistent snapshot: no rename or eviction meanwhile
                measured = bytes_under(cache_dir)
            if measured > int(budget):
                over += 1
        stats = cache.stats
    print(
        json.dumps(
            {
                "fetches": stats.fetches,
                "over": over,
                "hits": stats.hits,
                "waits": stats.waits,
                "evictions": stats.evictions,
            }
        )
    )


if __name__ == "__main__":
    main()
