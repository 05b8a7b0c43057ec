"""The LZ4 codecs: lz4 and lz4_shuffle{2,4,8} round trip every length and
every numeric dtype, store one standard LZ4 frame per record (the reference
library decodes it), fail damaged payloads with the store's checksum error,
and codec="auto-speed" picks them by the rule README states."""

import ctypes
import os
from pathlib import Path

import numpy as np
import pytest

from loaderx import DenseDataset, RaggedDataset, from_iterator, from_numpy
from loaderx.zrecord import (
    CODECS,
    ChecksumError,
    CorruptStoreError,
    InvalidArgumentError,
    Zrecord,
    encoded_bytes,
    shuffled_codec,
)

LZ4_CODECS = ["lz4", "lz4_shuffle2", "lz4_shuffle4", "lz4_shuffle8"]
LZ4_PATH = os.environ.get("LOADERX_LZ4") or "/usr/lib/x86_64-linux-gnu/liblz4.so.1"


def pack(records: list[bytes]) -> tuple[bytes, np.ndarray]:
    sizes = np.array([len(r) for r in records], dtype=np.uint64)
    return b"".join(records), np.cumsum(sizes) - sizes


def smooth(count: int, dtype=np.float32, width: int = 3072) -> np.ndarray:
    """Rows of a slowly varying signal with a little noise: neighbours share high bytes."""
    rng = np.random.default_rng(0)
    steps = rng.normal(0, 0.01, (count, width))
    return (100 + np.cumsum(steps, axis=1)).astype(dtype)


def payloads(path: Path) -> list[tuple[int, bytes]]:
    """(codec id, stored payload) of every record, read from the files by the
    documented format (the superblock's newer slot names the data and index)."""
    superblock = (path / "superblock").read_bytes()
    slots = [np.frombuffer(superblock[i * 4096 : i * 4096 + 256], dtype="<u8") for i in range(2)]
    slot = max(slots, key=lambda s: s[2])
    data = (path / f"data-{int(slot[5]):016x}").read_bytes()
    index = (path / f"index-{int(slot[7]):016x}").read_bytes()
    entries = np.frombuffer(index, dtype="<u8").reshape(-1, 4)
    found = []
    for offset, _raw_bytes, stored_codec, _checksum in entries:
        stored = int(stored_codec) & ((1 << 56) - 1)
        found.append((int(stored_codec) >> 56, data[int(offset) : int(offset) + stored]))
    return found


def shuffle_bytes(record: bytes, element_bytes: int) -> bytes:
    whole = len(record) // element_bytes * element_bytes
    planes = np.frombuffer(record[:whole], np.uint8).reshape(-1, element_bytes).T.tobytes()
    return planes + record[whole:]


def liblz4_decompress(frame: bytes, capacity: int) -> bytes:
    """One LZ4 frame decoded by the system liblz4's LZ4F_decompress (ctypes)."""
    library = ctypes.CDLL(LZ4_PATH)
    library.LZ4F_createDecompressionContext.argtypes = [ctypes.c_void_p, ctypes.c_uint]
    library.LZ4F_createDecompressionContext.restype = ctypes.c_size_t
    library.LZ4F_decompress.argtypes = [ctypes.c_void_p] + [ctypes.c_void_p] * 5
    library.LZ4F_decompress.restype = ctypes.c_size_t
    library.LZ4F_freeDecompressionContext.argtypes = [ctypes.c_void_p]
    context = ctypes.c_void_p()
    assert library.LZ4F_createDecompressionContext(ctypes.byref(context), 100) == 0
    try:
        target = ctypes.create_string_buffer(capacity)
        written, read = ctypes.c_size_t(capacity), ctypes.c_size_t(len(frame))
        left = library.LZ4F_decompress(
            context, target, ctypes.byref(written), frame, ctypes.byref(read), None
        )
        assert left == 0 and read.value == len(frame), "not one whole LZ4 frame"
        return target.raw[: written.value]
    finally:
        library.LZ4F_freeDecompressionContext(context)


def test_the_lz4_codecs_are_appended_to_the_table():
    """New ids after the old ones: stores written before read unchanged."""
    assert {name: CODECS[name] for name in LZ4_CODECS} == {
        "lz4": 0x03,
        "lz4_shuffle2": 0x13,
        "lz4_shuffle4": 0x23,
        "lz4_shuffle8": 0x33,
    }
    assert list(CODECS)[-4:] == LZ4_CODECS
    assert [shuffled_codec("lz4", n) for n in (2, 4, 8)] == LZ4_CODECS[1:]
    with pytest.raises(InvalidArgumentError, match="'lz4'"):
        shuffled_codec("lz4_shuffle4", 4)


@pytest.mark.parametrize("codec", LZ4_CODECS)
def test_every_length_round_trips(tmp_path, codec):
    """Lengths 0..40, around the shuffle's 16-element blocks and LZ4's 64 KiB
    blocks, compressible bytes, gathered back exactly in scrambled order."""
    rng = np.random.default_rng(1)
    lengths = list(range(41)) + [255, 257, 1025, 4099, 65535, 65536, 65537, 200_003]
    records = [rng.integers(0, 3, n, dtype=np.uint8).tobytes() for n in lengths]
    with Zrecord(tmp_path / "s", codec=codec) as store:
        store.append(*pack(records))
        assert store.stats()["live_bytes"] < sum(lengths)
        order = rng.permutation(len(records))
        got = store.lengths(order)
        offsets = np.cumsum(got) - got
        target = bytearray(int(got.sum()))
        store.gather(order, target, offsets)
        for k, index in enumerate(order):
            assert bytes(target[offsets[k] : offsets[k] + got[k]]) == records[index]
        assert store.verify() == []


@pytest.mark.parametrize(
    "dtype",
    ["<i1", "<u1", "<i2", "<f2", "<u4", "<f4", "<i8", "<f8", "<c8", "<c16", "<M8[s]"],
)
@pytest.mark.parametrize("codec", ["lz4", "lz4_shuffle", "auto-speed"])
def test_every_dtype_and_element_size_round_trips_through_the_converter(tmp_path, dtype, codec):
    """Each dtype through plain lz4, lz4 shuffled by its element size (for
    2/4/8-byte elements) and auto-speed: the rows come back exactly."""
    values = smooth(30, np.float64, 512)
    kind, size = np.dtype(dtype).kind, np.dtype(dtype).itemsize
    array = (values * 100).astype(np.int64).astype(dtype) if kind in "iuM" else values.astype(dtype)
    element_bytes = size // 2 if kind == "c" else size
    if codec == "lz4_shuffle":
        if element_bytes not in (2, 4, 8):
            pytest.skip("the shuffle takes 2, 4 or 8-byte elements")
        codec = shuffled_codec("lz4", element_bytes)
    from_numpy(tmp_path / "d", array, codec=codec, progress=False)
    with DenseDataset(tmp_path / "d") as dataset:
        assert dataset.codec.startswith("lz4")
        assert np.array_equal(dataset[:], array)
        assert np.array_equal(dataset[[29, 0, 7, 7]], array[[29, 0, 7, 7]])


@pytest.mark.parametrize("element_bytes", [1, 2, 4, 8])
def test_a_stored_payload_is_one_standard_lz4_frame(tmp_path, element_bytes):
    """The system liblz4 (ctypes LZ4F_decompress) and, when installed, the
    `lz4` package decode each stored payload to the (shuffled) record."""
    codec = "lz4" if element_bytes == 1 else shuffled_codec("lz4", element_bytes)
    records = [(np.arange(12288 - 3 * k) // 7 % 251).astype(np.uint8).tobytes() for k in range(3)]
    with Zrecord(tmp_path / "s", codec=codec) as store:
        store.append(*pack(records))
    stored = payloads(tmp_path / "s")
    assert [codec_id for codec_id, _ in stored] == [CODECS[codec]] * 3  # compressed, not raw
    try:
        import lz4.frame  # optional dependency
    except ImportError:
        lz4 = None
    for record, (_, frame) in zip(records, stored):
        assert len(frame) < len(record)
        expected = record if element_bytes == 1 else shuffle_bytes(record, element_bytes)
        assert liblz4_decompress(frame, len(record) + 64) == expected
        if lz4 is not None:
            assert lz4.frame.decompress(frame) == expected
            assert lz4.frame.get_frame_info(frame)["content_size"] == len(record)


def test_a_damaged_lz4_payload_fails_with_the_checksum_error(tmp_path):
    """A flipped byte in the second frame: reads raise ChecksumError naming
    it, verify() names only it, the others still read; unchecked reads
    (verify=False) still refuse a frame that no longer decodes to its length."""
    records = [smooth(3)[k].tobytes() for k in range(3)]
    with Zrecord(tmp_path / "s", codec="lz4_shuffle4") as store:
        store.append(*pack(records))
        first = encoded_bytes(records[0], [0], "lz4_shuffle4")
    (data,) = [name for name in os.listdir(tmp_path / "s") if name.startswith("data-")]
    path = tmp_path / "s" / data
    damaged = bytearray(path.read_bytes())
    damaged[first + 100] ^= 0x40
    path.write_bytes(bytes(damaged))
    with Zrecord(tmp_path / "s") as store:
        with pytest.raises(ChecksumError, match="record 1"):
            store.read(1)
        assert store.verify() == [1]
        assert store.read(0) == records[0] and store.read(2) == records[2]
    # A flipped content-size byte: the frame header no longer checks.
    damaged[first + 6] ^= 0x01  # the content size in the header no longer matches
    path.write_bytes(bytes(damaged))
    with Zrecord(tmp_path / "s", verify=False) as store:
        with pytest.raises(CorruptStoreError, match="does not decode"):
            store.read(1)
        assert store.read(2) == records[2]


# ---- codec="auto-speed" -------------------------------------------------------


@pytest.mark.parametrize(
    ("array", "speed", "size"),
    [
        (smooth(40), "lz4_shuffle4", "zstd_shuffle4"),
        (smooth(40, np.float64), "lz4_shuffle8", "zstd_shuffle8"),
        (np.tile(np.arange(64, dtype=np.uint8), (40, 64)), "lz4", "zstd"),
        (np.array([[f"label-{i % 7}"] * 8 for i in range(40)]), "lz4", "zstd"),
    ],
)
def test_auto_speed_picks_lz4_by_the_rule_auto_uses_for_zstd(tmp_path, array, speed, size):
    """auto-speed: lz4_shuffleN where auto picks zstd_shuffleN, else lz4;
    auto stays size-first."""
    from_numpy(tmp_path / "fast", array, codec="auto-speed", progress=False)
    from_numpy(tmp_path / "small", array, progress=False)
    with DenseDataset(tmp_path / "fast") as fast, DenseDataset(tmp_path / "small") as small:
        assert (fast.codec, small.codec) == (speed, size)
        assert np.array_equal(fast[:], array)


def test_auto_speed_appends_with_the_store_codec_and_from_iterator_tries_it(tmp_path):
    """Appending with auto-speed keeps the store's codec; ragged float32
    records pick lz4_shuffle4; an unknown auto name is refused."""
    rows = smooth(10)
    from_numpy(tmp_path / "d", rows, codec="zstd", progress=False)
    from_numpy(tmp_path / "d", rows, codec="auto-speed", mode="a", progress=False)
    with DenseDataset(tmp_path / "d") as dataset:
        assert dataset.codec == "zstd" and len(dataset) == 20
    records = [rows[k, : 100 + 7 * k] for k in range(10)]
    from_iterator(tmp_path / "r", iter(records), codec="auto-speed", progress=False)
    with RaggedDataset(tmp_path / "r") as dataset:
        assert dataset.codec == "lz4_shuffle4"
        assert all(np.array_equal(got, want) for got, want in zip(dataset[:], records))
    with pytest.raises(ValueError, match="unknown codec 'auto-fast'"):
        from_numpy(tmp_path / "x", rows, codec="auto-fast", progress=False)
