"""Weighted mixing: per-sample source choice, binomial counts, resume, shards, weight changes."""

import json
import math

import numpy as np
import pytest

from loaderx import DataLoader, DenseDataset, RaggedDataset, Sampler, from_iterator, from_numpy
from loaderx.dataloader import ElasticError

LENGTHS = (50, 31, 77)
# BLOCK needs its groups: tests/test_block.py.
MODES = [mode for mode in Sampler.Mode if mode != Sampler.Mode.BLOCK]


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Three sources, each a dense label stream (source s, record i: s * 1000 + i) and
    an aligned ragged stream (i % 4 values, each s * 1000 + i)."""
    root = tmp_path_factory.mktemp("mixing")
    opened = []
    for number, length in enumerate(LENGTHS):
        labels = number * 1000 + np.arange(length, dtype=np.int64)
        from_numpy(root / f"y{number}", labels)
        from_iterator(
            root / f"r{number}", [np.full(i % 4, label) for i, label in enumerate(labels)]
        )
        opened.append(
            {"y": DenseDataset(root / f"y{number}"), "r": RaggedDataset(root / f"r{number}")}
        )
    yield opened
    for source in opened:
        for dataset in source.values():
            dataset.close()


def take(loader, count):
    return [next(loader) for _ in range(count)]


def assert_from_own_sampler(batch, step, batch_size, mode, seed, shard=None):
    """Sample j comes from its chosen source, at that source's own sampler position j."""
    for j, (number, label) in enumerate(zip(batch["source"].tolist(), batch["y"].tolist())):
        index = Sampler(LENGTHS[number], batch_size, mode, seed=seed, shard=shard).batch(step)[j]
        assert label == number * 1000 + int(index), (step, j)
        np.testing.assert_array_equal(batch["r"][j], np.full(int(index) % 4, label))


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("workers", [0, 3])
def test_mixed_samples_come_from_their_sources_sampler(sources, mode, workers):
    """Every sample is its source's sampler record at the same step and position, dense and
    ragged."""
    with DataLoader(
        sources, weights=[2, 1, 1], num_workers=workers, batch_size=12, mode=mode, seed=8
    ) as loader:
        for step in range(10):
            assert_from_own_sampler(next(loader), step, 12, mode, 8)


@pytest.mark.parametrize("weights", [[0.5, 0.3, 0.2], [0.9, 0.1, 0.0], [1, 1, 1]])
@pytest.mark.parametrize("seed", [1, 2])
def test_source_counts_are_binomial(sources, weights, seed):
    """Per-source counts over n samples are within 5 standard deviations of n * weight
    (a binomial count leaves that bound about once in 1.7 million)."""
    with DataLoader(sources, weights=weights, batch_size=64, num_workers=2, seed=seed) as loader:
        choices = np.concatenate([batch["source"] for batch in take(loader, 300)])
    n = choices.size
    probabilities = np.asarray(weights, dtype=float) / sum(weights)
    for number, probability in enumerate(probabilities):
        count = int((choices == number).sum())
        bound = 5 * math.sqrt(n * probability * (1 - probability))
        assert abs(count - n * probability) <= bound, (number, count, n * probability, bound)
    assert (choices[probabilities[choices] == 0]).size == 0  # a zero weight never chosen


def test_mixed_batches_are_deterministic_and_resume_exactly(sources):
    """Same batches for any num_workers; a state resumes with exactly the next batch."""
    with DataLoader(sources, weights=[1, 2, 3], batch_size=10, num_workers=3, mode=2) as loader:
        take(loader, 7)
        state = json.loads(json.dumps(loader.state_dict()))
        want = take(loader, 5)
    with DataLoader(sources, weights=[1, 2, 3], batch_size=10, num_workers=0, mode=2) as resumed:
        resumed.load_state_dict(state)
        for got, expected in zip(take(resumed, 5), want):
            np.testing.assert_array_equal(got["y"], expected["y"])
            np.testing.assert_array_equal(got["source"], expected["source"])
            assert got["r"] == expected["r"]


def test_mixed_shards_concatenate_to_the_global_batch(sources):
    """Ranks' mixed batches joined in rank order are the unsharded batch."""
    parts = []
    for rank in range(3):
        with DataLoader(
            sources, weights=[1, 1, 2], batch_size=4, shard=(rank, 3), mode=0
        ) as loader:
            parts.append(take(loader, 6))
    with DataLoader(sources, weights=[1, 1, 2], batch_size=12, mode=0) as single:
        for step, whole in enumerate(take(single, 6)):
            for name in ("y", "source"):
                np.testing.assert_array_equal(
                    np.concatenate([part[step][name] for part in parts]), whole[name]
                )


def test_new_weights_on_resume_change_only_the_choices(sources):
    """Resumed with other weights: later samples follow the new weights, and each still
    comes from its source's own sampler at the same step and position."""
    with DataLoader(sources, weights=[1, 0, 0], batch_size=32, mode=1, seed=4) as loader:
        take(loader, 3)
        state = loader.state_dict()
    with DataLoader(sources, weights=[0, 1, 3], batch_size=32, mode=1, seed=4) as resumed:
        resumed.load_state_dict(state)
        assert resumed.state_dict()["mixing"]["weights"] == [0.0, 0.25, 0.75]
        batches = take(resumed, 100)
    choices = np.concatenate([batch["source"] for batch in batches])
    assert not (choices == 0).any()
    count, n = int((choices == 2).sum()), choices.size
    assert abs(count - 0.75 * n) <= 5 * math.sqrt(n * 0.75 * 0.25)
    for offset, batch in enumerate(batches[:5]):
        assert_from_own_sampler(batch, 3 + offset, 32, 1, 4)


def test_mixing_rejects_what_it_cannot_mix(sources, tmp_path):
    """Mismatched sources, bad weights, another global batch or other sources on resume: clear
    errors."""
    a, b, _ = sources
    with pytest.raises(TypeError, match="list of sources"):
        DataLoader(a, weights=[1])
    with pytest.raises(ValueError, match="same names"):
        DataLoader([a, {"y": b["y"]}], weights=[1, 1])
    from_numpy(tmp_path / "floats", np.zeros(20, dtype=np.float32))
    with DenseDataset(tmp_path / "floats") as floats:
        with pytest.raises(ValueError, match="dtype"):
            DataLoader([{"y": a["y"]}, {"y": floats}], weights=[1, 1])
        with pytest.raises(ValueError, match="'source'"):
            DataLoader([{"source": floats}, {"source": floats}], weights=[1, 1])
    for weights in ([1], [1, -1], [0, 0], [1, float("nan")], "ab"):
        with pytest.raises(ValueError, match="weights"):
            DataLoader([a, b], weights=weights)
    with DataLoader([a, b], weights=[1, 1], batch_size=8) as loader:
        state = loader.state_dict()
    with (
        DataLoader([a, b], weights=[1, 1], batch_size=4) as other,
        pytest.raises(ElasticError, match="global batch"),
    ):
        other.load_state_dict(state)
    with (
        DataLoader([b, a], weights=[1, 1], batch_size=8) as swapped,
        pytest.raises(ValueError, match="length"),
    ):
        swapped.load_state_dict(state)
    with DataLoader(a, batch_size=8) as plain, pytest.raises(ValueError, match="mixing"):
        plain.load_state_dict(state)
