"""ArrayStore's converters to and from other array formats, and pack files.

``import_arrays`` reads a file or an in-memory object as named arrays and saves
them into an ArrayStore in one commit (all or none); ``export_arrays`` writes
named arrays of a store to a file. Invariant: no call holds a whole array it
can read or write in chunks. A source that supports partial reads becomes a
`RowSource`, which ArrayStore's save slices one chunk of rows at a time (the
converters' 64 MiB of rows per append); an export reads ``chunk_bytes`` of
rows at a time through a `LazyArray`. A file export is written beside its
path and renamed into place only when complete, so a failed export leaves
the old file (or none). Where a format cannot stream (``torch.save`` pickles
whole tensors; a pandas DataFrame lives in memory) the docs say so.

Pack files (``pack_store``/``unpack_store``): a store as one file of frames,
each ``kind, stored bytes, raw bytes`` (three little-endian uint32), its
payload, and the SHA-256 of header and payload; the closing frame carries
the SHA-256 of everything before it, so a damaged, truncated, reordered or
extended file is refused with its offset. Data frames are zstd frames of
the bytes shuffled by the array's element size (the core's record codecs,
through ``zrecord.encode_buffer``) where that saves space, else raw; the
zlib frames of pack files written before 2026-12-07 are still read. An unpack
builds the store in a staging directory beside the target and renames it
into place after the closing frame checked out.

Optional dependencies (torch, safetensors, h5py, zarr, pyarrow, pandas) are
imported when a function that needs one runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import secrets
import shutil
import struct
import tempfile
import zipfile
import zlib
from collections.abc import Iterator, Mapping
from typing import Any, BinaryIO, Callable, Protocol

import msgpack
import numpy as np

from ._arrayview import LazyArray
from ._checks import check_int
from .dataset import DenseDataset
from .zrecord import (
    CODEC_TABLE,
    CODECS,
    SHUFFLE_ELEMENT_BYTES,
    CorruptStoreError,
    decode_buffer,
    encode_buffer,
    shuffled_codec,
)

FORMATS = (
    "npy",
    "npz",
    "pt",
    "safetensors",
    "hdf5",
    "zarr",
    "parquet",
    "feather",
    "csv",
    "torch",
    "pandas",
)
SUFFIXES = {
    ".npy": "npy",
    ".npz": "npz",
    ".pt": "pt",
    ".pth": "pt",
    ".safetensors": "safetensors",
    ".h5": "hdf5",
    ".hdf5": "hdf5",
    ".zarr": "zarr",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".feather": "feather",
    ".arrow": "feather",
    ".csv": "csv",
}
IN_MEMORY = ("torch", "pandas")  # export formats that return an object instead of a file
CHUNK_BYTES = 64 << 20  # rows read at once by an export or a pack
CHUNK_BYTES_MAX = 1 << 30
NUMBER_KINDS = "biuf"  # bool, signed and unsigned integers, floats
READ_PIECE_BYTES = 8 << 20  # an .npy chunk is read this much at a time
CSV_ROWS = 4096  # rows of a CSV file parsed at once
CSV_CHECKPOINT_ROWS = 1024  # a CSV import remembers the byte offset of every 1024th row

PACK_MAGIC = b"LOADERXPACK\x00"
PACK_VERSION = 1
FRAME = struct.Struct("<III")  # kind, stored bytes, raw bytes
DIGEST_BYTES = 32
FRAME_RAW_MAX = 4 << 20  # data bytes per frame
META_BYTES_MAX = 1 << 20
# A CODED_FRAME holds a frame of the codec its array's header names ("frames");
# ZLIB_FRAME, zlib level 1, is what pack files held until 2026-12-07: read, not written.
ARRAY_FRAME, RAW_FRAME, ZLIB_FRAME, END_FRAME, CODED_FRAME = 1, 2, 3, 4, 5
DATA_FRAMES = (RAW_FRAME, ZLIB_FRAME, CODED_FRAME)


class CorruptPackError(ValueError):
    """A pack file that is damaged, truncated or not a pack file: ``path``
    and ``offset`` (the byte where the damaged frame starts) say where."""

    def __init__(self, path: str, offset: int, problem: str) -> None:
        super().__init__(
            f"pack file '{path}' is damaged at byte {offset}: {problem}; nothing was unpacked. "
            "Pack the store again, or restore the file from a copy"
        )
        self.path = path
        self.offset = offset


class Target(Protocol):
    """The side of an ArrayStore the converters use (ArrayStore has it)."""

    def save(self, arrays: Mapping[str, Any], codec: str = "raw") -> None: ...


class _NotContiguous:
    c_contiguous = False  # build_dense_store then bounds each append to 64 MiB of rows


class RowSource:
    """An array to save, read a slice of rows at a time (the ``name``,
    ``dtype`` and ``shape`` it has, and ``read(start, end)`` giving rows
    ``start..end``). ArrayStore's save takes it in place of an ndarray: the
    store's writer slices it in bounded chunks, so the array is never whole
    in memory. Each slice is checked against the dtype and shape."""

    flags = _NotContiguous()

    def __init__(
        self,
        name: str,
        dtype: np.dtype[Any],
        shape: tuple[int, ...],
        read: Callable[[int, int], np.ndarray],
    ) -> None:
        assert len(shape) >= 1, "a 0-d array is saved as an ndarray"
        self.name = name
        self.dtype = np.dtype(dtype)
        self.shape = tuple(int(n) for n in shape)
        self.ndim = len(self.shape)
        self._read = read

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key: slice) -> np.ndarray:
        start, stop, step = key.indices(len(self))
        assert step == 1, "the store's writer reads runs of rows"
        rows = np.ascontiguousarray(self._read(start, stop))
        expected = (max(0, stop - start), *self.shape[1:])
        if rows.shape != expected or rows.dtype != self.dtype:
            raise ValueError(
                f"array '{self.name}': its source gave rows of shape {rows.shape} and dtype "
                f"{rows.dtype} where {expected} of {self.dtype} were expected (did the file "
                "change during the import?); nothing was saved"
            )
        return rows


# ---- checks ----------------------------------------------------------------------


def format_of(path: Any, format: str | None, what: str) -> str:  # path: checked here
    """The format named by ``format``, or by ``path``'s suffix."""
    if format is not None:
        if format not in FORMATS:
            raise ValueError(f"unknown format {format!r}: use one of {list(FORMATS)}")
        return format
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{what}: give format= for a {type(path).__name__}")
    suffix = os.path.splitext(os.fspath(path).rstrip("/"))[1].lower()
    if suffix not in SUFFIXES:
        raise ValueError(
            f"{what}: cannot tell the format of '{os.fspath(path)}' from its suffix "
            f"(known: {sorted(SUFFIXES)}); give format= (one of {list(FORMATS)})"
        )
    return SUFFIXES[suffix]


def check_dtype(name: str, dtype: np.dtype[Any], format: str, kinds: str = NUMBER_KINDS) -> None:
    """TypeError unless ``format`` can hold ``dtype`` (of the kinds ``kinds``)."""
    if dtype.hasobject or dtype.kind not in kinds or dtype.fields is not None:
        raise TypeError(
            f"array '{name}' has dtype {dtype}, which {format} cannot hold exactly (it takes "
            f"{_kind_text(kinds)}): convert the array first (e.g. store.save({{'{name}': "
            f"store.load('{name}').astype(...)}})), pick other names=, or use a format that "
            "holds it (npy, npz, hdf5 or pack)"
        )


def _kind_text(kinds: str) -> str:
    words = {"b": "bool", "i": "signed", "u": "unsigned", "f": "float", "S": "bytes", "U": "str"}
    return "/".join(words.get(kind, kind) for kind in kinds) + " dtypes"


def check_chunk_bytes(chunk_bytes: Any) -> int:  # Any: checked here
    return check_int("chunk_bytes", chunk_bytes, 1, CHUNK_BYTES_MAX)


def for_chunks(
    array: LazyArray | np.ndarray, chunk_bytes: int, consume: Callable[[int, np.ndarray], None]
) -> None:
    """Calls ``consume(start_row, rows)`` with runs of rows of ``array`` of at
    most ``chunk_bytes`` (at least one row each); a 0-d array as one value.
    Only one run is alive at a time: none is held while the next is read."""
    if array.ndim == 0:
        consume(0, np.asarray(array[()]))
        return
    row_bytes = array.dtype.itemsize * math.prod(array.shape[1:])
    step = max(1, chunk_bytes // max(1, row_bytes))
    for start in range(0, array.shape[0], step):
        consume(start, np.ascontiguousarray(array[start : start + step]))


def _write_bytes(file: BinaryIO) -> Callable[[int, np.ndarray], None]:
    def write(start: int, rows: np.ndarray) -> None:
        file.write(rows.reshape(-1).view(np.uint8).data)

    return write


# ---- atomic outputs --------------------------------------------------------------


@contextlib.contextmanager
def atomic_output(path: str, directory: bool = False) -> Iterator[str]:
    """A temporary path beside ``path``; renamed to ``path`` (durably) when
    the block succeeds, removed when it fails. A directory target must not
    exist."""
    parent = os.path.dirname(os.path.abspath(path))
    if directory and os.path.exists(path):
        raise FileExistsError(
            f"'{path}' exists: export writes a new {os.path.basename(path)} directory; "
            "remove it first or pick another path"
        )
    temporary = os.path.join(parent, f".{os.path.basename(path)}.tmp-{secrets.token_hex(6)}")
    try:
        yield temporary
        _fsync_tree(temporary)
        if directory:
            os.rename(temporary, path)
        else:
            os.replace(temporary, path)
        _fsync_path(parent)
    except BaseException:
        if os.path.isdir(temporary):
            shutil.rmtree(temporary, ignore_errors=True)
        elif os.path.exists(temporary):
            os.unlink(temporary)
        raise


def _fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(path: str) -> None:
    if not os.path.isdir(path):
        _fsync_path(path)
        return
    for folder, _, files in os.walk(path):
        for file in files:
            _fsync_path(os.path.join(folder, file))
        _fsync_path(folder)


# ---- import ----------------------------------------------------------------------


def import_arrays(
    target: Target,
    source: Any,  # a path or an in-memory object: checked by the readers
    format: str | None,
    names: list[str] | None,
    codec: str,
) -> list[str]:
    """Reads ``source`` and saves its arrays (``names`` only, when given)
    into ``target`` in one commit; returns the names saved, sorted."""
    if names is not None:
        names = _name_list(names)
    with contextlib.ExitStack() as stack:
        arrays = open_arrays(stack, source, format, names)
        if names is not None:
            missing = [name for name in names if name not in arrays]
            if missing:
                raise KeyError(
                    f"{_describe(source)} has no arrays {missing} (it has {sorted(arrays)})"
                )
            arrays = {name: arrays[name] for name in names}
        if not arrays:
            raise ValueError(f"{_describe(source)} holds no arrays: nothing to import")
        target.save(arrays, codec=codec)
    return sorted(arrays)


def _name_list(names: Any) -> list[str]:  # Any: checked here
    if isinstance(names, str) or not isinstance(names, (list, tuple)):
        raise TypeError(f"names= takes a list of array names, got {type(names).__name__}")
    return list(dict.fromkeys(names))


def _describe(source: Any) -> str:
    if isinstance(source, (str, os.PathLike)):
        return f"'{os.fspath(source)}'"
    return f"the {type(source).__name__}"


def open_arrays(
    stack: contextlib.ExitStack, source: Any, format: str | None, names: list[str] | None
) -> dict[str, Any]:  # values: np.ndarray | RowSource
    """``{name: ndarray | RowSource}`` of ``source``; files it opens stay
    open until ``stack`` closes."""
    if not isinstance(source, (str, os.PathLike)):
        return _object_arrays(stack, source, names)  # type: ignore[no-any-return]
    path = os.fspath(source)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no file or directory at '{path}' to import")
    format = format_of(path, format, "import_")
    readers: dict[str, Callable[[contextlib.ExitStack, str], dict[str, Any]]] = {
        "npy": _npy_arrays,
        "npz": _npz_arrays,
        "pt": _pt_arrays,
        "safetensors": _safetensors_arrays,
        "hdf5": _hdf5_arrays,
        "zarr": _zarr_arrays,
        "parquet": _arrow_arrays,
        "feather": _arrow_arrays,
        "csv": _csv_arrays,
    }
    if format not in readers:
        raise ValueError(
            f"format {format!r} is an in-memory object: pass the object itself to import_"
        )
    if format == "feather":
        return _feather_arrays(stack, path)
    return readers[format](stack, path)


def _object_arrays(stack: contextlib.ExitStack, source: Any, names: list[str] | None) -> Any:
    module = type(source).__module__.split(".")[0]
    if isinstance(source, Mapping):
        return dict(source)  # save takes arrays and DLPack producers (tensors) as they are
    if module == "pandas":
        return _dataframe_arrays(source)
    if module == "h5py":
        return _hdf5_group_arrays(source)
    if module == "zarr":
        return _zarr_group_arrays(source)
    if module == "pyarrow":
        return _arrow_table_arrays(stack, source)
    if hasattr(source, "__dlpack__") or isinstance(source, np.ndarray):
        raise TypeError(
            f"import_ takes a single {type(source).__name__} as {{name: array}}: e.g. "
            "store.import_({'x': tensor})"
        )
    raise TypeError(
        f"import_ reads a path, a {{name: array or tensor}} dict, a pandas DataFrame, an h5py "
        f"File or Group, a zarr Group or a pyarrow Table; got {type(source).__name__}"
    )


def _sourced(
    name: str, dtype: np.dtype[Any], shape: tuple[int, ...], read: Callable[[int, int], Any]
) -> Any:  # np.ndarray | RowSource
    """A RowSource of ``read``, or for a 0-d array its value."""
    if len(shape) == 0:
        return np.asarray(read(0, 1), dtype=dtype).reshape(())
    return RowSource(name, dtype, shape, lambda start, end: np.asarray(read(start, end)))


# npy / npz


def _npy_header(file: BinaryIO, where: str) -> tuple[tuple[int, ...], bool, np.dtype[Any]]:
    fmt = np.lib.format
    try:
        version = fmt.read_magic(file)
        if version == (1, 0):
            return fmt.read_array_header_1_0(file)
        return fmt.read_array_header_2_0(file)
    except ValueError as exc:
        raise ValueError(f"{where} is not a readable .npy file: {exc}") from exc


def _npy_source(
    name: str, open_file: Callable[[], BinaryIO], stack: contextlib.ExitStack, where: str
) -> Any:
    file = stack.enter_context(open_file())
    shape, fortran, dtype = _npy_header(file, where)
    check_dtype(name, dtype, "an ArrayStore", "biufcSU")
    if fortran and len(shape) > 1:
        raise ValueError(
            f"{where} is in Fortran order, which cannot be read row by row: save it with "
            f"np.save(path, np.ascontiguousarray(array)) first"
        )
    data_start = file.tell()
    row_bytes = dtype.itemsize * math.prod(shape[1:])

    def read(start: int, end: int) -> np.ndarray:
        out = np.empty((end - start, *shape[1:]) if shape else (), dtype=dtype)
        file.seek(data_start + start * row_bytes)
        view = out.reshape(-1).view(np.uint8).data
        # In pieces: a zip member's readinto reads into a temporary bytes first.
        for first in range(0, view.nbytes, READ_PIECE_BYTES):
            piece = view[first : first + READ_PIECE_BYTES]
            if file.readinto(piece) != piece.nbytes:  # type: ignore[attr-defined]
                raise ValueError(f"{where} is truncated: its header says shape {shape}")
        return out

    return _sourced(name, dtype, shape, read)


def _npy_arrays(stack: contextlib.ExitStack, path: str) -> dict[str, Any]:
    name = os.path.splitext(os.path.basename(path))[0]
    return {name: _npy_source(name, lambda: open(path, "rb"), stack, f"'{path}'")}


def _npz_arrays(stack: contextlib.ExitStack, path: str) -> dict[str, Any]:
    archive = stack.enter_context(zipfile.ZipFile(path))
    arrays = {}
    for member in archive.namelist():
        if not member.endswith(".npy"):
            raise ValueError(f"'{path}' holds {member!r}, which is not an .npy member")
        name = member[: -len(".npy")]

        def open_member(member: str = member) -> BinaryIO:
            return archive.open(member)  # type: ignore[return-value]

        arrays[name] = _npy_source(name, open_member, stack, f"'{path}' member {member!r}")
    return arrays


# torch / safetensors


def _pt_arrays(stack: contextlib.ExitStack, path: str) -> dict[str, Any]:
    import torch  # optional dependency

    try:  # mmap: the tensors' bytes stay in the file until a chunk is read
        loaded = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except RuntimeError:  # a legacy (non-zip) file cannot be mapped
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(loaded, torch.Tensor):
        loaded = {os.path.splitext(os.path.basename(path))[0]: loaded}
    if not isinstance(loaded, Mapping):
        raise TypeError(
            f"'{path}' holds a {type(loaded).__name__}; import_ reads a tensor or a "
            "{name: tensor} dict (a state_dict)"
        )
    return {str(name): _tensor_source(str(name), tensor) for name, tensor in loaded.items()}


def _tensor_source(name: str, tensor: Any) -> Any:  # tensor: a torch.Tensor
    import torch  # optional dependency

    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"entry '{name}' is a {type(tensor).__name__}, not a tensor")
    try:
        dtype = torch.empty(0, dtype=tensor.dtype).numpy().dtype
    except TypeError as exc:
        raise TypeError(
            f"tensor '{name}' has dtype {tensor.dtype}, which NumPy has no dtype for: convert "
            f"it first (e.g. tensor.float()), or leave it out with names="
        ) from exc
    tensor = tensor.detach()
    if tensor.ndim == 0:
        return tensor.numpy().copy()
    return _sourced(name, dtype, tuple(tensor.shape), lambda s, e: tensor[s:e].numpy().copy())


SAFETENSORS_DTYPES = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "U16": "uint16",
    "I16": "int16",
    "U32": "uint32",
    "I32": "int32",
    "U64": "uint64",
    "I64": "int64",
    "F16": "float16",
    "F32": "float32",
    "F64": "float64",
}


def _safetensors_arrays(stack: contextlib.ExitStack, path: str) -> dict[str, Any]:
    from safetensors import safe_open  # optional dependency

    handle = stack.enter_context(safe_open(path, framework="numpy"))
    arrays = {}
    for name in handle.keys():  # noqa: SIM118 (a safe_open handle is not a dict)
        part = handle.get_slice(name)
        kind = part.get_dtype()
        if kind not in SAFETENSORS_DTYPES:
            raise TypeError(
                f"tensor '{name}' of '{path}' has dtype {kind}, which NumPy has no dtype for: "
                "convert it first, or leave it out with names="
            )
        shape = tuple(part.get_shape())
        dtype = np.dtype(SAFETENSORS_DTYPES[kind])
        if shape:
            arrays[name] = _sourced(name, dtype, shape, _sliced_part(part))
        else:
            arrays[name] = np.asarray(handle.get_tensor(name))
    return arrays


def _sliced_part(part: Any) -> Callable[[int, int], Any]:  # part: a safetensors slice
    return lambda start, end: part[start:end]


# hdf5 / zarr


def _hdf5_arrays(stack: contextlib.ExitStack, path: str) -> dict[str, Any]:
    import h5py  # optional dependency

    return _hdf5_group_arrays(stack.enter_context(h5py.File(path, "r")))


def _hdf5_group_arrays(group: Any) -> dict[str, Any]:  # group: an h5py Group or File
    import h5py  # optional dependency

    arrays = {}
    for name, item in group.items():
        if not isinstance(item, h5py.Dataset):
            raise ValueError(
                f"'{group.file.filename}' group {group.name!r} holds the group {name!r}: "
                f"import_ reads the datasets of one group; import that group itself "
                f"(store.import_(file[{item.name!r}])), or pick datasets with names="
            )
        check_dtype(name, item.dtype, "an ArrayStore", "biufS")
        arrays[name] = _sourced(name, item.dtype, item.shape, _sliced(item))
    return arrays


def _sliced(array: Any) -> Callable[[int, int], Any]:
    """``read(start, end)`` of an array that slices (h5py, zarr): a 0-d one whole."""
    return lambda start, end: array[()] if array.ndim == 0 else array[start:end]


def _zarr_arrays(stack: contextlib.ExitStack, path: str) -> dict[str, Any]:
    import zarr  # optional dependency

    return _zarr_group_arrays(zarr.open(path, mode="r"))


def _zarr_group_arrays(group: Any) -> dict[str, Any]:  # a zarr Group or Array
    import zarr  # optional dependency

    if isinstance(group, zarr.Array):
        name = group.basename or "array"
        return {name: _sourced(name, group.dtype, group.shape, _sliced(group))}
    arrays = {}
    for name, item in group.members():
        if not isinstance(item, zarr.Array):
            raise ValueError(
                f"zarr group {group.path or '/'!r} holds the group {name!r}: import_ reads the "
                "arrays of one group; import that group itself, or pick arrays with names="
            )
        dtype = np.dtype(item.dtype)
        check_dtype(name, dtype, "an ArrayStore", "biuf")
        arrays[name] = _sourced(name, dtype, item.shape, _sliced(item))
    return arrays


# parquet / feather / arrow (through loaderx.arrow's converter)


def _arrow_arrays(stack: contextlib.ExitStack, source: Any) -> dict[str, Any]:
    """The dense columns of a Parquet path or Arrow table, converted by
    ``from_arrow`` into a temporary column directory and read from there."""
    from . import arrow  # optional dependency (pyarrow)

    temporary = stack.enter_context(tempfile.TemporaryDirectory(prefix="loaderx-import-"))
    columns = os.path.join(temporary, "columns")
    arrow.from_arrow(columns, source, codec="raw", progress=False)
    opened = arrow.open_columns(columns)
    for dataset in opened.values():
        stack.callback(dataset.close)
    arrays = {}
    for name, dataset in opened.items():
        if not isinstance(dataset, DenseDataset):
            raise TypeError(
                f"column '{name}' holds rows of varying length (lists, strings or binary), "
                "which an ArrayStore array cannot: convert it to a ragged dataset with "
                "loaderx.from_arrow, or leave it out of the file"
            )
        shape = (len(dataset), *dataset.item_shape)
        arrays[name] = RowSource(name, dataset.dtype, shape, _dataset_rows(dataset))
    return arrays


def _dataset_rows(dataset: DenseDataset) -> Callable[[int, int], np.ndarray]:
    return lambda start, end: np.asarray(dataset[start:end])


def _feather_arrays(stack: contextlib.ExitStack, path: str) -> dict[str, Any]:
    import pyarrow as pa  # optional dependency

    mapped = stack.enter_context(pa.memory_map(path, "r"))
    reader = pa.ipc.open_file(mapped)
    batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
    return _arrow_arrays(stack, pa.RecordBatchReader.from_batches(reader.schema, batches))


def _arrow_table_arrays(stack: contextlib.ExitStack, table: Any) -> dict[str, Any]:
    return _arrow_arrays(stack, table)


# pandas


def _dataframe_arrays(frame: Any) -> dict[str, np.ndarray]:  # frame: a pandas DataFrame
    import pandas as pd  # optional dependency

    if not isinstance(frame, pd.DataFrame):
        raise TypeError(f"import_ reads a pandas DataFrame, got a {type(frame).__name__}")
    if not isinstance(frame.index, pd.RangeIndex) or frame.index.start != 0:
        raise ValueError(
            "the DataFrame has an index other than 0..n-1, which import_ would lose: "
            "keep it as a column with frame.reset_index(), or drop it with "
            "frame.reset_index(drop=True)"
        )
    arrays = {}
    for column in frame.columns:
        if not isinstance(column, str):
            raise TypeError(
                f"column {column!r} has a non-str name: rename it (array names are str)"
            )
        series = frame[column]
        dtype = series.dtype
        if not isinstance(dtype, np.dtype) or dtype.kind not in NUMBER_KINDS:
            raise TypeError(
                f"column '{column}' has dtype {dtype}, which is not a NumPy number or bool "
                "dtype: convert it (e.g. series.astype('float64') after filling missing "
                "values), or leave it out with names="
            )
        arrays[column] = series.to_numpy(copy=False)
    return arrays


# csv


def _csv_arrays(stack: contextlib.ExitStack, path: str) -> dict[str, Any]:
    file = stack.enter_context(open(path, "rb"))  # noqa: SIM115 (the stack closes it)
    columns = _csv_header(file.readline(), path)
    start = file.tell()
    checkpoints, rows = _csv_scan(file, len(columns), path)
    arrays: dict[str, Any] = {}
    for index, (name, dtype) in enumerate(columns):
        read = _csv_reader(file, start, checkpoints, index, dtype, path)
        arrays[name] = RowSource(name, dtype, (rows,), read)
    return arrays


def _csv_header(line: bytes, path: str) -> list[tuple[str, np.dtype[Any]]]:
    """The columns of a header ``name:dtype,...`` (a bare ``name`` is float64)."""
    text = line.decode("utf-8").rstrip("\r\n")
    if not text:
        raise ValueError(f"'{path}' has no header line: the first line names the columns")
    columns = []
    for cell in text.split(","):
        name, _, dtype_text = cell.strip().partition(":")
        try:
            dtype = np.dtype(dtype_text or "float64")
        except TypeError as exc:
            raise ValueError(f"'{path}': column {cell!r} names an unknown dtype") from exc
        check_dtype(name, dtype, "CSV")
        columns.append((name, dtype))
    return columns


def _csv_scan(file: BinaryIO, width: int, path: str) -> tuple[list[int], int]:
    """One pass over the rows: their count and the offset of every
    ``CSV_CHECKPOINT_ROWS``-th row."""
    checkpoints: list[int] = []
    rows = 0
    while True:
        offset = file.tell()
        line = file.readline()
        if not line.strip():
            if line and file.read(1):
                raise ValueError(f"'{path}' has an empty line at row {rows}: remove it")
            return checkpoints, rows
        if rows % CSV_CHECKPOINT_ROWS == 0:
            checkpoints.append(offset)
        if line.count(b",") != width - 1:
            raise ValueError(
                f"'{path}' row {rows} has {line.count(b',') + 1} cells, the header {width}"
            )
        rows += 1


def _csv_reader(
    file: BinaryIO,
    start: int,
    checkpoints: list[int],
    column: int,
    dtype: np.dtype[Any],
    path: str,
) -> Callable[[int, int], np.ndarray]:
    def read(first: int, end: int) -> np.ndarray:
        out = np.empty(end - first, dtype=dtype)
        row = first - first % CSV_CHECKPOINT_ROWS
        file.seek(checkpoints[row // CSV_CHECKPOINT_ROWS] if checkpoints else start)
        done = 0
        while done < out.size:
            lines = [file.readline() for _ in range(min(CSV_ROWS, end - row))]
            cells = [line.split(b",")[column].strip() for line in lines]
            skip = max(0, first - row)
            row += len(lines)
            take = cells[skip:]
            out[done : done + len(take)] = _parse_cells(take, dtype, path)
            done += len(take)
        return out

    return read


def _parse_cells(cells: list[bytes], dtype: np.dtype[Any], path: str) -> np.ndarray:
    try:
        if dtype.kind == "b":
            values = np.array(cells)
            truth = values == b"True"
            if not np.all(truth | (values == b"False")):
                raise ValueError("a bool column holds a cell other than True or False")
            return np.asarray(truth, dtype=bool)
        if dtype.kind == "f":  # via float64: Python's correctly rounded parse
            return np.array(cells).astype(np.float64).astype(dtype)
        return np.array(cells).astype(dtype)
    except (ValueError, OverflowError) as exc:
        raise ValueError(f"'{path}': a cell does not parse as {dtype}: {exc}") from exc


# ---- export ----------------------------------------------------------------------


def export_arrays(
    path: Any, format: str | None, arrays: dict[str, LazyArray], chunk_bytes: int
) -> Any:  # path: checked here; the result: None, or the in-memory object
    """Writes ``arrays`` to ``path`` in ``format`` (from the suffix when
    None); for the in-memory formats returns the object instead."""
    if not arrays:
        raise ValueError("export of no arrays: the store is empty, or names= named none")
    if path is None:
        if format not in IN_MEMORY:
            raise ValueError(f"export without a path makes an object: give format= in {IN_MEMORY}")
        return _to_torch(arrays) if format == "torch" else _to_pandas(arrays)
    format = format_of(path, format, "export")
    if format in IN_MEMORY:
        raise ValueError(f"format {format!r} makes an object: call export(None, format={format!r})")
    path = os.fspath(path)
    writers: dict[str, Callable[[str, dict[str, LazyArray], int], None]] = {
        "npy": _write_npy,
        "npz": _write_npz,
        "pt": _write_pt,
        "safetensors": _write_safetensors,
        "hdf5": _write_hdf5,
        "zarr": _write_zarr,
        "parquet": _write_parquet,
        "feather": _write_feather,
        "csv": _write_csv,
    }
    _check_exportable(format, arrays)
    with atomic_output(path, directory=format == "zarr") as temporary:
        writers[format](temporary, arrays, chunk_bytes)
    return None


def _check_exportable(format: str, arrays: dict[str, LazyArray]) -> None:
    """Refuses, before anything is written, what ``format`` cannot hold."""
    kinds = {"npy": None, "npz": None, "hdf5": "biufS"}.get(format, "biuf")
    for name, array in arrays.items():
        if kinds is not None:
            check_dtype(name, array.dtype, format, kinds)
    if format == "npy" and len(arrays) != 1:
        raise ValueError(
            f".npy holds one array, got {sorted(arrays)}: export one with names=[...], or all "
            "into an .npz"
        )
    if format in ("parquet", "feather", "csv", "pandas"):
        _check_table(format, arrays)
    for name in arrays if format == "csv" else ():
        if any(mark in name for mark in ',:"\n\r'):
            raise ValueError(
                f"array name {name!r} has a comma, colon, quote or line break, which a CSV "
                "header cannot hold: save the array under another name first"
            )


def _check_table(format: str, arrays: dict[str, LazyArray]) -> None:
    """A table's columns: arrays of at least one dimension (CSV and pandas:
    exactly one), all of one length."""
    lengths = {}
    for name, array in arrays.items():
        flat = format in ("csv", "pandas")
        if array.ndim == 0 or (flat and array.ndim != 1):
            need = "1-d" if flat else "at least 1-d"
            raise ValueError(
                f"array '{name}' has shape {array.shape}: {format} columns are {need} arrays "
                "(one value per row); leave it out with names=, or export it as npy or hdf5"
            )
        lengths[name] = array.shape[0]
    if len(set(lengths.values())) > 1:
        raise ValueError(
            f"{format} columns all have one length, these arrays differ: {lengths}; export "
            "arrays of one length together (names=)"
        )


def _npy_header_bytes(array: LazyArray) -> dict[str, Any]:
    return {
        "descr": np.lib.format.dtype_to_descr(array.dtype),
        "fortran_order": False,
        "shape": tuple(array.shape),
    }


def _write_npy_to(file: BinaryIO, array: LazyArray, chunk_bytes: int) -> None:
    header = _npy_header_bytes(array)
    try:
        np.lib.format.write_array_header_1_0(file, header)
    except ValueError:  # a header past 64 KiB
        np.lib.format.write_array_header_2_0(file, header)
    for_chunks(array, chunk_bytes, _write_bytes(file))


def _write_npy(path: str, arrays: dict[str, LazyArray], chunk_bytes: int) -> None:
    with open(path, "wb") as file:
        _write_npy_to(file, next(iter(arrays.values())), chunk_bytes)


def _write_npz(path: str, arrays: dict[str, LazyArray], chunk_bytes: int) -> None:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, array in arrays.items():
            with archive.open(name + ".npy", "w", force_zip64=True) as member:
                _write_npy_to(member, array, chunk_bytes)  # type: ignore[arg-type]


def _write_pt(path: str, arrays: dict[str, LazyArray], chunk_bytes: int) -> None:
    import torch  # optional dependency

    torch.save(_to_torch(arrays), path)  # torch.save pickles whole tensors: no streaming


def _to_torch(arrays: dict[str, LazyArray]) -> dict[str, Any]:
    import torch  # optional dependency

    for name, array in arrays.items():
        check_dtype(name, array.dtype, "torch")
    # from_dlpack shares each freshly loaded array's memory: one read, no second copy
    return {name: torch.from_dlpack(np.asarray(array)) for name, array in arrays.items()}


def _to_pandas(arrays: dict[str, LazyArray]) -> Any:  # a pandas DataFrame
    import pandas as pd  # optional dependency

    _check_exportable("pandas", arrays)
    return pd.DataFrame({name: np.asarray(array) for name, array in arrays.items()}, copy=False)


def _write_safetensors(path: str, arrays: dict[str, LazyArray], chunk_bytes: int) -> None:
    """The safetensors layout, streamed: an 8-byte little-endian header
    length, the JSON header (padded with spaces to 8 bytes), the tensors'
    bytes back to back in the header's order."""
    kinds = {np.dtype(dtype): kind for kind, dtype in SAFETENSORS_DTYPES.items()}
    header: dict[str, Any] = {}
    offset = 0
    for name, array in arrays.items():
        kind = kinds.get(array.dtype)
        if kind is None:
            raise TypeError(
                f"array '{name}' has dtype {array.dtype}, which safetensors cannot hold (it "
                f"takes {sorted(set(SAFETENSORS_DTYPES.values()))}, little-endian): convert "
                "the array first, pick other names=, or use npy, npz or hdf5"
            )
        end = offset + array.nbytes
        header[name] = {"dtype": kind, "shape": list(array.shape), "data_offsets": [offset, end]}
        offset = end
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(text)) + text)
        for array in arrays.values():
            for_chunks(array, chunk_bytes, _write_bytes(file))


def _write_hdf5(path: str, arrays: dict[str, LazyArray], chunk_bytes: int) -> None:
    import h5py  # optional dependency

    with h5py.File(path, "w") as file:
        for name, array in arrays.items():
            dataset = file.create_dataset(name, shape=array.shape, dtype=array.dtype)
            _fill(dataset, array, chunk_bytes)


def _fill(target: Any, array: LazyArray, chunk_bytes: int) -> None:
    """Copies ``array`` into an array-like that takes slice assignment."""

    def store(start: int, rows: np.ndarray) -> None:
        if array.ndim == 0:
            target[()] = rows
        else:
            target[start : start + len(rows)] = rows

    for_chunks(array, chunk_bytes, store)


def _write_zarr(path: str, arrays: dict[str, LazyArray], chunk_bytes: int) -> None:
    import zarr  # optional dependency

    group = zarr.open_group(path, mode="w")
    for name, array in arrays.items():
        row_bytes = array.dtype.itemsize * math.prod(array.shape[1:])
        rows = max(1, min(chunk_bytes, 16 << 20) // max(1, row_bytes))
        layout = tuple(max(1, n) for n in (rows, *array.shape[1:]))[: array.ndim]
        target = group.create_array(name, shape=array.shape, dtype=array.dtype, chunks=layout)
        _fill(target, array, chunk_bytes)


def _arrow_batches(arrays: dict[str, LazyArray], chunk_bytes: int) -> Iterator[Any]:
    """Record batches of about ``chunk_bytes``: each column flat values
    nested in fixed-size lists, one level per trailing dimension (which
    ``from_arrow`` reads back as the item shape)."""
    import pyarrow as pa  # optional dependency

    row_bytes = sum(array.nbytes // max(1, array.shape[0]) for array in arrays.values())
    step = max(1, chunk_bytes // max(1, row_bytes))
    length = next(iter(arrays.values())).shape[0]
    for start in range(0, max(length, 1), step):
        columns = []
        for array in arrays.values():
            rows = np.ascontiguousarray(array[start : start + step])
            column = pa.array(rows.reshape(-1))
            for size in reversed(rows.shape[1:]):
                column = pa.FixedSizeListArray.from_arrays(column, size)
            columns.append(column)
        yield pa.record_batch(columns, names=list(arrays))


def _write_parquet(path: str, arrays: dict[str, LazyArray], chunk_bytes: int) -> None:
    import pyarrow.parquet as pq  # optional dependency

    writer = None
    try:
        for batch in _arrow_batches(arrays, chunk_bytes):
            writer = writer or pq.ParquetWriter(path, batch.schema)
            writer.write_batch(batch)
    finally:
        if writer is not None:
            writer.close()


def _write_feather(path: str, arrays: dict[str, LazyArray], chunk_bytes: int) -> None:
    import pyarrow as pa  # optional dependency

    writer = None
    try:
        for batch in _arrow_batches(arrays, chunk_bytes):
            writer = writer or pa.ipc.new_file(path, batch.schema)
            writer.write_batch(batch)
    finally:
        if writer is not None:
            writer.close()


def _write_csv(path: str, arrays: dict[str, LazyArray], chunk_bytes: int) -> None:
    """A header ``name:dtype,...``, then one line per row; floats in their
    shortest text that parses back to the same value."""
    with open(path, "wb") as file:
        file.write(
            (",".join(f"{name}:{a.dtype.name}" for name, a in arrays.items()) + "\n").encode()
        )
        length = next(iter(arrays.values())).shape[0]
        step = max(1, min(chunk_bytes // (32 * len(arrays)), 1 << 20))
        for start in range(0, length, step):
            cells = [np.asarray(a[start : start + step]).astype(str) for a in arrays.values()]
            lines = [",".join(row) for row in zip(*cells)]
            file.write(("\n".join(lines) + "\n").encode())


# ---- pack files ------------------------------------------------------------------


class _PackWriter:
    """Frames appended to a file, with the running SHA-256 of all of them."""

    def __init__(self, file: BinaryIO) -> None:
        self.file = file
        self.digest = hashlib.sha256(PACK_MAGIC + struct.pack("<I", PACK_VERSION))
        file.write(PACK_MAGIC + struct.pack("<I", PACK_VERSION))

    def frame(self, kind: int, payload: bytes | memoryview, raw_bytes: int) -> None:
        header = FRAME.pack(kind, len(payload), raw_bytes)
        check = hashlib.sha256(header)
        check.update(payload)
        for part in (header, payload, check.digest()):
            self.file.write(part)
            self.digest.update(part)

    def array(self, name: str, array: LazyArray, codec: str, chunk_bytes: int) -> None:
        """An array's header frame (``codec``: the store's), then its data frames."""
        frames = frame_codec(array.dtype)
        meta = {"name": name, "dtype": array.dtype.str, "shape": list(array.shape)}
        meta.update(codec=codec, frames=frames)
        self.frame(ARRAY_FRAME, msgpack.packb(meta), 0)
        for_chunks(array, chunk_bytes, lambda _, rows: self.data(rows, frames))

    def data(self, chunk: np.ndarray, codec: str) -> None:
        raw = chunk.reshape(-1).view(np.uint8).data
        for start in range(0, len(raw), FRAME_RAW_MAX):
            part = raw[start : start + FRAME_RAW_MAX]
            packed = encode_buffer(part, codec)
            if len(packed) < len(part):
                self.frame(CODED_FRAME, packed, len(part))
            else:
                self.frame(RAW_FRAME, part, len(part))


def frame_codec(dtype: np.dtype[Any]) -> str:
    """The codec of an array's data frames: zstd, of the bytes shuffled by
    the element size where the core shuffles elements of that size."""
    if dtype.itemsize in SHUFFLE_ELEMENT_BYTES:
        return shuffled_codec("zstd", dtype.itemsize)
    return "zstd"


def pack_store(path: str, arrays: dict[str, tuple[LazyArray, str]], chunk_bytes: int) -> None:
    """Writes ``arrays`` (``{name: (lazy array, codec)}``) as one pack file."""
    for name, (array, _) in arrays.items():
        if array.dtype.fields is not None:
            raise TypeError(f"array '{name}' has a structured dtype, which pack cannot hold")
    with atomic_output(path) as temporary, open(temporary, "wb") as file:
        writer = _PackWriter(file)
        for name, (array, codec) in arrays.items():
            writer.array(name, array, codec, chunk_bytes)
        end = {"arrays": len(arrays), "sha256": writer.digest.hexdigest()}
        writer.frame(END_FRAME, msgpack.packb(end), 0)


class _PackReader:
    """The frames of a pack file, each checked before it is used."""

    def __init__(self, file: BinaryIO, path: str) -> None:
        self.file = file
        self.path = path
        self.offset = 0
        start = file.read(len(PACK_MAGIC) + 4)
        if start[: len(PACK_MAGIC)] != PACK_MAGIC or len(start) != len(PACK_MAGIC) + 4:
            raise CorruptPackError(path, 0, "it does not start like a loaderx pack file")
        (version,) = struct.unpack("<I", start[len(PACK_MAGIC) :])
        if version != PACK_VERSION:
            raise CorruptPackError(path, 0, f"format version {version}, not {PACK_VERSION}")
        self.digest = hashlib.sha256(start)
        self.offset = len(start)

    def fail(self, problem: str, offset: int | None = None) -> CorruptPackError:
        return CorruptPackError(self.path, self.offset if offset is None else offset, problem)

    def _exactly(self, size: int, what: str) -> bytes:
        data = self.file.read(size)
        if len(data) != size:
            raise self.fail(f"the file ends inside a frame ({what}): it is truncated")
        return data

    def frame(self) -> tuple[int, bytes, int]:
        """The next frame's kind, payload and raw size: a zlib frame's payload
        inflated, a coded one's as stored (``data_into`` decodes it)."""
        header = self._exactly(FRAME.size, "header")
        kind, stored, raw = FRAME.unpack(header)
        limit = META_BYTES_MAX if kind in (ARRAY_FRAME, END_FRAME) else FRAME_RAW_MAX
        if kind not in (ARRAY_FRAME, END_FRAME, *DATA_FRAMES) or stored > limit + 64:
            raise self.fail(f"a frame header that is not one (kind {kind}, {stored} bytes)")
        if raw > FRAME_RAW_MAX:
            raise self.fail(f"a frame header that is not one ({raw} raw bytes)")
        payload = self._exactly(stored, "payload")
        check = self._exactly(DIGEST_BYTES, "checksum")
        if hashlib.sha256(header + payload).digest() != check:
            raise self.fail("a frame whose checksum does not match its bytes")
        start = self.offset
        self.offset += len(header) + stored + DIGEST_BYTES
        if kind != END_FRAME:
            for part in (header, payload, check):
                self.digest.update(part)
        if kind == ZLIB_FRAME:
            inflate = zlib.decompressobj()
            try:  # at most raw bytes: a hostile frame cannot make it allocate more
                payload = inflate.decompress(payload, raw)
            except zlib.error as exc:
                raise self.fail(f"a data frame that does not decompress ({exc})", start) from None
            if len(payload) != raw or inflate.unconsumed_tail or not inflate.eof:
                raise self.fail("a data frame that decompresses to the wrong size", start)
        elif kind == RAW_FRAME and stored != raw:
            raise self.fail("a raw data frame of the wrong size", start)
        return kind, payload, raw

    def meta(self, expect: int) -> dict[str, Any]:
        start = self.offset
        kind, payload, _ = self.frame()
        if kind != expect:
            raise self.fail(f"a frame of kind {kind} where kind {expect} belongs", start)
        try:
            data = msgpack.unpackb(payload, raw=False)
        except Exception as exc:
            raise self.fail(f"an unreadable header frame ({exc})", start) from None
        if not isinstance(data, dict):
            raise self.fail("a header frame that is not a map", start)
        return data

    def data_into(self, out: memoryview, codec: str | None) -> None:
        """Fills ``out`` from the next data frames; ``codec`` decodes the coded
        ones (None: the array's header named none)."""
        done = 0
        while done < len(out):
            start = self.offset
            kind, payload, raw = self.frame()
            if kind not in DATA_FRAMES or raw > len(out) - done:
                raise self.fail("the frames do not hold the array its header describes", start)
            target = out[done : done + raw]
            if kind != CODED_FRAME:
                target[:] = payload
            elif codec is None:
                raise self.fail("a coded data frame of an array that names no frame codec", start)
            else:
                try:
                    decode_buffer(payload, codec, target)
                except CorruptStoreError as exc:
                    raise self.fail(f"a data frame that does not decode ({exc})", start) from None
            done += raw


def _pack_array(reader: _PackReader) -> tuple[str, str, Any]:  # name, codec, value to save
    start = reader.offset
    meta = reader.meta(ARRAY_FRAME)
    try:
        name, codec = str(meta["name"]), str(meta["codec"])
        dtype = np.dtype(meta["dtype"])
        shape = tuple(int(n) for n in meta["shape"])
        frames = meta.get("frames")
        known = frames is None or (frames in CODECS and not CODEC_TABLE[frames].uses_dictionary)
        valid = all(n >= 0 for n in shape) and not dtype.hasobject and known
    except (KeyError, TypeError, ValueError):
        valid = False
    if not valid:
        raise reader.fail(f"an array header that does not describe an array: {meta}", start)
    position = [0]

    def read(first: int, end: int) -> np.ndarray:
        assert first == position[0], "an unpack reads the rows in order"
        out = np.empty((end - first, *shape[1:]) if shape else (), dtype=dtype)
        reader.data_into(out.reshape(-1).view(np.uint8).data, frames)
        position[0] = end
        return out

    if not shape:
        return name, codec, read(0, 1)
    return name, codec, RowSource(name, dtype, shape, read)


def unpack_store(path: str, dst: str, open_store: Callable[[str], Any]) -> None:
    """Unpacks the pack file ``path`` into a new store at ``dst``:
    staged beside it, renamed into place once the whole file checked out."""
    path, dst = os.fspath(path), os.fspath(dst)
    if os.path.lexists(dst):
        raise FileExistsError(f"'{dst}' exists: unpack makes a new store; pick a new path")
    with atomic_output(dst, directory=True) as staging, open(path, "rb") as file:
        reader = _PackReader(file, path)
        store = open_store(staging)
        try:
            _unpack_arrays(reader, store)
        finally:
            store.close()


def _unpack_arrays(reader: _PackReader, store: Any) -> None:  # store: an ArrayStore
    count = 0
    while True:
        start = reader.offset
        header = reader.file.read(FRAME.size)
        reader.file.seek(-len(header), os.SEEK_CUR)
        if len(header) == FRAME.size and FRAME.unpack(header)[0] == END_FRAME:
            break
        name, codec, value = _pack_array(reader)
        # The stream reads in order; a dictionary codec samples rows anywhere, so
        # those arrays go in raw first and are re-encoded from the store.
        sequential = isinstance(value, RowSource) and "dict" in codec
        store.save({name: value}, codec="raw" if sequential else codec)
        if sequential:
            lazy = store.load(name, lazy=True)
            rows = RowSource(name, lazy.dtype, lazy.shape, _sliced(lazy))
            store.save({name: rows}, codec=codec)
        count += 1
        if count > 1 << 20:
            raise reader.fail("more than 2^20 arrays", start)
    digest = reader.digest.hexdigest()
    start = reader.offset
    end = reader.meta(END_FRAME)
    if end.get("sha256") != digest or end.get("arrays") != count:
        raise reader.fail("the closing frame does not match the frames before it", start)
    if reader.file.read(1):
        raise reader.fail("bytes after the closing frame")


def from_dlpack(name: str, value: Any) -> np.ndarray:  # value: a DLPack producer
    """``value`` (a PyTorch or JAX tensor, any ``__dlpack__`` producer) as a
    NumPy array sharing its memory."""
    try:
        return np.from_dlpack(value)
    except (BufferError, RuntimeError, TypeError, ValueError) as exc:
        raise TypeError(
            f"cannot save '{name}': its {type(value).__name__} does not hand its memory to "
            f"NumPy through DLPack ({exc}); move it to the CPU and to a NumPy dtype first "
            "(e.g. tensor.detach().cpu().float())"
        ) from exc
