"""In-place replace through the journal, durable=False, and what readers see
while a writer replaces rows in place (README: "In-place replace, the
journal and durability")."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from loaderx.zrecord import Zrecord, ZrecordError

ROW = 40  # bytes per record: ten float32, the numpack benchmark's rows


def rows_of(values, width=ROW):
    """One record per value, every byte of record i equal to values[i] % 256."""
    return np.repeat(np.asarray(values, dtype=np.uint8)[:, None], width, axis=1)


def packed(rows):
    rows = np.ascontiguousarray(rows)
    return rows, np.arange(len(rows), dtype=np.uint64) * rows.shape[1]


def read_rows(store, indices=None, width=ROW):
    indices = (
        np.arange(len(store), dtype=np.uint64)
        if indices is None
        else np.asarray(indices, dtype=np.uint64)
    )
    out = np.empty((len(indices), width), dtype=np.uint8)
    store.gather(indices, out)
    return out


def make_store(path, count, durable=True, verify=False):
    store = Zrecord(path, codec="raw", durable=durable, verify=verify, create=True)
    store.append(*packed(rows_of(np.arange(count))))
    return store


def journal_files(path):
    return [name for name in os.listdir(path) if name.startswith("journal-")]


@pytest.mark.parametrize("durable", [True, False])
def test_replace_in_a_fixed_store_writes_in_place(tmp_path, durable):
    """A fixed-store replace keeps the data file (same inode, same size) and
    changes only the rows named, through a journal; the store stays fixed
    and reopens (with checksums verified) to the same rows."""
    path = tmp_path / "s"
    store = make_store(path, 5000, durable)
    data = [name for name in os.listdir(path) if name.startswith("data-")]
    inode = os.stat(path / data[0]).st_ino
    expected = rows_of(np.arange(5000))
    for k in range(20):
        idx = np.array([k * 211 % 5000, 4999 - k], dtype=np.uint64)
        new = rows_of([200 + k, 100 + k])
        store.replace(idx, *packed(new))
        expected[idx.astype(np.int64)] = new
    assert (read_rows(store) == expected).all()
    assert store.stats()["layout"] == "fixed" and len(journal_files(path)) == 1
    assert os.stat(path / data[0]).st_ino == inode and os.path.getsize(path / data[0]) == 5000 * ROW
    store.close()
    with Zrecord(path, verify=True) as reopened:
        assert (read_rows(reopened) == expected).all() and reopened.verify() == []
    # close() checkpointed: the journal is its page alone.
    assert os.path.getsize(path / journal_files(path)[0]) == 4096


@pytest.mark.parametrize("durable", [True, False])
def test_a_durable_stores_first_append_creates_its_journal(tmp_path, durable):
    """The append that creates a durable fixed store creates its journal
    under the syncs it makes anyway, so the first replace after reopen
    writes into it (one fdatasync) instead of creating it (four syncs). A
    durable=False store, which syncs nothing then, creates it at its first
    replace; the same journal file is kept across replaces and reopens."""
    path = tmp_path / "s"
    make_store(path, 100, durable).close()
    assert len(journal_files(path)) == (1 if durable else 0)
    for _ in range(2):
        with Zrecord(path, codec="raw", durable=durable) as store:
            store.replace(np.array([3], dtype=np.uint64), *packed(rows_of([250])))
            assert store.stats()["layout"] == "fixed"
        assert len(journal_files(path)) == 1
    first = journal_files(path)
    with Zrecord(path, verify=True) as store:
        assert (read_rows(store, [3]) == rows_of([250])).all() and store.verify() == []
    assert journal_files(path) == first


def test_durable_false_commits_are_atomic_and_sync_makes_them_durable(tmp_path):
    """durable=False: every operation still commits whole, a reader in
    another handle sees it at once, sync() and close() leave a store whose
    superblock is synced (no `unsynced` flag)."""
    import store_worker as worker

    path = tmp_path / "lazy"
    store = make_store(path, 1000, durable=False)
    assert worker.committed_superblock(path)["unsynced"] == 1
    store.replace([3], *packed(rows_of([77])))
    store.append(*packed(rows_of([5, 6])))
    store.delete([0], keep_order=True)
    with Zrecord(path) as reader:
        assert len(reader) == 1001 and read_rows(reader, [2])[0, 0] == 77
    store.sync()
    assert worker.committed_superblock(path)["unsynced"] == 0
    store.append(*packed(rows_of([9])))
    assert worker.committed_superblock(path)["unsynced"] == 1
    store.close()
    assert worker.committed_superblock(path)["unsynced"] == 0
    with Zrecord(path, verify=True) as reopened:
        assert len(reopened) == 1002 and reopened.verify() == []


def test_each_gather_sees_one_committed_state_while_rows_are_replaced_in_place(tmp_path):
    """Threads gather a run of rows spanning several 16 KiB blocks (copy and
    pread paths, with checksums verified) while the writer replaces the
    whole run in place with one value per replace: every gather sees one
    value throughout, never a mix and never a false checksum failure."""
    path = tmp_path / "s"
    count = 4000  # 160 KB: ten blocks
    writer = make_store(path, count)
    writer.replace(np.arange(count, dtype=np.uint64), *packed(rows_of(np.zeros(count))))
    readers = [Zrecord(path, verify=True, threads=2), writer]
    stop = threading.Event()
    seen: list[set] = [set(), set()]
    failures: list = []

    def read(k):
        store = readers[k]
        while not stop.is_set():
            try:
                for indices in (np.arange(count), np.arange(0, count, 7)):
                    rows = read_rows(store, indices)
                    values = np.unique(rows)
                    if len(values) != 1:
                        failures.append(f"one gather saw {values[:8]}")
                    seen[k].add(int(values[0]))
            except ZrecordError as exc:
                failures.append(exc)

    threads = [threading.Thread(target=read, args=(k,)) for k in range(2)]
    for thread in threads:
        thread.start()
    try:
        for version in range(1, 120):
            writer.replace(
                np.arange(count, dtype=np.uint64), *packed(rows_of(np.full(count, version)))
            )
            # A read that starts after replace returns sees the new rows.
            assert np.unique(read_rows(readers[0])).tolist() == [version % 256]
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert failures == []
    assert all(len(values) > 2 for values in seen), "the readers did not overlap the replaces"
    readers[0].close()
    writer.close()


READER_CHILD = r"""
import sys, threading, numpy as np
from loaderx.zrecord import Zrecord
path, count = sys.argv[1], int(sys.argv[2])
store = Zrecord(path, verify=True)
stop, failures, gathers = threading.Event(), [], [0]
def spin():
    while not stop.is_set():
        out = np.empty((count, 40), dtype=np.uint8)
        store.gather(np.arange(count, dtype=np.uint64), out)
        values = np.unique(out)
        if len(values) != 1:
            failures.append(values[:8].tolist())
        gathers[0] += 1
thread = threading.Thread(target=spin)
thread.start()
print("ready", flush=True)
for line in sys.stdin:
    expected = int(line)
    out = np.empty((count, 40), dtype=np.uint8)
    store.gather(np.arange(count, dtype=np.uint64), out)
    values = np.unique(out)
    print("ok" if values.tolist() == [expected] else f"saw {values[:8].tolist()}", flush=True)
stop.set()
thread.join()
print(f"done {len(failures)} {gathers[0]}", flush=True)
"""


def test_a_reader_in_another_process_sees_each_replace_whole_and_at_once(tmp_path):
    """Another process gathers (checksums verified) while this one replaces
    in place: each of its gathers sees one committed state, and a gather it
    starts after a replace returned here sees the new rows."""
    path = tmp_path / "s"
    count = 2000
    writer = make_store(path, count)
    writer.replace(np.arange(count, dtype=np.uint64), *packed(rows_of(np.zeros(count))))
    child = subprocess.Popen(
        [sys.executable, "-c", READER_CHILD, str(path), str(count)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "ready", child.stderr.read()
        for version in range(1, 60):
            writer.replace(
                np.arange(count, dtype=np.uint64), *packed(rows_of(np.full(count, version)))
            )
            child.stdin.write(f"{version}\n")
            child.stdin.flush()
            assert child.stdout.readline().strip() == "ok", child.stderr.read()
        child.stdin.close()
        done = child.stdout.readline().split()
        assert child.wait(timeout=60) == 0, child.stderr.read()
        assert done[0] == "done" and done[1] == "0" and int(done[2]) > 0, done
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        writer.close()


def kill_after_replace(script, path):
    """Runs `script` on the store at `path` until it prints "replaced", then
    SIGKILLs it: a writer that dies without checkpointing its journal."""
    child = subprocess.Popen(
        [sys.executable, "-c", script, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "replaced", child.stderr.read()
        child.send_signal(signal.SIGKILL)
        child.wait()
    finally:
        for stream in (child.stdin, child.stdout, child.stderr):
            stream.close()


KILLED_WRITER = r"""
import sys, numpy as np
from loaderx.zrecord import Zrecord
store = Zrecord(sys.argv[1], codec="raw")
rows = np.full((1, 40), 99, dtype=np.uint8)
store.replace(np.array([5], dtype=np.uint64), rows, np.zeros(1, dtype=np.uint64))
print("replaced", flush=True)
sys.stdin.read()
"""


def test_a_killed_writer_leaves_its_replaces_for_the_next_reader(tmp_path):
    """A writer killed after a replace (its journal not checkpointed): a new
    reader sees the replace, checksums hold, and the next writer checkpoints."""
    path = tmp_path / "s"
    make_store(path, 3000).close()
    kill_after_replace(KILLED_WRITER, path)
    journal = path / journal_files(path)[0]
    assert (
        journal.read_bytes().count(b"ZJOURNAL") == 2
    )  # the page's header and the record, not replayed yet
    with Zrecord(path, verify=True) as reader:
        assert read_rows(reader, [5])[0, 0] == 99 and reader.verify() == []
    with Zrecord(path, codec="raw") as writer:  # raw: the store stays fixed and keeps its journal
        writer.append(*packed(rows_of([1])))
    assert os.path.getsize(journal) == 4096
    with Zrecord(path, verify=True) as reader:
        assert read_rows(reader, [4, 5, 3000])[:, 0].tolist() == [4, 99, 1]


KILLED_AFTER_A_CHECKPOINT = r"""
import os, sys, numpy as np
from loaderx.zrecord import Zrecord
path = sys.argv[1]
store = Zrecord(path, codec="raw")
one = np.zeros(1, dtype=np.uint64)
def replace(row, value):
    store.replace(np.array([row], dtype=np.uint64), np.full((1, 40), value, dtype=np.uint8), one)
replace(8, 1)
replace(5, 20)
store.append(np.full((1, 40), 7, dtype=np.uint8), one)  # a checkpoint: both records are dead now
replace(5, 30)  # lands where the first record was; the second follows it, dead
print("replaced", flush=True)
sys.stdin.read()
"""


def test_dead_records_a_checkpoint_left_in_the_journal_are_never_replayed(tmp_path):
    """After a checkpoint new records overwrite the dead ones from the start
    of the journal (which keeps its length while the writer lives). A writer
    killed then leaves a live record followed by a dead one of the same
    size that changed the same row: replay applies the live one only."""
    path = tmp_path / "s"
    make_store(path, 3000).close()
    kill_after_replace(KILLED_AFTER_A_CHECKPOINT, path)
    # The page's header, the live record and the dead one after it.
    assert (path / journal_files(path)[0]).read_bytes().count(b"ZJOURNAL") == 3
    with Zrecord(path, verify=True) as reader:
        assert (
            read_rows(reader, [5, 8, 3000])[:, 0].tolist() == [30, 1, 7] and reader.verify() == []
        )
    with Zrecord(path, codec="raw") as writer:
        writer.append(*packed(rows_of([2])))
    # The next writer cut it back to its page.
    assert os.path.getsize(path / journal_files(path)[0]) == 4096
    with Zrecord(path, verify=True) as reader:
        assert read_rows(reader, [5, 8, 3000, 3001])[:, 0].tolist() == [30, 1, 7, 2]


class InPlaceMachine(RuleBasedStateMachine):
    """A fixed store under random in-place replaces (single rows, runs,
    scattered rows), appends, deletes, syncs and reopens, with a second
    handle reading: both always equal the model, checksums hold."""

    durable = True

    def __init__(self):
        super().__init__()
        self.directory = tempfile.mkdtemp(prefix="zrecord-journal-")
        self.path = os.path.join(self.directory, "store")
        self.model = rows_of(np.arange(1500) * 7)
        self.store = Zrecord(self.path, codec="raw", durable=self.durable, create=True)
        self.store.append(*packed(self.model))
        self.reader = Zrecord(self.path, verify=True)

    @initialize()
    def nothing(self):
        pass

    @rule(data=st.data(), value=st.integers(0, 255))
    def replace(self, data, value):
        n = len(self.model)
        shape = data.draw(st.sampled_from(["one", "run", "scattered"]))
        if shape == "one":
            idx = [data.draw(st.integers(0, n - 1))]
        elif shape == "run":
            start = data.draw(st.integers(0, n - 1))
            idx = list(range(start, min(n, start + data.draw(st.integers(1, 900)))))
        else:
            idx = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=60, unique=True))
        rows = rows_of(np.full(len(idx), value))
        rows[:, 0] = np.arange(len(idx), dtype=np.uint8)  # distinct rows: order matters
        self.store.replace(np.asarray(idx, dtype=np.uint64), *packed(rows))
        self.model[idx] = rows

    @rule(count=st.integers(1, 500), value=st.integers(0, 255))
    def append(self, count, value):
        rows = rows_of(np.full(count, value))
        self.store.append(*packed(rows))
        self.model = np.concatenate([self.model, rows])

    @precondition(lambda self: len(self.model) > 10)
    @rule(data=st.data())
    def delete(self, data):
        idx = data.draw(
            st.lists(st.integers(0, len(self.model) - 1), min_size=1, max_size=5, unique=True)
        )
        self.store.delete(idx, keep_order=True)
        self.model = np.delete(self.model, idx, axis=0)

    @rule()
    def sync(self):
        self.store.sync()

    @rule()
    def reopen(self):
        self.store.close()
        self.store = Zrecord(self.path, codec="raw", durable=self.durable, verify=True)

    @invariant()
    def matches_model(self):
        assert self.store.stats()["layout"] == "fixed"
        assert (read_rows(self.store) == self.model).all()
        self.reader.refresh()
        assert (read_rows(self.reader) == self.model).all()

    def teardown(self):
        assert self.store.verify() == [] and self.reader.verify() == []
        self.reader.close()
        self.store.close()
        shutil.rmtree(self.directory, ignore_errors=True)


class LazyInPlaceMachine(InPlaceMachine):
    durable = False


_settings = settings(
    max_examples=25,
    stateful_step_count=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestInPlaceMachine = InPlaceMachine.TestCase
TestInPlaceMachine.settings = _settings
TestLazyInPlaceMachine = LazyInPlaceMachine.TestCase
TestLazyInPlaceMachine.settings = _settings


def test_a_killed_writers_replaces_in_a_read_only_place_raise_a_clear_error():
    """A store whose writer was killed with journal records not checkpointed,
    moved where it cannot be written: a reader cannot apply them, so it
    refuses with StoreReadOnlyError saying what to do, rather than read a
    state it cannot check. Root ignores permissions, so the reader drops to
    an unprivileged user when the tests run as root."""
    base = tempfile.mkdtemp(prefix="zrecord-journal-ro-")
    try:
        os.chmod(base, 0o755)
        path = os.path.join(base, "s")
        make_store(path, 3000).close()
        kill_after_replace(KILLED_WRITER, path)
        for name in os.listdir(path):
            os.chmod(os.path.join(path, name), 0o444)
        os.chmod(path, 0o555)
        code = (
            "import os\nfrom loaderx.zrecord import Zrecord, StoreReadOnlyError\n"
            "if os.geteuid() == 0:\n    os.setuid(65534)\n"
            f"try:\n    Zrecord({path!r})\n"
            "except StoreReadOnlyError as e:\n    print('refused:', e)\n"
        )
        result = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
        )
        assert "refused:" in result.stdout and "open it once for writing" in result.stdout, (
            result.stdout + result.stderr
        )
        os.chmod(path, 0o755)
        for name in os.listdir(path):
            os.chmod(os.path.join(path, name), 0o644)
        with Zrecord(path, verify=True) as store:  # writable again: the replace is there
            assert read_rows(store, [5])[0, 0] == 99 and store.verify() == []
    finally:
        for root, dirs, _files in os.walk(base):
            for name in dirs:
                os.chmod(os.path.join(root, name), 0o755)
        shutil.rmtree(base, ignore_errors=True)


def test_the_lock_file_holds_the_shared_page_alone_and_an_older_full_page_still_works(tmp_path):
    """The shared page is 64 bytes of the `lock` file (a whole 4 KiB page
    before): a store's files stay within 0.1% of its data. A lock file an
    older build left at 4 KiB keeps working, for the writer and readers."""
    path = tmp_path / "s"
    store = make_store(path, 100)
    store.replace(np.array([3], dtype=np.uint64), *packed(rows_of([77])))
    assert os.path.getsize(path / "lock") == 64
    store.close()
    with open(path / "lock", "r+b") as lock:
        lock.truncate(4096)
    with Zrecord(path, codec="raw") as writer, Zrecord(path, verify=True) as reader:
        writer.replace(np.array([4], dtype=np.uint64), *packed(rows_of([88])))
        assert read_rows(reader, [3, 4])[:, 0].tolist() == [77, 88] and reader.verify() == []
    assert os.path.getsize(path / "lock") == 4096


def test_a_small_replace_fits_the_journals_first_page_and_a_version_1_journal_still_works(tmp_path):
    """Journal version 2 puts records right after its 64-byte header, so a
    small replace overwrites bytes the file holds (its fdatasync writes no
    new length). A version-1 journal (records after the 4 KiB page) that an
    older loaderx left is still written and replayed after a kill."""
    path = tmp_path / "s"
    make_store(path, 3000).close()
    journal = path / journal_files(path)[0]
    with Zrecord(path, codec="raw") as store:
        store.replace(np.array([9], dtype=np.uint64), *packed(rows_of([55])))
        assert os.path.getsize(journal) == 4096
    header = bytearray(journal.read_bytes()[:16])
    assert header[:8] == b"ZJOURNAL" and int.from_bytes(header[8:12], "little") == 2
    with open(journal, "r+b") as file:  # as an older loaderx made it: version 1, no records
        file.seek(8)
        file.write((1).to_bytes(4, "little"))
        file.truncate(4096)
        file.seek(64)
        file.write(bytes(4096 - 64))
    kill_after_replace(KILLED_WRITER, path)
    assert journal.read_bytes()[4096:4104] == b"ZJOURNAL"  # version 1: the record after the page
    with Zrecord(path, verify=True) as reader:
        assert read_rows(reader, [5, 9])[:, 0].tolist() == [99, 55] and reader.verify() == []


STRACE_EDITS = r"""
import os, sys
import numpy as np
from loaderx.zrecord import Zrecord
path, count = sys.argv[1], int(sys.argv[2])


def marker():
    try:
        os.stat("/loaderx-strace-marker")
    except FileNotFoundError:
        pass


rows = lambda value, k: np.full((k, 40), value % 256, dtype=np.uint8)
offsets = lambda k: np.arange(k, dtype=np.uint64) * 40
store = Zrecord(path, codec="raw", durable=False)
store.replace([0], rows(0, 1), offsets(1))  # creates the journal and the undo area
store.sync()
marker()  # 1: the first edit of the interval
store.replace(np.arange(count, dtype=np.uint64), rows(1, count), offsets(count))
marker()  # 2: 100 single-row edits of blocks the first one saved
for k in range(100):
    store.replace([(k * 37) % count], rows(2 + k, 1), offsets(1))
marker()  # 3: sync()
store.sync()
marker()  # 4: done
store.close()
"""


def strace_phases(log: str) -> list[list[str]]:
    """The sync calls strace logged between the script's markers."""
    phases: list[list[str]] = [[]]
    for line in log.splitlines():
        if "loaderx-strace-marker" in line:
            phases.append([])
        elif "sync(" in line and "resumed" not in line:
            phases[-1].append(line)
    return phases


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")
def test_unsynced_replaces_after_an_intervals_first_sync_nothing_until_sync(tmp_path):
    """durable=False, counted with strace: the first replace of a sync
    interval makes one fdatasync (its undo records, every block at once);
    100 single-row replaces of blocks it saved make
    none; sync() fdatasyncs the data and sums files (and the superblock),
    and a new process reads every edit back, checked."""
    path = tmp_path / "s"
    count = 2000  # 80 KB: four whole blocks and a partial one
    make_store(path, count, durable=False).close()
    log = tmp_path / "strace.log"
    subprocess.run(
        [
            "strace",
            "-f",
            "-y",
            "-o",
            str(log),
            "-e",
            "trace=fsync,fdatasync,sync_file_range,msync,syncfs,sync,stat,newfstatat,statx",
            sys.executable,
            "-c",
            STRACE_EDITS,
            str(path),
            str(count),
        ],
        check=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    phases = strace_phases(log.read_text())
    assert len(phases) == 5, phases
    first, run, synced = phases[1], phases[2], phases[3]
    assert [line for line in first if "fdatasync(" in line and "/undo>" in line] and len(
        [line for line in first if "fdatasync(" in line]
    ) == 1, first
    assert len(first) == 1, first
    assert run == [], run
    for name in ("data-", "sums-", "superblock"):
        assert any(name in line for line in synced), (name, synced)
    expected = rows_of(np.ones(count))
    for k in range(100):
        expected[(k * 37) % count] = (2 + k) % 256
    with Zrecord(path, verify=True) as reopened:
        assert (read_rows(reopened) == expected).all() and reopened.verify() == []


STRACE_SCATTERED = r"""
import os, sys
import numpy as np
from loaderx.zrecord import Zrecord
path, blocks = sys.argv[1], int(sys.argv[2])
rows_per_block = 16384 // 40


def marker():
    try:
        os.stat("/loaderx-strace-marker")
    except FileNotFoundError:
        pass


store = Zrecord(path, codec="raw", durable=False)
store.replace([0], np.full((1, 40), 7, np.uint8), np.zeros(1, np.uint64))
store.sync()
marker()  # 1: single-row edits of 100 different blocks, one call each
for k in range(100):
    row = ((k * 73) % blocks) * rows_per_block + 5
    store.replace([row], np.full((1, 40), k, np.uint8), np.zeros(1, np.uint64))
marker()  # 2: done
store.close()
"""


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")
def test_unsynced_edits_of_scattered_blocks_stop_paying_barriers(tmp_path):
    """durable=False, counted with strace: each barrier of an interval saves
    blocks ahead (2^(k-1) - 1 at the k-th, up to 64), so 100 single-row
    edits of 100 different blocks of a 200-block store pay at most 9
    fdatasyncs (saving only the touched blocks paid 100), and every edit
    and every other row reads back, checked."""
    path = tmp_path / "s"
    blocks = 200
    rows_per_block = 16384 // ROW
    count = blocks * rows_per_block
    make_store(path, count, durable=False).close()
    log = tmp_path / "strace.log"
    subprocess.run(
        ["strace", "-f", "-y", "-o", str(log), "-e", "trace=fdatasync,fsync,stat,newfstatat"]
        + [sys.executable, "-c", STRACE_SCATTERED, str(path), str(blocks)],
        check=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    phases = strace_phases(log.read_text())
    assert len(phases) == 3, phases
    edits = phases[1]
    assert all("/undo>" in line for line in edits), edits
    assert 1 <= len(edits) <= 9, edits
    expected = rows_of(np.arange(count))
    expected[0] = 7
    for k in range(100):
        expected[((k * 73) % blocks) * rows_per_block + 5] = k
    with Zrecord(path, verify=True) as reopened:
        assert (read_rows(reopened) == expected).all() and reopened.verify() == []
