"""The FlyDSL version adapters: each release maps to the adapter of its range, an unsupported one is refused
naming the supported range (before anything imports FlyDSL), and each range states its measured facts."""

from __future__ import annotations

import pytest

from flyship.compiler.frontends.flydsl import versions as V

pytestmark = pytest.mark.cpu

# Every release PyPI serves (pip index versions flydsl, 2026-12-01) and the range it falls in.
RELEASES = {
    "0.1.5": "Flydsl01", "0.1.6": "Flydsl01", "0.1.7": "Flydsl01", "0.1.8": "Flydsl01",
    "0.2.0": "Flydsl02", "0.2.1": "Flydsl02", "0.2.2": "Flydsl02", "0.2.3": "Flydsl02", "0.2.4": "Flydsl02",
    "0.3.0": "Flydsl02", "0.3.1": "Flydsl031", "0.3.2": "Flydsl031", "0.3.4": "Flydsl031",
    "0.3.4.1": "Flydsl031", "0.4.0": "Flydsl04", "0.4.1": "Flydsl04", "0.4.2": "Flydsl04", "0.5.0": "Flydsl04",
}


@pytest.mark.parametrize("release", sorted(RELEASES))
def test_every_pypi_release_gets_the_adapter_of_its_range(release):
    a = V.adapter_for(release)
    assert type(a).__name__ == RELEASES[release]
    assert a.version == release


def test_the_ranges_follow_the_measured_differences():
    old, mid, late, new = (V.adapter_for(v) for v in ("0.1.5", "0.2.4", "0.3.4.1", "0.5.0"))
    assert (old.tensor_abi, mid.tensor_abi, late.tensor_abi, new.tensor_abi) == ("static", "dynamic", "dynamic",
                                                                                  "dynamic")
    assert old.triple == mid.triple == V.adapter_for("0.3.0").triple == "amdgcn-amd-amdhsa-"
    assert V.adapter_for("0.3.1").triple == late.triple == new.triple == "amdgcn-amd-amdhsa-unknown"
    assert V.adapter_for("0.3.2").isa_dump_name() == "21_final_isa.s"
    assert V.adapter_for("0.3.4").isa_dump_name() == "22_final_isa.s"
    assert not V.adapter_for("0.1.7").has_rmem_tensor and V.adapter_for("0.1.8").has_rmem_tensor
    assert not old.has_unpack and mid.has_unpack
    assert old.environment()["COMPILE_ONLY"] == "1" and new.environment()["COMPILE_ONLY"] is None
    assert not late.compile_returns_function and new.compile_returns_function


@pytest.mark.parametrize("release", ["0.1.4", "0.1.4.2", "0.0.9", "0.6.0", "1.0.0"])
def test_an_unsupported_release_is_refused_naming_the_supported_range(release):
    with pytest.raises(V.FlydslVersionError, match=rf"expected 0\.1\.5 to 0\.5\.0, got {release}"):
        V.adapter_for(release)


def test_development_and_local_builds_count_as_their_release():
    assert V.parse_version("0.3.1.dev804") == (0, 3, 1)
    assert V.parse_version("0.5.0+rocm7") == (0, 5, 0)
    assert type(V.adapter_for("0.5.0rc1")).__name__ == "Flydsl04"
    with pytest.raises(V.FlydslVersionError, match="expected a dotted version"):
        V.parse_version("unknown")


def test_an_isa_from_another_range_is_caught_by_its_triple():
    isa = '\t.amdgcn_target "amdgcn-amd-amdhsa--gfx942"\n'
    V.adapter_for("0.2.4").check_isa_target(isa, "op add")
    with pytest.raises(V.FlydslVersionError, match=r"expected .amdgcn_target triple 'amdgcn-amd-amdhsa-unknown'"):
        V.adapter_for("0.5.0").check_isa_target(isa, "op add")


def test_the_compile_environment_unsets_compile_only_for_releases_that_compile_with_placeholders(monkeypatch):
    env = {"COMPILE_ONLY": "1"}
    monkeypatch.setattr(V, "installed_version_without_import", lambda: "0.5.0")
    V.apply_compile_environment(env)
    assert "COMPILE_ONLY" not in env and "FLYDSL_DUMP_IR" not in env
    monkeypatch.setattr(V, "installed_version_without_import", lambda: "0.1.5")
    V.apply_compile_environment(env)
    assert env["COMPILE_ONLY"] == "1"


def test_flyc_build_refuses_an_unsupported_flydsl_before_importing_it(monkeypatch, tmp_path):
    from flyship.compiler.pipeline import BuildOptions, build
    from flyship.errors import FlyshipError

    monkeypatch.setattr(V, "installed_version_without_import", lambda: "0.1.4")
    spec = tmp_path / "ops.py"
    spec.write_text("raise SystemExit('the spec file must not be imported')\n")
    with pytest.raises(FlyshipError, match=r"FlyDSL version: expected 0\.1\.5 to 0\.5\.0, got 0\.1\.4"):
        build(BuildOptions(spec_path=str(spec), out_dir=str(tmp_path / "out"), archs=("gfx942",)))
