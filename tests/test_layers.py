"""The package's shape: dependencies run one way, down the layers of docs/DESIGN.md, and every
module stays readable.

The import graph is read from the source with `ast`, imports inside functions included
(a lazy import hides a cycle from Python, not from a reader). `viewer/` ships as
`turbogs.viewer`, so it is part of the same graph.
"""

import ast
from pathlib import Path
from typing import Dict, List, Set

from conftest import REPO

MAX_MODULE_LINES = 500
PACKAGE_DIRS = {"turbogs": REPO / "turbogs", "turbogs.viewer": REPO / "viewer"}

# The layers of docs/DESIGN.md, top first. A part (a package under turbogs/, or a top-level
# module) may import parts of lower layers only: never its own layer's other parts, never up.
LAYERS = [
    ["cli"],
    ["bench", "viewer"],
    ["training"],
    ["evaluate", "turbo", "density", "optim", "distributed"],
    ["render", "formats", "capture"],
    ["data", "metrics", "kernels"],
    ["fileio", "tiles", "host_read", "gaussians", "geometry", "device"],
    ["errors"],
]


def package_modules(roots: Dict[str, Path]) -> Dict[str, Path]:
    """Dotted module name -> file, for every .py file under each package root."""
    modules = {}
    for package, root in roots.items():
        for path in sorted(root.rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join([package, *parts])] = path
    return modules


def imported_modules(name: str, path: Path, modules: Dict[str, Path]) -> Set[str]:
    """The package modules that `name` imports anywhere in its body. `from X import y`
    counts as importing X.y when that is a module, else X."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # `import turbogs.a.b` with a.b not a module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph(roots: Dict[str, Path]) -> Dict[str, Set[str]]:
    modules = package_modules(roots)
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
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
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles():
    graph = import_graph(PACKAGE_DIRS)
    assert len(graph) > 30, "the package was not found"
    assert cycles(graph) == []


def test_cycle_finder_sees_cycles_hidden_in_functions(tmp_path):
    """The detector itself: a cycle made only by imports inside functions and a relative import."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("from .c import g\n")
    (pkg / "sub" / "c.py").write_text("def g():\n    import pkg.a\n")
    (pkg / "d.py").write_text("from pkg import a\n")
    graph = import_graph({"pkg": pkg})
    assert graph["pkg.d"] == {"pkg.a"}
    assert cycles(graph) == [["pkg.a", "pkg.sub.b", "pkg.sub.c"]]


def test_no_module_over_500_lines():
    too_long = {str(path.relative_to(REPO)): n
                for path in package_modules(PACKAGE_DIRS).values()
                if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert too_long == {}


def part_of(module: str) -> str:
    """turbogs.training.trainer -> training; turbogs.tiles -> tiles; turbogs (the root) -> ''."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def layer_violations(graph: Dict[str, Set[str]], layers: List[List[str]]) -> List[str]:
    depth = {part: i for i, parts in enumerate(layers) for part in parts}
    found = []
    for module, targets in sorted(graph.items()):
        source = part_of(module)
        for target in sorted(targets):
            into = part_of(target)
            if into in (source, "") or source in ("", "__main__"):  # "": the root, turbogs/__init__.py (and _C)
                continue
            if source not in depth or into not in depth:
                found.append(f"{module} -> {target}: a part that has no layer")
            elif depth[into] <= depth[source]:
                found.append(f"{module} -> {target}: {source} may not import {into}")
    return found


def test_imports_run_down_the_layers():
    graph = import_graph(PACKAGE_DIRS)
    parts = {part_of(module) for module in graph} - {"", "__main__"}
    assert parts == {part for layer in LAYERS for part in layer}, "every part has exactly one layer"
    assert layer_violations(graph, LAYERS) == []


def test_layer_check_sees_an_upward_import():
    """The checker itself: an import up, one across a layer, and one into its own package."""
    graph = {"t.low.a": {"t.high.b"}, "t.high.b": {"t.low.a", "t.high.c"}, "t.high.c": set(), "t.side": {"t.low.a"},
             "t.other": {"t.side"}}
    layers = [["high"], ["side", "other"], ["low"]]
    assert layer_violations(graph, layers) == ["t.low.a -> t.high.b: low may not import high",
                                               "t.other -> t.side: other may not import side"]
