"""Writing datasets to object storage: stage locally, upload, verify, and
put the manifest last.

Every writer that takes a remote URL (``from_numpy``, ``from_iterator``,
``shards.write_shard`` and ``commit``, ``arrow.from_arrow``, the Ray
datasink) goes through this module, one unit at a time (a shard, or a
column store of ``from_arrow``):

1. the local writer builds the unit in a private directory under the
   staging root (``staging_dir=``, by default ``<cache dir>/staging``); a
   shard bound for an object store (``BUNDLE_SCHEMES``) is then turned into
   one file, ``sharded.BUNDLE_FILE``: its files but the lock, concatenated
   (``bundle_directory``), each member's size, SHA-256 and offset kept for
   the record, so a reader fetches the shard with one request;
2. each of its files is hashed once (SHA-256, plus the MD5s of its S3 etag),
   uploaded with ``ObjectSource.put`` (multipart above 8 MiB) unless the
   target already holds that exact file (the same size and SHA-256 in the
   unit's upload record, and an object of that size), and checked with
   ``head``: its size always, its bytes too when the store's etag is made
   of MD5s (S3; GCS single-part uploads); objects under the unit's prefix
   that are not its files are deleted;
3. the unit's upload record ``.uploaded/<name>`` (sealed: schema, rows,
   files) is put, which marks it complete, and the staged copy is deleted,
   so the staging directory holds about one unit at a time;
4. ``commit`` puts the manifest last, with every shard's files and digests
   (``Manifest.files``) and, for bundled shards, the bundle's size, digest
   and offsets (``Manifest.bundles``), after checking each listed object's
   size.

Invariant: a target becomes a dataset only when its manifest (or, for
``from_arrow``, its column listing) is put, and that happens only after
every object it names was uploaded and checked. A target that already holds
a dataset loses its manifest before anything of it changes, so no reader
ever opens a mix of two writes as one dataset.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from typing import Any, Callable

from ._envelope import EnvelopeError, seal, unseal
from ._remote import (
    MULTIPART_BYTES,
    PART_BYTES,
    ObjectInfo,
    ObjectSource,
    RemoteError,
    RemoteIntegrityError,
    RemoteNotFoundError,
    RetryingSource,
    open_source,
    parse_url,
)
from .schema import Schema, read_schema
from .sharded import (
    BUNDLE_FILE,
    MANIFEST_FILE,
    SHARD_PATTERN,
    Bundle,
    Manifest,
    numbers_to_commit,
    pack_manifest,
    parse_manifest,
    shard_name,
)
from .zrecord import LOCK_FILE

RECORDS_PREFIX = ".uploaded/"  # one upload record per complete unit
MARKER_KEY = ".loaderx-upload"  # put first: the prefix is a loaderx target
RECORD_FORMAT = "loaderx-upload"
RECORD_VERSION = 1
_RECORD_BYTES_MAX = 64 << 20
# from_numpy and from_iterator to a URL cut their input into shards of about
# this many bytes (before compression): staging holds one at a time, and a
# shard is the cache's unit when the dataset is read back.
SHARD_BYTES = 256 << 20
_HASH_BLOCK_BYTES = 1 << 20
# Stores where a shard is uploaded as one object (sharded.BUNDLE_FILE), so a
# reader fetches it with one request instead of one per file (5 or 6). A
# file:// target keeps one file per file: there a request costs nothing, and
# the dataset stays a local sharded dataset that opens by its path.
BUNDLE_SCHEMES = frozenset({"s3", "gs", "az", "http", "https"})
assert PART_BYTES % _HASH_BLOCK_BYTES == 0  # a hashed block never straddles two parts
# Stores whose etag of a single-part upload is the body's MD5; S3's etag of
# a multipart upload is the MD5 of its parts' MD5s and "-<parts>".
_MD5_ETAG_SCHEMES = frozenset({"s3", "gs"})
_MD5_ETAG = re.compile(r"[0-9a-f]{32}")
_MULTIPART_ETAG = re.compile(r"[0-9a-f]{32}-[0-9]+")
_RESUME = "nothing of it is committed: call again to resume (uploaded shards are kept)"

Files = dict[str, tuple[int, str]]  # file name -> (size, sha256 hex)


# ---- the target and the staging directory


def open_target(url: str, storage_options: dict[str, Any] | None) -> ObjectSource:
    """The source every remote write uses (a test replaces this function to
    put a ``FaultySource`` in between). A ``file://`` target's directory is
    created first (the local store opens only an existing one)."""
    remote = parse_url(url)
    if remote.scheme == "file":
        os.makedirs(remote.prefix, exist_ok=True)
    return RetryingSource(open_source(url, storage_options))


def staging_root(staging_dir: str | os.PathLike[str] | None) -> str:
    """Where writes stage their units: ``staging_dir``, else ``staging`` in
    the cache directory's default (``$LOADERX_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/loaderx``, else ``~/.cache/loaderx``), the disk the
    user set aside for loaderx's remote data."""
    if staging_dir is not None:
        return os.fspath(staging_dir)
    base = os.environ.get("LOADERX_CACHE_DIR")
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = os.path.join(xdg, "loaderx") if xdg else os.path.expanduser("~/.cache/loaderx")
    return os.path.join(base, "staging")


@contextlib.contextmanager
def staging(staging_dir: str | os.PathLike[str] | None) -> Iterator[str]:
    """A new private directory under the staging root, deleted at the end
    whatever happens. Without ``staging_dir``, a root that cannot be created
    (a read-only home) falls back to the system's temporary directory."""
    root = staging_root(staging_dir)
    try:
        os.makedirs(root, exist_ok=True)
    except OSError:
        if staging_dir is not None:
            raise
        root = tempfile.gettempdir()
    path = tempfile.mkdtemp(prefix="write-", dir=root)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def digest_file(path: str) -> tuple[int, str, str]:
    """(size, SHA-256 hex, S3 etag) of a staged file, in one read. The etag
    is the one S3 gives the upload ``put`` makes of it: the MD5 of the bytes,
    or above MULTIPART_BYTES (parts of PART_BYTES) the MD5 of the parts'
    MD5s followed by ``-<parts>``."""
    total = os.path.getsize(path)
    multipart = total > MULTIPART_BYTES
    sha, whole = hashlib.sha256(), hashlib.md5(usedforsecurity=False)
    part, parts, size, in_part = hashlib.md5(usedforsecurity=False), [], 0, 0
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(_HASH_BLOCK_BYTES), b""):
            sha.update(block)
            size += len(block)
            if not multipart:
                whole.update(block)
                continue
            part.update(block)
            in_part += len(block)
            if in_part == PART_BYTES:
                parts.append(part.digest())
                part, in_part = hashlib.md5(usedforsecurity=False), 0
    assert size == total, path  # a staged file does not change
    if not multipart:
        return size, sha.hexdigest(), whole.hexdigest()
    if in_part:
        parts.append(part.digest())
    joined = hashlib.md5(b"".join(parts), usedforsecurity=False).hexdigest()
    return size, sha.hexdigest(), f"{joined}-{len(parts)}"


# ---- uploads


def _where(source: ObjectSource, key: str) -> str:
    return source.url.rstrip("/") + "/" + key


def put_checked(source: ObjectSource, key: str, data: Any, size: int, etag: str | None) -> None:
    """Puts ``data`` (bytes or a file path) at ``key`` and checks the object:
    its size, and its content when the store's etag is an MD5 one (``etag``:
    what `digest_file` expects). A failure names the object."""
    try:
        source.put(key, data)
        info = source.head(key)
    except RemoteError as exc:
        raise type(exc)(f"{exc}; {_RESUME}", exc.url) from exc
    if info.size != size:
        raise RemoteIntegrityError(
            f"uploaded {_where(source, key)} holds {info.size} bytes, but {size} were sent; "
            f"{_RESUME}",
            _where(source, key),
        )
    found = _md5_etag(source, info)
    if etag is not None and found not in (None, etag):
        raise RemoteIntegrityError(
            f"uploaded {_where(source, key)} has MD5 etag {found}, but the bytes sent give "
            f"{etag}: corrupted in transit; {_RESUME}",
            _where(source, key),
        )


def _md5_etag(source: ObjectSource, info: ObjectInfo) -> str | None:
    """The object's etag when it is one of MD5s (single-part uploads to S3 or
    GCS, multipart uploads to S3), else None: then only the size is checked."""
    etag = (info.etag or "").strip('"').lower()
    scheme = source.url.split("://", 1)[0].lower()
    if scheme in _MD5_ETAG_SCHEMES and _MD5_ETAG.fullmatch(etag):
        return etag
    return etag if scheme == "s3" and _MULTIPART_ETAG.fullmatch(etag) else None


def read_record(source: ObjectSource, name: str) -> dict[str, Any] | None:
    """The upload record of unit ``name``, or None when absent or unreadable
    (then the unit is uploaded again)."""
    try:
        payload = source.get(RECORDS_PREFIX + name)
    except RemoteNotFoundError:
        return None
    if len(payload) > _RECORD_BYTES_MAX:
        return None
    try:
        _, content = unseal(payload, RECORD_FORMAT, RECORD_VERSION)
    except EnvelopeError:
        return None
    files = content.get("files")
    if not isinstance(files, dict) or not all(
        isinstance(value, list) and len(value) == 2 for value in files.values()
    ):
        return None
    members = content.get("members")
    if members is not None and (
        not isinstance(members, dict)
        or BUNDLE_FILE not in files
        or not all(isinstance(value, list) and len(value) == 3 for value in members.values())
    ):
        return None
    return content


def _record_files(record: dict[str, Any] | None) -> Files:
    if record is None:
        return {}
    return {entry: (int(value[0]), str(value[1])) for entry, value in record["files"].items()}


def _record_members(record: dict[str, Any]) -> dict[str, tuple[int, str, int]] | None:
    """The files of a bundled shard's record (file -> size, SHA-256,
    offset), or None for a shard uploaded one object per file."""
    members = record.get("members")
    if not isinstance(members, dict):
        return None
    return {entry: (int(v[0]), str(v[1]), int(v[2])) for entry, v in members.items()}


def _shard_files(record: dict[str, Any]) -> Files:
    """The shard's store files as the manifest lists them: the bundle's
    members, or the objects themselves."""
    members = _record_members(record)
    if members is None:
        return _record_files(record)
    return {entry: (size, sha) for entry, (size, sha, _) in members.items()}


def _record_bundle(record: dict[str, Any]) -> Bundle | None:
    """The manifest's Bundle of a bundled shard's record, else None."""
    members = _record_members(record)
    if members is None:
        return None
    size, sha = _record_files(record)[BUNDLE_FILE]
    return Bundle(BUNDLE_FILE, size, sha, {entry: at for entry, (_, _, at) in members.items()})


def complete(record: dict[str, Any] | None, name: str, listed: dict[str, ObjectInfo]) -> bool:
    """Whether every file of unit ``name``'s record is an object of its size."""
    files = _record_files(record)
    return bool(files) and all(
        listed.get(f"{name}/{entry}") is not None and listed[f"{name}/{entry}"].size == size
        for entry, (size, _) in files.items()
    )


def prepare_target(source: ObjectSource) -> Manifest | None:
    """The target's manifest (None when it has none), after refusing a prefix
    of objects loaderx did not write and marking the prefix as a loaderx
    target. Costs a ``head`` and a ``get`` once the prefix is marked (a
    listing only before), so each of many shard writers pays the same."""
    try:
        source.head(MARKER_KEY)
        marked = True
    except RemoteNotFoundError:
        marked = False
    manifest = remote_manifest(source)
    if not marked:
        if manifest is None:
            _check_empty(source)
        payload = seal(RECORD_FORMAT, RECORD_VERSION, {"target": True})
        put_checked(source, MARKER_KEY, payload, len(payload), None)
    return manifest


def _check_empty(source: ObjectSource) -> None:
    """Refuses a prefix that holds objects loaderx did not write there. A
    marker in the listing is another writer's (a parallel shard task) that
    marked the prefix since our ``head``: its marker goes up before any other
    object, so a listing that shows its objects shows the marker too."""
    listed = source.list()
    if listed and not any(info.key == MARKER_KEY for info in listed):
        raise FileExistsError(
            f"{source.url} holds objects that are not a loaderx dataset (e.g. {listed[0].key}): "
            "give a new or empty prefix"
        )


def shard_uploaded(url: str, k: int, storage_options: dict[str, Any] | None = None) -> bool:
    """Whether shard ``k``'s upload finished (one listing of its prefix and
    one read of its record: what a resumed task checks of its own shard)."""
    return _shard_complete(open_target(url, storage_options), k)


def _shard_complete(source: ObjectSource, k: int) -> bool:
    name = shard_name(k)
    listed = {info.key: info for info in source.list(name + "/")}
    return bool(listed) and complete(read_record(source, name), name, listed)


def upload_directory(
    source: ObjectSource, name: str, local: str, meta: dict[str, Any]
) -> tuple[Files, int]:
    """Uploads the files of the staged unit ``local`` under ``name/``, skipping
    those the target already holds (`_held`), deletes stale objects there,
    then puts the unit's record (``meta`` plus its files). Returns the files
    and the number of objects put."""
    staged: dict[str, tuple[int, str, str]] = {}
    for entry in sorted(os.listdir(local)):
        path = os.path.join(local, entry)
        assert os.path.isfile(path), path  # a store directory holds only files
        staged[entry] = digest_file(path)
    assert staged, local  # a store has at least its schema and superblock
    files = {entry: (size, sha) for entry, (size, sha, _) in staged.items()}
    record = read_record(source, name)
    listed = {info.key: info for info in source.list(name + "/")}
    kept = _record_files(record)
    missing = [
        entry
        for entry, digests in staged.items()
        if not _held(source, listed.get(f"{name}/{entry}"), digests, kept.get(entry))
    ]
    stale = [key for key in listed if key[len(name) + 1 :] not in files]
    new_record = {**meta, "files": {entry: [size, sha] for entry, (size, sha) in files.items()}}
    if record == new_record and not missing and not stale:
        return files, 0  # already uploaded, exactly
    if record is not None:
        source.delete(RECORDS_PREFIX + name)  # incomplete while it changes
    for entry in missing:
        size, _, etag = staged[entry]
        put_checked(source, f"{name}/{entry}", os.path.join(local, entry), size, etag)
    for key in stale:
        source.delete(key)
    payload = seal(RECORD_FORMAT, RECORD_VERSION, new_record)
    put_checked(source, RECORDS_PREFIX + name, payload, len(payload), None)
    return files, len(missing) + 1


def _held(
    source: ObjectSource,
    info: ObjectInfo | None,
    digests: tuple[int, str, str],
    recorded: tuple[int, str] | None,
) -> bool:
    """Whether the object ``info`` already holds a staged file of ``digests``
    (size, SHA-256, S3 etag): its size, and its etag where the store's etag
    is made of MD5s, else the record's SHA-256 of what was uploaded there."""
    size, sha, etag = digests
    if info is None or info.size != size:
        return False
    found = _md5_etag(source, info)
    return found == etag if found is not None else recorded == (size, sha)


# ---- sharded datasets


def remote_manifest(source: ObjectSource) -> Manifest | None:
    """The target's manifest, checked, or None when it has none."""
    try:
        payload = source.get(MANIFEST_FILE)
    except RemoteNotFoundError:
        return None
    return parse_manifest(payload, _where(source, MANIFEST_FILE))


def _listing(source: ObjectSource) -> dict[str, ObjectInfo]:
    return {info.key: info for info in source.list()}


def _shard_records(
    source: ObjectSource, listed: dict[str, ObjectInfo]
) -> dict[int, dict[str, Any]]:
    """The upload records of the shards that are complete, by number."""
    found = {}
    for key in listed:
        match = SHARD_PATTERN.fullmatch(key[len(RECORDS_PREFIX) :])
        if key.startswith(RECORDS_PREFIX) and match:
            record = read_record(source, match.group(0))
            if complete(record, match.group(0), listed):
                assert record is not None
                found[int(match.group(1))] = record
    return found


def written_shards(url: str, storage_options: dict[str, Any] | None = None) -> list[int]:
    """The shard numbers of the target whose uploads are complete, sorted."""
    source = open_target(url, storage_options)
    return sorted(_shard_records(source, _listing(source)))


def is_committed(url: str, storage_options: dict[str, Any] | None = None) -> bool:
    """Whether the target holds a manifest (a committed sharded dataset)."""
    source = open_target(url, storage_options)
    try:
        source.head(MANIFEST_FILE)
    except RemoteNotFoundError:
        return False
    return True


def shard_schema(url: str, k: int, storage_options: dict[str, Any] | None = None) -> Schema:
    """The schema shard ``k``'s upload record names (it must be complete)."""
    record = read_record(open_target(url, storage_options), shard_name(k))
    if record is None:
        raise FileNotFoundError(f"shard {k} of {url} is not uploaded: write it first")
    return Schema.from_dict(record["schema"], where=f"the upload record of shard {k} of {url}")


def write_shard(
    url: str,
    k: int,
    build: Callable[[str], int],
    overwrite: bool,
    storage_options: dict[str, Any] | None,
    staging_dir: str | os.PathLike[str] | None,
) -> int:
    """Shard ``k`` of the sharded dataset at ``url``: ``build(directory)``
    writes it locally as shard ``k`` of the new dataset ``directory``; it is
    uploaded and checked, and its staged copy deleted. Returns its rows."""
    source = open_target(url, storage_options)
    name = shard_name(k)
    manifest = prepare_target(source)
    if manifest is not None and name in manifest.names:
        raise FileExistsError(
            f"shard {k} of {url} is committed in its manifest and cannot change: write new "
            "shards with higher numbers"
        )
    if not overwrite and _shard_complete(source, k):
        raise FileExistsError(
            f"shard {k} of {url} is already uploaded: skip it (see written_shards) or pass "
            "overwrite=True"
        )
    return _stage_shard(source, k, build, staging_dir)[0]


def _stage_shard(
    source: ObjectSource,
    k: int,
    build: Callable[[str], int],
    staging_dir: str | os.PathLike[str] | None,
) -> tuple[int, Schema]:
    name = shard_name(k)
    with staging(staging_dir) as root:
        local_dataset = os.path.join(root, "dataset")
        rows = build(local_dataset)
        local = os.path.join(local_dataset, name)
        schema = read_schema(local)
        assert schema is not None  # the local writer finished the shard
        meta: dict[str, Any] = {"schema": schema.to_dict(), "rows": int(rows)}
        if parse_url(source.url).scheme in BUNDLE_SCHEMES:
            bundled = os.path.join(root, "bundle")
            meta["members"] = bundle_directory(local, os.path.join(bundled, BUNDLE_FILE))
            local = bundled
        upload_directory(source, name, local, meta)
    return rows, schema


def bundle_directory(local: str, bundle: str) -> dict[str, list[Any]]:
    """Concatenates the files of the staged store ``local`` (sorted by name;
    its ``lock``, which a reader does not need, left out) into the new file
    ``bundle``, deleting each once appended, so staging still holds about
    one shard. Returns ``{file: [size, sha256 hex, offset in the bundle]}``."""
    os.makedirs(os.path.dirname(bundle), exist_ok=True)
    members: dict[str, list[Any]] = {}
    offset = 0
    with open(bundle, "xb") as out:
        for entry in sorted(os.listdir(local)):
            path = os.path.join(local, entry)
            assert os.path.isfile(path), path  # a store directory holds only files
            if entry == LOCK_FILE:
                continue
            sha, size = hashlib.sha256(), 0
            with open(path, "rb") as handle:
                for block in iter(lambda: handle.read(_HASH_BLOCK_BYTES), b""):
                    sha.update(block)
                    out.write(block)
                    size += len(block)
            members[entry] = [size, sha.hexdigest(), offset]
            offset += size
            os.unlink(path)
    assert members, local  # a store has at least its schema and superblock
    return members


def commit(url: str, shard_count: int | None, storage_options: dict[str, Any] | None = None) -> int:
    """Makes the uploaded shards ``0..shard_count-1`` of ``url`` one dataset by
    putting its manifest, last; returns the total rows."""
    return commit_source(open_target(url, storage_options), shard_count)


def commit_source(source: ObjectSource, shard_count: int | None) -> int:
    listed = _listing(source)
    records = _shard_records(source, listed)
    numbers = numbers_to_commit(
        source.url,
        sorted(records),
        shard_count,
        "uploaded",
        "not uploaded (or their upload did not finish)",
    )
    names = [shard_name(number) for number in numbers]
    schemas = [
        Schema.from_dict(records[n]["schema"], where=f"the upload record of {shard_name(n)}")
        for n in numbers
    ]
    rows = [int(records[number]["rows"]) for number in numbers]
    for name, schema in zip(names, schemas):
        if schema != schemas[0]:
            raise ValueError(
                f"cannot commit {source.url}: {name} holds {schema.describe()}, but {names[0]} "
                f"holds {schemas[0].describe()}: rewrite {name} with the same schema"
            )
    old = remote_manifest(source) if MANIFEST_FILE in listed else None
    if old is not None and (
        names[: len(old.names)] != list(old.names) or rows[: len(old.rows)] != list(old.rows)
    ):
        raise ValueError(
            f"cannot commit {source.url}: its committed shards changed since the last commit "
            "(a committed shard is never rewritten): write into a new prefix"
        )
    files = {name: _shard_files(records[number]) for name, number in zip(names, numbers)}
    bundles = {
        name: bundle
        for name, number in zip(names, numbers)
        if (bundle := _record_bundle(records[number])) is not None
    }
    payload = pack_manifest(schemas[0], names, rows, files, bundles)
    md5 = hashlib.md5(payload, usedforsecurity=False).hexdigest()
    one_part = len(payload) <= MULTIPART_BYTES  # else: checked by its size
    put_checked(source, MANIFEST_FILE, payload, len(payload), md5 if one_part else None)
    return sum(rows)


def write_store(
    url: str,
    mode: str,
    parts: Iterable[Callable[[str, Schema | None], int]],
    storage_options: dict[str, Any] | None,
    staging_dir: str | os.PathLike[str] | None,
) -> int:
    """``from_numpy``/``from_iterator`` to ``url``: a sharded dataset whose
    manifest is what makes it valid (``mode="a"``: shards added after the
    dataset's). Each of ``parts``, called as ``part(path, schema)``, writes
    one shard as a new local store at ``path``; ``schema`` is the dataset's
    (appending) or the first shard's, so every shard gets one codec. The
    parts are taken one at a time, each staged, uploaded and deleted before
    the next. Returns the rows written."""
    source = open_target(url, storage_options)
    manifest = prepare_target(source)
    k, existing = 0, None
    if manifest is not None and mode == "x":
        raise FileExistsError(
            f"{url} holds a dataset: pass mode='w' to overwrite it or mode='a' to append to it"
        )
    if manifest is not None and mode == "a":
        k, existing = len(manifest.names), manifest.schema
    if manifest is not None and mode == "w":
        source.delete(MANIFEST_FILE)  # first: from here on the target is no dataset
    rows, first = 0, k
    for part in parts:

        def build(directory: str, part: Any = part, shard: int = k, known: Any = existing) -> int:
            return int(part(os.path.join(directory, shard_name(shard)), known))

        count, schema = _stage_shard(source, k, build, staging_dir)
        rows, k = rows + count, k + 1
        existing = existing if existing is not None else schema
    assert k > first  # the converters give at least one part
    commit_source(source, k)
    if mode != "a":
        delete_stale(source, k)
    return rows


def delete_stale(source: ObjectSource, shard_count: int) -> None:
    """Deletes the objects and records of shards numbered ``shard_count`` or
    more (left by an older dataset or attempt); nothing else."""
    for info in source.list():
        head = info.key[len(RECORDS_PREFIX) :] if info.key.startswith(RECORDS_PREFIX) else info.key
        match = SHARD_PATTERN.fullmatch(head.split("/", 1)[0])
        if match and int(match.group(1)) >= shard_count:
            source.delete(info.key)


# ---- column directories (from_arrow)


def write_columns(
    url: str,
    listing_file: str,
    build: Callable[[str], int],
    storage_options: dict[str, Any] | None,
    staging_dir: str | os.PathLike[str] | None,
) -> int:
    """``from_arrow`` to ``url``: ``build(directory)`` writes the column
    directory locally; each column store is uploaded as a unit, then
    ``listing_file`` last. Returns the rows written."""
    source = open_target(url, storage_options)
    if listing_file in {info.key for info in source.list()}:
        raise FileExistsError(
            f"{url} holds a column directory already: from_arrow writes a new one, give a new "
            "prefix"
        )
    prepare_target(source)
    with staging(staging_dir) as root:
        local = os.path.join(root, "columns")
        rows = build(local)
        for entry in sorted(os.listdir(local)):
            path = os.path.join(local, entry)
            if os.path.isdir(path):
                upload_directory(source, entry, path, {"rows": int(rows)})
        size, _, md5 = digest_file(os.path.join(local, listing_file))
        put_checked(source, listing_file, os.path.join(local, listing_file), size, md5)
    return rows
