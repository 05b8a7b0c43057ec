"""The network seam: every call loaderx makes to an object store goes through
an ``ObjectSource`` (``head``, ``get``, ``get_range``, ``put``, ``list``,
``delete``), so tests swap in a ``FaultySource`` that fails, truncates or
stalls a chosen call, deterministically.

``open_source(url, storage_options)`` parses a dataset URL (``s3://``,
``gs://``, ``az://``, ``http(s)://``, ``file://``) and builds the obstore
store behind a ``StoreSource``. Invariant: no exception of the client escapes
this module; each becomes a ``RemoteError`` (an ``OSError``) whose message
names the URL and says what to do. obstore is an optional dependency (the
``[remote]`` extra) imported only when a store is opened.
"""

from __future__ import annotations

import dataclasses
import datetime
import errno
import os
import random
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any, Callable, Protocol, TypeVar, Union

SCHEMES = ("s3", "gs", "az", "http", "https", "file")
# Below this a put is one request; above it obstore uploads parts of this
# size in parallel (S3's smallest part is 5 MiB, except the last).
MULTIPART_BYTES = 8 * 1024 * 1024
PART_BYTES = 8 * 1024 * 1024
# obstore retries 5xx, connection errors and timeouts itself with exponential
# backoff and jitter; these bound how long one call can take before it fails.
CLIENT_RETRIES = 3
CLIENT_RETRY_SECONDS = 60
CLIENT_TIMEOUT = "60s"
CLIENT_CONNECT_TIMEOUT = "10s"
_LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
# Keys of storage_options that are obstore client options, not store config.
_CLIENT_KEYS = frozenset(
    {
        "allow_http",
        "allow_invalid_certificates",
        "connect_timeout",
        "default_headers",
        "http1_only",
        "http2_only",
        "pool_idle_timeout",
        "proxy_url",
        "timeout",
        "read_timeout",
        "user_agent",
        "root_certificate",
    }
)


# ---- errors


class RemoteError(OSError):
    """An object-store call failed; ``url`` names the object (or the dataset)."""

    default_errno = errno.EIO

    def __init__(self, message: str, url: str = ""):
        super().__init__(self.default_errno, message)
        self.url = url

    def __str__(self) -> str:
        return str(self.strerror)

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        return (type(self), (str(self), self.url))


class RemoteNotFoundError(RemoteError, FileNotFoundError):
    """The object (or its bucket) does not exist at that URL."""

    default_errno = errno.ENOENT


class RemotePermissionError(RemoteError, PermissionError):
    """The credentials are missing, wrong, or not allowed this call."""

    default_errno = errno.EACCES


class RemoteNetworkError(RemoteError, ConnectionError):
    """The store did not answer (connection refused or reset, timeouts, 5xx)
    after every retry; transient, so a later call may succeed."""

    default_errno = errno.ECONNABORTED


class RemoteIntegrityError(RemoteError):
    """The bytes received are not the object's: short, long, or a checksum
    that does not match, after every refetch."""


class RemoteChangedError(RemoteError):
    """The object changed (another etag) while loaderx was reading it."""

    default_errno = errno.ESTALE


class RemoteConfigError(RemoteError, ValueError):
    """The URL or the storage options cannot open a store."""

    default_errno = errno.EINVAL


# ---- URLs


@dataclasses.dataclass(frozen=True)
class RemoteURL:
    """A parsed dataset URL: ``bucket`` is the bucket (s3, gs), the container
    (az), the host (http) or empty (file); ``prefix`` has no leading or
    trailing slash."""

    scheme: str
    bucket: str
    prefix: str
    url: str

    def join(self, key: str) -> str:
        """The full URL of ``key`` under this prefix (for messages and cache keys)."""
        return self.url.rstrip("/") + "/" + key.lstrip("/")


def parse_url(url: str) -> RemoteURL:
    """``url`` split into scheme, bucket and prefix, or RemoteConfigError."""
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise RemoteConfigError(
            f"cannot open {url!r}: the scheme {scheme or '(none)'!r} is not one of "
            f"{', '.join(s + '://' for s in SCHEMES)}; give one of them",
            url,
        )
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise RemoteConfigError(
                f"cannot open {url!r}: a file:// URL names a local path "
                "(file:///absolute/path), not a host",
                url,
            )
        return RemoteURL(scheme, "", parts.path.rstrip("/") or "/", url)
    if not parts.netloc:
        raise RemoteConfigError(
            f"cannot open {url!r}: it names no bucket (or host); write "
            f"{scheme}://<bucket>/<prefix>",
            url,
        )
    return RemoteURL(scheme, parts.netloc, parts.path.strip("/"), url)


def is_remote(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a URL this module opens (rather than a local path)."""
    text = os.fspath(path)
    return "://" in text and urllib.parse.urlsplit(text).scheme.lower() in SCHEMES


# ---- the seam


@dataclasses.dataclass(frozen=True)
class ObjectInfo:
    """What ``head`` and ``list`` say of an object; ``key`` is relative to the
    source's prefix. ``etag`` (or, without one, the size and modification
    time) identifies the object's version."""

    key: str
    size: int
    etag: str | None
    modified_ns: int = 0

    @property
    def version(self) -> str:
        """A string that changes whenever the object does."""
        return self.etag if self.etag else f"size={self.size},mtime={self.modified_ns}"


def tiling_problem(layout: dict[str, tuple[int, int]], size: object) -> str | None:
    """Why the members of a bundle (``layout``: file name -> (offset, size))
    do not tile it from 0 to ``size``, or None when they do: in offset order
    each starts where the previous one ends and the last ends at ``size``."""
    end = 0
    for member in sorted(layout, key=lambda name: (layout[name][0], name)):
        offset, length = layout[member]
        if "/" in member or member in ("", ".", "..") or length < 0:
            return f"member {member!r} is not a file name with a size"
        if offset != end:
            return (
                f"member {member!r} starts at {offset}, but the members before it end at {end}: "
                "the offsets must tile the bundle"
            )
        end += length
    if not layout or size != end or isinstance(size, bool):
        return f"the bundle has size {size!r}, but its members add up to {end}"
    return None


Data = Union[bytes, bytearray, memoryview, str, "os.PathLike[str]"]


class ObjectSource(Protocol):
    """The calls loaderx makes to an object store, keys relative to ``url``.
    ``etag`` on a read makes it fail with RemoteChangedError when the object
    is no longer that version."""

    url: str

    def head(self, key: str) -> ObjectInfo: ...

    def get(self, key: str, etag: str | None = None) -> bytes: ...

    def get_range(self, key: str, start: int, length: int, etag: str | None = None) -> bytes: ...

    def put(self, key: str, data: Data) -> ObjectInfo: ...

    def list(self, prefix: str = "") -> list[ObjectInfo]: ...

    def delete(self, key: str) -> None: ...


def _obstore() -> Any:
    try:
        import obstore  # optional dependency
        import obstore.store  # optional dependency
    except ImportError as exc:
        raise ImportError(
            "reading or writing a dataset in object storage needs obstore: "
            "pip install 'loaderx[remote]'"
        ) from exc
    return obstore


def _loopback(endpoint: str) -> bool:
    host = urllib.parse.urlsplit(endpoint).hostname or ""
    return host in _LOOPBACK_HOSTS


def split_options(
    remote: RemoteURL, storage_options: dict[str, Any] | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(store config, client options) for ``remote``: ``storage_options``
    split by key, plus plain HTTP allowed when the S3 endpoint (given, or
    AWS_ENDPOINT_URL) is http:// on this machine. A plain-HTTP endpoint
    elsewhere must be allowed explicitly (``allow_http=True``)."""
    options = dict(storage_options or {})
    client = {k: options.pop(k) for k in list(options) if k in _CLIENT_KEYS}
    client.setdefault("timeout", CLIENT_TIMEOUT)
    client.setdefault("connect_timeout", CLIENT_CONNECT_TIMEOUT)
    if remote.scheme == "s3":
        endpoint = str(
            options.get("endpoint")
            or options.get("endpoint_url")
            or os.environ.get("AWS_ENDPOINT_URL")
            or os.environ.get("AWS_ENDPOINT")
            or ""
        )
        if "endpoint_url" in options:
            options["endpoint"] = options.pop("endpoint_url")
        if endpoint.startswith("http://") and "allow_http" not in client:
            if not _loopback(endpoint):
                raise RemoteConfigError(
                    f"cannot open {remote.url!r}: the endpoint {endpoint} is plain HTTP "
                    "on another machine; use https, or pass storage_options="
                    "{'allow_http': True} if you mean it",
                    remote.url,
                )
            client["allow_http"] = True
    if remote.scheme == "http":
        client.setdefault("allow_http", True)
    return options, client


def build_store(remote: RemoteURL, storage_options: dict[str, Any] | None = None) -> Any:
    """The obstore store of ``remote`` with its prefix applied: credentials
    and endpoint from the environment (obstore reads AWS_*, GOOGLE_*,
    AZURE_* itself) overridden by ``storage_options``."""
    obstore = _obstore()
    stores = obstore.store
    config, client = split_options(remote, storage_options)
    retry = {
        "max_retries": CLIENT_RETRIES,
        "retry_timeout": datetime.timedelta(seconds=CLIENT_RETRY_SECONDS),
    }
    common: dict[str, Any] = {"client_options": client, "retry_config": retry}
    prefix = remote.prefix or None
    try:
        if remote.scheme == "s3":
            return stores.S3Store(remote.bucket, prefix=prefix, config=config, **common)
        if remote.scheme == "gs":
            return stores.GCSStore(remote.bucket, prefix=prefix, config=config, **common)
        if remote.scheme == "az":
            return stores.AzureStore(remote.bucket, prefix=prefix, config=config, **common)
        if remote.scheme in ("http", "https"):
            return stores.HTTPStore.from_url(remote.url.rstrip("/"), **common)
        if not os.path.isdir(remote.prefix):
            raise RemoteNotFoundError(
                f"cannot open {remote.url}: no directory {remote.prefix} on this machine; "
                "check the URL (file:///absolute/path)",
                remote.url,
            )
        return stores.LocalStore(remote.prefix)
    except RemoteError:
        raise
    except Exception as exc:  # the client's own error types, mapped below
        raise map_error(exc, remote.url, "open") from exc


def map_error(exc: BaseException, url: str, what: str) -> RemoteError:
    """The RemoteError a client exception ``exc`` of call ``what`` on ``url`` becomes."""
    if isinstance(exc, RemoteError):
        return exc
    name = type(exc).__name__
    first = str(exc).split("\n", 1)[0][:300]
    if isinstance(exc, FileNotFoundError) or name == "NotFoundError":
        return RemoteNotFoundError(
            f"cannot {what} {url}: no such object (or bucket); check the URL", url
        )
    if name in ("PermissionDeniedError", "UnauthenticatedError") or isinstance(
        exc, PermissionError
    ):
        return RemotePermissionError(
            f"cannot {what} {url}: access denied ({first}); set AWS_ACCESS_KEY_ID/"
            "AWS_SECRET_ACCESS_KEY (or the store's credentials) or storage_options",
            url,
        )
    if name == "PreconditionError":
        return RemoteChangedError(
            f"cannot {what} {url}: the object changed while it was read; "
            "open the dataset again to read its new version",
            url,
        )
    if name in ("UnknownConfigurationKeyError", "InvalidPathError") or isinstance(exc, ValueError):
        return RemoteConfigError(f"cannot {what} {url}: {first}; fix storage_options", url)
    return RemoteNetworkError(
        f"cannot {what} {url} after {CLIENT_RETRIES} retries{network_cause(str(exc))}: "
        f"{first}; check the endpoint and the network, then retry",
        url,
    )


# What the client's error chain (its debug text, after the first line) says
# went wrong, where the first line says only "error sending request".
_CAUSES = (
    ("TimedOut", "timed out"),
    ("kind: Timeout", "timed out"),
    ("IncompleteBody", "the body ended before its Content-Length"),
    ("ConnectionReset", "connection reset by the server"),
    ("ConnectionRefused", "connection refused"),
    ("UnexpectedEof", "the connection closed early"),
)


def network_cause(text: str) -> str:
    """`` (<cause>)`` named by the client's error text, or empty if it names none."""
    for marker, cause in _CAUSES:
        if marker in text:
            return f" ({cause})"
    return ""


def _info(meta: Any) -> ObjectInfo:
    modified = meta.get("last_modified")
    ns = int(modified.timestamp() * 1e9) if modified is not None else 0
    return ObjectInfo(str(meta["path"]), int(meta["size"]), meta.get("e_tag"), ns)


class StoreSource:
    """The production ``ObjectSource``: obstore calls on one store."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None):
        self.remote = parse_url(url)
        self.url = url.rstrip("/")
        self.store = build_store(self.remote, storage_options)
        self._obstore = _obstore()

    def _call(self, key: str, what: str, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except Exception as exc:  # the client's own error types
            raise map_error(exc, self.remote.join(key), what) from exc

    def head(self, key: str) -> ObjectInfo:
        meta = self._call(key, "look up", lambda: self._obstore.head(self.store, key))
        return dataclasses.replace(_info(meta), key=key)

    def get(self, key: str, etag: str | None = None) -> bytes:
        options = {"if_match": etag} if etag else None

        def call() -> bytes:
            return bytes(self._obstore.get(self.store, key, options=options).bytes())

        return bytes(self._call(key, "read", call))

    def get_range(self, key: str, start: int, length: int, etag: str | None = None) -> bytes:
        if length <= 0:
            return b""
        options: dict[str, Any] = {"range": (start, start + length)}
        if etag:
            options["if_match"] = etag

        def call() -> bytes:
            return bytes(self._obstore.get(self.store, key, options=options).bytes())

        return bytes(self._call(key, f"read bytes {start}..{start + length} of", call))

    def put(self, key: str, data: Data) -> ObjectInfo:
        body: Any = data
        size = len(data) if isinstance(data, (bytes, bytearray, memoryview)) else None
        if size is None:
            body = Path(os.fspath(data))  # type: ignore[arg-type]
            size = body.stat().st_size
        multipart = size > MULTIPART_BYTES

        def call() -> Any:
            return self._obstore.put(
                self.store, key, body, use_multipart=multipart, chunk_size=PART_BYTES
            )

        result = self._call(key, "upload", call)
        return ObjectInfo(key, size, result.get("e_tag"))

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        def call() -> list[ObjectInfo]:
            stream = self._obstore.list(self.store, prefix or None, chunk_size=1000)
            return [_info(meta) for chunk in stream for meta in chunk]

        return sorted(self._call(prefix, "list", call), key=lambda info: info.key)

    def delete(self, key: str) -> None:
        self._call(key, "delete", lambda: self._obstore.delete(self.store, key))


def open_source(url: str, storage_options: dict[str, Any] | None = None) -> StoreSource:
    """The ``ObjectSource`` of a dataset URL (see ``StoreSource``)."""
    return StoreSource(url, storage_options)


# ---- retries above the client, and faults for tests

T = TypeVar("T")
# Calls the client already retried fail here again only if they are
# transient; a second round is short (the client spent its own budget).
RETRY_ATTEMPTS = 3
RETRY_BASE_SECONDS = 0.05
RETRY_MAX_SECONDS = 2.0


class RetryingSource:
    """An ``ObjectSource`` that retries RemoteNetworkError with exponential
    backoff and full jitter (seeded, so a test replays the same waits), then
    raises the last error, which names the object and the attempts."""

    def __init__(
        self,
        inner: ObjectSource,
        attempts: int = RETRY_ATTEMPTS,
        base_seconds: float = RETRY_BASE_SECONDS,
        seed: int = 0,
        sleep: Callable[[float], None] = time.sleep,
    ):
        if attempts < 1:
            raise ValueError(f"attempts must be at least 1, got {attempts}")
        self.inner = inner
        self.url = inner.url
        self.attempts = attempts
        self.base_seconds = base_seconds
        self.retries = 0  # how many calls were repeated, for tests and stats
        self._random = random.Random(seed)
        self._sleep = sleep
        self._lock = threading.Lock()

    def _retry(self, call: Callable[[], T]) -> T:
        for attempt in range(self.attempts):
            try:
                return call()
            except RemoteNetworkError as exc:
                if attempt + 1 == self.attempts:
                    raise RemoteNetworkError(
                        f"{exc} (gave up after {self.attempts} attempts)", exc.url
                    ) from exc
                with self._lock:
                    self.retries += 1
                    cap = min(RETRY_MAX_SECONDS, self.base_seconds * 2**attempt)
                    wait = self._random.uniform(0, cap)
                self._sleep(wait)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def head(self, key: str) -> ObjectInfo:
        return self._retry(lambda: self.inner.head(key))

    def get(self, key: str, etag: str | None = None) -> bytes:
        return self._retry(lambda: self.inner.get(key, etag))

    def get_range(self, key: str, start: int, length: int, etag: str | None = None) -> bytes:
        return self._retry(lambda: self.inner.get_range(key, start, length, etag))

    def put(self, key: str, data: Data) -> ObjectInfo:
        return self._retry(lambda: self.inner.put(key, data))

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        return self._retry(lambda: self.inner.list(prefix))

    def delete(self, key: str) -> None:
        self._retry(lambda: self.inner.delete(key))


@dataclasses.dataclass(frozen=True)
class Fault:
    """What ``FaultySource`` does to its call number ``call`` (0-based, counted
    over every method, or only over ``method`` when given): ``"fail"`` raises
    RemoteNetworkError, ``"truncate"`` returns the body short by ``amount``
    bytes, ``"flip"`` flips one bit of it, ``"delay"`` sleeps ``seconds`` first."""

    call: int
    kind: str
    method: str | None = None
    amount: int = 1
    seconds: float = 0.0


class FaultySource:
    """An ``ObjectSource`` for tests that applies ``faults`` to chosen calls of
    ``inner``; the same faults on the same calls give the same run."""

    KINDS = ("fail", "truncate", "flip", "delay")

    def __init__(self, inner: ObjectSource, faults: list[Fault] | None = None):
        for fault in faults or []:
            if fault.kind not in self.KINDS:
                raise ValueError(f"fault kind {fault.kind!r} is not one of {self.KINDS}")
        self.inner = inner
        self.url = inner.url
        self.faults = list(faults or [])
        self.calls: list[tuple[str, str]] = []  # (method, key) of every call, in order
        self.injected: list[Fault] = []
        self._lock = threading.Lock()

    def _matching(self, method: str, key: str) -> list[Fault]:
        with self._lock:
            index = len(self.calls)
            per_method = sum(1 for m, _ in self.calls if m == method)
            self.calls.append((method, key))
            hits = [
                f
                for f in self.faults
                if (f.method is None and f.call == index)
                or (f.method == method and f.call == per_method)
            ]
            self.injected.extend(hits)
        return hits

    def _run(self, method: str, key: str, call: Callable[[], T]) -> T:
        faults = self._matching(method, key)
        for fault in faults:
            if fault.kind == "delay":
                time.sleep(fault.seconds)
            if fault.kind == "fail":
                raise RemoteNetworkError(
                    f"cannot {method} {self.url}/{key}: injected fault (connection reset)",
                    f"{self.url}/{key}",
                )
        result = call()
        for fault in faults:
            if isinstance(result, bytes) and fault.kind == "truncate":
                result = result[: max(0, len(result) - fault.amount)]  # type: ignore[assignment]
            if isinstance(result, bytes) and fault.kind == "flip" and result:
                flipped = bytearray(result)
                flipped[len(flipped) // 2] ^= 0x10
                result = bytes(flipped)  # type: ignore[assignment]
        return result

    def head(self, key: str) -> ObjectInfo:
        return self._run("head", key, lambda: self.inner.head(key))

    def get(self, key: str, etag: str | None = None) -> bytes:
        return self._run("get", key, lambda: self.inner.get(key, etag))

    def get_range(self, key: str, start: int, length: int, etag: str | None = None) -> bytes:
        return self._run("get_range", key, lambda: self.inner.get_range(key, start, length, etag))

    def put(self, key: str, data: Data) -> ObjectInfo:
        return self._run("put", key, lambda: self.inner.put(key, data))

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        return self._run("list", prefix, lambda: self.inner.list(prefix))

    def delete(self, key: str) -> None:
        self._run("delete", key, lambda: self.inner.delete(key))
