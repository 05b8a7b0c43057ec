"""Ragged streams in the DataLoader: RaggedBatch, alignment, determinism, resume, shards."""

import json

import numpy as np
import pytest

from loaderx import (
    DataLoader,
    DenseDataset,
    RaggedBatch,
    RaggedDataset,
    Sampler,
    from_iterator,
    from_numpy,
    pad,
)

LENGTH = 61
# BLOCK needs its groups: tests/test_block.py.
MODES = [mode for mode in Sampler.Mode if mode != Sampler.Mode.BLOCK]


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """A ragged token stream (record i: lengths 0..40 of values i * 1000 + j), a
    ragged stream of 3-float rows, and an aligned dense label stream."""
    root = tmp_path_factory.mktemp("ragged")
    rng = np.random.default_rng(7)
    lengths = rng.integers(0, 41, LENGTH)
    lengths[5] = 0  # an empty record among the others
    tokens = [np.arange(n, dtype=np.int32) + 1000 * i for i, n in enumerate(lengths)]
    points = [rng.random((int(n) % 7, 3)).astype(np.float32) for n in lengths]
    from_iterator(root / "tokens", tokens)
    from_iterator(root / "points", points, codec="raw")
    from_numpy(root / "labels", np.arange(LENGTH, dtype=np.int64))
    return root, tokens, points


@pytest.fixture
def streams(sources):
    root, _, _ = sources
    opened = {
        "tokens": RaggedDataset(root / "tokens"),
        "points": RaggedDataset(root / "points"),
        "y": DenseDataset(root / "labels"),
    }
    yield opened
    for dataset in opened.values():
        dataset.close()


def reference(sources, indices):
    _, tokens, points = sources
    return {
        "tokens": [tokens[i] for i in indices],
        "points": [points[i] for i in indices],
        "y": np.asarray(indices),
    }


def assert_batch(batch, want):
    np.testing.assert_array_equal(batch["y"], want["y"])
    for name in ("tokens", "points"):
        got = batch[name]
        assert isinstance(got, RaggedBatch) and len(got) == len(want[name])
        assert got.values.dtype == want[name][0].dtype
        np.testing.assert_array_equal(got.lengths, [len(record) for record in want[name]])
        for record, expected in zip(got, want[name]):
            np.testing.assert_array_equal(record, expected)


def take(loader, count):
    return [next(loader) for _ in range(count)]


def assert_same(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a["y"], b["y"])
        assert a["tokens"] == b["tokens"] and a["points"] == b["points"]


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("workers", [0, 1, 3])
def test_ragged_batch_k_is_the_samplers_step_k(sources, streams, mode, workers):
    """Each ragged stream holds the sampler's records of step k, aligned with the dense stream."""
    sampler = Sampler(LENGTH, 9, mode, seed=4)
    with DataLoader(streams, num_workers=workers, batch_size=9, mode=mode, seed=4) as loader:
        for step in range(12):
            assert_batch(next(loader), reference(sources, sampler.batch(step).tolist()))


def test_ragged_batch_layout_and_padding():
    """values are the records back to back, offsets their bounds; padded() is pad()."""
    records = [np.array([1, 2, 3]), np.array([], dtype=np.int64), np.array([4])]
    batch = RaggedBatch(np.array([1, 2, 3, 4]), np.array([0, 3, 3, 4]))
    assert len(batch) == 3 and batch.lengths.tolist() == [3, 0, 1]
    for width in (None, 0, 2, 5):
        got, kept = batch.padded(width, pad_value=-1)
        want, want_kept = pad(records, max_len=width, pad_value=-1)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(kept, want_kept)
    with pytest.raises(ValueError, match="offsets"):
        RaggedBatch(np.zeros(3), np.array([0, 2]))


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_ragged_resume_continues_exactly(streams, mode):
    """A ragged loader's state resumes with exactly the next batches, for another num_workers."""
    with DataLoader(streams, num_workers=2, batch_size=7, mode=mode) as loader:
        take(loader, 5)
        state = loader.state_dict()
        continued = take(loader, 4)
    with DataLoader(streams, num_workers=3, batch_size=7, mode=mode) as resumed:
        resumed.load_state_dict(json.loads(json.dumps(state)))
        assert_same(take(resumed, 4), continued)


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_ragged_shards_concatenate_to_the_single_host_batch(streams, mode):
    """Ranks' ragged batches, joined in rank order, are the unsharded batch (values and lengths)."""
    world_size, share = 3, 4
    per_rank = []
    for rank in range(world_size):
        with DataLoader(
            streams, num_workers=2, batch_size=share, mode=mode, shard=(rank, world_size)
        ) as loader:
            per_rank.append(take(loader, 6))
    with DataLoader(streams, num_workers=2, batch_size=share * world_size, mode=mode) as single:
        whole = take(single, 6)
    for step in range(6):
        for name in ("tokens", "points"):
            parts = [per_rank[rank][step][name] for rank in range(world_size)]
            np.testing.assert_array_equal(
                np.concatenate([part.values for part in parts]), whole[step][name].values
            )
            np.testing.assert_array_equal(
                np.concatenate([part.lengths for part in parts]), whole[step][name].lengths
            )


def test_ragged_gather_error_reaches_the_consumer(sources):
    """A ragged stream closed under the loader raises LoaderError from next(), not a hang."""
    root, _, _ = sources
    tokens = RaggedDataset(root / "tokens")
    loader = DataLoader({"tokens": tokens}, num_workers=2, batch_size=4)
    tokens.close()
    with pytest.raises(RuntimeError, match="reading the batch"):
        next(loader)
    assert loader.closed


@pytest.mark.parametrize("sharded", [False, True])
def test_gather_packed_fills_offsets_and_values_in_one_call(sources, tmp_path, sharded):
    """gather_packed returns every record's rows back to back with row offsets,
    into the front of a buffer that fits, or a new array when it does not;
    a sharded dataset gives the same answer."""
    from loaderx import shards

    root, tokens, points = sources
    if sharded:
        for k, part in enumerate((points[:20], points[20:21], points[21:])):
            shards.write_shard(tmp_path / "points", k, part, codec="raw")
        shards.commit(tmp_path / "points")
    dataset = RaggedDataset(tmp_path / "points" if sharded else root / "points")
    indices = np.array([7, 5, 60, 7, 0, 33, 20], dtype=np.uint64)
    expected = [points[i] for i in indices.tolist()]
    rows = sum(len(record) for record in expected)
    buffer = np.full(rows * 12 + 5, 0xAB, dtype=np.uint8)
    for given in (buffer, None, buffer[: rows * 12 - 1]):
        values, offsets = dataset.gather_packed(indices, given)
        assert (
            offsets.dtype == np.int64
            and offsets.tolist() == np.cumsum([0] + [len(r) for r in expected]).tolist()
        )
        assert values.shape == (rows, 3) and values.dtype == np.float32
        np.testing.assert_array_equal(values, np.concatenate(expected))
        assert np.shares_memory(values, buffer) == (given is buffer)
    assert (buffer[rows * 12 :] == 0xAB).all()  # nothing written past the batch
    values, offsets = dataset.gather_packed(np.array([], dtype=np.uint64))
    assert values.shape == (0, 3) and offsets.tolist() == [0]
    with pytest.raises(IndexError):
        dataset.gather_packed(np.array([0, LENGTH], dtype=np.uint64))
    dataset.close()


def test_gather_rows_refuses_a_record_of_partial_rows_and_reads_nothing(sources):
    """The native ragged gather checks every record is whole rows before it
    copies, and reports the size a too-small target would need."""
    from loaderx.zrecord import InvalidArgumentError, Zrecord

    root, tokens, _ = sources
    with Zrecord(root / "tokens") as store:
        indices = np.array([1, 2], dtype=np.uint64)
        target = np.zeros(1024, dtype=np.uint8)
        odd = next(
            i for i, record in enumerate(tokens) if len(record) % 2
        )  # 4 * odd bytes: not 8-byte rows
        with pytest.raises(
            InvalidArgumentError, match=f"record {odd} .* not a whole number of 8-byte rows"
        ):
            store.gather_rows(np.array([0, odd], dtype=np.uint64), 8, target)
        assert not target.any()
        needed, offsets = store.gather_rows(indices, 4, target[:3])
        assert needed == 4 * (len(tokens[1]) + len(tokens[2])) and offsets.tolist() == [
            0,
            4 * len(tokens[1]),
            needed,
        ]
        assert not target.any()
