# SPDX-License-Identifier: Apache-2.0
"""``out = x + 1`` over the first ``m`` rows of an (M, N) float32 tensor passed as raw ``fx.Pointer``\\ s.

Launchers::

    add_one_ptr(x: fx.Pointer, out: fx.Pointer, m: fx.Int32, N: fx.Constexpr[int],
                stream: fx.Stream = fx.Stream(None))
    add_one_addr(...)   # the same, the pointers passed to the kernel as 64-bit addresses (fx.ptrtoint)

Upstream FlyDSL builders (attention, RoPE + quant) take some operands as bare pointers and build the views
themselves: the caller passes ``flyc.from_c_void_p(fx.Float32, t.data_ptr())``, and the kernel argument is the
pointer alone (8 bytes), with no shape or stride. A spec declares such a parameter as the tensor it points into
(``Tensor("x", rank=2)``): flyship passes the tensor's data pointer, the guard checks its dtype and alignment,
and the sizes the view assumes are declared constraints (``x.shape[1] == N``, contiguous rows).
"""

import flydsl.compiler as flyc
import flydsl.expr as fx

ROWS_MAX = 65536
TILE_N = 256


def _add_one_rows(X, Out, m, N: int):
    """The kernel body: one TILE_N slice of one row per program, rows past ``m`` masked off."""
    tid = fx.thread_idx.x
    bid = fx.block_idx.x
    atom = fx.make_copy_atom(fx.UniversalCopy(32), fx.Float32)
    tiled = fx.make_tiled_copy_tv(atom, fx.make_ordered_layout((1, TILE_N), order=(1, 0)),
                                  fx.make_ordered_layout((1, 1), order=(0, 1)))
    tiles_n = (N + TILE_N - 1) // TILE_N
    row, col = bid // tiles_n, bid % tiles_n
    ident = fx.make_view((0, 0), fx.make_identity_layout((ROWS_MAX, N)))
    tile = tiled.tile_mn
    thr = tiled.get_slice(tid)
    tX = thr.partition_S(fx.flat_divide(X, tile)[None, None, row, col])
    tO = thr.partition_D(fx.flat_divide(Out, tile)[None, None, row, col])
    tC = thr.partition_S(fx.flat_divide(ident, tile)[None, None, row, col])
    rX = fx.make_fragment_like(tX)
    rO = fx.make_fragment_like(tO)
    pred = fx.make_fragment_like(tC, dtype=fx.Boolean)
    for i in fx.range_constexpr(fx.size(pred.shape).unpack()):
        pred[i] = fx.elem_less(tC[i], (m, N))
    fx.copy(atom, tX, rX, pred=pred)
    rO.store(rX.load() + 1.0)
    fx.copy(atom, rO, tO, pred=pred)


@flyc.kernel
def add_one_ptr_kernel(X: fx.Tensor, Out: fx.Tensor, m: fx.Int32, N: fx.Constexpr[int]):
    _add_one_rows(X, Out, m, N)


@flyc.jit
def add_one_ptr(x: fx.Pointer, out: fx.Pointer, m: fx.Int32, N: fx.Constexpr[int],
                stream: fx.Stream = fx.Stream(None)):
    """out[:m] = x[:m] + 1 for float32 (m, N) buffers given as pointers, N baked in."""
    xs = fx.Tensor(fx.make_view(x, fx.make_layout((ROWS_MAX, N), (N, 1))))
    os_ = fx.Tensor(fx.make_view(out, fx.make_layout((ROWS_MAX, N), (N, 1))))
    grid = m * ((N + TILE_N - 1) // TILE_N)
    add_one_ptr_kernel(xs, os_, m, N).launch(grid=(grid, 1, 1), block=(TILE_N, 1, 1), stream=stream)


@flyc.kernel
def add_one_addr_kernel(x_addr: fx.Int64, out_addr: fx.Int64, m: fx.Int32, N: fx.Constexpr[int]):
    f32_global = fx.PointerType.get(fx.Float32.ir_type, address_space=fx.AddressSpace.Global, alignment=4)
    layout = fx.make_layout((ROWS_MAX, N), (N, 1))
    _add_one_rows(fx.Tensor(fx.make_view(fx.inttoptr(f32_global, x_addr), layout)),
                  fx.Tensor(fx.make_view(fx.inttoptr(f32_global, out_addr), layout)), m, N)


@flyc.jit
def add_one_addr(x: fx.Pointer, out: fx.Pointer, m: fx.Int32, N: fx.Constexpr[int],
                 stream: fx.Stream = fx.Stream(None)):
    """``add_one_ptr`` with the operands reaching the kernel as 64-bit addresses (``fx.ptrtoint`` in the launcher,
    ``fx.inttoptr`` in the kernel), as upstream's MXFP4 preshuffle GEMM passes them: each kernel argument is the
    pointer's 8 bytes, by value."""
    grid = m * ((N + TILE_N - 1) // TILE_N)
    add_one_addr_kernel(fx.Int64(fx.ptrtoint(x)), fx.Int64(fx.ptrtoint(out)), m, N).launch(
        grid=(grid, 1, 1), block=(TILE_N, 1, 1), stream=stream)
