"""The README's and the docs' runnable examples keep working, with the values they show.

Every block also runs on its own in tests/test_docs_examples.py; these tests
check what particular blocks leave behind."""

import builtins
import re
import subprocess
import sys
from pathlib import Path

from loaderx import DenseDataset

ROOT = Path(__file__).resolve().parent.parent


def test_quickstart_script_runs():
    """examples/quickstart.py (the README's first command) prints the batch shapes."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "data batch: (256, 32, 32, 3) uint8" in result.stdout
    assert "label batch: (256,) int64" in result.stdout


def documentation_text():
    """README.md and every page of the docs site, one string."""
    pages = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))
    return "\n".join(page.read_text() for page in pages)


def python_blocks():
    return re.findall(r"```python\n(.*?)```", documentation_text(), re.S)


def readme_blocks():
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def test_readme_quick_start_block_runs(tmp_path, monkeypatch):
    """The README's quick start block runs as written, twice in a row, and the
    second run replaces the stores instead of doubling them."""
    monkeypatch.chdir(tmp_path)
    block = next(b for b in readme_blocks() if 'from_numpy("train_data"' in b)
    for _ in range(2):
        namespace = {}
        exec(compile(block, "README quick start", "exec"), namespace)
        assert namespace["batch"]["data"].shape == (256, 8, 8)
    with DenseDataset("train_data") as data, DenseDataset("train_label") as label:
        assert len(data) == len(label) == 1000


def test_the_exceptions_the_docs_name_import_from_loaderx():
    """Every error class the README and the docs name is importable from the top level, in the right
    family."""
    import loaderx

    named = set(re.findall(r"`(\w+Error)`", documentation_text())) - set(dir(builtins))
    named -= {
        "CommandError"
    }  # the CLI's own, turned into its exit status 2: it never reaches a caller
    named -= {
        "EnvelopeError"
    }  # _envelope's, turned into each metadata file's own error: never reaches a caller
    assert {"LoaderError", "StoreLockedError", "ChecksumError"} <= named
    for name in named:
        cls = getattr(loaderx, name)
        assert name in loaderx.__all__
        assert issubclass(cls, Exception), name
        if cls.__module__ in (
            "loaderx._native",
            "loaderx.zrecord",
        ):  # the store's errors are one family
            assert issubclass(cls, loaderx.ZrecordError), name
    assert issubclass(loaderx.LoaderError, RuntimeError)


def test_readme_dataset_and_store_blocks_run(tmp_path, monkeypatch):
    """The datasets guide's and the Zrecord guide's blocks run as written (after the README quick
    start)."""
    monkeypatch.chdir(tmp_path)
    test_readme_quick_start_block_runs(tmp_path, monkeypatch)
    ragged = {}
    store = {}
    for block in python_blocks():
        if 'RaggedDataset("tokens")' in block:
            exec(compile(block, "README dataset block", "exec"), ragged)
        if 'Zrecord("store"' in block:
            exec(compile(block, "README zrecord block", "exec"), store)
    assert ragged["lengths"].tolist() == [3, 4]
    assert ragged["padded"].shape == (2, 4)
    assert store["lengths"].tolist() == [12, 5]


def test_readme_arraystore_block_runs(tmp_path, monkeypatch):
    """The ArrayStore guide's block runs as written."""
    monkeypatch.chdir(tmp_path)
    block = next(b for b in python_blocks() if 'ArrayStore("arrays")' in b and "stream_load" in b)
    namespace = {}
    exec(compile(block, "README ArrayStore block", "exec"), namespace)
    assert namespace["rows"].shape == (3, 10)
    assert namespace["store"].closed


def test_readme_variable_length_block_runs(tmp_path, monkeypatch):
    """The DataLoader guide's ragged / packing / mixing block runs as written."""
    monkeypatch.chdir(tmp_path)
    block = next(b for b in python_blocks() if "Packing(seq_len=2048)" in b and "first_epoch" in b)
    namespace = {}
    exec(compile(block, "README variable-length block", "exec"), namespace)
    assert namespace["padded"].shape[0] == 32 and namespace["first_epoch"] == 1000 // 32 - 1
    assert namespace["rows"]["tokens"].shape == (8, 2048)
    assert namespace["state"]["packing"]["strategy"] == "concat"
    assert set(namespace["sources"].tolist()) == {0, 1}
