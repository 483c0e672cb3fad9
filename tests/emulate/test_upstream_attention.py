"""Upstream FlyDSL's fused RoPE + KV-cache kernel and its generic flash attention (causal and not), built from the
compile tests' specs (tests/compiler/test_upstream_attention.py), executed on the emulated device against torch
references written here, on gfx942 and gfx950 (gfx950's flash attention reads LDS with the CDNA4 transpose read
``ds_read_b64_tr_b16`` and the causal one loads global memory straight to LDS, ``buffer_load_dwordx4 ... lds``). Needs
``FLYSHIP_UPSTREAM_FLYDSL`` and the FlyDSL build Python; skips saying so otherwise. Emulated runs."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from tests.compiler.test_upstream_attention import FLASH, ROPE
from tests.compiler.test_upstream_wide import _write_spec
from tests.compiler.upstream import upstream_kernels
from tests.conftest import run_build
from tests.emulate.bundle_launch import launch

pytestmark = pytest.mark.cpu


@pytest.fixture(scope="module")
def attention(tmp_path_factory):
    root = upstream_kernels("its RoPE + KV cache and flash attention kernels compute what torch computes "
                            "(emulated)", "kernels/attention/fused_rope_cache_kernel.py")
    tmp = tmp_path_factory.mktemp("upstream-attention")
    run_build(_write_spec(tmp, root, FLASH + ROPE), tmp / "o", ["gfx942", "gfx950"], "-j", "2")
    return tmp / "o", json.loads((tmp / "o" / "manifest.json").read_text())


def _variants(manifest, name):
    op = next(o for o in manifest["ops"] if o["name"] == name)
    vs = [v for sp in op["specializations"] for v in sp["variants"]]
    assert {v["code_object"]["target"] for v in vs} == {"gfx942", "gfx950"}
    return vs


def _rotate(x, cos, sin):
    """NeoX RoPE: the two halves of the head rotate as (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def test_upstream_rope_cache_rotates_q_and_k_and_writes_the_paged_caches(attention):
    T, QH, D, BLOCK, BLOCKS, MAX_POS = 32, 8, 64, 16, 40, 1024  # the spec's baked sizes, one KV head
    bundle, manifest = attention
    bf = torch.bfloat16
    for v in _variants(manifest, "rope_cache"):
        q, k, val = torch.randn(T, QH, D).to(bf), torch.randn(T, 1, D).to(bf), torch.randn(T, 1, D).to(bf)
        pos = torch.randint(0, MAX_POS, (T,), dtype=torch.int32)
        cos, sin = torch.randn(MAX_POS, D // 2).to(bf), torch.randn(MAX_POS, D // 2).to(bf)
        slots = torch.randperm(BLOCKS * BLOCK)[:T].int()
        kc, vc = torch.zeros(BLOCKS, BLOCK, 1, D).to(bf), torch.zeros(BLOCKS, BLOCK, 1, D).to(bf)
        q_out, k_out = torch.full((T, QH, D), float("nan")).to(bf), torch.full((T, 1, D), float("nan")).to(bf)
        launch(bundle, v, {"Q": q, "K": k, "V": val, "Positions": pos, "CosCache": cos, "SinCache": sin,
                           "SlotMapping": slots, "KeyCache": kc, "ValueCache": vc, "Q_out": q_out, "K_out": k_out,
                           "KScale": torch.ones(1), "VScale": torch.ones(1)},
               {"num_tokens": T}, {"KeyCache", "ValueCache", "Q_out", "K_out"})
        c, s = cos.float()[pos.long()][:, None], sin.float()[pos.long()][:, None]
        want_q, want_k = _rotate(q.float(), c, s), _rotate(k.float(), c, s)
        tol = dict(atol=6e-2, rtol=2e-2)  # bf16 operands and results
        torch.testing.assert_close(q_out.float(), want_q, **tol)
        torch.testing.assert_close(k_out.float(), want_k, **tol)
        want_kc, want_vc = torch.zeros(BLOCKS * BLOCK, 1, D), torch.zeros(BLOCKS * BLOCK, 1, D)
        want_kc[slots.long()], want_vc[slots.long()] = want_k, val.float()
        torch.testing.assert_close(kc.float().view(-1, 1, D), want_kc, **tol)
        torch.testing.assert_close(vc.float().view(-1, 1, D), want_vc, atol=0, rtol=0)


@pytest.mark.parametrize("name,causal", [("fa", False), ("fa_causal", True)])
def test_upstream_flash_attention_matches_torch_on_gfx942_and_gfx950(attention, name, causal):
    B, S, H, D = 1, 64, 8, 128  # heads and head_dim baked into the build; one 64-row query tile
    bundle, manifest = attention
    for v in _variants(manifest, name):
        q, k, val = (torch.randn(B, S, H, D).to(torch.float16) for _ in range(3))
        out = torch.full((B, S, H, D), float("nan")).to(torch.float16)
        args = {"Q": q, "K": k, "V": val, "O": out}
        launch(bundle, v, args, {}, {"O"})
        want = F.scaled_dot_product_attention(*(t.float().transpose(1, 2) for t in (q, k, val)),
                                              is_causal=causal).transpose(1, 2)
        torch.testing.assert_close(out.float(), want, atol=2e-3, rtol=1e-2,
                                   msg=lambda m: f"{v['code_object']['target']}: {m}")
