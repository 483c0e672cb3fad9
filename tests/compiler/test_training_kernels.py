"""The training kernels' math on the CPU: each kernel of examples/triton/tl_training.py, run by Triton's interpreter,
equals the bundle's reference (the GPU run of the built cubins is tests/gpu/test_training.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ..conftest import ROOT

pytestmark = pytest.mark.compile


def test_every_training_kernel_equals_its_reference_under_the_triton_interpreter():
    pytest.importorskip("triton", reason="needs Triton (the build Python); it would run the training kernels' math")
    script = ROOT / "tests" / "compiler" / "data" / "training_interpreter.py"
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, TRITON_INTERPRET="1"), cwd=str(ROOT))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.split() == ["torch.float32", "ok", "torch.bfloat16", "ok"]


def test_a_backward_mistake_is_refused_while_reading_the_declarations_before_any_kernel_compiles(tmp_path):
    # The rule book judges each Backward on the ops' heads when the spec is read: a typo in grads costs seconds, not
    # the build of every kernel first.
    import shutil

    from flyship.compiler.pipeline import planning
    from flyship.errors import CompileError

    src = ROOT / "examples" / "triton"
    for name in ("training.py", "training_references.py", "tl_training.py"):
        shutil.copy(src / name, tmp_path / name)
    spec = tmp_path / "training.py"
    text = spec.read_text()
    assert 'grads={"a": "a", "b": "b"}' in text
    spec.write_text(text.replace('grads={"a": "a", "b": "b"}', 'grads={"a": "a", "b": "bb"}'))
    with pytest.raises(CompileError, match=r"op swiglu_fwd backward swiglu_bwd: grads\['b'\] = 'bb': expected a "
                                           r"buffer swiglu_bwd gives: a \(written in place\), b \(written in place\)"):
        planning.read_declarations(str(spec), planning.check_archs(("sm_90",)))
