"""Sequence packing: variable-length token documents into rows of exactly seq_len.

Strategy ``"concat"`` (concatenate-and-split): the document stream is read in
sampler order, concatenated, and cut into rows of ``seq_len`` tokens; a
document that does not fit the rest of a row continues at the start of the
next row (the next global batch if need be). Nothing is padded.

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
position P of the stream, token t inside it. That state does not depend on
the global batch, so a packed loader resumes exactly with another world
size or batch size, in every mode.

Rows come with ``segment_ids`` (1, 2, ... for the pieces of a row, in order)
and ``positions`` (0, 1, ... inside each piece; a document continued from
the previous row starts again at 0), the inputs of a block-diagonal
attention mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .dataset import RaggedDataset
from .sampler import Sampler

__all__ = ["DOCUMENT_CHUNK", "Packing", "STRATEGIES"]

DOCUMENT_CHUNK = 1024
STRATEGIES = ("concat",)


@dataclass(frozen=True)
class Packing:
    """How a DataLoader packs its one ragged token stream: rows of ``seq_len``."""

    seq_len: int
    strategy: str = "concat"

    def __post_init__(self):
        if isinstance(self.seq_len, bool) or not isinstance(self.seq_len, (int, np.integer)) or self.seq_len < 1:
            raise ValueError(f"seq_len must be a positive int, got {self.seq_len!r}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"unknown packing strategy {self.strategy!r}: use one of {STRATEGIES}")


class _Plan:
    """One step of this rank: documents to gather, the tokens to skip at the
    front of the first, the piece bounds (in row tokens), and the state after."""

    __slots__ = ("indices", "lengths", "skip", "piece_starts", "state_after")

    def __init__(self, indices, lengths, skip, piece_starts, state_after):
        self.indices = indices
        self.lengths = lengths
        self.skip = skip
        self.piece_starts = piece_starts
        self.state_after = state_after


class Packer:
    """Plans packed steps in order and builds their rows (see the module doc)."""

    def __init__(self, packing: Packing, name: str, dataset: RaggedDataset, sampler: Sampler):
        self.name = name
        self.seq_len = int(packing.seq_len)
        self.strategy = packing.strategy
        self.dataset = dataset
        rank, world_size = sampler.shard
        self.share = sampler.batch_size
        self.rows_global = sampler.batch_size * world_size
        self.first_row = rank * sampler.batch_size
        self.length = sampler.length
        self.chunk = min(DOCUMENT_CHUNK, self.length)
        self.documents = Sampler(self.length, self.chunk, sampler.mode, seed=sampler.seed)
        self.cached = (-1, None, None)  # chunk number, its indices, their token counts
        self.document = 0
        self.token = 0

    # -- state ---------------------------------------------------------------------

    def state(self) -> dict:
        return {"strategy": self.strategy, "seq_len": self.seq_len, "document": self.document, "token": self.token}

    def load(self, state) -> None:
        if not isinstance(state, dict):
            raise ValueError(f"state packing must be a dict, got {type(state).__name__}")
        mine = {"strategy": self.strategy, "seq_len": self.seq_len}
        theirs = {key: state.get(key) for key in mine}
        if theirs != mine:
            raise ValueError(f"state was packed with {theirs}, this loader packs with {mine}: they must match")
        for key in ("document", "token"):
            value = state.get(key)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise ValueError(f"state packing {key} must be a non-negative int, got {value!r}")
        self.document, self.token = int(state["document"]), int(state["token"])

    # -- planning (in step order) -------------------------------------------------------

    def _chunk(self, number: int):
        if self.cached[0] != number:
            indices = self.documents.batch(number)
            tokens = self.dataset._row_counts(indices)
            self.cached = (number, indices, tokens)
        return self.cached[1], self.cached[2]

    def plan(self) -> _Plan:
        """The next global batch's pieces, cut to this rank's rows; advances the state."""
        indices, starts, counts, lengths = self._take(self.rows_global * self.seq_len)
        ends = np.cumsum(counts)
        low, high = self.first_row * self.seq_len, (self.first_row + self.share) * self.seq_len
        first, last = int(np.searchsorted(ends, low, side="right")), int(np.searchsorted(ends, high, side="left"))
        mine = slice(first, last + 1)
        piece_starts = np.maximum(ends[mine] - counts[mine], low) - low
        skip = int(starts[first] + (low - (ends[first] - counts[first])))
        return _Plan(indices[mine], lengths[mine], skip, piece_starts, self.state())

    def _take(self, need: int):
        """The next ``need`` tokens as pieces: document index, first token, token
        count, and the document's whole length (empty documents left out)."""
        parts_index, parts_start, parts_count, lengths = [], [], [], []
        empty_run = 0
        while need > 0:
            number, position = divmod(self.document, self.chunk)
            indices, tokens = self._chunk(number)
            available = tokens[position:].astype(np.int64)
            available[0] -= self.token
            total = np.cumsum(available)
            end = int(np.searchsorted(total, need)) if total[-1] >= need else available.size - 1
            counts = available[:end + 1].copy()
            if total[end] > need:
                counts[-1] -= total[end] - need
            starts = np.zeros(end + 1, dtype=np.int64)
            starts[0] = self.token
            parts_index.append(indices[position:position + end + 1])
            parts_start.append(starts)
            parts_count.append(counts)
            lengths.append(tokens[position:position + end + 1])
            need -= int(counts.sum())
            empty_run = 0 if counts.any() else empty_run + counts.size
            if empty_run > self.length:
                raise ValueError(f"every document of '{self.dataset.path}' is empty: there are no tokens to pack")
            finished = starts[-1] + counts[-1] == tokens[position + end]
            self.document += end + 1 if finished else end
            self.token = 0 if finished else int(starts[-1] + counts[-1])
        counts = np.concatenate(parts_count)
        keep = counts > 0
        return (np.concatenate(parts_index)[keep], np.concatenate(parts_start)[keep], counts[keep],
                np.concatenate(lengths)[keep])

    # -- rows (any thread) ------------------------------------------------------------

    def read(self, plan: _Plan) -> dict:
        """This rank's rows: the stream's tokens, ``segment_ids`` and ``positions``, each
        ``(batch_size, seq_len)``; the documents come in one native gather."""
        dataset = self.dataset
        offsets = np.zeros(plan.indices.size + 1, dtype=np.uint64)
        np.cumsum(plan.lengths, out=offsets[1:])
        flat = np.empty(int(offsets[-1]), dtype=dataset.dtype)
        dataset.store.gather(plan.indices, flat, offsets[:-1] * np.uint64(dataset.dtype.itemsize))
        size = self.share * self.seq_len
        tokens = flat[plan.skip:plan.skip + size].reshape(self.share, self.seq_len)
        segment_ids, positions = _segments(plan.piece_starts, self.share, self.seq_len)
        return {self.name: tokens, "segment_ids": segment_ids, "positions": positions}


def _segments(piece_starts: np.ndarray, rows: int, seq_len: int):
    """Segment ids (1-based per row) and positions (0-based per segment) for
    rows cut at every piece start and every row start."""
    size = rows * seq_len
    starts = np.union1d(piece_starts, np.arange(0, size, seq_len))
    lengths = np.diff(np.append(starts, size))
    row_of = starts // seq_len
    first_in_row = np.searchsorted(row_of, row_of, side="left")
    ids = (np.arange(starts.size) - first_in_row + 1).astype(np.int32)
    segment_ids = np.repeat(ids, lengths).reshape(rows, seq_len)
    positions = (np.arange(size) - np.repeat(starts, lengths)).astype(np.int32).reshape(rows, seq_len)
    return segment_ids, positions
