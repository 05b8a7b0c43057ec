"""Training from object storage: loaderx against mosaicml-streaming and litdata.

    python scripts/bench_remote.py [--quick] [--json PATH] [--tools a,b] [--orders a,b]
        [--budgets 10,25,50,100] [--timeout S] [--contender-python PATH]
    python scripts/bench.py remote [--quick]

moto's S3 server runs on 127.0.0.1 in this process, behind a counting WSGI
middleware: every request (by method, object GETs apart from listings) and
every response body byte is counted at the server, so each tool is measured
the same way whatever its client. Every tool gets the same records (20,000 x
12 KiB: 3072 float32 each, deterministic, record i's first float is i),
written by the tool's own writer in the shards it recommends and uploaded to
one bucket. Then, for each tool, order and cache budget (10, 25, 50, 100% of
the records' bytes), a fresh child process reads two epochs of batches of
256 through a fresh cache directory and checks every record; the parent
reads the server's counters between the child's marks (start, epoch 2, end);
the child reports its peak RSS (VmHWM; not ru_maxrss, which Linux carries
over exec from the forking parent, here the server's process). Orders:

- iid: indices uniform with replacement; cyclic: a new permutation each
  epoch. loaderx uses its sampler modes; the contenders read the same index
  stream (seeded) by random access, `dataset[i]`, which is how a map-style
  PyTorch loop reads them.
- native: each tool's own order for remote data: streaming's py1e shuffle,
  litdata's shuffle=True, loaderx's "block" mode.

A run a tool refuses (an error before its first batch) is reported as
refused with the error; a run that passes `--timeout` is killed and
reported with what it had done. The server is slow (a few hundred requests
per second), so bytes and requests are the figures that matter; batches/s
is bounded by it. Contenders that do not import are skipped with the reason;
`--contender-python` runs them in another interpreter (mosaicml-streaming
0.13 needs numpy<2.2, so it usually lives in its own virtual environment).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RECORDS = 20_000
QUICK_RECORDS = 2_000
FLOATS = 3072  # 12 KiB of float32
RECORD_BYTES = FLOATS * 4
BATCH = 256
EPOCHS = 2
PAIR_EPOCHS = 5  # the file:// pair: long enough for a steady rate
BUDGETS = (10, 25, 50, 100)
QUICK_BUDGETS = (25, 100)
ORDERS = ("iid", "cyclic", "native")
TIMEOUT = 30.0
QUICK_TIMEOUT = 20.0
BUCKET = "bench"
MARK = "/__bench__/mark/"
# loaderx's shards: 625 records (7.3 MiB), 32 shards (justified in the docs page).
LOADERX_SHARD_ROWS = 625
# The 100% row's alternative: 4 shards of 5000 records (58.6 MiB), as few
# objects as the contenders' 64 MiB defaults (justified in the docs page).
LOADERX_BIG_SHARD_ROWS = 5000
STREAMING_DEFAULT_LIMIT = 1 << 26  # MDSWriter's default size_limit
STREAMING_SMALL_LIMIT = 1 << 23
LITDATA_CHUNK_BYTES = "64MB"  # litdata's README; optimize() has no default


# -- the records ------------------------------------------------------------------


def records(indices: np.ndarray) -> np.ndarray:
    """Records at `indices`: exact small integers as float32, record i's first float i."""
    i = np.asarray(indices, dtype=np.int64)[:, None]
    j = np.arange(FLOATS, dtype=np.int64)[None, :]
    values = ((i * 2654435761 + j * 40503) % (1 << 23)).astype(np.float32)
    values[:, 0] = i[:, 0]
    return values


def check_batch(batch: np.ndarray, count: int) -> np.ndarray:
    """The record indices of `batch`, after checking every byte of it."""
    batch = np.asarray(batch)
    if batch.shape[1:] != (FLOATS,) or batch.dtype != np.float32:
        raise AssertionError(f"a batch of {batch.dtype} {batch.shape}, expected (n, {FLOATS})")
    indices = batch[:, 0].astype(np.int64)
    if indices.min() < 0 or indices.max() >= count or not np.array_equal(batch, records(indices)):
        raise AssertionError("a batch holds records that are not the ones written")
    return indices


# -- the server -------------------------------------------------------------------


class Counting:
    """WSGI middleware: counts requests by kind and response body bytes; a
    GET of MARK + name records a snapshot of the counters (itself uncounted)."""

    def __init__(self, app):
        self.app = app
        self.lock = threading.Lock()
        self.counts: dict[str, int] = {}
        self.marks: dict[str, dict[str, int]] = {}

    def snapshot(self) -> dict[str, int]:
        with self.lock:
            return dict(self.counts)

    def _add(self, name: str, amount: int) -> None:
        with self.lock:
            self.counts[name] = self.counts.get(name, 0) + amount

    def __call__(self, environ, start_response):
        path = environ.get("PATH_INFO", "")
        if path.startswith(MARK):
            self.marks[path[len(MARK) :]] = self.snapshot()
            start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "2")])
            return [b"ok"]
        method = environ.get("REQUEST_METHOD", "GET")
        if method == "GET" and path.strip("/").count("/") == 0:
            method = "LIST"  # a GET of the bucket itself
        self._add("requests", 1)
        self._add(method, 1)
        return self._counted(self.app(environ, start_response))

    def _counted(self, body):
        try:
            for chunk in body:
                self._add("bytes", len(chunk))
                yield chunk
        finally:
            if hasattr(body, "close"):
                body.close()


def start_server():
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    class Quiet(MotoRequestHandler):
        def log(self, type, message, *args):  # noqa: A002 (werkzeug's names)
            pass

    counting = Counting(DomainDispatcherApplication(create_backend_app))
    server = make_server("127.0.0.1", 0, counting, threaded=True, request_handler=Quiet)
    threading.Thread(target=server.serve_forever, name="moto-s3", daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}", server, counting


def s3_environment(endpoint: str) -> dict[str, str]:
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "S3_ENDPOINT_URL": endpoint,  # mosaicml-streaming reads this one
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
    }


def mark(endpoint: str, name: str) -> None:
    with urllib.request.urlopen(f"{endpoint}{MARK}{name}", timeout=10) as response:
        response.read()


def upload(endpoint: str, directory: Path, prefix: str) -> tuple[int, int]:
    """Uploads every file under `directory` to s3://BUCKET/prefix/; (files, bytes)."""
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    files = sorted(path for path in directory.rglob("*") if path.is_file())
    for path in files:
        client.upload_file(str(path), BUCKET, f"{prefix}/{path.relative_to(directory)}")
    return len(files), sum(path.stat().st_size for path in files)


# -- the tools (child side) ---------------------------------------------------------


class Unavailable(Exception):
    """The tool cannot run here: the run is skipped with this reason."""


def import_streaming(bypass: bool):
    """streaming.base's classes. `bypass` skips the package's __init__, which
    imports its vision dataset zoo (torchvision) and nothing the bench uses."""
    if bypass:
        spec = importlib.util.find_spec("streaming")
        if spec is None:
            raise Unavailable(
                "mosaicml-streaming is not installed (pip install mosaicml-streaming)"
            )
        package = types.ModuleType("streaming")
        package.__path__ = list(spec.submodule_search_locations or [])
        package.__spec__ = spec
        sys.modules["streaming"] = package
    from streaming.base import MDSWriter, StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    return MDSWriter, StreamingDataset, clean_stale_shared_memory


def probe(spec: dict) -> dict:
    """Whether the tool imports here (and how), with its version."""
    from importlib.metadata import version

    tool = spec["tool"]
    if tool.startswith("streaming"):
        try:
            import_streaming(False)
            return {"version": version("mosaicml-streaming"), "bypass": False}
        except Exception as exc:  # torchvision's RuntimeError too
            if importlib.util.find_spec("streaming") is None:
                raise Unavailable("not installed (pip install mosaicml-streaming)") from exc
            note = f"`import streaming` fails here ({exc}); the bench imports streaming.base"
        for name in [name for name in sys.modules if name.split(".")[0] == "streaming"]:
            del sys.modules[name]
        import_streaming(True)
        return {"version": version("mosaicml-streaming"), "bypass": True, "note": note}
    if tool == "litdata":
        try:
            import litdata
        except ImportError as exc:
            raise Unavailable(f"not installed (pip install litdata): {exc}") from exc
        return {"version": litdata.__version__}
    import inspect

    import loaderx

    if "cache_bytes" not in inspect.signature(loaderx.DenseDataset).parameters:
        raise Unavailable(
            "loaderx.DenseDataset takes no cache_bytes= in this tree: remote datasets "
            "(issue #25) are not merged yet"
        )
    return {"version": version("loaderx")}


def write(spec: dict) -> dict:
    """Writes the records with the tool's own writer into spec['out']."""
    out, count, tool = Path(spec["out"]), spec["records"], spec["tool"]
    blocks = [np.arange(s, min(s + 1000, count)) for s in range(0, count, 1000)]
    if tool.startswith("streaming"):
        writer, _, _ = import_streaming(spec["bypass"])
        columns = {"x": f"ndarray:float32:{FLOATS}"}
        with writer(out=str(out), columns=columns, size_limit=spec["shard_bytes"]) as sink:
            for block in blocks:
                for row in records(block):
                    sink.write({"x": row})
    elif tool == "litdata":
        from litdata import optimize

        optimize(
            fn=litdata_record,
            inputs=list(range(count)),
            output_dir=str(out),
            chunk_bytes=LITDATA_CHUNK_BYTES,
            num_workers=1,
            mode="overwrite",
            verbose=False,
        )
    else:
        from loaderx import shards

        rows = spec["shard_rows"]
        for k, start in enumerate(range(0, count, rows)):
            block = records(np.arange(start, min(start + rows, count)))
            shards.write_shard(out, k, block, codec="raw")
            if spec.get("remote_url"):  # loaderx's own upload: one object per shard
                staging = out.parent / "staging"
                shards.write_shard(spec["remote_url"], k, block, codec="raw", staging_dir=staging)
        shards.commit(out)
        if spec.get("remote_url"):
            shards.commit(spec["remote_url"])
            return {"shards": shard_sizes(out), **uploaded(spec["remote_url"])}
    return {"shards": shard_sizes(out)}


def uploaded(url: str) -> dict:
    """The objects and bytes loaderx's writer left at ``url`` (shards, their
    upload records, the manifest and the marker)."""
    from loaderx._remote import open_source

    listed = open_source(url).list()
    return {"objects": len(listed), "uploaded": sum(info.size for info in listed)}


def shard_sizes(out: Path) -> list[int]:
    """The bytes of each shard: an .mds or .bin file, or a loaderx shard directory."""
    shards = sorted(out.glob("*.mds")) + sorted(out.glob("*.bin"))
    if shards:
        return [path.stat().st_size for path in shards]
    return [
        sum(path.stat().st_size for path in shard.rglob("*") if path.is_file())
        for shard in sorted(out.glob("shard-*"))
    ]


def litdata_record(index: int) -> np.ndarray:
    return records(np.array([index]))[0]


def index_stream(order: str, count: int, seed: int = 0) -> list[np.ndarray]:
    """The contenders' record indices: per epoch, an array (batches, BATCH)."""
    rng = np.random.default_rng(seed)
    per_epoch = count // BATCH
    if order == "iid":
        return [rng.integers(0, count, (per_epoch, BATCH)) for _ in range(EPOCHS)]
    return [
        rng.permutation(count)[: per_epoch * BATCH].reshape(per_epoch, BATCH) for _ in range(EPOCHS)
    ]


def batched(samples, per_epoch: int):
    """Batches of BATCH stacked samples, at most `per_epoch`; the samples are read
    to their end (an epoch ends when the tool's iterator does)."""
    pending, made = [], 0
    for sample in samples:
        pending.append(sample)
        if len(pending) == BATCH:
            if made < per_epoch:
                yield np.stack(pending)
            made += 1
            pending = []


def random_access(read_one, stream: list[np.ndarray]):
    def epoch(e: int):
        for indices in stream[e]:
            yield np.stack([read_one(int(i)) for i in indices])

    return epoch


def open_streaming(spec: dict):
    _, dataset_class, clean_stale_shared_memory = import_streaming(spec["bypass"])
    clean_stale_shared_memory()
    native = spec["order"] == "native"
    dataset = dataset_class(
        remote=spec["url"],
        local=spec["cache"],
        cache_limit=spec["budget"],
        batch_size=BATCH,
        shuffle=native,  # shuffle_algo="py1e" is the default
        shuffle_seed=0,
    )
    per_epoch = spec["records"] // BATCH
    if native:
        return lambda e: batched((sample["x"] for sample in dataset), per_epoch), None
    stream = index_stream(spec["order"], spec["records"])
    return random_access(lambda i: dataset[i]["x"], stream), None


def allow_http_in_litdata() -> None:
    """litdata builds its obstore S3Store (its chunk downloads) without
    client options, so it refuses a plain-HTTP endpoint ("BadScheme"); this
    adds allow_http=True to that constructor and changes nothing else."""
    import obstore.store

    real = obstore.store.S3Store
    if getattr(real, "allows_http", False):
        return

    def s3_store(*args, client_options=None, **kwargs):
        return real(*args, client_options={**(client_options or {}), "allow_http": True}, **kwargs)

    s3_store.allows_http = True
    obstore.store.S3Store = s3_store


def open_litdata(spec: dict):
    from litdata import StreamingDataset

    allow_http_in_litdata()

    native = spec["order"] == "native"
    dataset = StreamingDataset(
        spec["url"],
        cache_dir=spec["cache"],
        max_cache_size=spec["budget"],
        shuffle=native,
        seed=0,
        storage_options={"endpoint_url": spec["endpoint"]},
    )
    per_epoch = spec["records"] // BATCH
    if native:

        def epoch(e: int):
            dataset.set_epoch(e + 1)
            return batched(iter(dataset), per_epoch)

        return epoch, None
    return random_access(dataset.__getitem__, index_stream(spec["order"], spec["records"])), None


def working_set(rows, per_block: int, workers: int) -> int:
    """The most shards `workers` consecutive steps of loaderx's block order read
    (two cycles): what the cache must hold at once."""
    import numpy as np

    import loaderx

    sampler = loaderx.Sampler(
        int(sum(rows)), BATCH, "block", seed=0, groups=list(rows), shards_per_block=per_block
    )
    starts = np.cumsum([0, *rows])
    steps = 2 * (int(sum(rows)) // BATCH)
    touched = [set(np.searchsorted(starts, sampler.batch(k), "right") - 1) for k in range(steps)]
    return max(len(set().union(*touched[k : k + workers])) for k in range(steps - workers + 1))


def open_loaderx(spec: dict):
    import loaderx

    if spec.get("local"):
        dataset = loaderx.DenseDataset(spec["url"])
    else:
        dataset = loaderx.DenseDataset(
            spec["url"],
            cache_dir=spec["cache"],
            cache_bytes=spec["budget"],
            storage_options=spec.get("storage_options") or {},
        )
    mode = {"iid": "iid", "cyclic": "cyclic", "native": "block"}[spec["order"]]
    loader = None
    # As the remote guide says: the most shards per block and workers whose
    # steps in flight read at most a quarter of the budget (Belady keeps the
    # rest for shards read again; at a tight fit workers evict each other's
    # shards: 1.34x the data per epoch at 10% with 4 workers against 1.00x
    # with 1), else the smallest working set the loader accepts.
    tries = [(4, 4), (2, 4), (1, 4), (1, 2), (1, 1)] if mode == "block" else [(None, 4)]
    if mode == "block":
        rows = dataset.store.manifest.rows
        shard = max(unit.length for unit in dataset.store.units)
        roomy = [t for t in tries if working_set(rows, *t) * shard <= spec["budget"] // 4]
        tries = roomy[:1] + sorted(tries, key=lambda t: working_set(rows, *t))
    for at, (per_block, workers) in enumerate(tries):
        options = {} if per_block is None else {"shards_per_block": per_block}
        try:
            loader = loaderx.DataLoader(
                {"x": dataset}, batch_size=BATCH, mode=mode, seed=0, num_workers=workers, **options
            )
            break
        except loaderx.CacheTooSmallError:
            if at == len(tries) - 1:
                raise
    assert loader is not None
    per_epoch = spec["records"] // BATCH

    def epoch(e: int):
        for _ in range(per_epoch):
            batch = next(loader)
            yield batch["x"] if isinstance(batch, dict) else batch

    return epoch, loader.close


OPENERS = {"streaming": open_streaming, "litdata": open_litdata, "loaderx": open_loaderx}


def preload(spec: dict) -> None:
    tool = spec["tool"]
    if tool.startswith("streaming"):
        import_streaming(spec["bypass"])
    elif tool == "litdata":
        import litdata  # noqa: F401

        allow_http_in_litdata()
    else:
        import loaderx  # noqa: F401


def cache_bytes(directory: str) -> int:
    total = 0
    for folder, _, names in os.walk(directory):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(folder, name)).st_size
    return total


def peak_rss() -> int:
    """This process's peak RSS since its exec (VmHWM). Not ru_maxrss: Linux
    carries the forking parent's peak across exec into the child's, and the
    parent holds the server's objects."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


_OUT = threading.Lock()


def emit(kind: str, payload) -> None:
    with _OUT:
        sys.stdout.write(f"{kind} {json.dumps(payload)}\n")
        sys.stdout.flush()


def report_rss(interval: float = 0.25) -> None:
    """Reports the peak RSS from a thread, so a run killed at its timeout has one."""

    def loop():
        while True:
            emit("rss", peak_rss())
            time.sleep(interval)

    threading.Thread(target=loop, name="rss", daemon=True).start()


def read(spec: dict) -> dict:
    """Two epochs (spec['epochs']) of checked batches; marks the server at
    start, epoch 2 and end; prints progress lines and returns the result."""
    endpoint = spec.get("endpoint")
    report_rss()
    preload(spec)  # imports are not the tool's time to first batch
    if endpoint:
        mark(endpoint, "start")
    began = time.perf_counter()
    try:
        epoch, close = OPENERS[spec["tool"].split("-")[0]](spec)
    except Unavailable:
        raise
    except Exception as exc:
        return {"status": "refused", "error": f"{type(exc).__name__}: {exc}"}
    first = first_at = None
    batches = delivered = cache_peak = 0
    try:
        for e in range(spec.get("epochs", EPOCHS)):
            if e == 1 and endpoint:
                mark(endpoint, "epoch2")
            for batch in epoch(e):
                check_batch(batch, spec["records"])
                batches, delivered = batches + 1, delivered + len(batch)
                if first is None:
                    first_at = time.perf_counter()
                    first = first_at - began
                if batches % 8 == 0:
                    cache_peak = max(cache_peak, cache_bytes(spec["cache"]))
                now = time.perf_counter() - began
                emit("progress", [batches, delivered, peak_rss(), first, now])
    except Exception as exc:
        status = "refused" if first is None else "failed"
        return {"status": status, "error": f"{type(exc).__name__}: {exc}", "batches": batches}
    ended = time.perf_counter()
    if close is not None:
        close()
    if endpoint:
        mark(endpoint, "end")
    return {
        "status": "ok",
        "batches": batches,
        "delivered": delivered,
        "first_batch_s": first,
        "batches_per_s": (batches - 1) / max(ended - first_at, 1e-9) if batches > 1 else None,
        "cache_peak": max(cache_peak, cache_bytes(spec["cache"])),
        "peak_rss": peak_rss(),
    }


def child_main(spec: dict) -> int:
    actions = {"probe": probe, "write": write, "read": read}
    try:
        result = actions[spec["action"]](spec)
        if spec["action"] == "read":
            result.setdefault("peak_rss", peak_rss())
        emit("result", result)
    except Unavailable as exc:
        emit("result", {"status": "unavailable", "error": str(exc)})
    return 0


# -- the parent ---------------------------------------------------------------------


@dataclasses.dataclass
class Tool:
    name: str
    contender: bool
    write: dict  # the writer's options
    recommends: str  # what the tool recommends, for the docs and the report


TOOLS = (
    Tool(
        "loaderx",
        False,
        {"shard_rows": LOADERX_SHARD_ROWS},
        f"shards of {LOADERX_SHARD_ROWS} records (7.3 MiB); mode='block' for remote data",
    ),
    Tool(
        "loaderx-64MiB",
        False,
        {"shard_rows": LOADERX_BIG_SHARD_ROWS},
        f"shards of {LOADERX_BIG_SHARD_ROWS} records (58.6 MiB): few requests, for a budget "
        "that holds the dataset",
    ),
    Tool(
        "streaming",
        True,
        {"shard_bytes": STREAMING_DEFAULT_LIMIT},
        "MDSWriter's default size_limit (64 MiB); StreamingDataset(shuffle=True), py1e",
    ),
    Tool(
        "streaming-8MiB",
        True,
        {"shard_bytes": STREAMING_SMALL_LIMIT},
        "size_limit=8 MiB, so that its cache_limit check (4 shards) admits small budgets",
    ),
    Tool(
        "litdata",
        True,
        {},
        f"optimize(chunk_bytes={LITDATA_CHUNK_BYTES!r}) as its README; shuffle=True",
    ),
)


@dataclasses.dataclass
class Child:
    result: dict
    rss: int  # bytes: the child's VmHWM (its last report; ru_maxrss if none)
    seconds: float
    progress: list | None
    stderr: str


def run_child(python: str, spec: dict, env: dict, timeout: float) -> Child:
    """Runs this script as `python ... --child SPEC`; kills it (its process
    group) after `timeout` seconds."""
    with tempfile.TemporaryFile("w+") as errors:
        process = subprocess.Popen(
            [python, str(Path(__file__).resolve()), "--child", json.dumps(spec)],
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
            env=env,
            start_new_session=True,
        )
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True)
        reader.start()
        began, usage, killed = time.perf_counter(), None, False
        while usage is None:
            pid, _, rusage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                usage = rusage
            elif time.perf_counter() - began > timeout and not killed:
                os.killpg(process.pid, signal.SIGKILL)
                killed = True
            else:
                time.sleep(0.05)
        process.returncode = 0  # reaped by wait4 above
        seconds = time.perf_counter() - began
        reader.join(10)
        errors.seek(0)
        stderr = errors.read()
    result, progress, rss = None, None, usage.ru_maxrss * 1024
    for line in lines:
        kind, _, payload = line.partition(" ")
        if kind == "result":
            result = json.loads(payload)
        elif kind == "progress":
            progress = json.loads(payload)
        elif kind == "rss":
            rss = json.loads(payload)
    if result is None:
        if killed:
            result = {"status": f"timeout ({timeout:.0f} s)"}
        else:  # the last line of its stderr says why
            result = {"status": "crashed", "error": " ".join(stderr.strip().splitlines()[-1:])}
    return Child(result, result.get("peak_rss") or rss, seconds, progress, stderr)


def create_bucket(endpoint: str) -> None:
    request = urllib.request.Request(f"{endpoint}/{BUCKET}", method="PUT")
    with urllib.request.urlopen(request, timeout=10) as response:
        response.read()


def _delta(after: dict, before: dict, name: str) -> int:
    return after.get(name, 0) - before.get(name, 0)


@dataclasses.dataclass
class Context:
    endpoint: str
    counting: Counting
    env: dict
    work: Path
    count: int
    timeout: float
    pythons: dict  # tool name -> interpreter
    infos: dict  # tool name -> probe result
    stored: dict = dataclasses.field(default_factory=dict)  # tool name -> bytes uploaded


def measure(context: Context, tool: str, order: str, percent: int) -> dict:
    """One child run of `tool` at `order` and a budget of `percent` of the data."""
    data = context.count * RECORD_BYTES
    cache = context.work / "cache"
    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir()
    spec = {
        "action": "read",
        "tool": tool,
        "order": order,
        "budget": context.stored[tool] * percent // 100,  # of what the tool stores
        "url": f"s3://{BUCKET}/{tool}",
        "cache": str(cache),
        "records": context.count,
        "endpoint": context.endpoint,
        "bypass": context.infos[tool].get("bypass", False),
        "storage_options": {"endpoint_url": context.endpoint, "allow_http": True},
    }
    context.counting.marks.clear()
    child = run_child(context.pythons[tool], spec, context.env, context.timeout)
    now = context.counting.snapshot()
    marks = dict(context.counting.marks)
    start, end = marks.get("start", now), marks.get("end", now)
    shutil.rmtree(cache, ignore_errors=True)
    result = child.result
    batches, delivered, _, first, elapsed = child.progress or [0, 0, 0, None, None]
    rate = None
    if result["status"] != "ok" and first is not None and batches > 1:
        rate = (batches - 1) / max(elapsed - first, 1e-9)  # up to the kill
    row = {
        "tool": tool,
        "order": order,
        "budget_percent": percent,
        "status": result["status"],
        "error": result.get("error"),
        "batches": result.get("batches", batches),
        "delivered_bytes": result.get("delivered", delivered) * RECORD_BYTES,
        "fetched_bytes": _delta(end, start, "bytes"),
        "requests": _delta(end, start, "requests"),
        "gets": _delta(end, start, "GET"),
        "heads": _delta(end, start, "HEAD"),
        "lists": _delta(end, start, "LIST"),
        "epoch2_fetched_bytes": _delta(end, marks["epoch2"], "bytes")
        if "epoch2" in marks
        else None,
        "data_bytes": data,
        "first_batch_s": result.get("first_batch_s", first),
        "batches_per_s": result.get("batches_per_s", rate),
        "peak_rss_bytes": child.rss,
        "peak_cache_bytes": result.get("cache_peak"),
        "seconds": child.seconds,
    }
    return row


def measure_budgets(context: Context, tool: str, order: str, budgets: list[int]) -> list[dict]:
    """Runs from the largest budget down. A budget below one the tool refused
    before its first batch is refused too (the tools' checks are thresholds):
    that row says so and is not run."""
    rows: list[dict] = []
    refused = None
    for percent in sorted(budgets, reverse=True):
        if refused is not None:
            row = dict(refused, budget_percent=percent, seconds=0.0, peak_rss_bytes=None)
            row.update(fetched_bytes=0, requests=0, gets=0, heads=0, lists=0)
            row["error"] = f"as at {refused['budget_percent']}% (not run): {refused['error']}"
        else:
            row = measure(context, tool, order, percent)
            if row["status"] == "refused" and not row["batches"]:
                refused = row
        rows.append(row)
        print(" | ".join(table_row(row)), file=sys.stderr, flush=True)
    return sorted(rows, key=lambda row: row["budget_percent"])


def _mib(value) -> str:
    return "-" if value is None else f"{value / 2**20:.0f}"


def _status(row: dict) -> str:
    status = row["status"]
    if status.startswith(("timeout", "crashed", "failed")):
        status += f" after {row['batches']} batches"
    if row.get("error") and status != "ok":
        error = " ".join(str(row["error"]).split()).replace("|", "/")
        status += f": {error[:110]}{'...' if len(error) > 110 else ''}"
    return status


def table_row(row: dict) -> list[str]:
    delivered, fetched = row["delivered_bytes"], row["fetched_bytes"]
    ratio = f"{fetched / delivered:.2f}" if delivered else "-"
    epoch2 = row["epoch2_fetched_bytes"]
    first, rate = row["first_batch_s"], row["batches_per_s"]
    return [
        row["tool"],
        row["order"],
        f"{row['budget_percent']}%",
        _status(row),
        f"{ratio} ({_mib(fetched)} MiB)",
        f"{row['requests']} ({row['gets']})",
        "-" if epoch2 is None else f"{epoch2 / row['data_bytes']:.2f}",
        "-" if first is None else f"{first:.2f}",
        "-" if rate is None else f"{rate:.1f}",
        _mib(row["peak_rss_bytes"]),
        _mib(row["peak_cache_bytes"]),
    ]


HEADER = [
    "tool",
    "order",
    "budget",
    "status",
    "fetched / delivered (MiB fetched)",
    "requests (GETs)",
    "epoch 2 fetched / data",
    "first batch, s",
    "batches/s",
    "peak RSS, MiB",
    "peak cache dir, MiB",
]


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def prepare(context: Context, tool: Tool, lines: list[str]) -> bool:
    """Probes, writes and uploads `tool`'s dataset; False (with a line) if it cannot run."""
    python = context.pythons[tool.name]
    probed = run_child(python, {"action": "probe", "tool": tool.name}, context.env, 120).result
    context.infos[tool.name] = probed
    usable = probed.get("status") not in ("unavailable", "crashed") and "version" in probed
    if not usable and tool.name != "loaderx":  # loaderx still writes, for the local half
        lines.append(f"skipped: {tool.name}: {probed.get('error')} ({python})")
        return False
    out = context.work / "data" / tool.name
    spec = {"action": "write", "tool": tool.name, "out": str(out), "records": context.count}
    spec.update(tool.write, bypass=probed.get("bypass", False))
    if tool.name.startswith("loaderx"):  # written to S3 by loaderx itself (bundled shards)
        spec["remote_url"] = f"s3://{BUCKET}/{tool.name}"
    written = run_child(python, spec, context.env, 600).result
    if "shards" not in written:
        lines.append(f"skipped: {tool.name}: its writer failed: {written.get('error')}")
        return False
    if "objects" in written:
        files, size = written["objects"], written["uploaded"]
    else:
        files, size = upload(context.endpoint, out, tool.name)
    context.stored[tool.name] = size
    sizes = written["shards"]
    lines.append(
        f"- {tool.name} {probed.get('version', '')}: {len(sizes)} shards of up to "
        f"{max(sizes) / 2**20:.1f} MiB ({files} objects, {size / 2**20:.1f} MiB uploaded); "
        f"{tool.recommends}" + (f". Note: {probed['note']}" if probed.get("note") else "")
    )
    if not usable:
        lines.append(f"skipped: loaderx remote runs: {probed.get('error')}")
        return False
    return True


def file_pair(context: Context) -> tuple[str, list[dict]]:
    """loaderx over file:// against the same sharded dataset opened locally."""
    directory = context.work / "data" / "loaderx"
    data = context.count * RECORD_BYTES
    rows, cache = [], context.work / "pair-cache"
    for name, url, local in (
        ("local", str(directory), True),
        ("file://", directory.resolve().as_uri(), False),
    ):
        shutil.rmtree(cache, ignore_errors=True)
        cache.mkdir()
        spec = {"action": "read", "tool": "loaderx", "order": "cyclic", "url": url, "local": local}
        spec.update(cache=str(cache), budget=2 * data, records=context.count, epochs=PAIR_EPOCHS)
        if not local and "version" not in context.infos.get("loaderx", {}):
            rows.append({"loader": name, "status": "skipped", "error": "remote not available"})
            continue
        child = run_child(sys.executable, spec, context.env, context.timeout * 2)
        rows.append(
            {"loader": name, **child.result, "peak_rss_bytes": child.rss, "seconds": child.seconds}
        )
    shutil.rmtree(cache, ignore_errors=True)
    local_rate = rows[0].get("batches_per_s")
    cells = []
    for row in rows:
        rate = row.get("batches_per_s")
        ratio = f"{rate / local_rate:.2f}" if rate and local_rate else "-"
        cells.append(
            [
                f"loaderx {row['loader']}",
                _status({"batches": row.get("batches", 0), **row}),
                "-" if rate is None else f"{rate:.1f}",
                ratio,
                _mib(row.get("peak_rss_bytes")),
                "-" if row.get("first_batch_s") is None else f"{row['first_batch_s']:.2f}",
            ]
        )
    header = ["loader", "status", "batches/s", "x local", "peak RSS, MiB", "first batch, s"]
    return markdown_table(header, cells), rows


def bench(options: argparse.Namespace) -> tuple[str, dict]:
    """Runs the whole benchmark; returns (markdown, the rows for --json)."""
    began = time.perf_counter()
    endpoint, server, counting = start_server()
    env = {**os.environ, **s3_environment(endpoint)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE"):
        env.pop(name, None)
    os.environ.update(s3_environment(endpoint))  # boto3's uploads from this process
    create_bucket(endpoint)
    tools = [tool for tool in TOOLS if tool.name in options.tools]
    pythons = {
        tool.name: options.contender_python if tool.contender else sys.executable for tool in tools
    }
    lines: list[str] = []
    rows: list[dict] = []
    try:
        with tempfile.TemporaryDirectory(prefix="loaderx-bench-remote-") as work:
            context = Context(
                endpoint, counting, env, Path(work), options.records, options.timeout, pythons, {}
            )
            for tool in tools:
                if not prepare(context, tool, lines):
                    continue
                for order in options.orders:
                    rows += measure_budgets(context, tool.name, order, options.budgets)
            pair, pair_rows = ("", [])
            if "loaderx" in context.infos:
                pair, pair_rows = file_pair(context)
    finally:
        server.shutdown()
        server.server_close()
    data = options.records * RECORD_BYTES
    text = (
        f"### remote: {options.records:,} records x 12 KiB ({data / 2**20:.0f} MiB), "
        f"batches of {BATCH}, {EPOCHS} epochs, moto S3 on 127.0.0.1\n\n"
        + "\n".join(lines)
        + "\n\n"
        + markdown_table(HEADER, [table_row(row) for row in rows])
        + "\n\nBytes and requests are counted at the server (response bodies; every method). "
        "Budgets are of what each tool stores (its uploaded objects); fetched / delivered "
        "and epoch 2 are of the records' bytes. loaderx's block order takes the most shards "
        "per block (4, 2, 1) and workers (4, 2, 1) whose steps in flight read at most a "
        "quarter of the budget. "
        "iid/cyclic: loaderx's sampler modes, the "
        "contenders' random access to the same seeded indices; native: each tool's own "
        f"shuffled order for remote data. Per-run timeout {options.timeout:.0f} s."
    )
    if pair:
        text += (
            f"\n\n### remote: file:// against local, loaderx, cyclic, {PAIR_EPOCHS} epochs\n\n"
            + pair
        )
    text += f"\n\nremote bench time: {time.perf_counter() - began:.0f} s"
    return text, {"rows": rows, "file_pair": pair_rows, "tools": lines}


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_RECORDS} records, 2 budgets")
    parser.add_argument("--json", help="also write every row to this file")
    parser.add_argument("--tools", default=",".join(tool.name for tool in TOOLS))
    parser.add_argument("--orders", default=",".join(ORDERS))
    parser.add_argument("--budgets", help="percent of the data, comma-separated")
    parser.add_argument("--records", type=int)
    parser.add_argument("--timeout", type=float, help="seconds per run")
    parser.add_argument(
        "--contender-python", default=os.environ.get("LOADERX_BENCH_PYTHON", sys.executable)
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.child:
        return options
    options.tools = options.tools.split(",")
    unknown = set(options.tools) - {tool.name for tool in TOOLS}
    orders = options.orders.split(",")
    if unknown or set(orders) - set(ORDERS):
        parser.error(f"tools are {[t.name for t in TOOLS]}, orders {list(ORDERS)}")
    options.orders = orders
    budgets = options.budgets or ",".join(map(str, QUICK_BUDGETS if options.quick else BUDGETS))
    options.budgets = [int(value) for value in budgets.split(",")]
    options.records = options.records or (QUICK_RECORDS if options.quick else RECORDS)
    options.timeout = options.timeout or (QUICK_TIMEOUT if options.quick else TIMEOUT)
    return options


def bench_remote(quick: bool) -> str:
    """The `remote` table of scripts/bench.py."""
    return bench(parse(["--quick"] if quick else []))[0]


def main(argv: list[str] | None = None) -> int:
    options = parse(argv)
    if options.child:
        return child_main(json.loads(options.child))
    text, rows = bench(options)
    print(text)
    if options.json:
        Path(options.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
