"""The durable write that stalls after a delete: a reproducer (issue #30).

    python scripts/write_stall.py [--rounds N] [--pause S] [--mib M] [EXPERIMENT ...]

Each round times every experiment three times, in rotating order: right after
deleting a file of the same size (the delete, `sync`, 0.05 s), after the
same delete, `sync` and a pause of `--pause` seconds (5 s by default, as in
the issue), and after the pause alone, with nothing deleted. Every figure is
a median over the rounds. The experiments:

- ``anon``: fill fresh anonymous memory (`np.ones`): no file, no file system.
- ``plain``: 2 MiB `pwrite`s, then `fdatasync`.
- ``fallocate``: `fallocate` the whole file first, then as ``plain``.
- ``writeback``: ``plain`` plus `sync_file_range(WRITE)` after each piece
  (the early write-back hint loaderx's writers give).
- ``behind``: ``writeback`` plus `posix_fadvise(DONTNEED)` of the piece
  8 MiB behind (the page cache holds a few pieces, not the file).
- ``loaderx``: `loaderx.from_numpy(path, rows, codec="raw")` (durable).

With ``--read`` each write is followed by a read of what it wrote (timed
apart: the whole file, or for ``loaderx`` 200 random batches of 256 rows,
as a first epoch starts), to show what dropping the cache moves to it.
On a guest whose balloon has free page reporting (Firecracker, many cloud
VMs), the last column is the page-reporting counter's growth during the
pause: memory handed back to the host, whose pages the next allocation must
fault in again.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import loaderx

PIECE = 2 << 20
BEHIND = 8 << 20
REPORTED = Path("/sys/module/page_reporting/parameters/reported_kib")
_libc = ctypes.CDLL(None, use_errno=True)


def sync_file_range(fd: int, offset: int, length: int, flags: int) -> None:
    """sync_file_range(2), which Python's os module lacks."""
    result = _libc.sync_file_range(fd, ctypes.c_int64(offset), ctypes.c_int64(length), flags)
    if result != 0:
        raise OSError(ctypes.get_errno(), "sync_file_range failed")


def reported_mib() -> float | None:
    """The guest's free-page-reporting counter (MiB handed back), or None without it."""
    try:
        return int(REPORTED.read_text()) / 1024
    except OSError:
        return None


def write_file(path: Path, data: np.ndarray, mode: str) -> None:
    """Writes `data` to the new file `path` in 2 MiB pieces and fdatasyncs it."""
    view = memoryview(data).cast("B")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        if mode == "fallocate":
            os.posix_fallocate(fd, 0, len(view))
        for offset in range(0, len(view), PIECE):
            piece = view[offset : offset + PIECE]
            os.pwrite(fd, piece, offset)
            if mode in ("writeback", "behind"):
                sync_file_range(fd, offset, len(piece), 2)  # SYNC_FILE_RANGE_WRITE
            if mode == "behind" and offset >= BEHIND:
                os.posix_fadvise(fd, offset - BEHIND, PIECE, os.POSIX_FADV_DONTNEED)
        os.fdatasync(fd)
    finally:
        os.close(fd)


def experiment(name: str, data: np.ndarray) -> Callable[[Path], None]:
    """The write `name` stands for, writing `data` under a directory."""
    if name == "anon":
        return lambda directory: np.ones(data.nbytes, np.uint8)
    if name == "loaderx":
        rows = data.reshape(-1, 3072)
        return lambda directory: loaderx.from_numpy(
            directory / "store", rows, codec="raw", progress=False
        )
    return lambda directory: write_file(directory / "new", data, name)


def read_back(directory: Path) -> None:
    """Reads every file under `directory` (into the page cache); a loaderx
    store as a first epoch starts: 200 batches of 256 random rows."""
    if (directory / "store").exists():
        with loaderx.Zrecord(directory / "store") as store:
            batches = np.random.default_rng(1).integers(0, len(store), (200, 256))
            out = np.empty((256, 3072), np.float32)
            for batch in batches:
                store.gather(batch, out)
        return
    for path in directory.rglob("*"):
        if path.is_file():
            with open(path, "rb", buffering=0) as file:
                while file.read(8 << 20):
                    pass


def delete_one(directory: Path, data: np.ndarray, pause: float) -> float | None:
    """Writes and syncs a file as large as `data`, lets it settle, deletes it,
    syncs and waits `pause`; returns the MiB reported to the host meanwhile."""
    victim = directory / "old"
    write_file(victim, data, "plain")
    time.sleep(0.5)
    before = reported_mib()
    victim.unlink()
    os.sync()
    time.sleep(pause)
    after = reported_mib()
    return None if before is None or after is None else after - before


def one_round(
    directory: Path, data: np.ndarray, names: list[str], pause: float, read: bool
) -> dict[tuple[str, str], tuple[float, float, float | None]]:
    """(experiment, condition) -> (write seconds, read seconds, MiB reported)."""
    times = {}
    for name in names:
        for condition, wait in (("fresh", 0.05), ("paused", pause), ("no delete", pause)):
            if condition == "no delete":
                before = reported_mib()
                time.sleep(wait)
                after = reported_mib()
                reported = None if before is None or after is None else after - before
            else:
                reported = delete_one(directory, data, wait)
            target = directory / "out"
            target.mkdir()
            start = time.perf_counter()
            experiment(name, data)(target)
            written = time.perf_counter() - start
            start = time.perf_counter()
            if read:
                read_back(target)
            times[name, condition] = (written, time.perf_counter() - start, reported)
            shutil.rmtree(target)
            os.sync()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    names = ["anon", "plain", "fallocate", "writeback", "behind", "loaderx"]
    parser.add_argument("experiments", nargs="*", default=names, help=", ".join(names))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pause", type=float, default=5.0)
    parser.add_argument("--mib", type=int, default=234)
    parser.add_argument("--read", action="store_true", help="also time a full read after")
    parser.add_argument("--dir", default=None, help="where to write (default: the temp dir)")
    args = parser.parse_args()
    unknown = sorted(set(args.experiments) - set(names))
    if unknown:
        parser.error(f"unknown experiments {unknown}: choose from {names}")
    count = args.mib * (1 << 20) // (3072 * 4)
    data = np.random.default_rng(0).standard_normal((count, 3072), dtype=np.float32)
    results: dict[tuple[str, str], list] = {}
    with tempfile.TemporaryDirectory(dir=args.dir) as temporary:
        for index in range(args.rounds):
            order = args.experiments[index % len(args.experiments) :]
            order += args.experiments[: index % len(args.experiments)]
            for key, value in one_round(
                Path(temporary), data, order, args.pause, args.read
            ).items():
                results.setdefault(key, []).append(value)
    print(
        f"{data.nbytes / 2**20:.0f} MiB, {args.rounds} rounds, pause {args.pause} s, "
        f"loaderx {loaderx.__version__} from {Path(loaderx.__file__).parent}"
    )
    print(
        "| experiment | right after a delete, s | after delete + pause, s | pause, no delete, s "
        "| read after (same three), s | MiB reported in the pause (delete / none) |"
    )
    print("|---|---|---|---|---|---|")
    for name in args.experiments:
        runs = [results[name, c] for c in ("fresh", "paused", "no delete")]
        writes = [f"{statistics.median(r[0] for r in run):.3f}" for run in runs]
        reads = " / ".join(f"{statistics.median(r[1] for r in run):.3f}" for run in runs)
        reported = [[r[2] for r in run if r[2] is not None] for run in runs[1:]]
        shown = " / ".join(f"{statistics.median(r):.0f}" if r else "—" for r in reported)
        print(f"| {name} | {' | '.join(writes)} | {reads} | {shown} |")


if __name__ == "__main__":
    main()
