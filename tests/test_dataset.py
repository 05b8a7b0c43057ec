"""DenseDataset, RaggedDataset, pad and the store schema."""

import os

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loaderx import (
    CorruptStoreError,
    DenseDataset,
    RaggedDataset,
    Zrecord,
    from_iterator,
    from_numpy,
    pad,
)
from loaderx.dataset import SCHEMA_FILE, Schema, read_schema, write_schema


@pytest.fixture
def dense(tmp_path):
    """A dense store of 10 (2, 3) float32 items and the array it holds."""
    array = np.arange(60, dtype=np.float32).reshape(10, 2, 3)
    from_numpy(tmp_path / "dense", array)
    with DenseDataset(tmp_path / "dense") as dataset:
        yield dataset, array


@pytest.fixture
def ragged(tmp_path):
    """A ragged store of int16 records with 2-column rows, zero rows included."""
    records = [
        np.arange(rows * 2, dtype=np.int16).reshape(rows, 2) + 100 * i
        for i, rows in enumerate([3, 0, 1, 5, 2, 0, 4])
    ]
    from_iterator(tmp_path / "ragged", records)
    with RaggedDataset(tmp_path / "ragged") as dataset:
        yield dataset, records


# ---- the 0.9 README examples -------------------------------------------------------


def test_readme_dense_example(tmp_path, monkeypatch):
    """The README's dense example: the batch shape comes from the schema."""
    monkeypatch.chdir(tmp_path)
    from_numpy("data", np.arange(64, dtype=np.float32).reshape(8, 2, 4))
    ds = DenseDataset("data")
    assert ds[[0, 5, 2]].shape == (3, 2, 4)
    np.testing.assert_array_equal(
        ds[[0, 5, 2]], np.arange(64, dtype=np.float32).reshape(8, 2, 4)[[0, 5, 2]]
    )
    ds.close()


def test_readme_ragged_example(tmp_path, monkeypatch):
    """The README's ragged example: a list of records, padded by pad()."""
    monkeypatch.chdir(tmp_path)
    seqs = [np.arange(L, dtype=np.int32) for L in (3, 1, 4, 1, 5)]
    from_iterator("tokens", seqs)
    rs = RaggedDataset("tokens")
    records = rs[[0, 2, 4]]
    assert isinstance(records, list) and len(records) == 3
    for record, expected in zip(records, [seqs[0], seqs[2], seqs[4]]):
        np.testing.assert_array_equal(record, expected)
    padded, lengths = pad(records)
    assert padded.shape == (3, 5) and padded.dtype == np.int32
    np.testing.assert_array_equal(lengths, [3, 4, 5])
    np.testing.assert_array_equal(padded[0], [0, 1, 2, 0, 0])
    rs.close()


# ---- dense indexing --------------------------------------------------------------


def test_dense_attributes(dense, tmp_path):
    """A dense dataset reports its path, dtype, item shape, codec and length."""
    dataset, array = dense
    assert dataset.path == os.fspath(tmp_path / "dense")
    assert dataset.dtype == np.float32
    assert dataset.item_shape == (2, 3)
    assert dataset.codec == "zstd"
    assert len(dataset) == 10 and dataset.shape == (10, 2, 3)
    assert "10 records" in repr(dataset)


@pytest.mark.parametrize(
    "key",
    [0, 9, -1, -10, np.int64(3), np.uint8(4)],
)
def test_dense_int_returns_one_item(dense, key):
    """An int (negative counts from the end) returns one item of item_shape."""
    dataset, array = dense
    item = dataset[key]
    assert item.shape == (2, 3)
    np.testing.assert_array_equal(item, array[key])


@pytest.mark.parametrize(
    "key",
    [
        slice(None),
        slice(2, 7),
        slice(None, None, 3),
        slice(8, 1, -2),
        slice(None, None, -1),
        slice(5, 5),
        slice(-3, None),
        slice(-100, 100),
        [3, 1, 3, 0],
        [],
        [-1, -10, 5],
        np.array([9, 0, 9], dtype=np.uint64),
        np.array([[1, 2], [3, 4]]),
        np.arange(10) % 3 == 0,
        [True] * 10,
        np.zeros(10, dtype=bool),
    ],
)
def test_dense_selectors_match_numpy(dense, key):
    """Slices, int lists/arrays (any order, repeats, any shape) and bool masks index like NumPy."""
    dataset, array = dense
    result = dataset[key]
    expected = array[key]
    assert result.shape == expected.shape and result.dtype == expected.dtype
    np.testing.assert_array_equal(result, expected)


@pytest.mark.parametrize(
    "key", [(0, 1), (slice(1, 4), 0), ([2, 5], slice(None), 2), (Ellipsis, 1), (-1, 0, 2), ()]
)
def test_dense_tuple_indexes_into_items(dense, key):
    """A tuple selects records with its first element and indexes the items with the rest."""
    dataset, array = dense
    np.testing.assert_array_equal(dataset[key], array[key])


@pytest.mark.parametrize(
    "key", [10, -11, 2**40, [0, 10], [-11], np.array([3, 2**63], dtype=np.uint64)]
)
def test_dense_out_of_range_raises_index_error(dense, key):
    """Any index outside -len..len-1 raises IndexError."""
    dataset, _ = dense
    with pytest.raises(IndexError):
        dataset[key]


@pytest.mark.parametrize("key", [np.ones(9, dtype=bool), [1.5, 2.0], np.array(["a"])])
def test_dense_bad_selectors_raise_index_error(dense, key):
    """A mask of the wrong length or non-integer indices raise IndexError."""
    dataset, _ = dense
    with pytest.raises(IndexError):
        dataset[key]


def test_dense_getitems_and_gather_into(dense):
    """__getitems__ gathers a flat index list; gather_into fills a caller's array."""
    dataset, array = dense
    np.testing.assert_array_equal(dataset.__getitems__([4, 4, 0]), array[[4, 4, 0]])
    out = np.empty((3, 2, 3), dtype=np.float32)
    assert dataset.gather_into(np.array([7, 1, 7], dtype=np.uint64), out) is out
    np.testing.assert_array_equal(out, array[[7, 1, 7]])
    with pytest.raises(ValueError, match="shape"):
        dataset.gather_into(np.array([1, 2], dtype=np.uint64), out)
    with pytest.raises(ValueError, match="dtype"):
        dataset.gather_into(np.array([1, 2, 3], dtype=np.uint64), out.astype(np.float64))
    with pytest.raises(IndexError):
        dataset.gather_into(np.array([1, 2, 10], dtype=np.uint64), out)


def test_dense_results_are_fresh_arrays(dense):
    """Each read returns a new writable array, never a view of another read."""
    dataset, array = dense
    first = dataset[[1, 2]]
    second = dataset[[1, 2]]
    first[:] = -1
    np.testing.assert_array_equal(second, array[[1, 2]])
    assert first.flags.writeable and first.flags.c_contiguous


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=-10, max_value=9), max_size=40))
def test_dense_index_lists_property(tmp_path_factory, indices):
    """Any list of in-range indices returns exactly NumPy's fancy indexing."""
    path = tmp_path_factory.getbasetemp() / "property_store"
    array = np.arange(10 * 3, dtype=np.int64).reshape(10, 3) * 7
    if not path.exists():
        from_numpy(path, array, codec="raw")
    with DenseDataset(path) as dataset:
        np.testing.assert_array_equal(dataset[indices], array[indices] if indices else array[:0])


def test_dense_scalar_records(tmp_path):
    """A 1-D array becomes scalar records: ds[i] is a scalar, ds[list] a 1-D array."""
    labels = np.array([5, 3, 9, 1], dtype=np.int64)
    from_numpy(tmp_path / "labels", labels, codec="raw")
    with DenseDataset(tmp_path / "labels") as dataset:
        assert dataset.item_shape == ()
        assert dataset[2] == 9 and np.shape(dataset[2]) == ()
        np.testing.assert_array_equal(dataset[[3, 0]], [1, 5])


def test_dense_empty_store(tmp_path):
    """A store of zero rows opens, has length 0 and returns empty batches."""
    from_numpy(tmp_path / "empty", np.empty((0, 4), dtype=np.float32))
    with DenseDataset(tmp_path / "empty") as dataset:
        assert len(dataset) == 0
        assert dataset[:].shape == (0, 4)
        with pytest.raises(IndexError):
            dataset[0]


def test_dense_closed_dataset_raises(dense):
    """Reading a closed dataset raises a clear error; close is idempotent."""
    dataset, _ = dense
    dataset.close()
    dataset.close()
    assert dataset.closed
    with pytest.raises(ValueError, match="closed"):
        dataset[0]


# ---- ragged ----------------------------------------------------------------------


def test_ragged_attributes_and_int(ragged):
    """A ragged dataset's items are rows; ds[i] is one (rows_i, *item_shape) array."""
    dataset, records = ragged
    assert dataset.item_shape == (2,) and dataset.dtype == np.int16 and len(dataset) == 7
    for i in range(-7, 7):
        np.testing.assert_array_equal(dataset[i], records[i])
        assert dataset[i].shape == records[i].shape
    np.testing.assert_array_equal(dataset.row_counts(), [3, 0, 1, 5, 2, 0, 4])


@pytest.mark.parametrize(
    "key",
    [
        slice(None),
        slice(1, 6, 2),
        slice(None, None, -1),
        [6, 1, 6, 0],
        [],
        np.array([-1, 3]),
        np.arange(7) % 2 == 1,
    ],
)
def test_ragged_selectors(ragged, key):
    """Every selector returns a list of records in selection order."""
    dataset, records = ragged
    expected = (
        [records[i] for i in np.arange(7)[key]]
        if not isinstance(key, list)
        else [records[i] for i in key]
    )
    result = dataset[key]
    assert isinstance(result, list) and len(result) == len(expected)
    for got, want in zip(result, expected):
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    assert len(
        dataset.__getitems__(list(np.arange(7)[key]) if not isinstance(key, list) else key)
    ) == len(expected)


@pytest.mark.parametrize("key", [7, -8, [0, 7], np.ones(3, dtype=bool)])
def test_ragged_out_of_range(ragged, key):
    """Out-of-range selectors raise IndexError on ragged datasets too."""
    dataset, _ = ragged
    with pytest.raises(IndexError):
        dataset[key]


def test_ragged_bytes_records(tmp_path):
    """bytes records make a uint8 ragged store that reads back byte for byte."""
    blobs = [b"hello", b"", b"\x00\xff" * 1000]
    assert from_iterator(tmp_path / "blobs", blobs) == 3
    with RaggedDataset(tmp_path / "blobs") as dataset:
        assert dataset.dtype == np.uint8 and dataset.item_shape == ()
        assert [record.tobytes() for record in dataset[:]] == blobs


# ---- pad ---------------------------------------------------------------------------


def test_pad_rows_with_tail_and_value():
    """pad fills past each record with pad_value, keeps the row shape, reports lengths."""
    records = [
        np.ones((2, 3), np.float32),
        np.zeros((0, 3), np.float32),
        np.full((4, 3), 2, np.float32),
    ]
    padded, lengths = pad(records, pad_value=-1)
    assert padded.shape == (3, 4, 3) and padded.dtype == np.float32
    np.testing.assert_array_equal(lengths, [2, 0, 4])
    assert (padded[0, 2:] == -1).all() and (padded[1] == -1).all() and (padded[2] == 2).all()


def test_pad_max_len_truncates_and_widens():
    """max_len truncates longer records (lengths says what was kept) or pads further."""
    records = [np.arange(5), np.arange(2)]
    padded, lengths = pad(records, max_len=3)
    np.testing.assert_array_equal(padded, [[0, 1, 2], [0, 1, 0]])
    np.testing.assert_array_equal(lengths, [3, 2])
    padded, lengths = pad(records, max_len=7)
    assert padded.shape == (2, 7)


def test_pad_rejects_bad_input():
    """pad refuses an empty batch, mismatched row shapes and scalars."""
    with pytest.raises(ValueError, match="no records"):
        pad([])
    with pytest.raises(ValueError, match="record 1"):
        pad([np.zeros((2, 3)), np.zeros((2, 4))])
    with pytest.raises(ValueError, match="scalar"):
        pad([np.float32(1.0)])


# ---- schema and opening ------------------------------------------------------------


def test_schema_file_fields(dense, tmp_path):
    """schema.msgpack names the format, version, kind, dtype, item shape and codec."""
    with open(tmp_path / "dense" / SCHEMA_FILE, "rb") as handle:
        data = msgpack.unpackb(handle.read())
    assert data == {
        "format": "loaderx",
        "version": 1,
        "kind": "dense",
        "dtype": "<f4",
        "item_shape": [2, 3],
        "codec": "zstd",
    }


@pytest.mark.parametrize(
    "dtype",
    [
        "<f8",
        ">i4",
        "|S5",
        "<U3",
        "<M8[s]",
        "<c8",
        [("a", "<i4"), ("b", "<f8", (2,))],
        [("x", [("y", "u1"), ("z", ">u2")])],
    ],
)
def test_schema_round_trips_dtypes(tmp_path, dtype):
    """Every non-object dtype (structured and byte-swapped ones too) survives the schema file."""
    schema = Schema("dense", np.dtype(dtype), (3,), "raw")
    write_schema(tmp_path, schema)
    assert read_schema(tmp_path) == schema
    assert not [name for name in os.listdir(tmp_path) if name != SCHEMA_FILE]


def test_structured_records_round_trip(tmp_path):
    """A structured array converts and reads back field for field."""
    array = np.zeros(5, dtype=[("id", "<i8"), ("pos", "<f4", (2,))])
    array["id"] = np.arange(5)
    array["pos"] = np.arange(10).reshape(5, 2)
    from_numpy(tmp_path / "structured", array)
    with DenseDataset(tmp_path / "structured") as dataset:
        assert dataset.dtype == array.dtype
        np.testing.assert_array_equal(dataset[[4, 0]], array[[4, 0]])


def test_open_rejects_what_is_not_a_store(tmp_path):
    """A missing path, a bare directory and a bare Zrecord store are not loaderx stores."""
    with pytest.raises(FileNotFoundError, match="no loaderx store"):
        DenseDataset(tmp_path / "missing")
    assert not (tmp_path / "missing").exists()
    (tmp_path / "plain").mkdir()
    with pytest.raises(FileNotFoundError, match="not a loaderx store"):
        RaggedDataset(tmp_path / "plain")
    with Zrecord(tmp_path / "bare") as store:
        store.append(b"abcd", [0])
    with pytest.raises(FileNotFoundError, match="schema.msgpack"):
        DenseDataset(tmp_path / "bare")


def test_a_schema_without_its_store_is_refused_and_left_alone(tmp_path):
    """A dataset directory whose store files are gone (its schema left) is
    refused as damaged; the open creates no store in it."""
    from_numpy(tmp_path / "gone", np.arange(12, dtype=np.float32).reshape(4, 3))
    for name in os.listdir(tmp_path / "gone"):
        if name != SCHEMA_FILE:
            os.remove(tmp_path / "gone" / name)
    with pytest.raises(CorruptStoreError, match="has no superblock; it is not a zrecord store"):
        DenseDataset(tmp_path / "gone")
    assert os.listdir(tmp_path / "gone") == [SCHEMA_FILE]


def test_open_with_the_wrong_kind(dense, ragged, tmp_path):
    """Opening a ragged store as dense (and vice versa) names the right class."""
    with pytest.raises(ValueError, match="RaggedDataset"):
        DenseDataset(tmp_path / "ragged")
    with pytest.raises(ValueError, match="DenseDataset"):
        RaggedDataset(tmp_path / "dense")


@pytest.mark.parametrize(
    "payload, message",
    [
        (b"\xc1garbage", "damaged"),
        (msgpack.packb([1, 2]), "not a loaderx schema"),
        (msgpack.packb({"format": "other", "version": 1}), "not a loaderx schema"),
        (
            msgpack.packb(
                {
                    "format": "loaderx",
                    "version": 2,
                    "kind": "dense",
                    "dtype": "<f4",
                    "item_shape": [],
                    "codec": "raw",
                }
            ),
            "newer",
        ),
        (
            msgpack.packb(
                {
                    "format": "loaderx",
                    "version": 1,
                    "kind": "dense",
                    "dtype": "<f4",
                    "item_shape": [],
                }
            ),
            "lacks codec",
        ),
        (
            msgpack.packb(
                {
                    "format": "loaderx",
                    "version": 1,
                    "kind": "sparse",
                    "dtype": "<f4",
                    "item_shape": [],
                    "codec": "raw",
                }
            ),
            "kind",
        ),
        (
            msgpack.packb(
                {
                    "format": "loaderx",
                    "version": 1,
                    "kind": "dense",
                    "dtype": "|O",
                    "item_shape": [],
                    "codec": "raw",
                }
            ),
            "objects",
        ),
        (
            msgpack.packb(
                {
                    "format": "loaderx",
                    "version": 1,
                    "kind": "dense",
                    "dtype": "<f4",
                    "item_shape": [-1],
                    "codec": "raw",
                }
            ),
            "item_shape",
        ),
        (  # numpy's dtype parser raises SyntaxError for this one
            msgpack.packb(
                {
                    "format": "loaderx",
                    "version": 1,
                    "kind": "dense",
                    "dtype": "f4 ,,",
                    "item_shape": [],
                    "codec": "raw",
                }
            ),
            "invalid",
        ),
    ],
)
def test_damaged_schema_raises_value_error(dense, tmp_path, payload, message):
    """A schema file that is damaged, foreign, too new or invalid raises ValueError."""
    (tmp_path / "dense" / SCHEMA_FILE).write_bytes(payload)
    with pytest.raises(ValueError, match=message):
        DenseDataset(tmp_path / "dense")


def test_a_schema_file_is_parsed_once_per_content(tmp_path, monkeypatch):
    """Schema files with the same bytes are parsed once (the parsed schema is
    immutable); other bytes are parsed, and a damaged file raises each time."""
    from loaderx import schema as schema_module

    parses = []
    parse = schema_module.Schema.from_dict
    monkeypatch.setattr(
        schema_module.Schema,
        "from_dict",
        staticmethod(lambda data, where="schema": parses.append(where) or parse(data, where)),
    )
    monkeypatch.setattr(schema_module, "_PARSED", {})
    for name, dtype in (("a", np.int16), ("b", np.int16), ("c", np.float32)):
        (tmp_path / name).mkdir()
        write_schema(tmp_path / name, Schema("dense", np.dtype(dtype), (3,), "raw"))
    first, second, third = (read_schema(tmp_path / name) for name in "abc")
    assert first is second and third.dtype == np.float32 and len(parses) == 2
    (tmp_path / "b" / SCHEMA_FILE).write_bytes(b"\xc1")
    for _ in range(2):
        with pytest.raises(ValueError, match="damaged"):
            read_schema(tmp_path / "b")
    assert read_schema(tmp_path / "a") is first and len(parses) == 2


@pytest.mark.parametrize("codec", ["raw", "zstd"])  # the fixed layout, and the indexed
def test_dense_store_not_matching_its_schema(tmp_path, codec):
    """Records whose size is not the schema's item size are refused on open."""
    with Zrecord(tmp_path / "odd", codec=codec) as store:
        store.append(np.zeros(12, np.uint8), [0, 6])
    write_schema(tmp_path / "odd", Schema("dense", np.dtype("<f4"), (2,), codec))
    with pytest.raises(ValueError, match=r"holds records of \[6\] bytes.*does not match"):
        DenseDataset(tmp_path / "odd")


def test_the_usual_open_reads_schema_and_store_in_one_call(dense, tmp_path, general_opens):
    """A store with its schema opens in one native call (no look-up of the
    general open), whose identity is the directory's; a schema over the
    call's 4 KiB, and a store of the other kind, take the general open,
    which reads them whole and names the kind."""
    general = general_opens
    with DenseDataset(tmp_path / "dense") as reopened:
        np.testing.assert_array_equal(reopened[:], dense[1])
        found = os.stat(tmp_path / "dense")
        assert reopened.store.identity == (found.st_dev, found.st_ino)
        assert reopened.store.codec == reopened.schema.codec
    assert general == []
    fields = [(f"field_{i:03d}_{'x' * 40}", "<u1") for i in range(96)]
    wide = np.zeros(4, dtype=np.dtype(fields))
    wide[f"field_007_{'x' * 40}"] = np.arange(4)
    from_numpy(tmp_path / "wide", wide)
    assert os.path.getsize(tmp_path / "wide" / SCHEMA_FILE) >= 4096
    with DenseDataset(tmp_path / "wide") as opened:
        np.testing.assert_array_equal(opened[:], wide)
    assert general == [str(tmp_path / "wide")]
    with pytest.raises(ValueError, match="is a dense store: open it with DenseDataset"):
        RaggedDataset(tmp_path / "dense")
    assert general[-1] == str(tmp_path / "dense")


# ---- regressions of issue 11 ---------------------------------------------------------


@pytest.mark.parametrize(
    "records, pad_value",
    [
        ([np.arange(3), np.arange(1)], 0.5),  # used to pad with 0
        ([np.arange(3, dtype=np.uint8)], -1),  # used to raise OverflowError
        ([np.arange(3, dtype=np.uint8), np.arange(1, dtype=np.uint8)], 256),
        ([np.arange(3, dtype=np.int32), np.arange(1, dtype=np.int32)], float("nan")),
        ([np.array([True]), np.array([False, True])], 2),
        ([np.arange(3, dtype=np.float32), np.arange(1, dtype=np.float32)], "x"),
    ],
)
def test_pad_refuses_a_value_the_dtype_cannot_hold(records, pad_value):
    """pad raises ValueError naming the dtype instead of padding with another value."""
    with pytest.raises(ValueError, match="pad_value"):
        pad(records, pad_value=pad_value)


def test_pad_accepts_values_that_fit():
    """Values the dtype holds are used as they are (floats need not be exact)."""
    padded, _ = pad([np.arange(3, dtype=np.uint8), np.arange(1, dtype=np.uint8)], pad_value=255)
    assert padded[1].tolist() == [0, 255, 255]
    padded, _ = pad([np.arange(2, dtype=np.int64), np.arange(1, dtype=np.int64)], pad_value=-3.0)
    assert padded[1].tolist() == [0, -3]
    padded, _ = pad([np.ones(2, np.float32), np.ones(1, np.float32)], pad_value=0.1)
    assert padded[1, 1] == np.float32(0.1)
    padded, _ = pad([np.ones(2), np.ones(1)], pad_value=float("nan"))
    assert np.isnan(padded[1, 1])


def test_closed_dataset_names_the_class_to_reopen_with(dense):
    """A closed DenseDataset says to open it again with DenseDataset(path), not Zrecord(path)."""
    dataset, _ = dense
    dataset.close()
    with pytest.raises(ValueError, match=r"DenseDataset\(path\)"):
        dataset[0]


def test_open_a_file_says_it_is_a_file(tmp_path):
    """DenseDataset("f.txt") on an existing file says it is a file, not that nothing is there."""
    (tmp_path / "f.txt").write_text("hello")
    with pytest.raises(NotADirectoryError, match="is a file, not a loaderx store"):
        DenseDataset(tmp_path / "f.txt")


def test_datasets_pickle_as_their_path(dense, ragged):
    """A pickled dataset reopens its store with the same options and reads the same records."""
    import pickle

    dataset, array = dense
    copy = pickle.loads(pickle.dumps(dataset))
    with copy:
        assert copy.path == dataset.path and copy.store.verify_reads is None  # the default checks
        np.testing.assert_array_equal(copy[:], array)
    ragged_dataset, records = ragged
    with pickle.loads(pickle.dumps(ragged_dataset)) as copy:
        for got, want in zip(copy[:], records):
            np.testing.assert_array_equal(got, want)
    dataset.close()
    with pytest.raises(TypeError, match="closed"):
        pickle.dumps(dataset)


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_dataset_in_spawned_workers(dense, method):
    """As a torch DataLoader(num_workers=2) does: a spawn/forkserver pool gets the pickled
    dataset and reads records in the child processes."""
    import multiprocessing

    dataset, array = dense
    with multiprocessing.get_context(method).Pool(2) as pool:
        items = pool.map(dataset.__getitem__, range(len(dataset)))
        batches = pool.map(dataset.__getitems__, [[9, 0], [3, 3]])
    np.testing.assert_array_equal(np.stack(items), array)
    np.testing.assert_array_equal(batches[0], array[[9, 0]])
    np.testing.assert_array_equal(batches[1], array[[3, 3]])


def test_an_index_out_of_range_raises_the_same_class_from_either_layer(tmp_path):
    """The dataset layer (int, slice-free selectors) and the store below it
    raise the same IndexOutOfRangeError: a ZrecordError and an IndexError."""
    from loaderx import IndexOutOfRangeError, ZrecordError

    from_numpy(tmp_path / "d", np.arange(10), progress=False)
    with DenseDataset(tmp_path / "d") as ds:
        for bad in (10, -11, [0, 99], np.array([5, 12])):
            with pytest.raises(IndexOutOfRangeError) as caught:
                ds[bad]
            assert isinstance(caught.value, ZrecordError) and isinstance(caught.value, IndexError)
        with pytest.raises(IndexOutOfRangeError):
            ds.store.gather([10], bytearray(8))


@settings(max_examples=300, deadline=None)
@given(length=st.integers(1, 50), key=st.lists(st.integers(-80, 80), min_size=1, max_size=40))
def test_short_index_lists_are_checked_like_arrays(length, key):
    """A list of at most 32 Python ints takes a path of its own (no NumPy
    checks); it must give what the NumPy path gives, or the same error."""
    from loaderx._indexing import record_indices
    from loaderx.zrecord import IndexOutOfRangeError

    def outcome(selector):
        try:
            indices, shape = record_indices(selector, length)
        except IndexOutOfRangeError as exc:
            return "error", str(exc)
        assert indices.dtype == np.uint64 and indices.flags.c_contiguous
        return indices.tolist(), shape

    short, general = outcome(key), outcome(np.array(key, dtype=np.int64))
    if general[0] == "error":
        assert short[0] == "error"
        # Each path names an index that is out of range, maybe not the same one.
        named = int(short[1].split()[1])
        assert named in key and not -length <= named < length, short[1]
    else:
        assert short == general
        assert short[0] == [index % length for index in key]


@pytest.mark.parametrize(
    "key",
    [
        np.array([7, 0, 9, 7], np.int64),
        np.array([7, 0, 9, 7], np.uint64),
        np.array([-1, 3, -10], np.int64),
        np.array([7, 0, 9], ">i8"),
        np.array([7, 0, 9], np.int32),
        np.arange(10, dtype=np.int64)[::3],
        np.array([[1, 2], [3, 4]], np.int64),
    ],
)
def test_index_arrays_read_what_numpy_indexes(dense, monkeypatch, key):
    """An index array reads NumPy's rows whatever its dtype, byte order,
    strides or shape; a flat native int64 or uint64 one in range goes to the
    native gather as it is (its range checked there, not converted)."""
    from loaderx import dataset as dataset_module

    dataset, array = dense
    conversions = []
    convert = dataset_module.record_indices
    monkeypatch.setattr(
        dataset_module, "record_indices", lambda *a: conversions.append(a) or convert(*a)
    )
    assert np.array_equal(dataset[key], array[key])
    as_is = (
        key.ndim == 1 and key.dtype in (np.dtype("<i8"), np.dtype("<u8")) and key.strides == (8,)
    )
    assert len(conversions) == (0 if as_is and key.min() >= 0 else 1)


@pytest.mark.parametrize("dtype", [np.int64, np.uint64])
def test_an_index_array_out_of_range_says_which_index(dense, dtype):
    dataset, _ = dense
    with pytest.raises(IndexError, match="index 10 is out of range for a dataset of 10 records"):
        dataset[np.array([3, 10, 2], dtype)]
    if dtype is np.int64:
        with pytest.raises(IndexError, match="index -11 is out of range"):
            dataset[np.array([3, -11], dtype)]
