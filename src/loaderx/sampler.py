"""Index streams for training loops: zsampler, the native sampler.

Every batch is a pure function of ``(seed, step)`` (see ``zig/sampler.zig``):
``seek(k)`` followed by ``next()`` gives exactly the k-th batch of a fresh
sampler, and with ``shard=(rank, world_size)`` every process computes its own
slice of one global stream without communication.

Modes:

- ``SEQUENTIAL``: a window sliding over ``0..length`` that wraps around the end
  (a batch can span the end and the start).
- ``IID``: uniform with replacement, unbiased for every length.
- ``CYCLIC``: without replacement. Each cycle is a fresh pseudo-random
  permutation of ``0..length`` read ``batch_size * world_size`` indices at a
  time; when that global batch does not divide ``length``, the last
  ``length % (batch_size * world_size)`` indices of each cycle's permutation
  are dropped (different ones every cycle), so every batch is whole. Needs
  ``length >= batch_size * world_size``.
- ``BLOCK``: without replacement, local to groups of records (a sharded
  dataset's shards), for whole-shard caching. ``groups=`` gives the groups'
  row counts in index order (group g holds the next ``groups[g]`` indices).
  Each cycle permutes the groups, cuts that order into blocks of
  ``shards_per_block`` consecutive groups and permutes the records of each
  block together; the cycle's stream is the blocks one after another, read
  and cut exactly as in CYCLIC (the dropped tail is the end of the cycle's
  last block). A batch reads from one block, or two where it crosses a
  block boundary, so a cache needs about ``2 * shards_per_block`` groups
  resident. Needs ``length >= batch_size * world_size``.
"""

from __future__ import annotations

import enum
import operator
import threading
from collections.abc import Sequence
from typing import Any, SupportsIndex

import numpy as np

from ._native import LIMITS, check, ffi, lib

__all__ = [
    "Sampler",
    "LENGTH_MAX",
    "BATCH_SIZE_MAX",
    "STEP_MAX",
    "GROUPS_MAX",
    "SHARDS_PER_BLOCK_DEFAULT",
    "equal_groups",
]

#: The largest index space: every index then fits an int64 as well as a uint64.
LENGTH_MAX = LIMITS["sampler_length_max"]
#: The largest batch: each batch is a fresh array of 8-byte indices, so 2**24
#: indices are 128 MiB before a single record is read, and the records
#: themselves at least as much again. Sixteen million rows per step is over
#: ten times the largest global batches in published training runs (about a
#: million sequences), while ``Sampler(10, 2**62)`` would ask for 32 EiB.
BATCH_SIZE_MAX = 1 << 24
#: Steps are uint64 across the ABI (``zig/sampler.zig``).
STEP_MAX = (1 << 64) - 1
#: BLOCK mode's most groups: the most shards of one sharded dataset. Each
#: batch lays out its cycle's groups in 16 bytes per group.
GROUPS_MAX = LIMITS["sampler_groups_max"]
#: BLOCK mode's groups per block when none is given: the cache then needs
#: 2 * 4 groups resident (the block being read and the next one's prefetch),
#: and a batch mixes records of 4 groups (measured against 1, 2 and 8 on
#: the remote-design page).
SHARDS_PER_BLOCK_DEFAULT = 4
_U64_LIMIT = 1 << 64
_UINT64 = np.dtype(np.uint64)
_empty = np.empty
_from_buffer = ffi.from_buffer
_native_batch = lib.lx_sampler_batch
_native_block_batch = lib.lx_sampler_block_batch
_native_block_positions = lib.lx_sampler_block_positions
_new_blocks = ffi.new

if lib.lx_sampler_config_bytes() != ffi.sizeof("lx_sampler_config"):
    raise ImportError(
        f"loaderx's native library lays out lx_sampler_config in {lib.lx_sampler_config_bytes()} "
        f"bytes but _abi.h in {ffi.sizeof('lx_sampler_config')}: the build is stale. "
        "Rebuild it with `pip install -e .`."
    )
if lib.lx_sampler_blocks_bytes() != ffi.sizeof("lx_sampler_blocks"):
    raise ImportError(
        f"loaderx's native library lays out lx_sampler_blocks in {lib.lx_sampler_blocks_bytes()} "
        f"bytes but _abi.h in {ffi.sizeof('lx_sampler_blocks')}: the build is stale. "
        "Rebuild it with `pip install -e .`."
    )


def _integer(name: str, value: Any) -> int:  # Any: checked here, at run time
    """``value`` as a Python int; bools and floats are refused."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, not bool")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, not {type(value).__name__}") from None


class Sampler:
    """An endless stream of ``batch_size`` uint64 indices into ``0..length``.

    ``Sampler(length, batch_size, mode, seed=42, shard=None)``; ``mode`` is a
    ``Sampler.Mode``, its int value or its name (``"iid"``, any case). With
    ``shard=(rank, world_size)``, ``batch_size`` is this process's share: the
    ranks' batches at step k, concatenated in rank order, are the unsharded
    batch of size ``batch_size * world_size`` at step k. A pickled sampler is
    its parameters and current step.

    BLOCK mode also takes ``groups=``, the row counts of the groups in index
    order (positive, adding up to ``length``; a sharded dataset's shards),
    and ``shards_per_block=`` (default ``SHARDS_PER_BLOCK_DEFAULT``); the
    other modes take neither.
    """

    class Mode(enum.IntEnum):
        """SEQUENTIAL (0): a sliding window; IID (1): uniform with replacement;
        CYCLIC (2): a fresh permutation every cycle, without replacement;
        BLOCK (3): as CYCLIC, but each run of the stream stays inside a block of
        ``shards_per_block`` groups."""

        SEQUENTIAL = 0
        IID = 1
        CYCLIC = 2
        BLOCK = 3

    __slots__ = (
        "_length",
        "_batch_size",
        "_mode",
        "_seed",
        "_rank",
        "_world_size",
        "_config",
        "_groups",
        "_starts",
        "_per_block",
        "_local",
        "_step",
        "__weakref__",
    )
    # The slots' types (declarations only: __slots__ holds the values).
    _length: int
    _batch_size: int
    _mode: Sampler.Mode
    _seed: int
    _rank: int
    _world_size: int
    _config: Any  # a cffi lx_sampler_config *
    _groups: tuple[int, ...] | None  # BLOCK: the groups' row counts
    _starts: np.ndarray | None  # BLOCK: group g's first index, and length last
    _per_block: int | None
    _local: threading.local  # BLOCK: each thread's native groups struct and scratch
    _step: int

    def __init__(
        self,
        length: SupportsIndex,
        batch_size: SupportsIndex,
        mode: Sampler.Mode | int | str,
        seed: SupportsIndex = 42,
        shard: Sequence[SupportsIndex] | None = None,
        *,
        groups: Sequence[SupportsIndex] | np.ndarray | None = None,
        shards_per_block: SupportsIndex | None = None,
    ) -> None:
        length = _integer("length", length)
        batch_size = _integer("batch_size", batch_size)
        seed = _integer("seed", seed)
        rank, world_size = self._parse_shard(shard)
        mode = self._parse_mode(mode)
        if not 1 <= length <= LENGTH_MAX:
            raise ValueError(
                f"length must be in 1..2**63, got {length}"
                + (": the index space is empty (is the dataset empty?)" if length == 0 else "")
            )
        if not 1 <= batch_size <= BATCH_SIZE_MAX:
            raise ValueError(
                "batch_size must be in 1..2**24 (BATCH_SIZE_MAX, 128 MiB of indices), got "
                f"{batch_size:,}"
            )
        if not 0 <= seed < _U64_LIMIT:
            raise ValueError(f"seed must be in 0..2**64 - 1, got {seed}")
        global_batch = batch_size * world_size
        if global_batch >= _U64_LIMIT:
            raise ValueError(
                f"batch_size * world_size = {global_batch} does not fit 64 bits: "
                "use a smaller batch or fewer ranks"
            )
        if mode in (Sampler.Mode.CYCLIC, Sampler.Mode.BLOCK) and length < global_batch:
            raise ValueError(
                f"{mode.name} sampling without replacement needs a whole global batch per cycle, "
                f"but length {length} < batch_size * world_size = {global_batch}: "
                "use a smaller batch or mode IID"
            )
        self._groups, self._starts, self._per_block = _check_blocks(
            mode, length, groups, shards_per_block
        )
        self._local = threading.local()
        self._length = length
        self._batch_size = batch_size
        self._mode = mode
        self._seed = seed
        self._rank = rank
        self._world_size = world_size
        # Built once: every batch passes this same struct to the library.
        self._config = ffi.new(
            "lx_sampler_config *",
            {
                "length": length,
                "batch_size": batch_size,
                "seed": seed,
                "rank": rank,
                "world_size": world_size,
                "mode": int(mode),
                "reserved": 0,
            },
        )
        self._step = 0

    @classmethod
    def _parse_mode(cls, mode: object) -> Sampler.Mode:
        if isinstance(mode, str):
            try:
                return cls.Mode[mode.upper()]
            except KeyError:
                raise ValueError(
                    "mode must be 'sequential', 'iid', 'cyclic' or 'block' (or Sampler.Mode, or "
                    f"0, 1, 2, 3), got {mode!r}"
                ) from None
        value = _integer("mode", mode)
        try:
            return cls.Mode(value)
        except ValueError:
            raise ValueError(
                f"mode must be Sampler.Mode.SEQUENTIAL (0), IID (1), CYCLIC (2) or BLOCK (3), "
                f"got {mode!r}"
            ) from None

    @staticmethod
    def _parse_shard(shard: Any) -> tuple[int, int]:  # Any: checked here, at run time
        if shard is None:
            return 0, 1
        if isinstance(shard, (str, bytes)) or not hasattr(shard, "__len__") or len(shard) != 2:
            raise TypeError(f"shard must be None or a (rank, world_size) pair, got {shard!r}")
        rank = _integer("shard rank", shard[0])
        world_size = _integer("shard world_size", shard[1])
        if world_size < 1:
            raise ValueError(f"shard world_size must be at least 1, got {world_size}")
        if not 0 <= rank < world_size:
            raise ValueError(
                f"shard rank must be in 0..{world_size - 1} for world_size {world_size}, got {rank}"
            )
        return rank, world_size

    # -- the stream ----------------------------------------------------------

    def next(self) -> np.ndarray:
        """The batch at the current step, as a new uint64 array; advances one step."""
        # The hot path of every training step: `_write` inlined, names bound
        # at import, one allocation (the result).
        out = _empty(self._batch_size, _UINT64)
        if self._starts is not None:
            self._write_block(self._step, out)
            self._step += 1
            return out
        target = _from_buffer("uint64_t[]", out, True)
        status = _native_batch(self._config, self._step, target, self._batch_size)
        if status:
            check(status, "Sampler")
        self._step += 1
        return out

    def fill(self, out: np.ndarray) -> np.ndarray:
        """Writes the batch at the current step into ``out`` and advances one step.

        ``out`` is a writable, C-contiguous uint64 array of shape
        ``(batch_size,)``; nothing is allocated. Returns ``out``.
        """
        self._write(self._step, self._check_out(out))
        self._step += 1
        return out

    def batch(self, step: int, out: np.ndarray | None = None) -> np.ndarray:
        """The batch at ``step`` (random access; the current step is unchanged)."""
        step = self._check_step(step)
        if out is None:
            out = np.empty(self._batch_size, _UINT64)
        else:
            self._check_out(out)
        self._write(step, out)
        return out

    def seek(self, step: int) -> None:
        """Makes ``step`` the current step: the next batch is the batch at ``step``."""
        self._step = self._check_step(step)

    @property
    def step(self) -> int:
        """The step whose batch ``next()`` returns."""
        return self._step

    def __iter__(self) -> Sampler:
        return self

    def __next__(self) -> np.ndarray:
        return self.next()

    def _write(self, step: int, out: np.ndarray) -> None:
        if self._starts is not None:
            self._write_block(step, out)
            return
        target = _from_buffer("uint64_t[]", out, True)
        status = _native_batch(self._config, step, target, self._batch_size)
        if status:
            check(status, "Sampler")

    def _write_block(self, step: int, out: np.ndarray) -> None:
        """BLOCK: the native batch with the groups and a scratch of this thread's
        own (built at its first batch), so concurrent calls (the loader's
        workers) share nothing they write."""
        target = _from_buffer("uint64_t[]", out, True)
        status = _native_block_batch(self._config, self._blocks(), step, target, self._batch_size)
        if status:
            check(status, "Sampler")

    def cycle_positions(self, cycle: int, offset: int, out: np.ndarray) -> np.ndarray:
        """BLOCK: writes the indices at positions ``offset..offset + out.size`` of
        cycle ``cycle``'s stream into ``out`` (a writable, C-contiguous 1-D uint64
        array) and returns it: any run of one cycle, as an elastic resume reads."""
        if self._starts is None:
            raise ValueError(f"cycle_positions is for mode BLOCK, not {self._mode.name}")
        cycle = self._check_step(cycle)
        offset = _integer("offset", offset)
        if not isinstance(out, np.ndarray) or out.dtype != _UINT64 or out.ndim != 1:
            raise TypeError("out must be a 1-D numpy uint64 array")
        if not (out.flags.c_contiguous and out.flags.writeable):
            raise ValueError("out must be a writable, C-contiguous array")
        if not 0 <= offset <= self._length - out.size:
            raise ValueError(
                f"positions {offset}..{offset + out.size} are not inside one cycle of "
                f"{self._length}: read a cycle's positions 0..{self._length}"
            )
        target = _from_buffer("uint64_t[]", out, True)
        status = _native_block_positions(
            self._config, self._blocks(), cycle, offset, target, out.size
        )
        if status:
            check(status, "Sampler")
        return out

    def _blocks(self) -> Any:  # a cffi lx_sampler_blocks *
        """This thread's native groups struct, with its own scratch."""
        blocks = getattr(self._local, "blocks", None)
        if blocks is None:
            starts = self._starts
            assert starts is not None and self._per_block is not None
            scratch = _empty(2 * starts.size - 1, _UINT64)
            # The cffi buffers keep starts and scratch alive with the struct.
            buffers = (
                _from_buffer("uint64_t[]", starts),
                _from_buffer("uint64_t[]", scratch, True),
            )
            blocks = _new_blocks(
                "lx_sampler_blocks *",
                {
                    "starts": buffers[0],
                    "group_count": starts.size - 1,
                    "per_block": self._per_block,
                    "scratch": buffers[1],
                    "scratch_count": scratch.size,
                },
            )
            self._local.blocks = blocks
            self._local.buffers = buffers
        return blocks

    def with_batch_size(self, batch_size: int) -> Sampler:
        """An unsharded sampler of the same stream (length, mode, seed and BLOCK
        groups) with another batch size, at step 0. CYCLIC and BLOCK cycles do not
        depend on the batch size, so it reads the same cycles in other cuts."""
        return Sampler(
            self._length,
            batch_size,
            self._mode,
            seed=self._seed,
            **self.block_options,
        )

    def _check_out(self, out: object) -> np.ndarray:
        if not isinstance(out, np.ndarray):
            raise TypeError(f"out must be a numpy uint64 array, not {type(out).__name__}")
        if out.dtype != _UINT64:
            raise TypeError(f"out must have dtype uint64, not {out.dtype}")
        if out.shape != (self._batch_size,):
            raise ValueError(f"out must have shape ({self._batch_size},), not {out.shape}")
        if not (out.flags.c_contiguous and out.flags.writeable):
            raise ValueError("out must be a writable, C-contiguous array")
        return out

    @staticmethod
    def _check_step(step: object) -> int:
        step = _integer("step", step)
        if not 0 <= step <= STEP_MAX:
            raise ValueError(f"step must be in 0..2**64 - 1 (STEP_MAX), got {step}")
        return step

    # -- pickling: the parameters and the step, rebuilt natively on load ------

    def __reduce__(self) -> tuple[Any, tuple[Any, ...], int]:
        shard = None if self._world_size == 1 else (self._rank, self._world_size)
        arguments = (self._length, self._batch_size, int(self._mode), self._seed, shard)
        if self._groups is None:
            return type(self), arguments, self._step
        return _block_sampler, (*arguments, self._groups, self._per_block), self._step

    def __setstate__(self, step: int) -> None:
        self._step = step

    # -- what the sampler is -------------------------------------------------

    @property
    def length(self) -> int:
        """The size of the index space: indices run over ``0..length-1``."""
        return self._length

    @property
    def batch_size(self) -> int:
        """This process's share of each global batch."""
        return self._batch_size

    @property
    def mode(self) -> Sampler.Mode:
        """The sampling mode, a ``Sampler.Mode``."""
        return self._mode

    @property
    def seed(self) -> int:
        """The seed every batch is a pure function of, with the step."""
        return self._seed

    @property
    def shard(self) -> tuple[int, int]:
        """``(rank, world_size)``; ``(0, 1)`` when unsharded."""
        return self._rank, self._world_size

    @property
    def groups(self) -> tuple[int, ...] | None:
        """BLOCK: the groups' row counts, in index order; None in other modes."""
        return self._groups

    @property
    def shards_per_block(self) -> int | None:
        """BLOCK: groups per block; None in other modes."""
        return self._per_block

    @property
    def block_options(self) -> dict[str, Any]:
        """The keywords that rebuild this sampler's BLOCK groups
        (``groups``, ``shards_per_block``); ``{}`` in other modes."""
        if self._groups is None:
            return {}
        return {"groups": self._groups, "shards_per_block": self._per_block}

    def __repr__(self) -> str:
        shard = "" if self._world_size == 1 else f", shard=({self._rank}, {self._world_size})"
        blocks = (
            ""
            if self._groups is None
            else f", groups=<{len(self._groups)} groups>, shards_per_block={self._per_block}"
        )
        return (
            f"Sampler(length={self._length}, batch_size={self._batch_size}, "
            f"mode=Sampler.Mode.{self._mode.name}, seed={self._seed}{shard}{blocks}) "
            f"at step {self._step}"
        )


def _block_sampler(
    length: int,
    batch_size: int,
    mode: int,
    seed: int,
    shard: tuple[int, int] | None,
    groups: tuple[int, ...],
    shards_per_block: int,
) -> Sampler:
    """Unpickles a BLOCK sampler (its keywords do not fit ``__reduce__``'s arguments)."""
    return Sampler(
        length, batch_size, mode, seed, shard, groups=groups, shards_per_block=shards_per_block
    )


def equal_groups(length: int, count: int = 64) -> list[int]:
    """``min(count, length)`` contiguous groups of ``0..length`` whose sizes differ
    by one at most (the larger ones first): BLOCK groups for a store that has no
    shards of its own."""
    length = _integer("length", length)
    count = _integer("count", count)
    if length < 1 or count < 1:
        raise ValueError(f"equal_groups needs length >= 1 and count >= 1, got {length}, {count}")
    count = min(count, length)
    size, larger = divmod(length, count)
    return [size + 1] * larger + [size] * (count - larger)


def _check_blocks(
    mode: Sampler.Mode, length: int, groups: Any, shards_per_block: Any
) -> tuple[tuple[int, ...] | None, np.ndarray | None, int | None]:  # Any: checked here
    """BLOCK's groups and groups per block, checked; (None, None, None) otherwise."""
    if mode is not Sampler.Mode.BLOCK:
        if groups is not None or shards_per_block is not None:
            raise ValueError(
                f"groups= and shards_per_block= are parameters of mode BLOCK, not {mode.name}: "
                "drop them or use mode='block'"
            )
        return None, None, None
    if groups is None:
        raise ValueError(
            "mode BLOCK needs groups=: the row counts of the dataset's groups in index order "
            "(a sharded dataset's shards; loaderx.sampler.equal_groups(length) for a single "
            "store), adding up to length"
        )
    per_block = SHARDS_PER_BLOCK_DEFAULT if shards_per_block is None else shards_per_block
    per_block = _integer("shards_per_block", per_block)
    if not 1 <= per_block < _U64_LIMIT:
        raise ValueError(f"shards_per_block must be in 1..2**64 - 1, got {per_block}")
    if isinstance(groups, (str, bytes)) or not hasattr(groups, "__len__"):
        raise TypeError(f"groups must be a sequence of row counts, got {type(groups).__name__}")
    counts = tuple(_integer(f"groups[{g}]", count) for g, count in enumerate(groups))
    if not 1 <= len(counts) <= GROUPS_MAX:
        raise ValueError(
            f"groups must hold 1..{GROUPS_MAX:,} (GROUPS_MAX) row counts, got {len(counts):,}"
        )
    for group, count in enumerate(counts):
        if count < 1:
            raise ValueError(
                f"groups[{group}] is {count}: every group needs at least one row "
                "(leave empty shards out)"
            )
    if sum(counts) != length:
        raise ValueError(
            f"groups add up to {sum(counts):,} rows but length is {length:,}: "
            "pass the row counts of every group of the index space, in order"
        )
    starts = np.zeros(len(counts) + 1, _UINT64)
    np.cumsum(np.asarray(counts, dtype=_UINT64), out=starts[1:])
    starts.flags.writeable = False
    return counts, starts, per_block
