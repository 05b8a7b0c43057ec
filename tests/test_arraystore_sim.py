"""ArrayStore's directory protocol on a simulated disk: power loss at every
file-system call, and every fault at every call.

The simulated file system (tests/simfs.py, whose docstring states the model)
replaces the seam loaderx._fs.OsFs. Names and directory entries are durable
only after an fsync of their directory, file bytes only after an fsync of the
file; a power cut keeps or drops each pending operation and tears pending
writes at 512-byte sectors. Zrecord store directories are opaque blobs,
durable once built, whose own entry follows the directory rule.

Each workload is a list of ``save``/``drop``/``reset`` calls and batch
blocks (``batch_mode`` with saves, row edits, appends and drops inside;
``writable_batch_mode`` with in-place edits), checked against a model (the
dict of arrays after each call, computed with NumPy):

- power loss before every mutating call (exhaustively, several seeds each):
  the store reopens, holds the state after every acknowledged call and
  possibly the call in flight (never part of one), and the next writer's
  recovery leaves no staging entry;
- a fault (EIO, ENOSPC, failed fsync) at every fallible call, one-shot and
  sticky: the call raises an OSError that names what failed (an
  ArrayStoreIOError saying what the call left, for save/drop), the state is
  the one the error says, in the process and after a power cut right after
  the error, and once the fault clears the store works on.

Replay a failure: the assertion message names the calls, the call index and
the crash seed, and ``run_crash(workdir, {}, ops, at, seed, exchange)`` or
``run_fault(workdir, {}, ops, at, code, sticky, exchange)`` reproduces it;
random workloads print their seed, which LOADERX_SIM_SEED replays.
LOADERX_SIM_SEEDS raises the seeds per crash point (default 20); the soak runs
use 200,000 crash points and faults.
"""

from __future__ import annotations

import errno
import os
import random
import re
import time
import zlib
from pathlib import Path

import msgpack
import numpy as np
import pytest
from simfs import MOUNT, PowerLoss, SimFs

import loaderx._arraybatch as arraybatch_module
import loaderx._arraycommit as arraycommit_module
import loaderx._arraydrop as arraydrop_module
import loaderx._arrayview as arrayview_module
import loaderx.arraystore as arraystore_module
from loaderx import ArrayStore
from loaderx._arraydrop import DELETES_PREFIX
from loaderx.arraystore import COMMIT_FILE, LOCK_FILE, MARKER_FILE
from loaderx.zrecord import Zrecord

ROOT = MOUNT + "/store"


def workload_seed() -> int:
    """The random workloads' seed: LOADERX_SIM_SEED, or a fresh one (printed)."""
    seed = int(os.environ.get("LOADERX_SIM_SEED", random.randrange(1 << 30)))
    print(f"\nworkload seed {seed} (LOADERX_SIM_SEED={seed} replays it)")
    return seed


SEEDS = max(20, int(os.environ.get("LOADERX_SIM_SEEDS", "20")))  # crash seeds per crash point

A = np.arange(6, dtype=np.float32).reshape(3, 2)
B = np.array([1, -2, 3, -4, 5], dtype=np.int8)
C = np.array(2.5)  # 0-d
D = np.zeros((0, 3), dtype=np.int16)
E = np.array([[True, False], [False, True]])
ARRAYS = [A, B, C, D, E]

BATCH_OPS = [
    ("save", {"x": A, "y": B}),
    (
        "batch",
        [("replace", "x", 1, np.array([9, 9], np.float32)), ("replace", "y", [0, 4], [7, 7])],
    ),
    ("wbatch", [("x", 0, 5), ("y", 3, -1)]),
    (
        "batch",
        [("append", "y", [1, 2]), ("droprows", "x", [0]), ("save", {"z": E}), ("drop", ["z"])],
    ),
    ("batch", [("append", "y", [3])]),  # one array rewritten: the one-rename commit
    ("batch", [("drop", ["x"]), ("save", {"w": C}), ("replace", "y", 2, 5)]),
    ("batch", [("reset",), ("save", {"x": D})]),
]

# Short workloads, swept exhaustively: multi-array saves over existing and new
# names, a replace of a whole array, drops of one and several, reset.
WORKLOADS = {
    "save-drop": [
        ("save", {"x": A, "y": B}),
        ("save", {"x": C, "y": A}),
        ("drop", ["y"]),
        ("save", {"y": D, "z": E}),
        ("drop", ["x", "z"]),
        ("reset",),
    ],
    "replace": [
        ("save", {"x": A}),
        ("save", {"x": B}),
        ("save", {"x": C, "w": E}),
        ("drop", ["w", "x"]),
    ],
    # Batch modes: each block is one commit of every array it changed. (A
    # block that edits rows of one array only is that store's own replace,
    # outside this model: see no_native_row_edits.)
    "batch": BATCH_OPS,
    # A clone is a one-array save of a copy of the source's files.
    "clone": [
        ("save", {"x": A, "y": C}),
        ("clone", "x", "z"),
        ("clone", "y", "w"),
        ("drop", ["x"]),
        ("clone", "z", "x"),
    ],
}


@pytest.fixture(autouse=True)
def no_native_row_edits(monkeypatch):
    """A store's own row edits bypass the simulated disk (and would change
    the memoised store directories): every workload here must commit through
    the seam, so they fail the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("a native row edit in the simulator: commit through the seam")

    for method in ("replace", "delete"):  # (append also builds every store)
        monkeypatch.setattr(Zrecord, method, refuse)
    # compact() compacts an array without dropped rows in place, the store's
    # own commit, which changes no row: nothing here (a retried compact()
    # after a fault finds arrays it already rewrote).
    monkeypatch.setattr(Zrecord, "compact", lambda self: None)


@pytest.fixture(scope="module")
def memo():
    return {}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("simstores"))


def apply_op(store: ArrayStore, op) -> None:
    kind = op[0]
    if kind == "save":
        store.save(op[1])
    elif kind == "drop":
        store.drop(op[1])
    elif kind == "replace":
        store.replace({op[1]: op[3]}, op[2])
    elif kind == "append":
        store.append({op[1]: op[2]})
    elif kind == "droprows":
        store.drop(op[1], op[2])
    elif kind == "clone":  # ("clone", src, dst): one commit, like a save of dst
        store.clone(op[1], op[2])
    elif kind == "compact":  # arrays with dropped rows: one commit each, like a save
        store.compact()
    elif kind == "batch":  # ("batch", [inner ops]): one batch_mode block, one commit
        with store.batch_mode():
            for inner in op[1]:
                apply_op(store, inner)
    elif kind == "wbatch":  # ("wbatch", [(name, row, value)]): writable_batch_mode edits
        with store.writable_batch_mode():
            for name, row, value in op[1]:
                store.load(name)[row] = value
    else:
        store.reset()


def model_states(ops) -> list:
    """The expected state before the first call and after each call."""
    state, states = {}, [{}]
    for op in ops:
        state = model_op(dict(state), op)
        states.append({name: _frozen(array) for name, array in state.items()})
    return states


def model_op(state: dict, op) -> dict:
    """``state`` (name -> array) after ``op``, computed with NumPy."""
    kind = op[0]
    if kind == "save":
        state.update({name: np.array(array) for name, array in op[1].items()})
    elif kind == "drop":
        for name in op[1]:
            del state[name]
    elif kind == "replace":
        state[op[1]] = state[op[1]].copy()
        state[op[1]][op[2]] = op[3]
    elif kind == "append":
        state[op[1]] = np.concatenate([state[op[1]], np.asarray(op[2], state[op[1]].dtype)])
    elif kind == "droprows":
        state[op[1]] = np.delete(state[op[1]], op[2], axis=0)
    elif kind == "clone":
        state[op[2]] = state[op[1]].copy()
    elif kind == "compact":
        pass
    elif kind == "batch":
        for inner in op[1]:
            state = model_op(state, inner)
    elif kind == "wbatch":
        for name, row, value in op[1]:
            state[name] = state[name].copy()
            state[name][row] = value
    else:
        state = {}
    return state


def _frozen(array: np.ndarray) -> tuple:
    return (array.dtype.str, array.shape, array.tobytes())


def read_state(store: ArrayStore) -> dict:
    return {name: _frozen(store.load(name)) for name in store.get_member_list()}


def settle_and_list(store: ArrayStore, sim: SimFs) -> list:
    """Runs the writer's recovery (``drop([])`` is a write that changes
    nothing) and returns the root's listing."""
    store.drop([])
    return sim.listdir(ROOT)


def assert_clean(listing: list, state: dict, context: str) -> None:
    allowed = {MARKER_FILE, LOCK_FILE, *state, *(DELETES_PREFIX + name for name in state)}
    assert set(listing) <= allowed, (
        f"leftovers after recovery: {sorted(set(listing) - allowed)} ({context})"
    )


def new_sim(workdir: str, memo: dict, exchange: bool) -> SimFs:
    sim = SimFs(workdir, memo)
    sim.exchange_works = exchange
    return sim


def abandon(store) -> None:
    """Drops a store object whose process 'died' in the power cut."""
    if store is not None:
        for entry in store._arrays.values():
            entry.close()
        store._closed = True


# ---- power loss ------------------------------------------------------------------


def count_mutations(workdir, memo, ops, exchange: bool) -> int:
    sim = new_sim(workdir, memo, exchange)
    sim.arm_crash(None)
    with ArrayStore(ROOT, _fs=sim) as store:
        for op in ops:
            apply_op(store, op)
    return sim.mutations


def run_until_cut(sim, ops, at: int, seed: int, apply, **options) -> tuple[int, bool]:
    """Runs ``ops`` (each through ``apply``) on an ArrayStore opened with
    ``options`` over ``sim``, with power lost before the ``at``-th mutating
    call, then lets ``seed`` decide what the cut left. Returns how many calls
    were acknowledged and whether the store had opened."""
    sim.arm_crash(at)
    acked, started, store = 0, False, None
    try:
        store = ArrayStore(ROOT, _fs=sim, **options)
        started = True
        for op in ops:
            apply(store, op)
            acked += 1
        store.close()
    except PowerLoss:
        pass
    sim.crash(seed)
    abandon(store)
    return acked, started


def run_crash(workdir, memo, ops, at: int, seed: int, exchange: bool = True) -> None:
    """Power loss before the ``at``-th mutating call, then the checks of the
    module docstring."""
    states = model_states(ops)
    sim = new_sim(workdir, memo, exchange)
    acked, started = run_until_cut(sim, ops, at, seed, apply_op)
    context = f"exchange={exchange}, ops={ops_text(ops)}, crash before mutation {at}, seed {seed}"
    possible = [states[acked]] + ([states[acked + 1]] if started and acked < len(ops) else [])
    with ArrayStore(ROOT, _fs=sim) as reopened:
        state = read_state(reopened)
        assert state in possible, f"state after power loss is no prefix of the calls ({context})"
        assert_clean(settle_and_list(reopened, sim), state, context)
        assert read_state(reopened) == state, f"recovery changed the state ({context})"


def ops_text(ops) -> str:
    return " ".join(op_text(op) for op in ops)


def op_text(op) -> str:
    if op[0] == "batch":
        return f"batch[{ops_text(op[1])}]"
    if op[0] == "wbatch":
        return f"wbatch[{','.join(f'{name}[{row}]' for name, row, _ in op[1])}]"
    if op[0] in ("replace", "append"):
        return f"{op[0]}({op[1]})"
    if op[0] == "droprows":
        return f"droprows({op[1]}{list(op[2])})"
    if op[0] == "compact":
        return "compact"
    if op[0] == "clone":
        return f"clone({op[1]}->{op[2]})"
    return f"{op[0]}({','.join(sorted(op[1]))})" if len(op) > 1 else op[0]


def sweep_crashes(workdir, memo, seeds: int) -> int:
    runs = 0
    for ops in WORKLOADS.values():
        for exchange in (True, False):
            total = count_mutations(workdir, memo, ops, exchange)
            for at in range(total + 1):
                for seed in range(seeds):
                    run_crash(workdir, memo, ops, at, seed, exchange)
                    runs += 1
    return runs


def test_power_loss_at_every_call_of_save_and_drop(workdir, memo):
    """Exhaustive over the mutating calls of each short workload, with and
    without RENAME_EXCHANGE, SEEDS crash seeds each: every reopened state is
    the model after a prefix that holds every acknowledged call."""
    started = time.perf_counter()
    runs = sweep_crashes(workdir, memo, SEEDS)
    print(f"\n{runs} simulated power losses in {time.perf_counter() - started:.1f} s")
    assert runs >= 5_000


def random_workload(rng: random.Random, length: int) -> list:
    """Random save/drop/reset calls over five names, each valid when it runs."""
    names, ops, present = ["a", "b", "c", "d", "e"], [], set()
    for _ in range(length):
        choice = rng.random()
        if choice < 0.6 or not present:
            picked = rng.sample(names, rng.randint(1, 3))
            ops.append(("save", {name: rng.choice(ARRAYS) for name in picked}))
            present.update(picked)
        elif choice < 0.95:
            picked = rng.sample(sorted(present), rng.randint(1, len(present)))
            ops.append(("drop", picked))
            present.difference_update(picked)
        else:
            ops.append(("reset",))
            present.clear()
    return ops


def sweep_random_crashes(workdir, memo, workloads: int, points: int, seed: int) -> int:
    rng = random.Random(seed)
    runs = 0
    for _ in range(workloads):
        ops = random_workload(rng, rng.randint(4, 12))
        exchange = rng.random() < 0.7
        total = count_mutations(workdir, memo, ops, exchange)
        for _ in range(points):
            run_crash(workdir, memo, ops, rng.randint(0, total), rng.randrange(1 << 30), exchange)
            runs += 1
    return runs


def test_power_loss_at_random_calls_of_random_workloads(workdir, memo):
    """Random workloads, random crash points and crash seeds, all drawn from
    one printed workload seed."""
    seed = workload_seed()
    runs = sweep_random_crashes(workdir, memo, workloads=20, points=30, seed=seed)
    assert runs == 600


# ---- faults ---------------------------------------------------------------------

CODES = {
    "fsync": [errno.EIO],
    "write": [errno.EIO, errno.ENOSPC],
    "build": [errno.EIO, errno.ENOSPC],
    "mkdir": [errno.EIO, errno.ENOSPC],
}


def fallible_kinds(workdir, memo, ops, exchange: bool) -> list:
    sim = new_sim(workdir, memo, exchange)
    sim.count_from_here()
    with ArrayStore(ROOT, _fs=sim) as store:
        for op in ops:
            apply_op(store, op)
    return list(sim.fallible_kinds)


def check_error(exc: OSError, code: int, context: str) -> None:
    assert exc.errno == code, f"lost the errno: {exc!r} ({context})"
    assert re.search(r"cannot \w+", str(exc)), (
        f"the message does not say what failed: {exc} ({context})"
    )


def run_fault(workdir, memo, ops, at: int, code: int, sticky: bool, exchange: bool = True) -> str:
    """The ``at``-th fallible call fails (from there on when sticky): the call
    that meets it raises and leaves what its error says, in the process and
    after a power cut right then, and once the fault clears the store works
    on. Returns the outcome seen."""
    states = model_states(ops)
    context = (
        f"exchange={exchange}, ops={ops_text(ops)}, fault {errno.errorcode[code]} at call {at}, "
        f"sticky={sticky}"
    )
    sim = new_sim(workdir, memo, exchange)
    sim.fail(at, code, sticky)
    outcome = "absorbed"
    try:
        store = ArrayStore(ROOT, _fs=sim)
    except OSError as exc:
        check_error(exc, code, context)
        sim.clear_faults()
        outcome = "open"
        store = ArrayStore(ROOT, _fs=sim)
    for step, op in enumerate(ops, start=1):
        try:
            apply_op(store, op)
            continue
        except OSError as exc:
            check_error(exc, code, context)
            sim.clear_faults()
            outcome = getattr(exc, "outcome", "unchanged")
        expected = {
            "unchanged": [states[step - 1]],
            "committed": [states[step]],
            "unknown": [states[step - 1], states[step]],
        }[outcome]
        assert read_state(store) in expected, (
            f"the state is not what a {outcome!r} error says ({context})"
        )
        sim.crash(at)  # what the error says must also be what is durable
        abandon(store)
        store = ArrayStore(ROOT, _fs=sim)
        state = read_state(store)
        assert state in expected, (
            f"after a power cut the state is not what a {outcome!r} error says ({context})"
        )
        if state == states[step - 1]:
            apply_op(store, op)  # the store works again: the retried call succeeds
    sim.clear_faults()
    assert read_state(store) == states[-1], f"wrong final state ({context})"
    store.close()
    with ArrayStore(ROOT, _fs=sim) as reopened:
        assert read_state(reopened) == states[-1], f"wrong state after reopening ({context})"
        assert_clean(settle_and_list(reopened, sim), states[-1], context)
    return outcome


def sweep_faults(workdir, memo, ops, exchange: bool, outcomes: dict) -> None:
    """Every fault kind, one-shot and sticky, at every fallible call of ``ops``."""
    for at, kind in enumerate(fallible_kinds(workdir, memo, ops, exchange)):
        for code in CODES.get(kind, [errno.EIO]):
            for sticky in (False, True):
                outcome = run_fault(workdir, memo, ops, at, code, sticky, exchange)
                outcomes[outcome] = outcomes.get(outcome, 0) + 1


def sweep_random_faults(workdir, memo, target: int, seed: int, outcomes: dict) -> None:
    rng = random.Random(seed)
    while sum(outcomes.values()) < target:
        sweep_faults(
            workdir, memo, random_workload(rng, rng.randint(2, 6)), rng.random() < 0.7, outcomes
        )


def test_every_fault_at_every_call_of_save_and_drop(workdir, memo):
    """EIO/ENOSPC/failed fsync at each fallible call of each short workload,
    one-shot and sticky, with and without RENAME_EXCHANGE; then of random
    workloads up to 5,000 faults."""
    started = time.perf_counter()
    outcomes = {}
    for ops in WORKLOADS.values():
        for exchange in (True, False):
            sweep_faults(workdir, memo, ops, exchange, outcomes)
    seed = workload_seed()
    sweep_random_faults(workdir, memo, 5_000, seed, outcomes)
    total = sum(outcomes.values())
    print(
        f"\n{total} injected faults in {time.perf_counter() - started:.1f} s (workload seed "
        f"{seed}): {outcomes}"
    )
    # One-shot faults after the commit point are absorbed (a retry finishes
    # the commit); every other fault surfaces, with the outcome it says.
    for outcome in ("unchanged", "committed", "unknown", "absorbed", "open"):
        assert outcomes.get(outcome, 0) > 0, f"no fault had outcome {outcome!r}: {outcomes}"
    assert total >= 5_000


# ---- regressions ------------------------------------------------------------------


def test_regression_a_new_store_survives_power_loss_after_open(workdir, memo):
    """Regression: the parent of a new ArrayStore directory was never fsynced,
    so the whole store (and a saved array) could vanish in a power cut."""
    for seed in range(64):
        sim = new_sim(workdir, memo, True)
        with ArrayStore(ROOT, _fs=sim) as store:
            store.save({"x": A})
        sim.crash(seed)
        assert sim.isfile(f"{ROOT}/{MARKER_FILE}"), f"seed {seed}"
        with ArrayStore(ROOT, _fs=sim) as store:
            assert read_state(store) == {"x": _frozen(A)}, f"seed {seed}"


@pytest.mark.parametrize("exchange", [True, False])
def test_regression_a_save_of_two_arrays_is_one_commit(workdir, memo, exchange):
    """Regression: save({x, y}) swapped the arrays one by one, so a power cut
    (or kill) between the swaps left new x beside old y."""
    ops = [("save", {"x": A, "y": B}), ("save", {"x": C, "y": E}), ("drop", ["x", "y"])]
    total = count_mutations(workdir, memo, ops, exchange)
    for at in range(total + 1):
        for seed in range(8):
            run_crash(workdir, memo, ops, at, seed, exchange)


def test_a_damaged_commit_record_is_refused(workdir, memo):
    """A commit record that fails its checksum (loaderx renames it into place
    only after an fsync), or names an invalid array, raises CorruptStoreError
    and changes nothing."""
    from loaderx.zrecord import CorruptStoreError

    sim = new_sim(workdir, memo, True)
    with ArrayStore(ROOT, _fs=sim) as store:
        store.save({"x": A})
    sim.write_new(f"{ROOT}/{COMMIT_FILE}", b"\x93not a record")
    with pytest.raises(CorruptStoreError, match="checksum"):
        ArrayStore(ROOT, _fs=sim)
    payload = msgpack.packb(
        {"format": "loaderx-arraystore-commit", "version": 1, "save": {}, "drop": ["../x"]}
    )
    sim.write_new(f"{ROOT}/{COMMIT_FILE}", payload + zlib.crc32(payload).to_bytes(4, "little"))
    with pytest.raises(CorruptStoreError, match="invalid"):
        ArrayStore(ROOT, _fs=sim)
    assert sim.isfile(f"{ROOT}/x/schema.msgpack")


def test_arraystore_makes_no_file_system_call_outside_the_seam():
    """arraystore.py and its modules reach the disk only through loaderx._fs
    (a direct os, shutil or fcntl call would bypass the simulated disk and
    its tests)."""
    modules = (arraystore_module, arraycommit_module, arrayview_module, arraydrop_module)
    source = "\n".join(Path(module.__file__).read_text() for module in modules)
    calls = re.findall(
        r"\b(?:os\.(?!path\.join|fspath|getpid)\w+|shutil\.\w+|fcntl\.\w+|"
        r"(?<![.\w])(?<!def )open\()",
        source,
    )
    assert calls == [], f"file-system calls outside the seam: {calls}"
    # The batch modes' memory files and the pagemap are no disk: those calls only.
    batch_source = Path(arraybatch_module.__file__).read_text()
    batch_calls = set(
        re.findall(r"\b(?:os\.(?!path\.join)\w+|shutil\.\w+|fcntl\.\w+)", batch_source)
    )
    memory_only = {"os.memfd_create", "os.ftruncate", "os.pread", "os.close", "os.open"}
    flags = {"os.MFD_CLOEXEC", "os.O_RDONLY", "os.O_CLOEXEC"}
    assert batch_calls <= memory_only | flags, f"file-system calls outside the seam: {batch_calls}"
    assert re.findall(r"os\.open\((\w+)", batch_source) == ["_PAGEMAP"]


# ---- soak -------------------------------------------------------------------------


SOAK_COUNT = 200_000


@pytest.mark.soak
def test_soak_power_loss(workdir, memo):
    """At least 200,000 simulated power losses: the short workloads with 64
    seeds per crash point, then random workloads at random points."""
    seed = workload_seed()
    started = time.perf_counter()
    crashes = sweep_crashes(workdir, memo, seeds=64)
    crashes += sweep_random_crashes(
        workdir, memo, workloads=2000, points=(SOAK_COUNT - crashes) // 2000 + 1, seed=seed
    )
    print(f"{crashes} simulated power losses in {time.perf_counter() - started:.0f} s")
    assert crashes >= SOAK_COUNT


@pytest.mark.soak
def test_soak_faults(workdir, memo):
    """At least 200,000 injected faults, every one at every call of random workloads."""
    seed = workload_seed()
    started = time.perf_counter()
    outcomes = {}
    sweep_random_faults(workdir, memo, SOAK_COUNT, seed, outcomes)
    print(
        f"{sum(outcomes.values())} injected faults in {time.perf_counter() - started:.0f} s: "
        f"{outcomes}"
    )
    assert sum(outcomes.values()) >= SOAK_COUNT


# ---- logical row drops (the delete log) ---------------------------------------------

F = np.arange(8, dtype=np.int16)
# Each new file call of the delete log: the marker sealed at version 3, a
# log's first record (a new name: the root fsynced), later records (one
# write, one fsync), a save over an array with drops (its log stale, then
# deleted), compact (a rewrite of the live rows, one commit), drop of the
# array (its log deleted).
ROW_DROPS = [
    ("save", {"x": A, "y": F}),
    ("droprows", "y", [1]),
    ("droprows", "y", [0, 2, 3]),
    ("droprows", "x", [0]),
    ("save", {"x": B}),
    ("droprows", "x", [4]),
    ("compact",),
    ("droprows", "y", [0]),
    ("drop", ["y"]),
]
ROW_DROPS_NOT_DURABLE = [
    ("save", {"x": A, "y": F}),
    ("droprows", "y", [1]),
    ("sync",),
    ("droprows", "y", [0, 2]),
    ("save", {"y": B}),
    ("droprows", "y", [4]),
    ("droprows", "x", [2]),
    ("compact",),
    ("sync",),
    ("droprows", "x", [0]),
    ("drop", ["x"]),
]


def test_power_loss_at_every_call_of_row_drops(workdir, memo):
    """The row-drop workload, power lost before each of its mutating calls,
    with and without RENAME_EXCHANGE, 8 seeds each (durable: every
    acknowledged drop survives, a torn record names nothing), and its
    durable=False twin (never older than the last sync(), never torn)."""
    started = time.perf_counter()
    runs = 0
    for exchange in (True, False):
        total = count_mutations(workdir, memo, ROW_DROPS, exchange)
        for at in range(total + 1):
            for seed in range(8):
                run_crash(workdir, memo, ROW_DROPS, at, seed, exchange)
                runs += 1
        runs += sweep_not_durable(workdir, memo, ROW_DROPS_NOT_DURABLE, exchange, seeds=8)
    print(f"\n{runs} simulated power losses of row drops in {time.perf_counter() - started:.1f} s")
    assert runs >= 1_000


def test_every_fault_at_every_call_of_row_drops(workdir, memo):
    """Every fault at every fallible call of the row-drop workload, one-shot
    and sticky, with and without RENAME_EXCHANGE: the drop that meets it
    says what it left (a failed record is taken back: "unchanged", or
    "unknown" when the take-back fails too)."""
    outcomes = {}
    for exchange in (True, False):
        sweep_faults(workdir, memo, ROW_DROPS, exchange, outcomes)
    print(f"\n{sum(outcomes.values())} injected faults of row drops: {outcomes}")
    for outcome in ("unchanged", "unknown", "absorbed"):
        assert outcomes.get(outcome, 0) > 0, f"no fault had outcome {outcome!r}: {outcomes}"


# ---- durable=False ------------------------------------------------------------------

# One-array calls (the rename commit, fsync deferred to sync()), a multi-array
# save (the commit record, which fsyncs in both modes) and sync() between them.
NOT_DURABLE_WORKLOADS = [
    [
        ("save", {"x": A}),
        ("save", {"y": B}),
        ("sync",),
        ("save", {"x": C}),
        ("drop", ["y"]),
        ("save", {"y": E}),
        ("sync",),
        ("drop", ["x"]),
    ],
    [
        ("save", {"x": A, "y": B}),
        ("save", {"x": D}),
        ("drop", ["x"]),
        ("save", {"x": E, "y": C}),
        ("save", {"y": A}),
        ("sync",),
    ],
    BATCH_OPS[:3] + [("sync",)] + BATCH_OPS[3:],
    [("save", {"x": A}), ("clone", "x", "y"), ("sync",), ("drop", ["x"]), ("clone", "y", "x")],
]


def apply_not_durable(store: ArrayStore, op) -> None:
    if op[0] == "sync":
        store.sync()
    else:
        apply_op(store, op)


def run_crash_not_durable(workdir, memo, ops, at: int, seed: int, exchange: bool) -> None:
    """With durable=False a power cut leaves each array whole, at a value it
    had at the last acknowledged sync() or after (possibly the call in flight);
    the record-committed multi-array calls are durable when they return."""
    states = model_states(
        [op if op[0] != "sync" else ("save", {}) for op in ops]
    )  # a sync changes nothing
    synced = [0] + [
        index + 1
        for index, op in enumerate(ops)
        if op[0] == "sync" or (op[0] == "save" and len(op[1]) > 1)
    ]
    sim = new_sim(workdir, memo, exchange)
    acked, _ = run_until_cut(sim, ops, at, seed, apply_not_durable, durable=False)
    context = (
        f"durable=False, exchange={exchange}, ops={ops_text(ops)}, crash before mutation {at}, "
        f"seed {seed}"
    )
    floor = max(index for index in synced if index <= acked)
    window = states[floor : min(acked + 1, len(ops)) + 1]
    with ArrayStore(ROOT, durable=False, _fs=sim) as reopened:
        state = read_state(reopened)
        for name in {name for candidate in window for name in candidate} | set(state):
            allowed = [candidate.get(name) for candidate in window]
            assert state.get(name) in allowed, (
                f"'{name}' is at no state since the last sync ({context})"
            )
        assert_clean(settle_and_list(reopened, sim), state, context)


def test_power_loss_with_durable_false(workdir, memo):
    """Exhaustive over the mutating calls of workloads of one-array calls and
    sync() with durable=False, with and without RENAME_EXCHANGE, 8 seeds each:
    never a torn array, never older than the last sync()."""
    runs = sum(
        sweep_not_durable(workdir, memo, ops, exchange, seeds=8)
        for ops in NOT_DURABLE_WORKLOADS
        for exchange in (True, False)
    )
    assert runs >= 500


def sweep_not_durable(workdir, memo, ops, exchange: bool, seeds: int) -> int:
    """run_crash_not_durable at every mutating call of ``ops``, ``seeds`` seeds each."""
    sim = new_sim(workdir, memo, exchange)
    with ArrayStore(ROOT, durable=False, _fs=sim) as store:
        for op in ops:
            apply_not_durable(store, op)
    for at in range(sim.mutations + 1):
        for seed in range(seeds):
            run_crash_not_durable(workdir, memo, ops, at, seed, exchange)
    return (sim.mutations + 1) * seeds


@pytest.mark.parametrize("last", [("save", {"x": C}), ("drop", ["y"])], ids=["overwrite", "drop"])
def test_regression_durable_false_keeps_the_synced_copy_until_the_swap_is_durable(
    workdir, memo, last
):
    """Regression: with durable=False, save({"x": ...}) after the last sync()
    exchanged .new-x and x without an fsync and then deleted .new-x (the old,
    synced copy); a cut keeping the unlinks and dropping the exchange lost x
    (drop("y") the same for y). The simulator's rmtree now queues the unlinks
    of the tree (tests/simfs.py), and every cut leaves x and y whole."""
    ops = [("save", {"x": A}), ("save", {"y": B}), ("sync",), last, ("save", {"z": E})]
    assert (
        sum(sweep_not_durable(workdir, memo, ops, exchange, seeds=16) for exchange in (True, False))
        >= 300
    )


@pytest.mark.soak
def test_soak_power_loss_with_durable_false(workdir, memo):
    """The durable=False workloads (and the overwrite/drop-after-sync ones)
    with 256 crash seeds per crash point, with and without RENAME_EXCHANGE."""
    started = time.perf_counter()
    workloads = NOT_DURABLE_WORKLOADS + [
        [("save", {"x": A}), ("save", {"y": B}), ("sync",), last, ("save", {"z": E})]
        for last in (("save", {"x": C}), ("drop", ["y"]))
    ]
    runs = sum(
        sweep_not_durable(workdir, memo, ops, exchange, seeds=256)
        for ops in workloads
        for exchange in (True, False)
    )
    print(
        f"\n{runs} simulated power losses with durable=False in "
        f"{time.perf_counter() - started:.0f} s"
    )
    assert runs >= 75_000
