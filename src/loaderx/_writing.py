"""The write session of every converter: one store written all or nothing.

``from_numpy`` and ``from_iterator`` (loaderx.converter), ``from_arrow``
(loaderx.arrow), ``write_shard`` (loaderx.shards) and, through it, Ray's
sink are front-ends that turn their input into packed records; this module
is what they share underneath:

- ``write_store(path, schema, mode, fill)``: runs ``fill(writer)`` into the
  store ``mode`` asks for (a new one built beside ``path`` and swapped in, or
  an existing one appended to in place), all or nothing;
- ``Writer``: one store's appends, its dictionary training and its commit
  (data durable first, then the schema), rolled back on failure;
- ``auto_codec``, ``packed_trial``, ``shuffled_samples``: what
  ``codec="auto"`` and the shuffled dictionary codecs need from a sample;
- ``Progress``: the one-line progress bar;
- the argument checks and bounds the front-ends share (``chunk_bytes``,
  ``progress``, codec names).

Invariant: a store a session creates gets its schema only after its data is
durable, and a failed session leaves the path as it found it (an append's
records deleted again, a new store never swapped in).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Any, Callable, Literal, TextIO, cast

import numpy as np
import numpy.typing as npt

from ._checks import check_int
from ._fs import OS_FS, DirectorySwap, OsFs
from ._native import LIMITS
from .schema import Schema, StrPath, read_schema, write_schema
from .zrecord import (
    CODECS,
    SHUFFLE_ELEMENT_BYTES,
    StoreLockedError,
    Zrecord,
    ZrecordError,
    codec_id,
    codec_parts,
    encoded_bytes,
    is_creation_leftover,
    is_store,
    lock_exclusive,
    shuffle_bytes,
    shuffled_codec,
)

MiB = 1 << 20

CHUNK_BYTES = 64 * MiB

#: chunk_bytes is a memory budget: a chunk of rows is read (and for
#: from_iterator a buffer of that size allocated) before each append. 4 GiB
#: is 64x the default, which already appends at disk speed; 10**15 asked
#: for a petabyte buffer.
CHUNK_BYTES_MAX = 4 << 30

DICT_BYTES = 112 * 1024

DICT_BYTES_MIN = LIMITS["dict_bytes_min"]

DICT_BYTES_MAX = LIMITS["dict_bytes_max"]

# Bounds the records per append (and so the native per-record state) when
# records are tiny: a chunk holds at most chunk_bytes // 64 records.
RECORD_COST_BYTES = 64

# Dictionary training: samples of at most this many bytes each, about 100x
# the dictionary size in total (zstd's advice), and at least this many.
SAMPLE_PIECE_BYTES = 128 * 1024

SAMPLE_BUDGET_MAX = 32 * MiB

SAMPLE_PIECES_MIN = 16

# codec="auto" tries the shuffle filter on at most this many records, of at
# most this many bytes in all, and keeps it when the sample shrinks by at
# least SHUFFLE_GAIN_MIN (the measurements behind it: README, "Byte shuffle").
TRIAL_RECORDS_MAX = 64

TRIAL_BYTES_MAX = 4 * MiB

SHUFFLE_GAIN_MIN = 0.03

# The codec names that let a converter pick the codec from a trial:
# "auto" the smallest (zstd or zstd_shuffleN), "auto-speed" the fastest to
# decode (lz4 or lz4_shuffleN; docs/concepts/codecs.md has the measurements).
AUTO_CODECS = ("auto", "auto-speed")


# ---- the write session -------------------------------------------------------


class Writer:
    """One conversion's writes into one store: ``new`` a fresh store in a
    directory nobody reads yet (the staging directory of a ``DirectorySwap``),
    else the existing store at ``path`` appended to in place, whose records
    this call appended are deleted again on failure."""

    def __init__(self, path: str, schema: Schema, new: bool) -> None:
        self.path = path
        self.schema = schema
        existing = None if new else _existing_schema(path, OS_FS)
        if existing is not None and existing != schema:
            raise ValueError(_mismatch(path, existing, schema))
        self.new = existing is None  # a new store, or a bare Zrecord store without a schema yet
        # Commits skip their fsyncs: commit() syncs once at the end. A crash
        # before that leaves a new store without its schema (never swapped
        # in), and an existing one at its last synced state, so the call
        # stays all or nothing; each chunk's append no longer waits for its
        # own three fsyncs.
        self.store = Zrecord(path, codec=schema.codec, durable=False, create=new, _staged=new)
        self.first = len(self.store)
        self.appending = not new

    def __enter__(self) -> Writer:
        return self

    def __exit__(
        self, kind: object, error: BaseException | None, traceback: object
    ) -> Literal[False]:
        try:
            if error is not None and self.appending:
                self._roll_back()
        finally:
            self.store.close()
        return False

    def append(self, buffer: np.ndarray, offsets: np.ndarray) -> None:
        self.store.append(buffer, offsets)

    def train_dictionary(self, samples: list[npt.NDArray[np.uint8]], dict_size: int) -> None:
        train_dictionary(self.store, samples, dict_size)

    def commit(self) -> None:
        """Data durable first, then the schema that makes it a loaderx store."""
        self.store.sync()
        if self.new:
            write_schema(self.path, self.schema)

    def _roll_back(self) -> None:
        """Deletes what this call appended to an existing store (a new one is
        its owner's to delete)."""
        try:
            end = len(self.store)
            if end > self.first:
                self.store.delete(np.arange(self.first, end, dtype=np.uint64), keep_order=True)
                self.store.sync()
        except Exception:
            pass  # the error that stopped the conversion is the one to report


def write_store(
    path: StrPath, schema: Schema, mode: str, fill: Callable[[Writer], int], fs: OsFs, staged: bool
) -> int:
    """Runs ``fill`` (the conversion's writes, ending with ``commit``) into
    the store ``mode`` asks for at ``path``: appended to in place (``"a"``
    on an existing store), or a new store built beside it and swapped in
    (a first creation, or ``"w"`` over an old store) under the path's lock,
    so that every open sees the old store whole or the new one whole.
    ``staged``: ``path`` is the new staging directory of a swap its caller
    runs (a shard's), written directly."""
    target = os.fspath(path)
    if staged:
        with Writer(target, schema, new=True) as writer:
            return fill(writer)
    if mode == "a" and _store_state(target, fs) == "store":
        return _append_in_place(fs.real_path(target), schema, fill)
    if fs.exists(target) and not fs.replaceable(target) and _store_state(target, fs) == "fresh":
        return _create_in_place(target, schema, fill, fs)
    count = 0
    with DirectorySwap(target, fs, _locked) as swap:
        state = _store_state(
            target, fs
        )  # again, under the lock: another writer may have finished meanwhile
        if state == "store" and mode == "x":
            raise FileExistsError(
                f"'{target}' exists and is not empty: pass mode='w' to overwrite the store there "
                "or mode='a' to append to it"
            )
        if state == "store" and mode == "a":
            return _append_in_place(fs.real_path(target), schema, fill)
        old_lock = lock_exclusive(target, "overwrite", fs) if state == "store" else None
        try:

            def build(staging: str) -> None:
                nonlocal count
                with Writer(staging, schema, new=True) as writer:
                    count = fill(writer)

            swap.build(build)
            swap.commit()
        finally:
            if old_lock is not None:
                fs.unlock(old_lock)
    return count


def _create_in_place(target: str, schema: Schema, fill: Callable[[Writer], int], fs: OsFs) -> int:
    """A first creation in an empty directory that cannot be swapped away (a
    mount point, or a parent this process may not write): the store is
    written in place, as before the one swap, and a failure deletes what it
    wrote (the directory held nothing else, or only a killed creation's
    leftovers), as loaderx did before the one swap."""
    try:
        with Writer(target, schema, new=True) as writer:
            return fill(writer)
    except BaseException:
        for name in fs.listdir(target):
            with contextlib.suppress(OSError):
                fs.rmtree(os.path.join(target, name))
        raise


def _append_in_place(target: str, schema: Schema, fill: Callable[[Writer], int]) -> int:
    with Writer(target, schema, new=False) as writer:
        return fill(writer)


def _locked(message: str) -> StoreLockedError:
    return StoreLockedError(f"cannot write the store: {message}")


def _store_state(path: str, fs: OsFs) -> str:
    """``"fresh"`` (absent, empty, or only a killed creation's leftovers:
    ours to replace) or ``"store"``; ValueError for anything else, which is
    never replaced or deleted."""
    if not fs.exists(path):
        return "fresh"
    if not fs.isdir(path):
        raise ValueError(
            f"'{path}' exists and is not a directory: give a new or empty directory for the store"
        )
    if is_store(path, fs):
        return "store"
    names = fs.listdir(path)
    if all(is_creation_leftover(name) for name in names):
        return "fresh"
    raise ValueError(
        f"'{path}' is a non-empty directory that is not a loaderx store: give a new or empty "
        "directory, or an existing store"
    )


def _existing_schema(path: str, fs: OsFs) -> Schema | None:
    """The schema of the store at ``path``, or None for an empty zrecord store
    without one; a clear error for anything else."""
    schema = read_schema(fs.real_path(path))
    if schema is not None:
        return schema
    with Zrecord(fs.real_path(path)) as store:
        count = len(store)
    if count:
        raise ValueError(
            f"'{path}' holds {count} records but no schema.msgpack (an interrupted conversion, or "
            "a bare Zrecord "
            "store): delete the directory and convert again, or read it with loaderx.Zrecord"
        )
    return None


def _mismatch(path: str, existing: Schema, new: Schema) -> str:
    hints = []
    if existing.kind != new.kind:
        hints.append(
            f"it is a {existing.kind} store (write it with "
            f"{'from_numpy' if existing.kind == 'dense' else 'from_iterator'})"
        )
    if existing.dtype != new.dtype:
        hints.append(
            f"its dtype is {existing.dtype.str}, the data's is {new.dtype.str} (pass "
            f"schema={{'dtype': '{existing.dtype.str}'}} to convert)"
        )
    if existing.item_shape != new.item_shape:
        hints.append(f"its item shape is {existing.item_shape}, the data's is {new.item_shape}")
    if existing.codec != new.codec:
        hints.append(
            f"it was written with codec={existing.codec!r}, this call uses {new.codec!r} (pass "
            f"codec={existing.codec!r})"
        )
    return (
        f"cannot append to '{path}': the schema does not match, nothing was written: "
        + "; ".join(hints)
    )


# ---- shared argument checks --------------------------------------------------


def codec_name(codec: str | int, allow_auto: bool = False) -> str:
    """The codec's name (codecs may also be given by id); ValueError if unknown.
    ``"auto"`` and ``"auto-speed"`` pass when the converter picks the codec itself."""
    if allow_auto and is_auto(codec):
        return str(codec)
    value = codec_id(codec)
    return next(name for name, number in CODECS.items() if number == value)


def check_chunk_bytes(value: Any) -> int:  # Any: checked here
    """``chunk_bytes`` of a converter: an int in 1..CHUNK_BYTES_MAX."""
    return check_int("chunk_bytes", value, 1, CHUNK_BYTES_MAX)


def check_progress(progress: Any) -> None:  # Any: checked here
    """``progress`` is True, False or a text stream (anything with ``write``):
    a string such as ``"yes"`` is refused, not taken as a truthy flag."""
    if not isinstance(progress, (bool, np.bool_)) and not callable(
        getattr(progress, "write", None)
    ):
        raise TypeError(
            "progress must be True, False or a text stream such as sys.stderr, got "
            f"{type(progress).__name__} {progress!r}"
        )


# ---- the codec "auto" picks --------------------------------------------------


def is_auto(codec: object) -> bool:
    """Whether ``codec`` asks the converter to pick (``AUTO_CODECS``)."""
    return isinstance(codec, str) and codec in AUTO_CODECS


def uses_dictionary(codec: str) -> bool:
    """Whether ``codec`` trains a dictionary (not yet known for an auto codec)."""
    return not is_auto(codec) and codec_parts(codec).uses_dictionary


def _shuffle_element_bytes(dtype: np.dtype) -> int | None:
    """The element size the shuffle filter would use for ``dtype``: its item
    size for numbers (half of it for complex, two floats) when that is 2, 4 or
    8; None for bytes, strings, structured dtypes and 1-byte numbers."""
    if dtype.fields is not None or dtype.subdtype is not None or dtype.kind not in "iufcmM":
        return None
    element_bytes = dtype.itemsize // 2 if dtype.kind == "c" else dtype.itemsize
    return element_bytes if element_bytes in SHUFFLE_ELEMENT_BYTES else None


def auto_codec(
    path: StrPath,
    mode: str,
    target: Schema,
    trial: Callable[[], tuple[np.ndarray, np.ndarray]],
    auto: str = "auto",
) -> str:
    """The codec ``codec=auto`` picks (``auto`` is ``"auto"`` or
    ``"auto-speed"``): an existing store's own when appending to it; else the
    coder (``zstd`` for ``"auto"``, ``lz4`` for ``"auto-speed"``) with the
    shuffle filter, ``<coder>_shuffleN``, when the dtype has N-byte elements
    and shuffled records of the ``trial`` sample (packed bytes and offsets)
    take at least ``SHUFFLE_GAIN_MIN`` less space than plain frames of the
    coder; else the plain coder."""
    if mode == "a" and os.path.isdir(os.fspath(path)):
        existing = read_schema(path)
        if existing is not None and existing.kind == target.kind:
            return existing.codec
    coder = "lz4" if auto == "auto-speed" else "zstd"
    element_bytes = _shuffle_element_bytes(target.dtype)
    if element_bytes is None:
        return coder
    packed, offsets = trial()
    if packed.size == 0:
        return coder
    candidate = shuffled_codec(coder, element_bytes)
    plain = encoded_bytes(packed, offsets, coder)
    shuffled = encoded_bytes(packed, offsets, candidate)
    return candidate if shuffled <= plain * (1 - SHUFFLE_GAIN_MIN) else coder


def packed_trial(pieces: list[npt.NDArray[np.uint8]]) -> tuple[np.ndarray, np.ndarray]:
    """A trial's records packed back to back and their starts (empty ones
    left out: they tell the codecs apart by nothing)."""
    pieces = [piece for piece in pieces if piece.size]
    if not pieces:
        return np.empty(0, dtype=np.uint8), np.zeros(1, dtype=np.uint64)
    sizes = np.fromiter((piece.size for piece in pieces), dtype=np.uint64, count=len(pieces))
    return np.concatenate(pieces), np.cumsum(sizes) - sizes


def shuffled_samples(
    samples: list[npt.NDArray[np.uint8]], record_bytes: int | None, codec: str
) -> list[npt.NDArray[np.uint8]]:
    """Dictionary samples as the shuffled codec compresses them: each record
    shuffled (``record_bytes``: the samples hold whole records of that length;
    None: each sample is one record)."""
    element_bytes = codec_parts(codec).element_bytes
    if element_bytes == 1:
        return samples
    shuffled = []
    for sample in samples:
        records = (
            [sample]
            if record_bytes is None
            else np.split(sample, max(1, sample.size // max(record_bytes, 1)))
        )
        shuffled.append(
            np.concatenate([shuffle_bytes(record, element_bytes) for record in records])
        )
    return shuffled


# ---- dictionary training -----------------------------------------------------


def dense_samples(
    rows: Callable[[int, int], npt.NDArray[Any]],
    row_count: int,
    row_bytes: int,
    dict_size: int,
) -> list[npt.NDArray[np.uint8]]:
    """Rows spread evenly over the array, about 100x ``dict_size`` bytes."""
    budget = min(100 * dict_size, SAMPLE_BUDGET_MAX)
    wanted = min(row_count, max(1, budget // max(row_bytes, 1)))
    blocks = min(64, wanted)
    per_block = max(1, wanted // blocks)
    starts = np.linspace(0, row_count - per_block, blocks).astype(np.int64)
    return [
        rows(int(start), int(start) + per_block).reshape(-1).view(np.uint8)
        for start in np.unique(starts)
    ]


def train_dictionary(store: Zrecord, samples: list[npt.NDArray[np.uint8]], dict_size: int) -> None:
    """Trains the store's dictionary from byte ``samples`` cut into pieces, so
    that few large records still give zstd enough samples."""
    total = sum(sample.size for sample in samples)
    budget = min(100 * dict_size, SAMPLE_BUDGET_MAX)
    piece_bytes = max(8, min(SAMPLE_PIECE_BYTES, min(total, budget) // SAMPLE_PIECES_MIN))
    pieces, used = [], 0
    for sample in samples:
        for start in range(0, sample.size, piece_bytes):
            piece = sample[start : start + piece_bytes]
            pieces.append(piece)
            used += piece.size
            if used >= budget:
                break
        if used >= budget:
            break
    if used < DICT_BYTES_MIN or len(pieces) < 8:
        raise ValueError(
            f"too little data to train a zstd dictionary ({used} bytes in {len(pieces)} samples): "
            "use codec='zstd' for data this small, or convert more rows"
        )
    target = max(DICT_BYTES_MIN, min(dict_size, used))
    sizes = np.fromiter((piece.size for piece in pieces), dtype=np.uint64, count=len(pieces))
    try:
        store.train_dict(np.concatenate(pieces), sizes, target)
    except ZrecordError as exc:
        raise ValueError(
            f"could not train a zstd dictionary from {used} bytes in {len(pieces)} samples "
            f"({exc}); use codec='zstd', or convert more varied rows"
        ) from exc


# ---- progress ----------------------------------------------------------------


class Progress:
    """A one-line progress bar: with ``progress=True`` on stderr, only when it
    is a terminal and once the work has taken more than a second; with a text
    stream (``progress=sys.stderr``), on that stream from the start."""

    delay_seconds = 1.0
    interval_seconds = 0.2

    def __init__(
        self,
        enabled: bool | TextIO,
        label: str,
        total_bytes: int | None = None,
        total_records: int | None = None,
    ) -> None:
        forced = hasattr(enabled, "write")
        self.stream: TextIO = (
            cast(TextIO, enabled) if forced else sys.stderr
        )  # forced: it has write()
        if forced:
            self.delay_seconds = 0.0
        try:
            self.enabled = forced or (
                bool(enabled) and self.stream is not None and self.stream.isatty()
            )
        except (AttributeError, ValueError):
            self.enabled = False
        self.label = label
        self.total_bytes = total_bytes
        self.total_records = total_records
        self.started = time.monotonic()
        self.last = 0.0
        self.shown = False

    def update(self, records: int, done_bytes: int, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and (
            now - self.started < self.delay_seconds or now - self.last < self.interval_seconds
        ):
            return
        self.last = now
        self.shown = True
        rate = done_bytes / max(now - self.started, 1e-9) / MiB
        if self.total_bytes:
            fraction = min(1.0, done_bytes / self.total_bytes)
            filled = int(fraction * 30)
            bar = "#" * filled + "." * (30 - filled)
            text = (
                f"{self.label} [{bar}] {fraction:4.0%} "
                f"{done_bytes / MiB:,.0f}/{self.total_bytes / MiB:,.0f} MiB {rate:,.0f} MiB/s"
            )
        else:
            of = f"/{self.total_records:,}" if self.total_records is not None else ""
            text = (
                f"{self.label}: {records:,}{of} records, "
                f"{done_bytes / MiB:,.0f} MiB, {rate:,.0f} MiB/s"
            )
        self.stream.write("\r" + text)
        self.stream.flush()

    def finish(self, records: int, done_bytes: int) -> None:
        if self.shown or (self.enabled and not self.delay_seconds):
            self.update(records, done_bytes, force=True)
            self.stream.write("\n")
            self.stream.flush()
