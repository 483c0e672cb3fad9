# SPDX-License-Identifier: Apache-2.0
"""Version-portable FlyDSL kernels: one source that every FlyDSL release from 0.1.5 to 0.5.0 compiles.

Three kernels, float32, each a ``@flyc.kernel`` plus a ``@flyc.jit`` launcher (inputs, outputs, stream):

* ``add(x, y, out)``: 1-D elementwise ``out = x + y``; 256 threads per workgroup, one element each;
  the tail is predicated (``if i < n``), so any length works. grid = (cdiv(n, 256), 1, 1).
* ``row_sum(x, out)``: row reduction, ``out[r] = sum(x[r, :])`` for a 2-D ``x``; one thread per row,
  64 rows per workgroup, a runtime loop over the columns with a one-element register accumulator.
  grid = (cdiv(M, 64), 1, 1).
* ``block_sum(x, out)``: 1-D partial sums through LDS; workgroup ``b`` writes
  ``out[b] = sum(x[256 b : 256 b + 256])`` after a tree reduction in 1 KiB of LDS (eight halving
  steps, a barrier after each). grid = (cdiv(n, 256), 1, 1); ``out`` has cdiv(n, 256) elements.

The authoring API drifted between releases (FIELD-NOTES, docs/flydsl-versions.md); these kernels use
only what every release has, and the two helpers below bridge the rest:

* a layout's shape: ``IntTuple.unpack()`` (0.2.0 and later) or ``IntTuple.to_py_value()`` (0.1.x);
* a register tensor: ``fx.make_rmem_tensor`` (0.1.8 and later) or ``fx.memref_alloca`` (0.1.x).

LDS comes from ``SmemAllocator``/``SmemPtr`` (``flydsl.utils.smem_allocator``; 0.5.0 still has them and
warns that they are legacy), with the allocator's global emitted into the GPU module by the launcher.
``SmemPtr.load``/``store`` are called through the class, not the instance: FlyDSL's rewriting of a
runtime ``if`` refuses a Python object that a branch might mutate.

What the tensors become differs by release, not by source: before 0.2.0 a torch tensor is a static
layout (the kernel is specialized to the example shape; the kernel argument is a bare pointer), from
0.2.0 a dynamic layout (pointer + shape/stride struct; any shape).
"""

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl._mlir.ir import InsertionPoint
from flydsl.compiler.kernel_function import CompilationContext
from flydsl.utils.smem_allocator import SmemAllocator, SmemPtr

BLOCK = 256  # add, block_sum: threads per workgroup (one element each)
ROWS_PER_BLOCK = 64  # row_sum: rows (threads) per workgroup
LDS_STEPS = 8  # log2(BLOCK) halving steps of the block_sum tree


def dims(t):
    """A tensor's shape as Python values (ints for static entries, DSL integers for dynamic ones)."""
    s = t.shape
    return s.unpack() if hasattr(s, "unpack") else s.to_py_value()


def rmem_f32():
    """A one-element float32 register tensor."""
    if hasattr(fx, "make_rmem_tensor"):
        return fx.make_rmem_tensor(1, fx.Float32)
    ty = fx.MemRefType.get(fx.Float32.ir_type, fx.LayoutType.get(1, 1), fx.AddressSpace.Register)
    return fx.memref_alloca(ty, fx.make_layout(1, 1))


# -- elementwise, predicated tail ------------------------------------------------------------------

@flyc.kernel
def add_kernel(X: fx.Tensor, Y: fx.Tensor, Out: fx.Tensor):
    i = fx.block_idx.x * BLOCK + fx.thread_idx.x
    n = dims(X)
    if i < n:
        Out[i] = X[i] + Y[i]


@flyc.jit
def add(x: fx.Tensor, y: fx.Tensor, out: fx.Tensor, stream: fx.Stream = fx.Stream(None)):
    n = dims(x)
    add_kernel(x, y, out).launch(grid=((n + BLOCK - 1) // BLOCK, 1, 1), block=(BLOCK, 1, 1), stream=stream)


# -- row reduction ---------------------------------------------------------------------------------

@flyc.kernel
def row_sum_kernel(X: fx.Tensor, Out: fx.Tensor):
    r = fx.block_idx.x * ROWS_PER_BLOCK + fx.thread_idx.x
    m, n = dims(X)
    if r < m:
        acc = rmem_f32()
        acc[0] = fx.Float32(0.0)
        for j in range(n):
            acc[0] = acc[0] + X[r, j]
        Out[r] = acc[0]


@flyc.jit
def row_sum(x: fx.Tensor, out: fx.Tensor, stream: fx.Stream = fx.Stream(None)):
    m, _n = dims(x)
    row_sum_kernel(x, out).launch(grid=((m + ROWS_PER_BLOCK - 1) // ROWS_PER_BLOCK, 1, 1),
                                  block=(ROWS_PER_BLOCK, 1, 1), stream=stream)


# -- LDS: block partial sums -----------------------------------------------------------------------

_lds = SmemAllocator(None, global_sym_name="block_sum_lds")
_lds.ptr = BLOCK * 4  # BLOCK float32 slots


@flyc.kernel
def block_sum_kernel(X: fx.Tensor, Out: fx.Tensor):
    tid = fx.thread_idx.x
    bid = fx.block_idx.x
    i = bid * BLOCK + tid
    n = dims(X)
    s = SmemPtr(_lds.get_base(), 0, fx.Float32.ir_type, shape=(BLOCK,))
    SmemPtr.store(s, fx.Float32(0.0), [tid])
    if i < n:
        SmemPtr.store(s, X[i], [tid])
    fx.barrier()
    for k in fx.range_constexpr(LDS_STEPS):
        half = BLOCK >> (k + 1)
        if tid < half:
            SmemPtr.store(s, fx.Float32(SmemPtr.load(s, [tid])) + fx.Float32(SmemPtr.load(s, [tid + half])), [tid])
        fx.barrier()
    if tid == 0:
        Out[bid] = fx.Float32(SmemPtr.load(s, [0]))


@flyc.jit
def block_sum(x: fx.Tensor, out: fx.Tensor, stream: fx.Stream = fx.Stream(None)):
    _lds.finalized = False  # one LDS global per traced GPU module
    with InsertionPoint(CompilationContext.get_current().gpu_module_body):
        _lds.finalize()
    n = dims(x)
    block_sum_kernel(x, out).launch(grid=((n + BLOCK - 1) // BLOCK, 1, 1), block=(BLOCK, 1, 1), stream=stream)
