"""``loaderx doctor``: which stage bounds the DataLoader on this data and
this machine, with the numbers that say so, and what to change.

It runs the loader for a few seconds and splits the workers' time per batch
(``stats()``: sample, gather, transform) further into:

- disk: bytes the process read from storage (``/proc/self/io``
  ``read_bytes``: page-cache misses) at the disk's measured read rate
  (4 KiB random reads at queue depth 1, as a worker's page faults are; 1 MiB
  sequential reads in SEQUENTIAL and BLOCK mode), at most the gather time;
- decode and copy: the rest of the gather, in the proportions a warm gather
  of the same batches (page cache hot) has against a plain NumPy copy of as
  many bytes (the memory ceiling): a raw store only copies;
- transform: the transform's own time.

The stage with the largest share is the verdict. The consumer (the training
step) is not part of the run: the report gives the time per batch the
loader delivers at, which a slower training step hides (then the step is
the bound) and a faster one waits on.

Measuring the disk drops a sample of the dataset's largest file (at most
``DISK_SAMPLE_BYTES``) from the page cache, after the dataset is closed.
``cold=True`` drops all of the dataset's pages before each batch (its
mappings in this process with ``madvise(MADV_DONTNEED)``, which a shared
read-only file mapping refills from the file, then
``posix_fadvise(POSIX_FADV_DONTNEED)`` on each file): how the loader runs on
data larger than RAM, bounded to this process's own mappings and the
dataset's own files.
"""

from __future__ import annotations

import ctypes
import os
import time
from typing import Any, Callable

import numpy as np

from ._remote_dataset import RemoteStore, is_remote
from ._trace import process_read_bytes
from .dataloader import DataLoader, cache_state
from .dataset import DenseDataset, RaggedDataset

__all__ = ["DISK_SAMPLE_BYTES", "SECONDS_MAX", "diagnose", "doctor_text"]

#: A run longer than this measures nothing new: the figures settle in seconds.
SECONDS_MAX = 600.0
#: Bytes of the largest file read cold to measure the disk: enough for
#: hundreds of random reads and a few sequential MiB, little enough that the
#: sample it drops from the page cache costs nothing to read back.
DISK_SAMPLE_BYTES = 64 << 20
_DISK_SECONDS = 0.25  # per disk test
_RANDOM_READ = 4096
_SEQUENTIAL_READ = 1 << 20
_RANDOM_READS_MAX = 4096
_WARM_BATCHES = 4
_WARMUP_BATCHES = 2  # the first batch runs alone; its figures are not the steady state
_MADV_DONTNEED = 4
_COPY_BYTES_MAX = 64 << 20


def _open(path: str) -> DenseDataset | RaggedDataset:
    try:
        return DenseDataset(path)
    except ValueError as exc:
        if "is a ragged" not in str(exc):
            raise
    return RaggedDataset(path)


def _files(root: str) -> list[str]:
    return [
        os.path.join(directory, name) for directory, _, names in os.walk(root) for name in names
    ]


class _Evictor:
    """Drops a local dataset's pages: first this process's mappings of its
    files (else the kernel keeps mapped pages), then each file's page cache."""

    def __init__(self, root: str) -> None:
        self.root = os.path.realpath(root) + os.sep
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        self.synced = False

    def __call__(self) -> None:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                parts = line.split(maxsplit=5)
                if len(parts) == 6 and parts[5].rstrip("\n").startswith(self.root):
                    low, high = (int(bound, 16) for bound in parts[0].split("-"))
                    if self.libc.madvise(low, high - low, _MADV_DONTNEED) != 0:
                        error = ctypes.get_errno()
                        raise OSError(error, f"madvise of {parts[5].strip()}: {os.strerror(error)}")
        for path in _files(self.root):
            descriptor = os.open(path, os.O_RDONLY)
            try:
                if not self.synced:
                    os.fsync(descriptor)  # dirty pages (a store just written) stay cached
                os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(descriptor)
        self.synced = True


def _warm(dataset: DenseDataset | RaggedDataset, batch_size: int, mode: str) -> dict[str, float]:
    """Seconds per batch of the sampling and the gather alone and warm: an
    inline loader (no workers, no transform) over the same first steps twice,
    the second timed (its pages cached by the first); and of a NumPy copy of
    as many bytes in memory (the memory ceiling)."""
    for _ in range(2):
        with DataLoader({"x": dataset}, num_workers=0, batch_size=batch_size, mode=mode) as loader:
            for _ in range(_WARM_BATCHES):
                batch = next(loader)["x"]
            stats = loader.stats()
    nbytes = int(getattr(batch, "values", batch).nbytes)
    record_bytes = max(1, nbytes // batch_size)
    rows = max(batch_size, min(len(dataset), _COPY_BYTES_MAX // record_bytes))
    source = np.ones((rows, record_bytes), np.uint8)
    target = np.empty((batch_size, record_bytes), np.uint8)
    positions = np.random.default_rng(0).integers(0, rows, batch_size)
    copies = []
    for _ in range(8):
        started = time.perf_counter()
        np.take(source, positions, axis=0, out=target, mode="clip")
        copies.append(time.perf_counter() - started)
    return {
        "batch_bytes": nbytes,
        "sample_seconds": stats["sample_seconds"] / _WARM_BATCHES,
        "warm_gather_seconds": stats["gather_seconds"] / _WARM_BATCHES,
        "copy_seconds": float(np.median(copies[1:])),
    }


def _disk(root: str) -> dict[str, float] | None:
    """The disk's cold read rates, in bytes per second, measured on a sample
    of the dataset's largest file (None for a file too small to say)."""
    files = _files(root)
    if not files:
        return None
    path = max(files, key=os.path.getsize)
    sample = min(os.path.getsize(path), DISK_SAMPLE_BYTES) // _SEQUENTIAL_READ * _SEQUENTIAL_READ
    if sample < 4 * _SEQUENTIAL_READ:
        return None
    descriptor = os.open(path, os.O_RDONLY)
    try:
        rates = {}
        for kind, size in (("random", _RANDOM_READ), ("sequential", _SEQUENTIAL_READ)):
            os.posix_fadvise(descriptor, 0, sample, os.POSIX_FADV_DONTNEED)
            count = sample // size if kind == "sequential" else _RANDOM_READS_MAX
            offsets = np.arange(count) * size
            if kind == "random":
                offsets = np.random.default_rng(2).integers(0, sample // size, count) * size
                os.posix_fadvise(descriptor, 0, sample, os.POSIX_FADV_RANDOM)
            else:
                os.posix_fadvise(descriptor, 0, sample, os.POSIX_FADV_SEQUENTIAL)
            done, started = 0, time.perf_counter()
            for offset in offsets:
                done += len(os.pread(descriptor, size, int(offset)))
                if time.perf_counter() - started > _DISK_SECONDS:
                    break
            rates[f"{kind}_bytes_s"] = done / (time.perf_counter() - started)
        os.posix_fadvise(descriptor, 0, sample, os.POSIX_FADV_NORMAL)
        return rates
    finally:
        os.close(descriptor)


def _run(
    dataset: DenseDataset | RaggedDataset,
    options: dict[str, Any],
    seconds: float,
    evict: Callable[[], None] | None,
) -> dict[str, Any]:
    """Runs the loader for ``seconds`` after its warm-up; the deltas of its
    stats, of the bytes read from disk and of the wall clock."""
    with DataLoader({"x": dataset}, **options) as loader:
        for _ in range(_WARMUP_BATCHES):
            next(loader)
        before, read_before = loader.stats(), process_read_bytes()
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            if evict is not None:
                evict()
            next(loader)
        wall = time.perf_counter() - started
        after, read_after = loader.stats(), process_read_bytes()
    delta: dict[str, Any] = {
        key: after[key] - before[key] for key in after if key.endswith("seconds")
    }
    delta["batches"] = after["batches"] - before["batches"]
    delta["wall_seconds"] = wall
    delta["disk_read_bytes"] = (
        None if read_before is None or read_after is None else read_after - read_before
    )
    return delta


def _shares(
    run: dict[str, Any],
    warm: dict[str, float],
    disk: dict[str, float] | None,
    sequential: bool,
    raw: bool,
) -> tuple[dict[str, float], float]:
    """Worker seconds per batch by stage (disk, decode, gather: the copy and
    the sampling, transform), and ``contention``: gather time beyond the disk
    and a warm gather alone, spent waiting for the GIL or a core. It counts
    with the transform when there is one (a Python transform holds the GIL
    the gathers need between native calls), else with the gather's parts."""
    batches = max(1, run["batches"])
    gather = (run["sample_seconds"] + run["gather_seconds"]) / batches
    read = run["disk_read_bytes"] or 0
    disk_seconds = 0.0
    if disk is not None and read > 0:
        rate = disk["sequential_bytes_s" if sequential else "random_bytes_s"]
        disk_seconds = min(gather, read / batches / rate)
    rest = gather - disk_seconds
    alone = warm["sample_seconds"] + warm["warm_gather_seconds"]
    contention = max(0.0, rest - alone)
    scale = (rest - (contention if run["has_transform"] else 0.0)) / rest if rest > 0 else 0.0
    warm_gather, copy = warm["warm_gather_seconds"], warm["copy_seconds"]
    decode = 0.0 if raw else max(0.0, warm_gather - copy)
    parts = {"decode": decode, "gather": warm["sample_seconds"] + warm_gather - decode}
    # The measured time (less contention with a transform) in the parts' proportions alone.
    parts = {
        name: value / alone * rest * scale if alone > 0 else 0.0 for name, value in parts.items()
    }
    transform = run["transform_seconds"] / batches
    return {
        "disk": disk_seconds,
        **parts,
        "transform": transform + (contention if run["has_transform"] else 0.0),
    }, contention


def diagnose(
    path: str,
    batch_size: int = 256,
    workers: int = 4,
    seconds: float = 3.0,
    mode: str = "iid",
    transform: Callable[[Any], Any] | None = None,
    transform_processes: bool = False,
    cold: bool = False,
) -> dict[str, Any]:
    """Runs a DataLoader over the dataset at ``path`` for ``seconds`` and
    returns what bounds it: the per-batch time of each stage, this machine's
    ceilings, the verdict and the advice (``doctor_text`` prints it)."""
    if not 0 < seconds <= SECONDS_MAX:
        raise ValueError(f"seconds must be in (0, {SECONDS_MAX:g}], got {seconds!r}")
    local = not is_remote(path)
    if cold and not local:
        raise ValueError(
            "cold=True drops a local dataset's pages from the page cache; a URL's shards live "
            "in its cache directory: run the doctor on that directory's copy, or without --cold"
        )
    options: dict[str, Any] = {"num_workers": workers, "batch_size": batch_size, "mode": mode}
    if transform is not None:
        options.update(transform=transform, transform_processes=transform_processes)
    with _open(path) as dataset:
        codec, records = dataset.schema.codec, len(dataset)
        evict = _Evictor(path) if cold else None
        run = _run(dataset, options, seconds, evict)
        warm = _warm(dataset, batch_size, mode)
        cache = _cache_state(dataset)
    disk = _disk(path) if local else None
    sequential = str(mode).upper() in ("SEQUENTIAL", "BLOCK", "0", "3")
    run["has_transform"] = transform is not None
    shares, run["contention_seconds"] = _shares(run, warm, disk, sequential, codec == "raw")
    return _report(path, codec, records, options, run, warm, disk, shares, cache=cache, cold=cold)


def _cache_state(dataset: DenseDataset | RaggedDataset) -> dict[str, Any] | None:
    store = dataset.store
    if not isinstance(store, RemoteStore) or store.cache is None:
        return None
    return cache_state(store)


def _machine() -> dict[str, Any]:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    memory = None
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            fields = dict(line.split(":", 1) for line in handle)
        memory = {
            key: int(fields[name].split()[0]) * 1024
            for key, name in (("ram_bytes", "MemTotal"), ("available_bytes", "MemAvailable"))
        }
    except (OSError, KeyError, ValueError):
        pass
    return {"cores": cores, **(memory or {})}


def _mib(value: float | None) -> float | None:
    return None if value is None else round(value / 2**20, 1)


def _report(
    path: str,
    codec: str,
    records: int,
    options: dict[str, Any],
    run: dict[str, Any],
    warm: dict[str, float],
    disk: dict[str, float] | None,
    shares: dict[str, float],
    cache: dict[str, Any] | None,
    cold: bool,
) -> dict[str, Any]:
    """The doctor's findings as one JSON-ready dict."""
    batches, wall = run["batches"], run["wall_seconds"]
    worker_seconds = sum(run[f"{stage}_seconds"] for stage in ("sample", "gather", "transform"))
    total = sum(shares.values()) or 1.0
    verdict = max(shares, key=lambda stage: shares[stage])
    decode = warm["warm_gather_seconds"] - warm["copy_seconds"]
    result: dict[str, Any] = {
        "dataset": path,
        "codec": codec,
        "records": records,
        "dataset_bytes": sum(os.path.getsize(name) for name in _files(path))
        if not is_remote(path)
        else None,
        "loader": {**options, "transform": "transform" in options, "cold": cold},
        "machine": _machine(),
        "run": {
            "seconds": round(wall, 3),
            "batches": batches,
            "batches_s": round(batches / wall, 1),
            "mib_s": _mib(batches * warm["batch_bytes"] / wall),
            "stall_fraction": round(run["stall_seconds"] / wall, 3),
            "workers_busy": round(worker_seconds / wall / max(1, options["num_workers"]), 3),
            "worker_ms_per_batch": round(worker_seconds / max(1, batches) * 1e3, 3),
            "disk_read_mib_s": _mib(
                None if run["disk_read_bytes"] is None else run["disk_read_bytes"] / wall
            ),
        },
        "stages_ms": {stage: round(value * 1e3, 3) for stage, value in shares.items()},
        "contention_ms": round(run["contention_seconds"] * 1e3, 3),
        "stages_share": {stage: round(value / total, 3) for stage, value in shares.items()},
        "ceilings_mib_s": {
            "memory_copy": _mib(warm["batch_bytes"] / warm["copy_seconds"]),
            "warm_gather": _mib(warm["batch_bytes"] / warm["warm_gather_seconds"]),
            "decode": None if codec == "raw" or decode <= 0 else _mib(warm["batch_bytes"] / decode),
            "disk_random_4k": None if disk is None else _mib(disk["random_bytes_s"]),
            "disk_sequential": None if disk is None else _mib(disk["sequential_bytes_s"]),
        },
        "verdict": verdict,
        **({} if cache is None else {"cache": cache}),
    }
    result["advice"] = _advice(result)
    share = result["stages_share"][verdict]
    result["summary"] = (
        f"{verdict}-bound: {share:.0%} of the workers' time per batch is {verdict} "
        f"({result['stages_ms'][verdict]:.2f} ms of {total * 1e3:.2f} ms); "
        f"{result['run']['batches_s']:g} batches/s"
    )
    return result


def _advice(result: dict[str, Any]) -> str:
    """What to change, for the verdict's stage."""
    verdict, run, ceilings = result["verdict"], result["run"], result["ceilings_mib_s"]
    cores, workers = result["machine"]["cores"], result["loader"]["num_workers"]
    more = f"; more workers (now {workers}, {cores} cores)" if workers < (cores or 1) else ""
    if verdict == "disk":
        ram = result["machine"].get("available_bytes")
        size = result["dataset_bytes"]
        fits = ""
        if ram and size:
            room = "it fits, so a warm page cache removes the reads"
            room = room if size < ram else "it does not fit (more RAM, or a smaller codec)"
            fits = (
                f" The dataset is {size / 2**30:.2f} GiB on disk, {ram / 2**30:.1f} GiB of RAM "
                f"is available: {room}."
            )
        return (
            f"Page-cache misses: {run['disk_read_mib_s']} MiB/s read from disk (this disk: "
            f"{ceilings['disk_random_4k']} MiB/s in random 4 KiB reads, "
            f"{ceilings['disk_sequential']} MiB/s sequential).{fits} Keep the data in RAM, read "
            "it in BLOCK mode (contiguous shards, readahead works), use more workers to keep more "
            "reads in flight, or a smaller codec (codec='auto') to read fewer bytes."
        )
    if verdict == "decode":
        faster = (
            "rewrite the dataset with codec='auto-speed' (lz4 or lz4_shuffleN: several times "
            "faster to decode, a little larger)"
            if not result["codec"].startswith("lz4")
            else "store it raw (codec='raw') if the disk and the page cache can hold it"
        )
        return (
            f"Codec {result['codec']} decodes at {ceilings['decode']} MiB/s per gather where a "
            f"plain copy runs at {ceilings['memory_copy']} MiB/s: {faster}{more}."
        )
    if verdict == "transform":
        return (
            f"The transform takes {result['stages_ms']['transform']:.2f} ms per batch: with "
            "Python code that holds the GIL use transform_processes=True"
            f"{more}; else make it cheaper or move it to the accelerator."
        )
    return (
        f"Gathers copy at {ceilings['warm_gather']} MiB/s (a plain copy: "
        f"{ceilings['memory_copy']} MiB/s) and the loader is near its floor: larger batches "
        f"amortize per-batch work{more}."
    )


def doctor_text(result: dict[str, Any]) -> str:
    """The report for people: a short table and the verdict."""
    run, ceilings = result["run"], result["ceilings_mib_s"]
    loader = result["loader"]
    lines = [
        f"dataset {result['dataset']}: {result['records']:,} records, codec {result['codec']}",
        f"loader: {loader['num_workers']} workers, batches of {loader['batch_size']}, mode "
        f"{loader['mode']}{', cold page cache' if loader['cold'] else ''}; "
        f"{run['batches']} batches in {run['seconds']} s: {run['batches_s']:g} batches/s, "
        f"{run['mib_s']} MiB/s, workers {run['workers_busy']:.0%} busy",
        "",
        f"{'stage':<10} {'ms/batch':>9} {'share':>6}",
    ]
    for stage, value in result["stages_ms"].items():
        lines.append(f"{stage:<10} {value:>9.3f} {result['stages_share'][stage]:>6.0%}")
    lines.append(
        f"(of which waiting for the GIL or a core: {result['contention_ms']:.3f} ms, counted with "
        f"{'the transform' if loader['transform'] else 'decode and gather'})"
    )
    lines += [
        "",
        "ceilings (MiB/s): "
        + ", ".join(f"{name} {value}" for name, value in ceilings.items() if value is not None)
        + f"; read from disk during the run: {run['disk_read_mib_s']} MiB/s",
        f"a batch every {1e3 / max(run['batches_s'], 1e-9):.2f} ms: a training step that takes "
        "longer is the bound, not the loader",
        "",
        f"verdict: {result['summary']}",
        f"advice: {result['advice']}",
    ]
    return "\n".join(lines)
