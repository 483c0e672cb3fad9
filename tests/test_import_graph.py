"""No import cycles in the product tree: the module graph, read from the source with ``ast`` (imports inside
functions count too: a function-level import hides a cycle, it does not remove it; imports for type annotations
alone do not), has no strongly connected component of more than one module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.cpu

# Source folder -> the package it installs as (setup.py's mapping).
FOLDERS = {"flyship": "flyship", "bundle": "flyship.bundle", "compiler": "flyship.compiler", "loader": "flyship.loader"}


def product_modules() -> dict[str, Path]:
    mods = {}
    for folder, package in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join((package, *parts))] = path
    return mods


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The product modules ``name`` imports: ``import a.b``, ``from a import b`` (module b, else a), relative too."""
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(), str(path))
    # Imports under `if TYPE_CHECKING:` only name types for annotations: they never run.
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING"
                   for stmt in node.body for n in ast.walk(stmt)}
    out = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if is_package else name.split(".")[:-1]
                pkg = pkg[: len(pkg) - (node.level - 1)]
                base = ".".join([*pkg, *([base] if base else [])])
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in modules:  # `import flyship.loader.core` imports that module
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
    return found


def graph() -> dict[str, set[str]]:
    modules = product_modules()
    # A package's __init__ importing its own submodules is how a package re-exports: not a cycle with them.
    g = {m: imports_of(m, p, modules) for m, p in modules.items()}
    for m in g:
        g[m] = {t for t in g[m] if not (modules[m].name == "__init__.py" and t.startswith(m + "."))}
    return g


def test_the_cycle_finder_finds_a_cycle_and_nothing_else():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_product_tree_has_no_import_cycle():
    found = cycles(graph())
    assert not found, "import cycles (each a set of modules that import each other):\n" + "\n".join(
        " <-> ".join(c) for c in found)


def test_the_call_path_does_not_import_the_integrations_when_it_loads():
    """``flyship.loader`` (load, handles, selection, plan, extension) never imports ``flyship.loader.tools`` (patch,
    hook, report, bench, tune, inspect, verify, cli) at import time: a load imports only what it needs. A method that
    hands off to a tool (``OpHandle.verify``) imports it when called."""
    modules = product_modules()
    offenders = []
    for name, path in modules.items():
        if not name.startswith("flyship.loader") or name.startswith("flyship.loader.tools"):
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in tree.body:  # module level only
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [f"{node.module}.{a.name}" for a in node.names] if isinstance(node, ast.ImportFrom)
                     else [])
            offenders += [f"{name} imports {n}" for n in names if n.startswith("flyship.loader.tools")]
    assert not offenders, "\n".join(offenders)
