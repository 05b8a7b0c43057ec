"""The README's runnable examples keep working."""

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def test_quickstart_script_runs():
    """examples/quickstart.py (the README's first command) prints the batch shapes."""
    result = subprocess.run([sys.executable, str(ROOT / "examples" / "quickstart.py")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "data batch: (256, 32, 32, 3) uint8" in result.stdout
    assert "label batch: (256,) int64" in result.stdout


def python_blocks():
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def test_readme_quick_start_block_runs(tmp_path, monkeypatch):
    """The README's quick start block runs as written once its .npy files exist."""
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    np.save("data.npy", rng.random((1000, 8, 8), dtype=np.float32))
    np.save("label.npy", rng.integers(0, 10, 1000))
    block = next(b for b in python_blocks() if "from_numpy(\"train_data\"" in b)
    exec(compile(block, "README quick start", "exec"), {})
    assert os.path.exists("train_data/schema.msgpack")


def test_readme_dataset_and_store_blocks_run(tmp_path, monkeypatch):
    """The README's dataset and zrecord blocks run as written (after the quick start)."""
    monkeypatch.chdir(tmp_path)
    test_readme_quick_start_block_runs(tmp_path, monkeypatch)
    ragged = {"np": np}
    store = {}
    for block in python_blocks():
        if "RaggedDataset(\"tokens\")" in block:
            exec(compile(block, "README dataset block", "exec"), ragged)
        if "Zrecord(\"store\"" in block:
            exec(compile(block, "README zrecord block", "exec"), store)
    assert ragged["lengths"].tolist() == [3, 4]
    assert ragged["padded"].shape == (2, 4)
    assert store["lengths"].tolist() == [12, 5]


def test_readme_arraystore_block_runs(tmp_path, monkeypatch):
    """The README's ArrayStore block runs as written."""
    monkeypatch.chdir(tmp_path)
    block = next(b for b in python_blocks() if 'ArrayStore("arrays")' in b)
    namespace = {}
    exec(compile(block, "README ArrayStore block", "exec"), namespace)
    assert namespace["rows"].shape == (3, 10)
    assert namespace["store"].closed


def test_readme_variable_length_block_runs(tmp_path, monkeypatch):
    """The README's ragged / packing / mixing block runs as written."""
    monkeypatch.chdir(tmp_path)
    block = next(b for b in python_blocks() if "Packing(seq_len=2048)" in b)
    namespace = {}
    exec(compile(block, "README variable-length block", "exec"), namespace)
    assert namespace["padded"].shape[0] == 32 and namespace["first_epoch"] == 1000 // 32 - 1
    assert namespace["rows"]["tokens"].shape == (8, 2048)
    assert namespace["state"]["packing"]["strategy"] == "concat"
    assert set(namespace["sources"].tolist()) == {0, 1}
