"""loaderx.metrics: a DataLoader's stats(), bytes read and remote cache state
as Prometheus metrics, read through the client's own registry."""

import gc
import urllib.request

import numpy as np
import pytest

from loaderx import DataLoader, DenseDataset, from_numpy

prometheus_client = pytest.importorskip("prometheus_client")
metrics = pytest.importorskip("loaderx.metrics")


@pytest.fixture
def dataset(tmp_path):
    from_numpy(tmp_path / "x", np.arange(640, dtype=np.float32).reshape(80, 8), progress=False)
    with DenseDataset(tmp_path / "x") as opened:
        yield opened


def value(registry, name, **labels):
    return registry.get_sample_value(name, {"loader": "default", **labels})


def test_counters_are_those_of_stats(dataset):
    """Every scrape reads stats(): the counters equal it after the loader stopped."""
    registry = prometheus_client.CollectorRegistry()
    loader = DataLoader({"x": dataset}, num_workers=2, batch_size=8)
    metrics.register(loader, registry)
    for _ in range(6):
        next(loader)
    loader.close()
    stats = loader.stats()
    assert value(registry, "loaderx_batches_total") == stats["batches"] == 6
    assert value(registry, "loaderx_step") == 6
    assert value(registry, "loaderx_stall_seconds_total") == pytest.approx(stats["stall_seconds"])
    for stage in ("sample", "gather", "transform"):
        got = value(registry, "loaderx_stage_seconds_total", stage=stage)
        assert got == pytest.approx(stats[f"{stage}_seconds"]), stage
    assert value(registry, "loaderx_queue_depth") == 0
    assert value(registry, "loaderx_process_read_bytes_total") >= 0
    assert value(registry, "loaderx_cache_resident_bytes", dataset="any") is None  # local only


def test_remote_cache_state(tmp_path):
    """A dataset at a URL adds its cache's resident bytes, budget, fetches, hits, evictions."""
    from_numpy(tmp_path / "x", np.zeros((100, 8), np.float32), progress=False)
    url = (tmp_path / "x").as_uri()
    registry = prometheus_client.CollectorRegistry()
    with DenseDataset(url, cache_dir=tmp_path / "cache") as remote:
        with DataLoader({"x": remote}, num_workers=1, batch_size=8) as loader:
            metrics.register(loader, registry, name="train")
            next(loader)
            state = loader.cache_stats()[url]
            labels = {"loader": "train", "dataset": url}
            get = registry.get_sample_value
            assert get("loaderx_cache_resident_bytes", labels) == state["bytes_resident"] > 0
            assert get("loaderx_cache_budget_bytes", labels) == state["cache_bytes"]
            assert get("loaderx_cache_fetches_total", labels) == state["fetches"] >= 1
            assert get("loaderx_cache_fetched_bytes_total", labels) == state["bytes_fetched"]
            assert get("loaderx_cache_hits_total", labels) == state["hits"]
            assert get("loaderx_cache_misses_total", labels) == state["misses"]
            assert get("loaderx_cache_evictions_total", labels) == state["evictions"]
            assert get("loaderx_batches_total", {"loader": "train"}) == 1


def test_the_collector_does_not_keep_the_loader_alive(dataset):
    registry = prometheus_client.CollectorRegistry()
    loader = DataLoader({"x": dataset}, num_workers=0, batch_size=8)
    metrics.register(loader, registry)
    next(loader)
    assert value(registry, "loaderx_batches_total") == 1
    del loader
    gc.collect()
    assert value(registry, "loaderx_batches_total") is None


def test_serve_on_localhost(dataset):
    """serve() exposes the registry over HTTP on 127.0.0.1 (bounded wait)."""
    registry = prometheus_client.CollectorRegistry()
    with DataLoader({"x": dataset}, num_workers=0, batch_size=8) as loader:
        next(loader)
        server, thread = metrics.serve(loader, 0, registry=registry)
        try:
            port = server.server_address[1]
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
                text = reply.read().decode()
        finally:
            server.shutdown()
            server.server_close()
            thread.join(10)
    assert 'loaderx_batches_total{loader="default"} 1.0' in text
    assert 'loaderx_stage_seconds_total{loader="default",stage="gather"}' in text


def test_bad_arguments(dataset):
    with pytest.raises(TypeError, match="loader must be a loaderx.DataLoader"):
        metrics.register(dataset, prometheus_client.CollectorRegistry())
    with DataLoader({"x": dataset}, num_workers=0, batch_size=8) as loader:
        with pytest.raises(ValueError, match="name must be a non-empty string"):
            metrics.register(loader, prometheus_client.CollectorRegistry(), name="")
