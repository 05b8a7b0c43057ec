"""Sharded datasets: written shard by shard, committed by a manifest, read
exactly like one store (indexing, masks, __getitems__, the DataLoader's
sampler modes, sharding and resume)."""

from __future__ import annotations

import multiprocessing
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loaderx import DataLoader, DenseDataset, RaggedDataset, from_numpy, shards
from loaderx.zrecord import ChecksumError


def write_split(path, array, bounds, codec="zstd") -> None:
    """Writes ``array`` as shards cut at ``bounds`` and commits them."""
    for k, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        shards.write_shard(path, k, array[start:end], codec=codec)
    shards.commit(path)


def even_bounds(rows: int, count: int) -> list:
    return np.linspace(0, rows, count + 1).astype(int).tolist()


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    """One array as a single store and as 7 shards (one of them empty)."""
    root = tmp_path_factory.mktemp("dense")
    array = np.random.default_rng(0).normal(size=(500, 3, 2)).astype(np.float32)
    from_numpy(root / "single", array, progress=False)
    write_split(root / "sharded", array, [0, 60, 60, 200, 201, 350, 499, 500])
    return root, array


def test_shards_read_as_one_index_space(dense):
    """Every selector gives the concatenated rows, the same as the single store."""
    root, array = dense
    rng = np.random.default_rng(1)
    mask = rng.random(len(array)) < 0.3
    selectors = [
        5,
        -1,
        499,
        slice(None),
        slice(10, 400, 7),
        slice(None, None, -3),
        [499, 0, 0, 60, 200],
        rng.integers(0, 500, 300),
        rng.integers(-500, 500, (4, 5)),
        mask,
        np.array([], dtype=np.int64),
    ]
    with DenseDataset(root / "sharded") as sharded, DenseDataset(root / "single") as single:
        assert len(sharded) == 500 and sharded.shape == (500, 3, 2)
        assert (sharded.dtype, sharded.item_shape, sharded.codec) == (
            single.dtype,
            single.item_shape,
            single.codec,
        )
        for selector in selectors:
            np.testing.assert_array_equal(sharded[selector], array[selector])
            np.testing.assert_array_equal(sharded[selector], single[selector])
        np.testing.assert_array_equal(sharded[3, 1], array[3, 1])
        np.testing.assert_array_equal(sharded.__getitems__([7, 450, 7]), array[[7, 450, 7]])
        with pytest.raises(IndexError):
            sharded[500]
        with pytest.raises(IndexError):
            sharded.store.gather([500], np.empty((1, 3, 2), np.float32))
        assert sharded.store.stats()["records"] == 500
        assert sharded.store.stats()["shards"] == 7
        assert sharded.store.verify() == []


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    cuts=st.lists(st.integers(0, 120), max_size=9),
    picks=st.lists(st.integers(0, 119), min_size=1, max_size=80),
    codec=st.sampled_from(["raw", "zstd"]),
)
def test_any_split_reads_back_the_same_rows(tmp_path_factory, cuts, picks, codec):
    """Property: however the rows are cut into shards (empty shards too), a
    gather at any indices equals NumPy's fancy indexing."""
    array = np.arange(120 * 4, dtype=np.int32).reshape(120, 4)
    path = tmp_path_factory.mktemp("split") / "d"
    write_split(path, array, [0, *sorted(cuts), 120], codec=codec)
    with DenseDataset(path) as dataset:
        np.testing.assert_array_equal(dataset[picks], array[picks])
        assert dataset.store.stats()["layout"] == ("fixed" if codec == "raw" else "indexed")


def test_ragged_shards_read_as_one(tmp_path):
    """A ragged sharded dataset returns each record's rows, in global order."""
    rng = np.random.default_rng(2)
    records = [rng.integers(0, 1000, (int(n), 2)).astype(np.int16) for n in rng.integers(0, 9, 90)]
    for k, start in enumerate(range(0, 90, 25)):
        shards.write_shard(tmp_path / "r", k, records[start : start + 25])
    shards.commit(tmp_path / "r")
    with RaggedDataset(tmp_path / "r") as dataset:
        assert len(dataset) == 90
        picks = [89, 0, 25, 24, 50, 50]
        for got, index in zip(dataset[picks], picks):
            np.testing.assert_array_equal(got, records[index])
        np.testing.assert_array_equal(dataset.row_counts(), [len(record) for record in records])
        np.testing.assert_array_equal(dataset[-1], records[-1])
    with pytest.raises(ValueError, match="RaggedDataset"):
        DenseDataset(tmp_path / "r")


def test_bytes_and_object_arrays_become_ragged_shards(tmp_path):
    """bytes records and object arrays of arrays are ragged; a plain array is dense."""
    shards.write_shard(tmp_path / "b", 0, [b"ab", b"", b"xyz"])
    shards.write_shard(
        tmp_path / "b",
        1,
        np.array([np.arange(3, dtype=np.uint8), np.arange(1, dtype=np.uint8)], dtype=object),
    )
    shards.commit(tmp_path / "b")
    with RaggedDataset(tmp_path / "b") as dataset:
        assert [bytes(record) for record in dataset[:]] == [
            b"ab",
            b"",
            b"xyz",
            b"\x00\x01\x02",
            b"\x00",
        ]


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_dataloader_over_shards_matches_single_stores(dense, mode):
    """Every sampler mode gives the same batches from shards as from one store,
    sharded loaders concatenate to the global batch, and resume is exact."""
    root, array = dense
    labels = np.arange(500, dtype=np.int64)
    label_root = root / f"labels-{mode}"
    write_split(label_root, labels, even_bounds(500, 5), codec="raw")

    def loader(path, shard=None, batch_size=32):
        streams = {"x": DenseDataset(path), "y": DenseDataset(label_root)}
        return DataLoader(
            streams, num_workers=2, batch_size=batch_size, mode=mode, seed=7, shard=shard
        )

    with loader(root / "sharded") as sharded, loader(root / "single") as single:
        batches = [next(sharded) for _ in range(20)]
        for batch in batches:
            expected = next(single)
            np.testing.assert_array_equal(batch["x"], expected["x"])
            np.testing.assert_array_equal(batch["x"], array[batch["y"]])
        state = sharded.state_dict()
        following = next(sharded)
    with loader(root / "sharded") as resumed:
        resumed.load_state_dict(state)
        np.testing.assert_array_equal(next(resumed)["y"], following["y"])
    ranks = [loader(root / "sharded", shard=(rank, 2), batch_size=16) for rank in range(2)]
    for step in range(5):
        parts = [next(rank_loader)["y"] for rank_loader in ranks]
        np.testing.assert_array_equal(np.concatenate(parts), batches[step]["y"])
    for rank_loader in ranks:
        rank_loader.close()


def test_dataloader_cyclic_mode_sees_every_row_once_per_cycle(tmp_path):
    """CYCLIC over 8 shards: one cycle of batches is a permutation of all rows."""
    labels = np.arange(256, dtype=np.int64)
    write_split(tmp_path / "y", labels, even_bounds(256, 8), codec="raw")
    with DataLoader(
        {"y": DenseDataset(tmp_path / "y")}, num_workers=2, batch_size=32, mode=2, seed=3
    ) as loader:
        seen = np.concatenate([next(loader)["y"] for _ in range(8)])
    np.testing.assert_array_equal(np.sort(seen), labels)


# ---- writing, committing and resuming ------------------------------------------------


def test_an_uncommitted_directory_is_not_a_dataset_and_resumes(tmp_path):
    """Until commit there is no dataset; complete shards are reported for a
    resumed run to skip, and a crashed writer's leftovers are not shards."""
    path = tmp_path / "d"
    array = np.arange(100, dtype=np.int64)
    shards.write_shard(path, 0, array[:50])
    shards.write_shard(path, 2, array[80:])
    (path / ".tmp-shard-shard-00001-deadbeef").mkdir()  # a writer killed mid-shard
    with pytest.raises(FileNotFoundError, match="not a loaderx store"):
        DenseDataset(path)
    assert shards.written_shards(path) == [0, 2]
    with pytest.raises(ValueError, match="shards 1 are missing"):
        shards.commit(path)
    for k in range(3):
        if k not in shards.written_shards(path):
            shards.write_shard(path, k, array[50:80])
    assert shards.commit(path) == 100
    assert not any(entry.startswith(".tmp") for entry in os.listdir(path))
    with DenseDataset(path) as dataset:
        np.testing.assert_array_equal(dataset[:], array)


def test_a_failed_shard_write_leaves_no_shard(tmp_path):
    """A source that raises midway leaves neither the shard nor a temporary."""

    def records():
        yield np.arange(3)
        raise OSError("source broke")

    with pytest.raises(OSError, match="source broke"):
        shards.write_shard(tmp_path / "d", 0, records())
    assert [
        name for name in os.listdir(tmp_path / "d") if not name.startswith(".lock-")
    ] == []  # lock files stay by design


def test_existing_and_committed_shards_are_not_overwritten_by_accident(tmp_path):
    """An existing shard needs overwrite=True; a committed one never changes."""
    path = tmp_path / "d"
    shards.write_shard(path, 0, np.zeros(4))
    with pytest.raises(FileExistsError, match="overwrite=True"):
        shards.write_shard(path, 0, np.ones(4))
    shards.write_shard(path, 0, np.ones(4), overwrite=True)
    shards.commit(path)
    with pytest.raises(FileExistsError, match="committed"):
        shards.write_shard(path, 0, np.ones(2), overwrite=True)
    with DenseDataset(path) as dataset:
        np.testing.assert_array_equal(dataset[:], np.ones(4))


def test_commit_extends_a_committed_dataset(tmp_path):
    """Writing shard n and committing again appends its rows after the rest."""
    path = tmp_path / "d"
    write_split(path, np.arange(10), [0, 4, 10])
    shards.write_shard(path, 2, np.arange(10, 13))
    assert shards.commit(path) == 13
    with DenseDataset(path) as dataset:
        np.testing.assert_array_equal(dataset[:], np.arange(13))


def test_commit_refuses_mixed_schemas_and_bad_counts(tmp_path):
    """Shards of another dtype, item shape or codec, and a wrong shard_count,
    are refused with the shard named."""
    path = tmp_path / "d"
    shards.write_shard(path, 0, np.zeros((3, 2), np.float32))
    shards.write_shard(path, 1, np.zeros((3, 2), np.float64))
    with pytest.raises(ValueError, match="shard-00001 holds dense float64"):
        shards.commit(path)
    shards.write_shard(path, 1, np.zeros((3, 2), np.float32), codec="raw", overwrite=True)
    with pytest.raises(ValueError, match="codec 'raw'"):
        shards.commit(path)
    shards.write_shard(path, 1, np.zeros((3, 2), np.float32), overwrite=True)
    with pytest.raises(ValueError, match="beyond shard_count=1"):
        shards.commit(path, shard_count=1)
    with pytest.raises(ValueError, match="shards 2 are missing"):
        shards.commit(path, shard_count=3)
    assert shards.commit(path, shard_count=2) == 6


def test_bad_arguments_get_clear_errors(tmp_path):
    """A single store is not a shard directory; shard numbers are checked."""
    from_numpy(tmp_path / "store", np.zeros(3), progress=False)
    with pytest.raises(ValueError, match="single loaderx store"):
        shards.write_shard(tmp_path / "store", 0, np.zeros(3))
    with pytest.raises(ValueError, match="shard number"):
        shards.write_shard(tmp_path / "d", -1, np.zeros(3))
    with pytest.raises(TypeError, match="shard number"):
        shards.write_shard(tmp_path / "d", 1.5, np.zeros(3))
    assert not (tmp_path / "d").exists()  # refused before anything was written
    (tmp_path / "d").mkdir()
    with pytest.raises(ValueError, match="no complete shards"):
        shards.commit(tmp_path / "d")
    with pytest.raises(FileNotFoundError, match="write_shard"):
        shards.commit(tmp_path / "missing")


def _write_one(args):
    path, k = args
    return shards.write_shard(path, k, np.full((1000, 8), k, dtype=np.int32))


def test_shards_written_by_parallel_processes_commit_into_one_dataset(tmp_path):
    """Eight processes write eight shards at once; the commit orders them by number."""
    path = str(tmp_path / "d")
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        assert pool.map(_write_one, [(path, k) for k in reversed(range(8))]) == [1000] * 8
    assert shards.commit(path) == 8000
    with DenseDataset(path) as dataset:
        np.testing.assert_array_equal(dataset[::1000, 0], np.arange(8))


def test_a_damaged_shard_is_named_by_a_verified_read(tmp_path):
    """A flipped byte in one shard's data raises ChecksumError naming the shard."""
    path = tmp_path / "d"
    write_split(path, np.random.default_rng(0).random((64, 256)), even_bounds(64, 4))
    shard = path / shards.shard_name(2)
    target = max((shard / name for name in os.listdir(shard)), key=lambda file: file.stat().st_size)
    payload = bytearray(target.read_bytes())
    payload[len(payload) // 2] ^= 0xFF
    target.write_bytes(bytes(payload))
    with DenseDataset(path, verify=True) as dataset:
        with pytest.raises(ChecksumError, match="shard 2"):
            dataset[:]
        assert dataset[:32].shape == (32, 256)  # the other shards still read


def test_readme_sharded_block_runs(tmp_path, monkeypatch):
    """The scaling guide's "Sharded datasets" example runs as written."""
    import re
    from pathlib import Path

    monkeypatch.chdir(tmp_path)
    readme = (Path(__file__).resolve().parent.parent / "docs" / "guides" / "scaling.md").read_text()
    block = next(
        b
        for b in re.findall(r"```python\n(.*?)```", readme, re.S)
        if 'shards.write_shard("sharded"' in b
    )
    exec(compile(block, "scaling guide sharded block", "exec"), {})
    assert shards.is_sharded(tmp_path / "sharded")


def test_the_native_handle_refuses_rows_its_stores_do_not_hold(tmp_path):
    """lx_shards_open checks the row ranges against the stores it borrows,
    whatever the Python side passes."""
    from loaderx._native import ZrecordError, check, ffi, lib

    write_split(tmp_path / "d", np.arange(10), [0, 4, 10])
    with DenseDataset(tmp_path / "d") as dataset:
        handles = ffi.new("lx_store *[]", [shard._handle for shard in dataset.store.shards])
        out = ffi.new("lx_shards **")
        for starts, message in (
            ([0, 5, 10], "shard 0 is listed with rows 0..5 but holds 4"),
            ([1, 4, 10], "starting at 0"),
            ([0, 4, 3], "shard 1 is listed with rows 4..3"),
        ):
            row_starts = np.array(starts, dtype=np.uint64)
            with pytest.raises(ZrecordError, match=message):
                check(
                    lib.lx_shards_open(
                        handles, ffi.cast("uint64_t *", ffi.from_buffer(row_starts)), 2, 0, out
                    )
                )
            assert out[0] == ffi.NULL


def test_a_damaged_ragged_shard_is_named_when_lengths_are_read(tmp_path):
    """A verified length lookup over a damaged shard names the shard and the record."""
    records = [np.arange(n, dtype=np.int64) for n in range(1, 41)]
    for k in range(4):
        shards.write_shard(tmp_path / "r", k, records[k * 10 : (k + 1) * 10])
    shards.commit(tmp_path / "r")
    shard = tmp_path / "r" / shards.shard_name(1)
    target = next(shard / name for name in os.listdir(shard) if name.startswith("data-"))
    payload = bytearray(target.read_bytes())
    payload[-3] ^= 0xFF  # inside the last record of shard 1
    target.write_bytes(bytes(payload))
    with RaggedDataset(tmp_path / "r", verify=True) as dataset:
        with pytest.raises(ChecksumError, match=r"shard 1: record 9: checksum mismatch"):
            dataset.row_counts()
        np.testing.assert_array_equal(dataset[0], records[0])


def test_large_records_are_gathered_in_pieces_across_threads(tmp_path):
    """Records of 96 KiB: a shard's run of a batch is cut into pieces of two
    records spread over the threads, and every record still lands in place."""
    array = np.random.default_rng(3).integers(0, 1 << 30, (90, 24576), dtype=np.int32)
    write_split(tmp_path / "d", array, [0, 7, 80, 90], codec="raw")
    picks = np.random.default_rng(4).integers(0, 90, 200)
    with DenseDataset(tmp_path / "d") as dataset:
        np.testing.assert_array_equal(dataset[picks], array[picks])
        np.testing.assert_array_equal(dataset[10:75], array[10:75])
