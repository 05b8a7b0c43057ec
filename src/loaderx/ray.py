"""Ray Data integration (the ``[ray]`` extra): convert a ``ray.data.Dataset``
to sharded loaderx datasets in parallel, and read loaderx datasets back as a
``ray.data.Dataset``.

``write_dataset(ds, path)`` runs a Ray ``Datasink``: every Ray write task
writes shard ``task_idx`` of one sharded dataset per column,
``path/<column>/shard-k``, with ``loaderx.shards.write_shard``; the driver
then commits each column. Ray is told to preserve block order for the write,
so task ``k`` holds the k-th rows of the dataset and the result is the same on
every run. Column types map to streams by their Arrow type:

- numbers and booleans, fixed-size lists and Ray tensor columns: dense
  records (one item of the row's shape);
- lists of numbers (token ids): ragged records of that dtype;
- strings and binary: ragged ``uint8`` records (UTF-8 for strings);
- Ray variable-shaped tensor columns: ragged records of rows of the trailing
  shape.

``read_dataset(path)`` is a Ray ``Datasource`` over the columns written so
(or one loaderx dataset, read as column ``data``): read tasks cover
contiguous row ranges and gather them natively.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

try:
    import pyarrow as pa
    import ray
    from ray.data import Datasink, Datasource, ReadTask
    from ray.data.block import BlockAccessor, BlockMetadata
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(f"loaderx.ray needs Ray Data: pip install 'loaderx[ray]' ({exc})") from exc

from . import shards
from ._checks import check_flag
from ._remote import is_remote
from ._upload import is_committed, shard_schema, shard_uploaded
from .dataset import DenseDataset, RaggedDataset
from .schema import StrPath, read_schema

__all__ = ["LoaderxDatasink", "LoaderxDatasource", "read_dataset", "write_dataset"]

_READ_BLOCK_BYTES = 64 << 20


# ---- writing --------------------------------------------------------------------


def write_dataset(
    dataset: ray.data.Dataset,
    path: StrPath,
    columns: Sequence[str] | None = None,
    codec: str | dict[str, str] = "zstd",
    resume: bool = False,
    concurrency: int | None = None,
    *,
    storage_options: dict[str, Any] | None = None,
    staging_dir: StrPath | None = None,
) -> dict[str, int]:
    """Writes ``dataset`` (its ``columns``, all by default) to ``path/<column>``,
    one sharded loaderx dataset per column, one shard per Ray write task, in
    parallel; returns ``{column: rows}``.

    ``codec`` applies to every column (or give ``{column: codec}``).
    ``concurrency`` caps the write tasks running at once (Ray's default
    otherwise). A directory holding shards of an unfinished conversion is
    refused unless ``resume=True``, which keeps every shard already complete
    in all columns (run the same pipeline again); a committed column is
    never overwritten.

    ``path`` may be a URL (``s3://...``; "Writing to object storage"): each
    task stages its shard in ``staging_dir`` (by default under the cache
    directory of the worker's machine), uploads and checks it, and the
    driver uploads each column's manifest last. ``storage_options`` go to
    every task (credentials from the environment are the workers' own).
    """
    path = os.fspath(path)
    if not is_remote(path):
        path = os.path.abspath(path)  # Ray workers run in another directory
    remote = {"storage_options": storage_options} if is_remote(path) else {}
    resume = check_flag("resume", resume)
    names = list(columns) if columns is not None else list(dataset.columns())
    if not names:
        raise ValueError("the dataset has no columns to write")
    for name in names:
        if not name or name.startswith(".") or "/" in name or "\x00" in name:
            raise ValueError(
                f"column {name!r} cannot be a directory name: rename it (dataset.rename_columns)"
            )
    _check_target(path, names, resume, remote)
    sink = LoaderxDatasink(path, names, codec, storage_options, staging_dir)
    options = dataset.context.execution_options
    preserved = options.preserve_order
    options.preserve_order = True  # task k gets the k-th blocks: a deterministic manifest
    try:
        dataset.select_columns(names).write_datasink(sink, concurrency=concurrency)
    finally:
        options.preserve_order = preserved
    return sink.rows


def _column(path: str, name: str) -> str:
    return f"{path.rstrip('/')}/{name}" if is_remote(path) else os.path.join(path, name)


def _check_target(path: str, names: list[str], resume: bool, remote: dict[str, Any]) -> None:
    for name in names:
        column_dir = _column(path, name)
        committed = (
            is_committed(column_dir, remote["storage_options"])
            if remote
            else shards.is_sharded(column_dir)
        )
        if committed:
            raise FileExistsError(
                f"'{column_dir}' is a committed loaderx dataset: write to a new directory"
            )
        if shards.written_shards(column_dir, **remote) and not resume:
            raise FileExistsError(
                f"'{column_dir}' holds shards of an unfinished conversion: pass resume=True to "
                "keep "
                "them and write the rest (with the same pipeline), or delete the directory"
            )


class LoaderxDatasink(Datasink):
    """Writes each Ray write task's blocks as shard ``task_idx`` of every column."""

    def __init__(
        self,
        path: str,
        columns: list[str],
        codec: str | dict[str, str],
        storage_options: dict[str, Any] | None = None,
        staging_dir: StrPath | None = None,
    ) -> None:
        self.path = path
        self.columns = columns
        # Remote targets only: where a task stages its shard, the store's options.
        self.remote: dict[str, Any] = (
            {"storage_options": storage_options} if is_remote(path) else {}
        )
        self.staging: dict[str, Any] = {"staging_dir": staging_dir} if is_remote(path) else {}
        self.codecs = codec if isinstance(codec, dict) else dict.fromkeys(columns, codec)
        self.rows: dict[str, int] = {}

    def write(self, blocks: Iterable[Any], ctx: Any) -> tuple[int, int | None]:
        k = ctx.task_idx
        tables = [BlockAccessor.for_block(block).to_arrow() for block in blocks]
        tables = [table for table in tables if table.num_rows] or tables[:1]
        if not tables:
            return (k, None)
        if all(self._uploaded(_column(self.path, name), k) for name in self.columns):
            return (k, sum(table.num_rows for table in tables))  # resumed: kept from an earlier run
        table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        for name in self.columns:
            data, schema = column_records(table.column(name), name)
            shards.write_shard(
                _column(self.path, name),
                k,
                data,
                codec=self.codecs[name],
                schema=schema,
                overwrite=True,
                **self.remote,
                **self.staging,
            )
        return (k, table.num_rows)

    def _uploaded(self, column_dir: str, k: int) -> bool:
        """Whether shard k of the column is complete (remote: this shard's
        objects only, so N tasks do not each list all N shards)."""
        if self.remote:
            return shard_uploaded(column_dir, k, self.remote["storage_options"])
        return shards.shard_name(k) in _complete(column_dir, self.remote)

    def on_write_complete(self, write_result: Any) -> None:
        written = dict(write_result.write_returns)
        if not written:
            raise ValueError("the Ray dataset produced no blocks: nothing to write")
        count = max(written) + 1
        for name in self.columns:
            column_dir = _column(self.path, name)
            for k in range(count):
                if written.get(k) is None:
                    _write_empty_shard(column_dir, k, self.remote, self.staging)
            self.rows[name] = shards.commit(column_dir, shard_count=count, **self.remote)


def _complete(column_dir: str, remote: dict[str, Any]) -> set[str]:
    return {shards.shard_name(k) for k in shards.written_shards(column_dir, **remote)}


def _write_empty_shard(
    column_dir: str, k: int, remote: dict[str, Any], staging: dict[str, Any]
) -> None:
    """A task that got no blocks still owns shard k: an empty one keeps the
    numbering contiguous. Its schema is the column's first written shard's."""
    if shards.shard_name(k) in _complete(column_dir, remote):
        return
    present = shards.written_shards(column_dir, **remote)
    if not present:
        raise ValueError(f"no shard of '{column_dir}' was written: the dataset is empty")
    schema = (
        shard_schema(column_dir, present[0], remote["storage_options"])
        if remote
        else read_schema(os.path.join(column_dir, shards.shard_name(present[0])))
    )
    assert schema is not None  # written_shards lists only shards with a schema file
    empty: np.ndarray | list[Any] = (
        np.empty((0, *schema.item_shape), dtype=schema.dtype) if schema.kind == "dense" else []
    )
    shards.write_shard(
        column_dir,
        k,
        empty,
        codec=schema.codec,
        schema={"dtype": schema.dtype, "item_shape": schema.item_shape},
        **remote,
        **staging,
    )


def column_records(column: pa.ChunkedArray, name: str) -> tuple[Any, dict[str, Any] | None]:
    """A column as what ``write_shard`` takes: a dense array, or a list of
    ragged records plus the schema that types an empty list."""
    kind = column.type
    if column.null_count:
        raise ValueError(
            f"column {name!r} has {column.null_count} nulls: a loaderx stream has no nulls; fill "
            "or drop them first"
        )
    if (
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
    ):
        records = [
            value.encode() if isinstance(value, str) else value for value in column.to_pylist()
        ]
        return records, {"dtype": np.uint8, "item_shape": ()}
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return _list_records(column.combine_chunks(), name)
    if pa.types.is_fixed_size_list(kind):
        flat = column.combine_chunks().flatten().to_numpy(zero_copy_only=False)
        return flat.reshape(len(column), kind.list_size), None
    if isinstance(kind, pa.ExtensionType):
        array = BlockAccessor.for_block(pa.table({name: column})).to_numpy()[name]
        if array.dtype != object:
            return array, None
        records = [np.asarray(item) for item in array]
        if not records:
            raise ValueError(
                f"column {name!r} is an empty variable-shaped tensor column: its dtype is unknown"
            )
        return records, None
    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
        return column.to_numpy(), None
    raise TypeError(
        f"column {name!r} has Arrow type {kind}, which loaderx cannot store: convert it to "
        "numbers, lists of numbers, strings or binary"
    )


def _list_records(array: pa.ListArray, name: str) -> tuple[list[np.ndarray], dict[str, Any]]:
    values = array.flatten()
    if values.null_count:
        raise ValueError(f"column {name!r} has nulls inside its lists: fill or drop them first")
    if not (
        pa.types.is_integer(values.type)
        or pa.types.is_floating(values.type)
        or pa.types.is_boolean(values.type)
    ):
        raise TypeError(
            f"column {name!r} is a list of {values.type}: loaderx stores lists of numbers as "
            "ragged records"
        )
    flat = values.to_numpy(zero_copy_only=False)
    offsets = array.offsets.to_numpy()
    starts = offsets[:-1] - offsets[0]
    ends = offsets[1:] - offsets[0]
    records = [flat[start:end] for start, end in zip(starts.tolist(), ends.tolist())]
    return records, {"dtype": flat.dtype, "item_shape": ()}


# ---- reading --------------------------------------------------------------------------


def read_dataset(
    path: StrPath,
    columns: Sequence[str] | None = None,
    override_num_blocks: int | None = None,
) -> ray.data.Dataset:
    """``path`` (written by ``write_dataset``: one loaderx dataset per column
    directory; or a single loaderx dataset, read as column ``data``) as a
    ``ray.data.Dataset``, rows in order."""
    return ray.data.read_datasource(
        LoaderxDatasource(path, columns), override_num_blocks=override_num_blocks
    )


class LoaderxDatasource(Datasource):
    """Reads loaderx datasets (single stores or sharded) as Ray blocks: each
    read task gathers a contiguous range of rows from every column."""

    def __init__(self, path: StrPath, columns: Sequence[str] | None = None) -> None:
        self.path = os.path.abspath(os.fspath(path))  # read tasks run in another directory
        self.columns = _column_paths(self.path, columns)
        self.row_count, self.row_bytes = _measure(self.columns)

    def estimate_inmemory_data_size(self) -> int:
        return self.row_count * self.row_bytes

    def get_read_tasks(
        self,
        parallelism: int,
        per_task_row_limit: int | None = None,
        data_context: Any = None,
    ) -> list[Any]:
        task_count = max(1, min(parallelism, self.row_count))
        bounds = np.linspace(0, self.row_count, task_count + 1).astype(np.int64).tolist()
        rows_per_block = max(1, _READ_BLOCK_BYTES // max(1, self.row_bytes))
        tasks = []
        for start, end in zip(bounds[:-1], bounds[1:]):
            metadata = BlockMetadata(
                num_rows=end - start,
                size_bytes=(end - start) * self.row_bytes,
                input_files=None,
                exec_stats=None,
            )
            read = _RangeReader(self.columns, start, end, rows_per_block)
            tasks.append(ReadTask(read, metadata, per_task_row_limit=per_task_row_limit))
        return tasks


def _column_paths(path: str, columns: Sequence[str] | None) -> dict[str, str]:
    if shards.is_sharded(path) or read_schema(path) is not None:
        found = {"data": path}
    elif os.path.isdir(path):
        found = {
            entry: os.path.join(path, entry)
            for entry in sorted(os.listdir(path))
            if shards.is_sharded(os.path.join(path, entry))
            or read_schema(os.path.join(path, entry)) is not None
        }
    else:
        raise FileNotFoundError(f"no loaderx dataset at '{path}'")
    if not found:
        raise FileNotFoundError(
            f"'{path}' holds no loaderx datasets (one directory per column, as write_dataset "
            "writes)"
        )
    if columns is None:
        return found
    missing = [name for name in columns if name not in found]
    if missing:
        raise ValueError(f"'{path}' has no column {missing[0]!r}; it has {sorted(found)}")
    return {name: found[name] for name in columns}


def _open(path: str) -> DenseDataset | RaggedDataset:
    schema = shards.read_manifest(path).schema if shards.is_sharded(path) else read_schema(path)
    assert schema is not None  # _column_paths lists only datasets
    return (DenseDataset if schema.kind == "dense" else RaggedDataset)(path)


def _measure(columns: dict[str, str]) -> tuple[int, int]:
    """The common row count of the columns and an estimate of a row's bytes."""
    counts: dict[str, int] = {}
    row_bytes = 0
    for name, path in columns.items():
        with _open(path) as dataset:
            counts[name] = len(dataset)
            if isinstance(dataset, DenseDataset):
                row_bytes += dataset.schema.item_bytes
            elif len(dataset):
                sample = dataset.store.lengths(
                    np.linspace(0, len(dataset) - 1, 64).astype(np.uint64)
                )
                row_bytes += int(sample.mean())
    if len(set(counts.values())) > 1:
        raise ValueError(f"the columns have different row counts {counts}: they are not one table")
    return next(iter(counts.values())), max(1, row_bytes)


class _RangeReader:
    """Rows ``start..end`` of every column, as Arrow blocks of bounded size."""

    def __init__(self, columns: dict[str, str], start: int, end: int, rows_per_block: int) -> None:
        self.columns, self.start, self.end, self.rows_per_block = (
            columns,
            start,
            end,
            rows_per_block,
        )

    def __call__(self) -> Iterator[Any]:
        datasets = {name: _open(path) for name, path in self.columns.items()}
        try:
            for first in range(self.start, self.end, self.rows_per_block):
                rows = slice(first, min(self.end, first + self.rows_per_block))
                yield pa.table(
                    {name: _to_arrow(dataset, dataset[rows]) for name, dataset in datasets.items()}
                )
        finally:
            for dataset in datasets.values():
                dataset.close()


def _to_arrow(dataset: DenseDataset | RaggedDataset, values: Any) -> Any:  # a pyarrow array
    """A column of a block: plain values, Ray tensors, lists or variable-shaped tensors."""
    # optional dependency
    from ray.data.extensions import ArrowTensorArray, ArrowVariableShapedTensorArray

    if isinstance(dataset, DenseDataset):
        return pa.array(values) if values.ndim == 1 else ArrowTensorArray.from_numpy(values)
    if dataset.item_shape:
        records = np.empty(len(values), dtype=object)
        records[:] = values
        return ArrowVariableShapedTensorArray.from_numpy(records)
    lengths = np.fromiter((len(value) for value in values), dtype=np.int64, count=len(values))
    offsets = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.concatenate(values) if values else np.empty(0, dtype=dataset.dtype)
    return pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(flat))
