"""The compile stage, end to end: spec file -> per-target workers -> verified bundle on disk.

Reads like its steps (:func:`build`): lock the output, read the declarations, :func:`plan` the tasks,
:func:`run_tasks` in one process pool per target, :func:`assemble_manifest` from the results,
:func:`write_bundle` atomically. What a build leaves behind is :mod:`flyship.compiler.hygiene`'s business.
"""

from __future__ import annotations

import ast
import contextlib
import concurrent.futures as cf
import dataclasses
import hashlib
import multiprocessing
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional

from flyship import __version__
from flyship.bundle import expr as _expr
from flyship.bundle import files as _files
from flyship.bundle import manifest as M
from flyship.bundle import occupancy as _occupancy
from flyship.bundle import rules as _rules
from flyship.bundle import targets as _targets
from flyship.compiler import cache as _cache
from flyship.compiler import declarations as _declarations
from flyship.compiler import executors as _executors
from flyship.compiler import frontends as _frontends
from flyship.compiler import hygiene as _hygiene
from flyship.compiler import tuning as _tuning
from flyship.compiler import spec as _spec_mod
from flyship.compiler.spec import OpDecl, Output, Scalar, SpecFile, Tensor
from flyship.compiler.frontends import CompiledVariant
from flyship.compiler.worker import TaskResult, WorkerConfig, init_worker, load_spec_file, run_task
from flyship.errors import CompileError


class BuildError(CompileError, RuntimeError):
    """The build failed; nothing was written at the output path."""


@dataclasses.dataclass(frozen=True)
class BuildOptions:
    """Options of one ``flyc-build`` run (the CLI parses into this).

    Attributes:
        spec_path: the spec file.
        out_dir: bundle directory to create.
        archs: target IDs (``gfx942``, ``gfx950``, ``sm_90``...).
        jobs: worker processes in all (at least one per target).
        force: replace an existing ``out_dir``.
        keep_ir: also write each code object's ``.s``.
        llvm_bin: folder with llvm-mc / ld.lld, searched first.
        offload_bundle: also write one clang offload bundle per specialization holding every AMD target.
        code_object_version: 5 or 6; None keeps what the frontend emitted.
        cache: reuse and fill the build cache (``FLYSHIP_CACHE_DIR``); ``--no-cache`` turns it off.
        executor: ``local`` (process pools on this machine) or ``ray[:ADDRESS]`` (a Ray cluster).
        keep_going: when kernels fail, still write a bundle of what built, with the failures recorded in the
            manifest (``failed``); :func:`build` then raises :class:`PartialBuildError` after writing it.
    """

    spec_path: str
    out_dir: str
    archs: tuple[str, ...]
    jobs: int = 1
    force: bool = False
    keep_ir: bool = False
    llvm_bin: Optional[str] = None
    offload_bundle: bool = False
    code_object_version: Optional[int] = None
    cache: bool = True
    executor: str = "local"
    keep_going: bool = False


class PartialBuildError(BuildError):
    """``--keep-going``: the bundle was written without the kernels that failed (listed, each with a next step).

    Attributes:
        rows: the summary rows of what built.
        failures: the manifest's ``failed`` entries.
    """

    def __init__(self, message: str, rows: list["Row"], failures: tuple[M.Failure, ...]) -> None:
        super().__init__(message)
        self.rows = rows
        self.failures = failures


@dataclasses.dataclass(frozen=True)
class Row:
    """One line of the build's summary table: one launch of a compiled variant.

    Attributes:
        seconds: the compile time of the whole variant (all its launches compile in one task).
        symbol: the kernel's symbol.
        launch: which launch of one call this is, from 1 up to ``launches`` (1 of 1 for most ops).
    """

    op: str
    spec: str
    target: str
    vgprs: int
    sgprs: int
    lds: int
    kernarg_bytes: int
    seconds: float
    cached: bool = False
    occupancy: str = "n/a"
    symbol: str = ""
    launch: int = 1
    launches: int = 1


def check_archs(archs: tuple[str, ...]) -> list[_targets.TargetID]:
    """Parse the requested targets; unknown ones fail with the list of known processors."""
    if not archs:
        raise BuildError("flyc-build: expected at least one --arch (e.g. --arch gfx942 --arch gfx950)")
    out = []
    for a in archs:
        try:
            t = _targets.parse_target(a)
            _targets.limits(t)
        except M.BundleError as e:
            raise BuildError(f"flyc-build: unknown arch {a!r}: {e}") from None
        out.append(t)
    return out


def check_offload_targets(targets: list[_targets.TargetID]) -> None:
    """``--offload-bundle`` holds one entry per AMD target ID, and clang-offload-bundler refuses two IDs of one
    processor with different features (``gfx942`` and ``gfx942:sramecc+:xnack-``: "conflicting targets", LLVM
    ``getConflictTargetIDCombination``), so refuse them before compiling.

    Raises:
        BuildError: naming both target IDs and what to do.
    """
    seen: dict[str, str] = {}
    for t in targets:
        if t.vendor != "amd":
            continue
        other = seen.setdefault(t.processor, t.text)
        if other != t.text:
            raise BuildError(f"flyc-build --offload-bundle: expected one target ID per processor, got {other} and "
                             f"{t.text}; clang-offload-bundler refuses conflicting targets in one bundle (the loader "
                             "could not choose between them); build them into separate bundles, or drop "
                             "--offload-bundle (each code object is in the bundle folder either way)")


def plan(sf: SpecFile, targets: list[_targets.TargetID],
         note: Callable[[str], None] = lambda s: None) -> list[tuple[str, str, str]]:
    """(op, spec, target) tasks: each op for every requested target whose vendor its frontend builds for,
    a spec limited by ``Spec(targets=...)`` only for the requested targets of those processors; a spec that
    no requested target admits is reported through ``note`` (never dropped silently)."""
    tasks = []
    for op in sf.ops:
        fe = _frontends.get(op.frontend)
        usable = [t for t in targets if t.vendor in fe.vendors]
        if not usable:
            raise BuildError(f"flyc-build: op {op.name} ({op.frontend}) has no target among "
                             f"{[t.text for t in targets]}; {op.frontend} builds for "
                             f"{' and '.join(sorted(fe.vendors))} targets ({_VENDOR_EXAMPLES[min(fe.vendors)]}, ...)")
        for t in usable:
            try:
                fe.check_target(t)
            except CompileError as e:
                raise BuildError(f"flyc-build: op {op.name} ({fe.title}): {e}") from None
        for s in op.specs:
            mine = [t for t in usable if _spec_admits(s.targets, t)]
            if not mine:
                note(f"flyc-build: note: {op.name}.{s.name} is limited to {', '.join(s.targets)}, and no --arch "
                     f"is one of them ({', '.join(t.text for t in targets)}): not built")
            for key in s.per_target:
                if mine and not any(s.override_for(t.text) is s.per_target[key] for t in mine):
                    note(f"flyc-build: note: {op.name}.{s.name} has a per_target entry for {key}, and no --arch is "
                         f"{key} ({', '.join(t.text for t in targets)}): that form is not built")
            for t in mine:
                tasks.append((op.name, s.name, t.text))
        if not any(o == op.name for o, _s, _t in tasks):
            limits = "; ".join(f"{op.name}.{s.name}: {', '.join(s.targets)}" for s in op.specs)
            raise BuildError(f"flyc-build: op {op.name}: expected a specialization for some --arch "
                             f"({', '.join(t.text for t in targets)}), got none: its specs are limited to other "
                             f"targets ({limits}); "
                             "add one of those --arch, or widen a spec's targets=(...) (a bundle op without code "
                             "objects would only ever run its reference)")
    return tasks


def _spec_admits(limited_to: tuple[str, ...], t: _targets.TargetID) -> bool:
    """Whether a spec limited to ``limited_to`` (processors, or full target IDs; empty: all) builds for ``t``."""
    return _spec_mod.admits(limited_to, t)


_VENDOR_EXAMPLES = {"amd": "gfx942, gfx950", "nvidia": "sm_90"}


def _worker_config(opts: BuildOptions, target: str, toolchain: object, rocm_root: Optional[Path], scratch: Path,
                   frontends: tuple[str, ...]) -> WorkerConfig:
    return WorkerConfig(spec_path=str(Path(opts.spec_path).resolve()), target=target,
                        rocm_root=str(rocm_root) if rocm_root else None, toolchain=toolchain,
                        code_object_version=opts.code_object_version, keep_ir=opts.keep_ir,
                        scratch_root=str(scratch), frontends=frontends, parent_pid=os.getpid())


def run_tasks(tasks: list[tuple[str, str, str]], opts: BuildOptions, toolchain: object, rocm_root: Optional[Path],
              scratch: Path, progress: Callable[[str], None], frontends: tuple[str, ...]) -> list[TaskResult]:
    """Run the tasks in spawned worker processes, one pool per target; report each as it ends."""
    by_target: dict[str, list[tuple[str, str]]] = {}
    for o, s, t in tasks:
        by_target.setdefault(t, []).append((o, s))
    per_pool = max(1, opts.jobs // max(1, len(by_target)))
    ctx = multiprocessing.get_context("spawn")
    pools, futures = [], {}
    results: list[TaskResult] = []
    try:
        for target, items in by_target.items():
            cfg = _worker_config(opts, target, toolchain, rocm_root, scratch, frontends)
            pool = cf.ProcessPoolExecutor(max_workers=min(per_pool, len(items)), mp_context=ctx,
                                          initializer=init_worker, initargs=(cfg,))
            pools.append(pool)
            for o, s in items:
                futures[pool.submit(run_task, o, s)] = (o, s, target)
        done = 0
        broken: list[tuple[str, str, str]] = []
        retry: list[tuple[str, str, str, Optional[str]]] = []
        for fut in cf.as_completed(futures):
            o, s, t = futures[fut]
            try:
                r = fut.result()
            except cf.process.BrokenProcessPool:
                # A worker died (an abort inside the DSL's native code takes its whole pool down); which
                # task did it is found below, by running each of that pool's unfinished tasks alone.
                broken.append((o, s, t))
                continue
            if r.variant is None and r.reused and not r.resource and not r.deterministic:
                # Over a limit, or refused by flyship's own check (a SpecError, a FrontendError other than the
                # DSL's own failure), is the same answer in any process: no retry, reported once.
                # Some DSL kernels keep process-global state and cannot be traced twice in one process: a
                # failure in a reused worker is retried once in a fresh one (below) before it counts, so
                # -j 1 and -j 2 give the same bundle.
                retry.append((o, s, t, r.error))
                continue
            done += 1
            results.append(r)
            status = f"{r.variant.seconds:5.1f}s" if r.variant else "FAILED"
            progress(f"[{done}/{len(futures)}] {t:<8} {o}.{s}  {status}")
    finally:
        for p in pools:
            p.shutdown(wait=True, cancel_futures=True)
    for o, s, t, first in retry:
        r = _run_alone(o, s, _worker_config(opts, t, toolchain, rocm_root, scratch, frontends), ctx)
        if r.variant is None:
            r = dataclasses.replace(r, error=r.error if r.error == first else
                                    f"{r.error} (in a fresh process; in a reused worker it failed first with: {first})")
        done += 1
        results.append(r)
        status = f"{r.variant.seconds:5.1f}s" if r.variant else "FAILED"
        progress(f"[{done}/{len(futures)}] {t:<8} {o}.{s}  {status} (retried in a fresh process after failing in "
                 "a reused worker)")
    for o, s, t in broken:
        r = _run_alone(o, s, _worker_config(opts, t, toolchain, rocm_root, scratch, frontends), ctx)
        done += 1
        results.append(r)
        status = f"{r.variant.seconds:5.1f}s" if r.variant else "FAILED"
        progress(f"[{done}/{len(futures)}] {t:<8} {o}.{s}  {status} (rerun in its own process)")
    return results


def _run_alone(o: str, s: str, cfg: WorkerConfig, ctx) -> TaskResult:
    """One task in a process of its own, so a crash is pinned on the kernel that caused it."""
    with cf.ProcessPoolExecutor(max_workers=1, mp_context=ctx, initializer=init_worker, initargs=(cfg,)) as pool:
        try:
            return pool.submit(run_task, o, s).result()
        except cf.process.BrokenProcessPool:
            return TaskResult(o, s, cfg.target, None,
                              "the worker process died while compiling this kernel (a crash or abort in the DSL's "
                              "native code; its own message, if any, is printed above)")


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
        for k, step in enumerate(launches, 1):
            occ = _occupancy.for_variant(step, example)
            md = step.metadata
            rows.append(Row(o, s, step.target, md.vgpr_count, md.sgpr_count, md.group_segment_fixed_size,
                            step.kernargs.size, v.seconds, cached=(o, s, t) in hits, occupancy=str(occ or "n/a"),
                            symbol=step.symbol, launch=k, launches=len(launches)))
    return rows


def guard_constraints(where: str, constraints: tuple[str, ...]) -> tuple[str, ...]:
    """The constraints a guard keeps: one that reads nothing of the call (``1024 <= 2147483647``, from a constant
    ``Value`` feeding the launcher's arithmetic) is decided here: a true one is dropped, a false one fails the
    build (no call could ever take the specialization).

    Raises:
        BuildError: a constant constraint that is false, naming it.
    """
    kept = []
    for c in constraints:
        if not _expr.is_constant(c):
            kept.append(c)
        elif not _expr.evaluate_with_shapes(c, {}):
            raise BuildError(f"{where}: expected every guard constraint to hold for some call, got {c!r}, which "
                             "reads nothing of the call and is false; no call could take this specialization: fix "
                             "the spec's constraint, or the constant Value / constexpr it was computed from")
    return tuple(kept)


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
    args = []
    for a in op.args:
        if isinstance(a, Tensor):
            args.append(M.Arg(name=a.name, kind="tensor", rank=a.rank, dtypes=tuple(sorted(dtypes_seen[a.name])),
                              mutable=a.mutable, batch=bool(a.batch)))
        elif isinstance(a, Scalar):
            args.append(M.Arg(name=a.name, kind=a.type, default=a.default))
    outputs = tuple(M.Output(name=o.name, shape=op.output_shape(o), dtype=op.output_dtype(o), batch=op.output_batch(o),
                             zero=o.zero)
                    for o in op.outputs)
    return M.Op(name=op.name, frontend=op.frontend, doc=op.doc, args=tuple(args), outputs=outputs,
                reference=op.reference, specializations=tuple(specs), backward=op.backward,
                tuning_key=op.key), files


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


def check_reachable(op_name: str, specs: list[M.Specialization]) -> None:
    """Specializations are tried in order: refuse one that an earlier one always takes first (same dtypes, the
    earlier guard's constraints a subset of its own, no stricter alignment, built for at least its targets).
    The test is syntactic, so it catches the usual mistake (a general spec listed before a narrower one)
    without claiming to decide every implication between constraints.

    Raises:
        BuildError: naming both specializations and what to change.
    """
    for j, later in enumerate(specs):
        for earlier in specs[:j]:
            g0, g1 = earlier.guard, later.guard
            if (g0.dtypes == g1.dtypes and set(g0.constraints) <= set(g1.constraints)
                    and all(a <= g1.alignment.get(k, 1) for k, a in g0.alignment.items())
                    and {v.target for v in later.variants} <= {v.target for v in earlier.variants}):
                raise BuildError(
                    f"op {op_name}: expected every specialization to be reachable, got {later.name!r} behind "
                    f"{earlier.name!r}, which accepts every call {later.name!r} accepts (same dtypes, constraints "
                    f"{list(g0.constraints)} all among {later.name!r}'s) and is tried first; list {later.name!r} "
                    f"before {earlier.name!r} or give {earlier.name!r} a constraint that excludes its calls")


def check_references_module(path: Path, needed: dict[str, str]) -> None:
    """The references module is copied into the bundle alone and run in the workload Python (torch, no FlyDSL):
    it may import torch and the standard library, nothing relative, and must define every reference an op
    names (``needed``: op name -> function name).

    Raises:
        BuildError: naming the module, the import or the missing function.
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    stdlib = getattr(sys, "stdlib_module_names", frozenset())
    for node in ast.walk(tree):
        mods = []
        if isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                raise BuildError(f"references module {path}: relative import at line {node.lineno}; only "
                                 f"{path.name} is copied into the bundle, so it must stand alone")
            mods = [node.module or ""]
        for m in mods:
            top = m.split(".")[0]
            if top != "torch" and top not in stdlib:
                raise BuildError(f"references module {path}: imports {m!r}; it is copied into the bundle and run in "
                                 "the workload Python, which has torch and the standard library only")
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    defined |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    for op, fn in sorted(needed.items()):
        if fn not in defined:
            raise BuildError(f"op {op}: reference={fn!r} is not defined in {path}; it defines "
                             f"{', '.join(sorted(d for d in defined if not d.startswith('_'))) or 'nothing'}")


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
    refs = None
    if sf.references:
        rp = (Path(sf.path).parent / sf.references).resolve()
        if not rp.is_file():
            raise BuildError(f"spec file {sf.path}: references({sf.references!r}) names no file ({rp})")
        check_references_module(rp, {o.name: o.reference for o in sf.ops if o.reference})
        files["references.py"] = rp.read_bytes()
        refs = "references.py"
    m = M.Manifest(schema_version=M.SCHEMA_VERSION, namespace=sf.namespace,
                   build=M.BuildInfo(flyship_version=__version__, frontends=dict(sorted(frontends.items())),
                                     python=platform.python_version(), tools=dict(sorted(tools.items()))),
                   references=refs, ops=tuple(ops), offload_bundles=dict(sorted(offload.items())),
                   references_sha256=hashlib.sha256(files[refs]).hexdigest() if refs else None,
                   offload_bundles_sha256={f: hashlib.sha256(d).hexdigest()
                                           for f, d in sorted((offload_files or {}).items())},
                   failed=tuple(failures))
    m = dataclasses.replace(m, schema_version=M.version_for(m))
    _rules.check_manifest(m)
    return m, files


def write_bundle(m: M.Manifest | bytes, files: dict[str, bytes], out_dir: Path, force: bool) -> None:
    """Write into a staging sibling folder, read it back, then move it into place (swapped atomically with an
    existing bundle under ``force``): a failure leaves ``out_dir`` as it was and no staging folder."""
    out_dir = out_dir.resolve()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{_hygiene.staging_prefix(out_dir)}{os.getpid()}-", dir=out_dir.parent))
    try:
        # mkdtemp makes the folder private (0700); a bundle is shipped and read by other users (a container's
        # runtime user), so give it the permissions an ordinary folder gets under this umask.
        os.chmod(tmp, 0o777 & ~_files.umask())
        for name, data in sorted(files.items()):
            (tmp / name).write_bytes(data)
        if isinstance(m, bytes):  # from the build cache: its blobs were sha256-checked when read
            (tmp / M.MANIFEST_NAME).write_bytes(m)
        else:
            M.write(m, tmp / M.MANIFEST_NAME)
        try:  # what we wrote, fresh or cached, must read back and pass every rule the loader applies
            _rules.check_bundle(tmp, M.read(tmp))
        except M.BundleError as e:
            raise BuildError(f"flyc-build: the bundle would be refused at load: {e}") from e
        if out_dir.exists() and not force:
            raise BuildError(f"flyc-build: output folder {out_dir} exists; pass --force to replace it")
        _hygiene.replace_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def build(opts: BuildOptions, progress: Callable[[str], None] = lambda s: print(s, file=sys.stderr)) -> list[Row]:
    """Run the whole compile stage.

    Returns:
        One :class:`Row` per compiled variant, for the summary table.

    Raises:
        BuildError: anything that stops the build (unknown arch, tools missing, output exists, a kernel
            failing to compile or prove); every failing task is listed. Nothing is written then.
        flyship.compiler.hygiene.OutputBusyError: another build is writing ``opts.out_dir``.
    """
    targets = check_archs(opts.archs)
    if opts.offload_bundle:
        check_offload_targets(targets)
    if any(t.vendor == "amd" for t in targets):  # before the spec file imports flydsl
        from flyship.compiler.frontends.flydsl import versions as _flydsl_versions

        _flydsl_versions.check_installed()
    out_dir = Path(opts.out_dir)
    _executors.check_executor(opts.executor)
    cache = _cache.open_cache(opts.cache, progress)
    with _hygiene.output_lock(out_dir.resolve()):
        _hygiene.recover_output(out_dir.resolve())
        if out_dir.exists() and not opts.force:
            raise BuildError(f"flyc-build: output folder {out_dir} exists; pass --force to replace it")
        bkey = _build_key(opts, cache) if cache else ""
        if cache and (rows := _reuse_bundle(cache, bkey, out_dir, opts.force, progress)) is not None:
            return rows
        with _cache.record_reads() as deps:  # every file the spec reads while imported: the whole-build entry's inputs
            sf = read_declarations(opts.spec_path, targets)
        tasks = plan(sf, targets, progress)
        try:
            tasks, pruned = _tuning.prune_tasks(sf.ops, tasks)
        except CompileError as e:
            raise BuildError(f"flyc-build: {e}") from None
        for line in pruned:
            progress(f"flyc-build: {line}")
        frontends_used = tuple(sorted({o.frontend for o in sf.ops}))
        with contextlib.ExitStack() as stack:
            scratch = stack.enter_context(_hygiene.scratch_dir())
            toolchain, rocm_root, tools = find_tools(frontends_used, targets, opts, stack)
            progress(f"flyc-build: {len(tasks)} kernels ({len(sf.ops)} ops) for "
                     f"{', '.join(t.text for t in targets)}, jobs={opts.jobs}")
            results, hits = compile_with_cache(
                tasks, sf, tools, opts, cache, progress,
                lambda todo: _executors.run(todo, opts, toolchain, rocm_root, scratch, progress, frontends_used))
            results, dropped = _tuning.drop_over_limits(sf.ops, results)
            for line in dropped:
                progress(f"flyc-build: {line}")
            variants, failures = succeeded(results, opts.keep_going)
            for op in sf.ops:
                grids = {s: v.launch.grid for (o, s, _t), v in variants.items() if o == op.name}
                for line in _tuning.key_warnings(op, grids):
                    progress(f"flyc-build: warning: {line}")
            offload, offload_files = offload_bundles(sf, variants, toolchain, scratch) if opts.offload_bundle \
                else ({}, {})
            m, files = assemble_manifest(sf, variants, tools, frontend_versions(frontends_used, variants), offload,
                                         offload_files, failures)
            write_bundle(m, {**files, **offload_files}, out_dir, opts.force)
        rows = summary_rows(sf, variants, hits)
        if failures:  # a partial bundle is never the cached answer to an unchanged build: it would hide them
            raise PartialBuildError(
                f"flyc-build: {len(failures)} of {len(failures) + len(rows)} kernels failed; --keep-going wrote "
                f"{out_dir} without them (recorded in its manifest's failed; the loader falls back for them):\n"
                f"{failure_report(sorted((r for r in results if r.error), key=lambda r: (r.op, r.spec, r.target)))}",
                rows, failures)
        if cache:
            remember_build(cache, bkey, deps, opts.spec_path, out_dir, rows)
    return rows


def compile_with_cache(tasks: list[tuple[str, str, str]], sf: SpecFile, tools: dict[str, str], opts: BuildOptions,
                       cache: Optional[_cache.BuildCache], progress: Callable[[str], None],
                       run: Callable[[list], list[TaskResult]]) -> tuple[list[TaskResult], set]:
    """Take what the cache holds, ``run`` the rest, store what compiled.

    Returns:
        (one result per task, the tasks that came from the cache).
    """
    if cache is None:
        return run(tasks), set()
    keys = task_keys(sf, tasks, tools, opts)
    hits = {t: v for t in tasks if (v := cache.get_variant(keys[t])) is not None}
    if hits:
        progress(f"flyc-build: {len(hits)} of {len(tasks)} kernels from the cache ({cache.root.parent})")
    todo = [t for t in tasks if t not in hits]
    results = run(todo) if todo else []
    for r in results:
        if r.variant is not None:
            cache.put_variant(keys[(r.op, r.spec, r.target)], r.variant)
    return results + [TaskResult(o, s, t, v, None) for (o, s, t), v in hits.items()], set(hits)


def task_keys(sf: SpecFile, tasks: list[tuple[str, str, str]], tools: dict[str, str],
              opts: BuildOptions) -> dict[tuple[str, str, str], str]:
    """Each task's cache key (see :mod:`flyship.compiler.cache` for what goes into it)."""
    context = _cache.build_context(tools, opts.code_object_version, opts.keep_ir)
    ops = {o.name: o for o in sf.ops}
    sources = {name: _cache.kernel_sources(o.kernel) for name, o in ops.items()}
    keys = {}
    for o, s, t in tasks:
        spec = next(x for x in ops[o].specs if x.name == s).for_target(t)
        keys[(o, s, t)] = _cache.task_key(ops[o], spec, t, context, sources[o])
    return keys


def _build_key(opts: BuildOptions, cache: _cache.BuildCache) -> str:
    """The whole-build key, known before the spec file is imported (tool versions are remembered by the cache,
    so a no-op rebuild starts no tool process)."""
    from flyship.compiler import toolchain as _tc

    cache.load_tool_versions()
    try:
        tools = dict(_tc.find_toolchain(opts.llvm_bin).describe())
    except CompileError:
        tools = {}
    cache.save_tool_versions()
    return _cache.build_key(opts.spec_path, opts.archs, {"offload_bundle": opts.offload_bundle, "keep_ir": opts.keep_ir,
                                                         "code_object_version": opts.code_object_version}, tools)


def _reuse_bundle(cache: _cache.BuildCache, key: str, out_dir: Path, force: bool,
                  progress: Callable[[str], None]) -> Optional[list[Row]]:
    """Write the cached bundle of an unchanged build (no spec import, no compile); None when there is none."""
    entry = cache.get_build(key)
    if entry is None or M.MANIFEST_NAME not in entry.files:
        return None
    write_bundle(entry.files[M.MANIFEST_NAME], {n: b for n, b in entry.files.items() if n != M.MANIFEST_NAME},
                 out_dir, force)
    progress(f"flyc-build: the spec and every file it reads are unchanged since a cached build; wrote its bundle "
             f"({len(entry.files)} files) without compiling")
    return [dataclasses.replace(Row(**r), cached=True) for r in entry.rows]


def remember_build(cache: _cache.BuildCache, key: str, deps: dict[str, str], spec_path: str, out_dir: Path,
                   rows: list[Row]) -> None:
    """Store the bundle just written with the files its spec read, for the next no-op rebuild."""
    deps = {**deps, str(Path(spec_path).resolve()): _cache.sha256_file(spec_path) or "unreadable"}
    written = {p.name: p.read_bytes() for p in sorted(out_dir.iterdir()) if p.is_file()}
    cache.put_build(key, deps, written, [dataclasses.asdict(r) for r in rows])


def read_declarations(spec_path: str, targets: list[_targets.TargetID]) -> SpecFile:
    """Import the spec file here, only to list ops and specs (compiles happen in workers), once per target
    environment (:mod:`flyship.compiler.declarations`: each target's tasks follow what its own import declared),
    and refuse what would fail later: a references module that cannot stand alone, a declaration its frontend
    rejects.

    Raises:
        BuildError: naming the spec file or the op.
    """
    try:
        imports, sf = _declarations.load_for_targets(spec_path, targets, load_spec_file)
    except Exception as e:
        raise BuildError(f"flyc-build: {e}") from None
    if sf.references:
        rp = (Path(sf.path).parent / sf.references).resolve()
        if not rp.is_file():
            raise BuildError(f"spec file {sf.path}: references({sf.references!r}) names no file ({rp})")
        check_references_module(rp, {o.name: o.reference for o in sf.ops if o.reference})
        check_reference_outputs(sf, rp)
    elif any(o.reference for o in sf.ops):
        raise BuildError(f"spec file {sf.path}: ops name references but the spec calls no references('<file>.py')")
    for op in (o for imp in imports for o in imp.spec_file.ops):  # each declaration as its targets import it
        try:
            _frontends.get(op.frontend).check_declaration(op)
        except Exception as e:
            raise BuildError(f"flyc-build: {e}") from None
    return sf


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


def check_reference_outputs(sf: SpecFile, references_path: Path) -> None:
    """Call each op's reference on each specialization's example (zero-filled CPU tensors) and compare what it
    returns with the op's ``Output`` rules: a shape or dtype rule that disagrees with the reference would
    otherwise show only at the first call (an output of the wrong size, a verify failure).

    Raises:
        BuildError: naming the op, the spec, the output, the rule's shape and the reference's.
    """
    import importlib.util

    import torch

    mod_spec = importlib.util.spec_from_file_location("_flyship_references_check", references_path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    for op in sf.ops:
        if not op.reference:
            continue
        fn = getattr(mod, op.reference)
        for s in (form for spec in op.specs for _, form in spec.resolved()):
            shapes = op.example_shapes(s)
            scalars = op.example_scalars(s)
            if any(v is None for v in scalars.values()):
                continue  # no example value to call with; the frontend reports the missing scalar
            written = [a.name for a in op.inputs if isinstance(a, Tensor) and a.mutable]
            args = [_example_tensor(torch, s.shapes[a.name], s.dtypes[a.name], random=bool(written),
                                    written=a.name in written)
                    if isinstance(a, Tensor) else scalars[a.name] for a in op.inputs]
            before = {a.name: t.clone() for a, t in zip(op.inputs, args) if a.name in written}
            where = f"op {op.name} spec {s.name}"
            what = "random values" if written else "zeros"
            try:
                with torch.no_grad():
                    got = fn(*args)
            except Exception as e:
                raise BuildError(f"{where}: reference {op.reference}() failed on the example inputs ({what} of shapes "
                                 f"{dict(s.shapes)}): {type(e).__name__}: {e}") from None
            returned = got
            got = list(got) if isinstance(got, (tuple, list)) else [] if got is None and written else [got]
            if len(got) != len(op.outputs):
                hint = (f"; the kernel writes {', '.join(written)} in place, so the reference must write it in place "
                        f"(e.g. {written[0]}.copy_(new_value)) and return only the outputs"
                        if written and len(got) > len(op.outputs) else
                        f"; return {', '.join(o.name for o in op.outputs)} from {op.reference}()" if op.outputs else "")
                found = "None" if returned is None else f"{len(got)}"
                raise BuildError(f"{where}: expected reference {op.reference}() to return {len(op.outputs)} tensor(s) "
                                 f"({', '.join(o.name for o in op.outputs) or 'None'}), got {found}{hint}")
            for a, t in zip(op.inputs, args):
                if a.name in written and torch.equal(t, before[a.name]):
                    raise BuildError(f"{where}: expected reference {op.reference}() to write {a.name} in place (the "
                                     f"kernel does: Tensor({a.name!r}, mutable=True)), got {a.name} unchanged after a "
                                     f"call on random example values; write it in place, e.g. {a.name}.copy_(...)")
            for o, t in zip(op.outputs, got):
                want_dtype = op.output_dtype_for(o, s)
                if tuple(t.shape) != tuple(shapes[o.name]) or str(t.dtype) != f"torch.{want_dtype}":
                    raise BuildError(
                        f"{where}: output {o.name}: expected the reference's result to match the output rule "
                        f"(shape {list(op.output_shape(o))} = {list(shapes[o.name])}, dtype {want_dtype}), got shape "
                        f"{list(t.shape)}, dtype {str(t.dtype).removeprefix('torch.')} from {op.reference}() at the "
                        "example; fix the Output's shape=/dtype= rule (or the reference)")


def find_tools(frontends_used: tuple[str, ...], targets: list[_targets.TargetID], opts: BuildOptions,
               stack: contextlib.ExitStack) -> tuple[object, Optional[Path], dict[str, str]]:
    """The LLVM toolchain, checked for every AMD target, and a ROCm-shaped root (kept for ``stack``'s life),
    when a frontend in use needs them or offload bundles are asked for; else ``(None, None, {})``."""
    from flyship.compiler import toolchain as _tc

    amd = [t.text for t in targets if t.vendor == "amd"]
    if not amd or not (opts.offload_bundle or any(_frontends.get(f).needs_llvm for f in frontends_used)):
        return None, None, {}
    toolchain = _tc.find_toolchain(opts.llvm_bin)
    _tc.check_targets(toolchain, amd)
    rocm_root = stack.enter_context(_tc.rocm_root(toolchain))
    return toolchain, rocm_root, dict(toolchain.describe())


def succeeded(results: list[TaskResult], keep_going: bool = False
              ) -> tuple[dict[tuple[str, str, str], CompiledVariant], tuple[M.Failure, ...]]:
    """(op, spec, target) -> variant of every task that built, and the failures (with ``keep_going``).

    Raises:
        BuildError: without ``keep_going``, when any task failed: every failed task by (op, spec, target) with
            its error and a next step.
    """
    failed = sorted((r for r in results if r.error), key=lambda r: (r.op, r.spec, r.target))
    if failed and (not keep_going or len(failed) == len(results)):
        raise BuildError(f"flyc-build: {len(failed)} of {len(results)} kernels failed; nothing was written:\n"
                         f"{failure_report(failed)}\n(--keep-going writes a bundle of the kernels that built and "
                         "records these in its manifest; the loader falls back for them)")
    failures = tuple(M.Failure(op=r.op, spec=r.spec, target=r.target, reason=_short(r.error)) for r in failed)
    return {(r.op, r.spec, r.target): r.variant for r in results if not r.error}, failures


_MAX_REASON = 2000  # characters of a failure's message kept in the manifest (its strings are bounded)


def _short(text: str) -> str:
    return text if len(text) <= _MAX_REASON else text[:_MAX_REASON - 15] + " ... (cut here)"


def failure_report(failed: list[TaskResult]) -> str:
    """One block per failed (op, spec, target): the error, then what to do about it. A refusal of the
    declaration itself (:func:`spec_refusal`) that reads the same on several targets is one block naming them."""
    blocks: dict[tuple, list[TaskResult]] = {}
    for r in failed:
        same = (r.error or "").replace(r.target, "\0") if spec_refusal(r) else r.target
        blocks.setdefault((r.op, r.spec, same), []).append(r)
    return "\n".join(f"  {rs[0].op}.{rs[0].spec} on {', '.join(r.target for r in rs)}: {rs[0].error}\n"
                     f"    next step: {next_step(rs[0])}" for rs in blocks.values())


def spec_refusal(r: TaskResult) -> bool:
    """Whether flyship's own check refused the declaration (a SpecError, an entry or binding refusal: a
    FrontendError that is not the DSL's own error nor a target's resource limit): no target changes it."""
    err = r.error or ""
    return bool(err) and r.deterministic and not r.resource and "ProofError" not in err \
        and "ToolchainLimitError" not in err


def next_step(r: TaskResult) -> str:
    """What to do about one failed task, from what kind of failure it is."""
    err = r.error or ""
    if r.resource:
        return (f"the kernel is over {r.target.split(':')[0]}'s limits: give this target a smaller configuration "
                f"(Spec(per_target={{{r.target.split(':')[0]!r}: dict(constexprs=...)}})) or build the spec for the "
                "other targets only (Spec(targets=(...)))")
    if "ProofError" in err:
        return ("flyship's code object differs from the DSL's own: try another LLVM (--llvm-bin) and report the "
                "difference named above")
    if "ToolchainLimitError" in err:
        return (f"this LLVM cannot build FlyDSL kernels for {r.target} (named above); limit the spec to the targets "
                "it builds for (Spec(targets=(...))) or ship the rest with --keep-going")
    if "process died" in err:
        return "the DSL crashed on this kernel: run it alone (one --arch, one spec) to see its own message"
    if spec_refusal(r):
        return ("fix the spec (or the entry) as the error above says: flyship's own check refused the declaration, not "
                "a limit of this target, so limiting the spec's targets or --keep-going does not help")
    return (f"fix the kernel or the spec for {r.target}, limit the spec to the targets it builds for "
            "(Spec(targets=(...))), or ship the rest with --keep-going")


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
    from flyship.compiler import offload as _off

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
