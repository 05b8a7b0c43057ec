"""Damaged and hostile manifests of sharded datasets: every flipped byte and
every truncation, and hostile manifests with valid checksums (absolute
paths, '..', symlinks out of the directory, duplicates, row counts and
schemas that disagree with the shards). The outcome must be the right rows
or a ManifestError naming the problem: never a read outside the dataset
directory, never wrong rows."""

from __future__ import annotations

import hashlib
import os
import shutil

import msgpack
import numpy as np
import pytest

from loaderx import DenseDataset, from_numpy, shards
from loaderx.shards import MANIFEST_FILE, ManifestError

ROWS = np.arange(60 * 2, dtype=np.int64).reshape(60, 2)
BOUNDS = [0, 20, 35, 60]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A committed 3-shard dataset, and next to it a decoy store with the same
    schema that no manifest may reach."""
    root = tmp_path_factory.mktemp("manifest")
    for k, (start, end) in enumerate(zip(BOUNDS[:-1], BOUNDS[1:])):
        shards.write_shard(root / "d", k, ROWS[start:end])
    shards.commit(root / "d")
    from_numpy(root / "decoy", -ROWS[:20], progress=False)
    return root


@pytest.fixture
def dataset(pristine, tmp_path):
    shutil.copytree(pristine / "d", tmp_path / "d")
    shutil.copytree(pristine / "decoy", tmp_path / "decoy")
    return tmp_path / "d"


def body_of(path) -> dict:
    envelope = msgpack.unpackb((path / MANIFEST_FILE).read_bytes(), raw=False)
    return msgpack.unpackb(envelope["body"], raw=False)


def seal(path, body: dict, version: int = 1) -> None:
    """Writes ``body`` as the manifest with a valid checksum."""
    packed = msgpack.packb(body, use_bin_type=True)
    envelope = {
        "format": "loaderx-shards",
        "version": version,
        "body": packed,
        "sha256": hashlib.sha256(packed).digest(),
    }
    (path / MANIFEST_FILE).write_bytes(msgpack.packb(envelope, use_bin_type=True))


def outcome(path) -> str:
    """'ok' when the dataset opens and reads exactly its rows, 'refused' for
    a ManifestError; anything else fails the test."""
    try:
        dataset = DenseDataset(path)
    except ManifestError:
        return "refused"
    with dataset:
        np.testing.assert_array_equal(dataset[:], ROWS)
    return "ok"


def test_every_flipped_byte_is_refused(dataset):
    """Flipping any byte of the manifest (three patterns each) gives a
    ManifestError; none opens with other rows."""
    original = (dataset / MANIFEST_FILE).read_bytes()
    results = set()
    for position in range(len(original)):
        for pattern in (0x01, 0x80, 0xFF):
            damaged = bytearray(original)
            damaged[position] ^= pattern
            (dataset / MANIFEST_FILE).write_bytes(bytes(damaged))
            results.add(outcome(dataset))
    assert results == {"refused"}


def test_every_truncation_and_extension_is_refused(dataset):
    """A manifest cut at any length, or with bytes appended, is refused."""
    original = (dataset / MANIFEST_FILE).read_bytes()
    for length in range(len(original)):
        (dataset / MANIFEST_FILE).write_bytes(original[:length])
        assert outcome(dataset) == "refused", length
    (dataset / MANIFEST_FILE).write_bytes(original + b"\x00")
    assert outcome(dataset) == "refused"


def edit_shards(dataset, edit) -> None:
    body = body_of(dataset)
    edit(body["shards"])
    body["rows"] = sum(
        entry["rows"] for entry in body["shards"] if isinstance(entry.get("rows"), int)
    )
    seal(dataset, body)


@pytest.mark.parametrize(
    "name, message",
    [
        ("{decoy}", "absolute path"),
        ("../decoy", r"'\.\.'"),
        ("shard-00000/../../decoy", r"'\.\.'"),
        ("./shard-00000", r"'\.'"),
        ("", "invalid name"),
        (7, "invalid name"),
        ("shard-00000\x00", "invalid name"),
    ],
)
def test_names_outside_the_directory_are_refused(dataset, name, message):
    """Absolute names, '..' and '.' components and non-names are refused before any shard is
    opened."""
    name = name.format(decoy=dataset.parent / "decoy") if isinstance(name, str) else name
    edit_shards(dataset, lambda entries: entries[0].update(name=name, rows=20))
    with pytest.raises(ManifestError, match=message):
        DenseDataset(dataset)


def test_a_symlink_out_of_the_directory_is_refused(dataset):
    """A shard that is a symlink to a store outside the dataset is refused."""
    os.symlink(dataset.parent / "decoy", dataset / "link")
    edit_shards(dataset, lambda entries: entries[0].update(name="link"))
    with pytest.raises(ManifestError, match="outside the dataset directory"):
        DenseDataset(dataset)
    shutil.rmtree(dataset / "shard-00000")
    os.symlink(dataset.parent / "decoy", dataset / "shard-00000")
    edit_shards(dataset, lambda entries: entries[0].update(name="shard-00000"))
    with pytest.raises(ManifestError, match="outside the dataset directory"):
        DenseDataset(dataset)


def test_duplicate_shards_are_refused(dataset):
    """The same shard twice, by name or through a symlink inside the
    directory, is refused."""
    edit_shards(dataset, lambda entries: entries.append(dict(entries[0])))
    with pytest.raises(ManifestError, match="listed once"):
        DenseDataset(dataset)
    os.symlink("shard-00000", dataset / "alias")
    edit_shards(dataset, lambda entries: entries[-1].update(name="alias"))
    with pytest.raises(ManifestError, match="listed once"):
        DenseDataset(dataset)


@pytest.mark.parametrize("rows", [19, 21, 0, -1, True, "20", None, 1 << 63])
def test_row_counts_that_disagree_with_the_shards_are_refused(dataset, rows):
    """A row count other than the shard's own (or not a count) is refused."""
    edit_shards(dataset, lambda entries: entries[0].update(rows=rows))
    with pytest.raises(ManifestError, match="row count|holds 20 records"):
        DenseDataset(dataset)


def test_swapped_row_counts_and_a_wrong_total_are_refused(dataset):
    """Counts moved between shards (same total) or a total that does not add up are refused."""
    edit_shards(dataset, lambda entries: (entries[0].update(rows=15), entries[1].update(rows=20)))
    with pytest.raises(ManifestError, match="holds 20 records but the manifest says 15"):
        DenseDataset(dataset)
    body = body_of(dataset)
    body["shards"][0]["rows"], body["shards"][1]["rows"] = 20, 15
    body["rows"] = 61
    seal(dataset, body)
    with pytest.raises(ManifestError, match="61 rows in total"):
        DenseDataset(dataset)


def test_missing_shards_and_other_schemas_are_refused(dataset):
    """A listed shard that is gone, or a schema other than the shards', is refused."""
    body = body_of(dataset)
    body["schema"]["dtype"] = "<i4"
    seal(dataset, body)
    with pytest.raises(ManifestError, match="manifest says dense int32"):
        DenseDataset(dataset)
    body["schema"]["dtype"] = "<i8"
    seal(dataset, body)
    shutil.rmtree(dataset / "shard-00001")
    with pytest.raises(ManifestError, match="'shard-00001' listed in the manifest is missing"):
        DenseDataset(dataset)
    assert not (dataset / "shard-00001").exists()  # opening did not create it


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda body: body.update(shards=[]), "lists 0 shards"),
        (lambda body: body.update(shards="shard-00000"), "lists no shards"),
        (lambda body: body.update(shards=[["shard-00000", 20]]), "not a map"),
        (lambda body: body.pop("schema"), "schema"),
        (lambda body: body["schema"].update(format="other"), "not a loaderx schema"),
    ],
)
def test_malformed_bodies_are_refused(dataset, edit, message):
    """Bodies of the wrong shape, with a valid checksum, are refused by name."""
    body = body_of(dataset)
    edit(body)
    seal(dataset, body)
    with pytest.raises(ManifestError, match=message):
        DenseDataset(dataset)


def test_the_sha256_layout_of_version_1_still_opens(dataset):
    """A manifest as loaderx wrote it before the shared envelope (version 1,
    the body's SHA-256) opens with its rows; new commits write version 2."""
    assert msgpack.unpackb((dataset / MANIFEST_FILE).read_bytes())["version"] == 2
    seal(dataset, body_of(dataset), version=1)
    assert outcome(dataset) == "ok"


def test_a_newer_manifest_version_asks_for_an_upgrade(dataset):
    """A manifest from a newer loaderx is refused with what to do."""
    seal(dataset, body_of(dataset), version=2)
    with pytest.raises(ManifestError, match="upgrade loaderx"):
        DenseDataset(dataset)


def test_a_shard_changed_after_commit_is_refused(dataset):
    """Rows appended to a committed shard behind the manifest's back are refused."""
    from_numpy(dataset / "shard-00002", ROWS[:3], progress=False, mode="a")
    with pytest.raises(ManifestError, match="holds 28 records but the manifest says 25"):
        DenseDataset(dataset)


def test_commit_rewrites_a_damaged_manifest(dataset):
    """The remedy the errors name works: commit again rebuilds the manifest from the shards."""
    (dataset / MANIFEST_FILE).write_bytes(b"garbage")
    assert outcome(dataset) == "refused"
    shards.commit(dataset)
    assert outcome(dataset) == "ok"
