# SPDX-License-Identifier: Apache-2.0
"""``out = x * scale``: dequantize an (M, N) fp8 E4M3 tensor to float32 with the target's own fp8 conversion.

Launcher::

    dequant_fp8(x, out, scale: fx.Float32, stream: fx.Stream = fx.Stream(None))

* ``x`` is the target's native fp8 E4M3: ``float8_e4m3fnuz`` on gfx942 (MI300), ``float8_e4m3fn`` (OCP) on
  gfx950 (MI350). The same instruction, ``v_cvt_pk_f32_fp8``, decodes both: each target reads the bytes in its
  own format. So one spec serves both targets with a per-target dtype (examples/flydsl/pertarget.py); the
  launcher refuses the other format at trace time, since the instruction would silently decode it wrong.
* FlyDSL 0.5.0 copies fp8 tensors fine, but does not lower ``arith.extf`` from fp8 (``.to(fx.Float32)`` on an
  fp8 vector fails in LLVM translation), so the kernel converts with ``rocdl.cvt_pk_f32_fp8`` itself: the four
  fp8 bytes a thread holds are bitcast to one i32 word, whose low and high halves decode to two floats each.
* A workgroup of ``THREADS`` threads covers ``THREADS * 4`` columns of one row; tails are predicated per
  element; the last dim must be contiguous. ``out`` is float32, (M, N).
"""

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl._mlir import ir
from flydsl.expr import rocdl
from flydsl.runtime.device import get_rocm_arch

THREADS = 256
VEC = 4  # fp8 values per thread: one 32-bit word, two cvt_pk_f32_fp8


def check_fp8(dtype) -> None:
    """Refuse an fp8 type other than the one ``v_cvt_pk_f32_fp8`` decodes on the target being built: E4M3FNUZ
    on gfx94x, OCP E4M3FN from gfx950 on (the other would decode to wrong values, silently)."""
    arch = get_rocm_arch()
    native = fx.Float8E4M3FNUZ if arch.startswith("gfx94") else fx.Float8E4M3FN if arch.startswith("gfx95") else None
    if native is None:
        raise ValueError(f"dequant_fp8: expected a gfx94x or gfx95x target (v_cvt_pk_f32_fp8), got {arch}")
    if dtype is not native:
        raise TypeError(f"dequant_fp8 on {arch}: expected x of {native.__name__} (what v_cvt_pk_f32_fp8 decodes "
                        f"there), got {getattr(dtype, '__name__', dtype)}; give this target its fp8 dtype "
                        "(Spec per_target)")


@flyc.kernel
def dequant_fp8_kernel(X: fx.Tensor, Out: fx.Tensor, scale: fx.Float32):
    tid = fx.thread_idx.x
    bid = fx.block_idx.x
    threads = fx.make_ordered_layout((1, THREADS), order=(1, 0))
    values = fx.make_ordered_layout((1, VEC), order=(0, 1))
    load = fx.make_copy_atom(fx.UniversalCopy(8), X.element_type)
    store = fx.make_copy_atom(fx.UniversalCopy(32), fx.Float32)
    tiled_in = fx.make_tiled_copy_tv(load, threads, values)
    tiled_out = fx.make_tiled_copy_tv(store, threads, values)
    M, N = X.shape.unpack()
    tiles_n = (N + THREADS * VEC - 1) // (THREADS * VEC)
    row, col = bid // tiles_n, bid % tiles_n
    tile = tiled_in.tile_mn
    ident = fx.make_view((0, 0), fx.make_identity_layout((M, N)))
    thr_in, thr_out = tiled_in.get_slice(tid), tiled_out.get_slice(tid)
    tX = thr_in.partition_S(fx.flat_divide(X, tile)[None, None, row, col])
    tC = thr_in.partition_S(fx.flat_divide(ident, tile)[None, None, row, col])
    tO = thr_out.partition_D(fx.flat_divide(Out, tile)[None, None, row, col])
    rX = fx.make_fragment_like(tX)
    rO = fx.make_fragment_like(tO)
    pred = fx.make_fragment_like(tC, dtype=fx.Boolean)
    for i in fx.range_constexpr(VEC):
        pred[i] = fx.elem_less(tC[i], (M, N))
    fx.copy(load, tX, rX, pred=pred)
    word = rX.load().bitcast(fx.Int32)[0]  # 4 fp8 bytes, element 0 in the low byte
    pair = ir.VectorType.get([2], ir.F32Type.get())
    lo = fx.Vector(rocdl.cvt_pk_f32_fp8(pair, word, False))  # elements 0, 1
    hi = fx.Vector(rocdl.cvt_pk_f32_fp8(pair, word, True))  # elements 2, 3
    rO.store(lo.shuffle(hi, [0, 1, 2, 3]) * scale)
    fx.copy(store, rO, tO, pred=pred)


@flyc.jit
def dequant_fp8(x: fx.Tensor, out: fx.Tensor, scale: fx.Float32, stream: fx.Stream = fx.Stream(None)):
    """out (float32) = x (the target's fp8 E4M3, (M, N), last dim contiguous) * scale."""
    check_fp8(x.element_type)
    M, N = x.shape.unpack()
    grid = M * ((N + THREADS * VEC - 1) // (THREADS * VEC))
    dequant_fp8_kernel(x, out, scale).launch(grid=(grid, 1, 1), block=(THREADS, 1, 1), stream=stream)
