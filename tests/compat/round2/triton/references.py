# SPDX-License-Identifier: Apache-2.0
"""PyTorch references of the Triton example ops (imports torch only: copied into the bundle).

Each takes the op's inputs in schema order (``ops.py``) and returns its output; the math is float32 and
the result is cast back to the input dtype, as the kernels do.

    add(x, y)             add_ref(x, y)          x + y
    softmax(x)            softmax_ref(x)         softmax over the last dim
    softmax_bwd(dy, y)    softmax_bwd_ref(dy, y) y * (dy - sum(dy * y, -1)): the gradient of softmax's input
    rmsnorm(x, w, eps)    rmsnorm_ref(x, w, eps) x * rsqrt(mean(x**2, -1) + eps) * w
    gemm(a, b)            gemm_ref(a, b)         a @ b.T  (b is (N, K), the nn.Linear weight layout)
    gemm_tma(a, b)        gemm_ref(a, b)
    rowsum(x)             rowsum_ref(x)          x.sum(dim=1)  (persistent.py; rowsum_atomic in multilaunch.py;
                                                 rowsum_atomic_out in ops.py)
    rowsum_split(x)       rowsum_f32_ref(x)      x.float().sum(dim=1)  (multilaunch.py)
    fused_add_rmsnorm(x, residual, w, eps)       residual += x IN PLACE; returns rmsnorm(residual) * w
    accumulate(acc, x, alpha)                    acc += alpha * x IN PLACE; returns None

A reference of an op with an in-place input writes that input in place, as the kernel does, and returns only the
op's outputs.
"""

import torch


def add_ref(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (x.float() + y.float()).to(x.dtype)


def softmax_ref(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x.float(), dim=-1).to(x.dtype)


def softmax_bwd_ref(dy: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    g, p = dy.float(), y.float()
    return (p * (g - (g * p).sum(dim=-1, keepdim=True))).to(y.dtype)


def rmsnorm_ref(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def gemm_ref(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.float() @ b.float().t()).to(a.dtype)


# Tolerances for comparing a kernel with its reference, per dtype (float32 math, 16-bit rounding of I/O).
TOLERANCES = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
}


def rowsum_ref(x: torch.Tensor) -> torch.Tensor:
    return x.sum(dim=1)


def rowsum_f32_ref(x: torch.Tensor) -> torch.Tensor:
    """rowsum_split (multilaunch.py): the row sums in float32 whatever x's dtype."""
    return x.float().sum(dim=1)


def fused_add_rmsnorm_ref(x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    h = (x.float() + residual.float()).to(residual.dtype)
    residual.copy_(h)
    hf = h.float()
    return (hf * torch.rsqrt(hf.pow(2).mean(dim=-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def accumulate_ref(acc: torch.Tensor, x: torch.Tensor, alpha: float = 1.0) -> None:
    acc.copy_((acc.float() + alpha * x.float()).to(acc.dtype))


def rmsnorm_bwd_ref(dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """rmsnorm_bwd (workspaces.py): dx and dw of out = x * rsqrt(mean(x**2, -1) + eps) * w, math in float32."""
    xf, dyf, wf = x.float(), dy.float(), w.float()
    rstd = torch.rsqrt(xf.pow(2).mean(dim=1, keepdim=True) + eps)
    xhat = xf * rstd
    wdy = wf * dyf
    dx = (wdy - xhat * (xhat * wdy).mean(dim=1, keepdim=True)) * rstd
    return dx.to(x.dtype), (dyf * xhat).sum(dim=0).to(w.dtype)


def add3_ref(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """add3 (workspaces.py): (x + y) + z, the sum x + y kept in float32 as the kernel's workspace does."""
    return ((x.float() + y.float()) + z.float()).to(x.dtype)
