"""The manifest's schema version, and which version a bundle is written with: the must-understand keys (features a
loader of an older major would ignore but must not) and the lowest major that covers those a manifest uses
(docs/bundle-format.md, "Must-understand keys"). :mod:`flyship.bundle.model` re-exports every name here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flyship.bundle import expr as _expr

if TYPE_CHECKING:
    from flyship.bundle.model import Manifest

SCHEMA_MAJOR, SCHEMA_MINOR = 1, 5
SCHEMA_VERSION = f"{SCHEMA_MAJOR}.{SCHEMA_MINOR}"
# Keys a reader must understand, with the first major version whose readers do (docs/bundle-format.md,
# "Must-understand keys"): later launches of a call, workspaces and inputs written in place came with 2.x, outputs
# allocated zero-filled with 3.x, backward ops that overwrite saved tensors and composite ops with 4.x, the forward of
# an autograd pair that writes an input in place (``dirty``, as ctx.mark_dirty) and composites that receive
# workspaces (schema 1.5) with 5.x, outputs whose dtype differs per target (``outputs[].target_dtypes``) with 6.x.
# A bundle is written with the lowest major that covers every such key it uses, so a
# loader that would ignore one refuses the bundle's major with its version message instead of running it wrongly.
# Every other bundle is written as 1.5.
MUST_UNDERSTAND = {"then": 2, "workspaces": 2, "mutable": 2, "zero": 3, "consumes": 4, "composites": 4,
                   "device_workspaces": 4, "dirty": 5, "composite_workspaces": 5, "target_dtypes": 6}
# major -> the newest minor this flyship knows; a newer minor of a known major is read leniently (unknown keys
# ignored), an unknown major is refused. Each major's newest minor has the keys of 1.x's newest (1.5: every
# composite writes its `workspaces`, which a 4.0 reader would refuse as an unknown key; it reads 4.1 leniently).
# 6.0 has them and one more, ``outputs[].target_dtypes``, the one key written only when not empty (so every
# bundle that does not use it keeps its bytes and its version), which no older reader knows.
NEWEST_MINOR = {1: SCHEMA_MINOR, 2: 3, 3: 2, 4: 1, 5: 0, 6: 0}
# Keys written only when they hold something (class name, field name): readers give them their default when absent.
OMITTED_WHEN_EMPTY = frozenset({("Output", "target_dtypes")})


def must_understand(m: Manifest) -> tuple[str, ...]:
    """What ``m`` uses that a 1.x loader would ignore but must not: ``then`` (it would run only a call's first
    launch), ``workspaces``, ``mutable`` (it would register an in-place op as a functional one), ``zero`` (it
    would hand an accumulating kernel uninitialised outputs), ``consumes`` (a backward op that overwrites a saved
    tensor: an older rule book refuses the pair with a misleading message), ``composites`` (the ops the bundle
    promises would be missing), ``device_workspaces`` (a workspace sized by ``device.cu_count``: an older rule
    book refuses it as a shape that must not read the device, which blames the bundle instead of the loader),
    ``dirty`` (the forward of an autograd pair writes an input in place: a 4.x rule book refuses the pair, and a
    4.x loader would not rebase the input's autograd history), ``composite_workspaces`` (a composite that receives
    workspaces: an older loader would call its function without them), ``target_dtypes`` (an output whose dtype
    differs per target: an older loader would allocate every target's output with one dtype)."""
    found = []
    variants = [v for op in m.ops for s in op.specializations for v in s.variants]
    if any(v.then for v in variants):
        found.append("then")
    if any(v.workspaces for v in variants):
        found.append("workspaces")
    if any(_expr.names_device(e) for v in variants for w in v.workspaces for e in w.shape):
        found.append("device_workspaces")
    if any(a.mutable for op in m.ops for a in op.args):
        found.append("mutable")
    if any(o.zero for op in m.ops for o in op.outputs):
        found.append("zero")
    names = {op.name for op in m.ops}
    if any(op.backward.consumed(m.op(op.backward.op)) for op in m.ops
           if op.backward is not None and op.backward.op in names):
        found.append("consumes")
    if m.composites:
        found.append("composites")
    if any(op.backward is not None and op.mutable for op in m.ops):
        found.append("dirty")
    if any(c.workspaces for c in m.composites):
        found.append("composite_workspaces")
    if any(o.target_dtypes for op in m.ops for o in op.outputs):
        found.append("target_dtypes")
    return tuple(found)


def version_for(m: Manifest) -> str:
    """The schema version a writer gives ``m``: the newest minor of the lowest major whose readers understand every
    must-understand key ``m`` uses (:data:`MUST_UNDERSTAND`), 1.x for a bundle that uses none."""
    major = max((MUST_UNDERSTAND[k] for k in must_understand(m)), default=SCHEMA_MAJOR)
    return f"{major}.{NEWEST_MINOR[major]}"
