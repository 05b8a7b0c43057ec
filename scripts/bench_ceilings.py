"""The ceilings of scripts/bench.py: what this machine allows a gather, a
decode, a write and a cold read, measured without any store in the way.

    python scripts/bench_ceilings.py [--quick]

- memory: the bench's random batches (256 records of 12 KiB from a source
  of 20,000 in memory) gathered natively with the C library's memcpy on 1,
  2, ... threads (scripts/memory_ceiling.zig, built here with `python -m
  ziglang build-lib` and called through ctypes, so a ceiling pass runs in
  the bench's own process, into the same kind of destination array);
- decode: one core of the system libzstd / liblz4 decoding every record in
  a native loop (scripts/codec_ceiling.zig, see bench_codecs.py), times the
  threads a gather runs on;
- disk: a sequential write of a file as large as the store, timed to its
  fdatasync, and cold random reads of 4 KiB and 12 KiB with pread from a
  file evicted with posix_fadvise(POSIX_FADV_DONTNEED) after an fsync (the
  file holds every byte it is long: no sparse holes), on 1 thread and on one
  thread per core.

Every figure is the median of several runs. bench.py prints each store and
loader row as a fraction of its ceiling; this script prints the ceilings
alone.
"""

from __future__ import annotations

import argparse
import atexit
import ctypes
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
# Its neighbours (bench_codecs builds the decode ceiling) import by name.
if str(ROOT / "scripts") not in sys.path:
    sys.path.insert(0, str(ROOT / "scripts"))
import bench_codecs  # noqa: E402
from bench_common import BATCH_SIZE, MiB, cores, markdown_table, structured_rows  # noqa: E402

KiB = 1 << 10

# The builds of one process, shared by every table that needs them and
# removed when it exits.
_BUILT: dict[str, Path] = {}
_BUILD_DIRECTORY: list[Path] = []


def _build_directory() -> Path:
    if not _BUILD_DIRECTORY:
        directory = Path(tempfile.mkdtemp(prefix="loaderx-bench-ceilings-"))
        atexit.register(shutil.rmtree, directory, ignore_errors=True)
        _BUILD_DIRECTORY.append(directory)
    return _BUILD_DIRECTORY[0]


def codec_binary() -> Path:
    """scripts/codec_ceiling.zig, built once per process (about 20 s)."""
    if "codec" not in _BUILT:
        _BUILT["codec"] = bench_codecs.build_ceiling(_build_directory())
    return _BUILT["codec"]


def memory_library() -> Path:
    """scripts/memory_ceiling.zig as a shared library, built once per process."""
    if "memory" not in _BUILT:
        library = _build_directory() / "libmemory_ceiling.so"
        command = [
            sys.executable,
            "-m",
            "ziglang",
            "build-lib",
            "-dynamic",
            "-OReleaseFast",
            "-lc",
            f"-Mroot={ROOT / 'scripts' / 'memory_ceiling.zig'}",
            f"-femit-bin={library}",
        ]
        subprocess.run(command, cwd=_build_directory(), check=True, timeout=600)
        _BUILT["memory"] = library
    return _BUILT["memory"]


COPIES = {"libc": 0, "zig": 1}
MEMORY = "memory"  # a row bound by the memcpy gather (else by a codec's decode)


class MemoryGather:
    """memory_ceiling.zig's `memory_gather` through ctypes."""

    def __init__(self) -> None:
        self.library = ctypes.CDLL(str(memory_library()))
        function = self.library.memory_gather
        function.restype = ctypes.c_uint64
        function.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_size_t,
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_uint32,
        ]
        synced = self.library.memory_gather_synced
        synced.restype = ctypes.c_uint64
        synced.argtypes = [*function.argtypes, ctypes.c_uint32]

    def seconds(
        self,
        source: np.ndarray,
        batches: np.ndarray,
        out: np.ndarray,
        threads: int,
        copy: str = "libc",
        handoff: str = "",
    ) -> float:
        """Seconds to gather every batch of `batches` (one row of indices
        each) from `source` (records along axis 0) into `out` (one batch) on
        `threads` threads; `handoff` "futex" or "spin" hands every batch to
        the threads and waits for them (as a call per batch does), sleeping
        or spinning in between."""
        flat = np.ascontiguousarray(batches, dtype=np.uint64).reshape(-1)
        record_bytes = source[0].nbytes
        if flat.size and int(flat.max()) >= len(source):
            raise ValueError(f"an index of the batches is beyond the {len(source)} records")
        if out.nbytes < batches.shape[1] * record_bytes or not out.flags.c_contiguous:
            raise ValueError("out must be one C-contiguous batch of records")
        if not source.flags.c_contiguous:
            raise ValueError("source must be C-contiguous")
        arguments = (
            source.ctypes.data,
            record_bytes,
            flat.ctypes.data,
            flat.size,
            batches.shape[1],
            out.ctypes.data,
            threads,
            COPIES[copy],
        )
        if handoff:
            spin = {"futex": 0, "spin": 1}[handoff]
            nanoseconds = self.library.memory_gather_synced(*arguments, spin)
        else:
            nanoseconds = self.library.memory_gather(*arguments)
        if nanoseconds == 0:
            raise RuntimeError(
                "memory_gather failed: a thread could not start or libc.so.6 has no memcpy"
            )
        return nanoseconds / 1e9


class CeilingRounds:
    """The memory and decode ceilings in rounds a bench interleaves with its
    own runs: each `round()` times a memcpy gather of `batches` from `rows`
    once on every thread count from 1 to `threads_max` (default: one per
    core), and one decode pass of every record per codec of `codecs`."""

    def __init__(
        self,
        rows: np.ndarray,
        batches: np.ndarray,
        threads_max: int | None = None,
        codecs: tuple[str, ...] = (),
    ):
        self.codecs = codecs
        self.decode: dict[str, list[float]] = {codec: [] for codec in codecs}
        self.gather = MemoryGather()
        self.rows, self.batches = rows, batches
        self.out = np.empty((batches.shape[1], *rows.shape[1:]), dtype=rows.dtype)
        counts = range(1, (threads_max or cores()) + 1)
        self.samples: dict[int, list[float]] = {threads: [] for threads in counts}
        self.gather.seconds(rows, batches[:1], self.out, 1)  # loaded, pages touched

    def round(self) -> None:
        for threads, samples in self.samples.items():
            samples.append(self.gather.seconds(self.rows, self.batches, self.out, threads))
        if self.codecs:
            try:
                speeds = decode_ceiling(self.rows, self.codecs, 1)
            except (OSError, subprocess.SubprocessError):
                self.codecs = ()  # measure() says why when it tries once more
                self.decode = {}
                return
            for codec, speed in speeds.items():
                self.decode[codec].append(speed)

    def decode_medians(self) -> dict[str, float]:
        """Single-core decode MiB/s per codec, the median of the rounds so far."""
        return {codec: statistics.median(speeds) for codec, speeds in self.decode.items() if speeds}

    def medians(self) -> dict[int, float]:
        """MiB/s per thread count, the median of the rounds so far."""
        gathered = self.batches.size * self.rows[0].nbytes
        return {
            threads: gathered / statistics.median(samples) / MiB
            for threads, samples in self.samples.items()
            if samples
        }


def memory_ceiling(
    rows: np.ndarray, batches: np.ndarray, runs: int, threads_max: int | None = None
) -> dict[int, float]:
    """MiB/s of a memcpy gather of `batches` from `rows` on 1..threads_max
    threads (default: one per core), the median of `runs` rounds."""
    rounds = CeilingRounds(rows, batches, threads_max)
    for _ in range(runs):
        rounds.round()
    return rounds.medians()


def decode_ceiling(rows: np.ndarray, codecs: tuple[str, ...], runs: int) -> dict[str, float]:
    """Single-core MiB/s of the system library decoding every record of
    `rows`, compressed as a store compresses it, per codec (median of `runs`)."""
    with tempfile.TemporaryDirectory(prefix="loaderx-bench-decode-") as temporary:
        records = Path(temporary) / "records.bin"
        np.ascontiguousarray(rows).tofile(records)
        measured = bench_codecs.ceiling_runs(codec_binary(), codecs, records, rows[0].nbytes, runs)
    return {
        codec: rows.nbytes / statistics.median(library) / MiB
        for codec, (_, library, _) in measured.items()
    }


def _fill(path: Path, size: int, chunk: int = 8 * MiB) -> float:
    """Writes `size` bytes of random data to a new `path` and fdatasyncs it; the seconds."""
    block = np.random.default_rng(7).integers(0, 256, min(chunk, size), dtype=np.uint8).tobytes()
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        start = time.perf_counter()
        written = 0
        while written < size:
            written += os.write(descriptor, block[: size - written])
        os.fdatasync(descriptor)
        return time.perf_counter() - start
    finally:
        os.close(descriptor)


def sequential_write(directory: Path, size: int, runs: int) -> float:
    """MiB/s of a sequential write of `size` bytes to a new file, to its
    fdatasync (median of `runs`, each file deleted after)."""
    seconds = []
    for run in range(runs):
        path = directory / f"sequential-{run}"
        seconds.append(_fill(path, size))
        path.unlink()
    return size / statistics.median(seconds) / MiB


def evict(path: Path) -> None:
    """fsync, then drop the file's pages from the page cache."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
        os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(descriptor)


@dataclass
class ColdReads:
    """Cold random reads of one size on some threads: MiB/s and IOPS (medians)."""

    read_bytes: int
    threads: int
    mib_per_second: float
    iops: float
    samples: list[float] = field(default_factory=list)  # seconds per run


def _read_at(descriptor: int, read_bytes: int, offsets: np.ndarray) -> int:
    """preads `read_bytes` at each of `offsets`; the bytes read."""
    return sum(len(os.pread(descriptor, read_bytes, offset)) for offset in offsets.tolist())


def cold_random_reads(
    path: Path, read_bytes: int, reads: int, threads: int, runs: int, seed: int = 0
) -> ColdReads:
    """`reads` preads of `read_bytes` at distinct random offsets (multiples
    of `read_bytes`) of `path`, evicted before each run, on `threads`
    threads (readahead off: POSIX_FADV_RANDOM)."""
    slots = os.path.getsize(path) // read_bytes
    reads = min(reads, slots)
    rng = np.random.default_rng(seed)
    seconds = []
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(runs):
            offsets = rng.choice(slots, reads, replace=False) * read_bytes
            evict(path)
            descriptor = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_RANDOM)
                parts = np.array_split(offsets, threads)
                start = time.perf_counter()
                done = sum(pool.map(partial(_read_at, descriptor, read_bytes), parts))
                seconds.append(time.perf_counter() - start)
            finally:
                os.close(descriptor)
            if done != reads * read_bytes:
                raise RuntimeError(f"{path}: short reads ({done} of {reads * read_bytes} bytes)")
    median = statistics.median(seconds)
    return ColdReads(
        read_bytes, threads, reads * read_bytes / median / MiB, reads / median, seconds
    )


@dataclass
class Disk:
    """The disk ceilings: sequential write MiB/s and cold random reads by (size, threads)."""

    write_mib_per_second: float
    reads: dict[tuple[int, int], ColdReads]


def disk_ceilings(
    directory: Path, size: int, reads: int, runs: int, threads: tuple[int, ...] | None = None
) -> Disk:
    """Sequential write of `size` bytes, then cold random 4 KiB and 12 KiB
    reads from a file of `size` bytes, in `directory`."""
    write = sequential_write(directory, size, runs)
    path = directory / "cold-reads"
    _fill(path, size)
    try:
        measured = {}
        for count in threads or sorted({1, cores()}):
            for read_bytes in (4 * KiB, 12 * KiB):
                measured[read_bytes, count] = cold_random_reads(
                    path, read_bytes, reads, count, runs
                )
    finally:
        path.unlink()
    return Disk(write, measured)


@dataclass
class Ceilings:
    """Every ceiling of one bench run (MiB/s): memory by threads, decode per
    codec on one core, the disk."""

    memory: dict[int, float]
    decode: dict[str, float]
    disk: Disk | None
    notes: list[str] = field(default_factory=list)

    def memory_at(self, threads: int) -> float | None:
        if not self.memory:
            return None
        return self.memory[min(max(threads, 1), max(self.memory))]

    def speed(self, bound: tuple[str, int]) -> tuple[float | None, str]:
        """The ceiling of a row bound by `bound` (MEMORY or a codec, threads;
        0 threads: one per core) and its label; None when not measured."""
        kind, threads = bound
        threads = threads or cores()
        if kind == MEMORY:
            return self.memory_at(threads), f"memcpy, {threads} thread" + "s" * (threads > 1)
        if kind:
            return self.decode_at(kind, threads), f"{kind} decode x {threads}"
        return None, ""

    def cold_at(self, read_bytes: int, threads: int) -> float | None:
        """MiB/s of cold random reads of `read_bytes` on `threads` (0: one per core)."""
        if self.disk is None:
            return None
        cold = self.disk.reads.get((read_bytes, threads or cores()))
        return None if cold is None else cold.mib_per_second

    def decode_at(self, codec: str, threads: int) -> float | None:
        one = self.decode.get(codec)
        return None if one is None else one * threads


DECODE_CODECS = ("zstd", "zstd_shuffle4", "lz4", "lz4_shuffle4")


def measure(
    rows: np.ndarray,
    batches: np.ndarray,
    runs: int,
    disk_bytes: int,
    disk_reads: int,
    codecs: tuple[str, ...] = DECODE_CODECS,
    disk: bool = True,
    memory: CeilingRounds | None = None,
) -> Ceilings:
    """Every ceiling for `rows` and `batches` (the memory and decode ones
    from `memory`'s rounds when it has them, interleaved with a bench's
    runs); a ceiling that
    cannot be measured here (no compiler, no libzstd, no posix_fadvise) is
    left out with a note saying why."""
    notes = []
    try:
        speeds = memory_ceiling(rows, batches, runs) if memory is None else memory.medians()
    except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
        speeds, notes = {}, [f"memory ceiling not measured: {type(exc).__name__}: {exc}"]
    try:
        decode = memory.decode_medians() if memory is not None else {}
        decode = decode or decode_ceiling(rows, codecs, runs)
    except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
        decode = {}
        notes.append(f"decode ceilings not measured: {type(exc).__name__}: {exc}")
    measured_disk = None
    if disk and hasattr(os, "posix_fadvise"):
        with tempfile.TemporaryDirectory(prefix="loaderx-bench-disk-") as temporary:
            measured_disk = disk_ceilings(Path(temporary), disk_bytes, disk_reads, runs)
    elif disk:
        notes.append("disk ceilings not measured: this platform has no posix_fadvise")
    return Ceilings(speeds, decode, measured_disk, notes)


def ceilings_table(ceilings: Ceilings, runs: int) -> str:
    """The ceilings as a markdown table, with how they were measured."""

    rows = [
        [
            f"memory: memcpy gather, {threads} thread{'s' if threads > 1 else ''}",
            f"{speed:,.0f}",
            "—",
        ]
        for threads, speed in ceilings.memory.items()
    ]
    rows += [
        [f"decode: {codec}, 1 core", f"{speed:,.0f}", "—"]
        for codec, speed in ceilings.decode.items()
    ]
    if ceilings.disk is not None:
        rows.append(
            [
                "disk: sequential write + fdatasync",
                f"{ceilings.disk.write_mib_per_second:,.0f}",
                "—",
            ]
        )
        for (read_bytes, threads), cold in ceilings.disk.reads.items():
            rows.append(
                [
                    f"disk: cold random {read_bytes // KiB} KiB pread, {threads} thread"
                    + ("s" if threads > 1 else ""),
                    f"{cold.mib_per_second:,.1f}",
                    f"{cold.iops:,.0f}",
                ]
            )
    table = markdown_table(["ceiling", "MiB/s", "IOPS"], rows)
    notes = "\n".join(ceilings.notes)
    return (
        f"{table}\n\n"
        + (f"{notes}\n\n" if notes else "")
        + f"Median of {runs} runs (scripts/bench_ceilings.py: memory = glibc memcpy of the same "
        "random batches from the in-memory records into one reused batch array, threads with a "
        "fixed share of every batch and no hand-off between batches; decode = the system "
        "library alone on the store's payloads, scripts/codec_ceiling.zig; disk = a file as "
        "large as the store, written and fdatasynced, then evicted (fsync + "
        "POSIX_FADV_DONTNEED) before each run of preads at distinct random offsets, readahead "
        "off)."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes and one run")
    arguments = parser.parse_args(argv)

    count, batch_count, runs = (2000, 8, 1) if arguments.quick else (20000, 200, 5)
    rows = structured_rows(count)
    batches = np.random.default_rng(1).integers(0, count, (batch_count, BATCH_SIZE))
    disk_bytes = 16 * MiB if arguments.quick else rows.nbytes
    ceilings = measure(rows, batches, runs, disk_bytes, 200 if arguments.quick else 2000)
    print(
        f"### ceilings: {count:,} records of {rows[0].nbytes // KiB} KiB, {batch_count} "
        f"random batches of {BATCH_SIZE}\n"
    )
    print(ceilings_table(ceilings, runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
