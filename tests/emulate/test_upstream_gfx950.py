"""Upstream FlyDSL's gfx950-only attention kernels, declared as tests/compiler/test_upstream_new.py declares them
(the sliding window narrowed to (128, 0) so that a 256-row call crosses it), executed on the emulated device
against torch references written here: sliding-window GQA attention (``v_med3_i32``, ``buffer_load_dwordx4 ...
lds``, ``ds_read_b64_tr_b16``), the dual-wave causal flash attention and the fp8 implicit-GEMM conv3d (16-bit VOP2 and
SDWA, ``buffer_load_dwordx4 ... lds``; its operands packed as upstream's ``_conv3d_impl_fp8`` packs them), and the
4-wave MXFP4 GEMM (block-scaled ``v_mfma_scale_f32_16x16x128_f8f6f4`` with fp4 operands; built here at 256x256x2048,
its B and scales shuffled as upstream's test shuffles them). Needs ``FLYSHIP_UPSTREAM_FLYDSL`` and the FlyDSL build
Python; skips saying so otherwise. Emulated runs, not GPU runs."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
import torch.nn.functional as F

from tests.compiler.test_upstream_new import BUILT, RMS_AUTOTUNED, _write
from tests.compiler.upstream import upstream_kernels
from tests.conftest import run_build
from tests.emulate.bundle_launch import launch

pytestmark = pytest.mark.cpu
H, H_KV, D = 32, 16, 128  # swa's baked heads and head_dim (batch 2)
LEFT = 128
FM, FN, FK = 256, 256, 2048  # the MXFP4 GEMM's baked sizes (one 256x256 tile; K = 8 steps of 256)
FP4_GEMM = f"""
from kernels.gemm.fp4_gemm_4wave import compile_fp4_gemm_4w
op("fp4_gemm_4w", kernel=compile_fp4_gemm_4w(K={FK}, MN=({FM}, {FN})),
   args=[Tensor("A", rank=1), Tensor("B_T", rank=1), Output("C", shape=("{FM * FN}",), dtype="bfloat16"),
         Tensor("A_scale", rank=1), Tensor("B_scale", rank=1), Value("c_m", "{FM}"), Value("c_n", "{FN}")],
   specs=[Spec("mxfp4", dtypes={{"A": "uint8", "B_T": "uint8", "A_scale": "uint8", "B_scale": "uint8"}},
               shapes={{"A": ({FM * FK // 2},), "B_T": ({FN * FK // 2},), "A_scale": ({FM * FK // 32},),
                       "B_scale": ({FN * FK // 32},)}}, targets=("gfx950",))])
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = upstream_kernels("its gfx950 sliding-window and dual-wave flash attention compute what torch computes "
                            "(emulated)", "kernels/attention/swa_gfx950.py")
    body = BUILT.replace(RMS_AUTOTUNED, "")
    assert "sliding_window=(512, 0)" in body
    body = body.replace("sliding_window=(512, 0)", f"sliding_window=({LEFT}, 0)")
    body += textwrap.indent(FP4_GEMM, "    ")  # BUILT's indentation (the spec writer dedents the whole body)
    tmp = tmp_path_factory.mktemp("upstream-gfx950")
    run_build(_write(tmp, root, body), tmp / "o", ["gfx950"], "-j", "1")
    return tmp / "o", json.loads((tmp / "o" / "manifest.json").read_text())


def _variant(manifest, name):
    op = next(o for o in manifest["ops"] if o["name"] == name)
    (v,) = [v for sp in op["specializations"] for v in sp["variants"]]
    assert v["code_object"]["target"] == "gfx950"
    return v


def test_upstream_sliding_window_gqa_attention_matches_torch(built):
    bundle, manifest = built
    B, N = 2, 256  # one 256-row query tile per (head, batch); rows past LEFT lose their oldest keys
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, N, H, D, generator=g).to(torch.bfloat16)
    k, v = (torch.randn(B, N, H_KV, D, generator=g).to(torch.bfloat16) for _ in range(2))
    out = torch.full((B, N, H, D), float("nan")).to(torch.bfloat16)
    stats = launch(bundle, _variant(manifest, "swa"), {"Q": q.reshape(-1), "K": k.reshape(-1), "V": v.reshape(-1),
                                                       "O": out.reshape(-1)}, {}, {"O"})
    qf = q.float().transpose(1, 2)
    kf, vf = (t.float().transpose(1, 2).repeat_interleave(H // H_KV, dim=1) for t in (k, v))
    i, j = torch.arange(N)[:, None], torch.arange(N)[None, :]
    keep = (j >= i - LEFT) & (j <= i)  # upstream's band: keys i - LEFT .. i
    want = F.scaled_dot_product_attention(qf, kf, vf, attn_mask=keep).transpose(1, 2)
    torch.testing.assert_close(out.float(), want, atol=3e-2, rtol=2e-2)
    assert stats.lds_conflicts == []


def test_upstream_dualwave_causal_flash_attention_matches_torch(built):
    bundle, manifest = built
    B, S, FH = 1, 512, 8  # seq_len 512 and 8 heads baked into the build
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(B, S, FH, D, generator=g).to(torch.bfloat16) for _ in range(3))
    out = torch.full((B, S, FH, D), float("nan")).to(torch.bfloat16)
    launch(bundle, _variant(manifest, "fa_dualwave"), {"Q": q.reshape(-1), "K": k.reshape(-1), "V": v.reshape(-1),
                                                       "O": out.reshape(-1)}, {}, {"O"})
    want = F.scaled_dot_product_attention(*(t.float().transpose(1, 2) for t in (q, k, v)),
                                          is_causal=True).transpose(1, 2)
    torch.testing.assert_close(out.float(), want, atol=3e-2, rtol=2e-2)


def test_upstream_fp8_conv3d_matches_torch(built):
    bundle, manifest = built
    N, C, Dd, Hh, Ww, K = 2, 32, 4, 8, 8, 64  # the spec's baked sizes; 3x3x3 filter, stride 1, padding 1, bias
    crs = C * 27
    crs_pad = max(256, (crs + 127) // 128 * 128)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(N, C, Dd, Hh, Ww, generator=g).to(torch.float8_e4m3fn)
    w = torch.randn(K, C, 3, 3, 3, generator=g).to(torch.float8_e4m3fn)
    bias = torch.randn(K, generator=g)
    # upstream's _conv3d_impl_fp8: activations NDHWC, the weight KTRSC zero-padded to (K, crs_pad), bias f32
    w_packed = torch.zeros(K, crs_pad, dtype=torch.float8_e4m3fn)
    w_packed[:, :crs] = w.permute(0, 2, 3, 4, 1).reshape(K, crs)
    y = torch.full((N * K * Dd * Hh * Ww,), float("nan")).to(torch.bfloat16)
    launch(bundle, _variant(manifest, "conv3d_fp8"), {"y": y, "x": x.permute(0, 2, 3, 4, 1).contiguous().view(-1),
                                                       "weight": w_packed.view(-1), "bias": bias}, {}, {"y"})
    want = F.conv3d(x.float(), w.float(), bias, padding=1)  # OCP E4M3FN operands (gfx950), f32 accumulation
    torch.testing.assert_close(y.float().view(N, K, Dd, Hh, Ww), want, atol=1e-1, rtol=1e-2)  # bf16 output


E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def _mx_dequant(q, scale):
    """Two OCP E2M1 values per byte (low nibble first) times 2**(e8m0 - 127) per 32-wide block of a row."""
    v = torch.stack([E2M1[(q & 15).long()], E2M1[(q >> 4).long()]], -1).reshape(q.shape[0], -1)
    return v * torch.pow(2.0, scale.float() - 127).repeat_interleave(32, dim=1)


def test_upstream_mxfp4_gemm_matches_torch(built):
    bundle, manifest = built
    g = torch.Generator().manual_seed(3)
    a = torch.randint(0, 256, (FM, FK // 2), generator=g, dtype=torch.uint8)
    b = torch.randint(0, 256, (FN, FK // 2), generator=g, dtype=torch.uint8)
    sa = torch.randint(124, 131, (FM, FK // 32), generator=g, dtype=torch.uint8)
    sb = torch.randint(124, 131, (FN, FK // 32), generator=g, dtype=torch.uint8)
    # upstream's test inputs: B as shuffle_weight_w4(b, 16) ([N/16, 16, K/128, 4, 16] -> [N/16, K/128, 4, 16, 16]),
    # both scales as shuffle_scale_w4(s, 1) ([N/32, 2, 16, K/256, 2, 4] -> [N/32, K/256, 4, 16, 2, 2])
    b_sh = b.view(FN // 16, 16, FK // 128, 4, 16).permute(0, 2, 3, 1, 4).contiguous()
    sh = lambda s, n: s.view(n // 32, 2, 16, FK // 256, 2, 4).permute(0, 3, 5, 2, 4, 1).contiguous()  # noqa: E731
    c = torch.full((FM * FN,), float("nan")).to(torch.bfloat16)
    launch(bundle, _variant(manifest, "fp4_gemm_4w"), {"A": a.view(-1), "B_T": b_sh.view(-1), "C": c,
                                                       "A_scale": sh(sa, FM).view(-1), "B_scale": sh(sb, FN).view(-1)},
           {}, {"C"})
    want = _mx_dequant(a, sa) @ _mx_dequant(b, sb).T
    torch.testing.assert_close(c.float().view(FM, FN), want, atol=1e-1, rtol=1e-2)  # bf16 output
