"""flyship.bench's mechanics on the CPU: four interleaved arms, medians, speedups, and op calls per arm
(the GPU numbers come from bench/dropin_block.py on the H200)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import flyship
from flyship.errors import ConfigError

pytestmark = pytest.mark.cpu


@pytest.fixture
def model(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "data" / "dropin"))
    import dropin_model

    return dropin_model


def test_bench_times_four_arms_and_shows_only_the_patched_ones_reach_the_op(fresh_ops, model):
    ops = fresh_ops()
    torch.manual_seed(0)
    block, x = model.Block(4), torch.randn(3, 4)
    p1 = flyship.patch("dropin_model:add", ops.add, args={"x": "a", "y": "b"}, cpu_target="gfx942")
    p2 = flyship.patch("dropin_model:Scale.forward", ops.scale_rows, args={"x": "hidden", "alpha": "self.alpha"},
                       cpu_target="gfx942")
    p2.undo()
    try:
        torch._dynamo.reset()
        result = flyship.bench(block, x, patches=[p1, p2], repeats=3, iters=2, warmup=1,
                               compile_options={"backend": "aot_eager"})
        assert p1.active is True and p2.active is False  # left as found
    finally:
        p1.undo()
    assert [a.name for a in result.arms] == ["baseline", "patched", "compiled", "patched+compiled"]
    assert {a.name: a.op_calls for a in result.arms} == {"baseline": 0, "patched": 2, "compiled": 0,
                                                         "patched+compiled": 2}
    assert all(len(a.times) == 3 and a.median > 0 for a in result.arms)
    assert result["baseline"].speedup == 1.0
    table = result.table()
    assert table.splitlines()[0].startswith("arm") and "patched+compiled" in table and len(table.splitlines()) == 5
    assert set(result.as_dict()) == {"baseline", "patched", "compiled", "patched+compiled"}


def test_bench_refuses_unknown_arms_and_missing_patches(fresh_ops, model):
    with pytest.raises(ConfigError, match=r"expected at least one patch"):
        flyship.bench(lambda: None, patches=[])
    with pytest.raises(ConfigError, match=r"expected arms among baseline, patched, compiled, patched\+compiled, got "
                                          r"\['fast'\]"):
        flyship.bench(lambda: None, patches=[object()], arms=["fast"])


def test_the_gpu_bench_block_routes_its_norms_and_softmax_to_the_ops_on_the_cpu(example_bundle, ext, monkeypatch):
    """bench/dropin_block.py's wiring, run on the CPU with the FlyDSL example bundle (same op names); the H200
    run times it."""
    import uuid

    monkeypatch.syspath_prepend(str(Path(__file__).parents[2] / "bench"))
    import dropin_block

    ops = flyship.load(example_bundle, namespace=f"flyship_blk{uuid.uuid4().hex[:8]}")
    torch.manual_seed(0)
    block = dropin_block.Block(64, 4).eval()
    x = torch.randn(2, 16, 64)
    with torch.no_grad():
        want = block(x)
        patches = dropin_block.make_patches(ops, cpu_target="gfx942")
        try:
            got = block(x)
        finally:
            for p in patches:
                p.undo()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert [(p.stats()["to_op"], p.stats()["to_original"]) for p in patches] == [(2, {}), (1, {})]


def test_the_gpu_bench_follows_the_routing_reports_advice_when_fusion_is_lost(example_bundle, ext, monkeypatch):
    """bench/dropin_block.py's last compiled arm, on the CPU (aot_eager): with every site set to compiled="original"
    (what the report advises when a compiled graph loses fusion), the compiled graph traces the originals, so none of
    its calls reach the ops, while the eager arm still takes them; the patches are left as they were."""
    import uuid

    monkeypatch.syspath_prepend(str(Path(__file__).parents[2] / "bench"))
    import dropin_block

    ops = flyship.load(example_bundle, namespace=f"flyship_rep{uuid.uuid4().hex[:8]}")
    torch.manual_seed(0)
    block = dropin_block.Block(64, 4).eval()
    x = torch.randn(2, 16, 64)
    patches = dropin_block.make_patches(ops, cpu_target="gfx942")
    try:
        with torch.no_grad():
            got = dropin_block.routed_as_reported(block, x, patches, {"backend": "aot_eager"}, repeats=1, iters=1)
    finally:
        for p in patches:
            p.undo()
    calls = {name: arm["op_calls"] for name, arm in got["arms"].items()}
    assert calls == {"baseline": 0, "compiled": 0, "patched+compiled": 0}, calls
    assert [p.compiled for p in patches] == ["op", "op"]
    assert "patched+compiled" in got["table"] and got["patched_compiled_over_compiled"] > 0


def test_the_bench_command_times_a_factory_with_a_patches_file(tmp_path, tiny_bundle, ext):
    import json
    import os
    import subprocess
    import sys

    pf = tmp_path / "patches.json"
    pf.write_text(json.dumps({"bundle": str(tiny_bundle), "patches": [
        {"target": "dropin_model:add", "op": "add", "args": {"x": "a", "y": "b"}, "cpu_target": "gfx942"}]}))
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parent / "data" / "dropin"))
    r = subprocess.run([sys.executable, "-m", "flyship.loader.tools.cli", "bench", "dropin_model:bench_case", "--patches",
                        str(pf), "--repeats", "2", "--iters", "2", "--warmup", "1", "--backend", "aot_eager"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line.split() for line in r.stdout.splitlines() if line.split()}
    assert rows["baseline"][3] == "0" and rows["patched"][3] == "1" and rows["compiled"][3] == "0"
    assert rows["patched+compiled"][3] == "1"
    assert "dropin_model:add -> flyship_tiny::add" in r.stdout
    r = subprocess.run([sys.executable, "-m", "flyship.loader.tools.cli", "bench", "dropin_model:nothing", "--patches",
                        str(pf)], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 1 and "expected a factory 'package.module:function', got 'dropin_model:nothing'" in r.stderr
