"""Sequence packing: rows of exactly seq_len tokens, segment ids, positions, resume, shards."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loaderx import (
    DataLoader,
    DenseDataset,
    Packing,
    RaggedDataset,
    Sampler,
    from_iterator,
    from_numpy,
)
from loaderx.packing import SEQ_LEN_MAX, WINDOW_MAX

LENGTH = 40
# BLOCK needs its groups: tests/test_block.py.
MODES = [mode for mode in Sampler.Mode if mode != Sampler.Mode.BLOCK]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """40 documents of 0..30 tokens (some empty, some longer than a row); token j
    of document i is i * 100 + j."""
    root = tmp_path_factory.mktemp("packing")
    lengths = np.random.default_rng(3).integers(0, 31, LENGTH)
    lengths[[4, 5, 17]] = 0
    docs = [np.arange(n, dtype=np.int32) + 100 * i for i, n in enumerate(lengths)]
    from_iterator(root / "tokens", docs)
    with RaggedDataset(root / "tokens") as dataset:
        yield root, docs, dataset


def stream(docs, mode, seed, tokens):
    """The reference: at least `tokens` of the document stream (chunk c is the
    sampler's batch c of the whole length), as token values, piece numbers
    (one per document read), and positions inside each document."""
    values, pieces, positions, chunk = [], [], [], 0
    while sum(map(len, values)) < tokens:
        for index in Sampler(LENGTH, LENGTH, mode, seed=seed).batch(chunk).tolist():
            values.append(docs[index])
            pieces.append(np.full(len(docs[index]), len(pieces)))
            positions.append(np.arange(len(docs[index])))
        chunk += 1
    return np.concatenate(values), np.concatenate(pieces), np.concatenate(positions)


def expected_rows(docs, mode, seed, first_row, rows, seq_len):
    """Rows first_row.. of the packed stream with their segment ids and positions."""
    values, pieces, _ = stream(docs, mode, seed, (first_row + rows) * seq_len)
    span = slice(first_row * seq_len, (first_row + rows) * seq_len)
    tokens, piece = values[span].reshape(rows, seq_len), pieces[span].reshape(rows, seq_len)
    segment_ids = np.zeros_like(piece)
    positions = np.zeros_like(piece)
    for row in range(rows):
        for column in range(seq_len):
            new = column == 0 or piece[row, column] != piece[row, column - 1]
            segment_ids[row, column] = (segment_ids[row, column - 1] if column else 0) + new
            positions[row, column] = 0 if new else positions[row, column - 1] + 1
    return tokens, segment_ids, positions


def assert_rows(batch, want):
    tokens, segment_ids, positions = want
    np.testing.assert_array_equal(batch["tokens"], tokens)
    np.testing.assert_array_equal(batch["segment_ids"], segment_ids)
    np.testing.assert_array_equal(batch["positions"], positions)
    assert batch["tokens"].dtype == np.int32 and batch["segment_ids"].dtype == np.int32


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("workers", [0, 3])
@pytest.mark.parametrize("seq_len", [1, 7, 64])
def test_packed_rows_are_the_concatenated_stream(corpus, mode, workers, seq_len):
    """Batch k holds rows k*B.. of the concatenated document stream: no token lost,
    none padded, segment ids and positions restart at each document and row."""
    _, docs, dataset = corpus
    with DataLoader(
        {"tokens": dataset},
        num_workers=workers,
        batch_size=3,
        mode=mode,
        seed=5,
        packing=Packing(seq_len),
    ) as loader:
        for step in range(8):
            assert_rows(next(loader), expected_rows(docs, mode, 5, step * 3, 3, seq_len))


@settings(max_examples=25, deadline=None)
@given(
    mode=st.sampled_from(MODES),
    stop=st.integers(0, 12),
    share=st.integers(1, 4),
    world_size=st.integers(1, 3),
    new_share=st.integers(1, 4),
    new_world=st.integers(1, 3),
)
def test_packed_resume_continues_the_token_stream(
    corpus, mode, stop, share, world_size, new_share, new_world
):
    """A packed state resumes exactly, also with another world size and batch size:
    the ranks' rows continue the same token stream with the next token."""
    _, docs, dataset = corpus
    seq_len = 9
    states = []
    for rank in range(world_size):
        with DataLoader(
            {"tokens": dataset},
            num_workers=1,
            batch_size=share,
            mode=mode,
            seed=2,
            shard=(rank, world_size),
            packing=Packing(seq_len),
        ) as loader:
            for _ in range(stop):
                next(loader)
            states.append(json.loads(json.dumps(loader.state_dict())))
    # Every rank plans the whole global stream: their states differ in the shard only.
    assert all({**state, "shard": None} == {**states[0], "shard": None} for state in states)
    done_rows = stop * share * world_size
    for rank in range(new_world):
        with DataLoader(
            {"tokens": dataset},
            num_workers=2,
            batch_size=new_share,
            mode=mode,
            seed=2,
            shard=(rank, new_world),
            packing=Packing(seq_len),
        ) as resumed:
            resumed.load_state_dict(states[-1])
            for step in range(3):
                first = done_rows + (step * new_world + rank) * new_share
                assert_rows(next(resumed), expected_rows(docs, mode, 2, first, new_share, seq_len))


def test_packed_shards_concatenate_to_the_global_batch(corpus):
    """The ranks' packed rows, joined in rank order, are the unsharded batch."""
    _, _, dataset = corpus
    parts = []
    for rank in range(3):
        with DataLoader(
            {"tokens": dataset}, batch_size=2, shard=(rank, 3), packing=Packing(5)
        ) as loader:
            parts.append([next(loader) for _ in range(4)])
    with DataLoader({"tokens": dataset}, batch_size=6, packing=Packing(5)) as single:
        for step in range(4):
            whole = next(single)
            for name in ("tokens", "segment_ids", "positions"):
                np.testing.assert_array_equal(
                    np.concatenate([part[step][name] for part in parts]), whole[name]
                )


def test_packing_rejects_what_it_cannot_pack(corpus, tmp_path):
    """Dense or several streams, a bad seq_len or strategy, a mismatched state and
    a corpus without tokens raise errors that say what to do."""
    root, _, dataset = corpus
    from_numpy(tmp_path / "dense", np.zeros((10, 3), dtype=np.int32))
    with DenseDataset(tmp_path / "dense") as dense:
        with pytest.raises(ValueError, match="one ragged stream"):
            DataLoader({"tokens": dense}, packing=Packing(8))
        with pytest.raises(ValueError, match="one ragged stream"):
            DataLoader({"tokens": dataset, "other": dataset}, packing=Packing(8))
    for bad in (0, -1, SEQ_LEN_MAX + 1):
        with pytest.raises(ValueError, match="seq_len"):
            Packing(bad)
    for bad in (2.5, True, "8"):
        with pytest.raises(TypeError, match="seq_len"):
            Packing(bad)
    with pytest.raises(ValueError, match="strategy"):
        Packing(8, strategy="best_fit_decreasing_magic")
    with pytest.raises(TypeError, match="Packing"):
        DataLoader({"tokens": dataset}, packing=8)
    with DataLoader({"tokens": dataset}, batch_size=2, packing=Packing(8)) as loader:
        state = loader.state_dict()
    with (
        DataLoader({"tokens": dataset}, batch_size=2, packing=Packing(9)) as other,
        pytest.raises(ValueError, match="seq_len"),
    ):
        other.load_state_dict(state)
    with (
        DataLoader({"tokens": dataset}, batch_size=2) as plain,
        pytest.raises(ValueError, match="packing"),
    ):
        plain.load_state_dict(state)
    from_iterator(tmp_path / "empty", [np.zeros(0, dtype=np.int32)] * 5)
    with RaggedDataset(tmp_path / "empty") as empty:
        with DataLoader({"tokens": empty}, batch_size=2, packing=Packing(8)) as loader:
            with pytest.raises(RuntimeError, match="every document .* is empty"):
                next(loader)


# ---- first fit ---------------------------------------------------------------------------

FIRST_FIT = Packing.Strategy.FIRST_FIT


def first_fit_rows(docs, mode, seed, seq_len, window, count):
    """The reference: the first `count` rows of first-fit over the document stream,
    each as a list of (document, first token, tokens) pieces."""
    open_rows, ready, chunk = [], [], 0
    while len(ready) < count:
        for index in Sampler(LENGTH, LENGTH, mode, seed=seed).batch(chunk).tolist():
            for start in range(0, len(docs[index]), seq_len):
                piece = (index, start, min(seq_len, len(docs[index]) - start))
                row = next(
                    (row for row in open_rows if seq_len - sum(p[2] for p in row) >= piece[2]), None
                )
                if row is None:
                    row = []
                    open_rows.append(row)
                row.append(piece)
                if sum(p[2] for p in row) == seq_len:
                    open_rows.remove(row)
                    ready.append(row)
                elif len(open_rows) > window:
                    ready.append(open_rows.pop(0))
        chunk += 1
    return ready[:count]


def expected_first_fit(docs, rows, seq_len):
    tokens = np.zeros((len(rows), seq_len), dtype=np.int32)
    segment_ids = np.zeros_like(tokens)
    positions = np.zeros_like(tokens)
    for number, row in enumerate(rows):
        column = 0
        for segment, (index, start, count) in enumerate(row, 1):
            tokens[number, column : column + count] = docs[index][start : start + count]
            segment_ids[number, column : column + count] = segment
            positions[number, column : column + count] = np.arange(count)
            column += count
    return tokens, segment_ids, positions


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("seq_len, window", [(12, 1), (32, 4), (64, 16)])
def test_first_fit_rows_match_the_reference(corpus, mode, seq_len, window):
    """FIRST_FIT rows are the reference first-fit's: whole documents (cut only when
    longer than a row), padded with token 0 and segment id 0."""
    _, docs, dataset = corpus
    rows = first_fit_rows(docs, mode, 6, seq_len, window, 5 * 4)
    with DataLoader(
        {"tokens": dataset},
        num_workers=2,
        batch_size=4,
        mode=mode,
        seed=6,
        packing=Packing(seq_len, FIRST_FIT, window=window),
    ) as loader:
        for step in range(5):
            assert_rows(
                next(loader), expected_first_fit(docs, rows[step * 4 : (step + 1) * 4], seq_len)
            )


@settings(max_examples=20, deadline=None)
@given(
    stop=st.integers(0, 8),
    share=st.integers(1, 3),
    world_size=st.integers(1, 3),
    new_share=st.integers(1, 3),
    new_world=st.integers(1, 3),
    window=st.integers(1, 6),
)
def test_first_fit_resume_continues_the_rows(
    corpus, stop, share, world_size, new_share, new_world, window
):
    """A FIRST_FIT state (open and ready rows included) resumes exactly, with any
    world size and batch size: the ranks continue the same row stream."""
    _, docs, dataset = corpus
    packing = Packing(16, FIRST_FIT, window=window)
    with DataLoader(
        {"tokens": dataset},
        num_workers=1,
        batch_size=share,
        shard=(0, world_size),
        seed=1,
        packing=packing,
    ) as loader:
        for _ in range(stop):
            next(loader)
        state = json.loads(json.dumps(loader.state_dict()))
    done = stop * share * world_size
    rows = first_fit_rows(docs, Sampler.Mode.IID, 1, 16, window, done + 3 * new_share * new_world)
    for rank in range(new_world):
        with DataLoader(
            {"tokens": dataset},
            num_workers=2,
            batch_size=new_share,
            shard=(rank, new_world),
            seed=1,
            packing=packing,
        ) as resumed:
            resumed.load_state_dict(state)
            for step in range(3):
                first = done + (step * new_world + rank) * new_share
                assert_rows(
                    next(resumed), expected_first_fit(docs, rows[first : first + new_share], 16)
                )


def test_first_fit_state_is_checked(corpus):
    """A FIRST_FIT state with another window or damaged rows is refused."""
    _, _, dataset = corpus
    with DataLoader(
        {"tokens": dataset}, batch_size=2, packing=Packing(16, FIRST_FIT, window=4)
    ) as loader:
        next(loader)
        state = loader.state_dict()
    with DataLoader(
        {"tokens": dataset}, batch_size=2, packing=Packing(16, FIRST_FIT, window=5)
    ) as other:
        with pytest.raises(ValueError, match="window"):
            other.load_state_dict(state)
    damaged = json.loads(json.dumps(state))
    damaged["packing"]["open"] = [[1, 2]]
    with DataLoader(
        {"tokens": dataset}, batch_size=2, packing=Packing(16, FIRST_FIT, window=4)
    ) as other:
        with pytest.raises(ValueError, match="triples"):
            other.load_state_dict(damaged)


@pytest.mark.parametrize("strategy", list(Packing.Strategy))
def test_every_packing_state_holds_document_and_token(corpus, strategy):
    """Both strategies' states hold the position keys "document" and "token" (FIRST_FIT
    lacked "token"), and a FIRST_FIT state saved without "token" still resumes exactly."""
    _, _, dataset = corpus
    packing = Packing(16, strategy, window=4)
    with DataLoader(
        {"tokens": dataset}, num_workers=0, batch_size=2, seed=5, packing=packing
    ) as loader:
        next(loader)
        state = loader.state_dict()
        following = next(loader)
    assert {"document", "token"} <= set(state["packing"])
    if strategy is FIRST_FIT:
        assert state["packing"]["token"] == 0
        old = {
            **state,
            "packing": {key: value for key, value in state["packing"].items() if key != "token"},
        }
        with DataLoader(
            {"tokens": dataset}, num_workers=0, batch_size=2, seed=5, packing=packing
        ) as resumed:
            resumed.load_state_dict(old)
            assert_rows(
                next(resumed),
                (following["tokens"], following["segment_ids"], following["positions"]),
            )
        with (
            DataLoader({"tokens": dataset}, batch_size=2, seed=5, packing=packing) as other,
            pytest.raises(ValueError, match="token must be 0"),
        ):
            other.load_state_dict({**state, "packing": {**state["packing"], "token": 3}})


def test_packing_sizes_have_a_range(corpus):
    """seq_len and window are bounded where they are given (window=10**9 made every
    piece scan a list that could grow that long), and a state's positions past 2**64 - 1
    are refused on load rather than failing at the first batch."""
    _, _, dataset = corpus
    for bad in (WINDOW_MAX + 1, 10**9):
        with pytest.raises(ValueError, match=r"window must be in 1\.\.4,096"):
            Packing(8, FIRST_FIT, window=bad)
    with pytest.raises(ValueError, match=r"seq_len must be in 1\.\.16,777,216"):
        Packing(10**9)
    assert Packing(SEQ_LEN_MAX, window=WINDOW_MAX).seq_len == SEQ_LEN_MAX
    with DataLoader({"tokens": dataset}, batch_size=2, packing=Packing(8)) as loader:
        state = loader.state_dict()
    with DataLoader({"tokens": dataset}, batch_size=2, packing=Packing(8)) as other:
        with pytest.raises(
            ValueError,
            match=r"document must be in 0\.\.18,446,744,073,709,551,615, "
            r"got 18,446,744,073,709,551,616",
        ):
            other.load_state_dict({**state, "packing": {**state["packing"], "document": 2**64}})
