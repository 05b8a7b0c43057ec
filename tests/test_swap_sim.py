"""The one directory swap (loaderx._fs.DirectorySwap, swap_in, the leftover
rule) under the simulated file system (tests/simfs.py states the model), for
every user of it above ArrayStore: the converters' first creation and
overwrite, sharded datasets (write_shard, commit) and the CLI's Parquet
conversion. ArrayStore's own users of the swap run in test_arraystore_sim.py.

For each workload (a list of calls, checked against the contents each call
acknowledges):

- power loss before every mutating call (several crash seeds each): the
  target opens whole, holding what the last acknowledged call wrote or
  (for the call in flight) what that call writes; a rerun of the workload's
  calls is never refused because of what the cut left, and leaves only the
  target and its lock file;
- a fault (EIO, ENOSPC) at every fallible call, one-shot and sticky: the call
  raises an OSError, the target is old or new whole, in the process and after
  a power cut right then, and once the fault clears the call succeeds.

Each run counts toward the totals printed at the end (the report's numbers);
LOADERX_SOAK=1 runs the soak variant with many more seeds.
"""

from __future__ import annotations

import errno
import time

import numpy as np
import pytest
from simfs import MOUNT, PowerLoss, SimFs

from loaderx import DenseDataset, RaggedDataset, from_iterator, from_numpy, shards
from loaderx._fs import LOCK_PREFIX, DirectorySwap, readable_path, swap_in

PARENT = MOUNT + "/data"
TARGET = PARENT + "/store"
COUNTS: dict[str, int] = {}


def counted(kind: str, runs: int = 1) -> None:
    COUNTS[kind] = COUNTS.get(kind, 0) + runs


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("swapsim"))
    yield path
    print(f"\nsimulated runs through the one directory swap in this module: {COUNTS}")


def new_sim(workdir: str, exchange: bool) -> SimFs:
    sim = SimFs(workdir, {})
    sim.exchange_works = exchange
    return sim


def swap_calls(monkeypatch) -> list:
    """Records every swap_in call (proof that a workload runs through the one swap)."""
    calls = []
    import loaderx._fs as fs_module

    def recording(staging, target, fs=fs_module.OS_FS):
        calls.append(target)
        return swap_in(staging, target, fs)

    monkeypatch.setattr(fs_module, "swap_in", recording)
    return calls


# ---- converters: first creation and overwrite -----------------------------------

DENSE = [
    np.arange(6, dtype=np.int32),
    np.arange(40, 52, dtype=np.int32).reshape(4, 3),
    np.zeros(0, dtype=np.int32),
]
RAGGED = [[np.arange(3, dtype=np.int16), np.arange(0, dtype=np.int16)], [b"abc"]]


def convert(sim: SimFs, op) -> None:
    kind, value = op
    if kind == "numpy":
        from_numpy(TARGET, value, codec="raw", progress=False, _fs=sim)
    else:
        from_iterator(TARGET, value, codec="zstd", progress=False, _fs=sim)


def expected(op):
    kind, value = op
    if kind == "numpy":
        return ("dense", value.dtype.str, value.shape, value.tobytes())
    return (
        "ragged",
        tuple(
            np.frombuffer(item, np.uint8).tobytes() if isinstance(item, bytes) else item.tobytes()
            for item in value
        ),
    )


def read_target(sim: SimFs, target: str = TARGET):
    """What a reader opening the target sees, opened whole (None when there
    is no store): DenseDataset's rule, through ``readable_path``."""
    path = readable_path(target, sim)
    if not sim.exists(path):
        return None
    if not sim.isfile(path + "/schema.msgpack"):
        assert not sim.isfile(path + "/superblock"), "a store without its schema at the target"
        assert sim.listdir(path) == [], f"a half state at the target: {sim.listdir(path)}"
        return None
    real = sim.real_path(path)
    try:
        with DenseDataset(real) as dataset:
            array = dataset[:]
            return ("dense", array.dtype.str, array.shape, array.tobytes())
    except ValueError:
        with RaggedDataset(real) as dataset:
            return (
                "ragged",
                tuple(np.asarray(dataset[index]).tobytes() for index in range(len(dataset))),
            )


CONVERSIONS = [
    ("numpy", DENSE[0]),
    ("numpy", DENSE[1]),
    ("iterator", RAGGED[0]),
    ("numpy", DENSE[2]),
    ("iterator", RAGGED[1]),
]


def run_ops(sim: SimFs, ops, apply, at: int | None, seed: int) -> int:
    """Applies ``ops`` with power lost before mutating call ``at``; returns the calls
    acknowledged."""
    sim.arm_crash(at)
    acked = 0
    try:
        for op in ops:
            apply(sim, op)
            acked += 1
    except PowerLoss:
        pass
    sim.crash(seed)
    return acked


def assert_clean(sim: SimFs, parent: str, names: set) -> None:
    listing = set(sim.listdir(parent))
    allowed = names | {LOCK_PREFIX + name for name in names}
    assert listing <= allowed, f"leftovers: {sorted(listing - allowed)}"


def crash_points(workdir: str, ops, apply, seeds: int):
    """For each of RENAME_EXCHANGE on and off, each mutating call of ``ops``
    and ``seeds`` crash seeds: yields (sim after the cut, calls acknowledged,
    a context for messages)."""
    for exchange in (True, False):
        sim = new_sim(workdir, exchange)
        run_ops(sim, ops, apply, None, 0)
        total = sim.mutations
        for at in range(total + 1):
            for seed in range(seeds):
                sim = new_sim(workdir, exchange)
                acked = run_ops(sim, ops, apply, at, seed)
                yield (
                    sim,
                    acked,
                    f"exchange={exchange}, crash before mutation {at} of {total}, seed {seed}, "
                    f"{acked} calls acknowledged",
                )


def sweep_conversion_crashes(workdir: str, seeds: int) -> int:
    runs = 0
    for sim, acked, context in crash_points(workdir, CONVERSIONS, convert, seeds):
        possible = [expected(CONVERSIONS[acked - 1]) if acked else None]
        if acked < len(CONVERSIONS):
            possible.append(expected(CONVERSIONS[acked]))
        assert read_target(sim) in possible, (
            f"the target is at no acknowledged or in-flight state ({context})"
        )
        convert(sim, CONVERSIONS[-1])  # a rerun is never refused because of what the cut left
        assert read_target(sim) == expected(CONVERSIONS[-1]), context
        assert_clean(sim, PARENT, {"store"})
        runs += 1
    return runs


def test_power_loss_at_every_call_of_creation_and_overwrite(workdir, monkeypatch):
    """from_numpy / from_iterator creating a store, then overwriting it (mode
    "w") with other dtypes, kinds and an empty array, with and without
    RENAME_EXCHANGE: every power cut leaves the old or the new store whole,
    and the path works for the next conversion."""
    calls = swap_calls(monkeypatch)
    started = time.perf_counter()
    runs = sweep_conversion_crashes(workdir, seeds=2)
    counted("converter power losses", runs)
    print(f"\n{runs} power losses in {time.perf_counter() - started:.1f} s")
    assert runs >= 120 and calls


CODES = [errno.EIO, errno.ENOSPC]


def sweep_faults(workdir: str, exchange: bool, setup, ops, apply, read, states, clean) -> int:
    """Every fault (CODES, one-shot and sticky) at every fallible call of
    ``ops`` run after ``setup``: the call raises an OSError with the errno,
    ``read`` (what a reader sees) is the state before or after the call, in
    the process and after a power cut right then; once the fault clears the
    call succeeds, and the end state is ``states[-1]``, with no leftovers
    (``clean``) once the last call has run once more."""
    sim = new_sim(workdir, exchange)
    run_ops(sim, setup, apply, None, 0)
    sim.count_from_here()
    for op in ops:
        apply(sim, op)
    kinds = list(sim.fallible_kinds)
    runs = 0
    for at in range(len(kinds)):
        for code in CODES:
            for sticky in (False, True):
                sim = new_sim(workdir, exchange)
                run_ops(sim, setup, apply, None, 0)
                sim.fail(at, code, sticky)
                context = (
                    f"exchange={exchange}, fault {errno.errorcode[code]} at call {at} "
                    f"({kinds[at]}), sticky={sticky}"
                )
                for step, op in enumerate(ops, start=1):
                    try:
                        apply(sim, op)
                        continue
                    except OSError as exc:
                        assert exc.errno == code, f"lost the errno: {exc!r} ({context})"
                    allowed = states[step - 1 : step + 1]
                    sim.clear_faults()  # (reading needs a working disk)
                    assert read(sim) in allowed, f"after the error: a half state ({context})"
                    sim.crash(at)
                    assert read(sim) in allowed, (
                        f"after a power cut at the error: a half state ({context})"
                    )
                    apply(sim, op)  # works again
                assert read(sim) == states[-1], context
                sim.clear_faults()
                apply(
                    sim, ops[-1]
                )  # garbage a fault left (a failed deletion) is the next writer's to delete
                assert read(sim) == states[-1], context
                clean(sim)
                runs += 1
    return runs


def sweep_conversion_faults(workdir: str, exchange: bool) -> int:
    """Every fault at every fallible call of two overwrites."""
    first, ops = CONVERSIONS[:1], CONVERSIONS[1:3]
    states = [expected(op) for op in first + ops]
    return sweep_faults(
        workdir,
        exchange,
        first,
        ops,
        convert,
        read_target,
        states,
        lambda sim: assert_clean(sim, PARENT, {"store"}),
    )


def test_every_fault_at_every_call_of_an_overwrite(workdir):
    """EIO and ENOSPC at each fallible call of two overwrites, one-shot and
    sticky, with and without RENAME_EXCHANGE: an OSError with its errno,
    never a half store, and the next conversion works."""
    runs = sum(sweep_conversion_faults(workdir, exchange) for exchange in (True, False))
    counted("converter faults", runs)
    assert runs >= 100


def test_a_second_overwriter_gets_store_locked_error(workdir):
    """While one conversion holds the path's lock, a second one (any mode)
    raises StoreLockedError and changes nothing."""
    from loaderx import StoreLockedError

    sim = new_sim(workdir, True)
    convert(sim, CONVERSIONS[0])
    handle = sim.lock(PARENT + "/" + LOCK_PREFIX + "store")
    for mode in ("w", "x"):
        with pytest.raises(StoreLockedError, match="another process"):
            from_numpy(TARGET, DENSE[1], codec="raw", progress=False, mode=mode, _fs=sim)
    sim.unlock(handle)
    assert read_target(sim) == expected(CONVERSIONS[0])


# ---- sharded datasets ---------------------------------------------------------------

DATASET = PARENT + "/shards"
SHARD_OPS = [
    ("write", 0, DENSE[0][:4]),
    ("write", 1, DENSE[0][4:]),
    ("commit",),
    ("write", 2, DENSE[0][:1]),
    ("write", 2, DENSE[0][1:3]),
    ("commit",),
]


def apply_shard(sim: SimFs, op) -> None:
    if op[0] == "write":
        shards.write_shard(DATASET, op[1], op[2], codec="raw", overwrite=True, _fs=sim)
    else:
        shards.commit(DATASET, _fs=sim)


def shard_model(ops) -> list:
    """After each prefix of ops: (shards written, the committed dataset as a tuple of shard contents
    or None)."""
    written, committed, states = {}, None, [({}, None)]
    for op in ops:
        if op[0] == "write":
            written = {**written, op[1]: op[2].tobytes()}
        else:
            committed = tuple(written[k] for k in sorted(written))
        states.append((written, committed))
    return states


def read_dataset(sim: SimFs):
    """The committed dataset (shard contents in manifest order), checked whole, or None."""
    if not shards.is_sharded(DATASET, _fs=sim):
        return None
    manifest = shards.read_manifest(DATASET, _fs=sim)
    contents = []
    for name, rows in zip(manifest.names, manifest.rows):
        with DenseDataset(sim.real_path(f"{DATASET}/{name}")) as shard:
            assert len(shard) == rows, f"{name} holds {len(shard)} rows, the manifest says {rows}"
            contents.append(shard[:].tobytes())
    return tuple(contents)


def sweep_shard_crashes(workdir: str, seeds: int) -> int:
    states = shard_model(SHARD_OPS)
    runs = 0
    for sim, acked, context in crash_points(workdir, SHARD_OPS, apply_shard, seeds):
        possible = [states[acked][1]] + ([states[acked + 1][1]] if acked < len(SHARD_OPS) else [])
        assert read_dataset(sim) in possible, (
            f"the committed dataset is not what commit acknowledged ({context})"
        )
        for k, content in states[acked][0].items():
            with DenseDataset(
                sim.real_path(readable_path(f"{DATASET}/{shards.shard_name(k)}", sim))
            ) as shard:
                in_flight = acked < len(SHARD_OPS) and SHARD_OPS[acked][:2] == ("write", k)
                allowed = [content] + ([SHARD_OPS[acked][2].tobytes()] if in_flight else [])
                assert shard[:].tobytes() in allowed, (
                    f"acknowledged shard {k} is not whole ({context})"
                )
        for op in SHARD_OPS[acked:]:
            apply_shard(sim, op)  # the rest of the run works on what the cut left
        assert read_dataset(sim) == states[-1][1], context
        listing = set(sim.listdir(DATASET))
        assert not {name for name in listing if name.startswith((".new-", ".prev-", ".tmp"))}, (
            f"leftovers {sorted(listing)} ({context})"
        )
        runs += 1
    return runs


def test_power_loss_at_every_call_of_sharded_writes_and_commits(workdir, monkeypatch):
    """write_shard (new and overwritten shards) and commit, with and without
    RENAME_EXCHANGE: after any power cut the committed dataset is the one the
    last acknowledged commit made (or the one in flight), every acknowledged
    shard is whole, and the run resumes. Regression: the dataset directory's
    entry was never fsynced, so a cut after commit() returned could drop the
    whole dataset (the sweep checks the acknowledged commit survives)."""
    calls = swap_calls(monkeypatch)
    runs = sweep_shard_crashes(workdir, seeds=1)
    counted("shards power losses", runs)
    assert runs >= 70 and calls


def test_every_fault_at_every_call_of_sharded_writes_and_commits(workdir):
    """EIO and ENOSPC at each fallible call of a shard overwrite, a new shard
    and a commit, one-shot and sticky, with and without RENAME_EXCHANGE: the
    committed dataset is the old or the new one, never a half one."""
    setup = SHARD_OPS[:2]  # shards 0 and 1 written, nothing committed
    ops = [("write", 1, DENSE[1][:, 0].copy()), ("write", 2, DENSE[0][:2]), ("commit",)]
    states = [
        None,
        None,
        None,
        (DENSE[0][:4].tobytes(), DENSE[1][:, 0].copy().tobytes(), DENSE[0][:2].tobytes()),
    ]

    def clean(sim: SimFs) -> None:
        listing = sim.listdir(DATASET)
        assert not [name for name in listing if name.startswith((".new-", ".prev-"))], listing

    runs = sum(
        sweep_faults(workdir, exchange, setup, ops, apply_shard, read_dataset, states, clean)
        for exchange in (True, False)
    )
    counted("shards faults", runs)
    assert runs >= 100


def test_commit_refuses_while_a_writer_runs_and_leaves_its_staging(workdir):
    """Regression: commit deleted the temporary directory of a write_shard
    still running for another shard. Now commit raises StoreLockedError while
    any writer runs (they share the dataset's manifest lock, commit takes it
    exclusively), and a writer raises it while commit runs."""
    from loaderx import StoreLockedError

    sim = new_sim(workdir, True)
    for op in SHARD_OPS[:3]:
        apply_shard(sim, op)
    writer = sim.lock(DATASET + "/" + LOCK_PREFIX + shards.MANIFEST_FILE, shared=True)
    sim.build_store(
        DATASET + "/.new-shard-00002",
        lambda path: from_numpy(path, DENSE[0], progress=False, _staged=True),
    )
    with pytest.raises(StoreLockedError, match="write_shard is running"):
        shards.commit(DATASET, _fs=sim)
    assert sim.exists(DATASET + "/.new-shard-00002"), (
        "commit deleted a running writer's staging directory"
    )
    apply_shard(sim, ("write", 3, DENSE[0]))  # writers share the lock
    sim.unlock(writer)
    committing = sim.lock(DATASET + "/" + LOCK_PREFIX + shards.MANIFEST_FILE)
    with pytest.raises(StoreLockedError, match="commit is running"):
        apply_shard(sim, ("write", 4, DENSE[0]))
    sim.unlock(committing)
    apply_shard(
        sim, ("write", 2, DENSE[0])
    )  # the killed writer's staging is the next writer's to clean
    assert shards.commit(DATASET, _fs=sim) == 4 + 2 + 6 + 6
    assert not sim.exists(DATASET + "/.new-shard-00002")


# ---- the CLI's Parquet conversion ---------------------------------------------------------

COLUMNS = PARENT + "/cols"


def test_power_loss_and_faults_at_every_call_of_the_cli_parquet_convert(workdir, monkeypatch):
    """loaderx convert of Parquet (first conversion, then a replacement, with
    and without RENAME_EXCHANGE): after any power cut, and at any fault, the
    column directory opens whole, old or new."""
    pytest.importorskip("pyarrow")
    import pyarrow as pa

    from loaderx import cli
    from loaderx.arrow import from_arrow, open_columns

    tables = [
        pa.table({"a": np.arange(5, dtype=np.int64)}),
        pa.table({"a": np.arange(7, 10, dtype=np.int64), "b": np.ones(3)}),
    ]

    def run(sim: SimFs, table) -> None:
        cli._write_columns(
            COLUMNS,
            "w",
            lambda staging: from_arrow(staging, table, codec="raw", progress=False),
            sim,
        )

    def read(sim: SimFs):
        path = readable_path(COLUMNS, sim)  # open_columns' rule
        if not sim.exists(path + "/columns.msgpack"):
            return None
        opened = open_columns(sim.real_path(path))
        try:
            return {name: dataset[:].tobytes() for name, dataset in opened.items()}
        finally:
            for dataset in opened.values():
                dataset.close()

    states = [None] + [
        {name: table.column(name).to_numpy().tobytes() for name in table.column_names}
        for table in tables
    ]
    calls = swap_calls(monkeypatch)
    runs = 0
    for sim, acked, context in crash_points(workdir, tables, run, seeds=3):
        assert read(sim) in states[acked : acked + 2], context
        run(sim, tables[-1])
        assert read(sim) == states[-1], context
        assert_clean(sim, PARENT, {"cols"})
        runs += 1
    counted("cli convert power losses", runs)
    assert runs >= 60 and calls
    clean = lambda sim: assert_clean(sim, PARENT, {"cols"})  # noqa: E731
    faults = sum(
        sweep_faults(workdir, exchange, tables[:1], tables[1:], run, read, states[1:], clean)
        for exchange in (True, False)
    )
    counted("cli convert faults", faults)
    assert faults >= 40


# ---- the swap itself ------------------------------------------------------------------------


def test_a_two_rename_swap_cut_short_is_put_back(workdir):
    """The leftover rule: ``.prev-<name>`` without ``<name>`` (a two-rename
    swap cut between its renames) comes back as ``<name>``; a lone
    ``.new-<name>`` is deleted; nothing else is touched."""
    sim = new_sim(workdir, False)
    convert(sim, CONVERSIONS[0])
    sim.rename(TARGET, PARENT + "/.prev-store")
    sim.build_store(
        PARENT + "/.new-store",
        lambda path: from_numpy(path, DENSE[1], progress=False, _staged=True),
    )
    sim.write_new(PARENT + "/other", b"user data")
    with DirectorySwap(TARGET, sim, RuntimeError):
        pass
    assert read_target(sim) == expected(CONVERSIONS[0])
    assert sorted(sim.listdir(PARENT)) == [".lock-store", "other", "store"]


# ---- soak -----------------------------------------------------------------------------------


@pytest.mark.soak
def test_soak_swap_power_loss(workdir):
    """The converter and shard sweeps with many more crash seeds per crash point."""
    started = time.perf_counter()
    runs = sweep_conversion_crashes(workdir, seeds=120) + sweep_shard_crashes(workdir, seeds=40)
    counted("soak power losses", runs)
    print(
        f"\n{runs} simulated power losses through the swap in {time.perf_counter() - started:.0f} s"
    )
    assert runs >= 10_000
