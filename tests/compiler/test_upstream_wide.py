"""Issue 23 item 8: more of upstream FlyDSL's kernels, declared the way a new user would from their docstrings and
upstream's own call sites (its tests and host entry points), built for the archs upstream supports with a code
object proven equal to FlyDSL's own and a kernarg layout that tiles the code object's metadata: paged-attention
decode, the MoE 2-stage GEMMs and their topk reduce, the fp8 row-scale GEMMs, the MXFP4 GEMMs and the norm
backward kernels. One build per kernel family, each in its own tmp dir.

Upstream's ``kernels/`` is not in the wheel nor in this repository: point ``FLYSHIP_UPSTREAM_FLYDSL`` at a folder
holding it (``git archive HEAD kernels`` of ROCm/FlyDSL, extracted). Without it the tests skip.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from flyship.bundle import manifest as M
from flyship.bundle import rules
from flyship.bundle.codeobject import CodeObjectFile

from ..conftest import run_build
from .upstream import upstream_kernels

pytestmark = pytest.mark.compile
BOTH = ["gfx942", "gfx950"]
GFX950 = ["gfx950"]  # upstream's fp8 row-scale and fp4 GEMMs use CDNA4-only MFMAs; its tests skip elsewhere


@pytest.fixture(scope="module")
def upstream() -> Path:
    return upstream_kernels("its paged-attention decode, MoE 2-stage GEMMs, fp8 and MXFP4 GEMMs and norm backward kernels build", "kernels/moe/moe_gemm_2stage/gemm1.py")


# pa_decode_tile's host entry (``pa_decode_tile(output, query, key_cache, ...)``) computes the launcher's ints from
# its tensors (``int(block_tables.shape[1])``, ``query.stride(0)``), which flyship cannot bind from inside an entry;
# the spec names the launcher it compiles and declares those ints as Values, as that entry passes them. With
# num_partitions=1 the kernel writes ``output`` directly and pmax/psum/pout are the entry's 1-element dummies.
PA_DECODE = """
    from kernels.attention.pa_decode_tile import compile_pa_decode_tile
    S, QH, KH, D, BS, NB, MAXB = 4, 8, 1, 128, 16, 64, 16
    DUMMY = [Workspace(n, shape=("1",), dtype="float32") for n in ("pmax", "psum", "pout")]
    op("pa_decode_tile", kernel=compile_pa_decode_tile(head_dim=D, query_group_size=QH // KH, block_size=BS,
                                                       num_partitions=1, query_dtype="bf16")["launch"],
       args=[Output("output", like="query"), *DUMMY,
             Tensor("query", rank=3), Tensor("key_cache", rank=5), Tensor("value_cache", rank=5),
             Tensor("block_tables", rank=2), Tensor("context_lengths", rank=1),
             Tensor("key_scale", rank=1), Tensor("value_scale", rank=1),
             Value("max_blocks_per_seq", "block_tables.shape[1]"), Value("num_seqs", "context_lengths.shape[0]"),
             Value("num_kv_heads", "key_cache.shape[1]"), Value("stride_ks_block", "0"),
             Value("stride_ks_head", "0"), Value("stride_q_row", "query.stride[0]"),
             Value("stride_q_head", "query.stride[1]")],
       specs=[Spec("bf16_fp8", dtypes={"query": "bfloat16", "key_cache": "float8_e4m3fnuz",
                                       "value_cache": "float8_e4m3fnuz", "block_tables": "int32",
                                       "context_lengths": "int32", "key_scale": "float32", "value_scale": "float32"},
                   shapes={"query": (S, QH, D), "key_cache": (NB, KH, D // 16, BS, 16),
                           "value_cache": (NB, KH, BS // 16, D, 16), "block_tables": (S, MAXB),
                           "context_lengths": (S,), "key_scale": (1,), "value_scale": (1,)},
                   # head_dim, block_size and the GQA group are baked in; one query row per sequence
                   constraints=(f"query.shape[1] == {QH // KH} * key_cache.shape[1]", f"query.shape[2] == {D}",
                                "query.shape[0] == context_lengths.shape[0]", f"key_cache.shape[2] == {D // 16}",
                                f"key_cache.shape[3] == {BS}", "key_cache.shape[4] == 16",
                                "value_cache.shape[1] == key_cache.shape[1]", f"value_cache.shape[2] == {BS // 16}",
                                f"value_cache.shape[3] == {D}", "value_cache.shape[4] == 16",
                                "block_tables.shape[0] == context_lengths.shape[0]"),
                   # K/V are fp8 E4M3 FNUZ on gfx942 and OCP E4M3 on gfx950 (the module docstring)
                   per_target={"gfx950": dict(dtypes={"key_cache": "float8_e4m3fn",
                                                      "value_cache": "float8_e4m3fn"})})])
"""

# Upstream's test_moe_gemm_2stage.py: model_dim=256, inter_dim=128, experts=4, topk=2, tile_m=64, 128 tokens; every
# operand flattened (x.view(-1), ...), routing from its torch moe sorting, sizes passed as ints.
MOE_COMMON = """
    from kernels.moe.moe_gemm_2stage import compile_moe_gemm1, compile_moe_gemm2, compile_moe_reduction
    T, MD, ID, E, K, TM = 128, 256, 128, 4, 2, 64
    PADDED = T * K + E * TM - K            # the test's max_num_tokens_padded
    BLOCKS = (PADDED + TM - 1) // TM
    ROUTING = [Tensor("arg_sorted_token_ids", rank=1), Tensor("arg_expert_ids", rank=1),
               Tensor("arg_sorted_weights", rank=1)]
    DTYPES = {"arg_x": "float8_e4m3fnuz", "arg_w": "float8_e4m3fnuz", "arg_scale_x": "float32",
              "arg_scale_w": "float32", "arg_sorted_token_ids": "int32", "arg_expert_ids": "int32",
              "arg_sorted_weights": "float32"}
    OCP = {"gfx950": dict(dtypes={"arg_x": "float8_e4m3fn", "arg_w": "float8_e4m3fn"})}
    ROUTE_SHAPES = {"arg_sorted_token_ids": (PADDED,), "arg_expert_ids": (BLOCKS,), "arg_sorted_weights": (PADDED,)}
"""

MOE_GEMM1 = MOE_COMMON + """
    op("moe_gemm1", kernel=compile_moe_gemm1(model_dim=MD, inter_dim=ID, experts=E, topk=K, tile_m=TM, tile_n=64,
                                             tile_k=128, doweight_stage1=False, out_dtype="bf16", in_dtype="fp8"),
       args=[Output("arg_out", shape=("arg_scale_x.shape[0]", str(K), str(ID)), dtype="bfloat16"),
             Tensor("arg_x", rank=1), Tensor("arg_w", rank=1), Tensor("arg_scale_x", rank=1),
             Tensor("arg_scale_w", rank=1), *ROUTING, Tensor("arg_max_token_ids", rank=1),
             Value("i32_tokens_in", "arg_scale_x.shape[0]"), Value("i32_inter_in", str(ID)),
             Value("i32_k_in", str(MD)), Value("i32_size_expert_ids_in", "arg_expert_ids.shape[0]")],
       specs=[Spec("fp8", dtypes={**DTYPES, "arg_max_token_ids": "int32"},
                   shapes={"arg_x": (T * MD,), "arg_w": (E * 2 * ID * MD,), "arg_scale_x": (T,),
                           "arg_scale_w": (E * 2 * ID,), **ROUTE_SHAPES, "arg_max_token_ids": (1,)},
                   constraints=(f"arg_x.numel == arg_scale_x.shape[0] * {MD}", f"arg_w.numel == {E * 2 * ID * MD}",
                                f"arg_scale_w.numel == {E * 2 * ID}"),
                   per_target=OCP)])
"""

# Stage 2: accumulate=True adds into a zeroed (tokens, model_dim) output with atomics (the test zeroes it);
# accumulate=False writes one row per (token, slot) for the reduce kernel. Its activations are per (token, slot).
MOE_GEMM2 = MOE_COMMON + """
    for acc in (True, False):
        rows = "arg_scale_x.shape[0] // 2" if acc else "arg_scale_x.shape[0]"
        op("moe_gemm2_" + ("atomic" if acc else "reduce"),
           kernel=compile_moe_gemm2(model_dim=MD, inter_dim=ID, experts=E, topk=K, tile_m=TM, tile_n=64, tile_k=128,
                                    doweight_stage2=True, out_dtype="bf16", accumulate=acc, in_dtype="fp8"),
           args=[Output("arg_out", shape=(rows, str(MD)), dtype="bfloat16", zero=acc),
                 Tensor("arg_x", rank=1), Tensor("arg_w", rank=1), Tensor("arg_scale_x", rank=1),
                 Tensor("arg_scale_w", rank=1), *ROUTING, Tensor("arg_num_valid_ids", rank=1),
                 Value("i32_tokens_in", "arg_scale_x.shape[0] // 2"), Value("i32_n_in", str(MD)),
                 Value("i32_k_in", str(ID)), Value("i32_size_expert_ids_in", "arg_expert_ids.shape[0]")],
           specs=[Spec("fp8", dtypes={**DTYPES, "arg_num_valid_ids": "int32"},
                       shapes={"arg_x": (T * K * ID,), "arg_w": (E * MD * ID,), "arg_scale_x": (T * K,),
                               "arg_scale_w": (E * MD,), **ROUTE_SHAPES, "arg_num_valid_ids": (1,)},
                       constraints=(f"arg_x.numel == arg_scale_x.shape[0] * {ID}", "arg_scale_x.shape[0] % 2 == 0",
                                    f"arg_w.numel == {E * MD * ID}", f"arg_scale_w.numel == {E * MD}"),
                       per_target=OCP)])
    # The topk reduce (upstream's test_moe_reduce.py): fx.Pointer operands; no EP mask, so empty mask / ids.
    op("moe_reduce", kernel=compile_moe_reduction(topk=K, model_dim=MD, dtype_str="bf16"),
       args=[Tensor("X", rank=3), Output("Y", shape=("X.shape[0]", "X.shape[2]"), dtype="X"),
             Tensor("expert_mask", rank=1), Tensor("topk_ids", rank=1), Value("i32_m_tokens", "X.shape[0]")],
       specs=[Spec("bf16", dtypes={"X": "bfloat16", "expert_mask": "int32", "topk_ids": "int32"},
                   shapes={"X": (T, K, MD), "expert_mask": (0,), "topk_ids": (0,)},
                   constraints=(f"X.shape[1] == {K}", f"X.shape[2] == {MD}", "X.stride[0] == X.shape[1] * X.shape[2]",
                                "X.stride[1] == X.shape[2]", "X.stride[2] == 1"))])
"""

# Upstream's test_fp8_gemm_rowscale.py: A and B_T flat int8 views of fp8 e4m3fn, C flat bf16, per-row / per-column
# f32 scales, (M, N) as ints; by default (static_weight_scale=True) B_T and both scales go through
# flyc.from_torch_tensor (static layouts: their sizes, M included, are baked in and guarded). Its first shape.
FP8_GEMM = """
    import flydsl.compiler as flyc
    import flydsl.expr as fx
    from kernels.gemm.fp8_gemm_4wave import compile_fp8_gemm_4w
    from kernels.gemm.fp8_gemm_8wave import compile_fp8_gemm_8w
    M, N, K = 512, 2112, 7168

    def static_weights(launch):
        def fp8_gemm(A, B_T, C, A_scale, B_scale, c_m, c_n, stream=None):
            launch(A, flyc.from_torch_tensor(B_T), C, flyc.from_torch_tensor(A_scale),
                   flyc.from_torch_tensor(B_scale), c_m, c_n, fx.Stream(stream))
        return fp8_gemm

    ARGS = [Tensor("A", rank=1), Tensor("B_T", rank=1),
            Output("C", shape=("A_scale.shape[0] * B_scale.shape[0]",), dtype="bfloat16"),
            Tensor("A_scale", rank=1), Tensor("B_scale", rank=1),
            Value("c_m", "A_scale.shape[0]"), Value("c_n", "B_scale.shape[0]")]
    SPEC = dict(dtypes={"A": "int8", "B_T": "int8", "A_scale": "float32", "B_scale": "float32"},
                shapes={"A": (M * K,), "B_T": (N * K,), "A_scale": (M,), "B_scale": (N,)},
                constraints=(f"A.numel == A_scale.shape[0] * {K}", f"B_T.numel == B_scale.shape[0] * {K}"))
    op("fp8_gemm_4w", kernel=entry(static_weights(compile_fp8_gemm_4w(K=K, BLOCK_M=64, BLOCK_N=64))), args=ARGS,
       specs=[Spec("fp8", **SPEC)])
    op("fp8_gemm_8w", kernel=entry(static_weights(compile_fp8_gemm_8w(K=K, BLOCK_M=128, BLOCK_N=256))), args=ARGS,
       specs=[Spec("fp8", **SPEC)])
    # static_weight_scale=False: every operand a dynamic layout, the launcher named directly. The 256x256 tile
    # (the test's 5120x5120x8320 shape) spills 148 bytes per work-item in FlyDSL's own code object too.
    op("fp8_gemm_4w_dynamic", kernel=compile_fp8_gemm_4w(K=8320, BLOCK_M=256, BLOCK_N=256), args=ARGS,
       specs=[Spec("fp8", dtypes=SPEC["dtypes"],
                   shapes={"A": (5120 * 8320,), "B_T": (5120 * 8320,), "A_scale": (5120,), "B_scale": (5120,)},
                   constraints=("A.numel == A_scale.shape[0] * 8320", "B_T.numel == B_scale.shape[0] * 8320"),
                   allow_scratch=True)])
"""

# fp4_gemm_4wave as upstream's test_fp4_gemm_4wave.py calls it: compile_fp4_gemm_4w(K=K, MN=(M, N)) bakes M and N;
# every operand a flat uint8 view (two fp4 per byte, e8m0 scales). mxfp4_preshuffle.launch_gemm as that test's
# adapter in test_preshuffle_gemm.py calls it: fx.Pointer operands, all bytes (from_c_void_p(fx.Uint8, ...), the bf16
# output too), every config a positional Constexpr; the launcher passes the operands to the kernel as i64 addresses.
FP4_GEMM = """
    from kernels.gemm.fp4_gemm_4wave import compile_fp4_gemm_4w
    from kernels.gemm.mxfp4_preshuffle import launch_gemm
    M = N = K = 8192
    op("fp4_gemm_4w", kernel=compile_fp4_gemm_4w(K=K, MN=(M, N)),
       args=[Tensor("A", rank=1), Tensor("B_T", rank=1), Output("C", shape=(str(M * N),), dtype="bfloat16"),
             Tensor("A_scale", rank=1), Tensor("B_scale", rank=1), Value("c_m", str(M)), Value("c_n", str(N))],
       specs=[Spec("mxfp4", dtypes={"A": "uint8", "B_T": "uint8", "A_scale": "uint8", "B_scale": "uint8"},
                   shapes={"A": (M * K // 2,), "B_T": (N * K // 2,), "A_scale": (M * K // 32,),
                           "B_scale": (N * K // 32,)},
                   constraints=(f"A.numel == {M * K // 2}", f"B_T.numel == {N * K // 2}",
                                f"A_scale.numel == {M * K // 32}", f"B_scale.numel == {N * K // 32}"))])
    M2, N2, K2 = 64, 8192, 8192
    CONST = dict(N=N2, K=K2, tile_m=64, tile_n=128, tile_k=128, a_dtype="fp4", out_dtype="bf16", b_dtype="fp4",
                 batch=1, a_row_stride=-1, a_batch_stride=-1, sca_row_stride=-1, sca_batch_stride=-1,
                 c_row_stride=-1, c_batch_stride=-1, waves_per_eu=0, xcd_swizzle=0)
    op("mxfp4_preshuffle", kernel=launch_gemm,
       args=[Output("arg_c", shape=("arg_scale_a.numel // 256", str(N2)), dtype="bfloat16", pointee="uint8"),
             Tensor("arg_a", rank=2, pointee="uint8"), Tensor("arg_b", rank=2, pointee="uint8"),
             Tensor("arg_scale_a", rank=1, pointee="uint8"), Tensor("arg_scale_b", rank=1, pointee="uint8"),
             Value("i32_m", "arg_a.shape[0]"), Value("i32_n", str(N2)), *(Constexpr(k) for k in CONST)],
       specs=[Spec("bf16", dtypes={"arg_a": "uint8", "arg_b": "uint8", "arg_scale_a": "uint8",
                                   "arg_scale_b": "uint8"},
                   shapes={"arg_a": (M2, K2 // 2), "arg_b": (N2, K2 // 2), "arg_scale_a": (M2 * K2 // 32,),
                           "arg_scale_b": (N2 * K2 // 32,)},
                   constexprs=CONST,
                   constraints=(f"arg_a.shape[1] == {K2 // 2}", f"arg_a.stride[0] == {K2 // 2}",
                                "arg_a.stride[1] == 1", f"arg_b.shape[0] == {N2}", f"arg_b.shape[1] == {K2 // 2}",
                                f"arg_b.stride[0] == {K2 // 2}", "arg_b.stride[1] == 1",
                                f"arg_scale_a.numel == arg_a.shape[0] * {K2 // 32}",
                                f"arg_scale_b.numel == {N2 * K2 // 32}"))])
"""

# softmax_bwd as upstream's test_softmax_bwd.py calls it (launch_fn(dy, y, dx, M)): its vectorised buffered path
# (bf16, N=8192) and its generic tail path (f32, N=2000). rmsnorm_bwd as its host wrapper rmsnorm_bwd(...) in
# rmsnorm_kernel.py picks them: the atomic path (fp32 dweight, zeroed, atomics) below 512 rows, and the staged path
# (num_programs persistent programs, a num_programs x N fp32 partial, a deterministic reduce) from 512 rows.
NORM_BWD = """
    from kernels.norm.softmax_bwd_kernel import build_softmax_bwd_module
    from kernels.norm.rmsnorm_bwd_kernel import build_rmsnorm_bwd_module, build_rmsnorm_bwd_two_stage_module
    for N, dt, tdt in ((8192, "bf16", "bfloat16"), (2000, "f32", "float32")):
        op(f"softmax_bwd_{dt}_{N}", kernel=build_softmax_bwd_module(N, dt),
           args=[Tensor("DY", rank=2), Tensor("Y", rank=2), Output("DX", like="Y"), Value("m_in", "Y.shape[0]")],
           specs=[Spec(dt, dtypes={"DY": tdt, "Y": tdt}, shapes={"DY": (1024, N), "Y": (1024, N)},
                       constraints=(f"Y.shape[1] == {N}", "DY.shape[0] == Y.shape[0]", f"DY.shape[1] == {N}"))])
    M, N = 256, 4096
    SAME = (f"Input.shape[1] == {N}", f"Gamma.shape[0] == {N}", "DY.shape[0] == Input.shape[0]",
            f"DY.shape[1] == {N}", "Rstd.shape[0] == Input.shape[0]")
    BF = {"Input": "bfloat16", "Gamma": "bfloat16", "DY": "bfloat16", "Rstd": "float32"}
    SH = {"Input": (M, N), "Gamma": (N,), "DY": (M, N), "Rstd": (M,)}
    IN = [Tensor("Input", rank=2), Tensor("Gamma", rank=1), Tensor("DY", rank=2), Tensor("Rstd", rank=1),
          Output("DX", like="Input")]
    op("rmsnorm_bwd", kernel=build_rmsnorm_bwd_module(N, "bf16"),
       args=[*IN, Output("DWeight", shape=("Gamma.shape[0]",), dtype="float32", zero=True),
             Value("m_in", "Input.shape[0]")],
       specs=[Spec("bf16", dtypes=BF, shapes=SH, constraints=SAME)])
    P = 304  # the wrapper's num_programs for a 304-CU device and 512 <= M < 2048 (vec8 config)
    op("rmsnorm_bwd_two_stage", kernel=build_rmsnorm_bwd_two_stage_module(N, "bf16", P),
       args=[*IN, Output("DWeight", like="Gamma"), Workspace("DWeightPartial", shape=(str(P * N),), dtype="float32"),
             Value("m_in", "Input.shape[0]")],
       specs=[Spec("bf16", dtypes=BF, shapes={**SH, "Input": (1024, N), "DY": (1024, N), "Rstd": (1024,)},
                   constraints=SAME + (f"Input.shape[0] >= {P}",))])
"""

FAMILIES = {
    "pa_decode_tile": (PA_DECODE, BOTH),
    "moe_gemm1": (MOE_GEMM1, BOTH),
    "moe_gemm2_and_reduce": (MOE_GEMM2, BOTH),
    "fp8_gemm": (FP8_GEMM, GFX950),
    "fp4_gemm": (FP4_GEMM, GFX950),
    "norm_bwd": (NORM_BWD, BOTH),
}


def _write_spec(tmp_path: Path, upstream: Path, body: str) -> Path:
    spec = tmp_path / "spec.py"
    spec.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(upstream)!r})
        from flyship.compiler.spec import Constexpr, Output, Spec, Tensor, Value, Workspace, entry, namespace, op
        namespace("upstream")
    """) + textwrap.dedent(body))
    return spec


def _check_proven(bundle: Path, m: M.Manifest, archs: list[str]) -> dict[tuple[str, str], list[int]]:
    """Every launch of every variant is proven equal to FlyDSL's own code object and its kernargs tile its
    metadata; returns the .text size of each launch per (op, target)."""
    text: dict[tuple[str, str], list[int]] = {}
    for op in m.ops:
        for spec in op.specializations:
            for v in spec.variants:
                where = f"{op.name}.{spec.name}.{v.target}"
                for t in v.launches:
                    data = (bundle / t.code_object.file).read_bytes()
                    assert t.proof.method == "flydsl-binary" and t.proof.metadata == "equal", where
                    assert t.proof.kernel_descriptor == "identical", where
                    assert t.proof.differences == () and ".text" in t.proof.identical_sections, where
                    rules.check_layout(t.kernargs, t.metadata, where)
                    co = CodeObjectFile(data)
                    assert co.kernel_metadata(t.code_object.symbol) == t.metadata, where
                    text.setdefault((op.name, v.target), []).append(len(co.section_bytes(".text")))
        targets = sorted({v.target for s in op.specializations for v in s.variants})
        assert targets == archs, op.name
    return text


@pytest.mark.parametrize("family", list(FAMILIES))
def test_upstream_kernels_build_as_upstream_calls_them_equal_to_flydsls_code_objects(tmp_path, upstream, family):
    body, archs = FAMILIES[family]
    run_build(_write_spec(tmp_path, upstream, body), tmp_path / "o", archs, "-j", "2")
    m = M.read(tmp_path / "o")
    text = _check_proven(tmp_path / "o", m, archs)
    assert all(size > 0 for sizes in text.values() for size in sizes)
    if family == "pa_decode_tile":
        # fp8 K/V: E4M3 FNUZ on gfx942, OCP on gfx950, one specialization per target
        guards = {s.name: s.guard.dtypes["key_cache"] for s in m.op("pa_decode_tile").specializations}
        assert guards == {"bf16_fp8__gfx942": "float8_e4m3fnuz", "bf16_fp8__gfx950": "float8_e4m3fn"}
        v = m.op("pa_decode_tile").specializations[0].variants[0]
        assert v.launch.grid == ("context_lengths.shape[0]", "key_cache.shape[1]", "1")
        assert v.workspaces and all(w.shape == ("1",) for w in v.workspaces)
    if family == "moe_gemm2_and_reduce":
        assert m.op("moe_gemm2_atomic").outputs[0].zero and not m.op("moe_gemm2_reduce").outputs[0].zero
        assert m.op("moe_reduce").specializations[0].variants[0].tensor_abi["X"] == "pointer"
    if family == "fp8_gemm":
        # The static layouts of upstream's default call are pinned by the guard: M and N included.
        guard = m.op("fp8_gemm_4w").specializations[0].guard.constraints
        assert {"A_scale.shape[0] == 512", "B_scale.shape[0] == 2112", "B_T.shape[0] == 15138816"} <= set(guard)
        assert m.op("fp8_gemm_4w_dynamic").specializations[0].variants[0].metadata.private_segment_fixed_size > 0
    if family == "fp4_gemm":
        v = m.op("mxfp4_preshuffle").specializations[0].variants[0]
        # the launcher's fx.ptrtoint addresses are laid out as the tensors' data pointers
        assert [(f.kind, f.arg) for f in v.kernargs.fields][:5] == [
            ("pointer", "arg_c"), ("pointer", "arg_a"), ("pointer", "arg_b"), ("pointer", "arg_scale_a"),
            ("pointer", "arg_scale_b")]
    if family == "norm_bwd":
        assert m.op("rmsnorm_bwd").outputs[1].zero
        two = m.op("rmsnorm_bwd_two_stage").specializations[0].variants[0]
        assert len(two.launches) == 2 and two.launch.grid == ("304", "1", "1")


def test_upstream_fp8_gemms_crash_flydsl_on_gfx942_and_the_build_reports_it_instead_of_hanging(tmp_path, upstream):
    """Upstream's fp8 row-scale GEMMs are CDNA4-only (16x16x128 f8f6f4 MFMAs; its test skips elsewhere). Built for
    gfx942, FlyDSL 0.5.0 dies in native code without a message. Two such kernels in one pipelined pool (-j 1)
    hung flyc-build forever before the trace slots were lock files (tests/compiler/test_trace_slots.py)."""
    body = FP8_GEMM.split("    # static_weight_scale=False")[0]
    r = run_build(_write_spec(tmp_path, upstream, body), tmp_path / "o", ["gfx942"], "-j", "1", check=False)
    assert r.returncode == 1, r.stdout + r.stderr
    for name in ("fp8_gemm_4w", "fp8_gemm_8w"):
        assert f"{name}.fp8 on gfx942: the worker process died while compiling this kernel" in r.stderr
    assert not (tmp_path / "o").exists()
