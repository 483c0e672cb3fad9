"""Assembling the bundle from the compiled variants: manifest entries (one specialization per distinct guard),
the files they name, offload bundles, and the summary table's rows."""

from __future__ import annotations

import dataclasses
import hashlib
import platform
import sys
from pathlib import Path
from typing import Any, Optional

from flyship.version import __version__
from flyship.bundle import expr as _expr
from flyship.bundle import manifest as M
from flyship.bundle import occupancy as _occupancy
from flyship.bundle import rules as _rules
from flyship.compiler import frontends as _frontends
from flyship.compiler import offload as _off
from flyship.compiler.pipeline.checking import (check_reachable, check_references_module, guard_constraints,
                                                 mutable_written, needed_references)
from flyship.compiler.pipeline.options import Row
from flyship.compiler.spec import OpDecl, Scalar, SpecFile, Tensor
from flyship.errors import CompileError


def _fs_target(t: str) -> str:
    return t.replace(":", "_")


def _example(op: OpDecl, form: Any, v: Any) -> M.Example:
    """The manifest example of a spec's form (``Spec.for_target``) compiled as ``v``: the call it was traced with."""
    shapes = op.example_shapes(form)
    return M.Example(shapes={k: tuple(x) for k, x in sorted(shapes.items())},
                     scalars=dict(sorted(op.example_scalars(form).items())),
                     grid=tuple(v.example_grid),  # the common tail checked it against the grid
                     strides={k: tuple(x) for k, x in sorted(form.strides.items())})


def summary_rows(sf: SpecFile, variants: dict, hits: set) -> list[Row]:
    """The summary table's rows: one per launch of each compiled variant (a multi-launch op's ``then`` launches
    follow its first), each with its symbol, registers, LDS, kernarg bytes and the occupancy it can reach for
    the specialization's example call."""
    decls = {o.name: o for o in sf.ops}
    rows = []
    for (o, s, t), v in sorted(variants.items()):
        op = decls[o]
        form = next(x for x in op.specs if x.name == s).for_target(t)
        example = _example(op, form, v)
        launches = (v, *v.then)
        try:
            note = _frontends.get(op.frontend).build_note(op, form, t)
        except CompileError as e:  # the note is advice; a plan that fails here failed the build already
            note = f"(no comparison with the JIT: {e})"
        for k, step in enumerate(launches, 1):
            occ = _occupancy.for_variant(step, example)
            md = step.metadata
            rows.append(Row(o, s, step.target, md.vgpr_count, md.sgpr_count, md.group_segment_fixed_size,
                            step.kernargs.size, v.seconds, cached=(o, s, t) in hits, occupancy=str(occ or "n/a"),
                            symbol=step.symbol, launch=k, launches=len(launches), note=note if k == 1 else ""))
    return rows


def _op_entry(op: OpDecl, sf_specs: dict, results: dict) -> tuple[M.Op, dict[str, bytes]]:
    files: dict[str, bytes] = {}
    specs = []
    dtypes_seen: dict[str, set] = {a.name: set() for a in op.args if isinstance(a, Tensor)}
    for s in op.specs:
        # One manifest specialization per distinct guard: the targets of a spec share one unless per_target
        # gives them other dtypes, constraints or examples, or the lowering derived other layout constraints.
        groups: dict[str, dict] = {}
        for (o, sn, t), v in sorted(results.items()):
            if o != op.name or sn != s.name:
                continue
            form = s.for_target(t)
            derived = tuple(sorted(set(_expr.canonical(c) for c in v.constraints)))
            constraints = guard_constraints(f"op {op.name} spec {s.name} on {t}", tuple(dict.fromkeys(
                [_expr.canonical(c) for c in op.constraints(form)] + list(derived))))
            example = _example(op, form, v)
            key = repr((sorted(form.dtypes.items()), constraints, example.shapes, example.scalars, example.strides))
            g = groups.setdefault(key, {"form": form, "constraints": constraints, "example": example,
                                        "alignment": {}, "variants": [], "targets": []})
            for k, a in v.alignment.items():
                g["alignment"][k] = max(g["alignment"].get(k, 1), a)
            g["targets"].append(t)
            g["variants"].append(_variant_entry(op.name, s.name, v, files))
        names = _group_names(s.name, [g["targets"] for g in groups.values()])
        for name, g in zip(names, groups.values()):
            for k, d in g["form"].dtypes.items():
                dtypes_seen[k].add(d)
            guard = M.Guard(dtypes=dict(sorted(g["form"].dtypes.items())), constraints=g["constraints"],
                            alignment=dict(sorted(g["alignment"].items())))
            specs.append(M.Specialization(name=name, guard=guard, example=g["example"],
                                          variants=tuple(sorted(g["variants"], key=lambda x: x.target))))
    if not op.key:  # a config space's candidates share a guard by design: a tuning table picks among them
        check_reachable(op.name, specs)
    # op(..., mutable=True): the inputs some launch of some variant stores through (the write check's finding)
    written = mutable_written(op.name, results) if op.mutable_written else set()
    args = []
    for a in op.args:
        if isinstance(a, Tensor):
            args.append(M.Arg(name=a.name, kind="tensor", rank=a.rank, dtypes=tuple(sorted(dtypes_seen[a.name])),
                              mutable=a.mutable or a.name in written, batch=bool(a.batch)))
        elif isinstance(a, Scalar):
            args.append(M.Arg(name=a.name, kind=a.type, default=a.default))
    built = sorted({v.target for s in specs for v in s.variants})
    outputs = tuple(M.Output(name=o.name, shape=op.output_shape(o), dtype=op.output_dtype(o), batch=op.output_batch(o),
                             zero=o.zero, target_dtypes=op.output_target_dtypes(o, built))
                    for o in op.outputs)
    return M.Op(name=op.name, frontend=op.frontend, doc=op.doc, args=tuple(args), outputs=outputs,
                reference=op.reference, specializations=tuple(specs), backward=op.backward,
                tuning_key=op.key), files


def _note_shared_files(op: M.Op) -> None:
    """Say (on stderr) which specializations of ``op`` compiled to byte-identical code objects, kept as one file:
    their declarations differ only where the code does not (a ``waves_per_eu`` the compiler could not honour, a
    guard constraint), so they could be one specialization."""
    users: dict[str, list[str]] = {}
    for s in op.specializations:
        for v in s.variants:
            for t in (v, *v.then):
                users.setdefault(t.code_object.file, []).append(s.name)
    fe = _frontends.get(op.frontend)
    for f, names in users.items():
        names = list(dict.fromkeys(names))
        # a twin flyship made (Triton's <spec>__generic) that came out the same is no one's mistake: not named
        names = [n for n in names if fe.twin_of(n) not in names]
        if len(names) > 1:
            print(f"flyc-build: note: op {op.name}: specializations {', '.join(names)} compiled to byte-identical "
                  f"code objects, kept once as {f} (what tells them apart, e.g. a waves_per_eu or another option, "
                  "changes nothing in the code: one specialization would do)", file=sys.stderr)


def _group_names(spec: str, groups: list[list[str]]) -> list[str]:
    """Manifest names of a spec's guard groups (each a list of target IDs): the spec's own name for one group,
    else ``<spec>__<processor>`` (``fp8__gfx942``), numbered when two groups share a processor."""
    if len(groups) <= 1:
        return [spec] * len(groups)
    tags = ["_".join(dict.fromkeys(t.split(":")[0] for t in g)) for g in groups]
    return [f"{spec}__{tag}" if tags.count(tag) == 1 else f"{spec}__{tag}_{i}" for i, tag in enumerate(tags)]


def _variant_entry(op_name: str, spec_name: str, v: Any, files: dict[str, bytes]) -> M.Variant:
    """A compiled variant as the manifest's Variant, its files added to ``files``. The launches after the first
    (a multi-launch op) get files ``<op>.<spec>.<target>.<n>.<format>`` (n = 2, 3, ...), or share an earlier
    launch's file when their code objects are the same bytes (FlyDSL puts every kernel of a launcher in one; an
    entry that calls several launchers gives one code object per call)."""
    steps: list[M.Variant] = []
    launches = (v, *v.then)
    for k, t in enumerate(launches):
        # Record the target the code object was really built for (Triton builds sm_90 as sm_90a).
        stem = f"{op_name}.{spec_name}.{_fs_target(t.target)}" + (f".{k + 1}" if k else "")
        fname = f"{stem}.{t.format}"
        same = next((s for s, e in zip(steps, launches) if e.code_object == t.code_object), None)
        if same is not None:
            fname = same.code_object.file
        else:  # the same bytes as another specialization's (configs whose options change nothing): one file
            fname = next((f for f, data in files.items() if data == t.code_object and f.endswith(f".{t.format}")),
                         fname)
        files[fname] = t.code_object
        if t.isa is not None:
            files[f"{stem}.s"] = t.isa.encode()
        steps.append(M.Variant(
            target=t.target,
            code_object=M.CodeObject(file=fname, sha256=hashlib.sha256(t.code_object).hexdigest(), format=t.format,
                                     target=t.target, symbol=t.symbol, code_object_version=t.code_object_version),
            metadata=t.metadata, kernargs=t.kernargs, launch=t.launch, proof=t.proof,
            toolchain=dict(sorted(t.toolchain.items())), tensor_abi=dict(sorted(t.tensor_abi.items()))))
    if len(steps) == 1 and not v.workspaces:
        return steps[0]
    return dataclasses.replace(steps[0], then=tuple(steps[1:]), workspaces=tuple(v.workspaces))


def assemble_manifest(sf: SpecFile, results: dict, tools: dict[str, str], frontends: dict[str, str],
                      offload: dict[str, str], offload_files: Optional[dict[str, bytes]] = None,
                      failures: tuple[M.Failure, ...] = ()) -> tuple[M.Manifest, dict[str, bytes]]:
    """Build the manifest (and the files it names) from every task's result."""
    files: dict[str, bytes] = {}
    ops = []
    for op in sf.ops:
        entry, f = _op_entry(op, {}, results)
        ops.append(entry)
        files.update(f)
        _note_shared_files(entry)
    refs = None
    if sf.references:
        rp = (Path(sf.path).parent / sf.references).resolve()
        if not rp.is_file():
            raise CompileError(f"spec file {sf.path}: references({sf.references!r}) names no file ({rp})")
        check_references_module(rp, needed_references(sf))
        files["references.py"] = rp.read_bytes()
        refs = "references.py"
    m = M.Manifest(schema_version=M.SCHEMA_VERSION, namespace=sf.namespace,
                   build=M.BuildInfo(flyship_version=__version__, frontends=dict(sorted(frontends.items())),
                                     python=platform.python_version(), tools=dict(sorted(tools.items()))),
                   references=refs, ops=tuple(ops), offload_bundles=dict(sorted(offload.items())),
                   references_sha256=hashlib.sha256(files[refs]).hexdigest() if refs else None,
                   offload_bundles_sha256={f: hashlib.sha256(d).hexdigest()
                                           for f, d in sorted((offload_files or {}).items())},
                   failed=tuple(failures), composites=tuple(sf.composites))
    m = dataclasses.replace(m, schema_version=M.version_for(m))
    _rules.check_manifest(m)
    return m, files


def frontend_versions(frontends_used: tuple[str, ...], variants: dict) -> dict[str, str]:
    """Frontend name -> the DSL version its variants were built with (the manifest's ``build.frontends``)."""
    out = {}
    for fe in frontends_used:
        for v in variants.values():
            if v.toolchain.get(fe):
                out[fe] = v.toolchain[fe]
    return out


def offload_bundles(sf: SpecFile, variants: dict, toolchain: object, scratch: Path) -> tuple[dict[str, str],
                                                                                           dict[str, bytes]]:
    """One clang offload bundle per specialization holding all its AMD code objects.

    Returns:
        (``op.spec`` -> file name, file name -> bytes).
    """
    offload, files = {}, {}
    for op in sf.ops:
        for s in op.specs:
            cos = {t: v.code_object for (o, sn, t), v in variants.items()
                   if o == op.name and sn == s.name and v.format == "hsaco"}
            if not cos:
                continue
            path = scratch / f"{op.name}.{s.name}.offload"
            _off.make_offload_bundle(cos, toolchain, path)
            offload[f"{op.name}.{s.name}"] = path.name
            files[path.name] = path.read_bytes()
    return offload, files
