"""The spec file as each target sees it: one planning import per target environment, merged into one SpecFile.

A spec file may declare other things per target (a builder only valid for gfx950, a constexpr read from the
arch): the worker of each target imports it with that target's environment (``FLYDSL_GPU_ARCH``), so the
parent must plan each target's tasks from the declarations *that* target's import makes, never from the
first ``--arch``'s. The parent imports the spec file once per planning environment (each AMD processor; one
for every other target) and merges the imports: what is declared alike everywhere stays as declared; a spec
declared differently (or only) for some targets becomes one whose ``per_target`` holds, for each target, the
form that target's import declared, limited by ``targets=`` to the targets that declared it. The imports are
taken in a fixed order (by processor), so the merge never depends on the order of ``--arch``.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any, Callable

from flyship.bundle import targets as _targets
from flyship.compiler import frontends as _frontends
from flyship.compiler import spec as _spec
from flyship.compiler.spec import OpDecl, Spec, SpecFile
from flyship.errors import CompileError, SpecError

# The OpDecl fields that make an op's schema and launch: one value on every target.
_OP_FIELDS = ("args", "reference", "grid", "frontend", "backward", "key")


@dataclasses.dataclass(frozen=True)
class TargetImport:
    """The spec file as imported for ``targets`` (those sharing one planning environment)."""

    key: str  # the AMD processor, or "" for the targets of other vendors
    targets: tuple[_targets.TargetID, ...]
    spec_file: SpecFile


def planning_groups(targets: list[_targets.TargetID]) -> list[tuple[str, tuple[_targets.TargetID, ...]]]:
    """The requested targets grouped by the environment their import sees (FlyDSL reads the processor only;
    other vendors' DSLs read nothing per target), in a fixed order: other vendors first, then by processor."""
    groups: dict[str, list[_targets.TargetID]] = {}
    for t in targets:
        groups.setdefault(t.processor if t.vendor == "amd" else "", []).append(t)
    return [(k, tuple(groups[k])) for k in sorted(groups)]


def import_per_target(spec_path: str, targets: list[_targets.TargetID],
                      load: Callable[[str], SpecFile]) -> list[TargetImport]:
    """Import the spec file once per planning group (:func:`planning_groups`), each with the environment the
    frontends set for that group's targets; the process environment is restored afterwards.

    Between two imports, the user's modules the previous import loaded are dropped from ``sys.modules``, so
    kernel modules that fix arch constants at import run again for the next target (libraries stay loaded).
    """
    saved = dict(os.environ)
    groups = planning_groups(targets)
    imports: list[TargetImport] = []
    try:
        for key, group in groups:
            os.environ.clear()
            os.environ.update(saved)
            for name in _frontends.names():
                _frontends.get(name).prepare_planning(key or None)
            before = set(sys.modules)
            try:
                imports.append(TargetImport(key, group, load(spec_path)))
            except SpecError as e:  # this target's import declares no op (all gated on another arch)
                if e.kind != _spec.NO_OPS:
                    raise
                imports.append(TargetImport(key, group, SpecFile(path=spec_path)))
            if len(imports) < len(groups):
                for name in [m for m in set(sys.modules) - before if _users_module(sys.modules.get(m))]:
                    del sys.modules[name]
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return imports


def _users_module(module: Any) -> bool:
    """A module of the user's (the spec file's kernels), not a library nor flyship: a file outside any
    site-packages / dist-packages folder and outside the standard library."""
    import sysconfig

    name = getattr(module, "__name__", "") or ""
    path = getattr(module, "__file__", None)
    if not path or name == "flyship" or name.startswith("flyship."):
        return False
    parts = Path(path).resolve().parts
    if "site-packages" in parts or "dist-packages" in parts:
        return False
    stdlib = {str(Path(p).resolve()) for k, p in sysconfig.get_paths().items() if k in ("stdlib", "platstdlib")}
    return not any(str(Path(path).resolve()).startswith(s + os.sep) for s in stdlib)


def merge(imports: list[TargetImport]) -> SpecFile:
    """One SpecFile whose ops build, for each target, what that target's import declared.

    Raises:
        CompileError: the imports name another namespace or references module, or declare one op with
            another schema (args, reference, grid, backward, tuning key).
    """
    first = imports[0].spec_file
    if len(imports) == 1:
        return first
    for imp in imports[1:]:
        for field in ("namespace", "references", "composites"):
            if getattr(imp.spec_file, field) != getattr(first, field):
                raise CompileError(
                    f"spec file {first.path}: expected one {field} on every target, got "
                    f"{getattr(first, field)!r} when imported for {_names(imports[0])} and "
                    f"{getattr(imp.spec_file, field)!r} for {_names(imp)}; declare it the same on every target")
    ops = []
    for name in _ordered_union([[o.name for o in imp.spec_file.ops] for imp in imports]):
        present = [(imp, o) for imp in imports for o in imp.spec_file.ops if o.name == name]
        ops.append(_merge_op(first.path, present, everywhere=len(present) == len(imports)))
    return SpecFile(path=first.path, namespace=first.namespace, references=first.references, ops=ops,
                    composites=first.composites)


def _merge_op(path: str, present: list[tuple[TargetImport, OpDecl]], everywhere: bool) -> OpDecl:
    imp0, base = present[0]
    for imp, d in present[1:]:
        other = [f for f in _OP_FIELDS if not _same(getattr(d, f), getattr(base, f))]
        if other:
            raise CompileError(
                f"spec file {path}: op {base.name}: expected one declaration on every target, got other "
                f"{', '.join(other)} when imported for {_names(imp0)} and for {_names(imp)}; an op's schema is the "
                "same on every target: vary its specs instead (Spec(per_target=...), Spec(targets=...))")
    specs = []
    for sn in _ordered_union([[s.name for s in d.specs] for _, d in present]):
        have = [(imp, s) for imp, d in present for s in d.specs if s.name == sn]
        if everywhere and len(have) == len(present) and all(_same(s, have[0][1]) for _, s in have):
            specs.append(have[0][1])
            continue
        if base.tuning is not None:
            raise CompileError(
                f"spec file {path}: op {base.name}: its config space (configs=) declares spec {sn!r} differently "
                f"per target ({', '.join(_names(imp) for imp, _ in have)}); declare one config space for every "
                "target and limit configs with prune=")
        specs.append(_per_target_spec(sn, have))
    return dataclasses.replace(base, specs=tuple(specs))


def _per_target_spec(name: str, have: list[tuple[TargetImport, Spec]]) -> Spec:
    """A spec built, on each target whose import declared it (and whose ``targets=`` admits it), as that import
    declared it; on no other target."""
    forms: dict[str, dict[str, Any]] = {}
    for imp, s in have:
        for t in imp.targets:
            if _spec.admits(s.targets, t):
                form = s.for_target(t.text)
                forms[t.text] = {k: getattr(form, k) for k in _spec.PER_TARGET_FIELDS}
    if not forms:  # no requested target builds it: plan() notes that, naming its own targets
        return have[0][1]
    return Spec(name, dtypes={}, shapes={}, targets=tuple(forms), per_target=forms)


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # a value whose == raises (an array, a DSL object) compares unequal
        return False


def _ordered_union(lists: list[list[str]]) -> list[str]:
    """Every name once, each list's order kept: a name new to the result goes right before the next name of its
    list already there (the last, when none is)."""
    out: list[str] = []
    for names in lists:
        for k, n in enumerate(names):
            if n in out:
                continue
            after = next((m for m in names[k + 1:] if m in out), None)
            out.insert(out.index(after) if after is not None else len(out), n)
    return out


def _names(imp: TargetImport) -> str:
    return ", ".join(t.text for t in imp.targets)


def load_for_targets(spec_path: str, targets: list[_targets.TargetID],
                     load: Callable[[str], SpecFile]) -> tuple[list[TargetImport], SpecFile]:
    """The per-target imports and their merge (:func:`import_per_target`, :func:`merge`). Targets whose import
    declares no op (a spec file whose ops are all gated on gfx950, built with ``--arch gfx942 --arch gfx950``)
    build nothing, said on stderr; the others build.

    Raises:
        SpecError: no target's import declares an op (naming the targets).
    """
    imports = import_per_target(spec_path, targets, load)
    empty = [imp for imp in imports if not imp.spec_file.ops]
    if len(empty) == len(imports):
        raise SpecError(f"spec file {spec_path}: declares no ops for any target "
                        f"({', '.join(t.text for imp in imports for t in imp.targets)}); call op(...) (an op gated on "
                        "the target, e.g. on FLYDSL_GPU_ARCH, is declared only where its condition holds)",
                        kind=_spec.NO_OPS)
    if empty:
        built = ", ".join(t.text for imp in imports if imp.spec_file.ops for t in imp.targets)
        full = next(imp.spec_file for imp in imports if imp.spec_file.ops)
        imports = [imp if imp.spec_file.ops else dataclasses.replace(imp, spec_file=SpecFile(
            path=full.path, namespace=full.namespace, references=full.references, composites=full.composites))
            for imp in imports]
        print(f"flyc-build: spec file {spec_path} declares no ops for "
              f"{', '.join(t.text for imp in empty for t in imp.targets)} (its import there called no op()); "
              f"building the ops declared for {built}", file=sys.stderr)
    return imports, merge(imports)


__all__ = ["TargetImport", "import_per_target", "load_for_targets", "merge", "planning_groups"]
