"""The race on a real GPU: ``flyship tune`` on the tuned Triton bundle writes a table for this device whose
winners are the fastest measured (the op's PyTorch reference races too, as ``(original)``), and
``load(tuning=)`` runs those winners, correctly: a kernel's key launches it, a key the original wins runs the
reference on purpose (``stats()["original"]``, with the fallback off, no warning).

The bundle comes from ``FLYSHIP_GPU_TUNED_BUNDLE`` (default ``artifacts/tuned``), built without a GPU by
``flyc-build examples/triton/tuned.py -o artifacts/tuned --arch gfx942 --arch gfx950 --arch sm_90``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
import warnings
from pathlib import Path

import pytest

from ..conftest import ROOT

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def tuned_bundle(gpu) -> Path:
    b = Path(os.environ.get("FLYSHIP_GPU_TUNED_BUNDLE") or ROOT / "artifacts" / "tuned")
    if not (b / "manifest.json").is_file():
        pytest.skip(f"no tuned bundle at {b}; build it with flyc-build examples/triton/tuned.py -o {b} ... "
                    "to prove that the race picks the fastest config per regime on this GPU")
    return b


def test_flyship_tune_writes_the_fastest_candidate_per_key_for_this_device(gpu, tuned_bundle, tmp_path):
    import flyship
    from flyship.bundle import tuning as tt

    shapes = {"gemm": [{"a": [8, 1024], "b": [1024, 1024]}, {"a": [2048, 1024], "b": [1024, 1024]}],
              "rmsnorm": [{"x": [4, 4096], "w": [4096]}, {"x": [16384, 4096], "w": [4096]}]}
    (tmp_path / "shapes.json").write_text(json.dumps(shapes))
    subprocess.run([sys.executable, "-m", "flyship.loader.tools.cli", "tune", str(tuned_bundle), "--shapes",
                    str(tmp_path / "shapes.json"), "-o", str(tmp_path / "t.json"), "--repeats", "5"], check=True)
    table = tt.read(tmp_path / "t.json")
    ops = flyship.load(tuned_bundle, namespace=f"tr_{uuid.uuid4().hex[:6]}", tuning=tmp_path / "t.json")
    target = ops.device_target(0)
    assert len(table.entries) == 4
    for e in table.entries:
        assert e.target == target and e.cus == gpu.cuda.get_device_properties(0).multi_processor_count
        assert len(e.us) >= 3 and tt.ORIGINAL in e.us and e.spec == min(e.us, key=e.us.get)
    ops.fallback = False
    print({(e.op, e.key): e.spec for e in table.entries})
    for e in table.entries:
        call = next(c for c in shapes[e.op] if list(e.key)[0] == c[next(iter(c))][0])
        inputs = [gpu.randn(call[a.name], device="cuda").half() if a.kind == "tensor" else a.default
                  for a in ops[e.op].manifest.args]
        ops[e.op].reset_stats()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = ops[e.op](*inputs)
        st = ops[e.op].stats()
        ran = [k for k, v in st["launches"].items() if v]
        assert st["fallbacks"] == {}
        if e.spec == tt.ORIGINAL:
            assert ran == [] and st["original"] == 1
        else:
            assert len(ran) == 1 and ran[0].startswith(e.spec + tt.TUNED_SUFFIX) and st["original"] == 0
        gpu.testing.assert_close(got.float(), ops.reference(e.op)(*inputs).float(), atol=5e-2, rtol=5e-2)
