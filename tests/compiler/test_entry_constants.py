"""Issue 34 item 4: constants an entry takes or passes, as upstream FlyDSL's builders do, build as written.

- A literal ``Value`` declared where the entry's positional parameter of its name falls is that parameter (the
  caller passes the constant: upstream's sliding-window attention ``_launch(Q, K, V, O, Q_stride1, ...)``), no
  longer a constant the entry was assumed to pass its launcher itself (which left the parameter without an
  argument); elsewhere it is still such a constant, as before.
- An int the entry passes its launcher that is the default of a keyword the caller did not give (upstream's
  flash attention ``_launch(..., *, block_table_stride=0)`` passes it on as ``block_table_stride``) is that constant, with no ``Value`` to declare; a
  value the entry computes otherwise is still refused, naming the declaration.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from flyship.bundle import manifest as M

from ..conftest import ROOT, run_build

pytestmark = pytest.mark.compile


def _build(tmp_path: Path, body: str, check: bool = True):
    spec = tmp_path / "spec.py"
    spec.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT / 'examples' / 'flydsl')!r})
        from flyship.compiler.spec import Output, Spec, Tensor, Value, entry, namespace, op
        from rows import add_one_rows
        namespace("t")
    """) + textwrap.dedent(body))
    return run_build(spec, tmp_path / "o", ["gfx942"], check=check)


def _m_field(m: M.Manifest, name: str) -> str:
    (v,) = m.op(name).specializations[0].variants
    (field,) = [f for f in v.kernargs.fields if f.kind == "expr"]
    assert v.proof.method == "flydsl-binary" and v.proof.differences == ()
    return field.expr


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> M.Manifest:
    tmp = tmp_path_factory.mktemp("entry_constants")
    _build(tmp, """
        def by_position(x, out, m):
            return add_one_rows(x, out, m, N=1024)

        def by_default(x, out, *, m=7):
            return add_one_rows(x, out, m, N=1024)

        def passes_on(x, out, tile=256, m=7):  # Value("m", "7") third falls on tile: a constant, as before
            return add_one_rows(x, out, m, N=1024)

        SPEC = Spec("r", dtypes={"x": "float32"}, shapes={"x": (64, 1024)}, constraints=("x.shape[1] == 1024",))
        op("positional", kernel=entry(by_position), args=[Tensor("x", rank=2), Output("out", like="x"),
                                                         Value("m", "7")], specs=[SPEC])
        op("defaulted", kernel=entry(by_default), args=[Tensor("x", rank=2), Output("out", like="x")], specs=[SPEC])
        op("passed_on", kernel=entry(passes_on), args=[Tensor("x", rank=2), Output("out", like="x"),
                                                      Value("m", "7")], specs=[SPEC])
    """)
    return M.read(tmp / "o")


def test_a_literal_value_named_after_an_entry_parameter_is_passed_to_the_entry(built):
    assert _m_field(built, "positional") == "7"
    assert [a.name for a in built.op("positional").args] == ["x"]  # a constant: no schema argument


def test_an_int_the_entry_passes_from_a_keyword_default_is_that_constant_with_nothing_declared(built):
    assert _m_field(built, "defaulted") == "7"


def test_a_literal_value_off_its_parameters_position_stays_a_constant_the_entry_passes(built):
    assert _m_field(built, "passed_on") == "7"


def test_an_int_the_entry_computes_is_still_refused_naming_the_value_to_declare(tmp_path):
    # m defaults to None and the entry picks 7 itself: no default says it is a constant
    r = _build(tmp_path, """
        def f(x, out, *, m=None):
            return add_one_rows(x, out, 7 if m is None else m, N=1024)

        op("r", kernel=entry(f), args=[Tensor("x", rank=2), Output("out", like="x")],
           specs=[Spec("r", dtypes={"x": "float32"}, shapes={"x": (64, 1024)}, constraints=("x.shape[1] == 1024",))])
    """, check=False)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "entry 'f' passes launcher parameter 'm' the value 7, which is none of the op's scalar arguments" in r.stderr
    assert "is declared Value('m', '7') in args=" in r.stderr


def test_every_int_an_entry_passes_that_flyship_cannot_bind_is_named_in_one_refusal(tmp_path):
    # upstream's gfx950 flash attention passes six such ints; one per build cost six builds
    r = _build(tmp_path, """
        import flydsl.compiler as flyc
        import flydsl.expr as fx
        from rows import ROWS_MAX, TILE_N, add_one_rows_kernel

        @flyc.jit
        def two_ints(x: fx.Tensor, out: fx.Tensor, m: fx.Int32, k: fx.Int32, N: fx.Constexpr[int],
                     stream: fx.Stream = fx.Stream(None)):
            xs = fx.Tensor(fx.make_view(fx.get_iter(x), fx.make_layout((ROWS_MAX, N), (N, 1))))
            os_ = fx.Tensor(fx.make_view(fx.get_iter(out), fx.make_layout((ROWS_MAX, N), (N, 1))))
            add_one_rows_kernel(xs, os_, m, N).launch(grid=(m * ((N + TILE_N - 1) // TILE_N), 1, 1),
                                                      block=(TILE_N, 1, 1), stream=stream)

        def f(x, out, *, m=None):
            return two_ints(x, out, 7, 9, N=1024)

        op("r", kernel=entry(f), args=[Tensor("x", rank=2), Output("out", like="x")],
           specs=[Spec("r", dtypes={"x": "float32"}, shapes={"x": (64, 1024)}, constraints=("x.shape[1] == 1024",))])
    """, check=False)
    assert r.returncode == 1, r.stdout + r.stderr
    assert ("entry 'f' passes 2 launcher parameters a value flyship cannot bind to a declared argument: m=7, k=9; "
            "each needs its own declaration, as for the first: entry 'f' passes launcher parameter 'm' the value 7"
            ) in r.stderr, r.stderr
