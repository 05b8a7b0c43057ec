"""The byte-shuffle filter: codecs zstd_shuffle{2,4,8} and
zstd_dict_shuffle{2,4,8} round trip every length, store standard zstd frames of
the shuffled bytes, mix with every other codec in one store, work with
dictionaries and verify, and the converters pick them by the stated rule."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from loaderx import DenseDataset, RaggedDataset, from_iterator, from_numpy
from loaderx.zrecord import (
    CODECS,
    ChecksumError,
    InvalidArgumentError,
    NoDictionaryError,
    Zrecord,
    encoded_bytes,
    shuffled_codec,
)

PLAIN_SHUFFLES = ["zstd_shuffle2", "zstd_shuffle4", "zstd_shuffle8"]


def shuffle_bytes(record: bytes, element_bytes: int) -> bytes:
    """The filter's definition: byte j of element i goes to j * n + i; bytes
    past the last whole element stay at the end."""
    whole = len(record) // element_bytes * element_bytes
    planes = np.frombuffer(record[:whole], np.uint8).reshape(-1, element_bytes).T.tobytes()
    return planes + record[whole:]


def pack(records: list[bytes]) -> tuple[bytes, np.ndarray]:
    sizes = np.array([len(r) for r in records], dtype=np.uint64)
    return b"".join(records), np.cumsum(sizes) - sizes


def read_all(store: Zrecord) -> list[bytes]:
    return [store.read(i) for i in range(len(store))]


def smooth(count: int, dtype=np.float32) -> np.ndarray:
    """Rows of a slowly varying signal with a little noise: neighbours share high bytes."""
    rng = np.random.default_rng(0)
    steps = rng.normal(0, 0.01, (count, 1024))
    return (100 + np.cumsum(steps, axis=1)).astype(dtype)


def data_file(path: Path) -> Path:
    (name,) = [n for n in os.listdir(path) if n.startswith("data-")]
    return path / name


@pytest.mark.parametrize("codec", PLAIN_SHUFFLES)
def test_every_length_round_trips_including_lengths_not_a_multiple_of_the_element(tmp_path, codec):
    """Lengths 0..70 and around the 16-element blocks, compressible bytes, read back exactly."""
    rng = np.random.default_rng(1)
    lengths = list(range(71)) + [255, 256, 257, 1023, 1024, 1025, 4099, 70001]
    records = [rng.integers(0, 3, n, dtype=np.uint8).tobytes() for n in lengths]
    with Zrecord(tmp_path / "s", codec=codec) as store:
        store.append(*pack(records))
        assert read_all(store) == records
        assert store.verify() == []


@pytest.mark.parametrize("element_bytes", [2, 4, 8])
@pytest.mark.parametrize("length", [4096, 4099])
def test_a_shuffled_record_is_a_standard_zstd_frame_of_the_shuffled_bytes(
    tmp_path, element_bytes, length
):
    """Any zstd tool decodes the stored payload to the record shuffled by the
    filter's definition (trailing bytes of an odd length kept at the end)."""
    record = (np.arange(length) // 7 % 251).astype(np.uint8).tobytes()
    with Zrecord(tmp_path / "s", codec=shuffled_codec("zstd", element_bytes)) as store:
        store.append(record, [0])
        assert store.read(0) == record
    frame = data_file(tmp_path / "s").read_bytes()
    assert len(frame) < length  # stored compressed, not raw
    assert zstandard.ZstdDecompressor().decompress(frame) == shuffle_bytes(record, element_bytes)


@pytest.mark.parametrize(
    "dtype",
    [
        "<i2",
        "<u2",
        "<f2",
        "<i4",
        "<u4",
        "<f4",
        "<i8",
        "<u8",
        "<f8",
        "<c8",
        "<c16",
        "<M8[s]",
        "<m8[ms]",
    ],
)
def test_every_numeric_dtype_round_trips_through_the_converter(tmp_path, dtype):
    """Whatever codec auto picks for the dtype, the rows come back exactly."""
    values = smooth(40, np.float64)
    kind = np.dtype(dtype).kind
    array = (
        (values * 100).astype(np.int64).astype(dtype) if kind in "iumM" else values.astype(dtype)
    )
    from_numpy(tmp_path / "d", array, progress=False)
    with DenseDataset(tmp_path / "d") as dataset:
        assert np.array_equal(dataset[:], array)
        assert dataset.codec in CODECS


def test_a_store_mixing_shuffled_plain_and_raw_records_reads_back_exactly(tmp_path):
    """Fixed raw rows, then zstd, every shuffle, a dictionary codec and a
    shuffled record that does not shrink (kept raw) in one store, gathered
    in one call in scrambled order."""
    rng = np.random.default_rng(2)
    records = [rng.integers(0, 256, 64, dtype=np.uint8).tobytes() for _ in range(5)]
    with Zrecord(tmp_path / "s") as store:
        store.append(*pack(records), codec="raw")
        samples = [smooth(1)[0].tobytes()[: 200 + k] for k in range(300)]
        store.train_dict(b"".join(samples), [len(s) for s in samples], 4096)
        for codec in ["zstd", *PLAIN_SHUFFLES, "zstd_dict", "zstd_dict_shuffle4", "zstd_shuffle8"]:
            batch = [smooth(3)[k].tobytes()[: 4000 + 3 * k] for k in range(3)]
            batch.append(rng.integers(0, 256, 333, dtype=np.uint8).tobytes())  # does not shrink
            store.append(*pack(batch), codec=codec)
            records += batch
        assert store.stats()["layout"] == "indexed"
        order = rng.permutation(len(records))
        lengths = store.lengths(order)
        offsets = np.cumsum(lengths) - lengths
        target = bytearray(int(lengths.sum()))
        store.gather(order, target, offsets)
        for k, index in enumerate(order):
            assert bytes(target[offsets[k] : offsets[k] + lengths[k]]) == records[index]
        assert store.verify() == []


def test_dictionary_trained_on_shuffled_samples_works_with_the_shuffled_codec(tmp_path):
    """zstd_dict_shuffle4 needs the store's dictionary, reads back exactly and,
    trained on shuffled samples, beats the shuffle without a dictionary on
    small records."""
    rows = np.ascontiguousarray(smooth(400)[:, :64])  # 256-byte records: a dictionary matters
    with Zrecord(tmp_path / "nodict") as store:
        with pytest.raises(NoDictionaryError, match="zstd_dict_shuffle4"):
            store.append(rows, np.arange(400, dtype=np.uint64) * 256, codec="zstd_dict_shuffle4")
        assert len(store) == 0
    from_numpy(tmp_path / "dict", rows, codec="zstd_dict_shuffle4", dict_size=4096, progress=False)
    from_numpy(tmp_path / "plain", rows, codec="zstd_shuffle4", progress=False)
    with DenseDataset(tmp_path / "dict") as dataset, DenseDataset(tmp_path / "plain") as plain:
        assert dataset.codec == "zstd_dict_shuffle4" and dataset._store.has_dict()
        assert np.array_equal(dataset[:], rows)
        assert dataset._store.stats()["live_bytes"] < plain._store.stats()["live_bytes"]


def test_verify_names_a_shuffled_record_with_a_flipped_byte(tmp_path):
    """One flipped byte inside the second shuffled frame: verify() names record
    1 only, a verified read of it raises, the others still read."""
    records = [smooth(3)[k].tobytes() for k in range(3)]
    with Zrecord(tmp_path / "s", codec="zstd_shuffle4") as store:
        store.append(*pack(records))
        stored = encoded_bytes(records[0], [0], "zstd_shuffle4")
    path = data_file(tmp_path / "s")
    data = bytearray(path.read_bytes())
    data[stored + 10] ^= 0x40
    path.write_bytes(bytes(data))
    with Zrecord(tmp_path / "s", verify=True) as store:
        assert store.verify() == [1]
        with pytest.raises(ChecksumError):
            store.read(1)
        assert store.read(0) == records[0] and store.read(2) == records[2]


def test_unknown_codec_ids_and_shuffles_of_other_codecs_are_refused(tmp_path):
    """Codec 0x41 (a 16-byte shuffle) and 0x10 (a shuffled raw) do not exist."""
    with Zrecord(tmp_path / "s") as store:
        for bad in (0x41, 0x10, 0x04, 0x43):
            with pytest.raises(InvalidArgumentError, match="unknown codec"):
                store.append(b"abcd", [0], codec=bad)
    with pytest.raises(InvalidArgumentError, match="2, 4 or 8"):
        shuffled_codec("zstd", 16)
    with pytest.raises(InvalidArgumentError, match="2, 4 or 8"):
        shuffled_codec("raw", 4)


# ---- the converters' rule -------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "array", "expected"),
    [
        ("smooth float32", smooth(50), "zstd_shuffle4"),
        ("smooth float64", smooth(50, np.float64), "zstd_shuffle8"),
        ("smooth float16", smooth(50, np.float16), "zstd_shuffle2"),
        (
            "small int32 labels",
            np.random.default_rng(3).integers(0, 1000, (50, 1024)).astype(np.int32),
            "zstd_shuffle4",
        ),
        ("uint8 pixels", np.tile(np.arange(64, dtype=np.uint8), (50, 64)), "zstd"),
        (
            "random uint64 bits",
            np.random.default_rng(4).integers(0, 2**63, (50, 512), dtype=np.uint64),
            "zstd",
        ),
        ("strings", np.array([[f"label-{i % 7}"] * 8 for i in range(50)]), "zstd"),
    ],
)
def test_auto_picks_the_shuffle_only_for_numbers_it_shrinks(tmp_path, name, array, expected):
    """The default codec: zstd_shuffleN for numeric N-byte elements when a
    sample shrinks by 3% or more under the filter, else zstd."""
    from_numpy(tmp_path / "d", array, progress=False)
    with DenseDataset(tmp_path / "d") as dataset:
        assert dataset.codec == expected, name
        assert np.array_equal(dataset[:], array)


def test_auto_follows_the_measurement_not_the_dtype(tmp_path, monkeypatch):
    """The same float32 rows keep plain zstd when the shuffle must win by more
    than it does: the pick is the sample's sizes, compared."""
    import loaderx._writing as writing

    rows = smooth(20)
    plain = encoded_bytes(rows, np.arange(20, dtype=np.uint64) * rows[0].nbytes, "zstd")
    shuffled = encoded_bytes(rows, np.arange(20, dtype=np.uint64) * rows[0].nbytes, "zstd_shuffle4")
    assert shuffled < plain
    monkeypatch.setattr(writing, "SHUFFLE_GAIN_MIN", 1 - shuffled / plain + 0.01)
    from_numpy(tmp_path / "d", rows, progress=False)
    with DenseDataset(tmp_path / "d") as dataset:
        assert dataset.codec == "zstd"


def test_auto_appends_with_the_store_codec_and_explicit_codecs_are_kept(tmp_path):
    """Appending with auto keeps an existing store's codec; codec='zstd' is plain zstd."""
    rows = smooth(10)
    from_numpy(tmp_path / "d", rows, codec="zstd", progress=False)
    from_numpy(tmp_path / "d", rows, mode="a", progress=False)
    with DenseDataset(tmp_path / "d") as dataset:
        assert dataset.codec == "zstd" and len(dataset) == 20


def test_from_iterator_tries_the_shuffle_on_its_first_records(tmp_path):
    """Ragged float32 records pick zstd_shuffle4, byte records zstd; both read back."""
    rows = smooth(30)
    records = [rows[k, : 100 + 7 * k] for k in range(30)]
    from_iterator(tmp_path / "r", iter(records), progress=False)
    with RaggedDataset(tmp_path / "r") as dataset:
        assert dataset.codec == "zstd_shuffle4"
        assert all(np.array_equal(got, want) for got, want in zip(dataset[:], records))
    from_iterator(tmp_path / "b", [b"abc" * k for k in range(30)], progress=False)
    with RaggedDataset(tmp_path / "b") as dataset:
        assert dataset.codec == "zstd"


def test_cli_info_names_the_shuffled_codec(tmp_path):
    """`loaderx info` shows the codec the converter picked."""
    from_numpy(tmp_path / "d", smooth(20), progress=False)
    result = subprocess.run(
        [sys.executable, "-m", "loaderx", "info", "--json", str(tmp_path / "d")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(result.stdout)["codec"] == "zstd_shuffle4"


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.binary(max_size=300), st.sampled_from(["raw", "zstd", *PLAIN_SHUFFLES])),
        min_size=1,
        max_size=12,
    )
)
def test_any_mix_of_records_and_codecs_round_trips(tmp_path_factory, batches):
    """Property: each record appended with its own codec reads back exactly."""
    path = tmp_path_factory.mktemp("mix") / "s"
    with Zrecord(path) as store:
        for record, codec in batches:
            store.append(record, [0], codec=codec)
        assert read_all(store) == [record for record, _ in batches]
