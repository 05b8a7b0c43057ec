"""scripts/tidy.py: the code rules of loaderx, checked rather than hoped for.

One concept: a list of rule violations in the tree, each `path:line: rule: detail`, computed
from the source alone (the standard library only: Python through `ast`, Zig through line rules
on `fn`/`test` declarations and brace depth). Invariant: the same tree always gives the same
list, in path and line order, and `tests/test_tidy.py` holds main to an empty one.

    python scripts/tidy.py             the violations; exit status 1 when there is any
    python scripts/tidy.py --summary   counts per rule, longest functions, import graphs and
                                       cycles (and the Python cycles that imports inside
                                       functions hide), asserts per function in the Zig
                                       store files; exit status as above

Files: src/loaderx/**.py, scripts/*.py, tests/*.py, build_backend/*.py; zig/**.zig, build.zig
(less src/loaderx/_ffi.py, which the native build writes).

The rules (what each one decides, where the brief left it open):

function-length     a function over 70 lines. Python: from the `def` line (decorators not
                    counted) to its last line, docstring included; a nested function counts on
                    its own and inside its parent. Zig: from the `fn` line to its closing brace;
                    a `test` block counts as a function too, since a reader has to see a test
                    whole as much as the code it proves; a declaration without a body
                    (`extern fn`) is none, and a method of a struct declared inside a function
                    counts on its own and inside the function.
line-length         a line over 100 columns (characters, not bytes), comments and Zig multiline
                    strings included.
import-cycle        a cycle in the import graph. Python: the module-level imports inside
                    src/loaderx (relative ones resolved; those under `if TYPE_CHECKING:` and
                    inside functions left out: the first never run, the second are the rule
                    below). Zig: the `@import("x.zig")` edges between files, leaving out those
                    inside `test` blocks and the imports of `zig/testing/` from files outside
                    it (the simulated storage is compiled into test builds only).
import-in-function  an `import` statement inside a function in src/loaderx, unless its line or
                    the line before says `# optional dependency` (`importlib.import_module`
                    calls are not looked at).
private-import      in src/loaderx: a private name (one leading underscore, not a dunder)
                    imported from another module of the package, or read as `module._name`
                    from an imported loaderx module. Private *modules* (`loaderx._fs`) are fine.
status-number       a native status code written as a number outside the one table. Python
                    (src/loaderx less `_native.py`, the table): a ZrecordError subclass built
                    with an integer literal as its second argument (or `code=`), and `.code`,
                    `code` or `status` compared with integer literals (==, !=, in, not in).
                    Zig (zig/ less `status.zig`, whose `Code` enum is the table): `return <int>;`
                    in a function declared to return `c_int`, the C ABI's status type (0, "ok",
                    included: it is `Code.ok`).
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

FUNCTION_LINES_MAX = 70
LINE_COLUMNS_MAX = 100
PACKAGE = "loaderx"
OPTIONAL_MARK = "# optional dependency"
PYTHON_PATTERNS = (
    "src/loaderx/**/*.py",
    "scripts/*.py",
    "tests/*.py",
    "build_backend/*.py",
)
ZIG_PATTERNS = ("zig/**/*.zig", "build.zig")
# Written by the native build (cffi's parsed cdef), not by hand.
GENERATED = frozenset({"src/loaderx/_ffi.py"})
PYTHON_STATUS_TABLE = "src/loaderx/_native.py"
ZIG_STATUS_TABLE = "zig/status.zig"
ZIG_TESTING = "zig/testing/"
ERROR_BASE = "ZrecordError"
# The store files whose asserts per function the summary lists, and the Zig files there were
# when this checker was written: any other file under zig/ is new, and listed too.
STORE_FILES = (
    "store",
    "commit",
    "fixed",
    "indexed",
    "journal",
    "superblock",
    "plans",
    "snapshot",
)
ZIG_FILES_BEFORE = frozenset(
    {
        "codec",
        "commit",
        "encode",
        "fixed",
        "format",
        "indexed",
        "integrity",
        "io",
        "journal",
        "plans",
        "ragged",
        "read",
        "root",
        "sampler",
        "shards",
        "shuffle",
        "snapshot",
        "status",
        "store",
        "superblock",
        "workers",
        "zstd",
    }
)
RULES = (
    "function-length",
    "line-length",
    "import-cycle",
    "import-in-function",
    "private-import",
    "status-number",
)


@dataclass(frozen=True, order=True)
class Violation:
    path: str
    line: int
    rule: str
    detail: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.rule}: {self.detail}"


@dataclass(frozen=True)
class Function:
    path: str
    line: int
    name: str
    lines: int


@dataclass
class Report:
    violations: list[Violation] = field(default_factory=list)
    functions: dict[str, list[Function]] = field(default_factory=lambda: {"python": [], "zig": []})
    # module -> {imported module: line of the first import}
    python_graph: dict[str, dict[str, int]] = field(default_factory=dict)
    # the same with the imports inside functions added: the cycles they hide
    python_deferred: dict[str, dict[str, int]] = field(default_factory=dict)
    python_hidden_cycles: list[list[str]] = field(default_factory=list)
    zig_graph: dict[str, dict[str, int]] = field(default_factory=dict)
    python_cycles: list[list[str]] = field(default_factory=list)
    zig_cycles: list[list[str]] = field(default_factory=list)
    # Zig file -> (assert calls, fn definitions), test blocks left out
    asserts: dict[str, tuple[int, int]] = field(default_factory=dict)


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def files(root: Path, patterns: Iterable[str]) -> list[str]:
    found = {
        path.relative_to(root).as_posix()
        for pattern in patterns
        for path in root.glob(pattern)
        if path.is_file()
    }
    return sorted(found - GENERATED)


def line_lengths(path: str, lines: list[str]) -> Iterator[Violation]:
    for number, text in enumerate(lines, 1):
        if len(text) > LINE_COLUMNS_MAX:
            detail = f"{len(text)} columns (max {LINE_COLUMNS_MAX})"
            yield Violation(path, number, "line-length", detail)


def long_functions(functions: Iterable[Function]) -> Iterator[Violation]:
    for function in functions:
        if function.lines > FUNCTION_LINES_MAX:
            detail = f"{function.name} is {function.lines} lines (max {FUNCTION_LINES_MAX})"
            yield Violation(function.path, function.line, "function-length", detail)


def find_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The import cycles: in each strongly connected component of more than one node (or a
    node importing itself), a shortest cycle through each of its nodes, rotated to start at
    its least node and without repeats. Tarjan's algorithm, iterative so that a deep graph
    cannot hit the recursion limit."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, {}))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    components.append(pop_component(node, stack, on_stack))
                continue
            if child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.get(child, {})))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    cycles: set[tuple[str, ...]] = set()
    for component in components:
        if len(component) == 1 and component[0] not in graph.get(component[0], {}):
            continue
        for member in sorted(component):
            cycle = cycle_through(member, set(component), graph)[:-1]
            least = cycle.index(min(cycle))
            rotated = cycle[least:] + cycle[:least]
            cycles.add((*rotated, rotated[0]))
    return sorted(list(cycle) for cycle in cycles)


def pop_component(node: str, stack: list[str], on_stack: set[str]) -> list[str]:
    component = []
    while True:
        member = stack.pop()
        on_stack.discard(member)
        component.append(member)
        if member == node:
            return component


def cycle_through(start: str, members: set[str], graph: dict[str, dict[str, int]]) -> list[str]:
    """A shortest cycle from `start` back to it inside its component (breadth first)."""
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph.get(node, {})):
                if child not in members:
                    continue
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return [*reversed(path), start]
                if child not in parents:
                    parents[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"{start} is in a strongly connected component but on no cycle")


def cycle_violations(
    cycles: list[list[str]], graph: dict[str, dict[str, int]], path_of: dict[str, str]
) -> Iterator[Violation]:
    for cycle in cycles:
        first, second = cycle[0], cycle[1] if len(cycle) > 1 else cycle[0]
        line = graph[first].get(second, 1)
        yield Violation(path_of[first], line, "import-cycle", " -> ".join(cycle))


# ---- Python ------------------------------------------------------------------------------


@dataclass
class PythonModule:
    """What the checker knows of one module of the package."""

    name: str
    path: str
    tree: ast.Module
    lines: list[str]
    is_package: bool
    # every node, walked once: the rules that read expressions share the walk
    nodes: list[ast.AST] = field(default_factory=list)
    # every import with (is it inside a function, is it under `if TYPE_CHECKING:`)
    imports: list[tuple[ast.Import | ast.ImportFrom, bool, bool]] = field(default_factory=list)


# The fields that hold statements: functions, classes and imports are statements, so the
# walks that look for them skip expressions, most of a tree.
STATEMENT_FIELDS = ("body", "orelse", "finalbody", "handlers", "cases")


def child_statements(node: ast.AST) -> Iterator[ast.AST]:
    for name in STATEMENT_FIELDS:
        for child in getattr(node, name, ()):
            if isinstance(child, (ast.stmt, ast.excepthandler, ast.match_case)):
                yield child


def python_functions(path: str, tree: ast.Module) -> list[Function]:
    found = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in child_statements(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                lines = (child.end_lineno or child.lineno) - child.lineno + 1
                found.append(Function(path, child.lineno, name, lines))
                visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def module_name(path: str) -> tuple[str, bool]:
    """The dotted name of a file under src/, and whether it is a package's `__init__`."""
    parts = list(Path(path).relative_to("src").with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    if is_package:
        parts.pop()
    return ".".join(parts), is_package


def import_base(node: ast.ImportFrom, module: PythonModule) -> str:
    if node.level == 0:
        return node.module or ""
    parts = module.name.split(".")
    if not module.is_package:
        parts.pop()
    if node.level > 1:
        parts = parts[: len(parts) - (node.level - 1)]
    return ".".join([*parts, node.module] if node.module else parts)


def in_package(name: str) -> bool:
    return name == PACKAGE or name.startswith(PACKAGE + ".")


def import_targets(
    node: ast.Import | ast.ImportFrom, module: PythonModule, modules: set[str]
) -> list[tuple[str, str | None, str, str | None]]:
    """For each alias of an import that reaches into the package: the module imported, the
    name taken from it (None for the module itself), the local name bound, and the module
    that local name is bound to (None when it is bound to a name, not a module)."""
    targets: list[tuple[str, str | None, str, str | None]] = []
    if isinstance(node, ast.Import):
        for alias in node.names:
            if in_package(alias.name):
                top = alias.name.partition(".")[0]
                bound = alias.name if alias.asname else top
                targets.append((alias.name, None, alias.asname or top, bound))
        return targets
    base = import_base(node, module)
    if not in_package(base):
        return targets
    for alias in node.names:
        local = alias.asname or alias.name
        submodule = f"{base}.{alias.name}"
        if submodule in modules:
            targets.append((submodule, None, local, submodule))
        else:
            targets.append((base, alias.name, local, None))
    return targets


def is_type_checking(node: ast.AST) -> bool:
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def walk_imports(
    node: ast.AST, in_function: bool = False, type_checking: bool = False
) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool, bool]]:
    """Every import with (is it inside a function, is it under `if TYPE_CHECKING:`); the
    `else:` of such an `if` runs, so its imports count as usual."""
    for child in child_statements(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child, in_function, type_checking
        elif is_type_checking(child):
            assert isinstance(child, ast.If)
            yield from walk_imports(ast.Module(child.body, []), in_function, True)
            yield from walk_imports(ast.Module(child.orelse, []), in_function, type_checking)
        else:
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            yield from walk_imports(child, inner, type_checking)


def check_python_module(
    module: PythonModule, modules: set[str], errors: set[str]
) -> Iterator[Violation]:
    """The rules of src/loaderx that read one module: import-in-function, private-import and
    status-number (the import graph is `python_graph`'s)."""
    bound: dict[str, str] = {}
    for node, in_function, _ in module.imports:
        if in_function and not marked_optional(module.lines, node.lineno):
            what = ast.unparse(node).splitlines()[0]
            detail = f"`{what}` inside a function (mark an optional one `{OPTIONAL_MARK}`)"
            yield Violation(module.path, node.lineno, "import-in-function", detail)
        for target, name, local, bound_module in import_targets(node, module, modules):
            if bound_module is not None:
                bound[local] = bound_module
            elif name is not None and is_private(name) and target != module.name:
                detail = f"`{name}` is private to {target}: make it public or keep it there"
                yield Violation(module.path, node.lineno, "private-import", detail)
    yield from private_attributes(module, bound, modules)
    if module.path != PYTHON_STATUS_TABLE:
        yield from status_numbers(module, errors)


def marked_optional(lines: list[str], line: int) -> bool:
    nearby = lines[max(line - 2, 0) : line]
    return any(OPTIONAL_MARK in text for text in nearby)


def private_attributes(
    module: PythonModule, bound: dict[str, str], modules: set[str]
) -> Iterator[Violation]:
    """`module._name` on a name an import bound to a loaderx module, walking through
    submodules (`loaderx._native` is a module, so `loaderx._native.lib` is fine)."""
    seen: set[tuple[int, str]] = set()
    for node in module.nodes:
        chain = attribute_chain(node)
        if chain is None or chain[0] not in bound:
            continue
        target = bound[chain[0]]
        for index, attr in enumerate(chain[1:], 1):
            if f"{target}.{attr}" in modules:
                target = f"{target}.{attr}"
                continue
            reached = ".".join(chain[: index + 1])
            if is_private(attr) and target != module.name and (node.lineno, reached) not in seen:
                seen.add((node.lineno, reached))
                detail = f"`{reached}` is private to {target}"
                yield Violation(module.path, node.lineno, "private-import", detail)
            break


def attribute_chain(node: ast.AST) -> list[str] | None:
    """`a.b.c` as ["a", "b", "c"] for the outermost Attribute of a chain of names."""
    if not isinstance(node, ast.Attribute):
        return None
    names = []
    current: ast.AST = node
    while isinstance(current, ast.Attribute):
        names.append(current.attr)
        current = current.value
    if not isinstance(current, ast.Name):
        return None
    return [current.id, *reversed(names)]


def is_int(node: ast.AST) -> bool:
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return bool(node.elts) and all(is_int(element) for element in node.elts)
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int)
        and not isinstance(node.value, bool)
    )


def is_status(node: ast.AST) -> bool:
    if isinstance(node, ast.Attribute):
        return node.attr == "code"
    return isinstance(node, ast.Name) and node.id in ("code", "status")


def status_numbers(module: PythonModule, errors: set[str]) -> Iterator[Violation]:
    operators = (ast.Eq, ast.NotEq, ast.In, ast.NotIn)
    for node in module.nodes:
        if isinstance(node, ast.Call):
            callee = node.func
            name = callee.attr if isinstance(callee, ast.Attribute) else getattr(callee, "id", "")
            if name not in errors:
                continue
            codes = [node.args[1]] if len(node.args) > 1 else []
            codes += [keyword.value for keyword in node.keywords if keyword.arg == "code"]
            for code in codes:
                if is_int(code):
                    detail = f"{name}(..., {ast.unparse(code)}): name the code in the table"
                    yield Violation(module.path, node.lineno, "status-number", detail)
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            for left, operator, right in zip(sides, node.ops, sides[1:]):
                if not isinstance(operator, operators):
                    continue
                if (is_status(left) and is_int(right)) or (is_int(left) and is_status(right)):
                    detail = f"`{ast.unparse(node)}`: compare with the table's name for the code"
                    yield Violation(module.path, node.lineno, "status-number", detail)


def error_classes(modules: Iterable[PythonModule]) -> set[str]:
    """The names of the package's classes that derive from ZrecordError (and it), by name."""
    bases: dict[str, set[str]] = {}
    for module in modules:
        for node in module.nodes:
            if isinstance(node, ast.ClassDef):
                names = {
                    b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "")
                    for b in node.bases
                }
                bases.setdefault(node.name, set()).update(names)
    found = {ERROR_BASE}
    grown = True
    while grown:
        more = {name for name, parents in bases.items() if parents & found} - found
        found |= more
        grown = bool(more)
    return found


def python_graph(module: PythonModule, modules: set[str], deferred: bool = False) -> dict[str, int]:
    """The package modules this one imports at module level (with `deferred`: inside
    functions too), each with the line of its first import."""
    edges: dict[str, int] = {}
    for node, in_function, type_checking in module.imports:
        if type_checking or (in_function and not deferred):
            continue
        for target, _, _, _ in import_targets(node, module, modules):
            if target in modules and target != module.name:
                edges.setdefault(target, node.lineno)
    return edges


def check_python(root: Path, report: Report) -> None:
    package: list[PythonModule] = []
    for path in files(root, PYTHON_PATTERNS):
        text = (root / path).read_text(encoding="utf-8")
        lines = text.split("\n")
        report.violations.extend(line_lengths(path, lines))
        try:
            tree = ast.parse(text, filename=path)
        except SyntaxError as exc:
            detail = f"does not parse: {exc.msg}"
            report.violations.append(Violation(path, exc.lineno or 1, "syntax", detail))
            continue
        report.functions["python"].extend(python_functions(path, tree))
        if path.startswith("src/loaderx/"):
            name, is_package = module_name(path)
            module = PythonModule(name, path, tree, lines, is_package, list(ast.walk(tree)))
            module.imports = list(walk_imports(tree))
            package.append(module)
    modules = {module.name for module in package}
    errors = error_classes(package)
    for module in package:
        report.violations.extend(check_python_module(module, modules, errors))
        report.python_graph[module.name] = python_graph(module, modules)
        report.python_deferred[module.name] = python_graph(module, modules, deferred=True)
    report.python_cycles = find_cycles(report.python_graph)
    report.python_hidden_cycles = [
        cycle for cycle in find_cycles(report.python_deferred) if cycle not in report.python_cycles
    ]
    path_of = {module.name: module.path for module in package}
    report.violations.extend(cycle_violations(report.python_cycles, report.python_graph, path_of))
    report.violations.extend(long_functions(report.functions["python"]))


# ---- Zig ---------------------------------------------------------------------------------

ZIG_FN = re.compile(
    r"^\s*(?:pub\s+)?(?:(?:export|extern|inline|noinline)\s+(?:\"\"\s+)?)*fn\s+(@?\"\"|\w+)\s*\("
)
ZIG_TEST = re.compile(r"^\s*test\b\s*(?:\"\"|\w+)?\s*\{")
ZIG_IMPORT = re.compile(r'@import\("([^"]+)"\)')
ZIG_TOKEN = re.compile(r"\w+|\S")
ZIG_INT_RETURN = re.compile(r"\breturn\s+(-?(?:0x[0-9a-fA-F_]+|[0-9][0-9_]*))\s*;")
ZIG_ASSERT = re.compile(r"\bassert\(")
# A `{` right after these opens a type in a signature (`error{A}!void`), not the body.
ZIG_TYPE_WORDS = frozenset({"error", "struct", "enum", "union", "opaque"})


def zig_code(line: str) -> str:
    """The line with its comment cut and its string and character literals emptied, so that
    braces and words inside them do not count; a multiline string line (`\\\\`) is all text."""
    if line.lstrip().startswith("\\\\"):
        return ""
    out = []
    index = 0
    while index < len(line):
        char = line[index]
        if line.startswith("//", index):
            break
        if char in "\"'":
            end = index + 1
            while end < len(line) and line[end] != char:
                end += 2 if line[end] == "\\" else 1
            out.append(char * 2)
            index = end + 1
            continue
        out.append(char)
        index += 1
    return "".join(out)


def zig_block(code: list[str], start: int) -> tuple[int, str] | None:
    """From the declaration on line `start` (0-based): the line of the brace that closes its
    body and the signature's text, or None for a declaration without a body (`extern fn`)."""
    paren = signature_braces = depth = 0
    previous = ""
    signature: list[str] = []
    for number in range(start, len(code)):
        for token in ZIG_TOKEN.findall(code[number]):
            if depth:
                depth += {"{": 1, "}": -1}.get(token, 0)
                if depth == 0:
                    return number, " ".join(signature)
                continue
            if token in "([":
                paren += 1
            elif token in ")]":
                paren -= 1
            elif token == "{" and (signature_braces or paren or previous in ZIG_TYPE_WORDS):
                signature_braces += 1 if not paren else 0
            elif token == "}" and signature_braces:
                signature_braces -= 1
            elif token == "{":
                depth = 1
                continue
            elif token == ";" and not paren and not signature_braces:
                return None
            signature.append(token)
            previous = token
    return None


@dataclass
class ZigFile:
    path: str
    lines: list[str]
    code: list[str]
    # (first line, last line, is a test block, signature) of every fn and test, 0-based
    blocks: list[tuple[int, int, bool, str]] = field(default_factory=list)
    test_lines: set[int] = field(default_factory=set)

    def in_test(self, number: int) -> bool:
        return number in self.test_lines


def parse_zig(path: str, text: str) -> ZigFile:
    lines = text.split("\n")
    parsed = ZigFile(path, lines, [zig_code(line) for line in lines])
    for number, code in enumerate(parsed.code):
        is_test = bool(ZIG_TEST.match(code))
        if not is_test and not ZIG_FN.match(code):
            continue
        block = zig_block(parsed.code, number)
        if block is not None:
            parsed.blocks.append((number, block[0], is_test, block[1]))
            if is_test:
                parsed.test_lines.update(range(number, block[0] + 1))
    return parsed


def zig_functions(parsed: ZigFile) -> list[Function]:
    found = []
    for first, last, _, _ in parsed.blocks:
        text = parsed.lines[first].strip()
        declaration = ZIG_FN.match(parsed.code[first])
        name = declaration.group(1) if declaration else text.removesuffix("{").strip()
        found.append(Function(parsed.path, first + 1, name, last - first + 1))
    return found


def zig_imports(parsed: ZigFile, root: Path) -> dict[str, int]:
    """The files this one imports outside its test blocks, relative to the root."""
    edges: dict[str, int] = {}
    base = Path(parsed.path).parent
    for number, line in enumerate(parsed.lines):
        if "@import(" not in parsed.code[number] or parsed.in_test(number):
            continue
        for target in ZIG_IMPORT.findall(line):
            if not target.endswith(".zig"):
                continue
            resolved = (root / base / target).resolve()
            try:
                imported = resolved.relative_to(root.resolve()).as_posix()
            except ValueError:
                continue
            testing_only = imported.startswith(ZIG_TESTING) and not parsed.path.startswith(
                ZIG_TESTING
            )
            if not testing_only:
                edges.setdefault(imported, number + 1)
    return edges


def zig_status_numbers(parsed: ZigFile) -> Iterator[Violation]:
    for first, last, is_test, signature in parsed.blocks:
        if is_test or not re.search(r"\)\s*c_int$", signature):
            continue
        nested = [(f, la) for f, la, _, _ in parsed.blocks if first < f <= last]
        for number in range(first, last + 1):
            if any(f <= number <= la for f, la in nested):
                continue
            for value in ZIG_INT_RETURN.findall(parsed.code[number]):
                detail = f"`return {value};` from a c_int function: use status.zig's Code"
                yield Violation(parsed.path, number + 1, "status-number", detail)


def zig_asserts(parsed: ZigFile) -> tuple[int, int]:
    asserts = sum(
        len(ZIG_ASSERT.findall(code))
        for number, code in enumerate(parsed.code)
        if not parsed.in_test(number)
    )
    functions = sum(
        1 for first, _, is_test, _ in parsed.blocks if not is_test and not parsed.in_test(first)
    )
    return asserts, functions


def check_zig(root: Path, report: Report) -> None:
    for path in files(root, ZIG_PATTERNS):
        parsed = parse_zig(path, (root / path).read_text(encoding="utf-8"))
        report.violations.extend(line_lengths(path, parsed.lines))
        report.functions["zig"].extend(zig_functions(parsed))
        report.zig_graph[path] = zig_imports(parsed, root)
        if path != ZIG_STATUS_TABLE:
            report.violations.extend(zig_status_numbers(parsed))
        stem = Path(path).stem
        new = path.startswith("zig/") and not path.startswith(ZIG_TESTING)
        new = new and stem not in ZIG_FILES_BEFORE
        if path in {f"zig/{name}.zig" for name in STORE_FILES} or new:
            report.asserts[path] = zig_asserts(parsed)
    report.zig_cycles = find_cycles(report.zig_graph)
    path_of = {path: path for path in report.zig_graph}
    report.violations.extend(cycle_violations(report.zig_cycles, report.zig_graph, path_of))
    report.violations.extend(long_functions(report.functions["zig"]))


# ---- the report --------------------------------------------------------------------------


def check(root: Path) -> Report:
    """Every rule over the tree at `root` (the repository's top directory, or a synthetic one
    laid out the same way)."""
    report = Report()
    check_python(root, report)
    check_zig(root, report)
    report.violations.sort()
    return report


def summary(report: Report) -> str:
    out = ["## violations per rule: all (python, zig)"]
    for rule in RULES:
        found = [v for v in report.violations if v.rule == rule]
        zig = sum(v.path.endswith(".zig") for v in found)
        out.append(f"{rule:20} {len(found):5} ({len(found) - zig}, {zig})")
    for language in ("python", "zig"):
        out.append(f"\n## the 10 longest functions ({language})")
        longest = sorted(report.functions[language], key=lambda f: (-f.lines, f.path, f.line))
        out += [f"{f.lines:5}  {f.path}:{f.line} {f.name}" for f in longest[:10]]
    for language, graph, cycles in (
        ("python", report.python_graph, report.python_cycles),
        ("zig", report.zig_graph, report.zig_cycles),
    ):
        out.append(f"\n## import graph ({language}): module: imports")
        out += [f"{node}: {' '.join(sorted(graph[node])) or '-'}" for node in sorted(graph)]
        out.append(f"\n## import cycles ({language}): {len(cycles)}")
        out += [" -> ".join(cycle) for cycle in cycles]
        if language == "python":
            out.append("\n## imports inside functions (python): module: imports")
            for node in sorted(report.python_deferred):
                extra = sorted(set(report.python_deferred[node]) - set(graph[node]))
                out += [f"{node}: {' '.join(extra)}"] if extra else []
            hidden = report.python_hidden_cycles
            out.append(f"\n## import cycles hidden by imports inside functions: {len(hidden)}")
            out += [" -> ".join(cycle) for cycle in hidden]
    out.append("\n## asserts per function (assert( calls / fn definitions, test blocks left out)")
    for path, (asserts, functions) in sorted(report.asserts.items()):
        ratio = asserts / functions if functions else 0.0
        out.append(f"{path:24} {asserts:4} / {functions:4} = {ratio:.2f}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--summary", action="store_true", help="counts, graphs and asserts")
    parser.add_argument(
        "--root",
        type=Path,
        default=Path(__file__).resolve().parent.parent,
        help="the tree to check (default: this repository)",
    )
    arguments = parser.parse_args(argv)
    report = check(arguments.root)
    if arguments.summary:
        print(summary(report))
    else:
        for violation in report.violations:
            print(violation)
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
