"""Hostile and careless inputs on the output folder of ``flyc-build --force`` (issue 22, "Robustness"): it replaces
only a bundle (one this flyship refuses to read included) or an empty folder, never the user's files."""

from __future__ import annotations

import json

import pytest

from ..conftest import ROOT, run_build

pytestmark = pytest.mark.compile


@pytest.mark.parametrize("kind", ["user files", "a file", "a broken manifest"])
def test_force_never_replaces_a_folder_that_is_not_a_bundle(tmp_path, kind):
    out = tmp_path / "out"
    if kind == "a file":
        out.write_text("precious")
    else:
        out.mkdir()
        (out / "thesis.tex").write_text("precious")
        if kind == "a broken manifest":
            (out / "manifest.json").write_text("{")
    before = sorted((p.name, p.read_bytes()) for p in tmp_path.rglob("*") if p.is_file())
    spec = ROOT / "examples" / "flydsl" / "ops.py"
    r = run_build(spec, out, ["sm_90"], "--force", check=False, env={"TMPDIR": str(tmp_path)})
    if kind == "a file":  # click's own refusal of -o (a usage error)
        assert r.returncode == 2 and "is a file" in r.stderr, r.stderr
    else:
        assert r.returncode == 1 and "--force replaces only a bundle or an empty folder" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert sorted((p.name, p.read_bytes()) for p in tmp_path.rglob("*") if p.is_file()) == before


def test_force_replaces_a_bundle_this_flyship_refuses_to_read(tmp_path):
    # A bundle an older flyc-build wrote (here: a version this flyship refuses) is what a rebuild replaces; the
    # refusal that tells the user to rebuild must not be followed by one that forbids it.
    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.json").write_text(json.dumps({"format": "flyship-bundle", "schema_version": "0.9", "ops": []}))
    (out / "gone.f32.gfx942.hsaco").write_bytes(b"old")
    r = run_build(ROOT / "examples" / "flydsl" / "ops.py", out, ["gfx942"], "--force", check=False,
                  env={"TMPDIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert not (out / "gone.f32.gfx942.hsaco").exists() and json.loads((out / "manifest.json").read_text())["ops"]
