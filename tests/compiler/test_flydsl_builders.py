"""FlyDSL builders that return a plain Python function around an inner ``@flyc.jit`` launcher (issue 23, item 6:
the shape of upstream FlyDSL's RoPE + KV cache and flash attention builders), named in a spec as the user calls
them: accepted as an entry, building the same code object as ``entry(...)``; a plain function that reaches no
launcher is refused naming the op and ``entry()``."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from ..conftest import ROOT, run_build

pytestmark = pytest.mark.compile

SPEC = """
    import sys
    sys.path.insert(0, {folder!r})
    from flyship.compiler.spec import Output, Scalar, Spec, Tensor, entry, namespace, op
    from builder import build_closure_divide
    namespace("t")
    ARGS = [Tensor("x", rank=2), Output("out", like="x"), Scalar("alpha", "float", default=3.0)]
    SPECS = [Spec("f32", dtypes={{"x": "float32"}}, shapes={{"x": (64, 1000)}})]
"""


def _spec(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "spec.py"
    p.write_text(textwrap.dedent(SPEC.format(folder=str(ROOT / "examples" / "flydsl"))) + textwrap.dedent(body))
    return p


def test_a_builders_plain_function_builds_as_the_user_calls_it_with_the_code_object_of_its_entry(tmp_path):
    spec = _spec(tmp_path, """
        op("plain", kernel=build_closure_divide(), args=ARGS, specs=SPECS)
        op("wrapped", kernel=entry(build_closure_divide()), args=ARGS, specs=SPECS)
    """)
    run_build(spec, tmp_path / "o", ["gfx942"])
    ops = {o["name"]: o for o in json.loads((tmp_path / "o" / "manifest.json").read_text())["ops"]}
    plain = ops["plain"]["specializations"][0]["variants"][0]
    assert plain["proof"]["method"] == "flydsl-binary" and plain["proof"]["differences"] == []
    assert ((tmp_path / "o" / "plain.f32.gfx942.hsaco").read_bytes()
            == (tmp_path / "o" / "wrapped.f32.gfx942.hsaco").read_bytes())
    assert plain["kernargs"] == ops["wrapped"]["specializations"][0]["variants"][0]["kernargs"]


def test_a_plain_function_that_reaches_no_launcher_is_refused_naming_the_op_and_entry(tmp_path):
    spec = _spec(tmp_path, """
        def copy_through(x, out, alpha, stream=None):
            return helper(x, out)
        op("copy_through", kernel=copy_through, args=ARGS, specs=SPECS)
    """)
    r = run_build(spec, tmp_path / "o", ["gfx942"], check=False)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "op copy_through: kernel= is the plain Python function 'copy_through', expected a DSL launcher" in r.stderr
    assert "it reaches no launcher" in r.stderr
    assert "declare kernel=entry(copy_through)" in r.stderr
    assert not (tmp_path / "o").exists()


def test_a_builder_that_dispatches_through_star_args_builds_the_launcher_each_spec_picks(tmp_path):
    # build_dispatch_divide returns divide(*args, stream=None): the declared (x, out, alpha) reach it as *args,
    # and each spec's example picks one of its two inner launchers (64-thread blocks for rows of <= 64 columns).
    spec = _spec(tmp_path, """
        from builder import build_dispatch_divide
        op("dispatch", kernel=build_dispatch_divide(), args=ARGS, specs=[
            Spec("narrow", dtypes={"x": "float32"}, shapes={"x": (64, 48)}, constraints=("x.shape[1] <= 64",)),
            Spec("wide", dtypes={"x": "float32"}, shapes={"x": (64, 1000)}, constraints=("x.shape[1] > 64",))])
    """)
    run_build(spec, tmp_path / "o", ["gfx942"])
    (o,) = json.loads((tmp_path / "o" / "manifest.json").read_text())["ops"]
    variants = {s["name"]: s["variants"][0] for s in o["specializations"]}
    assert sorted(variants) == ["narrow", "wide"]
    for v in variants.values():
        assert v["proof"]["method"] == "flydsl-binary" and v["proof"]["differences"] == []
    assert _block(variants["narrow"]) == [64, 1, 1] and _block(variants["wide"]) == [256, 1, 1]
    assert ((tmp_path / "o" / "dispatch.narrow.gfx942.hsaco").read_bytes()
            != (tmp_path / "o" / "dispatch.wide.gfx942.hsaco").read_bytes())


def _block(variant: dict) -> list:
    return variant["launch"]["block"]


def test_an_entry_taking_star_args_must_still_declare_its_named_parameters_first(tmp_path):
    spec = _spec(tmp_path, """
        def f(x, alpha, *rest, stream=None):
            pass
        op("d", kernel=entry(f), args=ARGS, specs=SPECS)
    """)
    r = run_build(spec, tmp_path / "o", ["gfx942"], check=False)
    assert r.returncode == 1, r.stdout + r.stderr
    assert ("op d: expected args= to declare the first 3 parameters of entry 'f' in its order (x, alpha, *rest), "
            "got (x, out, alpha); entry 'f' takes (x, alpha, *rest, stream)") in r.stderr


def test_a_keyword_only_parameter_after_star_args_with_no_default_is_refused(tmp_path):
    spec = _spec(tmp_path, """
        def f(*args, stream):
            pass
        op("d", kernel=entry(f), args=ARGS, specs=SPECS)
    """)
    r = run_build(spec, tmp_path / "o", ["gfx942"], check=False)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "every later parameter needs a default, got stream without one" in r.stderr
