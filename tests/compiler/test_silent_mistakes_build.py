"""Spec mistakes that used to pass silently (issue 23, item 7), caught at build time on a real Triton kernel: (b) a
stride declared as a ``Value`` that the kernel never reads (the declared stride lifts the loader's row-major check,
so ``W[::2]`` reached the kernel), and an output the kernel never stores through."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from ..conftest import run_build

pytestmark = pytest.mark.compile

KERNELS = '''
import triton
import triton.language as tl


@triton.jit
def scale_rows(x, w, out, x_stride, w_stride, n, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < n
    v = tl.load(x + row * x_stride + cols, mask=m) * tl.load(w + row * WSTRIDE + cols, mask=m)
    tl.store(out + row * n + cols, v, mask=m)
'''

SPEC = """
    import sys
    sys.path.insert(0, {folder!r})
    from flyship.compiler.spec import Constexpr, Output, Spec, Tensor, Value, namespace, op
    from kern import scale_rows
    namespace("t")
    op("scale_rows", kernel=scale_rows,
       args=[Tensor("x", rank=2), Tensor("w", rank=2), Output("out", like="x"), Value("x_stride", "x.stride[0]"),
             Value("w_stride", "w.stride[0]"), Value("n", "x.shape[1]"), Constexpr("BLOCK")],
       grid=("x.shape[0]",),
       specs=[Spec("f32", dtypes={{"x": "float32", "w": "float32"}}, shapes={{"x": (4, 100), "w": (4, 100)}},
                   constexprs={{"BLOCK": 128}}, constraints=("x.shape[1] <= 128", "w.shape[1] == x.shape[1]",
                   "w.shape[0] == x.shape[0]"))])
"""


def _build(tmp_path: Path, w_stride: str, value: str = "w.stride[0]"):
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "kern.py").write_text(KERNELS.replace("WSTRIDE", w_stride))
    spec = tmp_path / "spec.py"
    spec.write_text(textwrap.dedent(SPEC.format(folder=str(tmp_path))).replace('"w.stride[0]"', repr(value)))
    return run_build(spec, tmp_path / "o", ["sm_90"], check=False)


def test_a_declared_stride_the_triton_kernel_never_reads_is_refused_naming_it_and_the_fix(tmp_path):
    r = _build(tmp_path, "n")  # the kernel indexes w as if row-major: w_stride is passed but never read
    assert r.returncode == 1, r.stdout + r.stderr
    assert "expected the kernel to read parameter 4 (w_stride), declared as the stride w.stride[0]" in r.stderr
    assert "w[::2] would reach the kernel" in r.stderr and "make the kernel index w with that stride" in r.stderr
    # The constant it suggests is the example's own stride (100), which keeps Triton's JIT specialization; round 2
    # suggested "0", divisible by 16 where the JIT saw 100 (test_the_suggested_constant_keeps_...).
    assert "the example call's own stride as a constant instead of the Value (Value('w_stride', \"100\"))" in r.stderr
    assert "so the binary stays the JIT's" in r.stderr
    assert not (tmp_path / "o").exists()
    ok = _build(tmp_path, "w_stride")  # the same kernel reading its stride builds
    assert ok.returncode == 0, ok.stdout + ok.stderr
    # The second fix the message names: a constant in place of the stride, and the loader keeps w row-major.
    fixed = _build(tmp_path / "fixed", "n", value="100")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    from flyship.bundle import manifest as M
    from flyship.loader.plan import implied_layout_constraints

    spec = M.read(tmp_path / "fixed" / "o").op("scale_rows").specializations[0]
    guards = implied_layout_constraints(M.read(tmp_path / "fixed" / "o").op("scale_rows"), spec.variants)
    assert guards["w"] == ["w.shape[0] <= 1 or w.stride[0] == w.shape[1]", "w.shape[1] <= 1 or w.stride[1] == 1"]


def test_the_suggested_constant_keeps_the_jit_specialization_of_the_stride_and_zero_would_not(tmp_path):
    # What triton.compile gets (signature, constants, attributes) for the JIT-like variant: the example's own stride
    # as a constant is the declared stride's plan exactly; "0" (round 2's advice) adds tt.divisibility=16.
    from flyship.compiler.frontends.triton import planning as tp
    from flyship.compiler.worker import load_spec_file

    def jit_plan(value: str):
        folder = tmp_path / value.replace(".", "_").replace("[", "_").replace("]", "_")
        folder.mkdir()
        (folder / "kern.py").write_text(KERNELS.replace("WSTRIDE", "w_stride"))
        spec = folder / "spec.py"
        spec.write_text(textwrap.dedent(SPEC.format(folder=str(folder))).replace('"w.stride[0]"', repr(value)))
        op = load_spec_file(str(spec)).ops[0]
        jit = next(s for s in op.specs if s.options.get("specialize") == "jit")
        p = tp.plan(op, jit, "sm_90")
        return p.signature, p.constexprs, p.attrs

    declared = jit_plan("w.stride[0]")
    assert jit_plan("100") == declared
    assert jit_plan("0") != declared


def test_an_output_the_kernel_never_stores_through_is_refused_naming_it_and_zero_true(tmp_path):
    # The kernel stores into x (declared mutable) instead of out: out would come back as the allocator left it.
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "kern.py").write_text(KERNELS.replace("WSTRIDE", "w_stride").replace("tl.store(out + ", "tl.store(x + "))
    spec = tmp_path / "spec.py"
    spec.write_text(textwrap.dedent(SPEC.format(folder=str(tmp_path))).replace('Tensor("x", rank=2)',
                                                                              'Tensor("x", rank=2, mutable=True)'))
    r = run_build(spec, tmp_path / "o", ["sm_90"], check=False)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "expected the kernel to store through output 'out'" in r.stderr
    assert "Output('out', ..., zero=True)" in r.stderr and not (tmp_path / "o").exists()
    zeroed = tmp_path / "zeroed.py"
    zeroed.write_text(spec.read_text().replace('Output("out", like="x")', 'Output("out", like="x", zero=True)'))
    ok = run_build(zeroed, tmp_path / "o2", ["sm_90"], check=False)
    assert ok.returncode == 0, ok.stdout + ok.stderr
