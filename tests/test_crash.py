"""Crash safety: a writer killed with SIGKILL at random points leaves the store
as it was after its last acknowledged operation, or with the operation in
flight applied whole; a later writer recovers and the store takes new writes.
Also: one writer per store across processes, and readers in another process
see a consistent prefix while a writer appends.

LOADERX_TRIALS raises the number of kill trials (soak runs); LOADERX_SEED fixes
the seeds (each failure message names the seed that reproduces it).
"""

from __future__ import annotations

import json
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import store_worker as worker

from loaderx.zrecord import StoreLockedError, Zrecord, ZrecordError

WORKER = str(Path(__file__).with_name("store_worker.py"))
TRIALS = int(os.environ.get("LOADERX_TRIALS", "100"))
SOAK_TRIALS = int(os.environ.get("LOADERX_TRIALS", "2000"))
BASE_SEED = int(os.environ.get("LOADERX_SEED", random.randrange(1 << 30)))
TRIAL_TIMEOUT_S = 60.0


class LineReader:
    """Lines from a child's stdout, with a deadline (a hung child fails the test)."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.fd = proc.stdout.fileno()
        self.buffer = b""

    def next_line(self, deadline: float) -> str | None:
        while b"\n" not in self.buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("child produced no output before the deadline")
            ready, _, _ = select.select([self.fd], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(self.fd, 65536)
            if not chunk:
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode()

    def rest(self) -> list[str]:
        deadline = time.monotonic() + TRIAL_TIMEOUT_S
        lines = []
        while (line := self.next_line(deadline)) is not None:
            lines.append(line)
        return lines


def spin(seconds: float) -> None:
    """Waits `seconds` precisely (sleep is too coarse below a millisecond)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def run_trial(path: Path, seed: int, variant: str = "mixed") -> dict:
    """Runs ops(seed) in a child, kills it at a random point, checks the store."""
    ops, _ = worker.make_ops(seed, variant=variant)
    rng = random.Random(seed ^ 0x5EED)
    target = rng.randrange(len(ops))
    # Delays from 10 us to 20 ms after op `target` starts: most land inside
    # an op (ops take 0.1-20 ms, mostly fsync), some after it.
    delay = 0.0 if rng.random() < 0.15 else 10 ** rng.uniform(-5, -1.7)
    lines, killed, returncode, stderr = kill_writer(path, seed, variant, target, delay)
    context = (
        f"seed {seed} (LOADERX_SEED), variant {variant}, kill after op {target} began + "
        f"{delay * 1e6:.0f} us; child lines {lines[-4:]}"
    )
    if not killed:
        assert returncode == 0, f"{context}: the writer failed on its own:\n{stderr}"
    else:
        # The child may finish its last op and exit before the signal lands.
        assert returncode in (-signal.SIGKILL, 0), f"{context}: writer exit {returncode}:\n{stderr}"
    acked = sum(1 for line in lines if line.startswith("A "))
    # Before any writer recovers: what the crash left behind.
    debris = crash_debris(path)
    report = check_recovery(path, seed, acked, variant, context)
    return {
        "acked": acked,
        "in_flight_applied": report["match"] == acked + 1,
        "debris": debris,
        "killed": killed,
        "op": ops[target]["kind"] if killed else None,
    }


def kill_writer(
    path: Path, seed: int, variant: str, target: int, delay: float
) -> tuple[list[str], bool, int, str]:
    """Runs ops(seed) in a child and SIGKILLs it `delay` s after op `target` began: the child's
    stdout lines, whether it was killed, its exit status and its stderr."""
    proc = subprocess.Popen(
        [sys.executable, WORKER, "crash", str(path), str(seed), variant],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    reader = LineReader(proc)
    deadline = time.monotonic() + TRIAL_TIMEOUT_S
    lines = []
    killed = False
    try:
        while (line := reader.next_line(deadline)) is not None:
            lines.append(line)
            if line == f"B {target}":
                spin(delay)
                proc.send_signal(signal.SIGKILL)
                killed = True
                break
        lines += reader.rest()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        stderr = proc.stderr.read().decode(errors="replace")
        proc.stdout.close()
        proc.stderr.close()
    return lines, killed, proc.returncode, stderr


def crash_debris(path: Path) -> bool:
    """Whether the store holds a file or bytes its committed superblock does not name."""
    debris = False
    if (path / "superblock").exists():
        committed = worker.committed_superblock(path)
        named = worker.named_files(committed)
        for name in os.listdir(path):
            if name in ("superblock", "lock"):
                continue
            if name not in named or os.path.getsize(path / name) > named[name]:
                debris = True
    return debris


def check_recovery(path: Path, seed: int, acked: int, variant: str, context: str) -> dict:
    """In a fresh process (a crash there fails this trial, not pytest): a reader sees the last
    acknowledged state or that state with the op in flight applied whole; then a writer
    recovers and takes a new record. Returns the child's report."""
    kept = path.with_name(path.name + "-after-crash")
    shutil.copytree(path, kept)
    context += f"; the store as the crash left it is kept at {kept}"
    check = subprocess.run(
        [sys.executable, WORKER, "recover", str(path), str(seed), str(acked), variant],
        capture_output=True,
        text=True,
        timeout=TRIAL_TIMEOUT_S,
    )
    assert check.returncode == 0, (
        f"{context}: the check process exited {check.returncode}:\n{check.stderr[-3000:]}"
    )
    report = json.loads(check.stdout.strip().splitlines()[-1])
    assert report["match"] is not None, (
        f"{context}: after {acked} acknowledged ops the store holds {report['found']}, "
        f"expected one of {report['expected']}"
    )
    assert report["verify"] == [] and report["verify_after"] == [], f"{context}: {report}"
    assert (
        report["first"] == report["expected_first"]
        and report["after_append_ok"]
        and report["reopen_ok"]
    ), f"{context}: after recovery the store does not hold the state plus the new record: {report}"
    assert report["on_disk"] == report["named"], (
        f"{context}: after recovery the directory holds {report['on_disk']}, the superblock names "
        f"{report['named']}"
    )
    shutil.rmtree(kept)
    return report


def run_trials(tmp_path: Path, trials: int, variant: str = "mixed") -> list[dict]:
    def one(trial: int) -> dict:
        path = tmp_path / f"trial-{trial}"
        try:
            return run_trial(path, BASE_SEED + trial, variant)
        finally:
            shutil.rmtree(path, ignore_errors=True)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(one, range(trials)))


def summarize(results: list[dict]) -> str:
    killed = [r for r in results if r["killed"]]
    by_op: dict[str, int] = {}
    for r in killed:
        by_op[r["op"]] = by_op.get(r["op"], 0) + 1
    return (
        f"{len(results)} trials (seed {BASE_SEED}): {len(killed)} killed, "
        f"{sum(r['debris'] for r in killed)} left uncommitted bytes or files, "
        f"{sum(r['in_flight_applied'] for r in killed)} found the op in flight applied; kills "
        f"during {by_op}"
    )


def test_sigkill_at_random_points_loses_no_acknowledged_record(tmp_path):
    """Each trial: a seeded mix of fixed and indexed appends, replaces, both
    deletes, compactions and syncs, killed at a random point; the reopened
    store equals the model after the last acknowledged op (or the next)."""
    results = run_trials(tmp_path, TRIALS)
    print(summarize(results))
    killed = [r for r in results if r["killed"]]
    # The kill points must actually land inside operations most of the time.
    assert len(killed) >= TRIALS * 0.8, summarize(results)
    assert any(r["debris"] for r in killed), f"no kill landed inside a write: {summarize(results)}"


@pytest.mark.parametrize("variant", ["fixed", "fixed-lazy", "mixed-lazy"])
def test_sigkill_during_in_place_replaces_and_checkpoints(tmp_path, variant):
    """Fixed stores, mostly in-place replaces (journal write, apply, and the
    checkpoints that appends, deletes, syncs and close make), in both
    durability modes, and mixed stores with durable=False: a kill at a
    random point leaves the last acknowledged state or the next, whole —
    durable=False loses nothing to a process kill either, except in-place
    replaces since its last durable commit, which its undo area undoes."""
    results = run_trials(tmp_path, TRIALS // 5, variant)
    print(summarize(results))
    killed = [r for r in results if r["killed"]]
    assert len(killed) >= len(results) * 0.8, summarize(results)
    if variant.startswith("fixed"):
        assert any(r["op"] == "replace" for r in killed), (
            f"no kill landed in a replace: {summarize(results)}"
        )


@pytest.mark.soak
def test_sigkill_soak(tmp_path):
    """The same, for LOADERX_TRIALS (default 2000) trials."""
    print(summarize(run_trials(tmp_path, SOAK_TRIALS)))


def test_second_writer_process_is_refused_while_the_first_holds_the_lock(tmp_path):
    """A second process's mutation raises StoreLockedError naming the problem;
    it can still read; once the first writer is gone (even by SIGKILL) the
    lock is free."""
    path = tmp_path / "locked"
    for ending in ("close", "kill"):
        proc = subprocess.Popen(
            [sys.executable, WORKER, "hold", str(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            assert LineReader(proc).next_line(time.monotonic() + TRIAL_TIMEOUT_S) == "locked", (
                proc.stderr.read()
            )
            with Zrecord(path) as store:
                before = worker.read_all(store)
                for attempt in (
                    lambda: store.append(b"second", [0]),
                    lambda: store.delete([0]),
                    lambda: store.replace([0], b"x", [0]),
                    lambda: store.compact(),
                ):
                    with pytest.raises(StoreLockedError) as info:
                        attempt()
                    assert isinstance(info.value, ZrecordError)
                    assert "one writer" in str(info.value) and str(path) in str(info.value)
                assert worker.read_all(store) == before and before[-1] == b"held"
            if ending == "close":
                proc.stdin.close()
                assert proc.wait(timeout=TRIAL_TIMEOUT_S) == 0
            else:
                proc.kill()
                proc.wait()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if not stream.closed:
                    stream.close()
        with Zrecord(path) as store:
            first = store.append(b"mine", [0])
            assert store.read(first) == b"mine"


def test_reader_in_another_process_sees_a_consistent_prefix_while_a_writer_appends(tmp_path):
    """While a child appends (fixed layout, then a switch to indexed that
    rewrites the files), a reader here sees after each refresh() a whole
    number of batches, every record exact; a reader that does not refresh
    keeps its snapshot, readable even after the files it maps are replaced."""
    path = tmp_path / "shared"
    seed, batches = BASE_SEED, 60
    expected: list[bytes] = []
    boundaries = {0}
    for j in range(batches):
        expected += worker.appender_batch(seed, j)
        boundaries.add(len(expected))
    proc = subprocess.Popen(
        [sys.executable, WORKER, "appender", str(path), str(seed), str(batches)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    reader = LineReader(proc)
    deadline = time.monotonic() + TRIAL_TIMEOUT_S
    try:
        assert reader.next_line(deadline) == "A 0", proc.stderr.read()
        stale = Zrecord(path, verify=True)
        stale_records = worker.read_all(stale)
        assert stale_records == expected[: len(stale_records)]
        fresh = Zrecord(path, verify=True)
        seen = set()
        while True:
            finished = proc.poll() is not None
            n = fresh.refresh()
            assert n in boundaries, f"reader saw {n} records, not a whole number of batches"
            seen.add(n)
            sample = sorted(
                set(range(max(0, n - 30), n)) | set(random.sample(range(n), min(n, 30)))
            )
            if sample:
                lengths = [int(x) for x in fresh.lengths(sample)]
                offsets = np.cumsum([0] + lengths[:-1], dtype=np.uint64)
                buffer = bytearray(sum(lengths))
                fresh.gather(sample, buffer, offsets)
                for i, o, length in zip(sample, offsets, lengths):
                    assert bytes(buffer[int(o) : int(o) + length]) == expected[i], (
                        f"record {i} of {n}"
                    )
            assert len(stale) == len(stale_records) and worker.read_all(stale) == stale_records
            if finished:
                break
            if time.monotonic() > deadline:
                raise TimeoutError("the appender did not finish")
        assert proc.returncode == 0, proc.stderr.read()
        assert reader.rest()[-1:] == ["DONE"]
        assert n == len(expected)
        assert len(seen) > 3, (
            f"the reader saw only {sorted(seen)}; the test did not overlap the writer"
        )
        assert fresh.stats()["layout"] == "indexed"
        assert worker.read_all(fresh) == expected
        stale.close()
        fresh.close()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
