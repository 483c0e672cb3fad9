"""``flyship inspect``: what each kernel of a bundle is, on the workload side (no DSL, no GPU, no torch).

Per op, specialization, target and launch (a multi-launch variant's ``then`` launches each get their own entry):
the symbol, the kernarg layout, VGPR / AGPR / SGPR counts, LDS (static and dynamic), scratch, spills and the
occupancy the kernel can reach (:mod:`flyship.bundle.occupancy`). Every code object shown is checked as a load
checks it (:func:`flyship.bundle.rules.check_variant_file`: inside the bundle, its sha256, a readable ELF whose
facts are the manifest's); a bad one is marked with the reason and makes the command exit 1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flyship.bundle import manifest as _m
from flyship.bundle import occupancy as _occupancy
from flyship.bundle import rules as _rules
from flyship.errors import BundleError


def _spills(v: _m.Variant, data: bytes, where: str) -> dict[str, Any]:
    """Spill figures read from a checked code object: AMD ``.vgpr_spill_count`` / ``.sgpr_spill_count`` (AMDGPU
    code object metadata); NVIDIA: the per-thread stack frame (``EIATTR_FRAME_SIZE``, spills included)."""
    if v.code_object.format == "hsaco":
        from flyship.bundle.codeobject import CodeObjectFile

        k = CodeObjectFile(data, where).kernel(v.code_object.symbol)
        return {"vgpr_spills": int(k.get(".vgpr_spill_count", 0)), "sgpr_spills": int(k.get(".sgpr_spill_count", 0))}
    from flyship.bundle.cubin import CubinFile

    return {"stack_frame_bytes": CubinFile(data, where).frame_size(v.code_object.symbol)}


def _kernel(root: Path, op: _m.Op, s: _m.Specialization, v: _m.Variant, k: int, n: int,
            checked: dict[str, bytes]) -> dict[str, Any]:
    """One launch's entry; ``checked``: code-object file -> bytes that passed their sha256 check already."""
    where = (f"op {op.name} specialization {s.name} target {v.target}" + (f" launch {k}" if n > 1 else "")
             + f" ({v.code_object.file})")
    problem, spills = None, {}
    try:
        data = _rules.check_variant_file(root, v, where, checked.get(v.code_object.file))
        checked[v.code_object.file] = data
        spills = _spills(v, data, where)
    except BundleError as e:  # a missing, changed or damaged code object: mark it, go on listing the others
        problem = str(e)
    occ = _occupancy.for_variant(v, s.example)
    md = v.metadata
    return {
        "op": op.name, "spec": s.name, "target": v.target, "launch": k, "launches": n,
        "symbol": v.code_object.symbol, "file": v.code_object.file, "problem": problem,
        "kernargs": {"size": v.kernargs.size, "alignment": v.kernargs.alignment,
                     "fields": [{key: val for key, val in _m.to_json_obj(f).items() if val is not None}
                                for f in v.kernargs.fields]},
        "vgprs": md.vgpr_count, "agprs": md.agpr_count, "sgprs": md.sgpr_count,
        "lds_static": md.group_segment_fixed_size, "lds_dynamic": v.launch.dynamic_lds,
        "lds_dynamic_example": _occupancy.example_dynamic_lds(v, s.example),
        "scratch_per_item": md.private_segment_fixed_size, "spills": spills,
        "block": list(v.launch.block),
        "occupancy": None if occ is None else {"value": occ.value, "unit": occ.unit,
                                               "limited_by": occ.limited_by, "limits": occ.limits},
    }


def inspect_bundle(root: Path | str) -> dict[str, Any]:
    """The facts ``flyship inspect`` shows, as JSON-ready data, every code object checked.

    Returns:
        ``{"namespace", "schema_version", "ok", "kernels": [{op, spec, target, launch, launches, symbol, file,
        problem, kernargs, vgprs, agprs, sgprs, lds_static, lds_dynamic, lds_dynamic_example, scratch_per_item,
        spills, block, occupancy}]}``: one entry per launch (``launch`` counts from 1 up to ``launches``, the
        number of kernels one call of the variant launches); ``problem`` is None, or why the code object failed
        its check (missing, sha256 mismatch, damaged, not what the manifest says); ``ok`` is whether none did.

    Raises:
        BundleError: the manifest is missing or invalid.
    """
    root = Path(root)
    m = _m.read(root)
    checked: dict[str, bytes] = {}
    kernels = [_kernel(root, op, s, t, k, len(v.launches), checked)
               for op in m.ops for s in op.specializations for v in s.variants
               for k, t in enumerate(v.launches, 1)]
    return {"namespace": m.namespace, "schema_version": m.schema_version,
            "ok": all(k["problem"] is None for k in kernels), "kernels": kernels}


def _field(f: dict[str, Any]) -> str:
    what = f.get("arg") or f.get("expr") or f.get("value", "")
    dim = f"[{f['dim']}]" if "dim" in f else ""
    return f"{f['offset']}:{f['type']} {f['kind']} {what}{dim}".rstrip()


def format_inspect(data: dict[str, Any]) -> str:
    """The readable form of :func:`inspect_bundle`."""
    lines = [f"namespace {data['namespace']} (schema {data['schema_version']})"]
    for k in data["kernels"]:
        occ = k["occupancy"]
        spills = k["spills"]
        spill_text = (f"{spills['vgpr_spills']} VGPR / {spills['sgpr_spills']} SGPR spills" if "vgpr_spills" in spills
                      else f"stack frame {spills['stack_frame_bytes']} B" if "stack_frame_bytes" in spills
                      else "spills n/a")
        dyn = (k["lds_dynamic"] if k["lds_dynamic"] == "0"
               else f"{k['lds_dynamic']} (= {k['lds_dynamic_example']} for the example)")
        launch = f" launch {k['launch']} of {k['launches']}" if k["launches"] > 1 else ""
        lines += ["", f"{k['op']} / {k['spec']} / {k['target']}{launch}: {k['symbol']} ({k['file']})"]
        if k["problem"] is not None:
            lines.append(f"  BAD CODE OBJECT: {k['problem']}")
        lines += [
            (f"  registers: {k['vgprs']} per thread; block {tuple(k['block'])}" if k["target"].startswith("sm_") else
             f"  registers: {k['vgprs']} VGPRs, {k['agprs']} AGPRs, {k['sgprs']} SGPRs; block {tuple(k['block'])}"),
            f"  memory: LDS {k['lds_static']} B static + {dyn} dynamic; scratch {k['scratch_per_item']} B per "
            f"work-item; {spill_text}",
            "  occupancy: " + ("n/a (no occupancy table for this target)" if occ is None else
                                f"{occ['value']} {occ['unit']}, limited by {occ['limited_by']} ("
                                + ", ".join(f"{n} {v}" for n, v in occ["limits"].items()) + ")"),
            f"  kernargs: {k['kernargs']['size']} B, align {k['kernargs']['alignment']}: "
            + "; ".join(_field(f) for f in k["kernargs"]["fields"]),
        ]
    return "\n".join(lines)
