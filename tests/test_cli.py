"""The `loaderx` command: every subcommand run as a user runs it, in a subprocess."""

import glob
import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from loaderx import (
    ArrayStore,
    DenseDataset,
    RaggedDataset,
    Zrecord,
    from_iterator,
    from_numpy,
    shards,
)
from loaderx.zrecord import ChecksumError


def loaderx(*args, cwd=None):
    """Runs `python -m loaderx ARGS`; returns (exit status, stdout, stderr)."""
    result = subprocess.run(
        [sys.executable, "-m", "loaderx", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
    )
    return result.returncode, result.stdout, result.stderr


def loaderx_json(*args):
    status, out, err = loaderx(*args, "--json")
    assert status == 0, err
    return json.loads(out)


def disk_bytes(path):
    return sum(
        os.lstat(file).st_blocks * 512
        for file in glob.glob(os.path.join(path, "**"), recursive=True)
        if os.path.isfile(file)
    )


def test_console_script_and_help():
    """The `loaderx` console script is installed next to this Python and lists every subcommand."""
    script = Path(sys.executable).parent / "loaderx"
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    for command in ("info", "verify", "compact", "convert", "bench"):
        assert command in result.stdout
    status, _, err = loaderx()
    assert status == 2 and "usage: loaderx" in err


def test_info_of_a_dense_dataset(tmp_path):
    """info reports kind, dtype, shape, codec, records, bytes, ratio, layout and generation."""
    array = np.tile(np.arange(64, dtype=np.uint8), (1000, 64))  # 4 KiB rows zstd shrinks
    from_numpy(tmp_path / "ds", array)
    info = loaderx_json("info", tmp_path / "ds")
    assert (info["kind"], info["dtype"], info["shape"], info["item_shape"], info["codec"]) == (
        "dense",
        "uint8",
        [1000, 4096],
        [4096],
        "zstd",
    )
    assert info["records"] == 1000 and info["raw_bytes"] == array.nbytes
    assert info["disk_bytes"] == disk_bytes(tmp_path / "ds")
    assert (
        info["ratio"] == pytest.approx(array.nbytes / info["disk_bytes"], rel=1e-3)
        and info["ratio"] > 1
    )
    # Generation 1 is the converter's one unsynced append, 2 the sync that made it durable.
    assert (info["layout"], info["generation"], info["reclaimable_bytes"]) == ("indexed", 2, 0)
    status, out, _ = loaderx("info", tmp_path / "ds")
    assert status == 0
    assert (
        "loaderx dense dataset" in out
        and "(1000, 4096)" in out
        and "1,000" in out
        and "compression ratio" in out
    )


def test_info_of_ragged_bare_and_arraystore(tmp_path):
    """info knows ragged datasets, bare zrecord stores and ArrayStores."""
    records = [np.arange(n, dtype=np.int32) for n in range(20)]
    from_iterator(tmp_path / "ragged", records, codec="raw")
    info = loaderx_json("info", tmp_path / "ragged")
    assert (info["kind"], info["records"], info["raw_bytes"]) == (
        "ragged",
        20,
        sum(r.nbytes for r in records),
    )
    with Zrecord(tmp_path / "bare", codec="raw") as store:
        store.append(b"abcdefgh", [0, 4])
    info = loaderx_json("info", tmp_path / "bare")
    assert (info["kind"], info["records"], info["raw_bytes"], info["layout"]) == (
        "zrecord",
        2,
        8,
        "fixed",
    )
    with ArrayStore(tmp_path / "arrays") as store:
        store.save({"x": np.zeros((10, 3), np.float32), "s": np.float64(2.0)})
    info = loaderx_json("info", tmp_path / "arrays")
    assert info["kind"] == "arraystore"
    assert {(entry["name"], tuple(entry["shape"]), entry["dtype"]) for entry in info["arrays"]} == {
        ("x", (10, 3), "float32"),
        ("s", (), "float64"),
    }
    status, out, _ = loaderx("info", tmp_path / "arrays")
    assert status == 0 and "ArrayStore, 2 arrays" in out


def test_info_refuses_what_is_not_a_store(tmp_path):
    """A missing path, a file and a plain directory exit 2 with a one-line reason, and nothing is
    created."""
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "notes.txt").write_text("hi")
    (tmp_path / "file.npy").write_bytes(b"x")
    for path, reason in [
        ("missing", "does not exist"),
        ("file.npy", "is a file"),
        ("plain", "not a loaderx store"),
    ]:
        status, out, err = loaderx("info", tmp_path / path)
        assert status == 2 and out == "" and reason in err and err.startswith("loaderx: error:")
    assert not (tmp_path / "missing").exists()
    assert os.listdir(tmp_path / "plain") == ["notes.txt"]


def damaged_store(path, damaged_index):
    """A zstd store of 10 incompressible 4 KiB records (stored raw, back to back)
    with one byte of record `damaged_index` flipped."""
    rng = np.random.default_rng(0)
    from_iterator(path, [rng.integers(0, 256, 4096, dtype=np.uint8) for _ in range(10)])
    (data,) = glob.glob(os.path.join(path, "data-*"))
    with open(data, "r+b") as handle:
        handle.seek(damaged_index * 4096 + 100)
        byte = handle.read(1)[0]
        handle.seek(damaged_index * 4096 + 100)
        handle.write(bytes([byte ^ 0xFF]))


def test_verify_clean_and_damaged(tmp_path):
    """verify exits 0 on a clean store and 1 on a damaged one, naming the damaged record."""
    from_numpy(tmp_path / "clean", np.arange(100))
    status, out, _ = loaderx("verify", tmp_path / "clean")
    assert status == 0 and "ok, 100 records verified" in out
    from_numpy(tmp_path / "one", np.arange(1))
    status, out, _ = loaderx("verify", tmp_path / "one")
    assert status == 0 and "ok, 1 record verified" in out  # not "1 records"
    damaged_store(tmp_path / "bad", 5)
    status, out, _ = loaderx("verify", tmp_path / "bad")
    assert status == 1
    assert "DAMAGED, 1 of 10 records fail their checksum: 5" in out
    status, out, _ = loaderx("verify", tmp_path / "bad", "--json")
    result = json.loads(out)
    assert status == 1 and result["ok"] is False and result["stores"][0]["damaged"] == [5]


def test_verify_a_store_too_damaged_to_open(tmp_path):
    """A store whose superblock is zeroed cannot be opened: verify reports it as damage (exit 1)."""
    from_numpy(tmp_path / "ds", np.arange(100))
    superblock = tmp_path / "ds" / "superblock"
    superblock.write_bytes(bytes(superblock.stat().st_size))
    status, out, _ = loaderx("verify", tmp_path / "ds")
    assert status == 1 and "DAMAGED, cannot be read" in out and "CorruptStoreError" in out


@pytest.mark.parametrize("damage", ["superblock deleted", "schema garbled"])
def test_verify_a_dataset_missing_its_superblock_or_schema(tmp_path, damage):
    """A dataset whose superblock is gone, or whose schema.msgpack is garbage, is damaged (exit 1),
    not 'not a store'."""
    from_numpy(tmp_path / "ds", np.arange(100))
    if damage == "superblock deleted":
        (tmp_path / "ds" / "superblock").unlink()
    else:
        (tmp_path / "ds" / "schema.msgpack").write_bytes(b"\xc1garbage")
    status, out, err = loaderx("verify", tmp_path / "ds")
    assert status == 1 and "DAMAGED, cannot be read" in out, (out, err)
    status, _, err = loaderx("info", tmp_path / "ds")
    assert status == 2 and "loaderx: error:" in err


def test_verify_an_arraystore(tmp_path):
    """verify checks every array of an ArrayStore."""
    with ArrayStore(tmp_path / "arrays") as store:
        store.save({"x": np.zeros((10, 3), np.float32), "y": np.arange(5)})
    result = loaderx_json("verify", tmp_path / "arrays")
    assert result["ok"] and sorted(entry["name"] for entry in result["stores"]) == ["x", "y"]


def test_verify_opens_each_array_of_an_arraystore_once(tmp_path, monkeypatch, capsys):
    """verify opened each array twice (through the ArrayStore, then as a DenseDataset);
    it checks the array through the ArrayStore's own handle."""
    from loaderx.cli import main

    with ArrayStore(tmp_path / "arrays") as store:
        store.save({"x": np.zeros((10, 3), np.float32), "y": np.arange(5)})
    opened = []
    real_opened = Zrecord._opened  # every open of a store, by any constructor, runs it

    def counting_opened(self, path, *args):
        opened.append(os.path.basename(os.fspath(path)))
        real_opened(self, path, *args)

    monkeypatch.setattr(Zrecord, "_opened", counting_opened)
    assert main(["verify", str(tmp_path / "arrays"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["ok"] and [entry["records"] for entry in result["stores"]] == [10, 5]
    assert sorted(opened) == ["x", "y"]


def test_compact_reclaims_deleted_records(tmp_path):
    """compact shrinks a store whose records were deleted, and keeps the live ones."""
    payload = np.random.default_rng(0).integers(0, 256, 64 * 4096, dtype=np.uint8)
    with Zrecord(tmp_path / "store", codec="zstd") as store:
        store.append(payload, np.arange(64) * 4096)
        store.delete(np.arange(48), keep_order=True)
    result = loaderx_json("compact", tmp_path / "store")
    assert result["reclaimed_bytes"] >= 48 * 4096
    assert result["disk_bytes_after"] == disk_bytes(tmp_path / "store")
    with Zrecord(tmp_path / "store") as store:
        assert len(store) == 16 and store.read(0) == payload[48 * 4096 : 49 * 4096].tobytes()
    status, out, _ = loaderx("compact", tmp_path / "store")
    assert status == 0 and "compacted" in out


def test_compact_and_convert_refuse_a_store_being_written(tmp_path):
    """While another handle writes to a store, compact and an overwriting convert exit 2 and change
    nothing."""
    np.save(tmp_path / "a.npy", np.arange(10))
    from_numpy(tmp_path / "ds", np.arange(4), codec="raw")
    with Zrecord(tmp_path / "ds", codec="raw") as writer:
        writer.append(np.arange(4, 6).astype(np.int64), [0, 8])  # holds the write lock until closed
        for args in (
            ("compact", tmp_path / "ds"),
            ("convert", tmp_path / "a.npy", tmp_path / "ds"),
        ):
            status, _, err = loaderx(*args)
            assert status == 2 and "another process" in err and err.count("another process") == 1, (
                err
            )
    with DenseDataset(tmp_path / "ds") as dataset:
        assert dataset[:].tolist() == [0, 1, 2, 3, 4, 5]


def test_convert_npy(tmp_path):
    """convert writes a dense dataset from a .npy file; a second run replaces it, --mode a
    appends."""
    array = np.arange(3000, dtype=np.float32).reshape(1000, 3)
    np.save(tmp_path / "a.npy", array)
    status, out, err = loaderx("convert", tmp_path / "a.npy", tmp_path / "ds", "--codec", "raw")
    assert status == 0, err
    assert "1,000 rows written" in out and err == ""  # no progress bar: stderr is not a terminal
    status, _, _ = loaderx("convert", tmp_path / "a.npy", tmp_path / "ds", "--codec", "raw")
    with DenseDataset(tmp_path / "ds") as dataset:
        np.testing.assert_array_equal(dataset[:], array)
        assert dataset.codec == "raw" and dataset.store.stats()["layout"] == "fixed"
    result = loaderx_json(
        "convert", tmp_path / "a.npy", tmp_path / "ds", "--codec", "raw", "--mode", "a"
    )
    assert result["rows_written"] == 1000 and result["store"]["records"] == 2000
    status, _, err = loaderx("convert", tmp_path / "a.npy", tmp_path / "ds", "--mode", "x")
    assert (
        status == 2 and "--mode w" in err and "mode='w'" not in err
    )  # the flag, not the Python keyword


def test_convert_progress_bar_on_request(tmp_path):
    """--progress draws the bar on stderr even when it is a pipe."""
    np.save(tmp_path / "a.npy", np.zeros((500, 16), np.int64))
    status, _, err = loaderx("convert", tmp_path / "a.npy", tmp_path / "ds", "--progress")
    assert status == 0
    assert "[##############################] 100%" in err and err.endswith("\n")


def test_convert_refuses_bad_sources(tmp_path):
    """A file that is not .npy, an .npz archive and a non-store target exit 2 and write nothing."""
    (tmp_path / "text.npy").write_text("not numpy")
    np.savez(tmp_path / "pair.npz", a=np.arange(3))
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "cat.jpg").write_bytes(b"meow")
    np.save(tmp_path / "a.npy", np.arange(3))
    for source, target, reason in [
        ("text.npy", "out", "not a .npy file"),
        ("pair.npz", "out", ".npz archive"),
        ("a.npy", "photos", "not a loaderx store"),
    ]:
        status, _, err = loaderx("convert", tmp_path / source, tmp_path / target)
        assert status == 2 and reason in err and "allow_pickle" not in err
    assert not (tmp_path / "out").exists() and os.listdir(tmp_path / "photos") == ["cat.jpg"]


def test_bench_quick_figures(tmp_path):
    """bench measures the sampler, two stores and the loader, checks the store's rows, and cleans
    up."""
    result = loaderx_json("bench", "--records", 300, "--dir", tmp_path)
    assert result["machine"]["cores"] >= 1
    assert {row["sampler"] for row in result["sampler"]} >= {"loaderx IID", "loaderx CYCLIC"}
    assert all(row["us_per_batch"] > 0 for row in result["sampler"])
    stores = {row["store"]: row for row in result["store"]}
    assert stores["loaderx raw"]["ratio"] == pytest.approx(1.0, abs=0.05)
    assert stores["loaderx zstd"]["ratio"] > 1.1 and stores["loaderx zstd"]["gather_mib_s"] > 0
    assert all(row["batches_s"] > 0 for row in result["loader"])
    assert os.listdir(tmp_path) == []
    status, out, _ = loaderx("bench", "--records", 300, "--dir", tmp_path)
    assert status == 0 and "sampler" in out and "loaderx zstd" in out


# ---- sharded datasets and column directories ------------------------------------------


def _require(name):
    """The module; CI installs the [arrow] extra, so there a missing one fails."""
    if os.environ.get("CI"):
        return importlib.import_module(name)
    return pytest.importorskip(name)


def sharded_dataset(path, shard_count=4, rows_per_shard=10, damaged=None):
    """A ragged sharded dataset of incompressible 4 KiB records, stored raw
    back to back; ``damaged=(shard, local_index)`` flips one byte of that record."""
    rng = np.random.default_rng(0)
    records = [
        rng.integers(0, 256, 4096, dtype=np.uint8) for _ in range(shard_count * rows_per_shard)
    ]
    for k in range(shard_count):
        shards.write_shard(path, k, records[k * rows_per_shard : (k + 1) * rows_per_shard])
    shards.commit(path)
    if damaged is not None:
        shard, index = damaged
        (data,) = glob.glob(os.path.join(path, shards.shard_name(shard), "data-*"))
        with open(data, "r+b") as handle:
            handle.seek(index * 4096 + 100)
            byte = handle.read(1)[0]
            handle.seek(index * 4096 + 100)
            handle.write(bytes([byte ^ 0xFF]))
    return records


def test_info_of_a_sharded_dataset(tmp_path):
    """info opens a sharded dataset as one: kind, dtype, shape, codec, records over all shards,
    shards, bytes, ratio."""
    array = np.tile(np.arange(64, dtype=np.uint8), (300, 16))  # 1 KiB rows zstd shrinks
    for k, (start, end) in enumerate([(0, 100), (100, 100), (100, 300)]):
        shards.write_shard(tmp_path / "ds", k, array[start:end])
    shards.commit(tmp_path / "ds")
    info = loaderx_json("info", tmp_path / "ds")
    assert (
        info["kind"],
        info["sharded"],
        info["shards"],
        info["dtype"],
        info["shape"],
        info["codec"],
    ) == ("dense", True, 3, "uint8", [300, 1024], "zstd")
    assert info["records"] == 300 and info["raw_bytes"] == array.nbytes
    assert info["disk_bytes"] == disk_bytes(tmp_path / "ds")
    assert (
        info["ratio"] == pytest.approx(array.nbytes / info["disk_bytes"], rel=1e-3)
        and info["ratio"] > 1
    )
    status, out, _ = loaderx("info", tmp_path / "ds")
    assert status == 0
    assert "dense dataset, sharded" in out and "shards       3" in out and "(300, 1024)" in out


def test_info_of_a_ragged_sharded_dataset_and_an_unfinished_one(tmp_path):
    """A ragged sharded dataset sums its records' lengths; shards without a manifest are refused
    with the remedy."""
    records = sharded_dataset(tmp_path / "ds", shard_count=3)
    info = loaderx_json("info", tmp_path / "ds")
    assert (info["kind"], info["shards"], info["records"], info["raw_bytes"]) == (
        "ragged",
        3,
        30,
        sum(r.nbytes for r in records),
    )
    os.remove(tmp_path / "ds" / shards.MANIFEST_FILE)
    status, out, err = loaderx("info", tmp_path / "ds")
    assert status == 2 and out == "" and "no manifest.msgpack" in err and "shards.commit" in err


def test_verify_a_sharded_dataset_names_damage_by_global_index(tmp_path):
    """verify checks every shard; a flipped byte in shard 2 is reported at its global index, exit
    1."""
    sharded_dataset(tmp_path / "clean")
    result = loaderx_json("verify", tmp_path / "clean")
    assert (
        result["ok"]
        and result["damaged"] == []
        and [entry["name"] for entry in result["stores"]]
        == [shards.shard_name(k) for k in range(4)]
    )
    assert [entry["first_record"] for entry in result["stores"]] == [0, 10, 20, 30]
    sharded_dataset(tmp_path / "bad", damaged=(2, 3))
    status, out, _ = loaderx("verify", tmp_path / "bad", "--json")
    result = json.loads(out)
    assert status == 1 and result["ok"] is False and result["damaged"] == [23]
    assert [entry["damaged"] for entry in result["stores"]] == [[], [], [23], []]
    status, out, _ = loaderx("verify", tmp_path / "bad")
    assert status == 1
    assert (
        "shard-00002 (global records 20..29): DAMAGED, 1 of 10 records fail their checksum: 23"
        in out
    )
    assert "shard-00001 (global records 10..19): ok, 10 records verified" in out
    assert "global indices: 23" in out
    with RaggedDataset(
        tmp_path / "bad", verify=True
    ) as dataset:  # what verify names is what a checked read trips on
        assert len(dataset[22]) == 4096 and len(dataset[24]) == 4096
        with pytest.raises(ChecksumError):
            dataset[23]


def test_verify_a_sharded_dataset_with_a_damaged_manifest_or_missing_shard(tmp_path):
    """A garbled manifest, or a shard deleted after commit, is damage (exit 1) and the other shards
    are still checked."""
    sharded_dataset(tmp_path / "ds")
    manifest = tmp_path / "ds" / shards.MANIFEST_FILE
    good = manifest.read_bytes()
    manifest.write_bytes(good[:-5] + b"xxxxx")
    status, out, _ = loaderx("verify", tmp_path / "ds")
    assert status == 1 and "DAMAGED, cannot be read" in out and "ManifestError" in out
    status, _, err = loaderx("info", tmp_path / "ds")
    assert status == 2 and "loaderx: error:" in err and "manifest" in err
    manifest.write_bytes(good)
    shutil.rmtree(tmp_path / "ds" / shards.shard_name(1))
    result = json.loads(loaderx("verify", tmp_path / "ds", "--json")[1])
    assert result["ok"] is False and result["stores"][1]["error"] is not None
    assert [entry["error"] is None for entry in result["stores"]] == [True, False, True, True]


def test_compact_a_sharded_dataset_per_shard(tmp_path):
    """compact compacts every shard in place; a dataset whose manifest disagrees with its shards is
    refused untouched."""
    records = sharded_dataset(tmp_path / "ds", shard_count=2)
    result = loaderx_json("compact", tmp_path / "ds")
    assert result["disk_bytes_after"] == disk_bytes(tmp_path / "ds")
    with RaggedDataset(tmp_path / "ds") as dataset:
        assert len(dataset) == 20 and bytes(dataset[13]) == records[13].tobytes()
    with Zrecord(tmp_path / "ds" / shards.shard_name(1)) as store:
        store.delete([0])  # the manifest now disagrees: compacting would make it permanent
    before = disk_bytes(tmp_path / "ds")
    status, _, err = loaderx("compact", tmp_path / "ds")
    assert status == 2 and "manifest says 10" in err and disk_bytes(tmp_path / "ds") == before


def test_info_verify_and_compact_a_column_directory(tmp_path):
    """A from_arrow column directory: info lists every column, verify checks each (exit 1 on
    damage), compact each."""
    pa = _require("pyarrow")
    from loaderx.arrow import from_arrow

    rng = np.random.default_rng(0)
    table = pa.table(
        {
            "label": np.arange(10),
            "blob": [rng.integers(0, 256, 4096, dtype=np.uint8).tobytes() for _ in range(10)],
        }
    )
    from_arrow(tmp_path / "cols", table, codec="zstd", progress=False)
    info = loaderx_json("info", tmp_path / "cols")
    assert (info["kind"], info["records"]) == ("columns", 10)
    assert {(entry["name"], entry["kind"], entry["dtype"]) for entry in info["columns"]} == {
        ("label", "dense", "int64"),
        ("blob", "ragged", "uint8"),
    }
    assert info["disk_bytes"] == disk_bytes(tmp_path / "cols")
    status, out, _ = loaderx("info", tmp_path / "cols")
    assert status == 0 and "column directory, 2 columns of 10 records" in out
    assert loaderx_json("verify", tmp_path / "cols")["ok"]
    assert loaderx_json("compact", tmp_path / "cols")["disk_bytes_after"] == disk_bytes(
        tmp_path / "cols"
    )
    (data,) = glob.glob(os.path.join(tmp_path / "cols" / "blob", "data-*"))
    with open(data, "r+b") as handle:
        handle.seek(7 * 4096 + 9)
        byte = handle.read(1)[0]
        handle.seek(7 * 4096 + 9)
        handle.write(bytes([byte ^ 0xFF]))
    status, out, _ = loaderx("verify", tmp_path / "cols", "--json")
    result = json.loads(out)
    assert status == 1 and {entry["name"]: entry["damaged"] for entry in result["stores"]} == {
        "label": [],
        "blob": [7],
    }


def parquet_table(pa, start, rows):
    return pa.table(
        {
            "x": np.arange(start, start + rows, dtype=np.float32),
            "ids": [list(range(i % 5)) for i in range(start, start + rows)],
            "name": [f"row {i}" for i in range(start, start + rows)],
        }
    )


def test_convert_parquet_file_and_glob(tmp_path):
    """convert takes a .parquet file or a glob through from_arrow: one store per column, rows in
    file order."""
    pa = _require("pyarrow")
    pq = _require("pyarrow.parquet")
    from loaderx.arrow import open_columns

    (tmp_path / "parts").mkdir()
    for k in range(3):
        pq.write_table(parquet_table(pa, 100 * k, 100), tmp_path / "parts" / f"part-{k}.parquet")
    status, out, err = loaderx(
        "convert", tmp_path / "parts" / "part-1.parquet", tmp_path / "one", "--codec", "raw"
    )
    assert status == 0, err
    assert "100 rows written" in out and "column directory, 3 columns" in out
    columns = open_columns(tmp_path / "one")
    assert columns["x"][:].tolist() == list(range(100, 200)) and columns["x"].codec == "raw"
    assert columns["ids"][4].tolist() == [0, 1, 2, 3] and bytes(columns["name"][0]) == b"row 100"
    for dataset in columns.values():
        dataset.close()
    result = loaderx_json(
        "convert",
        str(tmp_path / "parts" / "part-*.parquet"),
        tmp_path / "all",
        "--columns",
        "x,name",
    )
    assert result["rows_written"] == 300 and [
        entry["name"] for entry in result["columns"]["columns"]
    ] == ["x", "name"]
    with DenseDataset(tmp_path / "all" / "x") as x:
        np.testing.assert_array_equal(x[:], np.arange(300, dtype=np.float32))


def test_convert_parquet_replaces_only_a_column_directory(tmp_path):
    """--mode w replaces a column directory, x and a refuse it; another non-empty directory is never
    replaced."""
    pa = _require("pyarrow")
    pq = _require("pyarrow.parquet")
    pq.write_table(parquet_table(pa, 0, 50), tmp_path / "a.parquet")
    pq.write_table(parquet_table(pa, 50, 20), tmp_path / "b.parquet")
    assert loaderx("convert", tmp_path / "a.parquet", tmp_path / "cols")[0] == 0
    for mode, reason in [("x", "--mode x refuses"), ("a", "cannot append")]:
        status, _, err = loaderx(
            "convert", tmp_path / "b.parquet", tmp_path / "cols", "--mode", mode
        )
        assert status == 2 and reason in err
    assert loaderx_json("info", tmp_path / "cols")["records"] == 50
    assert loaderx_json("convert", tmp_path / "b.parquet", tmp_path / "cols")["rows_written"] == 20
    with DenseDataset(tmp_path / "cols" / "x") as x:
        assert x[:].tolist() == list(range(50, 70))
    listed = sorted(
        name for name in os.listdir(tmp_path) if not name.startswith(".lock-")
    )  # the swap's lock file stays
    assert listed == ["a.parquet", "b.parquet", "cols"]  # no staging left behind
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "cat.jpg").write_bytes(b"meow")
    status, _, err = loaderx("convert", tmp_path / "a.parquet", tmp_path / "photos")
    assert (
        status == 2
        and "not a loaderx column directory" in err
        and os.listdir(tmp_path / "photos") == ["cat.jpg"]
    )
    status, _, err = loaderx("convert", str(tmp_path / "none-*.parquet"), tmp_path / "new")
    assert status == 2 and "no Parquet file" in err and not (tmp_path / "new").exists()
    status, _, err = loaderx(
        "convert", tmp_path / "a.parquet", tmp_path / "new", "--columns", "nope"
    )
    assert status == 2 and "no column 'nope'" in err and not (tmp_path / "new").exists()


def test_convert_parquet_without_pyarrow_says_how_to_install_it(tmp_path):
    """Where pyarrow cannot be imported, a Parquet convert exits 2 naming the extra to install, and
    writes nothing."""
    (tmp_path / "a.parquet").write_bytes(b"PAR1")
    code = (
        "import sys; sys.modules['pyarrow'] = None; from loaderx.cli import main; "
        f"sys.exit(main(['convert', {str(tmp_path / 'a.parquet')!r}, {str(tmp_path / 'out')!r}]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2
    assert (
        "needs pyarrow: pip install 'loaderx[arrow]'" in result.stderr
        and result.stderr.count("\n") == 1
    )
    assert not (tmp_path / "out").exists()


def test_json_goes_before_or_after_the_command(tmp_path):
    """`loaderx --json info PATH` was refused ("unrecognized arguments"); a global
    option works before or after the command alike."""
    from_numpy(tmp_path / "ds", np.arange(10.0), progress=False)
    for argv in (
        ["--json", "info", tmp_path / "ds"],
        ["info", "--json", tmp_path / "ds"],
        ["info", tmp_path / "ds", "--json"],
    ):
        status, out, err = loaderx(*argv)
        assert status == 0, (argv, err)
        assert json.loads(out)["records"] == 10


@pytest.mark.parametrize(
    "argv, words",
    [
        (["info", "{missing}", "--json"], "does not exist"),
        (["--json", "info", "{missing}"], "does not exist"),
        (["--json", "info"], "the following arguments are required: PATH"),
        (["--json", "frobnicate"], "invalid choice"),
        (["--json", "convert", "{missing}.npy", "{missing}", "--mode", "q"], "invalid choice"),
    ],
)
def test_an_error_under_json_prints_a_json_error_object(tmp_path, argv, words):
    """An error under --json printed no JSON at all; now stdout is one JSON object
    saying what went wrong, and the exit status is 2."""
    status, out, err = loaderx(*[str(arg).format(missing=tmp_path / "missing") for arg in argv])
    assert status == 2
    error = json.loads(out)
    assert error["ok"] is False and error["exit_status"] == 2 and words in error["error"]
    assert words in err


def test_a_closed_pipe_ends_the_command_quietly(tmp_path):
    """`loaderx ... --json | head` ended with "error: Broken pipe" (exit 2); a reader
    that closes the pipe early ends the command quietly, as SIGPIPE would (141)."""
    with ArrayStore(tmp_path / "arrays") as store:
        store.save(
            {f"a{number}": np.zeros(2) for number in range(300)}
        )  # a few hundred KiB of JSON
    process = subprocess.Popen(
        [sys.executable, "-m", "loaderx", "info", "--json", str(tmp_path / "arrays")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    process.stdout.read(10)
    process.stdout.close()  # the reader goes away, as head does after its lines
    try:
        status = process.wait(timeout=120)
        err = process.stderr.read().decode()
    finally:
        process.kill()
        process.stderr.close()
    assert status == 141 and err == "", (status, err)


def test_messages_count_in_the_singular_and_use_cli_flags(tmp_path):
    """ "1 arrays" is "1 array"; --records out of range names its range (2**40 ran out
    of memory with a traceback)."""
    with ArrayStore(tmp_path / "arrays") as store:
        store.save({"x": np.zeros(3)})
    status, out, _ = loaderx("info", tmp_path / "arrays")
    assert status == 0 and "ArrayStore, 1 array," in out
    status, out, err = loaderx("bench", "--records", 2**40)
    assert status == 2 and "--records must be in 256..262,144" in err


def test_convert_mode_a_mismatch_names_the_cli_flag(tmp_path):
    """Appending with another codec told a CLI user to "pass codec='raw'"; it names --codec."""
    np.save(tmp_path / "a.npy", np.arange(10.0))
    assert loaderx("convert", tmp_path / "a.npy", tmp_path / "ds", "--codec", "raw")[0] == 0
    status, _, err = loaderx(
        "convert", tmp_path / "a.npy", tmp_path / "ds", "--codec", "zstd", "--mode", "a"
    )
    assert status == 2 and "pass --codec raw" in err and "pass codec=" not in err


def test_convert_never_advises_an_unsafe_load(tmp_path):
    """`loaderx convert t.txt` passed on NumPy's advice to load with allow_pickle;
    a file without NumPy's header, or a .npy of Python objects, is named for what
    it is, and no advice to unpickle is given."""
    (tmp_path / "t.txt").write_text("hello\n")
    np.save(tmp_path / "objects.npy", np.array([{}, 1], dtype=object), allow_pickle=True)
    for source, words in (("t.txt", "not a .npy file"), ("objects.npy", "holds Python objects")):
        status, out, err = loaderx("convert", tmp_path / source, tmp_path / "out")
        assert (
            status == 2 and words in err and "allow_pickle" not in err and "pickle.load" not in err
        ), err
    assert not (tmp_path / "out").exists()
