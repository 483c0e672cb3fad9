"""Rules on one variant: its target, code object entry, metadata, kernargs, launch and workspaces."""

from __future__ import annotations

from flyship.bundle import expr as _expr
from flyship.bundle import limits as L
from flyship.bundle import model as _m
from flyship.bundle import targets as _targets
from flyship.bundle.errors import BundleError
from flyship.bundle.rules.common import SHA256 as _SHA256
from flyship.bundle.rules.common import count as _count
from flyship.bundle.rules.common import fail as _fail
from flyship.bundle.rules.expressions import check_expression
from flyship.bundle.rules.files import check_relative_path
from flyship.bundle.rules.layout import check_fields, check_layout
from flyship.bundle.rules.names import check_name
from flyship.bundle.rules.resources import check_metadata, check_resources
from flyship.bundle.rules.values import check_block


def check_workspace_dtype(dtype: object, where: str) -> None:
    """A workspace's element type is one of the manifest's dtype names (the spec API asks this too)."""
    if dtype not in _m.DTYPES:
        raise _fail(where, f"expected a dtype name ({', '.join(_m.DTYPES)}), got {dtype!r}")


def check_launch_count(launches: tuple | list, where: str) -> None:
    """At most ``MAX_LAUNCHES`` kernel launches in one call (the C++ core refuses more: csrc/plan.cpp)."""
    _count(launches, L.MAX_LAUNCHES, "launches", where)


def check_workspaces(workspaces: tuple[_m.Workspace, ...], slots: dict[str, _expr.Slot],
                     inputs: dict[str, _expr.Slot], where: str) -> None:
    """A variant's workspaces: identifiers unique among themselves and the op's arguments and outputs, a known
    dtype, a shape of at most ``MAX_RANK`` expressions over the inputs and the device's properties
    (``device.cu_count``: a buffer of one row per SM/CU, sized on the device that runs the call; the loader checks
    each size is >= 0 and the bytes fit int64 per call). Unlike an output's, a workspace's shape may read the
    device: a workspace never leaves the call, so fake kernels and torch.compile never see it."""
    _count(workspaces, L.MAX_WORKSPACES, "workspaces", f"{where}.workspaces")
    seen: set[str] = set()
    for i, w in enumerate(workspaces):
        ww = f"{where}.workspaces[{i}]"
        check_name(w.name, f"{ww}.name")
        if w.name in slots or w.name in seen or w.name == "device":
            raise _fail(f"{ww}.name", f"workspace name {w.name!r} repeats an argument, output or workspace name")
        seen.add(w.name)
        check_workspace_dtype(w.dtype, f"{ww}.dtype")
        if len(w.shape) > L.MAX_RANK:
            raise _fail(f"{ww}.shape", f"expected a rank up to {L.MAX_RANK}, got {len(w.shape)}")
        for j, e in enumerate(w.shape):
            check_expression(e, inputs, f"{ww}.shape[{j}]")


def check_variant(v: _m.Variant, slots: dict[str, _expr.Slot], where: str, workspaces: tuple[str, ...] = ()) -> None:
    """One launch's rules: its target, code object entry, metadata, kernarg layout and launch (``workspaces``:
    the names its ``workspace`` fields may use)."""
    try:
        tid = _targets.parse_target(v.target)
    except BundleError as e:
        raise _fail(f"{where}.target", str(e)) from None
    co = v.code_object
    if co.format not in _m.CODE_OBJECT_FORMATS:
        raise _fail(f"{where}.code_object.format", f"expected one of {', '.join(_m.CODE_OBJECT_FORMATS)}, "
                                                   f"got {co.format!r}")
    want = "hsaco" if tid.vendor == "amd" else "cubin"
    if co.format != want:
        raise _fail(f"{where}.code_object.format", f"a {tid.vendor} target takes {want} code objects, got {co.format}")
    check_relative_path(co.file, f"{where}.code_object.file")
    if not _SHA256.match(co.sha256):
        raise _fail(f"{where}.code_object.sha256", f"expected 64 lowercase hex digits, got {co.sha256!r}")
    if not co.symbol or len(co.symbol) > L.MAX_STRING:
        raise _fail(f"{where}.code_object.symbol", f"expected a kernel symbol, got {co.symbol!r}")
    check_metadata(v.metadata, f"{where}.metadata")
    check_fields(v.kernargs, slots, f"{where}.kernargs", workspaces)
    check_layout(v.kernargs, v.metadata, where)
    for j, e in enumerate(v.launch.grid):
        check_expression(e, slots, f"{where}.launch.grid[{j}]")
        lit = _expr.int_literal(e)
        if lit is not None and not 0 <= lit <= L.MAX_GRID:
            raise _fail(f"{where}.launch.grid[{j}]", f"expected a grid dimension in 0..{L.MAX_GRID}, got {lit}")
    check_expression(v.launch.dynamic_lds, slots, f"{where}.launch.dynamic_lds")
    lit = _expr.int_literal(v.launch.dynamic_lds)
    if lit is not None and not 0 <= lit <= L.MAX_RESOURCE:
        raise _fail(f"{where}.launch.dynamic_lds", f"expected 0..{L.MAX_RESOURCE} bytes, got {lit}")
    check_block(v.launch.block, f"{where}.launch.block")
    check_resources(v.metadata, v.launch.block, v.target, where)


# ---------------------------------------------------------------------------------------------
# Files
