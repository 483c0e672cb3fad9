"""Checks of what the spec file declares that need the whole declaration: the references module (it must stand
alone, and agree with the ``Output`` rules at each example), constant guard constraints, and specializations
that an earlier one always shadows."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any, Optional

from flyship.bundle import expr as _expr
from flyship.bundle import manifest as M
from flyship.compiler.spec import SpecFile, Tensor
from flyship.errors import CompileError, traceback_text


def needed_references(sf: Any) -> dict[str, str]:
    """What a spec file's references module must define: ``"op NAME: reference"`` / ``"composite NAME: function"``
    (the declaration's own words, for the message) -> the function's name."""
    return ({f"op {o.name}: reference": o.reference for o in sf.ops if o.reference}
            | {f"composite {c.name}: function": c.function for c in sf.composites})


def check_references_module(path: Path, needed: dict[str, str]) -> None:
    """The references module is copied into the bundle alone and run in the workload Python (torch, no FlyDSL):
    it may import torch and the standard library, nothing relative, and must define every reference an op
    names (``needed``: :func:`needed_references`).

    Raises:
        CompileError: naming the module, the import or the missing function.
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    stdlib = getattr(sys, "stdlib_module_names", frozenset())
    for node in ast.walk(tree):
        mods = []
        if isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                raise CompileError(f"references module {path}: relative import at line {node.lineno}; only "
                                   f"{path.name} is copied into the bundle, so it must stand alone")
            mods = [node.module or ""]
        for m in mods:
            top = m.split(".")[0]
            if top != "torch" and top not in stdlib:
                raise CompileError(f"references module {path}: imports {m!r}; it is copied into the bundle and run in "
                                   "the workload Python, which has torch and the standard library only")
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    defined |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    for where, fn in sorted(needed.items()):
        if fn not in defined:
            raise CompileError(f"{where}={fn!r} is not defined in {path}; it defines "
                               f"{', '.join(sorted(d for d in defined if not d.startswith('_'))) or 'nothing'}")


def _example_tensor(torch: Any, shape: tuple[int, ...], dtype: str, random: bool, written: bool = False) -> Any:
    """A CPU example tensor for a reference check: zeros, or (for an op that writes inputs in place, whose effect
    must show) seeded random floats. Integer and bool tensors stay zero (they are often indices or positions, and
    zero is in range for any of them), except one the op writes in place: that one gets seeded random values in
    [2, 100), so a reference that zeroes it, fills it with -1/0/1 or counts up from it visibly changes it."""
    dt = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(0)
    if written and dt == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).to(dt)
    if written and not dt.is_floating_point and not dt.is_complex:
        return torch.randint(2, 100, shape, generator=gen).to(dt)  # in range for every integer dtype, uint8 included
    if not (random or written) or not dt.is_floating_point or (dt.itemsize == 1 and not written):
        return torch.zeros(shape, dtype=dt)
    return torch.rand(shape, generator=gen).to(dt) + 0.5


def _check_reference_arity(op: Any, fn: Any, where: str) -> None:
    """Refuse a reference that cannot take the op's inputs, naming the inputs it does not take: the usual cause
    is an output declared as an input ``Tensor`` (forgotten ``Output``), which the reference rightly does not take.

    Raises:
        CompileError: the reference's parameters against the op's inputs, and what to declare.
    """
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # a builtin or C function: the call below says what it says
    names = [a.name for a in op.inputs]
    try:
        sig.bind(*names)
        return
    except TypeError:
        pass
    params = [p.name for p in sig.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    extra = [n for n in names if n not in params]
    tensors = [n for n in extra if isinstance(next(a for a in op.inputs if a.name == n), Tensor)]
    hint = (f"; {', '.join(tensors)} {'is' if len(tensors) == 1 else 'are'} declared as input Tensor(...), which the "
            f"reference does not take: if the kernel writes {'it' if len(tensors) == 1 else 'them'}, declare "
            f"{', '.join(f'Output({n!r}, ...)' for n in tensors)} (the loader allocates it and the reference returns "
            f"it) or Tensor(..., mutable=True) (written in place); else make {op.reference}() take "
            f"{'it' if len(tensors) == 1 else 'them'}" if tensors else
            f"; make {op.reference}() take the op's inputs in this order")
    raise CompileError(f"{where}: expected reference {op.reference}({', '.join(params)}) to take the op's "
                       f"{len(names)} inputs ({', '.join(names)}), got a function of {len(params)} positional "
                       f"parameter(s){hint}")


def mutable_written(op_name: str, results: dict) -> set[str]:
    """The inputs some launch of some variant of ``op_name`` stores through (the write check's finding): what
    ``op(..., mutable=True)`` makes mutable in the manifest."""
    return {n for (o, _s, _t), v in results.items() if o == op_name for step in (v, *v.then)
            for n in getattr(step, "writes", ())}


def check_reference_outputs(sf: SpecFile, references_path: Path,
                            resolved: Optional[dict[str, set[str]]] = None) -> None:
    """Call each op's reference on each specialization's example (zero-filled CPU tensors) and compare what it
    returns with the op's ``Output`` rules: a shape or dtype rule that disagrees with the reference would
    otherwise show only at the first call (an output of the wrong size, a verify failure).

    Args:
        resolved: after the compile, ``op(..., mutable=True)`` op -> the inputs its kernels store through (the
            write check's finding): only those ops are checked, against that set. Without it (before the
            compile) such an op's written set is not known yet: its reference may write any input in place.

    Raises:
        CompileError: naming the op, the spec, the output, the rule's shape and the reference's.
    """
    import torch  # the build Python has it (FlyDSL imports it); imported only when references are checked

    mod_spec = importlib.util.spec_from_file_location("_flyship_references_check", references_path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    for op in sf.ops:
        if not op.reference or (resolved is not None and op.name not in resolved):
            continue
        fn = getattr(mod, op.reference)
        unknown = op.mutable_written and resolved is None  # mutable=True before the compile tells what it writes
        for s in (form for spec in op.specs for _, form in spec.resolved()):
            shapes = op.example_shapes(s)
            scalars = op.example_scalars(s)
            if any(v is None for v in scalars.values()):
                continue  # no example value to call with; the frontend reports the missing scalar
            written = [a.name for a in op.inputs if isinstance(a, Tensor)
                       and (a.mutable or unknown or a.name in (resolved or {}).get(op.name, ()))]
            args = [_example_tensor(torch, s.shapes[a.name], s.dtypes[a.name], random=bool(written),
                                    written=a.name in written)
                    if isinstance(a, Tensor) else scalars[a.name] for a in op.inputs]
            before = {a.name: t.clone() for a, t in zip(op.inputs, args) if a.name in written}
            where = f"op {op.name} spec {s.name}"
            what = "random values" if written else "zeros"
            _check_reference_arity(op, fn, where)
            try:
                with torch.no_grad():
                    got = fn(*args)
            except Exception as e:
                raise CompileError(f"{where}: reference {op.reference}() failed on the example inputs ({what} of "
                                   f"shapes {dict(s.shapes)}): {type(e).__name__}: {e}",
                                   details=traceback_text(e)) from e  # the reference's bug: its traceback too
            returned = got
            got = list(got) if isinstance(got, (tuple, list)) else [] if got is None and written else [got]
            if len(got) != len(op.outputs):
                said = "the inputs it stores through" if unknown else ", ".join(written)
                hint = (f"; the kernel writes {said} in place, so the reference must write "
                        f"{'it' if len(written) == 1 else 'them'} in place "
                        f"(e.g. {written[0]}.copy_(new_value)) and return only the outputs"
                        if written and len(got) > len(op.outputs) else
                        f"; return {', '.join(o.name for o in op.outputs)} from {op.reference}()" if op.outputs else "")
                found = "None" if returned is None else f"{len(got)}"
                raise CompileError(f"{where}: expected reference {op.reference}() to return {len(op.outputs)} "
                                   f"tensor(s) ({', '.join(o.name for o in op.outputs) or 'None'}), got {found}{hint}")
            for a, t in zip(op.inputs, args):
                if a.name in written and not unknown and torch.equal(t, before[a.name]):
                    raise CompileError(f"{where}: expected reference {op.reference}() to write {a.name} in place (the "
                                       f"kernel does: Tensor({a.name!r}, mutable=True)), got {a.name} unchanged after "
                                       f"a call on random example values; if the kernel writes {a.name}, write it "
                                       f"in place in the reference, e.g. {a.name}.copy_(...); if the kernel writes "
                                       "another input instead, declare that one mutable (op(..., mutable=True) "
                                       "takes exactly the inputs the kernel stores through, as the compile finds "
                                       "them)")
            for o, t in zip(op.outputs, got):
                want_dtype = op.output_dtype_for(o, s)
                if tuple(t.shape) != tuple(shapes[o.name]) or str(t.dtype) != f"torch.{want_dtype}":
                    raise CompileError(
                        f"{where}: output {o.name}: expected the reference's result to match the output rule "
                        f"(shape {list(op.output_shape(o))} = {list(shapes[o.name])}, dtype {want_dtype}), got shape "
                        f"{list(t.shape)}, dtype {str(t.dtype).removeprefix('torch.')} from {op.reference}() at the "
                        "example; fix the Output's shape=/dtype= rule (or the reference)")


def check_resolved_references(sf: SpecFile, variants: dict) -> None:
    """After the compile: check each ``op(..., mutable=True)`` op's reference against the inputs its kernels
    store through (:func:`mutable_written`), which the check before the compile could not know.

    Raises:
        CompileError: as :func:`check_reference_outputs`.
    """
    resolved = {op.name: mutable_written(op.name, variants) for op in sf.ops if op.mutable_written and op.reference}
    if resolved and sf.references:
        check_reference_outputs(sf, (Path(sf.path).parent / sf.references).resolve(), resolved)


def guard_constraints(where: str, constraints: tuple[str, ...]) -> tuple[str, ...]:
    """The constraints a guard keeps: one that reads nothing of the call (``1024 <= 2147483647``, from a constant
    ``Value`` feeding the launcher's arithmetic) is decided here: a true one is dropped, a false one fails the
    build (no call could ever take the specialization).

    Raises:
        CompileError: a constant constraint that is false, naming it.
    """
    kept = []
    for c in constraints:
        if not _expr.is_constant(c):
            kept.append(c)
        elif not _expr.evaluate_with_shapes(c, {}):
            raise CompileError(f"{where}: expected every guard constraint to hold for some call, got {c!r}, which "
                               "reads nothing of the call and is false; no call could take this specialization: fix "
                               "the spec's constraint, or the constant Value / constexpr it was computed from")
    return tuple(kept)


def check_reachable(op_name: str, specs: list[M.Specialization]) -> None:
    """Specializations are tried in order: refuse one that an earlier one always takes first (same dtypes, the
    earlier guard's constraints a subset of its own, no stricter alignment, built for at least its targets).
    The test is syntactic, so it catches the usual mistake (a general spec listed before a narrower one)
    without claiming to decide every implication between constraints.

    Raises:
        CompileError: naming both specializations and what to change.
    """
    for j, later in enumerate(specs):
        for earlier in specs[:j]:
            g0, g1 = earlier.guard, later.guard
            if (g0.dtypes == g1.dtypes and set(g0.constraints) <= set(g1.constraints)
                    and all(a <= g1.alignment.get(k, 1) for k, a in g0.alignment.items())
                    and {v.target for v in later.variants} <= {v.target for v in earlier.variants}):
                jit = any(s.name == later.name + "__generic" for s in specs)  # Triton's default JIT variant
                raise CompileError(
                    f"op {op_name}: expected every specialization to be reachable, got {later.name!r} behind "
                    f"{earlier.name!r}, which accepts every call {later.name!r} accepts (same dtypes, constraints "
                    f"{list(g0.constraints)} all among {later.name!r}'s) and is tried first; list {later.name!r} "
                    f"before {earlier.name!r} or give {earlier.name!r} a constraint that excludes its calls"
                    + (f"; {later.name!r} is the JIT-like variant flyship builds by default for a Triton spec without "
                       f"options['specialize'] (since round 2, beside {later.name + '__generic'!r}): set "
                       f"options={{'specialize': 'declared'}} on spec {later.name!r} to build only what it declares"
                       if jit else ""))
