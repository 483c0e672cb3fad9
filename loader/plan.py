"""Lower a manifest to the plan the C++ core runs (``csrc/plan.cpp``: ``parse_op``, ``parse_specs``).

Each op's head (slots, outputs) is lowered at load; its specializations when the core first uses the op (or once,
into the plan cache: :mod:`flyship.loader.plancache`): slots (argument positions), kernarg fields with their
offsets, and postfix programs (:func:`flyship.bundle.expr.compile_program`). Kinds, field types and opcodes travel
by the manifest's names ("tensor", "pointer", "i32", "cdiv"); the core maps each name to its code once, at plan
parse, so the codes exist only in C++ (``csrc/plan.h``, ``csrc/expr.h``; exported as ``PLAN_TABLES``). The plan
travels as plain dicts and lists, each built by the plan contract (:mod:`flyship.bundle.plan_contract`, from which
``csrc/plan_fields.h`` is generated: :func:`lower_by_contract`); its shape is versioned by ``PLAN_VERSION``
(``kPlanVersion`` in C++) and documented in ``docs/loader-internals.md``.
"""

from __future__ import annotations

import struct
from typing import Any, Callable, Optional

from flyship.bundle import expr as _expr
from flyship.bundle import limits as _limits
from flyship.bundle import manifest as _m
from flyship.bundle import plan_contract as _contract
from flyship.loader.cpu import mutable_hint

PLAN_VERSION = _limits.PLAN_VERSION  # one constant for both languages (csrc/limits.h is generated from it)
FLOAT_TYPES = ("f64", "f32", "f16", "bf16")
_PACK = {"ptr": "<Q", "u64": "<Q", "i64": "<q", "i32": "<i", "u32": "<I", "i16": "<h", "i8": "<b", "f64": "<d",
         "f32": "<f", "f16": "<e"}


def _bf16_bits(v: float) -> int:
    """bfloat16 bits of ``v``, rounded to nearest even (as c10::BFloat16 does)."""
    bits = struct.unpack("<I", struct.pack("<f", v))[0]
    if (bits & 0x7F800000) == 0x7F800000 and bits & 0x007FFFFF:  # NaN stays NaN
        return (bits >> 16) | 0x40
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF


def constant_word(field: _m.KernargField) -> int:
    """The little-endian bytes of a ``constant`` field's value, padded to 8 and read as an int64. The rule book
    (:func:`flyship.bundle.rules.check_fields`) has checked that the value fits the field's type."""
    v = field.value
    if field.type == "bf16":
        raw = struct.pack("<H", _bf16_bits(float(v)))
    elif field.type in FLOAT_TYPES:
        raw = struct.pack(_PACK[field.type], float(v))
    else:
        raw = struct.pack(_PACK[field.type], int(v))
    return struct.unpack("<q", raw.ljust(8, b"\0"))[0]


def implied_layout_constraints(op: _m.Op, variants: tuple[_m.Variant, ...],
                               guard: tuple[str, ...] = ()) -> dict[str, list[str]]:
    """Layout checks implied by the kernargs: a tensor dimension whose stride no variant passes must be
    row-major contiguous (``x.stride[d] == x.shape[d+1] * ... `` unless ``x.shape[d] <= 1``), unless the
    specialization's guard already pins that stride to a constant (``x.stride[0] == 1``: a FlyDSL kernel
    compiled for a column-major operand folds its unit stride into the code, and the guard says so).

    A kernel that receives a tensor's pointer but not one of its strides can only assume the row-major
    stride; a call with another layout would read or write the wrong elements. The compile stage should
    emit such guards itself; the loader adds them so a missing one falls back instead of corrupting.

    Returns:
        tensor name -> constraint texts, for every tensor that some variant receives as a pointer.
    """
    ranks = {a.name: a.rank for a in op.args if a.kind == "tensor"} | {o.name: len(o.shape) for o in op.outputs}
    launches = [t for v in variants for t in v.launches]  # every kernel of a multi-launch variant (1.2)
    pointers = [{f.arg for f in t.kernargs.fields if f.kind == "pointer"} for t in launches]
    strides = [{(f.arg, f.dim) for f in t.kernargs.fields if f.kind == "stride" and f.dim is not None}
               for t in launches]
    pins = _expr.pinned(guard)
    out: dict[str, list[str]] = {}
    for name, rank in ranks.items():
        takers = [st for ptrs, st in zip(pointers, strides) if name in ptrs]
        if not takers:
            continue
        # A stride counts as passed only if every kernel that takes the pointer passes it (the guard is per
        # specialization, and each launch must read the layout it was given).
        passed = {d for d in range(rank) if all((name, d) in st for st in takers)}
        texts = []
        for d in range(rank):
            pinned = pins.get((name, "stride", d), -1) >= 0
            if d in passed or pinned:
                continue
            expected = " * ".join(f"{name}.shape[{k}]" for k in range(d + 1, rank)) or "1"
            texts.append(f"{name}.shape[{d}] <= 1 or {name}.stride[{d}] == {expected}")
        if texts:
            out[name] = texts
    return out


def lower_by_contract(struct: str, obj: Any, computed: dict[str, Any]) -> dict[str, Any]:
    """One plan dict of ``struct``, keyed by the contract (:mod:`flyship.bundle.plan_contract`): each key with a
    ``source`` copied from ``obj``, every other key taken from ``computed``, which must hold exactly those.

    Raises:
        RuntimeError: ``computed`` lacks a key of the contract or holds one it does not declare (a flyship bug).
    """
    out: dict[str, Any] = {}
    for f in _contract.fields_of(struct):
        out[f.key] = _contract.source_value(obj, f) if f.source is not None else computed.get(f.key, computed)
    missing = sorted(k for k, v in out.items() if v is computed)
    extra = sorted(set(computed) - set(out))
    if missing or extra:
        raise RuntimeError(f"plan contract: the {struct} lowering lacks {missing} and adds {extra}; "
                           "bundle/plan_contract.py and flyship/loader/plan.py disagree")
    return out


def lower_program(text: str, slots: dict[str, _expr.Slot]) -> dict[str, Any]:
    """An expression as the core reads it (``parse_program``): its text and its postfix words."""
    return {"text": text, "code": _expr.compile_program(text, slots)}


def lower_workspaces(op: _m.Op, v: _m.Variant, slots: dict[str, _expr.Slot]) -> list[dict[str, Any]]:
    """A variant's workspaces as the core reads them: name, dtype, zero fill, shape programs over the inputs."""
    inputs_only = {k: s for k, s in slots.items() if s.index < len(op.args)}
    return [lower_by_contract("WorkspacePlan", w, {"shape": [lower_program(e, inputs_only) for e in w.shape]})
            for w in v.workspaces]


def lower_variant(op: _m.Op, spec: _m.Specialization, v: _m.Variant, slots: dict[str, _expr.Slot],
                  workspaces: Optional[tuple[str, ...]] = None) -> dict[str, Any]:
    """One variant as the core reads it (``parse_variant``); its code object's bytes are not part of it: the core
    asks the bundle's ``code_object`` callable for them when the variant is first loaded onto a device.
    A multi-launch variant (schema 1.2) carries its following launches (``then``, lowered alike) and its
    workspaces; a ``workspace`` field's slot is the workspace's index (``workspaces``: the names, for a
    following launch, whose workspaces are its variant's)."""
    if workspaces is None:
        workspaces = tuple(w.name for w in v.workspaces)
    programs: list[dict[str, Any]] = []

    def program(text: str) -> int:
        programs.append(lower_program(text, slots))
        return len(programs) - 1

    grid = [program(e) for e in v.launch.grid]
    dynamic_lds = program(v.launch.dynamic_lds)
    fields = []
    for f in sorted(v.kernargs.fields, key=lambda f: f.offset):
        label = f"{f.kernel_arg or f.kind} (offset {f.offset}, {f.type})"
        slot = dim = prog = -1
        constant = bytes_per_program = align = 0
        # The rule book (check_fields) has judged every field: its argument or workspace exists and has the
        # field's kind, its dimension is in 0..rank-1, its type fits its kind; here it is only lowered.
        if f.kind in ("pointer", "shape", "stride", "scalar"):
            slot = slots[f.arg].index
            if f.kind in ("shape", "stride"):
                dim = f.dim
        if f.kind == "workspace":
            slot = workspaces.index(f.arg)
        if f.kind == "expr":
            prog = program(f.expr or "")
        elif f.kind == "constant":
            constant = constant_word(f)
        elif f.kind == "scratch":
            bytes_per_program = int(f.bytes_per_program or 0)
            align = int(f.align or 256)
        fields.append(lower_by_contract("Field", f, {
            "slot": slot, "dim": dim, "program": prog, "constant": constant, "bytes_per_program": bytes_per_program,
            "align": align, "label": label}))
    return lower_by_contract("VariantPlan", v, {
        "fields": fields,
        "programs": programs,
        "grid": grid,
        "dynamic_lds": dynamic_lds,
        "then": [lower_variant(op, spec, t, slots, workspaces) for t in v.then],
        "workspaces": lower_workspaces(op, v, slots) if v.workspaces else [],
    })


def lower_op(op: _m.Op, namespace: str, spec_variants: Optional[list[int]] = None,
             n_code_objects: Optional[int] = None) -> dict[str, Any]:
    """One op's head as the core reads it at load (``parse_op``): slots, outputs and the number of variants of
    each specialization; the specializations themselves are :func:`lower_specs`'s, read on the op's first use.

    Args:
        op: the manifest op (its ``specializations`` may be empty when ``spec_variants`` is given).
        namespace: the torch namespace it registers under.
        spec_variants: the number of variants of each specialization (default: counted in ``op``).
        n_code_objects: the number of the op's variants and their following launches, each of which has a
            variant id (default: counted in ``op``).

    The op must have passed the rule book (:func:`flyship.bundle.rules.check_op`): lowering judges nothing.
    """
    slots = _m.slots(op)
    batched = {a.name for a in op.args if a.batch} | {o.name for o in op.outputs if o.batch}
    n_in = len(op.args)
    inputs_only = {k: s for k, s in slots.items() if s.index < n_in}
    outputs = []
    for o in op.outputs:
        # Only an input *tensor* gives a dtype (a scalar named like a dtype does not); C++ refuses any other slot.
        dtype_slot = slots[o.dtype].index if o.dtype in inputs_only and inputs_only[o.dtype].kind == "tensor" else -1
        outputs.append(lower_by_contract("OutputPlan", o, {
            "dtype_slot": dtype_slot,
            "dtype": "" if dtype_slot >= 0 else o.dtype,
            "shape": [lower_program(e, inputs_only) for e in o.shape],
        }))
    return lower_by_contract("OpPlan", op, {
        "qualname": f"{namespace}::{op.name}",
        "slots": [lower_by_contract("Slot", s, {"name": n, "kind": s.kind, "rank": s.rank, "batch": n in batched,
                                                "mutable": n in op.mutable}) for n, s in slots.items()],
        "n_inputs": n_in,
        "outputs": outputs,
        "spec_variants": [len(s.variants) for s in op.specializations] if spec_variants is None else spec_variants,
        "n_code_objects": (sum(1 + len(v.then) for s in op.specializations for v in s.variants)
                           if n_code_objects is None else n_code_objects),
        # The C++ fallback's words for a reference that returned what it should have written in place: the one
        # owner's (loader/cpu.py), so both paths name the op's own mutable inputs.
        "mutable_hint": mutable_hint(op),
    })


def lower_specs(op: _m.Op) -> list[dict[str, Any]]:
    """One op's specializations as the core reads them (``parse_specs``): guards (with the implied layout
    checks) and variants. Depends on the op alone (not on the namespace), so a plan cache may keep it. The op must
    have passed the rule book (:func:`flyship.bundle.rules.check_op`): lowering judges nothing.
    """
    slots = _m.slots(op)
    specs = []
    out_names = {o.name for o in op.outputs}
    for s in op.specializations:
        implied = implied_layout_constraints(op, s.variants, s.guard.constraints)
        constraints = [lower_program(c, slots) for c in s.guard.constraints]
        constraints += [lower_program(c, slots) for name, cs in implied.items() if name not in out_names for c in cs]
        out_constraints = [lower_program(c, slots) for name, cs in implied.items() if name in out_names for c in cs]
        specs.append(lower_by_contract("SpecPlan", s, {
            "dtypes": [[slots[t].index, d] for t, d in s.guard.dtypes.items()],
            "alignment": [[slots[t].index, int(a)] for t, a in s.guard.alignment.items()],
            "constraints": constraints,
            "out_constraints": out_constraints,
            "variants": [lower_variant(op, s, v, slots) for v in s.variants],
        }))
    return specs


def lower_bundle(heads: list[dict[str, Any]], namespace: str, references: list[Optional[Callable[..., Any]]],
                 specs: Callable[[int], list[dict[str, Any]]], code_object: Callable[[int], bytes],
                 blame: Callable[[int, dict[str, Any], str, str, bool], str]) -> dict[str, Any]:
    """The whole plan handed to ``_C.Bundle``: version, namespace, the ops' heads (:func:`lower_op`), their
    references (or None), ``specs(op_index) -> list`` (:func:`lower_specs` of that op, checked by the rule book),
    which the core calls once per op, on its first use, and ``code_object(variant_id) -> bytes``, which it calls
    once per variant, before its first load onto a device (variant ids number the variants in manifest order:
    ops, specializations, variants); it must return bytes checked by the rule book
    (:func:`flyship.bundle.rules.check_variant_file`). ``blame(op_index, inputs, failure, fix, about_dtypes) ->
    str`` words a failed reference's message (:func:`flyship.loader.blame.blame` of that op), which the core asks
    only when a reference failed."""
    return lower_by_contract("Bundle", None, {
        "version": PLAN_VERSION,
        "namespace": namespace,
        "ops": heads,
        "references": list(references),
        "specs": specs,
        "blame": blame,
        "code_object": code_object,
    })
