"""Upstream FlyDSL's forward norm kernels (RMSNorm, LayerNorm, softmax) and its preshuffle GEMM (bf16, f16, fp8),
built as upstream's builders make them, executed on the emulated device for gfx942 and gfx950 against torch
references written here, at small shapes. fp8 follows each target: E4M3FNUZ on gfx942, OCP E4M3FN on gfx950.
Needs ``FLYSHIP_UPSTREAM_FLYDSL`` (upstream's kernels/, like the compile tests) and the FlyDSL build Python; skips
saying so otherwise. An emulated run, not a GPU run.

Findings about upstream recorded here: softmax's ``block_reduce`` has an LDS write-after-read race (FIELD-NOTES):
the schedule in which wave 0 runs ahead gives wrong rows and the emulator reports the LDS conflict; the preshuffle
GEMM with fp8 reads ``arg_scale_a`` past M for the last M tile's rows (its buffer is not bounded by M)."""

from __future__ import annotations

import json

import pytest
import torch

from tests.compiler.test_upstream_wide import _write_spec
from tests.compiler.upstream import upstream_kernels
from tests.conftest import run_build
from tests.emulate.bundle_launch import launch

pytestmark = pytest.mark.cpu
N, ROWS = 2048, 4
GN, GK, GM = 128, 512, 33  # GEMM: M not a multiple of tile_m=32, so the last M tile is ragged

FWD = f"""
    from kernels.norm.rmsnorm_kernel import build_rmsnorm_module
    from kernels.norm.layernorm_kernel import build_layernorm_module
    from kernels.norm.softmax_kernel import build_softmax_module
    from kernels.gemm.preshuffle_gemm import compile_preshuffle_gemm
    N, ROWS, GN, GK, GM = {N}, {ROWS}, {GN}, {GK}, {GM}
    for dt, tdt in (("bf16", "bfloat16"), ("f32", "float32")):
        op(f"rmsnorm_{{dt}}", kernel=build_rmsnorm_module(N, dt),
           args=[Tensor("Input", rank=2), Tensor("Gamma", rank=1), Output("Output", like="Input"),
                 Value("m_in", "Input.shape[0]")],
           specs=[Spec(dt, dtypes={{"Input": tdt, "Gamma": tdt}}, shapes={{"Input": (ROWS, N), "Gamma": (N,)}},
                       constraints=(f"Input.shape[1] == {{N}}", f"Gamma.shape[0] == {{N}}"))])
        op(f"layernorm_{{dt}}", kernel=build_layernorm_module(N, dt),
           args=[Tensor("Input", rank=2), Tensor("Gamma", rank=1), Tensor("Beta", rank=1),
                 Output("Output", like="Input"), Value("m_in", "Input.shape[0]")],
           specs=[Spec(dt, dtypes={{"Input": tdt, "Gamma": tdt, "Beta": tdt}},
                       shapes={{"Input": (ROWS, N), "Gamma": (N,), "Beta": (N,)}},
                       constraints=(f"Input.shape[1] == {{N}}", f"Gamma.shape[0] == {{N}}",
                                    f"Beta.shape[0] == {{N}}"))])
        op(f"softmax_{{dt}}", kernel=build_softmax_module(ROWS, N, dt),
           args=[Tensor("A", rank=2), Output("C", like="A"), Value("m_in", "A.shape[0]")],
           specs=[Spec(dt, dtypes={{"A": tdt}}, shapes={{"A": (ROWS, N)}}, constraints=(f"A.shape[1] == {{N}}",))])
    # upstream's test_preshuffle_gemm.py call: flat operands (fp8 viewed as int8), empty scales for 16-bit inputs,
    # an empty bias (epilogue "none"), (M, N) as ints
    for ind, tdt in (("bf16", "bfloat16"), ("fp16", "float16"), ("fp8", "int8")):
        op(f"gemm_{{ind}}", kernel=compile_preshuffle_gemm(N=GN, K=GK, tile_m=32, tile_n=64, tile_k=GK, in_dtype=ind,
                                                         out_dtype="bf16"),
           args=[Output("arg_c", shape=(f"arg_a.numel // {{GK}} * {{GN}}",), dtype="bfloat16"), Tensor("arg_a", rank=1),
                 Tensor("arg_b", rank=1), Tensor("arg_scale_a", rank=1), Tensor("arg_scale_b", rank=1),
                 Tensor("arg_bias", rank=1), Value("i32_m", f"arg_a.numel // {{GK}}"), Value("i32_n", str(GN))],
           specs=[Spec(ind, dtypes={{"arg_a": tdt, "arg_b": tdt, "arg_scale_a": "float32", "arg_scale_b": "float32",
                                    "arg_bias": "bfloat16"}},
                       shapes={{"arg_a": (GM * GK,), "arg_b": (GN * GK,), "arg_scale_a": (GM,), "arg_scale_b": (GN,),
                               "arg_bias": (0,)}},
                       constraints=(f"arg_b.numel == {{GN * GK}}", f"arg_a.numel % {{GK}} == 0"))])
"""


@pytest.fixture(scope="module")
def fwd(tmp_path_factory):
    root = upstream_kernels("its RMSNorm, LayerNorm, softmax and preshuffle GEMM kernels compute what torch computes "
                            "on gfx942 and gfx950 (emulated)", "kernels/norm/softmax_kernel.py")
    tmp = tmp_path_factory.mktemp("upstream-fwd")
    run_build(_write_spec(tmp, root, FWD), tmp / "o", ["gfx942", "gfx950"], "-j", "2")
    return tmp / "o", json.loads((tmp / "o" / "manifest.json").read_text())


def _variants(manifest, name):
    op = next(o for o in manifest["ops"] if o["name"] == name)
    vs = [v for sp in op["specializations"] for v in sp["variants"]]
    assert {v["code_object"]["target"] for v in vs} == {"gfx942", "gfx950"}
    return vs


DTYPES = [(torch.bfloat16, "bf16", dict(atol=3e-2, rtol=2e-2)), (torch.float32, "f32", dict(atol=1e-5, rtol=1e-5))]


@pytest.mark.parametrize("dtype,tag,tol", DTYPES)
def test_upstream_rmsnorm_and_layernorm_match_torch(fwd, dtype, tag, tol):
    bundle, manifest = fwd
    for v in _variants(manifest, f"rmsnorm_{tag}"):
        x, g = torch.randn(ROWS, N).to(dtype), torch.randn(N).to(dtype)
        y = torch.full((ROWS, N), float("nan")).to(dtype)
        stats = launch(bundle, v, {"Input": x, "Gamma": g, "Output": y}, {"m_in": ROWS}, {"Output"})
        want = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5) * g.float()
        torch.testing.assert_close(y.float(), want.to(dtype).float(), **tol)
        assert stats.lds_conflicts == []
    for v in _variants(manifest, f"layernorm_{tag}"):
        x, g, b = (torch.randn(*s).to(dtype) for s in ((ROWS, N), (N,), (N,)))
        y = torch.full((ROWS, N), float("nan")).to(dtype)
        stats = launch(bundle, v, {"Input": x, "Gamma": g, "Beta": b, "Output": y}, {"m_in": ROWS}, {"Output"})
        want = torch.nn.functional.layer_norm(x.float(), (N,), g.float(), b.float(), 1e-5)
        torch.testing.assert_close(y.float(), want.to(dtype).float(), **tol)
        assert stats.lds_conflicts == []


@pytest.mark.parametrize("dtype,tag,tol", DTYPES)
def test_upstream_softmax_matches_torch_where_its_block_reduce_race_does_not_strike(fwd, dtype, tag, tol):
    """Both wave schedules: a schedule whose rows differ from torch must be one in which the emulator reports an
    LDS conflict (upstream's block_reduce race), and a schedule without a conflict must match torch."""
    bundle, manifest = fwd
    for v in _variants(manifest, f"softmax_{tag}"):
        clean = 0
        for schedule in ("forward", "reverse"):
            x = (torch.randn(ROWS, N) * 3).to(dtype)
            y = torch.full((ROWS, N), float("nan")).to(dtype)
            stats = launch(bundle, v, {"A": x, "C": y}, {"m_in": ROWS}, {"C"}, schedule=schedule)
            want = torch.softmax(x.float(), -1).to(dtype).float()
            if stats.lds_conflicts:
                continue  # the race struck in this order: reported, a finding about upstream (module docstring)
            torch.testing.assert_close(y.float(), want, **tol)
            clean += 1
        assert clean >= 1, f"softmax_{tag} on {v['code_object']['target']}: every schedule raced"


def _preshuffle(b: torch.Tensor) -> torch.Tensor:
    """B (N, K) in the preshuffled layout the kernel reads: 16 rows x 16 bytes of K per block, K blocks inner."""
    n, k = b.shape
    kp = 16 // b.element_size()
    return b.view(n // 16, 16, k // kp, kp).permute(0, 2, 1, 3).contiguous().view(-1)


def _gemm(bundle, v, a, b, sa, sb):
    c = torch.full((GM * GN,), float("nan")).to(torch.bfloat16)
    launch(bundle, v, {"arg_c": c, "arg_a": a.reshape(-1), "arg_b": _preshuffle(b), "arg_scale_a": sa,
                       "arg_scale_b": sb, "arg_bias": torch.empty(0, dtype=torch.bfloat16)}, {}, {"arg_c"})
    return c.view(GM, GN).float()


@pytest.mark.parametrize("dtype,tag", [(torch.bfloat16, "bf16"), (torch.float16, "fp16")])
def test_upstream_preshuffle_gemm_16bit_matches_torch(fwd, dtype, tag):
    bundle, manifest = fwd
    for v in _variants(manifest, f"gemm_{tag}"):
        a, b = torch.randn(GM, GK).to(dtype), torch.randn(GN, GK).to(dtype)
        c = _gemm(bundle, v, a, b, torch.empty(0), torch.empty(0))
        torch.testing.assert_close(c, (a.float() @ b.float().T).to(torch.bfloat16).float(), atol=0.1, rtol=1e-2)


def test_upstream_preshuffle_gemm_fp8_matches_torch_per_target(fwd):
    """gfx942: E4M3FNUZ operands through 16x16x32 fp8 MFMAs; gfx950: OCP E4M3FN through the CDNA4 16x16x128
    f8f6f4 MFMA. Per-row and per-column f32 scales."""
    bundle, manifest = fwd
    for v in _variants(manifest, "gemm_fp8"):
        f8 = torch.float8_e4m3fnuz if v["code_object"]["target"] == "gfx942" else torch.float8_e4m3fn
        a, b = torch.randn(GM, GK).to(f8), torch.randn(GN, GK).to(f8)
        sa = (torch.rand(64) + 0.5)[:GM]  # its storage covers the ragged tile's rows, which the kernel reads
        sb = torch.rand(GN) + 0.5
        want = (a.float() * sa[:, None]) @ (b.float() * sb[:, None]).T
        c = _gemm(bundle, v, a.view(torch.int8), b.view(torch.int8), sa, sb)
        torch.testing.assert_close(c, want.to(torch.bfloat16).float(), atol=0.1, rtol=1e-2)
