"""from_numpy and from_iterator: schemas, appends, all-or-nothing writes, limits."""

import io
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from loaderx import DenseDataset, RaggedDataset, Zrecord, _writing, from_iterator, from_numpy
from loaderx.dataset import read_schema, write_schema


def store_files(path):
    """Every file of a store with its size and contents, to prove nothing changed."""
    return {name: (path / name).read_bytes() for name in sorted(os.listdir(path)) if name != "lock"}


def disk_bytes(path):
    return sum(os.path.getsize(path / name) for name in os.listdir(path))


# ---- from_numpy ------------------------------------------------------------------


@pytest.mark.parametrize("codec", ["raw", "zstd", "zstd_dict"])
def test_from_numpy_round_trip(tmp_path, codec):
    """Each codec stores every row and reads it back exactly; the count is returned."""
    rng = np.random.default_rng(1)
    array = rng.integers(0, 8, size=(600, 4, 8)).astype(np.float32)
    assert (
        from_numpy(
            tmp_path / "store", array, codec=codec, dict_size=4096 if codec == "zstd_dict" else None
        )
        == 600
    )
    with DenseDataset(tmp_path / "store") as dataset:
        assert dataset.codec == codec and dataset.item_shape == (4, 8)
        np.testing.assert_array_equal(dataset[:], array)
        if codec == "zstd_dict":
            assert dataset.store.has_dict()


def test_from_numpy_default_dictionary_size(tmp_path):
    """zstd_dict without dict_size trains a default-size dictionary, clamped to the data."""
    array = (
        np.tile(np.arange(256, dtype=np.uint8), (300, 1)) ^ np.arange(300, dtype=np.uint8)[:, None]
    )
    from_numpy(tmp_path / "store", array, codec="zstd_dict")
    with DenseDataset(tmp_path / "store") as dataset:
        assert dataset.store.has_dict()
        np.testing.assert_array_equal(dataset[::7], array[::7])


def test_from_numpy_dictionary_from_few_large_rows(tmp_path):
    """A handful of large rows is still enough to train (rows are cut into samples)."""
    rng = np.random.default_rng(2)
    array = rng.integers(0, 3, size=(4, 64 * 1024), dtype=np.uint8)
    from_numpy(tmp_path / "store", array, codec="zstd_dict", dict_size=2048)
    with DenseDataset(tmp_path / "store") as dataset:
        np.testing.assert_array_equal(dataset[:], array)


def test_from_numpy_dictionary_too_little_data(tmp_path):
    """Too little data for a dictionary is a clear ValueError and leaves no store."""
    with pytest.raises(ValueError, match="codec='zstd'"):
        from_numpy(tmp_path / "tiny", np.arange(3, dtype=np.uint8), codec="zstd_dict")
    assert not (tmp_path / "tiny").exists()


def test_from_numpy_append_keeps_the_dictionary(tmp_path):
    """Appending to a zstd_dict store reuses its dictionary, whatever dict_size says."""
    array = np.tile(np.arange(128, dtype=np.uint8), (200, 1))
    from_numpy(tmp_path / "store", array, codec="zstd_dict", dict_size=1024)
    from_numpy(tmp_path / "store", array[:10], codec="zstd_dict", dict_size=4096, mode="a")
    with DenseDataset(tmp_path / "store") as dataset:
        assert len(dataset) == 210


def test_from_numpy_one_dimensional_is_scalar_records(tmp_path):
    """A 1-D array becomes scalar records."""
    from_numpy(tmp_path / "labels", np.arange(7, dtype=np.int32))
    assert read_schema(tmp_path / "labels").item_shape == ()


@pytest.mark.parametrize(
    "make",
    [
        lambda a: a[:, ::2],
        lambda a: np.asfortranarray(a),
        lambda a: a[::-1],
        lambda a: a.transpose(0, 2, 1),
    ],
)
def test_from_numpy_non_contiguous(tmp_path, make):
    """Strided, reversed, transposed and Fortran-ordered input is copied chunk by chunk."""
    source = make(np.arange(40 * 6 * 4, dtype=np.int16).reshape(40, 6, 4))
    from_numpy(tmp_path / "store", source, chunk_bytes=100)
    with DenseDataset(tmp_path / "store") as dataset:
        np.testing.assert_array_equal(dataset[:], source)


def test_from_numpy_small_chunks_and_rows_over_a_chunk(tmp_path):
    """Chunks smaller than a row still write one row per append, in order."""
    array = np.arange(9 * 300, dtype=np.uint32).reshape(9, 300)
    from_numpy(tmp_path / "store", array, chunk_bytes=500, codec="raw")
    with DenseDataset(tmp_path / "store") as dataset:
        np.testing.assert_array_equal(dataset[:], array)


def test_from_numpy_array_likes(tmp_path):
    """Nested lists and lazily sliced array-likes convert like arrays."""
    from_numpy(tmp_path / "lists", [[1, 2], [3, 4]])
    with DenseDataset(tmp_path / "lists") as dataset:
        np.testing.assert_array_equal(dataset[:], [[1, 2], [3, 4]])

    class Lazy:
        """Like an HDF5 dataset: shape, dtype and slicing, no __array__."""

        shape = (5, 3)
        dtype = np.dtype("<f8")

        def __getitem__(self, key):
            return np.arange(15, dtype="<f8").reshape(5, 3)[key]

    from_numpy(tmp_path / "lazy", Lazy(), chunk_bytes=24)
    with DenseDataset(tmp_path / "lazy") as dataset:
        np.testing.assert_array_equal(dataset[:], np.arange(15.0).reshape(5, 3))


def test_from_numpy_rejects_bad_input(tmp_path):
    """Object dtypes, 0-d arrays, unknown codecs and bad sizes raise before writing."""
    with pytest.raises(TypeError, match="Python objects"):
        from_numpy(tmp_path / "a", np.array([{}, 1], dtype=object))
    with pytest.raises(ValueError, match="0-d"):
        from_numpy(tmp_path / "a", np.float32(3))
    with pytest.raises(ValueError, match="unknown codec"):
        from_numpy(tmp_path / "a", np.zeros(3), codec="brotli")
    with pytest.raises(ValueError, match="chunk_bytes"):
        from_numpy(tmp_path / "a", np.zeros(3), chunk_bytes=0)
    with pytest.raises(ValueError, match="dict_size only applies"):
        from_numpy(tmp_path / "a", np.zeros(3), dict_size=1024)
    with pytest.raises(ValueError, match="dict_size must be"):
        from_numpy(tmp_path / "a", np.zeros(3), codec="zstd_dict", dict_size=10)
    assert not (tmp_path / "a").exists()


def test_from_numpy_empty_array_creates_an_empty_store(tmp_path):
    """Zero rows make a valid empty store that later appends extend."""
    assert from_numpy(tmp_path / "store", np.empty((0, 3), np.float32)) == 0
    assert from_numpy(tmp_path / "store", np.ones((2, 3), np.float32)) == 2
    with DenseDataset(tmp_path / "store") as dataset:
        np.testing.assert_array_equal(dataset[:], np.ones((2, 3)))


def test_from_numpy_appends_when_the_schema_matches(tmp_path):
    """A second from_numpy with the same schema appends after the first."""
    first = np.arange(12, dtype=np.float64).reshape(4, 3)
    from_numpy(tmp_path / "store", first)
    assert from_numpy(tmp_path / "store", first * 2, mode="a") == 4
    with DenseDataset(tmp_path / "store") as dataset:
        np.testing.assert_array_equal(dataset[:], np.concatenate([first, first * 2]))


@pytest.mark.parametrize(
    "other, kwargs, message",
    [
        (np.zeros((3, 2), np.int32), {}, "dtype is <i8"),
        (np.zeros((3, 5), np.int64), {}, "item shape is"),
        (np.zeros((3, 2), np.int64), {"codec": "zstd"}, "codec='raw'"),
        (np.zeros(3, np.int64), {"codec": "raw"}, "item shape"),
    ],
)
def test_schema_mismatch_writes_nothing(tmp_path, other, kwargs, message):
    """Appending data of another dtype, shape or codec raises and leaves every file as it was."""
    base = np.arange(20, dtype=np.int64).reshape(10, 2)
    from_numpy(tmp_path / "store", base, codec="raw")
    before = store_files(tmp_path / "store")
    with pytest.raises(ValueError, match=message) as caught:
        from_numpy(tmp_path / "store", other, mode="a", **kwargs)
    assert "nothing was written" in str(caught.value)
    assert store_files(tmp_path / "store") == before
    with DenseDataset(tmp_path / "store") as dataset:
        np.testing.assert_array_equal(dataset[:], base)


def test_kind_mismatch_writes_nothing(tmp_path):
    """A ragged write to a dense store (and the reverse) is refused up front."""
    from_numpy(tmp_path / "dense", np.zeros(5, np.int32))
    from_iterator(tmp_path / "ragged", [np.zeros(5, np.int32)])
    before = (store_files(tmp_path / "dense"), store_files(tmp_path / "ragged"))
    with pytest.raises(ValueError, match="dense store"):
        from_iterator(tmp_path / "dense", [np.zeros(2, np.int32)], mode="a")
    with pytest.raises(ValueError, match="ragged store"):
        from_numpy(tmp_path / "ragged", np.zeros(5, np.int32), mode="a")
    assert (store_files(tmp_path / "dense"), store_files(tmp_path / "ragged")) == before


def test_schema_override(tmp_path):
    """schema= casts the dtype (same kind only) and reshapes the items."""
    array = np.arange(24, dtype=np.float64).reshape(2, 12)
    from_numpy(tmp_path / "store", array, schema={"dtype": "<f4", "item_shape": (3, 4)})
    with DenseDataset(tmp_path / "store") as dataset:
        assert dataset.dtype == np.float32 and dataset.item_shape == (3, 4)
        np.testing.assert_array_equal(dataset[:], array.reshape(2, 3, 4))
    # Appending float64 data to the float32 store works through the same override.
    from_numpy(tmp_path / "store", array, schema={"dtype": "<f4", "item_shape": (3, 4)})
    with pytest.raises(ValueError, match="cannot convert"):
        from_numpy(tmp_path / "other", array, schema={"dtype": "<i4"})
    with pytest.raises(ValueError, match="reshaped"):
        from_numpy(tmp_path / "other", array, schema={"item_shape": (5,)})
    with pytest.raises(ValueError, match="unknown keys"):
        from_numpy(tmp_path / "other", array, schema={"shape": (3, 4)})
    with pytest.raises(ValueError, match="kind"):
        from_numpy(tmp_path / "other", array, schema={"kind": "ragged"})
    assert not (tmp_path / "other").exists()


def test_refuses_paths_that_are_not_stores(tmp_path):
    """A file, or a directory holding other things, is never turned into a store."""
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="not a directory"):
        from_numpy(tmp_path / "file", np.zeros(3))
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="not a loaderx store"):
        from_numpy(tmp_path / "mine", np.zeros(3))
    assert os.listdir(tmp_path / "mine") == ["notes.txt"]


def test_empty_directory_becomes_a_store(tmp_path):
    """An existing empty directory is a fine target."""
    (tmp_path / "empty").mkdir()
    from_numpy(tmp_path / "empty", np.zeros(3))
    assert read_schema(tmp_path / "empty").kind == "dense"


def test_failed_append_is_rolled_back(tmp_path, monkeypatch):
    """When a later chunk fails, the chunks this call appended are taken back."""
    from_numpy(tmp_path / "store", np.arange(10, dtype=np.int64), codec="raw")
    calls = []
    original = _writing.Writer.append

    def failing(self, buffer, offsets):
        calls.append(len(offsets))
        if len(calls) == 3:
            raise OSError("disk on fire")
        original(self, buffer, offsets)

    monkeypatch.setattr(_writing.Writer, "append", failing)
    with pytest.raises(OSError, match="disk on fire"):
        from_numpy(tmp_path / "store", np.arange(100, dtype=np.int64), codec="raw", chunk_bytes=80)
    calls.clear()
    with pytest.raises(OSError):
        from_numpy(tmp_path / "new", np.arange(100, dtype=np.int64), codec="raw", chunk_bytes=80)
    monkeypatch.undo()
    with DenseDataset(tmp_path / "store") as dataset:
        np.testing.assert_array_equal(dataset[:], np.arange(10))
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("mode", ["w", "a"])
def test_conversion_syncs_once_before_its_schema(tmp_path, monkeypatch, mode):
    """Chunks are appended without fsyncs (durable=False) and made durable by
    one sync before the schema is written or the call returns."""
    from_numpy(tmp_path / "store", np.arange(10, dtype=np.float32), codec="zstd")
    events, opened = [], []

    class Spy(Zrecord):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            opened.append(kwargs.get("durable", True))

        def append(self, *args, **kwargs):
            events.append("append")
            return super().append(*args, **kwargs)

        def sync(self):
            events.append("sync")
            return super().sync()

    def schema(*args, **kwargs):
        events.append("schema")
        return write_schema(*args, **kwargs)

    monkeypatch.setattr(_writing, "Zrecord", Spy)
    monkeypatch.setattr(_writing, "write_schema", schema)
    from_numpy(
        tmp_path / "store",
        np.arange(100, dtype=np.float32),
        codec="zstd",
        chunk_bytes=1280,
        mode=mode,
    )  # 20 rows a chunk
    assert opened == [False]
    assert events == ["append"] * 5 + (["sync", "schema"] if mode == "w" else ["sync"])
    monkeypatch.undo()
    with DenseDataset(tmp_path / "store") as dataset:
        expected = (
            np.arange(100) if mode == "w" else np.concatenate([np.arange(10), np.arange(100)])
        )
        np.testing.assert_array_equal(dataset[:], expected)


def test_interrupted_conversion_is_not_a_store(tmp_path):
    """Records without a schema (a crash mid-conversion) are neither opened nor appended to."""
    with Zrecord(tmp_path / "half", codec="raw") as store:
        store.append(np.zeros(4, np.int64), np.arange(4) * 8)
    with pytest.raises(FileNotFoundError):
        DenseDataset(tmp_path / "half")
    with pytest.raises(ValueError, match="interrupted"):
        from_numpy(tmp_path / "half", np.zeros(4, np.int64), codec="raw", mode="a")


def test_raw_label_overhead(tmp_path):
    """1M int64 labels stored raw take at most 1% + a few KiB over their 8 MB."""
    labels = np.arange(1_000_000, dtype=np.int64)
    from_numpy(tmp_path / "labels", labels, codec="raw")
    assert disk_bytes(tmp_path / "labels") <= labels.nbytes * 1.01 + 16 * 1024
    with DenseDataset(tmp_path / "labels") as dataset:
        np.testing.assert_array_equal(dataset[[0, 999_999, 123_456]], [0, 999_999, 123_456])


def test_more_than_2_24_samples(tmp_path):
    """More records than 0.9's 2^24 limit convert and read back at the far end."""
    count = (1 << 24) + 5
    array = (np.arange(count, dtype=np.uint32) % 251).astype(np.uint8)
    assert from_numpy(tmp_path / "many", array, codec="raw") == count
    del array
    with DenseDataset(tmp_path / "many") as dataset:
        assert len(dataset) == count
        tail = np.arange(count - 10, count)
        np.testing.assert_array_equal(dataset[tail], tail % 251)
        np.testing.assert_array_equal(
            dataset[[1 << 24, -1, 0]], [(1 << 24) % 251, (count - 1) % 251, 0]
        )


@pytest.mark.parametrize("codec", ["raw", "zstd"])
def test_samples_over_one_mib(tmp_path, codec):
    """1024x1024x3 uint8 images (3 MiB each) convert and read back exactly."""
    rng = np.random.default_rng(3)
    images = rng.integers(0, 4, size=(3, 1024, 1024, 3), dtype=np.uint8)
    images[1] = 7
    from_numpy(tmp_path / "images", images, codec=codec, chunk_bytes=4 << 20)
    with DenseDataset(tmp_path / "images") as dataset:
        np.testing.assert_array_equal(dataset[[2, 0, 1, 2]], images[[2, 0, 1, 2]])
        np.testing.assert_array_equal(dataset[1], images[1])


MEMORY_SCRIPT = textwrap.dedent(
    """
    import sys, threading, time
    import numpy as np
    from loaderx import from_numpy, DenseDataset

    npy, store, rows = sys.argv[1], sys.argv[2], int(sys.argv[3])
    row_shape = (1024, 1024)
    # Real data, written chunk by chunk (no sparse file, no full array in memory).
    array = np.lib.format.open_memmap(npy, mode="w+", dtype=np.uint8, shape=(rows, *row_shape))
    pattern = (np.arange(1 << 20, dtype=np.uint32) * 7 % 251).astype(np.uint8).reshape(row_shape)
    for start in range(0, rows, 32):
        array[start:start + 32] = pattern
        array[start:start + 32, 0, 0] = np.arange(start, min(rows, start + 32)) % 256
    array.flush()
    del array

    def anonymous_kib():
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1])

    peak = [anonymous_kib()]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], anonymous_kib())
            time.sleep(0.002)

    sampler = threading.Thread(target=sample)
    sampler.start()
    before = anonymous_kib()
    count = from_numpy(store, np.load(npy, mmap_mode="r"), codec="zstd")
    done.set()
    sampler.join()
    with DenseDataset(store) as dataset:
        assert len(dataset) == rows == count
        assert dataset[rows - 1][0, 0] == (rows - 1) % 256
        assert (dataset[rows // 2][1] == pattern[1]).all()
    print(before, peak[0])
    """
)


def test_bounded_memory_converting_a_large_memmap(tmp_path):
    """Converting a 1.25 GiB memory-mapped .npy keeps peak anonymous memory
    to a few hundred MiB (the mapped file's page cache does not count)."""
    npy = tmp_path / "big.npy"
    rows = 1280  # 1280 MiB of real data
    try:
        result = subprocess.run(
            [sys.executable, "-c", MEMORY_SCRIPT, str(npy), str(tmp_path / "store"), str(rows)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, result.stderr
        before_kib, peak_kib = map(int, result.stdout.split())
        assert os.path.getsize(npy) > (1 << 30)
    finally:
        if npy.exists():
            npy.unlink()
        shutil.rmtree(tmp_path / "store", ignore_errors=True)
    assert peak_kib - before_kib < 300 * 1024, (
        f"conversion used {(peak_kib - before_kib) / 1024:.0f} MiB of anonymous memory"
    )


# ---- from_iterator -----------------------------------------------------------------


def test_from_iterator_any_row_count_and_generators(tmp_path):
    """A generator of arrays with 0..n rows becomes a ragged store of exactly those records."""
    records = [np.full((rows, 3), rows, dtype=np.float32) for rows in [2, 0, 5, 0, 1]]
    assert from_iterator(tmp_path / "store", (record for record in records)) == 5
    with RaggedDataset(tmp_path / "store") as dataset:
        assert dataset.item_shape == (3,)
        for got, want in zip(dataset[:], records):
            assert got.shape == want.shape
            np.testing.assert_array_equal(got, want)


def test_from_iterator_many_chunks_and_appends(tmp_path):
    """Small chunks split the records over many appends; a second call appends."""
    records = [np.arange(i % 7, dtype=np.int64) for i in range(200)]
    from_iterator(tmp_path / "store", records, chunk_bytes=64)
    from_iterator(tmp_path / "store", records[:3], chunk_bytes=64, mode="a")
    with RaggedDataset(tmp_path / "store") as dataset:
        assert len(dataset) == 203
        for got, want in zip(dataset[:], records + records[:3]):
            np.testing.assert_array_equal(got, want)


def test_from_iterator_source_may_reuse_its_buffer(tmp_path):
    """A source that refills one array for every record is stored record by record."""

    def source():
        buffer = np.empty(4, np.int32)
        for i in range(50):
            buffer[:] = i
            yield buffer
        yield np.full(40, 50, np.int32)  # larger than a chunk: written on its own

    assert from_iterator(tmp_path / "store", source(), chunk_bytes=100) == 51
    with RaggedDataset(tmp_path / "store") as dataset:
        for i, record in enumerate(dataset[:]):
            assert (record == i).all() and record.size in (4, 40)


@pytest.mark.parametrize(
    "bad, message",
    [
        (np.zeros(3, np.float64), "record 2 has dtype float64"),
        (np.zeros((3, 2), np.int32), r"record 2 has rows of shape \(2,\)"),
        (np.int32(5), "record 2 is a scalar"),
        (np.array([None, 1]), "record 2 has dtype object"),
    ],
)
def test_from_iterator_bad_record_writes_nothing(tmp_path, bad, message):
    """A record of another dtype or row shape raises naming it; the call keeps nothing."""
    good = [np.arange(4, dtype=np.int32), np.arange(2, dtype=np.int32)]
    with pytest.raises((ValueError, TypeError), match=message):
        from_iterator(tmp_path / "new", good + [bad], chunk_bytes=8)
    assert not (tmp_path / "new").exists()
    from_iterator(tmp_path / "old", good)
    before = store_files(tmp_path / "old")
    with pytest.raises((ValueError, TypeError), match=message):
        from_iterator(tmp_path / "old", good + [bad], chunk_bytes=8)
    with RaggedDataset(tmp_path / "old") as dataset:
        assert len(dataset) == 2
    assert read_schema(tmp_path / "old") is not None and "schema.msgpack" in before


def test_from_iterator_source_error_rolls_back(tmp_path):
    """An exception raised by the source itself propagates and the call keeps nothing."""

    def source():
        for i in range(50):
            yield np.arange(i, dtype=np.uint16)
        raise RuntimeError("source broke")

    with pytest.raises(RuntimeError, match="source broke"):
        from_iterator(tmp_path / "store", source(), chunk_bytes=32)
    assert not (tmp_path / "store").exists()


def test_from_iterator_empty_source(tmp_path):
    """An empty source needs schema= to create a store, and appends nothing to an existing one."""
    with pytest.raises(ValueError, match="empty source"):
        from_iterator(tmp_path / "store", [])
    assert from_iterator(tmp_path / "store", [], schema={"dtype": "<i4", "item_shape": (2,)}) == 0
    with RaggedDataset(tmp_path / "store") as dataset:
        assert len(dataset) == 0 and dataset.item_shape == (2,)
    assert from_iterator(tmp_path / "store", iter([]), mode="a") == 0


def test_from_iterator_bytes_and_forced_schema(tmp_path):
    """bytes are raw rows of the store's dtype; schema= casts arrays of the same kind."""
    schema = {"dtype": "<f4", "item_shape": (2,)}
    payload = np.array([[1, 2], [3, 4]], np.float32).tobytes()
    records = [payload, np.array([[5, 6]], np.float64), b""]
    assert from_iterator(tmp_path / "store", records, schema=schema) == 3
    with RaggedDataset(tmp_path / "store") as dataset:
        got = dataset[:]
        np.testing.assert_array_equal(got[0], [[1, 2], [3, 4]])
        np.testing.assert_array_equal(got[1], [[5, 6]])
        assert got[2].shape == (0, 2)
    with pytest.raises(ValueError, match="not a whole number"):
        from_iterator(tmp_path / "store", [b"abc"], schema=schema)


def test_from_iterator_dictionary(tmp_path):
    """zstd_dict trains from the first chunk of records and reads back exactly."""
    records = [np.tile(np.arange(40, dtype=np.uint8), i % 5 + 1) for i in range(300)]
    from_iterator(tmp_path / "store", records, codec="zstd_dict", dict_size=1024)
    with RaggedDataset(tmp_path / "store") as dataset:
        assert dataset.store.has_dict()
        for got, want in zip(dataset[::13], records[::13]):
            np.testing.assert_array_equal(got, want)


# ---- progress ------------------------------------------------------------------------


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_only_on_a_terminal(tmp_path, monkeypatch, capsys):
    """The bar goes to stderr on a terminal once writing is slow, never otherwise."""
    from_numpy(tmp_path / "quiet", np.zeros((64, 16)), chunk_bytes=128)
    assert capsys.readouterr().err == ""
    terminal = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(_writing.Progress, "delay_seconds", 0.0)
    monkeypatch.setattr(_writing.Progress, "interval_seconds", 0.0)
    from_numpy(tmp_path / "loud", np.zeros((64, 16)), chunk_bytes=128)
    assert "100%" in terminal.getvalue() and terminal.getvalue().endswith("\n")
    quiet = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", quiet)
    from_numpy(tmp_path / "off", np.zeros((64, 16)), chunk_bytes=128, progress=False)
    assert quiet.getvalue() == ""
    from_iterator(tmp_path / "ragged", [np.zeros(3)] * 10, chunk_bytes=8)
    assert quiet.getvalue().count("records") >= 1


# ---- regressions of issue 11: mode ------------------------------------------------------


def listed(directory) -> list:
    """The entries of ``directory`` but the swap's lock files (``.lock-<name>``, kept by design)."""
    return sorted(name for name in os.listdir(directory) if not name.startswith(".lock-"))


def test_converting_twice_does_not_double_the_dataset(tmp_path):
    """The default mode "w" replaces the store: the quick start run twice keeps its rows."""
    array = np.arange(30, dtype=np.int64).reshape(10, 3)
    for _ in range(2):
        assert from_numpy(tmp_path / "dense", array) == 10
        assert from_iterator(tmp_path / "ragged", [np.arange(3), np.arange(1)]) == 2
    with DenseDataset(tmp_path / "dense") as dataset:
        np.testing.assert_array_equal(dataset[:], array)
    with RaggedDataset(tmp_path / "ragged") as dataset:
        assert len(dataset) == 2
    assert listed(tmp_path) == ["dense", "ragged"]  # no staging left behind


def test_mode_w_replaces_another_schema_and_mode_a_appends(tmp_path):
    """ "w" may change dtype and shape; "a" appends; "x" refuses an existing store."""
    from_numpy(tmp_path / "store", np.zeros((4, 2), np.float32))
    from_numpy(tmp_path / "store", np.arange(3, dtype=np.int16), mode="w")
    assert from_numpy(tmp_path / "store", np.arange(2, dtype=np.int16), mode="a") == 2
    with DenseDataset(tmp_path / "store") as dataset:
        assert dataset.dtype == np.int16 and dataset[:].tolist() == [0, 1, 2, 0, 1]
    with pytest.raises(FileExistsError, match="mode='w'"):
        from_numpy(tmp_path / "store", np.arange(3, dtype=np.int16), mode="x")
    assert from_numpy(tmp_path / "new", np.arange(3), mode="x") == 3
    with pytest.raises(ValueError, match="mode must be"):
        from_numpy(tmp_path / "store", np.arange(3), mode="append")


def test_failed_overwrite_keeps_the_old_store(tmp_path, monkeypatch):
    """An overwrite that fails midway leaves the old store whole, and no staging directory."""
    old = np.arange(10, dtype=np.int64)
    from_numpy(tmp_path / "store", old)
    original = _writing.Writer.append

    def failing(self, buffer, offsets):
        original(self, buffer, offsets)
        raise OSError("disk on fire")

    monkeypatch.setattr(_writing.Writer, "append", failing)
    with pytest.raises(OSError, match="disk on fire"):
        from_numpy(tmp_path / "store", np.arange(5, dtype=np.int64))
    with DenseDataset(tmp_path / "store") as dataset:
        np.testing.assert_array_equal(dataset[:], old)
    assert listed(tmp_path) == ["store"]


def test_mode_w_refuses_a_directory_that_is_not_a_store(tmp_path):
    """Overwriting means replacing a store, never a directory of other files."""
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "cat.jpg").write_bytes(b"meow")
    with pytest.raises(ValueError, match="not a loaderx store"):
        from_numpy(tmp_path / "photos", np.arange(3))
    assert os.listdir(tmp_path / "photos") == ["cat.jpg"]


def test_mode_w_waits_for_no_writer(tmp_path):
    """Overwriting a store another handle is writing to raises StoreLockedError and changes
    nothing."""
    from loaderx import StoreLockedError

    from_numpy(tmp_path / "store", np.arange(4), codec="raw")
    with Zrecord(tmp_path / "store", codec="raw") as writer:
        writer.append(np.arange(4, 6).astype(np.int64), [0, 8])  # holds the write lock until closed
        with pytest.raises(StoreLockedError, match="another process"):
            from_numpy(tmp_path / "store", np.arange(10), codec="raw")
    with DenseDataset(tmp_path / "store") as dataset:
        assert dataset[:].tolist() == [0, 1, 2, 3, 4, 5]
    assert from_numpy(tmp_path / "store", np.arange(10), codec="raw") == 10
    assert listed(tmp_path) == ["store"]


def test_progress_on_a_given_stream(tmp_path):
    """progress=<stream> draws the bar there even though it is no terminal, from the first chunk."""
    stream = io.StringIO()
    from_numpy(tmp_path / "store", np.zeros((64, 16)), chunk_bytes=1024, progress=stream)
    assert (
        "from_numpy [" in stream.getvalue()
        and "100%" in stream.getvalue()
        and stream.getvalue().endswith("\n")
    )
