"""ArrayStore's logical row drops (issue 29): ``drop(name, rows)`` appends a
record to the array's delete log, reads skip the dropped rows, ``compact()``
rewrites the array without them. The power-cut and fault side is in
tests/test_arraystore_sim.py."""

from __future__ import annotations

import errno
import itertools
import os
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

from loaderx import ArrayStore, ArrayStoreIOError, _arraydrop, _arrayview, _envelope
from loaderx._arraycommit import FORMAT_NAME, MARKER_FILE
from loaderx._fs import OsFs
from loaderx.zrecord import CorruptStoreError

X = np.arange(60, dtype=np.float32).reshape(20, 3)


@pytest.fixture
def root(tmp_path):
    return str(tmp_path / "store")


def log_of(root: str, name: str) -> str:
    return os.path.join(root, _arraydrop.DELETES_PREFIX + name)


def marker_version(root: str) -> int:
    payload = Path(root, MARKER_FILE).read_bytes()
    return _envelope.unseal(payload, FORMAT_NAME, 99)[0]


def test_reads_skip_dropped_rows_with_every_selector(root):
    """After drops, every read addresses the remaining rows in order, as
    np.delete of the same rows would leave them."""
    with ArrayStore(root) as store:
        store.save({"x": X})
        store.drop("x", [1, 3, 5])
        store.drop("x", slice(0, 4))
        store.drop("x", -1)
        expected = np.delete(np.delete(np.delete(X, [1, 3, 5], 0), slice(0, 4), 0), -1, 0)
        assert store.get_shape("x") == expected.shape
        assert np.array_equal(store.load("x"), expected)
        lazy = store.load("x", lazy=True)
        assert len(lazy) == len(expected) and lazy.shape == expected.shape
        mask = np.arange(len(expected)) % 3 == 0
        for key in (0, -1, slice(2, 9, 2), slice(None, None, -1), [4, 0, 4], mask):
            assert np.array_equal(store.getitem("x", key), expected[key]), key
            assert np.array_equal(lazy[key], expected[key]), key
        assert np.array_equal(lazy[np.array([[0, 1], [2, 3]])], expected[[[0, 1], [2, 3]]])
        assert np.array_equal(lazy[1:4, 2], expected[1:4, 2])
        assert np.array_equal(lazy[..., 1], expected[..., 1])
        assert np.array_equal(np.concatenate(list(store.stream_load("x", 4))), expected)
        assert np.array_equal(np.stack(list(lazy)), expected)
        with pytest.raises(IndexError, match="out of range"):
            store.getitem("x", len(expected))


@pytest.mark.parametrize("durable", [True, False])
def test_drops_survive_a_reopen(root, durable):
    with ArrayStore(root, durable=durable) as store:
        store.save({"x": X})
        store.drop("x", [0, 19, 7])
    with ArrayStore(root) as store:
        assert np.array_equal(store.load("x"), np.delete(X, [0, 19, 7], 0))


def test_replace_and_append_after_a_drop_address_the_remaining_rows(root):
    with ArrayStore(root) as store:
        store.save({"x": X})
        store.drop("x", [2, 4])
        expected = np.delete(X, [2, 4], 0)
        store.replace({"x": np.full((2, 3), -1, np.float32)}, [2, 0])
        expected[[2, 0]] = -1
        store.append({"x": np.full((3, 3), 9, np.float32)})
        expected = np.concatenate([expected, np.full((3, 3), 9, np.float32)])
        store.drop("x", [-2, 1])  # an appended row, and an old one
        expected = np.delete(expected, [-2, 1], 0)
        store.replace({"x": np.full((1, 3), 5, np.float32)}, -1)
        expected[-1] = 5
        assert np.array_equal(store.load("x"), expected)
    with ArrayStore(root) as store:
        assert np.array_equal(store.load("x"), expected)


def test_compact_rewrites_without_the_dropped_rows_and_deletes_the_log(root):
    with ArrayStore(root) as store:
        store.save({"x": X, "y": np.arange(5)})
        store.drop("x", list(range(0, 20, 2)))
        assert os.path.exists(log_of(root, "x"))
        before = store.get_metadata()["arrays"]["x"]["disk_bytes"]
        store.compact()
        store.sync()
        assert not os.path.exists(log_of(root, "x"))
        assert np.array_equal(store.load("x"), X[1::2])
        assert store.get_metadata()["arrays"]["x"]["disk_bytes"] < before
        assert np.array_equal(store.load("y"), np.arange(5))
    with ArrayStore(root) as store:
        assert np.array_equal(store.load("x"), X[1::2])
        assert marker_version(root) == 3  # the store may hold logs again


def test_a_save_or_drop_of_the_array_ends_its_log(root):
    with ArrayStore(root) as store:
        store.save({"x": X, "y": X})
        store.drop("x", [0])
        store.drop("y", [0])
        store.save({"x": X[:5]})
        store.drop("y")
        store.sync()
        assert not os.path.exists(log_of(root, "x")) and not os.path.exists(log_of(root, "y"))
        assert np.array_equal(store.load("x"), X[:5])
        store.save({"y": X[:2]})
        assert np.array_equal(store.load("y"), X[:2])
    with ArrayStore(root) as store:
        assert np.array_equal(store.load("x"), X[:5]) and np.array_equal(store.load("y"), X[:2])


def test_a_stale_log_names_nothing_and_recovery_deletes_it(root):
    """A log of an older directory of the name (a cut between the swap and
    the log's deletion) is ignored; the next writer deletes it."""
    with ArrayStore(root) as store:
        store.save({"x": X})
        store.drop("x", [0, 1])
        stale = Path(log_of(root, "x")).read_bytes()
        store.save({"x": X})  # a new directory: the log is stale
        store.sync()
    with open(log_of(root, "x"), "wb") as handle:
        handle.write(stale)
    with ArrayStore(root) as store:
        assert np.array_equal(store.load("x"), X)
        store.drop([])  # a write: the writer's recovery
        assert not os.path.exists(log_of(root, "x"))


def test_a_torn_tail_is_ignored_and_written_over(root):
    with ArrayStore(root) as store:
        store.save({"x": X})
        store.drop("x", [0])
        whole = os.path.getsize(log_of(root, "x"))
        store.drop("x", [0])
    with open(log_of(root, "x"), "r+b") as handle:
        handle.truncate(os.path.getsize(log_of(root, "x")) - 3)  # the second record, torn
    with ArrayStore(root) as store:
        assert np.array_equal(store.load("x"), X[1:])
        store.drop("x", [5])
        assert os.path.getsize(log_of(root, "x")) > whole
    with ArrayStore(root) as store:
        assert np.array_equal(store.load("x"), np.delete(X[1:], 5, 0))


def test_a_record_that_fails_the_crc_chain_ends_the_log(root):
    """The CRC chain: a damaged record and every one after it name nothing."""
    with ArrayStore(root) as store:
        store.save({"x": X})
        store.drop("x", [0])
        second = os.path.getsize(log_of(root, "x"))
        store.drop("x", [0])
        store.drop("x", [0])
    with open(log_of(root, "x"), "r+b") as handle:
        handle.seek(second + _arraydrop.RECORD.size)
        byte = handle.read(1)
        handle.seek(second + _arraydrop.RECORD.size)
        handle.write(bytes([byte[0] ^ 1]))
    with ArrayStore(root) as store:
        assert np.array_equal(store.load("x"), X[1:])


def test_a_checked_record_naming_missing_rows_is_damage(root):
    with ArrayStore(root) as store:
        store.save({"x": X})
        store.drop("x", [0])
        log = Path(log_of(root, "x")).read_bytes()
    head = _arraydrop.read_header(log, "log")
    assert head is not None
    _, offset, crc = head
    kind, payload = _arraydrop.encode(np.array([25], dtype=np.uint64))
    body = _arraydrop.RECORD.pack(kind, len(payload), 30) + payload
    forged = log[:offset] + body + _arraydrop.CRC.pack(zlib.crc32(body, crc))
    with open(log_of(root, "x"), "wb") as handle:
        handle.write(forged)
    with ArrayStore(root) as store, pytest.raises(CorruptStoreError, match="names rows"):
        store.load("x")


def test_the_first_drop_seals_the_marker_at_version_3(root):
    """A loaderx that reads at most version 2 refuses the store once it may
    hold a delete log (it would read dropped rows); a store without one
    stays at version 2."""
    with ArrayStore(root) as store:
        store.save({"x": X})
        assert marker_version(root) == 2
        store.drop("x", [1])
        assert marker_version(root) == 3
        assert store.get_metadata()["version"] == 3
    payload = Path(root, MARKER_FILE).read_bytes()
    with pytest.raises(_envelope.EnvelopeError) as info:
        _envelope.unseal(payload, FORMAT_NAME, 2)
    assert info.value.reason == _envelope.NEWER


@pytest.mark.parametrize(
    "ids",
    [[0], [3, 4, 5, 9], list(range(0, 1000, 2)), list(range(100, 200)), [0, 999]],
    ids=["one", "runs", "every-other", "one-run", "far-apart"],
)
def test_records_encode_and_decode_to_the_same_rows(ids):
    base = np.array(ids, dtype=np.uint64)
    kind, payload = _arraydrop.encode(base)
    mask = np.zeros(1000, dtype=bool)
    mask[ids] = True
    assert _arraydrop.encode_mask(mask, len(ids)) == (kind, payload)  # a mask past the rows
    assert kind in (_arraydrop.RUNS, _arraydrop.BITMAP)
    decoded = _arraydrop.decode(kind, payload, 1000)
    assert decoded is not None and decoded.tolist() == ids
    assert _arraydrop.decode(kind, payload, max(ids)) is None  # rows past the array


def test_batch_mode_after_a_drop(root):
    with ArrayStore(root) as store:
        store.save({"x": X})
        store.drop("x", [0, 1])
        expected = X[2:].copy()
        with store.batch_mode():
            assert np.array_equal(store.load("x"), expected)
            store.replace({"x": np.zeros((1, 3), np.float32)}, [0])
            store.drop("x", [1])
            store.append({"x": np.ones((1, 3), np.float32)})
        expected[0] = 0
        expected = np.concatenate([np.delete(expected, 1, 0), np.ones((1, 3), np.float32)])
        store.sync()
        assert np.array_equal(store.load("x"), expected)
        assert not os.path.exists(log_of(root, "x"))  # rewritten whole: the log went with it
        store.drop("x", [0])
        with store.batch_mode():  # only rows replaced: an in-place replace of the live rows
            store.replace({"x": np.full((1, 3), 7, np.float32)}, [0])
        expected = expected[1:].copy()
        expected[0] = 7
        assert np.array_equal(store.load("x"), expected)
    with ArrayStore(root) as store:
        assert np.array_equal(store.load("x"), expected)


def test_writable_batch_mode_after_a_drop(root):
    with ArrayStore(root) as store:
        store.save({"x": X})
        store.drop("x", [0, 5])
        expected = np.delete(X, [0, 5], 0)
        with store.writable_batch_mode():
            array = store.load("x")
            assert np.array_equal(array, expected)
            array[4] = -3
        expected[4] = -3
        assert np.array_equal(store.load("x"), expected)
    with ArrayStore(root) as store:
        assert np.array_equal(store.load("x"), expected)


def test_a_reader_sees_the_writers_drops(root):
    with ArrayStore(root) as writer:
        writer.save({"x": X})
        reader = ArrayStore(root)
        try:
            assert np.array_equal(reader.load("x"), X)
            writer.drop("x", [3])
            assert np.array_equal(reader.load("x"), np.delete(X, 3, 0))
            writer.drop("x", [0])
            writer.append({"x": X[:1]})
            expected = np.concatenate([np.delete(X, [0, 3], 0), X[:1]])
            assert np.array_equal(reader.getitem("x", slice(None)), expected)
        finally:
            reader.close()


def test_clone_dataset_export_and_pack_see_the_live_rows(root, tmp_path):
    with ArrayStore(root) as store:
        store.save({"x": X})
        store.drop("x", [1, 2])
        expected = np.delete(X, [1, 2], 0)
        store.clone("x", "y")
        assert np.array_equal(store.load("y"), expected)
        store.export(str(tmp_path / "x.npy"), names=["x"])
        assert np.array_equal(np.load(tmp_path / "x.npy"), expected)
        store.pack(tmp_path / "p.pack")
        dataset = store.dataset("x")  # the dropped rows go first: a dataset reads records
        try:
            assert np.array_equal(dataset[:], expected)
        finally:
            dataset.close()
    with ArrayStore.unpack(tmp_path / "p.pack", tmp_path / "unpacked") as unpacked:
        assert np.array_equal(unpacked.load("x"), expected)


class FailingWrites(OsFs):
    """The real disk, with ``write_at`` or ``fsync_file`` failing on cue."""

    def __init__(self) -> None:
        super().__init__()
        self.failing: set[str] = set()

    def write_at(self, path, offset, payload):
        if "write_at" in self.failing:
            raise OSError(errno.EIO, f"cannot write '{path}' (test fault)")
        super().write_at(path, offset, payload)

    def fsync_file(self, path):
        if "fsync_file" in self.failing:
            self.failing.discard("fsync_file")  # one-shot: the take-back's fsync works
            raise OSError(errno.EIO, f"cannot fsync '{path}' (test fault)")
        super().fsync_file(path)


def test_a_failed_drop_changes_nothing_and_says_so(root):
    fs = FailingWrites()
    with ArrayStore(root, _fs=fs) as store:
        store.save({"x": X})
        store.drop("x", [0])
        fs.failing = {"fsync_file"}
        with pytest.raises(ArrayStoreIOError, match="nothing changed") as info:
            store.drop("x", [0])
        assert info.value.outcome == "unchanged" and info.value.errno == errno.EIO
        assert np.array_equal(store.load("x"), X[1:])
        fs.failing = {"write_at"}
        with pytest.raises(ArrayStoreIOError, match="may or may not") as info:
            store.drop("x", [0])
        assert info.value.outcome == "unknown"
        fs.failing = set()
        store.drop("x", [0])
    with ArrayStore(root) as store:
        assert np.array_equal(store.load("x"), X[2:])


def test_drop_rows_checks_everything_before_writing(root):
    with ArrayStore(root) as store:
        store.save({"x": X, "s": np.array(1.5)})
        with pytest.raises(IndexError, match="out of range"):
            store.drop(["x"], [0, 20])
        with pytest.raises(ValueError, match="0-d"):
            store.drop(["x", "s"], [0])
        assert not os.path.exists(log_of(root, "x"))
        assert np.array_equal(store.load("x"), X)


def test_a_drop_after_appends_syncs_them_first(root, monkeypatch):
    """A record may only name rows the store keeps through a power cut: with
    appends since the last sync, the drop syncs the store first."""
    with ArrayStore(root, durable=False) as store:
        store.save({"x": X})
        store.append({"x": X[:2]})
        entry = store._entry("x")
        synced = []
        original = entry.store.sync
        monkeypatch.setattr(entry.store, "sync", lambda: (synced.append(1), original())[1])
        store.drop("x", [20])
        assert synced == [1]
        store.drop("x", [0])
        assert synced == [1]  # nothing appended since
        assert np.array_equal(store.load("x"), np.delete(np.concatenate([X, X[:2]]), [0, 20], 0))


def reference_payload(mask: np.ndarray) -> tuple[int, bytes]:
    """A record's payload by the format's words (runs or bitmap, the
    smaller), from a plain loop over ``mask``."""
    rows = [i for i, dropped in enumerate(mask.tolist()) if dropped]
    runs: list[list[int]] = []
    for row in rows:
        if runs and runs[-1][1] == row:
            runs[-1][1] = row + 1
        else:
            runs.append([row, row + 1])
    first, last = rows[0], rows[-1]
    bitmap = bytearray((last - first) // 8 + 1)
    for row in rows:
        bitmap[(row - first) // 8] |= 1 << ((row - first) % 8)
    if len(runs) * 16 <= 8 + len(bitmap):
        return _arraydrop.RUNS, b"".join(struct.pack("<QQ", *run) for run in runs)
    return _arraydrop.BITMAP, struct.pack("<Q", first) + bytes(bitmap)


@pytest.mark.parametrize("popcount", [True, False], ids=["bitwise_count", "numpy-1"])
def test_records_encode_as_the_format_says(monkeypatch, popcount):
    """Runs counted on packed words (across word edges, with and without
    NumPy's bitwise_count) and the last row found from the tail block by
    block give the bytes the format defines."""
    if not popcount:
        monkeypatch.setattr(_arraydrop, "_POPCOUNT", None)
    monkeypatch.setattr(_arraydrop, "_TAIL_ROWS", 50)  # several tail blocks
    rng = np.random.default_rng(29)
    masks = []
    for size in (1, 63, 64, 65, 127, 128, 129, 700):
        masks.append(rng.random(size) < 0.5)  # bitmaps
        clustered = np.zeros(size, dtype=bool)
        for start in rng.integers(0, size, 3):
            clustered[start : start + 40] = True  # runs, some across word edges
        masks.append(clustered)
    masks.append(np.r_[np.zeros(5, bool), np.ones(64, bool), np.zeros(300, bool)])
    masks.append(np.r_[np.zeros(1000, bool), True, np.zeros(10, bool)])
    for mask in masks:
        if not mask.any():
            mask[-1] = True
        expected = reference_payload(mask)
        assert _arraydrop.encode_mask(mask, int(mask.sum())) == expected, mask.nonzero()


@pytest.fixture
def small_chunks(monkeypatch):
    """Drops of an array with drops map rows a chunk of 7 base rows at a
    time, so a small array spans chunks with and without drops."""
    monkeypatch.setattr(_arrayview, "_CHUNK_ROWS", 7)


def lazy_step(store: ArrayStore, expected: np.ndarray, step: str, k: int) -> np.ndarray:
    """One call of ``step`` on ``x`` after a drop, checked against NumPy;
    returns the expected array after it."""
    n = len(expected)
    if step == "append":
        rows = np.full((3, 3), 100 + k, np.float32)
        store.append({"x": rows})
        return np.concatenate([expected, rows])
    if step == "replace":
        at = [n - 1, 0, n // 2]
        rows = np.arange(9, dtype=np.float32).reshape(3, 3) - 10 * k
        store.replace({"x": rows}, at)
        expected = expected.copy()
        expected[at] = rows
        return expected
    if step == "len":
        assert len(store.load("x", lazy=True)) == n and store.get_shape("x") == (n, 3)
        return expected
    if step == "read":
        picks = np.array([n - 1, 0, n // 3, n // 3, 1])
        assert np.array_equal(store.getitem("x", picks), expected[picks])
        assert np.array_equal(store.getitem("x", slice(1, None, 3)), expected[1::3])
        assert np.array_equal(store.load("x"), expected)
        return expected
    rows = np.array([n - 1, 1, n // 2, 1, n - 2], dtype=np.int64)  # a repeat, unsorted
    store.drop("x", rows)
    return np.delete(expected, rows, 0)


LAZY_STEPS = ("append", "replace", "len", "read", "drop")


@pytest.mark.parametrize(
    "order", list(itertools.permutations(LAZY_STEPS)), ids=lambda order: "-".join(order)
)
def test_every_order_of_calls_after_a_drop_sees_the_remaining_rows(root, small_chunks, order):
    """A drop builds no map of the live rows: the first call that needs it
    does. After a drop, appends, replaces, len, reads and further drops in
    every order address the remaining rows as np.delete leaves them, and a
    reopen replays the same."""
    x = np.arange(120, dtype=np.float32).reshape(40, 3)
    with ArrayStore(root, durable=False) as store:
        store.save({"x": x})
        first = np.array([0, 3, 4, 5, 6, 7, 8, 9, 17, 39, 38])  # a whole chunk, and edges
        store.drop("x", first)
        expected = np.delete(x, first, 0)
        for k, step in enumerate(order):
            expected = lazy_step(store, expected, step, k)
            expected = lazy_step(store, expected, "read", k)
    with ArrayStore(root) as store:
        assert np.array_equal(store.load("x"), expected)


def test_a_drop_leaves_the_map_of_live_rows_to_the_first_read(root):
    with ArrayStore(root) as store:
        store.save({"x": X})
        store.drop("x", np.array([2, 5], dtype=np.int64))
        entry = store._entry("x")
        assert entry.live_rows is not None and entry.live_rows._map is None
        assert len(store.load("x", lazy=True)) == 18 and entry.live_rows._map is None
        store.drop("x", np.array([-1, 0], dtype=np.int64))  # negative rows count from the end
        assert entry.live_rows._map is None
        assert np.array_equal(store.getitem("x", [0, -1]), X[[1, 18]])
        assert entry.live_rows._map is not None
        store.append({"x": X[:1]})  # a built map grows with the mask
        assert entry.live_rows._map is not None
        assert np.array_equal(
            store.load("x"), np.concatenate([np.delete(X, [0, 2, 5, 19], 0), X[:1]])
        )


@pytest.mark.parametrize(
    "rows", [[0, 25], [-31], [3, -40]], ids=["past-end", "before-start", "mixed"]
)
def test_an_int64_row_array_out_of_range_is_refused_before_any_record(root, rows):
    """An int64 array is scattered into the drop's mask as it is (no range
    pass of its own): a row out of range in any named array raises the
    store's IndexError before the first record is written."""
    with ArrayStore(root) as store:
        store.save({"long": np.zeros((30, 2), np.float32), "x": X})
        with pytest.raises(IndexError, match="out of range"):
            store.drop(["long", "x"], np.array(rows, dtype=np.int64))
        assert not os.path.exists(log_of(root, "long")) and not os.path.exists(log_of(root, "x"))
        assert marker_version(root) == 2
        store.drop(["long", "x"], np.array([-1, 0, -1], dtype=np.int64)[::2])  # strided: -1, -1
        assert store.get_shape("long") == (29, 2) and np.array_equal(store.load("x"), X[:-1])
