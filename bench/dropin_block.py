"""End-to-end drop-in on a GPU: a small transformer block whose RMSNorm and attention softmax are patched
with the Triton example ops (``examples/triton``: ``rmsnorm``, ``softmax``), timed in the four arms.

    flyc-build examples/triton/ops.py -o artifacts/triton --arch sm_90 --arch gfx942     # build Python
    python bench/dropin_block.py --bundle artifacts/triton --out /tmp/dropin               # workload Python, GPU

The model is plain PyTorch (the "user's code"); ``flyship.patch`` replaces ``RMSNorm.forward`` and
``attention_probs`` in this module. The script checks that the patched block agrees with the baseline,
that the patched sites really reached the ops (routing report and the ops' launch counters), then runs
:func:`flyship.bench`: baseline, patched, compiled, patched+compiled (warm-up and compilation excluded,
interleaved repeats, medians). Writes ``dropin_block.json`` and ``dropin_block.md`` to ``--out``; the
table goes into docs/perf.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import torch
from torch import nn

import flyship


class RMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        xf = hidden_states.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * self.weight.float()).to(hidden_states.dtype)


def attention_probs(scores: torch.Tensor) -> torch.Tensor:
    return torch.softmax(scores.float(), dim=-1).to(scores.dtype)


class Block(nn.Module):
    """Pre-norm attention (explicit scores -> softmax -> values) and a GELU MLP, as in a GPT-style layer."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = RMSNorm(hidden), RMSNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.proj = nn.Linear(hidden, hidden, bias=False)
        self.up = nn.Linear(hidden, 4 * hidden, bias=False)
        self.down = nn.Linear(4 * hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-1, -2)) * (h // self.heads) ** -0.5
        attn = (attention_probs(scores) @ v).transpose(1, 2).reshape(b, s, h)
        x = x + self.proj(attn)
        return x + self.down(nn.functional.gelu(self.up(self.norm2(x))))


def rows(name: str):
    """An args source: the parameter ``name`` viewed as rows (the ops take 2-D tensors)."""
    return lambda bound: bound[name].reshape(-1, bound[name].shape[-1])


def make_patches(ops, cpu_target: str | None = None) -> list:
    """The two patches (``cpu_target``: for the CPU test of this script's wiring)."""
    module = __name__
    return [
        flyship.patch(f"{module}:RMSNorm.forward", ops.rmsnorm,
                      args={"x": rows("hidden_states"), "w": "self.weight", "eps": "self.eps"},
                      result=lambda out, bound: out.view_as(bound["hidden_states"]), cpu_target=cpu_target),
        flyship.patch(f"{module}:attention_probs", ops.softmax, args={"x": rows("scores")},
                      result=lambda out, bound: out.view_as(bound["scores"]), cpu_target=cpu_target),
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", default="artifacts/triton")
    ap.add_argument("--out", type=Path, default=Path("/tmp/dropin_block"))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--iters", type=int, default=20)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("dropin_block: needs a GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 1
    dtype = getattr(torch, a.dtype)
    ops = flyship.load(a.bundle)
    torch.manual_seed(0)
    model = Block(a.hidden, a.heads).to("cuda", dtype).eval()
    x = torch.randn(a.batch, a.seq, a.hidden, device="cuda", dtype=dtype)

    with torch.no_grad():
        want = model(x)
        patches = make_patches(ops)
        for op in (ops.rmsnorm, ops.softmax):
            op.reset_stats()
        got = model(x)
    tol = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 5e-2}[dtype]
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)
    report = flyship.routing_report()
    launched = {op.name: sum(op.stats()["launches"].values()) for op in (ops.rmsnorm, ops.softmax)}
    routed = {s["target"]: (s["to_op"], s["to_original"]) for s in report["sites"]}
    print(f"routing after one call: {routed}; launches {launched}")
    if launched["rmsnorm"] != 2 or launched["softmax"] != 1:
        print("dropin_block: the patched block did not launch the kernels (see the routing above)", file=sys.stderr)
        return 1

    result = flyship.bench(model, x, patches=patches, repeats=a.repeats, iters=a.iters)
    for p in patches:
        p.undo()
    table = result.table()
    print(table)
    a.out.mkdir(parents=True, exist_ok=True)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "python": platform.python_version(),
            "shape": [a.batch, a.seq, a.hidden], "heads": a.heads, "dtype": a.dtype, "repeats": a.repeats,
            "iters": a.iters, "routing": flyship.routing_report(), "arms": result.as_dict()}
    (a.out / "dropin_block.json").write_text(json.dumps(meta, indent=1, default=str))
    (a.out / "dropin_block.md").write_text(
        f"{meta['device']}, torch {meta['torch']}, x {tuple(meta['shape'])} {a.dtype}, {a.heads} heads\n\n"
        f"```\n{table}\n```\n")
    print(f"wrote {a.out}/dropin_block.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
