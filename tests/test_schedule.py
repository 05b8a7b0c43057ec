"""Epochs and elastic resume: the schedule that maps steps to the global stream."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loaderx import DataLoader, DenseDataset, Sampler, from_numpy
from loaderx.schedule import ElasticError, Schedule, elastic_anchor

SEQUENTIAL, IID, CYCLIC = Sampler.Mode.SEQUENTIAL, Sampler.Mode.IID, Sampler.Mode.CYCLIC
LENGTH = 53
NONE = np.empty(0, dtype=np.uint64)


def global_indices(schedule, first, count):
    out = np.empty(schedule.sampler.batch_size, dtype=np.uint64)
    return np.concatenate(
        [NONE] + [schedule.indices(step, out).copy() for step in range(first, first + count)]
    )


def permutation(length, seed, cycle):
    """Cycle ``cycle``'s whole permutation, read with a batch of the whole length."""
    return Sampler(length, length, CYCLIC, seed=seed).batch(cycle)


def expected_cyclic(length, seed, runs):
    """The global stream the rules promise for runs [(global_batch, steps), ...]:
    each run continues the cycle at the exact next position while whole batches
    fit, drops the rest of a cycle, and starts every later cycle at offset 0."""
    cycle, offset, out = 0, 0, []
    for global_batch, steps in runs:
        for _ in range(steps):
            if offset + global_batch > length:
                cycle, offset = cycle + 1, 0
            out.append(permutation(length, seed, cycle)[offset : offset + global_batch])
            offset += global_batch
    return np.concatenate([NONE, *out])


@settings(max_examples=80, deadline=None)
@given(
    length=st.integers(8, 90),
    seed=st.integers(0, 2**64 - 1),
    runs=st.lists(st.tuples(st.integers(1, 8), st.integers(0, 30)), min_size=1, max_size=4),
)
def test_cyclic_elastic_resume_continues_the_global_order(length, seed, runs):
    """Resumed with other global batches, CYCLIC continues each cycle at the exact
    next sample: no sample of a cycle repeated or skipped (but a tail too short
    for a whole batch), the same order as the permutation."""
    runs = [(batch, steps) for batch, steps in runs if batch <= length]
    schedule, step, got = None, 0, []
    for global_batch, steps in runs:
        fresh = Schedule(Sampler(length, global_batch, CYCLIC, seed=seed))
        schedule = (
            fresh
            if schedule is None
            else Schedule(fresh.sampler, elastic_anchor(schedule, step, fresh))
        )
        got.append(global_indices(schedule, step, steps))
        step += steps
    np.testing.assert_array_equal(np.concatenate([NONE, *got]), expected_cyclic(length, seed, runs))


@settings(max_examples=60, deadline=None)
@given(
    length=st.integers(1, 70),
    runs=st.lists(st.tuples(st.integers(1, 90), st.integers(0, 20)), min_size=1, max_size=4),
)
def test_sequential_elastic_resume_continues_the_window(length, runs):
    """SEQUENTIAL resumed with other global batches reads position p mod length, p counting on."""
    schedule, step, got = None, 0, []
    for global_batch, steps in runs:
        fresh = Schedule(Sampler(length, global_batch, SEQUENTIAL))
        schedule = (
            fresh
            if schedule is None
            else Schedule(fresh.sampler, elastic_anchor(schedule, step, fresh))
        )
        got.append(global_indices(schedule, step, steps))
        step += steps
    total = sum(batch * steps for batch, steps in runs)
    np.testing.assert_array_equal(np.concatenate(got), np.arange(total) % length)


@settings(max_examples=40, deadline=None)
@given(
    mode=st.sampled_from([SEQUENTIAL, CYCLIC]),
    share=st.integers(1, 5),
    world_size=st.integers(1, 4),
    anchor_offset=st.integers(0, 60),
    steps=st.integers(1, 12),
)
def test_anchored_shards_concatenate_to_the_global_batch(
    mode, share, world_size, anchor_offset, steps
):
    """After an elastic resume, the ranks' batches joined in rank order are still the global
    batch."""
    length = 61
    global_batch = share * world_size
    anchor = (
        {"step": 3, "cycle": 2, "offset": anchor_offset % length}
        if mode == CYCLIC
        else {"step": 3, "position": anchor_offset % length}
    )
    whole = Schedule(Sampler(length, global_batch, mode, seed=9), anchor)
    ranks = [
        Schedule(Sampler(length, share, mode, seed=9, shard=(rank, world_size)), anchor)
        for rank in range(world_size)
    ]
    for step in range(3, 3 + steps):
        joined = np.concatenate([global_indices(rank, step, 1) for rank in ranks])
        np.testing.assert_array_equal(joined, global_indices(whole, step, 1))


def test_iid_resume_needs_the_same_global_batch():
    """IID: another world size with the same global batch is the same stream; another global batch
    is refused."""
    saved = Schedule(Sampler(100, 8, IID, seed=1, shard=(0, 2)))
    same = Schedule(Sampler(100, 4, IID, seed=1, shard=(1, 4)))
    assert elastic_anchor(saved, 5, same) is None
    with pytest.raises(ElasticError, match="IID draws are keyed"):
        elastic_anchor(saved, 5, Schedule(Sampler(100, 5, IID, seed=1)))


# ---- through the DataLoader ------------------------------------------------------------


@pytest.fixture(scope="module")
def labels(tmp_path_factory):
    path = tmp_path_factory.mktemp("schedule") / "labels"
    from_numpy(path, np.arange(LENGTH, dtype=np.int64), codec="raw")
    with DenseDataset(path) as dataset:
        yield dataset


def loader(labels, **options):
    return DataLoader({"y": labels}, **{"num_workers": 2, "mode": CYCLIC, "seed": 11, **options})


def test_elastic_resume_through_the_loader(labels):
    """W=2 x 6 saved mid-cycle, resumed on W=3 x 5: the ranks continue the cycle
    with its next samples, none repeated or skipped, and keep going after it."""
    states, seen = [], []
    for rank in range(2):
        with loader(labels, batch_size=6, shard=(rank, 2)) as old:
            seen.append(np.concatenate([next(old)["y"] for _ in range(3)]))
            states.append(old.state_dict())
    assert states[0]["step"] == 3 and states[0]["global_batch"] == 12
    before = np.concatenate([part.reshape(3, 6) for part in seen], axis=1).reshape(-1)
    after = []
    for rank in range(3):
        with loader(labels, batch_size=5, shard=(rank, 3)) as new:
            new.load_state_dict(json.loads(json.dumps(states[0])))
            after.append(np.stack([next(new)["y"] for _ in range(4)]))
    after = np.concatenate(after, axis=1).reshape(-1)
    # 36 read of cycle 0, then (53 - 36) // 15 = 1 more batch; 2 samples dropped; cycle 1 on.
    cycle0, cycle1 = permutation(LENGTH, 11, 0), permutation(LENGTH, 11, 1)
    np.testing.assert_array_equal(before, cycle0[:36])
    np.testing.assert_array_equal(after, np.concatenate([cycle0[36:51], cycle1[:45]]))


def test_resumed_elastic_state_resumes_again_exactly(labels):
    """The state of an elastically resumed loader carries its anchor: resuming it again is exact."""
    with loader(labels, batch_size=12) as old:
        [next(old) for _ in range(2)]
        state = old.state_dict()
    with loader(labels, batch_size=5) as middle:
        middle.load_state_dict(state)
        next(middle)
        second = middle.state_dict()
        want = [next(middle)["y"] for _ in range(12)]
    assert second["anchor"] == {"step": 2, "cycle": 0, "offset": 24}
    with loader(labels, batch_size=5, num_workers=0) as resumed:
        resumed.load_state_dict(second)
        for expected in want:
            np.testing.assert_array_equal(next(resumed)["y"], expected)


def test_iid_loader_refuses_another_global_batch(labels):
    """An IID state resumed with another global batch raises ElasticError saying why."""
    with loader(labels, batch_size=8, mode=IID) as old:
        state = old.state_dict()
    with (
        loader(labels, batch_size=4, mode=IID) as new,
        pytest.raises(ElasticError, match="global batch"),
    ):
        new.load_state_dict(state)


def test_one_epoch_reads_each_record_once(labels):
    """CYCLIC: one_epoch() yields steps_per_epoch batches of distinct records, then the next
    epoch."""
    with loader(labels, batch_size=10) as cyclic:
        assert cyclic.steps_per_epoch == 5 and cyclic.epoch == 0
        for epoch in range(3):
            batches = [batch["y"] for batch in cyclic.one_epoch()]
            assert len(batches) == 5 and cyclic.epoch == epoch + 1
            records = np.concatenate(batches)
            assert len(set(records.tolist())) == 50  # 3 of 53 dropped, different each epoch
            np.testing.assert_array_equal(records, permutation(LENGTH, 11, epoch)[:50])


def test_epochs_need_cyclic_mode(labels):
    """epoch, steps_per_epoch and one_epoch() raise ValueError outside CYCLIC."""
    with loader(labels, batch_size=10, mode=IID) as iid:
        for use in (lambda: iid.epoch, lambda: iid.steps_per_epoch, lambda: next(iid.one_epoch())):
            with pytest.raises(ValueError, match="CYCLIC"):
                use()


def test_packed_and_mixed_loaders_have_no_epochs(labels, tmp_path):
    """Epochs are cycles over one dataset: a packed or mixed CYCLIC loader refuses them."""
    from loaderx import Packing, RaggedDataset, from_iterator

    from_iterator(tmp_path / "docs", [np.arange(5, dtype=np.int32)] * 60)
    with RaggedDataset(tmp_path / "docs") as docs:
        with DataLoader({"t": docs}, mode=CYCLIC, batch_size=4, packing=Packing(8)) as packed:
            with pytest.raises(ValueError, match="no epochs"):
                packed.epoch
    with DataLoader(
        [{"y": labels}, {"y": labels}], weights=[1, 1], mode=CYCLIC, batch_size=4
    ) as mixed:
        with pytest.raises(ValueError, match="no epochs"):
            mixed.steps_per_epoch


def test_stats_count_batches_stages_and_stalls(labels):
    """stats() counts delivered batches, consumer stall time and per-stage worker time."""

    def slow(batch):
        import time

        time.sleep(0.01)
        return batch

    with loader(
        labels, batch_size=10, transform=slow, num_workers=1, prefetch_size=2
    ) as slow_loader:
        assert slow_loader.stats()["batches"] == 0
        [next(slow_loader) for _ in range(6)]
        stats = slow_loader.stats()
    assert stats["batches"] == 6 and stats["step"] == 6
    assert (
        stats["transform_seconds"] >= 0.05
    )  # at least 6 transforms of 10 ms, minus the prefetched ones
    assert stats["stall_seconds"] >= 0.03  # one worker at 10 ms a batch: the consumer waits
    assert stats["gather_seconds"] > 0 and stats["sample_seconds"] > 0
    assert 0 <= stats["queue_depth"] <= 2


def test_version_1_states_still_load(labels):
    """A state saved by the previous loader (version 1: no global_batch, no anchor) resumes
    exactly."""
    with loader(labels, batch_size=10) as old:
        [next(old) for _ in range(4)]
        state = old.state_dict()
        want = next(old)["y"]
    legacy = {key: state[key] for key in ("step", "seed", "mode", "batch_size", "shard", "length")}
    with loader(labels, batch_size=10) as resumed:
        resumed.load_state_dict({"version": 1, **legacy})
        np.testing.assert_array_equal(next(resumed)["y"], want)
