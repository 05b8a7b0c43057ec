"""Converting Parquet, Arrow and Hugging Face tables: loaderx.arrow."""

import importlib
import io
import os
import subprocess
import sys
import textwrap

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loaderx import DataLoader, DenseDataset, RaggedDataset, _writing, from_iterator, from_numpy
from loaderx.zrecord import Zrecord


def _require(name: str):
    """The module; CI installs the [arrow] extra, so there a missing one fails."""
    if os.environ.get("CI"):
        return importlib.import_module(name)
    return pytest.importorskip(name)


pa = _require("pyarrow")
pq = _require("pyarrow.parquet")
datasets = _require("datasets")

from loaderx.arrow import COLUMNS_FILE, from_arrow, open_columns  # noqa: E402


def mixed_table(rows: int = 37) -> "pa.Table":
    """One column of every supported kind, with empty lists and strings."""
    rng = np.random.default_rng(rows)
    lengths = rng.integers(0, 6, rows)
    tokens = [rng.integers(0, 50_000, n).astype(np.int32) for n in lengths]
    vectors = [rng.random((n, 4), dtype=np.float32) for n in lengths]
    return pa.table(
        {
            "label": pa.array(np.arange(rows, dtype=np.int64)),
            "small": pa.array((np.arange(rows) % 100).astype(np.int8)),
            "half": pa.array(rng.random(rows).astype(np.float16)),
            "flag": pa.array(np.arange(rows) % 3 == 0),
            "image": pa.array(
                list(rng.integers(0, 255, (rows, 2, 3), dtype=np.uint8).tolist()),
                pa.list_(pa.list_(pa.uint8(), 3), 2),
            ),
            "tensor": pa.FixedShapeTensorArray.from_numpy_ndarray(rng.random((rows, 3, 2))),
            "digest": pa.array([bytes([i % 256]) * 8 for i in range(rows)], pa.binary(8)),
            "tokens": pa.array(tokens, pa.list_(pa.int32())),
            "vectors": pa.array(
                [v.tolist() for v in vectors], pa.large_list(pa.list_(pa.float32(), 4))
            ),
            "text": pa.array(["é" * (i % 4) + str(i) if i % 5 else "" for i in range(rows)]),
            "blob": pa.array([bytes(range(i % 7)) for i in range(rows)], pa.large_binary()),
        }
    )


def expected(table, name: str) -> list:
    """Column ``name`` as the list of NumPy records the store should return."""
    column = table.column(name).combine_chunks()
    if name == "tensor":
        return list(column.to_numpy_ndarray())
    values = column.to_pylist()
    kinds = {
        "image": np.uint8,
        "digest": np.uint8,
        "tokens": np.int32,
        "vectors": np.float32,
        "text": np.uint8,
        "blob": np.uint8,
    }
    if name in ("text", "blob", "digest"):
        return [
            np.frombuffer(value.encode() if isinstance(value, str) else value, np.uint8)
            for value in values
        ]
    if name == "vectors":
        return [np.asarray(value, np.float32).reshape(-1, 4) for value in values]
    dtype = kinds[name] if name in kinds else table.schema.field(name).type.to_pandas_dtype()
    return [np.asarray(value, dtype=dtype) for value in values]


def assert_columns_equal(path, table, names=None):
    columns = open_columns(path)
    try:
        assert list(columns) == (names or table.column_names)
        for name, dataset in columns.items():
            assert len(dataset) == table.num_rows
            got = dataset[:] if isinstance(dataset, RaggedDataset) else list(dataset[:])
            for row, (have, want) in enumerate(zip(got, expected(table, name))):
                np.testing.assert_array_equal(have, want, err_msg=f"{name} row {row}")
                assert have.dtype == want.dtype, name
    finally:
        for dataset in columns.values():
            dataset.close()


# ---- types and layout ------------------------------------------------------------------


def test_every_column_kind_round_trips_through_small_batches(tmp_path):
    """Each supported type becomes the store the module doc promises and reads
    back exactly, also when tiny chunk_bytes cut batches and appends apart."""
    table = mixed_table()
    assert from_arrow(tmp_path / "out", table, chunk_bytes=64) == table.num_rows
    assert_columns_equal(tmp_path / "out", table)
    columns = open_columns(tmp_path / "out")
    kinds = {
        name: (type(dataset).__name__, dataset.dtype.str, dataset.item_shape)
        for name, dataset in columns.items()
    }
    for dataset in columns.values():
        dataset.close()
    assert kinds == {
        "label": ("DenseDataset", "<i8", ()),
        "small": ("DenseDataset", "|i1", ()),
        "half": ("DenseDataset", "<f2", ()),
        "flag": ("DenseDataset", "|b1", ()),
        "image": ("DenseDataset", "|u1", (2, 3)),
        "tensor": ("DenseDataset", "<f8", (3, 2)),
        "digest": ("DenseDataset", "|u1", (8,)),
        "tokens": ("RaggedDataset", "<i4", ()),
        "vectors": ("RaggedDataset", "<f4", (4,)),
        "text": ("RaggedDataset", "|u1", ()),
        "blob": ("RaggedDataset", "|u1", ()),
    }
    assert sorted(os.listdir(tmp_path / "out")) == sorted([*table.column_names, COLUMNS_FILE])


def test_sliced_and_chunked_tables_and_readers(tmp_path):
    """Arrow slices (non-zero offsets), multi-chunk tables, record batches and
    readers give the rows they show, not their underlying buffers."""
    table = mixed_table(60)
    sliced = table.slice(7, 41)
    chunked = pa.concat_tables([table.slice(0, 13), table.slice(13, 20), table.slice(33)])
    from_arrow(tmp_path / "sliced", sliced, chunk_bytes=100)
    assert_columns_equal(tmp_path / "sliced", sliced)
    from_arrow(tmp_path / "chunked", chunked)
    assert_columns_equal(tmp_path / "chunked", table)
    from_arrow(tmp_path / "batch", sliced.combine_chunks().to_batches()[0])
    assert_columns_equal(tmp_path / "batch", sliced)
    from_arrow(
        tmp_path / "reader",
        pa.RecordBatchReader.from_batches(table.schema, table.to_batches(max_chunksize=9)),
    )
    assert_columns_equal(tmp_path / "reader", table)


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=60),
    chunk_bytes=st.integers(1, 600),
    start=st.integers(0, 5),
)
def test_token_lists_round_trip_for_any_lengths_and_chunks(
    tmp_path_factory, lengths, chunk_bytes, start
):
    """Property: list<int32> rows of any lengths, any slice and any chunk size
    come back as exactly their records, in order."""
    rows = [list(range(sum(lengths[:i]), sum(lengths[:i]) + n)) for i, n in enumerate(lengths)]
    table = pa.table({"ids": pa.array(rows, pa.list_(pa.int32()))}).slice(min(start, len(rows) - 1))
    path = tmp_path_factory.mktemp("tokens") / "out"
    from_arrow(path, table, chunk_bytes=chunk_bytes)
    with RaggedDataset(path / "ids") as dataset:
        assert [record.tolist() for record in dataset[:]] == table.column("ids").to_pylist()


def test_columns_select_rename_and_codecs(tmp_path):
    """columns= picks and orders columns and renames them; codec= may differ per store."""
    table = mixed_table()
    from_arrow(
        tmp_path / "out", table, columns={"text": "caption", "label": "y"}, codec={"y": "raw"}
    )
    columns = open_columns(tmp_path / "out")
    assert list(columns) == ["caption", "y"]
    assert columns["y"].codec == "raw" and columns["caption"].codec == "zstd"
    np.testing.assert_array_equal(columns["y"][:], np.arange(table.num_rows))
    for dataset in columns.values():
        dataset.close()
    from_arrow(tmp_path / "dict", table, columns=["tokens", "label"], codec="zstd_dict")
    assert_columns_equal(tmp_path / "dict", table, ["tokens", "label"])


def test_auto_codec_is_from_numpys_and_from_iterators_choice(tmp_path):
    """The default codec="auto" picks each store's codec from its first
    records by the converters' rule: shuffled for smooth float32 rows, plain
    zstd for text, as from_numpy and from_iterator pick on the same data."""
    grid = np.linspace(0, 1, 256, dtype=np.float32)
    smooth = np.round(np.sin(np.outer(np.arange(1, 201), grid)) * 65536).astype(np.float32) / 65536
    table = pa.table(
        {
            "smooth": pa.FixedSizeListArray.from_arrays(pa.array(smooth.reshape(-1)), 256),
            "tokens": pa.array(
                [np.arange(n, dtype=np.int32) * 3 for n in range(1, 201)], type=pa.list_(pa.int32())
            ),
            "text": pa.array([f"row {n} " * (n % 7) for n in range(200)]),
        }
    )
    from_arrow(tmp_path / "out", table)
    columns = open_columns(tmp_path / "out")
    try:
        from_numpy(tmp_path / "numpy", smooth)
        from_iterator(
            tmp_path / "iterator", [np.arange(n, dtype=np.int32) * 3 for n in range(1, 201)]
        )
        with (
            DenseDataset(tmp_path / "numpy") as dense,
            RaggedDataset(tmp_path / "iterator") as ragged,
        ):
            assert columns["smooth"].codec == dense.codec == "zstd_shuffle4"
            assert columns["tokens"].codec == ragged.codec
        assert columns["text"].codec == "zstd"
        np.testing.assert_array_equal(columns["smooth"][:], smooth)
    finally:
        for dataset in columns.values():
            dataset.close()
    from_arrow(tmp_path / "forced", table, codec={"smooth": "zstd"})
    forced = open_columns(tmp_path / "forced")
    assert [forced[name].codec for name in ("smooth", "tokens")] == [
        "zstd",
        columns["tokens"].codec,
    ]
    for dataset in forced.values():
        dataset.close()


def test_a_shuffled_dictionary_codec_trains_on_shuffled_records(tmp_path):
    """codec="zstd_dict_shuffle4" trains each store's dictionary on its first
    batch's records shuffled as that codec compresses them, as from_numpy
    does, and the rows read back."""
    grid = np.linspace(0, 1, 256, dtype=np.float32)
    smooth = np.round(np.sin(np.outer(np.arange(1, 401), grid)) * 65536).astype(np.float32) / 65536
    table = pa.table(
        {"smooth": pa.FixedSizeListArray.from_arrays(pa.array(smooth.reshape(-1)), 256)}
    )
    from_arrow(tmp_path / "out", table, codec="zstd_dict_shuffle4")
    columns = open_columns(tmp_path / "out")
    try:
        assert columns["smooth"].codec == "zstd_dict_shuffle4"
        np.testing.assert_array_equal(columns["smooth"][:], smooth)
    finally:
        for dataset in columns.values():
            dataset.close()
    with Zrecord(tmp_path / "out" / "smooth") as store:
        assert store.has_dict()


def test_dense_columns_feed_the_dataloader_row_aligned(tmp_path):
    """The dense stores of a column directory are DataLoader streams whose row i lines up."""
    rows = 256
    table = pa.table(
        {
            "x": pa.array(
                list(np.arange(rows * 4, dtype=np.float32).reshape(rows, 4).tolist()),
                pa.list_(pa.float32(), 4),
            ),
            "y": pa.array(np.arange(rows, dtype=np.int64)),
        }
    )
    from_arrow(tmp_path / "out", table)
    columns = open_columns(tmp_path / "out")
    with DataLoader(columns, batch_size=32, mode=2, seed=3, num_workers=2) as loader:
        for _ in range(10):
            batch = next(loader)
            np.testing.assert_array_equal(batch["x"][:, 0], batch["y"] * 4)
    for dataset in columns.values():
        dataset.close()


# ---- Parquet and Hugging Face ----------------------------------------------------------


def test_parquet_file_directory_and_glob(tmp_path):
    """A Parquet file, a directory of them and a glob convert in sorted file order."""
    table = mixed_table(90)
    parts = tmp_path / "parts"
    parts.mkdir()
    for number, start in enumerate(range(0, 90, 30)):
        pq.write_table(table.slice(start, 30), parts / f"part-{number}.parquet", row_group_size=7)
    pq.write_table(table, tmp_path / "one.parquet", row_group_size=11)
    assert from_arrow(tmp_path / "file", tmp_path / "one.parquet", chunk_bytes=500) == 90
    assert_columns_equal(tmp_path / "file", table)
    assert from_arrow(tmp_path / "dir", parts) == 90
    assert_columns_equal(tmp_path / "dir", table)
    assert from_arrow(tmp_path / "glob", str(parts / "part-[12].parquet"), columns=["tokens"]) == 60
    assert_columns_equal(tmp_path / "glob", table.slice(30), ["tokens"])


def test_parquet_files_of_another_schema_are_refused(tmp_path):
    """Files of different schemas raise before anything is written."""
    pq.write_table(pa.table({"a": [1, 2]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"a": [1.5]}), tmp_path / "b.parquet")
    with pytest.raises(ValueError, match="another schema"):
        from_arrow(tmp_path / "out", str(tmp_path / "*.parquet"))
    assert not (tmp_path / "out").exists()
    with pytest.raises(FileNotFoundError, match="no Parquet file"):
        from_arrow(tmp_path / "out", str(tmp_path / "*.nothing"))


def hugging_face_dataset(cache, rows: int = 40):
    """A Dataset built locally, its cache files under ``cache`` (a tmp_path)."""
    features = datasets.Features(
        {
            "pixels": datasets.Array2D((2, 3), "float32"),
            "input_ids": datasets.Sequence(datasets.Value("int32")),
            "text": datasets.Value("string"),
            "label": datasets.ClassLabel(names=["neg", "pos"]),
            "pair": datasets.Sequence(datasets.Value("float64"), length=2),
        }
    )

    def rows_of():
        for i in range(rows):
            yield {
                "pixels": np.full((2, 3), i, np.float32),
                "input_ids": list(range(i % 9)),
                "text": "t" * (i % 5),
                "label": i % 2,
                "pair": [i, -i],
            }

    return datasets.Dataset.from_generator(rows_of, features=features, cache_dir=str(cache))


def test_hugging_face_dataset_in_its_row_order(tmp_path):
    """A datasets.Dataset built locally (Array2D, Sequence, ClassLabel, string)
    converts with the shape its features declare; a shuffled selection keeps
    its order, and an IterableDataset converts too."""
    dataset = hugging_face_dataset(tmp_path / "cache")
    assert from_arrow(tmp_path / "all", dataset, chunk_bytes=256) == 40
    columns = open_columns(tmp_path / "all")
    assert columns["pixels"].item_shape == (2, 3) and columns["pair"].item_shape == (2,)
    np.testing.assert_array_equal(columns["pixels"][:][:, 1, 2], np.arange(40))
    assert [record.tolist() for record in columns["input_ids"][:5]] == [
        list(range(i)) for i in range(5)
    ]
    assert bytes(columns["text"][4]) == b"tttt"
    for column in columns.values():
        column.close()
    picked = dataset.shuffle(seed=1).select(range(15))
    from_arrow(tmp_path / "picked", picked, columns=["label", "pair"])
    with DenseDataset(tmp_path / "picked" / "pair") as pair:
        np.testing.assert_array_equal(pair[:][:, 0], np.asarray(picked["pair"])[:, 0])
    assert (
        from_arrow(tmp_path / "iterable", dataset.to_iterable_dataset(), columns=["input_ids"])
        == 40
    )
    with RaggedDataset(tmp_path / "iterable" / "input_ids") as ids:
        assert ids[39].tolist() == list(range(39 % 9))
    with pytest.raises(TypeError, match="pick a split"):
        from_arrow(tmp_path / "dict", datasets.DatasetDict({"train": dataset}))


def test_hugging_face_array_with_a_free_first_dimension_is_ragged(tmp_path):
    """Array2D((None, 3)) rows of any count become a ragged store of (3,) rows."""
    features = datasets.Features({"v": datasets.Array2D((None, 3), "float32")})
    records = [np.full((n, 3), n, np.float32) for n in (2, 0, 4, 1)]
    from_arrow(
        tmp_path / "out",
        datasets.Dataset.from_dict({"v": records}, features=features),
        chunk_bytes=40,
    )
    with RaggedDataset(tmp_path / "out" / "v") as ragged:
        assert ragged.item_shape == (3,)
        for got, want in zip(ragged[:], records):
            np.testing.assert_array_equal(got, want)


# ---- errors and all-or-nothing ---------------------------------------------------------


def test_unsupported_types_and_names_fail_before_writing(tmp_path):
    """Structs, timestamps, lists of lists, unsafe names: a clear error, nothing on disk."""
    cases = [
        (pa.table({"s": pa.array([{"a": 1}])}), {}, TypeError, "column 's' has Arrow type struct"),
        (pa.table({"t": pa.array([1], pa.timestamp("s"))}), {}, TypeError, "cast it"),
        (pa.table({"l": pa.array([[[1]]])}), {}, TypeError, "cannot store"),
        (pa.table({"../x": [1]}), {}, ValueError, "not a plain file name"),
        (pa.table({"a": [1]}), {"columns": ["b"]}, ValueError, "no column 'b'"),
        (
            pa.table({"a": [1], "b": [2]}),
            {"columns": {"a": "c", "b": "c"}},
            ValueError,
            "share the store name",
        ),
        (
            pa.table({"a": [1]}),
            {"columns": {"a": COLUMNS_FILE}},
            ValueError,
            "not a plain file name",
        ),
        (pa.table({"a": [1]}), {"codec": "brotli"}, ValueError, "codec"),
    ]
    for table, options, error, message in cases:
        with pytest.raises(error, match=message):
            from_arrow(tmp_path / "out", table, **options)
        assert not (tmp_path / "out").exists()


def test_nulls_late_in_the_source_leave_nothing_behind(tmp_path):
    """A null found after batches were written raises and removes every store
    the call wrote; an empty target directory stays, empty."""
    good = pa.table({"a": pa.array(np.arange(100)), "t": pa.array([[1, 2]] * 100)})
    bad = pa.table({"a": pa.array([1, None], pa.int64()), "t": pa.array([[1], [2]])})
    reader = pa.RecordBatchReader.from_batches(
        good.schema, [*good.to_batches(max_chunksize=10), *bad.to_batches()]
    )
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="column 'a' has 1 null"):
        from_arrow(tmp_path / "empty", reader)
    assert os.listdir(tmp_path / "empty") == []
    nested = pa.table({"t": pa.array([[1, None]])})
    with pytest.raises(ValueError, match="null"):
        from_arrow(tmp_path / "nested", nested)
    assert not (tmp_path / "nested").exists()


def test_a_failing_reader_leaves_nothing_and_an_existing_target_is_refused(tmp_path):
    """An exception from the source mid-way removes the partial directory; a
    non-empty target is never touched."""
    table = pa.table({"a": pa.array(np.arange(50))})

    def batches():
        yield from table.to_batches(max_chunksize=10)[:3]
        raise OSError("disk went away")

    with pytest.raises(OSError, match="disk went away"):
        from_arrow(tmp_path / "out", pa.RecordBatchReader.from_batches(table.schema, batches()))
    assert not (tmp_path / "out").exists()
    from_arrow(tmp_path / "out", table)
    with pytest.raises(ValueError, match="not an empty directory"):
        from_arrow(tmp_path / "out", table)
    with DenseDataset(tmp_path / "out" / "a") as kept:
        assert len(kept) == 50


def test_progress_bar_on_a_terminal(tmp_path, monkeypatch):
    """from_arrow reports rows on a terminal like the other converters."""
    terminal = type("Terminal", (io.StringIO,), {"isatty": lambda self: True})()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(_writing.Progress, "delay_seconds", 0.0)
    monkeypatch.setattr(_writing.Progress, "interval_seconds", 0.0)
    from_arrow(tmp_path / "out", pa.table({"a": np.arange(100)}), chunk_bytes=80)
    assert "from_arrow: 100/100 records" in terminal.getvalue()
    assert terminal.getvalue().endswith("\n")


# ---- the listing is never trusted ----------------------------------------------------


def rewrite_listing(path, change):
    file = path / COLUMNS_FILE
    outer = msgpack.unpackb(file.read_bytes())
    listing = msgpack.unpackb(outer["body"])
    change(listing)
    body = msgpack.packb(listing)
    file.write_bytes(msgpack.packb({"body": body, "crc32": __import__("zlib").crc32(body)}))


def test_damaged_or_hostile_listing_raises(tmp_path):
    """Names outside the directory, symlinks, duplicates, wrong counts, flipped
    bytes and a missing listing each raise a clear error."""
    table = pa.table({"a": pa.array(np.arange(10)), "b": pa.array(np.arange(10))})
    outside = tmp_path / "outside"
    from_arrow(outside, table)

    def fresh():
        target = tmp_path / f"case{len(os.listdir(tmp_path))}"
        from_arrow(target, table)
        return target

    cases = [
        (lambda listing: listing["columns"][0].update(name="../outside"), "bad column entry"),
        (lambda listing: listing["columns"][0].update(name=str(outside / "a")), "bad column entry"),
        (
            lambda listing: listing["columns"].append(dict(listing["columns"][0])),
            "bad column entry",
        ),
        (lambda listing: listing["columns"][0].update(kind="sparse"), "bad column entry"),
        (lambda listing: listing.update(rows=11), "holds 10 records"),
        (lambda listing: listing.update(version=99), "upgrade loaderx"),
        (lambda listing: listing.update(columns=[]), "rows or columns"),
    ]
    for change, message in cases:
        target = fresh()
        rewrite_listing(target, change)
        with pytest.raises(ValueError, match=message):
            open_columns(target)
    target = fresh()
    os.rename(target / "a", target / "a-moved")
    os.symlink(outside / "a", target / "a")
    with pytest.raises(ValueError, match="not a directory inside"):
        open_columns(target)
    target = fresh()
    data = bytearray((target / COLUMNS_FILE).read_bytes())
    data[-8] ^= 0xFF
    (target / COLUMNS_FILE).write_bytes(bytes(data))
    with pytest.raises(ValueError, match="damaged"):
        open_columns(target)
    target = fresh()
    os.unlink(target / COLUMNS_FILE)
    with pytest.raises(FileNotFoundError, match="unfinished or failed conversion"):
        open_columns(target)


# ---- bounded memory ----------------------------------------------------------------------

MEMORY_SCRIPT = textwrap.dedent(
    """
    import sys, threading, time
    import numpy as np
    import pyarrow as pa, pyarrow.parquet as pq

    mode, path = sys.argv[1], sys.argv[2]
    width, rows, group = 64 * 1024, int(sys.argv[3]), 256
    if mode == "write":
        # 64 KiB uint8 images (fixed-size lists), token lists and labels, written a row group at
        # a time.
        schema = pa.schema(
            [
                ("image", pa.list_(pa.uint8(), width)),
                ("tokens", pa.list_(pa.int32())),
                ("label", pa.int64()),
            ]
        )
        with pq.ParquetWriter(path, schema) as writer:
            for start in range(0, rows, group):
                labels = np.arange(start, start + group)
                images = np.zeros((group, width), np.uint8)
                images[:, 0] = labels % 256
                images[:, 1::97] = 7
                offsets = np.concatenate([[0], np.cumsum(labels % 50 * 40)]).astype(np.int32)
                values = pa.array(np.arange(offsets[-1], dtype=np.int32))
                tokens = pa.ListArray.from_arrays(pa.array(offsets), values)
                images = pa.FixedSizeListArray.from_arrays(pa.array(images.reshape(-1)), width)
                batch = pa.record_batch([images, tokens, pa.array(labels)], schema=schema)
                writer.write_batch(batch)
        sys.exit(0)

    from loaderx.arrow import from_arrow, open_columns

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
    count = from_arrow(sys.argv[4], path)
    done.set()
    sampler.join()
    columns = open_columns(sys.argv[4])
    assert count == rows == len(columns["image"]) == len(columns["tokens"])
    assert columns["image"][rows - 1][0] == (rows - 1) % 256 and columns["image"][5][98] == 7
    assert columns["tokens"][rows - 1].size == (rows - 1) % 50 * 40
    print(before, peak[0])
    """
)


def test_parquet_conversion_memory_is_bounded(tmp_path):
    """Converting a Parquet file of 256 MiB of decoded rows (decoded at once they
    would take several times that) stays under 300 MiB of anonymous memory,
    in a fresh process with the default chunk_bytes."""
    rows = 4096  # x 64 KiB images = 256 MiB, plus 2.4 MiB of tokens
    parquet = tmp_path / "big.parquet"
    run = [sys.executable, "-c", MEMORY_SCRIPT]
    written = subprocess.run(
        [*run, "write", str(parquet), str(rows)], capture_output=True, text=True, timeout=300
    )
    assert written.returncode == 0, written.stderr
    result = subprocess.run(
        [*run, "read", str(parquet), str(rows), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    before_kib, peak_kib = map(int, result.stdout.split())
    print(f"peak anonymous memory of the conversion: {(peak_kib - before_kib) / 1024:.0f} MiB")
    before_kib, peak_kib = map(int, result.stdout.split())
    assert peak_kib - before_kib < 300 * 1024, (
        f"conversion used {(peak_kib - before_kib) / 1024:.0f} MiB of anonymous memory"
    )


def test_readme_conversion_block_runs(tmp_path, monkeypatch):
    """The datasets guide's from_arrow block runs as written."""
    import re
    from pathlib import Path

    monkeypatch.chdir(tmp_path)
    readme = (
        Path(__file__).resolve().parent.parent / "docs" / "guides" / "datasets.md"
    ).read_text()
    block = next(
        b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if 'from_arrow("converted"' in b
    )
    namespace = {}
    exec(compile(block, "datasets guide conversion block", "exec"), namespace)
    assert namespace["batch"]["image"].shape == (32, 8, 8)
    assert bytes(namespace["columns"]["text"][3]) == b"caption 3"
    assert sorted(os.listdir("converted")) == [COLUMNS_FILE, "image", "input_ids", "label", "text"]
