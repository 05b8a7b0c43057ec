"""Datasets in object storage (loaderx._remote_dataset): a remote stream equals
the local stream bit for bit (every mode, shard=, resume, mixing, packing,
dense and ragged, over S3 and file://), the cache budget at every batch,
budgets too small refused when the loader is built, two processes on one
cache directory, a reader killed mid-download, a network fault then an exact
resume, the CLI on a URL, and corrupted objects on the server."""

from __future__ import annotations

import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from s3_fixture import REQUESTS, bytes_under, requests_to

import loaderx
from loaderx import _cache, _remote, _remote_dataset, _upload, cli, shards
from loaderx._cache import CacheTooSmallError
from loaderx._remote import Fault, FaultySource, RetryingSource

pytest.importorskip("obstore", reason="remote datasets need obstore: pip install 'loaderx[remote]'")

HERE = Path(__file__).resolve().parent
WORKER = HERE / "remote_worker.py"
WORKER_SECONDS = 60
DENSE_ROWS, DENSE_SHARDS = 2000, 8
BATCH = 64


def deleted_mappings(directory) -> set[str]:
    """Files under ``directory`` this process still maps though they were
    deleted (an evicted shard's store left open): disk the budget cannot see."""
    with open("/proc/self/maps") as maps:
        return {
            line.split()[-2]
            for line in maps
            if line.rstrip().endswith("(deleted)") and str(directory) in line
        }


def dense_rows():
    return np.random.default_rng(0).random((DENSE_ROWS, 16)).astype(np.float32)


def token_docs(count=800):
    rng = np.random.default_rng(1)
    return [rng.integers(0, 1000, rng.integers(1, 40)).astype(np.int32) for _ in range(count)]


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """Local datasets: dense sharded, ragged sharded (scalar tokens), a single store."""
    root = tmp_path_factory.mktemp("local")
    rows = dense_rows()
    per = DENSE_ROWS // DENSE_SHARDS
    for k in range(DENSE_SHARDS):
        shards.write_shard(root / "dense", k, rows[k * per : (k + 1) * per])
    shards.commit(root / "dense")
    docs = token_docs()
    for k in range(4):
        shards.write_shard(root / "ragged", k, docs[k * 200 : (k + 1) * 200])
    shards.commit(root / "ragged")
    loaderx.from_numpy(root / "single", rows[:500])
    with pytest.MonkeyPatch.context() as patch:  # as written to object storage: one object a shard
        patch.setattr(_upload, "BUNDLE_SCHEMES", frozenset({"file"}))
        for k in range(DENSE_SHARDS):
            part = rows[k * per : (k + 1) * per]
            shards.write_shard(url(root / "bundled"), k, part, staging_dir=root / "staging")
        shards.commit(url(root / "bundled"))
    return root


def url(path) -> str:
    return f"file://{path}"


def shard_bytes(path) -> int:
    """The largest shard's bytes (what one cache unit holds)."""
    return max(
        sum(f.stat().st_size for f in shard.rglob("*") if f.is_file())
        for shard in Path(path).glob("shard-*")
    )


def upload(local_dir, source) -> None:
    """A local dataset, file by file (the manifest last, as a writer would)."""
    files = sorted(p for p in Path(local_dir).rglob("*") if p.is_file())
    files.sort(key=lambda p: p.name == "manifest.msgpack")
    for path in files:
        source.put(str(path.relative_to(local_dir)), str(path))


def stream(loader, steps):
    batches = [next(loader) for _ in range(steps)]
    loader.close()
    return batches


def same(left, right) -> bool:
    if isinstance(left, dict):
        return left.keys() == right.keys() and all(same(left[k], right[k]) for k in left)
    if isinstance(left, loaderx.RaggedBatch):
        return left == right
    return np.array_equal(left, right)


# ---- the stream, bit for bit


def test_s3_stream_equals_local_in_every_mode(tmp_path, s3, local):
    """Uploaded to the S3 server file by file, a dense and a ragged dataset read
    the local stream bit for bit, in SEQUENTIAL, IID and CYCLIC order."""
    for name in ("dense", "ragged"):
        upload(local / name, _remote.open_source(s3.url(name)))
    for name, kind in (("dense", loaderx.DenseDataset), ("ragged", loaderx.RaggedDataset)):
        remote = kind(s3.url(name), cache_dir=tmp_path / "c")
        assert len(remote) == len(kind(local / name))
        for mode in ("SEQUENTIAL", "IID", "CYCLIC"):
            expected = stream(loaderx.DataLoader({"x": kind(local / name)}, mode=mode), 12)
            got = stream(loaderx.DataLoader({"x": remote}, mode=mode, num_workers=2), 12)
            assert all(same(a, b) for a, b in zip(expected, got)), (name, mode)
        remote.close()


@pytest.mark.parametrize("mode", ["SEQUENTIAL", "IID", "CYCLIC"])
def test_file_stream_equals_local_with_shard_and_resume(tmp_path, local, mode):
    """shard=(rank, 2), and a resume from state_dict at step 7, under a budget
    of three shards of eight (SEQUENTIAL; a random order reads every shard in
    every step, so it gets the default budget, the whole dataset): the remote
    stream is the local one."""
    budget = 3 * shard_bytes(local / "dense") if mode == "SEQUENTIAL" else None
    options = dict(batch_size=BATCH, mode=mode, shard=(1, 2), num_workers=2)
    expected = stream(
        loaderx.DataLoader({"x": loaderx.DenseDataset(local / "dense")}, **options), 20
    )
    remote = loaderx.DenseDataset(url(local / "dense"), cache_dir=tmp_path, cache_bytes=budget)
    first = loaderx.DataLoader({"x": remote}, **options)
    got = [next(first) for _ in range(7)]
    state = first.state_dict()
    first.close()
    again = loaderx.DataLoader({"x": remote}, **options)
    again.load_state_dict(state)
    got += stream(again, 13)
    assert all(same(a, b) for a, b in zip(expected, got))


def test_mixing_and_packing_equal_local(tmp_path, local):
    remote_dense = loaderx.DenseDataset(url(local / "dense"), cache_dir=tmp_path)
    sources = [{"x": loaderx.DenseDataset(local / "dense")}, {"x": remote_dense}]
    mixed = dict(weights=[0.3, 0.7], batch_size=BATCH, mode="IID")
    local_pair = [{"x": loaderx.DenseDataset(local / "dense")}] * 2
    assert all(
        same(a, b)
        for a, b in zip(
            stream(loaderx.DataLoader(local_pair, **mixed), 10),
            stream(loaderx.DataLoader(sources, **mixed), 10),
        )
    )
    packing = loaderx.Packing(64)
    remote = loaderx.RaggedDataset(url(local / "ragged"), cache_dir=tmp_path)
    expected = stream(
        loaderx.DataLoader(
            {"t": loaderx.RaggedDataset(local / "ragged")}, packing=packing, batch_size=8
        ),
        10,
    )
    packed = loaderx.DataLoader({"t": remote}, packing=packing, batch_size=8, num_workers=2)
    assert remote.store.cache.plan is not None  # planned by the packer's chunks
    got = stream(packed, 10)
    assert all(same(a, b) for a, b in zip(expected, got))


def test_single_store_and_pickle(tmp_path, local):
    """A store without shards is one unit pinned while open; a budget below it is
    refused at open; a pickled remote dataset opens its own cache on the same directory."""
    rows = dense_rows()[:500]
    remote = loaderx.DenseDataset(url(local / "single"), cache_dir=tmp_path)
    assert np.array_equal(remote[:], rows)
    assert remote[[]].shape == (0, 16)
    copy = pickle.loads(pickle.dumps(remote))
    assert np.array_equal(copy[[3, 499, 0]], rows[[3, 499, 0]])
    assert copy.store.cache.stats.fetches == 0  # the other process's units are shared
    copy.close()
    remote.close()
    with pytest.raises(CacheTooSmallError, match="shards"):
        loaderx.DenseDataset(url(local / "single"), cache_dir=tmp_path / "small", cache_bytes=1000)
    with pytest.raises(ValueError, match="local path"):
        loaderx.DenseDataset(local / "single", cache_bytes=10**6)


# ---- the budget


@pytest.mark.parametrize("mode, shards_held", [("SEQUENTIAL", 2), ("SEQUENTIAL", 4), ("CYCLIC", 9)])
def test_budget_holds_after_every_batch(tmp_path, local, mode, shards_held):
    """Two epochs under budgets of 2, 4 and 9 shards (of 8): the cache directory
    never holds more than the budget after any batch, and the stream is local's."""
    one = shard_bytes(local / "dense")
    budget = shards_held * one
    remote = loaderx.DenseDataset(url(local / "dense"), cache_dir=tmp_path, cache_bytes=budget)
    directory = remote.store.cache_directory
    loader = loaderx.DataLoader(
        {"x": remote}, mode=mode, batch_size=BATCH, num_workers=2, prefetch_size=2
    )
    expected = loaderx.DataLoader(
        {"x": loaderx.DenseDataset(local / "dense")}, mode=mode, batch_size=BATCH
    )
    peak = 0
    for step in range(2 * (DENSE_ROWS // BATCH)):  # two epochs
        assert np.array_equal(next(loader)["x"], next(expected)["x"]), step
        peak = max(peak, bytes_under(directory))
        assert peak <= budget, (step, peak, budget)
        # An evicted shard's store is closed at the next read: at most the
        # data and index files of two shards are still mapped after a batch.
        deleted = deleted_mappings(directory)
        assert len(deleted) <= 4, (step, deleted)
    loader.close()
    stats = remote.store.cache.stats
    if shards_held == 9:  # everything fits: no byte fetched twice, nothing evicted
        assert stats.bytes_fetched <= sum(u.length for u in remote.store.units), stats
        assert stats.evictions == 0 and all(map(remote.store.cache.resident, remote.store.units))
    else:
        assert stats.evictions > 0, stats


def test_budget_below_what_a_step_needs_is_refused_at_build(tmp_path, local):
    one = shard_bytes(local / "dense")
    tiny = loaderx.DenseDataset(url(local / "dense"), cache_dir=tmp_path, cache_bytes=one // 2)
    with pytest.raises(CacheTooSmallError, match="cache_bytes") as refused:
        loaderx.DataLoader({"x": tiny}, mode="SEQUENTIAL", batch_size=BATCH)
    assert "mode='block'" not in str(refused.value)  # it reads a shard or two a step
    with pytest.raises(CacheTooSmallError, match="read fewer records"):
        tiny[:]  # one read pins all its shards together
    # IID touches every shard each step: four workers in flight need them all at once.
    some = loaderx.DenseDataset(url(local / "dense"), cache_dir=tmp_path, cache_bytes=3 * one)
    with pytest.raises(CacheTooSmallError, match="in flight.*or an order that reads a few shards"):
        loaderx.DataLoader({"x": some}, mode="IID", batch_size=BATCH, num_workers=4)


def test_a_budget_without_headroom_warns_once_at_build(tmp_path, local):
    """Four workers in SEQUENTIAL order read up to three shards at once (4 x
    64 records across shards of 250): under a budget of three shards (of
    eight) that is over half of it, so building the loader warns once, from
    the user's call, with the numbers and what to change; a re-plan later
    does not warn again; seven shards are quiet, and so is a budget that
    holds the whole dataset (it never evicts)."""
    one = shard_bytes(local / "dense")
    options = dict(mode="SEQUENTIAL", batch_size=BATCH, num_workers=4)
    tight = loaderx.DenseDataset(
        url(local / "dense"), cache_dir=tmp_path / "a", cache_bytes=3 * one
    )
    with pytest.warns(loaderx.CacheHeadroomWarning) as caught:
        loader = loaderx.DataLoader({"x": tight}, **options)
    assert len(caught) == 1 and caught[0].filename == __file__
    message = str(caught[0].message)
    need = int(message.split("read up to ")[1].split(" bytes")[0])
    assert 2 * one < need <= 3 * one and "(3 shards, at step" in message
    assert f"cache_bytes={3 * one}" in message and f"at least {2 * need}" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error", loaderx.CacheHeadroomWarning)
        for _ in range(3 * _remote_dataset.PLAN_STEPS // 4):  # past a re-plan
            next(loader)
        loader.close()
        for name, budget, mode in (("b", 7 * one, "SEQUENTIAL"), ("c", 8 * one, "IID")):
            roomy = loaderx.DenseDataset(
                url(local / "dense"), cache_dir=tmp_path / name, cache_bytes=budget
            )
            loaderx.DataLoader({"x": roomy}, **{**options, "mode": mode}).close()
            roomy.close()
    tight.close()


# ---- processes, faults, corruption


def worker(mode, dataset_url, cache_dir, budget):
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(HERE.parent / "src"), os.environ.get("PYTHONPATH", "")]),
    )
    return subprocess.Popen(
        [sys.executable, str(WORKER), mode, dataset_url, str(cache_dir), str(budget)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )


def finish(process):
    out, err = process.communicate(timeout=WORKER_SECONDS)
    assert process.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("name", ["dense", "bundled"])
def test_two_processes_share_one_cache_without_double_downloads(tmp_path, local, name):
    budget = 10 * shard_bytes(local / name)
    readers = [worker("read", url(local / name), tmp_path, budget) for _ in range(2)]
    results = [finish(p) for p in readers]
    total = float(dense_rows().astype(np.float64).sum())
    assert all(abs(r["sum"] - total) < 1e-3 for r in results)
    objects = sum(1 for p in (local / name).glob("shard-*/*") if p.is_file())
    if name == "bundled":
        assert objects == DENSE_SHARDS  # one object a shard
    assert sum(r["fetches"] for r in results) == objects  # each object once, between the two


@pytest.mark.parametrize("name", ["dense", "bundled"])
def test_reader_killed_mid_download_then_a_new_reader_works(tmp_path, local, name):
    process = worker("hang", url(local / name), tmp_path, 10**7)
    deadline = time.monotonic() + WORKER_SECONDS
    while not any(Path(tmp_path).glob("d-*/tmp/*.part")):
        assert process.poll() is None and time.monotonic() < deadline, process.stderr.read()
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=WORKER_SECONDS)
    remote = loaderx.DenseDataset(url(local / name), cache_dir=tmp_path, cache_bytes=10**7)
    assert (remote.store.manifest.bundles is not None) == (name == "bundled")
    assert np.array_equal(remote[:], dense_rows())
    assert not any(Path(tmp_path).glob("d-*/tmp/*.part"))
    remote.close()


def test_network_fault_mid_run_then_exact_resume(tmp_path, local):
    """Gets 20 to 49 fail (past every retry): the loader raises at that step, its
    state_dict names it, and a loader resumed from it reads the exact stream."""
    one = shard_bytes(local / "dense")
    faults = [Fault(n, "fail", method="get") for n in range(20, 50)]
    inner = FaultySource(_remote.open_source(url(local / "dense")), faults)
    flaky = RetryingSource(inner, sleep=lambda seconds: None)
    options = dict(batch_size=BATCH, mode="SEQUENTIAL", num_workers=2)
    remote = loaderx.DenseDataset(
        url(local / "dense"), cache_dir=tmp_path, cache_bytes=3 * one, _source=flaky
    )
    loader = loaderx.DataLoader({"x": remote}, **options)
    got = []
    with pytest.raises(loaderx.LoaderError) as caught:
        while True:
            got.append(next(loader))
    assert isinstance(caught.value.__cause__, loaderx.RemoteNetworkError)
    assert inner.injected
    state = loader.state_dict()
    assert state["step"] == len(got) == caught.value.step
    healthy = loaderx.DenseDataset(url(local / "dense"), cache_dir=tmp_path, cache_bytes=3 * one)
    resumed = loaderx.DataLoader({"x": healthy}, **options)
    resumed.load_state_dict(state)
    got += stream(resumed, 40 - len(got))
    expected = stream(
        loaderx.DataLoader({"x": loaderx.DenseDataset(local / "dense")}, **options), 40
    )
    assert all(same(a, b) for a, b in zip(expected, got))


def corrupt_copy(local, tmp_path, how):
    copy = tmp_path / "served"
    subprocess.run(["cp", "-r", str(local / "dense"), str(copy)], check=True)
    data = sorted((copy / "shard-00003").glob("data-*"))[0]
    payload = bytearray(data.read_bytes())
    if how == "flip":
        payload[len(payload) // 2] ^= 0x40
    else:
        payload = payload[: len(payload) // 2]
    data.write_bytes(bytes(payload))
    return copy, data


@pytest.mark.parametrize("how", ["flip", "truncate"])
def test_corrupted_object_on_the_server_is_an_error_never_wrong_data(tmp_path, local, how):
    served, _ = corrupt_copy(local, tmp_path, how)
    remote = loaderx.DenseDataset(url(served), cache_dir=tmp_path / "c")
    rows = dense_rows()
    assert np.array_equal(remote[:250], rows[:250])  # shard 0 is intact
    with pytest.raises((loaderx.ZrecordError, ValueError, OSError)) as caught:
        got = remote[750:1000]  # shard 3
        assert np.array_equal(got, rows[750:1000]), "wrong data returned"
    assert f"{url(served)}/shard-00003" in str(caught.value)
    remote.close()


def test_body_corrupted_in_transit_is_fetched_again_then_refused(tmp_path, local):
    """A body truncated on every get is never used: RemoteIntegrityError names the object."""
    faults = [Fault(n, "truncate", method="get", amount=3) for n in range(1, 100)]
    source = FaultySource(_remote.open_source(url(local / "dense")), faults)
    remote = loaderx.DenseDataset(url(local / "dense"), cache_dir=tmp_path, _source=source)
    with pytest.raises(loaderx.RemoteIntegrityError, match="shard-00000/"):
        remote[0]
    remote.close()


def test_cli_info_and_verify_on_a_url(tmp_path, local, capsys):
    dense = url(local / "dense")
    assert cli.main(["info", dense, "--cache-dir", str(tmp_path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["records"] == DENSE_ROWS and info["shards"] == DENSE_SHARDS
    one = shard_bytes(local / "dense")
    argv = ["verify", dense, "--cache-dir", str(tmp_path / "v"), "--cache-bytes", str(one)]
    assert cli.main(argv) == 0
    assert "ok" in capsys.readouterr().out
    served, _ = corrupt_copy(local, tmp_path, "flip")
    assert cli.main(["verify", url(served), "--cache-dir", str(tmp_path / "w")]) == 1
    assert "shard-00003" in capsys.readouterr().out


# ---- written remotely, read remotely


def test_written_to_s3_reads_back_and_a_flipped_superblock_is_refused(tmp_path, s3):
    """from_numpy to an S3 URL, then DenseDataset on it: the rows come back.
    A superblock flipped on the server, inside its shard's bundle (a store
    alone can open it at its older, empty generation), fails the bundle's
    SHA-256 on every fetch: RemoteIntegrityError naming the object, after
    FETCH_ATTEMPTS gets of it, never an empty or wrong read."""
    rows = dense_rows()
    target = s3.url("written")
    loaderx.from_numpy(target, rows, codec="raw", shard_bytes=rows.nbytes // 4, progress=False)
    remote = loaderx.DenseDataset(target, cache_dir=tmp_path / "c")
    manifest = remote.store.manifest
    assert manifest.files is not None and len(remote.store.units) == 4
    assert np.array_equal(remote[:], rows)
    remote.close()
    source = _remote.open_source(target)
    key = "shard-00001/shard.lxs"
    payload = bytearray(source.get(key))
    at = manifest.bundles["shard-00001"].offsets["superblock"]
    payload[at + 4096 + 64] ^= 0x01  # slot 1: the newest generation's fields
    source.put(key, bytes(payload))
    remote = loaderx.DenseDataset(target, cache_dir=tmp_path / "fresh")
    first = len(rows) // 4
    assert np.array_equal(remote[:first], rows[:first])  # shard 0 is intact
    since = len(REQUESTS)
    with pytest.raises(loaderx.RemoteIntegrityError, match="shard-00001/shard.lxs: the SHA-256"):
        remote[first : first + 10]
    gets = [path for method, path, _ in requests_to(s3.bucket, since) if method == "GET"]
    assert gets == [f"/{s3.bucket}/written/{key}"] * _cache.FETCH_ATTEMPTS
    assert bytes_under(remote.store.cache_directory) == remote.store.cache.usage()
    assert not any(remote.store.cache.resident(unit) for unit in remote.store.units[1:2])
    remote.close()


def test_a_bundled_shard_fetch_is_one_get_and_the_stream_is_local(tmp_path, s3):
    """Written to S3, each shard is one object: opening costs one listing
    and one get of the manifest, and each shard fetch is exactly one GET at
    the server (no HEAD, no listing), under a budget of two shards of four
    that holds after every batch; the stream equals the local one bit for
    bit (SEQUENTIAL with evictions, IID with every shard resident)."""
    rows = dense_rows()
    target = s3.url("bundled")
    loaderx.from_numpy(target, rows, codec="raw", shard_bytes=rows.nbytes // 4, progress=False)
    loaderx.from_numpy(tmp_path / "local", rows, codec="raw", progress=False)
    since = len(REQUESTS)
    remote = loaderx.DenseDataset(target, cache_dir=tmp_path / "c")
    opened = [(method, path) for method, path, _ in requests_to(s3.bucket, since)]
    assert opened == [("GET", f"/{s3.bucket}"), ("GET", f"/{s3.bucket}/bundled/manifest.msgpack")]
    one = max(unit.length for unit in remote.store.units)
    assert len(remote.store.units) == 4 and all(u.bundle is not None for u in remote.store.units)
    remote.close()
    for mode, budget, steps in (
        ("SEQUENTIAL", 3 * one, 2 * (DENSE_ROWS // BATCH)),
        ("IID", 4 * one, 40),
    ):
        remote = loaderx.DenseDataset(target, cache_dir=tmp_path / mode, cache_bytes=budget)
        since = len(REQUESTS)
        # Two batches ahead at most: past the last step read, the workers reach
        # into epoch 3's first shard (about 8 steps a shard), never its second.
        loader = loaderx.DataLoader(
            {"x": remote}, mode=mode, batch_size=BATCH, num_workers=2, prefetch_size=2
        )
        expected = loaderx.DataLoader(
            {"x": loaderx.DenseDataset(tmp_path / "local")}, mode=mode, batch_size=BATCH
        )
        for step in range(steps):
            assert np.array_equal(next(loader)["x"], next(expected)["x"]), (mode, step)
            assert bytes_under(remote.store.cache_directory) <= budget, (mode, step)
        loader.close()
        expected.close()
        stats = remote.store.cache.stats
        seen = requests_to(s3.bucket, since)
        assert all(method == "GET" and "/bundled/shard-" in path for method, path, _ in seen)
        assert all(path.endswith("/shard.lxs") for _, path, _ in seen), seen
        # Another cache object of the loader's may fetch too: count at the server.
        assert len(seen) >= stats.fetches and stats.refetches == 0, (mode, seen, stats)
        if mode == "SEQUENTIAL":  # each shard once an epoch (and the next epoch's first)
            assert stats.evictions > 0 and 5 <= len(seen) <= 12, (len(seen), seen)
        else:
            assert len(seen) == 4  # every shard once: they all fit
        remote.close()


def test_the_unbundled_layout_still_reads_at_a_get_per_file(tmp_path, s3, monkeypatch):
    """A dataset uploaded one object per file (as ``aws s3 sync`` of a local
    one, or loaderx before bundles; here a writer told not to bundle) reads
    the same rows as the bundled one, at a get per file of each shard, while
    the bundled one costs one get per shard."""
    rows = dense_rows()
    loaderx.from_numpy(
        s3.url("one"), rows, codec="raw", shard_bytes=rows.nbytes // 4, progress=False
    )
    monkeypatch.setattr(_upload, "BUNDLE_SCHEMES", frozenset())
    loaderx.from_numpy(
        s3.url("many"), rows, codec="raw", shard_bytes=rows.nbytes // 4, progress=False
    )
    gets = {}
    for name in ("one", "many"):
        remote = loaderx.DenseDataset(s3.url(name), cache_dir=tmp_path / name)
        assert (remote.store.manifest.bundles is None) == (name == "many")
        since = len(REQUESTS)
        assert np.array_equal(remote[:], rows)
        gets[name] = [p for m, p, _ in requests_to(s3.bucket, since) if m == "GET"]
        remote.close()
    assert len(gets["one"]) == 4
    files = sorted(p.rsplit("/", 1)[1] for p in gets["many"] if "/shard-00000/" in p)
    assert {"lock", "schema.msgpack", "superblock"} < set(files) and len(files) >= 4, files
    assert len(gets["many"]) == 4 * len(files)


def test_block_order_streams_from_half_a_dataset_fetching_only_what_did_not_fit(tmp_path):
    """BLOCK order (one shard per block) under a budget of half the shards: the
    stream is the local one, the budget holds after every batch, and over two
    cycles Belady fetches the dataset once plus at most 0.55x of it again
    (the second cycle keeps what fits beside the two shards a step spans)."""
    rows = np.random.default_rng(2).random((3200, 4)).astype(np.float32)
    for k in range(64):
        shards.write_shard(tmp_path / "data", k, rows[k * 50 : (k + 1) * 50], codec="raw")
    shards.commit(tmp_path / "data")
    one = shard_bytes(tmp_path / "data")
    total = sum(f.stat().st_size for f in (tmp_path / "data").rglob("shard-*/*") if f.is_file())
    budget = 32 * one
    remote = loaderx.DenseDataset(
        url(tmp_path / "data"), cache_dir=tmp_path / "c", cache_bytes=budget
    )
    options = dict(mode="block", shards_per_block=1, batch_size=16, num_workers=1)
    loader = loaderx.DataLoader({"x": remote}, prefetch_size=2, **options)
    expected = loaderx.DataLoader({"x": loaderx.DenseDataset(tmp_path / "data")}, **options)
    for step in range(2 * loader.steps_per_epoch):
        assert np.array_equal(next(loader)["x"], next(expected)["x"]), step
        assert bytes_under(remote.store.cache_directory) <= budget, step
    loader.close()
    expected.close()
    fetched = remote.store.cache.stats.bytes_fetched
    assert total < fetched <= 1.55 * total, (fetched, total)
    remote.close()


@pytest.mark.parametrize("bundled", [False, True])
def test_plain_http_server_reads_a_dataset_its_manifest_lists(tmp_path, monkeypatch, bundled):
    """A plain HTTP server cannot list: the dataset's files (or each shard's
    one bundle object) come from its manifest, each fetch checked against
    the recorded SHA-256; a file changed on the server is refused by name; a
    manifest without the record is refused with what to do."""
    if bundled:  # written as to object storage: one object per shard
        monkeypatch.setattr(_upload, "BUNDLE_SCHEMES", frozenset({"file"}))
    rows = dense_rows()
    served = tmp_path / "www"
    loaderx.from_numpy(
        url(served / "d"),
        rows,
        codec="raw",
        shard_bytes=rows.nbytes // 2,
        progress=False,
        staging_dir=tmp_path / "staging",
    )
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "-d", str(served)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        address = f"http://127.0.0.1:{port}/d"
        deadline = time.monotonic() + 30
        while True:  # bounded wait for the server to answer
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                assert time.monotonic() < deadline, "the HTTP server did not start"
                time.sleep(0.05)
        remote = loaderx.DenseDataset(address, cache_dir=tmp_path / "c")
        assert len(remote.store.units) == 2 and np.array_equal(remote[:], rows)
        files = len(remote.store.manifest.files["shard-00000"])
        assert remote.store.cache.stats.fetches == (2 if bundled else 2 * files)
        remote.close()
        data = next((served / "d" / "shard-00001").glob("shard.lxs" if bundled else "data-*"))
        payload = bytearray(data.read_bytes())
        payload[10] ^= 0x08  # same size: only the digest tells
        data.write_bytes(bytes(payload))
        remote = loaderx.DenseDataset(address, cache_dir=tmp_path / "c2")
        with pytest.raises(loaderx.RemoteIntegrityError, match=f"shard-00001/{data.name}"):
            remote[len(rows) - 1]
        remote.close()
        with pytest.raises(loaderx.RemoteNotFoundError, match="manifest"):
            loaderx.DenseDataset(f"http://127.0.0.1:{port}/nothing", cache_dir=tmp_path / "c3")
    finally:
        server.terminate()
        server.wait(timeout=30)
