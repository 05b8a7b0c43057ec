"""The bundled CPU-level builds of the native library against a build for this CPU.

    python scripts/bench_cpu.py [--quick]

An install carries the library built for the x86-64 baseline, x86-64-v3 and
x86-64-v4 and loads the best one the CPU runs (src/loaderx/_native.py). This
script measures what that costs against a library compiled with
`-Dcpu=native` (what an install built before the wheels were portable): it
compiles a native build into a temporary directory, loads every build into
this one process with cffi, and times each row build after build in rotating
order, so noise on a shared machine hits all of them alike. Every figure is a
median over rounds; `picked / native` is the median of the per-round ratios
(above 1: the build `import loaderx` picks is faster than the native one).
The rows are the CPU-bound parts of `scripts/bench.py sampler` and `store`:
sampler batches, warm gathers from a raw and a zstd store, and verify (XXH3
over every record). A bundled build
this CPU cannot run is named above the table with the flags it lacks.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from bench_common import BATCH_SIZE, markdown_table, structured_rows  # noqa: E402

from loaderx import Zrecord, _native  # noqa: E402
from loaderx._native import ffi  # noqa: E402


def native_build(directory: Path) -> Path:
    """Compile the library for this machine's CPU (the build's own default target)."""
    sys.path.insert(0, str(ROOT / "build_backend"))
    from loaderx_build import library_flags, target_arch

    command = [
        sys.executable,
        "-m",
        "ziglang",
        "build",
        *library_flags(target_arch()),
        "--prefix",
        str(directory),
    ]
    subprocess.run(command, cwd=ROOT, check=True)
    return directory / "lib" / "libloaderx.so"


def load_builds(native: Path) -> dict:
    """name -> loaded library, for the native build and every bundled build this CPU runs."""
    flags = _native.cpu_flags()
    names = [_native.BASELINE] + [
        name for name, needed in _native.CPU_LEVELS.items() if needed <= flags
    ]
    builds = {"native": ffi.dlopen(str(native))}
    for name in names:
        if _native.library_path(name).exists():
            builds[name] = ffi.dlopen(str(_native.library_path(name)))
    return builds


def untimed_builds() -> list[str]:
    """One line per bundled build this CPU cannot run (loading it would die with SIGILL), saying
    what it lacks."""
    flags = _native.cpu_flags()
    return [
        f"{name}: not timed, this CPU lacks {', '.join(sorted(needed - flags))}"
        for name, needed in _native.CPU_LEVELS.items()
        if not needed <= flags and _native.library_path(name).exists()
    ]


def interleaved(builds: dict, run, rounds: int) -> dict:
    """name -> list of `run(library)` over `rounds`, the builds' order rotated each round.

    Each run is short (about a millisecond), so a burst of load from other
    processes lands on neighbouring runs of different builds alike.
    """
    names = list(builds)
    samples = {name: [] for name in names}
    for round_number in range(rounds):
        for offset in range(len(names)):
            name = names[(round_number + offset) % len(names)]
            samples[name].append(run(builds[name]))
    return samples


def sampler_rows(builds: dict, quick: bool) -> list:
    """µs per batch of lx_sampler_batch, IID and CYCLIC over 0..1,000,000."""
    rows = []
    for mode, label in ((1, "IID"), (2, "CYCLIC")):
        for batch in (256, 1024) if quick else (256, 1024, 8192):
            config = ffi.new(
                "lx_sampler_config *",
                {
                    "length": 1_000_000,
                    "batch_size": batch,
                    "seed": 42,
                    "rank": 0,
                    "world_size": 1,
                    "mode": mode,
                    "reserved": 0,
                },
            )
            out = np.empty(batch, dtype=np.uint64)
            target = ffi.cast("uint64_t *", out.ctypes.data)
            calls = max(1, 200_000 // batch)

            def run(library, config=config, target=target, batch=batch, calls=calls) -> float:
                started = time.perf_counter()
                for step in range(calls):
                    library.lx_sampler_batch(config, step, target, batch)
                return (time.perf_counter() - started) / calls * 1e6

            rows.append(
                (
                    f"sampler {label} {batch}",
                    "µs / batch",
                    False,
                    interleaved(builds, run, 21 if quick else 301),
                )
            )
    return rows


def store_rows(builds: dict, quick: bool, directory: Path) -> list:
    """Warm gathers (MiB/s) from a raw and a zstd store, and verify of the whole zstd store."""
    records = structured_rows(2000 if quick else 20000)
    record_bytes = records[0].nbytes
    batches = np.random.default_rng(1).integers(0, len(records), (8, BATCH_SIZE)).astype(np.uint64)
    out = np.empty(BATCH_SIZE * record_bytes, dtype=np.uint8)
    rows = []
    for codec in ("raw", "zstd"):
        path = directory / codec
        with Zrecord(path, codec=codec) as store:
            store.append(records.tobytes(), np.arange(len(records), dtype=np.uint64) * record_bytes)
        handles = {}
        for name, library in builds.items():
            handle = ffi.new("lx_store **")
            assert library.lx_store_open(str(path).encode(), 0, 0, handle) == 0, name
            handles[name] = (library, handle[0])

        def gather(library, handles=handles) -> float:
            store = next(h for lib, h in handles.values() if lib is library)
            started = time.perf_counter()
            for indices in batches:
                status = library.lx_store_gather(
                    store,
                    ffi.cast("uint64_t *", indices.ctypes.data),
                    BATCH_SIZE,
                    ffi.cast("uint8_t *", out.ctypes.data),
                    out.nbytes,
                    ffi.NULL,
                )
                assert status == 0
            return batches.size * record_bytes / 2**20 / (time.perf_counter() - started)

        gather(builds["native"])  # warm the page cache
        rows.append(
            (
                f"store gather {codec}",
                "MiB/s",
                True,
                interleaved(builds, gather, 11 if quick else 201),
            )
        )
        if codec == "zstd":
            damaged, found = np.empty(16, dtype=np.uint64), ffi.new("uint64_t *")

            def verify(library, handles=handles, damaged=damaged, found=found) -> float:
                store = next(h for lib, h in handles.values() if lib is library)
                started = time.perf_counter()
                assert (
                    library.lx_store_verify(
                        store, 0, 1000, ffi.cast("uint64_t *", damaged.ctypes.data), found
                    )
                    == 0
                    and found[0] == 0
                )
                return 1000 * record_bytes / 2**20 / (time.perf_counter() - started)

            rows.append(
                (
                    "store verify zstd",
                    "MiB/s",
                    True,
                    interleaved(builds, verify, 11 if quick else 201),
                )
            )
        for library, handle in handles.values():
            library.lx_store_close(handle)
    return rows


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes and few rounds (seconds)")
    arguments = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="loaderx-bench-cpu-") as temporary:
        builds = load_builds(native_build(Path(temporary) / "native"))
        rows = sampler_rows(builds, arguments.quick) + store_rows(
            builds, arguments.quick, Path(temporary)
        )
    picked = _native.VARIANT
    table = []
    for row, unit, higher_is_better, samples in rows:
        # The ratio is paired: picked against native within each round, then the median.
        pairs = [
            p / n if higher_is_better else n / p for p, n in zip(samples[picked], samples["native"])
        ]
        table.append(
            [row, unit]
            + [f"{statistics.median(samples[name]):,.2f}" for name in builds]
            + [f"{statistics.median(pairs):.3f}x"]
        )
    print(f"import picks: {picked}; {len(rows[0][3]['native'])} rounds per sampler row")
    print("".join(f"{line}\n" for line in untimed_builds()))
    print(markdown_table(["row", "unit", *builds, "picked / native"], table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
