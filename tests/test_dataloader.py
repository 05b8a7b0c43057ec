"""The DataLoader: 0.9 examples, determinism, resume, sharding, failures, lifetime."""

import gc
import json
import random
import threading
import time

import msgpack
import numpy as np
import pytest

from loaderx import DataLoader, DenseDataset, RaggedDataset, Sampler, from_iterator, from_numpy, pad
from loaderx.dataloader import LoaderError

LENGTH = 97
MODES = [Sampler.Mode.SEQUENTIAL, Sampler.Mode.IID, Sampler.Mode.CYCLIC]


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """Two aligned streams of LENGTH records: features (row i is i*10 + j) and labels i."""
    root = tmp_path_factory.mktemp("loader")
    features = np.arange(LENGTH * 10, dtype=np.float32).reshape(LENGTH, 10)
    labels = np.arange(LENGTH, dtype=np.int64)
    from_numpy(root / "features", features)
    from_numpy(root / "labels", labels, codec="raw")
    return root, features, labels


@pytest.fixture
def streams(stores):
    root, _, _ = stores
    opened = {"x": DenseDataset(root / "features"), "y": DenseDataset(root / "labels")}
    yield opened
    for dataset in opened.values():
        dataset.close()


def expected_batches(stores, steps, batch_size, mode, seed=42, shard=None, first=0):
    """The reference: the sampler's step k, gathered from the in-memory arrays."""
    _, features, labels = stores
    sampler = Sampler(LENGTH, batch_size, mode, seed=seed, shard=shard)
    for step in range(first, first + steps):
        indices = sampler.batch(step).astype(np.int64)
        yield {"x": features[indices], "y": labels[indices]}


def take(loader, count):
    return [next(loader) for _ in range(count)]


def assert_same_batches(got, want):
    assert len(got) == len(want)
    for step, (a, b) in enumerate(zip(got, want)):
        assert a.keys() == b.keys()
        for name in a:
            assert a[name].shape == b[name].shape and a[name].dtype == b[name].dtype, (step, name)
            np.testing.assert_array_equal(a[name], b[name], err_msg=f"step {step}, stream {name}")


def jitter(batch):
    """A transform that finishes at random times, so workers complete out of order."""
    time.sleep(random.random() * 0.002)
    return batch


# ---- the 0.9 README examples ---------------------------------------------------------


def test_readme_quick_start(tmp_path, monkeypatch):
    """The README quick start: convert .npy files, load endless batches of 256."""
    monkeypatch.chdir(tmp_path)
    np.save("data.npy", np.random.default_rng(0).random((600, 8), dtype=np.float32))
    np.save("label.npy", np.arange(600, dtype=np.int64))
    from_numpy("train_data", np.load("data.npy", mmap_mode="r"))
    from_numpy("train_label", np.load("label.npy", mmap_mode="r"))

    loader = DataLoader(
        {"data": DenseDataset("train_data"), "label": DenseDataset("train_label")},
        transform=lambda batch: batch,
    )

    for i, batch in enumerate(loader):  # noqa: B007 (the last batch is checked below)
        if i >= 256:
            break
    assert batch["data"].shape == (256, 8)
    assert batch["label"].shape == (256,)
    data = np.load("data.npy")
    np.testing.assert_array_equal(batch["data"], data[batch["label"]])
    loader.close()


def test_readme_collate_example(tmp_path, monkeypatch):
    """The README collate example: a padded token stream and labels through a transform."""
    monkeypatch.chdir(tmp_path)
    seqs = [np.arange(L, dtype=np.int32) for L in (3, 1, 4, 1, 5)] * 20
    from_iterator("tokens", seqs)
    padded, lengths = pad(RaggedDataset("tokens")[:], max_len=6)
    from_numpy("dense_tokens", padded)
    from_numpy("labels", lengths)
    dense_tokens, labelset = DenseDataset("dense_tokens"), DenseDataset("labels")

    def collate(batch):
        return {"input_ids": batch["tokens"], "label": batch["label"]}

    loader = DataLoader(
        {"tokens": dense_tokens, "label": labelset}, batch_size=32, transform=collate
    )
    batch = next(loader)
    assert set(batch) == {"input_ids", "label"}
    assert batch["input_ids"].shape == (32, 6) and batch["label"].shape == (32,)
    for row, length in zip(batch["input_ids"], batch["label"]):
        np.testing.assert_array_equal(row[:length], np.arange(length))
        assert not row[length:].any()
    loader.close()


# ---- determinism -------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("workers", [1, 2, 4, 8])
def test_batch_k_is_the_samplers_step_k(stores, streams, mode, workers):
    """For any worker count and completion order, batch k is the sampler's step k."""
    with DataLoader(
        streams,
        num_workers=workers,
        batch_size=16,
        prefetch_size=6,
        mode=mode,
        seed=7,
        transform=jitter,
    ) as loader:
        got = take(loader, 24)
    assert_same_batches(got, list(expected_batches(stores, 24, 16, mode, seed=7)))


def test_inline_mode_matches_workers(stores, streams):
    """num_workers=0 computes the same batches in the consumer's thread."""
    with DataLoader(streams, num_workers=0, batch_size=8, mode=2) as loader:
        got = take(loader, 15)
    assert_same_batches(got, list(expected_batches(stores, 15, 8, 2)))


def test_batches_are_fresh_arrays(streams):
    """A batch handed out is never overwritten by later batches."""
    with DataLoader(streams, num_workers=4, batch_size=8, prefetch_size=2) as loader:
        first = next(loader)
        kept = {name: array.copy() for name, array in first.items()}
        take(loader, 20)
    for name in kept:
        np.testing.assert_array_equal(first[name], kept[name])
    assert first["x"].flags.writeable and first["x"].flags.c_contiguous


def test_streams_line_up(streams):
    """Every stream is gathered at the same indices: row i of x belongs to label i."""
    with DataLoader(streams, batch_size=32) as loader:
        for batch in take(loader, 10):
            np.testing.assert_array_equal(batch["x"][:, 0], batch["y"] * 10)


# ---- resume --------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize(
    "stop, before, after", [(0, 4, 1), (1, 2, 8), (5, 1, 4), (37, 8, 0), (12, 3, 3)]
)
def test_resume_continues_exactly(stores, streams, mode, stop, before, after):
    """A state saved after `stop` batches resumes with batch `stop`, for any num_workers."""
    with DataLoader(streams, num_workers=before, batch_size=8, mode=mode, seed=3) as loader:
        take(loader, stop)
        state = loader.state_dict()
        continued = take(loader, 6)
    assert state["step"] == stop
    with DataLoader(streams, num_workers=after, batch_size=8, mode=mode, seed=3) as resumed:
        resumed.load_state_dict(json.loads(json.dumps(state)))
        assert resumed.state_dict() == state
        got = take(resumed, 6)
    assert_same_batches(got, continued)
    assert_same_batches(got, list(expected_batches(stores, 6, 8, mode, seed=3, first=stop)))


def test_state_dict_is_small_and_versioned(streams):
    """state_dict is a small, serializable dict with everything the check needs."""
    with DataLoader(streams, batch_size=8, mode=0, seed=5, shard=(1, 2)) as loader:
        take(loader, 3)
        state = loader.state_dict()
    assert state == {
        "version": 2,
        "step": 3,
        "seed": 5,
        "mode": 0,
        "batch_size": 8,
        "shard": [1, 2],
        "length": LENGTH,
        "global_batch": 16,
        "anchor": None,
    }
    assert len(msgpack.packb(state)) < 100


@pytest.mark.parametrize(
    "change",
    [
        {"seed": 43},
        {"mode": 2},
        {"batch_size": 16},
        {"shard": (0, 2)},
        {"length": LENGTH + 1},
        {"version": 3},
        {"step": -1},
        {"step": 1.5},
    ],
)
def test_load_state_dict_rejects_another_configuration(streams, change):
    """A state from another seed, mode, batch size, shard, length or version raises ValueError."""
    with DataLoader(streams, batch_size=8) as loader:
        state = loader.state_dict()
    state.update(change)
    with DataLoader(streams, batch_size=8) as fresh:
        with pytest.raises(ValueError):
            fresh.load_state_dict(state)


def test_load_state_dict_after_iterating_raises(streams):
    """Loading a state into a loader that already handed out batches is refused."""
    with DataLoader(streams, batch_size=8) as loader:
        state = loader.state_dict()
        next(loader)
        with pytest.raises(RuntimeError, match="before iterating"):
            loader.load_state_dict(state)
    with pytest.raises(ValueError, match="lacks"):
        DataLoader(streams, batch_size=8).load_state_dict({"version": 1, "step": 0})


# ---- sharding --------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_shards_concatenate_to_the_single_host_stream(stores, streams, mode):
    """The ranks' batches at each step, concatenated in rank order, are the unsharded batch."""
    world_size, share, steps = 3, 5, 12
    per_rank = []
    for rank in range(world_size):
        with DataLoader(
            streams, num_workers=2, batch_size=share, mode=mode, shard=(rank, world_size)
        ) as loader:
            per_rank.append(take(loader, steps))
    with DataLoader(streams, num_workers=3, batch_size=share * world_size, mode=mode) as single:
        whole = take(single, steps)
    for step in range(steps):
        for name in ("x", "y"):
            joined = np.concatenate([per_rank[rank][step][name] for rank in range(world_size)])
            np.testing.assert_array_equal(joined, whole[step][name], err_msg=f"step {step}")


# ---- failures --------------------------------------------------------------------


def test_transform_error_reaches_the_consumer(streams):
    """An exception in the transform is raised from next() at its step, chained, with its
    message."""

    def transform(batch):
        if batch["y"].sum() == boom_sum:
            raise KeyError("no such feature")
        return batch

    with DataLoader(streams, batch_size=8, mode=0) as probe:
        boom_sum = take(probe, 4)[3]["y"].sum()
    with DataLoader(streams, num_workers=4, batch_size=8, mode=0, transform=transform) as loader:
        take(loader, 3)
        with pytest.raises(LoaderError, match="no such feature") as caught:
            next(loader)
        assert isinstance(caught.value.__cause__, KeyError)
        assert caught.value.step == 3
        assert "transform" in str(caught.value)
        assert loader.state_dict()["step"] == 3
        with pytest.raises(LoaderError):
            next(loader)


def test_reading_error_reaches_the_consumer(stores):
    """A failing gather (here: a stream closed under the loader) surfaces instead of hanging."""
    root, _, _ = stores
    x, y = DenseDataset(root / "features"), DenseDataset(root / "labels")
    loader = DataLoader({"x": x, "y": y}, num_workers=2, batch_size=8, prefetch_size=2)
    next(loader)
    y.close()
    with pytest.raises(LoaderError, match="closed") as caught:
        take(loader, 5)
    assert "reading the batch" in str(caught.value)
    loader.close()
    x.close()


def test_close_is_prompt_with_full_queues_and_stuck_transforms(streams):
    """close() returns well under a second with full slots or a transform that blocks."""
    with DataLoader(streams, num_workers=4, batch_size=8, prefetch_size=4) as loader:
        next(loader)
        time.sleep(0.05)  # let the workers fill every slot
        started = time.monotonic()
        loader.close()
        assert time.monotonic() - started < 1.0
        with pytest.raises(RuntimeError, match="closed"):
            next(loader)

    baseline = threading.active_count()
    release = threading.Event()
    stuck = DataLoader(
        streams, num_workers=2, batch_size=8, transform=lambda batch: release.wait(30) and batch
    )
    waiter = threading.Thread(target=lambda: pytest.raises(RuntimeError, next, stuck))
    waiter.start()
    time.sleep(0.05)  # the consumer waits, both workers are inside the transform
    assert threading.active_count() == baseline + 3
    started = time.monotonic()
    stuck.close()
    assert time.monotonic() - started < 1.0
    waiter.join(2)
    assert not waiter.is_alive()
    release.set()  # the stuck workers finish their transform, drop the batch and end
    deadline = time.monotonic() + 5
    while threading.active_count() > baseline and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threading.active_count() == baseline


def test_create_close_cycles_leak_no_threads(streams):
    """100 loaders created, iterated and closed leave no threads behind; so does dropping one."""
    baseline = threading.active_count()
    for cycle in range(100):
        loader = DataLoader(streams, num_workers=4, batch_size=4, prefetch_size=3)
        next(loader)
        if cycle % 2:
            next(loader)
        loader.close()
    assert threading.active_count() == baseline
    dropped = DataLoader(streams, num_workers=4, batch_size=4)
    next(dropped)
    assert threading.active_count() == baseline + 4
    del dropped
    gc.collect()
    deadline = time.monotonic() + 2
    while threading.active_count() > baseline and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threading.active_count() == baseline


def test_at_most_prefetch_size_batches_in_flight(streams):
    """Workers never run more than prefetch_size steps ahead of the consumer."""
    lock = threading.Lock()
    counts = {"made": 0, "taken": 0, "most": 0}

    def transform(batch):
        with lock:
            counts["made"] += 1
            counts["most"] = max(counts["most"], counts["made"] - counts["taken"])
        return batch

    with DataLoader(
        streams, num_workers=8, batch_size=4, prefetch_size=3, transform=transform
    ) as loader:
        for _ in range(30):
            next(loader)
            with lock:
                counts["taken"] += 1
            time.sleep(0.002)
    assert 1 <= counts["most"] <= 3


# ---- the surface -------------------------------------------------------------------


def test_endless_iterator_and_context_manager(streams):
    """len() raises TypeError; the loader is its own iterator; with closes it."""
    with DataLoader(streams, batch_size=8) as loader:
        with pytest.raises(TypeError, match="endless"):
            len(loader)
        assert iter(loader) is loader
        assert loader.next()["x"].shape == (8, 10)
        assert loader.step == 1
    assert loader.closed
    with pytest.raises(RuntimeError, match="closed"):
        next(loader)


def test_rejects_bad_streams_and_arguments(stores, streams, tmp_path):
    """Empty, ragged, foreign or unequal streams and bad arguments raise clear errors."""
    root, _, _ = stores
    with pytest.raises(ValueError, match="empty"):
        DataLoader({})
    with pytest.raises(TypeError, match="dict"):
        DataLoader([streams["x"]])
    with pytest.raises(ValueError, match="DenseDataset"):
        DataLoader({"x": np.zeros((5, 2))})
    from_numpy(tmp_path / "short", np.zeros(LENGTH - 1))
    with (
        DenseDataset(tmp_path / "short") as short,
        pytest.raises(ValueError, match="equal lengths"),
    ):
        DataLoader({"x": streams["x"], "short": short})
    with pytest.raises(TypeError, match="callable"):
        DataLoader(streams, transform="collate")
    with pytest.raises(ValueError, match="num_workers"):
        DataLoader(streams, num_workers=-1)
    with pytest.raises(ValueError, match="prefetch_size"):
        DataLoader(streams, prefetch_size=0)
    with pytest.raises(ValueError, match="mode"):
        DataLoader(streams, mode=3)
    with pytest.raises(ValueError, match="CYCLIC"):
        DataLoader(streams, mode=2, batch_size=LENGTH + 1)
    with pytest.raises(ValueError, match="rank"):
        DataLoader(streams, shard=(2, 2))


# ---- regressions of issue 11 ---------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 2])
def test_keyboard_interrupt_in_the_transform_propagates_as_itself(streams, workers):
    """Ctrl-C in a transform is a KeyboardInterrupt for the consumer, not a LoaderError."""

    def transform(batch):
        raise KeyboardInterrupt

    loader = DataLoader(streams, num_workers=workers, batch_size=8, transform=transform)
    with pytest.raises(KeyboardInterrupt):
        next(loader)
    assert loader.closed


def test_mode_by_name(stores, streams):
    """mode="cyclic" is Sampler.Mode.CYCLIC."""
    with DataLoader(streams, batch_size=8, mode="cyclic", num_workers=1) as loader:
        assert_same_batches(
            take(loader, 3), list(expected_batches(stores, 3, 8, Sampler.Mode.CYCLIC))
        )


def test_dataloader_refuses_to_pickle(streams):
    """A DataLoader (threads, queues) cannot be pickled: a TypeError says what to send instead."""
    import pickle

    with DataLoader(streams, batch_size=8) as loader:
        with pytest.raises(TypeError, match="state_dict"):
            pickle.dumps(loader)


def test_the_first_batch_is_computed_alone(streams):
    """Time to first batch: the other workers start prefetching only once the
    first step is done, so it gets every core instead of sharing them with
    num_workers - 1 other batches."""
    lock, active, overlaps = threading.Lock(), [0], []

    def transform(batch):
        with lock:
            active[0] += 1
            first = not overlaps
            if first:
                overlaps.append(active[0])
        time.sleep(
            0.05 if first else 0.001
        )  # long enough for idle workers to join in, were they free to
        with lock:
            overlaps.append(active[0])
            active[0] -= 1
        return batch

    with DataLoader(
        streams, num_workers=4, batch_size=8, prefetch_size=4, transform=transform
    ) as loader:
        next(loader)
        next(loader)
    assert overlaps[:2] == [1, 1], overlaps


def test_an_edited_state_gets_its_own_message_and_the_saved_one_resumes(stores, streams):
    """The old Scaling-out recipe, {**state, "shard": [r, w], "batch_size": b} with
    another global batch, raised "the state is damaged"; it now says the state was
    edited and that the unedited state resumes by itself, which it does, exactly."""
    with DataLoader(streams, num_workers=0, batch_size=8, mode="sequential") as loader:
        take(loader, 3)
        state = loader.state_dict()
    with DataLoader(streams, num_workers=0, batch_size=8, mode="sequential", shard=(0, 2)) as rank0:
        with pytest.raises(
            ValueError, match=r"its batch_size or shard was edited after state_dict\(\) returned it"
        ):
            rank0.load_state_dict({**state, "shard": [0, 2], "batch_size": 8})
    rows = []
    for rank in range(2):
        with DataLoader(
            streams, num_workers=0, batch_size=8, mode="sequential", shard=(rank, 2)
        ) as resumed:
            resumed.load_state_dict(state)
            rows.append(next(resumed)["y"])
    # 3 batches of 8 were read: the 16-row global batch continues at sample 24.
    np.testing.assert_array_equal(np.concatenate(rows), (24 + np.arange(16)) % LENGTH)
