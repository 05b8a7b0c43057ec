"""A process reading a remote dataset through a cache directory others share,
for tests/test_remote_dataset.py:
``python remote_worker.py MODE URL CACHE_DIR BUDGET``.

MODE ``read``: every record of the dense dataset at URL, SEQUENTIAL through
a DataLoader; prints one JSON line (fetches, bytes fetched, the sum of the
records). MODE ``hang``: every get of a shard's objects stalls for a minute (for the
parent to SIGKILL this process mid-download).
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

import loaderx
from loaderx import _remote, _remote_dataset


class Stalling:
    """Gets of a shard's objects stall for a minute (the manifest is read)."""

    def __init__(self, inner):
        self.inner = inner
        self.url = inner.url

    def get(self, key, etag=None):
        if "/" in key:
            time.sleep(60)
        return self.inner.get(key, etag)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def stalling(url, storage_options):
    return Stalling(_remote.open_source(url, storage_options))


def main() -> None:
    mode, url, cache_dir, budget = sys.argv[1:5]
    if mode == "hang":
        _remote_dataset.make_source = stalling
    dataset = loaderx.DenseDataset(url, cache_dir=cache_dir, cache_bytes=int(budget))
    steps = len(dataset) // 50
    total = 0.0
    with loaderx.DataLoader({"x": dataset}, num_workers=1, batch_size=50, mode=0) as loader:
        for _ in range(steps):
            total += float(np.asarray(next(loader)["x"], dtype=np.float64).sum())
    stats = dataset.store.cache.stats
    print(json.dumps({"fetches": stats.fetches, "bytes": stats.bytes_fetched, "sum": total}))
    dataset.close()


if __name__ == "__main__":
    main()
