"""The network seam (loaderx._remote): URL parsing, a round trip through a
local S3 server (moto), credentials from the environment and from
storage_options, the error each failure becomes, and the fault injector."""

from __future__ import annotations

import os

import pytest
from s3_fixture import MemorySource

from loaderx import _remote
from loaderx._remote import (
    Fault,
    FaultySource,
    RemoteConfigError,
    RemoteNetworkError,
    RemoteNotFoundError,
    RemotePermissionError,
    RetryingSource,
    parse_url,
)

obstore = pytest.importorskip(
    "obstore", reason="obstore is not installed: pip install 'loaderx[remote]'"
)


@pytest.mark.parametrize(
    "url, scheme, bucket, prefix",
    [
        ("s3://bucket/a/b/", "s3", "bucket", "a/b"),
        ("s3://bucket", "s3", "bucket", ""),
        ("gs://gbucket/train", "gs", "gbucket", "train"),
        ("az://container/x/y", "az", "container", "x/y"),
        ("https://example.com/data/set", "https", "example.com", "data/set"),
        ("http://127.0.0.1:9000/d", "http", "127.0.0.1:9000", "d"),
        ("file:///tmp/data/", "file", "", "/tmp/data"),
    ],
)
def test_parse_url_per_scheme(url, scheme, bucket, prefix):
    """Each scheme splits into its bucket (or host) and a prefix without slashes at its ends."""
    parsed = parse_url(url)
    assert (parsed.scheme, parsed.bucket, parsed.prefix) == (scheme, bucket, prefix)
    assert _remote.is_remote(url)


@pytest.mark.parametrize("url", ["ftp://host/x", "s3:///nobucket", "file://host/x", "plain/path"])
def test_parse_url_refuses_what_it_cannot_open(url):
    """An unknown scheme, a missing bucket or a file URL with a host is a RemoteConfigError."""
    with pytest.raises(RemoteConfigError, match="cannot open"):
        parse_url(url)
    assert not _remote.is_remote("/local/path")


def test_store_per_scheme(monkeypatch, tmp_path):
    """Each scheme builds the obstore store of its kind, with the URL's prefix."""
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "account")
    stores = obstore.store
    assert isinstance(_remote.build_store(parse_url("s3://b/p")), stores.S3Store)
    gcs = _remote.build_store(parse_url("gs://b/p"))
    assert isinstance(gcs, stores.GCSStore) and gcs.prefix == "p"
    assert isinstance(_remote.build_store(parse_url("az://c/p")), stores.AzureStore)
    assert isinstance(_remote.build_store(parse_url("https://example.com/a")), stores.HTTPStore)
    assert isinstance(_remote.build_store(parse_url(f"file://{tmp_path}")), stores.LocalStore)


def test_plain_http_only_to_this_machine(monkeypatch):
    """An http:// endpoint on loopback is allowed; elsewhere it needs allow_http=True."""
    local = parse_url("s3://b/p")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://localhost:9000")
    assert _remote.split_options(local, None)[1]["allow_http"] is True
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://10.1.2.3:9000")
    with pytest.raises(RemoteConfigError, match="allow_http"):
        _remote.split_options(local, None)
    config, client = _remote.split_options(local, {"allow_http": True, "region": "eu-west-1"})
    assert client["allow_http"] is True and config == {"region": "eu-west-1"}


def test_round_trip_on_s3(s3, tmp_path):
    """put (one request, and multipart for a file over 5 MiB), head, list, get,
    ranged get and delete against the local S3 server."""
    source = _remote.open_source(s3.url("data/train"))
    small = source.put("a.bin", b"hello world")
    assert small.size == 11 and small.etag
    big = os.urandom(_remote.MULTIPART_BYTES + 1024 * 1024)
    path = tmp_path / "big.bin"
    path.write_bytes(big)
    uploaded = source.put("sub/big.bin", path)
    assert uploaded.etag and uploaded.etag.endswith('-2"')  # an S3 multipart etag: 2 parts
    assert source.head("sub/big.bin").size == len(big)
    assert [info.key for info in source.list()] == ["a.bin", "sub/big.bin"]
    assert [info.key for info in source.list("sub")] == ["sub/big.bin"]
    assert source.get("a.bin") == b"hello world"
    assert source.get("sub/big.bin") == big
    assert source.get_range("sub/big.bin", 5_000_000, 100) == big[5_000_000:5_000_100]
    source.delete("a.bin")
    with pytest.raises(RemoteNotFoundError, match=r"s3://.*/data/train/a.bin"):
        source.get("a.bin")


def test_changed_object_fails_a_read_by_etag(s3):
    """A read that names the etag it planned on fails once the object changed."""
    source = _remote.open_source(s3.url("p"))
    first = source.put("x", b"one")
    source.put("x", b"two")
    with pytest.raises(_remote.RemoteChangedError, match="changed"):
        source.get("x", first.etag)
    assert source.get("x", source.head("x").etag) == b"two"


def test_credentials_from_environment_and_storage_options(s3, monkeypatch):
    """The AWS_* variables reach the client; storage_options override them;
    a server that refuses the credentials gives RemotePermissionError."""
    _remote.open_source(s3.url()).put("k", b"v")
    for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"):
        monkeypatch.delenv(name)
    options = {
        "endpoint": s3.endpoint,
        "access_key_id": "testing",
        "secret_access_key": "testing",
        "region": "us-east-1",
    }
    assert _remote.open_source(s3.url(), options).get("k") == b"v"
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    anonymous = _remote.open_source(s3.url(), {"skip_signature": True})
    with pytest.raises(RemotePermissionError, match=r"s3://.*/k: access denied"):
        anonymous.head("k")  # the object is private: unsigned requests are refused
    with pytest.raises(RemoteConfigError, match="not valid"):
        _remote.open_source(s3.url(), {"no_such_option": 1})


def test_error_mapping_names_the_url():
    """Client errors become RemoteError subclasses whose message names the URL."""
    assert isinstance(
        _remote.map_error(FileNotFoundError("x"), "s3://b/k", "read"), RemoteNotFoundError
    )
    denied = _remote.map_error(PermissionError("x"), "s3://b/k", "read")
    assert isinstance(denied, RemotePermissionError) and "s3://b/k" in str(denied)
    network = _remote.map_error(RuntimeError("reset"), "s3://b/k", "read")
    assert isinstance(network, RemoteNetworkError) and isinstance(network, OSError)
    assert "s3://b/k" in str(network) and "retry" in str(network)


def test_network_error_names_the_cause_the_client_buries():
    """obstore's first line says only "error sending request"; the cause in its
    debug text (a timeout, a reset, a body cut short) goes into the message."""
    text = "Generic S3 error: HTTP error: error sending request\n\ninner: HttpError {{ {} }}"
    for marker, cause in [
        ("kind: Timeout", "timed out"),
        ("kind: ConnectionReset", "connection reset"),
        ("error: IncompleteBody", "before its Content-Length"),
    ]:
        error = _remote.map_error(RuntimeError(text.format(marker)), "s3://b/k", "read")
        assert isinstance(error, RemoteNetworkError) and cause in str(error)
    assert "(" not in str(_remote.map_error(RuntimeError("odd"), "s3://b/k", "read")).split(":")[0]


def test_unreachable_endpoint_is_a_network_error(monkeypatch):
    """Nothing listening: RemoteNetworkError naming the object, within the client's bounds."""
    monkeypatch.setattr(_remote, "CLIENT_RETRIES", 0)
    options = {
        "endpoint": "http://127.0.0.1:9",
        "access_key_id": "a",
        "secret_access_key": "b",
        "region": "us-east-1",
        "connect_timeout": "1s",
    }
    with pytest.raises(RemoteNetworkError, match="s3://b/p/k"):
        _remote.open_source("s3://b/p", options).head("k")


def test_missing_obstore_says_how_to_install(monkeypatch):
    """Without obstore, opening a URL raises ImportError naming the extra."""
    import builtins

    real_import = builtins.__import__

    def refuse(name, *args, **kwargs):
        if name.startswith("obstore"):
            raise ImportError("no obstore")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", refuse)
    with pytest.raises(ImportError, match=r"loaderx\[remote\]"):
        _remote.open_source("s3://b/p")


def test_nth_call_fails_then_retried():
    """A fault on call n is retried (with recorded backoff); every attempt failing is a
    RemoteNetworkError that says it gave up."""
    waits = []
    faulty = FaultySource(MemorySource({"k": b"abc"}), [Fault(call=1, kind="fail")])
    source = RetryingSource(faulty, attempts=3, sleep=waits.append)
    assert source.get("k") == b"abc"  # call 0
    assert source.get("k") == b"abc"  # call 1 fails, call 2 succeeds
    assert source.retries == 1 and len(waits) == 1 and 0 <= waits[0] <= 0.05
    assert [f.call for f in faulty.injected] == [1]
    always = FaultySource(
        MemorySource({"k": b"abc"}), [Fault(call=n, kind="fail") for n in range(3)]
    )
    with pytest.raises(RemoteNetworkError, match="gave up after 3 attempts"):
        RetryingSource(always, attempts=3, sleep=waits.append).get("k")


def test_faults_are_deterministic():
    """Truncate, flip and per-method faults hit exactly the calls named, run after run."""
    faults = [
        Fault(call=0, kind="truncate", amount=2, method="get"),
        Fault(call=1, kind="flip", method="get"),
        Fault(call=0, kind="delay", seconds=0.01, method="head"),
    ]
    for _ in range(2):
        source = FaultySource(MemorySource({"k": b"abcdef"}), faults)
        assert source.head("k").size == 6
        assert source.get("k") == b"abcd"
        flipped = source.get("k")
        assert flipped != b"abcdef" and len(flipped) == 6
        assert source.get("k") == b"abcdef"
        assert source.calls == [("head", "k")] + [("get", "k")] * 3
    with pytest.raises(ValueError, match="not one of"):
        FaultySource(MemorySource({}), [Fault(call=0, kind="explode")])
