"""Upstream FlyDSL's norm backward kernels (softmax_bwd, rmsnorm_bwd), built as upstream calls them
(tests/compiler/test_upstream_wide.py's spec), executed on the emulated device for gfx942 and gfx950 against torch
references written here. Needs ``FLYSHIP_UPSTREAM_FLYDSL`` (upstream's kernels/, like the compile tests) and the
FlyDSL build Python; skips saying so otherwise. An emulated run, not a GPU run."""

from __future__ import annotations

import json

import pytest
import torch

from tests.compiler.test_upstream_wide import NORM_BWD, _write_spec
from tests.compiler.upstream import upstream_kernels
from tests.conftest import run_build
from tests.emulate.bundle_launch import launch

pytestmark = pytest.mark.cpu


@pytest.fixture(scope="module")
def norm_bwd(tmp_path_factory):
    root = upstream_kernels("its softmax_bwd and rmsnorm_bwd kernels compute what torch computes on gfx942 and "
                            "gfx950 (emulated)", "kernels/norm/softmax_bwd_kernel.py")
    tmp = tmp_path_factory.mktemp("upstream-norm-bwd")
    run_build(_write_spec(tmp, root, NORM_BWD), tmp / "o", ["gfx942", "gfx950"], "-j", "2")
    return tmp / "o", json.loads((tmp / "o" / "manifest.json").read_text())


def _variants(manifest, name):
    op = next(o for o in manifest["ops"] if o["name"] == name)
    return [v for sp in op["specializations"] for v in sp["variants"]]


@pytest.mark.parametrize("name,n,dtype", [("softmax_bwd_f32_2000", 2000, torch.float32),
                                          ("softmax_bwd_bf16_8192", 8192, torch.bfloat16)])
def test_upstream_softmax_bwd_matches_torch(norm_bwd, name, n, dtype):
    bundle, manifest = norm_bwd
    targets = set()
    for v in _variants(manifest, name):
        m = 3
        y = torch.softmax(torch.randn(m, n), -1).to(dtype)
        dy = torch.randn(m, n).to(dtype)
        dx = torch.full((m, n), float("nan")).to(dtype)
        stats = launch(bundle, v, {"DY": dy, "Y": y, "DX": dx}, {"m_in": m}, {"DX"})
        g, p = dy.float(), y.float()
        want = p * (g - (g * p).sum(-1, keepdim=True))
        tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(dx.float(), want.to(dtype).float(), **tol)
        assert stats.lds_conflicts == []
        targets.add(v["code_object"]["target"])
    assert targets == {"gfx942", "gfx950"}


def test_upstream_rmsnorm_bwd_matches_torch(norm_bwd):
    bundle, manifest = norm_bwd
    targets = set()
    for v in _variants(manifest, "rmsnorm_bwd"):
        m, n = 3, 4096
        x, g, dy = (torch.randn(*s).to(torch.bfloat16) for s in ((m, n), (n,), (m, n)))
        rstd = torch.rsqrt(x.float().pow(2).mean(-1) + 1e-6)
        dx = torch.full((m, n), float("nan")).to(torch.bfloat16)
        dw = torch.zeros(n)
        launch(bundle, v, {"Input": x, "Gamma": g, "DY": dy, "Rstd": rstd, "DX": dx, "DWeight": dw}, {"m_in": m},
               {"DX", "DWeight"})
        xhat = x.float() * rstd[:, None]
        gdy = dy.float() * g.float()
        want_dx = rstd[:, None] * (gdy - xhat * (gdy * xhat).mean(-1, keepdim=True))
        torch.testing.assert_close(dx.float(), want_dx.to(torch.bfloat16).float(), atol=3e-2, rtol=2e-2)
        torch.testing.assert_close(dw, (dy.float() * xhat).sum(0), atol=1e-4, rtol=1e-5)
        targets.add(v["code_object"]["target"])
    assert targets == {"gfx942", "gfx950"}
