"""Arguments are checked where they are given: sizes against their documented
range, flags and buffers against their type. Each case is one of the sweep of
issue 26 (sections 4 and 6): before, it was accepted and failed later, hung,
or did something else than asked."""

import shutil

import numpy as np
import pytest

from loaderx import (
    ArrayStore,
    DataLoader,
    DenseDataset,
    Packing,
    RaggedDataset,
    Sampler,
    Zrecord,
    from_iterator,
    from_numpy,
    pad,
)
from loaderx.dataloader import NUM_WORKERS_MAX, PREFETCH_SIZE_MAX, PROCESS_WORKERS_MAX
from loaderx.dataset import THREADS_MAX
from loaderx.sampler import BATCH_SIZE_MAX


def double(batch):
    return batch


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("validation")
    from_numpy(root / "dense", np.arange(40.0).reshape(20, 2), progress=False)
    from_iterator(
        root / "ragged",
        [np.arange(3, dtype=np.int64), np.arange(2, dtype=np.int64)],
        progress=False,
    )
    return root


@pytest.fixture
def dense(stores):
    with DenseDataset(stores / "dense") as dataset:
        yield dataset


# ---- section 4: every size-like argument has a range, checked where it is given

SIZE_CASES = [
    # (what, call(dense dataset, tmp_path), words of the message)
    (
        "prefetch_size=10**9 (hung at the first batch)",
        lambda d, t: DataLoader({"x": d}, prefetch_size=10**9),
        r"prefetch_size must be in 1\.\.1,024",
    ),
    (
        "prefetch_size=0",
        lambda d, t: DataLoader({"x": d}, prefetch_size=0),
        r"prefetch_size must be in 1\.\.",
    ),
    (
        "num_workers=10**6 (hung)",
        lambda d, t: DataLoader({"x": d}, num_workers=10**6),
        r"num_workers must be in 0\.\.1,024",
    ),
    (
        "num_workers=-1",
        lambda d, t: DataLoader({"x": d}, num_workers=-1),
        r"num_workers must be in 0\.\.",
    ),
    (
        "worker processes past the cap",
        lambda d, t: DataLoader(
            {"x": d},
            num_workers=PROCESS_WORKERS_MAX + 1,
            transform_processes=True,
            transform=double,
        ),
        r"transform_processes=True must be in 1\.\.128",
    ),
    (
        "Sampler(10, 2**62) (32 EiB at the first batch)",
        lambda d, t: Sampler(10, 2**62, "iid"),
        r"batch_size must be in 1\.\.2\*\*24",
    ),
    (
        "DataLoader batch_size=2**40",
        lambda d, t: DataLoader({"x": d}, batch_size=2**40),
        r"batch_size must be in 1\.\.2\*\*24",
    ),
    (
        "DenseDataset threads=10**6",
        lambda d, t: DenseDataset(d.path, threads=10**6),
        r"threads must be in 0\.\.1,024",
    ),
    (
        "Zrecord threads=2**40 (a cffi OverflowError)",
        lambda d, t: Zrecord(d.path, threads=2**40),
        r"threads must be in 0\.\.1,024",
    ),
    (
        "from_numpy chunk_bytes=10**15",
        lambda d, t: from_numpy(t / "c", np.zeros(4), chunk_bytes=10**15, progress=False),
        r"chunk_bytes must be in 1\.\.4,294,967,296",
    ),
    (
        "from_iterator chunk_bytes=10**15 (a petabyte buffer)",
        lambda d, t: from_iterator(t / "c", [np.zeros(2)], chunk_bytes=10**15, progress=False),
        r"chunk_bytes must be in 1\.\.",
    ),
    ("Packing seq_len=10**9", lambda d, t: Packing(10**9), r"seq_len must be in 1\.\.16,777,216"),
    (
        "Packing window=10**9",
        lambda d, t: Packing(8, Packing.Strategy.FIRST_FIT, window=10**9),
        r"window must be in 1\.\.4,096",
    ),
]


@pytest.mark.parametrize("what, call, words", SIZE_CASES, ids=[case[0] for case in SIZE_CASES])
def test_sizes_out_of_range_raise_value_error_naming_the_range(dense, tmp_path, what, call, words):
    """An out-of-range size raises ValueError naming the range and the value, at the
    call that gives it (none of these calls starts a thread or allocates the size)."""
    with pytest.raises(ValueError, match=words):
        call(dense, tmp_path)
    assert not (tmp_path / "c").exists()


def test_the_largest_sizes_are_accepted(dense):
    """Each range is inclusive: its largest value is a working argument."""
    assert Sampler(BATCH_SIZE_MAX, BATCH_SIZE_MAX, "cyclic").batch_size == BATCH_SIZE_MAX
    with DataLoader(
        {"x": dense}, num_workers=NUM_WORKERS_MAX, prefetch_size=PREFETCH_SIZE_MAX, batch_size=4
    ) as loader:
        assert next(loader)["x"].shape == (4, 2)
    with DenseDataset(dense.path, threads=THREADS_MAX) as again:
        np.testing.assert_array_equal(again[[3, 1]], dense[[3, 1]])


@pytest.mark.parametrize(
    "edit, words",
    [
        (
            {"step": 2**64},
            r"step must be in 0\.\.18,446,744,073,709,551,615, got 18,446,744,073,709,551,616",
        ),
        ({"step": -1}, r"step must be in 0\.\."),
        ({"step": "3"}, r"state step must be an int, got str '3': the state is damaged"),
        ({"step": 3, "anchor": {"step": 5, "position": 0}}, r"comes before its anchor"),
        (
            {"step": 3, "anchor": {"step": 2**64, "position": 0}},
            r"anchor step must be in 0\.\.18,446,744,073,709,551,615",
        ),
    ],
)
def test_a_resume_state_out_of_range_is_refused_on_load(dense, edit, words):
    """A state whose step cannot be run (2**64 was accepted and failed at the first
    batch, in a worker) is refused by load_state_dict itself."""
    with DataLoader({"x": dense}, batch_size=4, mode="sequential") as loader:
        state = loader.state_dict()
    with DataLoader({"x": dense}, batch_size=4, mode="sequential") as resumed:
        with pytest.raises(ValueError, match=words):
            resumed.load_state_dict({**state, **edit})


def test_prefetch_slots_are_allocated_as_they_are_needed(stores, tmp_path):
    """A large prefetch_size costs memory only for the batches in flight, not
    prefetch_size batches up front (10**6 allocated 6.4 GB before the first batch):
    with one worker held after its first batch, about two batches exist."""
    import threading
    import tracemalloc

    from_numpy(tmp_path / "wide", np.zeros((64, 16384), np.float32), codec="raw", progress=False)
    release = threading.Event()
    calls = []

    def hold(batch):
        calls.append(1)
        if len(calls) > 1:
            release.wait(10)
        return batch

    batch_bytes = 16 * 16384 * 4
    with DenseDataset(tmp_path / "wide") as wide:
        tracemalloc.start()
        try:
            loader = DataLoader(
                {"x": wide},
                num_workers=1,
                prefetch_size=PREFETCH_SIZE_MAX,
                batch_size=16,
                transform=hold,
            )
            next(loader)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
            release.set()
        loader.close()
    assert peak < 8 * batch_bytes, f"{peak / batch_bytes:.0f} batches allocated for one delivered"


# ---- section 6: types are checked where they enter


@pytest.mark.parametrize(
    "call, error, words",
    [
        (
            lambda root: ArrayStore(root / "a", durable="no"),
            TypeError,
            "durable must be True or False",
        ),
        (
            lambda root: ArrayStore(root / "a", durable=0),
            TypeError,
            "durable must be True or False",
        ),
        (
            lambda root: DenseDataset(root / "dense", verify="no"),
            TypeError,
            "verify must be True, False or None",
        ),
        (
            lambda root: Zrecord(root / "z", verify="yes"),
            TypeError,
            "verify must be True, False or None",
        ),
        (
            lambda root: Zrecord(root / "z", durable="no"),
            TypeError,
            "durable must be True or False",
        ),
        (
            lambda root: DataLoader({"x": DenseDataset(root / "dense")}, transform_processes="no"),
            TypeError,
            "transform_processes must be True or False",
        ),
        (
            lambda root: from_numpy(root / "p", np.zeros(3), progress="yes"),
            TypeError,
            "progress must be True, False or a text stream",
        ),
        (
            lambda root: from_iterator(root / "p", [np.zeros(3)], progress="no"),
            TypeError,
            "progress must be True, False or a text stream",
        ),
        (
            lambda root: from_numpy(root / "p", np.zeros(3), chunk_bytes=True),
            TypeError,
            "chunk_bytes must be an int",
        ),
        (
            lambda root: from_numpy(root / "p", np.zeros(3), chunk_bytes=4096.0),
            TypeError,
            "chunk_bytes must be an int",
        ),
        (lambda root: Packing(8.0), TypeError, "seq_len must be an int"),
        (lambda root: Sampler(10, 2.0, "iid"), TypeError, "batch_size must be an integer"),
        (
            lambda root: DataLoader({"x": DenseDataset(root / "dense")}, prefetch_size="4"),
            TypeError,
            "prefetch_size must be an int",
        ),
    ],
)
def test_flags_and_sizes_of_the_wrong_type_raise_type_error(stores, tmp_path, call, error, words):
    """A string or float where a bool or int is expected is refused, saying what is
    expected: durable="no" used to stay durable, progress="yes" to be taken as True."""
    for name in ("dense", "ragged"):
        if not (tmp_path / name).exists():
            shutil.copytree(stores / name, tmp_path / name)
    with pytest.raises(error, match=words):
        call(tmp_path)
    assert (
        not (tmp_path / "a").exists()
        and not (tmp_path / "z").exists()
        and not (tmp_path / "p").exists()
    )


@pytest.mark.parametrize("value", ["str", b"raw bytes"])
def test_arraystore_save_refuses_a_string_for_an_array(tmp_path, value):
    """save({"x": "str"}) replaced the existing x with a 0-d <U3 array; now it raises
    TypeError and x keeps its rows."""
    with ArrayStore(tmp_path / "s") as store:
        store.save({"x": np.arange(3)})
        with pytest.raises(TypeError, match=r"not an array; save takes \{name: array\}"):
            store.save({"x": value})
        np.testing.assert_array_equal(store.load("x"), np.arange(3))
        with pytest.raises(TypeError, match="lazy must be True or False"):
            store.load("x", lazy="yes")


def test_pad_refuses_mixed_dtypes():
    """pad() of int32 and float64 records returned float64 silently; now it says to
    cast first. Empty records hold no values and take any dtype."""
    with pytest.raises(ValueError, match="record 1 has dtype float64 but the others int32"):
        pad([np.arange(3, dtype=np.int32), np.arange(2.0)])
    padded, lengths = pad([np.arange(3, dtype=np.int32), np.empty(0)])
    assert padded.dtype == np.int32 and lengths.tolist() == [3, 0]


def test_gather_buffers_must_be_raw_bytes(stores):
    """gather_packed(buffer=float64) failed with "cannot reshape array of size 6";
    gather_into(out=list) with an AttributeError. Both say what buffer is expected."""
    indices = np.array([0, 1], dtype=np.uint64)
    with RaggedDataset(stores / "ragged") as ragged:
        with pytest.raises(TypeError, match="buffer must be a 1-D uint8 NumPy array"):
            ragged.gather_packed(indices, np.zeros(6))
        with pytest.raises(ValueError, match="not contiguous"):
            ragged.gather_packed(indices, np.zeros(200, np.uint8)[::2])
        read_only = np.zeros(100, np.uint8)
        read_only.flags.writeable = False
        with pytest.raises(ValueError, match="read-only"):
            ragged.gather_packed(indices, read_only)
        values, offsets = ragged.gather_packed(indices, np.zeros(100, np.uint8))
        assert values.tolist() == [0, 1, 2, 0, 1] and offsets.tolist() == [0, 3, 5]
    with DenseDataset(stores / "dense") as dataset:
        with pytest.raises(TypeError, match="out must be a NumPy array"):
            dataset.gather_into([0, 1], [[0, 0], [0, 0]])


def test_a_0d_integer_array_indexes_like_an_int(stores):
    """ds[np.array(3)] failed inside reshape; NumPy indexes with it like ds[3]."""
    with DenseDataset(stores / "dense") as dataset:
        np.testing.assert_array_equal(dataset[np.array(3)], dataset[3])
    with RaggedDataset(stores / "ragged") as ragged:
        np.testing.assert_array_equal(ragged[np.array(1)], ragged[1])


# ---- section 7: a store deleted under an open handle


def test_refresh_after_the_directory_was_deleted_says_so(tmp_path):
    """refresh() of a store whose directory was deleted said "not a zrecord store";
    it is a FileNotFoundError saying the directory was deleted or moved."""
    from_numpy(tmp_path / "gone", np.arange(10.0), progress=False)
    with DenseDataset(tmp_path / "gone") as dataset:
        shutil.rmtree(tmp_path / "gone")
        with pytest.raises(
            FileNotFoundError, match="was deleted or moved since this handle opened it"
        ):
            dataset.refresh()


def test_shard_flags_and_sizes_are_taken_as_given(tmp_path):
    """write_shard(overwrite="no") replaced the existing shard (a truthy string), and
    chunk_bytes=0 silently fell back to the default; both are refused now."""
    from loaderx import shards

    shards.write_shard(tmp_path / "ds", 0, np.arange(4.0))
    with pytest.raises(TypeError, match="overwrite must be True or False"):
        shards.write_shard(tmp_path / "ds", 0, np.arange(8.0), overwrite="no")
    with pytest.raises(ValueError, match=r"chunk_bytes must be in 1\.\."):
        shards.write_shard(tmp_path / "ds", 1, np.arange(8.0), chunk_bytes=0)
    assert shards.written_shards(tmp_path / "ds") == [0]
    shards.commit(tmp_path / "ds")
    with DenseDataset(tmp_path / "ds") as dataset:
        np.testing.assert_array_equal(dataset[:], np.arange(4.0))


def test_row_counts_are_ints_not_truncated_floats(stores, tmp_path):
    """RaggedBatch.padded(max_len=2.7) padded to 2 (int() truncates) and
    stream_load(buffer_size=True) read one row at a time; both raise TypeError."""
    from loaderx import RaggedBatch

    batch = RaggedBatch(np.arange(5), np.array([0, 3, 5]))
    with pytest.raises(TypeError, match="max_len must be an int"):
        batch.padded(max_len=2.7)
    assert batch.padded(max_len=2)[0].tolist() == [[0, 1], [3, 4]]
    with pytest.raises(TypeError, match="max_len must be an int, got float"):
        pad([np.arange(3)], max_len=2.0)
    with ArrayStore(tmp_path / "s") as store:
        store.save({"x": np.arange(6)})
        for bad in (True, 2.0):
            with pytest.raises(TypeError, match=r"buffer_size \(rows\) must be an int"):
                next(store.stream_load("x", bad))
        with pytest.raises(ValueError, match=r"buffer_size \(rows\) must be at least 1"):
            next(store.stream_load("x", 0))
        assert [chunk.tolist() for chunk in store.stream_load("x", 4)] == [[0, 1, 2, 3], [4, 5]]
