"""Compatibility as a contract (issue 34, item 1): spec files written against earlier documented releases, frozen,
each built by today's flyc-build unchanged, or refused by design with the migration message CHANGELOG.md gives.

The corpus (tests/compat/README.md): ``round2/`` is the examples folder of the end of round 2 (main 22b6ab2:
examples/triton, and the FlyDSL launcher examples/triton/tuned.py imports), ``round3/`` a spec in the shape of
issue 34's trial, written against the round-3 docs. Each builds for one target, without the build cache (about
70 s in all on a 2-core machine: the price of the contract)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from ..conftest import run_build

pytestmark = pytest.mark.compile

HERE = Path(__file__).resolve().parent

# (spec file, the --arch it builds for, None to build or the refusal's text by design (CHANGELOG.md's migration)).
CORPUS = [
    ("round2/triton/ops.py", "sm_90", None),
    ("round2/triton/multilaunch.py", "sm_90", None),
    ("round2/triton/persistent.py", "sm_90", None),
    ("round2/triton/training.py", "sm_90", None),
    ("round2/triton/workspaces.py", "sm_90", None),
    ("round2/triton/tuned.py", "gfx942", None),  # its FlyDSL op builds for AMD targets only
    ("round3/triton/trial.py", "sm_90", None),
]


def test_the_corpus_is_frozen_every_file_as_recorded():
    recorded = dict(reversed(line.split(maxsplit=1)) for line in (HERE / "FROZEN.sha256").read_text().splitlines())
    on_disk = {str(p.relative_to(HERE.parents[1])): p for p in sorted(HERE.glob("round*/**/*.py"))}
    assert sorted(on_disk) == sorted(recorded), "add a new corpus file to FROZEN.sha256 (sha256sum); never edit one"
    for name, p in on_disk.items():
        assert hashlib.sha256(p.read_bytes()).hexdigest() == recorded[name], f"{name} changed: the corpus is frozen"
    assert sorted(str((HERE / f).relative_to(HERE.parents[1])) for f, _, _ in CORPUS) == sorted(
        n for n in recorded if Path(n).name not in {"references.py", "training_references.py"}
        and not Path(n).name.startswith(("tl_", "elementwise")))


@pytest.mark.parametrize("spec, arch, refusal", CORPUS, ids=[c[0] for c in CORPUS])
def test_a_spec_of_an_earlier_release_builds_unchanged_or_is_refused_with_its_migration(tmp_path, spec, arch, refusal):
    r = run_build(HERE / spec, tmp_path / "o", [arch], check=False)
    if refusal is None:
        assert r.returncode == 0, r.stdout + r.stderr
        assert (tmp_path / "o" / "manifest.json").is_file()
    else:
        assert r.returncode == 1 and refusal in r.stderr, r.stdout + r.stderr
