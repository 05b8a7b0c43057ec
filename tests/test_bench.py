"""scripts/bench.py runs end to end, so the benchmark script cannot rot.

This checks that every table runs and prints, not what the numbers are:
benchmarks report speed, tests check behaviour. The script runs twice at
its `--quick` sizes: with whatever contenders are installed here, and with
all of them hidden, so both the timed path and the "skipped" path work
whether or not `.[bench]` is installed.
"""

import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "bench.py"

# The optional contenders (the `bench` extra), by top-level module.
CONTENDERS = (
    "h5py",
    "lmdb",
    "blosc2",
    "zarr",
    "tensorstore",
    "array_record",
    "numpack",
    "torch",
    "grain",
)

# Runs a script with modules unimportable, as on a machine with only
# `.[test]`: argv is the script, the modules to hide, "--", its arguments.
HIDING_RUNNER = """
import runpy, sys
script, rest = sys.argv[1], sys.argv[2:]
hidden, arguments = set(rest[:rest.index("--")]), rest[rest.index("--") + 1:]
class Hide:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in hidden:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Hide())
sys.argv = [script, *arguments]
runpy.run_path(script, run_name="__main__")
"""

HEADERS = (
    "## machine",
    "- CPU:",
    "- NumPy:",
    "- loaderx:",
    "### sampler:",
    "### store:",
    "### store ceilings:",
    "### store, cold page cache:",
    "### loader:",
    "### codecs:",
    "### numpack:",
    "### ragged:",
    "### packing:",
    "### processes:",
    "total time:",
)


def run(command):
    # The quick run takes about 15 s here; the limit leaves room for a busy CI box.
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def check_codecs(stdout):
    """The codec table: every codec against its in-order and its random-batch
    decode ceiling, and the DataLoader against both."""
    codecs = stdout.split("### codecs:")[1].split("\n### ")[0]
    assert "| library random-batch ceiling, 1 core, MiB/s | gather / random-batch ceiling |" in (
        codecs
    ), codecs
    codec_rows = [line for line in codecs.splitlines() if line.startswith(("| zstd", "| lz4"))]
    assert len(codec_rows) == 4 and all(row.count("|") == 10 for row in codec_rows), codec_rows
    assert codecs.count("x its random-batch ceiling (rounds") == 2, codecs
    # And against what a prefetching loader can reach: every core into a ring of batches.
    assert codecs.count("x its loader ceiling** (") == 2, codecs


def check_output(result):
    assert result.returncode == 0, (
        f"bench.py exited {result.returncode}\n{result.stdout}\n{result.stderr}"
    )
    for header in HEADERS:
        assert header in result.stdout, f"missing {header!r} in:\n{result.stdout}"
    # A contender may fail its own correctness check (numpack 0.4.5's
    # multi-row replace writes wrong rows); loaderx never may.
    for line in result.stdout.splitlines():
        if line.startswith(("| loaderx", "FAILED:")):
            assert "loaderx" not in line or "FAILED" not in line, line
    assert "FAILED: loaderx" not in result.stdout, result.stdout
    assert "| loaderx zstd |" in result.stdout
    # Every store, cold and loader row has its fraction of a ceiling.
    assert "| write x ceiling | gather x ceiling |" in result.stdout
    assert "| MiB cached per batch | x ceiling |" in result.stdout
    assert "| MiB/s | x ceiling |" in result.stdout
    check_codecs(result.stdout)
    # The integer-label table too: each of its loaderx rows against its codec's decode.
    labels = result.stdout.split("### store, integer labels:")[1].split("\n### ")[0]
    assert "| write x ceiling | gather x ceiling |" in labels, labels
    label_rows = [line for line in labels.splitlines() if line.startswith("| loaderx ")]
    assert len(label_rows) == 3 and all(" decode x " in row for row in label_rows), label_rows
    rows = [line for line in result.stdout.splitlines() if line.startswith("| loaderx raw |")]
    # The store, cold and loader rows (the time-to-first-batch table has one too, without).
    fractions = [row for row in rows if "x (memcpy, " in row or "x (12 KiB" in row]
    assert len(rows) == 4 and len(fractions) == 3, rows
    assert (
        "| replace 1 row, array in use |" in result.stdout
        and "random-index access, array in use |" in result.stdout
    )


@pytest.mark.parametrize("contenders", ["as installed", "hidden"])
def test_bench_all_quick_prints_every_table(contenders):
    if contenders == "hidden":
        result = run(
            [sys.executable, "-c", HIDING_RUNNER, str(SCRIPT), *CONTENDERS, "--", "all", "--quick"]
        )
    else:
        result = run([sys.executable, str(SCRIPT), "all", "--quick"])
    check_output(result)
    if contenders == "hidden":
        assert "skipped: hdf5 not installed (pip install h5py)" in result.stdout
        assert "skipped: grain over ArrayRecord not installed" in result.stdout


def test_ceilings_measure_positive_speeds_and_gather_the_right_rows(tmp_path):
    """bench_ceilings at a tiny size: the memcpy gather copies the batches'
    rows (its last batch is left in the destination), every ceiling is a
    positive speed, and the disk ceilings leave no file behind."""
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import bench_ceilings
    finally:
        sys.path.remove(str(SCRIPT.parent))
    rows = np.random.default_rng(0).random((64, 3072), dtype=np.float32)
    batches = np.random.default_rng(1).integers(0, len(rows), (3, 16))
    gather = bench_ceilings.MemoryGather()
    for threads in (1, 2, 3):
        for copy in bench_ceilings.COPIES:
            for handoff in ("", "futex", "spin"):
                out = np.zeros((16, 3072), dtype=np.float32)
                assert gather.seconds(rows, batches, out, threads, copy, handoff) > 0
                assert np.array_equal(out, rows[batches[-1]]), (threads, copy, handoff)
    with pytest.raises(ValueError, match="beyond the 64 records"):
        gather.seconds(rows, batches + 64, out, 1)
    memory = bench_ceilings.memory_ceiling(rows, batches, 2, threads_max=2)
    assert sorted(memory) == [1, 2] and all(speed > 0 for speed in memory.values())
    decode = bench_ceilings.decode_ceiling(rows, ("zstd", "lz4_shuffle4"), 1)
    assert sorted(decode) == ["lz4_shuffle4", "zstd"] and all(
        speed > 0 for speed in decode.values()
    )
    disk = bench_ceilings.disk_ceilings(tmp_path, 1 << 20, 20, 1, threads=(1, 2))
    assert disk.write_mib_per_second > 0
    assert sorted(disk.reads) == [(4096, 1), (4096, 2), (12288, 1), (12288, 2)]
    assert all(cold.mib_per_second > 0 and cold.iops > 0 for cold in disk.reads.values())
    assert list(tmp_path.iterdir()) == []
    ceilings = bench_ceilings.Ceilings(memory, decode, disk)
    assert ceilings.speed(("memory", 2)) == (memory[2], "memcpy, 2 threads")
    assert ceilings.speed(("zstd", 2)) == (2 * decode["zstd"], "zstd decode x 2")
    assert ceilings.speed(("", 1)) == (None, "")


FLOORS = SCRIPT.parent / "first_write_floors.py"


@pytest.mark.parametrize("numpack", ["as installed", "hidden"])
def test_first_write_floors_quick_times_every_variant(numpack):
    if numpack == "hidden":
        result = run([sys.executable, "-c", HIDING_RUNNER, str(FLOORS), "numpack", "--", "--quick"])
    else:
        result = run([sys.executable, str(FLOORS), "--quick"])
    assert result.returncode == 0, (
        f"first_write_floors.py exited {result.returncode}\n{result.stdout}\n{result.stderr}"
    )
    rows = {
        line.split(" | ")[0].lstrip("| "): line
        for line in result.stdout.splitlines()
        if line.startswith("| ")
    }
    for variant in ("ArrayStore", "Zrecord", "Zrecord open", "replica", "bare"):
        cells = rows[variant].strip(" |").split(" | ")[1:]
        assert len(cells) == 3 and all(cell.endswith(")") and " ms (" in cell for cell in cells), (
            rows[variant]
        )
    # numpack is timed exactly when the script could import it.
    skipped = "skipped: numpack not installed" in result.stdout
    assert ("skipped" in rows["numpack + fsync"]) == skipped, result.stdout
    if numpack == "hidden":
        assert skipped, result.stdout


def test_numpack_rows_of_an_array_in_use_run_their_warm_call_first(tmp_path):
    """The numpack table's "array in use" rows time a second call on the
    array: the untimed first call (and, for an edit, its settling fsync)
    runs before the timed one, and the replace's check holds only then."""
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import bench_numpack
    finally:
        sys.path.remove(str(SCRIPT.parent))

    class Recording(bench_numpack.ArrayStoreOps):
        calls: list = []

        def replace(self, handle, name, rows, key):
            self.calls.append(("replace", list(key)))
            super().replace(handle, name, rows, key)

        def getitem(self, handle, name, indices):
            self.calls.append(("getitem", len(indices)))
            return super().getitem(handle, name, indices)

        def settle(self, path):
            self.calls.append(("settle",))

    rng = np.random.default_rng(0)
    a, b = rng.random((1000, 10), dtype=np.float32), rng.random((500, 5), dtype=np.float32)
    operations, arrays = bench_numpack.build_operations(a, b)
    # the rows whose warm call is one call of the timed kind (the drop and
    # edit-run rows warm up differently and check themselves)
    labels = ["100 random-index access, array in use", "replace 1 row, array in use"]
    in_use = {op.label: op for op in operations if op.label in labels}
    assert sorted(in_use) == labels
    ops = Recording(durable=True)
    ops.save(str(tmp_path / "saved"), arrays)
    for operation in in_use.values():
        for warm in (True, False):
            kept = operation.warm
            if not warm:
                operation.warm = None
            ops.calls.clear()
            try:
                handle, path = bench_numpack._prepare(
                    ops, operation, tmp_path / "work", tmp_path / "saved"
                )
            finally:
                operation.warm = kept
            try:
                result = operation.run(ops, handle, path)
                checked = operation.check(ops, handle, path, result)
            finally:
                ops.close(handle)
            kinds = [call[0] for call in ops.calls]
            if not warm:
                assert kinds == ["replace" if operation.writes else "getitem"], ops.calls
            elif operation.writes:  # another row first, made durable before the timed call
                assert (
                    kinds == ["replace", "settle", "replace"] and ops.calls[0][1] != ops.calls[2][1]
                ), ops.calls
            else:  # a few rows first
                assert ops.calls == [("getitem", 10), ("getitem", 100)], ops.calls
            # The replace's check expects both rows replaced: it holds only after the warm call.
            assert checked == (warm or not operation.writes), (operation.label, warm)


@pytest.mark.parametrize("count", [2, 3, 4, 5, 6])
def test_numpack_runs_balance_who_runs_after_whom(count):
    """The numpack table's run orders (a Williams design): over a full cycle
    each contender runs right after each other one equally often (so none
    always follows the heaviest, NPZ, and finds the caches cold) and runs
    first equally often."""
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import bench_numpack
    finally:
        sys.path.remove(str(SCRIPT.parent))
    cycle = count if count % 2 == 0 else 2 * count
    orders = [bench_numpack.williams_order(run, count) for run in range(cycle)]
    assert all(sorted(order) == list(range(count)) for order in orders)
    follows = Counter(pair for order in orders for pair in zip(order, order[1:]))
    assert len(follows) == count * (count - 1) and len(set(follows.values())) == 1
    firsts = Counter(order[0] for order in orders)
    assert len(firsts) == count and len(set(firsts.values())) == 1


def test_numpack_unsynced_table_checks_every_side_against_numpy():
    """The durable=False edit table at its smallest: every edit kind runs on
    each side, and the closing check compares the store (and numpack, when
    installed) with the memmap's rows plus the appends."""
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import bench_numpack
    finally:
        sys.path.remove(str(SCRIPT.parent))
    table = bench_numpack.bench_unsynced_edits(quick=True, runs=2, rows=2_000)
    rows = [line for line in table.splitlines() if line.startswith("| ") and " ms |" in line]
    labels = [row.split(" | ")[0][2:] for row in rows]
    assert labels == [
        "replace 1 row",
        "replace 200 contiguous rows",
        "replace 200 random rows",
        "replace 1,000 rows",
        "100 1-row edits, one call each",
        "append 1,000 rows",
    ], table


REMOTE = SCRIPT.parent / "bench_remote.py"


def test_bench_remote_quick_runs_loaderx_and_the_file_pair():
    """The remote bench's harness end to end at its smallest: moto's server,
    the counting middleware, loaderx's writer and upload, one child run per
    row, the table and the file:// pair. The contenders are left out (they
    live in their own environment); loaderx's remote rows run once its
    remote datasets exist, and until then the run says why it skipped them."""
    pytest.importorskip("moto", reason="moto[server] is not installed: pip install 'loaderx[test]'")
    arguments = ["--quick", "--tools", "loaderx", "--orders", "cyclic", "--budgets", "100"]
    result = run([sys.executable, str(REMOTE), *arguments])
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    out = result.stdout
    assert "### remote: 2,000 records x 12 KiB" in out and "- loaderx " in out, out
    assert "| loaderx local | ok |" in out, out
    skipped = "skipped: loaderx remote runs:" in out
    assert skipped or "| loaderx | cyclic | 100% | ok |" in out, out
    assert skipped == ("| loaderx file:// | skipped" in out), out
    assert "FAILED" not in out and "crashed" not in out, out
