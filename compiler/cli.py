"""``flyc-build``: the compile stage's command line (click). Parses into BuildOptions, calls build()."""

from __future__ import annotations

import atexit
import os
import sys
import tempfile
from typing import TYPE_CHECKING
from pathlib import Path

import click

from flyship import env as _env
from flyship.compiler import hygiene as _hygiene
from flyship.compiler import outlock as _outlock
from flyship.compiler import signals as _signals
from flyship.errors import FlyshipError, bug_details

if TYPE_CHECKING:
    from flyship.compiler.pipeline import Row


def format_table(rows: list[Row], verbose: bool = False) -> str:
    """The summary table, one row per kernel launch: op, spec, arch, launch (``K/N``, only when some op launches
    several kernels per call), kernel symbol, VGPRs, SGPRs, LDS bytes, kernarg bytes, occupancy, compile seconds
    (of the whole variant, on its first launch's row; ``-`` on the others) or ``cached``; then the notes
    (:func:`format_notes`)."""
    multi = any(r.launches > 1 for r in rows)
    head = ("op", "spec", "arch", *(("launch",) if multi else ()), "kernel", "VGPRs", "SGPRs", "LDS bytes",
            "kernarg bytes", "occupancy", "compile s")
    body = [(r.op, r.spec, r.target, *((f"{r.launch}/{r.launches}",) if multi else ()), r.symbol, str(r.vgprs),
             str(r.sgprs), str(r.lds), str(r.kernarg_bytes), r.occupancy,
             "cached" if r.cached else f"{r.seconds:.1f}" if r.launch == 1 else "-") for r in rows]
    left = head.index("kernel") + 1  # text columns left-aligned, numbers right-aligned
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    line = lambda cells: "  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))  # noqa: E731
    notes = format_notes(rows, verbose)
    return "\n".join([line(head), line(tuple("-" * w for w in widths)), *(line(b) for b in body),
                      *(["", "notes:", *notes] if notes else [])])


def format_notes(rows: list[Row], verbose: bool = False) -> list[str]:
    """The variants' notes: each one with ``verbose``; else one line per kind of note (its words before the first
    colon), naming the first three variants, so that one kind repeated for every generic variant (16-34 "differs
    from Triton's JIT" in a build) does not bury a note that stands alone."""
    noted = [r for r in rows if r.note]
    if verbose:
        return [f"  {r.op} {r.spec} {r.target}: {r.note}" for r in noted]
    kinds: dict[str, list[Row]] = {}
    for r in noted:
        kinds.setdefault(r.note.split(":", 1)[0], []).append(r)
    lines = []
    for kind, rs in kinds.items():
        if len(rs) == 1:
            lines.append(f"  {rs[0].op} {rs[0].spec} {rs[0].target}: {rs[0].note}")
            continue
        named = ", ".join(f"{r.op} {r.spec} {r.target}" for r in rs[:3]) + (f" and {len(rs) - 3} more"
                                                                             if len(rs) > 3 else "")
        lines.append(f"  {kind}: {len(rs)} variants ({named}); flyc-build -v shows each")
    return lines


def report_error(e: FlyshipError, verbose: bool) -> None:
    """Print a deliberate error's message (one line, or one per failed kernel); where it reports a bug (an
    unexpected exception, here or in a worker), also that bug's traceback: printed with ``verbose``, else written
    to a file this names, so a bug is never just one line."""
    click.echo(f"error: {e}", err=True)
    tb = bug_details(e)
    if not tb:
        return
    if not verbose:
        try:
            fd, path = tempfile.mkstemp(prefix="flyc-build-", suffix=".traceback.txt")
            with os.fdopen(fd, "w") as fh:
                fh.write(tb)
            click.echo(f"the traceback of the unexpected exception is in {path} (flyc-build --verbose prints it)",
                       err=True)
            return
        except OSError:
            pass  # no temporary folder to write to: print it instead
    click.echo(f"traceback of the unexpected exception:\n{tb}", err=True)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("spec", type=click.Path(dir_okay=False))
@click.option("-o", "--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Bundle folder to write.")
@click.option("--arch", "archs", multiple=True, required=True,
              help="Target ID to build for (repeatable): gfx942, gfx950, gfx942:sramecc+:xnack-, sm_90.")
@click.option("-j", "--jobs", default=1, show_default=True, type=click.IntRange(1, 256),
              help="Worker processes in all (at least one per target).")
@click.option("--force", is_flag=True, help="Replace an existing output folder.")
@click.option("--keep-ir", is_flag=True, help="Also write each code object's assembly (.s).")
@click.option("--llvm-bin", type=click.Path(file_okay=False), default=None,
              help="Folder with llvm-mc and ld.lld, searched before ROCm and Debian installs.")
@click.option("--offload-bundle", is_flag=True, help="Also write one clang offload bundle per specialization.")
@click.option("--pack", "pack", is_flag=True,
              help="Also write the bundle as one file, OUT.flyship (flyship pack; flyship.load opens it).")
@click.option("--sign", "sign_key", default=None, type=click.Path(dir_okay=False),
              help="With --pack: sign the pack with this Ed25519 private key (from `flyship keygen`; docs/security.md).")
@click.option("--code-object-version", type=click.Choice(["5", "6"]), default=None,
              help="AMDHSA code object version (default: what FlyDSL emitted; ROCm < 6.3 refuses 6).")
@click.option("--no-cache", is_flag=True,
              help="Compile everything; neither read nor fill the build cache (FLYSHIP_CACHE_DIR).")
@click.option("--executor", default="local", show_default=True, metavar="local|ray[:ADDRESS]",
              help="Where compile tasks run: local process pools, or a Ray cluster (ray: RAY_ADDRESS or a private "
                   "local instance; ray:HOST:PORT an existing cluster).")
@click.option("--keep-going", is_flag=True,
              help="When kernels fail, still write a bundle of those that built, recording the failures in its "
                   "manifest (the loader falls back for them); exits 1.")
@click.option("--verify", "verify", is_flag=True,
              help="After writing, run every AMD specialization on the emulated device against its reference "
              "(`flyship verify --emulate`: boundary shapes, admitted layouts, both wave schedules), and every Triton "
              "kernel's source under Triton's interpreter through the same cases' recorded launches; a mismatch "
              "refuses the build (the bundle is moved to OUT.refused). Needs torch and a C++ compiler here.")
@click.option("--verify-budget", type=click.FloatRange(min=0.0), default=60.0, show_default=True,
              help="With --verify: seconds per specialization and target; cases past it are listed as skipped.")
@click.option("-v", "--verbose", is_flag=True,
              help="Print every variant's note (without it: one line per kind of note), and the traceback of an "
                   "unexpected exception (a bug) with the error (also FLYSHIP_VERBOSE=1); without it the traceback "
                   "goes to a file the error names.")
def main(spec, out_dir, archs, jobs, force, keep_ir, llvm_bin, offload_bundle, pack, sign_key, code_object_version,
         no_cache, executor, keep_going, verify, verify_budget, verbose) -> None:
    """Compile the ops declared in SPEC into a verified bundle of code objects + manifest."""
    if sign_key is not None and not pack:
        raise click.UsageError("--sign KEY signs the pack: expected --pack with it, got --sign alone; add --pack")
    if sign_key is not None and not os.path.isfile(sign_key):  # before a long build, not after it
        raise click.BadParameter(f"expected the private key file `flyship keygen` wrote, found no file at {sign_key}",
                                 param_hint="--sign")
    # Imported here, after run() has installed the signal handlers: the build's modules take ~0.6 s to import, a
    # window in which SIGTERM would otherwise end the process by the default action.
    from flyship.compiler.pipeline import BuildOptions, PartialBuildError, build

    opts = BuildOptions(spec_path=spec, out_dir=out_dir, archs=tuple(archs), jobs=jobs, force=force, keep_ir=keep_ir,
                        llvm_bin=llvm_bin, offload_bundle=offload_bundle,
                        code_object_version=int(code_object_version) if code_object_version else None,
                        cache=not no_cache, executor=executor, keep_going=keep_going)
    try:
        _outlock.sweep_leftovers(Path(out_dir).resolve())  # what killed builds left, before anything else
        rows = build(opts)
        if verify:
            _verify_emulated(out_dir, archs, verify_budget)
            _verify_interpreted(spec, out_dir, archs, verify_budget)
        packed = _write_pack(out_dir, sign_key) if pack else None
    except PartialBuildError as e:  # the bundle of what built is written: show it, then every failure
        click.echo(format_table(e.rows, verbose or _env.verbose()))
        click.echo(f"\nwrote {out_dir} (partial)")
        report_error(e, verbose or _env.verbose())
        sys.exit(1)
    except FlyshipError as e:  # every deliberate error carries its own wording; anything else is a bug
        report_error(e, verbose or _env.verbose())
        sys.exit(1)
    click.echo(format_table(rows, verbose or _env.verbose()))
    click.echo(f"\nwrote {out_dir}" + (f" and {packed}" if packed else ""))


def _verify_emulated(out_dir: str, archs: tuple[str, ...], budget: float) -> None:
    """``--verify``: ``flyship verify --emulate`` on the written bundle for its AMD targets, in a child process of this
    Python (the compiler never imports the loader: docs/architecture.md), its lines shown as they come. A mismatch
    moves the bundle to ``OUT.refused`` (nothing at OUT to load) and raises naming the first failure.

    Raises:
        CompileError (kind "VerifyError"): a specialization disagreed with its reference on the emulated device, or
            the check could not run.
    """
    import subprocess

    from flyship.errors import CompileError

    amd = [a.split(":", 1)[0] for a in archs if a.startswith("gfx")]
    others = [a for a in archs if not a.startswith("gfx")]
    if others:
        click.echo(f"flyc-build --verify: {', '.join(others)} code objects not executed (no NVIDIA GPU; the emulator "
                   "runs AMD code objects only); Triton kernels run from their source under Triton's interpreter")
    if not amd:
        return
    cmd = [sys.executable, "-m", "flyship.loader.tools.cli", "verify", "--emulate", str(out_dir),
           *(x for a in dict.fromkeys(amd) for x in ("--target", a)), "--budget", str(budget)]
    env = {k: v for k, v in os.environ.items() if k != "FLYSHIP_FLAVOR"}
    click.echo(f"flyc-build --verify: running every AMD specialization on the emulated device ({', '.join(amd)})")
    r = subprocess.run(cmd, stdout=None, stderr=subprocess.PIPE, text=True, env=env)
    if r.returncode == 0:
        return
    words = (r.stderr.strip().splitlines() or ["no output"])[-1].removeprefix("Error: ")
    if words.startswith("verify --emulate: expected") and ", got " in words:  # its own words, without repeating ours
        words = words.split(", got ", 1)[1]
    refused = _refuse(out_dir)
    raise CompileError(f"flyc-build --verify: expected every AMD specialization to match its reference on the emulated "
                     f"device, got {words}; the bundle was moved to {refused} (not shipped); fix the kernel or its "
                     f"spec, or run `flyship verify --emulate {refused}` to see every case", kind="VerifyError")


def _refuse(out_dir: str) -> str:
    """Move a refused bundle to ``OUT.refused`` (nothing left at OUT to load); its new path."""
    import shutil

    refused = str(out_dir).rstrip("/") + ".refused"
    shutil.rmtree(refused, ignore_errors=True)
    os.replace(out_dir, refused)
    return refused


def _verify_interpreted(spec: str, out_dir: str, archs: tuple[str, ...], budget: float) -> None:
    """``--verify`` for Triton ops: each kernel's source under Triton's interpreter, replaying the launches the
    loader's recording driver makes for every case (:mod:`flyship.loader.tools.verify_interpreted`), in a child
    process of this Python with ``TRITON_INTERPRET=1`` set before Triton is imported. The plan it replays (kernel
    files, constexprs, file hashes) comes from the spec (:mod:`flyship.compiler.interpreting`).

    Raises:
        CompileError (kind "VerifyError"): a Triton specialization disagreed with its reference under the
            interpreter, or the check could not run; the bundle is moved to ``OUT.refused``.
    """
    import subprocess
    import tempfile

    from flyship.compiler.interpreting import interpret_plan, write_plan
    from flyship.errors import CompileError

    plan = interpret_plan(spec, tuple(dict.fromkeys(archs)))
    if plan is None:
        return
    click.echo("flyc-build --verify: running every Triton specialization's kernel source under Triton's interpreter "
               f"(TRITON_INTERPRET=1), replaying the {plan['target']} launches")
    with tempfile.TemporaryDirectory(prefix="flyship-interp-") as tmp:
        plan_path = Path(tmp) / "plan.json"
        write_plan(plan, plan_path)
        env = {k: v for k, v in os.environ.items() if k != "FLYSHIP_FLAVOR"}
        env["TRITON_INTERPRET"] = "1"
        cmd = [sys.executable, "-m", "flyship.loader.tools.verify_interpreted", str(out_dir), str(plan_path),
               str(budget)]
        r = subprocess.run(cmd, stdout=None, stderr=subprocess.PIPE, text=True, env=env)
    if r.returncode == 0:
        return
    words = (r.stderr.strip().splitlines() or [f"no output (exit status {r.returncode})"])[-1]
    refused = _refuse(out_dir)
    raise CompileError(f"flyc-build --verify: expected every Triton specialization to match its reference under "
                       f"Triton's interpreter, got {words}; the bundle was moved to {refused} (not shipped); fix the "
                       "kernel or its spec (grid, Values, guard constraints)", kind="VerifyError")


def _write_pack(out_dir: str, sign_key: str | None = None) -> str:
    """``--pack [--sign KEY]``: the bundle as one file beside it, signed with KEY when given (imported here: most
    builds write no pack)."""
    from flyship.bundle import pack as _pack

    return _pack.pack(out_dir, str(out_dir).rstrip("/") + ".flyship", sign_key)


def run() -> None:
    """The ``flyc-build`` program: :func:`main`, then the process ends without tearing its modules down.

    The build process has imported torch and the DSL to plan; interpreter teardown of those took 0.5-0.7 s of
    every build's wall time on the 2-core machine, after the bundle was written (docs/perf.md, "Build wall time").
    Every exit handler still runs first (multiprocessing's, the DSLs', the user's), and the exit code is main's."""
    # SIGTERM (a job scheduler, `kill`) unwinds like Ctrl-C: the pools are stopped, the scratch folder removed;
    # neither lands inside a DSL's native import; a second one exits at once (compiler/signals.py).
    code: object = 1
    try:  # (a signal may land right after the handlers are installed: the outer handler catches it)
        _signals.install(stop_processes=lambda: (_hygiene.sweep_descendants(), _hygiene.release_semaphores()))
        _workers_skip_main()
        _hygiene.adopt_orphans()  # what the spec file starts and detaches, here or in a worker, stays ours to stop
        try:
            main()  # click's standalone mode ends in SystemExit, with the command's code
            code = 0
        except SystemExit as e:
            code = e.code
        except KeyboardInterrupt:  # one that click's own handling did not catch (raised outside the command)
            print("\nflyc-build: interrupted", file=sys.stderr)
        _signals.finishing()  # (a signal may land at this call's entry: the handler below catches it)
    except KeyboardInterrupt:  # a signal before the command (right after install) or between its end and the line above
        _signals.finishing()
    if isinstance(code, str):  # as the interpreter does with SystemExit("message")
        print(code, file=sys.stderr)
    status = _signals.exit_status(0 if code is None else code if isinstance(code, int) else 1)
    run_exit_handlers = getattr(atexit, "_run_exitfuncs", None)
    if run_exit_handlers is None:  # another Python than CPython: the ordinary exit
        _stop_leftovers()
        sys.exit(status)
    run_exit_handlers()
    _stop_leftovers()
    _hygiene.end_process(status)


def _stop_leftovers() -> None:
    """No process outlives flyc-build (one left would also hold its output open: ``flyc-build ... | tee`` waits)."""
    stopped = _hygiene.sweep_descendants()
    others = [str(s) for s in stopped if not s.tool]
    tools = [str(s) for s in stopped if s.tool]
    if others:
        print(f"flyc-build: stopped {len(others)} process(es) still running as the build ended (started by the spec "
              f"file or the DSL, and left running): {', '.join(others)}", file=sys.stderr, flush=True)
    if tools:
        print(f"flyc-build: stopped {len(tools)} of flyship's own tool process(es) still running as the build ended: "
              f"{', '.join(tools)}", file=sys.stderr, flush=True)


def _workers_skip_main() -> None:
    """Spawned workers do not run this program's main module again. multiprocessing's spawn re-imports the parent's
    ``__main__`` in every child (by its module name or file) so that functions defined there unpickle; flyc-build's
    workers run only flyship.compiler.worker's functions, and re-importing the CLI (click, the build's modules) was
    ~0.2 s of each worker's start, on the critical path of every build (0.27 -> 0.05 s to a worker's first task).
    Only the program does this (:func:`run`), never a process that calls build() as a library."""
    main = sys.modules.get("__main__")
    if main is not None:
        main.__spec__ = None  # no init_main_from_name
        main.__dict__.pop("__file__", None)  # no init_main_from_path


if __name__ == "__main__":
    run()
