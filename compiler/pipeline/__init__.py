"""The compile stage, end to end: spec file -> per-target workers -> verified bundle on disk.

:func:`build` reads like its steps, each in the module named for its job:

* :mod:`.planning`: check the request, read the declarations, :func:`plan` the (op, spec, target) tasks,
  find the tools the frontends in use need;
* :mod:`.running`: take what the build cache holds, run the rest on the executor
  (:mod:`flyship.compiler.executors`), judge what came back;
* :mod:`.assembling`: manifest entries, offload bundles and the summary rows from the compiled variants;
* :mod:`.checking`: the checks that need a whole declaration (references module, guards, reachability);
* :mod:`.writing`: write the bundle atomically, and the whole-build cache entry of an unchanged build.

What a build leaves behind is :mod:`flyship.compiler.hygiene`'s business.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Callable

from flyship.compiler import cache as _cache
from flyship.compiler import executors as _executors
from flyship.compiler import hygiene as _hygiene
from flyship.compiler import outlock as _outlock
from flyship.compiler.pipeline.assembling import assemble_manifest, frontend_versions, offload_bundles, summary_rows
from flyship.compiler.pipeline.checking import (check_reachable, check_reference_outputs, check_references_module,
                                                check_resolved_references, guard_constraints, _example_tensor)
from flyship.compiler.pipeline.options import BuildOptions, PartialBuildError, Row
from flyship.compiler.pipeline.planning import (check_archs, check_offload_targets, check_output, check_request,
                                                early_tools, find_tools, plan, plan_tasks, read_declarations)
from flyship.compiler.pipeline.running import (compile_with_cache, failure_report, next_step, partial_build_error,
                                               spec_refusal, succeeded, task_keys, verdict)
from flyship.compiler.pipeline.writing import build_key, remember_build, reuse_bundle, write_bundle, write_results
from flyship.compiler.worker import load_spec_file

__all__ = ["BuildOptions", "PartialBuildError", "Row", "assemble_manifest", "build", "check_archs",
           "check_offload_targets", "check_reachable", "check_reference_outputs", "check_references_module",
           "compile_with_cache", "failure_report", "find_tools", "frontend_versions", "guard_constraints",
           "load_spec_file", "next_step", "offload_bundles", "plan", "read_declarations", "remember_build",
           "spec_refusal", "succeeded", "summary_rows", "task_keys", "write_bundle", "_example_tensor"]


def build(opts: BuildOptions, progress: Callable[[str], None] = lambda s: print(s, file=sys.stderr)) -> list[Row]:
    """Run the whole compile stage.

    Returns:
        One :class:`Row` per compiled variant, for the summary table.

    Raises:
        CompileError: anything that stops the build (unknown arch, tools missing, output exists or another build
            is writing it, a kernel failing to compile or prove); every failing task is listed. Nothing is
            written then.
        PartialBuildError: ``--keep-going`` wrote the bundle without the kernels that failed.
    """
    targets = check_request(opts)
    out_dir = Path(opts.out_dir)
    cache = _cache.open_cache(opts.cache, progress)
    with _outlock.output_lock(out_dir.resolve()):
        check_output(out_dir, opts.force)
        bkey = build_key(opts, cache) if cache else ""
        if cache and (rows := reuse_bundle(cache, bkey, out_dir, opts.force, progress)) is not None:
            return rows
        with contextlib.ExitStack() as stack:
            scratch = stack.enter_context(_hygiene.scratch_dir())
            # The workers start now and import the spec file while this process imports it to plan (pools.py).
            found = early_tools(targets, opts, stack, scratch)
            early = stack.enter_context(
                _executors.early_pools(opts, [t.text for t in targets], found[0], found[1], scratch))
            # every file the spec reads while imported: the inputs of the whole-build entry (none without a cache)
            with _cache.record_reads() if cache else contextlib.nullcontext({}) as deps:
                sf = read_declarations(opts.spec_path, targets)
            tasks = plan_tasks(sf, targets, progress)
            frontends_used = tuple(sorted({o.frontend for o in sf.ops}))
            toolchain, rocm_root, tools = find_tools(frontends_used, targets, opts, stack, found, scratch)
            # The workers get what the early ones were given when nothing in use needs a toolchain (only the frontends
            # that need one read it), so the early pools fit; the bundle and the cache keys keep `tools`.
            workers_tools = (toolchain, rocm_root) if toolchain is not None else (found[0], found[1])
            progress(f"flyc-build: {len(tasks)} kernels ({len(sf.ops)} ops) for "
                     f"{', '.join(t.text for t in targets)}, jobs={opts.jobs}")
            results, hits = compile_with_cache(
                tasks, sf, tools, opts, cache, progress,
                lambda todo: _executors.run(todo, opts, *workers_tools, scratch, progress, frontends_used, early))
            results, variants, failures = verdict(sf, results, opts.keep_going, progress)
            check_resolved_references(sf, variants)  # op(..., mutable=True): now that the writes are known
            write_results(sf, variants, failures, tools, toolchain, scratch, out_dir, opts)
        rows = summary_rows(sf, variants, hits)
        if failures:  # a partial bundle is never the cached answer to an unchanged build: it would hide them
            raise partial_build_error(out_dir, rows, failures, results)
        if cache:
            remember_build(cache, bkey, deps, opts.spec_path, out_dir, rows)
    return rows
