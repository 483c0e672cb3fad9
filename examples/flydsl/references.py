# SPDX-License-Identifier: Apache-2.0
"""Pure-PyTorch references for the FlyDSL example kernels (imports torch only).

Argument order/meaning matches the launchers' inputs; outputs are returned
instead of written.  Every reference computes in float32 and casts back to
the input dtype, like the kernels do.

    elementwise.add(x, y, out)          <->  add_ref(x, y)
    softmax.softmax(x, out)             <->  softmax_ref(x)
    softmax.softmax_bwd(dy, y, dx)      <->  softmax_bwd_ref(dy, y) = y * (dy - sum(dy * y, -1))
    rmsnorm.rmsnorm(x, w, out, eps)     <->  rmsnorm_ref(x, w, eps)
    gemm.gemm(a, b, c)   (b is [N, K])  <->  gemm_ref(a, b)   = a @ b.T
"""

import torch


def add_ref(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (x.float() + y.float()).to(x.dtype)


def softmax_ref(x: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    xf = xf - xf.amax(dim=-1, keepdim=True)
    e = torch.exp(xf)
    return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)


def softmax_bwd_ref(dy: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    g, p = dy.float(), y.float()
    return (p * (g - (g * p).sum(dim=-1, keepdim=True))).to(y.dtype)


def rmsnorm_ref(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (xf * rstd * w.float()).to(x.dtype)


def gemm_ref(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """C[M, N] = A[M, K] @ B[N, K]^T  (B is given as [N, K], like the kernel)."""
    return (a.float() @ b.float().t()).to(a.dtype)


# Tolerances that fit the kernels' arithmetic (f32 math; 16-bit rounding of I/O).
TOLERANCES = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
}


def scale_ref(x: torch.Tensor, alpha: float) -> torch.Tensor:
    return (x.float() * alpha).to(x.dtype)


def dequant_fp8_ref(x: torch.Tensor, scale: float) -> torch.Tensor:
    """dequant_fp8 (pertarget.py): x in either fp8 E4M3 format, decoded as its dtype says, times scale in float32."""
    return x.float() * scale


def add_one_rows_ref(x: torch.Tensor) -> torch.Tensor:
    return x + 1


def divide_ref(x: torch.Tensor, alpha: float) -> torch.Tensor:
    return x / alpha


def scale_add_one_ref(x: torch.Tensor, alpha: float) -> torch.Tensor:
    """scale_add_one (patterns.py, two launches): alpha * x rounded to float32, then + 1."""
    return (x * alpha) + 1


def scale_and_add_one_ref(x: torch.Tensor, alpha: float) -> tuple[torch.Tensor, torch.Tensor]:
    """scale_and_add_one (patterns.py, two launchers): scaled = alpha * x, and out = scaled + 1."""
    scaled = x * alpha
    return scaled, scaled + 1


def fused_add_rmsnorm_ref(x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """residual += x IN PLACE (as the kernel does); returns rmsnorm(residual) * w."""
    residual.add_(x)
    h = residual.float()
    return (h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def colsum_ref(x: torch.Tensor) -> torch.Tensor:
    """out[n] = sum over m of x[m, n], in float32 (the kernel adds atomically into a zero-filled output)."""
    return x.float().sum(dim=0).to(x.dtype)
