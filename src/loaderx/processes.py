"""Transforms in worker processes, for Python code that holds the GIL.

With ``transform_processes=True`` each worker thread of the DataLoader owns
one child process (started with "spawn", so the transform must be
picklable, e.g. a module-level function). The thread samples and gathers as
usual, then hands the batch over through two shared-memory blocks it owns:

- the *input* block: the thread copies the batch's arrays into it and sends
  the child a small message (each array's offset, dtype and shape); the
  child runs ``transform`` on views of the block;
- the *output* block: the child writes the result's arrays into it and
  answers with their layout; the thread copies them out into fresh arrays.

Array bytes never go through pickle or the pipe; only the layouts and any
non-array leaves of the result (numbers, strings) do. A block is a file in
/dev/shm (tmpfs; the system temporary directory where there is none)
unlinked the moment it is created: the child receives its descriptor over
the pipe (a Unix socket) once, and the memory goes when the last mapping
does, so no file is left behind even when a process is killed. A block too
small for a batch is replaced by a larger one (sent to the child the same
way).

Guarantees stay those of threads: the batch of step k is what the thread
computed for step k, so the order and resume are unchanged; an exception in
the child comes back (pickled, or as its repr if it cannot be) and is raised
as the step's failure; a child that dies is a failure of its step; close()
kills the children. Children ignore SIGINT: Ctrl-C reaches the training
process, which closes the loader.
"""

from __future__ import annotations

import itertools
import mmap
import multiprocessing
import os
import pickle
import signal
import tempfile
import threading
from collections.abc import Iterator
from multiprocessing import reduction
from multiprocessing.connection import Connection
from typing import Any, Callable

import numpy as np
import numpy.typing as npt

from .streams import RaggedBatch

__all__ = ["ProcessTransform", "TransformProcessError", "check_picklable"]

_ALIGN = 64
_SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


class TransformProcessError(RuntimeError):
    """The transform's child process failed or raised something that could not be pickled."""


# ---- layouts: a batch tree with arrays replaced by (offset, dtype, shape) ------------------


class _Array:
    __slots__ = ("offset", "dtype", "shape")

    def __init__(self, offset: int, dtype: str, shape: tuple[int, ...]) -> None:
        self.offset, self.dtype, self.shape = offset, dtype, shape

    def __getstate__(self) -> tuple[int, str, tuple[int, ...]]:
        return self.offset, self.dtype, self.shape

    def __setstate__(self, state: tuple[int, str, tuple[int, ...]]) -> None:
        self.offset, self.dtype, self.shape = state


class _Ragged:
    __slots__ = ("values", "offsets")

    def __init__(self, values: _Array, offsets: _Array) -> None:
        self.values, self.offsets = values, offsets

    def __getstate__(self) -> tuple[_Array, _Array]:
        return self.values, self.offsets

    def __setstate__(self, state: tuple[_Array, _Array]) -> None:
        self.values, self.offsets = state


def _arrays(tree: object) -> list[npt.NDArray[Any]]:
    """The arrays of a batch tree, in the order ``_layout`` places them."""
    if isinstance(tree, np.ndarray) and not tree.dtype.hasobject:
        return [tree]
    if isinstance(tree, RaggedBatch):
        return [tree.values, tree.offsets]
    if isinstance(tree, dict):
        return [array for value in tree.values() for array in _arrays(value)]
    if isinstance(tree, (list, tuple)):
        return [array for value in tree for array in _arrays(value)]
    return []


def _layout(tree: Any, offsets: Iterator[int]) -> Any:  # a batch tree in, its layout tree out
    """The tree with each array replaced by its ``_Array`` (offsets in ``_arrays`` order)."""
    if isinstance(tree, np.ndarray) and not tree.dtype.hasobject:
        return _Array(next(offsets), tree.dtype.str, tree.shape)
    if isinstance(tree, RaggedBatch):
        return _Ragged(_layout(tree.values, offsets), _layout(tree.offsets, offsets))
    if isinstance(tree, dict):
        return {key: _layout(value, offsets) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_layout(value, offsets) for value in tree)
    return tree


def _build(layout: Any, buffer: mmap.mmap, copy: bool) -> Any:  # a layout tree in, a batch tree out
    """The tree of a layout over ``buffer``: views, or copies when ``copy``."""
    if isinstance(layout, _Array):
        view = np.ndarray(layout.shape, np.dtype(layout.dtype), buffer, layout.offset)
        return view.copy() if copy else view
    if isinstance(layout, _Ragged):
        return RaggedBatch(
            _build(layout.values, buffer, copy), _build(layout.offsets, buffer, copy)
        )
    if isinstance(layout, dict):
        return {key: _build(value, buffer, copy) for key, value in layout.items()}
    if isinstance(layout, (list, tuple)):
        return type(layout)(_build(value, buffer, copy) for value in layout)
    return layout


def _place(arrays: list[npt.NDArray[Any]]) -> tuple[list[int], int]:
    """Aligned offsets for ``arrays`` back to back, and the bytes they need."""
    offsets: list[int] = []
    end = 0
    for array in arrays:
        offsets.append(end)
        end += -(-array.nbytes // _ALIGN) * _ALIGN
    return offsets, max(end, _ALIGN)


def _write(arrays: list[npt.NDArray[Any]], offsets: list[int], buffer: mmap.mmap) -> None:
    for array, offset in zip(arrays, offsets):
        np.ndarray(array.shape, array.dtype, buffer, offset)[...] = array


# ---- shared-memory blocks -------------------------------------------------------------


_block_numbers = itertools.count(1)


class _Block:
    """Shared memory mapped read-write: a file in /dev/shm removed as soon as it
    is created, so nothing is left behind even if a process is killed. The
    parent keeps its descriptor to pass to the child (over the pipe, which is
    a Unix socket); the child maps the descriptor it receives."""

    def __init__(self, size: int, handle: int | None = None, number: int = 0):
        owner = handle is None
        if owner:
            handle, path = tempfile.mkstemp(prefix="loaderx-", dir=_SHM_DIR)
            os.unlink(path)
            number = next(_block_numbers)
        assert handle is not None  # ours (mkstemp) or the one the parent sent
        try:
            if owner:
                os.ftruncate(handle, size)
            self.map = mmap.mmap(handle, size)
        except BaseException:
            os.close(handle)
            raise
        if not owner:
            os.close(handle)  # the mapping keeps the memory
        self.handle = handle if owner else None
        self.number, self.size = number, size

    def close(self) -> None:
        try:
            self.map.close()
        except BufferError:  # a view still exported: the memory goes when it does
            pass
        if self.handle is not None:
            os.close(self.handle)
            self.handle = None


def _grown(block: _Block | None, need: int) -> _Block:
    if block is not None and block.size >= need:
        return block
    if block is not None:
        block.close()
    return _Block(max(need, 1 << 16) * 5 // 4)


# ---- the child ------------------------------------------------------------------------------


def _child_main(connection: Connection, transform: Callable[[Any], Any]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    mapped: dict[str, _Block] = {}  # role -> the parent's current block

    def receive(role: str, number: int, size: int) -> None:
        """A block the parent announced as new comes with its descriptor next."""
        current = mapped.get(role)
        if current is None or current.number != number:
            handle = reduction.recv_handle(connection)
            if current is not None:
                current.close()  # the parent replaced it with a larger one
            mapped[role] = _Block(size, handle, number)

    while True:
        try:
            (input_number, input_size, layout), (output_number, output_size) = connection.recv()
            receive("input", input_number, input_size)
            receive("output", output_number, output_size)
        except (EOFError, OSError):
            return
        try:
            batch = _build(layout, mapped["input"].map, copy=False)
            result = transform(batch)
            del batch
            arrays = _arrays(result)
            offsets, need = _place(arrays)
            if need > mapped["output"].size:
                connection.send(("grow", need))
                receive("output", *connection.recv())
            _write(arrays, offsets, mapped["output"].map)
            reply = ("done", _layout(result, iter(offsets)))
            del result, arrays
        except BaseException as exc:  # every failure goes back to the parent's step
            reply = ("error", _picklable(exc))
        connection.send(reply)


def _picklable(exc: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return TransformProcessError(
            f"the transform raised {type(exc).__name__}: {exc} (not picklable, so re-raised as "
            "this)"
        )


# ---- the parent's side: one per worker thread ------------------------------------------------


def check_picklable(transform: object) -> None:
    """A clear TypeError, up front, for a transform a child process cannot receive."""
    try:
        pickle.dumps(transform)
    except Exception as exc:
        raise TypeError(
            f"transform_processes=True needs a picklable transform (a module-level function or "
            f"callable object), but {transform!r} is not: {exc}"
        ) from None


class ProcessTransform:
    """Runs ``transform`` in one child process, for one worker thread.

    ``close`` may run on another thread while a call waits for the child: it
    kills the child first (so the wait ends), then, under ``lock``, removes
    the blocks; a call touches the blocks only under ``lock`` and after
    checking ``closed``, so no block is created after close or used after
    removal."""

    def __init__(self, transform: Callable[[Any], Any]) -> None:
        check_picklable(transform)
        context = multiprocessing.get_context("spawn")
        self.connection, child = context.Pipe()
        self.process = context.Process(
            target=_child_main, args=(child, transform), name="loaderx-transform", daemon=True
        )
        self.process.start()
        child.close()
        self.lock = threading.Lock()
        self.closed = False
        self.input: _Block | None = None
        self.output: _Block | None = None
        self.sent: set[int] = set()  # numbers of the blocks the child has

    def __call__(self, batch: Any) -> Any:
        arrays = _arrays(batch)
        offsets, need = _place(arrays)
        with self.lock:
            self._check_open()
            self.input = _grown(self.input, need)
            self.output = _grown(self.output, _ALIGN)
            _write(arrays, offsets, self.input.map)
            message = (
                (self.input.number, self.input.size, _layout(batch, iter(offsets))),
                (self.output.number, self.output.size),
            )
            reply = self._exchange(message, self.input, self.output)
        if reply[0] == "grow":
            with self.lock:
                self._check_open()
                self.output = _grown(self.output, reply[1])
                reply = self._exchange((self.output.number, self.output.size), self.output)
        if reply[0] == "error":
            raise reply[1]
        with self.lock:
            self._check_open()
            return _build(reply[1], self.output.map, copy=True)

    def _exchange(self, message: object, *blocks: _Block) -> Any:
        """Sends ``message`` and the descriptors of the blocks the child has not
        seen (in the order it expects them), then waits for the reply."""
        try:
            self.connection.send(message)
            for block in blocks:
                if block.number not in self.sent:
                    assert block.handle is not None  # the parent owns the blocks it sends
                    reduction.send_handle(self.connection, block.handle, self.process.pid)
                    self.sent.add(block.number)
            return self.connection.recv()
        except (EOFError, OSError) as exc:
            raise TransformProcessError(
                f"the transform's process ended (exit code {self.process.exitcode}): it crashed or "
                "was killed"
            ) from exc

    def _check_open(self) -> None:
        if self.closed:
            raise TransformProcessError(
                "the DataLoader was closed while this batch was in its transform"
            )

    def close(self) -> None:
        """Kills the child (it may be inside a stuck transform) and removes the blocks."""
        if self.process.is_alive():
            self.process.kill()
        self.process.join(1.0)
        with self.lock:
            self.closed = True
            self.connection.close()
            for block in (self.input, self.output):
                if block is not None:
                    block.close()
            self.input = self.output = None
