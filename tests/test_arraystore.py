"""ArrayStore: numpack's operations over zrecord stores, checked against NumPy.

A stateful property test drives random save / replace / append / drop /
compact / reopen sequences against plain arrays; the rest pins down lazy
reads (counted gathers), every bad input (raises, changes nothing), locking,
readers in other handles, recovery, the DataLoader, and crash atomicity of
save and drop (children killed with SIGKILL mid-operation).
"""

from __future__ import annotations

import errno
import fcntl
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from loaderx import ArrayStore, ArrayStoreBatchError, DataLoader, DenseDataset
from loaderx._fs import OS_FS, copy_file
from loaderx.arraystore import LazyArray
from loaderx.zrecord import StoreClosedError, StoreLockedError, Zrecord, ZrecordError

DTYPES = [
    np.bool_,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
    np.float16,
    np.float32,
    np.float64,
]
CRASH_TRIALS = int(os.environ.get("LOADERX_TRIALS", "8"))


def same(actual, expected) -> bool:
    """Equal dtype, shape and bytes (so NaNs and -0.0 compare exactly)."""
    actual = np.asarray(actual)
    return (
        actual.dtype == expected.dtype
        and actual.shape == expected.shape
        and actual.tobytes() == expected.tobytes()
    )


def snapshot(root: str) -> dict:
    """What a failed call must not change: the directory listing, and per
    array its contents and the time of its last commit."""
    state = {"listing": sorted(os.listdir(root))}
    with ArrayStore(root) as reader:
        for name in reader:
            superblock = os.path.join(root, name, "superblock")
            state[name] = (
                reader.load(name).tobytes(),
                reader.get_shape(name),
                os.stat(superblock).st_mtime_ns,
            )
    return state


@pytest.fixture
def root(tmp_path):
    return str(tmp_path / "store")


# ---- round trips ----------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_numpack_dtype_and_shape_round_trips(root, dtype):
    """Each of numpack's dtypes (and float16) round-trips in 0-d, empty,
    1-D, 2-D and 3-D arrays, through a reopen, whole and lazily."""
    rng = np.random.default_rng(0)
    shapes = {
        "scalar": (),
        "empty": (0,),
        "empty_rows": (0, 3),
        "vector": (7,),
        "matrix": (5, 3),
        "cube": (4, 2, 3),
        "no_bytes": (3, 0),
    }
    arrays = {name: (rng.random(shape) * 100).astype(dtype) for name, shape in shapes.items()}
    with ArrayStore(root) as store:
        store.save(arrays)
    with ArrayStore(root) as store:
        assert store.get_member_list() == sorted(shapes)
        assert store.get_shape() == shapes
        for name, array in arrays.items():
            assert same(store.load(name), array), name
            assert same(store[name], array), name
            lazy = store.load(name, lazy=True)
            assert lazy.shape == array.shape and lazy.dtype == array.dtype
            assert same(np.asarray(lazy), array), name
            if array.ndim:
                assert same(lazy[1:3], array[1:3])
                assert same(store.getitem(name, slice(0, 2)), array[0:2])


def test_row_edits_match_numpy(root):
    """replace, append and drop rows with ints, negative ints, slices, lists
    and masks do what the same edit does to a NumPy array."""
    expected = np.arange(60, dtype=np.float32).reshape(20, 3)
    with ArrayStore(root) as store:
        store.save({"a": expected})
        store.replace({"a": np.full((1, 3), -1, np.float32)}, 0)
        expected[0] = -1
        store.replace({"a": np.full(3, -2, np.float32)}, -1)  # one row without its row axis
        expected[-1] = -2
        store.replace({"a": np.full((3, 3), -3, np.float32)}, slice(2, 8, 2))
        expected[2:8:2] = -3
        store.replace({"a": np.array([[7, 7, 7], [8, 8, 8]], np.float32)}, [5, -5])
        expected[[5, -5]] = [[7, 7, 7], [8, 8, 8]]
        mask = np.zeros(20, bool)
        mask[[1, 9]] = True
        store.replace({"a": np.full((2, 3), 4, np.float32)}, mask)
        expected[mask] = 4
        store.append({"a": np.ones((2, 3), np.float32)})
        expected = np.concatenate([expected, np.ones((2, 3), np.float32)])
        store.drop("a", [0, 3, -1, 3])
        expected = np.delete(expected, [0, 3, len(expected) - 1], axis=0)
        store.drop("a", slice(0, 4))
        expected = expected[4:]
        assert same(store.load("a"), expected)
        assert same(store.getitem("a", 2), expected[2])
        assert same(store.getitem("a", [4, 0, 4]), expected[[4, 0, 4]])
        assert same(store.getitem("a", np.arange(len(expected)) % 2 == 0), expected[::2])


def test_replace_with_repeated_indices_takes_the_last_row(root):
    """A repeated index in replace takes its last row, as NumPy's assignment does."""
    with ArrayStore(root) as store:
        store.save({"a": np.zeros((4, 2), np.int32)})
        store.replace({"a": np.array([[1, 1], [2, 2], [3, 3]], np.int32)}, [2, 0, 2])
        assert same(store.load("a"), np.array([[2, 2], [0, 0], [3, 3], [0, 0]], np.int32))


ONE_ROW_KEYS = [3, -2, np.int64(3), np.array(3), [3], [-2], [np.uint8(3)]]


@pytest.mark.parametrize("key", [*ONE_ROW_KEYS, np.array([3]), [3, 3], [[3]]])
def test_a_replace_of_one_row_takes_the_one_record_path_and_matches_numpy(root, monkeypatch, key):
    """A selector of one row (an int, or a list of one int) is one native
    replace of one record, with no index arrays; it and the selectors
    around it write what NumPy's assignment writes, before and after a
    drop moves the rows."""
    a = np.arange(40, dtype=np.int16).reshape(10, 4)
    expected = a.copy()
    with ArrayStore(root, durable=False) as store:
        store.save({"a": a})
        records = count_calls(monkeypatch, Zrecord, "replace_record")
        for dropped in (None, [0, 1, 2]):
            if dropped:
                store.drop("a", dropped)
                expected = np.delete(expected, dropped, 0)
            if isinstance(key, list) and isinstance(key[0], list):
                with pytest.raises(ValueError, match="as a flat list"):
                    store.replace({"a": np.zeros((1, 4), np.int16)}, key)
                continue
            selected = np.arange(len(expected))[key].reshape(-1)
            rows = (np.arange(selected.size * 4, dtype=np.int16) - 100).reshape(-1, 4)
            expected[key] = rows if selected.size > 1 else rows[0]
            store.replace({"a": rows}, key)
            assert same(store.load("a"), expected)
        one_row = any(key is other for other in ONE_ROW_KEYS)
        assert len(records) == (2 if one_row else 0)
        with pytest.raises(IndexError, match="array 'a': index 7 is out of range"):
            store.replace({"a": np.zeros((1, 4), np.int16)}, [7])
        with pytest.raises(ValueError, match=r"got shape \(2, 4\), expected \(1, 4\)"):
            store.replace({"a": np.zeros((2, 4), np.int16)}, 0)
        assert same(store.load("a"), expected)
    with ArrayStore(root) as store:
        assert same(store.load("a"), expected)


def test_same_kind_casts_are_accepted_and_integers_must_fit(root):
    """Rows of another dtype are cast with same_kind casting; integer values
    that do not fit, and float into int, are refused."""
    with ArrayStore(root) as store:
        store.save({"f": np.zeros((2, 2), np.float32), "i": np.zeros(3, np.int8)})
        store.replace({"f": np.full((1, 2), 0.5)}, 0)  # float64 rows
        store.append({"f": [[1, 2]], "i": np.array([100, -100], np.int64)})
        store.replace({"i": [True]}, 0)
        assert same(store.load("f"), np.array([[0.5, 0.5], [0, 0], [1, 2]], np.float32))
        assert same(store.load("i"), np.array([1, 0, 0, 100, -100], np.int8))
        with pytest.raises(ValueError, match="does not fit"):
            store.append({"i": np.array([300])})
        with pytest.raises(ValueError, match="does not cast"):
            store.append({"i": np.array([1.5])})


def test_non_contiguous_inputs_are_copied(root):
    """Strided and Fortran-ordered inputs are accepted (copied)."""
    base = np.arange(200, dtype=np.int64).reshape(20, 10)
    with ArrayStore(root) as store:
        store.save({"a": base[::2, ::3]})
        assert same(store.load("a"), np.ascontiguousarray(base[::2, ::3]))
        rows = np.asfortranarray(np.arange(8, dtype=np.int64).reshape(2, 4))
        store.replace({"a": rows}, [1, 2])
        store.append({"a": base[:3, ::3]})
        expected = np.concatenate([np.ascontiguousarray(base[::2, ::3]), base[:3, ::3]])
        expected[[1, 2]] = rows
        assert same(store.load("a"), expected)


def test_codecs_per_array(root):
    """save(..., codec=) stores each call's arrays with that codec; row edits
    and compact keep working on compressed arrays."""
    data = np.tile(np.arange(100, dtype=np.int32), (50, 1))
    with ArrayStore(root) as store:
        store.save({"z": data}, codec="zstd")
        store.save({"r": data})
        meta = store.get_metadata()["arrays"]
        assert meta["z"]["codec"] == "zstd" and meta["r"]["codec"] == "raw"
        assert meta["z"]["disk_bytes"] < meta["r"]["disk_bytes"]
        store.replace({"z": np.zeros((2, 100), np.int32)}, [3, 4])
        store.drop("z", [0])
        store.compact()
        expected = data.copy()
        expected[[3, 4]] = 0
        assert same(store.load("z"), expected[1:])
        with pytest.raises(ValueError, match="unknown codec"):
            store.save({"x": data}, codec="brotli")


# ---- the stateful model ------------------------------------------------------------

NAMES = st.sampled_from(["a", "b", "c"])
SMALL_DTYPES = st.sampled_from(
    [np.bool_, np.int8, np.uint16, np.int64, np.float16, np.float32, np.float64]
)


@st.composite
def saved_arrays(draw):
    dtype = draw(SMALL_DTYPES)
    ndim = draw(st.integers(0, 3))
    shape = tuple(draw(st.lists(st.integers(0, 4), min_size=ndim, max_size=ndim)))
    if ndim:
        shape = (draw(st.integers(0, 8)),) + shape[1:]
    return draw(hnp.arrays(dtype, shape))


@st.composite
def row_selectors(draw, length: int):
    """An int, slice, or list of distinct rows (negative ones included)."""
    kind = draw(st.sampled_from(["int", "slice", "list"]))
    if kind == "int" and length:
        return draw(st.integers(-length, length - 1))
    if kind == "slice":
        start, stop = (
            draw(st.integers(-length - 1, length + 1)),
            draw(st.integers(-length - 1, length + 1)),
        )
        return slice(start, stop, draw(st.sampled_from([None, 1, 2, -1])))
    rows = draw(st.lists(st.integers(0, max(length - 1, 0)), unique=True, max_size=length))
    return [row - length if draw(st.booleans()) else row for row in rows] if length else []


# One rule picks the operation: with a rule per operation Hypothesis mostly
# draws the argument-free ones (compact, reopen). Edits are listed twice.
OPERATIONS = ("replace", "append", "drop_rows", "save") * 2 + (
    "drop_array",
    "compact",
    "reopen",
    "sync",
)


class ArrayStoreMachine(RuleBasedStateMachine):
    """Random sequences of edits against plain NumPy arrays."""

    durable = True

    def __init__(self):
        super().__init__()
        self.root = tempfile.mkdtemp(prefix="arraystore-model-")
        self.store = ArrayStore(self.root, durable=self.durable)
        self.model: dict[str, np.ndarray] = {}

    def teardown(self):
        self.store.close()
        shutil.rmtree(self.root, ignore_errors=True)

    @rule(operation=st.sampled_from(OPERATIONS), data=st.data())
    def step(self, operation, data):
        with_rows = sorted(name for name, array in self.model.items() if array.ndim)
        if (operation in ("replace", "append", "drop_rows") and not with_rows) or (
            operation == "drop_array" and not self.model
        ):
            operation = "save"
        if operation in ("replace", "append", "drop_rows"):
            getattr(self, operation)(data.draw(st.sampled_from(with_rows), label="name"), data)
        elif operation == "save":
            self.save(
                data.draw(NAMES, label="name"),
                data.draw(saved_arrays(), label="array"),
                data.draw(st.sampled_from(["raw", "raw", "zstd"]), label="codec"),
            )
        elif operation == "drop_array":
            name = data.draw(st.sampled_from(sorted(self.model)), label="name")
            self.store.drop(name)
            del self.model[name]
        elif operation == "compact":
            self.store.compact()
        elif operation == "sync":
            self.store.sync()
        else:
            self.store.close()
            self.store = ArrayStore(self.root, durable=self.durable)

    def save(self, name, array, codec):
        self.store.save({name: array}, codec=codec)
        self.model[name] = array.copy()

    def replace(self, name, data):
        expected = self.model[name]
        key = data.draw(row_selectors(len(expected)), label="rows")
        count = len(np.arange(len(expected))[key].reshape(-1))
        rows = data.draw(hnp.arrays(expected.dtype, (count, *expected.shape[1:])), label="values")
        self.store.replace({name: rows}, key)
        expected[key] = rows[0] if isinstance(key, int) else rows

    def append(self, name, data):
        expected = self.model[name]
        rows = data.draw(
            hnp.arrays(expected.dtype, (data.draw(st.integers(0, 4)), *expected.shape[1:])),
            label="values",
        )
        self.store.append({name: rows})
        self.model[name] = np.concatenate([expected, rows])

    def drop_rows(self, name, data):
        expected = self.model[name]
        key = data.draw(row_selectors(len(expected)), label="rows")
        self.store.drop(name, key)
        self.model[name] = np.delete(expected, np.arange(len(expected))[key], axis=0)

    @invariant()
    def matches_the_model(self):
        assert self.store.get_member_list() == sorted(self.model)
        for name, expected in self.model.items():
            assert self.store.get_shape(name) == expected.shape
            assert same(self.store.load(name), expected), name


ArrayStoreMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("LOADERX_EXAMPLES", "50")),
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestArrayStoreModel = ArrayStoreMachine.TestCase


class NotDurableArrayStoreMachine(ArrayStoreMachine):
    """The same model with ``durable=False``: what the process sees is the same."""

    durable = False


NotDurableArrayStoreMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("LOADERX_EXAMPLES", "15")),
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestNotDurableArrayStoreModel = NotDurableArrayStoreMachine.TestCase


# ---- lazy reads -----------------------------------------------------------------


@pytest.fixture
def gathers(monkeypatch):
    """Every Zrecord.gather call's indices, in order."""
    calls = []
    original = Zrecord.gather

    def counting(self, idxs, dst, offsets=None):
        calls.append(np.array(idxs, dtype=np.int64).reshape(-1))
        return original(self, idxs, dst, offsets)

    monkeypatch.setattr(Zrecord, "gather", counting)
    return calls


def test_lazy_load_reads_only_the_rows_asked_for(root, gathers):
    """A lazy load of a 4M-row array reads nothing; each index reads exactly
    its rows with one gather; load and getitem are one gather each."""
    rows = 4_000_000
    values = (np.arange(rows) % 251).astype(np.uint8)
    with ArrayStore(root) as store:
        store.save({"big": values})
    with ArrayStore(root) as store:
        gathers.clear()
        started = time.perf_counter()
        lazy = store.load("big", lazy=True)
        assert isinstance(lazy, LazyArray)
        assert lazy.shape == (rows,) and len(lazy) == rows and lazy.dtype == np.uint8
        assert time.perf_counter() - started < 0.5
        assert gathers == []
        cases = [
            (slice(10, 20), np.arange(10, 20)),
            (slice(-3, None), np.arange(rows - 3, rows)),
            ([5, 3, 5], np.array([5, 3, 5])),
            (np.array([rows - 1, 0]), np.array([rows - 1, 0])),
            (slice(100, 110, 5), np.array([100, 105])),
        ]
        for key, indices in cases:
            gathers.clear()
            assert same(lazy[key], values[key])
            assert len(gathers) == 1 and np.array_equal(gathers[0], indices), key
        gathers.clear()
        assert lazy[7] == values[7] and len(gathers) == 1 and np.array_equal(gathers[0], [7])
        gathers.clear()
        assert same(store.getitem("big", [1, 2, 3]), values[[1, 2, 3]]) and len(gathers) == 1
        gathers.clear()
        assert same(store.load("big"), values) and len(gathers) == 1
        with store.mmap_mode() as view:
            gathers.clear()
            mapped = view.load("big")
            assert isinstance(mapped, LazyArray) and gathers == []
            assert same(mapped[2:4], values[2:4]) and isinstance(view["big"], LazyArray)


def test_lazy_mask_tuple_and_zero_d(root):
    """Masks and trailing indices work on lazy arrays; a 0-d lazy array is
    read with [()] or np.asarray."""
    matrix = np.arange(24, dtype=np.int16).reshape(6, 4)
    with ArrayStore(root) as store:
        store.save({"m": matrix, "s": np.int32(7)})
        lazy = store.load("m", lazy=True)
        assert same(lazy[matrix[:, 0] > 8], matrix[matrix[:, 0] > 8])
        assert same(lazy[1:3, 2], matrix[1:3, 2])
        assert same(lazy[..., 1], matrix[..., 1])
        assert same(np.stack(list(lazy)), matrix)
        scalar = store.load("s", lazy=True)
        assert (
            scalar.shape == ()
            and same(scalar[()], np.array(7, np.int32))
            and same(np.asarray(scalar), np.array(7, np.int32))
        )
        with pytest.raises(IndexError):
            scalar[0]
        with pytest.raises(TypeError):
            len(scalar)


def test_a_zero_d_array_is_its_marker_and_a_bad_marker_is_damage(root):
    """A one-row array of scalars is 0-d only where its directory's marker
    says so; a marker that says otherwise, or is not msgpack, is damage,
    named on load (lazy or not)."""
    with ArrayStore(root) as store:
        store.save({"s": np.float64(2.5), "one": np.array([2.5])})
    with ArrayStore(root) as store:
        assert store.load("s").shape == () and store.load("s", lazy=True).shape == ()
        assert same(store.load("one"), np.array([2.5]))
    marker = os.path.join(root, "s", "array.msgpack")
    for payload, says in (
        (msgpack.packb({"shape": [1]}), "says a 0-d array"),
        (b"\xc1", "damaged"),
    ):
        with open(marker, "wb") as file:
            file.write(payload)
        for lazy in (False, True):
            with ArrayStore(root) as store, pytest.raises(ValueError, match=says):
                store.load("s", lazy=lazy)


def test_a_reader_opens_each_array_once_by_the_usual_open(root, general_opens):
    """A reader's first load of an array opens it in one native call (not
    the general open), keyed by its directory's inode, so later loads reuse
    it until another process replaces it; a missing name is a KeyError at
    once, with no general open either."""
    general = general_opens
    with ArrayStore(root) as writer:
        writer.save({"a": np.arange(6.0), "b": np.arange(4)})
    with ArrayStore(root) as reader:
        first = reader.load("a", lazy=True)
        entry = reader._arrays["a"]
        assert entry.inode == os.lstat(os.path.join(root, "a")).st_ino
        assert same(first[1:3], np.arange(6.0)[1:3])
        assert reader.load("a", lazy=True)[5] == 5.0 and reader._arrays["a"] is entry
        with pytest.raises(KeyError, match="no array named 'c'"):
            reader.load("c")
        with ArrayStore(root) as writer:
            writer.save({"a": np.arange(3.0) + 10})
        assert same(reader.load("a"), np.arange(3.0) + 10) and reader._arrays["a"] is not entry
    assert general == []


def test_lazy_arrays_see_edits_and_stop_after_overwrite(root):
    """A lazy array shows in-place edits, and fails clearly once its array is
    overwritten, dropped or the store closed."""
    with ArrayStore(root) as store:
        store.save({"a": np.zeros((3, 2)), "b": np.zeros(2)})
        lazy, other = store.load("a", lazy=True), store.load("b", lazy=True)
        store.replace({"a": np.ones((1, 2))}, 1)
        store.append({"a": np.ones((1, 2))})
        assert lazy.shape == (4, 2) and lazy[1].tolist() == [1, 1]
        store.save({"a": np.zeros(5)})
        with pytest.raises(ValueError, match="load it again"):
            lazy[0]
        store.drop("b")
        with pytest.raises(ValueError, match="load it again"):
            other.shape
        kept = store.load("a", lazy=True)
    with pytest.raises(ValueError, match="load it again"):
        kept[0]


# ---- metadata and iteration ---------------------------------------------------------


def test_metadata_iteration_and_streaming(root):
    """get_shape, get_member_list, iteration, len, in, has_array,
    get_metadata, get_modify_time and stream_load."""
    a = np.arange(50, dtype=np.float64).reshape(10, 5)
    with ArrayStore(root) as store:
        store.save({"a": a, "b": np.arange(3)})
        assert store.get_shape("a") == (10, 5) and store.get_shape() == {"a": (10, 5), "b": (3,)}
        assert list(store) == ["a", "b"] == store.get_member_list() and len(store) == 2
        assert (
            "a" in store
            and store.has_array("b")
            and "c" not in store
            and not store.has_array("../a")
        )
        meta = store.get_metadata()["arrays"]["a"]
        assert meta["shape"] == [10, 5] and meta["dtype"] == "<f8" and meta["nbytes"] == 400
        assert meta["disk_bytes"] >= 400
        before = store.get_modify_time("a")
        assert abs(before - time.time()) < 60
        time.sleep(0.02)
        store.replace({"a": np.zeros((1, 5))}, 0)
        assert store.get_modify_time("a") > before
        chunks = list(store.stream_load("a", 4))
        assert [len(chunk) for chunk in chunks] == [4, 4, 2]
        a[0] = 0
        assert same(np.concatenate(chunks), a)
        assert same(np.concatenate(list(store.stream_load("a"))), a)
        store.reset()
        assert list(store) == [] and len(store) == 0


# ---- bad input changes nothing ------------------------------------------------------


def test_every_bad_input_raises_and_changes_nothing(root):
    """Each bad call raises ValueError, IndexError or KeyError (TypeError for
    a non-dict) before anything is written: listing, contents and commit
    times stay as they were."""
    with ArrayStore(root) as store:
        store.save(
            {
                "a": np.arange(12, dtype=np.int8).reshape(4, 3),
                "v": np.arange(5, dtype=np.float32),
                "s": np.float64(1),
            }
        )
    before = snapshot(root)
    good = np.zeros((1, 3), np.int8)
    bad_calls = [
        (ValueError, lambda s: s.save({"../x": good})),
        (ValueError, lambda s: s.save({"": good})),
        (ValueError, lambda s: s.save({".hidden": good})),
        (ValueError, lambda s: s.save({"a/b": good})),
        (ValueError, lambda s: s.save({"x" * 300: good})),
        (ValueError, lambda s: s.save({7: good})),
        (ValueError, lambda s: s.save({"fresh": good, "a\0": good})),
        (ValueError, lambda s: s.save({"fresh": good, "o": np.array([object()])})),
        (ValueError, lambda s: s.save({"fresh": good}, codec="nope")),
        (TypeError, lambda s: s.save([("fresh", good)])),
        (ValueError, lambda s: s.replace({"a": np.zeros((1, 3), np.float32)}, 0)),
        (ValueError, lambda s: s.replace({"a": np.zeros((1, 4), np.int8)}, 0)),
        (ValueError, lambda s: s.replace({"a": np.zeros((2, 3), np.int8)}, [0])),
        (ValueError, lambda s: s.replace({"a": np.zeros((1, 3), np.int8)}, [0, 1])),
        (ValueError, lambda s: s.replace({"a": np.full((1, 3), 300)}, 0)),
        (ValueError, lambda s: s.replace({"a": good}, np.array([[0]]))),
        (ValueError, lambda s: s.replace({"s": np.zeros(1)}, 0)),
        (IndexError, lambda s: s.replace({"a": good}, 4)),
        (IndexError, lambda s: s.replace({"a": good}, -5)),
        (IndexError, lambda s: s.replace({"a": good}, [1.5])),
        (IndexError, lambda s: s.replace({"v": np.zeros(1, np.float32), "a": good}, [4])),
        (KeyError, lambda s: s.replace({"v": np.zeros(1, np.float32), "missing": good}, 0)),
        (KeyError, lambda s: s.append({"missing": good})),
        (
            ValueError,
            lambda s: s.append({"v": np.zeros(2, np.float32), "a": np.zeros((1, 2), np.int8)}),
        ),
        (ValueError, lambda s: s.append({"a": np.zeros((1, 3), np.float64)})),
        (ValueError, lambda s: s.append({"s": np.zeros(1)})),
        (KeyError, lambda s: s.drop("missing")),
        (KeyError, lambda s: s.drop(["v", "missing"])),
        (ValueError, lambda s: s.drop(["v", "../a"])),
        (IndexError, lambda s: s.drop("a", [0, 9])),
        (IndexError, lambda s: s.drop(["v", "a"], [4])),
        (ValueError, lambda s: s.drop("s", [0])),
        (KeyError, lambda s: s.load("missing")),
        (KeyError, lambda s: s["missing"]),
        (IndexError, lambda s: s.getitem("a", 10)),
        (IndexError, lambda s: s.getitem("s", 0)),
        (KeyError, lambda s: s.get_shape("missing")),
        (KeyError, lambda s: s.get_modify_time("missing")),
        (ValueError, lambda s: s.stream_load("a", 0)),
        (ValueError, lambda s: s.stream_load("s", 1)),
        (ValueError, lambda s: s.dataset("s")),
        (KeyError, lambda s: s.dataset("missing")),
    ]
    with ArrayStore(root) as store:
        for position, (error, call) in enumerate(bad_calls):
            with pytest.raises(error):
                call(store)
            assert not store.has_array("fresh"), position
        assert same(store.load("a"), np.arange(12, dtype=np.int8).reshape(4, 3))
    assert snapshot(root) == before


def test_a_directory_without_a_schema_is_not_an_array(root):
    """A directory in the root that holds no schema (empty, or someone
    else's files) is no array: KeyError, and nothing is created in it."""
    with ArrayStore(root) as store:
        store.save({"a": np.arange(4, dtype=np.int8)})
    os.mkdir(os.path.join(root, "empty"))
    os.mkdir(os.path.join(root, "foreign"))
    with open(os.path.join(root, "foreign", "notes.txt"), "w") as file:
        file.write("not an array")
    with ArrayStore(root) as store:
        for name in ("empty", "foreign"):
            with pytest.raises(KeyError, match=f"no array named '{name}'"):
                store.load(name)
            with pytest.raises(KeyError, match=f"no array named '{name}'"):
                store.replace({name: np.zeros(1, np.int8)}, 0)
        assert store.get_member_list() == ["a"]
    assert os.listdir(os.path.join(root, "empty")) == []
    assert os.listdir(os.path.join(root, "foreign")) == ["notes.txt"]


def test_an_array_whose_schema_is_gone_is_damage_not_absence(root, capsys):
    """Deleting `x/schema.msgpack` made `x` vanish from get_member_list()
    without an error and `loaderx verify` exit 0. An array directory that
    holds a store but no schema is a damaged array: listed, its load raises
    CorruptStoreError, and `loaderx verify` names it and exits 1."""
    from loaderx.cli import main
    from loaderx.zrecord import CorruptStoreError

    with ArrayStore(root) as store:
        store.save({"x": np.arange(5), "y": np.arange(3)})
    os.unlink(os.path.join(root, "x", "schema.msgpack"))
    with ArrayStore(root) as store:
        assert store.get_member_list() == ["x", "y"] and "x" in store
        with pytest.raises(CorruptStoreError, match="array 'x' .* is damaged"):
            store.load("x")
        assert store.load("y").tolist() == [0, 1, 2]
    assert main(["verify", root]) == 1
    out = capsys.readouterr().out
    assert "x: DAMAGED" in out and "ok, 3 records verified" in out
    assert (
        "no readable schema.msgpack; restore the array from a copy" in out
        and "from_numpy" not in out
    )


def test_a_closed_store_refuses_calls(root):
    """Every call on a closed ArrayStore raises StoreClosedError (a ValueError)."""
    store = ArrayStore(root)
    store.save({"a": np.zeros(2)})
    store.close()
    store.close()
    for call in (
        lambda: store.load("a"),
        lambda: store.save({"b": np.zeros(1)}),
        lambda: list(store),
        lambda: store.sync(),
    ):
        with pytest.raises(StoreClosedError):
            call()
    assert issubclass(StoreClosedError, ValueError)


def test_paths_that_are_not_array_stores(tmp_path):
    """A file, a foreign non-empty directory or a newer format is refused."""
    file = tmp_path / "file"
    file.write_bytes(b"x")
    with pytest.raises(ValueError, match="is a file"):
        ArrayStore(file)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "data.npy").write_bytes(b"x")
    with pytest.raises(ValueError, match="not an ArrayStore"):
        ArrayStore(foreign)
    newer = tmp_path / "newer"
    ArrayStore(newer).close()
    (newer / ".arraystore.msgpack").write_bytes(
        msgpack.packb({"format": "loaderx-arraystore", "version": 99})
    )
    with pytest.raises(ValueError, match="upgrade"):
        ArrayStore(newer)
    empty = tmp_path / "empty"
    empty.mkdir()
    ArrayStore(empty).close()
    assert os.path.exists(empty / ".arraystore.msgpack")


# ---- writers, readers, recovery ---------------------------------------------------------


def test_one_writer_and_readers_that_follow(root):
    """A second ArrayStore reads but cannot write while the first writes; it
    sees the writer's saves, in-place edits and drops, and becomes the writer
    once the first closes (even holding a handle of an array since dropped)."""
    writer = ArrayStore(root)
    writer.save({"a": np.zeros((3, 2)), "c": np.zeros(1)})
    reader = ArrayStore(root)
    assert same(reader.load("a"), np.zeros((3, 2))) and same(reader.load("c"), np.zeros(1))
    with pytest.raises(StoreLockedError):
        reader.save({"b": np.zeros(1)})
    writer.replace({"a": np.ones((1, 2))}, 2)
    assert reader.getitem("a", 2).tolist() == [1, 1]
    writer.save({"a": np.arange(4)})
    assert same(reader.load("a"), np.arange(4))
    writer.drop("a")
    with pytest.raises(KeyError):
        reader.load("a")
    writer.drop("c")
    writer.close()
    reader.save({"b": np.zeros(1)})
    assert reader.get_member_list() == ["b"]
    reader.close()


def test_recovery_finishes_what_a_crashed_writer_left(root):
    """The first write removes .new- and .drop- leftovers and renames an
    .old-<name> back when <name> is missing (a two-rename swap cut short)."""
    with ArrayStore(root) as store:
        store.save({"a": np.arange(3), "b": np.arange(4), "c": np.arange(5)})
    os.rename(os.path.join(root, "a"), os.path.join(root, ".old-a"))
    shutil.copytree(os.path.join(root, "b"), os.path.join(root, ".old-b"))
    shutil.copytree(os.path.join(root, "b"), os.path.join(root, ".new-b"))
    os.rename(os.path.join(root, "c"), os.path.join(root, ".drop-c"))
    with ArrayStore(root) as store:
        assert store.get_member_list() == ["b"]
        store.compact()  # the first write recovers
        assert store.get_member_list() == ["a", "b"]
        assert same(store.load("a"), np.arange(3)) and same(store.load("b"), np.arange(4))
    assert sorted(os.listdir(root)) == [".arraystore.msgpack", ".lock", "a", "b"]


def test_a_commit_record_left_by_a_crash_is_replayed_on_open(root):
    """A commit record whose swaps did not happen (a crash right after the
    commit point) is replayed by the next open on the real file system: the
    record's inode numbers find the new directories, the saved array is the
    new one, the dropped one is gone, nothing is left over."""
    with ArrayStore(root) as store:
        store.save({"a": np.arange(3), "b": np.arange(4), "c": np.arange(5)})
    shutil.copytree(os.path.join(root, "b"), os.path.join(root, ".new-a"))
    record = {
        "format": "loaderx-arraystore-commit",
        "version": 1,
        "save": {"a": os.stat(os.path.join(root, ".new-a")).st_ino},
        "drop": ["c"],
    }
    payload = msgpack.packb(record)
    with open(os.path.join(root, ".commit.msgpack"), "wb") as handle:
        handle.write(payload + zlib.crc32(payload).to_bytes(4, "little"))
    with ArrayStore(root) as store:
        assert store.get_member_list() == ["a", "b"]
        assert same(store.load("a"), np.arange(4))
    assert sorted(os.listdir(root)) == [".arraystore.msgpack", ".lock", "a", "b"]


def _commit_record_replays(root, record_payload) -> None:
    """Saves a, b, c; puts a copy of b at .new-a and the record; reopening
    replays it: a holds b's rows, c is dropped, nothing is left over."""
    with ArrayStore(root) as store:
        store.save({"a": np.arange(3), "b": np.arange(4), "c": np.arange(5)})
    shutil.copytree(os.path.join(root, "b"), os.path.join(root, ".new-a"))
    with open(os.path.join(root, ".new-a", "schema.msgpack"), "rb") as handle:
        generation = msgpack.unpackb(handle.read())["generation"]
    with open(os.path.join(root, ".commit.msgpack"), "wb") as handle:
        handle.write(record_payload(generation))
    with ArrayStore(root) as store:
        assert store.get_member_list() == ["a", "b"]
        assert same(store.load("a"), np.arange(4))
    assert sorted(os.listdir(root)) == [".arraystore.msgpack", ".lock", "a", "b"]


def test_a_version_2_commit_record_with_a_crc_trailer_is_replayed(root):
    """The commit record of loaderx before the envelope (version 2: msgpack
    and a CRC32 trailer, directories named by generation id) still replays."""

    def payload(generation):
        record = {"format": "loaderx-arraystore-commit", "version": 2}
        body = msgpack.packb({**record, "save": {"a": generation}, "drop": ["c"]})
        return body + zlib.crc32(body).to_bytes(4, "little")

    _commit_record_replays(root, payload)


def test_a_sealed_commit_record_replays_and_a_bad_one_is_refused(root):
    """The commit record this loaderx writes (an envelope, version 3)
    replays; one that fails its checksum, or of a newer loaderx, raises
    CorruptStoreError with the messages of the older layout."""
    from loaderx import _envelope
    from loaderx.zrecord import CorruptStoreError

    def payload(generation):
        content = {"save": {"a": generation}, "drop": ["c"]}
        return _envelope.seal("loaderx-arraystore-commit", 3, content)

    _commit_record_replays(root, payload)
    record = os.path.join(root, ".commit.msgpack")
    empty = {"save": {}, "drop": []}
    sealed = msgpack.unpackb(_envelope.seal("loaderx-arraystore-commit", 3, empty))
    with open(record, "wb") as handle:
        handle.write(msgpack.packb({**sealed, "crc32": sealed["crc32"] ^ 1}))
    with pytest.raises(CorruptStoreError, match="checksum does not match"):
        ArrayStore(root)
    with open(record, "wb") as handle:
        handle.write(_envelope.seal("loaderx-arraystore-commit", 4, empty))
    with pytest.raises(CorruptStoreError, match="version 4.*upgrade loaderx"):
        ArrayStore(root)


def test_the_marker_of_version_1_opens_and_new_markers_are_sealed(tmp_path):
    """A root whose marker is the plain map of loaderx before the envelope
    (version 1) opens and takes writes; a new root's marker is an envelope
    of version 2; a damaged envelope is refused."""
    from loaderx import _envelope

    old, new = tmp_path / "old", tmp_path / "new"
    with ArrayStore(old) as store:
        store.save({"x": np.arange(3)})
    legacy = {"format": "loaderx-arraystore", "version": 1}
    (old / ".arraystore.msgpack").write_bytes(msgpack.packb(legacy))
    with ArrayStore(old) as store:
        store.save({"y": np.arange(2)})
        assert same(store.load("x"), np.arange(3)) and store.get_member_list() == ["x", "y"]
    ArrayStore(new).close()
    payload = (new / ".arraystore.msgpack").read_bytes()
    assert _envelope.unseal(payload, "loaderx-arraystore", 2) == (2, {})
    sealed = msgpack.unpackb(payload)
    torn = {**sealed, "crc32": sealed["crc32"] ^ 1}
    (new / ".arraystore.msgpack").write_bytes(msgpack.packb(torn))
    with pytest.raises(ValueError, match="damaged"):
        ArrayStore(new)
    (new / ".arraystore.msgpack").write_bytes(msgpack.packb({"format": "numpack", "version": 1}))
    with pytest.raises(ValueError, match="not an ArrayStore"):
        ArrayStore(new)


def test_overwrite_without_rename_exchange(root, monkeypatch):
    """Where renameat2(RENAME_EXCHANGE) is missing, the two-rename swap
    overwrites correctly and leaves nothing behind."""
    monkeypatch.setattr(OS_FS, "exchange_works", False)
    with ArrayStore(root) as store:
        store.save({"a": np.zeros(3)})
        store.save({"a": np.ones((2, 2), np.int8)})
        assert same(store.load("a"), np.ones((2, 2), np.int8))
    assert sorted(os.listdir(root)) == [".arraystore.msgpack", ".lock", "a"]


# ---- the DataLoader ------------------------------------------------------------------


def test_dataloader_reads_array_store_datasets(root):
    """dataset(name) is a DenseDataset the DataLoader gathers from, with
    every stream at the same indices."""
    features = np.repeat(np.arange(100, dtype=np.float32)[:, None], 4, axis=1)
    labels = np.arange(100, dtype=np.int64)
    with ArrayStore(root) as store:
        store.save({"x": features, "y": labels})
        store.replace({"y": np.array([50], np.int64), "x": np.full((1, 4), 50, np.float32)}, 0)
        streams = {"x": store.dataset("x"), "y": store.dataset("y")}
    assert all(isinstance(stream, DenseDataset) for stream in streams.values())
    with DataLoader(streams, num_workers=2, batch_size=16, mode=1, seed=3) as loader:
        for _ in range(10):
            batch = next(loader)
            assert batch["x"].shape == (16, 4) and batch["y"].shape == (16,)
            assert np.array_equal(batch["x"][:, 0].astype(np.int64), batch["y"])
            assert 0 not in batch["y"]
    for stream in streams.values():
        stream.close()


# ---- crash atomicity -------------------------------------------------------------------

WORKER = r"""
import sys
import numpy as np
from loaderx import ArrayStore
from loaderx._fs import OS_FS

root, mode, durable = sys.argv[1], sys.argv[2], sys.argv[3] == "durable"
if mode == "fallback":
    OS_FS.exchange_works = False
old = np.full((20000, 16), 1, np.float32)
new = np.full((9000, 8), 2, np.int16)
with ArrayStore(root, durable=durable) as store:
    print("ready", flush=True)
    k = 0
    while True:
        if mode == "drop":
            store.drop([name for name in ("a", "b") if name in store])
        version = new if k % 2 == 0 else old
        if mode == "one":  # one-array calls: the rename commit without a record
            store.save({"a": version})
            store.save({"b": version})
            store.drop("b")
        elif mode == "batch":  # scattered rows of a and all of b get k: one commit
            with store.batch_mode():
                store.replace({"a": np.full((3, 16), k + 2, np.float32)}, [0, 7777, 19999])
                store.save({"b": np.full(100, k + 2, np.int64)})
        elif mode == "wbatch":  # scattered rows of a get k: one replace of the changed rows
            with store.writable_batch_mode():
                store.load("a")[[0, 7777, 19999]] = k
        elif mode == "rows":  # row edits: every row of a gets k, atomically
            store.replace({"a": np.full((20000, 16), k, np.float32)}, slice(None))
            store.drop("a", [0])
            store.append({"a": np.full((1, 16), k, np.float32)})
        else:
            store.save({"a": version, "b": version})
        k += 1
"""
STAGING = (".new-", ".prev-", ".old-", ".drop-", ".commit.msgpack")


@pytest.mark.parametrize(
    "mode, durable",
    [
        ("exchange", "durable"),
        ("fallback", "durable"),
        ("drop", "durable"),
        ("one", "durable"),
        ("exchange", "not"),
        ("drop", "not"),
        ("one", "not"),
        ("rows", "durable"),
        ("rows", "not"),
        ("batch", "durable"),
        ("batch", "not"),
        ("wbatch", "durable"),
        ("wbatch", "not"),
    ],
)
def test_save_and_drop_survive_sigkill(tmp_path, mode, durable):
    """A writer killed with SIGKILL mid-save (or mid-drop) of two arrays
    leaves both old or both new (or both absent after a drop), each whole,
    never a mix; the next open clears the leftovers and the other array is
    untouched. The same with ``durable=False``, for one-array calls, and
    for row edits (a whole-array replace leaves every row old or every row
    new; a drop plus append of a row keeps 20,000 rows of one value)."""
    old = np.full((20000, 16), 1, np.float32)
    new = np.full((9000, 8), 2, np.int16)
    other = np.arange(1000, dtype=np.int64)
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    interrupted = 0
    for trial in range(CRASH_TRIALS):
        root = str(tmp_path / f"{mode}-{trial}")
        with ArrayStore(root) as store:
            store.save({"a": old, "other": other})
        child = subprocess.Popen(
            [sys.executable, "-c", WORKER, root, mode, durable], stdout=subprocess.PIPE
        )
        try:
            assert child.stdout.readline() == b"ready\n"
            time.sleep(rng.uniform(0.0, 0.15))
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
            child.stdout.close()
        interrupted += any(name.startswith(STAGING) for name in os.listdir(root))
        with ArrayStore(root) as store:
            store.compact()  # takes the lock: recovery
            context = f"mode {mode}, trial {trial}, seed {seed}"
            present = [name for name in ("a", "b") if name in store]
            if mode in ("batch", "wbatch"):
                loaded = store.load("a")
                edited = loaded[[0, 7777, 19999]]
                assert np.unique(edited).size == 1, f"a batch was torn ({context})"
                assert same(np.delete(loaded, [0, 7777, 19999], axis=0), old[3:]), context
                if mode == "batch" and edited[0, 0] != 1:
                    assert same(store.load("b"), np.full(100, edited[0, 0], np.int64)), context
                else:
                    assert "b" not in present, context
            elif mode == "rows":
                loaded = store.load("a")
                assert (
                    present == ["a"] and loaded.shape[1:] == (16,) and len(loaded) in (19999, 20000)
                ), context
                assert np.unique(loaded).size == 1, f"a row edit was torn ({context})"
            elif mode == "one":
                loaded = store.load("a")
                assert same(loaded, old) or same(loaded, new), context
                assert "b" not in present or same(store.load("b"), loaded), context
            elif present == ["a"]:
                assert same(store.load("a"), old), context  # the first save did not commit
            elif present == ["a", "b"]:
                loaded = [store.load(name) for name in present]
                assert all(same(array, old) for array in loaded) or all(
                    same(array, new) for array in loaded
                ), context
            else:
                assert present == [] and mode == "drop", context
            assert same(store.load("other"), other), context
        assert [name for name in os.listdir(root) if name.startswith(STAGING)] == []
    # Most kills land inside an operation (about 5 in 6 here); none would mean
    # the test exercised nothing.
    assert interrupted > 0 or mode in ("rows", "wbatch"), (
        f"no kill landed mid-operation in {CRASH_TRIALS} trials (seed {seed})"
    )


# ---- regressions of issue 11 ---------------------------------------------------------


def test_replace_and_append_take_python_values_that_fit(tmp_path):
    """Python ints and lists go into a uint8 array when they fit; arrays of a wider kind
    and values out of range are still refused, and nothing changes."""
    with ArrayStore(tmp_path / "arrays") as store:
        store.save({"y": np.arange(5, dtype=np.uint8)})
        store.replace({"y": [200]}, [0])
        store.replace({"y": 7}, 1)
        store.append({"y": [255, 0]})
        assert store.load("y").tolist() == [200, 7, 2, 3, 4, 255, 0]
        for bad in ([300], [-1], np.array([9]), [1.5]):
            with pytest.raises(ValueError, match="'y'"):
                store.replace({"y": bad}, [0])
        assert store.load("y").tolist() == [200, 7, 2, 3, 4, 255, 0]


def test_refresh_after_save_says_the_array_was_replaced(tmp_path):
    """refresh() on a dataset taken before save() overwrote its array says so, and the
    old dataset still reads what it opened."""
    from loaderx import StoreReplacedError

    with ArrayStore(tmp_path / "arrays") as store:
        store.save({"x": np.arange(4.0)})
        before = store.dataset("x")
        store.save({"x": np.arange(6.0)})
        with pytest.raises(StoreReplacedError, match="replaced.*DenseDataset"):
            before.refresh()
        np.testing.assert_array_equal(before[:], np.arange(4.0))
        before.close()
        with store.dataset("x") as after:
            assert after.refresh() == 6


# ---- issue 10: what each call costs in the ArrayStore protocol ------------------------


class CountingFs(type(OS_FS)):
    """The real file system, counting the seam's mutating and syncing calls."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __getattribute__(self, name):
        attribute = super().__getattribute__(name)
        if name in (
            "mkdir",
            "write_new",
            "write_at",
            "rename",
            "exchange",
            "unlink",
            "rmtree",
            "build_store",
            "fsync_file",
            "fsync_dir",
        ):
            calls = super().__getattribute__("calls")

            def counted(*args, **kwargs):
                calls.append(name)
                return attribute(*args, **kwargs)

            return counted
        return attribute


@pytest.mark.parametrize("durable", [True, False])
def test_row_edits_cost_no_protocol_call_and_one_array_commits_one_fsync(root, durable):
    """Row edits are the array's own zrecord commits: no rename, record or
    fsync of ArrayStore's. A drop of rows is one write of the delete log and
    its fsync (the store's first one also seals the marker at version 3 and
    fsyncs the root, for the log's name). A save or drop of one array is one
    rename plus one root fsync (none with durable=False until sync(), which
    makes one)."""
    fs = CountingFs()
    with ArrayStore(root, durable=durable, _fs=fs) as store:
        store.save({"x": np.zeros((100, 4), np.float32)})
        fs.calls.clear()
        store.replace({"x": np.ones((2, 4), np.float32)}, [3, 9])
        store.append({"x": np.ones((5, 4), np.float32)})

        def protocol():
            # rmtree and unlink are not counted: leftovers go on a thread.
            return [call for call in fs.calls if call not in ("rmtree", "unlink")]

        assert protocol() == []
        marker = ["write_new", "fsync_file", "rename", "fsync_dir"]
        store.drop("x", [0, 1])
        assert protocol() == marker + (
            ["write_at", "fsync_file", "fsync_dir"] if durable else ["write_at"]
        )
        fs.calls.clear()
        store.drop("x", [0])
        assert protocol() == (["write_at", "fsync_file"] if durable else ["write_at"])
        if not durable:
            fs.calls.clear()
            store.sync()  # the log's bytes, and its name with the root's one fsync
            assert protocol() == ["fsync_file", "fsync_dir"], fs.calls
        fs.calls.clear()
        store.save({"y": np.arange(10)})
        store.save({"y": np.arange(5)})  # an overwrite: one exchange
        store.drop("y")
        fsyncs = 3 if durable else 0
        assert fs.calls.count("fsync_dir") == fsyncs and fs.calls.count("fsync_file") == 0, fs.calls
        assert fs.calls.count("build_store") == 2 and "write_new" not in fs.calls, fs.calls
        fs.calls.clear()
        store.sync()
        assert protocol() == ([] if durable else ["fsync_dir"]), fs.calls
        assert store.load("x").shape == (102, 4) and "y" not in store


def test_not_durable_arrays_edit_through_a_non_durable_store_handle(root):
    """With durable=False each array's row edits go through a store handle
    opened with Zrecord(durable=False), and reads see those edits; a durable
    ArrayStore edits through durable handles."""
    with ArrayStore(root, durable=False) as store:
        store.save({"x": np.zeros((10, 3), np.int32)})
        store.replace({"x": np.ones((1, 3), np.int32)}, [4])
        store.append({"x": np.full((2, 3), 7, np.int32)})
        expected = np.zeros((12, 3), np.int32)
        expected[4], expected[10:] = 1, 7
        assert same(store.load("x"), expected) and same(
            store.getitem("x", [4, 11]), expected[[4, 11]]
        )
        assert store._entry("x").store.durable is False
    with ArrayStore(root) as store:
        assert same(store.load("x"), expected)
        store.replace({"x": np.ones((1, 3), np.int32)}, [0])
        assert store._entry("x").store.durable is True


# ---- batch modes (issue 29) ------------------------------------------------------------


def count_calls(monkeypatch, owner, method: str) -> list:
    """Records the arguments of each call of ``owner.method`` (still running it)."""
    calls, original = [], getattr(owner, method)

    def counted(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, method, counted)
    return calls


def test_batch_mode_edits_in_memory_and_commits_once_at_exit(root, monkeypatch):
    """Inside the block reads see the batch, a second reader sees the disk as
    before; at the end one commit makes all of it visible (NumPy's result)."""
    a = np.arange(40, dtype=np.float32).reshape(10, 4)
    b = np.arange(6, dtype=np.int64)
    with ArrayStore(root) as store:
        store.save({"a": a, "b": b})
        expected_a = a.copy()
        commits = count_calls(monkeypatch, store._commits, "commit")
        with store.batch_mode():
            store.replace({"a": np.ones((2, 4))}, [7, 2])
            expected_a[[7, 2]] = 1
            store.append({"b": [6, 7]})
            store.drop("a", [0])
            store.save({"c": np.eye(2)})
            store.drop("b", [1])
            assert same(store.load("a"), expected_a[1:])
            assert same(store.getitem("b", slice(0, 3)), np.array([0, 2, 3]))
            assert store.get_shape() == {"a": (9, 4), "b": (7,), "c": (2, 2)}
            assert same(np.concatenate(list(store.stream_load("a", 4))), expected_a[1:])
            with ArrayStore(root) as reader:
                assert reader.get_member_list() == ["a", "b"]
                assert same(reader.load("a"), a) and same(reader.load("b"), b)
            assert commits == []
        assert len(commits) == 1
        assert same(store.load("a"), expected_a[1:])
        assert same(store.load("b"), np.array([0, 2, 3, 4, 5, 6, 7]))
        assert same(store.load("c"), np.eye(2))
    with ArrayStore(root) as reopened:
        assert reopened.get_member_list() == ["a", "b", "c"]
        assert same(reopened.load("a"), expected_a[1:])


def test_batch_mode_of_rows_of_one_array_is_one_replace_of_those_rows(root, monkeypatch):
    """Only rows of one array edited: one store replace of just those rows
    (no rewrite); a second array edited makes it one commit rewriting both."""
    a = np.arange(3000, dtype=np.int32).reshape(1000, 3)
    with ArrayStore(root) as store:
        store.save({"a": a, "b": np.zeros(5, np.int8)})
        replaces = count_calls(monkeypatch, Zrecord, "replace_checked")
        commits = count_calls(monkeypatch, store._commits, "commit")
        with store.batch_mode():
            for row in (900, 3, 500, 3):
                store.replace({"a": np.full(3, row, np.int32)}, row)
        assert commits == [] and len(replaces) == 1
        assert replaces[0][1].tolist() == [3, 500, 900]
        with store.batch_mode():
            store.replace({"a": [1, 1, 1]}, 0)
            store.replace({"b": [9]}, [4])
        assert len(replaces) == 1 and sorted(commits[0][0]) == ["a", "b"]
        with store.batch_mode():  # rows kept aside, then read: the batch's copy has them
            store.replace({"a": np.zeros((0, 3), np.int32)}, [])
            store.replace({"a": [[2, 2, 2], [4, 4, 4]]}, [10, 11])
            assert same(store.getitem("a", [11, 10]), np.array([[4] * 3, [2] * 3], np.int32))
            store.replace({"a": [5, 5, 5]}, 11)
        assert len(replaces) == 2 and replaces[1][1].tolist() == [10, 11]
        with store.batch_mode():
            store.replace({"a": np.zeros((0, 3), np.int32)}, [])
        assert len(replaces) == 2 and len(commits) == 1  # nothing changed: no commit
        expected = a.copy()
        expected[[900, 3, 500, 0, 10, 11]] = [
            [900] * 3,
            [3] * 3,
            [500] * 3,
            [1] * 3,
            [2] * 3,
            [5] * 3,
        ]
        assert same(store.load("a"), expected)
        assert same(store.load("b"), np.array([0, 0, 0, 0, 9], np.int8))


@pytest.mark.parametrize("durable", [True, False])
def test_batch_mode_keeps_the_rows_a_replace_was_given_not_the_callers_array(root, durable):
    """A caller refilling one buffer for every replace in a batch commits
    each row as it was at its call, with or without the row axis, whether
    the batch holds a copy of the array yet or not."""
    with ArrayStore(root, durable=durable) as store:
        store.save({"a": np.zeros((6, 3), np.float32), "b": np.zeros((6, 3), np.float32)})
        row = np.zeros(3, np.float32)
        rows = np.zeros((1, 3), np.float32)
        with store.batch_mode():
            store.load("b")  # the batch holds b whole; a only as replaces kept aside
            for i in range(6):
                row[:] = i
                rows[:] = 10 + i
                store.replace({"a": row, "b": rows}, i)
                if i >= 3:  # rows 0-2 again, from the other buffer
                    store.replace({"a": rows}, [i - 3])
            row[:] = -1
            rows[:] = -1
        expected = np.repeat(np.arange(6, dtype=np.float32)[:, None], 3, axis=1)
        expected[[0, 1, 2]] = (10 + np.arange(3, 6, dtype=np.float32))[:, None]
        assert same(store.load("a"), expected)
        assert same(store.load("b"), 10 + np.repeat(np.arange(6, dtype=np.float32)[:, None], 3, 1))


def test_a_refused_replace_in_a_batch_keeps_none_of_its_arrays(root):
    """A replace in a batch that one of its arrays refuses (a row out of
    range, rows of the wrong shape) keeps nothing of any array it names,
    whether the batch holds the array whole or its replaces only; a negative
    row counts from the end, as outside a batch."""
    with ArrayStore(root) as store:
        store.save({"a": np.zeros((4, 3), np.int32), "b": np.zeros((4, 2), np.int32)})
        with store.batch_mode():
            store.replace({"a": [1, 1, 1]}, 0)  # a: kept aside, b: not touched yet
            with pytest.raises(ValueError, match="expected"):
                store.replace({"a": [2, 2, 2], "b": [1, 2, 3]}, 1)
            with pytest.raises(IndexError, match="'b': index 4 is out of range"):
                store.replace({"b": [5, 5], "a": [2, 2, 2]}, 4)
            with pytest.raises(IndexError, match="'a'"):
                store.replace({"a": [2, 2, 2]}, -5)
            store.load("b")  # b now held whole
            with pytest.raises(ValueError, match="expected"):
                store.replace({"b": [6, 6], "a": [[2, 2, 2], [2, 2, 2]]}, 2)
            store.replace({"a": [3, 3, 3]}, -1)
        expected = np.zeros((4, 3), np.int32)
        expected[0], expected[3] = 1, 3
        assert same(store.load("a"), expected)
        assert same(store.load("b"), np.zeros((4, 2), np.int32))


def test_an_exception_in_a_batch_discards_it(root):
    """Nothing of a batch that raised is written, in memory or on disk; the
    store works on (the next batch starts from the disk)."""
    with ArrayStore(root) as store:
        store.save({"a": np.arange(4)})
        with pytest.raises(KeyError, match="'zz'"):
            with store.batch_mode():
                store.replace({"a": [9]}, 0)
                store.drop("a")
                store.save({"b": np.ones(2)})
                store.load("zz")
        with pytest.raises(RuntimeError, match="boom"):
            with store.writable_batch_mode():
                store.load("a")[:] = 7
                raise RuntimeError("boom")
        assert store.get_member_list() == ["a"] and same(store.load("a"), np.arange(4))
        with store.batch_mode():
            assert same(store.load("a"), np.arange(4))
    with ArrayStore(root) as reopened:
        assert reopened.get_member_list() == ["a"] and same(reopened.load("a"), np.arange(4))


def test_batches_do_not_nest_or_cross_threads_and_refuse_what_they_cannot_do(root):
    import threading

    from loaderx import ArrayStoreBatchError

    with ArrayStore(root) as store:
        store.save({"a": np.arange(4), "z": np.array(1.5)})
        with store.batch_mode():
            with pytest.raises(ArrayStoreBatchError, match="do not nest"):
                with store.writable_batch_mode():
                    pass
            store.replace({"a": [5]}, 1)
            errors = []

            def other():
                for call in (
                    lambda: store.load("a"),
                    lambda: store.replace({"a": [7]}, 2),  # a's replaces are kept aside
                ):
                    try:
                        call()
                    except ArrayStoreBatchError as exc:
                        errors.append(str(exc))

            thread = threading.Thread(target=other)
            thread.start()
            thread.join(timeout=30)
            assert len(errors) == 2 and all("another thread" in error for error in errors)
            outside = os.path.join(os.path.dirname(str(root)), "out")
            for call in (
                store.compact,
                store.sync,
                store.close,
                store.get_metadata,
                lambda: store.import_({"n": np.ones(2)}),  # a commit of its own
                lambda: store.export(outside + ".npz"),  # it would miss the batch's edits
                lambda: store.pack(outside + ".pack"),
            ):
                with pytest.raises(ArrayStoreBatchError, match="after the batch block"):
                    call()
            assert not os.path.exists(outside + ".npz") and not os.path.exists(outside + ".pack")
            with pytest.raises(ArrayStoreBatchError, match="dataset"):
                store.dataset("a")
            with pytest.raises(ValueError, match="0-d"):
                store.replace({"z": [1.0]}, 0)
            with pytest.raises(IndexError, match="'a'"):
                store.getitem("a", 10)
        with store.writable_batch_mode():
            for call in (
                lambda: store.save({"b": np.ones(1)}),
                lambda: store.append({"a": [1]}),
                lambda: store.drop("a"),
                lambda: store.reset(),
            ):
                with pytest.raises(ArrayStoreBatchError, match="writable_batch_mode"):
                    call()
        assert same(store.load("a"), np.array([0, 5, 2, 3]))


@pytest.mark.parametrize("scan", ["pagemap", "compare"])
def test_writable_batch_mode_commits_only_the_rows_that_changed(root, monkeypatch, scan):
    """Edits of the arrays load() returns are one replace of exactly the
    changed rows, found by the pagemap (rows of written pages, compared) or
    by comparing every row; a write of the same bytes is no change; the
    arrays are read-only after the block."""
    from loaderx import _arraybatch

    if scan == "pagemap" and not _arraybatch.pagemap_works():
        pytest.skip("this kernel's pagemap does not tell written pages apart")
    monkeypatch.setattr(_arraybatch, "pagemap_works", lambda: scan == "pagemap")
    a = np.arange(200_000, dtype=np.float64).reshape(50_000, 4)
    with ArrayStore(root) as store:
        store.save({"a": a, "s": np.array(3)})
        replaces = count_calls(monkeypatch, Zrecord, "replace_checked")
        with store.writable_batch_mode():
            view = store.load("a")
            assert view is store.load("a") and view.flags.writeable
            view[[10, 49_999, 20_000]] += 1
            view[30_000] = a[30_000]  # the same bytes: not a change
            store.replace({"a": np.zeros((1, 4))}, 7)
            assert same(store.getitem("a", 7), np.zeros(4))
        assert len(replaces) == 1 and replaces[0][1].tolist() == [7, 10, 20_000, 49_999]
        assert not view.flags.writeable
        expected = a.copy()
        expected[[10, 49_999, 20_000]] += 1
        expected[7] = 0
        assert same(store.load("a"), expected)
        with store.writable_batch_mode():
            store.load("s")[()] = 4
            store.load("a")[0, 0] = -1
        assert same(store.load("s"), np.array(4)) and store.getitem("a", 0)[0] == -1
        with store.writable_batch_mode():
            store.load("a")
        assert len(replaces) == 1  # no change: no commit
    with ArrayStore(root) as reopened:
        expected[0, 0] = -1
        assert same(reopened.load("a"), expected)


@pytest.mark.parametrize("row_bytes", [1, 24, 4096, 12_000])
def test_changed_rows_finds_exactly_the_changed_rows_of_the_pages_given(row_bytes):
    """The native compare finds exactly the rows that differ among the rows
    overlapping the pages it is given (a row reaching into a page not given
    compared whole, none found elsewhere), rows smaller and larger than a
    page and a partial last page; it refuses pages out of order."""
    from loaderx import _arraybatch, zrecord

    page = _arraybatch.PAGE_BYTES
    rng = np.random.default_rng(row_bytes)
    rows = (page * 40 + 100) // row_bytes + 1
    original = rng.integers(0, 256, rows * row_bytes, dtype=np.uint8)
    edited = original.copy()
    spots = rng.choice(edited.size, 60, replace=False)
    edited[spots] ^= rng.integers(1, 256, spots.size, dtype=np.uint8)
    edited[-1] ^= 1  # the partial last page
    last_page = (edited.size - 1) // page
    pages = np.unique(np.concatenate([spots // page, [last_page]])).astype(np.uint64)
    given = pages[rng.random(pages.size) < 0.7]
    found = zrecord.changed_rows(edited, original, row_bytes, given, page)
    differ = np.any(edited.reshape(rows, row_bytes) != original.reshape(rows, row_bytes), axis=1)
    starts = np.arange(rows) * row_bytes
    overlapping = np.zeros(rows, dtype=bool)
    for number in given.tolist():
        overlapping |= (starts < (number + 1) * page) & (starts + row_bytes > number * page)
    assert found.tolist() == np.flatnonzero(differ & overlapping).tolist()
    assert zrecord.changed_rows(edited, original, row_bytes, given[:0], page).size == 0
    if given.size > 1:
        with pytest.raises(ZrecordError, match="page numbers must ascend"):
            zrecord.changed_rows(edited, original, row_bytes, given[::-1], page)


def test_a_store_compares_edited_records_with_its_committed_ones(tmp_path):
    """``Zrecord.changed_rows`` finds what the module's compare finds against
    a copy of the committed records, reading them through the store; it
    refuses a store that is not of fixed-size records, and more bytes than
    the store holds."""
    from loaderx import _arraybatch, zrecord

    page = _arraybatch.PAGE_BYTES
    rng = np.random.default_rng(11)
    committed = rng.integers(0, 256, (3000, 24), dtype=np.uint8)
    with Zrecord(tmp_path / "fixed", codec="raw") as store:
        store.append(committed, np.arange(3000, dtype=np.uint64) * 24)
        edited = committed.copy().reshape(-1)
        spots = rng.choice(edited.size, 30, replace=False)
        edited[spots] += 1
        pages = np.unique(spots // page).astype(np.uint64)
        expected = zrecord.changed_rows(edited, committed.reshape(-1), 24, pages, page)
        assert expected.size == np.unique(spots // 24).size
        assert store.changed_rows(edited, pages, page).tolist() == expected.tolist()
        with pytest.raises(ZrecordError, match="does not hold"):
            store.changed_rows(np.zeros(edited.size + 24, np.uint8), pages, page)
    with Zrecord(tmp_path / "indexed", codec="zstd") as store:
        store.append(committed, np.arange(3000, dtype=np.uint64) * 24)
        with pytest.raises(ZrecordError, match="layout: indexed"):
            store.changed_rows(edited, pages, page)


@pytest.mark.parametrize("row_items", [1, 3, 1500])
def test_writable_batch_mode_finds_rows_across_page_ends(root, monkeypatch, row_items):
    """Rows smaller than a page, straddling page ends, and larger than a page
    (8-, 24- and 12,000-byte rows): every changed row is found, whichever
    byte of it changed, with the pagemap and with the full compare."""
    from loaderx import _arraybatch

    rows = 40_000 // row_items + 3  # a partial last page
    a = np.arange(rows * row_items, dtype=np.float64).reshape(rows, row_items)
    rng = np.random.default_rng(row_items)
    for scan in (True, False):
        monkeypatch.setattr(_arraybatch, "pagemap_works", lambda scan=scan: scan)
        with ArrayStore(root) as store:
            store.save({"a": a})
            edits = rng.choice(rows, 7, replace=False).tolist() + [rows - 1, 0]
            with store.writable_batch_mode():
                view = store.load("a")
                for row in edits:
                    view[row, rng.integers(row_items)] = -1.0 - row
            expected = a.copy()
            for row in edits:
                expected[row] = view[row]
            assert same(store.load("a"), expected), (row_items, scan)
        shutil.rmtree(root)


@pytest.mark.parametrize("durable", [True, False])
def test_writable_batch_mode_maps_the_data_file_unless_rows_were_dropped(root, durable):
    """An array whose data file holds its rows as they are is edited over a
    private mapping of that file (no copy; the file is unchanged until the
    commit); with dropped rows the rows are copied into a memfd. Both
    commit exactly the rows changed, and a reopen reads them."""
    a = np.arange(60_000, dtype=np.float32).reshape(20_000, 3)
    expected = a.copy()
    with ArrayStore(root, durable=durable) as store:
        store.save({"a": a, "b": a})
        store.drop("b", [0, 7])
        data_file = store._entry("a").store.fixed_data_file()
        before = Path(data_file).read_bytes()
        with store.writable_batch_mode():
            view, other = store.load("a"), store.load("b")
            backing = {
                name: os.readlink(f"/proc/self/fd/{store._batch.copies[name].fd}")
                for name in ("a", "b")
            }
            view[[5, 19_999]] = -1
            other[3] = -2
            assert Path(data_file).read_bytes() == before  # nothing written before the commit
        assert backing["a"] == os.path.realpath(data_file)
        assert backing["b"].startswith("/memfd:")
        expected[[5, 19_999]] = -1
        assert same(store.load("a"), expected) and not view.flags.writeable
        kept = np.delete(a, [0, 7], 0)
        kept[3] = -2
        assert same(store.load("b"), kept)
        store.sync()
    with ArrayStore(root) as reopened:
        assert same(reopened.load("a"), expected) and same(reopened.load("b"), kept)


# ---- get_io_stats and clone -----------------------------------------------------------


def test_io_stats_count_reads_writes_and_syncs_of_known_operations(root):
    rows = np.arange(400, dtype=np.float32).reshape(100, 4)
    with ArrayStore(root) as store:
        opened = store.get_io_stats()
        assert set(opened) == {"bytes_read", "bytes_written", "reads", "writes", "syncs", "calls"}
        store.save({"a": rows})
        saved = store.get_io_stats()
        # The directory built: at least the rows' bytes; its files and the root fsynced.
        assert saved["bytes_written"] - opened["bytes_written"] >= rows.nbytes
        assert saved["syncs"] > opened["syncs"] and saved["bytes_read"] == opened["bytes_read"]
        store.load("a")
        loaded = store.get_io_stats()
        assert loaded["bytes_read"] - saved["bytes_read"] == rows.nbytes
        assert loaded["reads"] - saved["reads"] == 1
        store.getitem("a", [1, 5, 7])
        store.load("a", lazy=True)[10:20]
        read = store.get_io_stats()
        assert read["bytes_read"] - loaded["bytes_read"] == 3 * 16 + 10 * 16
        assert read["reads"] - loaded["reads"] == 2
        store.replace({"a": np.ones((2, 4), np.float32)}, [0, 1])
        replaced = store.get_io_stats()
        assert replaced["bytes_written"] - read["bytes_written"] == 32
        assert replaced["writes"] - read["writes"] == 1
        assert replaced["syncs"] - read["syncs"] == 1  # durable=True: synced before it returns
        assert replaced["calls"] > read["calls"]
        assert sum(len(chunk) for chunk in store.stream_load("a", 30)) == 100
        assert store.get_io_stats()["bytes_read"] - replaced["bytes_read"] == rows.nbytes
    with ArrayStore(root, durable=False) as store:
        store.append({"a": np.zeros((3, 4), np.float32)})
        assert store.get_io_stats()["syncs"] == 0  # deferred to sync()
        store.sync()
        assert store.get_io_stats()["syncs"] >= 1


def test_clone_copies_an_array_in_one_commit_and_refuses_an_existing_name(root):
    rows = np.random.default_rng(3).random((1000, 10)).astype(np.float32)
    with ArrayStore(root, durable=False) as store:
        store.save({"a": rows, "s": np.array(7.5)})
        store.replace({"a": np.full(10, 2, np.float32)}, 3)  # not synced yet: clone syncs it
        rows[3] = 2
        store.clone("a", "b")
        store.clone("s", "t")
        assert same(store.load("b"), rows) and same(store.load("t"), np.array(7.5))
        before = sorted(os.listdir(root))
        with pytest.raises(FileExistsError, match="already has an array 'b'.*drop"):
            store.clone("a", "b")
        with pytest.raises(KeyError, match="no array named 'nope'"):
            store.clone("nope", "c")
        with pytest.raises(ValueError, match="invalid array name"):
            store.clone("a", ".hidden")
        assert sorted(os.listdir(root)) == before
        store.append({"b": np.zeros((1, 10), np.float32)})  # the copies are independent
        assert store.get_shape("a") == (1000, 10) and store.get_shape("b") == (1001, 10)
    with ArrayStore(root) as store:
        assert same(store.load("a"), rows) and same(store.load("b")[:1000], rows)
        with store.batch_mode(), pytest.raises(ArrayStoreBatchError, match="clone"):
            store.clone("a", "c")


@pytest.mark.parametrize("cannot", ["ioctl", "ioctl+copy_file_range"])
def test_copy_file_falls_back_where_reflink_or_copy_file_range_is_missing(
    tmp_path, monkeypatch, cannot
):
    payload = os.urandom(3 * (1 << 20) + 5)
    (tmp_path / "source").write_bytes(payload)

    def unsupported(*args):
        raise OSError(errno.EOPNOTSUPP, "not supported")

    monkeypatch.setattr(fcntl, "ioctl", unsupported)
    if "copy_file_range" in cannot:
        monkeypatch.setattr(os, "copy_file_range", unsupported)
    size, how = copy_file(str(tmp_path / "source"), str(tmp_path / "target"))
    assert size == len(payload) and (tmp_path / "target").read_bytes() == payload
    assert how == ("read" if "copy_file_range" in cannot else "copy_file_range")
    with pytest.raises(FileExistsError, match="cannot copy"):
        copy_file(str(tmp_path / "source"), str(tmp_path / "target"))
