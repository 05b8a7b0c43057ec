"""A local S3-compatible server for the tests: moto's server app on
127.0.0.1 at a free port, in a thread of the test process, started once per
session and stopped at its end; ``s3`` gives each test a fresh bucket and
the standard AWS environment variables pointing at the server.

Every wait is bounded: the socket is bound before the thread starts (so
there is nothing to wait for), bucket creation has a timeout, and stopping
joins the thread for at most STOP_SECONDS. Without moto the tests that use
these fixtures skip and say why.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import itertools
import os
import threading
import urllib.request

import pytest

from loaderx._remote import ObjectInfo

STOP_SECONDS = 10.0
REQUEST_SECONDS = 10.0
_buckets = itertools.count()
# Every request the server answered, as (method, path, query string), in
# order: what a test counts to know how many requests a read cost.
REQUESTS: list[tuple[str, str, str]] = []
_requests_lock = threading.Lock()


def _counted(app):
    """The WSGI ``app``, logging each request into REQUESTS."""

    def counting(environ, start_response):
        entry = (environ["REQUEST_METHOD"], environ["PATH_INFO"], environ.get("QUERY_STRING", ""))
        with _requests_lock:
            REQUESTS.append(entry)
        return app(environ, start_response)

    return counting


def requests_to(bucket: str, since: int = 0) -> list[tuple[str, str, str]]:
    """The requests to ``bucket`` from position ``since`` of REQUESTS on."""
    with _requests_lock:
        seen = REQUESTS[since:]
    return [entry for entry in seen if entry[1].lstrip("/").split("/", 1)[0] == bucket]


@dataclasses.dataclass(frozen=True)
class S3:
    endpoint: str
    bucket: str

    def url(self, prefix: str = "") -> str:
        return f"s3://{self.bucket}/{prefix}".rstrip("/")


def _moto_app():
    try:
        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            MotoRequestHandler,
            create_backend_app,
        )
    except ImportError:
        pytest.skip("moto[server] is not installed: pip install 'loaderx[test]'")

    class QuietHandler(MotoRequestHandler):
        def log(self, type, message, *args):  # noqa: A002 (werkzeug's names)
            pass  # one line per request would drown the test output

    return DomainDispatcherApplication(create_backend_app), QuietHandler


@pytest.fixture(scope="session")
def s3_endpoint():
    """The server's endpoint URL, http://127.0.0.1:<port>."""
    from werkzeug.serving import make_server

    app, handler = _moto_app()
    server = make_server("127.0.0.1", 0, _counted(app), threaded=True, request_handler=handler)
    thread = threading.Thread(target=server.serve_forever, name="moto-s3", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(STOP_SECONDS)


def create_bucket(endpoint: str, bucket: str) -> None:
    request = urllib.request.Request(f"{endpoint}/{bucket}", method="PUT")
    with urllib.request.urlopen(request, timeout=REQUEST_SECONDS) as response:
        response.read()


def s3_environment(endpoint: str) -> dict[str, str]:
    """The variables obstore (and boto3) read for this server."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
    }


@pytest.fixture
def s3(s3_endpoint, monkeypatch):
    """A new empty bucket on the server, with the AWS_* variables set for this test."""
    pytest.importorskip("obstore", reason="obstore is not installed: pip install 'loaderx[remote]'")
    for name, value in s3_environment(s3_endpoint).items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    bucket = f"loaderx-test-{next(_buckets)}"
    create_bucket(s3_endpoint, bucket)
    return S3(s3_endpoint, bucket)


class MemorySource:
    """A dict-backed ObjectSource without a server: the fault and cache tests'
    double. ``gets`` counts the bodies and ranges it served."""

    url = "mem://test"

    def __init__(self, objects):
        self.objects = dict(objects)
        self.gets = 0

    def head(self, key):
        data = self.objects[key]
        return ObjectInfo(key, len(data), hashlib.md5(data).hexdigest())

    def get(self, key, etag=None):
        self.gets += 1
        return self.objects[key]

    def get_range(self, key, start, length, etag=None):
        self.gets += 1
        return self.objects[key][start : start + length]

    def put(self, key, data):
        self.objects[key] = bytes(data)
        return self.head(key)

    def list(self, prefix=""):
        return [self.head(k) for k in sorted(self.objects) if k.startswith(prefix)]

    def delete(self, key):
        del self.objects[key]


def bytes_under(directory) -> int:
    """The bytes of the files under a cache ``directory``, a consistent
    snapshot: taken holding the cache's directory lock, as any process
    sharing it would."""
    directory = str(directory)
    lock = os.path.join(directory, "lock")
    if not os.path.exists(lock):
        return 0
    fd = os.open(lock, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        total = 0
        for root, _, files in os.walk(directory):
            total += sum(os.lstat(os.path.join(root, name)).st_size for name in files)
        return total
    finally:
        os.close(fd)
