"""Sequence packing: variable-length token documents into rows of exactly seq_len.

Two strategies (``Packing.Strategy``):

- ``CONCAT`` (concatenate-and-split): the document stream is read in sampler
  order, concatenated, and cut into rows of ``seq_len`` tokens; a document
  that does not fit the rest of a row continues at the start of the next row
  (the next global batch if need be). Nothing is padded.
- ``FIRST_FIT``: documents stay whole (one longer than ``seq_len`` is cut
  into ``seq_len`` pieces first). Each piece goes into the first open row
  with room for it, or opens a new row; at most ``window`` rows are open, and
  opening one more closes the oldest. Rows leave in the order they close,
  padded at the end with token 0 and segment id 0.

The document stream. Documents are read ``DOCUMENT_CHUNK`` at a time: chunk c
is the sampler's step c with batch ``min(DOCUMENT_CHUNK, length)``, unsharded
(so in CYCLIC mode each cycle drops ``length % chunk`` documents, different
ones every cycle). Global batch k is the next ``G * seq_len`` tokens of that
stream (``G = batch_size * world_size`` rows) and rank r takes rows
``[r * b, (r + 1) * b)``, so the ranks' rows concatenate to the global batch.

State. The stream is sequential: where global batch k starts depends on the
lengths of every document before it. ``Packer.plan`` is therefore called in
step order (the DataLoader calls it when a worker claims a step, under its
lock; it reads only lengths, from the store's table); its state is the
position of the next token, ``{"document": P, "token": t}``: document
position P of the stream, token t inside it (FIRST_FIT places documents
whole, so its t is always 0; it adds its open rows and the closed rows not
yet handed out, a few KiB; its states saved without ``"token"`` load).
That state does not depend on the global batch, so a packed loader resumes
exactly with another world size or batch size, in every mode.

Rows come with ``segment_ids`` (1, 2, ... for the pieces of a row, in order)
and ``positions`` (0, 1, ... inside each piece; a document continued from
the previous row starts again at 0), the inputs of a block-diagonal
attention mask.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._checks import check_int, check_state_int
from ._remote_dataset import reading_step
from .dataset import RaggedDataset
from .sampler import STEP_MAX, Sampler

__all__ = ["DOCUMENT_CHUNK", "SEQ_LEN_MAX", "WINDOW_MAX", "Packing", "Strategy", "make_packer"]

DOCUMENT_CHUNK = 1024
WINDOW = 64
#: Tokens per row. The longest contexts trained today are a few million
#: tokens; 2**24 (16.7 M) is well past them, and one row of that many int32
#: tokens with its segment ids and positions is already 192 MiB.
SEQ_LEN_MAX = 1 << 24
#: Open rows of FIRST_FIT. Every piece scans the open rows for room
#: (O(window) in Python) and the checkpoint carries them: a scan of 4096
#: full rows takes 0.25 ms here, and the state stays a few MiB.
WINDOW_MAX = 4096


class Strategy(enum.Enum):
    """CONCAT: concatenate documents and cut rows, no padding; FIRST_FIT:
    documents kept whole, each in the first open row with room for it."""

    CONCAT = "concat"
    FIRST_FIT = "first_fit"


@dataclass(frozen=True)
class Packing:
    """How a DataLoader packs its one ragged token stream: rows of ``seq_len``,
    by ``strategy`` (``Packing.Strategy.CONCAT`` or ``FIRST_FIT``, whose
    ``window`` is how many rows it keeps open)."""

    seq_len: int
    strategy: Strategy = Strategy.CONCAT
    window: int = WINDOW

    Strategy = Strategy

    def __post_init__(self) -> None:
        for name, high in (("seq_len", SEQ_LEN_MAX), ("window", WINDOW_MAX)):
            object.__setattr__(self, name, check_int(name, getattr(self, name), 1, high))
        try:
            object.__setattr__(self, "strategy", Strategy(self.strategy))
        except ValueError:
            raise ValueError(
                f"unknown packing strategy {self.strategy!r}: use Packing.Strategy.CONCAT or "
                "FIRST_FIT"
            ) from None


def make_packer(
    packing: Packing,
    name: str,
    dataset: RaggedDataset,
    sampler: Sampler,
) -> _ConcatPacker | _FirstFitPacker:
    """The packer of ``packing.strategy`` for one ragged stream and this rank."""
    kind = _ConcatPacker if packing.strategy is Strategy.CONCAT else _FirstFitPacker
    return kind(packing, name, dataset, sampler)


class _Documents:
    """The document stream: sampler steps of ``chunk`` documents, with each
    chunk's token counts (one lengths lookup per chunk, the last one cached)."""

    def __init__(self, dataset: RaggedDataset, sampler: Sampler):
        self.dataset = dataset
        self.length = sampler.length
        self.chunk = min(DOCUMENT_CHUNK, self.length)
        self.sampler = sampler.with_batch_size(self.chunk)
        self.cached: tuple[int, Any, Any] = (
            -1,
            None,
            None,
        )  # chunk number, its indices, their token counts

    def chunk_at(self, position: int) -> tuple[np.ndarray, np.ndarray, int]:
        """Indices and token counts of the chunk holding document ``position``, and
        that document's place in it."""
        number, place = divmod(position, self.chunk)
        if self.cached[0] != number:
            indices = self.sampler.batch(number)
            with reading_step(number):  # a remote cache plans by chunk (DataLoader)
                self.cached = (number, indices, self.dataset._row_counts(indices))
        return self.cached[1], self.cached[2], place

    def empty_error(self) -> ValueError:
        return ValueError(
            f"every document of '{self.dataset.path}' is empty: there are no tokens to pack"
        )


class _Packer:
    """What both strategies share: the rank's rows, the state checks."""

    def __init__(self, packing: Packing, name: str, dataset: RaggedDataset, sampler: Sampler):
        self.name = name
        self.packing = packing
        self.seq_len = int(packing.seq_len)
        self.dataset = dataset
        rank, world_size = sampler.shard
        self.share = sampler.batch_size
        self.rows_global = sampler.batch_size * world_size
        self.first_row = rank * sampler.batch_size
        self.documents = _Documents(dataset, sampler)
        self.document = 0

    def _config(self) -> dict[str, Any]:
        return {"strategy": self.packing.strategy.value, "seq_len": self.seq_len}

    def _check_state(self, state: object, keys: tuple[str, ...]) -> None:
        if not isinstance(state, dict):
            raise ValueError(f"state packing must be a dict, got {type(state).__name__}")
        mine = self._config()
        theirs = {key: state.get(key) for key in mine}
        if theirs != mine:
            raise ValueError(
                f"state was packed with {theirs}, this loader packs with {mine}: they must match"
            )
        # Positions are bounded like sampler steps (uint64): past that, the
        # document's chunk is a step the sampler cannot draw.
        for key in keys:
            check_state_int(f"state packing {key}", state.get(key), STEP_MAX)

    def chunk_of(self, state: dict[str, Any]) -> int:
        """The chunk of the next document of ``state``: a packed loader's remote
        cache is planned by chunks, the order in which documents are read."""
        return int(state["document"]) // self.documents.chunk

    def planned_reads(self, chunk: int) -> np.ndarray:
        """The documents of chunk ``chunk`` (a pure function of the chunk number)."""
        return self.documents.sampler.batch(chunk)

    def _gather(self, indices: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Documents ``indices`` whole, back to back, in one native gather; and their offsets."""
        offsets = np.zeros(indices.size + 1, dtype=np.uint64)
        np.cumsum(lengths, out=offsets[1:])
        flat = np.empty(int(offsets[-1]), dtype=self.dataset.dtype)
        if flat.size:
            self.dataset.store.gather(
                indices, flat, offsets[:-1] * np.uint64(self.dataset.dtype.itemsize)
            )
        return flat, offsets


class _ConcatPlan:
    """One step of this rank: documents to gather, the tokens to skip at the
    front of the first, the piece bounds (in row tokens), and the state after."""

    __slots__ = ("indices", "lengths", "skip", "piece_starts", "state_after")

    def __init__(
        self,
        indices: np.ndarray,
        lengths: np.ndarray,
        skip: int,
        piece_starts: np.ndarray,
        state_after: dict[str, Any],
    ) -> None:
        self.indices = indices
        self.lengths = lengths
        self.skip = skip
        self.piece_starts = piece_starts
        self.state_after = state_after


class _ConcatPacker(_Packer):
    """Concatenate-and-split (see the module doc)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.token = 0

    def state(self) -> dict[str, Any]:
        return {**self._config(), "document": self.document, "token": self.token}

    def load(self, state: Any) -> None:  # Any: checked here
        self._check_state(state, ("document", "token"))
        self.document, self.token = int(state["document"]), int(state["token"])

    def plan(self) -> _ConcatPlan:
        """The next global batch's pieces, cut to this rank's rows; advances the state."""
        indices, starts, counts, lengths = self._take(self.rows_global * self.seq_len)
        ends = np.cumsum(counts)
        low, high = self.first_row * self.seq_len, (self.first_row + self.share) * self.seq_len
        first, last = (
            int(np.searchsorted(ends, low, side="right")),
            int(np.searchsorted(ends, high, side="left")),
        )
        mine = slice(first, last + 1)
        piece_starts = np.maximum(ends[mine] - counts[mine], low) - low
        skip = int(starts[first] + (low - (ends[first] - counts[first])))
        return _ConcatPlan(indices[mine], lengths[mine], skip, piece_starts, self.state())

    def _take(self, need: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The next ``need`` tokens as pieces: document index, first token, token
        count, and the document's whole length (empty documents left out)."""
        parts_index: list[np.ndarray] = []
        parts_start: list[np.ndarray] = []
        parts_count: list[np.ndarray] = []
        lengths: list[np.ndarray] = []
        empty_run = 0
        while need > 0:
            indices, tokens, position = self.documents.chunk_at(self.document)
            available = tokens[position:].astype(np.int64)
            available[0] -= self.token
            total = np.cumsum(available)
            end = int(np.searchsorted(total, need)) if total[-1] >= need else available.size - 1
            counts = available[: end + 1].copy()
            if total[end] > need:
                counts[-1] -= total[end] - need
            starts = np.zeros(end + 1, dtype=np.int64)
            starts[0] = self.token
            parts_index.append(indices[position : position + end + 1])
            parts_start.append(starts)
            parts_count.append(counts)
            lengths.append(tokens[position : position + end + 1])
            need -= int(counts.sum())
            empty_run = 0 if counts.any() else empty_run + counts.size
            if empty_run > self.documents.length:
                raise self.documents.empty_error()
            finished = starts[-1] + counts[-1] == tokens[position + end]
            self.document += end + 1 if finished else end
            self.token = 0 if finished else int(starts[-1] + counts[-1])
        counts = np.concatenate(parts_count)
        keep = counts > 0
        return (
            np.concatenate(parts_index)[keep],
            np.concatenate(parts_start)[keep],
            counts[keep],
            np.concatenate(lengths)[keep],
        )

    def read(self, plan: _ConcatPlan) -> dict[str, np.ndarray]:
        """This rank's rows: the stream's tokens, ``segment_ids`` and ``positions``,
        each ``(batch_size, seq_len)``; the rows are one slice of the gathered
        documents, as consecutive pieces are consecutive documents."""
        with reading_step(self.chunk_of(plan.state_after)):
            flat, _ = self._gather(plan.indices, plan.lengths)
        size = self.share * self.seq_len
        tokens = flat[plan.skip : plan.skip + size].reshape(self.share, self.seq_len)
        segment_ids, positions = _segments(plan.piece_starts, self.share, self.seq_len)
        return {self.name: tokens, "segment_ids": segment_ids, "positions": positions}


def _segments(piece_starts: np.ndarray, rows: int, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Segment ids (1-based per row) and positions (0-based per segment) for
    rows cut at every piece start and every row start."""
    size = rows * seq_len
    starts = np.union1d(piece_starts, np.arange(0, size, seq_len))
    lengths = np.diff(np.append(starts, size))
    row_of = starts // seq_len
    first_in_row = np.searchsorted(row_of, row_of, side="left")
    ids = (np.arange(starts.size) - first_in_row + 1).astype(np.int32)
    segment_ids = np.repeat(ids, lengths).reshape(rows, seq_len)
    positions = (
        (np.arange(size) - np.repeat(starts, lengths)).astype(np.int32).reshape(rows, seq_len)
    )
    return segment_ids, positions


class _RowsPlan:
    """One step of this rank under FIRST_FIT: its rows, each a flat list of
    (document index, first token, count) triples, and the state after."""

    __slots__ = ("rows", "state_after")

    def __init__(self, rows: list[list[int]], state_after: dict[str, Any]) -> None:
        self.rows = rows
        self.state_after = state_after


class _FirstFitPacker(_Packer):
    """First-fit over a window of open rows (see the module doc). A row is a
    flat list ``[index, start, count, index, start, count, ...]``; ``free``
    holds the room left in each open row."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.window = int(self.packing.window)
        self.open: list[list[int]] = []
        self.free: list[int] = []
        self.ready: deque[list[int]] = deque()

    def _config(self) -> dict[str, Any]:
        return {**super()._config(), "window": self.window}

    def state(self) -> dict[str, Any]:
        # Documents are placed whole, so the next token is always the first
        # of the next document: "token" is 0, kept so that every packing
        # state has the same position keys.
        return {
            **self._config(),
            "document": self.document,
            "token": 0,
            "open": [list(row) for row in self.open],
            "ready": [list(row) for row in self.ready],
        }

    def load(self, state: Any) -> None:  # Any: checked here
        if isinstance(state, dict) and "token" not in state:
            state = {**state, "token": 0}  # saved before FIRST_FIT states held it
        self._check_state(state, ("document", "token"))
        if state["token"] != 0:
            raise ValueError(
                "state packing token must be 0 for FIRST_FIT (documents are placed whole), got "
                f"{state['token']!r}"
            )
        rows = {key: state.get(key) for key in ("open", "ready")}
        for key, value in rows.items():
            if not isinstance(value, list) or not all(_is_row(row, self.seq_len) for row in value):
                raise ValueError(
                    f"state packing {key} must be a list of rows of (index, start, count) triples"
                )
        if len(rows["open"]) > self.window:
            raise ValueError(
                f"state packing holds {len(rows['open'])} open rows, more than the window "
                f"{self.window}"
            )
        self.document = int(state["document"])
        self.open = [list(map(int, row)) for row in rows["open"]]
        self.free = [self.seq_len - sum(row[2::3]) for row in self.open]
        self.ready = deque(list(map(int, row)) for row in rows["ready"])

    def plan(self) -> _RowsPlan:
        empty_run = 0
        while len(self.ready) < self.rows_global:
            empty_run = 0 if self._place_next_document() else empty_run + 1
            if empty_run > self.documents.length:
                raise self.documents.empty_error()
        rows = [self.ready.popleft() for _ in range(self.rows_global)]
        return _RowsPlan(rows[self.first_row : self.first_row + self.share], self.state())

    def _place_next_document(self) -> int:
        """Places the next document's pieces; returns its token count."""
        indices, tokens, place = self.documents.chunk_at(self.document)
        self.document += 1
        index, length = int(indices[place]), int(tokens[place])
        for start in range(0, length, self.seq_len):
            self._place(index, start, min(self.seq_len, length - start))
        return length

    def _place(self, index: int, start: int, count: int) -> None:
        row = next((number for number, room in enumerate(self.free) if room >= count), None)
        if row is None:
            self.open.append([])
            self.free.append(self.seq_len)
            row = len(self.open) - 1
        self.open[row] += (index, start, count)
        self.free[row] -= count
        if self.free[row] == 0:  # nothing more fits: hand it out now
            self._close(row)
        elif len(self.open) > self.window:
            self._close(0)

    def _close(self, row: int) -> None:
        self.ready.append(self.open.pop(row))
        self.free.pop(row)

    def read(self, plan: _RowsPlan) -> dict[str, np.ndarray]:
        """This rank's rows from one gather of the documents they hold (each once)."""
        pieces = np.array(
            [triple for row in plan.rows for triple in zip(row[0::3], row[1::3], row[2::3])],
            dtype=np.int64,
        ).reshape(-1, 3)
        row_of = np.repeat(np.arange(len(plan.rows)), [len(row) // 3 for row in plan.rows])
        unique, inverse = np.unique(pieces[:, 0], return_inverse=True)
        with reading_step(self.chunk_of(plan.state_after)):
            lengths = self.dataset._row_counts(unique.astype(np.uint64))
            flat, offsets = self._gather(unique.astype(np.uint64), lengths)
        counts = pieces[:, 2]
        column = np.cumsum(counts) - counts  # the piece's start column within its row
        first_of_row = np.searchsorted(row_of, row_of, side="left")
        column -= column[first_of_row]
        within = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        target = np.repeat(row_of * self.seq_len + column, counts) + within
        source = np.repeat(offsets[inverse].astype(np.int64) + pieces[:, 1], counts) + within
        size = self.share * self.seq_len
        tokens = np.zeros(size, dtype=self.dataset.dtype)
        tokens[target] = flat[source]
        segment_ids = np.zeros(size, dtype=np.int32)
        segment_ids[target] = np.repeat(
            (np.arange(len(pieces)) - first_of_row + 1).astype(np.int32), counts
        )
        positions = np.zeros(size, dtype=np.int32)
        positions[target] = within
        shape = (self.share, self.seq_len)
        return {
            self.name: tokens.reshape(shape),
            "segment_ids": segment_ids.reshape(shape),
            "positions": positions.reshape(shape),
        }


def _is_row(row: object, seq_len: int) -> bool:
    if (
        not isinstance(row, list)
        or len(row) % 3
        or not all(
            isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 0
            for value in row
        )
    ):
        return False
    return 0 < sum(row[2::3]) <= seq_len and all(count > 0 for count in row[2::3])
