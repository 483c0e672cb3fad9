"""Upstream FlyDSL's MoE 2-stage GEMMs (gate-up + SiLU, down-projection with atomics or per-slot rows), its topk
reduce and its paged-attention decode (pa_decode_tile), built from the compile tests' specs
(tests/compiler/test_upstream_wide.py: upstream's own call sites), executed on the emulated device for gfx942 and
gfx950 against torch references written here. fp8 operands follow each target: E4M3FNUZ on gfx942, OCP E4M3FN on
gfx950. Needs ``FLYSHIP_UPSTREAM_FLYDSL`` and the FlyDSL build Python; skips saying so otherwise. Emulated runs."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from tests.compiler.test_upstream_wide import MOE_GEMM1, MOE_GEMM2, PA_DECODE, _write_spec
from tests.compiler.upstream import upstream_kernels
from tests.conftest import run_build
from tests.emulate.bundle_launch import launch

pytestmark = pytest.mark.cpu
# The MoE specs' routing buffers are sized for 128 tokens (upstream's test); fewer tokens are routed into them.
T, MD, ID, E, K, TM, SPEC_T = 16, 256, 128, 4, 2, 64, 128
PADDED = SPEC_T * K + E * TM - K
BLOCKS = (PADDED + TM - 1) // TM


def _build(tmp_path_factory, name, body):
    root = upstream_kernels(f"its {name} kernels compute what torch computes on gfx942 and gfx950 (emulated)",
                            "kernels/moe/moe_gemm_2stage/gemm1.py")
    tmp = tmp_path_factory.mktemp(f"upstream-{name}")
    run_build(_write_spec(tmp, root, body), tmp / "o", ["gfx942", "gfx950"], "-j", "2")
    return tmp / "o", json.loads((tmp / "o" / "manifest.json").read_text())


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    return _build(tmp_path_factory, "MoE", MOE_GEMM1 + MOE_GEMM2)


@pytest.fixture(scope="module")
def pa(tmp_path_factory):
    return _build(tmp_path_factory, "paged-attention", PA_DECODE)


def _variants(manifest, name):
    op = next(o for o in manifest["ops"] if o["name"] == name)
    vs = [v for sp in op["specializations"] for v in sp["variants"]]
    assert {v["code_object"]["target"] for v in vs} == {"gfx942", "gfx950"}
    return vs


def _fp8(v) -> torch.dtype:
    return torch.float8_e4m3fnuz if v["code_object"]["target"] == "gfx942" else torch.float8_e4m3fn


def _preshuffle(w: torch.Tensor) -> torch.Tensor:
    """Rows x K bytes in the 16x16 preshuffled layout (upstream's shuffle_weight): 16 rows x 16 bytes per block."""
    n, k = w.shape
    return w.view(n // 16, 16, k // 16, 16).permute(0, 2, 1, 3).contiguous().view(-1)


def _routing():
    """Random top-k routes and their moe_sorting form: per expert, (slot << 24 | token) ids padded to tile_m
    (padding = topk << 24 | tokens), one expert id per tile (-1 past the used tiles), the valid-id count."""
    topk_ids = torch.stack([torch.randperm(E)[:K] for _ in range(T)])
    topk_w = torch.softmax(torch.rand(T, K), -1)
    ids = torch.full((PADDED,), (K << 24) | T, dtype=torch.int32)
    weights, experts = torch.zeros(PADDED), torch.full((BLOCKS,), -1, dtype=torch.int32)
    pos = blocks = 0
    for e in range(E):
        t, s = torch.where(topk_ids == e)
        n, nb = len(t), (len(t) + TM - 1) // TM
        ids[pos:pos + n] = (s.int() << 24) | t.int()
        weights[pos:pos + n] = topk_w[t, s]
        experts[blocks:blocks + nb] = e
        pos, blocks = pos + nb * TM, blocks + nb
    return topk_ids, topk_w, {"arg_sorted_token_ids": ids, "arg_expert_ids": experts, "arg_sorted_weights": weights}, \
        torch.tensor([pos], dtype=torch.int32)


def _operands(v, rows, n_w, k):
    x, w = torch.randn(rows, k).to(_fp8(v)), torch.randn(n_w, k).to(_fp8(v))
    sx, sw = torch.rand(rows) * 0.1 + 0.05, (torch.rand(n_w) + 0.5) / k ** 0.5
    args = {"arg_x": x.view(torch.int8).view(-1), "arg_w": _preshuffle(w.view(torch.int8)), "arg_scale_x": sx,
            "arg_scale_w": sw}
    return args, x.float() * sx[:, None], w.float() * sw[:, None]


def test_upstream_moe_gemm1_gate_up_silu_matches_torch(moe):
    bundle, manifest = moe
    for v in _variants(manifest, "moe_gemm1"):
        topk_ids, _, route, valid = _routing()
        args, x, w = _operands(v, T, E * 2 * ID, MD)
        out = torch.full((T, K, ID), float("nan")).to(torch.bfloat16)
        launch(bundle, v, {"arg_out": out, **args, **route, "arg_max_token_ids": valid}, {}, {"arg_out"})
        y = torch.einsum("tk,tsnk->tsn", x, w.view(E, 2 * ID, MD)[topk_ids])
        want = F.silu(y[..., :ID]) * y[..., ID:]
        torch.testing.assert_close(out.float(), want.to(torch.bfloat16).float(), atol=2e-3, rtol=2e-2)


@pytest.mark.parametrize("name", ["moe_gemm2_atomic", "moe_gemm2_reduce"])
def test_upstream_moe_gemm2_down_projection_matches_torch(moe, name):
    """Routed-weight-scaled down projection: summed over the top-k slots with atomics into a zeroed output, or
    one row per (token, slot) for the reduce kernel."""
    bundle, manifest = moe
    atomic = name == "moe_gemm2_atomic"
    for v in _variants(manifest, name):
        topk_ids, topk_w, route, valid = _routing()
        args, x, w = _operands(v, T * K, E * MD, ID)
        out = torch.zeros(T, MD).to(torch.bfloat16) if atomic else \
            torch.full((T * K, MD), float("nan")).to(torch.bfloat16)
        launch(bundle, v, {"arg_out": out, **args, **route, "arg_num_valid_ids": valid}, {}, {"arg_out"})
        per = torch.einsum("tsk,tsnk->tsn", x.view(T, K, ID), w.view(E, MD, ID)[topk_ids]) * topk_w[..., None]
        want = per.sum(1) if atomic else per.reshape(T * K, MD)
        torch.testing.assert_close(out.float(), want.to(torch.bfloat16).float(), atol=1e-2, rtol=2e-2)


def test_upstream_moe_reduce_sums_the_topk_rows(moe):
    bundle, manifest = moe
    for v in _variants(manifest, "moe_reduce"):
        x = torch.randn(T, K, MD).to(torch.bfloat16)
        y = torch.full((T, MD), float("nan")).to(torch.bfloat16)
        empty = torch.empty(0, dtype=torch.int32)  # no expert-parallel mask: empty, as the spec says
        launch(bundle, v, {"X": x, "Y": y, "expert_mask": empty, "topk_ids": empty}, {}, {"Y"})
        torch.testing.assert_close(y.float(), x.float().sum(1).to(torch.bfloat16).float(), atol=1e-2, rtol=1e-2)


def test_upstream_pa_decode_tile_matches_attention_over_the_paged_cache(pa):
    """One query row per sequence (8 query heads on 1 KV head), fp8 K/V in upstream's logical paged layouts,
    contexts of 1, 37, 200 and 256 tokens through shuffled block tables, per-tensor K and V scales. The kernel
    quantizes Q and P to fp8, so the tolerance is fp8's (a few percent), not bf16's."""
    S, QH, D, BS, NB, MAXB = 4, 8, 128, 16, 64, 16
    bundle, manifest = pa
    for v in _variants(manifest, "pa_decode_tile"):
        q = torch.randn(S, QH, D).to(torch.bfloat16)
        kc = torch.randn(NB, 1, D // 16, BS, 16).to(_fp8(v))
        vc = torch.randn(NB, 1, BS // 16, D, 16).to(_fp8(v))
        tables = torch.stack([torch.randperm(NB)[:MAXB] for _ in range(S)]).int()
        lengths = torch.tensor([1, 37, 200, 256], dtype=torch.int32)
        k_scale, v_scale = torch.tensor([0.7]), torch.tensor([1.3])
        out = torch.full((S, QH, D), float("nan")).to(torch.bfloat16)
        dummies = {n: torch.zeros(1) for n in ("pmax", "psum", "pout")}  # num_partitions=1: never written
        launch(bundle, v, {"output": out, "query": q, "key_cache": kc, "value_cache": vc, "block_tables": tables,
                           "context_lengths": lengths, "key_scale": k_scale, "value_scale": v_scale, **dummies}, {},
               {"output", *dummies})
        keys = kc.float().permute(0, 1, 3, 2, 4).reshape(NB, BS, D) * k_scale  # [block, token, dim]
        values = vc.float().permute(0, 1, 2, 4, 3).reshape(NB, BS, D) * v_scale
        want = torch.empty(S, QH, D)
        for s in range(S):
            n = int(lengths[s])
            used = tables[s, :(n + BS - 1) // BS]
            k, val = keys[used].reshape(-1, D)[:n], values[used].reshape(-1, D)[:n]
            want[s] = torch.softmax(q[s].float() @ k.T / D ** 0.5, -1) @ val
        torch.testing.assert_close(out.float(), want, atol=0.06, rtol=0.03)
