"""The ``flyship`` command: inspect, verify and prepare for bundles on the workload side.

    flyship list BUNDLE        ops, schemas, specializations (guards) and targets; no GPU, no compiler
    flyship verify BUNDLE      run every specialization against its reference; needs a GPU
    flyship prebuild           build and cache the C++ extension (container image build time)

Each command parses its options and calls one plain function; errors print one clear line and exit 1
(2 for a usage error, as click does).
"""

from __future__ import annotations

from pathlib import Path

import click

from flyship.bundle import manifest as _m
from flyship.errors import FlyshipError


def describe(manifest: _m.Manifest) -> str:
    """A readable listing of a manifest: ops, schemas, specializations with guards and targets."""
    from flyship.loader.plan import implied_layout_constraints
    from flyship.loader.schema import schemas

    lines = [f"namespace {manifest.namespace} (schema {manifest.schema_version}, built by flyship "
             f"{manifest.build.flyship_version} under Python {manifest.build.python}; "
             f"frontends {', '.join(f'{k} {v}' for k, v in sorted(manifest.build.frontends.items()))})",
             f"targets: {', '.join(manifest.targets)}"]
    for op in manifest.ops:
        functional, out = schemas(op)
        lines.append("")
        lines.append(f"{manifest.namespace}::{functional}")
        lines.append(f"{manifest.namespace}::{out}")
        lines.append(f"  {op.doc}  [{op.frontend}; reference: {op.reference or 'none'}]")
        for s in op.specializations:
            guard = [f"{k}={v}" for k, v in s.guard.dtypes.items()] + list(s.guard.constraints)
            guard += [f"{k} aligned to {v}" for k, v in s.guard.alignment.items()]
            targets = ", ".join(f"{v.target} ({v.code_object.format})" for v in s.variants)
            implied = [c for cs in implied_layout_constraints(op, s.variants).values() for c in cs]
            lines.append(f"  {s.name}: {'; '.join(guard) or 'any input'}")
            if implied:
                lines.append(f"    layout (implied by the kernargs): {'; '.join(implied)}")
            lines.append(f"    targets: {targets}")
    return "\n".join(lines)


@click.group()
def main() -> None:
    """flyship: run FlyDSL / Triton kernel bundles as torch ops."""


@main.command("list")
@click.argument("bundle", type=click.Path(file_okay=False, path_type=Path))
def list_cmd(bundle: Path) -> None:
    """List the ops, specializations and targets of BUNDLE."""
    try:
        manifest = _m.read(bundle)
        click.echo(describe(manifest))
    except FlyshipError as e:
        raise click.ClickException(str(e)) from None


@main.command("verify")
@click.argument("bundle", type=click.Path(file_okay=False, path_type=Path))
@click.option("--namespace", default=None, help="register under this torch namespace instead of the manifest's")
def verify_cmd(bundle: Path, namespace: str | None) -> None:
    """Run every specialization of BUNDLE against its reference on generated inputs (needs a GPU)."""
    from flyship.loader import core
    from flyship.loader.verify import VerificationError

    try:
        ops = core.load(bundle, namespace=namespace)
        report = ops.verify()
    except FlyshipError as e:
        raise click.ClickException(str(e)) from None
    click.echo(report.table())
    try:
        report.raise_on_failure()
    except VerificationError:
        raise click.ClickException("verification failed (see the table above)") from None


@main.command("prebuild")
@click.option("--flavor", type=click.Choice(["hip", "cuda"]), default=None,
              help="driver shim to build (default: from FLYSHIP_FLAVOR or the torch build)")
def prebuild_cmd(flavor: str | None) -> None:
    """Build and cache the loader's C++ extension, so no compiler is needed at run time."""
    from flyship.loader import build

    try:
        cfg = build.config(flavor)
        path = build.build(cfg)
    except FlyshipError as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"flyship extension ({cfg.flavor}) ready: {path}")


if __name__ == "__main__":
    main()
