"""loaderx.ray on a local Ray cluster started here (ray.init(num_cpus=2),
once for the module): parallel conversion of a ray.data.Dataset to sharded
loaderx datasets, deterministic block order, resume, and reading back
through the Datasource."""

from __future__ import annotations

import os

import numpy as np
import pytest

ray = pytest.importorskip(
    "ray", reason="the [ray] extra is not installed (pip install -e '.[test,ray]')"
)

from loaderx import DenseDataset, RaggedDataset, from_numpy, shards  # noqa: E402
from loaderx.ray import read_dataset, write_dataset  # noqa: E402

ROWS = 300


@pytest.fixture(scope="module", autouse=True)
def cluster():
    # The README's Ray block (run by tests/test_examples.py in this process)
    # may have started a default cluster: start ours on a clean slate.
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield
    ray.shutdown()


def items(count: int = ROWS) -> list:
    return [
        {
            "x": np.full((2, 3), i, np.float32),
            "label": i,
            "tokens": np.arange(i % 5, dtype=np.int32),
            "text": "é" * (i % 3),
            "blob": bytes([i % 256]) * (i % 4),
        }
        for i in range(count)
    ]


def expected_columns(count: int = ROWS) -> dict:
    return {
        "x": np.repeat(np.arange(count, dtype=np.float32), 6).reshape(count, 2, 3),
        "label": np.arange(count),
        "tokens": [np.arange(i % 5, dtype=np.int32) for i in range(count)],
        "text": [("é" * (i % 3)).encode() for i in range(count)],
        "blob": [bytes([i % 256]) * (i % 4) for i in range(count)],
    }


def shuffled_pipeline(count: int = ROWS):
    """Blocks whose tasks finish out of order: a map that sleeps longer on early
    blocks, in its own operator (other resources: not fused with the write)."""
    import time

    def slow_start(batch):
        time.sleep(0.2 if batch["label"][0] < count // 3 else 0.0)
        return batch

    return ray.data.from_items(items(count), override_num_blocks=6).map_batches(
        slow_start, batch_size=None, num_cpus=0.5
    )


def test_a_dataset_converts_column_by_column_in_block_order(tmp_path):
    """Each column becomes one sharded dataset, dense or ragged by its Arrow
    type, holding the rows in the Ray dataset's order, one shard per task."""
    rows = write_dataset(shuffled_pipeline(), tmp_path / "out", concurrency=2)
    assert rows == dict.fromkeys(("x", "label", "tokens", "text", "blob"), ROWS)
    expected = expected_columns()
    with (
        DenseDataset(tmp_path / "out" / "x") as x,
        DenseDataset(tmp_path / "out" / "label") as label,
    ):
        np.testing.assert_array_equal(x[:], expected["x"])
        np.testing.assert_array_equal(label[:], expected["label"])
        assert (
            len(x.store.shards) == len(shards.read_manifest(tmp_path / "out" / "label").names) > 1
        )
    with RaggedDataset(tmp_path / "out" / "tokens") as tokens:
        assert tokens.dtype == np.int32
        for got, want in zip(tokens[:], expected["tokens"]):
            np.testing.assert_array_equal(got, want)
    for name in ("text", "blob"):
        with RaggedDataset(tmp_path / "out" / name) as column:
            assert column.dtype == np.uint8
            assert [bytes(record) for record in column[:]] == expected[name]


def test_the_conversion_is_deterministic(tmp_path):
    """Two runs of the same pipeline write identical manifests."""
    for run in ("a", "b"):
        write_dataset(
            shuffled_pipeline(), tmp_path / run, columns=["label", "tokens"], concurrency=2
        )
    for name in ("label", "tokens"):
        assert (tmp_path / "a" / name / "manifest.msgpack").read_bytes() == (
            tmp_path / "b" / name / "manifest.msgpack"
        ).read_bytes()


def test_an_interrupted_conversion_resumes_keeping_complete_shards(tmp_path):
    """A run that fails midway leaves no dataset; the rerun with resume=True
    keeps the shards already complete and commits the rest."""
    ids = ray.data.range(1000, override_num_blocks=8)

    def fail_late(batch):
        if batch["id"][0] >= 750:
            raise RuntimeError("worker lost")
        return batch

    with pytest.raises(Exception, match="worker lost"):
        write_dataset(ids.map_batches(fail_late, batch_size=None), tmp_path / "out", concurrency=1)
    column = tmp_path / "out" / "id"
    assert not shards.is_sharded(column)
    kept = {k: os.stat(column / shards.shard_name(k)).st_ino for k in shards.written_shards(column)}
    assert kept, "the first run wrote no shard before failing"
    with pytest.raises(FileExistsError, match="resume=True"):
        write_dataset(ids, tmp_path / "out")
    assert write_dataset(ids, tmp_path / "out", resume=True) == {"id": 1000}
    assert {k: os.stat(column / shards.shard_name(k)).st_ino for k in kept} == kept
    with DenseDataset(column) as dataset:
        np.testing.assert_array_equal(dataset[:], np.arange(1000))
    with pytest.raises(FileExistsError, match="committed"):
        write_dataset(ids, tmp_path / "out", resume=True)


def test_read_back_as_a_ray_dataset(tmp_path):
    """The Datasource returns every column's rows in order, dense as tensors
    and ragged as lists; a single store reads as column 'data'."""
    write_dataset(ray.data.from_items(items(), override_num_blocks=4), tmp_path / "out")
    back = read_dataset(tmp_path / "out", columns=["x", "label", "tokens"], override_num_blocks=3)
    assert back.count() == ROWS
    batch = back.take_batch(ROWS, batch_format="numpy")
    expected = expected_columns()
    np.testing.assert_array_equal(batch["x"], expected["x"])
    np.testing.assert_array_equal(batch["label"], expected["label"])
    for got, want in zip(batch["tokens"], expected["tokens"]):
        np.testing.assert_array_equal(got, want)
    from_numpy(tmp_path / "single", np.arange(50, dtype=np.int16), progress=False)
    single = read_dataset(tmp_path / "single").take_batch(50, batch_format="numpy")
    np.testing.assert_array_equal(single["data"], np.arange(50, dtype=np.int16))


def test_unstorable_columns_get_clear_errors(tmp_path):
    """Nulls and nested non-numeric lists are refused before anything is committed."""
    with pytest.raises(Exception, match="nulls"):
        write_dataset(ray.data.from_items([{"a": 1}, {"a": None}]), tmp_path / "nulls")
    assert not shards.is_sharded(tmp_path / "nulls" / "a")
    write_dataset(ray.data.range(10), tmp_path / "ok")
    with pytest.raises(ValueError, match="no column 'nope'"):
        read_dataset(tmp_path / "ok", columns=["nope"])


def test_readme_ray_block_runs(tmp_path, monkeypatch):
    """The scaling guide's "Ray Data" example runs as written (on this module's cluster)."""
    import re
    from pathlib import Path

    monkeypatch.chdir(tmp_path)
    readme = (Path(__file__).resolve().parent.parent / "docs" / "guides" / "scaling.md").read_text()
    block = next(
        b
        for b in re.findall(r"```python\n(.*?)```", readme, re.S)
        if 'write_dataset(ds, "converted")' in b
    )
    exec(compile(block, "scaling guide Ray block", "exec"), {})
    assert sorted(os.listdir(tmp_path / "converted")) == ["image", "label", "tokens"]
