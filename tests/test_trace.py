"""The DataLoader's Chrome trace: well-formed events, sums that match
stats(), rings that stay bounded."""

import json

import numpy as np
import pytest

from loaderx import DataLoader, DenseDataset, Packing, RaggedDataset, from_iterator, from_numpy

STAGES = {"sample", "gather", "transform", "wait"}


@pytest.fixture
def dataset(tmp_path):
    data = np.arange(64 * 8, dtype=np.float32).reshape(64, 8)
    from_numpy(tmp_path / "x", data, codec="zstd", progress=False)
    with DenseDataset(tmp_path / "x") as opened:
        yield opened


def read_trace(path):
    document = json.loads(path.read_text())
    return document["traceEvents"]


def stage_sums(events):
    sums = dict.fromkeys(STAGES, 0.0)
    for event in events:
        if event["ph"] == "X":
            sums[event["name"]] += event["dur"] / 1e6
    return sums


def assert_well_formed(events):
    names = {
        event["tid"]: event["args"]["name"] for event in events if event["name"] == "thread_name"
    }
    complete = [event for event in events if event["ph"] == "X"]
    assert complete
    for event in complete:
        assert event["name"] in STAGES
        assert isinstance(event["ts"], (int, float)) and event["ts"] >= 0
        assert isinstance(event["dur"], (int, float)) and event["dur"] >= 0
        assert isinstance(event["pid"], int) and event["tid"] in names
        assert isinstance(event["args"]["step"], int)
    assert {event["ph"] for event in events} <= {"M", "X"}
    return names, complete


@pytest.mark.parametrize("workers", [0, 2])
def test_trace_sums_match_stats(dataset, tmp_path, workers):
    """Every interval stats() sums is in the trace while the ring holds them all."""
    loader = DataLoader({"x": dataset}, num_workers=workers, batch_size=8, trace_batches=1000)
    for _ in range(20):
        next(loader)
    loader.close()  # the workers stop: nothing changes between the two reads
    stats = loader.stats()
    path = tmp_path / "trace.json"
    written = loader.trace(path)
    names, complete = assert_well_formed(read_trace(path))
    assert written == len(complete)
    sums = stage_sums(complete)
    for stage in ("sample", "gather", "transform"):
        assert sums[stage] == pytest.approx(stats[f"{stage}_seconds"], abs=1e-5), stage
    assert sums["wait"] == pytest.approx(stats["stall_seconds"], abs=1e-5)
    waits = [event for event in complete if event["name"] == "wait"]
    assert [event["args"]["step"] for event in waits] == list(range(20))
    assert names[0] == "consumer"
    if workers:
        assert set(names.values()) - {"consumer"} <= {"loaderx-worker-0", "loaderx-worker-1"}
        gathered = [event for event in complete if event["name"] == "gather"]
        assert {event["tid"] for event in gathered} <= set(names) - {0}
        assert len(gathered) >= 20  # the delivered steps and any prefetched


def test_trace_ring_bound_holds(dataset, tmp_path):
    """A trace keeps at most trace_batches intervals per thread and stage, the last ones."""
    with DataLoader({"x": dataset}, num_workers=0, batch_size=8, trace_batches=3) as loader:
        for _ in range(10):
            next(loader)
        path = tmp_path / "trace.json"
        loader.trace(path)
    _, complete = assert_well_formed(read_trace(path))
    for stage in STAGES:
        steps = [event["args"]["step"] for event in complete if event["name"] == stage]
        assert steps == [7, 8, 9], stage


def test_packed_plans_are_sample_intervals(tmp_path):
    """A packer's plan (sampled under the pipeline lock) is traced as sample time."""
    documents = (np.arange(n % 7 + 1, dtype=np.int32) for n in range(200))
    from_iterator(tmp_path / "d", documents, progress=False)
    with RaggedDataset(tmp_path / "d") as tokens:
        loader = DataLoader(
            {"t": tokens}, num_workers=0, batch_size=2, packing=Packing(16), trace_batches=100
        )
        for _ in range(5):
            next(loader)
        loader.close()
        loader.trace(tmp_path / "trace.json")
        sums = stage_sums(read_trace(tmp_path / "trace.json"))
        assert sums["sample"] == pytest.approx(loader.stats()["sample_seconds"], abs=1e-5)


def test_trace_off_by_default_and_checked(dataset, tmp_path):
    with DataLoader({"x": dataset}, num_workers=0, batch_size=8) as loader:
        next(loader)
        with pytest.raises(ValueError, match="trace_batches=N"):
            loader.trace(tmp_path / "trace.json")
    assert not (tmp_path / "trace.json").exists()
    with pytest.raises(ValueError, match="trace_batches must be in 0..1,048,576"):
        DataLoader({"x": dataset}, trace_batches=-1)
    with pytest.raises(TypeError, match="trace_batches must be an int"):
        DataLoader({"x": dataset}, trace_batches=True)
