"""Run the training kernels (examples/triton/tl_training.py) under Triton's interpreter on the CPU, in float32 and
bfloat16, against the bundle's references (examples/triton/training_references.py): the kernels' math, the in-place
writes of the backward kernels and of the in-place forwards (rope_inplace, ce_fwd_inplace), ignored rows written
as zeros and a NaN loss for a target outside the vocabulary.

Run by tests/compiler/test_training_kernels.py in a subprocess (TRITON_INTERPRET must be set before triton is
imported). Triton 3.6's interpreter hands scalar kernel arguments to ``range`` as one-element arrays, which Python's
``range`` refuses; the kernels' module gets a ``range`` that takes them (the compiled kernels are unchanged).
"""
import os, sys
os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples", "triton"))
import torch, triton
import builtins
_range = builtins.range
def _int(v):
    h = getattr(v, "handle", None)
    return int(h.data.reshape(-1)[0]) if h is not None else int(v)
class _R:
    def __call__(self, *a):
        return _range(*[_int(x) for x in a])
import tl_training as _K0
_K0.ce_fwd_kernel.fn.__globals__["range"] = _R()
import tl_training as K
import training_references as R
torch.manual_seed(0)
def close(a, b, tol=1e-5):
    err = (a.float() - b.float()).abs().max().item(); sc = b.float().abs().max().item()
    assert err <= tol * max(sc, 1e-30), (err, sc)
for dt, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
    a, b = torch.randn(37, 100, dtype=dt), torch.randn(37, 100, dtype=dt)
    c = torch.empty_like(a); n = a.numel()
    K.swiglu_fwd_kernel[(triton.cdiv(n, 1024),)](a, b, c, n, BLOCK=1024); close(c, R.swiglu_ref(a, b), tol)
    dc = torch.randn_like(a); a1, b1, a2, b2 = a.clone(), b.clone(), a.clone(), b.clone()
    K.swiglu_bwd_kernel[(triton.cdiv(n, 1024),)](dc, a1, b1, n, BLOCK=1024); R.swiglu_bwd_ref(dc, a2, b2)
    close(a1, a2, tol); close(b1, b2, tol)
    q = torch.randn(9, 3, 128, dtype=dt); cs, sn = torch.rand(9, 64), torch.rand(9, 64); out = torch.empty_like(q)
    K.rope_fwd_kernel[(9, 3)](q, out, cs, sn, q.stride(0), q.stride(1), out.stride(0), out.stride(1), cs.stride(0), 64, BLOCK_H=64)
    close(out, R.rope_ref(q, cs, sn), tol)
    d1, d2 = q.clone(), q.clone()
    K.rope_bwd_kernel[(9, 3)](d1, cs, sn, d1.stride(0), d1.stride(1), cs.stride(0), 64, BLOCK_H=64); R.rope_bwd_ref(d2, cs, sn)
    close(d1, d2, tol)
    q1, q2 = q.clone(), q.clone()  # the in-place forward: q rotated in its own memory
    K.rope_inplace_kernel[(9, 3)](q1, cs, sn, q1.stride(0), q1.stride(1), cs.stride(0), 64, BLOCK_H=64)
    R.rope_inplace_ref(q2, cs, sn); close(q1, q2, tol); close(q1, R.rope_ref(q, cs, sn), tol)
    logits = torch.randn(6, 5000, dtype=dt); t = torch.randint(0, 5000, (6,)); t[1] = -100; t[3] = 7000
    loss = torch.empty(6); dl = torch.empty_like(logits)
    K.ce_fwd_kernel[(6,)](logits, t, loss, dl, logits.stride(0), dl.stride(0), 5000, -100, BLOCK=2048)
    tt = t.clone(); tt[3] = 5
    rl, rg = R.ce_fwd_ref(logits, torch.where(t == 7000, 5, t))
    assert torch.isnan(loss[3]) and loss[1] == 0
    m = torch.tensor([1, 1, 1, 0, 1, 1], dtype=torch.bool)
    close(loss[m], rl[m], 1e-5); close(dl[m], rg[m], tol)
    l1, loss1 = logits.clone(), torch.empty(6)  # the in-place forward: the gradient written over the logits
    K.ce_fwd_inplace_kernel[(6,)](l1, t, loss1, l1.stride(0), 5000, -100, BLOCK=2048)
    assert torch.isnan(loss1[3]) and loss1[1] == 0 and (l1[1] == 0).all()
    close(loss1[m], rl[m], 1e-5); close(l1[m], rg[m], tol)
    g = torch.rand(6); e1, e2 = dl.clone(), dl.clone()
    K.ce_bwd_kernel[(6,)](e1, g, e1.stride(0), 5000, BLOCK=2048); R.ce_bwd_ref(e2, g); close(e1[m], e2[m], tol)
    x, w = torch.randn(70, 300, dtype=dt), torch.randn(300, dtype=dt); y = torch.empty_like(x)
    K.scale_fwd_kernel[(70, 1)](x, w, y, x.stride(0), y.stride(0), 300, BLOCK_N=1024); close(y, R.scale_ref(x, w), tol)
    dy = torch.randn_like(x); dx = torch.empty_like(x); p = torch.empty(3, 300)
    K.scale_bwd_kernel[(3, 2)](dy, x, w, dx, p, dy.stride(0), x.stride(0), dx.stride(0), p.stride(0), 70, 300, ROWS=32, BLOCK_N=256)
    rdx, rp = R.scale_bwd_partial_ref(dy, x, w); close(dx, rdx, tol); close(p, rp, 1e-5)
    print(dt, "ok")
