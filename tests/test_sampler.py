"""Behaviour of loaderx.sampler.Sampler and the native zsampler under it."""

import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loaderx._native import ZrecordError, check, ffi, lib
from loaderx.sampler import LENGTH_MAX, Sampler

# BLOCK needs its groups: tests/test_block.py.
MODES = [mode for mode in Sampler.Mode if mode != Sampler.Mode.BLOCK]
SEQUENTIAL, IID, CYCLIC = Sampler.Mode.SEQUENTIAL, Sampler.Mode.IID, Sampler.Mode.CYCLIC


def chi_square_z(counts, expected):
    """(chi2 - dof) / sqrt(2 dof): about standard normal for a fair source."""
    counts = np.asarray(counts, dtype=np.float64)
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    dof = counts.size - 1
    return (chi2 - dof) / math.sqrt(2 * dof)


# Six standard deviations: a fair source fails about once in 10^8 runs (the
# seeds are fixed anyway), a biased one by far more.
Z_MAX = 6.0


def batches(sampler, count):
    return np.concatenate([sampler.next() for _ in range(count)])


# -- the API -------------------------------------------------------------------


def test_mode_values_and_plain_ints():
    assert [int(mode) for mode in Sampler.Mode] == [0, 1, 2, 3]
    assert [mode.name for mode in Sampler.Mode] == ["SEQUENTIAL", "IID", "CYCLIC", "BLOCK"]
    for mode in MODES:
        by_int = Sampler(100, 10, int(mode), seed=5)
        by_enum = Sampler(100, 10, mode, seed=5)
        assert by_int.mode is mode
        np.testing.assert_array_equal(by_int.next(), by_enum.next())


def test_next_returns_a_fresh_uint64_array_and_advances():
    sampler = Sampler(1000, 7, IID)
    assert sampler.step == 0
    first = sampler.next()
    second = sampler.next()
    assert first.dtype == np.uint64 and first.shape == (7,)
    assert first is not second and not np.shares_memory(first, second)
    assert sampler.step == 2


def test_iteration_is_endless_and_matches_next():
    reference = Sampler(50, 8, CYCLIC, seed=3)
    iterated = Sampler(50, 8, CYCLIC, seed=3)
    for count, batch in enumerate(iterated):
        np.testing.assert_array_equal(batch, reference.next())
        if count == 40:  # 6 batches per cycle: several cycles
            break
    assert iterated.step == 41
    assert iter(iterated) is iterated


def test_fill_and_batch_write_into_the_callers_buffer():
    sampler = Sampler(10_000, 64, CYCLIC, seed=9)
    reference = Sampler(10_000, 64, CYCLIC, seed=9)
    out = np.empty(64, np.uint64)
    for _ in range(5):
        assert sampler.fill(out) is out
        np.testing.assert_array_equal(out, reference.next())
    # batch() is random access and leaves the current step alone.
    assert sampler.batch(2, out) is out
    assert sampler.step == 5
    np.testing.assert_array_equal(out, Sampler(10_000, 64, CYCLIC, seed=9).batch(2))


def test_properties_and_repr():
    sampler = Sampler(1000, 16, CYCLIC, seed=7, shard=(1, 4))
    assert (sampler.length, sampler.batch_size, sampler.mode, sampler.seed) == (1000, 16, CYCLIC, 7)
    assert sampler.shard == (1, 4)
    assert Sampler(10, 2, IID).shard == (0, 1)
    assert "CYCLIC" in repr(sampler) and "shard=(1, 4)" in repr(sampler)


def test_config_layout_matches_the_library():
    assert ffi.sizeof("lx_sampler_config") == lib.lx_sampler_config_bytes() == 48


# -- determinism and seek -----------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    mode=st.sampled_from(MODES),
    length=st.integers(1, 5000),
    batch_size=st.integers(1, 64),
    seed=st.integers(0, 2**64 - 1),
    step=st.integers(0, 300),
)
def test_seek_reproduces_the_stream_in_every_mode(mode, length, batch_size, seed, step):
    if mode is CYCLIC and length < batch_size:
        length = batch_size
    fresh = Sampler(length, batch_size, mode, seed=seed)
    stream = [fresh.next() for _ in range(step + 2)]
    sought = Sampler(length, batch_size, mode, seed=seed)
    sought.seek(step)
    np.testing.assert_array_equal(sought.next(), stream[step])
    np.testing.assert_array_equal(sought.next(), stream[step + 1])
    np.testing.assert_array_equal(sought.batch(step), stream[step])
    for batch in stream:
        assert batch.max() < length


@pytest.mark.parametrize("mode", MODES)
def test_seek_to_far_steps_is_exact(mode):
    sampler = Sampler(10**6, 32, mode, seed=11)
    for step in (10**6, 2**40 + 3, 2**64 - 1):
        sampler.seek(step)
        assert sampler.step == step
        np.testing.assert_array_equal(sampler.next(), Sampler(10**6, 32, mode, seed=11).batch(step))


@pytest.mark.parametrize("mode", [IID, CYCLIC])
def test_seeds_give_different_streams(mode):
    one = batches(Sampler(10**6, 256, mode, seed=1), 4)
    two = batches(Sampler(10**6, 256, mode, seed=2), 4)
    assert (one == two).mean() < 0.01


# -- SEQUENTIAL -------------------------------------------------------------------


def test_sequential_slides_and_wraps_around_the_end():
    sampler = Sampler(10, 4, SEQUENTIAL)
    assert [sampler.next().tolist() for _ in range(4)] == [
        [0, 1, 2, 3],
        [4, 5, 6, 7],
        [8, 9, 0, 1],
        [2, 3, 4, 5],
    ]


def test_sequential_batch_larger_than_length_wraps_several_times():
    np.testing.assert_array_equal(Sampler(3, 8, SEQUENTIAL).batch(1), [2, 0, 1, 2, 0, 1, 2, 0])


@pytest.mark.parametrize("length", [2**40, 2**63 - 1, LENGTH_MAX])
def test_sequential_is_exact_at_huge_steps(length):
    batch_size = 1000
    sampler = Sampler(length, batch_size, SEQUENTIAL, shard=(2, 3))
    for step in (2**33, 2**64 - 1):
        start = (step * batch_size * 3 + 2 * batch_size) % length
        expected = [(start + j) % length for j in range(batch_size)]
        assert sampler.batch(step).tolist() == expected


# -- IID --------------------------------------------------------------------------


def test_iid_is_uniform():
    # 400_000 draws into 1000 cells: chi-square with 999 degrees of freedom.
    draws = batches(Sampler(1000, 4000, IID, seed=123), 100)
    assert abs(chi_square_z(np.bincount(draws.astype(np.int64), minlength=1000), 400.0)) < Z_MAX


def test_iid_draws_are_independent_of_their_neighbours():
    # Pairs (x_j, x_j+1) in 16 x 16 cells: correlated neighbours would fail.
    draws = batches(Sampler(16, 5000, IID, seed=5), 40).astype(np.int64)
    pairs = draws[:-1] * 16 + draws[1:]
    assert abs(chi_square_z(np.bincount(pairs, minlength=256), (draws.size - 1) / 256)) < Z_MAX


def test_iid_has_no_modulo_bias_on_3_times_2_to_the_61():
    # Unbiased, an index is below 2^62 with probability 2/3 and is 2 mod 3
    # with probability 1/3. `x % length` folds the top quarter of u64 onto
    # 0..2^62 (probability 1/2); multiply-shift without rejection maps 3 of
    # every 8 words to indices 0 and 1 mod 3 but only 2 to 2 mod 3 (1/4).
    length = 3 * 2**61
    draws = batches(Sampler(length, 10_000, IID, seed=77), 20)
    n = draws.size
    below = float((draws < 2**62).mean())
    two_mod_three = float((draws % 3 == 2).mean())
    assert draws.max() < length
    assert abs(below - 2 / 3) < 6 * math.sqrt(2 / 9 / n)
    assert abs(two_mod_three - 1 / 3) < 6 * math.sqrt(2 / 9 / n)


@pytest.mark.parametrize("length", [2**40, 2**63 - 25, LENGTH_MAX])
def test_iid_covers_huge_index_spaces(length):
    draws = batches(Sampler(length, 10_000, IID, seed=1), 5)
    assert draws.max() < length
    # The top 16 bins of the range are equally likely.
    bins = (draws // -(-length // 16)).astype(np.int64)
    assert abs(chi_square_z(np.bincount(bins, minlength=16), draws.size / 16)) < Z_MAX


# -- CYCLIC -----------------------------------------------------------------------


@pytest.mark.parametrize("length", [10, 100, 256, 257, 1000, 4096, 65_537])
def test_cyclic_cycles_are_permutations_that_change(length):
    batch_size = next(b for b in (100, 64, 10, 1) if length % b == 0)
    per_cycle = length // batch_size
    sampler = Sampler(length, batch_size, CYCLIC, seed=4)
    cycles = [batches(sampler, per_cycle) for _ in range(3)]
    for cycle in cycles:
        np.testing.assert_array_equal(np.sort(cycle), np.arange(length))
    assert not np.array_equal(cycles[0], cycles[1])
    assert not np.array_equal(cycles[1], cycles[2])


@pytest.mark.parametrize("length", [100, 1000, 100_003])
def test_cyclic_drops_a_different_remainder_each_cycle(length):
    batch_size = 64
    per_cycle = length // batch_size
    dropped = length - per_cycle * batch_size
    sampler = Sampler(length, batch_size, CYCLIC, seed=8)
    remainders = []
    for _ in range(4):
        cycle = batches(sampler, per_cycle)
        assert np.unique(cycle).size == cycle.size == per_cycle * batch_size
        remainder = np.setdiff1d(np.arange(length), cycle)
        assert remainder.size == dropped
        remainders.append(set(remainder.tolist()))
    assert len({frozenset(r) for r in remainders}) == 4


def test_cyclic_batch_equal_to_length_is_one_cycle_per_step():
    sampler = Sampler(300, 300, CYCLIC, seed=2)
    first, second = sampler.next(), sampler.next()
    np.testing.assert_array_equal(np.sort(first), np.arange(300))
    np.testing.assert_array_equal(np.sort(second), np.arange(300))
    assert not np.array_equal(first, second)


@pytest.mark.parametrize("length", [16, 1000])
def test_cyclic_places_every_index_uniformly(length):
    # Which index comes first in a cycle, over 20_000 cycles.
    sampler = Sampler(length, length, CYCLIC, seed=21)
    firsts = np.array([sampler.batch(step)[0] for step in range(20_000)], dtype=np.int64)
    assert abs(chi_square_z(np.bincount(firsts, minlength=length), 20_000 / length)) < Z_MAX


def test_cyclic_neighbours_are_not_correlated():
    # In one cycle of 2^20, consecutive indices must look independent: their
    # correlation is about N(0, 1/sqrt(n)) for a random permutation.
    cycle = Sampler(2**20, 2**20, CYCLIC, seed=13).next().astype(np.float64)
    n = cycle.size
    assert abs(np.corrcoef(np.arange(n), cycle)[0, 1]) < Z_MAX / math.sqrt(n)
    assert abs(np.corrcoef(cycle[:-1], cycle[1:])[0, 1]) < Z_MAX / math.sqrt(n)


@pytest.mark.parametrize("length", [2**40, 2**40 + 1, LENGTH_MAX])
def test_cyclic_handles_huge_index_spaces(length):
    sampler = Sampler(length, 50_000, CYCLIC, seed=3)
    draws = batches(sampler, 4)
    assert draws.max() < length
    assert np.unique(draws).size == draws.size
    sampler.seek(length // 50_000 + 2)  # into the second cycle
    assert sampler.next().max() < length


# -- sharding ---------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    mode=st.sampled_from(MODES),
    length=st.integers(1, 3000),
    share=st.integers(1, 20),
    world_size=st.integers(1, 6),
    seed=st.integers(0, 2**64 - 1),
    step=st.integers(0, 2**64 - 1),
)
def test_shards_concatenate_to_the_global_stream(mode, length, share, world_size, seed, step):
    if mode is CYCLIC and length < share * world_size:
        length = share * world_size
    whole = Sampler(length, share * world_size, mode, seed=seed).batch(step)
    parts = [
        Sampler(length, share, mode, seed=seed, shard=(rank, world_size)).batch(step)
        for rank in range(world_size)
    ]
    np.testing.assert_array_equal(np.concatenate(parts), whole)


@pytest.mark.parametrize("mode", MODES)
def test_shards_are_disjoint_in_cyclic_and_agree_in_every_mode(mode):
    world_size, share = 4, 25
    whole = Sampler(10_000, share * world_size, mode, seed=6)
    ranks = [
        Sampler(10_000, share, mode, seed=6, shard=(rank, world_size)) for rank in range(world_size)
    ]
    for _ in range(120):  # more than one cycle of 100 batches
        expected = whole.next()
        parts = [rank.next() for rank in ranks]
        np.testing.assert_array_equal(np.concatenate(parts), expected)
        if mode is not IID:
            assert np.unique(expected).size == expected.size


# -- errors -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        (dict(length=0), ValueError, "empty"),
        (dict(length=-5), ValueError, "length"),
        (dict(length=2**63 + 1), ValueError, "2**63"),
        (dict(length=10.0), TypeError, "length"),
        (dict(length=True), TypeError, "bool"),
        (dict(batch_size=0), ValueError, "batch_size"),
        (dict(batch_size=-1), ValueError, "batch_size"),
        (dict(batch_size="8"), TypeError, "batch_size"),
        (dict(mode=4), ValueError, "CYCLIC (2) or BLOCK (3)"),
        (dict(mode=-1), ValueError, "mode"),
        (dict(mode="iidd"), ValueError, "'iid'"),
        (dict(mode=1.0), TypeError, "mode"),
        (dict(seed=-1), ValueError, "seed"),
        (dict(seed=2**64), ValueError, "seed"),
        (dict(seed=1.5), TypeError, "seed"),
        (dict(shard=(2, 2)), ValueError, "rank"),
        (dict(shard=(-1, 2)), ValueError, "rank"),
        (dict(shard=(0, 0)), ValueError, "world_size"),
        (dict(shard=(0,)), TypeError, "pair"),
        (dict(shard=(0, 1, 2)), TypeError, "pair"),
        (dict(shard=3), TypeError, "pair"),
        (dict(shard="01"), TypeError, "pair"),
        (dict(shard=(0.0, 2)), TypeError, "rank"),
        (dict(batch_size=2**24, shard=(0, 2**40)), ValueError, "64 bits"),
        (
            dict(length=10, batch_size=2**62),
            ValueError,
            "batch_size must be in 1..2**24",
        ),  # 32 EiB at the first batch
        (dict(batch_size=2**24 + 1), ValueError, "batch_size must be in 1..2**24"),
        (dict(length=100, batch_size=30, mode=CYCLIC, shard=(0, 4)), ValueError, "CYCLIC"),
        (dict(length=5, batch_size=6, mode=CYCLIC), ValueError, "smaller batch"),
    ],
)
def test_bad_arguments_raise_clear_errors(kwargs, error, words):
    arguments = dict(length=100, batch_size=8, mode=IID) | kwargs
    with pytest.raises(error, match=re.escape(words)):
        Sampler(**arguments)


def test_cyclic_batch_equal_to_length_and_other_modes_beyond_it_are_fine():
    Sampler(5, 5, CYCLIC)
    assert Sampler(5, 6, IID).next().max() < 5
    assert Sampler(5, 6, SEQUENTIAL).next().tolist() == [0, 1, 2, 3, 4, 0]


@pytest.mark.parametrize(
    "step, error", [(-1, ValueError), (2**64, ValueError), (1.0, TypeError), ("3", TypeError)]
)
def test_bad_steps_raise(step, error):
    sampler = Sampler(100, 8, SEQUENTIAL)
    with pytest.raises(error, match="step"):
        sampler.seek(step)
    with pytest.raises(error, match="step"):
        sampler.batch(step)
    assert sampler.step == 0


@pytest.mark.parametrize(
    "out, error, words",
    [
        (np.empty(8, np.int64), TypeError, "uint64"),
        (np.empty(7, np.uint64), ValueError, "shape"),
        (np.empty((2, 4), np.uint64), ValueError, "shape"),
        (np.empty(16, np.uint64)[::2], ValueError, "contiguous"),
        (np.frombuffer(bytes(64), np.uint64), ValueError, "writable"),
        (np.empty(8, np.dtype(">u8")), TypeError, "uint64"),
        (bytearray(64), TypeError, "numpy"),
    ],
)
def test_bad_output_buffers_raise(out, error, words):
    sampler = Sampler(100, 8, IID)
    with pytest.raises(error, match=words):
        sampler.fill(out)
    with pytest.raises(error, match=words):
        sampler.batch(0, out)
    assert sampler.step == 0


def native_config(**fields):
    values = (
        dict(length=100, batch_size=8, seed=1, rank=0, world_size=1, mode=1, reserved=0) | fields
    )
    return ffi.new("lx_sampler_config *", values)


@pytest.mark.parametrize(
    "fields, words",
    [
        (dict(length=0), "length is 0"),
        (dict(length=2**63 + 1), "above 2^63"),
        (dict(batch_size=0), "batch_size is 0"),
        (dict(mode=7), "mode 7 is unknown"),
        (dict(world_size=0), "world_size is 0"),
        (dict(rank=3, world_size=3), "rank 3 is outside"),
        (dict(batch_size=2**40, world_size=2**24), "overflows 64 bits"),
        (dict(mode=2, length=7), "CYCLIC"),
        (dict(reserved=1), "reserved"),
        (dict(mode=3), "BLOCK) needs its groups: call lx_sampler_block_batch"),
    ],
)
def test_the_library_refuses_bad_configs_itself(fields, words):
    # Python validates first; the library must not trust its caller anyway.
    out = ffi.new("uint64_t[]", 8)
    status = lib.lx_sampler_batch(native_config(**fields), 0, out, 8)
    assert status == 1  # invalid_argument
    with pytest.raises(ZrecordError, match=re.escape(words)):
        check(status)


def test_the_library_refuses_a_short_target():
    out = ffi.new("uint64_t[]", 8)
    status = lib.lx_sampler_batch(native_config(batch_size=8), 0, out, 7)
    assert status == 16  # buffer_too_small
    assert out[7] == 0  # nothing written


# ---- regressions of issue 11 ---------------------------------------------------------


def test_mode_names_work_like_the_ints():
    """mode="iid"/"cyclic"/"sequential" (any case) give the same stream as the ints."""
    for name, mode in [("sequential", SEQUENTIAL), ("iid", IID), ("CYCLIC", CYCLIC), ("Iid", IID)]:
        by_name = Sampler(100, 10, name, seed=5)
        assert by_name.mode is mode
        np.testing.assert_array_equal(
            by_name.batch(3), Sampler(100, 10, int(mode), seed=5).batch(3)
        )


def test_sampler_pickles_as_its_parameters_and_step():
    """A pickled sampler continues with the batch the original would give next."""
    import multiprocessing
    import pickle

    sampler = Sampler(1000, 16, CYCLIC, seed=7, shard=(1, 3))
    sampler.seek(41)
    copy = pickle.loads(pickle.dumps(sampler))
    assert repr(copy) == repr(sampler)
    np.testing.assert_array_equal(copy.next(), sampler.next())
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        batches = pool.map(sampler.batch, [0, 5])
    np.testing.assert_array_equal(batches[1], sampler.batch(5))
