"""A FlyDSL native crash (issue 23, item 6): LLVM's fatal errors print ``LLVM ERROR: ...`` to the process's
stderr and abort. The failure flyc-build reports shows that message (the lone rerun's stderr is kept), not only
"a crash in native code"."""

from __future__ import annotations

import textwrap

import pytest

from ..conftest import ROOT, run_build

pytestmark = pytest.mark.compile


def test_a_native_abort_shows_the_llvm_error_it_printed_in_the_build_failure(tmp_path):
    (tmp_path / "crash.py").write_text(textwrap.dedent("""
        import os
        import flydsl.compiler as flyc
        import flydsl.expr as fx

        @flyc.jit
        def crash(x: fx.Tensor, out: fx.Tensor, stream: fx.Stream = fx.Stream(None)):
            # What LLVM's report_fatal_error does: its message straight to file descriptor 2, then abort.
            os.write(2, b"LLVM ERROR: Cannot select: intrinsic %llvm.amdgcn.made.up\\n")
            os.abort()
    """))
    spec = tmp_path / "spec.py"
    spec.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        from flyship.compiler.spec import Output, Spec, Tensor, namespace, op
        from crash import crash
        namespace("t")
        op("crash", kernel=crash, args=[Tensor("x", rank=1), Output("out", like="x")],
           specs=[Spec("f32", dtypes={{"x": "float32"}}, shapes={{"x": (64,)}})])
    """))
    r = run_build(spec, tmp_path / "o", ["gfx942"], "-j", "1", check=False)
    assert r.returncode == 1, r.stdout + r.stderr
    failure = r.stderr.split("crash.f32 on gfx942: the worker process died while compiling this kernel", 1)[1]
    assert "it printed:" in failure
    assert "LLVM ERROR: Cannot select: intrinsic %llvm.amdgcn.made.up" in failure
    assert not (tmp_path / "o").exists()


def test_an_abort_inside_flydsls_binary_step_shows_the_llvm_error_although_that_step_had_moved_stderr(tmp_path):
    # FlyDSL's binary step runs with file descriptor 2 sent to a file (its ISA is read from stderr:
    # flydsl/capture.py). LLVM's fatal errors happen there ("LLVM ERROR: Do not know how to expand this operator's
    # operand!" from an upstream kernel); this spec makes that step print such a line and abort, as LLVM does, at
    # the point the real one would, for a real launcher (examples/flydsl/scale.py).
    spec = tmp_path / "spec.py"
    spec.write_text(textwrap.dedent(f"""
        import inspect, os, sys
        sys.path.insert(0, {str(ROOT / "examples" / "flydsl")!r})
        from flyship.compiler.frontends.flydsl import capture
        from flyship.compiler.spec import Constexpr, Output, Scalar, Spec, Tensor, namespace, op
        from scale import scale

        _run = capture._ObservedPassManager._run

        def _run_or_abort(self, *a, **k):
            if inspect.stack()[1].function == "_run_printing_isa":  # inside the binary step, fd 2 moved
                os.write(2, b"LLVM ERROR: Do not know how to expand this operator's operand!\\n")
                os.abort()
            return _run(self, *a, **k)

        capture._ObservedPassManager._run = _run_or_abort
        namespace("t")
        op("scale", kernel=scale, args=[Tensor("x", rank=2), Output("out", like="x"), Scalar("alpha", "float"),
                                        Constexpr("TILE_N")],
           specs=[Spec("f32", dtypes={{"x": "float32"}}, shapes={{"x": (4, 256)}}, scalars={{"alpha": 2.0}},
                       constexprs={{"TILE_N": 256}})])
    """))
    r = run_build(spec, tmp_path / "o", ["gfx942"], "-j", "1", check=False)
    assert r.returncode == 1, r.stdout + r.stderr
    failure = r.stderr.split("scale.f32 on gfx942: the worker process died while compiling this kernel", 1)[1]
    assert "killed by SIGABRT" in failure and "it printed:" in failure, failure
    assert "LLVM ERROR: Do not know how to expand this operator's operand!" in failure, failure
    assert not list(tmp_path.glob("**/*.stderr.step"))

