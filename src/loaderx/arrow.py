"""Converting Parquet, Arrow and Hugging Face ``datasets`` tables to loaderx.

``from_arrow(path, source)`` turns a table into a *column directory*: one
loaderx store per column, plus ``columns.msgpack``, which lists them::

    path/
      columns.msgpack   written last: without it the directory is not a dataset
      label/            a dense store (schema.msgpack + zrecord files)
      image/            a dense store, item_shape (32, 32, 3)
      input_ids/        a ragged store, one record of int32 rows per sample
      text/             a ragged uint8 store, the UTF-8 bytes of each string

How columns map to stores. Numeric and boolean columns become dense scalar
stores; fixed-size lists (nested ones too), Arrow's fixed-shape tensors and
Hugging Face ``Array2D``..``Array5D`` become dense stores of that item shape;
fixed-size binary becomes dense ``uint8`` of its width. Lists of any of those
(token ids, variable-length sequences of vectors) become ragged stores, one
record per row. Binary and string columns become ragged ``uint8`` (strings
as UTF-8). Anything else (structs, dictionaries, timestamps, lists of lists)
raises ``TypeError`` naming the column: cast it first or leave it out with
``columns=``. A null anywhere raises ``ValueError``: a store has no missing
values, so fill or drop them first.

Streaming and memory. The source is read one record batch at a time, batches
cut to about ``chunk_bytes`` of row data, and every column's part of a batch
is appended with one native call straight from Arrow's buffers (no copy for
numeric, list and binary data). Peak memory does not grow with the source:
about two batches plus what the reader holds (Parquet decodes in batches of
``chunk_bytes / 8``, see ``_PARQUET_DECODE_FACTOR``).

All or nothing, like ``from_numpy``: each column is one ``Writer`` of the
converters' write session (loaderx._writing): every column store gets its
schema only after its data is durable, ``columns.msgpack`` is written last
(atomically, with a checksum), and a failure removes everything the call
wrote. The target must be a new or empty directory. ``open_columns(path)`` opens the stores as
``{name: DenseDataset | RaggedDataset}`` after checking the listing against
the directory: it never trusts ``columns.msgpack``.

pyarrow is imported when a function runs, so ``import loaderx`` never needs
it (install ``loaderx[arrow]``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import itertools
import math
import os
import re
import shutil
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Callable, TextIO

import msgpack
import numpy as np

from ._envelope import (
    NEWER,
    UNREADABLE,
    VERSION,
    EnvelopeError,
    check_header,
    checked_body,
    unpack_map,
)
from ._fs import readable_path, write_file_atomic
from ._remote import is_remote
from ._upload import write_columns
from ._writing import (
    CHUNK_BYTES,
    DICT_BYTES,
    RECORD_COST_BYTES,
    SAMPLE_BUDGET_MAX,
    TRIAL_BYTES_MAX,
    TRIAL_RECORDS_MAX,
    Progress,
    Writer,
    auto_codec,
    check_chunk_bytes,
    check_progress,
    codec_name,
    is_auto,
    packed_trial,
    shuffled_samples,
    uses_dictionary,
)
from .dataset import DenseDataset, RaggedDataset
from .schema import Schema, StrPath
from .zrecord import codec_parts

__all__ = ["COLUMNS_FILE", "from_arrow", "open_columns"]

COLUMNS_FILE = "columns.msgpack"
COLUMNS_FORMAT = "loaderx-columns"
COLUMNS_VERSION = 1
_COLUMNS_BYTES_MAX = 16 << 20
# Decoding a Parquet batch of nested columns (fixed-size lists, lists) takes
# several times the batch's size (two 16-bit levels per value, then the
# arrays): 16 MiB batches of uint8 fixed-size lists peaked at 168 MiB in
# Arrow's pool and 400 MiB of process memory. Batches of chunk_bytes / 8 keep
# the peak near 3 x chunk_bytes (about 200 MiB with the default).
_PARQUET_DECODE_FACTOR = 8
# Bytes per row assumed for a ragged column of a stream of unknown size.
_RAGGED_ROW_GUESS_BYTES = 4096
# Store names become directory names: a plain name, never '.', '..' or a path.
_STORE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,199}")


@dataclass(frozen=True)
class _Column:
    """One source column and the store it becomes."""

    source: str
    name: str
    arrow_type: str
    schema: Schema
    # codec="auto" or "auto-speed" (this names which; "" for a given codec):
    # the schema's "zstd" stands in until the first batch's records decide.
    auto: str = ""

    @property
    def ragged(self) -> bool:
        return self.schema.kind == "ragged"


def from_arrow(
    path: StrPath,
    source: Any,
    columns: Mapping[str, str] | list[str] | tuple[str, ...] | None = None,
    codec: str | int | Mapping[str, str | int] = "auto",
    chunk_bytes: int = CHUNK_BYTES,
    progress: bool | TextIO = True,
    *,
    storage_options: dict[str, Any] | None = None,
    staging_dir: StrPath | None = None,
) -> int:
    """Writes the table ``source`` to a new column directory at ``path`` (one
    store per column, see the module doc); returns the rows written.

    ``source`` is a ``pyarrow.Table``, ``RecordBatch`` or
    ``RecordBatchReader`` (a ``pyarrow.dataset`` scanner's ``to_reader()``),
    a Hugging Face ``datasets.Dataset`` or ``IterableDataset`` (in its row
    order, selections and shuffles included), or a Parquet file path,
    directory of ``.parquet`` files or glob (sorted order, one schema). ``columns`` picks the
    columns: a list of names (that order), or ``{column: store_name}`` to
    rename (a store name is a plain file name). ``codec`` is one codec for
    every store or ``{store_name: codec}`` (stores it does not name get
    ``"auto"``); ``"auto"``, the default, picks ``"zstd_shuffleN"`` or
    ``"zstd"`` (``"auto-speed"``: ``"lz4_shuffleN"`` or ``"lz4"``) per store
    as ``from_numpy`` does, from the store's first records in the first batch
    (up to 64, or 4 MiB); ``zstd_dict`` trains each store's dictionary from
    its first batch (a shuffled dictionary codec from its
    records shuffled). ``chunk_bytes`` bounds the row data read
    and appended at once; ``progress`` shows a bar on a terminal.

    ``path`` may be a URL (``s3://...``; "Writing to object storage"): the
    column directory is written whole into ``staging_dir``, each column
    store is uploaded and checked, and ``columns.msgpack`` is uploaded last.
    """
    chunk_bytes = check_chunk_bytes(chunk_bytes)
    check_progress(progress)
    if is_remote(path):

        def build(local: str) -> int:
            return from_arrow(local, source, columns, codec, chunk_bytes, progress)

        return write_columns(os.fspath(path), COLUMNS_FILE, build, storage_options, staging_dir)
    reader = _open_source(source)
    plan = _plan(reader.schema, columns, codec)
    path = os.fspath(path)
    batches = reader.batches(chunk_bytes, plan)
    first = next(batches, None)
    if first is not None:
        plan = [_decide_codec(path, column, first.column(column.source)) for column in plan]
    with _fresh_directory(path), contextlib.ExitStack() as stack:
        writers = [
            stack.enter_context(Writer(os.path.join(path, column.name), column.schema, new=True))
            for column in plan
        ]
        meter = Progress(progress, "from_arrow", total_records=reader.rows)
        rows = written_bytes = 0
        for batch in itertools.chain([] if first is None else [first], batches):
            for column, writer in zip(plan, writers):
                written_bytes += _write_column(
                    writer, column, batch.column(column.source), chunk_bytes
                )
            rows += batch.num_rows
            meter.update(rows, written_bytes)
        for writer in writers:
            writer.commit()
        _write_listing(path, plan, rows)
        meter.finish(rows, written_bytes)
    return rows


def open_columns(
    path: StrPath, verify: bool | None = None
) -> dict[str, DenseDataset | RaggedDataset]:
    """The stores of the column directory at ``path`` as ``{name: DenseDataset
    | RaggedDataset}``, in the listing's order, all of its row count. Dense
    ones can be passed to the ``DataLoader`` as they are."""
    path = readable_path(os.fspath(path))  # the old directory, mid two-rename swap
    listing = read_listing(path)
    opened: dict[str, DenseDataset | RaggedDataset] = {}
    try:
        for entry in listing["columns"]:
            kind = DenseDataset if entry["kind"] == "dense" else RaggedDataset
            dataset = kind(os.path.join(path, entry["name"]), verify=verify)
            opened[entry["name"]] = dataset
            if len(dataset) != listing["rows"]:
                raise ValueError(
                    f"'{path}' is damaged: store {entry['name']!r} holds {len(dataset)} records "
                    f"but {COLUMNS_FILE} "
                    f"says {listing['rows']}: convert again"
                )
    except BaseException:
        for dataset in opened.values():
            dataset.close()
        raise
    return opened


# ---- sources ----------------------------------------------------------------------


class _Reader:
    """A source as a schema, a row count (None when unknown) and record
    batches of about ``chunk_bytes`` each, holding at least the planned columns."""

    def __init__(
        self,
        schema: Any,
        rows: int | None,
        batches_of: Callable[[int, list[_Column]], Iterator[Any]],
    ) -> None:  # schema: a pyarrow.Schema; batches: pyarrow.RecordBatch
        self.schema = schema
        self.rows = rows
        self._batches_of = batches_of

    def batches(self, chunk_bytes: int, plan: list[_Column]) -> Iterator[Any]:
        for batch in self._batches_of(chunk_bytes, plan):
            yield from _cut(batch, chunk_bytes)


def _open_source(source: Any) -> _Reader:
    pa = _pyarrow()
    if isinstance(source, (str, os.PathLike)):
        return _parquet_reader(os.fspath(source))
    if isinstance(source, pa.RecordBatch):
        source = pa.Table.from_batches([source])
    if isinstance(source, pa.Table):
        table = source
        return _Reader(
            table.schema,
            table.num_rows,
            lambda chunk_bytes, plan: table.to_batches(
                _rows_per_batch(table.nbytes, table.num_rows, chunk_bytes)
            ),
        )
    if isinstance(source, pa.RecordBatchReader):
        return _Reader(source.schema, None, lambda chunk_bytes, plan: source)
    if type(source).__module__.startswith("datasets"):
        return _hugging_face_reader(source)
    raise TypeError(
        "from_arrow reads a pyarrow Table, RecordBatch or RecordBatchReader, a Hugging Face "
        "Dataset, "
        f"or a Parquet path or glob; got {type(source).__name__}"
    )


def _parquet_reader(pattern: str) -> _Reader:
    import pyarrow.parquet as pq  # optional dependency

    if os.path.isdir(pattern):
        files = sorted(glob.glob(os.path.join(glob.escape(pattern), "*.parquet")))
    elif os.path.exists(pattern):
        files = [pattern]
    else:
        files = sorted(glob.glob(pattern))
    if not files:
        raise FileNotFoundError(
            f"no Parquet file at '{pattern}': give a .parquet file, a directory of them or a glob"
        )
    schema = pq.read_schema(files[0])
    rows = 0
    for file in files:
        metadata = pq.read_metadata(file)
        if not metadata.schema.to_arrow_schema().equals(schema, check_metadata=False):
            raise ValueError(
                f"'{file}' has another schema than '{files[0]}': convert files of one schema "
                "together"
            )
        rows += metadata.num_rows

    def batches(chunk_bytes: int, plan: list[_Column]) -> Iterator[Any]:
        columns = [column.source for column in plan]
        fixed_bytes = sum(column.schema.item_bytes for column in plan if not column.ragged)
        seen_bytes = 0  # the largest bytes per row seen so far
        for file in files:
            with pq.ParquetFile(file) as parquet:
                for group in range(parquet.metadata.num_row_groups):
                    row_bytes = max(
                        seen_bytes,
                        fixed_bytes + _encoded_row_bytes(parquet.metadata.row_group(group), plan),
                    )
                    batch_rows = max(1, chunk_bytes // _PARQUET_DECODE_FACTOR // max(1, row_bytes))
                    for batch in parquet.iter_batches(
                        batch_size=batch_rows,
                        row_groups=[group],
                        columns=columns,
                        use_threads=False,
                    ):
                        seen_bytes = max(seen_bytes, batch.nbytes // max(1, batch.num_rows))
                        yield batch

    return _Reader(schema, rows, batches)


def _hugging_face_reader(dataset: Any) -> _Reader:
    if not hasattr(dataset, "with_format") or not hasattr(dataset, "features"):
        raise TypeError(
            "from_arrow reads a Hugging Face Dataset or IterableDataset, got "
            f"{type(dataset).__name__}: pick a split, e.g. dataset['train']"
        )
    if dataset.features is None:
        raise TypeError(
            "this Hugging Face IterableDataset does not know its features yet: pass features= when "
            "building it, or call .cast(features)"
        )
    arrow = dataset.with_format("arrow")
    rows = (
        len(dataset) if hasattr(dataset, "__len__") and not hasattr(dataset, "n_shards") else None
    )
    schema = dataset.features.arrow_schema

    def batches(chunk_bytes: int, plan: list[_Column]) -> Iterator[Any]:
        data = getattr(dataset, "data", None)
        nbytes = getattr(data, "nbytes", None)
        if nbytes and rows:
            batch_rows = _rows_per_batch(nbytes, rows, chunk_bytes)
        else:  # a stream: the fixed columns' size, and a guess for the others
            row_bytes = sum(
                column.schema.item_bytes if not column.ragged else _RAGGED_ROW_GUESS_BYTES
                for column in plan
            )
            batch_rows = max(1, chunk_bytes // max(1, row_bytes))
        for table in arrow.iter(batch_size=batch_rows):
            yield from table.to_batches()

    return _Reader(schema, rows, batches)


def _encoded_row_bytes(row_group: Any, plan: list[_Column]) -> int:
    """Bytes per row of the ragged columns as Parquet stores them before
    compression: a first guess (encodings shrink data), raised by the batches
    actually read."""
    ragged = {column.source for column in plan if column.ragged}
    total = 0
    for index in range(row_group.num_columns):
        chunk = row_group.column(index)
        if chunk.path_in_schema.split(".")[0] in ragged:
            total += chunk.total_uncompressed_size
    return int(total // max(1, row_group.num_rows))


def _rows_per_batch(data_bytes: int, rows: int, chunk_bytes: int) -> int:
    """Rows per batch so that a batch holds about ``chunk_bytes`` of data."""
    if not rows:
        return 1
    row_bytes = max(1, data_bytes // rows)
    return max(1, min(rows, chunk_bytes // row_bytes))


def _cut(batch: Any, chunk_bytes: int) -> Iterator[Any]:
    """``batch`` in zero-copy slices of about ``chunk_bytes`` each (a source
    may hand over one huge batch)."""
    if batch.num_rows == 0:
        return
    step = _rows_per_batch(batch.nbytes, batch.num_rows, chunk_bytes)
    for start in range(0, batch.num_rows, step):
        yield batch.slice(start, step)


# ---- the column plan ------------------------------------------------------------------


def _plan(schema: Any, columns: Any, codec: Any) -> list[_Column]:  # columns, codec: checked here
    """The columns to convert, checked before any write."""
    names = list(schema.names)
    if columns is None:
        chosen = {name: name for name in names}
    elif isinstance(columns, Mapping):
        chosen = dict(columns)
    elif isinstance(columns, (list, tuple)):
        chosen = {name: name for name in columns}
    else:
        raise TypeError(
            f"columns must be a list of column names or a dict {{column: store_name}}, got "
            f"{type(columns).__name__}"
        )
    if not chosen:
        raise ValueError("no columns to convert: give at least one")
    if len(set(names)) != len(names):
        raise ValueError(
            "the source has duplicate column names "
            f"{sorted(n for n in set(names) if names.count(n) > 1)}: rename them first"
        )
    missing = [name for name in chosen if name not in names]
    if missing:
        raise ValueError(f"no column {missing[0]!r} in the source; it has {names}")
    stores = list(chosen.values())
    if len(set(stores)) != len(stores):
        raise ValueError(f"two columns would share the store name in {stores}: give each its own")
    codecs = _codecs(codec, stores)
    plan = []
    for column, name in chosen.items():
        _check_store_name(name, column)
        arrow_type = schema.field(column).type
        kind, dtype, item_shape = _store_layout(column, arrow_type)
        auto = codecs[name] if is_auto(codecs[name]) else ""
        plan.append(
            _Column(
                column,
                name,
                str(arrow_type),
                Schema(kind, dtype, item_shape, "zstd" if auto else codecs[name]),
                auto,
            )
        )
    return plan


def _codecs(codec: Any, stores: list[str]) -> dict[str, str]:
    if isinstance(codec, Mapping):
        unknown = sorted(set(codec) - set(stores))
        if unknown:
            raise ValueError(
                f"codec names stores {unknown} that are not converted; the stores are {stores}"
            )
        return {name: codec_name(codec.get(name, "auto"), allow_auto=True) for name in stores}
    return {name: codec_name(codec, allow_auto=True) for name in stores}


def _check_store_name(name: object, column: str) -> None:
    if not isinstance(name, str) or not _STORE_NAME.fullmatch(name) or name == COLUMNS_FILE:
        raise ValueError(
            f"column {column!r} would be stored as {name!r}, which is not a plain file name "
            "(letters, digits, '_', '.', '-', "
            f"not starting with '.', at most 200 characters): rename it with columns={{{column!r}: "
            f"'a_name'}}"
        )


def _store_layout(column: str, arrow_type: Any) -> tuple[str, np.dtype[Any], tuple[int, ...]]:
    """(kind, dtype, item_shape) of the store for a column of ``arrow_type``."""
    pa = _pyarrow()
    fixed = _fixed_layout(arrow_type)
    if fixed is not None:
        return ("dense", *fixed)
    if _is_bytes(arrow_type):
        return "ragged", np.dtype(np.uint8), ()
    shape = getattr(arrow_type, "shape", None)
    if isinstance(arrow_type, pa.BaseExtensionType) and shape and shape[0] is None:
        # A Hugging Face ArrayXD whose first dimension varies: ragged rows.
        inner = _fixed_layout(_value_type(arrow_type))
        if inner is not None and all(size is not None for size in shape[1:]):
            return "ragged", inner[0], tuple(shape[1:]) + inner[1]
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        inner = _fixed_layout(arrow_type.value_type)
        if inner is not None:
            return ("ragged", *inner)
    raise TypeError(
        f"column {column!r} has Arrow type {arrow_type}, which loaderx cannot store: numbers, "
        "booleans, fixed-size "
        "lists and tensors (dense), lists of those and binary or string (ragged) convert; cast it "
        "(e.g. pyarrow.compute.cast) or leave it out with columns=[...]"
    )


def _fixed_layout(arrow_type: Any) -> tuple[np.dtype[Any], tuple[int, ...]] | None:
    """(dtype, item_shape) when every value of ``arrow_type`` has one fixed
    shape, else None."""
    pa = _pyarrow()
    if (
        pa.types.is_boolean(arrow_type)
        or pa.types.is_integer(arrow_type)
        or pa.types.is_floating(arrow_type)
    ):
        return np.dtype(arrow_type.to_pandas_dtype()), ()
    if pa.types.is_fixed_size_binary(arrow_type):
        return np.dtype(np.uint8), (arrow_type.byte_width,)
    if pa.types.is_fixed_size_list(arrow_type):
        inner = _fixed_layout(arrow_type.value_type)
        return None if inner is None else (inner[0], (arrow_type.list_size, *inner[1]))
    if isinstance(arrow_type, pa.BaseExtensionType):
        return _extension_layout(arrow_type)
    return None


def _extension_layout(arrow_type: Any) -> tuple[np.dtype[Any], tuple[int, ...]] | None:
    """Arrow's fixed-shape tensor and Hugging Face's ArrayXD carry their shape;
    other extension types are read as their storage."""
    shape = getattr(arrow_type, "shape", None)
    value_type = getattr(arrow_type, "value_type", None)
    if shape is None or value_type is None:
        return _fixed_layout(arrow_type.storage_type)
    if any(size is None for size in shape):
        return None
    permutation = getattr(arrow_type, "permutation", None)
    if permutation is not None and list(permutation) != sorted(permutation):
        raise TypeError(
            f"tensor type {arrow_type} stores its dimensions permuted ({list(permutation)}): cast "
            "it to a row-major tensor first"
        )
    inner = _fixed_layout(_value_type(arrow_type))
    return None if inner is None else (inner[0], (*(int(size) for size in shape), *inner[1]))


def _value_type(arrow_type: Any) -> Any:
    """The element type of a tensor extension type (Hugging Face names it, e.g. 'float32')."""
    value_type = arrow_type.value_type
    return _pyarrow().type_for_alias(value_type) if isinstance(value_type, str) else value_type


def _is_bytes(arrow_type: Any) -> bool:
    pa = _pyarrow()
    return any(
        check(arrow_type)
        for check in (
            pa.types.is_binary,
            pa.types.is_large_binary,
            pa.types.is_string,
            pa.types.is_large_string,
        )
    )


# ---- writing a batch -----------------------------------------------------------------


def _column_bytes(column: _Column, array: Any) -> tuple[np.ndarray, np.ndarray]:
    """One batch's part of a column as packed bytes and each record's start."""
    if column.ragged:
        return _ragged_parts(column, array)
    values = _dense_values(column, array)
    return values.reshape(-1).view(np.uint8), np.arange(len(values), dtype=np.uint64) * np.uint64(
        column.schema.item_bytes
    )


def _decide_codec(path: str, column: _Column, array: Any) -> _Column:
    """The column with its codec="auto" decided on its first records in the
    first batch (each cut to 4 MiB, up to 64 or 4 MiB in all): the rule and
    sample of ``from_iterator``."""
    if not column.auto:
        return column

    def trial() -> tuple[np.ndarray, np.ndarray]:
        data, starts = _column_bytes(column, array)
        ends = np.append(starts[1:], np.uint64(data.size)).tolist()
        pieces, total = [], 0
        for start, end in zip(starts[:TRIAL_RECORDS_MAX].tolist(), ends):
            if total >= TRIAL_BYTES_MAX:
                break
            piece = data[start : min(end, start + TRIAL_BYTES_MAX)]
            pieces.append(piece)
            total += piece.size
        return packed_trial(pieces)

    codec = auto_codec(os.path.join(path, column.name), "x", column.schema, trial, column.auto)
    return dataclasses.replace(
        column, schema=dataclasses.replace(column.schema, codec=codec), auto=""
    )


def _write_column(writer: Writer, column: _Column, array: Any, chunk_bytes: int) -> int:
    """Appends one batch's part of a column; returns the bytes appended."""
    data, starts = _column_bytes(column, array)
    if not starts.size:
        return 0
    if uses_dictionary(column.schema.codec) and not writer.store.has_dict():
        writer.train_dictionary(_dictionary_samples(column.schema.codec, data, starts), DICT_BYTES)
    ends = np.append(starts[1:], np.uint64(data.size))
    records_max = max(1, chunk_bytes // RECORD_COST_BYTES)
    first = 0
    while first < starts.size:
        # Records ending within chunk_bytes of the first; one at least.
        last = int(np.searchsorted(ends, starts[first] + np.uint64(chunk_bytes), side="right"))
        last = min(max(last, first + 1), first + records_max)
        base = int(starts[first])
        writer.append(data[base : int(ends[last - 1])], starts[first:last] - np.uint64(base))
        first = last
    return int(data.size)


def _dictionary_samples(codec: str, data: np.ndarray, starts: np.ndarray) -> list[np.ndarray]:
    """A first batch's bytes as dictionary samples: whole for ``zstd_dict``;
    for a shuffled dictionary codec its records (as many as training reads)
    each shuffled as that codec compresses them, as the other converters do."""
    if codec_parts(codec).element_bytes == 1:
        return [data]
    ends = np.append(starts[1:], np.uint64(data.size))
    records, taken = [], 0
    for start, end in zip(starts.tolist(), ends.tolist()):
        records.append(data[start:end])
        taken += end - start
        if taken >= SAMPLE_BUDGET_MAX:
            break
    return shuffled_samples(records, None, codec)


def _dense_values(column: _Column, array: Any) -> np.ndarray:
    """The column's values as an array ``(rows, *item_shape)``, zero-copy where
    Arrow's layout allows."""
    pa = _pyarrow()
    rows = len(array)
    leaf = array
    while True:
        leaf = _storage(leaf)
        _check_no_nulls(column, leaf)
        kind = leaf.type
        if pa.types.is_fixed_size_list(kind):
            leaf = leaf.flatten()
        elif pa.types.is_list(kind) or pa.types.is_large_list(kind):
            lengths = np.diff(leaf.offsets.to_numpy())
            if lengths.size and np.any(lengths != lengths[0]):
                raise ValueError(
                    f"column {column.source!r} has rows of different lengths where its type "
                    f"promises shape {column.schema.item_shape}"
                )
            leaf = leaf.flatten()
        else:
            break
    if pa.types.is_fixed_size_binary(leaf.type):
        width = leaf.type.byte_width
        buffer = leaf.buffers()[1]
        values = (
            np.frombuffer(buffer, dtype=np.uint8)[
                leaf.offset * width : (leaf.offset + len(leaf)) * width
            ]
            if buffer
            else np.empty(0, np.uint8)
        )
    else:
        values = leaf.to_numpy(zero_copy_only=False)
    if values.size != rows * math.prod(column.schema.item_shape):
        raise ValueError(
            f"column {column.source!r} holds {values.size} values for {rows} rows of shape "
            f"{column.schema.item_shape}"
        )
    return np.ascontiguousarray(values, dtype=column.schema.dtype).reshape(
        rows, *column.schema.item_shape
    )


def _ragged_parts(column: _Column, array: Any) -> tuple[np.ndarray, np.ndarray]:
    """The column's records packed back to back as bytes, and the byte offset
    of each record's start."""
    array = _storage(array)
    _check_no_nulls(column, array)
    if _is_bytes(array.type):
        buffers = array.buffers()
        large = _pyarrow().types.is_large_binary(array.type) or _pyarrow().types.is_large_string(
            array.type
        )
        offsets = np.frombuffer(buffers[1], dtype=np.int64 if large else np.int32)[
            array.offset : array.offset + len(array) + 1
        ]
        data = (
            np.frombuffer(buffers[2], dtype=np.uint8)
            if buffers[2] is not None
            else np.empty(0, np.uint8)
        )
        data = data[int(offsets[0]) : int(offsets[-1])]
        row_bytes = 1
    else:
        offsets = array.offsets.to_numpy()
        child = array.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
        inner = _Column(
            column.source,
            column.name,
            column.arrow_type,
            Schema("dense", column.schema.dtype, column.schema.item_shape, column.schema.codec),
        )
        data = _dense_values(inner, child).reshape(-1).view(np.uint8)
        row_bytes = column.schema.item_bytes
    starts = (offsets[:-1] - offsets[0]).astype(np.uint64) * np.uint64(row_bytes)
    return data, starts


def _storage(array: Any) -> Any:
    """An extension array's storage; other arrays as they are."""
    return array.storage if isinstance(array.type, _pyarrow().BaseExtensionType) else array


def _check_no_nulls(column: _Column, array: Any) -> None:
    if array.null_count:
        raise ValueError(
            f"column {column.source!r} has {array.null_count} null values, and a store has no "
            "missing values: fill them "
            "(pyarrow.compute.fill_null, datasets' map) or filter those rows out first; nothing "
            "was written"
        )


# ---- the column listing ---------------------------------------------------------------


@contextlib.contextmanager
def _fresh_directory(path: str) -> Iterator[None]:
    """Creates the target directory; on failure removes what this call wrote."""
    existed = os.path.isdir(path)
    if os.path.exists(path) and (not existed or os.listdir(path)):
        raise ValueError(
            f"'{path}' exists and is not an empty directory: from_arrow writes a new column "
            "directory, give a new path"
        )
    os.makedirs(path, exist_ok=True)
    try:
        yield
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        if existed:
            os.makedirs(path, exist_ok=True)
        raise


def _write_listing(path: str, plan: list[_Column], rows: int) -> None:
    body = msgpack.packb(
        {
            "format": COLUMNS_FORMAT,
            "version": COLUMNS_VERSION,
            "rows": rows,
            "columns": [
                {
                    "name": column.name,
                    "source": column.source,
                    "kind": column.schema.kind,
                    "arrow_type": column.arrow_type,
                }
                for column in plan
            ],
        },
        use_bin_type=True,
    )
    write_file_atomic(
        os.path.join(path, COLUMNS_FILE),
        msgpack.packb({"body": body, "crc32": zlib.crc32(body)}, use_bin_type=True),
    )


def read_listing(path: str) -> dict[str, Any]:
    """``columns.msgpack`` checked field by field: every name a plain
    directory inside ``path``, no duplicates, a known kind, a sane count."""
    file = os.path.join(path, COLUMNS_FILE)
    if not os.path.isfile(file):
        what = "an unfinished or failed conversion" if os.path.isdir(path) else "missing"
        raise FileNotFoundError(
            f"'{path}' is not a loaderx column directory (no {COLUMNS_FILE}; {what}): convert with "
            "loaderx.arrow.from_arrow"
        )
    with open(file, "rb") as handle:
        payload = handle.read(_COLUMNS_BYTES_MAX + 1)
    damaged = f"{file} is damaged: convert again"
    try:
        if len(payload) > _COLUMNS_BYTES_MAX:
            raise EnvelopeError(UNREADABLE, f"over {_COLUMNS_BYTES_MAX} bytes")
        listing = unpack_map(checked_body(unpack_map(payload)))
        check_header(listing, COLUMNS_FORMAT, COLUMNS_VERSION)
    except EnvelopeError as exc:
        if exc.reason in (VERSION, NEWER):
            raise ValueError(
                f"{file} has version {exc.found!r}; this loaderx reads version {COLUMNS_VERSION}: "
                "upgrade loaderx"
            ) from None
        raise ValueError(f"{damaged} ({exc})") from exc
    rows, columns = listing.get("rows"), listing.get("columns")
    if (
        not isinstance(rows, int)
        or isinstance(rows, bool)
        or rows < 0
        or not isinstance(columns, list)
        or not columns
    ):
        raise ValueError(f"{damaged} (rows or columns invalid)")
    seen = set()
    for entry in columns:
        name = entry.get("name") if isinstance(entry, dict) else None
        if (
            not isinstance(name, str)
            or not _STORE_NAME.fullmatch(name)
            or name in seen
            or entry.get("kind") not in ("dense", "ragged")
        ):
            raise ValueError(f"{damaged} (bad column entry {entry!r})")
        directory = os.path.join(path, name)
        if os.path.islink(directory) or not os.path.isdir(directory):
            raise ValueError(f"{damaged} (column {name!r} is not a directory inside it)")
        seen.add(name)
    return listing


def _pyarrow() -> Any:  # the pyarrow module
    try:
        import pyarrow  # optional dependency
    except ImportError:
        raise ImportError("loaderx.arrow needs pyarrow: pip install 'loaderx[arrow]'") from None
    return pyarrow
