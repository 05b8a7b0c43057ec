"""BLOCK mode: the shard-local sampler order for whole-shard caching.

The definition (zig/sampler.zig, docs/guides/remote-design.md): each cycle
permutes the groups, cuts that order into blocks of ``shards_per_block``
groups and permutes each block's records together; the cycle's stream is the
blocks one after another, read in global batches as CYCLIC reads its cycles.
``reference_cycle`` below is that definition in plain Python and NumPy, with
the same keyed generator (SplitMix64 keys, an exact Fisher-Yates shuffle for
up to 256 items), so for small sizes the native stream must equal it exactly.
"""

import json
import pickle
import re

import numpy as np
import pytest

from loaderx import (
    DataLoader,
    DenseDataset,
    Packing,
    RaggedDataset,
    Sampler,
    from_numpy,
    shards,
)
from loaderx._native import ZrecordError, check, ffi, lib
from loaderx.sampler import GROUPS_MAX, SHARDS_PER_BLOCK_DEFAULT, equal_groups
from loaderx.schedule import Schedule, elastic_anchor

BLOCK = Sampler.Mode.BLOCK
MASK = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15
GAMMA_STEP = 0xD1B54A32D192ED03
DOMAIN_RETRY = 0x3C6EF372FE94F82B
DOMAIN_BLOCK = 0xA54FF53A5F1D36F1
DOMAIN_BLOCK_GROUPS = 0x510E527FADE682D1
NONE = np.empty(0, dtype=np.uint64)


# ---- the reference ------------------------------------------------------------------


def mix(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def bounded(random, n):
    """Lemire's unbiased draw from 0..n, with the library's pure-function retries."""
    threshold = (-n % (1 << 64)) % n
    for _ in range(129):
        product = random * n
        if product & MASK >= threshold:
            break
        random = mix(random ^ DOMAIN_RETRY)
    return product >> 64


def shuffle(n, key):
    """The exact keyed Fisher-Yates shuffle of 0..n (n <= 256)."""
    assert 1 <= n <= 256
    order = list(range(n))
    for remaining in range(n, 1, -1):
        chosen = bounded(mix((key + remaining * GAMMA) & MASK), remaining)
        order[remaining - 1], order[chosen] = order[chosen], order[remaining - 1]
    return order


def reference_cycle(seed, cycle, groups, per_block):
    """Cycle ``cycle``'s whole stream, straight from the definition."""
    key = mix((mix(seed ^ DOMAIN_BLOCK) + cycle * GAMMA_STEP) & MASK)
    order = shuffle(len(groups), mix(key ^ DOMAIN_BLOCK_GROUPS))
    starts = np.concatenate([[0], np.cumsum(groups)]).astype(np.uint64)
    stream = []
    for block, first in enumerate(range(0, len(groups), per_block)):
        records = np.concatenate(
            [
                np.arange(starts[g], starts[g + 1], dtype=np.uint64)
                for g in order[first:][:per_block]
            ]
        )
        stream.append(records[shuffle(records.size, mix((key + (block + 1) * GAMMA) & MASK))])
    return np.concatenate(stream)


def reference_stream(seed, groups, per_block, global_batch, steps):
    """Global batches 0..steps of the definition: whole batches of each cycle, the tail
    of each cycle dropped."""
    per_cycle = sum(groups) // global_batch
    cycles = {}
    out = []
    for step in range(steps):
        cycle, batch = divmod(step, per_cycle)
        if cycle not in cycles:
            cycles[cycle] = reference_cycle(seed, cycle, groups, per_block)
        out.append(cycles[cycle][batch * global_batch : (batch + 1) * global_batch])
    return np.concatenate([NONE, *out])


def stream(sampler, steps):
    return np.concatenate([NONE] + [sampler.batch(step) for step in range(steps)])


# ---- the sampler ---------------------------------------------------------------------

CASES = [
    # (groups, shards_per_block, batch_size, seed)
    ([5, 1, 9, 3, 12, 7, 2, 8], 2, 4, 0),
    ([5, 1, 9, 3, 12, 7, 2, 8], 3, 5, 7),  # a last block of 2 groups
    ([1] * 20, 1, 3, 2**64 - 1),  # single-row groups, one per block
    ([1] * 20, 4, 20, 5),  # a batch of the whole cycle
    ([40], 2, 6, 11),  # one group
    ([3, 4, 5], 3, 2, 13),  # one block of all groups
    ([3, 4, 5], 10, 7, 13),  # shards_per_block above the group count
    ([30, 60, 25, 90, 45], 2, 16, 99),  # blocks of up to 150 records
]


@pytest.mark.parametrize(("groups", "per_block", "batch_size", "seed"), CASES)
def test_the_stream_is_the_definition(groups, per_block, batch_size, seed):
    """The native stream equals the pure-Python reference, over several cycles."""
    sampler = Sampler(
        sum(groups), batch_size, "block", seed, groups=groups, shards_per_block=per_block
    )
    steps = 3 * (sum(groups) // batch_size) + 1
    np.testing.assert_array_equal(
        stream(sampler, steps), reference_stream(seed, groups, per_block, batch_size, steps)
    )


def group_of(groups, indices):
    return np.searchsorted(np.cumsum(groups), indices, side="right")


def assert_local(groups, per_block, cycle_stream):
    """The stream cuts into consecutive blocks, each made of all records of at most
    ``per_block`` groups (exactly that many, but for the last block)."""
    rows = np.asarray(groups)
    members, left = set(), 0
    for group in group_of(groups, cycle_stream):
        if group not in members:
            members.add(group)
            left += rows[group]
            assert len(members) <= per_block, "a block reads more groups than shards_per_block"
        left -= 1
        if left == 0 and len(members) == min(per_block, len(groups)):
            members = set()
    assert left == 0  # the last block, possibly of fewer groups, is whole too


@pytest.mark.parametrize("per_block", [1, 2, 4, 8])
def test_large_cycles_are_local_permutations_that_change(per_block):
    """Groups and blocks past 256 records take the Feistel network: still a permutation of
    every record per cycle, still local to blocks, different each cycle."""
    generator = np.random.default_rng(per_block)
    groups = generator.integers(1, 900, size=37).tolist()
    length = sum(groups)
    sampler = Sampler(length, length, BLOCK, 3, groups=groups, shards_per_block=per_block)
    cycles = [sampler.batch(cycle) for cycle in range(3)]
    for cycle in cycles:
        np.testing.assert_array_equal(np.sort(cycle), np.arange(length))
        assert_local(groups, per_block, cycle)
    assert not np.array_equal(cycles[0], cycles[1])
    assert not np.array_equal(group_of(groups, cycles[1]), group_of(groups, cycles[2]))


def test_a_cycle_does_not_depend_on_the_batch_size():
    """Batches of 7 read the cycle a batch of the whole length reads, dropping the tail
    (the end of the cycle's last block)."""
    groups = [300, 2, 451, 77, 1000, 9]
    length = sum(groups)
    whole = Sampler(length, length, BLOCK, 5, groups=groups, shards_per_block=2).batch(4)
    sevens = Sampler(length, 7, BLOCK, 5, groups=groups, shards_per_block=2)
    per_cycle = length // 7
    got = np.concatenate([sevens.batch(4 * per_cycle + b) for b in range(per_cycle)])
    np.testing.assert_array_equal(got, whole[: per_cycle * 7])


@pytest.mark.parametrize("world_size", [2, 3])
def test_shards_partition_the_global_batch(world_size):
    """With shard=(r, w), rank r reads its share of every global batch, and the shares of
    a cycle are disjoint."""
    groups = [50, 13, 70, 1, 1, 40, 25]
    share = 6
    whole = Sampler(sum(groups), share * world_size, BLOCK, 8, groups=groups)
    ranks = [
        Sampler(sum(groups), share, BLOCK, 8, shard=(rank, world_size), groups=groups)
        for rank in range(world_size)
    ]
    for step in (0, 1, 5, 11, 2**40):
        joined = np.concatenate([rank.batch(step) for rank in ranks])
        np.testing.assert_array_equal(joined, whole.batch(step))


def test_seek_pickle_and_properties():
    groups = [10, 20, 30]
    sampler = Sampler(60, 5, "BLOCK", 1, groups=groups, shards_per_block=2)
    assert sampler.groups == (10, 20, 30) and sampler.shards_per_block == 2
    assert sampler.block_options == {"groups": (10, 20, 30), "shards_per_block": 2}
    assert "groups=<3 groups>, shards_per_block=2" in repr(sampler)
    assert Sampler(60, 5, BLOCK, groups=groups).shards_per_block == SHARDS_PER_BLOCK_DEFAULT
    expected = [sampler.next() for _ in range(30)]
    sampler.seek(17)
    np.testing.assert_array_equal(sampler.next(), expected[17])
    again = pickle.loads(pickle.dumps(sampler))
    assert again.step == 18 and again.groups == sampler.groups
    np.testing.assert_array_equal(again.next(), expected[18])
    out = np.empty(5, np.uint64)
    np.testing.assert_array_equal(sampler.fill(out), expected[18])
    other = sampler.with_batch_size(60)
    assert other.groups == sampler.groups and other.batch_size == 60
    assert Sampler(60, 5, "cyclic").groups is None


def test_equal_groups():
    assert equal_groups(10, 4) == [3, 3, 2, 2]
    assert equal_groups(3) == [1, 1, 1]
    assert sum(equal_groups(1_000_003)) == 1_000_003 and len(equal_groups(1_000_003)) == 64
    with pytest.raises(ValueError, match="length >= 1"):
        equal_groups(0)


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"groups": None}, ValueError, "mode BLOCK needs groups="),
        ({"groups": [5, 5]}, ValueError, "add up to 10 rows but length is 12"),
        ({"groups": [6, 0, 6]}, ValueError, r"groups\[1\] is 0"),
        ({"groups": [13, -1]}, ValueError, r"groups\[1\] is -1"),
        ({"groups": []}, ValueError, "1..1,048,576 .GROUPS_MAX."),
        ({"groups": [6, 6.0]}, TypeError, r"groups\[1\] must be an integer"),
        ({"groups": "abc"}, TypeError, "groups must be a sequence"),
        ({"groups": 12}, TypeError, "groups must be a sequence"),
        ({"groups": [12], "shards_per_block": 0}, ValueError, "shards_per_block must be in"),
        ({"groups": [12], "shards_per_block": True}, TypeError, "shards_per_block must be an"),
        ({"groups": [12], "batch_size": 13}, ValueError, "BLOCK sampling without replacement"),
        ({"mode": "cyclic", "groups": [12]}, ValueError, "parameters of mode BLOCK, not CYCLIC"),
        ({"mode": "iid", "shards_per_block": 2}, ValueError, "parameters of mode BLOCK, not IID"),
        ({"mode": "blocks"}, ValueError, "'cyclic' or 'block'"),
    ],
)
def test_bad_arguments_raise_clear_errors(kwargs, error, words):
    arguments = {"length": 12, "batch_size": 4, "mode": BLOCK, **kwargs}
    with pytest.raises(error, match=words):
        Sampler(**arguments)


def test_too_many_groups_are_refused():
    with pytest.raises(ValueError, match="GROUPS_MAX"):
        Sampler(GROUPS_MAX + 1, 1, BLOCK, groups=np.ones(GROUPS_MAX + 1, np.int64))


def test_cycle_positions_read_any_run_of_a_cycle():
    groups = [5, 1, 9, 3, 12, 7, 2, 8]
    sampler = Sampler(47, 4, BLOCK, 2, groups=groups, shards_per_block=3)
    cycle = reference_cycle(2, 5, groups, 3)
    for offset, count in [(0, 47), (1, 3), (13, 20), (46, 1), (47, 0)]:
        out = np.empty(count, np.uint64)
        assert sampler.cycle_positions(5, offset, out) is out
        np.testing.assert_array_equal(out, cycle[offset : offset + count])
    with pytest.raises(ValueError, match="not inside one cycle of 47"):
        sampler.cycle_positions(5, 40, np.empty(8, np.uint64))
    with pytest.raises(ValueError, match="not inside one cycle"):
        sampler.cycle_positions(5, -1, np.empty(1, np.uint64))
    with pytest.raises(TypeError, match="1-D numpy uint64"):
        sampler.cycle_positions(5, 0, np.empty(2, np.int64))
    with pytest.raises(ValueError, match="writable"):
        sampler.cycle_positions(5, 0, np.empty(4, np.uint64)[::2])
    with pytest.raises(ValueError, match="STEP_MAX"):
        sampler.cycle_positions(2**64, 0, np.empty(1, np.uint64))
    with pytest.raises(ValueError, match="for mode BLOCK, not CYCLIC"):
        Sampler(47, 4, "cyclic").cycle_positions(0, 0, np.empty(1, np.uint64))


# ---- the schedule: elastic resume ---------------------------------------------------------


def test_elastic_resume_continues_the_block_order():
    """Saved mid-cycle with a global batch of 12, resumed with 5: the stream continues at the
    exact next sample of the cycle, drops the cycle's short tail, then reads cycle 1 in 5s."""
    groups = [9, 14, 3, 20, 7, 4]
    length = sum(groups)  # 57
    options = {"groups": groups, "shards_per_block": 2}
    saved = Schedule(Sampler(length, 12, BLOCK, 4, **options))
    fresh = Schedule(Sampler(length, 5, BLOCK, 4, **options))
    resumed = Schedule(fresh.sampler, elastic_anchor(saved, 2, fresh))
    assert resumed.anchor == {"step": 2, "cycle": 0, "offset": 24}
    out = np.empty(5, np.uint64)
    got = np.concatenate([resumed.indices(step, out).copy() for step in range(2, 2 + 6 + 11)])
    cycle0 = reference_cycle(4, 0, groups, 2)
    cycle1 = reference_cycle(4, 1, groups, 2)
    # (57 - 24) // 5 = 6 more batches of cycle 0, 3 samples dropped, then 11 of cycle 1.
    np.testing.assert_array_equal(got, np.concatenate([cycle0[24:54], cycle1[:55]]))
    # The ranks of the resumed loader still join into its global batch.
    ranks = [
        Schedule(
            Sampler(length, 1, BLOCK, 4, shard=(rank, 5), **options),
            elastic_anchor(saved, 2, fresh),
        )
        for rank in range(5)
    ]
    one = np.empty(1, np.uint64)
    for step in (2, 3, 9):
        joined = np.concatenate([rank.indices(step, one).copy() for rank in ranks])
        np.testing.assert_array_equal(joined, resumed.indices(step, out))


# ---- through the DataLoader ------------------------------------------------------------


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """Labels 0..89 in five shards of 10, 25, 5, 30 and 20 rows."""
    path = tmp_path_factory.mktemp("block") / "labels"
    start = 0
    for k, rows in enumerate([10, 25, 5, 30, 20]):
        shards.write_shard(path, k, np.arange(start, start + rows, dtype=np.int64), codec="raw")
        start += rows
    shards.commit(path)
    with DenseDataset(path) as dataset:
        yield dataset


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    path = tmp_path_factory.mktemp("block") / "single"
    from_numpy(path, np.arange(90, dtype=np.int64), codec="raw", progress=False)
    with DenseDataset(path) as dataset:
        yield dataset


def block_loader(dataset, **options):
    settings = {"num_workers": 2, "mode": "block", "seed": 3, "shards_per_block": 2}
    return DataLoader({"y": dataset}, **{**settings, **options})


def test_the_loader_groups_by_shards_and_reads_the_sampler(sharded):
    with block_loader(sharded, batch_size=8) as loader:
        sampler = Sampler(90, 8, BLOCK, 3, groups=[10, 25, 5, 30, 20], shards_per_block=2)
        assert loader.steps_per_epoch == 11 and loader.epoch == 0
        for step in range(25):
            np.testing.assert_array_equal(next(loader)["y"], sampler.batch(step))
        assert loader.epoch == 2
        state = loader.state_dict()
    assert state["block"]["groups"] == 5 and state["block"]["shards_per_block"] == 2


def test_a_single_store_gets_equal_groups(single):
    with block_loader(single, batch_size=8, num_workers=0) as loader:
        sampler = Sampler(90, 8, BLOCK, 3, groups=equal_groups(90), shards_per_block=2)
        np.testing.assert_array_equal(next(loader)["y"], sampler.batch(0))


def test_the_loader_resumes_exactly_and_elastically(sharded):
    with block_loader(sharded, batch_size=6, shard=(1, 2)) as old:
        [next(old) for _ in range(4)]
        state = json.loads(json.dumps(old.state_dict()))
    with block_loader(sharded, batch_size=6, shard=(1, 2)) as same:
        same.load_state_dict(state)
        np.testing.assert_array_equal(
            next(same)["y"],
            Sampler(90, 6, BLOCK, 3, (1, 2), groups=[10, 25, 5, 30, 20], shards_per_block=2).batch(
                4
            ),
        )
    with block_loader(sharded, batch_size=5, num_workers=0) as new:
        new.load_state_dict(state)
        got = np.concatenate([next(new)["y"] for _ in range(12)])
    cycle0 = reference_cycle(3, 0, [10, 25, 5, 30, 20], 2)
    cycle1 = reference_cycle(3, 1, [10, 25, 5, 30, 20], 2)
    # 48 of cycle 0 read; (90 - 48) // 5 = 8 more batches; 2 dropped; then cycle 1.
    np.testing.assert_array_equal(got, np.concatenate([cycle0[48:88], cycle1[:20]]))


def test_the_loader_refuses_a_state_of_other_blocks(sharded, single):
    with block_loader(sharded, batch_size=6) as old:
        state = old.state_dict()
    with block_loader(sharded, batch_size=6, shards_per_block=3) as other:
        with pytest.raises(ValueError, match="same shards_per_block"):
            other.load_state_dict(state)
    with block_loader(single, batch_size=6) as other:
        with pytest.raises(ValueError, match="saved in BLOCK mode with groups"):
            other.load_state_dict(state)
    with block_loader(sharded, batch_size=6, mode="cyclic", shards_per_block=None) as cyclic:
        with pytest.raises(ValueError, match="mode=BLOCK .this loader: CYCLIC"):
            cyclic.load_state_dict(state)
        cyclic_state = cyclic.state_dict()
    with block_loader(sharded, batch_size=6) as block:
        with pytest.raises(ValueError, match="mode=<Mode.CYCLIC: 2> .this loader: <Mode.BLOCK: 3>"):
            block.load_state_dict(cyclic_state)
        damaged = {**state, "block": None}
        with pytest.raises(ValueError, match="the state is damaged"):
            block.load_state_dict(damaged)


def test_loader_arguments_are_checked(sharded, single, tmp_path):
    with pytest.raises(ValueError, match="parameters of mode BLOCK, not IID"):
        block_loader(sharded, mode="iid")
    with pytest.raises(ValueError, match="BLOCK does not combine with weights"):
        DataLoader([{"y": sharded}, {"y": single}], mode="block", weights=[1, 1], batch_size=4)
    path = tmp_path / "other"
    for k in range(3):
        shards.write_shard(path, k, np.arange(30 * k, 30 * k + 30, dtype=np.int64), codec="raw")
    shards.commit(path)
    with DenseDataset(path) as other:
        with pytest.raises(ValueError, match="shard row counts differ"):
            DataLoader({"y": sharded, "z": other}, mode="block", batch_size=4)
        # A single store next to a sharded one: the shards are the groups.
        with DataLoader({"y": sharded, "z": single}, mode="block", batch_size=4) as loader:
            assert loader._sampler.groups == (10, 25, 5, 30, 20)


def test_packing_reads_the_documents_in_block_order(tmp_path):
    """A packed BLOCK loader packs the documents in the BLOCK order of the shards."""
    lengths = np.random.default_rng(1).integers(1, 12, 30)
    docs = [np.arange(n, dtype=np.int32) + 100 * i for i, n in enumerate(lengths)]
    for k, (first, end) in enumerate([(0, 10), (10, 18), (18, 30)]):
        shards.write_shard(tmp_path / "tokens", k, docs[first:end])
    shards.commit(tmp_path / "tokens")
    options = {"batch_size": 2, "seed": 5, "num_workers": 0, "packing": Packing(4)}
    with (
        RaggedDataset(tmp_path / "tokens") as dataset,
        DataLoader({"tokens": dataset}, mode="block", shards_per_block=2, **options) as loader,
    ):
        got = np.concatenate([next(loader)["tokens"].reshape(-1) for _ in range(5)])
    order = Sampler(30, 30, BLOCK, 5, groups=[10, 8, 12], shards_per_block=2).batch(0)
    np.testing.assert_array_equal(got, np.concatenate([docs[i] for i in order])[: got.size])


# ---- the library checks its caller ----------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"group_count": 0}, "1..1048576 groups, got 0"),
        ({"per_block": 0}, "shards_per_block is 0"),
        ({"scratch_count": 6}, "need 2 * groups + 1 = 7"),
        ({"group_count": 2}, "not from 0 to the sampler length 12"),
        ({"starts": [0, 5, 5, 12]}, "group 1 holds no rows"),
        ({"mode": 2}, "mode is 2: call lx_sampler_batch"),
    ],
)
def test_the_library_refuses_bad_groups_itself(fields, words):
    """Python validates first; the library must not trust its caller anyway."""
    mode = fields.pop("mode", 3)
    config = ffi.new(
        "lx_sampler_config *",
        {"length": 12, "batch_size": 4, "seed": 1, "rank": 0, "world_size": 1, "mode": mode},
    )
    starts = ffi.new("uint64_t[]", fields.pop("starts", [0, 3, 7, 12]))
    scratch = ffi.new("uint64_t[]", 7)
    values = {"starts": starts, "group_count": 3, "per_block": 2, "scratch": scratch}
    blocks = ffi.new("lx_sampler_blocks *", {**values, "scratch_count": 7, **fields})
    out = ffi.new("uint64_t[]", 4)
    status = lib.lx_sampler_block_batch(config, blocks, 0, out, 4)
    assert status != 0
    with pytest.raises(ZrecordError, match=re.escape(words)):
        check(status)


def test_the_library_refuses_positions_past_the_cycle():
    config = ffi.new(
        "lx_sampler_config *",
        {"length": 12, "batch_size": 4, "seed": 1, "rank": 0, "world_size": 1, "mode": 3},
    )
    starts = ffi.new("uint64_t[]", [0, 3, 7, 12])
    scratch = ffi.new("uint64_t[]", 7)
    blocks = ffi.new(
        "lx_sampler_blocks *",
        {
            "starts": starts,
            "group_count": 3,
            "per_block": 2,
            "scratch": scratch,
            "scratch_count": 7,
        },
    )
    out = ffi.new("uint64_t[]", 5)
    assert lib.lx_sampler_block_positions(config, blocks, 0, 7, out, 5) == 0
    status = lib.lx_sampler_block_positions(config, blocks, 0, 8, out, 5)
    with pytest.raises(ZrecordError, match=re.escape("8..8+5 run past the cycle's length 12")):
        check(status)
