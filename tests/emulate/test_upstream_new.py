"""Upstream FlyDSL's autotuned RMSNorm, built as the compile test declares it (tests/compiler/test_upstream_new.py:
the tuner named as upstream's ``rmsnorm_autotuned`` calls it, every config of its search space), executed on the
emulated device for gfx942 and gfx950 against a torch reference written here, 3 rows. Each distinct code object runs
once (configs that differ only in a ``waves_per_eu`` the compiler could not honour share one). The gfx950-only new
attention kernels run in tests/emulate/test_upstream_gfx950.py; fp8 conv3d is not run (docs/emulator.md). Needs ``FLYSHIP_UPSTREAM_FLYDSL`` and the FlyDSL build Python; skips
saying so otherwise. Emulated runs, not GPU runs."""

from __future__ import annotations

import json

import pytest
import torch

from tests.compiler.test_upstream_new import RMS_AUTOTUNED
from tests.compiler.test_upstream_wide import _write_spec
from tests.compiler.upstream import upstream_kernels
from tests.conftest import run_build
from tests.emulate.bundle_launch import launch

pytestmark = pytest.mark.cpu
ROWS, N, EPS = 3, 8192, 1e-5  # N is the spec's baked row length; upstream's EPS


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    root = upstream_kernels("its autotuned RMSNorm computes what torch computes for every config, on gfx942 and "
                            "gfx950 (emulated)", "kernels/norm/rmsnorm_autotune.py")
    tmp = tmp_path_factory.mktemp("upstream-new")
    run_build(_write_spec(tmp, root, RMS_AUTOTUNED), tmp / "o", ["gfx942", "gfx950"], "-j", "1")
    return tmp / "o", json.loads((tmp / "o" / "manifest.json").read_text())


def test_upstream_autotuned_rmsnorm_every_distinct_config_matches_torch(tuned):
    bundle, manifest = tuned
    (op,) = manifest["ops"]
    seen: dict[tuple[str, str], str] = {}
    for spec in op["specializations"]:
        for v in spec["variants"]:
            seen.setdefault((v["code_object"]["target"], v["code_object"]["sha256"]), (spec["name"], v))
    assert {t for t, _ in seen} == {"gfx942", "gfx950"}
    assert sorted(v["launch"]["block"][0] for _n, v in seen.values()) == [128, 128, 256, 256, 512, 512]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(ROWS, N, generator=g).to(torch.bfloat16)
    w = torch.rand(N, generator=g).to(torch.bfloat16)
    xf = x.float()
    want = xf * torch.rsqrt((xf * xf).mean(-1, keepdim=True) + EPS) * w.float()
    for name, v in seen.values():
        out = torch.full((ROWS, N), float("nan")).to(torch.bfloat16)
        launch(bundle, v, {"Input": x, "Gamma": w, "Output": out}, {}, {"Output"})
        torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=0, msg=lambda m: f"{name}: {m}")
