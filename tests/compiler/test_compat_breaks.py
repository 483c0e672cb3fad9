"""The three breaks a spec that built in round 3 met in round 4's trial (issue 34, item 1), each fixed so the spec
builds unchanged: (1) a ``Launch`` passing a ``Constexpr`` to a runtime parameter (accepted, as for a single-launch
op; the reverse mismatch is refused before any worker compiles); (2) a plain spec whose default JIT-like variant
duplicates a hand-hinted spec listed first (built as declared only, and flyc-build's note says why and names the
switch); (3) the unread-stride check judged per op (a launch that skips a tensor is excused when another launch
reads its stride, or when it never reads the tensor)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from flyship.bundle import manifest as M

from ..conftest import run_build

pytestmark = pytest.mark.compile
triton = pytest.importorskip("triton", reason="needs triton 3.6 (the FlyDSL venv); it would compile Triton kernels")

from flyship.compiler.frontends import get as _frontend  # noqa: E402
from flyship.compiler.frontends.base import FrontendError  # noqa: E402
from flyship.compiler.spec import (Constexpr, Launch, Output, Spec, Tensor, Value, namespace, op,  # noqa: E402
                                   run_spec_file)

KERNELS = '''
import triton
import triton.language as tl


@triton.jit
def rows(x, w, out, x_stride, w_stride, n, MODE: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < n
    if MODE == 0:  # out = x * w, each read with its row stride
        v = tl.load(x + row * x_stride + cols, mask=m) * tl.load(w + row * w_stride + cols, mask=m)
        tl.store(out + row * n + cols, v, mask=m)
    else:  # out += 1: neither x nor w nor their strides are read
        v = tl.load(out + row * n + cols, mask=m)
        tl.store(out + row * n + cols, v + 1.0, mask=m)
'''

SPEC = """
    import sys
    sys.path.insert(0, {folder!r})
    from flyship.compiler.spec import Constexpr, Launch, Output, Spec, Tensor, Value, namespace, op
    from kern import rows
    namespace("t")
    op("mul_inc",
       kernel=[Launch(rows, args=["x", "w", "out", "x_stride", "w_stride", "n", "MUL", "BLOCK"], grid=("x.shape[0]",)),
               Launch(rows, args=["x", "w", "out", "x_stride", {second_w_stride!r}, "n", "INC", "BLOCK"],
                      grid=("x.shape[0]",))],
       args=[Tensor("x", rank=2), Tensor("w", rank=2), Output("out", like="x"), Value("x_stride", "x.stride[0]"),
             Value("w_stride", "w.stride[0]"), Value("n", "x.shape[1]"), Constexpr("MUL"), Constexpr("INC"),
             Constexpr("ZERO"), Constexpr("BLOCK")],
       specs=[Spec("f32", dtypes={{"x": "float32", "w": "float32"}}, shapes={{"x": (4, 100), "w": (4, 100)}},
                   constexprs={{"MUL": 0, "INC": 1, "ZERO": 0, "BLOCK": 128}},
                   constraints=("x.shape[1] <= 128", "w.shape[1] == x.shape[1]", "w.shape[0] == x.shape[0]"),
                   options={{"specialize": "declared"}})])
"""


def _kernel(folder: Path):
    import importlib.util

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kern.py").write_text(KERNELS)
    sp = importlib.util.spec_from_file_location(f"kern_{abs(hash(str(folder)))}", folder / "kern.py")
    mod = importlib.util.module_from_spec(sp)
    sp.loader.exec_module(mod)
    return mod.rows


def test_a_kernel_launched_twice_builds_when_one_launch_skips_a_stride_or_takes_a_constexpr_for_it(tmp_path):
    # Launch 2 (MODE=1) never reads x, w or their strides: launch 1 reads them, so the op reads them (break 3).
    # Launch 2 also passes Constexpr ZERO to the runtime parameter w_stride, compiled in as a constant as a
    # single-launch op's would be (break 1).
    _kernel(tmp_path)
    spec = tmp_path / "spec.py"
    spec.write_text(textwrap.dedent(SPEC.format(folder=str(tmp_path), second_w_stride="ZERO")))
    r = run_build(spec, tmp_path / "o", ["sm_90"], check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    (v,) = M.read(tmp_path / "o").op("mul_inc").specializations[0].variants
    first, second = v.launches
    assert ("w", "stride", 0) in {(f.arg, f.kind, f.dim) for f in first.kernargs.fields}
    assert "w" not in {f.arg for f in second.kernargs.fields if f.kind == "stride"}  # ZERO is compiled in
    assert second.kernargs.size < first.kernargs.size


def test_a_launch_that_reads_a_tensor_but_not_its_declared_stride_is_still_refused(tmp_path):
    # The same op, with launch 1 indexing w as if row-major: no launch reads w_stride, so the refusal stands.
    folder = tmp_path / "k"
    folder.mkdir()
    (folder / "kern.py").write_text(KERNELS.replace("w + row * w_stride", "w + row * n"))
    spec = tmp_path / "spec.py"
    spec.write_text(textwrap.dedent(SPEC.format(folder=str(folder), second_w_stride="w_stride")))
    r = run_build(spec, tmp_path / "o", ["sm_90"], check=False)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "spec f32 target sm_90: expected the kernel to read parameter 4 (w_stride)" in r.stderr, r.stderr


def test_a_launch_passing_a_runtime_value_to_a_tl_constexpr_is_refused_before_compiling(tmp_path):
    rows = _kernel(tmp_path)

    def run() -> None:
        namespace("t")
        op("bad", kernel=[Launch(rows, args=["x", "w", "out", "x_stride", "w_stride", "n", "n", "BLOCK"],
                                 grid=("x.shape[0]",))],
           args=[Tensor("x", rank=2), Tensor("w", rank=2), Output("out", like="x"), Value("x_stride", "x.stride[0]"),
                 Value("w_stride", "w.stride[0]"), Value("n", "x.shape[1]"), Constexpr("BLOCK")],
           specs=[Spec("f32", dtypes={"x": "float32", "w": "float32"}, shapes={"x": (4, 100), "w": (4, 100)},
                       constexprs={"BLOCK": 128})])

    decl = run_spec_file("<test>", run).ops[0]
    with pytest.raises(FrontendError, match="op bad launch 1: the Launch passes runtime 'n' to the kernel's parameter "
                                            "'MODE', which is a tl.constexpr; expected a Constexpr there"):
        _frontend("triton").check_declaration(decl)


def _scale_ops(tmp_path: Path, specs: list[Spec]):
    rows = _kernel(tmp_path)

    def run() -> None:
        namespace("t")
        op("mul", kernel=rows, grid=("x.shape[0]",),
           args=[Tensor("x", rank=2), Tensor("w", rank=2), Output("out", like="x"), Value("x_stride", "x.stride[0]"),
                 Value("w_stride", "w.stride[0]"), Value("n", "x.shape[1]"), Constexpr("MODE"), Constexpr("BLOCK")],
           specs=specs)

    return run_spec_file("<test>", run).ops[0]


def _spec(name: str, **kw) -> Spec:
    return Spec(name, dtypes={"x": "float32", "w": "float32"}, shapes={"x": (4, 100), "w": (4, 100)},
                constexprs={"MODE": 0, "BLOCK": 128}, **kw)


def test_a_plain_spec_whose_jit_variant_duplicates_a_hand_hinted_one_is_built_as_declared_with_a_note(tmp_path):
    decl = _scale_ops(tmp_path, [_spec("f32_a16", options={"divisible_by_16": ["x", "w", "out"]}), _spec("f32")])
    # Round 3 built [f32_a16, f32 (JIT), f32__generic] and refused f32 as unreachable behind f32_a16.
    assert [(s.name, s.options.get("specialize")) for s in decl.specs] == [("f32_a16", "declared"),
                                                                           ("f32", "declared")]
    note = _frontend("triton").build_note(decl, decl.specs[1], "sm_90")
    assert ("built as declared only: the JIT-like variant flyship builds by default for a spec without "
            "options['specialize'] (since round 2) would take only calls 'f32_a16', listed first, already "
            "takes") in note
    assert "set options={'specialize': 'declared'} on 'f32'" in note
    assert "built as declared only" not in _frontend("triton").build_note(decl, decl.specs[0], "sm_90")


def test_a_plain_spec_that_a_hand_hinted_one_does_not_cover_keeps_its_jit_variant(tmp_path):
    # A different constraint set: the hinted spec takes only short inputs, so the plain spec's JIT variant can run.
    decl = _scale_ops(tmp_path, [_spec("f32_a16", options={"divisible_by_16": ["x", "w", "out"]},
                                       constraints=("x.shape[0] <= 64",)), _spec("f32")])
    assert [s.name for s in decl.specs] == ["f32_a16", "f32", "f32__generic"]
    assert not _frontend("triton").build_note(decl, decl.specs[1], "sm_90").count("built as declared only")


def test_an_unreachable_default_jit_variant_the_expansion_missed_is_named_as_such_with_the_switch():
    # A case _duplicated_by leaves to the build's check (say, per_target forms): its refusal names the default.
    from types import SimpleNamespace

    from flyship.compiler.pipeline.checking import check_reachable
    from flyship.errors import CompileError

    def spec(name, alignment):
        return SimpleNamespace(name=name, guard=SimpleNamespace(dtypes={"x": "float32"}, constraints=(),
                                                                alignment=alignment),
                               variants=(SimpleNamespace(target="sm_90"),))

    specs = [spec("f32_a16", {"x": 16}), spec("f32", {"x": 16}), spec("f32__generic", {})]
    with pytest.raises(CompileError, match=r"'f32' is the JIT-like variant flyship builds by default for a Triton "
                                           r"spec without options\['specialize'\] \(since round 2, beside "
                                           r"'f32__generic'\): set options=\{'specialize': 'declared'\} on spec 'f32'"):
        check_reachable("mul", specs)


def test_a_launch_may_pass_a_none_constexpr_to_a_runtime_pointer_parameter(tmp_path):
    # Issue 34 item 2: "a multi-launch op cannot pass a constexpr such as None to a runtime parameter" (an optional
    # bias pointer): launch 2 never reads w, so it gets None, compiled in, as a single-launch op's kernel would.
    _kernel(tmp_path)
    spec = tmp_path / "spec.py"
    spec.write_text(textwrap.dedent(SPEC.format(folder=str(tmp_path), second_w_stride="w_stride"))
                    .replace('["x", "w", "out", "x_stride", \'w_stride\', "n", "INC", "BLOCK"]',
                             '["x", "NONE", "out", "x_stride", \'w_stride\', "n", "INC", "BLOCK"]')
                    .replace('Constexpr("ZERO"), ', 'Constexpr("ZERO"), Constexpr("NONE"), ')
                    .replace('"ZERO": 0, ', '"ZERO": 0, "NONE": None, '))
    assert '"NONE", "out"' in spec.read_text()
    r = run_build(spec, tmp_path / "o", ["sm_90"], check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    (v,) = M.read(tmp_path / "o").op("mul_inc").specializations[0].variants
    assert "w" in {f.arg for f in v.launches[0].kernargs.fields} and "w" not in {
        f.arg for f in v.launches[1].kernargs.fields if f.kind == "pointer"}
