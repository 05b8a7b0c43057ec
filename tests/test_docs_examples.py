"""Every Python block of README.md and docs/ runs as written, and prints what it says.

Conventions (docs/architecture.md, "Documentation that cannot rot"):
- each ```python block runs on its own, in a fresh namespace and an empty
  temporary directory;
- a line ending in ``# prints: TEXT`` promises the printed line TEXT: the
  lines a block prints must equal, in order, the ``# prints:`` texts of its
  lines (a block without any must print nothing);
- a block importing an optional extra (torch, jax, ray, pyarrow, datasets)
  is skipped, naming the module, where that module is not installed;
- a block preceded by ``<!-- docs-test: skip REASON -->`` is skipped with
  that reason, and counted.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import io
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OPTIONAL = ("torch", "jax", "ray", "pyarrow", "datasets", "prometheus_client")
SKIP_MARKER = re.compile(r"^<!-- docs-test: skip (.+?) -->$")
PRINTS = re.compile(r"#\s*prints:\s?(.*)$")
BLOCKS_MAX = 1000  # far above today's count: bounds the scan of a page


def pages() -> list[Path]:
    return [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))


def blocks_of(page: Path) -> list[dict]:
    """The ```python blocks of one page: line number, source, skip reason."""
    lines = page.read_text().split("\n")
    found: list[dict] = []
    fence = None
    for number, line in enumerate(lines, start=1):
        stripped = line.strip()
        if fence is None and stripped.startswith("```"):
            info = stripped[3:].strip()
            fence = {"info": info, "start": number, "body": []}
            previous = next(
                (text.strip() for text in reversed(lines[: number - 1]) if text.strip()), ""
            )
            marker = SKIP_MARKER.match(previous)
            fence["skip"] = marker.group(1) if marker else None
        elif fence is not None and stripped == "```":
            if fence["info"] == "python":
                found.append(fence)
            fence = None
        elif fence is not None:
            fence["body"].append(line)
        assert len(found) <= BLOCKS_MAX
    assert fence is None, f"{page}: a code fence opened at line {fence['start']} is never closed"
    for block in found:
        block["source"] = "\n".join(block["body"]) + "\n"
        block["id"] = f"{page.relative_to(ROOT)}:{block['start']}"
    return found


def all_blocks() -> list[dict]:
    return [block for page in pages() for block in blocks_of(page)]


def needed_extras(source: str) -> list[str]:
    """The optional modules a block imports."""
    modules = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.add(node.module.split(".")[0])
        if isinstance(node, ast.ImportFrom) and node.module in ("loaderx.arrow", "loaderx.ray"):
            modules.add("pyarrow" if node.module == "loaderx.arrow" else "ray")
    return sorted(modules & set(OPTIONAL))


def expected_prints(source: str) -> list[str]:
    return [
        match.group(1).rstrip() for line in source.split("\n") if (match := PRINTS.search(line))
    ]


BLOCKS = all_blocks()


@pytest.mark.parametrize("block", BLOCKS, ids=[block["id"] for block in BLOCKS])
def test_block_runs_and_prints_what_it_says(block, tmp_path, monkeypatch):
    """One documentation block runs in an empty directory and prints exactly its `# prints:`
    lines."""
    if block["skip"]:
        pytest.skip(f"marked in the page: {block['skip']}")
    for module in needed_extras(block["source"]):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"needs {module} (an optional extra), which is not installed")
    monkeypatch.chdir(tmp_path)
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            exec(compile(block["source"], block["id"], "exec"), {"__name__": "__docs__"})
    finally:
        _stop_ray()
    lines = [line.rstrip() for line in printed.getvalue().splitlines()]
    assert lines == expected_prints(block["source"]), f"{block['id']} printed {lines}"


def _stop_ray() -> None:
    """A Ray block starts a local cluster; stop it so the next block starts clean."""
    ray = sys.modules.get("ray")
    if ray is not None and getattr(ray, "is_initialized", lambda: False)():
        ray.shutdown()


def test_every_block_is_counted():
    """The docs hold the examples this suite expects, and every skip marker names a reason.

    It prints the counts, so a CI log shows how many blocks ran and why any did not."""
    marked = [block for block in BLOCKS if block["skip"]]
    commands = sum(len(re.findall(r"^```(?:sh|bash)$", page.read_text(), re.M)) for page in pages())
    extras = [block for block in BLOCKS if not block["skip"] and needed_extras(block["source"])]
    print(
        f"{len(BLOCKS)} python blocks in README.md and docs/: {len(marked)} marked not to run, "
        f"{len(extras)} need an optional extra "
        f"({', '.join(sorted({m for b in extras for m in needed_extras(b['source'])}))}); "
        f"{commands} shell blocks (commands, such as a torchrun launch) are not executed"
    )
    assert len(BLOCKS) >= 20
    pages_with_blocks = {block["id"].split(":")[0] for block in BLOCKS}
    for page in (
        "README.md",
        "docs/getting-started/dense.md",
        "docs/getting-started/tokens.md",
        "docs/getting-started/arrays.md",
        "docs/guides/dataloader.md",
    ):
        assert page in pages_with_blocks, page


def test_no_python_block_hides_under_another_fence_name():
    """Only ```python counts as Python: a ```py or ```python3 block would escape the runner."""
    for page in pages():
        for number, line in enumerate(page.read_text().split("\n"), start=1):
            info = line.strip()[3:].strip() if line.strip().startswith("```") else ""
            assert info.split(" ")[0] not in ("py", "python3", "pycon", "Python") and not (
                info.startswith("python") and info != "python"
            ), f"{page}:{number}: use a plain ```python fence"


def test_prints_convention_fails_on_a_wrong_promise(tmp_path, monkeypatch):
    """The runner's output check can fail: a block that prints something else than it promises is
    caught."""
    block = {"id": "synthetic:1", "skip": None, "source": 'print("one")  # prints: two\n'}
    with pytest.raises(AssertionError, match="printed"):
        test_block_runs_and_prints_what_it_says(block, tmp_path, monkeypatch)


def test_blocks_needing_an_extra_are_recognised():
    """A block importing an optional extra (directly or through loaderx.arrow / loaderx.ray) is
    known to need it, so it skips with that reason where the extra is missing instead of
    failing."""
    assert needed_extras("import numpy as np\nfrom loaderx import DataLoader\n") == []
    assert needed_extras("from loaderx.arrow import from_arrow\n") == ["pyarrow"]
    assert needed_extras("import ray\nfrom loaderx.ray import write_dataset\n") == ["ray"]
    assert needed_extras("import torch.distributed as dist\nimport jax.numpy as jnp\n") == [
        "jax",
        "torch",
    ]
