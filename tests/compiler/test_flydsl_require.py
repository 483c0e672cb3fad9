"""A spec or kernel module that needs a newer FlyDSL says which (issue 23, item 6): ``versions.require`` refuses an
older one before anything is traced, naming both versions and why, instead of the AttributeError an old FlyDSL
raises on the missing API (``flydsl.expr has no attribute struct`` under 0.1.5)."""

from __future__ import annotations

import textwrap

import pytest

from flyship.compiler.frontends.flydsl import versions

from ..conftest import run_build


def test_require_passes_the_installed_version_and_refuses_a_newer_minimum_naming_both(monkeypatch):
    monkeypatch.setattr(versions, "installed_version_without_import", lambda: "0.1.5")
    assert versions.require("0.1.5") == "0.1.5"
    with pytest.raises(versions.FlydslVersionError, match=r"expected 0\.5\.0 or newer for @fx\.struct, got 0\.1\.5; "
                                                          r"this module declares that minimum"):
        versions.require("0.5.0", why="@fx.struct")


@pytest.mark.compile
def test_a_spec_declaring_a_newer_flydsl_is_refused_before_its_kernels_are_imported(tmp_path):
    (tmp_path / "kern.py").write_text("raise AssertionError('imported although FlyDSL is too old')\n")
    spec = tmp_path / "spec.py"
    spec.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        from flyship.compiler.frontends.flydsl.versions import require
        require("99.0", why="fx.future_api")
        import kern
    """))
    r = run_build(spec, tmp_path / "o", ["gfx942"], check=False)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FlyDSL version: expected 99.0 or newer for fx.future_api, got " in r.stderr
    assert "imported although" not in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "o").exists()
