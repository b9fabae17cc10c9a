"""The package keeps its layers (docs/layout.md): read with `ast`, never imported.

Every module of packer/ is parsed, and every import of a packer module is collected, at module
level and inside functions and classes: `import packer.x.y`, `from packer.x import y` (y a
submodule or a name), `from packer import arguments as A`, and relative imports. Then:

- a module imports only a strictly lower layer (LAYERS, lowest first) or modules of its own
  package `packer.X`; `packer` (the __init__), `packer.__main__` and `packer.cli` are the top;
- no import cycle between modules, module-level and function-level edges together;
- no private name (`_x`, not a dunder) from another package, imported or read off a module;
- third-party libraries stay where they belong (typer, rich, ray, datasets, torch);
- no module over 450 lines, no function body over 80 lines, numba kernels apart.

There is no list of exceptions: a violation is fixed in packer, not recorded here. Two
subprocess tests check that `import packer.contract` and `import packer.torch` leave numba out.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Layers, lowest first (as docs/layout.md draws them): the key is a top-level module or package of packer.
LAYERS = {
    "packer.errors": 0,
    "packer.starting": 0,
    "packer.version": 1,
    "packer.arguments": 1,
    "packer.hashing": 1,
    "packer.workers": 1,
    "packer.interrupts": 1,
    "packer.jit": 1,
    "packer.storage": 1,
    "packer.contract": 2,
    "packer.planning": 3,
    "packer.config": 4,
    "packer.read": 5,
    "packer.tokenize": 6,
    "packer.write": 7,
    "packer.engines": 8,
    "packer.pipelines": 9,
    "packer.torch": 10,
    "packer.export": 10,
    "packer.verify": 11,
    "packer.inspection": 12,
    "packer.inspect_html": 13,
    "packer": 14,
    "packer.__main__": 14,
    "packer.cli": 14,
}
TOP = {"packer", "packer.__main__", "packer.cli"}  # one package: they may import one another

MAX_MODULE_LINES = 450
LONG_MODULES_ALLOWED = {"packer/planning/kernels.py", "packer/verify/kernels.py"}
MAX_BODY_LINES = 80
KERNEL_DECORATORS = {"kernel", "helper", "njit", "jit"}


@dataclass(frozen=True)
class Import:
    """One imported packer module (or one private name taken from it)."""

    importer: str  # module name, e.g. "packer.read.files"
    path: str  # the importer's file, relative to the repository root
    line: int
    target: str  # the packer module imported (a name imported from it resolves to it)
    private: str | None = None  # the private name taken from `target`, if any


@dataclass(frozen=True)
class External:
    """One import of a third-party (or standard) module."""

    importer: str
    path: str
    line: int
    name: str  # e.g. "torch.nn"


# --------------------------------------------------------------------------------------------
# Collecting imports


def module_name(path: str) -> str:
    """packer/read/files.py -> packer.read.files, packer/read/__init__.py -> packer.read."""
    parts = path.removesuffix(".py").split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_of(module: str) -> str:
    """The `packer.X` a module belongs to; the top (`packer`, `__main__`, `cli`) is one."""
    group = ".".join(module.split(".")[:2])
    return "packer" if group in TOP else group


def layer_of(module: str) -> int | None:
    return LAYERS.get(".".join(module.split(".")[:2]))


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def existing(name: str, modules: set[str]) -> str:
    """The longest prefix of a dotted name that is a module (`packer.x.f` -> `packer.x`)."""
    while name not in modules and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The module a `from ... import` statement names, relative imports resolved."""
    if not node.level:
        return node.module or ""
    parts = module.split(".") if is_package else module.split(".")[:-1]
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


class Collector(ast.NodeVisitor):
    """Imports of one module, and the names they bind to packer modules (for `A._x`)."""

    def __init__(self, path: str, modules: set[str]):
        self.path, self.modules = path, modules
        self.module = module_name(path)
        self.is_package = path.endswith("__init__.py")
        self.imports: list[Import] = []
        self.externals: list[External] = []
        self.aliases: dict[str, str] = {}  # bound name -> packer module

    def add(self, line: int, dotted: str, private: str | None = None) -> None:
        if dotted == "packer" or dotted.startswith("packer."):
            target = existing(dotted, self.modules)
            rest = dotted[len(target) :].lstrip(".").split(".")
            private = private or next((p for p in rest if is_private(p)), None)
            self.imports.append(Import(self.module, self.path, line, target, private))
        else:
            self.externals.append(External(self.module, self.path, line, dotted))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.add(node.lineno, alias.name)
            if alias.asname:
                self.aliases[alias.asname] = alias.name
            else:
                top = alias.name.split(".")[0]
                self.aliases[top] = top

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        source = absolute(node, self.module, self.is_package)
        for alias in node.names:
            if alias.name == "*":
                self.add(node.lineno, source)
                continue
            full = f"{source}.{alias.name}"
            if full in self.modules:
                self.add(node.lineno, full)
                self.aliases[alias.asname or alias.name] = full
            else:
                self.add(node.lineno, source, alias.name if is_private(alias.name) else None)

    def private_reads(self, tree: ast.AST) -> None:
        """`A._x` where A is a packer module bound by an import: a private import all the same."""
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute):
                continue
            attrs, base = [], node
            while isinstance(base, ast.Attribute):
                attrs.insert(0, base.attr)
                base = base.value
            if not isinstance(base, ast.Name) or base.id not in self.aliases:
                continue
            dotted = ".".join([self.aliases[base.id], *attrs])
            if dotted.startswith("packer"):
                target = existing(dotted, self.modules)
                rest = dotted[len(target) :].lstrip(".").split(".")
                if rest and is_private(rest[0]):
                    imp = Import(self.module, self.path, node.lineno, target, rest[0])
                    if imp not in self.imports:
                        self.imports.append(imp)


def collect(sources: dict[str, str]) -> tuple[list[Import], list[External]]:
    """Every import of every module; `sources` maps paths (packer/x.py) to their text."""
    modules = {module_name(path) for path in sources}
    imports, externals = [], []
    for path, text in sorted(sources.items()):
        tree = ast.parse(text, filename=path)
        collector = Collector(path, modules)
        collector.visit(tree)
        collector.private_reads(tree)
        imports += collector.imports
        externals += collector.externals
    return imports, externals


def package_sources() -> dict[str, str]:
    return {
        str(path.relative_to(ROOT)): path.read_text(encoding="utf-8")
        for path in sorted((ROOT / "packer").rglob("*.py"))
        if "__pycache__" not in path.parts
    }


# --------------------------------------------------------------------------------------------
# Checks: each returns its violations, one line each


def unlayered_modules(sources: dict[str, str]) -> list[str]:
    return [
        f"{path}: {module_name(path)} is in no layer"
        for path in sorted(sources)
        if layer_of(module_name(path)) is None
    ]


def upward_imports(imports: list[Import]) -> list[str]:
    found = []
    for imp in imports:
        low, high = layer_of(imp.target), layer_of(imp.importer)
        if low is None or high is None or package_of(imp.importer) == package_of(imp.target):
            continue  # modules in no layer are reported by test_every_module_has_a_layer
        if low >= high:
            found.append(
                f"{imp.path}:{imp.line}: {imp.importer} (layer {high}) imports "
                f"{imp.target} (layer {low})"
            )
    return list(dict.fromkeys(found))  # one line for `from x import a, b`


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def shortest_cycle(graph: dict[str, set[str]], start: str, members: set[str]) -> list[str]:
    """start -> ... -> start, the fewest edges, inside one component."""
    parent: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt in sorted(graph[node] & members):
            if nxt == start:
                path = [node]
                while path[-1] != start:
                    path.append(parent[path[-1]])
                return [*reversed(path), start]
            if nxt not in parent:
                parent[nxt] = node
                queue.append(nxt)
    raise AssertionError(f"{start} is on no cycle")


def import_cycles(imports: list[Import]) -> list[str]:
    graph: dict[str, set[str]] = {}
    where: dict[tuple[str, str], Import] = {}
    for imp in imports:
        if imp.target != imp.importer:
            graph.setdefault(imp.importer, set()).add(imp.target)
            graph.setdefault(imp.target, set())
            where.setdefault((imp.importer, imp.target), imp)
    found = []
    for component in strongly_connected(graph):
        cycles = {}  # the shortest cycle through each member, each cycle once
        for member in component:
            cycle = shortest_cycle(graph, member, set(component))[:-1]
            turn = cycle.index(min(cycle))
            cycles.setdefault(tuple(cycle[turn:] + cycle[:turn]), None)
        lines = [
            "; ".join(
                f"{a} -> {b} ({where[a, b].path}:{where[a, b].line})"
                for a, b in zip(cycle, cycle[1:] + cycle[:1])
            )
            for cycle in cycles
        ]
        found.append(
            f"cycles among {len(component)} modules ({', '.join(component)}):\n    "
            + "\n    ".join(lines)
        )
    return found


def private_imports(imports: list[Import]) -> list[str]:
    return [
        f"{imp.path}:{imp.line}: {imp.importer} imports private {imp.private} from {imp.target}"
        for imp in imports
        if imp.private and package_of(imp.importer) != package_of(imp.target)
    ]


def misplaced(externals: list[External], libraries: set[str], allowed) -> list[str]:
    """Imports of `libraries` (and their submodules) by a module that `allowed` refuses."""
    return [
        f"{ext.path}:{ext.line}: {ext.importer} imports {ext.name}"
        for ext in externals
        if ext.name.split(".")[0] in libraries and not allowed(ext.importer)
    ]


def in_package(*prefixes: str):
    return lambda module: any(module == p or module.startswith(p + ".") for p in prefixes)


def datasets_spread(externals: list[External]) -> list[str]:
    users = sorted({e.importer for e in externals if e.name.split(".")[0] == "datasets"})
    if len(users) <= 1:
        return []
    return [
        f"{e.path}:{e.line}: {e.importer} imports {e.name} (datasets is imported by {users})"
        for e in externals
        if e.name.split(".")[0] == "datasets"
    ]


def long_modules(sources: dict[str, str]) -> list[str]:
    return [
        f"{path}: {len(text.splitlines())} lines (at most {MAX_MODULE_LINES})"
        for path, text in sorted(sources.items())
        if len(text.splitlines()) > MAX_MODULE_LINES and path not in LONG_MODULES_ALLOWED
    ]


def decorator_name(node: ast.expr) -> str:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def long_functions(sources: dict[str, str]) -> list[str]:
    found = []
    for path, text in sorted(sources.items()):
        for node in ast.walk(ast.parse(text, filename=path)):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if any(decorator_name(d) in KERNEL_DECORATORS for d in node.decorator_list):
                continue  # a numba kernel
            body = node.end_lineno - node.body[0].lineno + 1
            if body > MAX_BODY_LINES:
                found.append(
                    f"{path}:{node.lineno}: {module_name(path)}.{node.name} has a body of "
                    f"{body} lines (at most {MAX_BODY_LINES})"
                )
    return found


def report(violations: list[str]) -> str:
    return f"{len(violations)} violation(s):\n" + "\n".join(violations)


# --------------------------------------------------------------------------------------------
# The package


SOURCES = package_sources()
IMPORTS, EXTERNALS = collect(SOURCES)


def test_the_package_is_read():
    """The collector sees the package and its imports (one that saw nothing would pass all)."""
    assert {"packer/__init__.py", "packer/errors.py", "packer/cli/app.py"} <= set(SOURCES)
    assert any(i.importer == "packer.cli.app" for i in IMPORTS)
    assert any(e.name == "typer" for e in EXTERNALS)


def test_every_module_has_a_layer():
    """Every module of packer/ belongs to one layer of LAYERS (a new top-level module or
    package needs its place in the layering before anything can judge its imports)."""
    violations = unlayered_modules(SOURCES)
    assert not violations, report(violations)


def test_no_upward_imports():
    """A module imports only strictly lower layers, or modules of its own package `packer.X`
    (module level or inside a function: a lazy import is a dependency all the same)."""
    violations = upward_imports(IMPORTS)
    assert not violations, report(violations)


def test_no_import_cycles():
    """No cycle between modules, counting module-level and function-level imports together."""
    violations = import_cycles(IMPORTS)
    assert not violations, report(violations)


def test_no_private_names_across_packages():
    """No `_name` (dunders apart) is imported from, or read off, a module of another package:
    what one package needs from another is public."""
    violations = private_imports(IMPORTS)
    assert not violations, report(violations)


def test_typer_and_rich_only_in_the_cli():
    """typer and rich are the CLI's: only packer/cli/ imports them."""
    violations = misplaced(EXTERNALS, {"typer", "rich"}, in_package("packer.cli"))
    assert not violations, report(violations)


def test_ray_only_in_its_engine():
    """ray is imported by packer/engines/ray.py only."""
    violations = misplaced(EXTERNALS, {"ray"}, in_package("packer.engines.ray"))
    assert not violations, report(violations)


def test_datasets_in_one_module():
    """datasets (🤗) is imported by one adapter module at most."""
    violations = datasets_spread(EXTERNALS)
    assert not violations, report(violations)


def test_torch_only_in_torch_and_verify():
    """torch is imported only under packer/torch/ and packer/verify/: packing never needs it."""
    violations = misplaced(EXTERNALS, {"torch"}, in_package("packer.torch", "packer.verify"))
    assert not violations, report(violations)


def test_modules_are_short():
    """No module is over 450 lines, apart from the numba kernel files."""
    violations = long_modules(SOURCES)
    assert not violations, report(violations)


def test_functions_are_short():
    """No function body (first statement to last line; the signature does not count) is over
    80 lines, apart from numba kernels (decorated with kernel, helper, njit or jit)."""
    violations = long_functions(SOURCES)
    assert not violations, report(violations)


def modules_after_import(module: str) -> set[str]:
    code = f"import sys, {module}; print(' '.join(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


def test_numba_probe_sees_numba():
    """The probe below sees numba when a module does load it (the planning kernels do)."""
    assert "numba" in modules_after_import("packer.planning.kernels")


@pytest.mark.parametrize("module", ["names", "schema", "manifest", "shards", "outputs"])
def test_contract_imports_no_numba(module):
    """`import packer.contract.*` (what an output is) loads neither numba nor torch."""
    loaded = modules_after_import(f"packer.contract.{module}")
    assert "numba" not in loaded and "torch" not in loaded


def test_cli_imports_no_numba_nor_numpy():
    """`packer --help` imports the CLI only: no numba, no numpy, no pyarrow."""
    loaded = modules_after_import("packer.cli")
    assert not {"numba", "numpy", "pyarrow"} & loaded


def test_torch_loader_imports_no_numba():
    """`import packer.torch` (the trainer-side loader) does not load numba."""
    assert "numba" not in modules_after_import("packer.torch")


# --------------------------------------------------------------------------------------------
# The checker itself


CLEAN = {
    "packer/__init__.py": "from packer.read.a import read\nfrom packer import errors as E\n",
    "packer/__main__.py": "from packer.cli import run\n",
    "packer/cli/__init__.py": "import typer\nfrom packer import read\ndef run(): ...\n",
    "packer/errors.py": "class UsageError(Exception): ...\n",
    "packer/config.py": "from packer.errors import UsageError\nfrom packer.jit import kernel\n",
    "packer/jit.py": "def kernel(fn): return fn\n",
    "packer/read/__init__.py": "",
    "packer/read/a.py": "from . import b\nfrom packer.read.b import _shared\ndef read(): ...\n",
    "packer/read/b.py": "def _shared(): ...\ndef f():\n    from packer import config as C\n"
    "    return C.PackConfig\n",
}


def all_violations(sources: dict[str, str]) -> list[str]:
    imports, externals = collect(sources)
    return (
        unlayered_modules(sources)
        + upward_imports(imports)
        + import_cycles(imports)
        + private_imports(imports)
        + misplaced(externals, {"typer", "rich"}, in_package("packer.cli"))
        + long_modules(sources)
        + long_functions(sources)
    )


def test_checker_passes_a_clean_tree():
    """Relative imports, own-package private names, `from packer import x as X` of a lower
    layer, the top importing itself: all allowed, so a violation below is the one planted."""
    assert all_violations(CLEAN) == []


@pytest.mark.parametrize(
    "path, source, expected",
    [
        # an upward import inside a function, through `from packer import x as X`
        (
            "packer/errors.py",
            "def f():\n    from packer import config as C\n",
            "packer/errors.py:2: packer.errors (layer 0) imports packer.config (layer 4)",
        ),
        # a name from the top
        (
            "packer/read/b.py",
            "from packer import read_samples\n",
            "packer/read/b.py:1: packer.read.b (layer 5) imports packer (layer 14)",
        ),
        # a relative import that climbs to the top package
        ("packer/read/b.py", "from .. import cli\n", "imports packer.cli (layer 14)"),
        # a cycle inside one package, through a function-level import
        (
            "packer/read/b.py",
            "def f():\n    import packer.read.a\n",
            "packer.read.a -> packer.read.b (packer/read/a.py:1); "
            "packer.read.b -> packer.read.a (packer/read/b.py:2)",
        ),
        # a private name, imported and read off a module alias
        (
            "packer/config.py",
            "from packer.read.b import _shared\n",
            "packer.config imports private _shared from packer.read.b",
        ),
        (
            "packer/config.py",
            "import packer.read.b as B\nB._shared()\n",
            "packer/config.py:2: packer.config imports private _shared from packer.read.b",
        ),
        ("packer/config.py", "import rich.console\n", "packer.config imports rich.console"),
        ("packer/extra.py", "", "packer.extra is in no layer"),
        ("packer/config.py", "x = 1\n" * 451, "packer/config.py: 451 lines"),
        (
            "packer/config.py",
            "def f(\n    a,\n):\n" + "    a += 1\n" * 81,
            "packer.config.f has a body of 81 lines",
        ),
    ],
)
def test_checker_catches(path, source, expected):
    """Each planted violation is reported, naming the module, the line and the import."""
    found = all_violations({**CLEAN, path: source})
    assert any(expected in v for v in found), found


def test_checker_exempts_kernels_only():
    """A numba kernel may be long; the same function undecorated may not."""
    body = "    a += 1\n" * 81
    kernel = "from packer.jit import kernel\n@kernel(cache=True)\ndef f(a):\n" + body
    assert all_violations({**CLEAN, "packer/config.py": kernel}) == []
    assert all_violations({**CLEAN, "packer/config.py": "def f(a):\n" + body})
