"""Planning a build: the targets asked for, the spec file's declarations, the (op, spec, target) tasks and the
tools the frontends in use need, all settled before any worker starts."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Callable, Optional

from flyship.bundle import manifest as M
from flyship.bundle import rules as _rules
from flyship.bundle import targets as _targets
from flyship.bundle.errors import BundleError
from flyship.compiler import declarations as _declarations
from flyship.compiler import frontends as _frontends
from flyship.compiler import hygiene as _hygiene
from flyship.compiler import spec as _spec_mod
from flyship.compiler import executors as _executors
from flyship.compiler import tuning as _tuning
from flyship.compiler import toolchain as _tc
from flyship.compiler.pipeline.checking import check_reference_outputs, check_references_module, needed_references
from flyship.compiler.pipeline.options import BuildOptions
from flyship.compiler.spec import SpecFile
from flyship.compiler.spec.checks import manifest_head
from flyship.compiler.spec.composite import check_composite_functions
from flyship.compiler.worker import load_spec_file
from flyship.errors import CompileError, FlyshipError, SpecError, headline, traceback_text


def check_archs(archs: tuple[str, ...]) -> list[_targets.TargetID]:
    """Parse the requested targets; unknown ones fail with the list of known processors."""
    if not archs:
        raise CompileError("flyc-build: expected at least one --arch (e.g. --arch gfx942 --arch gfx950)")
    out = []
    for a in archs:
        try:
            t = _targets.parse_target(a)
            _targets.limits(t)
        except M.BundleError as e:
            raise CompileError(f"flyc-build: unknown arch {a!r}: {e}") from None
        out.append(t)
    return out


def check_offload_targets(targets: list[_targets.TargetID]) -> None:
    """``--offload-bundle`` holds one entry per AMD target ID, and clang-offload-bundler refuses two IDs of one
    processor with different features (``gfx942`` and ``gfx942:sramecc+:xnack-``: "conflicting targets", LLVM
    ``getConflictTargetIDCombination``), so refuse them before compiling.

    Raises:
        CompileError: naming both target IDs and what to do.
    """
    seen: dict[str, str] = {}
    for t in targets:
        if t.vendor != "amd":
            continue
        other = seen.setdefault(t.processor, t.text)
        if other != t.text:
            raise CompileError(f"flyc-build --offload-bundle: expected one target ID per processor, got {other} and "
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
            raise CompileError(f"flyc-build: op {op.name} ({op.frontend}) has no target among "
                               f"{[t.text for t in targets]}; {op.frontend} builds for "
                               f"{' and '.join(sorted(fe.vendors))} targets ({_VENDOR_EXAMPLES[min(fe.vendors)]}, ...)")
        others = [t.text for t in targets if t not in usable]
        if others:
            note(f"flyc-build: note: op {op.name} ({op.frontend}) builds for {' and '.join(sorted(fe.vendors))} "
                 f"targets only: not built for {', '.join(others)} (there it runs its reference, or refuses with the "
                 "fallback off)")
        for t in usable:
            try:
                fe.check_target(t)
            except CompileError as e:
                raise CompileError(f"flyc-build: op {op.name} ({fe.title}): {e}") from None
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
            raise CompileError(f"flyc-build: op {op.name}: expected a specialization for some --arch "
                               f"({', '.join(t.text for t in targets)}), got none: its specs are limited to other "
                               f"targets ({limits}); "
                               "add one of those --arch, or widen a spec's targets=(...) (a bundle op without code "
                               "objects would only ever run its reference)")
    return tasks


def _spec_admits(limited_to: tuple[str, ...], t: _targets.TargetID) -> bool:
    """Whether a spec limited to ``limited_to`` (processors, or full target IDs; empty: all) builds for ``t``."""
    return _spec_mod.admits(limited_to, t)


_VENDOR_EXAMPLES = {"amd": "gfx942, gfx950", "nvidia": "sm_90"}


def read_declarations(spec_path: str, targets: list[_targets.TargetID]) -> SpecFile:
    """Import the spec file here, only to list ops and specs (compiles happen in workers), once per target
    environment (:mod:`flyship.compiler.declarations`: each target's tasks follow what its own import declared),
    and refuse what would fail later: a references module that cannot stand alone, a declaration its frontend
    rejects.

    Raises:
        CompileError: naming the spec file or the op.
    """
    try:
        imports, sf = _declarations.load_for_targets(spec_path, targets, load_spec_file)
    except FlyshipError as e:  # a refusal: its own words, one line
        raise CompileError(f"flyc-build: {e}") from None
    except Exception as e:  # a bug: named, its traceback kept (errors.py)
        raise _bug(f"reading the declarations of {spec_path}", e) from e
    if sf.references:
        rp = (Path(sf.path).parent / sf.references).resolve()
        if not rp.is_file():
            raise CompileError(f"spec file {sf.path}: references({sf.references!r}) names no file ({rp})")
        check_references_module(rp, needed_references(sf))
        try:
            check_composite_functions(rp, sf.composites)
        except SpecError as e:
            raise CompileError(f"spec file {sf.path}: {e}") from None
        check_reference_outputs(sf, rp)
    elif any(o.reference for o in sf.ops) or sf.composites:
        raise CompileError(f"spec file {sf.path}: ops name references or composites but the spec calls no "
                         "references('<file>.py'); composites and references live in that module")
    for op in (o for imp in imports for o in imp.spec_file.ops):  # each declaration as its targets import it
        try:
            _frontends.get(op.frontend).check_declaration(op)
        except FlyshipError as e:
            raise CompileError(f"flyc-build: {e}") from None
        except Exception as e:
            raise _bug(f"frontend {op.frontend}'s check of op {op.name}", e) from e
    check_backwards(sf)
    return sf


def check_backwards(sf: SpecFile) -> None:
    """The rule book's judgement of every ``Backward`` on the declarations alone (the ops' heads and the composites),
    before anything compiles: a backward that names a missing op or buffer is refused in seconds, not after every
    kernel was built. The written bundle is judged again by the same rules.

    Raises:
        CompileError: the rule book's refusal, naming the op and its backward.
    """
    heads = tuple(manifest_head(o) for o in sf.ops)
    if not any(h.backward for h in heads):
        return
    draft = M.Manifest(schema_version=M.SCHEMA_VERSION, namespace=sf.namespace or "draft",
                       build=M.BuildInfo(flyship_version="", frontends={}, python="", tools={}), references=None,
                       ops=heads, composites=tuple(sf.composites))
    for h in heads:
        if h.backward is not None:
            try:
                _rules.check_backward(draft, h, h.backward)
            except BundleError as e:
                raise CompileError(f"spec file {sf.path}: {e}") from None


def _bug(where: str, e: Exception) -> CompileError:
    """The error reporting an unexpected exception, a bug: one line naming it, its traceback as ``details``."""
    return CompileError(f"flyc-build: {where} raised an unexpected {headline(e)}; this is a bug (of flyship, the "
                        "frontend or code the spec file calls), not a refusal of the spec: fix or report it with its "
                        "traceback", details=traceback_text(e))


Tools = tuple[object, Optional[Path], dict[str, str]]  # (toolchain, ROCm-shaped root, what goes into cache keys)


def find_tools(frontends_used: tuple[str, ...], targets: list[_targets.TargetID], opts: BuildOptions,
               stack: contextlib.ExitStack, found: Optional[Tools] = None, scratch: Optional[Path] = None) -> Tools:
    """The LLVM toolchain, checked for every AMD target, and a ROCm-shaped root (kept for ``stack``'s life),
    when a frontend in use needs them or offload bundles are asked for; else ``(None, None, {})``. ``found``:
    what :func:`early_tools` found before planning (used when needed, instead of looking again)."""
    amd = [t.text for t in targets if t.vendor == "amd"]
    if not amd or not (opts.offload_bundle or any(_frontends.get(f).needs_llvm for f in frontends_used)):
        return None, None, {}
    if found is not None and found[0] is not None:
        _tc.check_targets(found[0], amd)  # early_tools found the tools without checking them
        return found
    toolchain = _tc.find_toolchain(opts.llvm_bin)
    _tc.check_targets(toolchain, amd)
    rocm_root = stack.enter_context(_tc.rocm_root(toolchain, parent=scratch))
    return toolchain, rocm_root, dict(toolchain.describe())


def early_tools(targets: list[_targets.TargetID], opts: BuildOptions, stack: contextlib.ExitStack,
                scratch: Optional[Path] = None) -> Tools:
    """Before the declarations are read (the early workers need the ROCm root in their environment before they
    import the spec file): the toolchain and ROCm root :func:`find_tools` would give if every registered frontend
    were used, not yet checked against the targets (:func:`find_tools` does that once it is known to be needed,
    while the workers import); ``(None, None, {})`` where none is found, so a build that needs no LLVM is never
    refused here (the needed lookup after planning reports a missing toolchain in its own words)."""
    if not any(t.vendor == "amd" for t in targets):
        return None, None, {}
    try:
        toolchain = _tc.find_toolchain(opts.llvm_bin)
        return toolchain, stack.enter_context(_tc.rocm_root(toolchain, parent=scratch)), dict(toolchain.describe())
    except CompileError:
        return None, None, {}


def check_request(opts: BuildOptions) -> list[_targets.TargetID]:
    """What can be refused before anything is read: the targets, offload bundle conflicts, an installed DSL a
    frontend cannot build with (before the spec file imports it), the executor.

    Raises:
        CompileError: naming what was asked and what to do.
    """
    targets = check_archs(opts.archs)
    if opts.offload_bundle:
        check_offload_targets(targets)
    for name in _frontends.names():
        fe = _frontends.get(name)
        mine = [t for t in targets if t.vendor in fe.vendors]
        if mine:
            fe.check_installed(mine)
    _executors.check_executor(opts.executor)
    return targets


def check_output(out_dir: Path, force: bool) -> None:
    """Recover what an interrupted build left at ``out_dir`` (under its lock), then refuse an existing bundle
    unless ``force``."""
    _hygiene.recover_output(out_dir.resolve())
    if out_dir.exists() and not force:
        raise CompileError(f"flyc-build: output folder {out_dir} exists; pass --force to replace it")
    check_replaceable(out_dir)


def check_replaceable(out_dir: Path) -> None:
    """``--force`` replaces only a flyship bundle (its manifest reads) or an empty folder: never a folder of
    someone's other files, nor a file or a link."""
    if not os.path.lexists(out_dir):
        return
    if out_dir.is_symlink() or not out_dir.is_dir():
        raise CompileError(f"flyc-build: output {out_dir} exists and is not a folder (a file or a link); choose another "
                         "-o, or remove it yourself")
    if not any(out_dir.iterdir()):
        return
    try:
        M.read(out_dir)
    except (M.BundleError, OSError) as e:
        if _written_by_flyship(out_dir):
            return  # an older or broken bundle of ours (a version this flyship refuses): what a rebuild replaces
        raise CompileError(f"flyc-build: output folder {out_dir} is not empty and is not a flyship bundle ({e}); "
                         "--force replaces only a bundle or an empty folder: choose another -o, or empty or remove "
                         "the folder yourself") from None


def _written_by_flyship(out_dir: Path) -> bool:
    """Whether ``out_dir/manifest.json`` is a JSON object with flyship's ``format`` key, whatever its version or
    its other keys: a bundle an older (or newer) flyc-build wrote, which this one may refuse to read but may
    replace."""
    from flyship.bundle import files as _files
    from flyship.bundle import limits as _limits

    try:
        data = _files.read_json(out_dir / M.MANIFEST_NAME, _limits.MAX_MANIFEST_BYTES, what="read bundle")
    except (M.BundleError, OSError):
        return False
    return isinstance(data, dict) and data.get("format") == M.FORMAT_NAME


def plan_tasks(sf: SpecFile, targets: list[_targets.TargetID],
               progress: Callable[[str], None]) -> list[tuple[str, str, str]]:
    """:func:`plan`, less what the config spaces prune on each target before compiling (each pruning reported)."""
    tasks = plan(sf, targets, progress)
    try:
        tasks, pruned = _tuning.prune_tasks(sf.ops, tasks)
    except CompileError as e:
        raise CompileError(f"flyc-build: {e}") from None
    for line in pruned:
        progress(f"flyc-build: {line}")
    return tasks
