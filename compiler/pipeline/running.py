"""Running the planned tasks: what the build cache already holds, the rest on the executor, and the verdict on
what came back (every failure with a next step)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from flyship.bundle import manifest as M
from flyship.compiler import cache as _cache
from flyship.compiler import kernel_sources as _kernel_sources
from flyship.compiler import tuning as _tuning
from flyship.compiler.pipeline.options import BuildOptions, PartialBuildError, Row
from flyship.compiler.frontends import CompiledVariant
from flyship.compiler.spec import SpecFile
from flyship.compiler.worker import TaskResult
from flyship.errors import CompileError


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
    sources = {name: _kernel_sources.kernel_sources(o.kernel) for name, o in ops.items()}
    keys = {}
    for o, s, t in tasks:
        spec = next(x for x in ops[o].specs if x.name == s).for_target(t)
        keys[(o, s, t)] = _cache.task_key(ops[o], spec, t, context, sources[o])
    return keys


def succeeded(results: list[TaskResult], keep_going: bool = False
              ) -> tuple[dict[tuple[str, str, str], CompiledVariant], tuple[M.Failure, ...]]:
    """(op, spec, target) -> variant of every task that built, and the failures (with ``keep_going``).

    Raises:
        CompileError: without ``keep_going``, when any task failed: every failed task by (op, spec, target) with
            its error and a next step.
    """
    failed = sorted((r for r in results if r.error), key=lambda r: (r.op, r.spec, r.target))
    if failed and (not keep_going or len(failed) == len(results)):
        raise CompileError(f"flyc-build: {len(failed)} of {len(results)} kernels failed; nothing was written:\n"
                           f"{failure_report(failed)}\n(--keep-going writes a bundle of the kernels that built and "
                           "records these in its manifest; the loader falls back for them)", details=tracebacks(failed))
    failures = tuple(M.Failure(op=r.op, spec=r.spec, target=r.target, reason=_short(r.error)) for r in failed)
    return {(r.op, r.spec, r.target): r.variant for r in results if not r.error}, failures


_MAX_REASON = 2000  # characters of a failure's message kept in the manifest (its strings are bounded)


def _short(text: str) -> str:
    return text if len(text) <= _MAX_REASON else text[:_MAX_REASON - 15] + " ... (cut here)"


def failure_report(failed: list[TaskResult]) -> str:
    """One block per failed (op, spec, target): the error, then what to do about it. A refusal of the
    declaration itself (:func:`spec_refusal`) that reads the same on several targets is one block naming them."""
    blocks: dict[tuple, list[TaskResult]] = {}
    for r in failed:  # a refusal that reads the same for several specs (a spec and its JIT twin) is one block too
        key = ((r.op, (r.error or "").replace(r.spec, "\1").replace(r.target, "\0")) if spec_refusal(r) else
               (r.op, r.spec, r.target))
        blocks.setdefault(key, []).append(r)
    return "\n".join(f"  {rs[0].op}.{', '.join(dict.fromkeys(r.spec for r in rs))} on "
                     f"{', '.join(dict.fromkeys(r.target for r in rs))}: {rs[0].error}\n"
                     f"    next step: {next_step(rs[0])}" for rs in blocks.values())


def tracebacks(failed: list[TaskResult]) -> str:
    """The tracebacks of the failed tasks that raised a bug (not a flyship error), each under its task's name: the
    ``details`` of the build's error, which flyc-build prints under ``--verbose`` or writes to a file it names."""
    return "".join(f"--- {r.op}.{r.spec} on {r.target} ---\n{r.traceback}" for r in failed if r.traceback)


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
    if r.traceback:
        return ("an unexpected exception, a bug (in the kernel's Python, its frontend or flyship), not a refusal: "
                "its traceback is printed by flyc-build --verbose (or written to the file named below); fix it or "
                "report it with that traceback")
    if "process died while importing the spec file" in err:
        return ("the spec file (or a module it imports) ended the worker process while it imported: look for "
                "os._exit, a crash in native code or a signal at import time in the workers, which import it with "
                "the target's environment (FLYDSL_GPU_ARCH)")
    if "process died" in err:
        return "the DSL crashed on this kernel: run it alone (one --arch, one spec) to see its own message"
    if spec_refusal(r):
        return ("fix the spec (or the entry) as the error above says: flyship's own check refused the declaration, not "
                "a limit of this target, so limiting the spec's targets or --keep-going does not help")
    return (f"fix the kernel or the spec for {r.target}, limit the spec to the targets it builds for "
            "(Spec(targets=(...))), or ship the rest with --keep-going")


def verdict(sf: SpecFile, results: list[TaskResult], keep_going: bool, progress: Callable[[str], None]
            ) -> tuple[list[TaskResult], dict[tuple[str, str, str], CompiledVariant], tuple[M.Failure, ...]]:
    """What the build keeps: config-space variants over a target's limits pruned (reported), the variants that
    built and the failures (:func:`succeeded`), with a warning for each dimension a tuning key leaves out.

    Returns:
        (the results less the pruned ones, (op, spec, target) -> variant, the failures kept by ``keep_going``).
    """
    results, dropped = _tuning.drop_over_limits(sf.ops, results)
    for line in dropped:
        progress(f"flyc-build: {line}")
    variants, failures = succeeded(results, keep_going)
    for op in sf.ops:
        grids = {s: v.launch.grid for (o, s, _t), v in variants.items() if o == op.name}
        for line in _tuning.key_warnings(op, grids):
            progress(f"flyc-build: warning: {line}")
    return results, variants, failures


def partial_build_error(out_dir: Path, rows: list[Row], failures: tuple[M.Failure, ...],
                        results: list[TaskResult]) -> PartialBuildError:
    """The error of a ``--keep-going`` build that wrote its bundle without the kernels that failed."""
    failed = sorted((r for r in results if r.error), key=lambda r: (r.op, r.spec, r.target))
    return PartialBuildError(
        f"flyc-build: {len(failures)} of {len(failures) + len(rows)} kernels failed; --keep-going wrote "
        f"{out_dir} without them (recorded in its manifest's failed; the loader falls back for them):\n"
        f"{failure_report(failed)}", rows, failures, details=tracebacks(failed))
