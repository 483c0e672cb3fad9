# SPDX-License-Identifier: Apache-2.0
"""bf16 GEMM with MFMA (FlyDSL 0.5.0):  C[M, N] = A[M, K] @ B[N, K]^T.

Launcher::

    gemm(a, b, c, stream: fx.Stream = fx.Stream(None))

* a: (M, K) bf16, row-major (K contiguous).
* b: (N, K) bf16, row-major (K contiguous) -- i.e. B is given TRANSPOSED, the
  ``torch.nn.functional.linear`` weight layout; C = a @ b.T.
* c: (M, N) bf16 output, row-major.  f32 accumulation in MFMA accumulators.
* shapes (dynamic, NOT checked on the device): M % 128 == 0, N % 128 == 0,
  K % 32 == 0, K >= 32; row strides multiples of 8 elements and base pointers
  16-byte aligned (true for contiguous torch tensors with such shapes).
* tiling: workgroup tile 128 x 128 x 32, 256 threads = 4 waves laid out 2 x 2.
  The MMA atom is ``v_mfma_f32_16x16x16_bf16`` (``fx.rocdl.MFMA(16, 16, 16,
  BFloat16)``, present on gfx942 and gfx950); the 2 x 2-wave tiled MMA covers
  32 x 32 and is repeated 4 x 4 over the 128 x 128 tile, so each wave owns a
  64 x 64 block of C (16 MFMA tiles, 64 f32 accumulators per lane) and issues
  32 MFMAs per K-step of 32.
* data flow per K-step: global -> registers (128-bit loads, 2 per operand per
  thread) -> LDS (row-major 128 x 32 tiles for A and B, XOR-swizzled against
  bank conflicts) -> MFMA fragments (64-bit LDS reads) -> MFMA.  The global
  loads of step k+1 are issued before the MFMAs of step k (register
  prefetch, single LDS buffer, two barriers per step).
* grid = (M / 128, N / 128, 1), block = (256, 1, 1).
"""

from flyship.compiler.frontends.flydsl import requires

# @fx.struct is missing from FlyDSL 0.1.5 ("flydsl.expr has no attribute struct"); 0.5.0 is the release this
# example is verified with: an older one is refused here, naming both versions, before anything is traced.
requires("0.5.0", "@fx.struct")

import flydsl.compiler as flyc  # noqa: E402
import flydsl.expr as fx  # noqa: E402

BM, BN, BK = 128, 128, 32
BLOCK_THREADS = 256
VEC = 8  # bf16 per 128-bit global load


@fx.struct
class SharedStorage:
    a: fx.Array[fx.BFloat16, BM * BK, 16]
    b: fx.Array[fx.BFloat16, BN * BK, 16]


def _smem_layout(rows):
    # (rows, BK) row-major, K contiguous, with the 16-byte chunk index (bits
    # 3-4 of the element offset) XORed with bits 1-2 of the row (bits 6-7):
    # the MFMA fragment reads (16 rows x 8 bytes per half-wave) then hit all
    # 32 LDS banks (2-way instead of 8-way conflicts); the 128-bit stores keep
    # their 8-element chunks contiguous.
    return fx.make_composed_layout(
        fx.static(fx.SwizzleType.get(2, 3, 3)),
        fx.make_layout((rows, BK), (BK, 1)),
    )


@flyc.kernel
def gemm_kernel(
    A: fx.Tensor,
    B: fx.Tensor,
    C: fx.Tensor,
):
    tid = fx.thread_idx.x
    bid_m = fx.block_idx.x
    bid_n = fx.block_idx.y

    M, K = A.shape.unpack()
    k_tiles = K // BK

    gA = fx.flat_divide(A, (BM, BK))[None, None, bid_m, None]  # (BM, BK, k)
    gB = fx.flat_divide(B, (BN, BK))[None, None, bid_n, None]  # (BN, BK, k)
    gC = fx.flat_divide(C, (BM, BN))[None, None, bid_m, bid_n]  # (BM, BN)

    lds = fx.SharedAllocator().allocate(SharedStorage).peek()
    sA = lds.a.view(_smem_layout(BM))
    sB = lds.b.view(_smem_layout(BN))

    # ---- global -> register -> LDS copies: 128-bit per thread, 64 x 32 per pass
    g2s_atom = fx.make_copy_atom(fx.UniversalCopy128b(), fx.BFloat16)
    g2s = fx.make_tiled_copy_tv(
        g2s_atom,
        fx.make_ordered_layout((BLOCK_THREADS * VEC // BK, BK // VEC), order=(1, 0)),
        fx.make_ordered_layout((1, VEC), order=(0, 1)),
    )
    thr_g2s = g2s.get_slice(tid)
    tAg = thr_g2s.partition_S(gA)  # (V, 2, 1, k)
    tBg = thr_g2s.partition_S(gB)
    tAs = thr_g2s.partition_D(sA)  # (V, 2, 1)
    tBs = thr_g2s.partition_D(sB)
    rA = fx.make_fragment_like(tAs)
    rB = fx.make_fragment_like(tBs)

    # ---- MFMA: 16x16x16 bf16 atom, 2 x 2 waves
    mma_atom = fx.make_mma_atom(fx.rocdl.MFMA(16, 16, 16, fx.BFloat16))
    tiled_mma = fx.make_tiled_mma(mma_atom, fx.make_layout((2, 2, 1), (1, 2, 0)))
    thr_mma = tiled_mma.thr_slice(tid)
    fA = thr_mma.make_fragment_A(sA)
    fB = thr_mma.make_fragment_B(sB)
    fC = thr_mma.make_fragment_C(gC)

    # ---- LDS -> MFMA fragments (4 contiguous K values = 64 bits per lane)
    s2r_atom = fx.make_copy_atom(fx.UniversalCopy64b(), fx.BFloat16)
    thr_s2r_A = fx.make_tiled_copy_A(s2r_atom, tiled_mma).get_slice(tid)
    thr_s2r_B = fx.make_tiled_copy_B(s2r_atom, tiled_mma).get_slice(tid)
    tAs_r = thr_s2r_A.partition_S(sA)
    tBs_r = thr_s2r_B.partition_S(sB)
    fA_r = thr_s2r_A.retile(fA)
    fB_r = thr_s2r_B.retile(fB)

    def mma_step():
        fx.copy(s2r_atom, tAs_r, fA_r)
        fx.copy(s2r_atom, tBs_r, fB_r)
        fx.gemm(tiled_mma, fC, fA, fB, fC)

    fC.fill(0.0)

    # prologue: K-tile 0 into LDS
    fx.copy(g2s_atom, tAg[None, None, None, 0], rA)
    fx.copy(g2s_atom, tBg[None, None, None, 0], rB)
    fx.copy(g2s_atom, rA, tAs)
    fx.copy(g2s_atom, rB, tBs)
    fx.gpu.barrier()

    for kt in range(1, k_tiles):
        # prefetch the next K-tile into registers while the MFMAs run
        fx.copy(g2s_atom, tAg[None, None, None, kt], rA)
        fx.copy(g2s_atom, tBg[None, None, None, kt], rB)
        mma_step()
        fx.gpu.barrier()
        fx.copy(g2s_atom, rA, tAs)
        fx.copy(g2s_atom, rB, tBs)
        fx.gpu.barrier()

    mma_step()

    # ---- epilogue: f32 accumulators -> bf16 -> global
    fC16 = fx.make_fragment_like(fC, fx.BFloat16)
    fC16.store(fC.load().to(fx.BFloat16))
    r2g_atom = fx.make_copy_atom(fx.UniversalCopy16b(), fx.BFloat16)
    thr_r2g = fx.make_tiled_copy_C(r2g_atom, tiled_mma).get_slice(tid)
    fx.copy(r2g_atom, thr_r2g.retile(fC16), thr_r2g.partition_D(gC))


@flyc.jit
def gemm(
    a: fx.Tensor,
    b: fx.Tensor,
    c: fx.Tensor,
    stream: fx.Stream = fx.Stream(None),
):
    """c = a @ b.T.  Inputs a (M, K), b (N, K); output c (M, N); all bf16."""
    M, K = a.shape.unpack()
    N, _ = b.shape.unpack()
    gemm_kernel(a, b, c).launch(grid=(M // BM, N // BN, 1), block=(BLOCK_THREADS, 1, 1), stream=stream)
