"""The code rules hold on the tree, and each rule of the checker can fail.

`scripts/tidy.py` checks what the ecosystem's tools do not (function length, import cycles,
imports inside functions, private names across modules, status codes as numbers); `ruff` and
`zig fmt` check the rest. The tree test lists every violation in its failure message. Each rule
then gets a small synthetic tree (tmp_path, laid out like the repository) with one violation
that it must find, and the clean version of the same tree must pass, so no rule is vacuous.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "tidy.py"
TREE = ["src/loaderx", "tests", "scripts", "build_backend"]


def load_tidy():
    # Registered before it runs: dataclasses look their module up in sys.modules.
    spec = importlib.util.spec_from_file_location("loaderx_tidy", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["loaderx_tidy"] = module
    spec.loader.exec_module(module)
    return module


tidy = load_tidy()


def violations(root: Path, files: dict[str, str]) -> list[str]:
    """Lays `files` (path: text, dedented) under root and returns the violations as lines."""
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(textwrap.dedent(text).lstrip("\n"))
    return [str(violation) for violation in tidy.check(root).violations]


def rules(found: list[str]) -> list[str]:
    return [line.split(": ")[1] for line in found]


def test_the_tree_keeps_the_rules():
    found = tidy.check(REPO).violations
    counts = {rule: sum(v.rule == rule for v in found) for rule in tidy.RULES}
    listed = "\n".join(str(violation) for violation in found)
    assert not found, f"{len(found)} tidy violations {counts}:\n{listed}"


def python_function(name: str, lines: int) -> str:
    """A function of exactly `lines` lines, its docstring included."""
    body = "".join(f"    x{index} = {index}\n" for index in range(lines - 2))
    return f'def {name}():\n    """Doc."""\n{body}'


def zig_function(head: str, lines: int) -> str:
    body = "".join(f"    _ = {index};\n" for index in range(lines - 2))
    return f"{head} {{\n{body}}}\n"


def test_a_function_over_70_lines_is_found_in_both_languages(tmp_path):
    found = violations(
        tmp_path,
        {
            "src/loaderx/long.py": python_function("long", 71) + python_function("fits", 70),
            "tests/test_long.py": python_function("test_long", 71),
            "zig/long.zig": zig_function("fn long() void", 71) + zig_function("fn fits() void", 70),
            "build.zig": zig_function('test "a long test"', 71),
        },
    )
    assert found == [
        'build.zig:1: function-length: test "a long test" is 71 lines (max 70)',
        "src/loaderx/long.py:1: function-length: long is 71 lines (max 70)",
        "tests/test_long.py:1: function-length: test_long is 71 lines (max 70)",
        "zig/long.zig:1: function-length: long is 71 lines (max 70)",
    ]


def test_a_zig_signature_over_lines_with_an_error_set_ends_at_the_body_brace(tmp_path):
    # 3 lines of signature, 68 of body and the closing brace: 72 lines.
    head = "pub fn split(\n    a: u32,\n) error{ Bad, Worse }!void"
    source = zig_function(head, 70) + 'extern "c" fn puts(text: [*:0]const u8) c_int;\n'
    found = violations(tmp_path, {"zig/split.zig": source})
    assert found == ["zig/split.zig:1: function-length: split is 72 lines (max 70)"]


def test_a_line_over_100_columns_is_found_in_both_languages(tmp_path):
    fits = "x = '" + "a" * 94 + "'\n"
    found = violations(
        tmp_path,
        {
            "scripts/wide.py": fits + fits.replace("'a", "'aa"),
            "zig/wide.zig": "// " + "é" * 97 + "\n// " + "é" * 98 + "\n",
        },
    )
    assert found == [
        "scripts/wide.py:2: line-length: 101 columns (max 100)",
        "zig/wide.zig:2: line-length: 101 columns (max 100)",
    ]


def test_a_python_import_cycle_is_found_at_module_level_only(tmp_path):
    files = {
        "src/loaderx/__init__.py": "",
        "src/loaderx/a.py": "from . import b\n",
        "src/loaderx/b.py": "from loaderx.a import thing\n",
    }
    assert rules(violations(tmp_path, files)) == ["import-cycle"]
    assert violations(tmp_path, {}) == [
        "src/loaderx/a.py:1: import-cycle: loaderx.a -> loaderx.b -> loaderx.a"
    ]
    typed = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import thing\n"
    assert violations(tmp_path, {"src/loaderx/b.py": typed}) == []
    report = tidy.check(tmp_path)
    assert report.python_graph["loaderx.a"] == {"loaderx.b": 1}
    assert report.python_graph["loaderx.b"] == {}


def test_a_zig_import_cycle_is_found_outside_test_blocks(tmp_path):
    files = {
        "zig/a.zig": 'const b = @import("b.zig");\n',
        "zig/b.zig": 'const std = @import("std");\nconst a = @import("a.zig");\n',
    }
    assert violations(tmp_path, files) == [
        "zig/a.zig:1: import-cycle: zig/a.zig -> zig/b.zig -> zig/a.zig"
    ]
    in_test = 'test "b uses a" {\n    const a = @import("a.zig");\n    _ = a;\n}\n'
    simulated = 'const storage = @import("testing/storage.zig");\n'
    clean = {
        "zig/b.zig": in_test + simulated,
        "zig/testing/storage.zig": 'const b = @import("../b.zig");\n',
    }
    assert violations(tmp_path, clean) == []
    assert tidy.check(tmp_path).zig_graph["zig/testing/storage.zig"] == {"zig/b.zig": 1}


def test_an_import_inside_a_function_in_the_package_is_found_unless_marked(tmp_path):
    source = """
        def load():
            import json
            # optional dependency
            import pyarrow
            import torch  # optional dependency
            return json, pyarrow, torch
    """
    found = violations(tmp_path, {"src/loaderx/lazy.py": source, "tests/test_lazy.py": source})
    assert found == [
        "src/loaderx/lazy.py:2: import-in-function: `import json` inside a function "
        "(mark an optional one `# optional dependency`)"
    ]


def test_a_private_name_taken_from_another_module_of_the_package_is_found(tmp_path):
    files = {
        "src/loaderx/__init__.py": "",
        "src/loaderx/_fs.py": "def replace(): ...\ndef _raw(): ...\n",
        "src/loaderx/x.py": "_y = 1\nz = 2\n",
        "src/loaderx/use.py": """
            import loaderx
            from . import _fs, x
            from .x import __doc__, _y, z
            from loaderx.x import _y as y

            _fs.replace()
            _fs._raw()
            x._y
            loaderx._fs._raw()
        """,
        "tests/test_use.py": "from loaderx.x import _y\nfrom loaderx import _fs\n_fs._raw()\n",
    }
    found = violations(tmp_path, files)
    assert [line.split(": ", 2)[0] for line in found] == [
        f"src/loaderx/use.py:{line}" for line in (3, 4, 7, 8, 9)
    ]
    assert set(rules(found)) == {"private-import"}
    assert "`_fs._raw` is private to loaderx._fs" in found[2]
    assert "`loaderx._fs._raw` is private to loaderx._fs" in found[4]


def test_a_status_code_written_as_a_number_is_found_outside_the_tables(tmp_path):
    errors = """
        class ZrecordError(RuntimeError): ...
        class StoreLockedError(ZrecordError): ...
        LOCKED = 6
    """
    use = """
        from ._native import LOCKED, StoreLockedError

        def fail(exc, status):
            if exc.code == 6 or 6 != status or status in (6, 7) or exc.code == LOCKED:
                raise StoreLockedError("locked", 6)
            raise StoreLockedError("locked", code=LOCKED)
    """
    zig = """
        export fn lx_one() c_int {
            return 0;
        }
        export fn lx_two() c_int {
            return @intFromEnum(status.Code.ok);
        }
        fn count() u32 {
            return 3;
        }
    """
    files = {
        "src/loaderx/_native.py": errors + use.replace("from ._native import", "#"),
        "src/loaderx/use.py": use,
        "zig/status.zig": zig,
        "zig/root.zig": zig,
    }
    found = violations(tmp_path, files)
    assert [line.split(": ", 2)[0] for line in found] == [
        "src/loaderx/use.py:4",
        "src/loaderx/use.py:4",
        "src/loaderx/use.py:4",
        "src/loaderx/use.py:5",
        "zig/root.zig:2",
    ]
    assert set(rules(found)) == {"status-number"}


def test_a_clean_tree_passes_and_exits_0(tmp_path, capsys):
    files = {
        "src/loaderx/__init__.py": '"""A package."""\nfrom .a import thing\n',
        "src/loaderx/a.py": '"""A module."""\nfrom . import _fs\n\nthing = _fs.replace\n',
        "src/loaderx/_fs.py": "def replace():\n    return 1\n",
        "tests/test_a.py": "from loaderx.a import thing\nfrom loaderx._fs import _raw\n",
        "zig/store.zig": 'const io = @import("io.zig");\nfn a() void {\n    assert(true);\n}\n',
        "zig/io.zig": "pub fn read() void {}\n",
        "build.zig": 'pub fn build() void {\n    const text = "{";\n    _ = text;\n}\n',
    }
    assert violations(tmp_path, files) == []
    assert tidy.main(["--root", str(tmp_path)]) == 0
    assert capsys.readouterr().out == ""


def test_the_report_exits_1_and_the_summary_counts(tmp_path, capsys):
    store = (
        'const assert = @import("std").debug.assert;\n'
        "fn a(x: u32) void {\n    assert(x > 0);\n    assert(x < 9); // assert(\n}\n"
        "fn b() void {}\n"
        'test "a" {\n    assert(true);\n}\n'
    )
    violations(tmp_path, {"zig/store.zig": store, "zig/fresh.zig": "fn c() void {}\n"})
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "bad.py").write_text("x = 1" + " " * 100 + "\n")
    assert tidy.main(["--root", str(tmp_path)]) == 1
    assert capsys.readouterr().out == "scripts/bad.py:1: line-length: 105 columns (max 100)\n"
    assert tidy.main(["--root", str(tmp_path), "--summary"]) == 1
    out = capsys.readouterr().out
    assert re.search(r"^line-length +1 \(1, 0\)$", out, re.MULTILINE), out
    assert re.search(r"^zig/store.zig +2 / +2 = 1.00$", out, re.MULTILINE), out
    assert re.search(r"^zig/fresh.zig +0 / +1 = 0.00$", out, re.MULTILINE), out
    assert "## import cycles (zig): 0" in out


def test_the_checker_runs_as_a_script():
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--summary"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode in (0, 1), result.stderr
    assert "## the 10 longest functions (zig)" in result.stdout


def tool(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(
            f"{module} is not installed (it is in the `test` extra: pip install -e .[test])"
        )


def run(command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)


def test_ruff_check_passes():
    tool("ruff")
    result = run([sys.executable, "-m", "ruff", "check", "--output-format", "concise", *TREE])
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_leaves_every_file_as_it_is():
    tool("ruff")
    command = [sys.executable, "-m", "ruff", "format", "--check", "--output-format", "concise"]
    result = run([*command, *TREE])
    assert result.returncode == 0, result.stdout + result.stderr


def test_zig_fmt_leaves_every_file_as_it_is():
    tool("ziglang")
    result = run([sys.executable, "-m", "ziglang", "fmt", "--check", "zig", "build.zig"])
    assert result.returncode == 0, f"zig fmt would change:\n{result.stdout}{result.stderr}"
