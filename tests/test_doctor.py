"""loaderx doctor names the stage that bounds the loader: on a dataset built
to be disk-bound (cold reads), one built to be decode-bound (zstd) and one
with a slow Python transform."""

import json
import os
import sys
import textwrap

import numpy as np
import pytest

from loaderx import ArrayStore, from_iterator, from_numpy
from loaderx.cli import main

SECONDS = "1"


def doctor(capsys, *args):
    status = main(["doctor", *args, "--json"])
    out = capsys.readouterr().out
    result = json.loads(out)
    if status == 0:  # the stages split the workers' time, no more and no less
        split = sum(result["stages_ms"].values())
        assert split == pytest.approx(result["run"]["worker_ms_per_batch"], rel=0.01, abs=0.01)
    return status, result


def file_system(path):
    """The type of the file system holding ``path`` (from /proc/self/mountinfo)."""
    best, kind = "", ""
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            fields = line.split()
            mount = fields[4]
            separator = fields.index("-")
            if (str(path) + "/").startswith(mount.rstrip("/") + "/") and len(mount) >= len(best):
                best, kind = mount, fields[separator + 1]
    return kind


def compressible_rows(count):
    grid = np.linspace(0, 1, 3072, dtype=np.float32)
    frequency = np.random.default_rng(0).uniform(1, 8, (count, 1)).astype(np.float32)
    rows = np.sin(frequency * grid * np.float32(2 * np.pi))
    return (np.round(rows * 256) / 256).astype(np.float32)


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="needs Linux's /proc/self/io")
def test_cold_reads_are_disk_bound(tmp_path, capsys):
    """64 MiB of raw 16 KiB records, every page dropped before each batch:
    the reads from disk dominate."""
    if file_system(tmp_path) in ("tmpfs", "ramfs"):
        pytest.skip(f"{tmp_path} is on {file_system(tmp_path)}: no page cache to drop")
    rows = np.random.default_rng(0).random((4096, 4096), dtype=np.float32)
    from_numpy(tmp_path / "d", rows, codec="raw", progress=False)
    del rows
    status, result = doctor(
        capsys, str(tmp_path / "d"), "--cold", "--batch-size", "64", "--workers", "2",
        "--seconds", SECONDS,
    )  # fmt: skip
    assert status == 0
    assert result["verdict"] == "disk", result
    assert result["run"]["disk_read_mib_s"] > 0
    assert result["ceilings_mib_s"]["disk_random_4k"] > 0
    assert "Page-cache misses" in result["advice"]
    assert result["summary"].startswith("disk-bound: ")


def test_zstd_of_compressible_floats_is_decode_bound(tmp_path, capsys):
    """zstd over compressible float32 records and no transform: decoding dominates."""
    from_numpy(tmp_path / "z", compressible_rows(2048), codec="zstd", progress=False)
    status, result = doctor(capsys, str(tmp_path / "z"), "--workers", "2", "--seconds", SECONDS)
    assert status == 0
    assert result["verdict"] == "decode", result
    assert result["codec"] == "zstd"
    assert result["ceilings_mib_s"]["decode"] < result["ceilings_mib_s"]["memory_copy"]
    assert "auto-speed" in result["advice"]
    assert result["stages_share"]["decode"] == max(result["stages_share"].values())


def test_a_slow_python_transform_is_transform_bound(tmp_path, capsys, monkeypatch):
    """A pure-Python loop as the transform over small raw records: the transform dominates."""
    (tmp_path / "slow_transform.py").write_text(
        textwrap.dedent(
            """
            def slow(batch):
                total = 0
                for number in range(100_000):
                    total += number
                return batch
            """
        )
    )
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.chdir(tmp_path)
    rows = np.random.default_rng(0).random((2048, 64), dtype=np.float32)
    from_numpy(tmp_path / "t", rows, codec="raw", progress=False)
    status, result = doctor(
        capsys, "t", "--transform", "slow_transform:slow", "--batch-size", "64",
        "--workers", "2", "--seconds", SECONDS,
    )  # fmt: skip
    assert status == 0
    assert result["verdict"] == "transform", result
    assert result["stages_share"]["gather"] < 0.2  # its wait for the GIL counts with the transform
    assert result["loader"]["transform"] is True
    assert "transform_processes=True" in result["advice"]


def test_text_report_has_the_table_and_the_verdict(tmp_path, capsys):
    from_numpy(tmp_path / "z", compressible_rows(512), codec="zstd", progress=False)
    assert main(["doctor", str(tmp_path / "z"), "--seconds", "0.2", "--batch-size", "32"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith(f"dataset {tmp_path / 'z'}: 512 records, codec zstd")
    header = next(number for number, line in enumerate(lines) if line.startswith("stage"))
    assert [line.split()[0] for line in lines[header + 1 : header + 5]] == [
        "disk", "decode", "gather", "transform",
    ]  # fmt: skip
    assert any(line.startswith("verdict: ") and "-bound: " in line for line in lines)
    assert any(line.startswith("advice: ") for line in lines)


def test_a_ragged_dataset_is_diagnosed(tmp_path, capsys):
    """Ragged records are gathered as the loader gathers them (a RaggedBatch)."""
    rng = np.random.default_rng(0)
    documents = [rng.integers(0, 100, rng.integers(1, 300), dtype=np.int32) for _ in range(500)]
    from_iterator(tmp_path / "r", documents, codec="zstd", progress=False)
    status, result = doctor(capsys, str(tmp_path / "r"), "--seconds", "0.2", "--mode", "cyclic")
    assert status == 0
    assert result["codec"] == "zstd" and result["records"] == 500
    assert result["verdict"] in ("disk", "decode", "gather", "transform")
    assert result["run"]["mib_s"] > 0


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--seconds", "0"], "--seconds must be in (0, 600]"),
        (["--transform", "nocolon"], "--transform must be MODULE:FUNCTION"),
        (["--transform", "no_such_module_xyz:f"], "cannot import 'no_such_module_xyz'"),
        (["--transform", "json:no_such_function"], "json has no function 'no_such_function'"),
        (["--transform-processes"], "--transform-processes needs --transform"),
        (["--workers", "-1"], "num_workers must be in 0..1,024"),
    ],
)
def test_bad_arguments_fail_with_a_message(tmp_path, capsys, arguments, message):
    from_numpy(tmp_path / "z", compressible_rows(64), codec="zstd", progress=False)
    status, result = doctor(capsys, str(tmp_path / "z"), "--seconds", "0.1", *arguments)
    assert status == 2
    assert message in result["error"]


def test_a_failing_transform_is_reported(tmp_path, capsys, monkeypatch):
    (tmp_path / "bad_transform.py").write_text("def bad(batch):\n    raise KeyError('label')\n")
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.chdir(tmp_path)
    from_numpy(tmp_path / "z", compressible_rows(64), codec="zstd", progress=False)
    status, result = doctor(capsys, "z", "--transform", "bad_transform:bad", "--seconds", "0.1")
    assert status == 2
    assert "the loader failed while the doctor ran it" in result["error"]
    assert "transform raised KeyError" in result["error"]


def test_an_arraystore_is_refused_with_advice(tmp_path, capsys):
    with ArrayStore(tmp_path / "a") as store:
        store.save({"x": np.zeros((4, 2), np.float32)})
    status, result = doctor(capsys, str(tmp_path / "a"))
    assert status == 2
    assert "an ArrayStore's arrays are dense datasets" in result["error"]
