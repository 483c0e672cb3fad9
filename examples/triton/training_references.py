# SPDX-License-Identifier: Apache-2.0
"""PyTorch references and composites of the training ops (examples/triton/training.py); imports torch only.

Copied into the bundle as ``references.py`` and checked by its sha256. The references are the yardstick and the
fallback of the kernel ops; a reference of an op that writes an input in place writes it in place too. The
composites (``cross_entropy``, ``swiglu``, ``rope``) are the training ops a user calls: each composes the bundle's
ops (``ops``: ``torch.ops.<namespace>``) with torch ops, and trains through the ops' autograd pairs.
"""

import torch
import torch.nn.functional as F


def _up(t: torch.Tensor) -> torch.Tensor:
    """The math dtype: float32 for 16-bit floats (what the kernels compute in), the tensor's own dtype otherwise (a
    float64 call, as torch.autograd.gradcheck makes, stays float64)."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def swiglu_ref(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (F.silu(_up(a)) * _up(b)).to(a.dtype)


def swiglu_bwd_ref(dc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """Writes da into a and db into b."""
    af, bf, g = _up(a), _up(b), _up(dc)
    sig = torch.sigmoid(af)
    da = g * bf * sig * (1.0 + af * (1.0 - sig))
    db = g * af * sig
    a.copy_(da.to(a.dtype))
    b.copy_(db.to(b.dtype))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE of x (T, H, D) by cos/sin (T, D/2), in float32."""
    half = x.shape[-1] // 2
    x1, x2 = _up(x[..., :half]), _up(x[..., half:])
    c, s = cos.to(x1.dtype)[:, None, :], sin.to(x1.dtype)[:, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def rope_ref(q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return _rotate(q, cos, sin).to(q.dtype)


def rope_bwd_ref(dq: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """The inverse rotation, written into dq."""
    dq.copy_(_rotate(dq, cos, -sin).to(dq.dtype))


def ce_fwd_ref(logits: torch.Tensor, target: torch.Tensor,
               ignore_index: int = -100) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row loss (float32, 0 on ignored rows) and its gradient softmax - onehot (zero rows where ignored)."""
    x = _up(logits)
    keep = target != ignore_index
    safe = torch.where(keep, target, torch.zeros_like(target))
    lse = torch.logsumexp(x, dim=-1)
    loss = torch.where(keep, lse - x.gather(1, safe[:, None]).squeeze(1), torch.zeros_like(lse))
    grad = torch.softmax(x, dim=-1)
    grad = grad - F.one_hot(safe, x.shape[1]).to(grad.dtype)
    grad = torch.where(keep[:, None], grad, torch.zeros_like(grad))
    return loss.float(), grad.to(logits.dtype)


def rope_inplace_ref(q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """rope_ref written into q (the in-place forward of an autograd pair)."""
    q.copy_(_rotate(q, cos, sin).to(q.dtype))


def ce_fwd_inplace_ref(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """ce_fwd_ref's loss; its gradient is written over logits (the in-place forward of an autograd pair)."""
    loss, grad = ce_fwd_ref(logits, target, ignore_index)
    logits.copy_(grad)
    return loss


def ce_bwd_ref(dlogits: torch.Tensor, g: torch.Tensor) -> None:
    """Scales each row of dlogits by g, in place."""
    dlogits.copy_((_up(dlogits) * g.to(_up(dlogits).dtype)[:, None]).to(dlogits.dtype))


SCALE_ROWS = 32  # rows per program of scale_bwd_kernel: one partial row each (the spec's ROWS)


def scale_ref(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (_up(x) * _up(w)).to(x.dtype)


def scale_bwd_partial_ref(dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """dx, and the float32 sums of dy * x over each block of SCALE_ROWS rows."""
    dx = (_up(dy) * _up(w)).to(dy.dtype)
    prod = (_up(dy) * _up(x)).float()
    blocks = -(-x.shape[0] // SCALE_ROWS)
    pad = torch.zeros(blocks * SCALE_ROWS - x.shape[0], x.shape[1], dtype=prod.dtype, device=prod.device)
    return dx, torch.cat([prod, pad]).view(blocks, SCALE_ROWS, x.shape[1]).sum(1)


# -- composites: ops = torch.ops.<namespace> -----------------------------------------------------------------------


def cross_entropy(ops, logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Mean cross-entropy over the rows whose target is not ignore_index (torch's reduction="mean"). The host step
    between launches is the count of rows that count; the gradient buffer the forward wrote is scaled in place by the
    backward (the op's dlogits output is dropped here, so the backward owns it)."""
    loss, _ = ops.ce_fwd(logits, target, ignore_index)
    count = (target != ignore_index).sum()
    return loss.sum() / count


def swiglu(ops, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """silu(a) * b; its backward writes da into a and db into b when nothing else holds them."""
    return ops.swiglu_fwd(a, b)


def rope(ops, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
         ) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE of queries and keys; the backward rotates the incoming gradients in place."""
    return ops.rope_fwd(q, cos, sin), ops.rope_fwd(k, cos, sin)


def scale_bwd(ops, dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """scale's backward: the kernel's dx and partial sums, then the host step that finishes dw."""
    dx, partial = ops.scale_bwd_partial(dy, x, w)
    return dx, partial.sum(0).to(w.dtype)
