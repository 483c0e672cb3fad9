"""Autograd pairs whose forward writes its input in place (issue 34 item 3) against the same kernels called as plain
in-place ops: a training step's forward + backward of RoPE and of cross-entropy, on a GPU.

    flyc-build examples/triton/training.py -o artifacts/training --arch sm_90
    python3 bench/inplace_pair.py --bundle artifacts/training --out /tmp/out

Per family, three paths run the same torch ops around the flyship kernels, so the ratio is the cost of the pair
itself (its autograd node, saved tensors, the version count, the private-buffer check):

* ``pair`` (in-place forward): ``q = w * 1``, ``ops.rope_inplace(q, cos, sin)``, ``(q * c).sum().backward()``
  (cross-entropy: ``ops.ce_fwd_inplace(w * 1, t)``, ``(loss.sum() / n).backward()``); the backward kernel gets the
  incoming gradient (RoPE) or the logits buffer the forward wrote (cross-entropy) without a copy, as nothing else
  holds them;
* ``plain`` (no autograd): the same kernels as plain in-place ops under ``no_grad``, and the backward's torch ops
  written out (the gradient of ``(q * c).sum()`` is ``c``; the gradient of ``w * 1`` is the incoming one, assigned to
  ``w.grad`` as autograd's accumulation does for a fresh gradient);
* ``copy-first pair`` (what a port did before 5.0): the out-of-place pairs ``rope_fwd`` / ``ce_fwd``, whose forward
  writes a fresh output.

Each path is timed as ``calls`` back-to-back steps (wall time including the final synchronize: the GPU's time when
the steps are large enough to keep it busy), in ``repeats`` interleaved rounds (every path once per round); the
ratios are medians of per-round ratios. The issue's target: ``pair / plain <= 1.05``. Before timing, each path's
gradient is checked against the plain one. ``--device cpu`` runs the same paths on the CPU path (the references,
small shapes): a check of the bench's mechanics, not a measurement. Writes ``inplace_pair.json`` and
``inplace_pair.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Optional

ROOT = Path(__file__).resolve().parents[1]

# (tokens, heads, head dim) of RoPE and (rows, vocabulary) of cross-entropy: a training step's sizes (bf16), and
# small ones for the CPU mechanics check.
SIZES = {"cuda": {"rope": (8192, 32, 128), "ce": (8192, 32000)}, "cpu": {"rope": (16, 4, 64), "ce": (8, 300)}}
TARGET = 1.05


def rope_paths(ops: Any, device: str, dtype: Any) -> dict[str, Callable[[], Any]]:
    """The three RoPE steps; each returns the gradient of ``w``."""
    import torch

    t, h, d = SIZES[device]["rope"]
    theta = torch.randn(t, d // 2, device=device)
    cos, sin = theta.cos(), theta.sin()
    w = torch.randn(t, h, d, device=device, dtype=dtype, requires_grad=True)
    c = torch.randn(t, h, d, device=device, dtype=dtype)

    def pair() -> Any:
        w.grad = None
        q = w * 1
        ops.rope_inplace(q, cos, sin)
        (q * c).sum().backward()
        return w.grad

    def plain() -> Any:
        with torch.no_grad():
            q = w * 1
            ops.rope_inplace(q, cos, sin)
            (q * c).sum()
            dq = c * torch.ones((), device=device, dtype=dtype)  # the gradient of (q * c).sum(): c, as a fresh buffer
            ops.rope_bwd(dq, cos, sin)
            w.grad = dq * 1
        return w.grad

    def copy_first() -> Any:
        w.grad = None
        q = w * 1
        (ops.rope_fwd(q, cos, sin) * c).sum().backward()
        return w.grad

    return {"pair": pair, "plain": plain, "copy-first pair": copy_first}


def ce_paths(ops: Any, device: str, dtype: Any) -> dict[str, Callable[[], Any]]:
    """The three cross-entropy steps (mean over rows); each returns the gradient of ``w``."""
    import torch

    rows, vocab = SIZES[device]["ce"]
    w = torch.randn(rows, vocab, device=device, dtype=dtype, requires_grad=True)
    target = torch.randint(0, vocab, (rows,), device=device)

    def pair() -> Any:
        w.grad = None
        loss = ops.ce_fwd_inplace(w * 1, target)  # the logits are dropped: the backward scales them in place
        (loss.sum() / rows).backward()
        return w.grad

    def plain() -> Any:
        with torch.no_grad():
            logits = w * 1
            loss = ops.ce_fwd_inplace(logits, target)
            loss.sum() / rows
            g = torch.full((rows,), 1.0 / rows, device=device)  # the gradient of loss.sum() / rows
            ops.ce_bwd(logits, g)
            w.grad = logits * 1
        return w.grad

    def copy_first() -> Any:
        w.grad = None
        loss, _ = ops.ce_fwd(w * 1, target)
        (loss.sum() / rows).backward()
        return w.grad

    return {"pair": pair, "plain": plain, "copy-first pair": copy_first}


def check_same(paths: dict[str, Callable[[], Any]], family: str) -> None:
    """Every path gives the plain path's gradient (bf16 rounding apart)."""
    import torch

    want = paths["plain"]().float().clone()
    for name, fn in paths.items():
        got = fn().float()
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2, msg=lambda m: f"{family} {name}: {m}")


def interleaved_ms(paths: dict[str, Callable[[], Any]], calls: int, repeats: int,
                   sync: Callable[[], None]) -> dict[str, list[float]]:
    """Milliseconds per step of each path, ``repeats`` rounds of ``calls`` steps; each round times every path once,
    in turn, so drift spreads over all paths alike."""
    for fn in paths.values():
        for _ in range(3):
            fn()
    sync()
    out: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(repeats):
        for name, fn in paths.items():
            sync()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            sync()
            out[name].append((time.perf_counter() - t0) / calls * 1e3)
    return out


def ratios(ms: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """Per-round ratios to the plain path: median, min, max."""
    out = {}
    for name in ms:
        if name == "plain":
            continue
        r = [a / b for a, b in zip(ms[name], ms["plain"])]
        out[f"{name} / plain"] = {"median": statistics.median(r), "min": min(r), "max": max(r)}
    return out


def markdown(results: dict[str, Any], meta: dict[str, Any]) -> str:
    lines = [f"# In-place forward pairs vs plain in-place ops ({meta['device']}, {meta['dtype']})", "",
             f"torch {meta['torch']}, {meta['calls']} steps x {meta['repeats']} interleaved rounds; target "
             f"pair / plain <= {TARGET}", "",
             "| family | path | ms per step (median) | ratio to plain (median, min-max) |",
             "|---|---|---|---|"]
    for family, r in results.items():
        for name, ms in r["ms"].items():
            ratio = r["ratios"].get(f"{name} / plain")
            shown = "1" if ratio is None else f"{ratio['median']:.3f} ({ratio['min']:.3f}-{ratio['max']:.3f})"
            lines.append(f"| {family} | {name} | {statistics.median(ms):.3f} | {shown} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bundle", default=str(ROOT / "artifacts" / "training"), help="the training bundle")
    ap.add_argument("--out", default="/tmp/out", help="folder for inplace_pair.json / .md")
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                    help="cpu: the bench's mechanics on the references (no measurement)")
    a = ap.parse_args(argv)
    import torch

    import flyship

    if a.device == "cuda" and not torch.cuda.is_available():
        print("bench/inplace_pair.py: expected a CUDA GPU, got none; run it on the GPU machine (or --device cpu "
              "to check the mechanics)", file=sys.stderr)
        return 2
    dtype = torch.bfloat16 if a.device == "cuda" else torch.float32
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # --device cpu: a fallback warning per op
        ops = flyship.load(a.bundle)
        sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
        results = {}
        for family, make in (("rope", rope_paths), ("cross-entropy", ce_paths)):
            paths = make(ops, a.device, dtype)
            check_same(paths, family)
            ms = interleaved_ms(paths, a.calls, a.repeats, sync)
            results[family] = {"ms": ms, "ratios": ratios(ms)}
    if a.device == "cuda":  # a call that fell back to the reference would have timed the wrong thing
        fell = {h.name: h.stats()["fallbacks"] for h in ops if any(h.stats()["fallbacks"].values())}
        if fell:
            print(f"bench/inplace_pair.py: expected every call on the bundle's kernels, got fallbacks {fell}; "
                  "build the bundle for this GPU's target", file=sys.stderr)
            return 1
    where = f"CPU ({platform.machine()}, mechanics only)"
    meta = {"device": torch.cuda.get_device_name() if a.device == "cuda" else where,
            "dtype": str(dtype).removeprefix("torch."), "torch": torch.__version__, "calls": a.calls,
            "repeats": a.repeats, "target": TARGET, "mechanics_only": a.device == "cpu"}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "inplace_pair.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    text = markdown(results, meta)
    (out / "inplace_pair.md").write_text(text)
    print(text)
    if a.device == "cuda":
        missed = [f for f, r in results.items() if r["ratios"]["pair / plain"]["median"] > TARGET]
        if missed:
            print(f"target missed (pair / plain > {TARGET}): {', '.join(missed)}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
