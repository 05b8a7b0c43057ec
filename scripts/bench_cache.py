"""Fetches and bytes of the unit cache, Belady's MIN against LRU, on a local S3 server.

    python scripts/bench_cache.py [--units N] [--unit-kib K] [--epochs E] [--seed S]

N whole objects of K KiB (the units: think shards) in a bucket of moto's S3
server on 127.0.0.1, read one per step in an order shuffled anew each epoch,
for E epochs, through a UnitCache whose budget is 25%, 50% and 75% of the
data: with the plan (Belady's MIN; demand fetches only, then with prefetch)
and without (LRU). Prints, per budget and policy, the fetches, the MiB
downloaded, their ratio to the data, and the wall time; then the server's
measured latency (a 1-byte get) and bandwidth (a large get). The server is
local, so latency is small and wall times say little: the counts matter.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

try:
    import loaderx  # noqa: F401
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from s3_fixture import create_bucket, s3_environment

from loaderx import _cache, _remote


def start_server() -> tuple[str, object]:
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    class Quiet(MotoRequestHandler):
        def log(self, type, message, *args):  # noqa: A002 (werkzeug's names)
            pass  # one line per request

    server = make_server(
        "127.0.0.1",
        0,
        DomainDispatcherApplication(create_backend_app),
        threaded=True,
        request_handler=Quiet,
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}", server


def run(source, units, sequence, budget, policy) -> tuple[int, int, float, str]:
    plan = [[units[i]] for i in sequence] if policy != "lru" else None
    threads = 2 if policy == "belady+prefetch" else 0
    with tempfile.TemporaryDirectory() as directory:
        began = time.perf_counter()
        with _cache.UnitCache(
            directory, budget, source, plan=plan, prefetch_threads=threads
        ) as cache:
            for step, index in enumerate(sequence):
                with cache.acquire(units[index], step if plan else None) as pin:
                    pin.read(0, 1)
            stats = cache.stats
            latency, bandwidth = cache.link.fit()
            link = (
                (
                    f"fit L={latency * 1e3:.1f} ms B={bandwidth / 2**20:.0f} MiB/s "
                    f"depth={cache.prefetch_depth()}"
                )
                if threads
                else ""
            )
        return stats.fetches, stats.bytes_fetched, time.perf_counter() - began, link


def measure_link(source) -> tuple[float, float]:
    source.put("tiny", b"x")
    source.put("big", os.urandom(16 * 2**20))
    small = []
    for _ in range(20):
        began = time.perf_counter()
        source.get("tiny")
        small.append(time.perf_counter() - began)
    began = time.perf_counter()
    size = len(source.get("big"))
    seconds = time.perf_counter() - began
    latency = sorted(small)[len(small) // 2]
    return latency, size / max(1e-9, seconds - latency)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--units", type=int, default=40)
    parser.add_argument("--unit-kib", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args(argv)
    endpoint, _server = start_server()
    os.environ.update(s3_environment(endpoint))
    create_bucket(endpoint, "bench")
    source = _remote.open_source("s3://bench/units")
    size = options.unit_kib * 1024
    infos = [source.put(f"u{i:04d}", os.urandom(size)) for i in range(options.units)]
    units = [_cache.object_unit(source.head(info.key)) for info in infos]
    order = random.Random(options.seed)
    sequence: list[int] = []
    for _ in range(options.epochs):
        epoch = list(range(options.units))
        order.shuffle(epoch)
        sequence += epoch
    data = options.units * size
    print(
        f"{options.units} units x {options.unit_kib} KiB = {data / 2**20:.1f} MiB, "
        f"{options.epochs} epochs shuffled per epoch, {len(sequence)} reads"
    )
    print("budget  policy           fetches  MiB fetched  x data  seconds")
    for fraction in (0.25, 0.50, 0.75):
        for policy in ("lru", "belady", "belady+prefetch"):
            fetches, fetched, seconds, link = run(
                source, units, sequence, int(data * fraction), policy
            )
            print(
                f"{fraction:>5.0%}   {policy:<15} {fetches:>8} {fetched / 2**20:>12.1f} "
                f"{fetched / data:>7.2f} {seconds:>8.2f}  {link}"
            )
    latency, bandwidth = measure_link(source)
    print(
        f"server: latency {latency * 1e3:.2f} ms (median 1-byte get), "
        f"bandwidth {bandwidth / 2**20:.0f} MiB/s (one 16 MiB get)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
