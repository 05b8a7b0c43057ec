"""mypy --strict, as configured in pyproject.toml's [tool.mypy], is clean on
src/loaderx: the package ships py.typed, so its annotations are part of its
interface and a regression in them fails CI like any other test."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_py_typed_marker_is_shipped() -> None:
    # The marker must sit in the package and be listed as package data, or
    # type checkers treat an installed loaderx as untyped.
    assert (ROOT / "src" / "loaderx" / "py.typed").is_file()
    assert '"py.typed"' in (ROOT / "pyproject.toml").read_text()


def test_mypy_strict_is_clean(tmp_path: Path) -> None:
    pytest.importorskip("mypy", reason="mypy is in the [test] extra: pip install -e '.[test]'")
    # Run from the repository root so mypy reads pyproject.toml (strict, the
    # file list, the per-module settings); the cache goes to tmp_path so the
    # test leaves nothing behind and cannot pass on a stale cache.
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, "mypy --strict found errors:\n" + result.stdout + result.stderr
    assert "Success: no issues found" in result.stdout
