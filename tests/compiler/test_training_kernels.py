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
