"""``flyship inspect``: what each kernel of a bundle is, on the workload side (no DSL, no GPU, no torch).

Per op, specialization and target: the symbol, the kernarg layout, VGPR / AGPR / SGPR counts, LDS (static and
dynamic), scratch, spills and the occupancy the kernel can reach (:mod:`flyship.bundle.occupancy`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flyship.bundle import manifest as _m
from flyship.bundle import occupancy as _occupancy


def _spills(root: Path, v: _m.Variant) -> dict[str, Any]:
    """Spill figures read from the code object itself: AMD ``.vgpr_spill_count`` / ``.sgpr_spill_count`` (AMDGPU
    code object metadata); NVIDIA: the per-thread stack frame (``EIATTR_FRAME_SIZE``, spills included)."""
    path = root / v.code_object.file
    if not path.is_file():
        return {}
    data = path.read_bytes()
    try:
        if v.code_object.format == "hsaco":
            from flyship.bundle.codeobject import CodeObjectFile

            k = CodeObjectFile(data, str(path)).kernel(v.code_object.symbol)
            return {"vgpr_spills": int(k.get(".vgpr_spill_count", 0)),
                    "sgpr_spills": int(k.get(".sgpr_spill_count", 0))}
        from flyship.bundle.cubin import CubinFile

        return {"stack_frame_bytes": CubinFile(data, str(path)).frame_size(v.code_object.symbol)}
    except Exception as e:  # noqa: BLE001 - a damaged file: report it in the row rather than stop the listing
        return {"error": f"{type(e).__name__}: {e}"}


def inspect_bundle(root: Path | str) -> dict[str, Any]:
    """The facts ``flyship inspect`` shows, as JSON-ready data.

    Returns:
        ``{"namespace", "schema_version", "kernels": [{op, spec, target, symbol, file, kernargs, vgprs, agprs, sgprs,
        lds_static, lds_dynamic, lds_dynamic_example, scratch_per_item, spills, block, occupancy}]}``.

    Raises:
        BundleError: the manifest is missing or invalid.
    """
    root = Path(root)
    m = _m.read(root)
    kernels = []
    for op in m.ops:
        for s in op.specializations:
            for v in s.variants:
                occ = _occupancy.for_variant(v, s.example)
                md = v.metadata
                kernels.append({
                    "op": op.name, "spec": s.name, "target": v.target, "symbol": v.code_object.symbol,
                    "file": v.code_object.file,
                    "kernargs": {"size": v.kernargs.size, "alignment": v.kernargs.alignment,
                                 "fields": [{k: val for k, val in _m.to_json_obj(f).items() if val is not None}
                                            for f in v.kernargs.fields]},
                    "vgprs": md.vgpr_count, "agprs": md.agpr_count, "sgprs": md.sgpr_count,
                    "lds_static": md.group_segment_fixed_size, "lds_dynamic": v.launch.dynamic_lds,
                    "lds_dynamic_example": _occupancy.example_dynamic_lds(v, s.example),
                    "scratch_per_item": md.private_segment_fixed_size, "spills": _spills(root, v),
                    "block": list(v.launch.block),
                    "occupancy": None if occ is None else {"value": occ.value, "unit": occ.unit,
                                                           "limited_by": occ.limited_by, "limits": occ.limits},
                })
    return {"namespace": m.namespace, "schema_version": m.schema_version, "kernels": kernels}


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
                      else spills.get("error", "spills n/a"))
        dyn = (k["lds_dynamic"] if k["lds_dynamic"] == "0"
               else f"{k['lds_dynamic']} (= {k['lds_dynamic_example']} for the example)")
        lines += [
            "",
            f"{k['op']} / {k['spec']} / {k['target']}: {k['symbol']} ({k['file']})",
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
