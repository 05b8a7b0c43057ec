"""A DataLoader's counters for Prometheus (the ``metrics`` extra:
``pip install 'loaderx[metrics]'``, which brings ``prometheus-client``).

``register(loader)`` adds a collector to a registry (the client's default
one unless given): every scrape reads ``loader.stats()``, the bytes this
process read from storage and, for datasets at a URL, each cache's state, so
the figures are those of the moment of the scrape and nothing runs between
scrapes. ``serve(loader, port)`` also starts the client's HTTP server on
127.0.0.1 (another address only when asked). The collector holds the loader
weakly: registering it does not keep a dropped loader alive, and a dead
loader's collector reports nothing.

Metrics (all with the label ``loader``, the name given to ``register``):
``loaderx_batches_total``, ``loaderx_stall_seconds_total``,
``loaderx_stage_seconds_total{stage}`` (sample, gather, transform: summed
over the workers), ``loaderx_step``, ``loaderx_queue_depth``,
``loaderx_process_read_bytes_total`` (page-cache misses of the whole
process, from ``/proc/self/io``), and per remote dataset (label
``dataset``, its URL) ``loaderx_cache_resident_bytes``,
``loaderx_cache_budget_bytes``, ``loaderx_cache_fetches_total``,
``loaderx_cache_fetched_bytes_total``, ``loaderx_cache_hits_total``,
``loaderx_cache_misses_total``, ``loaderx_cache_evictions_total``.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Any

from ._trace import process_read_bytes
from .dataloader import DataLoader

__all__ = ["LoaderCollector", "register", "serve"]

_CACHE_COUNTERS = (
    ("fetches", "fetches_total", "downloads of a unit (refetches of bad bodies included)"),
    ("bytes_fetched", "fetched_bytes_total", "bytes downloaded"),
    ("hits", "hits_total", "reads that found their unit resident"),
    ("misses", "misses_total", "reads that had to fetch their unit"),
    ("evictions", "evictions_total", "units evicted to stay within the budget"),
)


def _client() -> Any:
    """The client module (its ``core`` loaded), or ImportError with the remedy."""
    try:
        import prometheus_client  # optional dependency
        import prometheus_client.core  # optional dependency
    except ImportError as exc:
        raise ImportError(
            "loaderx.metrics needs prometheus-client: pip install 'loaderx[metrics]'"
        ) from exc
    return prometheus_client


class LoaderCollector:
    """A Prometheus collector of one DataLoader's counters (see the module)."""

    def __init__(self, loader: DataLoader, name: str = "default") -> None:
        if not isinstance(loader, DataLoader):
            raise TypeError(f"loader must be a loaderx.DataLoader, got {type(loader).__name__}")
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty string (the loader label), got {name!r}")
        self.core = _client().core
        self.loader = weakref.ref(loader)
        self.name = name

    def collect(self) -> Iterator[Any]:
        loader = self.loader()
        if loader is None:
            return
        core, labels = self.core, [self.name]
        stats = loader.stats()
        for key, help_text in (
            ("batches", "batches delivered to the consumer"),
            ("stall_seconds", "seconds the consumer waited inside next()"),
        ):
            family = core.CounterMetricFamily(f"loaderx_{key}", help_text, labels=["loader"])
            family.add_metric(labels, stats[key])
            yield family
        stages = core.CounterMetricFamily(
            "loaderx_stage_seconds",
            "worker seconds per stage, summed over the workers",
            labels=["loader", "stage"],
        )
        for stage in ("sample", "gather", "transform"):
            stages.add_metric([self.name, stage], stats[f"{stage}_seconds"])
        yield stages
        for key, help_text in (
            ("step", "the step of the batch the next next() returns"),
            ("queue_depth", "batches ready and waiting for the consumer"),
        ):
            gauge = core.GaugeMetricFamily(f"loaderx_{key}", help_text, labels=["loader"])
            gauge.add_metric(labels, stats[key])
            yield gauge
        read = process_read_bytes()
        if read is not None:
            family = core.CounterMetricFamily(
                "loaderx_process_read_bytes",
                "bytes this process read from storage (page-cache misses, /proc/self/io)",
                labels=["loader"],
            )
            family.add_metric(labels, read)
            yield family
        yield from self._caches(loader.cache_stats())

    def _caches(self, caches: dict[str, dict[str, float]]) -> Iterator[Any]:
        if not caches:
            return
        core, names = self.core, ["loader", "dataset"]
        for key, metric, help_text in (
            ("bytes_resident", "resident_bytes", "bytes of the cache directory's files"),
            ("cache_bytes", "budget_bytes", "the cache's byte budget"),
        ):
            gauge = core.GaugeMetricFamily(f"loaderx_cache_{metric}", help_text, labels=names)
            for url, state in caches.items():
                gauge.add_metric([self.name, url], state[key])
            yield gauge
        for key, metric, help_text in _CACHE_COUNTERS:
            # The client appends _total to a counter's name itself.
            family = core.CounterMetricFamily(
                f"loaderx_cache_{metric.removesuffix('_total')}", help_text, labels=names
            )
            for url, state in caches.items():
                family.add_metric([self.name, url], state[key])
            yield family


def register(loader: DataLoader, registry: Any = None, name: str = "default") -> LoaderCollector:
    """Registers a collector of ``loader``'s counters in ``registry`` (the
    client's default ``REGISTRY`` when None); returns it, for
    ``registry.unregister``. ``name`` is the ``loader`` label."""
    collector = LoaderCollector(loader, name)
    if registry is None:
        registry = collector.core.REGISTRY
    registry.register(collector)
    return collector


def serve(
    loader: DataLoader,
    port: int,
    addr: str = "127.0.0.1",
    registry: Any = None,
    name: str = "default",
) -> Any:
    """Registers ``loader`` (as ``register`` does) and serves the registry
    over HTTP at ``addr:port`` with the client's ``start_http_server``;
    returns its (server, thread): ``server.shutdown()`` stops it."""
    client = _client()
    registry = client.REGISTRY if registry is None else registry
    register(loader, registry, name)
    return client.start_http_server(port, addr=addr, registry=registry)
