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

Stacking (``--modes``, comma-separated, or ``all``; docs/perf.md "Stacking with torch.compile and export"):

* ``default``, ``reduce-overhead`` (CUDA graphs), ``max-autotune-no-cudagraphs``: the torch.compile modes, each
  racing eager, compiled alone and patched + compiled, as ratios against eager in the same run;
* ``export``: the patched block through ``torch.export`` and an AOTInductor package (compiled, packaged and
  loaded in this process after ``flyship.load``), raced against eager (patched and not);
* ``probe``: a host-bound probe, ``softmax(x) * 2`` on a 64x1000 fp16 tensor, flyship's softmax vs torch's, eager
  and compiled, with the op's own CPU time per call (torch.profiler) eager, inside the compiled graph, and eager
  right after a compiled call.

    python3 bench/dropin_block.py --bundle artifacts/triton --out $OUT/dropin --modes all
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

import flyship
from flyship.loader.tools.report import note_compiled


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


COMPILE_MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs")
EXTRA_MODES = ("export", "probe")


def parse_modes(text: str) -> list[str]:
    """``--modes``: ``all``, ``none`` or a comma-separated subset of the compile modes, ``export`` and ``probe``."""
    known = COMPILE_MODES + EXTRA_MODES
    if text == "all":
        return list(known)
    modes = [m for m in text.split(",") if m and m != "none"]
    bad = [m for m in modes if m not in known]
    if bad:
        raise SystemExit(f"dropin_block: expected --modes among all, none, {', '.join(known)}; got {', '.join(bad)}")
    return modes


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def race(fns: dict[str, Callable[[], Any]], repeats: int, iters: int,
         before: dict[str, Callable[[], None]] | None = None) -> dict[str, dict[str, float]]:
    """Interleaved timing (rotating order per repeat, a sync around each run), medians in seconds per call; each
    entry's ``ratio`` is the first entry's median over its own (above 1: faster than the first). ``before[name]``,
    if given, runs untimed before each run of that entry (applies or undoes the patches)."""
    names = list(fns)
    times: dict[str, list[float]] = {n: [] for n in names}
    before = before or {}
    for n, f in fns.items():  # warm-up: compiles, autotunes, records CUDA graphs
        before.get(n, lambda: None)()
        for _ in range(3):
            f()
    for r in range(repeats):
        for k in range(len(names)):
            n = names[(r + k) % len(names)]
            before.get(n, lambda: None)()
            sync()
            t0 = time.perf_counter()
            for _ in range(iters):
                fns[n]()
            sync()
            times[n].append((time.perf_counter() - t0) / iters)
    base = statistics.median(times[names[0]])
    return {n: {"median_us": statistics.median(t) * 1e6, "ratio": base / statistics.median(t)}
            for n, t in times.items()}


def compile_arms(model: nn.Module, x: torch.Tensor, patches: list, mode: str, repeats: int,
                 iters: int) -> dict[str, Any]:
    """One torch.compile mode: eager, compiled alone and patched + compiled (flyship.bench's arms)."""
    torch._dynamo.reset()
    result = flyship.bench(model, x, patches=patches, repeats=repeats, iters=iters,
                           arms=("baseline", "compiled", "patched+compiled"), compile_options={"mode": mode})
    arms = result.as_dict()
    pc, c = arms["patched+compiled"]["median"], arms["compiled"]["median"]
    note_compiled([p.target for p in patches], mode, pc, c)  # the routing report says whether fusion was lost
    out = {"arms": arms, "table": result.table(), "patched_compiled_over_compiled": c / pc if pc else None}
    if pc > c:  # the report says FUSION LOST: follow its advice (compiled="original") and race again
        out["report_routed"] = routed_as_reported(model, x, patches, {"mode": mode}, repeats, iters)
        out["table"] += "\nas the routing report advises (the sites step aside inside compiled graphs):\n" + \
            out["report_routed"]["table"]
    return out


def routed_as_reported(model: nn.Module, x: torch.Tensor, patches: list, compile_options: dict[str, Any],
                       repeats: int, iters: int) -> dict[str, Any]:
    """The compiled race again with every patch set to ``compiled="original"``, as the routing report advises when
    fusion is lost: the compiled graph traces the originals (and fuses them) while eager calls still take the ops."""
    before = [p.compiled for p in patches]
    try:
        for p in patches:
            p.compiled = "original"
        torch._dynamo.reset()
        result = flyship.bench(model, x, patches=patches, repeats=repeats, iters=iters,
                               arms=("baseline", "compiled", "patched+compiled"), compile_options=compile_options)
    finally:
        for p, was in zip(patches, before):
            p.compiled = was
        torch._dynamo.reset()
    arms = result.as_dict()
    pc, c = arms["patched+compiled"]["median"], arms["compiled"]["median"]
    return {"arms": arms, "table": result.table(), "patched_compiled_over_compiled": c / pc if pc else None}


def export_arm(model: nn.Module, x: torch.Tensor, patches: list, ops, repeats: int,
               iters: int) -> dict[str, Any]:
    """The patched block through torch.export and an AOTInductor package, loaded in this process; checks that the
    package computes the eager result and launches our kernels, then races it against eager."""
    for p in patches:
        p.apply()
    try:
        return _export_and_race(model, x, patches, ops, repeats, iters)
    finally:
        for p in patches:
            p.undo()


def _export_and_race(model: nn.Module, x: torch.Tensor, patches: list, ops, repeats: int,
                     iters: int) -> dict[str, Any]:
    with torch.no_grad():
        want = model(x)
        program = torch.export.export(model, (x,), strict=False)
        in_graph = sorted({str(n.target) for n in program.graph.nodes if ops.namespace in str(n.target)})
        # The package (tens of MB of compiled code) goes to a temporary folder, not --out: --out holds the results
        # that travel back from a GPU machine, and one file over their size limit lost them all once.
        with tempfile.TemporaryDirectory(prefix="flyship-dropin-") as tmp:
            package = torch._inductor.aoti_compile_and_package(program, package_path=str(Path(tmp) / "block.pt2"))
            package_bytes = Path(package).stat().st_size
            loaded = torch._inductor.aoti_load_package(package)
        n0 = sum(sum(op.stats()["launches"].values()) for op in (ops.rmsnorm, ops.softmax))
        got = loaded(x)
        launched = sum(sum(op.stats()["launches"].values()) for op in (ops.rmsnorm, ops.softmax)) - n0
        torch.testing.assert_close(got, want, atol=5e-2, rtol=5e-2)

        def patched(on: bool) -> Callable[[], None]:
            def switch() -> None:
                for p in patches:
                    p.apply() if on else p.undo()
            return switch

        timed = race({"eager": lambda: model(x), "eager_patched": lambda: model(x), "aoti_patched": lambda: loaded(x)},
                     repeats, iters, before={"eager": patched(False), "eager_patched": patched(True)})
    return {"ops_in_graph": in_graph, "launches_per_call": launched, "package_bytes": package_bytes, "times": timed}


def probe_arm(ops, repeats: int, iters: int) -> dict[str, Any]:
    """The host-bound probe: ``softmax(x) * 2`` on 64x1000 fp16, flyship's op vs torch's, eager and compiled;
    plus the op's own CPU time per call (torch.profiler) eager and inside the compiled graph."""
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(64, 1000, device="cuda" if torch.cuda.is_available() else "cpu", dtype=torch.float16)
    softmax = getattr(torch.ops, ops.namespace).softmax

    def ours(t: torch.Tensor) -> torch.Tensor:
        return softmax(t) * 2

    def theirs(t: torch.Tensor) -> torch.Tensor:
        return torch.softmax(t, dim=-1) * 2

    torch.testing.assert_close(ours(x), theirs(x), atol=2e-2, rtol=2e-2)
    torch._dynamo.reset()
    c_ours, c_theirs = torch.compile(ours), torch.compile(theirs)
    fns = {"torch_eager": lambda: theirs(x), "flyship_eager": lambda: ours(x), "flyship_handle_eager":
           lambda: ops.softmax(x) * 2, "torch_compiled": lambda: c_theirs(x), "flyship_compiled": lambda: c_ours(x)}
    timed = race(fns, repeats, iters * 10)
    # The same eager call right after a compiled one: isolates the surroundings (a compiled call's host code leaves
    # the op's host path cold) from the path (the graph calls torch.ops.<ns>.softmax.default, as eager torch.ops).
    fns["flyship_eager_after_compiled"] = lambda: (c_theirs(x), ours(x))
    op_cpu_us = {}
    for name in ("flyship_eager", "flyship_handle_eager", "flyship_compiled", "flyship_eager_after_compiled"):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(200):
                fns[name]()
            sync()
        rows = [e for e in prof.key_averages() if e.key == f"{ops.namespace}::softmax"]
        op_cpu_us[name] = rows[0].cpu_time_total / rows[0].count if rows else None
    return {"times": timed, "op_cpu_us_per_call": op_cpu_us}


def check_block(ops, model: nn.Module, x: torch.Tensor, dtype: torch.dtype) -> list | None:
    """Patch the block, check it agrees with the baseline and reached the ops; the patches, or None."""
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
        return None
    return patches


def stacking(a: argparse.Namespace, ops, model: nn.Module, x: torch.Tensor, patches: list) -> dict[str, Any]:
    """The arms ``--modes`` asks for, each printed as it finishes (a failing arm is reported, not fatal)."""
    results: dict[str, Any] = {}
    for mode in a.modes:
        t0 = time.perf_counter()
        try:
            if mode in COMPILE_MODES:
                results[mode] = compile_arms(model, x, patches, mode, a.repeats, a.iters)
            elif mode == "export":
                results[mode] = export_arm(model, x, patches, ops, a.repeats, a.iters)
            else:
                results[mode] = probe_arm(ops, a.repeats, a.iters)
        except Exception as e:  # noqa: BLE001 - a bench arm that fails is a result to report, the others still run
            results[mode] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        results[mode]["wall_s"] = time.perf_counter() - t0
        shown = results[mode].get("table") or json.dumps({k: v for k, v in results[mode].items() if k != "arms"},
                                                         indent=1, default=str)
        print(f"--- {mode} ({results[mode]['wall_s']:.0f} s)\n{shown}", flush=True)
    return results


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
    ap.add_argument("--modes", type=parse_modes, default=[],
                    help="stacking arms: all, or comma-separated among " + ", ".join(COMPILE_MODES + EXTRA_MODES))
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("dropin_block: needs a GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 1
    dtype = getattr(torch, a.dtype)
    ops = flyship.load(a.bundle)
    torch.manual_seed(0)
    model = Block(a.hidden, a.heads).to("cuda", dtype).eval()
    x = torch.randn(a.batch, a.seq, a.hidden, device="cuda", dtype=dtype)
    patches = check_block(ops, model, x, dtype)
    if patches is None:
        return 1
    a.out.mkdir(parents=True, exist_ok=True)
    result = flyship.bench(model, x, patches=patches, repeats=a.repeats, iters=a.iters)
    for p in patches:
        p.undo()
    table = result.table()
    print(table)
    stacked = stacking(a, ops, model, x, patches)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "python": platform.python_version(),
            "shape": [a.batch, a.seq, a.hidden], "heads": a.heads, "dtype": a.dtype, "repeats": a.repeats,
            "iters": a.iters, "routing": flyship.routing_report(), "arms": result.as_dict(), "stacking": stacked}
    (a.out / "dropin_block.json").write_text(json.dumps(meta, indent=1, default=str))
    tables = "".join(f"\n{m}:\n```\n{r.get('table') or json.dumps(r, indent=1, default=str)}\n```\n"
                     for m, r in stacked.items())
    (a.out / "dropin_block.md").write_text(
        f"{meta['device']}, torch {meta['torch']}, x {tuple(meta['shape'])} {a.dtype}, {a.heads} heads\n\n"
        f"```\n{table}\n```\n{tables}")
    print(f"wrote {a.out}/dropin_block.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
