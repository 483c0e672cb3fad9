"""The ``flyship`` command: inspect, verify and prepare for bundles on the workload side.

    flyship list BUNDLE        ops, schemas, specializations (guards) and targets; no GPU, no compiler
    flyship verify BUNDLE      run every specialization against its reference; needs a GPU
    flyship verify --emulate BUNDLE   the same and more (boundary shapes, two wave schedules, guard zones) for every
                               AMD specialization on the emulated device (the CPU emulator; no GPU)
    flyship prebuild [-o DIR]  build the C++ extension and install it (the environment, or DIR beside a bundle)
    flyship hook install|status|remove   patch every process of this environment (docs/integrate.md)
    flyship bench FACTORY --patches FILE  baseline / patched / compiled / patched+compiled timings
    flyship pack BUNDLE -o F [--sign KEY]  write the bundle as one reproducible file that flyship.load(F) opens
    flyship check FILE [--trusted-key PUB]  a pack's signature, hashes, rules, targets; exit 3/4/5 for unsigned /
                               altered / signed by an untrusted key (CI: docs/shipping.md)
    flyship keygen KEY         an Ed25519 key pair (KEY, KEY.pub) for signed packs (docs/security.md)
    flyship inspect BUNDLE     per kernel: symbol, kernargs, registers, LDS, scratch, spills, occupancy [--json];
                               every code object checked, exit 1 when one is bad
    flyship tune BUNDLE --shapes FILE      race each tuned op's configs on this GPU, write a tuning table
                                           (--dry-run: check bundle, shapes and table, no GPU)

Each command parses its options and calls one plain function; errors print one clear line and exit 1
(2 for a usage error, as click does).
"""

from __future__ import annotations

from pathlib import Path

import click

from flyship.bundle import manifest as _m
from flyship.bundle import pack as _pack
from flyship.errors import FlyshipError


def describe(manifest: _m.Manifest) -> str:
    """A readable listing of a manifest: ops, schemas, specializations with guards and targets."""
    from flyship.loader.plan import implied_layout_constraints
    from flyship.loader.opschema import schemas

    lines = [f"namespace {manifest.namespace} (schema {manifest.schema_version}, built by flyship "
             f"{manifest.build.flyship_version} under Python {manifest.build.python}; "
             f"frontends {', '.join(f'{k} {v}' for k, v in sorted(manifest.build.frontends.items()))})",
             f"targets: {', '.join(manifest.targets)}"]
    backward_of: dict[str, str] = {}  # an op may be the backward of several (rope_bwd: rope_fwd and rope_inplace)
    for h in (*manifest.ops, *manifest.composites):
        if getattr(h, "backward", None) is not None:
            backward_of[h.backward.op] = ", ".join(filter(None, (backward_of.get(h.backward.op), h.name)))
    for op in manifest.ops:
        functional, out = schemas(op)
        lines.append("")
        lines.append(f"{manifest.namespace}::{functional}")
        if out is not None:
            lines.append(f"{manifest.namespace}::{out}")
        lines.append(f"  {op.doc}  [{op.frontend}; reference: {op.reference or 'none'}]")
        lines += _autograd_lines(op, backward_of)
        batched = [f"{a.name} (rank {a.rank})" for a in op.args if a.batch]
        if batched:
            back = [o.name for o in op.outputs if o.batch]
            lines.append(f"  leading batch dims: {', '.join(batched)} flatten into their first dim"
                         + (f"; {', '.join(back)} get them back" if back else ""))
        for s in op.specializations:
            guard = [f"{k}={v}" for k, v in s.guard.dtypes.items()] + list(s.guard.constraints)
            guard += [f"{k} aligned to {v}" for k, v in s.guard.alignment.items()]
            targets = ", ".join(f"{v.target} ({v.code_object.format})" for v in s.variants)
            implied = [c for cs in implied_layout_constraints(op, s.variants, s.guard.constraints).values() for c in cs]
            lines.append(f"  {s.name}: {'; '.join(guard) or 'any input'}")
            if implied:
                lines.append(f"    layout (implied by the kernargs): {'; '.join(implied)}")
            lines.append(f"    targets: {targets}")
    for c in manifest.composites:
        from flyship.loader.composites import schema

        lines += ["", f"{manifest.namespace}::{schema(c)}",
                  f"  {c.doc}  [composite: {manifest.references}:{c.function}, torch code over this bundle's ops]"]
        lines += _autograd_lines(c, backward_of)
    return "\n".join(lines)


def _autograd_lines(head: object, backward_of: dict[str, str]) -> list[str]:
    """``backward: <op> (grads x <- dx, ...)`` for an op or composite with a derivative, ``backward of: <op>`` for
    the op that is one."""
    out = []
    b = getattr(head, "backward", None)
    if b is not None:
        grads = ", ".join(f"{x} <- {g}" for x, g in b.grads.items())
        out.append(f"  backward: {b.op} (grads {grads})")
    name = getattr(head, "name")
    if name in backward_of:
        out.append(f"  backward of: {backward_of[name]}")
    return out


@click.group()
def main() -> None:
    """flyship: run FlyDSL / Triton kernel bundles as torch ops."""


@main.command("list")
@click.argument("bundle", type=click.Path(path_type=Path))
def list_cmd(bundle: Path) -> None:
    """List the ops, specializations and targets of BUNDLE (a folder, its manifest.json or a packed file), after
    every check a load makes without torch."""
    from flyship.bundle import rules

    try:
        bundle = _pack.bundle_dir(bundle)
        manifest = _m.read(bundle)
        rules.check_bundle(bundle, manifest)
        click.echo(describe(manifest))
    except FlyshipError as e:
        raise click.ClickException(str(e)) from None


@main.command("verify")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--namespace", default=None, help="register under this torch namespace instead of the manifest's")
@click.option("--emulate", is_flag=True, help="run every AMD specialization on the emulated device (CPU emulator, no "
              "GPU), with boundary shapes, every admitted layout, both wave schedules and guard zones")
@click.option("--target", "targets", multiple=True, help="with --emulate: the AMD targets to emulate (repeat; default "
              "the bundle's own gfx90a/gfx942/gfx950 targets)")
@click.option("--op", "op_names", multiple=True, help="with --emulate: only these ops (repeat)")
@click.option("--no-shapes", is_flag=True, help="with --emulate: leave out the boundary shapes beyond the example")
@click.option("--budget", type=click.FloatRange(min=0.0), default=None,
              help="with --emulate: seconds per specialization and target before its remaining cases are skipped "
              "(default 120)")
def verify_cmd(bundle: Path, namespace: str | None, emulate: bool, targets: tuple[str, ...],
               op_names: tuple[str, ...], no_shapes: bool, budget: float | None) -> None:
    """Check BUNDLE entirely (every rule, every code object), then run every specialization against its reference
    on generated inputs (needs a GPU; with --emulate, on the emulated device instead)."""
    from flyship.loader import core
    from flyship.loader.tools.verify import VerificationError

    if emulate:
        _verify_emulated(bundle, targets, op_names, no_shapes, budget)
        return
    if targets or op_names or no_shapes or budget is not None:
        raise click.UsageError("--target, --op, --no-shapes and --budget go with --emulate")
    try:
        ops = core.load(bundle, namespace=namespace)
        ops.check()  # every rule and code object now, whatever the load took from the plan cache
        report = ops.verify()
    except FlyshipError as e:
        raise click.ClickException(str(e)) from None
    click.echo(report.table())
    try:
        report.raise_on_failure()
    except VerificationError:
        raise click.ClickException("verification failed (see the table above)") from None


def _verify_emulated(bundle: Path, targets: tuple[str, ...], op_names: tuple[str, ...], no_shapes: bool,
                     budget: float | None) -> None:
    from flyship.loader.tools import verify_emulated as _ve

    for t in targets:
        if not t.startswith("gfx"):
            raise click.UsageError(f"--target: expected an AMD target (gfx942, gfx950), got {t!r}; the emulator runs "
                                   "AMD code objects only")
    try:
        report = _ve.verify_emulated(bundle, targets or None, shapes=not no_shapes, ops=op_names or None,
                                     budget_s=_ve.DEFAULT_BUDGET_S if budget is None else budget, echo=click.echo)
    except FlyshipError as e:
        raise click.ClickException(str(e)) from None
    click.echo(report.summary())
    bad = report.failures()
    if bad:
        first = bad[0]
        raise click.ClickException(f"verify --emulate: expected every AMD specialization to match its reference on "
                                   f"the emulated device, got {len(bad)} failing; first: op {first.op!r}, "
                                   f"specialization {first.spec!r}, {first.target}, {first.case}: {first.note}")
    if not report.ok:
        raise click.ClickException("verify --emulate: expected at least one AMD specialization to run on the emulated "
                                   f"device, got none; {_nothing_emulated(bundle, targets)}")


def _nothing_emulated(bundle: Path, targets: tuple[str, ...]) -> str:
    """Why ``verify --emulate`` ran nothing: the targets asked for that the bundle has no code objects for (and the
    ones it has), or a bundle with no AMD code objects the emulator models."""
    from flyship.loader.tools import verify_emulated as _ve

    try:
        has = _ve.bundle_targets(bundle)
    except FlyshipError:
        has = ()
    if not has:
        return "the bundle has no AMD code objects the emulator models (an sm_*-only bundle is not executed)"
    missing = [t for t in targets if t.split(":", 1)[0] not in has]
    if missing:
        return (f"the bundle has no {', '.join(missing)} code objects (it has {', '.join(has)}); pass "
                f"{' '.join(f'--target {t}' for t in has)} or leave --target out")
    return f"every case was skipped (see the table above); the bundle's AMD targets: {', '.join(has)}"


@main.command("prebuild")
@click.option("--flavor", type=click.Choice(["hip", "cuda"]), default=None,
              help="driver shim to build (default: from FLYSHIP_FLAVOR or the torch build)")
@click.option("-o", "--out", "out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="folder to put the extension in, e.g. the one holding the bundle (default: this Python "
                   "environment, <sys.prefix>/share/flyship/extensions)")
def prebuild_cmd(flavor: str | None, out: Path | None) -> None:
    """Build the loader's C++ extension and install it where later loads find it without a compiler, whatever
    their HOME, CXX or current directory."""
    from flyship.loader import extension

    try:
        cfg = extension.config(flavor)
        path = extension.install(extension.build(cfg), out if out is not None else extension.installed_dir())
    except (FlyshipError, OSError) as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"flyship extension ({cfg.flavor}) ready: {path}")


@main.group("hook")
def hook_group() -> None:
    """Patch functions with ops in every process of this environment (torchrun's ranks included)."""


SITE_DIR = click.option("--site-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
                        help="the site-packages folder (default: this Python's)")


@hook_group.command("install")
@click.option("--patches", "patches", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="the patches file (JSON: bundle + patches; see docs/integrate.md)")
@SITE_DIR
def hook_install_cmd(patches: Path, site_dir: Path | None) -> None:
    """Write a .pth that applies PATCHES when their modules are first imported, in every interpreter here."""
    from flyship.loader.tools import hook

    try:
        pth = hook.install(patches, site_dir)
        targets = [f"{p.target} -> {p.op}" for p in hook.read_patches(patches).patches]
    except FlyshipError as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"flyship hook installed: {pth}")
    for t in targets:
        click.echo(f"  {t}")


@hook_group.command("status")
@SITE_DIR
def hook_status_cmd(site_dir: Path | None) -> None:
    """Show the installed hook, its patches file and whether that file is valid (exit 1 when it is not)."""
    from flyship.loader.tools import hook

    st = hook.status(site_dir)
    if st is None:
        click.echo(f"no flyship hook in {hook.site_dir(site_dir)}")
        return
    click.echo(f"flyship hook: {st['pth']}\npatches: {st['patches']}")
    if not st["ok"]:
        raise click.ClickException(f"the patches file is invalid, nothing will be patched: {st['error']}")
    click.echo(f"bundle: {st['bundle']}")
    for t in st["targets"]:
        click.echo(f"  {t}")


@hook_group.command("remove")
@SITE_DIR
def hook_remove_cmd(site_dir: Path | None) -> None:
    """Delete the hook's .pth: later processes are no longer patched."""
    from flyship.loader.tools import hook

    try:
        pth = hook.remove(site_dir)
    except FlyshipError as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"removed {pth}" if pth else f"no flyship hook in {hook.site_dir(site_dir)}")


@main.command("bench")
@click.argument("factory")
@click.option("--patches", "patches", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="the patches file (as for flyship hook install)")
@click.option("--repeats", default=10, show_default=True, help="timed runs per arm (interleaved; the median counts)")
@click.option("--iters", default=10, show_default=True, help="calls per timed run")
@click.option("--warmup", default=3, show_default=True, help="untimed calls per arm first (compiles)")
@click.option("--backend", default="inductor", show_default=True, help="torch.compile backend of the compiled arms")
@click.option("--mode", default=None, help="torch.compile mode of the compiled arms")
def bench_cmd(factory: str, patches: Path, repeats: int, iters: int, warmup: int, backend: str,
              mode: str | None) -> None:
    """Time FACTORY's callable in four arms: baseline, patched, compiled, patched+compiled.

    FACTORY is 'package.module:function'; the function returns (fn, args) or (fn, args, kwargs).
    """
    from flyship.loader.tools.bench import bench_from_files
    from flyship.loader.tools.report import format_report, routing_report

    options = {"backend": backend, **({"mode": mode} if mode else {})}
    try:
        result, _ = bench_from_files(factory, str(patches), repeats=repeats, iters=iters, warmup=warmup,
                                     compile_options=options)
    except FlyshipError as e:
        raise click.ClickException(str(e)) from None
    click.echo(result.table())
    click.echo(format_report(routing_report()))


@main.command("inspect")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="print JSON instead of text")
def inspect_cmd(bundle: Path, as_json: bool) -> None:
    """Show each kernel of BUNDLE (every launch of a multi-launch op): symbol, kernarg layout, registers, LDS,
    scratch, spills and occupancy. Each code object is checked as a load checks it (sha256, a readable ELF that
    says what the manifest says); bad ones are marked and the command exits 1."""
    import json

    from flyship.loader.tools.inspect import format_inspect, inspect_bundle

    try:
        data = inspect_bundle(_pack.bundle_dir(bundle))
    except FlyshipError as e:
        raise click.ClickException(str(e)) from None
    click.echo(json.dumps(data, indent=1, sort_keys=True) if as_json else format_inspect(data))
    bad = [k for k in data["kernels"] if k["problem"] is not None]
    if bad:
        marked = "their \"problem\" fields" if as_json else "their BAD CODE OBJECT lines"
        raise click.ClickException(
            f"inspect: expected every code object to match the manifest, got {len(bad)} of {len(data['kernels'])} "
            f"that do not ({marked} above say why); rebuild or re-copy the bundle")


@main.command("pack")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("-o", "--out", "out", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="the file to write (e.g. my_kernels.flyship)")
@click.option("--sign", "sign", default=None, type=click.Path(dir_okay=False, path_type=Path),
              help="Ed25519 private key (from `flyship keygen`) to sign the pack's sha256 index with")
def pack_cmd(bundle: Path, out: Path, sign: Path | None) -> None:
    """Write BUNDLE (a folder, its manifest.json or a packed file) as one reproducible file (manifest, references,
    code objects; sha256 of each), signed with --sign KEY when given (docs/security.md)."""
    try:
        path = _pack.pack(_pack.bundle_dir(bundle, folder_ok=True), out, sign)
    except FlyshipError as e:
        raise click.ClickException(str(e)) from None
    except OSError as e:  # the output: a missing folder, no permission, a full disk
        raise click.ClickException(f"flyship pack -o {out}: expected a file it can write, got {type(e).__name__}: "
                                   f"{e.strerror or e}; pass -o a path in a writable folder") from None
    click.echo(f"packed {bundle} into {path} ({path.stat().st_size} bytes)")


@main.command("check")
@click.argument("file", type=click.Path(exists=True, path_type=Path))  # a missing file: a usage error, exit 2
@click.option("--trusted-key", "keys", multiple=True, metavar="PUB",
              help="a trusted public key (a .pub file from `flyship keygen`, or 64 hex digits), repeatable; default "
                   "FLYSHIP_TRUSTED_KEYS; with none, a signature is not required (a present one is still verified)")
@click.option("--device", "devices", multiple=True, metavar="TARGET",
              help="device target ID for the op table, repeatable (default: the bundle's targets)")
def check_cmd(file: Path, keys: tuple[str, ...], devices: tuple[str, ...]) -> None:
    """Check the packed bundle FILE before deploying it: signature, every member's sha256, manifest, code objects,
    targets, and which ops launch kernels on which device. Exit codes: 0 sound, 1 invalid, 3 unsigned (while keys
    are trusted), 4 damaged or altered, 5 signed by a key that is not trusted."""
    from flyship.loader.tools import check as _check

    try:
        report = _check.check(file, list(keys) if keys else None, devices)
    except FlyshipError as e:  # one line, and the exit code of its kind (unsigned 3, altered 4, untrusted key 5)
        click.echo(f"Error: {e}", err=True)
        raise SystemExit(_check.exit_code(e)) from None
    click.echo(report.text())


@main.command("keygen")
@click.argument("key", type=click.Path(dir_okay=False, path_type=Path))
def keygen_cmd(key: Path) -> None:
    """Write a new Ed25519 signing key to KEY (mode 0600) and its public key to KEY.pub, for `flyship pack --sign`
    and `FLYSHIP_TRUSTED_KEYS`."""
    from flyship.bundle import signing

    try:
        private, public = signing.generate_key(key)
    except FlyshipError as e:
        raise click.ClickException(str(e)) from None
    except OSError as e:  # a folder that does not exist, no permission: say which and what to do, not the errno
        raise click.ClickException(f"flyship keygen: expected to write {key} and {key}.pub, got "
                                   f"{e.strerror or e}; create the folder {key.parent} first (mode 700)") from None
    click.echo(f"private key: {private} (keep it secret)\npublic key:  {public} (give it to those who load your packs)")


@main.command("tune")
@click.argument("bundle", type=click.Path(file_okay=False, path_type=Path))
@click.option("--shapes", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="JSON: {op: [{tensor: [dims], ...}, ...]}, the calls to tune for (docs/tuning.md)")
@click.option("-o", "--out", default=None, type=click.Path(dir_okay=False, path_type=Path),
              help="tuning table to write (default BUNDLE/tuning.json; merged with an existing one)")
@click.option("--device", default=0, show_default=True, help="GPU index")
@click.option("--warmup", default=5, show_default=True, help="untimed calls per candidate")
@click.option("--repeats", default=20, show_default=True, help="timed calls per candidate (the median is kept)")
@click.option("--no-merge", is_flag=True, help="replace an existing table instead of merging into it")
@click.option("--no-original", is_flag=True, help="race only the bundle's configs, not the op's reference")
@click.option("--dry-run", is_flag=True, help="check the bundle, the shapes file and an existing table, print the "
              "plan; no GPU, no extension build")
def tune_cmd(bundle: Path, shapes: Path, out: Path | None, device: int, warmup: int, repeats: int,
             no_merge: bool, no_original: bool, dry_run: bool) -> None:
    """Race every candidate config of BUNDLE's tuned ops for each call in --shapes on a GPU (needs torch and
    a GPU; no DSL, no compiler) and write the winners as a tuning table for flyship.load(..., tuning=)."""
    from flyship.loader.tools.tune import tune

    try:
        if dry_run:
            from flyship.loader.tools.tune_shapes import dry_run as _dry_run

            table = out if out else Path(bundle) / "tuning.json"
            click.echo("\n".join(_dry_run(bundle, shapes, None if no_merge else table)))
            return
        path = tune(bundle, shapes, out, device=device, warmup=warmup, repeats=repeats, merge=not no_merge,
                    original=not no_original)
    except FlyshipError as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"flyship tune: wrote {path}")


if __name__ == "__main__":
    main()
