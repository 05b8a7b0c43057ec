"""The numpack benchmark: numpack's own table, for ArrayStore, numpack, NPY and NPZ.

    python scripts/bench_numpack.py [--quick] [--only LABEL-PART]
    python scripts/bench_numpack.py --unsynced [--quick]   # durable=False edits vs np.memmap

`bench_numpack(quick)` returns the markdown table (scripts/bench.py prints it
as its `numpack` table). Two float32 arrays, `a` of N x 10 and `b` of
N/2 x 5 (N = 1M; 100K with --quick), and numpack's operations on them. For
NPY (one .npy file per array) and NPZ (one uncompressed .npz), as in
numpack's README, an edit is load, modify, save. Every figure is the median
of several runs, interleaved across contenders; each contender's results
are checked against NumPy on the first run. Directories live under the
system temporary directory (TMPDIR chooses the disk).
"""

from __future__ import annotations

import gc
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

try:
    import loaderx  # noqa: F401
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from loaderx import ArrayStore

NUMPACK_INSTALL = "numpack==0.4.5"  # 0.5.0's wheel needs glibc 2.38


# ---- contenders: one small adapter each --------------------------------------------


class ArrayStoreOps:
    """ArrayStore and numpack share numpack's method names, so one adapter
    serves both; the subclass says how to open and save. ``settle(path)``
    runs inside the timed region after every write (nothing here: a durable
    ArrayStore call is durable when it returns, a non-durable one is not
    meant to be)."""

    def __init__(self, durable: bool = True):
        self.durable = durable
        self.name = "loaderx durable" if durable else "loaderx durable=False"

    def save(self, path, arrays):
        with ArrayStore(path, durable=self.durable) as store:
            store.save(arrays)

    def open(self, path):
        return ArrayStore(path, durable=self.durable)

    def settle(self, path):
        pass

    def close(self, handle):
        handle.close()

    def load(self, handle, name):
        return handle.load(name)

    def lazy(self, handle, name):
        return handle.load(name, lazy=True)

    def replace(self, handle, name, rows, key):
        handle.replace({name: rows}, key)

    def drop_array(self, handle, name):
        handle.drop(name)

    def drop_rows(self, handle, name, indices):
        handle.drop(name, indices)

    def rewrite(self, handle, name, rows):
        handle.save({name: rows})

    def append(self, handle, name, rows):
        handle.append({name: rows})

    def clone(self, handle, name, new):
        handle.clone(name, new)

    def pack(self, handle, names, out):
        """The whole store to one file in ``out`` and back into memory: pack,
        unpack into a new store, load its arrays."""
        os.makedirs(out)
        handle.pack(os.path.join(out, "arrays.lxpack"))
        with ArrayStore.unpack(os.path.join(out, "arrays.lxpack"), os.path.join(out, "u")) as copy:
            return {name: copy.load(name) for name in names}

    def edits(self, handle, name, rows, indices, mode):
        """One-row edits of ``rows`` at ``indices``: one call each (``mode``
        "calls"), or inside ``batch_mode`` ("batch") or ``writable_batch_mode``
        ("writable") as their users write them."""
        if mode == "batch":
            with handle.batch_mode():
                for index, row in zip(indices.tolist(), rows):
                    handle.replace({name: row}, index)
        elif mode == "writable":
            with handle.writable_batch_mode():
                array = handle.load(name)
                for index, row in zip(indices.tolist(), rows):
                    array[index] = row
        else:
            for index, row in zip(indices.tolist(), rows):
                handle.replace({name: row[None]}, [index])

    def getitem(self, handle, name, indices):
        return handle.getitem(name, indices)


class NumpackOps(ArrayStoreOps):
    """numpack as it is, or with ``synced=True`` each write followed by an
    fsync of every file in its directory (data_<name>.npkd per array and
    metadata.npkm) and of the directory itself (the entries of new and
    deleted files)."""

    def __init__(self, synced: bool = False):
        from numpack import NumPack

        self.NumPack = NumPack
        self.synced = synced
        self.name = "numpack + fsync" if synced else "numpack"
        self.index_replace_works = _numpack_index_replace_works()

    def settle(self, path):
        if self.synced:
            fsync_tree(path)

    def save(self, path, arrays):
        with self.NumPack(path, drop_if_exists=True) as pack:
            pack.save(arrays)

    def open(self, path):
        pack = self.NumPack(path, warn_no_context=False)
        pack.open()
        return pack

    def replace(self, handle, name, rows, key):
        if not isinstance(key, slice) and len(key) > 1 and not self.index_replace_works:
            raise RuntimeError(
                "numpack's replace with an index list of several rows writes wrong rows here (and "
                "crashes the process on large lists), so it is not run"
            )
        handle.replace({name: rows}, key)

    def drop_rows(self, handle, name, indices):
        """numpack 0.4.5's drop of rows from an array that has dropped rows
        already grows about quadratically with the rows: it is refused
        (reported, not timed) when the probe's fit says one call would take
        more than ``SLOW_DROP_SECONDS``."""
        dropped = getattr(handle, "_bench_dropped", set())
        if name in dropped:
            seconds = _numpack_second_drop_seconds(len(indices))
            if seconds > SLOW_DROP_SECONDS:
                raise RuntimeError(
                    f"numpack's drop of {len(indices):,} rows from an array with dropped rows "
                    f"would take about {seconds:,.0f} s a call (a probe's fit: "
                    f"{_numpack_drop_probe_text()}), so it is not run"
                )
        super().drop_rows(handle, name, indices)
        handle._bench_dropped = dropped | {name}

    def clone(self, handle, name, new):
        """numpack 0.4.5 has no clone (0.7 has): a load and a save of the copy."""
        handle.save({new: np.array(handle.load(name))})

    def pack(self, handle, names, out):
        raise RuntimeError("numpack 0.4.5 has no pack (0.7 has), so it is not run")

    def edits(self, handle, name, rows, indices, mode):
        """numpack 0.4.5 has no batch mode: one call per edit, whatever ``mode``."""
        for index, row in zip(indices.tolist(), rows):
            handle.replace({name: row[None]}, [index])


_NUMPACK_PROBE = """
import sys, tempfile
import numpy as np
from numpack import NumPack
with tempfile.TemporaryDirectory() as path:
    with NumPack(path, drop_if_exists=True) as pack:
        pack.save({"a": np.arange(30, dtype=np.float32).reshape(10, 3)})
        pack.replace({"a": np.full((2, 3), -1, np.float32)}, [2, 5])
        ok = np.array_equal(np.array(pack.load("a"))[[2, 5]], np.full((2, 3), -1, np.float32))
sys.exit(0 if ok else 1)
"""


SLOW_DROP_SECONDS = 10.0
_DROP_PROBE_ROWS = (8_000, 32_000)
_NUMPACK_DROP_PROBE = """
import sys, tempfile, time
import numpy as np
from numpack import NumPack
rows = int(sys.argv[1])
with tempfile.TemporaryDirectory() as path:
    with NumPack(path, drop_if_exists=True) as pack:
        pack.save({"a": np.zeros((2 * rows, 10), np.float32)})
    pack = NumPack(path, warn_no_context=False)
    pack.open()
    pack.drop("a", [2 * rows - 1])
    doomed = np.sort(np.random.default_rng(0).choice(2 * rows - 1, rows, replace=False))
    started = time.perf_counter()
    pack.drop("a", doomed)
    print(time.perf_counter() - started)
    pack.close()
"""
_DROP_PROBE: list[tuple[float, float]] = []


def _numpack_drop_probe() -> tuple[float, float]:
    """Seconds of numpack's second drop of 8,000 and of 32,000 rows (after a
    drop of one row), each in a child with a bounded wait."""
    if not _DROP_PROBE:
        seconds = []
        for rows in _DROP_PROBE_ROWS:
            result = subprocess.run(
                [sys.executable, "-c", _NUMPACK_DROP_PROBE, str(rows)],
                capture_output=True,
                text=True,
                timeout=120,
            )
            if result.returncode != 0:
                raise RuntimeError(f"numpack's drop probe failed: {result.stderr[-400:]}")
            seconds.append(float(result.stdout))
        _DROP_PROBE.append((seconds[0], seconds[1]))
    return _DROP_PROBE[0]


def _numpack_second_drop_seconds(rows: int) -> float:
    """The probe's power-law fit at ``rows``."""
    small, large = _numpack_drop_probe()
    exponent = math.log(max(large, 1e-6) / max(small, 1e-6)) / math.log(
        _DROP_PROBE_ROWS[1] / _DROP_PROBE_ROWS[0]
    )
    return large * (rows / _DROP_PROBE_ROWS[1]) ** max(exponent, 1.0)


def _numpack_drop_probe_text() -> str:
    small, large = _numpack_drop_probe()
    return (
        f"{small:.3f} s for {_DROP_PROBE_ROWS[0]:,} rows, {large:.3f} s for {_DROP_PROBE_ROWS[1]:,}"
    )


def _numpack_index_replace_works() -> bool:
    """Whether numpack replaces rows at an index list correctly (numpack 0.4.5
    writes garbage past the first row and can segfault), tried in a child."""
    return (
        subprocess.run([sys.executable, "-c", _NUMPACK_PROBE], capture_output=True).returncode == 0
    )


class NpyOps:
    """One .npy file per array; an edit is load, modify, save."""

    name = "NPY"

    def save(self, path, arrays):
        os.makedirs(path, exist_ok=True)
        for name, array in arrays.items():
            np.save(os.path.join(path, name + ".npy"), array)

    def open(self, path):
        return path

    def close(self, handle):
        pass

    def _file(self, path, name):
        return os.path.join(path, name + ".npy")

    def load(self, path, name):
        return np.load(self._file(path, name))

    def lazy(self, path, name):
        return np.load(self._file(path, name), mmap_mode="r")

    def replace(self, path, name, rows, key):
        array = self.load(path, name)
        array[key] = rows
        np.save(self._file(path, name), array)

    def drop_array(self, path, name):
        os.remove(self._file(path, name))

    def drop_rows(self, path, name, indices):
        np.save(self._file(path, name), np.delete(self.load(path, name), indices, axis=0))

    def rewrite(self, path, name, rows):
        np.save(self._file(path, name), rows)

    def append(self, path, name, rows):
        np.save(self._file(path, name), np.concatenate([self.load(path, name), rows]))

    def clone(self, path, name, new):
        shutil.copyfile(self._file(path, name), self._file(path, new))

    def pack(self, path, names, out):
        return _savez_compressed_and_back({name: self.load(path, name) for name in names}, out)

    def getitem(self, path, name, indices):
        return np.load(self._file(path, name), mmap_mode="r")[indices]

    def edits(self, path, name, rows, indices, mode):
        self.replace(path, name, rows, indices)  # one load, modify, save of them all

    def settle(self, path):
        pass


class NpzOps:
    """One uncompressed .npz of all arrays; an edit is load all, modify, save all."""

    name = "NPZ"

    def _file(self, path):
        return os.path.join(path, "arrays.npz")

    def _all(self, path):
        with np.load(self._file(path)) as archive:
            return {name: archive[name] for name in archive.files}

    def save(self, path, arrays):
        os.makedirs(path, exist_ok=True)
        np.savez(self._file(path), **arrays)

    def open(self, path):
        return path

    def close(self, handle):
        pass

    def load(self, path, name):
        with np.load(self._file(path)) as archive:
            return archive[name]

    def lazy(self, path, name):
        return self.load(path, name)  # an .npz member cannot be memory-mapped

    def _edit(self, path, name, change):
        arrays = self._all(path)
        arrays[name] = change(arrays[name])
        np.savez(self._file(path), **arrays)

    def replace(self, path, name, rows, key):
        def change(array):
            array[key] = rows
            return array

        self._edit(path, name, change)

    def drop_array(self, path, name):
        arrays = self._all(path)
        del arrays[name]
        np.savez(self._file(path), **arrays)

    def drop_rows(self, path, name, indices):
        self._edit(path, name, lambda array: np.delete(array, indices, axis=0))

    def rewrite(self, path, name, rows):
        self._edit(path, name, lambda array: rows)

    def append(self, path, name, rows):
        self._edit(path, name, lambda array: np.concatenate([array, rows]))

    def clone(self, path, name, new):
        arrays = self._all(path)
        np.savez(self._file(path), **arrays, **{new: arrays[name]})

    def pack(self, path, names, out):
        return _savez_compressed_and_back(self._all(path), out)

    def getitem(self, path, name, indices):
        return self.load(path, name)[indices]

    def edits(self, path, name, rows, indices, mode):
        self.replace(path, name, rows, indices)  # one load, modify, save of them all

    def settle(self, path):
        pass


def _savez_compressed_and_back(arrays: dict, out: str) -> dict:
    """NumPy's one compressed file of many arrays (a zip of deflated .npy
    members), written to ``out`` and read back: the NPY and NPZ pack."""
    os.makedirs(out)
    np.savez_compressed(os.path.join(out, "arrays.npz"), **arrays)
    with np.load(os.path.join(out, "arrays.npz")) as archive:
        return {name: archive[name] for name in archive.files}


def fsync_tree(path) -> None:
    """fsync every file under ``path`` and the directories (what makes a
    contender's files durable after its own call returns)."""
    for directory, _, files in os.walk(path):
        for file in files:
            descriptor = os.open(os.path.join(directory, file), os.O_RDONLY)
            try:
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
        descriptor = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def tree_bytes(path) -> int:
    return sum(
        os.path.getsize(os.path.join(directory, file))
        for directory, _, files in os.walk(path)
        for file in files
    )


# ---- the operations --------------------------------------------------------------------


class Operation:
    """One row of the table: ``run(ops, handle, path) -> result`` (timed, and
    for a write followed by ``ops.settle(path)`` in the timed region) and
    ``check(ops, handle, path, result)`` (first run only). ``setup`` says what
    ``path`` holds before the run (untimed): nothing (``empty``, no handle),
    a fresh copy of the saved arrays (``fresh``) or the saved arrays (``open``);
    every operation that does not read an open store writes. ``warm(ops,
    handle)``, when given, runs untimed on the open handle before the run
    (followed by ``settle`` for a write): the array is then in use, as in a
    program that edits or reads it more than once."""

    def __init__(self, label, run, check, setup="open", floor_bytes=0, warm=None):
        self.label = label
        self.run = run
        self.check = check
        self.setup = setup
        self.warm = warm
        self.writes = setup != "open"
        # The new bytes a durable write must put on disk at least once: the
        # floor column times one write of them to a new file plus fdatasync.
        self.floor_bytes = floor_bytes


@dataclass(frozen=True)
class Draws:
    """The rows the edits write and the indices they and the reads use, drawn from one seed (in
    this order: a seed is one workload)."""

    one_row: np.ndarray
    block_rows: np.ndarray
    large_rows: np.ndarray
    row: int
    start: int
    random_rows: np.ndarray
    doomed: np.ndarray
    access: np.ndarray
    warm_row: int
    warm_access: np.ndarray
    scattered: np.ndarray
    scattered_rows: np.ndarray
    clustered: np.ndarray

    @classmethod
    def of(cls, a: np.ndarray, seed: int) -> Draws:
        rng = np.random.default_rng(seed)
        rows = len(a)
        block = min(10_000, rows // 10)
        large = rows // 2
        one_row = rng.random((1, a.shape[1]), dtype=np.float32)
        block_rows = rng.random((block, a.shape[1]), dtype=np.float32)
        large_rows = rng.random((large, a.shape[1]), dtype=np.float32)
        row = int(rng.integers(rows))
        start = int(rng.integers(rows - block))
        random_rows = np.sort(rng.choice(rows, block, replace=False))
        doomed = np.sort(rng.choice(rows, large, replace=False))
        access = rng.integers(0, rows, block)
        warm_row = (row + rows // 2) % rows
        warm_access = rng.integers(0, rows, 10)
        scattered = rng.choice(rows, min(EDITS, rows), replace=False)
        scattered_rows = rng.random((len(scattered), a.shape[1]), dtype=np.float32)
        # As many edits, within 10,000 rows (about 100 pages of a): several a page.
        clustered = rng.choice(block, min(EDITS, block), replace=False) + start
        return cls(
            one_row,
            block_rows,
            large_rows,
            row,
            start,
            random_rows,
            doomed,
            access,
            warm_row,
            warm_access,
            scattered,
            scattered_rows,
            clustered,
        )


def build_operations(a: np.ndarray, b: np.ndarray, seed: int = 0):
    """The table's rows in order (save, loads, edits, random access) and the arrays saved."""
    draws = Draws.of(a, seed)
    arrays = {"a": a, "b": b}
    operations = (
        _load_operations(a, b, arrays)
        + _replace_operations(a, draws)
        + _batch_operations(a, draws)
        + _run_operations(a, draws)
        + _resize_operations(a, b, draws)
        + _access_operations(a, draws)
    )
    return operations, arrays


def _replaced(a: np.ndarray, key, new: np.ndarray) -> np.ndarray:
    expected = a.copy()
    expected[key] = new
    return expected


def _loaded_equal(name: str, expected: np.ndarray):
    return lambda ops, handle, path, _: np.array_equal(ops.load(handle, name), expected)


def _load_operations(a: np.ndarray, b: np.ndarray, arrays: dict) -> list[Operation]:
    def saved_equal(ops, handle, path, _):
        reopened = ops.open(path)
        try:
            return np.array_equal(ops.load(reopened, "a"), a) and np.array_equal(
                ops.load(reopened, "b"), b
            )
        finally:
            ops.close(reopened)

    return [
        Operation(
            "save",
            lambda ops, handle, path: ops.save(path, arrays),
            saved_equal,
            setup="empty",
            floor_bytes=a.nbytes + b.nbytes,
        ),
        Operation(
            "full load (a and b)",
            lambda ops, handle, path: (ops.load(handle, "a"), ops.load(handle, "b")),
            lambda ops, handle, path, result: (
                np.array_equal(result[0], a) and np.array_equal(result[1], b)
            ),
        ),
        Operation(
            "selective load (a)",
            lambda ops, handle, path: ops.load(handle, "a"),
            lambda ops, handle, path, result: np.array_equal(result, a),
        ),
        Operation(
            "lazy / mmap load (a and b)",
            lambda ops, handle, path: (ops.lazy(handle, "a"), ops.lazy(handle, "b")),
            lambda ops, handle, path, result: (
                result[0].shape == a.shape and np.array_equal(result[0][5:9], a[5:9])
            ),
        ),
    ]


def _replace_operations(a: np.ndarray, draws: Draws) -> list[Operation]:
    one_row, block_rows, large_rows = draws.one_row, draws.block_rows, draws.large_rows
    row, warm_row, start, random_rows = draws.row, draws.warm_row, draws.start, draws.random_rows
    block, large = len(block_rows), len(large_rows)
    return [
        Operation(
            "replace 1 row",
            lambda ops, handle, path: ops.replace(handle, "a", one_row, [row]),
            _loaded_equal("a", _replaced(a, [row], one_row)),
            setup="fresh",
            floor_bytes=one_row.nbytes,
        ),
        Operation(
            "replace 1 row, array in use",
            lambda ops, handle, path: ops.replace(handle, "a", one_row, [row]),
            _loaded_equal("a", _replaced(a, [warm_row, row], np.concatenate([one_row, one_row]))),
            setup="fresh",
            floor_bytes=one_row.nbytes,
            warm=lambda ops, handle: ops.replace(handle, "a", one_row, [warm_row]),
        ),
        Operation(
            f"replace {block:,} contiguous rows",
            lambda ops, handle, path: ops.replace(
                handle, "a", block_rows, slice(start, start + block)
            ),
            _loaded_equal("a", _replaced(a, slice(start, start + block), block_rows)),
            setup="fresh",
            floor_bytes=block_rows.nbytes,
        ),
        Operation(
            f"replace {block:,} random rows",
            lambda ops, handle, path: ops.replace(handle, "a", block_rows, random_rows),
            _loaded_equal("a", _replaced(a, random_rows, block_rows)),
            setup="fresh",
            floor_bytes=block_rows.nbytes,
        ),
        Operation(
            f"replace {large:,} rows",
            lambda ops, handle, path: ops.replace(handle, "a", large_rows, slice(0, large)),
            _loaded_equal("a", _replaced(a, slice(0, large), large_rows)),
            setup="fresh",
            floor_bytes=large_rows.nbytes,
        ),
    ]


EDITS = 1_000
EDIT_MODES = {
    "calls": "one call each",
    "batch": "in batch_mode (numpack: one call each)",
    "writable": "in writable_batch_mode (numpack: one call each)",
}


def _batch_operations(a: np.ndarray, draws: Draws) -> list[Operation]:
    """1,000 scattered one-row edits of ``a``, and 1,000 within 10,000 rows
    (several a page), as each side's users write them."""
    indices, rows = draws.scattered, draws.scattered_rows
    expected = _replaced(a, indices, rows)
    clustered = draws.clustered
    clustered_rows = rows[: len(clustered)]
    return [
        Operation(
            f"{len(indices):,} scattered 1-row edits, {text}",
            lambda ops, handle, path, mode=mode: ops.edits(handle, "a", rows, indices, mode),
            _loaded_equal("a", expected),
            setup="fresh",
            floor_bytes=rows.nbytes,
        )
        for mode, text in EDIT_MODES.items()
    ] + [
        Operation(
            f"{len(clustered):,} 1-row edits within {len(draws.block_rows):,} rows, {text}",
            lambda ops, handle, path, mode=mode: ops.edits(
                handle, "a", clustered_rows, clustered, mode
            ),
            _loaded_equal("a", _replaced(a, clustered, clustered_rows)),
            setup="fresh",
            floor_bytes=clustered_rows.nbytes,
        )
        for mode, text in EDIT_MODES.items()
        if mode != "calls"
    ]


RUN_EDITS = 100


def _run_operations(a: np.ndarray, draws: Draws) -> list[Operation]:
    """A run of 100 one-row edits, one call each, on an array in use: the
    untimed warm calls edit the same rows once (one call per row), so with
    ``durable=False`` the run is after the first edit of a sync interval."""
    indices = draws.scattered[:RUN_EDITS]
    rows = draws.scattered_rows[:RUN_EDITS]
    expected = _replaced(a, indices, rows)
    return [
        Operation(
            f"{len(indices)} 1-row edits, one call each, array in use",
            lambda ops, handle, path: ops.edits(handle, "a", rows, indices, "calls"),
            _loaded_equal("a", expected),
            setup="fresh",
            floor_bytes=rows.nbytes,
            # One call per row, as the timed run: numpack 0.4.5's replace of
            # an index list writes wrong rows (see NumpackOps.replace).
            warm=lambda ops, handle: ops.edits(handle, "a", rows[::-1].copy(), indices, "calls"),
        )
    ]


def _resize_operations(a: np.ndarray, b: np.ndarray, draws: Draws) -> list[Operation]:
    doomed = draws.doomed
    kept = np.delete(a, doomed, axis=0)  # the rewrite's rows, made untimed
    in_use = doomed[doomed < len(a) - 1]  # in range after the warm drop of the last row
    return [
        Operation(
            "drop array (b)",
            lambda ops, handle, path: ops.drop_array(handle, "b"),
            lambda ops, handle, path, _: np.array_equal(ops.load(handle, "a"), a),
            setup="fresh",
        ),
        Operation(
            f"drop {len(doomed):,} rows",
            lambda ops, handle, path: ops.drop_rows(handle, "a", doomed),
            _loaded_equal("a", kept),
            setup="fresh",
        ),
        Operation(
            # The warm call is the store's first drop (loaderx: it seals the
            # marker at version 3 and creates the array's delete log).
            f"drop {len(in_use):,} rows, array in use",
            lambda ops, handle, path: ops.drop_rows(handle, "a", in_use),
            _loaded_equal("a", np.delete(a[:-1], in_use, axis=0)),
            setup="fresh",
            warm=lambda ops, handle: ops.drop_rows(handle, "a", [len(a) - 1]),
        ),
        Operation(
            f"rewrite a with the {len(kept):,} rows a drop of {len(doomed):,} keeps",
            lambda ops, handle, path: ops.rewrite(handle, "a", kept),
            _loaded_equal("a", kept),
            setup="fresh",
            floor_bytes=kept.nbytes,
        ),
        Operation(
            "clone (a to c)",
            lambda ops, handle, path: ops.clone(handle, "a", "c"),
            _loaded_equal("c", a),
            setup="fresh",
        ),
        Operation(
            # NPY and NPZ: np.savez_compressed and np.load of it; loaderx: pack, unpack, load.
            "pack to one compressed file and back (a and b)",
            lambda ops, handle, path: ops.pack(handle, ["a", "b"], pack_output(path)),
            lambda ops, handle, path, result: (
                result.keys() == {"a", "b"}
                and np.array_equal(result["a"], a)
                and np.array_equal(result["b"], b)
            ),
            setup="fresh",
        ),
        Operation(
            f"append {len(b):,} rows (to b)",
            lambda ops, handle, path: ops.append(handle, "b", b),
            _loaded_equal("b", np.concatenate([b, b])),
            setup="fresh",
            floor_bytes=b.nbytes,
        ),
    ]


def _access_operations(a: np.ndarray, draws: Draws) -> list[Operation]:
    access, warm_access = draws.access, draws.warm_access
    return [
        Operation(
            f"{len(access):,} random-index access",
            lambda ops, handle, path: ops.getitem(handle, "a", access),
            lambda ops, handle, path, result: np.array_equal(result, a[access]),
        ),
        Operation(
            f"{len(access):,} random-index access, array in use",
            lambda ops, handle, path: ops.getitem(handle, "a", access),
            lambda ops, handle, path, result: np.array_equal(result, a[access]),
            warm=lambda ops, handle: ops.getitem(handle, "a", warm_access),
        ),
    ]


# ---- running ---------------------------------------------------------------------------


def pack_output(path: str) -> str:
    """Where the pack row writes its file and copy, beside the store at ``path``."""
    return f"{path}-pack"


def _prepare(ops, operation, work: Path, saved: Path):
    """The untimed setup; returns (handle, path) for ``run``. It ends with
    ``os.sync()`` so no write-back of earlier runs overlaps the timed one."""
    if operation.setup == "open":
        handle, path = ops.open(str(saved)), str(saved)
    else:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(pack_output(str(work)), ignore_errors=True)
        if operation.setup == "empty":
            handle, path = None, str(work)
        else:
            shutil.copytree(saved, work)
            handle, path = ops.open(str(work)), str(work)
    if operation.warm is not None:
        try:
            operation.warm(ops, handle)
        except Exception:
            if handle is not None:
                ops.close(handle)
            raise
        if operation.writes:
            ops.settle(path)
    os.sync()
    gc.collect()
    return handle, path


def _floor_seconds(root: Path, byte_count: int) -> float:
    """One overwrite of ``byte_count`` bytes in a file that holds them
    already (allocated and synced, untimed) and its fdatasync: no durable
    write of that much new data can cost less."""
    path = root / "floor"
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(descriptor, np.zeros(byte_count, dtype=np.uint8))
        os.fsync(descriptor)
        payload = np.ones(byte_count, dtype=np.uint8)
        os.sync()
        started = time.perf_counter()
        os.pwrite(descriptor, payload, 0)
        os.fdatasync(descriptor)
        elapsed = time.perf_counter() - started
    finally:
        os.close(descriptor)
        os.remove(path)
    return elapsed


def _time_operation(contenders, operation, root: Path, runs: int) -> dict:
    samples = {ops.name: [] for ops in contenders}
    failures = {}
    floors = []
    for run in range(runs):
        if operation.floor_bytes:
            floors.append(_floor_seconds(root, operation.floor_bytes))
        # Whoever runs right after the heaviest contender (NPZ) finds the
        # caches cold: a rotation kept that one contender (loaderx durable)
        # for all runs but the first. The orders of a Williams design give
        # each contender every other one as its predecessor equally often.
        for position in williams_order(run, len(contenders)):
            ops = contenders[position]
            if ops.name in failures:
                continue
            stem = ops.name.replace(" ", "_")
            handle = None
            try:
                handle, path = _prepare(
                    ops, operation, root / f"{stem}-work", root / f"{stem}-saved"
                )
                started = time.perf_counter()
                result = operation.run(ops, handle, path)
                if operation.writes:
                    ops.settle(path)
                samples[ops.name].append(time.perf_counter() - started)
                if run == 0 and not operation.check(ops, handle, path, result):
                    failures[ops.name] = "wrong result"
            except Exception as exc:  # a contender that fails is reported, not fatal
                failures[ops.name] = f"{type(exc).__name__}: {exc}"
            finally:
                if handle is not None:
                    ops.close(handle)
    results = {
        name: (failures.get(name) or statistics.median(values)) for name, values in samples.items()
    }
    results[FLOOR] = statistics.median(floors) if floors else None
    return results


FLOOR = "floor: new bytes overwritten + fdatasync"


def williams_order(run: int, count: int) -> list[int]:
    """Run ``run``'s order of ``count`` contenders, from a Williams design:
    over ``count`` runs (``2 * count`` for an odd count) each contender runs
    right after each other one equally often, and first equally often."""
    first = [0]
    low, high = 1, count - 1
    while len(first) < count:
        first.append(low)
        low += 1
        if len(first) < count:
            first.append(high)
            high -= 1
    order = [(position + run) % count for position in first]
    return order[::-1] if count % 2 and (run // count) % 2 else order


PAIRINGS = (("loaderx durable", "numpack + fsync"), ("loaderx durable=False", "numpack"))


def _pairing_best(results: dict, name: str) -> float | None:
    """The fastest time of ``name``'s pairing (None for the references)."""
    for pairing in PAIRINGS:
        if name in pairing:
            times = [
                results[member]
                for member in pairing
                if member in results and not isinstance(results[member], str)
            ]
            return min(times) if times else None
    return None


def _cell(value, best: float | None) -> str:
    if isinstance(value, str):
        return "not run" if value.endswith("so it is not run") else "FAILED"
    text = f"{value * 1e3:.3f} ms" if value < 0.01 else f"{value * 1e3:.1f} ms"
    return f"**{text}**" if value == best else text


def _contenders() -> tuple[list, list[str]]:
    """The table's columns in order (each pairing side by side) and a note on any skipped."""
    contenders, notes = [ArrayStoreOps(durable=True)], []
    try:
        contenders.append(NumpackOps(synced=True))
    except ImportError:
        notes.append(f"skipped: numpack not installed (pip install {NUMPACK_INSTALL})")
    contenders.append(ArrayStoreOps(durable=False))
    if len(contenders) == 3:
        contenders.append(NumpackOps(synced=False))
    contenders += [NpyOps(), NpzOps()]
    return contenders, notes


def bench_numpack(quick: bool, only: str | None = None) -> str:
    """numpack's benchmark table; returns markdown. ``only``: just the rows
    whose label contains it."""
    rows = 100_000 if quick else 1_000_000
    runs = 3 if quick else 12  # 12: two cycles of the six contenders' Williams orders
    rng = np.random.default_rng(42)
    a = rng.random((rows, 10), dtype=np.float32)
    b = rng.random((rows // 2, 5), dtype=np.float32)
    contenders, notes = _contenders()
    operations, arrays = build_operations(a, b)
    operations = [operation for operation in operations if only is None or only in operation.label]
    table_rows, errors = [], []
    with tempfile.TemporaryDirectory(prefix="loaderx-bench-numpack-") as temporary:
        root = Path(temporary)
        sizes = {}
        for ops in contenders:
            saved = root / (ops.name.replace(" ", "_") + "-saved")
            ops.save(str(saved), arrays)
            sizes[ops.name] = tree_bytes(saved)
        for operation in operations:
            results = _time_operation(contenders, operation, root, runs)
            floor = results.pop(FLOOR)
            table_rows.append(
                [operation.label]
                + [_cell(results[ops.name], _pairing_best(results, ops.name)) for ops in contenders]
                + ["—" if floor is None else _cell(floor, None)]
            )
            errors += [
                f"{_cell(value, None)}: {name}, {operation.label}: {value}"
                for name, value in results.items()
                if isinstance(value, str)
            ]
        npy = sizes["NPY"]
        table_rows.append(
            ["file size"]
            + [
                f"{sizes[ops.name] / 2**20:.2f} MiB ({sizes[ops.name] / npy:.5f}x NPY)"
                for ops in contenders
            ]
            + ["—"]
        )
    header = ["operation"] + [ops.name for ops in contenders] + [FLOOR]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows]
    table, text = "\n".join(lines), "\n".join(notes + errors)
    return (
        f"### numpack: arrays a = {rows:,} x 10 and b = {rows // 2:,} x 5 float32, "
        "warm page cache\n\n"
        f"{table}\n\n"
        + (f"{text}\n\n" if text else "")
        + f"Median of {runs} interleaved runs in Williams-design orders (each contender runs right "
        "after each other one, and first, equally often), results checked against NumPy on the "
        "first. Two pairings: `loaderx durable` (every call durable when it returns) against "
        "`numpack + fsync` (each write followed, inside the timing, by an fsync of numpack's "
        "data_<name>.npkd files, metadata.npkm and the directory), and `loaderx durable=False` "
        "(atomic through SIGKILL, durable at sync() and close(); the save row includes the close,"
        " so its syncs) against numpack as it is; the fastest of each pairing in bold. NPY and "
        "NPZ are references without fsync. Edits run on a fresh copy of the saved arrays (copied "
        "untimed); reads on an open store. The rows `..., array in use` first make one untimed "
        "call of the same kind on `a` (an edit of another row with its settling fsync), so "
        "loaderx's open of the array is out of their timing (numpack, NPY and NPZ open their "
        "files in every call). NPY and NPZ edits are load, modify, save (numpack's README "
        "method). numpack and loaderx drop rows by marking them (compacted later); `rewrite a "
        "...` saves the kept rows over `a`. Random access: `getitem` (loaderx, numpack), a memory"
        " map (NPY), a full member read (NPZ). "
        f"`{FLOOR}`: one overwrite of the operation's new bytes in an allocated, synced file and "
        "its fdatasync, timed in the same runs: a durable write cannot cost less, and an atomic "
        "in-place replace must make its new rows durable somewhere (a journal) before it may "
        "overwrite the old ones, so it cannot cost less than this either, durable or not."
    )


def _unsynced_edit_kinds(rows: int, rng) -> dict:
    """label -> (key, row count, one call per row?); key None: an append."""
    block = min(10_000, rows // 10)
    start = int(rng.integers(rows - block))
    return {
        "replace 1 row": ([int(rng.integers(rows))], 1, False),
        f"replace {block:,} contiguous rows": (slice(start, start + block), block, False),
        f"replace {block:,} random rows": (
            np.sort(rng.choice(rows, block, replace=False)),
            block,
            False,
        ),
        f"replace {rows // 2:,} rows": (slice(0, rows // 2), rows // 2, False),
        f"{RUN_EDITS} 1-row edits, one call each": (
            rng.choice(rows, RUN_EDITS, replace=False),
            RUN_EDITS,
            True,
        ),
        f"append {rows // 2:,} rows": (None, rows // 2, False),
    }


class _UnsyncedSides:
    """The three sides of the unsynced-edit table on one array ``a``: an
    ArrayStore with ``durable=False``, numpack 0.4.5 as it is (when
    installed), and a writable ``np.memmap`` of an .npy file."""

    def __init__(self, root: Path, a: np.ndarray):
        with ArrayStore(root / "store", durable=True) as store:
            store.save({"a": a})
        np.save(root / "a.npy", a)
        self.store = ArrayStore(root / "store", durable=False)
        self.store.replace({"a": a[:1]}, [0])  # opens the array: it is in use
        self.mapped = np.load(root / "a.npy", mmap_mode="r+")
        self.appended = []  # the memmap side's appends, kept to check against
        try:
            self.numpack = NumpackOps(synced=False)
        except ImportError:
            self.numpack = None
            self.pack = None
        else:
            self.numpack.save(str(root / "numpack"), {"a": a})
            self.pack = self.numpack.open(str(root / "numpack"))
            self.numpack.replace(self.pack, "a", a[:1], [0])
            self.pack_mirror, self.pack_appended = a.copy(), []  # what numpack must hold

    def store_edit(self, key, rows, per_row):
        if key is None:
            return self.store.append({"a": rows})
        if not per_row:
            return self.store.replace({"a": rows}, key)
        for index, row in zip(key.tolist(), rows):
            self.store.replace({"a": row[None]}, [index])

    def numpack_can(self, key, per_row) -> bool:
        """Whether numpack is installed and makes this edit correctly (0.4.5's
        replace of an index list of several rows does not)."""
        if self.pack is None:
            return False
        several = key is not None and not isinstance(key, slice) and len(key) > 1
        return per_row or not several or self.numpack.index_replace_works

    def numpack_edit(self, key, rows, per_row):
        if key is None:
            self.pack_appended.append(rows)
            return self.numpack.append(self.pack, "a", rows)
        self.pack_mirror[key] = rows
        if per_row:
            return self.numpack.edits(self.pack, "a", rows, key, "calls")
        return self.numpack.replace(self.pack, "a", rows, key)

    def memmap_edit(self, key, rows, per_row):
        """The stand-in for an unsynced pwrite: rows assigned into a writable
        memory map (an append: kept aside, a mapping cannot grow)."""
        if key is None:
            self.appended.append(rows)
        elif not per_row:
            self.mapped[key] = rows
        else:
            for index, row in zip(key.tolist(), rows):
                self.mapped[index] = row

    def check(self) -> None:
        self.store.sync()
        self.mapped.flush()
        expected = np.concatenate([np.asarray(self.mapped)] + self.appended)
        assert np.array_equal(np.array(self.store.load("a")), expected), "loaderx differs"
        if self.pack is not None:
            loaded = np.array(self.pack.load("a"))
            mirror = np.concatenate([self.pack_mirror] + self.pack_appended)
            assert np.array_equal(loaded, mirror), "numpack differs"

    def close(self) -> None:
        self.store.close()
        if self.pack is not None:
            self.numpack.close(self.pack)


def _timed(edit) -> float:
    started = time.perf_counter()
    edit()
    return time.perf_counter() - started


def bench_unsynced_edits(quick: bool, runs: int = 21, rows: int | None = None) -> str:
    """``durable=False`` edits of an array in use, after the first edit of a
    sync interval, against numpack 0.4.5 as it is (no sync; when installed)
    and a writable ``np.memmap`` of an .npy file. Each run: ``sync()``
    (untimed, a new interval), the first edit (timed apart: it saves the
    blocks it touches to the undo area, one fdatasync), then the same edit
    again with other values (timed: no sync); numpack and the memmap make
    the edit twice the same way, the second timed."""
    rows = rows or (100_000 if quick else 1_000_000)
    rng = np.random.default_rng(7)
    a = rng.random((rows, 10), dtype=np.float32)
    table = []
    with tempfile.TemporaryDirectory(prefix="loaderx-bench-unsynced-") as temporary:
        sides = _UnsyncedSides(Path(temporary), a)
        try:
            for label, (key, count, per_row) in _unsynced_edit_kinds(rows, rng).items():
                values = [rng.random((count, 10), dtype=np.float32) for _ in range(2)]
                first, then, pack, standin = [], [], [], []

                def edit(side, v, key=key, values=values, per_row=per_row):
                    return lambda: side(key, values[v], per_row)

                for _ in range(runs):
                    sides.store.sync()
                    os.sync()
                    first.append(_timed(edit(sides.store_edit, 0)))
                    then.append(_timed(edit(sides.store_edit, 1)))
                    if sides.numpack_can(key, per_row):
                        sides.numpack_edit(key, values[0], per_row)
                        pack.append(_timed(edit(sides.numpack_edit, 1)))
                    sides.memmap_edit(key, values[0], per_row)
                    standin.append(_timed(edit(sides.memmap_edit, 1)))
                medians = [statistics.median(v) if v else None for v in (first, then, pack or [])]
                table.append((label, *medians, statistics.median(standin)))
            sides.check()
        finally:
            sides.close()
    header = (
        "| edit (array in use) | ArrayStore durable=False, first edit of the interval | "
        "ArrayStore durable=False, next edit | numpack 0.4.5 | ratio to numpack | "
        "np.memmap stand-in |\n|---|---|---|---|---|---|"
    )

    def pack_cells(then, pack):
        if pack is None:
            return "not run | —"
        return f"{_cell(pack, None)} | {then / pack:.2f}x"

    lines = [header] + [
        f"| {label} | {_cell(first, None)} | {_cell(then, None)} | {pack_cells(then, pack)} | "
        f"{_cell(standin, None)} |"
        for label, first, then, pack, standin in table
    ]
    return (
        f"### durable=False edits after the first of a sync interval: a = {rows:,} x 10 float32\n\n"
        + "\n".join(lines)
        + f"\n\nMedian of {runs} runs. Each run syncs (untimed), makes the first edit (which "
        "saves the blocks it touches to the undo area under one fdatasync; of the 100 one-row "
        "edits, on 100 blocks, each that finds its block unsaved pays one, and saves blocks "
        "ahead too) and then the same edit again with other "
        "values (no sync). numpack 0.4.5 as it is (no sync; `not run`: not installed, or its "
        "replace of an index list of several rows writes wrong rows) and the stand-in, the same "
        "rows assigned into a writable np.memmap of an .npy file (page cache only, no sync "
        "call, no checksums, no atomicity; an append is only kept aside), make each edit twice, "
        "the second timed."
    )


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if "--unsynced" in args:
        print(bench_unsynced_edits("--quick" in args))
        return 0
    only = args[args.index("--only") + 1] if "--only" in args else None
    print(bench_numpack("--quick" in args, only))
    return 0


if __name__ == "__main__":
    sys.exit(main())
