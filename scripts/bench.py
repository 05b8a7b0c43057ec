"""loaderx benchmarks: speed reports, not tests.

    python scripts/bench.py all|sampler|store|loader|numpack [--quick]

Prints a machine block, then one markdown table per benchmark. Every figure
is the median of several runs (the count is printed under each table); runs
of the contenders are interleaved so a burst of noise on a shared machine
hits all of them alike. Every contender's output is checked for correctness
before it is timed. `--quick` runs small sizes and few runs in a few seconds.

Each table is a function registered in `TABLES`; a table that is not written
yet prints a line saying so.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

try:
    import loaderx  # noqa: F401
except ImportError:
    # Run from a source checkout without an install: use the tree itself.
    sys.path.insert(0, str(ROOT / "src"))


# -- the machine ------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 2**20:.1f} GiB"
    except OSError:
        pass
    return "unknown"


def _loaderx_version() -> str:
    try:
        import loaderx._native as native

        from importlib.metadata import version

        return f"{version('loaderx')} (native ABI {native.lib.lx_version()})"
    except Exception as exc:  # the benchmark still reports the machine
        return f"not importable ({exc})"


def machine_block() -> str:
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    rows = [
        ("CPU", _cpu_model()),
        ("cores", f"{os.cpu_count()} ({usable} usable by this process)"),
        ("memory", _memory()),
        ("OS", platform.platform()),
        ("Python", f"{platform.python_version()} ({platform.python_implementation()})"),
        ("NumPy", np.__version__),
        ("loaderx", _loaderx_version()),
    ]
    return "\n".join(f"- {name}: {value}" for name, value in rows)


# -- timing -----------------------------------------------------------------------


def calibrate(function: Callable[[], object], seconds: float) -> int:
    """How many calls of `function` take about `seconds`."""
    number = 1
    while True:
        start = time.perf_counter()
        for _ in range(number):
            function()
        elapsed = time.perf_counter() - start
        if elapsed >= seconds / 4 or number >= 1 << 24:
            return max(1, int(number * seconds / max(elapsed, 1e-9)))
        number *= 4


def time_interleaved(functions: dict[str, Callable[[], object]], runs: int, seconds: float) -> dict[str, float]:
    """Median seconds per call of each function over `runs` interleaved runs."""
    numbers = {name: calibrate(function, seconds) for name, function in functions.items()}
    samples: dict[str, list[float]] = {name: [] for name in functions}
    for _ in range(runs):
        for name, function in functions.items():
            number = numbers[name]
            start = time.perf_counter()
            for _ in range(number):
                function()
            samples[name].append((time.perf_counter() - start) / number)
    return {name: statistics.median(values) for name, values in samples.items()}


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


# -- sampler ----------------------------------------------------------------------


def _check_indices(name: str, batch: np.ndarray, length: int, size: int, distinct: bool) -> None:
    if batch.shape != (size,) or batch.dtype.kind not in "iu":
        raise AssertionError(f"{name}: expected {size} integers, got {batch.dtype} {batch.shape}")
    if batch.min() < 0 or batch.max() >= length:
        raise AssertionError(f"{name}: an index falls outside 0..{length}")
    if distinct and np.unique(batch).size != size:
        raise AssertionError(f"{name}: a batch without replacement repeats an index")


def bench_sampler(quick: bool) -> str:
    """Random indices over a 1M space, one Python call per batch."""
    from loaderx.sampler import Sampler

    length = 1_000_000
    sizes = (256, 1024) if quick else (256, 1024, 8192)
    runs, seconds = (3, 0.02) if quick else (7, 0.15)
    rows = []
    for size in sizes:
        rng = np.random.default_rng(0)
        np.random.seed(0)
        iid = Sampler(length, size, Sampler.Mode.IID, seed=0)
        cyclic = Sampler(length, size, Sampler.Mode.CYCLIC, seed=0)
        contenders = {
            "numpy randint": (lambda: np.random.randint(0, length, size), False),
            "numpy default_rng().integers": (lambda: rng.integers(0, length, size), False),
            "loaderx IID": (iid.next, False),
            "loaderx CYCLIC": (cyclic.next, True),
        }
        for name, (function, distinct) in contenders.items():
            _check_indices(name, function(), length, size, distinct)
        medians = time_interleaved({name: fn for name, (fn, _) in contenders.items()}, runs, seconds)
        reference = medians["numpy default_rng().integers"]
        for name, median in medians.items():
            rows.append([
                name,
                str(size),
                f"{median * 1e6:.2f}",
                f"{size / median / 1e6:.0f}",
                f"{reference / median:.2f}x",
            ])
    table = markdown_table(["sampler", "batch", "µs / batch", "M indices / s", "vs default_rng"], rows)
    return (
        f"### sampler: indices over 0..{length:,}, one call per batch\n\n{table}\n\n"
        f"Medians of {runs} interleaved runs of about {seconds * 1e3:.0f} ms each; "
        "`vs default_rng` above 1 is faster."
    )


# -- registry ---------------------------------------------------------------------

TABLES: dict[str, Callable[[bool], str] | None] = {
    "sampler": bench_sampler,
    "store": None,
    "loader": None,
    "numpack": None,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("table", choices=["all", *TABLES], help="which benchmark to run")
    parser.add_argument("--quick", action="store_true", help="small sizes and few runs (seconds)")
    arguments = parser.parse_args(argv)

    print("## machine\n")
    print(machine_block())
    names = list(TABLES) if arguments.table == "all" else [arguments.table]
    for name in names:
        print()
        table = TABLES[name]
        if table is None:
            print(f"### {name}: table not implemented yet")
            continue
        print(table(arguments.quick), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
