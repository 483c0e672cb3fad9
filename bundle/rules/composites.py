"""Rules on composite ops (schema 1.4): ops composed in torch code from the bundle's ops, run from the bundle's
references module."""

from __future__ import annotations

from flyship.bundle import limits as L
from flyship.bundle import model as _m
from flyship.bundle.rules.common import count as _count
from flyship.bundle.rules.common import fail as _fail
from flyship.bundle.rules.names import check_name
from flyship.bundle.rules.ops import check_args
from flyship.bundle.rules.variants import check_workspaces


def check_composites(m: _m.Manifest) -> None:
    """Each composite: an identifier name unique among the bundle's ops and composites, a function of the references
    module (the only code a bundle runs besides its kernels, checked by ``references_sha256``), arguments as an op's
    (none written in place, none batched: the ops it calls own those) and at least one returned tensor, named once.

    Raises:
        BundleError: naming the JSON path (``composites[0].function`` ...).
    """
    _count(m.composites, L.MAX_OPS, "composites", "manifest composites")
    taken = {op.name for op in m.ops}
    for i, c in enumerate(m.composites):
        where = f"manifest composites[{i}]"
        check_name(c.name, f"{where}.name")
        if c.name in taken:
            raise _fail(f"{where}.name", f"expected a name no op or composite of the bundle has, got {c.name!r}; "
                                         "rename the composite")
        taken.add(c.name)
        check_name(c.function, f"{where}.function")
        if m.references is None:
            raise _fail(f"{where}.function", f"composite {c.name} runs {c.function!r} of the references module, but "
                                             "the manifest names no references file; declare references(...) in "
                                             "the spec")
        _count(c.args, L.MAX_ARGS, "arguments", f"{where}.args")
        check_args(c.args, where)
        names = [a.name for a in c.args]
        for j, a in enumerate(c.args):
            check_name(a.name, f"{where}.args[{j}].name")
            if a.mutable or a.batch:
                raise _fail(f"{where}.args[{j}]", f"a composite's argument {a.name!r} is neither written in place nor "
                                                  "batched (the ops it calls declare those), got mutable="
                                                  f"{a.mutable}, batch={a.batch}")
        if len(set(names)) != len(names):
            raise _fail(f"{where}.args", f"argument names must be unique, got {names}")
        if not c.returns:
            raise _fail(f"{where}.returns", "expected at least one returned tensor, got none")
        _count(c.returns, L.MAX_OUTPUTS, "returned tensors", f"{where}.returns")
        for j, r in enumerate(c.returns):
            check_name(r, f"{where}.returns[{j}]")
        if len(set(c.returns)) != len(c.returns) or set(c.returns) & set(names):
            raise _fail(f"{where}.returns", f"returned names must be unique and differ from the arguments' "
                                            f"({', '.join(names)}), got {list(c.returns)}")
        check_composite_workspaces(c, where)


def check_composite_workspaces(c: _m.Composite, where: str) -> None:
    """(1.5) What the loader allocates per call and passes after a composite's arguments: shapes over its arguments
    and the device (``device.cu_count``), names apart from the arguments and the returns, a known dtype."""
    if c.workspaces and not any(a.kind == "tensor" for a in c.args):
        raise _fail(f"{where}.workspaces", "expected a tensor argument for the workspaces to be allocated beside (on "
                                           "its device), got none; declare the tensor the composite works on")
    head = _m.composite_head(c)
    slots = _m.slots(head)
    check_workspaces(c.workspaces, slots, {k: v for k, v in slots.items() if k not in c.returns}, where)
