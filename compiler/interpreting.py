"""``flyc-build --verify`` for Triton ops: what each launch of each specialization runs under Triton's interpreter.

An sm_* cubin cannot execute without an NVIDIA GPU, so ``--verify`` runs the kernel's *source* under Triton's
interpreter (``TRITON_INTERPRET=1``) instead, through the op's real launch path: the loader's recording driver
gives each launch's grid and kernarg bytes, and :mod:`flyship.loader.tools.verify_interpreted` turns them back into
the kernel's arguments. What it cannot read from the bundle comes from here, as plain data (the loader never imports
the compiler): for every launch of every specialization, the kernel's module file and qualified name, the constexprs
the build compiled in (the spec's, and int parameters Triton compiles as the constant 1), and the sha256 of every
user file the kernel reaches (:func:`flyship.compiler.kernel_sources.kernel_sources`), so the interpreter runs the
user's code as it was built, or refuses.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

PLAN_FORMAT = "flyship-interpret-plan/1"


def _plain(v: Any) -> bool:
    return v is None or isinstance(v, (bool, int, float, str))


def _kernel_entry(jit_fn: Any, constexprs: dict[str, Any], where: str) -> dict[str, Any]:
    """One launch: the kernel's module file, qualified name, constexprs and the user files it reaches, hashed."""
    from flyship.compiler.kernel_sources import kernel_sources, underlying_function

    fn = underlying_function(jit_fn)
    if fn is None or not fn.__code__.co_filename:
        return {"refused": f"{where}: the kernel has no Python source file to interpret"}
    odd = sorted(k for k, v in constexprs.items() if not _plain(v))
    if odd:
        return {"refused": f"{where}: constexprs {odd} are not plain values (int, float, bool, str)"}
    return {"symbol": fn.__name__, "module": fn.__module__, "qualname": fn.__qualname__,
            "file": str(Path(fn.__code__.co_filename).resolve()), "constexprs": dict(constexprs),
            "files": kernel_sources(jit_fn)["files"]}


def interpret_plan(spec_path: str, archs: tuple[str, ...]) -> Optional[dict[str, Any]]:
    """The plan of every Triton op in ``spec_path`` (None when it has none): the target whose launches the
    interpreter replays (the first sm_* of ``archs``, else the first), and per op and specialization one entry per
    launch (:func:`_kernel_entry`, or ``{"refused": why}``)."""
    from flyship.compiler.frontends.triton.planning import plan
    from flyship.compiler.worker import load_spec_file

    if not archs:
        return None
    sf = load_spec_file(spec_path)
    target = next((a for a in archs if a.startswith("sm_")), archs[0])
    ops: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for op in sf.ops:
        if op.frontend != "triton":
            continue
        views = [(op.launch_view(launch), op) for launch in op.launches] or [(op, None)]
        per_spec: dict[str, list[dict[str, Any]]] = {}
        for spec in op.specs:
            entries = []
            for k, (view, scope) in enumerate(views, 1):
                where = f"op {op.name} spec {spec.name}" + (f" launch {k}" if scope is not None else "")
                try:
                    p = plan(view, spec, target, scope)
                except Exception as e:  # noqa: BLE001 - the build compiled it; say why it cannot be replayed
                    entries.append({"refused": f"{where}: {type(e).__name__}: {e}"})
                    continue
                entries.append(_kernel_entry(p.fn, p.constexprs, where))
            per_spec[spec.name] = entries
        ops[op.name] = per_spec
    if not ops:
        return None
    return {"format": PLAN_FORMAT, "target": target, "paths": [str(Path(spec_path).resolve().parent)], "ops": ops}


def write_plan(plan: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(plan, indent=1, sort_keys=True))
