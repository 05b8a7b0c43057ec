"""Where the first in-place replace on a freshly opened store goes, against
numpack + fsync: the measurement behind the numpack table's three durable
replace rows that loaderx loses (README, "ArrayStore against numpack").

    python scripts/first_write_floors.py [--quick] [--runs N]

The numpack table's arrays: `a`, 1,000,000 x 10 float32 (100,000 with
--quick), and `b`, half as many rows of 5. Rows of `a` are replaced. For each batch
size (one row, 10,000 contiguous rows: 1,000 with --quick, and half of `a`)
every run
copies the saved store (untimed), runs `os.sync()` and `gc.collect()` as
the numpack table does, and times one of:

- `ArrayStore`: opened untimed, then `replace` (the numpack table's row);
- `Zrecord`: the array's store opened and replaced directly, without
  ArrayStore's root lock, schema and checks (its open also timed alone);
- `replica`: the system calls loaderx's journal makes, from Python, with no
  open, no checksum and no check: read the edge blocks, write the record
  (rows, then its header and row list) to the journal, fdatasync it, write
  the rows in place and their block sums;
- `bare`: the rows written to the journal, one fdatasync, the rows written
  in place; what any replace that is atomic through a power loss must do;
- `numpack + fsync`: as in the numpack table.

`replica` and `bare` are timings, not replaces: they leave the copy's sums
wrong. Each cell is the median (first quartile in brackets) of N runs,
each starting at the next variant. Directories live under the system
temporary directory.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
try:
    import loaderx  # noqa: F401
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from bench_numpack import NUMPACK_INSTALL, fsync_tree

from loaderx import ArrayStore
from loaderx.zrecord import Zrecord

BLOCK_BYTES = 16 * 1024  # a fixed store's checksum block
RECORD_HEADER_BYTES = 72  # a journal record's header
JOURNAL_PAGE_HEADER_BYTES = 64  # records start after it (journal version 2)


def store_files(array_dir: Path) -> dict[str, str]:
    """The names of the array's data, sums and journal files."""
    names = {}
    for kind in ("data", "sums", "journal"):
        (names[kind],) = [
            path.name for path in array_dir.iterdir() if path.name.startswith(kind + "-")
        ]
    return names


def replica(array_dir: Path, files: dict[str, str], rows: np.ndarray, start: int) -> None:
    stride = rows.shape[1] * rows.itemsize
    first, end = start * stride, (start + len(rows)) * stride
    blocks = list(range(first // BLOCK_BYTES, (end - 1) // BLOCK_BYTES + 1))
    header_bytes = RECORD_HEADER_BYTES + 8 * len(rows) + 16 * len(blocks)
    descriptors: list[int] = []
    try:
        for kind in ("data", "sums", "journal"):
            descriptors.append(os.open(array_dir / files[kind], os.O_RDWR))
        data, sums, journal = descriptors
        for block in {blocks[0], blocks[-1]}:  # the edge blocks, for their new sums
            os.pread(data, BLOCK_BYTES, block * BLOCK_BYTES)
        os.pwrite(journal, rows, JOURNAL_PAGE_HEADER_BYTES + header_bytes)
        os.pwrite(journal, bytes(header_bytes), JOURNAL_PAGE_HEADER_BYTES)
        os.fdatasync(journal)
        os.pwrite(data, rows, first)
        os.pwrite(sums, bytes(8 * len(blocks)), blocks[0] * 8)
    finally:
        for descriptor in descriptors:
            os.close(descriptor)


def bare(array_dir: Path, files: dict[str, str], rows: np.ndarray, start: int) -> None:
    journal = os.open(array_dir / files["journal"], os.O_RDWR)
    try:
        os.pwrite(journal, rows, JOURNAL_PAGE_HEADER_BYTES)
        os.fdatasync(journal)
    finally:
        os.close(journal)
    data = os.open(array_dir / files["data"], os.O_RDWR)
    try:
        os.pwrite(data, rows, start * rows.shape[1] * rows.itemsize)
    finally:
        os.close(data)


def measure(saved: dict, work: Path, rows: np.ndarray, length: int, runs: int, numpack) -> dict:
    """Samples (seconds) per variant for replacing ``rows`` at varying starts."""
    variants = ["ArrayStore", "Zrecord", "replica", "bare"] + (
        ["numpack + fsync"] if numpack else []
    )
    samples: dict[str, list[float]] = {name: [] for name in variants + ["Zrecord open"]}
    offsets = np.arange(len(rows), dtype=np.uint64) * np.uint64(rows.shape[1] * rows.itemsize)
    files = store_files(saved["loaderx"] / "a")  # every copy has the saved store's names
    for run in range(runs):
        start = (run * 7919) % (length - len(rows))
        key = slice(start, start + len(rows)) if len(rows) > 1 else [start]
        shift = run % len(variants)
        for name in variants[shift:] + variants[:shift]:
            shutil.rmtree(work, ignore_errors=True)
            shutil.copytree(saved["numpack" if name == "numpack + fsync" else "loaderx"], work)
            handle = None
            if name == "ArrayStore":
                handle = ArrayStore(work)
            elif name == "numpack + fsync":
                handle = numpack(str(work), warn_no_context=False)
                handle.open()
            os.sync()
            gc.collect()
            started = time.perf_counter()
            if name == "Zrecord":
                handle = Zrecord(work / "a", _existing=True)
                samples["Zrecord open"].append(time.perf_counter() - started)
                handle.replace(
                    np.arange(start, start + len(rows), dtype=np.uint64), rows, offsets, codec="raw"
                )
            elif name == "replica":
                replica(work / "a", files, rows, start)
            elif name == "bare":
                bare(work / "a", files, rows, start)
            else:
                handle.replace({"a": rows}, key)
                if name == "numpack + fsync":
                    fsync_tree(work)
            samples[name].append(time.perf_counter() - started)
            if handle is not None:
                handle.close()
    shutil.rmtree(work, ignore_errors=True)
    return samples


def cell(values: list[float]) -> str:
    return (
        f"{statistics.median(values) * 1e3:.3f} ms ({np.percentile(values, 25) * 1e3:.3f})"
        if values
        else "skipped"
    )


def first_write_floors(quick: bool, runs: int) -> str:
    length = 100_000 if quick else 1_000_000
    block = 1_000 if quick else 10_000
    rng = np.random.default_rng(7)
    arrays = {
        "a": rng.random((length, 10), dtype=np.float32),
        "b": rng.random((length // 2, 5), dtype=np.float32),
    }
    try:
        from numpack import NumPack
    except ImportError:
        NumPack = None
    sizes = {
        "1 row": rng.random((1, 10), dtype=np.float32),
        f"{block:,} contiguous rows": rng.random((block, 10), dtype=np.float32),
        f"{length // 2:,} rows": rng.random((length // 2, 10), dtype=np.float32),
    }
    with tempfile.TemporaryDirectory(prefix="loaderx-first-write-") as temporary:
        root = Path(temporary)
        saved = {"loaderx": root / "loaderx", "numpack": root / "numpack"}
        with ArrayStore(saved["loaderx"]) as store:
            store.save(arrays)
        if NumPack is not None:
            with NumPack(str(saved["numpack"]), drop_if_exists=True) as pack:
                pack.save(arrays)
        columns = {
            label: measure(saved, root / "work", rows, length, runs, NumPack)
            for label, rows in sizes.items()
        }
    names = ["ArrayStore", "Zrecord", "Zrecord open", "replica", "bare", "numpack + fsync"]
    lines = [
        f"### first write: replace rows of a in a fresh copy of a = {length:,} x 10 and b = "
        f"{length // 2:,} x 5 float32, median (p25) of {runs} runs",
        "",
        "| variant | " + " | ".join(columns) + " |",
        "|---" * (len(columns) + 1) + "|",
    ]
    for name in names:
        lines.append(
            f"| {name} | "
            + " | ".join(cell(samples.get(name, [])) for samples in columns.values())
            + " |"
        )
    if NumPack is None:
        lines += ["", f"skipped: numpack not installed (pip install {NUMPACK_INSTALL})"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="100,000 rows and 3 runs")
    parser.add_argument(
        "--runs", type=int, default=None, help="runs per variant (default 30, 3 with --quick)"
    )
    arguments = parser.parse_args()
    runs = arguments.runs or (3 if arguments.quick else 30)
    print(first_write_floors(arguments.quick, runs))


if __name__ == "__main__":
    main()
