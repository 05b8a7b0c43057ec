"""Writing datasets to object storage (loaderx._upload): staged, uploaded,
checked, manifest last; resumed after a fault; staging bounded.

The S3 tests run against moto's server on 127.0.0.1 (tests/s3_fixture.py);
the others against file:// targets in tmp_path. Faults come from
``FaultySource`` put in front of the real source.
"""

from __future__ import annotations

import hashlib
import os

import msgpack
import numpy as np
import pytest
from s3_fixture import MemorySource

import loaderx
from loaderx import _upload, shards
from loaderx._remote import (
    MULTIPART_BYTES,
    Fault,
    FaultySource,
    RemoteIntegrityError,
    RemoteNetworkError,
    open_source,
)
from loaderx.sharded import (
    BUNDLE_VERSION,
    Bundle,
    Manifest,
    ManifestError,
    pack_manifest,
    parse_manifest,
    read_manifest,
)

pytest.importorskip("obstore", reason="obstore is not installed: pip install 'loaderx[remote]'")


def download(url: str, local: str) -> list[str]:
    """Every object under ``url`` written below ``local``; returns the keys."""
    source = open_source(url)
    keys = [info.key for info in source.list()]
    for key in keys:
        path = os.path.join(local, key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as handle:
            handle.write(source.get(key))
    return keys


def tree_bytes(path: str) -> int:
    return sum(
        os.path.getsize(os.path.join(root, name))
        for root, _, names in os.walk(path)
        for name in names
    )


class Recorder:
    """Wraps every target the writers open: counts puts (by key) and measures
    the staging directory at every put, when its unit is staged whole."""

    def __init__(self, monkeypatch, staging: str, faults=None):
        self.staging = staging
        self.puts: list[str] = []
        self.peak = 0
        self.faults = faults
        real = _upload.open_target

        opened: dict[str, _Measured] = {}

        def open_target(url, storage_options):
            # One source per URL, so the faults count calls across writes.
            if url not in opened:
                source = real(url, storage_options)
                if self.faults is not None:
                    source = FaultySource(source, self.faults)
                opened[url] = _Measured(source, self)
            return opened[url]

        monkeypatch.setattr(_upload, "open_target", open_target)


class _Measured:
    def __init__(self, inner, recorder: Recorder):
        self.inner, self.recorder, self.url = inner, recorder, inner.url

    def put(self, key, data):
        self.recorder.peak = max(self.recorder.peak, tree_bytes(self.recorder.staging))
        self.recorder.puts.append(key)
        return self.inner.put(key, data)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def check_files(local_dataset: str) -> Manifest:
    """The manifest's files map equals the downloaded shards, byte for byte:
    each shard's files, or the members of its one bundle object, cut at the
    manifest's offsets (the bundle's own size and SHA-256 checked too)."""
    manifest = read_manifest(local_dataset)
    assert manifest.files is not None
    bundles = manifest.bundles or {}
    for name in manifest.names:
        on_disk = sorted(os.listdir(os.path.join(local_dataset, name)))
        if name in bundles:
            bundle = bundles[name]
            assert on_disk == [bundle.file] and sorted(bundle.offsets) == sorted(
                manifest.files[name]
            )
            with open(os.path.join(local_dataset, name, bundle.file), "rb") as handle:
                whole = handle.read()
            assert (len(whole), hashlib.sha256(whole).hexdigest()) == (bundle.size, bundle.sha256)
            parts = {
                entry: whole[at : at + manifest.files[name][entry][0]]
                for entry, at in bundle.offsets.items()
            }
        else:
            assert sorted(manifest.files[name]) == on_disk
            parts = {}
            for entry in on_disk:
                with open(os.path.join(local_dataset, name, entry), "rb") as handle:
                    parts[entry] = handle.read()
        for entry, (size, digest) in manifest.files[name].items():
            data = parts[entry]
            assert (len(data), hashlib.sha256(data).hexdigest()) == (size, digest)
    return manifest


def open_copy(path, cache) -> loaderx.DenseDataset:
    """A downloaded dataset, opened as a file:// URL: its shards may be
    bundles, which only the remote reader splits."""
    return loaderx.DenseDataset(f"file://{path}", cache_dir=cache)


# ---- round trips


def test_from_numpy_to_s3_round_trips_and_leaves_no_staging(s3, tmp_path):
    """from_numpy to s3:// gives a one-shard dataset whose downloaded copy
    opens locally with the same rows, and whose manifest's files map is right."""
    array = np.arange(6000, dtype=np.float32).reshape(-1, 6)
    staging = tmp_path / "staging"
    assert loaderx.from_numpy(s3.url("ds"), array, progress=False, staging_dir=staging) == 1000
    assert os.listdir(staging) == []  # the staged shard was deleted
    keys = download(s3.url("ds"), str(tmp_path / "copy"))
    assert {key.split("/")[0] for key in keys} == {
        ".loaderx-upload",
        ".uploaded",
        "manifest.msgpack",
        "shard-00000",
    }
    manifest = check_files(str(tmp_path / "copy"))
    assert manifest.names == ("shard-00000",) and manifest.rows == (1000,)
    assert manifest.bundles is not None and set(manifest.bundles) == {"shard-00000"}
    assert keys.count("shard-00000/shard.lxs") == 1 and "shard-00000/lock" not in keys
    with pytest.raises(ManifestError, match="bundles.*open it as the URL file://"):
        loaderx.DenseDataset(str(tmp_path / "copy"))
    with open_copy(tmp_path / "copy", tmp_path / "cache") as dataset:
        np.testing.assert_array_equal(dataset[:], array)


def test_from_iterator_to_file_url_round_trips_ragged(tmp_path):
    """from_iterator to file:// writes a ragged dataset the local reader opens."""
    records = [np.arange(i, dtype=np.int32) for i in range(1, 60)]
    target = tmp_path / "ds"
    count = loaderx.from_iterator(
        f"file://{target}", records, progress=False, staging_dir=tmp_path / "s"
    )
    assert count == len(records)
    check_files(str(target))
    with loaderx.RaggedDataset(str(target)) as dataset:
        for i, record in enumerate(records):
            np.testing.assert_array_equal(dataset[i], record)


def test_write_shard_and_commit_to_s3_are_one_dataset(s3, tmp_path):
    """write_shard per shard then commit: written_shards sees them, the
    manifest is last, and the downloaded dataset reads every row."""
    url = s3.url("sharded")
    parts = [np.full((50 + k, 3), k, dtype=np.int64) for k in range(3)]
    for k, part in enumerate(parts):
        assert shards.write_shard(url, k, part, staging_dir=tmp_path / "s") == len(part)
    assert shards.written_shards(url) == [0, 1, 2]
    assert not _upload.is_committed(url) and not shards.is_sharded(url)
    with pytest.raises(FileExistsError, match="already uploaded"):
        shards.write_shard(url, 0, parts[0], staging_dir=tmp_path / "s")
    assert shards.commit(url) == sum(map(len, parts))
    assert _upload.is_committed(url) and shards.is_sharded(url + "/")
    assert not shards.is_sharded(s3.url("nothing-here"))
    download(url, str(tmp_path / "copy"))
    manifest = check_files(str(tmp_path / "copy"))
    assert manifest.rows == (50, 51, 52) and manifest.bundles is not None
    with open_copy(tmp_path / "copy", tmp_path / "cache") as dataset:
        np.testing.assert_array_equal(dataset[:], np.concatenate(parts))
    with pytest.raises(FileExistsError, match="committed in its manifest"):
        shards.write_shard(url, 1, parts[1], staging_dir=tmp_path / "s")


def test_a_file_over_the_multipart_threshold_round_trips(s3, tmp_path):
    """A raw store whose data file is over 8 MiB goes up in parts and comes
    back byte for byte."""
    array = np.random.default_rng(3).integers(0, 255, (9 << 10, 1024), dtype=np.uint8)
    url = s3.url("big")
    loaderx.from_numpy(url, array, codec="raw", progress=False, staging_dir=tmp_path / "s")
    download(url, str(tmp_path / "copy"))
    manifest = check_files(str(tmp_path / "copy"))
    assert max(size for size, _ in manifest.files["shard-00000"].values()) > MULTIPART_BYTES
    with open_copy(tmp_path / "copy", tmp_path / "cache") as dataset:
        np.testing.assert_array_equal(dataset[:], array)


def test_from_arrow_to_file_url_uploads_the_listing_last(tmp_path, monkeypatch):
    """from_arrow to file:// writes a column directory open_columns reads;
    columns.msgpack is the last object put."""
    pa = pytest.importorskip("pyarrow")
    from loaderx import arrow

    table = pa.table({"x": np.arange(100, dtype=np.float32), "t": [[1, 2]] * 50 + [[3]] * 50})
    recorder = Recorder(monkeypatch, str(tmp_path / "s"))
    target = tmp_path / "cols"
    rows = arrow.from_arrow(f"file://{target}", table, progress=False, staging_dir=tmp_path / "s")
    assert rows == 100 and recorder.puts[-1] == arrow.COLUMNS_FILE
    opened = arrow.open_columns(str(target))
    np.testing.assert_array_equal(opened["x"][:], np.arange(100, dtype=np.float32))
    np.testing.assert_array_equal(opened["t"][99], [3])
    for dataset in opened.values():
        dataset.close()
    with pytest.raises(FileExistsError, match="column directory already"):
        arrow.from_arrow(f"file://{target}", table, progress=False, staging_dir=tmp_path / "s")


def test_ray_datasink_writes_to_a_file_url(tmp_path):
    """loaderx.ray.write_dataset to file:// commits every column remotely."""
    ray = pytest.importorskip("ray", reason="ray is not installed: pip install 'loaderx[ray]'")
    from loaderx import ray as loaderx_ray

    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        ray.data.DataContext.get_current().enable_progress_bars = False
        data = ray.data.from_items([{"a": i, "b": [i] * (i % 3 + 1)} for i in range(40)])
        data = data.repartition(3)
        target = tmp_path / "ray"
        rows = loaderx_ray.write_dataset(data, f"file://{target}", staging_dir=tmp_path / "s")
    finally:
        ray.shutdown()
    assert rows == {"a": 40, "b": 40}
    check_files(str(target / "a"))
    with loaderx.DenseDataset(str(target / "a")) as dataset:
        np.testing.assert_array_equal(np.sort(dataset[:]), np.arange(40))


# ---- the manifest last, faults and resume


def test_a_fault_before_the_manifest_leaves_no_dataset_and_a_retry_puts_only_it(
    s3, tmp_path, monkeypatch
):
    """The manifest's upload fails: the error names it, the target is not a
    dataset (no manifest; its copy is refused), and the retry puts only the
    manifest (the shard is recorded and present)."""
    array = np.arange(300, dtype=np.float64).reshape(-1, 3)
    dry = Recorder(monkeypatch, str(tmp_path / "s"))
    loaderx.from_numpy(s3.url("dry"), array, progress=False, staging_dir=tmp_path / "s")
    manifest_put = dry.puts.index("manifest.msgpack")
    assert manifest_put == len(dry.puts) - 1  # the manifest is the last object put
    Recorder(monkeypatch, str(tmp_path / "s"), [Fault(manifest_put, "fail", method="put")])
    url = s3.url("ds")
    with pytest.raises(RemoteNetworkError, match=r"ds/manifest\.msgpack.*call again to resume"):
        loaderx.from_numpy(url, array, progress=False, staging_dir=tmp_path / "s")
    assert not _upload.is_committed(url)
    download(url, str(tmp_path / "half"))
    assert not shards.is_sharded(str(tmp_path / "half"))
    with pytest.raises((ValueError, FileNotFoundError, OSError)):
        loaderx.DenseDataset(str(tmp_path / "half"))
    retry = Recorder(monkeypatch, str(tmp_path / "s"))
    loaderx.from_numpy(url, array, progress=False, staging_dir=tmp_path / "s")
    assert retry.puts == ["manifest.msgpack"]
    download(url, str(tmp_path / "whole"))
    with open_copy(tmp_path / "whole", tmp_path / "cache") as dataset:
        np.testing.assert_array_equal(dataset[:], array)


def test_resume_after_a_fault_uploads_only_the_missing_shards(s3, tmp_path, monkeypatch):
    """A put fails inside shard 2 of 4 (its record, after its bundle): shards
    0 and 1 stay; the resumed loop (skipping written_shards) puts shard 2's
    record only (its bundle's MD5 etag matches), shard 3, then the manifest."""
    url = s3.url("resume")
    parts = [np.full((40, 4), k, dtype=np.float32) for k in range(4)]
    probe = Recorder(monkeypatch, str(tmp_path / "s"))
    shards.write_shard(s3.url("probe"), 0, parts[0], staging_dir=tmp_path / "s")
    per_shard = [key for key in probe.puts if key != _upload.MARKER_KEY]
    assert per_shard == ["shard-00000/shard.lxs", ".uploaded/shard-00000"]  # one object a shard
    # put 0 is the marker; shard k's puts follow; fail the second put of shard 2
    Recorder(monkeypatch, str(tmp_path / "s"), [Fault(1 + 2 * 2 + 1, "fail", method="put")])
    with pytest.raises(RemoteNetworkError, match=r"\.uploaded/shard-00002"):
        for k, part in enumerate(parts):
            shards.write_shard(url, k, part, staging_dir=tmp_path / "s")
    assert shards.written_shards(url) == [0, 1]
    with pytest.raises(ValueError, match="shards 2, 3 are not uploaded"):
        shards.commit(url, 4)
    retry = Recorder(monkeypatch, str(tmp_path / "s"))
    done = set(shards.written_shards(url))
    for k, part in enumerate(parts):
        if k not in done:
            shards.write_shard(url, k, part, staging_dir=tmp_path / "s")
    shards.commit(url)
    assert retry.puts == [
        ".uploaded/shard-00002",
        "shard-00003/shard.lxs",
        ".uploaded/shard-00003",
        "manifest.msgpack",
    ]
    download(url, str(tmp_path / "copy"))
    check_files(str(tmp_path / "copy"))
    with open_copy(tmp_path / "copy", tmp_path / "cache") as dataset:
        np.testing.assert_array_equal(dataset[:], np.concatenate(parts))


def test_a_rewrite_reuploads_only_objects_whose_etag_differs(s3, tmp_path, monkeypatch):
    """write_shard(overwrite=True) of the same data puts only the record; an
    object changed behind loaderx's back (same size) is put again, found by
    its MD5 etag."""
    url, part = s3.url("again"), np.arange(600, dtype=np.int16).reshape(-1, 6)
    shards.write_shard(url, 0, part, staging_dir=tmp_path / "s")
    recorder = Recorder(monkeypatch, str(tmp_path / "s"))
    shards.write_shard(url, 0, part, overwrite=True, staging_dir=tmp_path / "s")
    assert recorder.puts == []  # the record and every object already match
    source = open_source(url)
    size = source.head("shard-00000/shard.lxs").size
    source.put("shard-00000/shard.lxs", b"\0" * size)
    shards.write_shard(url, 0, part, overwrite=True, staging_dir=tmp_path / "s")
    assert recorder.puts == ["shard-00000/shard.lxs", ".uploaded/shard-00000"]
    shards.commit(url)
    download(url, str(tmp_path / "copy"))
    check_files(str(tmp_path / "copy"))


def test_staging_holds_about_one_shard_at_a_time(tmp_path, monkeypatch):
    """Writing 5 shards to a remote target stages one at a time: the staging
    directory's peak is one shard's files, not the dataset's."""
    staging = tmp_path / "s"
    recorder = Recorder(monkeypatch, str(staging))
    target = tmp_path / "remote"
    rng = np.random.default_rng(0)
    for k in range(5):
        part = rng.integers(0, 1 << 30, (4000, 16), dtype=np.int64)
        shards.write_shard(f"file://{target}", k, part, codec="raw", staging_dir=staging)
    shards.commit(f"file://{target}")
    manifest = read_manifest(str(target))
    shard_bytes = [
        sum(size for size, _ in manifest.files[name].values()) for name in manifest.names
    ]
    assert 0 < recorder.peak <= max(shard_bytes) + (64 << 10)
    assert sum(shard_bytes) > 4 * recorder.peak
    assert tree_bytes(str(staging)) == 0


def test_converters_cut_a_url_write_into_shards_staged_one_at_a_time(tmp_path, monkeypatch):
    """from_numpy and from_iterator to a URL write shards of about
    shard_bytes, one codec for all, staging one shard at a time."""
    staging = tmp_path / "s"
    recorder = Recorder(monkeypatch, str(staging))
    array = np.random.default_rng(1).integers(0, 1 << 20, (10_000, 8), dtype=np.int64)
    url = f"file://{tmp_path / 'dense'}"
    loaderx.from_numpy(url, array, progress=False, staging_dir=staging, shard_bytes=160_000)
    manifest = read_manifest(str(tmp_path / "dense"))
    assert manifest.rows == (2500,) * 4 and recorder.peak < 2 * 160_000
    with loaderx.DenseDataset(str(tmp_path / "dense")) as dataset:
        np.testing.assert_array_equal(dataset[:], array)
    records = [np.full(k % 50 + 1, k, dtype=np.int32) for k in range(400)]
    url = f"file://{tmp_path / 'ragged'}"
    loaderx.from_iterator(url, iter(records), progress=False, staging_dir=staging, shard_bytes=8000)
    assert len(read_manifest(str(tmp_path / "ragged")).names) > 3
    with loaderx.RaggedDataset(str(tmp_path / "ragged")) as dataset:
        assert len(dataset) == len(records)
        for k in (0, 199, 399):
            np.testing.assert_array_equal(dataset[k], records[k])
    with pytest.raises(ValueError, match="shard_bytes applies to a URL"):
        loaderx.from_numpy(tmp_path / "local", array, shard_bytes=1000)


# ---- overwrite, foreign prefixes, checks


def test_modes_over_a_remote_dataset(tmp_path):
    """mode='x' refuses a dataset, 'a' adds a shard, 'w' replaces it and
    deletes the old shards; a prefix of foreign objects is refused."""
    url, staging = f"file://{tmp_path / 'ds'}", tmp_path / "s"
    first, second = np.ones((10, 2), np.float32), np.zeros((7, 2), np.float32)
    loaderx.from_numpy(url, first, progress=False, staging_dir=staging)
    with pytest.raises(FileExistsError, match="mode='w'"):
        loaderx.from_numpy(url, first, progress=False, staging_dir=staging, mode="x")
    loaderx.from_numpy(url, second, progress=False, staging_dir=staging, mode="a")
    assert read_manifest(str(tmp_path / "ds")).rows == (10, 7)
    loaderx.from_numpy(url, second, progress=False, staging_dir=staging, mode="w")
    assert read_manifest(str(tmp_path / "ds")).rows == (7,)
    assert not os.listdir(tmp_path / "ds" / "shard-00001")  # its objects were deleted
    with loaderx.DenseDataset(str(tmp_path / "ds")) as dataset:
        np.testing.assert_array_equal(dataset[:], second)
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not a loaderx dataset"):
        loaderx.from_numpy(f"file://{tmp_path / 'foreign'}", first, staging_dir=staging)
    assert (tmp_path / "foreign" / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("rows, victim", [(4, "shard.lxs"), (9 << 10, "shard.lxs")])
def test_a_body_corrupted_in_transit_fails_its_md5_etag(s3, tmp_path, monkeypatch, rows, victim):
    """An object whose bytes differ from the staged file's (one bit flipped on
    the way) is caught by the etag check, single-part or multipart (the
    bundle of a 9 MiB data file), named, and nothing is committed."""
    real = _upload.open_target

    class Flipping:
        def __init__(self, inner):
            self.inner, self.url = inner, inner.url

        def put(self, key, data):
            if key.endswith("/" + victim):
                body = bytearray(open(data, "rb").read())  # noqa: SIM115 (a test's one read)
                body[100] ^= 1
                data = bytes(body)
            return self.inner.put(key, data)

        def __getattr__(self, name):
            return getattr(self.inner, name)

    monkeypatch.setattr(_upload, "open_target", lambda url, options: Flipping(real(url, options)))
    url = s3.url("flip")
    array = np.ones((rows, 1024), dtype=np.uint8)
    with pytest.raises(RemoteIntegrityError, match=rf"flip/shard-00000/{victim} has MD5 etag"):
        loaderx.from_numpy(url, array, codec="raw", progress=False, staging_dir=tmp_path / "s")
    assert not _upload.is_committed(url)


def test_an_upload_of_the_wrong_size_is_refused():
    """put_checked compares the object's size (head) with what was sent."""

    class Short(MemorySource):
        def put(self, key, data):
            return super().put(key, bytes(data)[:-1])

    with pytest.raises(RemoteIntegrityError, match="holds 3 bytes, but 4 were sent"):
        _upload.put_checked(Short({}), "k", b"abcd", 4, None)


def test_manifest_files_map_is_optional_and_checked(tmp_path):
    """A local commit records no files (None, as every older manifest); a
    packed files map parses back; a damaged one is a ManifestError."""
    shards.write_shard(tmp_path / "local", 0, np.ones((3, 2)))
    shards.commit(tmp_path / "local")
    old = read_manifest(tmp_path / "local")
    assert old.files is None
    files = {"shard-00000": {"superblock": (8192, "ab" * 32)}}
    payload = pack_manifest(old.schema, ["shard-00000"], [3], files)
    assert parse_manifest(payload, "m").files == files
    for bad in ({"shard-00000": {"../x": (1, "ab" * 32)}}, {"shard-00000": {"a": (1, "zz")}}):
        with pytest.raises(ManifestError, match="damaged file list"):
            parse_manifest(pack_manifest(old.schema, ["shard-00000"], [3], bad), "m")


def test_manifest_bundles_round_trip_as_version_3_and_are_checked(tmp_path):
    """A bundles map packs as version 3 and parses back; without one a
    manifest stays version 2; offsets that leave a gap, overlap, miss a file
    or disagree with the size are refused, and so is a version that does
    not match the layout (the checksum does not cover the version)."""
    shards.write_shard(tmp_path / "local", 0, np.ones((3, 2)))
    shards.commit(tmp_path / "local")
    schema = read_manifest(tmp_path / "local").schema
    files = {"shard-00000": {"data": (10, "ab" * 32), "superblock": (5, "cd" * 32)}}
    bundle = Bundle("shard.lxs", 15, "ef" * 32, {"data": 0, "superblock": 10})
    payload = pack_manifest(schema, ["shard-00000"], [3], files, {"shard-00000": bundle})
    assert msgpack.unpackb(payload)["version"] == BUNDLE_VERSION == 3
    assert parse_manifest(payload, "m").bundles == {"shard-00000": bundle}
    plain = pack_manifest(schema, ["shard-00000"], [3], files)
    assert msgpack.unpackb(plain)["version"] == 2 and parse_manifest(plain, "m").bundles is None
    for offsets, size in (
        ({"data": 0, "superblock": 11}, 16),  # a gap
        ({"data": 0, "superblock": 9}, 15),  # an overlap
        ({"data": 0}, 10),  # a file without an offset
        ({"data": 0, "superblock": 10}, 16),  # a size its files do not add up to
    ):
        damaged = {"shard-00000": Bundle("shard.lxs", size, "ef" * 32, offsets)}
        with pytest.raises(ManifestError, match="damaged bundle list"):
            parse_manifest(pack_manifest(schema, ["shard-00000"], [3], files, damaged), "m")
    for good, version in ((payload, 2), (plain, 3)):
        envelope = msgpack.unpackb(good)
        envelope["version"] = version
        with pytest.raises(ManifestError, match=f"has version {version} but lists"):
            parse_manifest(msgpack.packb(envelope), "m")


def test_the_staging_root_defaults_to_the_cache_directory(tmp_path, monkeypatch):
    """staging_dir wins; then $LOADERX_CACHE_DIR, $XDG_CACHE_HOME/loaderx and
    ~/.cache/loaderx, each with staging/ below it."""
    monkeypatch.setenv("LOADERX_CACHE_DIR", str(tmp_path / "cache"))
    assert _upload.staging_root(tmp_path / "mine") == str(tmp_path / "mine")
    assert _upload.staging_root(None) == str(tmp_path / "cache" / "staging")
    monkeypatch.delenv("LOADERX_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _upload.staging_root(None) == str(tmp_path / "xdg" / "loaderx" / "staging")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert _upload.staging_root(None) == str(tmp_path / "home" / ".cache" / "loaderx" / "staging")
