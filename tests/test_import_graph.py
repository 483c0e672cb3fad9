"""No import cycles in the product tree: the module graph, read from the source with ``ast`` (imports inside
functions count too: a function-level import hides a cycle, it does not remove it; imports for type annotations
alone do not; a package's ``__init__`` importing its own submodules counts like any other import), has no strongly
connected component of more than one module. And what the graph cannot see, a fresh process shows: every product
module imports first in a process of its own, and ``flyship.compiler.spec`` imports whatever order its
``__init__`` lists its imports in (issue 31: a cycle through it worked only because of that order)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.cpu

# Source folder -> the package it installs as (setup.py's mapping).
FOLDERS = {"flyship": "flyship", "bundle": "flyship.bundle", "compiler": "flyship.compiler", "loader": "flyship.loader"}


def product_modules(root: Path = ROOT, folders: dict[str, str] = FOLDERS) -> dict[str, Path]:
    mods = {}
    for folder, package in folders.items():
        for path in (root / folder).rglob("*.py"):
            parts = path.relative_to(root / folder).with_suffix("").parts
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


def graph(modules: dict[str, Path] | None = None) -> dict[str, set[str]]:
    """Module -> the product modules it imports. A package's ``__init__`` importing its own submodules is an edge
    like any other: a submodule that imports a name back from its package's ``__init__`` (``from flyship.compiler.spec
    import OpDecl``) while that ``__init__`` is importing it is a cycle that works only in one order of imports."""
    modules = product_modules() if modules is None else modules
    return {m: imports_of(m, p, modules) for m, p in modules.items()}


def test_the_cycle_finder_finds_a_cycle_and_nothing_else():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_a_cycle_through_a_packages_init_is_found(tmp_path):
    """The shape of issue 31's cycle: a package's ``__init__`` imports a module that imports a name back from it."""
    pkg = tmp_path / "src" / "spec"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("from flyship.spec.params import Tensor\nfrom flyship.tuning import expand\n")
    (pkg / "params.py").write_text("class Tensor: ...\n")
    (tmp_path / "src" / "tuning.py").write_text("from flyship.frontends import get\n")
    (tmp_path / "src" / "frontends.py").write_text("from flyship.spec import Tensor\n\ndef get(): ...\n")
    modules = product_modules(tmp_path, {"src": "flyship"})
    assert cycles(graph(modules)) == [["flyship.frontends", "flyship.spec", "flyship.tuning"]]
    # Annotations only (under TYPE_CHECKING), as the frontends now import the spec API's types: no cycle.
    (tmp_path / "src" / "frontends.py").write_text(
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from flyship.spec import Tensor\n\ndef get(): ...\n")
    assert cycles(graph(modules)) == []


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


# Imported first, in a child forked from a process that holds only the third-party packages (so each child pays for
# flyship's own modules alone); two children at a time. Prints the modules that fail, with their error.
FIRST_IMPORT = """
import os, sys
import click, filelock, msgpack, numpy, torch, elftools.elf.elffile  # noqa: E401,F401
running, failed = {}, []
def reap():
    pid, status = os.wait()
    if status:
        failed.append(running[pid])
    del running[pid]
for name in sys.argv[1:]:
    if len(running) == 2:
        reap()
    pid = os.fork()
    if pid == 0:
        try:
            __import__(name)
        except BaseException as e:
            print(f"{name}: {type(e).__name__}: {e}", flush=True)
            os._exit(1)
        os._exit(0)
    running[pid] = name
while running:
    reap()
print("FAILED", " ".join(sorted(failed)))
"""


def test_every_product_module_imports_first_in_a_fresh_process():
    names = sorted(m for m in product_modules() if not any(p.startswith("_") for p in m.split(".")))
    r = subprocess.run([sys.executable, "-c", FIRST_IMPORT, *names], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().endswith("FAILED"), f"modules that fail when imported first:\n{r.stdout[-3000:]}"


def import_lines(text: str) -> tuple[int, int, list[str]]:
    """The module-level import statements of ``text`` after ``from __future__``: (first line, last line, each
    statement's source lines); they must be one run of lines with nothing else between."""
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    body = [n for n in tree.body if not (isinstance(n, ast.ImportFrom) and n.module == "__future__")]
    block = []
    for n in body:
        if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) and not block:
            continue  # the docstring
        if not isinstance(n, (ast.Import, ast.ImportFrom)):
            break
        block.append(n)
    assert block, "no import statements found"
    first, last = block[0].lineno, block[-1].end_lineno
    inside = {i for n in block for i in range(n.lineno, n.end_lineno + 1)}
    others = [lines[i - 1] for i in range(first, last + 1) if i not in inside]
    assert all(not x.strip() or x.lstrip().startswith("#") for x in others), f"not one block of imports: {others}"
    return first, last, ["".join(lines[n.lineno - 1:n.end_lineno]) for n in block]


def test_the_spec_api_imports_whatever_order_its_init_lists_its_imports_in(tmp_path):
    """``import flyship.compiler.spec`` (the first line of every spec file) in a copy of the checkout whose
    ``compiler/spec/__init__.py`` lists its imports reversed, sorted by module, and in seeded random orders."""
    import random
    import shutil

    co = tmp_path / "checkout"
    co.mkdir()
    for name in ("flyship", "bundle", "loader", "csrc", "setup.py"):  # flyship/ finds its siblings beside it
        (co / name).symlink_to(ROOT / name)
    shutil.copytree(ROOT / "compiler", co / "compiler", ignore=shutil.ignore_patterns("__pycache__"))
    init = co / "compiler" / "spec" / "__init__.py"
    text = init.read_text()
    first, last, statements = import_lines(text)
    assert len(statements) >= 10
    lines = text.splitlines(keepends=True)
    orders = [statements[::-1], sorted(statements, key=lambda s: s.split()[1])]
    orders += [random.Random(seed).sample(statements, len(statements)) for seed in range(6)]
    code = "import flyship.compiler.spec as s; print(s.__file__); s.op, s.Tensor, s.Spec"
    for order in orders:
        init.write_text("".join(lines[:first - 1] + order + lines[last:]))
        r = subprocess.run([sys.executable, "-B", "-c", code], cwd=co, capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
        assert r.returncode == 0, f"import order {[s.split()[1] for s in order]}:\n{r.stderr[-2000:]}"
        assert r.stdout.strip() == str(init), r.stdout  # the copy was imported, not the installed checkout
