"""Faults on the wire: tests/fault_proxy.py between obstore and the local S3
server (moto) injects HTTP 500/503, connection resets, stalls past the
client's timeout, truncated, short and bit-flipped bodies, by a seeded
schedule; these tests read through ``open_source`` (+ ``RetryingSource``)
and through ``UnitCache`` and check what each fault becomes: a success
after retries (counted in the proxy's log), a RemoteNetworkError naming the
object and the cause after a bounded number of requests, or a refetch then
RemoteIntegrityError: never wrong data where a checksum is known.

Client bounds are made small so every test ends quickly: obstore retries
once (CLIENT_RETRIES=1, so 2 requests per call) with a 500 ms timeout, and
RetryingSource makes 2 attempts: a persistent fault costs exactly 4 requests.
"""

from __future__ import annotations

import collections
import hashlib
import http.client
import os
import random
import re
import threading
import time
import urllib.parse

import fault_proxy
import numpy as np
import pytest
from fault_proxy import KINDS, FaultProxy, Schedule

from loaderx import ChecksumError, DenseDataset, _cache, _remote, from_numpy
from loaderx._cache import UnitCache
from loaderx._remote import RemoteIntegrityError, RemoteNetworkError, RetryingSource

pytest.importorskip("obstore", reason="obstore is not installed: pip install 'loaderx[remote]'")

TIMEOUT = "500ms"
STALL_SECONDS = 2.0  # past the client's timeout, and what a stalled proxy thread waits at most
BODY = bytes(range(256)) * 40  # 10 KiB
# What the RemoteNetworkError of each persistent fault names as its cause.
CAUSES = {
    "500": "500 Internal Server Error",
    "503": "503 Service Unavailable",
    "503-retry-after": "503 Service Unavailable",
    "reset": "connection reset",
    "reset-body": "connection reset",
    "truncate": "the body ended before its Content-Length",
    "stall": "timed out",
}


@pytest.fixture(autouse=True)
def one_client_retry(monkeypatch):
    monkeypatch.setattr(_remote, "CLIENT_RETRIES", 1)


@pytest.fixture
def proxied(s3):
    """proxied(schedule, prefix) -> (proxy, source through it); the proxy stops after the test."""
    proxies = []

    def make(schedule, prefix="p"):
        schedule.stall_seconds = STALL_SECONDS
        proxy = FaultProxy(s3.endpoint, schedule).start()
        proxies.append(proxy)
        options = {"endpoint": proxy.endpoint, "timeout": TIMEOUT, "connect_timeout": TIMEOUT}
        return proxy, _remote.open_source(s3.url(prefix), options)

    yield make
    for proxy in proxies:
        proxy.stop()
    assert not [t for t in threading.enumerate() if t.name.startswith("fault-proxy")]


def gets(proxy):
    return sum(1 for r in proxy.log if r.method == "GET")


@pytest.mark.parametrize(
    "kind", ["500", "503", "503-retry-after", "reset", "reset-body", "truncate"]
)
def test_transient_fault_succeeds_after_retries(s3, proxied, kind):
    """Two faults in a row: obstore's own retry meets the second, RetryingSource's
    second attempt succeeds: 3 GETs, 1 retry above the client, the right bytes."""
    _remote.open_source(s3.url("p")).put("k", BODY)
    proxy, source = proxied(Schedule(script=[kind, kind], method="GET"))
    retrying = RetryingSource(source, attempts=2)
    assert retrying.get("k") == BODY
    assert proxy.faults() == [kind, kind] and gets(proxy) == 3 and retrying.retries == 1


def test_transient_fault_on_upload_and_listing(s3, proxied):
    """A 500 on a PUT and a reset on a LIST are retried by obstore: the upload lands once."""
    proxy, source = proxied(
        Schedule(script=["500", None, "reset"], method="PUT|GET", path="k|list")
    )
    assert source.put("k", BODY).size == len(BODY)
    assert [info.key for info in source.list()] == ["k"]
    assert proxy.faults() == ["500", "reset"]
    assert proxy.stats["PUT"].requests == 2 and proxy.stats["PUT"].bytes_up == 2 * len(BODY)
    assert _remote.open_source(s3.url("p")).get("k") == BODY


@pytest.mark.parametrize("kind", sorted(CAUSES))
def test_persistent_fault_is_a_network_error_naming_object_and_cause(s3, proxied, kind):
    """Every GET faulted: RemoteNetworkError naming the object URL and the cause,
    after exactly (1 + CLIENT_RETRIES) x attempts requests."""
    _remote.open_source(s3.url("p")).put("k", BODY)
    proxy, source = proxied(Schedule(probabilities={kind: 1.0}, method="GET"))
    with pytest.raises(RemoteNetworkError) as caught:
        RetryingSource(source, attempts=2).get("k")
    message = str(caught.value)
    assert caught.value.url == s3.url("p/k") and s3.url("p/k") in message
    assert CAUSES[kind] in message and "gave up after 2 attempts" in message
    assert gets(proxy) == 4 and proxy.faults() == [kind] * 4


def test_transient_stall_times_out_then_succeeds(s3, proxied):
    """One stall past the timeout: the client times out, retries, and reads."""
    _remote.open_source(s3.url("p")).put("k", BODY)
    proxy, source = proxied(Schedule(script=["stall"], method="GET"))
    assert RetryingSource(source, attempts=1).get("k") == BODY
    assert proxy.faults() == ["stall"] and gets(proxy) == 2


def unit_of(s3, key, sha=True):
    info = _remote.open_source(s3.url("p")).put(key, BODY)
    return _cache.object_unit(info, hashlib.sha256(BODY).hexdigest() if sha else None)


@pytest.mark.parametrize("ranged", [False, True], ids=["whole", "range"])
@pytest.mark.parametrize("kind", ["truncate", "short", "flip"])
def test_cache_refetches_a_bad_body_once(s3, proxied, tmp_path, kind, ranged):
    """A body cut on the wire is caught by obstore's length check (its own retry,
    no refetch); a short body with a matching Content-Length by the cache's
    length check (obstore does not compare a range's body with the range asked),
    a flipped bit by its SHA-256: one refetch, the right bytes."""
    unit, expected = unit_of(s3, "k"), BODY
    if ranged:
        expected = BODY[100:1100]
        info = _remote.open_source(s3.url("p")).head("k")
        unit = _cache.range_unit(info, 100, 1000, hashlib.sha256(expected).hexdigest())
    proxy, source = proxied(Schedule(script=[kind], method="GET"))
    with UnitCache(tmp_path / "c", 10**6, RetryingSource(source), prefetch_threads=0) as cache:
        with cache.acquire(unit) as pin:
            assert pin.read() == expected
        assert cache.stats.refetches == (0 if kind == "truncate" else 1)
    assert proxy.faults() == [kind] and gets(proxy) == 2


@pytest.mark.parametrize("kind", ["short", "flip"])
def test_cache_refuses_a_body_bad_every_time(s3, proxied, tmp_path, kind):
    """Every body short or flipped: RemoteIntegrityError naming the object after
    `attempts` fetches, and nothing of it kept in the cache."""
    unit = unit_of(s3, "k")
    proxy, source = proxied(Schedule(probabilities={kind: 1.0}, method="GET"))
    with UnitCache(tmp_path / "c", 10**6, source, prefetch_threads=0, attempts=3) as cache:
        with pytest.raises(RemoteIntegrityError, match=r"s3://.*/p/k: .* after 3 fetches"):
            cache.acquire(unit)
        assert not cache.resident(unit) and cache.usage() == 0
    assert gets(proxy) == 3 and proxy.faults() == [kind] * 3


def test_cache_with_a_body_cut_every_time_fails_clean(s3, proxied, tmp_path):
    """Every body cut on the wire: obstore's length check fails each request, so
    it is a RemoteNetworkError (the cause named), not data: nothing kept."""
    unit = unit_of(s3, "k")
    proxy, source = proxied(Schedule(probabilities={"truncate": 1.0}, method="GET"))
    with UnitCache(tmp_path / "c", 10**6, RetryingSource(source, attempts=2)) as cache:
        with pytest.raises(RemoteNetworkError, match="before its Content-Length"):
            cache.acquire(unit)
        assert not cache.resident(unit) and cache.usage() == 0
    assert gets(proxy) == 4


def test_random_faults_under_a_planned_cache_with_prefetch(s3, proxied, tmp_path):
    """Every kind at random (seeded) under a cache with a plan and two prefetch
    threads: each read gives the object's bytes or a RemoteError, never other
    bytes; the budget holds at every step; close() ends with no download left."""
    direct = _remote.open_source(s3.url("p"))
    bodies = {f"o{i}": os.urandom(2000) for i in range(8)}
    units = [
        _cache.object_unit(direct.put(key, body), hashlib.sha256(body).hexdigest())
        for key, body in bodies.items()
    ]
    kinds = ("500", "503", "reset", "reset-body", "stall", "truncate", "short", "flip")
    schedule = Schedule(probabilities=dict.fromkeys(kinds, 0.06), seed=3, method="GET")
    proxy, source = proxied(schedule)
    order = random.Random(3).choices(range(len(units)), k=32)
    budget = 3 * 2000
    errors = []
    cache = UnitCache(
        tmp_path / "c", budget, RetryingSource(source, attempts=2), plan=[[units[i]] for i in order]
    )
    with cache:
        for step, index in enumerate(order):
            try:
                with cache.acquire(units[index], step) as pin:
                    assert pin.read() == bodies[units[index].key]
            except (RemoteNetworkError, RemoteIntegrityError) as exc:
                errors.append(exc)
            assert cache.usage() <= budget
    assert not list((tmp_path / "c" / "tmp").iterdir())
    assert all(re.search(r"s3://\S+/p/o\d", str(exc)) for exc in errors)
    print(
        f"random faults: {collections.Counter(proxy.faults())}, {gets(proxy)} GETs, "
        f"{proxy.connections} connections, {proxy.chunked_responses} chunked, {errors}"
    )
    assert len(set(proxy.faults())) >= 5 and cache.stats.refetches >= 1


def test_close_during_a_stalled_prefetch_ends(s3, proxied, tmp_path):
    """A prefetch stuck in a stall: close() waits for it only as long as the
    client's timeouts allow, the failed prefetch leaves no reservation, and the
    reader that needs the unit later gets the timeout as a RemoteNetworkError."""
    first, second = unit_of(s3, "a"), unit_of(s3, "b")
    proxy, source = proxied(Schedule(probabilities={"stall": 1.0}, method="GET", path="/p/b"))
    with UnitCache(tmp_path / "c", 10**6, source, plan=[[first], [second]]) as cache:
        cache.acquire(first, 0).release()  # submits the prefetch of b, which stalls
    assert not list((tmp_path / "c" / "tmp").iterdir()) and gets(proxy) >= 1
    with UnitCache(tmp_path / "c", 10**6, source, prefetch_threads=0) as cache:
        with pytest.raises(RemoteNetworkError, match=r"/p/b .*\(timed out\)"):
            cache.acquire(second)
    assert set(proxy.faults()) == {"stall"}


def test_failed_prefetch_is_not_retried_forever(s3, proxied, tmp_path):
    """A prefetch that fails is left to the reader: it is not resubmitted while
    the reader stays at its step (it was, at once and without end: 37 requests
    in 2 s against a persistent 500); the reader's own acquire then fails."""
    first, second = unit_of(s3, "a"), unit_of(s3, "b")
    proxy, source = proxied(Schedule(probabilities={"500": 1.0}, method="GET", path="/p/b"))
    with UnitCache(tmp_path / "c", 10**6, source, plan=[[first], [second]]) as cache:
        cache.acquire(first, 0).release()  # submits the prefetch of b, which fails
        for _ in range(400):  # at most 10 s
            if len(proxy.faults()) >= 2:
                break
            time.sleep(0.025)
        time.sleep(0.5)  # time for a resubmitted prefetch to show
        assert len(proxy.faults()) == 2  # one call: obstore's 2 requests
        with pytest.raises(RemoteNetworkError, match=r"/p/b .*500"):
            cache.acquire(second, 1)
    assert len(proxy.faults()) == 4 and not list((tmp_path / "c" / "tmp").iterdir())


def test_flip_without_a_sha256_passes_the_cache_but_not_reads_with_verify(s3, proxied, tmp_path):
    """A bit flipped in a store's data file, fetched in a directory unit with no
    SHA-256, reaches the pinned directory: verify=False reads the wrong row,
    the default and verify=True raise ChecksumError (the records' own checksums)."""
    rows = np.arange(600, dtype=np.float32).reshape(100, 6)
    store = upload_store(s3, tmp_path, rows)
    proxy, source = proxied(Schedule(script=["flip"], method="GET", path=r"/data-", seed=1))
    unit = _cache.directory_unit("shard-0", source.list("shard-0"))
    with UnitCache(tmp_path / "c", 10**6, source, prefetch_threads=0) as cache:
        with cache.acquire(unit) as pin:
            assert not np.array_equal(DenseDataset(pin.path, verify=False)[:], rows)
            for verify in (None, True):
                with pytest.raises(ChecksumError, match="checksum mismatch"):
                    DenseDataset(pin.path, verify=verify)[:]
    assert proxy.faults() == ["flip"] and len(store) == len(unit.members)


def test_superblock_flip_needs_the_manifest_sha256(s3, proxied, tmp_path):
    """A bit flipped in the newest superblock slot makes the store open at its
    older generation (here: empty) with no error, even with verify=True; with
    the files' SHA-256 in the unit the cache refetches it and the rows are right."""
    rows = np.arange(600, dtype=np.float32).reshape(100, 6)
    digests = upload_store(s3, tmp_path, rows)
    for sha256, name in ((None, "bare"), (digests, "checked")):
        schedule = Schedule(script=["flip"], method="GET", path=r"/superblock", seed=17)
        proxy, source = proxied(schedule)
        unit = _cache.directory_unit("shard-0", source.list("shard-0"), sha256)
        with UnitCache(tmp_path / name, 10**6, source, prefetch_threads=0) as cache:
            with cache.acquire(unit) as pin:
                got = DenseDataset(pin.path, verify=True)[:]
            assert cache.stats.refetches == (0 if sha256 is None else 1)
        assert got.shape == ((0, 6) if sha256 is None else rows.shape)
        assert proxy.faults() == ["flip"]
    assert np.array_equal(got, rows)


def upload_store(s3, tmp_path, rows):
    """A loaderx store of ``rows`` uploaded file by file under p/shard-0;
    the map of its keys to their SHA-256."""
    from_numpy(tmp_path / "store", rows, progress=False)
    direct = _remote.open_source(s3.url("p"))
    digests = {}
    for path in sorted((tmp_path / "store").iterdir()):
        key = "shard-0/" + path.name
        direct.put(key, path)
        digests[key] = hashlib.sha256(path.read_bytes()).hexdigest()
    return digests


def replay(s3, proxied, seed):
    """The proxy's log of one fixed workload under a random schedule of ``seed``."""
    kinds = ("500", "503", "reset", "reset-body", "short", "flip")
    proxy, source = proxied(Schedule(probabilities=dict.fromkeys(kinds, 0.08), seed=seed))
    retrying = RetryingSource(source, attempts=2, seed=seed)
    outcomes = []
    for i in range(12):
        try:
            outcomes.append(retrying.get(f"k{i % 4}") == BODY)
        except RemoteNetworkError:
            outcomes.append(None)
    return [(r.method, r.path, r.fault) for r in proxy.log], outcomes


def test_same_seed_same_faults(s3, proxied):
    """The same seed gives the same log of requests and faults, and the same
    outcomes; another seed another log."""
    direct = _remote.open_source(s3.url("p"))
    for i in range(4):
        direct.put(f"k{i}", BODY)
    first, outcomes = replay(s3, proxied, seed=5)
    assert replay(s3, proxied, seed=5) == (first, outcomes)
    assert replay(s3, proxied, seed=6)[0] != first
    assert any(fault for _, _, fault in first) and any(fault is None for _, _, fault in first)
    print(f"replay: {len(first)} requests, faults {[f for _, _, f in first if f]}, {outcomes}")


def test_schedule_checks_and_counts():
    """Unknown kinds and probabilities over 1 are refused; only matching requests count."""
    with pytest.raises(ValueError, match="not one of"):
        Schedule(script=["explode"])
    with pytest.raises(ValueError, match="more than 1"):
        Schedule(probabilities={"500": 0.7, "reset": 0.4})
    schedule = Schedule(script=["500", None, "flip"], method="GET", path=r"/data-")
    assert schedule.matches("GET", "/b/p/data-01") and not schedule.matches("PUT", "/b/data-01")
    assert [schedule.decide()[0] for _ in range(4)] == ["500", None, "flip", None]
    assert set(KINDS) >= set(CAUSES)


# moto checks that a request is signed, not the signature.
SIGNED = {
    "Authorization": "AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/s3/aws4_request, "
    "SignedHeaders=host, Signature=0"
}


def test_chunked_upload_keep_alive_and_clean_stop(s3, proxied):
    """A chunked request body is forwarded whole; several requests share one
    kept-alive connection, idle between them; stop() ends with it still open."""
    proxy, _ = proxied(Schedule())
    host = urllib.parse.urlsplit(proxy.endpoint)
    connection = http.client.HTTPConnection(host.hostname, host.port, timeout=10)
    body = [os.urandom(1000), os.urandom(3000)]
    path = f"/{s3.bucket}/p/chunked"
    connection.request("PUT", path, iter(body), SIGNED, encode_chunked=True)
    assert connection.getresponse().read() is not None
    for _ in range(2):
        time.sleep(2 * fault_proxy.IDLE_SECONDS)  # idle longer than the proxy's wake-up
        connection.request("GET", path, headers=SIGNED)
        response = connection.getresponse()
        assert response.status == 200 and response.read() == b"".join(body)
    assert len(proxy.log) == 3 and proxy.connections == 1
    assert proxy.stats["PUT"].bytes_up == 4000 and proxy.stats["GET"].bytes_down == 8000
    proxy.stop()  # the connection is still open: stop must not wait for it
    connection.close()
