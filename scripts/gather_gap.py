"""Where a raw loaderx gather loses against the memory ceiling (issue #30).

    python scripts/gather_gap.py [--rounds N] [--quick]

The bench's raw store (20,000 records of 12 KiB, written by from_numpy) and
its 200 random batches of 256, gathered in interleaved rounds by:

- the memory ceiling (bench_ceilings.MemoryGather): memcpy of the same
  batches into one reused batch array, from the in-memory records
  (anonymous memory) and from a mapping of the store's own data file (the
  page cache, as loaderx reads it), with glibc's memcpy and with Zig's
  @memcpy (the copy the loaderx library is built with), on 1 and 2 threads;
- loaderx: `Zrecord.gather` into a reused array on 1 thread and on its
  default (one per core), `DenseDataset.gather_into` into a fresh
  `np.empty` per batch (the bench's bare loop), and the gather into a
  page-aligned array (the ceiling's own destination is a NumPy array, 16
  bytes past a page);
- the memory ceiling with a hand-off per batch: the threads woken for each
  batch and waited for (sleeping on a futex, or spinning, in between), as
  a gather call per batch does;
- per-call overhead: a gather of one record, many times.

Prints each variant's median MiB/s, the median over rounds of its ratio to
the memory ceiling on the same round (libc, in-memory source, as many
threads as it uses), the process's CPU seconds per wall second (how many
cores it got: a second thread on a busy machine may get little), MiB per
CPU second (the work per core, whatever the machine gave), the minor page
faults per batch, and the load average.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_ceilings
from bench_common import BATCH_SIZE, MiB, markdown_table, structured_rows


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def variants(rows, mapped, batches, stores, dataset, gather):
    """name -> (threads it runs on, function returning seconds for all batches)."""
    out = np.empty((BATCH_SIZE, rows.shape[1]), dtype=rows.dtype)
    spare = np.zeros(out.nbytes + 4096, dtype=np.uint8)
    start = (-spare.ctypes.data) % 4096
    aligned = spare[start : start + out.nbytes].view(rows.dtype).reshape(out.shape)

    def ceiling(source, threads, copy, target=out):
        return lambda: gather.seconds(source, batches, target, threads, copy)

    def store_gather(store, target):
        def run():
            begin = time.perf_counter()
            for indices in batches:
                store.gather(indices, target)
            return time.perf_counter() - begin

        return run

    def bare():
        begin = time.perf_counter()
        for indices in batches:
            dataset.gather_into(indices, np.empty(out.shape, out.dtype))
        return time.perf_counter() - begin

    table = {}
    copies = [
        ("libc memcpy, in memory", rows, "libc", out),
        ("zig memcpy, in memory", rows, "zig", out),
        ("libc memcpy, page cache", mapped, "libc", out),
        ("zig memcpy, page cache", mapped, "zig", out),
        ("libc, in memory, aligned out", rows, "libc", aligned),
    ]
    for threads in (1, 2):
        for label, source, copy, target in copies:
            table[f"ceiling: {label}, {threads}t"] = (
                threads,
                ceiling(source, threads, copy, target),
            )
    for handoff in ("futex", "spin"):
        table[f"ceiling: libc, in memory, hand-off per batch ({handoff}), 2t"] = (
            2,
            lambda handoff=handoff: gather.seconds(rows, batches, out, 2, "libc", handoff),
        )
    for threads, store in stores.items():
        table[f"Zrecord.gather, reused out, {threads}t"] = (threads, store_gather(store, out))
    table["Zrecord.gather, aligned out, 2t"] = (2, store_gather(stores[2], aligned))
    table["gather_into np.empty (bare loop), default"] = (bench_ceilings.cores(), bare)
    return table


def per_call(store, rows, calls: int) -> float:
    """Seconds per gather of one record (the fixed cost of a call)."""
    out = np.empty((1, rows.shape[1]), dtype=rows.dtype)
    indices = np.random.default_rng(3).integers(0, len(rows), (calls, 1))
    begin = time.perf_counter()
    for index in indices:
        store.gather(index, out)
    return (time.perf_counter() - begin) / calls


def report(table, seconds, cpu, faults, gathered: int) -> list[list[str]]:
    """One table row per variant: medians, and the paired ratio to the
    libc in-memory ceiling on as many threads."""
    rows_out = []
    for name, (threads, _) in table.items():
        reference = seconds[f"ceiling: libc memcpy, in memory, {min(threads, 2)}t"]
        ratios = [ceiling / own for ceiling, own in zip(reference, seconds[name])]
        rows_out.append(
            [
                name,
                f"{gathered / statistics.median(seconds[name]) / MiB:,.0f}",
                f"{statistics.median(ratios):.2f}x",
                f"{statistics.median(c / w for c, w in zip(cpu[name], seconds[name])):.2f}",
                f"{gathered / statistics.median(cpu[name]) / MiB:,.0f}",
                f"{statistics.median(faults[name]):.1f}",
            ]
        )
    return rows_out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="2,000 records, 3 rounds")
    arguments = parser.parse_args(argv)
    from loaderx import DenseDataset, from_numpy
    from loaderx.zrecord import Zrecord

    count, rounds = (2000, 3) if arguments.quick else (20000, arguments.rounds)
    rows = structured_rows(count)
    batches = np.random.default_rng(1).integers(0, count, (200, BATCH_SIZE))
    with tempfile.TemporaryDirectory(prefix="loaderx-gather-gap-") as temporary:
        path = Path(temporary) / "store"
        from_numpy(path, rows, codec="raw", progress=False)
        data = next(path.glob("data-*"))
        mapped = np.memmap(data, dtype=rows.dtype, mode="r", shape=rows.shape)
        stores = {1: Zrecord(path, threads=1), 2: Zrecord(path)}
        dataset = DenseDataset(path)
        gather = bench_ceilings.MemoryGather()
        table = variants(rows, mapped, batches, stores, dataset, gather)
        for _, run in table.values():  # pages mapped, libraries loaded
            run()
        seconds = {name: [] for name in table}
        cpu = {name: [] for name in table}
        faults = {name: [] for name in table}
        loads = []
        for _ in range(rounds):
            loads.append(os.getloadavg()[0])
            for name, (_, run) in table.items():
                before, used = _faults(), time.process_time()
                seconds[name].append(run())
                cpu[name].append(time.process_time() - used)
                faults[name].append((_faults() - before) / len(batches))
        calls = {threads: per_call(store, rows, 20000) for threads, store in stores.items()}
        for store in stores.values():
            store.close()
        dataset.close()
        del mapped
    rows_out = report(table, seconds, cpu, faults, batches.size * rows[0].nbytes)
    print(
        f"### gather gap: {count:,} records of {rows[0].nbytes // 1024} KiB, 200 random batches "
        f"of {BATCH_SIZE}, {rounds} interleaved rounds, {bench_ceilings.cores()} cores\n"
    )
    print(
        markdown_table(
            [
                "variant",
                "MiB/s",
                "x libc ceiling (paired)",
                "CPU s / wall s",
                "MiB / CPU s",
                "minor faults / batch",
            ],
            rows_out,
        )
    )
    print(
        "\nOne record per call: "
        + ", ".join(
            f"{threads} thread(s) {seconds * 1e6:.2f} µs" for threads, seconds in calls.items()
        )
        + f". Load average (1 min) at each round: {min(loads):.2f} to {max(loads):.2f}, "
        f"median {statistics.median(loads):.2f}."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
