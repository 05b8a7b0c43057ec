"""Transforms in worker processes: same batches as threads, errors, crashes, prompt close."""

import os
import threading
import time

import numpy as np
import pytest

from loaderx import DataLoader, DenseDataset, RaggedDataset, from_iterator, from_numpy
from loaderx.dataloader import LoaderError

LENGTH = 80


# Module-level, so the spawned children can unpickle them.
def python_transform(batch):
    """Pure Python work on every sample, and a result of nested arrays and plain values."""
    tokens = batch["tokens"]
    sums = [int(tokens[i].sum()) for i in range(len(tokens))]
    return {
        "x": batch["x"] * 2,
        "tokens": tokens,
        "extra": (np.array(sums), {"count": len(sums), "name": "ok"}),
    }


def fail_at_step_3(batch):
    if 3 * 8 <= int(batch["x"][0]) < 4 * 8:
        raise ValueError(f"bad sample {int(batch['x'][0])}")
    return batch


class Unpicklable(Exception):
    def __init__(self, handle):
        super().__init__("unpicklable")
        self.handle = handle


def raise_unpicklable(batch):
    raise Unpicklable(lambda: None)


def die_at_step_2(batch):
    if 2 * 8 <= int(batch["x"][0]) < 3 * 8:
        os._exit(7)
    return batch


def grow_result(batch):
    """Results larger than any block so far, growing with the step: the output block is replaced."""
    return {"big": np.full(50_000 * (1 + int(batch["x"][0]) // 8), batch["x"][0])}


def stuck(batch):
    time.sleep(60)
    return batch


@pytest.fixture(scope="module")
def streams(tmp_path_factory):
    root = tmp_path_factory.mktemp("processes")
    from_numpy(root / "x", np.arange(LENGTH, dtype=np.int64))
    from_iterator(root / "tokens", [np.arange(i % 9, dtype=np.int32) + i for i in range(LENGTH)])
    opened = {"x": DenseDataset(root / "x"), "tokens": RaggedDataset(root / "tokens")}
    yield opened
    for dataset in opened.values():
        dataset.close()


def shm_files():
    return (
        {name for name in os.listdir("/dev/shm") if name.startswith("loaderx-")}
        if os.path.isdir("/dev/shm")
        else set()
    )


def assert_same(got, want):
    np.testing.assert_array_equal(got["x"], want["x"])
    assert got["tokens"] == want["tokens"]
    np.testing.assert_array_equal(got["extra"][0], want["extra"][0])
    assert got["extra"][1] == want["extra"][1]


def test_processes_give_the_threads_batches_and_resume_exactly(streams):
    """Processes return what threads return, step for step (dense, ragged, nested results),
    and a state saved from a process loader resumes exactly; no block is left in /dev/shm."""
    before = shm_files()
    with DataLoader(
        streams, num_workers=1, batch_size=8, mode=0, transform=python_transform
    ) as threads:
        want = [next(threads) for _ in range(12)]
    with DataLoader(
        streams,
        num_workers=2,
        batch_size=8,
        mode=0,
        transform=python_transform,
        transform_processes=True,
    ) as processes:
        got = [next(processes) for _ in range(6)]
        state = processes.state_dict()
        assert processes.stats()["transform_seconds"] > 0
    for a, b in zip(got, want):
        assert_same(a, b)
    with DataLoader(
        streams,
        num_workers=2,
        batch_size=8,
        mode=0,
        transform=python_transform,
        transform_processes=True,
    ) as resumed:
        resumed.load_state_dict(state)
        for a, b in zip([next(resumed) for _ in range(6)], want[6:]):
            assert_same(a, b)
        assert shm_files() <= before  # blocks are unlinked as soon as they are made
    assert shm_files() <= before


def test_results_larger_than_the_blocks(streams):
    """A result that outgrows the output block (several times) comes back whole."""
    with DataLoader(
        streams,
        num_workers=1,
        batch_size=8,
        mode=0,
        transform=grow_result,
        transform_processes=True,
    ) as loader:
        for step in range(4):
            big = next(loader)["big"]
            assert big.shape == (50_000 * (1 + step),) and (big == step * 8).all()


def test_transform_errors_and_crashes_surface(streams):
    """An exception in the child is raised at its step, chained; one that cannot be pickled
    and a child that dies are failures of their step too."""
    with DataLoader(
        streams,
        num_workers=2,
        batch_size=8,
        mode=0,
        transform=fail_at_step_3,
        transform_processes=True,
    ) as loader:
        for _ in range(3):
            next(loader)
        with pytest.raises(
            LoaderError, match="batch 3: transform raised ValueError: bad sample 24"
        ) as caught:
            next(loader)
        assert isinstance(caught.value.__cause__, ValueError) and loader.closed
    with DataLoader(
        streams, num_workers=1, batch_size=8, transform=raise_unpicklable, transform_processes=True
    ) as loader:
        with pytest.raises(LoaderError, match="Unpicklable"):
            next(loader)
    with DataLoader(
        streams,
        num_workers=1,
        batch_size=8,
        mode=0,
        transform=die_at_step_2,
        transform_processes=True,
    ) as loader:
        next(loader), next(loader)
        with pytest.raises(LoaderError, match="process ended"):
            next(loader)


def test_close_is_prompt_with_a_stuck_process(streams):
    """close() kills children stuck in the transform and returns promptly; a consumer
    waiting in next() is released with an error."""
    loader = DataLoader(
        streams,
        num_workers=2,
        batch_size=8,
        transform=stuck,
        transform_processes=True,
        prefetch_size=2,
    )
    outcome = []
    waiter = threading.Thread(target=lambda: outcome.append(_next_or_error(loader)), daemon=True)
    waiter.start()
    waiter.join(1.5)
    assert waiter.is_alive() and loader._pipeline is not None  # stuck in the transform
    runners = loader._pipeline.runners
    started = time.monotonic()
    loader.close()
    assert time.monotonic() - started < 3.0
    waiter.join(3.0)
    assert isinstance(outcome[0], RuntimeError)
    assert all(not runner.process.is_alive() for runner in runners)


def _next_or_error(loader):
    try:
        return next(loader)
    except Exception as exc:
        return exc


def test_process_transform_arguments(streams):
    """Unpicklable transforms and processes without workers are refused up front."""
    with pytest.raises(TypeError, match="picklable"):
        DataLoader(streams, transform=lambda batch: batch, transform_processes=True)
    with pytest.raises(ValueError, match="num_workers"):
        DataLoader(streams, num_workers=0, transform=python_transform, transform_processes=True)
