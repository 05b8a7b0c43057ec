"""NumPy views over zrecord stores: ``DenseDataset``, ``RaggedDataset``, ``pad``.

A loaderx store is a zrecord directory plus ``schema.msgpack`` (see
``loaderx.schema``); a sharded dataset is a directory of such stores plus a
manifest (``loaderx.sharded``), read like one store. Datasets only read: the
converters in ``loaderx.converter`` write stores.

Every batch read is one native gather straight into a fresh array (dense), or
one lengths call and one gather into one flat buffer that is split into views
(ragged). Invariant: a dataset's schema and store are of one directory (an
open that sees the directory swapped under it opens again).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar, overload

import numpy as np
import numpy.typing as npt

from ._checks import check_int, check_verify
from ._fs import readable_path
from ._indexing import int_index, is_int, record_indices
from ._remote_dataset import RemoteStore, is_remote
from .schema import (  # the names loaderx.dataset has always offered
    FORMAT_NAME as FORMAT_NAME,
)
from .schema import (
    FORMAT_VERSION as FORMAT_VERSION,
)
from .schema import (
    KINDS as KINDS,
)
from .schema import (
    SCHEMA_FILE as SCHEMA_FILE,
)
from .schema import (
    Schema as Schema,
)
from .schema import (
    StrPath as StrPath,
)
from .schema import (
    open_schema as open_schema,
)
from .schema import parse_schema
from .schema import (
    read_schema as read_schema,
)
from .schema import (
    schema_path as schema_path,
)
from .schema import (
    write_schema as write_schema,
)
from .sharded import ShardedStore, is_sharded
from .zrecord import (
    THREADS_MAX,
    CorruptStoreError,
    IndexOutOfRangeError,
    Zrecord,
    ZrecordError,
    path_identity,
)

_DatasetT = TypeVar("_DatasetT", bound="_Dataset")

__all__ = ["DenseDataset", "RaggedDataset", "Schema", "pad", "read_schema", "write_schema"]

# Native ragged gathers of one batch before giving up on a store whose
# records keep growing under it (see RaggedDataset.gather_packed).
_GATHER_ATTEMPTS = 4


# An open that sees the store's directory swapped under it (an overwrite,
# _fs.DirectorySwap) opens it again, at most this many times: each swap is a
# whole conversion, so more than a few during one open means a writer in a
# tight loop, which gets an error instead of an endless retry. (A damaged
# store costs as many extra opens before its error.)
_SWAPS_SEEN_MAX = 8

# The schema bytes the usual open reads with its store: a larger schema is
# read by the open that handles everything else (``_open_any``).
_SCHEMA_PIECE_BYTES = 4096


class _Dataset:
    """The part dense and ragged datasets share: the store and its schema.

    A dataset pickles as its path and options and opens the store again when
    unpickled, so it can go to spawn/forkserver worker processes (a torch
    ``DataLoader`` with ``num_workers``)."""

    _kind = ""

    def __init__(
        self,
        path: StrPath,
        verify: bool | None = None,
        threads: int = 0,
        *,
        cache_dir: StrPath | None = None,
        cache_bytes: int | None = None,
        storage_options: dict[str, Any] | None = None,
        _durable: bool = True,
        _source: Any = None,
    ) -> None:
        # ``_durable=False`` is for ArrayStore, which writes through the
        # dataset's store: one native open instead of a second handle.
        self.path = os.fspath(path)
        verify = check_verify(verify)
        threads = check_int("threads", threads, 0, THREADS_MAX)
        self._store: Zrecord | ShardedStore | RemoteStore
        self._remote = (cache_dir, cache_bytes, storage_options)
        if is_remote(self.path):
            self._open_remote(verify, threads, _source)
            return
        self._refuse_remote_options()
        self._open_local(verify, threads, _durable)

    @classmethod
    def _of_array(
        cls: type[_DatasetT], path: str, durable: bool
    ) -> tuple[_DatasetT, Zrecord, int] | None:
        """ArrayStore's open of one of its arrays (default options): the usual
        open of ``__init__`` without its argument checks, which a lazy load
        of many arrays would pay for each; the dataset, its store and its
        record count. None, with nothing left open, where it is not the
        usual case (the caller opens it as ``__init__`` does, which names
        what is wrong)."""
        dataset = cls.__new__(cls)
        dataset.path = path
        dataset._remote = (None, None, None)
        opened = dataset._open_usual(None, 0, durable)
        if opened is None:
            return None
        store, shape = opened
        dataset._finish_open(None, 0, shape)
        return dataset, store, shape[2]

    def _open_local(self, verify: bool | None, threads: int, durable: bool) -> None:
        """Opens the local store at ``self.path`` (checked options)."""
        opened = self._open_usual(verify, threads, durable)
        if opened is None:
            self._open_any(verify, threads, durable)
            store = self._store
            assert not isinstance(store, RemoteStore)  # a local path
            shape = (*store.layout(), len(store))
        else:
            shape = opened[1]
        self._finish_open(verify, threads, shape)

    def _finish_open(self, verify: bool | None, threads: int, shape: tuple[str, int, int]) -> None:
        """The dataset's fields, once its store is open; ``shape``: the store's
        ``layout()`` and record count, which the kind of dataset checks."""
        self._opened(verify, threads)
        try:
            self._check_opened(*shape)
        except BaseException:
            self.close()
            raise

    def _open_usual(
        self, verify: bool | None, threads: int, durable: bool
    ) -> tuple[Zrecord, tuple[str, int, int]] | None:
        """The usual open: the schema and the store, of one directory in one
        native call; returns the store and its layout and record count. None, with
        nothing left open, for anything else (no schema: a sharded dataset
        or none; a large schema; a swap or damage under way; a store of
        another kind), which ``_open_any`` sorts out and names."""
        try:
            opened = Zrecord._beside(
                self.path, SCHEMA_FILE, _SCHEMA_PIECE_BYTES, verify, threads, durable
            )
        except (ZrecordError, OSError):
            return None
        if opened is None:
            return None
        store, payload, shape = opened
        try:
            if len(payload) == _SCHEMA_PIECE_BYTES:
                raise ValueError("a schema this large is read whole by _open_any")
            schema = parse_schema(payload, self.path)
            if schema.kind != self._kind:
                raise ValueError("a store of another kind: _open_any names it")
            store._set_codec(schema.codec)
        except (ValueError, ZrecordError):
            store.close()
            return None
        except BaseException:
            store.close()
            raise
        self._store, self._schema = store, schema
        return store, shape

    def _open_any(self, verify: bool | None, threads: int, durable: bool) -> None:
        """The open of every case: the store at ``self.path``, or while a
        two-rename swap is between its renames the old directory; a sharded
        dataset; or the error that says what is there instead."""
        # A sharded dataset has no schema at its top (write_shard refuses a
        # directory that has one): a store's schema is the one look-up.
        for attempt in range(_SWAPS_SEEN_MAX + 1):
            before = path_identity(self.path)
            # Where it is missing: the old directory, mid two-rename swap.
            path = self.path if before is not None else readable_path(self.path)
            try:
                schema = read_schema(path)
                if schema is None and is_sharded(self.path):
                    # A sharded dataset reads like one store: ShardedStore has the
                    # read side of Zrecord, over one global index space.
                    self._store = ShardedStore(
                        self.path, self._kind, verify=verify, threads=threads
                    )
                    self._schema = self._store.schema
                    break
                self._schema = open_schema(path, self._kind, schema)
                self._store = Zrecord._existing_store(
                    path, self._schema.codec, verify, threads, durable
                )
            except (ZrecordError, OSError, ValueError) as exc:
                # A file gone mid-open is what a swap does to a reader of the
                # old directory (whose inode number the next swap may reuse,
                # so an unchanged identity proves nothing): open it again.
                if attempt < _SWAPS_SEEN_MAX and (
                    path_identity(self.path) != before
                    or isinstance(exc, (CorruptStoreError, FileNotFoundError))
                ):
                    continue
                raise
            # The store's handle took its directory's identity as it opened
            # (after the schema read), so the usual open stats it once.
            after = self._store.identity if path == self.path else path_identity(self.path)
            if after == before:
                break  # the schema and the store are of one directory
            self._store.close()
            if attempt == _SWAPS_SEEN_MAX:
                raise ZrecordError(
                    f"'{self.path}' was replaced {attempt + 1} times while it was being opened: "
                    "open it again when its writer is done"
                )

    def _check_opened(self, layout: str, record_bytes: int, count: int) -> None:
        """What a kind of dataset checks of the local store it opened, given
        its ``layout()`` and record count."""

    def _refuse_remote_options(self) -> None:
        if self._remote != (None, None, None):
            raise ValueError(
                f"cache_dir, cache_bytes and storage_options are for datasets in object storage "
                f"(s3://, gs://, az://, http(s)://, file:// URLs); '{self.path}' is a local path, "
                "read in place: leave them out, or give a URL"
            )

    def _open_remote(self, verify: bool | None, threads: int, source: Any) -> None:
        """A dataset in object storage: its store reads through the cache."""
        cache_dir, cache_bytes, storage_options = self._remote
        if cache_bytes is not None:
            cache_bytes = check_int("cache_bytes", cache_bytes, 1)
        self._store = RemoteStore(
            self.path,
            self._kind,
            verify,
            threads,
            cache_dir=cache_dir,
            cache_bytes=cache_bytes,
            storage_options=storage_options,
            source=source,
        )
        self._schema = self._store.schema
        self._opened(verify, threads)

    def _opened(self, verify: bool | None, threads: int) -> None:
        self.dtype = self._schema.dtype
        self.item_shape = self._schema.item_shape
        self.codec = self._schema.codec
        self._item_bytes = self._schema.item_bytes
        self._store._reopen_hint = f"{type(self).__name__}(path)"
        self._options = (verify, threads)

    def __reduce__(self) -> tuple[Any, ...]:
        if self.closed:
            raise TypeError(
                f"cannot pickle the closed {type(self).__name__} '{self.path}': pickle it while "
                "open"
            )
        if not isinstance(self._store, RemoteStore):
            return (type(self), (self.path, *self._options))
        # A remote dataset pickles as its URL and options: the other process
        # opens its own cache on the same directory (shared safely).
        cache_dir, cache_bytes, storage_options = self._remote
        options = {
            "cache_dir": cache_dir if cache_dir is not None else self._store.cache_base,
            "cache_bytes": self._store.cache_budget,
            "storage_options": storage_options,
        }
        return (_reopen, (type(self), self.path, *self._options, options))

    @property
    def schema(self) -> Schema:
        return self._schema

    @property
    def store(self) -> Zrecord | ShardedStore | RemoteStore:
        """The underlying record store, a ``Zrecord`` or for a sharded dataset
        a ``loaderx.shards.ShardedStore`` (read it, do not write through it)."""
        return self._store

    def __len__(self) -> int:
        return len(self._store)

    def refresh(self) -> int:
        """Sees records appended by other processes since open; returns len()."""
        return self._store.refresh()

    def close(self) -> None:
        self._store.close()

    @property
    def closed(self) -> bool:
        """True once ``close()`` ran."""
        return self._store.closed

    def __enter__(self: _DatasetT) -> _DatasetT:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len(self)} records"
        return (
            f"{type(self).__name__}({self.path!r}, dtype={self.dtype}, "
            f"item_shape={self.item_shape}, codec={self.codec!r}, {state})"
        )


def _reopen(
    cls: type[_Dataset], path: str, verify: bool | None, threads: int, options: dict[str, Any]
) -> _Dataset:
    """Unpickling a remote dataset: open it again with its cache options."""
    return cls(path, verify, threads, **options)


# Index arrays whose bytes are uint64 indices where in range (native byte order).
_INDEX_DTYPES = (np.dtype(np.int64), np.dtype(np.uint64))


class DenseDataset(_Dataset):
    """A dense store: every record is one item of ``item_shape`` and ``dtype``.

        ``ds[i]`` is one item; ``ds[slice | int array | list | bool mask]`` and
        ``ds.__getitems__(idxs)`` are arrays ``(n, *item_shape)`` gathered with
        one native call. Reads check record checksums where that costs little
    (compressed and ragged stores: ``Zrecord``'s default); ``verify=True``
    checks every read, ``verify=False`` none;
        ``threads`` caps the native threads of a gather (0: one per core).
    """

    _kind = "dense"

    def _check_opened(self, layout: str, record_bytes: int, count: int) -> None:
        """A store whose records do not have the schema's size is not this dense
        store (written around the converters, or damaged): refuse it on open."""
        store = self._store
        assert not isinstance(store, RemoteStore)  # its shards are checked as they open
        if layout == "fixed":
            sizes = {record_bytes}
        elif layout == "indexed" and count:
            sizes = {int(size) for size in store.lengths([0, count - 1])}
        else:
            return
        if sizes != {self._item_bytes}:
            raise ValueError(
                f"'{self.path}' holds records of {sorted(sizes)} bytes, but its schema says "
                f"{self._item_bytes} bytes ({self.dtype} items of shape {self.item_shape}): the "
                "store does not match its schema"
            )

    @property
    def shape(self) -> tuple[int, ...]:
        """``(len(self), *item_shape)``: the shape of the whole dataset as one array."""
        return (len(self), *self.item_shape)

    def gather_into(
        self, indices: Sequence[int] | npt.NDArray[np.integer[Any]], out: npt.NDArray[Any]
    ) -> npt.NDArray[Any]:
        """Decodes records ``indices`` (in range, non-negative) into ``out``, a
        writable C-contiguous array of shape ``(n, *item_shape)`` and this
        dataset's dtype, with one native call; returns ``out``."""
        count = len(indices)
        if not isinstance(out, np.ndarray):
            raise TypeError(
                f"out must be a NumPy array of dtype {self.dtype} and shape "
                f"{(count, *self.item_shape)}, got {type(out).__name__}"
            )
        if out.dtype != self.dtype or out.shape != (count, *self.item_shape):
            raise ValueError(
                f"out must have dtype {self.dtype} and shape {(count, *self.item_shape)}, "
                f"got {out.dtype} {out.shape}"
            )
        if count:
            # Without offsets the store lays equal-length records back to back
            # (and refuses a batch whose lengths differ).
            self._store.gather(indices, out)
        return out

    def _gather(self, indices: npt.NDArray[np.uint64], shape: tuple[int, ...]) -> npt.NDArray[Any]:
        out = np.empty((indices.size, *self.item_shape), dtype=self.dtype)
        self.gather_into(indices, out)
        return out.reshape((*shape, *self.item_shape))

    def __getitem__(self, key: Any) -> Any:  # an array, or one element of it for a full index
        rest = None
        if isinstance(key, tuple):
            if key and key[0] is Ellipsis:
                return self[:][key]
            key, rest = (key[0], key[1:]) if key else (slice(None), ())
        if key is Ellipsis:
            key = slice(None)
        if is_int(key):
            item = self._gather(np.array([int_index(key, len(self))], dtype=np.uint64), (1,))[0]
            return item if rest is None else item[rest]
        if rest is None:
            out = self._gather_native_checked(key)
            if out is not None:
                return out
        indices, shape = record_indices(key, len(self))
        out = self._gather(indices, shape)
        return out if rest is None else out[(slice(None),) * len(shape) + rest]

    def _gather_native_checked(self, key: Any) -> npt.NDArray[Any] | None:
        """A flat native-order int64 or uint64 index array of a local store
        (the usual sampled batch) gathered as it is: its bytes are the
        uint64 indices, and the native gather checks their range before it
        reads, so no NumPy pass converts or checks them (three passes, 150 us
        of a 10,000-row read on cold caches). None for any other key, or
        when an index is out of range as uint64 (a negative one counts from
        the end): the full conversion then reads it, or says which index is
        out of range."""
        if not (
            type(key) is np.ndarray
            and key.ndim == 1
            and key.dtype in _INDEX_DTYPES
            and key.flags.c_contiguous
            and type(self._store) is Zrecord
        ):
            return None
        try:
            return self._gather(key.view(np.uint64), key.shape)
        except IndexOutOfRangeError:
            return None

    def __getitems__(self, idxs: npt.ArrayLike) -> npt.NDArray[Any]:
        """Records ``idxs`` (a sequence of ints) as one ``(n, *item_shape)`` array."""
        indices, shape = record_indices(idxs, len(self))
        if len(shape) != 1:
            raise ValueError(f"__getitems__ takes a flat sequence of indices, got shape {shape}")
        return self._gather(indices, shape)


class RaggedDataset(_Dataset):
    """A ragged store: record i is ``rows_i`` rows of ``item_shape``.

    ``ds[i]`` is one array ``(rows_i, *item_shape)``; any other selector
    returns a list of such arrays, all views into one flat buffer filled by
    one native gather.
    """

    _kind = "ragged"

    def row_counts(self, key: Any = None) -> npt.NDArray[np.int64]:
        """The row count of each selected record (all records by default)."""
        indices, _ = record_indices(slice(None) if key is None else key, len(self))
        return self._row_counts(indices)

    def _row_counts(self, indices: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
        byte_lengths = self._store.lengths(indices).astype(np.int64)
        if self._item_bytes == 0:
            return np.zeros(indices.size, dtype=np.int64)
        rows, remainder = np.divmod(byte_lengths, self._item_bytes)
        if np.any(remainder):
            bad = int(indices[np.flatnonzero(remainder)[0]])
            raise ValueError(
                f"record {bad} of '{self.path}' is "
                f"{int(byte_lengths[np.flatnonzero(remainder)[0]])} bytes, "
                f"not a whole number of {self._item_bytes}-byte rows: the store does not match its "
                "schema"
            )
        return rows

    def _gather(self, indices: npt.NDArray[np.uint64]) -> list[npt.NDArray[Any]]:
        values, offsets = self.gather_packed(indices)
        bounds = offsets.tolist()
        return [values[start:end] for start, end in zip(bounds[:-1], bounds[1:])]

    def gather_packed(
        self,
        indices: npt.NDArray[np.uint64],
        buffer: npt.NDArray[np.uint8] | None = None,
    ) -> tuple[npt.NDArray[Any], npt.NDArray[np.int64]]:
        """Records ``indices`` (a contiguous uint64 array, in range) back to
        back: ``values`` ``(total_rows, *item_shape)`` and int64 row
        ``offsets`` (``n + 1``, record i is ``values[offsets[i]:offsets[i + 1]]``),
        from one native call (lengths, offsets and copy together). ``values``
        is the front of ``buffer`` (uint8) when the batch fits, else of a new
        array of exactly its size."""
        indices = np.ascontiguousarray(indices, dtype=np.uint64)
        if buffer is not None:
            _check_buffer(buffer)
        capacity = 0 if buffer is None else buffer.nbytes
        needed, offsets = self._store.gather_rows(indices, self._item_bytes, buffer)
        # The lengths may grow between two calls only if another thread
        # refreshes the store meanwhile: a few attempts, then give up.
        for _ in range(_GATHER_ATTEMPTS):
            if needed <= capacity:
                break
            buffer = np.empty(needed, dtype=np.uint8)
            capacity = needed
            needed, offsets = self._store.gather_rows(indices, self._item_bytes, buffer)
        else:
            raise ZrecordError(
                f"'{self.path}': the records kept growing while they were gathered; try again"
            )
        assert buffer is not None or needed == 0
        front = buffer[:needed] if buffer is not None else np.empty(0, dtype=np.uint8)
        return front.view(self.dtype).reshape(int(offsets[-1]), *self.item_shape), offsets

    @overload
    def __getitem__(self, key: int | np.integer[Any]) -> npt.NDArray[Any]: ...
    @overload
    def __getitem__(
        self, key: slice | Sequence[int] | npt.NDArray[Any]
    ) -> list[npt.NDArray[Any]]: ...

    def __getitem__(self, key: Any) -> npt.NDArray[Any] | list[npt.NDArray[Any]]:
        if is_int(key):
            index = int_index(key, len(self))
            return self._gather(np.array([index], dtype=np.uint64))[0]
        if isinstance(key, tuple) or key is Ellipsis:
            raise TypeError(
                "a RaggedDataset is indexed by records only (int, slice, int array, list or bool "
                "mask)"
            )
        indices, shape = record_indices(key, len(self))
        if len(shape) > 1:
            raise IndexError(
                f"a RaggedDataset takes a flat selector, got an index array of shape {shape}"
            )
        return self._gather(indices)

    def __getitems__(
        self, idxs: Iterable[int] | npt.NDArray[np.integer[Any]]
    ) -> list[npt.NDArray[Any]]:
        return self[list(idxs) if not isinstance(idxs, np.ndarray) else idxs]


def _check_buffer(buffer: object) -> None:
    """A gather buffer is raw bytes the records are decoded into: a writable,
    C-contiguous 1-D uint8 array (any other dtype used to fail in a reshape)."""
    if not isinstance(buffer, np.ndarray) or buffer.dtype != np.uint8:
        what = f"dtype {buffer.dtype}" if isinstance(buffer, np.ndarray) else type(buffer).__name__
        raise TypeError(
            f"buffer must be a 1-D uint8 NumPy array (raw bytes), got {what}: allocate it with "
            "np.empty(nbytes, np.uint8)"
        )
    if buffer.ndim != 1 or not buffer.flags.c_contiguous or not buffer.flags.writeable:
        raise ValueError(
            f"buffer must be a writable, C-contiguous 1-D uint8 array, got shape {buffer.shape}"
            f"{'' if buffer.flags.c_contiguous else ', not contiguous'}"
            f"{'' if buffer.flags.writeable else ', read-only'}"
        )


def pad(
    records: Iterable[npt.ArrayLike],
    max_len: int | None = None,
    pad_value: object = 0,
) -> tuple[npt.NDArray[Any], npt.NDArray[np.int64]]:
    """Pads variable-length records into one dense array.

    ``records`` is a sequence of arrays ``(rows_i, *tail)`` sharing ``tail``.
    Returns ``(padded, lengths)``: ``padded`` is ``(B, max_len, *tail)`` with
    ``pad_value`` past each record's rows, ``lengths`` the int64 row counts.
    ``max_len`` defaults to the longest record; longer records are truncated
    to it (and ``lengths`` says how many rows were kept).
    """
    arrays = [np.asarray(record) for record in records]
    if not arrays:
        raise ValueError("pad got no records: give at least one")
    for position, array in enumerate(arrays):
        if array.ndim == 0:
            raise ValueError(
                f"record {position} is a scalar: pad takes arrays with a leading row axis"
            )
    tail = arrays[0].shape[1:]
    for position, array in enumerate(arrays):
        if array.shape[1:] != tail:
            raise ValueError(
                f"record {position} has rows of shape {array.shape[1:]}, but record 0 has {tail}"
            )
    row_counts = np.array([array.shape[0] for array in arrays], dtype=np.int64)
    width = int(row_counts.max()) if max_len is None else check_int("max_len", max_len, 0)
    dtype = _common_dtype(arrays)
    padded = np.full((len(arrays), width, *tail), _pad_fill(pad_value, dtype), dtype=dtype)
    lengths = np.minimum(row_counts, width)
    for position, (array, count) in enumerate(zip(arrays, lengths.tolist())):
        padded[position, :count] = array[:count]
    return padded, lengths


def _common_dtype(arrays: list[npt.NDArray[Any]]) -> np.dtype[Any]:
    """The one dtype of the records that hold values (empty ones hold nothing to
    convert); mixed dtypes are refused rather than silently upcast (int32 and
    float64 records used to come back as float64)."""
    holding = [array for array in arrays if array.size] or arrays[:1]
    dtype = holding[0].dtype
    for position, array in enumerate(arrays):
        if array.size and array.dtype != dtype:
            raise ValueError(
                f"record {position} has dtype {array.dtype} but the others {dtype}: pad does not "
                "convert "
                "records silently; cast them to one dtype first (e.g. "
                f"[r.astype(np.{array.dtype.name}) for r in records])"
            )
    return dtype


def _pad_fill(pad_value: Any, dtype: np.dtype[Any]) -> npt.NDArray[Any]:  # Any: checked here
    """``pad_value`` as a ``dtype`` scalar; ValueError when the dtype cannot
    hold it (0.5 in an int array, -1 in a uint8 one) rather than padding with
    some other value."""
    try:
        with np.errstate(invalid="ignore", over="ignore"):  # checked below
            fill = np.array(pad_value).astype(dtype, casting="unsafe")
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValueError(
            f"pad_value {pad_value!r} cannot be stored in the records' dtype {dtype}: {exc}"
        ) from None
    if dtype.kind in "biu":
        try:
            holds = (
                fill.shape == () and bool(fill == pad_value) and float(pad_value) == int(pad_value)
            )
        except (TypeError, ValueError, OverflowError):
            holds = False
        if not holds:
            low, high = (0, 1) if dtype.kind == "b" else (np.iinfo(dtype).min, np.iinfo(dtype).max)
            raise ValueError(
                f"pad_value {pad_value!r} does not fit the records' dtype {dtype} (whole numbers "
                f"{low}..{high}): give a pad value the dtype can hold, or cast the records first"
            )
    return fill
