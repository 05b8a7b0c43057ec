"""loaderx benchmarks: speed reports, not tests.

    python scripts/bench.py all|sampler|store|loader|codecs|numpack|ragged|packing|processes
        [--quick]
    python scripts/bench.py remote [--quick]     (not in `all`: scripts/bench_remote.py)

Prints a machine block, then one markdown table per benchmark. Every figure
is the median of several runs (the count is printed under each table); runs
of the contenders are interleaved so a burst of noise on a shared machine
hits all of them alike. Every contender's output is checked for correctness
before it is timed; a contender that returns wrong data is reported FAILED,
one that is not installed is skipped with a line saying how to install it
(`pip install -e '.[bench]'` brings them all). `--quick` runs small sizes and
few runs, every table in well under a minute, for smoke testing. The stores
are written under the system temporary directory (set TMPDIR to choose the
disk); the full `store` table needs about 4 GiB there.

Each table is a function registered in `TABLES`; a table that is not written
yet prints a line saying so.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
# The tables that live beside this script import by name.
if str(ROOT / "scripts") not in sys.path:
    sys.path.insert(0, str(ROOT / "scripts"))
from bench_common import (  # noqa: E402
    BATCH_SIZE,
    LOADER_WORKERS,
    RECORD_BYTES,
    RECORD_FLOATS,
    MiB,
    cores,
    markdown_table,
    structured_rows,
)

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
        from importlib.metadata import version

        import loaderx._native as native

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


def time_interleaved(
    functions: dict[str, Callable[[], object]], runs: int, seconds: float
) -> dict[str, float]:
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
            # Defaults bind this iteration's size and generator (the lambdas run before the next).
            "numpy randint": (lambda size=size: np.random.randint(0, length, size), False),
            "numpy default_rng().integers": (
                lambda rng=rng, size=size: rng.integers(0, length, size),
                False,
            ),
            "loaderx IID": (iid.next, False),
            "loaderx CYCLIC": (cyclic.next, True),
        }
        for name, (function, distinct) in contenders.items():
            _check_indices(name, function(), length, size, distinct)
        medians = time_interleaved(
            {name: fn for name, (fn, _) in contenders.items()}, runs, seconds
        )
        reference = medians["numpy default_rng().integers"]
        for name, median in medians.items():
            rows.append(
                [
                    name,
                    str(size),
                    f"{median * 1e6:.2f}",
                    f"{size / median / 1e6:.0f}",
                    f"{reference / median:.2f}x",
                ]
            )
    table = markdown_table(
        ["sampler", "batch", "µs / batch", "M indices / s", "vs default_rng"], rows
    )
    return (
        f"### sampler: indices over 0..{length:,}, one call per batch\n\n{table}\n\n"
        f"Medians of {runs} interleaved runs of about {seconds * 1e3:.0f} ms each; "
        "`vs default_rng` above 1 is faster."
    )


# -- shared by the store and loader tables ----------------------------------------


def _files(directory: Path) -> list[Path]:
    return sorted(path for path in directory.rglob("*") if path.is_file())


def allocated_bytes(directory: Path) -> int:
    """Bytes of disk blocks the files under `directory` occupy (sparse holes are free)."""
    return sum(path.stat().st_blocks * 512 for path in _files(directory))


def sync_tree(directory: Path) -> None:
    """fsyncs every file under `directory`: a write counts once it is on disk
    (loaderx commits durably by itself, the others do not), and only clean
    pages can be evicted for the cold-cache runs."""
    for path in _files(directory):
        descriptor = os.open(path, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def warm_tree(directory: Path) -> None:
    """Reads every file under `directory` once, so all reads start from the page cache."""
    for path in _files(directory):
        with open(path, "rb", buffering=0) as handle:
            while handle.read(8 * MiB):
                pass


def evict_tree(directory: Path) -> None:
    """Asks the kernel to drop the (clean, unmapped) cached pages of every file."""
    for path in _files(directory):
        descriptor = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(descriptor)


def resident_bytes(directory: Path) -> int | None:
    """Bytes of the files under `directory` in the page cache (util-linux
    `fincore`), or None when fincore is not installed."""
    files = [str(path) for path in _files(directory)]
    if shutil.which("fincore") is None:
        return None
    if not files:
        return 0
    result = subprocess.run(
        ["fincore", "--bytes", "--noheadings", "--output", "RES", *files],
        capture_output=True,
        text=True,
        check=True,
    )
    return sum(int(field) for field in result.stdout.split())


def _missing(modules: tuple[str, ...]) -> str | None:
    """The first of `modules` that cannot be imported, or None when all import."""
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception:  # a broken install (a missing shared library) is missing too
            return module
    return None


def _mib_per_second(byte_count: int, seconds: float) -> str:
    return f"{byte_count / seconds / MiB:,.0f}"


# -- store ------------------------------------------------------------------------
#
# A contender is a writer and an opener. `write(directory, rows)` stores the
# rows under `directory`; `open(directory, rows)` returns `(read, close)`, where
# `read(indices)` returns the records at `indices` (int64, any order, repeats
# allowed) as a (len(indices), RECORD_FLOATS) float32 array, through the
# contender's public API the way its documentation reads a batch. Only the
# in-memory ceiling looks at `rows` when opening.

Reader = Callable[[np.ndarray], np.ndarray]
Opened = tuple[Reader, Callable[[], None]]


@dataclass(frozen=True)
class StoreContender:
    name: str
    modules: tuple[str, ...]  # what it imports; if any is missing it is skipped
    install: str  # the pip requirement that brings it
    write: Callable[[Path, np.ndarray], None] | None  # None: nothing on disk
    open: Callable[[Path, np.ndarray], Opened]
    before: Callable[[Path, np.ndarray], None] | None = None  # untimed, before each write
    # What bounds its gather: (MEMORY or a codec's decode, threads); "" none measured.
    ceiling: tuple[str, int] = ("", 1)


def _open_memory(directory: Path, rows: np.ndarray) -> Opened:
    out = np.empty((BATCH_SIZE, RECORD_FLOATS), dtype=np.float32)
    # mode="clip": with the default "raise" NumPy buffers `out` (a second copy);
    # the indices are in range, so clipping changes nothing.
    return (lambda indices: np.take(rows, indices, axis=0, out=out, mode="clip")), (lambda: None)


def _loaderx(codec: str) -> tuple[Callable, Callable]:
    def write(directory: Path, rows: np.ndarray) -> None:
        from loaderx.zrecord import Zrecord

        with Zrecord(directory / "store", codec=codec) as store:
            if codec == "zstd_dict":
                # zstd wants about 100x the dictionary in samples: ~1000 rows
                # spread over the data for a 112 KiB dictionary.
                sample = np.ascontiguousarray(rows[:: max(1, len(rows) // 1000)])
                store.train_dict(sample, [rows[0].nbytes] * len(sample), 112 * 1024)
            store.append(rows, np.arange(len(rows), dtype=np.uint64) * np.uint64(rows[0].nbytes))

    return write, _open_loaderx(codec)


def _open_loaderx(codec: str) -> Callable[[Path, np.ndarray], Opened]:
    def open_(directory: Path, rows: np.ndarray) -> Opened:
        from loaderx.zrecord import Zrecord

        store = Zrecord(directory / "store", codec=codec)
        out = np.empty((BATCH_SIZE, *rows.shape[1:]), dtype=rows.dtype)

        def read(indices: np.ndarray) -> np.ndarray:
            store.gather(indices, out)
            return out

        return read, store.close

    return open_


def _loaderx_from_numpy(codec: str) -> tuple[Callable, Callable]:
    """The converter's write (chunked appends, schema, durable commit); reads
    as `_loaderx` does."""

    def write(directory: Path, rows: np.ndarray) -> None:
        from loaderx import from_numpy

        from_numpy(directory / "store", rows, codec=codec, progress=False)

    return write, _open_loaderx(
        "zstd" if codec == "auto" else codec
    )  # reads do not depend on the default codec


# The pause of `_delete_a_store`: longer than the 2 s a guest's free page
# reporting waits before it hands freed memory back to the host.
DELETE_PAUSE_SECONDS = 5.0


def _delete_a_store(directory: Path, rows: np.ndarray) -> None:
    """Before a timed write: writes a store as large as `rows` beside
    `directory`, reads it, deletes it, syncs and pauses (`DELETE_PAUSE_SECONDS`), as a
    user who deletes an old version and then converts a new one. On a VM
    whose balloon reports free pages, the deleted store's page cache has gone
    back to the host when the write starts (docs/troubleshooting.md)."""
    from loaderx import from_numpy

    victim = directory.parent / f"{directory.name}-deleted"
    from_numpy(victim, rows, codec="raw", progress=False)
    warm_tree(victim)  # a store in use: its pages in the cache
    time.sleep(0.5)
    shutil.rmtree(victim)
    os.sync()
    time.sleep(DELETE_PAUSE_SECONDS)


SHARD_COUNT = 64


def _loaderx_sharded(codec: str) -> tuple[Callable, Callable]:
    """The rows split into SHARD_COUNT shards of one sharded dataset, read as
    one through its store (the same level as `_loaderx`'s Zrecord.gather)."""

    def write(directory: Path, rows: np.ndarray) -> None:
        from loaderx import shards

        bounds = np.linspace(0, len(rows), SHARD_COUNT + 1).astype(np.int64)
        for k in range(SHARD_COUNT):
            shards.write_shard(
                directory / "sharded", k, rows[bounds[k] : bounds[k + 1]], codec=codec
            )
        shards.commit(directory / "sharded")

    def open_(directory: Path, rows: np.ndarray) -> Opened:
        from loaderx import DenseDataset

        dataset = DenseDataset(directory / "sharded")
        out = np.empty((BATCH_SIZE, RECORD_FLOATS), dtype=np.float32)

        def read(indices: np.ndarray) -> np.ndarray:
            dataset.store.gather(indices, out)
            return out

        return read, dataset.close

    return write, open_


def _write_npy(directory: Path, rows: np.ndarray) -> None:
    np.save(directory / "rows.npy", rows)


def _open_npy(directory: Path, rows: np.ndarray) -> Opened:
    array = np.load(directory / "rows.npy", mmap_mode="r")
    return (lambda indices: array[indices]), (lambda: None)


def _write_hdf5(compression: str | None) -> Callable[[Path, np.ndarray], None]:
    def write(directory: Path, rows: np.ndarray) -> None:
        import h5py

        with h5py.File(directory / "rows.h5", "w") as file:
            if compression is None:
                file.create_dataset("rows", data=rows)  # contiguous, h5py's default
            else:  # one record per chunk: random records decompress nothing extra
                file.create_dataset(
                    "rows", data=rows, chunks=(1, RECORD_FLOATS), compression=compression
                )

    return write


def _open_hdf5(directory: Path, rows: np.ndarray) -> Opened:
    import h5py

    file = h5py.File(directory / "rows.h5", "r")
    dataset = file["rows"]

    def read(indices: np.ndarray) -> np.ndarray:
        # h5py selects only increasing, distinct indices: sort, read, restore order.
        unique, inverse = np.unique(indices, return_inverse=True)
        return dataset[unique][inverse]

    return read, file.close


def _lmdb(compress: bool) -> tuple[Callable, Callable]:
    def write(directory: Path, rows: np.ndarray) -> None:
        import lmdb

        environment = lmdb.open(str(directory / "lmdb"), map_size=2 * rows.nbytes + 64 * MiB)
        try:
            with environment.begin(write=True) as transaction:
                for index, row in enumerate(rows):
                    value = row.tobytes()
                    transaction.put(
                        index.to_bytes(8, "big"), zlib.compress(value) if compress else value
                    )
        finally:
            environment.close()

    def open_(directory: Path, rows: np.ndarray) -> Opened:
        import lmdb

        environment = lmdb.open(str(directory / "lmdb"), readonly=True, lock=False)

        def read(indices: np.ndarray) -> np.ndarray:
            out = np.empty((len(indices), RECORD_FLOATS), dtype=np.float32)
            with environment.begin() as transaction:
                for position, index in enumerate(indices.tolist()):
                    value = transaction.get(index.to_bytes(8, "big"))
                    out[position] = np.frombuffer(
                        zlib.decompress(value) if compress else value, dtype=np.float32
                    )
            return out

        return read, environment.close

    return write, open_


def _write_blosc2(directory: Path, rows: np.ndarray) -> None:
    import blosc2

    # One record per chunk (blosc2's defaults otherwise: zstd, shuffle, all cores).
    blosc2.asarray(rows, urlpath=str(directory / "rows.b2nd"), mode="w", chunks=(1, RECORD_FLOATS))


def _open_blosc2(directory: Path, rows: np.ndarray) -> Opened:
    import blosc2

    array = blosc2.open(str(directory / "rows.b2nd"), mode="r")
    return (lambda indices: array[indices]), (lambda: None)


def _shard_rows(count: int) -> int:
    # Sharded so `on disk` measures compression, not one 4 KiB-rounded file per record.
    return min(1000, count)


def _write_zarr(directory: Path, rows: np.ndarray) -> None:
    import zarr

    array = zarr.create_array(
        store=str(directory / "rows.zarr"),
        shape=rows.shape,
        dtype=rows.dtype,
        chunks=(1, RECORD_FLOATS),
        shards=(_shard_rows(len(rows)), RECORD_FLOATS),
    )  # zarr's default codec: zstd
    array[...] = rows


def _open_zarr(directory: Path, rows: np.ndarray) -> Opened:
    import zarr

    array = zarr.open_array(str(directory / "rows.zarr"), mode="r")
    return (lambda indices: array.oindex[indices]), (lambda: None)


def _tensorstore_spec(directory: Path) -> dict:
    return {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(directory / "rows.zarr")}}


def _write_tensorstore(directory: Path, rows: np.ndarray) -> None:
    import tensorstore

    chunk = {
        "name": "regular",
        "configuration": {"chunk_shape": [_shard_rows(len(rows)), RECORD_FLOATS]},
    }
    inner = [
        {"name": "bytes", "configuration": {"endian": "little"}},
        {"name": "zstd", "configuration": {"level": 3}},
    ]
    sharding = {
        "name": "sharding_indexed",
        "configuration": {
            "chunk_shape": [1, RECORD_FLOATS],
            "codecs": inner,
            "index_codecs": [
                {"name": "bytes", "configuration": {"endian": "little"}},
                {"name": "crc32c"},
            ],
        },
    }
    spec = dict(
        _tensorstore_spec(directory),
        create=True,
        metadata={
            "shape": list(rows.shape),
            "data_type": "float32",
            "chunk_grid": chunk,
            "codecs": [sharding],
        },
    )
    tensorstore.open(spec).result().write(rows).result()


def _open_tensorstore(directory: Path, rows: np.ndarray) -> Opened:
    import tensorstore

    array = tensorstore.open(_tensorstore_spec(directory), read=True).result()
    return (lambda indices: array[indices].read().result()), (lambda: None)


def _write_arrayrecord(directory: Path, rows: np.ndarray) -> None:
    from array_record.python.array_record_module import ArrayRecordWriter

    # group_size:1 is what ArrayRecord recommends for random access (default codec zstd).
    writer = ArrayRecordWriter(str(directory / "rows.array_record"), "group_size:1")
    for row in rows:
        writer.write(row.tobytes())
    writer.close()


def _open_arrayrecord(directory: Path, rows: np.ndarray) -> Opened:
    from array_record.python.array_record_data_source import ArrayRecordDataSource

    source = ArrayRecordDataSource(str(directory / "rows.array_record"))

    def read(indices: np.ndarray) -> np.ndarray:
        records = source.__getitems__(indices.tolist())
        return np.stack([np.frombuffer(record, dtype=np.float32) for record in records])

    return read, (lambda: source.__exit__(None, None, None))


def _write_numpack(directory: Path, rows: np.ndarray) -> None:
    from numpack import NumPack

    with NumPack(str(directory / "numpack"), drop_if_exists=True) as pack:
        pack.save({"rows": rows})


def _open_numpack(directory: Path, rows: np.ndarray) -> Opened:
    from numpack import NumPack

    pack = NumPack(str(directory / "numpack"))
    pack.open()
    return (lambda indices: pack.getitem("rows", indices)), pack.close


# A ceiling's kinds and threads: MEMORY is the memcpy gather (else a codec's
# decode); CORES is one thread per core, loaderx's default.
MEMORY, CORES = "memory", 0


def _ours(name: str, codec: str, contender: tuple[Callable, Callable], **options) -> StoreContender:
    """A loaderx store: its gathers run on one thread per core, bound by
    memcpy (raw) or by its codec's decode (zstd_dict's dictionary aside)."""
    bound = MEMORY if codec == "raw" else codec.replace("zstd_dict", "zstd")
    return StoreContender(name, ("loaderx",), "-e .", *contender, ceiling=(bound, CORES), **options)


def store_contenders() -> list[StoreContender]:
    lmdb_plain, lmdb_zlib = _lmdb(False), _lmdb(True)
    one_copy = (MEMORY, 1)  # a copy per record on the calling thread
    return [
        StoreContender("numpy in memory (ceiling)", (), "", None, _open_memory, ceiling=one_copy),
        *(
            _ours(f"loaderx {codec}", codec, _loaderx(codec))
            for codec in ("raw", "zstd", "zstd_dict", "zstd_shuffle4", "lz4_shuffle4")
        ),
        _ours("loaderx from_numpy raw", "raw", _loaderx_from_numpy("raw")),
        _ours(
            "loaderx from_numpy raw, after a delete",
            "raw",
            _loaderx_from_numpy("raw"),
            before=_delete_a_store,
        ),
        _ours("loaderx from_numpy zstd", "zstd", _loaderx_from_numpy("zstd")),
        # auto picks zstd_shuffle4 for float32 records.
        _ours("loaderx from_numpy auto", "zstd_shuffle4", _loaderx_from_numpy("auto")),
        _ours(f"loaderx raw, {SHARD_COUNT} shards", "raw", _loaderx_sharded("raw")),
        _ours(f"loaderx zstd, {SHARD_COUNT} shards", "zstd", _loaderx_sharded("zstd")),
        StoreContender("npy-mmap", (), "", _write_npy, _open_npy, ceiling=one_copy),
        StoreContender(
            "npy-mmap, after a delete",
            (),
            "",
            _write_npy,
            _open_npy,
            before=_delete_a_store,
            ceiling=one_copy,
        ),
        StoreContender("hdf5", ("h5py",), "h5py", _write_hdf5(None), _open_hdf5, ceiling=one_copy),
        StoreContender("hdf5-gzip", ("h5py",), "h5py", _write_hdf5("gzip"), _open_hdf5),
        StoreContender("lmdb", ("lmdb",), "lmdb", *lmdb_plain, ceiling=one_copy),
        StoreContender("lmdb-zlib", ("lmdb",), "lmdb", *lmdb_zlib),
        # blosc2 shuffles by the item size and decodes on every core.
        StoreContender(
            "blosc2",
            ("blosc2",),
            "blosc2",
            _write_blosc2,
            _open_blosc2,
            ceiling=("zstd_shuffle4", CORES),
        ),
        StoreContender("zarr", ("zarr",), "zarr", _write_zarr, _open_zarr, ceiling=("zstd", CORES)),
        StoreContender(
            "tensorstore",
            ("tensorstore",),
            "tensorstore",
            _write_tensorstore,
            _open_tensorstore,
            ceiling=("zstd", CORES),
        ),
        StoreContender(
            "arrayrecord",
            ("array_record.python.array_record_module",),
            "array-record",
            _write_arrayrecord,
            _open_arrayrecord,
            ceiling=("zstd", CORES),
        ),
        StoreContender(
            "numpack",
            ("numpack",),
            "numpack==0.4.5",
            _write_numpack,
            _open_numpack,
            ceiling=one_copy,
        ),
    ]


# The contenders of the cold-cache table: stores a loader reads through the
# page cache, whose pages fadvise can drop once the store is closed.
COLD_CONTENDERS = ("loaderx raw", "loaderx zstd", f"loaderx zstd, {SHARD_COUNT} shards", "npy-mmap")


@dataclass
class StoreResult:
    contender: StoreContender
    directory: Path
    write_seconds: list[float]
    read_seconds: list[float]
    cold_seconds: list[float]
    failure: str = ""
    cold_cached: list[int] = field(
        default_factory=list
    )  # bytes a cold batch left in the page cache


def _write_store(
    contender: StoreContender, directory: Path, rows: np.ndarray, runs: int
) -> StoreResult:
    """Writes `runs` times, each into a fresh `directory` and timed to the last
    fsync; the last write stays for the reads."""
    seconds = []
    for _ in range(runs if contender.write else 1):
        if directory.exists():
            shutil.rmtree(directory)
        directory.mkdir()
        if contender.write is None:
            break
        if contender.before is not None:
            contender.before(directory, rows)
        start = time.perf_counter()
        contender.write(directory, rows)
        sync_tree(directory)
        seconds.append(time.perf_counter() - start)
    return StoreResult(contender, directory, seconds, [], [])


def _check_batch(name: str, batch, rows: np.ndarray, indices: np.ndarray) -> None:
    batch = np.asarray(batch)
    expected = rows[indices]
    if batch.shape != expected.shape or batch.dtype != expected.dtype:
        raise AssertionError(
            f"{name}: returned {batch.dtype} {batch.shape}, expected {expected.dtype} "
            f"{expected.shape}"
        )
    if not np.array_equal(batch, expected):
        wrong = int((batch != expected).any(axis=1).sum())
        raise AssertionError(f"{name}: {wrong} of {len(indices)} records differ from the source")


def _read_run(reader: Reader, batches: np.ndarray) -> float:
    start = time.perf_counter()
    for indices in batches:
        reader(indices)
    return time.perf_counter() - start


def _evict_settled(directory: Path, tries: int = 5) -> int | None:
    """Evicts `directory` until fincore finds none of it cached (readahead
    started by the last read can land pages after an eviction), at most
    `tries` times; returns the bytes still cached (None: no fincore)."""
    for _ in range(tries):
        evict_tree(directory)
        cached = resident_bytes(directory)
        if not cached:
            return cached
        time.sleep(0.02)
    return cached


def _cold_run(
    result: StoreResult, rows: np.ndarray, batches: np.ndarray
) -> tuple[float, int | None]:
    """Seconds to read `batches`, each from a cold page cache: the store is
    closed (unmapping it), its files evicted, and reopened before every batch;
    only the read is timed. Records in `result.cold_cached` what each batch
    brought into the page cache, and returns the most bytes an eviction left
    cached (None: fincore is not installed, so neither is measurable)."""
    elapsed, left = 0.0, 0
    for indices in batches:
        cached = _evict_settled(result.directory)
        left = None if cached is None or left is None else max(left, cached)
        read, close = result.contender.open(result.directory, rows)
        start = time.perf_counter()
        read(indices)
        elapsed += time.perf_counter() - start
        if left is not None:
            result.cold_cached.append(resident_bytes(result.directory))
        close()
        del read  # drops the last reference to a memory map, so the next eviction reaches it
    return elapsed, left


def _fraction(speed: float, ceiling: float | None, label: str = "") -> str:
    """`speed` as a fraction of `ceiling` (— when none was measured)."""
    if not ceiling:
        return "—"
    return f"{speed / ceiling:.2f}x" + (f" ({label})" if label else "")


def _store_row(
    result: StoreResult, source_bytes: int, batch_count: int, ceilings=None
) -> list[str]:
    """A store table row; with `ceilings` (bench_ceilings.Ceilings) also the
    write as a fraction of the sequential-write ceiling (bytes on disk per
    second) and the gather as one of its memory or decode ceiling."""
    name = result.contender.name
    fractions = [] if ceilings is None else ["—", "—"]
    if result.failure:
        return [name, "FAILED", "FAILED", "—", "—", "—", *fractions]
    read = statistics.median(result.read_seconds)
    gathered = batch_count * BATCH_SIZE * RECORD_BYTES
    if result.contender.write is None:
        write, on_disk, ratio = "—", "— (in memory)", "—"
    else:
        disk = allocated_bytes(result.directory)
        write_seconds = statistics.median(result.write_seconds)
        write = _mib_per_second(source_bytes, write_seconds)
        on_disk, ratio = f"{disk / MiB:,.1f} MiB", f"{source_bytes / disk:.2f}x"
        if ceilings is not None and ceilings.disk is not None:
            fractions[0] = _fraction(disk / write_seconds / MiB, ceilings.disk.write_mib_per_second)
    if ceilings is not None:
        fractions[1] = _fraction(gathered / read / MiB, *ceilings.speed(result.contender.ceiling))
    return [
        name,
        write,
        _mib_per_second(gathered, read),
        f"{read / batch_count * 1e3:.2f}",
        on_disk,
        ratio,
        *fractions,
    ]


def _write_stores(
    root: Path, rows: np.ndarray, runs: int, contenders: list[StoreContender] | None = None
) -> tuple[list[StoreResult], list[str]]:
    """Writes every installed contender's store (all of `store_contenders()`
    by default) under `root` and reads its files once; returns the results
    so far and the skipped lines."""
    results, skipped = [], []
    for number, contender in enumerate(store_contenders() if contenders is None else contenders):
        if _missing(contender.modules) is not None:
            skipped.append(
                f"skipped: {contender.name} not installed (pip install {contender.install})"
            )
            continue
        directory = root / f"{number:02d}"
        try:
            result = _write_store(contender, directory, rows, runs)
        except Exception as exc:
            result = StoreResult(
                contender, directory, [], [], [], f"write raised {type(exc).__name__}: {exc}"
            )
        else:
            warm_tree(directory)
        results.append(result)
    return results, skipped


def _time_reads(
    results: list[StoreResult],
    rows: np.ndarray,
    batches: np.ndarray,
    runs: int,
    between: Callable[[], None] | None = None,
) -> None:
    """Checks each store's first and last batch against the source (which also
    warms its own caches), then times `runs` passes over all batches,
    interleaved so noise on the shared box hits every store alike (and
    `between` once after every pass, a ceiling's round). A store that
    returns wrong data or raises is marked failed and not timed."""
    readers: dict[str, Opened] = {}
    for result in results:
        if result.failure:
            continue
        try:
            readers[result.contender.name] = result.contender.open(result.directory, rows)
            for indices in (batches[0], batches[-1]):
                _check_batch(
                    result.contender.name, readers[result.contender.name][0](indices), rows, indices
                )
        except Exception as exc:
            result.failure = f"{type(exc).__name__}: {exc}"
    for _ in range(runs):
        for result in results:
            if result.failure:
                continue
            try:
                result.read_seconds.append(_read_run(readers[result.contender.name][0], batches))
            except Exception as exc:
                result.failure = f"{type(exc).__name__}: {exc}"
        if between is not None:
            between()
    for _, close in readers.values():
        close()
    readers.clear()  # drops memory maps, so the cold runs can evict their pages


def bench_store(quick: bool) -> str:
    """Random batch gathers from every record store, the same batches for all."""
    count, batch_count = (2000, 8) if quick else (20000, 200)
    write_runs, read_runs = (1, 1) if quick else (3, 5)
    cold_batches, cold_runs = (3, 1) if quick else (50, 3)
    rows = structured_rows(count)
    batches = np.random.default_rng(1).integers(0, count, (batch_count, BATCH_SIZE))
    with tempfile.TemporaryDirectory(prefix="loaderx-bench-store-") as temporary:
        results, skipped = _write_stores(Path(temporary), rows, write_runs)
        memory = _memory_rounds(rows, batches)
        _time_reads(results, rows, batches, read_runs, None if memory is None else memory.round)
        limits = bench_ceilings.measure(
            rows,
            batches,
            read_runs,
            rows.nbytes,
            200 if quick else 2000,
            STORE_CODECS,
            memory=memory,
        )
        cold = [
            result
            for result in results
            if result.contender.name in COLD_CONTENDERS and not result.failure
        ]
        cold_note = _cold_table(cold, rows, batches[:cold_batches], cold_runs, limits)
        table_rows = [_store_row(result, rows.nbytes, batch_count, limits) for result in results]
        shuffle_notes = _shuffle_ratios(results, "zstd_shuffle4")
    ceilings, ceiling_note = _ceiling_rows(rows, 4, batch_count, read_runs)
    paired = _paired_ceiling_ratios(rows, 4, 1 if quick else 5)
    failures = [
        f"FAILED: {result.contender.name}: {result.failure}" for result in results if result.failure
    ]
    table = markdown_table(
        [*STORE_HEADER, "write x ceiling", "gather x ceiling"],
        table_rows + [[*row, "—", "—"] for row in ceilings],
    )
    notes = "\n".join(
        skipped + failures + _sharded_ratios(results) + shuffle_notes + [ceiling_note] + paired
    )
    return (
        f"### store: {count:,} records of {RECORD_BYTES // 1024} KiB (float32, zstd-compressible "
        f"~1.3x), {batch_count} random batches of {BATCH_SIZE}, warm page cache\n\n{table}\n\n"
        + (f"{notes}\n\n" if notes else "")
        + f"Write: median of {write_runs} (to the last fsync; loaderx zstd_dict includes training "
        "its dictionary; an `after a delete` row first writes and reads a store of the same "
        f"size, deletes it, syncs and waits {DELETE_PAUSE_SECONDS:.0f} s, untimed). Gather: "
        f"median of {read_runs} interleaved runs of all {batch_count} batches, after every file "
        "was read once and each store's first and last batch were checked against the source. "
        "`on disk` is allocated blocks; `ratio` is source bytes over that. Reads go through each "
        "library's own batch API: loaderx `gather` into a reused buffer, NumPy `take` into one, "
        "h5py fancy indexing (sorted, then reordered), one `get` per record in LMDB, `oindex` in "
        "zarr, index arrays in TensorStore and blosc2, `__getitems__` for ArrayRecord, `getitem` "
        "in numpack. Chunked stores keep one record per "
        f"chunk; zarr and TensorStore shard them 1000 to a file. {CEILING_NOTE}\n\n"
        f"### store ceilings: measured in the same run\n\n"
        f"{bench_ceilings.ceilings_table(limits, read_runs)}\n\n{cold_note}\n\n"
        f"{_label_table(quick, limits.disk)}"
    )


STORE_HEADER = ["store", "write MiB/s", "gather MiB/s", "ms / batch", "on disk", "ratio"]
# The codecs whose decode ceilings the store and loader tables measure.
STORE_CODECS = ("zstd", "zstd_shuffle4", "lz4_shuffle4")
CEILING_NOTE = (
    "`x ceiling`: the row as a fraction of what bounds it on this machine (the table below, "
    "scripts/bench_ceilings.py): a write is its bytes on disk per second against a sequential "
    "write + fdatasync; a raw gather against a memcpy gather of the same batches on the threads "
    "it runs on (loaderx: one per core, its default; NumPy, h5py, LMDB, numpack: the calling "
    "thread); a compressed gather against the system library's single-core decode of its codec "
    "times the cores (loaderx's zstd_dict and zarr, TensorStore, ArrayRecord against plain zstd, "
    "blosc2 against zstd_shuffle4; gzip and zlib are not measured: —); a round of the memory "
    "and decode ceilings runs after every round of gathers, so both see the same machine."
)


def _memory_rounds(rows: np.ndarray, batches: np.ndarray, codecs: tuple[str, ...] = STORE_CODECS):
    """bench_ceilings.CeilingRounds for these batches and `codecs`, or None
    when its library cannot be built or loaded here (the ceilings then say
    why)."""
    try:
        return bench_ceilings.CeilingRounds(rows, batches, codecs=codecs)
    except (OSError, subprocess.SubprocessError, RuntimeError):
        return None


# -- the compression limit ------------------------------------------------------------
#
# What one core of the system libzstd (the library loaderx links) does on the
# same records, called through ctypes one record at a time in a tight loop,
# times the cores: no store can compress or decode zstd-3 faster than that.


def _libzstd():
    import ctypes
    import ctypes.util

    path = os.environ.get("LOADERX_ZSTD") or "/usr/lib/x86_64-linux-gnu/libzstd.so.1"
    library = ctypes.CDLL(path if os.path.exists(path) else ctypes.util.find_library("zstd"))
    library.ZSTD_createCCtx.restype = ctypes.c_void_p
    library.ZSTD_createDCtx.restype = ctypes.c_void_p
    library.ZSTD_compressBound.restype = ctypes.c_size_t
    library.ZSTD_compressCCtx.restype = ctypes.c_size_t
    library.ZSTD_compressCCtx.argtypes = [
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
    ]
    library.ZSTD_decompressDCtx.restype = ctypes.c_size_t
    library.ZSTD_decompressDCtx.argtypes = [
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_void_p,
        ctypes.c_size_t,
    ]
    library.ZSTD_freeCCtx.argtypes = [ctypes.c_void_p]
    library.ZSTD_freeDCtx.argtypes = [ctypes.c_void_p]
    return library


def _shuffle_rows(rows: np.ndarray, element_bytes: int) -> np.ndarray:
    """Each row byte-shuffled by `element_bytes` (what zstd_shuffleN compresses)."""
    raw = rows.reshape(len(rows), -1).view(np.uint8)
    return np.ascontiguousarray(
        raw.reshape(len(rows), -1, element_bytes).transpose(0, 2, 1)
    ).reshape(len(rows), -1)


def zstd_single_core(rows: np.ndarray, runs: int) -> tuple[float, float, float]:
    """Median single-core libzstd level-3 compress and decode seconds over all
    `rows` (one frame per row), and the compression ratio."""
    library = _libzstd()
    raw = np.ascontiguousarray(rows).reshape(len(rows), -1).view(np.uint8)
    row_bytes = raw.shape[1]
    bound = library.ZSTD_compressBound(row_bytes)
    frames = np.empty((len(raw), bound), dtype=np.uint8)
    frames.fill(0)  # faulted in here, not inside the first timed pass
    sizes = np.empty(len(raw), dtype=np.int64)
    out = np.empty(row_bytes, dtype=np.uint8)
    compressor, decompressor = library.ZSTD_createCCtx(), library.ZSTD_createDCtx()
    source, target, back = raw.ctypes.data, frames.ctypes.data, out.ctypes.data
    compress_seconds, decode_seconds = [], []
    for _ in range(runs):
        start = time.perf_counter()
        for k in range(len(raw)):
            sizes[k] = library.ZSTD_compressCCtx(
                compressor, target + k * bound, bound, source + k * row_bytes, row_bytes, 3
            )
        compress_seconds.append(time.perf_counter() - start)
        start = time.perf_counter()
        for k in range(len(raw)):
            if (
                library.ZSTD_decompressDCtx(
                    decompressor, back, row_bytes, target + k * bound, int(sizes[k])
                )
                != row_bytes
            ):
                raise AssertionError("libzstd ceiling: a frame did not decode to its row")
        decode_seconds.append(time.perf_counter() - start)
    library.ZSTD_freeCCtx(compressor)
    library.ZSTD_freeDCtx(decompressor)
    return (
        statistics.median(compress_seconds),
        statistics.median(decode_seconds),
        raw.nbytes / float(sizes.sum()),
    )


def _ceiling_rows(
    rows: np.ndarray, element_bytes: int, batch_count: int, runs: int
) -> tuple[list[list[str]], str]:
    """The compression limit as table rows: single-core libzstd-3 compress
    (write column) and decode (gather column) times the cores, on the plain
    and on the shuffled records."""
    try:
        measured = {
            "plain": zstd_single_core(rows, runs),
            f"shuffled by {element_bytes}": zstd_single_core(
                _shuffle_rows(rows, element_bytes), runs
            ),
        }
    except (OSError, AttributeError) as exc:
        return [], f"ceiling rows skipped: the system libzstd could not be loaded ({exc})"
    count, table_rows = cores(), []
    gathered = batch_count * BATCH_SIZE * rows[0].nbytes
    for name, (compress, decode, ratio) in measured.items():
        per_batch = decode / count * gathered / rows.nbytes / batch_count
        table_rows.append(
            [
                f"ceiling: libzstd-3 x {count} cores, {name}",
                _mib_per_second(rows.nbytes * count, compress),
                _mib_per_second(rows.nbytes * count, decode),
                f"{per_batch * 1e3:.2f}",
                "—",
                f"{ratio:.2f}x",
            ]
        )
    note = (
        f"Ceilings: single-core libzstd level 3 on the same {len(rows):,} records (one frame each, "
        f"through ctypes, median of {runs}) times {count} cores; write = compress, gather = "
        "decode, ratio = frames only."
    )
    return table_rows, note


def _paired_ceiling_ratios(rows: np.ndarray, element_bytes: int, rounds: int) -> list[str]:
    """`from_numpy` writes against the compression limit, paired: each round
    times one write (to the last fsync, as the table does) and then one
    single-core libzstd pass over the same records, so both see the same
    machine (on a shared box the limit itself moves by 15% between minutes).
    One line per codec: the median over rounds of write speed / limit."""
    try:
        _libzstd()
    except (OSError, AttributeError) as exc:
        return [f"paired ceiling ratios skipped: the system libzstd could not be loaded ({exc})"]
    write, _ = _loaderx_from_numpy("zstd")
    write_shuffled, _ = _loaderx_from_numpy(f"zstd_shuffle{element_bytes}")
    shuffled_rows = _shuffle_rows(rows, element_bytes)
    pairs = (("zstd", write, rows), (f"zstd_shuffle{element_bytes}", write_shuffled, shuffled_rows))
    ratios: dict[str, list[float]] = {name: [] for name, _, _ in pairs}
    with tempfile.TemporaryDirectory(prefix="loaderx-bench-ceiling-") as temporary:
        for _ in range(rounds):
            for name, writer, limit_rows in pairs:
                directory = Path(temporary) / name
                shutil.rmtree(directory, ignore_errors=True)
                directory.mkdir()
                start = time.perf_counter()
                writer(directory, rows)
                sync_tree(directory)
                written = time.perf_counter() - start
                compress, _, _ = zstd_single_core(limit_rows, 1)
                ratios[name].append(compress / cores() / written)
    return [
        f"from_numpy {name} writes at {statistics.median(values):.2f}x the compression limit "
        f"(paired: median of {rounds} rounds of one write and one single-core libzstd pass x "
        f"{cores()} cores; rounds {', '.join(f'{value:.2f}' for value in values)})."
        for name, values in ratios.items()
    ]


def _shuffle_ratios(results: list[StoreResult], codec: str) -> list[str]:
    """The shuffled store against plain zstd: gather speed, size and write speed."""
    by_name = {
        result.contender.name: result
        for result in results
        if not result.failure and result.read_seconds
    }
    plain, shuffled = by_name.get("loaderx zstd"), by_name.get(f"loaderx {codec}")
    if plain is None or shuffled is None:
        return []
    gather = statistics.median(plain.read_seconds) / statistics.median(shuffled.read_seconds)
    size = allocated_bytes(shuffled.directory) / allocated_bytes(plain.directory)
    write = statistics.median(plain.write_seconds) / statistics.median(shuffled.write_seconds)
    return [
        f"loaderx {codec} against loaderx zstd: gather {gather:.2f}x, on-disk size {size:.2f}x, "
        f"write {write:.2f}x (median runs)."
    ]


LABELS_PER_RECORD = RECORD_BYTES // 8


def _label_table(quick: bool, disk: bench_ceilings.Disk | None = None) -> str:
    """Plain against shuffled zstd on an integer-label column: int64 class ids
    (0..999) in records of 12 KiB, as a per-position label column is stored;
    every row as a fraction of its ceilings: its codec's decode measured on
    these records, and `disk` (the store table's, the same run's)."""
    count, batch_count = (2000, 8) if quick else (20000, 200)
    write_runs, read_runs = (1, 1) if quick else (3, 5)
    labels = np.random.default_rng(5).integers(0, 1000, (count, LABELS_PER_RECORD), dtype=np.int64)
    batches = np.random.default_rng(1).integers(0, count, (batch_count, BATCH_SIZE))
    contenders = [
        _ours("loaderx zstd", "zstd", _loaderx("zstd")),
        _ours("loaderx zstd_shuffle8", "zstd_shuffle8", _loaderx("zstd_shuffle8")),
        _ours("loaderx from_numpy auto", "auto", _loaderx_from_numpy("auto")),
    ]
    with tempfile.TemporaryDirectory(prefix="loaderx-bench-labels-") as temporary:
        results, skipped = _write_stores(Path(temporary), labels, write_runs, contenders)
        for result in results:
            if result.contender.ceiling[0] == "auto" and not result.failure:
                result.contender = replace(
                    result.contender, ceiling=(_written_codec(result.directory), CORES)
                )
        codecs = tuple(dict.fromkeys(r.contender.ceiling[0] for r in results if not r.failure))
        memory = _memory_rounds(labels, batches, codecs)
        _time_reads(results, labels, batches, read_runs, None if memory is None else memory.round)
        limits = replace(
            bench_ceilings.measure(labels, batches, read_runs, 0, 0, codecs, False, memory),
            disk=disk,
        )
        table_rows = [_store_row(result, labels.nbytes, batch_count, limits) for result in results]
        ratios = _shuffle_ratios(results, "zstd_shuffle8")
    ceilings, ceiling_note = _ceiling_rows(labels, 8, batch_count, read_runs)
    failures = [
        f"FAILED: {result.contender.name}: {result.failure}" for result in results if result.failure
    ]
    table = markdown_table(
        [*STORE_HEADER, "write x ceiling", "gather x ceiling"],
        table_rows + [[*row, "—", "—"] for row in ceilings],
    )
    notes = "\n".join(skipped + failures + ratios + [ceiling_note] + limits.notes)
    return (
        f"### store, integer labels: {count:,} records of {LABELS_PER_RECORD:,} int64 class ids "
        f"(0..999), {batch_count} random batches of {BATCH_SIZE}, warm page cache\n\n{table}\n\n"
        f"{notes}\n\nWrite: median of {write_runs}; gather: median of {read_runs} interleaved "
        "runs, as above; `x ceiling` as in the store table (its disk ceilings, decode ceilings "
        "measured on these records)."
    )


def _written_codec(directory: Path) -> str:
    """The codec a converter's `auto` picked for the store in `directory`."""
    from loaderx import DenseDataset

    with DenseDataset(directory / "store") as dataset:
        return dataset.codec


def _sharded_ratios(results: list[StoreResult]) -> list[str]:
    """Lines comparing each sharded dataset's gather with its single store's."""
    seconds = {
        result.contender.name: statistics.median(result.read_seconds)
        for result in results
        if result.read_seconds and not result.failure
    }
    lines = []
    for codec in ("raw", "zstd"):
        single, sharded = f"loaderx {codec}", f"loaderx {codec}, {SHARD_COUNT} shards"
        if single in seconds and sharded in seconds:
            lines.append(
                f"{sharded} gathers at {seconds[single] / seconds[sharded]:.2f}x the speed of one "
                f"{codec} store (median runs)."
            )
    return lines


def _cold_table(
    results: list[StoreResult], rows: np.ndarray, batches: np.ndarray, runs: int, ceilings=None
) -> str:
    header = (
        f"### store, cold page cache: {len(batches)} batches of {BATCH_SIZE}, files evicted before "
        "each batch"
    )
    if not results:
        return f"{header}\n\nskipped: none of {', '.join(COLD_CONTENDERS)} ran"
    if not hasattr(os, "posix_fadvise"):
        return f"{header}\n\nnot measured: this platform has no posix_fadvise"
    verified = True
    for _ in range(runs):
        for result in results:
            seconds, left = _cold_run(result, rows, batches)
            result.cold_seconds.append(seconds)
            if left is None:
                verified = False
            elif left > 0:
                return (
                    f"{header}\n\nnot measured: posix_fadvise(DONTNEED) left {left:,} bytes of "
                    f"{result.contender.name} in the page cache, so a cold read cannot be forced "
                    "here"
                )
    gathered = len(batches) * BATCH_SIZE * RECORD_BYTES
    table_rows = []
    for result in results:
        seconds = statistics.median(result.cold_seconds)
        cached = f"{statistics.median(result.cold_cached) / MiB:.1f}" if result.cold_cached else "—"
        threads = result.contender.ceiling[1]
        cold = None if ceilings is None else ceilings.cold_at(RECORD_BYTES, threads)
        table_rows.append(
            [
                result.contender.name,
                _mib_per_second(gathered, seconds),
                f"{seconds / len(batches) * 1e3:.2f}",
                cached,
                _fraction(
                    gathered / seconds / MiB,
                    cold,
                    f"{RECORD_BYTES // 1024} KiB preads, {threads or cores()} thread"
                    + "s" * ((threads or cores()) > 1),
                ),
            ]
        )
    table = markdown_table(
        ["store", "gather MiB/s", "ms / batch", "MiB cached per batch", "x ceiling"], table_rows
    )
    check = (
        "fincore confirmed every eviction"
        if verified
        else "fincore is not installed, so the evictions are unverified"
    )
    return (
        f"{header}\n\n{table}\n\nMedian of {runs} runs. Before every batch the store is closed, "
        "its files evicted with posix_fadvise(POSIX_FADV_DONTNEED) and the store reopened "
        f"(untimed); {check}. `MiB cached per batch` is what one batch of "
        f"{BATCH_SIZE * RECORD_BYTES / MiB:.0f} MiB of records brought into the page cache (the "
        "kernel reads ahead around each fault or read). `x ceiling` is against cold random preads "
        "of a record's size on the threads the gather runs on (the store ceilings above). "
        '"Cold" here is whatever backs this machine\'s disk, often a host cache, not a bare device.'
    )


# -- loader -----------------------------------------------------------------------
#
# A loader contender is `start(directory) -> (next_batch, close)`:
# `next_batch()` returns the next batch as NumPy arrays (features, labels),
# endlessly (loaders with epochs start the next one), and `close()` stops its
# workers. Every loader reads what it is built for from `directory`, written
# by `_write_loader_data`. Labels are a permutation of 0..count, so a batch is
# checked against the source by its labels alone, whatever sampler made it.

Batch = tuple[np.ndarray, np.ndarray]
Started = tuple[Callable[[], Batch], Callable[[], None]]


@dataclass(frozen=True)
class LoaderContender:
    name: str
    modules: tuple[str, ...]
    install: str
    data: str  # what it reads: "loaderx" stores, "npy" files or an "arrayrecord" file
    start: Callable[[Path], Started]
    # What bounds it (as StoreContender.ceiling): all of them run on every core.
    ceiling: tuple[str, int] = (MEMORY, CORES)


def _write_loader_data(
    directory: Path, rows: np.ndarray, labels: np.ndarray, contenders: list[LoaderContender]
) -> None:
    """Writes what the runnable `contenders` read: loaderx stores, `.npy` files, an ArrayRecord
    file."""
    kinds = {contender.data for contender in contenders}
    if "loaderx" in kinds:
        from loaderx import from_numpy

        from_numpy(directory / "x-zstd", rows, codec="zstd", progress=False)
        from_numpy(directory / "x-raw", rows, codec="raw", progress=False)
        from_numpy(directory / "x-zstd_shuffle4", rows, codec="zstd_shuffle4", progress=False)
        from_numpy(directory / "x-lz4_shuffle4", rows, codec="lz4_shuffle4", progress=False)
        # 8-byte labels gain nothing from a zstd frame each: both loaderx rows store them raw.
        from_numpy(directory / "y", labels, codec="raw", progress=False)
    if "npy" in kinds:
        np.save(directory / "x.npy", rows)
        np.save(directory / "y.npy", labels)
    if "arrayrecord" in kinds:
        from array_record.python.array_record_module import ArrayRecordWriter

        writer = ArrayRecordWriter(str(directory / "xy.array_record"), "group_size:1")
        for row, label in zip(rows, labels.tolist()):
            writer.write(row.tobytes() + label.to_bytes(8, "little", signed=True))
        writer.close()


def _loaderx_streams(directory: Path, codec: str) -> dict:
    from loaderx import DenseDataset

    return {"x": DenseDataset(directory / f"x-{codec}"), "y": DenseDataset(directory / "y")}


def _start_loaderx(codec: str) -> Callable[[Path], Started]:
    def start(directory: Path) -> Started:
        from loaderx import DataLoader

        streams = _loaderx_streams(directory, codec)
        loader = DataLoader(
            streams,
            num_workers=LOADER_WORKERS,
            batch_size=BATCH_SIZE,
            prefetch_size=4,
            mode=1,
            seed=42,
        )

        def next_batch() -> Batch:
            batch = next(loader)
            return batch["x"], batch["y"]

        def close() -> None:
            loader.close()
            for dataset in streams.values():
                dataset.close()

        return next_batch, close

    return start


def _start_bare(codec: str) -> Callable[[Path], Started]:
    """The loaderx DataLoader's work per batch in a plain loop on one Python
    thread: the same sampler steps, two gathers into fresh arrays."""

    def start(directory: Path) -> Started:
        from loaderx import Sampler

        streams = _loaderx_streams(directory, codec)
        features, labels = streams["x"], streams["y"]
        sampler = Sampler(len(features), BATCH_SIZE, Sampler.Mode.IID, seed=42)
        indices = np.empty(BATCH_SIZE, dtype=np.uint64)
        step = 0

        def next_batch() -> Batch:
            nonlocal step
            sampler.batch(step, indices)
            step += 1
            x = features.gather_into(
                indices, np.empty((BATCH_SIZE, *features.item_shape), features.dtype)
            )
            y = labels.gather_into(indices, np.empty(BATCH_SIZE, labels.dtype))
            return x, y

        def close() -> None:
            features.close()
            labels.close()

        return next_batch, close

    return start


class _NpyRecords:
    """A torch map-style dataset over memory-mapped `.npy` files, as torch's
    tutorials write one: `__getitem__` per record, torch's default collate
    stacks the batch. The files are mapped lazily, in each worker process."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.count = len(np.load(directory / "y.npy", mmap_mode="r"))
        self.features = self.labels = None

    def __len__(self) -> int:
        return self.count

    def _open(self) -> None:
        if self.features is None:
            self.features = np.load(self.directory / "x.npy", mmap_mode="r")
            self.labels = np.load(self.directory / "y.npy", mmap_mode="r")

    def __getitem__(self, index: int):
        import torch

        self._open()
        return torch.from_numpy(np.array(self.features[index])), int(self.labels[index])


class _NpyBatches(_NpyRecords):
    """The same with `__getitems__`, torch's batched fetch: one fancy index
    per batch, and a collate_fn that keeps the batch as it is."""

    def __getitems__(self, indices: list):
        import torch

        self._open()
        order = np.asarray(indices)
        return torch.from_numpy(self.features[order]), torch.from_numpy(self.labels[order])


def _start_torch(batched: bool) -> Callable[[Path], Started]:
    def start(directory: Path) -> Started:
        import torch.utils.data as data

        # Four workers on fewer cores is this benchmark's point, not a mistake.
        warnings.filterwarnings(
            "ignore", message="This DataLoader will create", category=UserWarning
        )
        dataset = _NpyBatches(directory) if batched else _NpyRecords(directory)
        loader = data.DataLoader(
            dataset,
            batch_size=BATCH_SIZE,
            sampler=data.RandomSampler(dataset),
            num_workers=LOADER_WORKERS,
            persistent_workers=True,
            drop_last=True,
            collate_fn=_keep_batch if batched else None,
        )
        epochs = _endless(loader)

        def next_batch() -> Batch:
            features, labels = next(epochs)
            return features.numpy(), labels.numpy()

        def close() -> None:
            nonlocal epochs
            # The generator holds the last reference to the loader: dropping it
            # shuts the persistent workers down.
            epochs.close()
            epochs = None
            gc.collect()

        return next_batch, close

    return start


def _keep_batch(batch):
    """collate_fn for `__getitems__`, whose result already is the batch."""
    return batch


def _endless(loader):
    while True:
        yield from loader


def _start_grain(directory: Path) -> Started:
    import grain.python as grain
    from absl import flags
    from array_record.python.array_record_data_source import ArrayRecordDataSource

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()  # grain 0.2.18 reads absl flags; this script defines none

    class Parse(grain.MapTransform):
        def map(self, record: bytes):
            return {
                "x": np.frombuffer(record, dtype=np.float32, count=RECORD_FLOATS),
                "y": np.frombuffer(record, dtype=np.int64, count=1, offset=RECORD_BYTES)[0],
            }

    source = ArrayRecordDataSource(str(directory / "xy.array_record"))
    sampler = grain.IndexSampler(
        num_records=len(source),
        shard_options=grain.NoSharding(),
        shuffle=True,
        num_epochs=None,
        seed=42,
    )
    loader = grain.DataLoader(
        data_source=source,
        sampler=sampler,
        operations=[Parse(), grain.Batch(BATCH_SIZE, drop_remainder=True)],
        worker_count=LOADER_WORKERS,
    )
    iterator = iter(loader)

    def next_batch() -> Batch:
        batch = next(iterator)
        return batch["x"], batch["y"]

    def close() -> None:
        nonlocal iterator
        iterator = None  # grain stops its worker processes when the iterator is collected
        gc.collect()

    return next_batch, close


def loader_contenders() -> list[LoaderContender]:
    return [
        LoaderContender(
            "loaderx zstd",
            ("loaderx.dataloader",),
            "-e .",
            "loaderx",
            _start_loaderx("zstd"),
            ("zstd", CORES),
        ),
        LoaderContender(
            "loaderx raw", ("loaderx.dataloader",), "-e .", "loaderx", _start_loaderx("raw")
        ),
        LoaderContender(
            "loaderx zstd_shuffle4",
            ("loaderx.dataloader",),
            "-e .",
            "loaderx",
            _start_loaderx("zstd_shuffle4"),
            ("zstd_shuffle4", CORES),
        ),
        LoaderContender(
            "loaderx lz4_shuffle4",
            ("loaderx.dataloader",),
            "-e .",
            "loaderx",
            _start_loaderx("lz4_shuffle4"),
            ("lz4_shuffle4", CORES),
        ),
        LoaderContender(
            "bare gather loop, zstd (no DataLoader)",
            ("loaderx.dataset",),
            "-e .",
            "loaderx",
            _start_bare("zstd"),
            ("zstd", CORES),
        ),
        LoaderContender(
            "bare gather loop, raw (no DataLoader)",
            ("loaderx.dataset",),
            "-e .",
            "loaderx",
            _start_bare("raw"),
        ),
        LoaderContender(
            "torch DataLoader, npy-mmap, per-record",
            ("torch",),
            "torch==2.13.0",
            "npy",
            _start_torch(False),
        ),
        LoaderContender(
            "torch DataLoader, npy-mmap, __getitems__",
            ("torch",),
            "torch==2.13.0",
            "npy",
            _start_torch(True),
        ),
        LoaderContender(
            "grain over ArrayRecord",
            ("grain.python", "array_record.python.array_record_data_source"),
            "grain array-record",
            "arrayrecord",
            _start_grain,
            ("zstd", CORES),
        ),
    ]


def _check_loader_batch(name: str, batch: Batch, rows: np.ndarray, position: np.ndarray) -> None:
    features, labels = (np.asarray(part) for part in batch)
    if features.shape != (BATCH_SIZE, RECORD_FLOATS) or labels.shape != (BATCH_SIZE,):
        raise AssertionError(f"{name}: batch shapes {features.shape} and {labels.shape}")
    if labels.min() < 0 or labels.max() >= len(rows):
        raise AssertionError(f"{name}: a label is not one of the source's")
    if not np.array_equal(features, rows[position[labels]]):
        raise AssertionError(f"{name}: features do not match their labels' source records")


def _loader_run(
    contender: LoaderContender,
    directory: Path,
    rows: np.ndarray,
    position: np.ndarray,
    warmup: int,
    seconds: float,
) -> float:
    """Seconds per batch over `seconds` of batches (at least 10), after
    `warmup` checked batches that also start the workers."""
    next_batch, close = contender.start(directory)
    try:
        for _ in range(warmup):
            _check_loader_batch(contender.name, next_batch(), rows, position)
        start = time.perf_counter()
        done = 0
        while done < 10 or time.perf_counter() - start < seconds:
            next_batch()
            done += 1
        return (time.perf_counter() - start) / done
    finally:
        close()


def bench_loader(quick: bool) -> str:
    """End-to-end batches from each loader: sample, fetch two streams, collate, hand over."""
    count = 2000 if quick else 20000
    runs, warmup, seconds = (1, 2, 0.2) if quick else (5, 8, 2.0)
    rows = structured_rows(count)
    # The memory ceiling's batches: as many random batches as a run takes, about.
    batches = np.random.default_rng(1).integers(0, count, (8 if quick else 200, BATCH_SIZE))
    labels = np.random.default_rng(2).permutation(count).astype(np.int64)
    position = np.argsort(labels)
    lines, runnable = [], []
    for contender in loader_contenders():
        if _missing(contender.modules) is None:
            runnable.append(contender)
        else:
            lines.append(
                f"skipped: {contender.name} not installed (pip install {contender.install})"
            )
    samples: dict[str, list[float]] = {contender.name: [] for contender in runnable}
    failures: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="loaderx-bench-loader-") as temporary:
        directory = Path(temporary)
        _write_loader_data(directory, rows, labels, runnable)
        warm_tree(directory)
        memory = _memory_rounds(rows, batches)
        for _ in range(runs):  # interleaved, as in the store table
            for contender in runnable:
                if contender.name in failures:
                    continue
                try:
                    samples[contender.name].append(
                        _loader_run(contender, directory, rows, position, warmup, seconds)
                    )
                except Exception as exc:
                    failures[contender.name] = f"{type(exc).__name__}: {exc}"
            if memory is not None:
                memory.round()
        limits = bench_ceilings.measure(
            rows, batches, runs, 0, 0, STORE_CODECS, disk=False, memory=memory
        )
        first_batch = (
            _first_batch_table(directory, 1 if quick else max(5, runs))
            if any(c.data == "loaderx" for c in runnable)
            else ""
        )
    table = _loader_table(runnable, samples, failures, limits, lines)
    notes = "\n".join(lines + limits.notes)
    return (
        f"### loader: end to end, {count:,} records, batches of {BATCH_SIZE} x (a "
        f"{RECORD_BYTES // 1024} KiB float32 record + an int64 label), {LOADER_WORKERS} workers\n\n"
        f"{table}\n\n"
        + (f"{notes}\n\n" if notes else "")
        + f"Median of {runs} interleaved runs; each run starts a fresh loader, checks {warmup} "
        f"batches against the source (starting its workers), then times {seconds:g} s of batches "
        "(at least 10). loaderx uses threads and IID sampling and never ends an epoch; torch "
        "(persistent worker processes, RandomSampler, drop_last) and grain (worker processes, "
        "shuffled IndexSampler) read without replacement and pay their epoch restarts and the "
        "inter-process hand-over. The bare loop is the DataLoader's work without the DataLoader: "
        "what its threads and prefetching cost or win. `x ceiling`: the features' bytes per "
        "second against, for a raw or NumPy source, a memcpy gather of random batches of the "
        "same records on every core, and for a compressed one the system library's single-core "
        f"decode of its codec times the cores (zstd for ArrayRecord); {_ceiling_summary(limits)}."
        + (f"\n\n{first_batch}" if first_batch else "")
    )


def _loader_table(
    runnable: list[LoaderContender],
    samples: dict[str, list[float]],
    failures: dict[str, str],
    limits,
    lines: list[str],
) -> str:
    """The loader table (a FAILED line added to `lines` for each failure)."""
    batch_bytes = BATCH_SIZE * (RECORD_BYTES + 8)
    table_rows = []
    for contender in runnable:
        if contender.name in failures:
            table_rows.append([contender.name, "FAILED", "—", "—", "—", "—"])
            lines.append(f"FAILED: {contender.name}: {failures[contender.name]}")
            continue
        per_batch = statistics.median(samples[contender.name])
        table_rows.append(
            [
                contender.name,
                f"{1 / per_batch:,.1f}",
                f"{per_batch * 1e3:.2f}",
                f"{BATCH_SIZE / per_batch:,.0f}",
                _mib_per_second(batch_bytes, per_batch),
                _fraction(
                    BATCH_SIZE * RECORD_BYTES / per_batch / MiB, *limits.speed(contender.ceiling)
                ),
            ]
        )
    return markdown_table(
        ["loader", "batches/s", "ms / batch", "samples/s", "MiB/s", "x ceiling"], table_rows
    )


def _ceiling_summary(limits) -> str:
    """The loader table's ceilings in one phrase."""
    parts = [f"memcpy on {threads}: {speed:,.0f} MiB/s" for threads, speed in limits.memory.items()]
    parts += [f"{codec} decode on 1 core: {speed:,.0f}" for codec, speed in limits.decode.items()]
    return "ceilings measured in the same run (medians), " + ", ".join(parts)


# What a fresh process does before training starts: import loaderx, open the
# two streams, build the DataLoader and take its first batch (timed apart).
_FIRST_BATCH_SCRIPT = """
import sys, time
started = time.perf_counter()
from loaderx import DataLoader, DenseDataset
imported = time.perf_counter()
directory, codec, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
streams = {"x": DenseDataset(f"{directory}/x-{codec}"), "y": DenseDataset(f"{directory}/y")}
opened = time.perf_counter()
loader = DataLoader(streams, num_workers=workers, batch_size=%d, prefetch_size=4, mode=1, seed=42)
batch = next(loader)
first = time.perf_counter()
assert batch["x"].shape == (%d, %d)
loader.close()
print(imported - started, opened - imported, first - opened)
""" % (BATCH_SIZE, BATCH_SIZE, RECORD_FLOATS)  # noqa: UP031 (its f-strings' braces stay as written)


def _first_batch_table(directory: Path, runs: int) -> str:
    """Time to the first batch in a fresh process (median of `runs`), with the
    import and the opening of the streams timed apart."""
    rows = []
    for codec in ("zstd", "zstd_shuffle4", "raw"):
        samples = []
        for _ in range(runs):
            result = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    _FIRST_BATCH_SCRIPT,
                    str(directory),
                    codec,
                    str(LOADER_WORKERS),
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            samples.append([float(value) for value in result.stdout.split()])
        imported, opened, first = (
            statistics.median(sample[k] for sample in samples) for k in range(3)
        )
        rows.append(
            [
                f"loaderx {codec}",
                f"{first * 1e3:.1f}",
                f"{imported * 1e3:.0f}",
                f"{opened * 1e3:.1f}",
            ]
        )
    table = markdown_table(
        ["loader", "DataLoader(...) to first batch, ms", "import loaderx, ms", "open streams, ms"],
        rows,
    )
    return (
        f"### loader, time to first batch: a fresh process, median of {runs}\n\n{table}\n\n"
        "Each run is a new Python process that imports loaderx, opens the two streams and times "
        "`DataLoader(...)` through `next(loader)` (warm page cache)."
    )


# -- registry ---------------------------------------------------------------------

import bench_ceilings  # noqa: E402
from bench_codecs import bench_codecs  # noqa: E402
from bench_numpack import bench_numpack  # noqa: E402
from bench_ragged import bench_packing, bench_processes, bench_ragged  # noqa: E402
from bench_remote import bench_remote  # noqa: E402

TABLES: dict[str, Callable[[bool], str] | None] = {
    "sampler": bench_sampler,
    "store": bench_store,
    "loader": bench_loader,
    "codecs": bench_codecs,
    "numpack": bench_numpack,
    "ragged": bench_ragged,
    "packing": bench_packing,
    "processes": bench_processes,
}
# Tables that `all` leaves out: the remote one starts a server and a child
# process per run (about 15 minutes; bench_remote.py's own options say more).
SEPARATE: dict[str, Callable[[bool], str]] = {"remote": bench_remote}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("table", choices=["all", *TABLES, *SEPARATE], help="which benchmark to run")
    parser.add_argument("--quick", action="store_true", help="small sizes and few runs (seconds)")
    arguments = parser.parse_args(argv)

    started = time.perf_counter()
    print("## machine\n")
    print(machine_block(), flush=True)
    names = list(TABLES) if arguments.table == "all" else [arguments.table]
    for name in names:
        print()
        table = TABLES[name] if name in TABLES else SEPARATE[name]
        if table is None:
            print(f"### {name}: table not implemented yet")
            continue
        print(table(arguments.quick), flush=True)
    print(
        f"\ntotal time: {time.perf_counter() - started:.1f} s "
        f"({arguments.table}{' --quick' if arguments.quick else ''})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
