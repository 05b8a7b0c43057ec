"""How the DataLoader reads one stream of a batch: dense or ragged.

A dense stream's batch is one array ``(n, *item_shape)`` filled by one native
gather into a buffer the consumer allocated. A ragged stream's batch is a
``RaggedBatch``: the n records back to back in one flat array plus offsets,
filled by one native call that looks up the lengths, writes the offsets
and gathers, into the front of a buffer the consumer allocated when it fits
(see ``RaggedReader.allocate``). Flat plus offsets, not padded: the
gather writes exactly the records' bytes, nothing is zero-filled, and
``RaggedBatch.padded()`` pads on request.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._checks import check_int
from .dataset import DenseDataset, RaggedDataset

__all__ = ["RaggedBatch"]


class RaggedBatch:
    """n variable-length records: record i is ``values[offsets[i]:offsets[i + 1]]``.

    ``values`` is ``(total_rows, *item_shape)``, ``offsets`` int64 ``(n + 1,)``
    starting at 0. ``lengths`` are the row counts, ``batch[i]`` one record (a
    view), ``padded(max_len=None, pad_value=0)`` the ``(padded, lengths)`` pair
    of ``loaderx.pad``.
    """

    __slots__ = ("values", "offsets")

    def __init__(self, values: np.ndarray, offsets: np.ndarray):
        if offsets.ndim != 1 or offsets.size < 1 or offsets[0] != 0 or offsets[-1] != len(values):
            raise ValueError(
                f"offsets must run from 0 to len(values) = {len(values)}, got {offsets!r}"
            )
        self.values = values
        self.offsets = offsets

    @classmethod
    def _trusted(cls, values: np.ndarray, offsets: np.ndarray) -> RaggedBatch:
        """A batch the readers built (offsets correct by construction): no checks,
        they cost a measurable share of a small batch."""
        batch = cls.__new__(cls)
        batch.values = values
        batch.offsets = offsets
        return batch

    @property
    def lengths(self) -> np.ndarray:
        """The row count of each record of the batch (int64, ``len(self)`` entries)."""
        return np.diff(self.offsets)

    def __len__(self) -> int:
        return self.offsets.size - 1

    def __getitem__(self, index: int) -> np.ndarray:
        start, stop = self.offsets[index], self.offsets[index + 1]
        return self.values[start:stop]

    def padded(
        self, max_len: int | None = None, pad_value: Any = 0
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(padded, lengths)``: ``(n, max_len, *item_shape)`` with ``pad_value``
        past each record (longer ones truncated), and the rows kept of each."""
        lengths = self.lengths
        # check_int: int(2.7) would truncate a float silently.
        width = int(lengths.max(initial=0)) if max_len is None else check_int("max_len", max_len, 0)
        kept = np.minimum(lengths, width)
        out = np.full(
            (len(self), width, *self.values.shape[1:]), pad_value, dtype=self.values.dtype
        )
        columns = np.arange(width)
        mask = columns < kept[:, None]
        # Row j of record i sits at values[offsets[i] + j]: take the kept rows only.
        out[mask] = self.values[(self.offsets[:-1, None] + columns)[mask]]
        return out, kept

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, RaggedBatch)
            and np.array_equal(self.offsets, other.offsets)
            and self.values.dtype == other.values.dtype
            and np.array_equal(self.values, other.values)
        )

    def __repr__(self) -> str:
        return (
            f"RaggedBatch({len(self)} records, {len(self.values)} rows of "
            f"{self.values.shape[1:]} {self.values.dtype})"
        )


class DenseReader:
    """A dense stream: the consumer allocates each batch's array (see _Pipeline)."""

    def __init__(self, dataset: DenseDataset, batch_size: int):
        self.dataset = dataset
        self.shape = (batch_size, *dataset.item_shape)

    def allocate(self) -> np.ndarray:
        return np.empty(self.shape, self.dataset.dtype)

    def read(self, indices: np.ndarray, out: np.ndarray) -> np.ndarray:
        return self.dataset.gather_into(indices, out)


class RaggedReader:
    """A ragged stream: its batch size in bytes is known only after the lengths
    lookup, so the worker allocates it."""

    def __init__(self, dataset: RaggedDataset):
        self.dataset = dataset
        self.capacity = 0

    def allocate(self) -> np.ndarray | None:
        """A buffer of the largest batch seen so far (plus a quarter), or None
        before the first. Allocated by the consumer like a dense stream's array
        and all of one size, so malloc hands the same memory back instead of
        fresh pages (which cost as much as the gather); a batch that does not
        fit allocates its own and raises the size."""
        return np.empty(self.capacity, dtype=np.uint8) if self.capacity else None

    def read(self, indices: np.ndarray, out: np.ndarray | None = None) -> RaggedBatch:
        values, offsets = self.dataset.gather_packed(indices, out)
        if out is None or values.nbytes > out.nbytes:
            size = values.nbytes
            self.capacity = max(
                self.capacity, size + size // 4
            )  # a benign race: any thread's bump will do
        return RaggedBatch._trusted(values, offsets)


def reader_for(
    dataset: DenseDataset | RaggedDataset, batch_size: int
) -> DenseReader | RaggedReader:
    """The reader of one stream, for a dataset the loader checked."""
    if isinstance(dataset, RaggedDataset):
        return RaggedReader(dataset)
    return DenseReader(dataset, batch_size)
