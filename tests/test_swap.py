"""The one directory swap on the real file system: concurrent overwriters and
readers (processes, for a bounded time each), a copied ArrayStore with a
leftover commit record, and shards.commit beside a running writer.

The power-loss and fault sweeps of the same protocol are in test_swap_sim.py.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from loaderx import ArrayStore, DenseDataset, StoreLockedError, from_numpy, shards

RACE_SECONDS = 3.0  # how long each racing process runs (a bound, not a measurement)
ARRAYS = [np.full((200, 16), value, dtype=np.float32) for value in range(3)]


def _overwriter(path: str, index: int, deadline: float, results) -> None:
    outcomes = {"ok": 0, "locked": 0}
    try:
        while time.monotonic() < deadline:
            try:
                from_numpy(path, ARRAYS[index], codec="raw", progress=False)
                outcomes["ok"] += 1
            except StoreLockedError:
                outcomes["locked"] += 1
    except BaseException as exc:  # any other error is the bug this test is about
        results.put(("error", f"writer {index}: {type(exc).__name__}: {exc}"))
        return
    results.put(("writer", outcomes))


def _reader(path: str, deadline: float, results) -> None:
    opens = 0
    values = {float(array[0, 0]) for array in ARRAYS}
    try:
        while time.monotonic() < deadline:
            if not os.path.exists(os.path.join(path, "superblock")) and opens == 0:
                continue  # not created yet
            with DenseDataset(path) as dataset:
                data = dataset[:]
            assert (
                data.shape == (200, 16)
                and float(data[0, 0]) in values
                and (data == data[0, 0]).all()
            ), "a mixed store"
            opens += 1
    except BaseException as exc:
        results.put(("error", f"reader after {opens} opens: {type(exc).__name__}: {exc}"))
        return
    results.put(("reader", opens))


def test_concurrent_overwriters_and_a_reader(tmp_path):
    """Regression: three processes re-running the same conversion at once
    left a store holding only lock or schema.msgpack, losers got
    ZrecordError/CorruptStoreError/FileNotFoundError, and a reader got "has
    no superblock". Now every loser gets StoreLockedError, every open sees
    one whole store, and the store opens whole afterwards."""
    path = str(tmp_path / "store")
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    deadline = time.monotonic() + RACE_SECONDS
    processes = [
        context.Process(target=_overwriter, args=(path, index, deadline, results))
        for index in range(3)
    ]
    processes.append(context.Process(target=_reader, args=(path, deadline + 0.5, results)))
    for process in processes:
        process.start()
    reports = [results.get(timeout=RACE_SECONDS + 60) for _ in processes]
    for process in processes:
        process.join(timeout=30)
    errors = [report[1] for report in reports if report[0] == "error"]
    assert not errors, errors
    writers = [report[1] for report in reports if report[0] == "writer"]
    assert sum(outcome["ok"] for outcome in writers) >= 1
    print(
        f"\nwriters {writers}, reader opens "
        f"{[report[1] for report in reports if report[0] == 'reader']}"
    )
    with DenseDataset(path) as dataset:
        data = dataset[:]
    assert any(np.array_equal(data, array) for array in ARRAYS)
    assert sorted(os.listdir(tmp_path)) == [".lock-store", "store"]


def test_a_directory_of_a_killed_first_creation_is_reused(tmp_path):
    """Regression: a first conversion killed while zrecord created the store
    left only superblock.tmp-<pid> (and lock); the rerun raised "not a
    loaderx store" and Zrecord(path) CorruptStoreError. Both now work."""
    from loaderx import Zrecord

    for leftovers in (["superblock.tmp-4242"], ["lock", "superblock.tmp-7"]):
        path = tmp_path / f"store{len(leftovers)}"
        path.mkdir()
        for name in leftovers:
            (path / name).write_bytes(b"")
        with Zrecord(path) as store:
            assert len(store) == 0
        for name in os.listdir(path):
            os.unlink(path / name)
        for name in leftovers:
            (path / name).write_bytes(b"")
        assert from_numpy(path, ARRAYS[0], progress=False) == 200
        with DenseDataset(path) as dataset:
            assert dataset[:].tolist() == ARRAYS[0].tolist()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "superblock.tmp-x").write_bytes(b"mine")  # not a pid: not a store's leftover
    with pytest.raises(ValueError, match="not a loaderx store"):
        from_numpy(foreign, ARRAYS[0], progress=False)
    assert os.listdir(foreign) == ["superblock.tmp-x"]


_KILLED_SAVE = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    import loaderx._arraycommit as arraycommit
    from loaderx import ArrayStore

    def killed(*args):
        os._exit(9)  # as SIGKILL: the commit record is durable, no swap done

    arraycommit.roll_forward = killed
    store = ArrayStore(sys.argv[1])
    store.save({"x": np.arange(5), "y": np.ones(3)})
    """
)


def test_a_copied_store_with_a_leftover_commit_record_opens(tmp_path):
    """Regression: the commit record named the new directories by inode
    number, so a copy (cp -a, tar, a backup) of a store holding a leftover
    record raised "the directory was copied ... restore it from a backup".
    Generation ids survive the copy: the copy replays the record."""
    root = tmp_path / "store"
    with ArrayStore(root) as store:
        store.save({"x": np.zeros(2), "y": np.zeros(4)})
    subprocess.run(
        [sys.executable, "-c", _KILLED_SAVE, str(root)],
        check=False,
        timeout=120,
        env={**os.environ},
    )
    assert (root / ".commit.msgpack").exists()
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-a", str(root), str(copy)], check=True, timeout=60)
    with ArrayStore(copy) as store:
        assert store.load("x").tolist() == list(range(5)) and store.load("y").tolist() == [
            1.0,
            1.0,
            1.0,
        ]
    assert not (copy / ".commit.msgpack").exists()


def test_commit_refuses_while_a_real_writer_runs(tmp_path):
    """Regression: shards.commit deleted the temporary directory of a
    write_shard still running for another shard, and that writer failed.
    Now commit raises StoreLockedError and the writer finishes."""
    path = tmp_path / "d"
    shards.write_shard(path, 0, np.arange(10))
    started, release = threading.Event(), threading.Event()
    failures = []

    def records():
        yield np.arange(3)
        started.set()
        assert release.wait(60)
        yield np.arange(2)

    def write() -> None:
        try:
            shards.write_shard(path, 1, records(), codec="zstd")
        except BaseException as exc:
            failures.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    assert started.wait(60)
    try:
        with pytest.raises(StoreLockedError, match="write_shard is running"):
            shards.commit(path)
        assert (path / ".new-shard-00001").exists()
    finally:
        release.set()
        writer.join(60)
    assert not failures, failures
    with pytest.raises(ValueError, match="ragged"):
        shards.commit(path)  # shard 1 is ragged, shard 0 dense: commit runs now, and checks them
    shutil.rmtree(path / "shard-00001")
    shards.write_shard(path, 1, np.arange(5))
    assert shards.commit(path) == 15


def test_a_directory_that_cannot_be_swapped_away_gets_its_store_in_place(tmp_path, monkeypatch):
    """A first conversion into an empty directory that cannot be swapped (a
    mount point, or a parent this process may not write: simulated here)
    writes the store in place, and a failed one leaves the directory empty."""
    from loaderx import _fs, from_iterator

    monkeypatch.setattr(_fs.OsFs, "replaceable", lambda self, path: False)
    target = tmp_path / "mount"
    target.mkdir()

    def broken():
        yield np.arange(3)
        raise OSError("source broke")

    with pytest.raises(OSError, match="source broke"):
        from_iterator(target, broken(), progress=False)
    assert os.listdir(target) == [] and os.listdir(tmp_path) == ["mount"]
    assert from_numpy(target, ARRAYS[1], progress=False) == 200
    with DenseDataset(target) as dataset:
        assert np.array_equal(dataset[:], ARRAYS[1])
