"""The codec table of scripts/bench.py: decode speed per core of zstd,
zstd_shuffle4, lz4 and lz4_shuffle4 on the bench's float32 records, against
the libraries' own decode ceilings, and the DataLoader against that ceiling.

    python scripts/bench.py codecs [--quick]

The ceilings come from scripts/codec_ceiling.zig, which this table compiles
(about 20 s, once per run): one core of the system libzstd / liblz4 decoding
in a tight native loop the payloads zig/codec.zig writes for a store. A
ctypes loop would not do for LZ4: its ~1 us per call is a fifth of an LZ4
decode of a 12 KiB record.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
from bench_common import BATCH_SIZE, LOADER_WORKERS, MiB, cores, markdown_table, structured_rows

ROOT = Path(__file__).resolve().parent.parent
CODECS = ("zstd", "zstd_shuffle4", "lz4", "lz4_shuffle4")
# The DataLoader runs on these, each against its own decode ceiling.
LOADER_CODECS = ("zstd_shuffle4", "lz4_shuffle4")
# The DataLoader's prefetch: at most this many batches in flight, and the
# consumer holds one more while the next is taken, so its batches rotate
# through about LOADER_PREFETCH + 2 buffers (the loader ceiling's ring).
LOADER_PREFETCH = 4
LOADER_RING = LOADER_PREFETCH + 2


def build_ceiling(directory: Path) -> Path:
    """Compiles scripts/codec_ceiling.zig against the system libraries into `directory`."""
    sys.path.insert(0, str(ROOT / "build_backend"))
    from loaderx_build import find_library

    binary = directory / "codec_ceiling"
    command = [
        sys.executable,
        "-m",
        "ziglang",
        "build-exe",
        "-OReleaseFast",
        "-lc",
        "--dep",
        "codec",
        f"-Mroot={ROOT / 'scripts' / 'codec_ceiling.zig'}",
        f"-Mcodec={ROOT / 'zig' / 'codec.zig'}",
        find_library("zstd"),
        find_library("lz4"),
        f"-femit-bin={binary}",
    ]
    subprocess.run(command, cwd=ROOT, check=True, timeout=600)
    return binary


def _helper_lines(
    binary: Path, codecs: tuple[str, ...], records: Path, record_bytes: int, rounds: int, *options
) -> dict[str, tuple[int, list[list[float]]]]:
    """Per codec, (payload bytes, the `|`-separated sections of seconds per round)."""
    result = subprocess.run(
        [str(binary), str(records), str(record_bytes), str(rounds), *options, *codecs],
        capture_output=True,
        text=True,
        check=True,
        timeout=1200,
    )
    measured = {}
    for line in result.stdout.splitlines():
        head, *sections = line.split("|")
        name, payload_bytes, *library = head.split()
        measured[name] = (
            int(payload_bytes),
            [[int(value) / 1e9 for value in part] for part in (library, *map(str.split, sections))],
        )
    return measured


def ceiling_runs(
    binary: Path, codecs: tuple[str, ...], records: Path, record_bytes: int, rounds: int
) -> dict[str, tuple[int, list[float], list[float]]]:
    """The helper's rounds: per codec, (payload bytes, library decode seconds
    per round, codec.decode seconds per round) over all records."""
    return {
        name: (payload_bytes, library, ours)
        for name, (payload_bytes, (library, ours)) in _helper_lines(
            binary, codecs, records, record_bytes, rounds
        ).items()
    }


def batch_ceiling_runs(
    binary: Path,
    codecs: tuple[str, ...],
    records: Path,
    record_bytes: int,
    rounds: int,
    batches: np.ndarray,
    directory: Path,
    ring: int = 1,
    threads: int = 1,
) -> dict[str, tuple[list[float], list[float], list[float], list[float]]]:
    """The helper's rounds with `batches` (one row of record indices per
    batch): per codec, seconds per round of the library and of codec.decode
    over all records in order into one record-sized buffer, then over every
    batch, each record into its slot of a batch-sized buffer: one reused
    buffer on one thread by default, else batch k into buffer k mod `ring`
    with `threads` threads side by side (wall seconds)."""
    indices = directory / "batches.int64"
    np.ascontiguousarray(batches, dtype="<i8").tofile(indices)
    options = ["--batches", str(indices), str(batches.shape[1])]
    if (ring, threads) != (1, 1):
        options += ["--ring", str(ring), "--threads", str(threads)]
    measured = _helper_lines(binary, codecs, records, record_bytes, rounds, *options)
    return {name: tuple(sections) for name, (_, sections) in measured.items()}


def gather_seconds(store, batches: np.ndarray, out: np.ndarray) -> float:
    """Seconds for one pass of `batches` through `store.gather` (one thread)."""
    start = time.perf_counter()
    for batch in batches:
        store.gather(batch, out)
    return time.perf_counter() - start


def loader_seconds(directory: Path, codec: str, workers: int, batch_size: int, seconds: float):
    """Seconds per batch of a DataLoader over the `codec` store (features only)."""
    from loaderx import DataLoader, DenseDataset

    dataset = DenseDataset(directory / codec)
    with DataLoader(
        {"x": dataset}, num_workers=workers, batch_size=batch_size, prefetch_size=LOADER_PREFETCH
    ) as loader:
        for _ in range(8):
            next(loader)
        start, done = time.perf_counter(), 0
        while done < 10 or time.perf_counter() - start < seconds:
            next(loader)
            done += 1
        elapsed = (time.perf_counter() - start) / done
    dataset.close()
    return elapsed


@dataclass
class Measured:
    """Seconds per round for every codec (gather passes over the batches;
    library and codec.decode passes over all records), the DataLoader's
    seconds per batch and its fraction of its codec's in-order and
    random-batch decode ceilings per round (library and codec.decode passes
    over the gather's batches) and of its loader ceiling (the library on
    every core into a ring of LOADER_RING batches), and each store's ratio."""

    gather: dict[str, list[float]] = field(default_factory=lambda: {c: [] for c in CODECS})
    library: dict[str, list[float]] = field(default_factory=dict)
    decode: dict[str, list[float]] = field(default_factory=dict)
    batch_library: dict[str, list[float]] = field(default_factory=dict)
    batch_decode: dict[str, list[float]] = field(default_factory=dict)
    loader: dict[str, list[float]] = field(default_factory=lambda: {c: [] for c in LOADER_CODECS})
    loader_fraction: dict[str, list[float]] = field(
        default_factory=lambda: {c: [] for c in LOADER_CODECS}
    )
    loader_batch_fraction: dict[str, list[float]] = field(
        default_factory=lambda: {c: [] for c in LOADER_CODECS}
    )
    loader_ring_fraction: dict[str, list[float]] = field(
        default_factory=lambda: {c: [] for c in LOADER_CODECS}
    )
    loader_ring_speed: dict[str, list[float]] = field(
        default_factory=lambda: {c: [] for c in LOADER_CODECS}
    )
    ratio: dict[str, float] = field(default_factory=dict)


def measure(rows: np.ndarray, batches: np.ndarray, rounds: int, loader_time: float) -> Measured:
    """Interleaved rounds of every codec's gather, then of the native
    ceilings, then DataLoader runs each paired with a ceiling pass."""
    # bench.py imports this module to register the table: its helpers are
    # imported when the table runs.

    from loaderx import from_numpy
    from loaderx.zrecord import Zrecord

    measured = Measured()
    out = np.empty((batches.shape[1], rows.shape[1]), dtype=rows.dtype)
    record_bytes = rows[0].nbytes
    with tempfile.TemporaryDirectory(prefix="loaderx-bench-codecs-") as temporary:
        directory = Path(temporary)
        binary = build_ceiling(directory)
        records = directory / "records.bin"
        rows.tofile(records)
        for codec in CODECS:
            from_numpy(directory / codec, rows, codec=codec, progress=False)
        stores = {codec: Zrecord(directory / codec, threads=1) for codec in CODECS}
        try:
            for codec, store in stores.items():
                measured.ratio[codec] = rows.nbytes / store.stats()["live_bytes"]
                store.gather(batches[0], out)
                if not np.array_equal(out, rows[batches[0]]):
                    raise AssertionError(f"{codec}: a gathered batch differs from its source")
            for _ in range(rounds):  # interleaved: a burst of noise hits every codec alike
                for codec, store in stores.items():
                    measured.gather[codec].append(gather_seconds(store, batches, out))
        finally:
            for store in stores.values():
                store.close()
        for codec, (library, decode, batch_library, batch_decode) in batch_ceiling_runs(
            binary, CODECS, records, record_bytes, rounds, batches, directory
        ).items():
            measured.library[codec], measured.decode[codec] = library, decode
            measured.batch_library[codec] = batch_library
            measured.batch_decode[codec] = batch_decode
        ceilings = partial(batch_ceiling_runs, binary, records=records, batches=batches)
        for _ in range(rounds):
            for codec in LOADER_CODECS:
                per_batch = loader_seconds(
                    directory, codec, LOADER_WORKERS, BATCH_SIZE, loader_time
                )
                _loader_round(measured, codec, per_batch, rows, batches, ceilings, directory)
    return measured


def _loader_round(measured, codec, per_batch, rows, batches, ceilings, directory) -> None:
    """One DataLoader run's seconds per batch, against ceiling passes run
    right after it (`ceilings`: batch_ceiling_runs with the helper, the
    records and the batches bound)."""

    record_bytes = rows[0].nbytes
    (library,), _, (batch_library,), _ = ceilings(
        (codec,), record_bytes=record_bytes, rounds=1, directory=directory
    )[codec]
    measured.loader[codec].append(per_batch)
    # The ceilings: every core decoding at the library's single-core
    # speed, in order into one record's buffer or into random batches.
    ceiling = library / len(rows) * BATCH_SIZE / cores()
    measured.loader_fraction[codec].append(ceiling / per_batch)
    batch_ceiling = batch_library / batches.shape[0] / cores()
    measured.loader_batch_fraction[codec].append(batch_ceiling / per_batch)
    # What a loader can reach: every core at once (sharing the memory
    # bus), each batch into its own buffer of a ring.
    _, _, (ring_library,), (ring_ours,) = ceilings(
        (codec,),
        record_bytes=record_bytes,
        rounds=1,
        directory=directory,
        ring=LOADER_RING,
        threads=cores(),
    )[codec]
    # The faster of the library alone and codec.decode (whose unshuffle
    # writes the batch in wide stores from a cached scratch: faster than
    # LZ4's own copies into a cold buffer).
    ring_seconds = min(ring_library, ring_ours)
    measured.loader_ring_fraction[codec].append(ring_seconds / batches.shape[0] / per_batch)
    measured.loader_ring_speed[codec].append(batches.size * record_bytes / ring_seconds)


def _loader_sentence(measured: Measured, codec: str) -> str:
    """The DataLoader on `codec` against its three ceilings, with the rounds."""

    def fraction(values: list[float]) -> str:
        rounds = ", ".join(f"{value:.2f}" for value in values)
        return f"{statistics.median(values):.2f}x", rounds

    decode, decode_rounds = fraction(measured.loader_fraction[codec])
    batch, batch_rounds = fraction(measured.loader_batch_fraction[codec])
    ring, ring_rounds = fraction(measured.loader_ring_fraction[codec])
    speed = statistics.median(measured.loader_ring_speed[codec]) / MiB
    return (
        f"{codec}: {1 / statistics.median(measured.loader[codec]):,.0f} batches/s, {decode} its "
        f"decode ceiling (rounds {decode_rounds}), {batch} its random-batch ceiling (rounds "
        f"{batch_rounds}), **{ring} its loader ceiling** ({speed:,.0f} MiB/s; rounds "
        f"{ring_rounds})."
    )


def _codec_row(measured: Measured, codec: str, rows: np.ndarray, batches: np.ndarray) -> list[str]:
    """`codec`'s row of the codec table: its gather against the in-order and
    the random-batch ceilings (medians of the rounds, MiB/s)."""

    def speed(seconds: list[float], byte_count: int) -> float:
        return byte_count / statistics.median(seconds) / MiB

    gathered = batches.size * rows[0].nbytes
    ours = speed(measured.gather[codec], gathered)
    ceiling = speed(measured.library[codec], rows.nbytes)
    batch_ceiling = speed(measured.batch_library[codec], gathered)
    return [
        codec,
        f"{measured.ratio[codec]:.2f}x",
        f"{ours:,.0f}",
        f"{speed(measured.decode[codec], rows.nbytes):,.0f}",
        f"{ceiling:,.0f}",
        f"{ours / ceiling:.2f}",
        f"{speed(measured.batch_decode[codec], gathered):,.0f}",
        f"{batch_ceiling:,.0f}",
        f"{ours / batch_ceiling:.2f}",
    ]


def bench_codecs(quick: bool) -> str:
    """The codec table (see the module docstring)."""

    count, batch_count = (2000, 20) if quick else (20000, 50)
    rounds, loader_time = (1, 0.3) if quick else (15, 2.0)
    rows = structured_rows(count)
    batches = np.random.default_rng(1).integers(0, count, (batch_count, BATCH_SIZE))
    measured = measure(rows, batches, rounds, loader_time)

    table_rows = [_codec_row(measured, codec, rows, batches) for codec in CODECS]
    versus = [
        statistics.median(
            zstd / lz4 for zstd, lz4 in zip(seconds["zstd_shuffle4"], seconds["lz4_shuffle4"])
        )
        for seconds in (measured.gather, measured.decode, measured.library)
    ]
    table = markdown_table(
        [
            "codec",
            "ratio",
            "gather, 1 thread, MiB/s",
            "codec.decode, 1 core, MiB/s",
            "library decode ceiling, 1 core, MiB/s",
            "gather / ceiling",
            "codec.decode of the batches, 1 core, MiB/s",
            "library random-batch ceiling, 1 core, MiB/s",
            "gather / random-batch ceiling",
        ],
        table_rows,
    )
    loaders = " ".join(_loader_sentence(measured, codec) for codec in LOADER_CODECS)
    return (
        f"### codecs: {count:,} records of {rows[0].nbytes // 1024} KiB (float32), one thread "
        f"per decode, {batch_count} random batches of {BATCH_SIZE}\n\n{table}\n\n"
        f"lz4_shuffle4 against zstd_shuffle4, per core: gather {versus[0]:.2f}x, codec.decode "
        f"{versus[1]:.2f}x, library decode {versus[2]:.2f}x (median of the {rounds} rounds' "
        "ratios).\n"
        f"DataLoader ({LOADER_WORKERS} workers, batches of {BATCH_SIZE}, features only; ceiling: "
        f"the library's single-core speed x {cores()} cores): {loaders}\n\n"
        f"Speeds: median of {rounds} rounds; within a round the codecs run back to back "
        "(gathers in this process, the native passes in the helper), so a burst of load on a "
        "shared machine hits them alike. The DataLoader's fraction pairs each of its runs with "
        "one pass of its library run right after it. `ratio` is source bytes over stored payload "
        "bytes (records no frame shrinks are stored raw: plain lz4 barely shrinks these floats). "
        "`gather` is `Zrecord(threads=1).gather` over the random batches (index, checks, decode, "
        "unshuffle into the caller's array); `codec.decode` is loaderx's decode of every record "
        "in order in a native loop; the ceiling is the library alone (ZSTD_decompressDCtx, "
        "LZ4F_decompress) on the same payloads, without the unshuffle (scripts/codec_ceiling.zig), "
        "in order into one record-sized buffer that stays in the core's cache. The random-batch "
        "ceiling is the same library calls on the gather's own random batches, each record into "
        "its slot of one batch-sized buffer reused across batches (as a loader's batch is): what "
        "a gather of these batches could reach on one core; `codec.decode of the batches` is "
        "loaderx's decode (unshuffle included) in that same loop. The loader ceiling is what a "
        f"prefetching loader can reach on this machine: the library on all {cores()} cores at "
        f"once, each batch into the next of a ring of {LOADER_RING} batch buffers (the "
        f"DataLoader's {LOADER_PREFETCH} batches in flight and the consumer's), so the batches do "
        "not stay in the cache as one reused buffer does and the cores share the memory bus as "
        "the loader's threads do (the single-core ceilings times the cores overstate it); the "
        "faster of the library alone and codec.decode in that loop."
    )
