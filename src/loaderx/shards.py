"""Sharded datasets: a directory of independently written shard stores plus
a manifest that makes them one dataset.

Layout::

    dataset/
      manifest.msgpack     written last, atomically: the dataset exists once it does
      shard-00000/         a complete loaderx store (zrecord + schema.msgpack)
      shard-00001/
      ...

Any engine writes shards in parallel with ``write_shard(dataset, k, data)``
(each shard is written to a temporary directory and renamed into place, so a
shard directory is always complete), then one process calls ``commit``, which
checks every shard's schema and row count and writes the manifest. An
interrupted conversion has no manifest, so it is never mistaken for a
dataset; running it again skips the shards ``written_shards`` reports.

Reading a sharded dataset (the manifest's checks, ``ShardedStore``) is
``loaderx.sharded``'s, below the datasets; this module writes, above the
converters, whose write session each shard uses. Invariant: a shard
directory is complete or absent, and the manifest is written last.

``DenseDataset`` and ``RaggedDataset`` open a sharded dataset like a single
store; a batch that spans shards is one native call (zig/shards.zig).
"""

from __future__ import annotations

import os
from typing import Any, TextIO

import numpy as np

from ._checks import check_flag
from ._fs import (
    ASIDE_PREFIX,
    LOCK_PREFIX,
    OS_FS,
    STAGING_PREFIX,
    DirectorySwap,
    OsFs,
    clean_leftovers,
    make_dirs_durable,
    sibling,
    write_file_atomic,
)
from ._remote import is_remote
from ._upload import commit as commit_remote
from ._upload import write_shard as write_remote_shard
from ._upload import written_shards as written_remote_shards
from .converter import CHUNK_BYTES, from_iterator, from_numpy
from .schema import SCHEMA_FILE, Schema, StrPath, read_schema
from .sharded import (  # loaderx.shards offers the reading names too
    MANIFEST_FILE as MANIFEST_FILE,
)
from .sharded import (
    MANIFEST_FORMAT as MANIFEST_FORMAT,
)
from .sharded import (
    MANIFEST_VERSION as MANIFEST_VERSION,
)
from .sharded import (
    SHARD_COUNT_MAX as SHARD_COUNT_MAX,
)
from .sharded import (
    SHARD_PATTERN as SHARD_PATTERN,
)
from .sharded import (
    Manifest as Manifest,
)
from .sharded import (
    ManifestError as ManifestError,
)
from .sharded import (
    ShardedStore as ShardedStore,
)
from .sharded import (
    is_sharded as is_sharded,
)
from .sharded import numbers_to_commit
from .sharded import (
    pack_manifest as pack_manifest,
)
from .sharded import (
    read_manifest as read_manifest,
)
from .sharded import (
    shard_name as shard_name,
)
from .zrecord import StoreLockedError, Zrecord, is_store

__all__ = [
    "MANIFEST_FILE",
    "ManifestError",
    "ShardedStore",
    "commit",
    "is_sharded",
    "read_manifest",
    "shard_name",
    "write_shard",
    "written_shards",
]

_LEGACY_TEMPORARY_PREFIX = ".tmp-shard-"  # the temporaries of loaderx before the one swap


# ---- writing ------------------------------------------------------------------


def write_shard(
    dataset_dir: StrPath,
    k: int,
    data: Any,
    codec: str | int = "zstd",
    schema: Schema | dict[str, Any] | None = None,
    overwrite: bool = False,
    chunk_bytes: int | None = None,
    dict_size: int | None = None,
    progress: bool | TextIO = False,
    *,
    storage_options: dict[str, Any] | None = None,
    staging_dir: StrPath | None = None,
    _fs: OsFs = OS_FS,
) -> int:
    """Writes shard ``k`` of the sharded dataset at ``dataset_dir``; returns its rows.

    ``data`` is a NumPy array (or array-like with ``shape``, ``dtype`` and
    slicing: one dense record per row, as ``from_numpy``) or any other
    iterable of arrays or ``bytes`` (one ragged record each, as
    ``from_iterator``; an object array of arrays counts as one). ``codec``,
    ``schema``, ``chunk_bytes`` and ``dict_size`` are those converters'.
    The shard is written whole into ``.new-shard-k`` and swapped into place
    (the one directory swap of ``_fs``), so ``shard-k`` is complete or
    absent. An existing shard raises ``FileExistsError`` unless
    ``overwrite=True`` (a retried task); a shard listed in the manifest is
    never overwritten. Safe to call from many processes at once for
    different ``k``; a second writer of the same ``k``, and any writer while
    ``commit`` runs, gets ``StoreLockedError``.

    ``dataset_dir`` may be a URL (``s3://...``; "Writing to object
    storage"): the shard is written into ``staging_dir`` (by default under
    the cache directory) as above, uploaded file by file and checked, then
    its staged copy is deleted. Files the target already holds with the same
    size and SHA-256 are not uploaded again. Writers of one remote shard are
    not locked against each other: give each ``k`` to one task.
    """
    dataset_dir = os.fspath(dataset_dir)
    name = shard_name(k)
    # overwrite="no" is truthy: it replaced the shard.
    overwrite = check_flag("overwrite", overwrite)
    options: dict[str, Any] = {
        "codec": codec,
        "chunk_bytes": CHUNK_BYTES if chunk_bytes is None else chunk_bytes,
        "dict_size": dict_size,
        "schema": schema,
        "progress": progress,
    }
    if is_remote(dataset_dir):

        def stage(local: str) -> int:
            return _swap_shard(local, k, name, False, data, options, OS_FS)

        return write_remote_shard(dataset_dir, k, stage, overwrite, storage_options, staging_dir)
    return _swap_shard(dataset_dir, k, name, overwrite, data, options, _fs)


def _swap_shard(
    dataset_dir: str,
    k: int,
    name: str,
    overwrite: bool,
    data: Any,
    options: dict[str, Any],
    _fs: OsFs,
) -> int:
    """``write_shard`` into a local dataset directory: built whole beside
    ``shard-k`` and swapped in, under the dataset's shared commit lock."""
    _prepare_directory(dataset_dir, _fs)
    final = os.path.join(dataset_dir, name)
    rows = 0

    def build(staging: str) -> None:
        nonlocal rows
        if _is_dense_source(data):
            rows = from_numpy(staging, data, **options, _staged=True)
        else:
            rows = from_iterator(staging, iter(data), **options, _staged=True)

    # Shared: many writers at once, but none while commit (exclusive) runs.
    commit_lock = _lock(
        _fs,
        sibling(os.path.join(dataset_dir, MANIFEST_FILE), LOCK_PREFIX),
        "write a shard of",
        dataset_dir,
        shared=True,
    )
    try:
        with DirectorySwap(
            final, _fs, lambda message: StoreLockedError(f"cannot write shard {k}: {message}")
        ) as swap:
            _check_writable(dataset_dir, k, name, final, overwrite, _fs)
            swap.build(build)
            swap.commit()
    finally:
        _fs.unlock(commit_lock)
    return rows


def _check_writable(
    dataset_dir: str, k: int, name: str, final: str, overwrite: bool, fs: OsFs
) -> None:
    """Refuses to write shard ``k`` over a committed one, or over a written
    one without ``overwrite`` (under the swap's lock, so no writer races it)."""
    if is_sharded(dataset_dir, _fs=fs) and name in read_manifest(dataset_dir, _fs=fs).names:
        raise FileExistsError(
            f"shard {k} of '{dataset_dir}' is committed in its manifest and cannot change: "
            "write new shards with higher numbers"
        )
    if fs.exists(final) and not overwrite:
        raise FileExistsError(
            f"shard {k} of '{dataset_dir}' already exists: skip it (see written_shards) or "
            "pass overwrite=True"
        )


def written_shards(
    dataset_dir: StrPath,
    *,
    storage_options: dict[str, Any] | None = None,
    _fs: OsFs = OS_FS,
) -> list[int]:
    """The shard numbers whose directories are complete (committed or not),
    sorted: what a resumed conversion can skip. For a URL: the shards whose
    upload finished (every object present, of the recorded size)."""
    dataset_dir = os.fspath(dataset_dir)
    if is_remote(dataset_dir):
        return written_remote_shards(dataset_dir, storage_options)
    if not _fs.isdir(dataset_dir):
        return []
    found = []
    for entry in _fs.listdir(dataset_dir):
        match = SHARD_PATTERN.fullmatch(entry)
        if match and _fs.isfile(os.path.join(dataset_dir, entry, SCHEMA_FILE)):
            found.append(int(match.group(1)))
    return sorted(found)


def commit(
    dataset_dir: StrPath,
    shard_count: int | None = None,
    *,
    storage_options: dict[str, Any] | None = None,
    _fs: OsFs = OS_FS,
) -> int:
    """Makes shards ``0..shard_count-1`` of ``dataset_dir`` one dataset by
    writing its manifest last and atomically; returns the total rows.

    Without ``shard_count`` every shard present is committed, and they must
    be numbered ``0..n-1`` without gaps. Every shard must have the first
    shard's schema (kind, dtype, item shape, codec). Committing again after
    writing more shards extends the dataset; committed shards keep their
    place. A damaged manifest is rewritten from the shards. Commit refuses
    with ``StoreLockedError`` while any ``write_shard`` on the dataset runs
    (so it never deletes a running writer's staging directory, nor commits a
    shard being replaced); it deletes the leftovers of killed writers. The
    manifest, and the dataset directory's entry in its parent, are durable
    when it returns.

    For a URL, the manifest is uploaded last, after checking that every
    shard's upload finished (each object present, of its recorded size);
    it records every file's size and SHA-256 (``Manifest.files``).
    """
    dataset_dir = os.fspath(dataset_dir)
    if is_remote(dataset_dir):
        return commit_remote(dataset_dir, shard_count, storage_options)
    if not _fs.isdir(dataset_dir):
        raise FileNotFoundError(
            f"no sharded dataset at '{dataset_dir}': write shards with loaderx.shards.write_shard "
            "first"
        )
    handle = _lock(
        _fs,
        sibling(os.path.join(dataset_dir, MANIFEST_FILE), LOCK_PREFIX),
        "commit",
        dataset_dir,
        shared=False,
    )
    try:
        _remove_leftovers(dataset_dir, _fs)
        numbers = _numbers_to_commit(dataset_dir, written_shards(dataset_dir, _fs=_fs), shard_count)
        names = [shard_name(number) for number in numbers]
        schema, rows = _inspect_shards(dataset_dir, names, _fs)
        if is_sharded(dataset_dir, _fs=_fs):
            try:
                old = read_manifest(dataset_dir, _fs=_fs)
            except ManifestError:
                old = None  # damaged: rewriting it from the shards is the remedy
            if old is not None:
                _check_extends(dataset_dir, old, names, rows)
        write_file_atomic(
            os.path.join(dataset_dir, MANIFEST_FILE), pack_manifest(schema, names, rows), _fs
        )
        _fs.fsync_dir(
            os.path.dirname(os.path.abspath(dataset_dir))
        )  # the dataset's own entry, however it was made
    finally:
        _fs.unlock(handle)
    return sum(rows)


def _lock(
    fs: OsFs, path: str, what: str, dataset_dir: str, shared: bool
) -> Any:  # Any: the seam's lock handle
    try:
        return fs.lock(path, shared=shared)
    except BlockingIOError:
        other = "commit is running on it" if shared else "write_shard is running on it"
        raise StoreLockedError(
            f"cannot {what} '{dataset_dir}' now: {other}; retry when it is done"
        ) from None


def _prepare_directory(dataset_dir: str, fs: OsFs) -> None:
    if fs.exists(os.path.join(dataset_dir, SCHEMA_FILE)) or is_store(dataset_dir, fs):
        raise ValueError(
            f"'{dataset_dir}' is a single loaderx store, not a sharded dataset: give a new or "
            "empty directory for the shards"
        )
    if fs.exists(dataset_dir) and not fs.isdir(dataset_dir):
        raise ValueError(
            f"'{dataset_dir}' exists and is not a directory: give a directory for the sharded "
            "dataset"
        )
    make_dirs_durable(
        dataset_dir, fs
    )  # a new directory's entry is durable only after an fsync of its parent


def _is_dense_source(data: object) -> bool:
    if isinstance(data, np.ndarray):
        return not data.dtype.hasobject
    return hasattr(data, "shape") and hasattr(data, "dtype") and hasattr(data, "__getitem__")


def _numbers_to_commit(dataset_dir: str, present: list[int], shard_count: int | None) -> list[int]:
    numbers = numbers_to_commit(
        f"'{dataset_dir}'", present, shard_count, "complete", "missing or unfinished"
    )
    shard_count = len(numbers)
    extra = [number for number in present if number >= shard_count]
    if extra:
        raise ValueError(
            f"cannot commit '{dataset_dir}': shard {extra[0]} exists beyond "
            f"shard_count={shard_count}: delete it or commit with a larger shard_count"
        )
    return list(range(shard_count))


def _inspect_shards(dataset_dir: str, names: list[str], fs: OsFs) -> tuple[Schema, list[int]]:
    """The common schema of the shards and their row counts; ValueError
    naming the first shard that disagrees with shard 0."""
    schema = None
    rows = []
    for name in names:
        path = fs.real_path(os.path.join(dataset_dir, name))
        shard_schema = read_schema(path)
        assert shard_schema is not None  # written_shards lists only shards with a schema file
        if schema is None:
            schema = shard_schema
        elif shard_schema != schema:
            raise ValueError(
                f"cannot commit '{dataset_dir}': {name} holds {shard_schema.describe()}, but "
                f"{names[0]} holds {schema.describe()}: rewrite {name} with the same schema"
            )
        with Zrecord(path, codec=shard_schema.codec) as store:
            rows.append(len(store))
    assert schema is not None  # names is never empty
    return schema, rows


def _check_extends(dataset_dir: str, old: Manifest, names: list[str], rows: list[int]) -> None:
    old_rows = list(old.rows)
    if names[: len(old.names)] != list(old.names) or rows[: len(old_rows)] != old_rows:
        raise ValueError(
            f"cannot commit '{dataset_dir}': its committed shards changed since the last commit "
            "(a committed shard is never rewritten): restore them or convert into a new directory"
        )


def _remove_leftovers(dataset_dir: str, fs: OsFs) -> None:
    """Applies the swap's leftover rule to every shard a killed writer left
    a staging or old directory of (commit holds the dataset's lock
    exclusively, so no writer runs), and deletes the temporaries of loaderx
    before the one swap (``.tmp-shard-*``)."""
    changed = False
    for entry in fs.listdir(dataset_dir):
        if entry.startswith(_LEGACY_TEMPORARY_PREFIX):
            fs.rmtree(os.path.join(dataset_dir, entry))
            changed = True
        for prefix in (STAGING_PREFIX, ASIDE_PREFIX):
            if entry.startswith(prefix) and SHARD_PATTERN.fullmatch(entry[len(prefix) :]):
                changed = (
                    clean_leftovers(os.path.join(dataset_dir, entry[len(prefix) :]), fs) or changed
                )
    if changed:
        fs.fsync_dir(dataset_dir)
