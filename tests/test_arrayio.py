"""ArrayStore interchange: import_/export for every format, DLPack, pack/unpack.

The round-trip matrix (every format x every numeric dtype x shapes from 0-d
and empty to 3-d) must come back exact (dtype, shape, bytes, names) or be
refused with a ValueError/TypeError that names the array; the matrix in
docs/guides/arraystore.md is this test's table. A child process checks the
memory bound of streamed imports, exports, packs and unpacks on an array
larger than a chunk. Pack files are corrupted at every frame kind and
truncated, and each damage must raise CorruptPackError and leave no store.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import subprocess
import sys
import textwrap
import zlib
from typing import Callable

import msgpack
import numpy as np
import pytest

from loaderx import ArrayStore, CorruptPackError, zrecord
from loaderx import _arrayio as arrayio
from loaderx._arrayview import OpenArray

DTYPES = [
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
]
SHAPES = [(), (0,), (9,), (5, 3), (4, 2, 3), (0, 3)]
SUFFIX = {
    "npy": ".npy",
    "npz": ".npz",
    "pt": ".pt",
    "safetensors": ".safetensors",
    "hdf5": ".h5",
    "zarr": ".zarr",
    "parquet": ".parquet",
    "feather": ".feather",
    "csv": ".csv",
    "torch": None,
    "pandas": None,
}
MODULES = {
    "pt": "torch",
    "torch": "torch",
    "safetensors": "safetensors",
    "hdf5": "h5py",
    "zarr": "zarr",
    "parquet": "pyarrow",
    "feather": "pyarrow",
    "pandas": "pandas",
}
# The shapes each format refuses (with ValueError): tables need rows, CSV
# and pandas columns are 1-d.
REFUSED_SHAPES = {
    "parquet": {()},
    "feather": {()},
    "csv": {(), (5, 3), (4, 2, 3), (0, 3)},
    "pandas": {(), (5, 3), (4, 2, 3), (0, 3)},
}


def _require(name: str):
    """The module; CI installs the [interop] extra, so there a missing one fails."""
    if os.environ.get("CI"):
        return importlib.import_module(name)
    return pytest.importorskip(
        name, reason=f"{name} is not installed (pip install loaderx[interop])"
    )


def values(dtype: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Random values over the dtype's whole range, with its extremes (ints)
    or NaN, infinities, -0.0, a subnormal and the largest value (floats)."""
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    n = int(np.prod(shape))
    if dt.kind == "b":
        flat = rng.integers(0, 2, n).astype(bool)
    elif dt.kind in "iu":
        info = np.iinfo(dt)
        flat = rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)
        flat[:2] = [info.min, info.max][: min(n, 2)]
    else:
        info = np.finfo(dt)
        flat = (rng.standard_normal(n) * 1e3).astype(dt)
        special = np.array([np.nan, np.inf, -np.inf, -0.0, info.tiny / 2, info.max], dtype=dt)
        flat[: min(n, special.size)] = special[: min(n, special.size)]
    return flat.reshape(shape)


def same(actual, expected: np.ndarray) -> bool:
    """Equal dtype, shape and bytes (NaNs and -0.0 compare exactly)."""
    actual = np.asarray(actual)
    return (
        actual.dtype == expected.dtype
        and actual.shape == expected.shape
        and actual.tobytes() == expected.tobytes()
    )


def round_trip(tmp_path, format: str, arrays: dict[str, np.ndarray], tag: str = "") -> ArrayStore:
    """Saves ``arrays``, exports them in ``format`` and imports them into a new store."""
    source = ArrayStore(tmp_path / f"source{tag}", durable=False)
    source.save(arrays)
    target = ArrayStore(tmp_path / f"target{tag}", durable=False)
    if SUFFIX[format] is None:
        target.import_(source.export(None, format))
    else:
        name = next(iter(arrays)) if format == "npy" else "out"
        (tmp_path / f"files{tag}").mkdir(exist_ok=True)
        path = tmp_path / f"files{tag}" / f"{name}{SUFFIX[format]}"
        source.export(path)
        assert target.import_(path) == sorted(arrays)
    source.close()
    return target


def matrix_groups(format: str) -> list[dict[str, np.ndarray]]:
    """The matrix's arrays (``x_<dtype>_<shape index>``, every dtype x every
    shape the format takes) in as few files as the format allows: one per
    array for npy, one per row count for tables, one for the rest."""
    arrays = {
        f"x_{dtype}_{index}": values(dtype, shape, index)
        for index, shape in enumerate(SHAPES)
        if shape not in REFUSED_SHAPES.get(format, set())
        for dtype in DTYPES
    }
    if format == "npy":
        return [{name: array} for name, array in arrays.items()]
    if format in REFUSED_SHAPES:
        lengths = sorted({array.shape[0] for array in arrays.values()})
        return [{n: a for n, a in arrays.items() if a.shape[0] == length} for length in lengths]
    return [arrays]


@pytest.mark.parametrize("format", list(SUFFIX))
def test_round_trip_matrix(tmp_path, format):
    """Every dtype x shape comes back exact; the shapes a format cannot hold
    are refused, naming the array, before anything is written."""
    if format in MODULES:
        _require(MODULES[format])
    if format == "npy":  # one file per array: one store to export them all from
        npy_matrix(tmp_path)
        return
    for group, arrays in enumerate(matrix_groups(format)):
        with round_trip(tmp_path, format, arrays, str(group)) as target:
            assert target.get_member_list() == sorted(arrays)
            for name, array in arrays.items():
                assert same(target.load(name), array), (format, name)
    with ArrayStore(tmp_path / "refused", durable=False) as store:
        for shape in sorted(REFUSED_SHAPES.get(format, ()), key=len):
            store.save({"x": values("int32", shape, 0)})
            path = None if SUFFIX[format] is None else tmp_path / f"r{SUFFIX[format]}"
            with pytest.raises(ValueError, match=r"array 'x' has shape .*: .* columns are"):
                store.export(path, format)
            assert path is None or not path.exists()


def npy_matrix(tmp_path):
    arrays = {name: a for group in matrix_groups("npy") for name, a in group.items()}
    with ArrayStore(tmp_path / "npy-source", durable=False) as source:
        source.save(arrays)
        for name in arrays:
            source.export(tmp_path / f"{name}.npy", names=[name])
        with pytest.raises(ValueError, match=".npy holds one array"):
            source.export(tmp_path / "all.npy")
    with ArrayStore(tmp_path / "npy-target", durable=False) as target:
        for name, array in arrays.items():
            assert target.import_(tmp_path / f"{name}.npy") == [name]  # named by the file
            assert same(target.load(name), array), name
            assert same(np.load(tmp_path / f"{name}.npy"), array)  # NumPy reads the files


@pytest.mark.parametrize("format", ["npz", "pt", "safetensors", "hdf5", "zarr"])
def test_many_arrays_and_names(tmp_path, format):
    if format in MODULES:
        _require(MODULES[format])
    arrays = {f"a{i}": values(dtype, (3 + i, 2), i) for i, dtype in enumerate(DTYPES)}
    arrays["scalar"] = np.array(7, np.int32)
    with round_trip(tmp_path, format, arrays) as target:
        for name, array in arrays.items():
            assert same(target.load(name), array)
    path = tmp_path / "files" / f"out{SUFFIX[format]}"
    with ArrayStore(tmp_path / "picked") as picked:
        assert picked.import_(path, names=["a3", "scalar"]) == ["a3", "scalar"]
        assert picked.get_member_list() == ["a3", "scalar"]
        with pytest.raises(KeyError, match="no arrays \\['nope'\\]"):
            picked.import_(path, names=["a1", "nope"])
        assert picked.get_member_list() == ["a3", "scalar"]  # a refused import saves nothing


def test_export_needs_arrays(tmp_path):
    with ArrayStore(tmp_path / "s", durable=False) as store:
        with pytest.raises(ValueError, match="export of no arrays"):
            store.export(tmp_path / "e.csv")
        store.save({"x": np.arange(3)})
        with pytest.raises(ValueError, match="export of no arrays"):
            store.export(tmp_path / "e.npz", names=[])
        with pytest.raises(KeyError, match="no array named 'y'"):
            store.export(tmp_path / "e.npz", names=["y"])
        with pytest.raises(ValueError, match="unknown format 'xls'"):
            store.export(tmp_path / "e.npz", format="xls")
        store.save({"a,b": np.arange(3)})
        with pytest.raises(ValueError, match="'a,b' has a comma"):
            store.export(tmp_path / "e.csv", names=["a,b"])
        with pytest.raises(ValueError, match="give format= in"):
            store.export(None)
        with pytest.raises(ValueError, match="chunk_bytes"):
            store.export(tmp_path / "e.npz", chunk_bytes=0)
        assert sorted(os.listdir(tmp_path)) == ["s"]


def test_tables_need_one_length(tmp_path):
    _require("pyarrow")
    with ArrayStore(tmp_path / "s") as store:
        store.save({"a": np.arange(4), "b": np.arange(5.0)})
        for suffix in (".parquet", ".feather", ".csv"):
            with pytest.raises(ValueError, match="differ: \\{'a': 4, 'b': 5\\}"):
                store.export(tmp_path / f"t{suffix}")
            assert not os.path.exists(tmp_path / f"t{suffix}")
        store.export(tmp_path / "t.parquet", names=["b"])
        with ArrayStore(tmp_path / "t") as target:
            assert target.import_(tmp_path / "t.parquet") == ["b"]


@pytest.mark.parametrize(
    "format, kind",
    [
        ("csv", "U3"),
        ("csv", "complex64"),
        ("pandas", "U3"),
        ("parquet", "S2"),
        ("feather", "U3"),
        ("safetensors", "U3"),
        ("safetensors", ">i4"),
        ("safetensors", "complex128"),
        ("zarr", "U3"),
        ("hdf5", "U3"),
        ("pt", "U3"),
        ("torch", "S2"),
    ],
)
def test_refused_dtypes_name_the_array(tmp_path, format, kind):
    if format in MODULES:
        _require(MODULES[format])
    with ArrayStore(tmp_path / "s") as store:
        store.save({"odd": np.zeros(3, dtype=kind), "fine": np.arange(3)})
        target = None if SUFFIX[format] is None else tmp_path / f"x{SUFFIX[format]}"
        with pytest.raises(TypeError, match=f"array 'odd' has dtype .*{format}"):
            store.export(target, format)
        assert target is None or not os.path.exists(target)
        assert os.listdir(tmp_path) == ["s"]  # no temporary file left either
        store.export(tmp_path / "fine.npy", names=["fine"])  # the other one goes


def test_strings_round_trip_where_the_format_holds_them(tmp_path):
    _require("h5py")
    arrays = {"s": np.array([b"ab", b"c", b""], dtype="S2"), "u": np.array(["xy", "z"])}
    for format in ("npy", "npz"):
        for name in arrays if format == "npz" else ["u"]:
            picked = {name: arrays[name]} if format == "npy" else arrays
            with round_trip(tmp_path, format, picked, format + name) as target:
                for key, array in picked.items():
                    assert same(target.load(key), array)
    with round_trip(tmp_path, "hdf5", {"s": arrays["s"]}, "h5") as target:
        assert same(target.load("s"), arrays["s"])


def test_imports_refuse_what_they_cannot_keep(tmp_path):
    pd = _require("pandas")
    torch = _require("torch")
    pa = _require("pyarrow")
    pq = _require("pyarrow.parquet")
    h5py = _require("h5py")
    with ArrayStore(tmp_path / "s") as store:
        with pytest.raises(TypeError, match="column 'name' has dtype .*leave it out"):
            store.import_(pd.DataFrame({"n": [1, 2], "name": ["a", "b"]}))
        with pytest.raises(ValueError, match="index other than 0..n-1.*reset_index"):
            store.import_(pd.DataFrame({"n": [1, 2]}, index=[5, 6]))
        torch.save({"w": torch.zeros(2, dtype=torch.bfloat16)}, tmp_path / "bf.pt")
        with pytest.raises(TypeError, match="tensor 'w' has dtype torch.bfloat16"):
            store.import_(tmp_path / "bf.pt")
        pq.write_table(pa.table({"ids": [[1, 2], [3]]}), tmp_path / "ragged.parquet")
        with pytest.raises(TypeError, match="column 'ids' holds rows of varying length"):
            store.import_(tmp_path / "ragged.parquet")
        with h5py.File(tmp_path / "nested.h5", "w") as file:
            file["top"] = np.arange(3)
            file["group/inner"] = np.arange(2)
        with pytest.raises(ValueError, match="holds the group 'group'"):
            store.import_(tmp_path / "nested.h5")
        with h5py.File(tmp_path / "nested.h5", "r") as file:
            assert store.import_(file["group"]) == ["inner"]
        with pytest.raises(TypeError, match="store.import_\\(\\{'x': tensor\\}\\)"):
            store.import_(torch.zeros(2))
        (tmp_path / "x.unknown").write_bytes(b"?")
        with pytest.raises(ValueError, match="cannot tell the format"):
            store.import_(tmp_path / "x.unknown")
        (tmp_path / "bad.csv").write_text("a:int8,b\n1,2\n3\n")
        with pytest.raises(ValueError, match="row 1 has 1 cells, the header 2"):
            store.import_(tmp_path / "bad.csv")
        (tmp_path / "bad.csv").write_text("a:int8\n1\n300\n")
        with pytest.raises(ValueError, match="does not parse as int8"):
            store.import_(tmp_path / "bad.csv")
        assert store.get_member_list() == ["inner"]  # every refused import saved nothing


def test_plain_csv_header_reads_float64_and_many_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(arrayio, "CSV_ROWS", 7)  # many parse runs and checkpoints
    monkeypatch.setattr(arrayio, "CSV_CHECKPOINT_ROWS", 5)
    rows = np.arange(103)
    (tmp_path / "p.csv").write_text("a,b:int16\n" + "".join(f"{r / 4},{-r}\n" for r in rows))
    with ArrayStore(tmp_path / "s") as store:
        assert store.import_(tmp_path / "p.csv") == ["a", "b"]
        assert same(store.load("a"), rows / 4)
        assert same(store.load("b"), (-rows).astype(np.int16))
        lazy = store.load("b", lazy=True)
        source = arrayio.RowSource("b", lazy.dtype, lazy.shape, lambda s, e: lazy[s:e])
        store.save({"c": source})  # a RowSource saves like an ndarray
        assert same(store.load("c"), store.load("b"))


def test_export_is_all_or_nothing(tmp_path, monkeypatch):
    with ArrayStore(tmp_path / "s") as store:
        store.save({"x": np.arange(100), "y": np.ones(100)})
        store.export(tmp_path / "out.npz")
        before = (tmp_path / "out.npz").read_bytes()
        calls = []
        real = arrayio._write_bytes

        def failing(file):
            write = real(file)

            def once(start, rows):
                calls.append(start)
                if len(calls) > 2:
                    raise OSError(28, "No space left on device")
                write(start, rows)

            return once

        monkeypatch.setattr(arrayio, "_write_bytes", failing)
        store.save({"x": np.arange(100) * 2})
        with pytest.raises(OSError, match="No space"):
            store.export(tmp_path / "out.npz", chunk_bytes=160)
        assert (tmp_path / "out.npz").read_bytes() == before  # the old file, whole
        assert sorted(os.listdir(tmp_path)) == ["out.npz", "s"]


def test_import_is_one_commit(tmp_path):
    with ArrayStore(tmp_path / "s") as store:
        store.save({"a": np.arange(5), "b": np.arange(6)})
        store.export(tmp_path / "x.npz")
    data = (tmp_path / "x.npz").read_bytes()
    (tmp_path / "cut.npz").write_bytes(data[: data.rindex(b"PK\x01\x02")])  # no directory
    with ArrayStore(tmp_path / "t") as target:
        target.save({"a": np.zeros(2)})
        with pytest.raises(Exception, match="zip"):
            target.import_(tmp_path / "cut.npz")
        assert target.get_member_list() == ["a"] and same(target.load("a"), np.zeros(2))


# ---- DLPack -----------------------------------------------------------------------


def test_dlpack_to_torch_shares_memory(tmp_path, monkeypatch):
    torch = _require("torch")
    reads = []
    real = OpenArray.read_all

    def recorded(self):
        out = real(self)
        reads.append(out)
        return out

    monkeypatch.setattr(OpenArray, "read_all", recorded)
    with ArrayStore(tmp_path / "s") as store:
        store.save({"x": np.arange(12, dtype=np.float32).reshape(3, 4)})
        loaded = store.load("x")
        tensor = torch.from_dlpack(loaded)
        assert tensor.data_ptr() == loaded.ctypes.data  # the loaded array's own memory
        lazy = store.load("x", lazy=True)
        assert lazy.__dlpack_device__() == (1, 0)
        reads.clear()
        tensor = torch.from_dlpack(lazy)
        assert len(reads) == 1 and tensor.data_ptr() == reads[0].ctypes.data  # one read, no copy
        assert torch.equal(tensor, torch.arange(12, dtype=torch.float32).reshape(3, 4))
        tensor[0, 0] = 99  # writable, and the lazy view re-reads the store (unchanged)
        assert lazy[0][0] == 0


def test_dlpack_to_jax(tmp_path):
    jnp = _require("jax.numpy")
    with ArrayStore(tmp_path / "s") as store:
        store.save({"x": np.arange(4096, dtype=np.int32)})
        loaded = store.load("x")
        array = jnp.from_dlpack(loaded)
        assert array.unsafe_buffer_pointer() == loaded.ctypes.data  # no copy
        assert np.array_equal(np.asarray(jnp.from_dlpack(store.load("x", lazy=True))), loaded)


def test_save_takes_dlpack_producers(tmp_path):
    torch = _require("torch")
    with ArrayStore(tmp_path / "s") as store:
        tensor = torch.arange(6, dtype=torch.int16).reshape(2, 3)
        store.save({"t": tensor, "u": torch.zeros(3, dtype=torch.uint32)})
        assert same(store.load("t"), np.arange(6, dtype=np.int16).reshape(2, 3))
        assert store.load("u").dtype == np.uint32
        assert store.import_({"v": torch.ones(2, dtype=torch.bool)}) == ["v"]
        assert same(store.load("v"), np.ones(2, bool))
        with pytest.raises(TypeError, match="cannot save 'g': .*DLPack.*detach"):
            store.save({"g": torch.zeros(2, requires_grad=True)})
        with pytest.raises(TypeError, match="cannot save 'b': .*DLPack"):
            store.save({"b": torch.zeros(2, dtype=torch.bfloat16)})
        try:
            jnp = importlib.import_module("jax.numpy")
        except ImportError:
            return
        store.save({"j": jnp.arange(5, dtype=jnp.float32)})
        assert same(store.load("j"), np.arange(5, dtype=np.float32))


# ---- pack / unpack ----------------------------------------------------------------


def packed_store(tmp_path) -> dict[str, np.ndarray]:
    arrays = {f"a_{dtype}": values(dtype, (50, 3), i) for i, dtype in enumerate(DTYPES)}
    arrays.update(scalar=np.array(3.5), empty=np.zeros((0, 4), np.int8), text=np.array(["a", "bc"]))
    arrays["big"] = np.arange(1_200_000, dtype=np.int64).reshape(-1, 2)  # several 4 MiB frames
    with ArrayStore(tmp_path / "s", durable=False) as store:
        store.save(arrays)
        store.save({"z": np.arange(4000, dtype=np.int32) % 7}, codec="zstd")
        store.save({"d": np.arange(4000, dtype=np.int32) % 5}, codec="zstd_dict")
        store.pack(tmp_path / "s.lxpack", chunk_bytes=1 << 20)
    arrays["z"] = np.arange(4000, dtype=np.int32) % 7
    arrays["d"] = np.arange(4000, dtype=np.int32) % 5
    return arrays


def small_pack(tmp_path, monkeypatch) -> bytes:
    """A pack of three arrays in 4 KiB frames, raw and coded ones, for the damage tests."""
    monkeypatch.setattr(arrayio, "FRAME_RAW_MAX", 4096)
    rng = np.random.default_rng(1)
    with ArrayStore(tmp_path / "s", durable=False) as store:
        store.save({"n": rng.integers(0, 255, 9000).astype(np.uint8), "z": np.zeros((3000, 2))})
        store.save({"one": np.array(7)})
        store.pack(tmp_path / "s.lxpack")
    return (tmp_path / "s.lxpack").read_bytes()


def test_pack_round_trip(tmp_path):
    arrays = packed_store(tmp_path)
    assert os.path.getsize(tmp_path / "s.lxpack") < sum(a.nbytes for a in arrays.values()) / 2
    with ArrayStore.unpack(tmp_path / "s.lxpack", tmp_path / "u") as store:
        assert store.get_member_list() == sorted(arrays)
        for name, array in arrays.items():
            assert same(store.load(name), array), name
        codecs = {name: meta["codec"] for name, meta in store.get_metadata()["arrays"].items()}
        assert codecs["z"] == "zstd" and codecs["d"] == "zstd_dict" and codecs["big"] == "raw"
    with pytest.raises(FileExistsError, match="pick a new path"):
        ArrayStore.unpack(tmp_path / "s.lxpack", tmp_path / "u")


def test_pack_frames_are_zstd_of_the_bytes_shuffled_by_the_element_size(tmp_path):
    smooth = {
        "f8": np.linspace(0, 1000, 600_000),
        "f4": np.linspace(0, 1, 300_000, dtype=np.float32).reshape(-1, 3),
        "i2": (np.arange(200_000) % 1000).astype(np.int16),
        "c16": np.linspace(0, 1, 20_000) * (1 + 2j),
        "u1": (np.arange(100_000) % 17).astype(np.uint8),
    }
    with ArrayStore(tmp_path / "s") as store:
        store.save(smooth)
        store.pack(tmp_path / "s.lxpack")
    data = (tmp_path / "s.lxpack").read_bytes()
    frames, metas = {}, {}
    for offset, kind in frame_starts(data):
        _, stored, raw = arrayio.FRAME.unpack_from(data, offset)
        if kind == arrayio.ARRAY_FRAME:
            meta = frame_meta(data, offset)
            name = meta["name"]
            metas[name] = meta
        elif kind != arrayio.END_FRAME:
            frames.setdefault(name, []).append((kind, stored, raw))
    assert {name: meta["frames"] for name, meta in metas.items()} == {
        "f8": "zstd_shuffle8",
        "f4": "zstd_shuffle4",
        "i2": "zstd_shuffle2",
        "c16": "zstd",
        "u1": "zstd",
    }
    for name, array in smooth.items():
        assert {kind for kind, _, _ in frames[name]} == {arrayio.CODED_FRAME}, name
        assert sum(raw for _, _, raw in frames[name]) == array.nbytes
        # Every frame is smaller than zlib level 1 (what packs held before) makes of it.
        stored = sum(size for _, size, _ in frames[name])
        assert stored < len(zlib.compress(array.tobytes(), 1)), name
    with ArrayStore.unpack(tmp_path / "s.lxpack", tmp_path / "u") as copy:
        for name, array in smooth.items():
            assert same(copy.load(name), array), name


def rewrite_pack(data: bytes, frame: Callable[[int, bytes, int], tuple[int, bytes, int]]) -> bytes:
    """``data`` with each frame but the closing one replaced by ``frame(kind,
    payload, raw)``, each frame's checksum and the closing digest made anew."""
    start = len(arrayio.PACK_MAGIC) + 4
    out, digest, arrays = [data[:start]], hashlib.sha256(data[:start]), 0
    for offset, kind in frame_starts(data):
        _, stored, raw = arrayio.FRAME.unpack_from(data, offset)
        payload = data[offset + arrayio.FRAME.size : offset + arrayio.FRAME.size + stored]
        if kind == arrayio.END_FRAME:
            kind, payload, raw = (
                kind,
                msgpack.packb({"arrays": arrays, "sha256": digest.hexdigest()}),
                0,
            )
        else:
            arrays += kind == arrayio.ARRAY_FRAME
            kind, payload, raw = frame(kind, payload, raw)
        header = arrayio.FRAME.pack(kind, len(payload), raw)
        whole = header + payload + hashlib.sha256(header + payload).digest()
        if kind != arrayio.END_FRAME:
            digest.update(whole)
        out.append(whole)
    return b"".join(out)


def test_a_pack_file_of_zlib_frames_written_before_zstd_still_unpacks(tmp_path):
    arrays = packed_store(tmp_path)
    codecs = []

    def as_zlib(kind: int, payload: bytes, raw: int) -> tuple[int, bytes, int]:
        if kind == arrayio.ARRAY_FRAME:  # the old header had no "frames"
            meta = msgpack.unpackb(payload)
            codecs.append(meta.pop("frames"))
            return kind, msgpack.packb(meta), raw
        if kind == arrayio.CODED_FRAME:
            decoded = bytearray(raw)
            zrecord.decode_buffer(payload, codecs[-1], decoded)
            return arrayio.ZLIB_FRAME, zlib.compress(bytes(decoded), 1), raw
        return kind, payload, raw

    old = rewrite_pack((tmp_path / "s.lxpack").read_bytes(), as_zlib)
    assert arrayio.ZLIB_FRAME in {kind for _, kind in frame_starts(old)}
    with ArrayStore.unpack(_write(tmp_path / "old.lxpack", old), tmp_path / "u") as store:
        assert store.get_member_list() == sorted(arrays)
        for name, array in arrays.items():
            assert same(store.load(name), array), name


@pytest.mark.parametrize("frames", [None, "zstd_dict", "zstd_shuffle3", ["zstd"]])
def test_unpack_refuses_coded_frames_its_array_header_does_not_decode(
    tmp_path, monkeypatch, frames
):
    """An array header that names no frame codec (its first coded frame is
    refused), or one that needs a dictionary, does not exist or is no name
    (the header is refused)."""
    data = small_pack(tmp_path, monkeypatch)

    def renamed(kind: int, payload: bytes, raw: int) -> tuple[int, bytes, int]:
        if kind == arrayio.ARRAY_FRAME:
            meta = msgpack.unpackb(payload)
            if meta["name"] == "z":
                meta["frames"] = frames
                if frames is None:
                    del meta["frames"]
            return kind, msgpack.packb(meta), raw
        return kind, payload, raw

    damaged = rewrite_pack(data, renamed)
    starts = frame_starts(damaged)
    header = next(
        o for o, k in starts if k == arrayio.ARRAY_FRAME and frame_meta(damaged, o)["name"] == "z"
    )
    first_coded = next(o for o, k in starts if o > header and k == arrayio.CODED_FRAME)
    assert_refused(tmp_path, damaged, first_coded if frames is None else header, f"frames-{frames}")


def frame_meta(data: bytes, offset: int) -> dict:
    """The msgpack map of the header or closing frame at ``offset``."""
    _, stored, _ = arrayio.FRAME.unpack_from(data, offset)
    return msgpack.unpackb(data[offset + arrayio.FRAME.size : offset + arrayio.FRAME.size + stored])


def frame_starts(data: bytes) -> list[tuple[int, int]]:
    """(offset, kind) of each frame of a pack file."""
    offset, frames = len(arrayio.PACK_MAGIC) + 4, []
    while offset < len(data):
        kind, stored, _ = arrayio.FRAME.unpack_from(data, offset)
        frames.append((offset, kind))
        offset += arrayio.FRAME.size + stored + arrayio.DIGEST_BYTES
    return frames


def assert_refused(tmp_path, data: bytes, offset: int | None, tag: str) -> None:
    path = tmp_path / f"bad-{tag}.lxpack"
    path.write_bytes(data)
    with pytest.raises(CorruptPackError) as caught:
        ArrayStore.unpack(path, tmp_path / f"u-{tag}")
    assert str(path) in str(caught.value) and caught.value.path == str(path)
    if offset is not None:
        assert caught.value.offset == offset, (tag, str(caught.value))
    assert not os.path.exists(tmp_path / f"u-{tag}")  # no half store
    assert not [item for item in os.listdir(tmp_path) if item.startswith(f".u-{tag}")]


def test_unpack_refuses_flipped_bytes(tmp_path, monkeypatch):
    data = small_pack(tmp_path, monkeypatch)
    frames = frame_starts(data)
    kinds = {kind for _, kind in frames}
    assert kinds == {arrayio.ARRAY_FRAME, arrayio.RAW_FRAME, arrayio.CODED_FRAME, arrayio.END_FRAME}
    picked = {}
    for offset, kind in frames:
        picked.setdefault(kind, []).append(offset)
    cases = [("magic", 3, 0)]
    for kind, offsets in picked.items():
        for offset in (offsets[0], offsets[-1]):
            for inside in (2, arrayio.FRAME.size + 1, arrayio.FRAME.size + 9):  # header, payload
                cases.append((f"k{kind}-{offset}-{inside}", offset + inside, offset))
    for tag, where, frame in cases:
        damaged = bytearray(data)
        damaged[where] ^= 0x10
        assert_refused(tmp_path, bytes(damaged), frame, tag)


def test_unpack_refuses_truncation_reordering_and_extra_bytes(tmp_path, monkeypatch):
    data = small_pack(tmp_path, monkeypatch)
    frames = frame_starts(data)
    for cut in (0, 5, 16, frames[1][0] + 3, frames[len(frames) // 2][0], len(data) - 1):
        assert_refused(tmp_path, data[:cut], None, f"cut{cut}")
    assert_refused(tmp_path, data + b"\0", len(data), "extra")
    # Two whole frames swapped: each checks out alone, the closing digest does not.
    (a, _), (b, _), (c, _) = frames[1], frames[2], frames[3]
    swapped = data[:a] + data[b:c] + data[a:b] + data[c:]
    with pytest.raises(CorruptPackError):
        ArrayStore.unpack(_write(tmp_path / "swap.lxpack", swapped), tmp_path / "u-swap")
    assert not os.path.exists(tmp_path / "u-swap")
    assert_refused(tmp_path, b"not a pack file at all", 0, "foreign")


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


# ---- bounded memory ---------------------------------------------------------------

MEMORY_CHILD = textwrap.dedent(
    r"""
    import os, sys, threading, time
    import numpy as np
    from loaderx import ArrayStore

    def anon():
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) << 10
        raise RuntimeError("no RssAnon")

    root, rows = sys.argv[1], int(sys.argv[2])
    width = 1024  # 4 KiB float32 rows
    source = os.path.join(root, "big.npy")
    with open(source, "wb") as file:  # written 8 MiB at a time
        header = {"descr": "<f4", "fortran_order": False, "shape": (rows, width)}
        np.lib.format.write_array_header_1_0(file, header)
        for start in range(0, rows, 2048):
            count = min(2048, rows - start)
            file.write(np.arange(start * width, (start + count) * width, dtype=np.float32))
    peak, stop = [0], threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], anon())
            time.sleep(0.001)

    threading.Thread(target=sample, daemon=True).start()

    def measured(step):
        time.sleep(0.05)
        base = peak[0] = anon()
        step()
        time.sleep(0.05)
        return (peak[0] - base) >> 20

    store = ArrayStore(os.path.join(root, "s"))
    results = [measured(lambda: store.import_(source))]
    results.append(measured(lambda: store.export(os.path.join(root, "o.npy"), chunk_bytes=8 << 20)))
    packed = os.path.join(root, "p.lxpack")
    results.append(measured(lambda: store.pack(packed, chunk_bytes=8 << 20)))
    results.append(measured(lambda: ArrayStore.unpack(
        os.path.join(root, "p.lxpack"), os.path.join(root, "u")).close()))
    assert open(os.path.join(root, "o.npy"), "rb").read() == open(source, "rb").read()
    print(*results)
    """
)


def test_streaming_memory_is_bounded(tmp_path):
    """A 160 MiB array: import (64 MiB append chunks), export and pack (8 MiB
    chunks) and unpack keep their extra anonymous memory under the bounds."""
    rows = 40 * 1024  # 160 MiB
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", MEMORY_CHILD, str(tmp_path), str(rows)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    imported, exported, packed, unpacked = map(int, done.stdout.split())
    print(
        f"peak extra RssAnon MiB, 160 MiB array: import {imported}, export {exported}, "
        f"pack {packed}, unpack {unpacked}"
    )
    assert imported <= 100  # one 64 MiB chunk, not the 160 MiB array
    # 8 MiB chunks: 0 to 6 MiB measured here, but one CI run on 2026-12-02 saw 64
    # (cause not found); a whole-array read would be 160 or more.
    assert exported <= 100 and packed <= 100
    assert unpacked <= 100
