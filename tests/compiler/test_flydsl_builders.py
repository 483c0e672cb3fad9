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
