# SPDX-License-Identifier: Apache-2.0
"""GEMM ``C[M, N] = A[M, K] @ B[N, K]^T`` with ``tl.dot`` (Triton 3.6), two kernels.

B is given transposed, (N, K) (the ``nn.Linear`` weight layout), so both operands are K-contiguous,
like ``examples/flydsl/gemm.py`` and ``references.gemm_ref``. Accumulation is float32; C has A's dtype
(bfloat16 or float16).

``gemm_kernel(a, b, c, M, N, K, stride_am, stride_bn, stride_cm, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)``

* Pointer arithmetic with masks on M, N and K: any shape works (no tile-multiple requirement). Row
  strides are runtime values; the K dim of a and b and the N dim of c must be contiguous.
* 1-D grid of ``cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N)`` programs in grouped order (``GROUP_M`` row
  blocks share B tiles in L2).

``gemm_tma_kernel(a, b, c, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K)``

* Builds device-side tensor descriptors with ``tl.make_tensor_descriptor``. On NVIDIA sm_90 these are
  TMA descriptors that the kernel writes into *global scratch memory* (128 bytes each, 128-byte
  aligned): the kernel takes Triton's hidden global-scratch pointer and needs
  ``grid programs x global_scratch_size`` bytes of it per launch. On AMD Triton lowers the same code
  to plain pointer loads (no scratch).
* Out-of-bounds tiles are zero-filled on load and clipped on store by the descriptor, so any M, N, K
  work, but TMA needs contiguous tensors, 16-byte aligned base pointers and row pitches that are a
  multiple of 16 bytes (K and N multiples of 8 for 16-bit types): the spec guards all of that.
* 2-D grid ``(cdiv(M, BLOCK_M), cdiv(N, BLOCK_N))``.
"""

import triton
import triton.language as tl


@triton.jit
def gemm_kernel(a, b, c, M, N, K, stride_am, stride_bn, stride_cm,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    group_size = GROUP_M * num_pid_n
    first_m = (pid // group_size) * GROUP_M
    group_m = min(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group_size) % group_m
    pid_n = (pid % group_size) // group_m

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a + offs_m[:, None].to(tl.int64) * stride_am + offs_k[None, :]
    b_ptrs = b + offs_n[None, :].to(tl.int64) * stride_bn + offs_k[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a_tile = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < k_left), other=0.0)
        b_tile = tl.load(b_ptrs, mask=(offs_n[None, :] < N) & (offs_k[:, None] < k_left), other=0.0)
        acc = tl.dot(a_tile, b_tile, acc)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    c_ptrs = c + offs_m[:, None].to(tl.int64) * stride_cm + offs_n[None, :]
    tl.store(c_ptrs, acc.to(c.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def gemm_tma_kernel(a, b, c, M, N, K,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    a_desc = tl.make_tensor_descriptor(a, shape=[M, K], strides=[K, 1], block_shape=[BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(b, shape=[N, K], strides=[K, 1], block_shape=[BLOCK_N, BLOCK_K])
    c_desc = tl.make_tensor_descriptor(c, shape=[M, N], strides=[N, 1], block_shape=[BLOCK_M, BLOCK_N])
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a_tile = a_desc.load([pid_m * BLOCK_M, k * BLOCK_K])
        b_tile = b_desc.load([pid_n * BLOCK_N, k * BLOCK_K])
        acc = tl.dot(a_tile, b_tile.T, acc)
    c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(c_desc.dtype))


def gemm_grid(meta: dict, M: int, N: int) -> tuple[int]:
    """Triton's own grid function for ``gemm_kernel[grid](...)``."""
    return (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)


def gemm_tma_grid(meta: dict, M: int, N: int) -> tuple[int, int]:
    """Triton's own grid function for ``gemm_tma_kernel[grid](...)``."""
    return (triton.cdiv(M, meta["BLOCK_M"]), triton.cdiv(N, meta["BLOCK_N"]))
