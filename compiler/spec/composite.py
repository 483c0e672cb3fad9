"""The spec API's composite ops (schema 1.4): ops written in torch code that compose the bundle's ops and torch ops.

A composite is a function of the references module (copied into the bundle and checked by its sha256, so loading
runs only the bundle's own code), called as ``function(ops, *args)`` with ``ops`` = ``torch.ops.<namespace>``. It
holds the host steps between launches (``dW = partial.sum(0).to(w.dtype)``, ``n = (target != ignore).sum()``) and
makes a whole training op one op of ``flyship.load``: its gradients come from the autograd pairs of the ops it calls.
See docs/training.md.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Sequence

from flyship.bundle import model as _m
from flyship.bundle import rules as _rules
from flyship.bundle.errors import BundleError
from flyship.compiler.spec.params import Scalar, Tensor, Workspace
from flyship.errors import SpecError


def composite_entry(name: str, function: str, args: Sequence[Tensor | Scalar], returns: Sequence[str],
                    doc: str = "", workspaces: Sequence[Workspace] = ()) -> _m.Composite:
    """The manifest entry of a composite, checked by the rule book's rules for composites that need no bundle.

    Raises:
        SpecError: naming the composite and the bad argument.
    """
    where = f"composite {name}"
    if isinstance(returns, str) or not all(isinstance(r, str) for r in returns):
        raise SpecError(f"{where}: returns= expects a list of names of the returned tensors, got {returns!r}; e.g. "
                        "returns=['loss']")
    out = []
    for a in args:
        if isinstance(a, Tensor):
            if a.mutable or a.batch or a.alignment is not None or a.pointee is not None:
                said = [k for k, v in (("mutable=True", a.mutable), ("batch=True", a.batch),
                                       (f"alignment={a.alignment}", a.alignment is not None),
                                       (f"pointee={a.pointee!r}", a.pointee is not None)) if v]
                raise SpecError(f"{where}: argument {a.name!r}: a composite's Tensor takes name and rank only, got "
                                f"{', '.join(said)}; the ops it calls own those declarations and their checks, and "
                                f"the composite passes {a.name!r} on to them unchanged: declare {said[0]} on the "
                                f"Tensor of the op that takes {a.name!r} (batch=True: that op flattens the leading "
                                "dims; mutable=True: that op writes it in place) and Tensor("
                                f"{a.name!r}, rank={a.rank}) here (docs/training.md, \"What a composite's args may "
                                "not say\")")
            out.append(_m.Arg(name=a.name, kind="tensor", rank=a.rank))
        elif isinstance(a, Scalar):
            out.append(_m.Arg(name=a.name, kind=a.type, default=a.default))
        else:
            raise SpecError(f"{where}: args= takes Tensor(...) and Scalar(...), got {type(a).__name__}")
    if isinstance(workspaces, Workspace) or not all(isinstance(w, Workspace) for w in workspaces):
        raise SpecError(f"{where}: workspaces= expects a list of Workspace(...), got {workspaces!r}; e.g. "
                        "workspaces=[Workspace('partial', shape=('device.cu_count', 'x.shape[1]'), zero=True)]")
    spaces = tuple(_m.Workspace(name=w.name, shape=tuple(w.shape), dtype=w.dtype, zero=w.zero) for w in workspaces)
    entry = _m.Composite(name=name, doc=doc, function=function, args=tuple(out), returns=tuple(returns),
                         workspaces=spaces)
    try:
        _rules.check_name(name, f"{where} name")
        _rules.check_name(function, f"{where} function")
        _rules.check_args(entry.args, where)
        _rules.check_composite_workspaces(entry, where)
    except BundleError as e:
        raise SpecError(str(e)) from None
    return entry


def check_composite_functions(path: Path, composites: Sequence[_m.Composite]) -> None:
    """Each composite's function, read from the references module's source (not run), takes ``ops``, then the
    composite's arguments, then its workspaces: a count that differs would fail only at the first call, in the
    workload.

    Raises:
        SpecError: naming the composite, the function and both counts.
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    defs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for c in composites:
        fn = defs.get(c.function)
        if fn is None or fn.args.vararg is not None:
            continue  # a missing function is check_references_module's refusal; *args takes any count
        params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
        needed = len(params) - len(fn.args.defaults)
        passed = [a.name for a in c.args] + [w.name for w in c.workspaces]
        if not needed <= 1 + len(passed) <= len(params):
            also = f" and its {len(c.workspaces)} workspaces" if c.workspaces else ""
            raise SpecError(f"composite {c.name}: {path.name}'s {c.function}({', '.join(params)}) is called as "
                            f"{c.function}(ops, {', '.join(passed)}); expected it to take ops and "
                            f"then the {len(c.args)} declared arguments{also}")
