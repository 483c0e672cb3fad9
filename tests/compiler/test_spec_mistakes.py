"""Spec mistakes flyc-build reports when it reads the spec file, before anything compiles: each one a user made
(a typo in a processor name, ...), run through the CLI as the user would."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from flyship.bundle.errors import BundleError
from flyship.bundle.targets import check_known, limits
from flyship.compiler.spec import Spec
from flyship.errors import SpecError

from ..conftest import ROOT, run_build

pytestmark = pytest.mark.compile


def _spec_file(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "spec.py"
    p.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT / 'examples' / 'flydsl')!r})
        from flyship.compiler.spec import Output, Scalar, Spec, Tensor, namespace, op
        from elementwise import add
        namespace("t")
    """) + textwrap.dedent(body))
    return p


def _add(spec_kwargs: str) -> str:
    return f"""
        op("add", kernel=add, args=[Tensor("x", rank=2), Tensor("y", rank=2), Output("out", like="x")],
           specs=[Spec("f32", dtypes={{"x": "float32", "y": "float32"}}, shapes={{"x": (64, 70), "y": (64, 70)}},
                       {spec_kwargs})])
    """


# -- 1. processor names ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, near", [("gfx0942", "gfx942"), ("gfx95", "gfx950"), ("sm_900", "sm_90"),
                                        ("gfx942x:xnack-", None)])
def test_an_unknown_processor_is_refused_naming_the_nearest_known_one(text, near):
    with pytest.raises(BundleError) as e:
        check_known(text)
    if near:
        assert f"did you mean {near!r}?" in str(e.value) and "known: " in str(e.value)
    assert check_known("gfx942:sramecc+:xnack-").processor == "gfx942" and check_known("sm_90a").sm == 90
    with pytest.raises(BundleError, match="did you mean 'gfx942'"):  # limits() reads the same table
        limits("gfx0942")


def test_a_spec_limited_to_or_varying_for_a_mistyped_processor_is_refused_when_declared():
    with pytest.raises(SpecError, match=r"Spec 'f32': targets: target gfx0942: expected a known AMD processor, got "
                                        r"'gfx0942'; did you mean 'gfx942'\?"):
        Spec("f32", dtypes={"x": "float32"}, shapes={"x": (8,)}, targets=("gfx0942",))
    with pytest.raises(SpecError, match=r"per_target\['gfx0942'\]: .*did you mean 'gfx942'\?"):
        Spec("f32", dtypes={"x": "float32"}, shapes={"x": (8,)}, per_target={"gfx0942": dict(shapes={"x": (16,)})})


def test_a_typo_in_targets_fails_the_build_instead_of_writing_an_empty_op(tmp_path):
    r = run_build(_spec_file(tmp_path, _add('targets=("gfx0942",)')), tmp_path / "o", ["gfx942"], check=False)
    assert r.returncode == 1 and "did you mean 'gfx942'?" in r.stderr
    assert not (tmp_path / "o").exists()


def test_an_op_with_no_specialization_for_any_requested_arch_is_an_error_naming_its_targets(tmp_path):
    r = run_build(_spec_file(tmp_path, _add('targets=("gfx950",)')), tmp_path / "o", ["gfx942"], check=False)
    assert r.returncode == 1
    assert "op add: expected a specialization for some --arch (gfx942), got none" in r.stderr
    assert "(add.f32: gfx950)" in r.stderr
    assert not (tmp_path / "o").exists()
