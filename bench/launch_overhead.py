"""Per-call host time of a tiny add (4096 float32 elements), every path side by side in one process.

    python3 bench/launch_overhead.py --bundle artifacts/triton --out /tmp/out

Paths: flyship's op through ``torch.ops`` (the packet, ``.default`` and ``.out``: the fast entry, loader/torchops.py,
beside torch's own ``__call__`` of the same objects, what an unpatched torch.ops call runs), the ``ops.add`` and
``ops.add.out`` handles (the fast entry, csrc/fast_call.cpp),
``torch.add`` (allocating and ``out=``), Triton's own launcher ``add_kernel[grid](...)`` on the same
kernel source, and the floor: a C++ loop of ``cuLaunchKernel`` on the bundle's own cubin with a prepacked
kernarg buffer (built with ``torch.utils.cpp_extension.load_inline``). Each path is timed as ``calls``
back-to-back calls (host time, before the final synchronize), in ``repeats`` interleaved rounds (every path once per
round, so drift spreads over all paths alike); the table shows the
median per call and the ratio to ``torch.add``. Figures move 20-50% between machines: compare within a run.
The breakdown rows time the stages apart: both allocating ops under ``no_grad`` (no autograd fallback), one
``torch.empty_like``, and ``ops.add.dispatch`` (binding and guards without dispatcher or launch).
Writes ``launch_overhead.json`` and ``launch_overhead.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import struct
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

ROOT = Path(__file__).resolve().parents[1]

SHAPE = (4, 1024)  # 4096 elements

LAUNCH_LOOP_SRC = r"""
#include <torch/extension.h>
#include <cuda.h>
#include <chrono>
#include <string>

static void check(CUresult rc, const char* what) {
  if (rc != CUDA_SUCCESS) {
    const char* name = nullptr;
    cuGetErrorName(rc, &name);
    TORCH_CHECK(false, what, " failed: ", name ? name : "unknown CUresult");
  }
}

// Launch `symbol` of `image` `calls` times with the kernarg bytes `params`; host microseconds per call.
double launch_loop(const std::string& image, const std::string& symbol, const std::string& params, int64_t grid,
                   int64_t block, int64_t shared, int64_t stream_handle, int64_t calls) {
  CUmodule mod = nullptr;
  CUfunction fn = nullptr;
  check(cuModuleLoadData(&mod, image.data()), "cuModuleLoadData");
  check(cuModuleGetFunction(&fn, mod, symbol.c_str()), "cuModuleGetFunction");
  std::string buf = params;
  size_t size = buf.size();
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buf.data(), CU_LAUNCH_PARAM_BUFFER_SIZE, &size, CU_LAUNCH_PARAM_END};
  CUstream stream = reinterpret_cast<CUstream>(stream_handle);
  for (int i = 0; i < 200; ++i)
    check(cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, shared, stream, nullptr, extra), "cuLaunchKernel");
  check(cuStreamSynchronize(stream), "cuStreamSynchronize");
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < calls; ++i)
    check(cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, shared, stream, nullptr, extra), "cuLaunchKernel");
  auto t1 = std::chrono::steady_clock::now();
  check(cuStreamSynchronize(stream), "cuStreamSynchronize");
  check(cuModuleUnload(mod), "cuModuleUnload");
  return std::chrono::duration<double, std::micro>(t1 - t0).count() / static_cast<double>(calls);
}
"""


def interleaved_us_per_call(paths: list[tuple[str, Callable[[], Any]]], calls: int,
                            repeats: int) -> dict[str, list[float]]:
    """Host microseconds per call of each path, ``repeats`` rounds; each round times every path once, in turn,
    so clock or thermal drift during the run spreads over all paths alike (the GPU is drained between timings)."""
    import torch

    for _, fn in paths:
        for _ in range(200):
            fn()
    torch.cuda.synchronize()
    out: dict[str, list[float]] = {name: [] for name, _ in paths}
    for _ in range(repeats):
        for name, fn in paths:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            out[name].append((t1 - t0) / calls * 1e6)
    return out


def pick_variant(ops: Any, spec: str) -> Any:
    """The ``add`` variant of specialization ``spec`` that runs on this GPU."""
    import torch

    from flyship.bundle import targets

    s = next(x for x in ops.add.manifest.specializations if x.name == spec)
    i = targets.select([v.target for v in s.variants], ops.device_target(torch.cuda.current_device()))
    if i is None:
        raise RuntimeError(f"the bundle's add.{spec} has no variant for this GPU")
    return s.variants[i]


def pack(variant: Any, tensors: dict[str, Any]) -> bytes:
    """The kernarg bytes of a call, from the manifest's fields alone (pointer, shape/stride/expr, null)."""
    from flyship.bundle import expr as E
    from flyship.bundle.manifest import FIELD_TYPES

    codes = {"ptr": "<Q", "i64": "<q", "u64": "<Q", "i32": "<i", "u32": "<I"}
    shapes = {k: tuple(t.shape) for k, t in tensors.items()}
    strides = {k: tuple(t.stride()) for k, t in tensors.items()}
    buf = bytearray(variant.kernargs.size)
    for f in variant.kernargs.fields:
        if f.kind == "pointer":
            value = tensors[f.arg].data_ptr()
        elif f.kind in ("shape", "stride"):
            value = (shapes if f.kind == "shape" else strides)[f.arg][f.dim]
        elif f.kind == "expr":
            value = E.evaluate_with_shapes(f.expr, shapes, {}, strides)
        elif f.kind == "null":
            value = 0
        else:
            raise RuntimeError(f"bench: kernarg kind {f.kind!r} not handled by the raw launch loop")
        struct.pack_into(codes[f.type], buf, f.offset, value)
        assert FIELD_TYPES[f.type] == struct.calcsize(codes[f.type])
    return bytes(buf)


def raw_loop(bundle: Path, ops: Any, x: Any, y: Any, o: Any, calls: int, repeats: int,
             build_dir: Optional[str]) -> tuple[list[float], float]:
    """The C++ cuLaunchKernel floor; returns (us per call per repeat, extension build seconds)."""
    import torch
    from torch.utils.cpp_extension import load_inline

    t0 = time.perf_counter()
    ext = load_inline(name="flyship_bench_launch_loop", cpp_sources=[LAUNCH_LOOP_SRC], functions=["launch_loop"],
                      with_cuda=True, extra_ldflags=["-lcuda"], build_directory=build_dir, verbose=False)
    build_s = time.perf_counter() - t0
    v = pick_variant(ops, "f32")
    image = (bundle / v.code_object.file).read_bytes()
    params = pack(v, {"x": x, "y": y, "out": o})
    from flyship.bundle import expr as E

    grid = E.evaluate_with_shapes(v.launch.grid[0], {"x": tuple(x.shape), "y": tuple(y.shape), "out": tuple(o.shape)})
    shared = int(v.launch.dynamic_lds)
    stream = torch.cuda.current_stream().cuda_stream
    o.zero_()
    out = [ext.launch_loop(image, v.code_object.symbol, params, grid, v.launch.block[0], shared, stream, calls)
           for _ in range(repeats)]
    torch.cuda.synchronize()
    torch.testing.assert_close(o, x + y)
    return out, build_s


def triton_launcher(x: Any, y: Any, o: Any) -> Callable[[], Any]:
    """Triton's own launcher on the same kernel source (JIT-compiled on first call)."""
    sys.path.insert(0, str(ROOT / "examples" / "triton"))
    from tl_elementwise import add_kernel

    n = x.numel()
    grid = (-(-n // 1024),)

    def call() -> None:
        add_kernel[grid](x, y, o, n, BLOCK=1024)

    return call


# The targets, as medians of per-round ratios (numerator path, denominator path, target, "<=" or ">=").
TARGETS = [
    ("flyship ops.add(x, y) (fast entry)", "torch.add(x, y)", 1.0, "<="),
    ("flyship ops.add.out(x, y, out=o) (fast entry)", "torch.add(x, y, out=o)", 0.9, "<="),
    ("flyship torch.ops.<ns>.add(x, y)", "torch.add(x, y)", 1.0, "<="),
    ("flyship torch.ops.<ns>.add.default(x, y)", "torch.add(x, y)", 1.0, "<="),
    ("flyship torch.ops.<ns>.add.out(x, y, out=o)", "torch.add(x, y, out=o)", 0.95, "<="),
    ("flyship torch.ops.<ns>.add(x, y) (torch's own __call__)", "torch.add(x, y)", None, ""),
    ("flyship torch.ops.<ns>.add.default(x, y) (torch's own __call__)", "torch.add(x, y)", None, ""),
    ("flyship torch.ops.<ns>.add.out(x, y, out=o) (torch's own __call__)", "torch.add(x, y, out=o)", None, ""),
    ("Triton launcher add_kernel[grid](...)", "flyship ops.add(x, y) (fast entry)", 1.5, ">="),
    ("Triton launcher add_kernel[grid](...)", "flyship ops.add.out(x, y, out=o) (fast entry)", 1.5, ">="),
]


def per_round_ratios(us: dict[str, list[float]]) -> list[dict[str, Any]]:
    """Each target's ratio per round (paths timed in the same round), its median and whether it meets the target.
    Per-round ratios cancel swings of the machine between rounds that a ratio of medians keeps."""
    out = []
    for num, den, target, op in TARGETS:
        if num not in us or den not in us:
            continue
        r = [a / b for a, b in zip(us[num], us[den])]
        med = statistics.median(r)
        met = None if target is None else (med <= target if op == "<=" else med >= target)
        out.append({"ratio": f"{num} / {den}", "median": med, "min": min(r), "max": max(r), "target": target,
                    "op": op, "met": met})
    return out


def ratio_table(ratios: list[dict[str, Any]]) -> str:
    lines = ["", "| ratio (median of per-round ratios) | median | min..max | target | met |",
             "| --- | ---: | ---: | --- | --- |"]
    for r in ratios:
        target = "" if r["target"] is None else f"{r['op']} {r['target']}"
        met = "" if r["met"] is None else ("yes" if r["met"] else "**no**")
        lines.append(f"| {r['ratio']} | {r['median']:.2f} | {r['min']:.2f}..{r['max']:.2f} | {target} | {met} |")
    return "\n".join(lines) + "\n"


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [f"Launch overhead on {meta['device']} ({meta['calls']} calls x {meta['repeats']} repeats, "
             f"{SHAPE[0] * SHAPE[1]}-element float32 add; torch {meta['torch']}, triton {meta['triton']})", "",
             "| path | us/call (median) | min | x torch.add |", "| --- | ---: | ---: | ---: |"]
    for r in rows:
        if r.get("skipped"):
            lines.append(f"| {r['path']} | skipped: {r['skipped']} | | |")
        else:
            lines.append(f"| {r['path']} | {r['median_us']:.2f} | {r['min_us']:.2f} | {r['ratio_to_torch_add']:.2f} |")
    return "\n".join(lines) + "\n"


def call_paths(ops: Any, op: Any, x: Any, y: Any, o: Any) -> list[tuple[str, Callable[[], Any]]]:
    """The timed paths: torch's, flyship's torch.ops objects (the fast entry, loader/torchops.py) and torch's own
    ``__call__`` of the same objects (what an unpatched torch.ops call runs), and the handles."""
    import torch

    packet_call, overload_call = torch._ops.OpOverloadPacket.__call__, torch._ops.OpOverload.__call__
    default, out = op.default, op.out
    return [
        ("torch.add(x, y)", lambda: torch.add(x, y)),
        ("torch.add(x, y, out=o)", lambda: torch.add(x, y, out=o)),
        ("flyship torch.ops.<ns>.add(x, y)", lambda: op(x, y)),
        ("flyship torch.ops.<ns>.add.default(x, y)", lambda: default(x, y)),
        ("flyship torch.ops.<ns>.add.out(x, y, out=o)", lambda: out(x, y, out=o)),
        ("flyship torch.ops.<ns>.add(x, y) (torch's own __call__)", lambda: packet_call(op, x, y)),
        ("flyship torch.ops.<ns>.add.default(x, y) (torch's own __call__)", lambda: overload_call(default, x, y)),
        ("flyship torch.ops.<ns>.add.out(x, y, out=o) (torch's own __call__)",
         lambda: overload_call(out, x, y, out=o)),
        ("flyship ops.add(x, y) (fast entry)", lambda: ops.add(x, y)),
        ("flyship ops.add.out(x, y, out=o) (fast entry)", lambda: ops.add.out(x, y, out=o)),
    ]


def check_launched(ops: Any, op: Any, stats_before: dict[str, Any], expected: int) -> None:
    """Every flyship path launched its kernel (no fallback), and the fast entries handed no call to torch's path."""
    launched = sum(ops.add.stats()["launches"].values()) - sum(stats_before["launches"].values())
    handed = {n: ops._ext.fast_call_counts(h)["dispatcher"] for n, h in (
        ("add", ops.add), ("add.out", ops.add.out), ("torch.ops add", op), ("torch.ops add.default", op.default),
        ("torch.ops add.out", op.out))}
    if any(handed.values()):
        raise SystemExit(f"launch_overhead: the fast entry handed calls to torch's path: {handed}")
    if launched < expected:
        raise SystemExit(f"launch_overhead: the flyship paths launched {launched} kernels, expected >= "
                         f"{expected}; did they fall back to the reference? {ops.add.stats()}")


def checked_triton(x: Any, y: Any, o: Any, want: Any) -> tuple[str, Optional[Callable[[], Any]], Optional[str]]:
    """Triton's version, its launcher (checked against ``want``) or None, and why not."""
    import torch

    try:
        import triton

        fn = triton_launcher(x, y, o)
        o.zero_()
        fn()
        torch.cuda.synchronize()
        torch.testing.assert_close(o, want)
        return triton.__version__, fn, None
    except Exception as e:  # report, keep the other rows
        return "n/a", None, f"{type(e).__name__}: {e}"


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bundle", default=str(ROOT / "artifacts" / "triton"), help="bundle built by flyc-build")
    ap.add_argument("--out", default="/tmp/out", help="folder for launch_overhead.json / .md")
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args(argv)

    import torch

    import flyship

    if not torch.cuda.is_available():
        print("launch_overhead: needs a GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    bundle = Path(args.bundle).resolve()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    ops = flyship.load(bundle)
    x = torch.randn(*SHAPE, device="cuda")
    y = torch.randn(*SHAPE, device="cuda")
    o = torch.empty_like(x)
    want = x + y
    op = torch.ops.flyship_triton.add
    paths = call_paths(ops, op, x, y, o)
    for name, fn in paths:  # every path computes the right thing before it is timed
        r = fn()
        torch.testing.assert_close(r if r is not None else o, want)
    def no_grad(fn: Callable[..., Any], *a: Any) -> Any:
        with torch.no_grad():
            return fn(*a)

    target = ops.device_target(torch.cuda.current_device())
    # The breakdown (docs/perf.md): what torch's autograd fallback on the functional op costs (both ops under
    # no_grad, so the context manager's cost is on both sides), one output allocation, and binding + guards
    # alone (decide through pybind11, no dispatcher, no launch).
    breakdown: list[tuple[str, Callable[[], Any]]] = [
        ("torch.add(x, y) under no_grad", lambda: no_grad(torch.add, x, y)),
        ("flyship torch.ops.<ns>.add.default(x, y) under no_grad", lambda: no_grad(op.default, x, y)),
        ("torch.empty_like(x) (one allocation)", lambda: torch.empty_like(x)),
        ("flyship ops.add.dispatch(x, y) (bind + guards only)", lambda: ops.add.dispatch(x, y, target=target)),
    ]
    stats_before = ops.add.stats()
    timed = list(paths) + breakdown
    triton_name = "Triton launcher add_kernel[grid](...)"
    triton_version, triton_fn, triton_skip = checked_triton(x, y, o, want)
    if triton_fn is not None:
        timed.append((triton_name, triton_fn))
    us = interleaved_us_per_call(timed, args.calls, args.repeats)
    rows: list[dict[str, Any]] = [{"path": name, "us": us[name]} for name, _ in paths + breakdown]
    rows.append({"path": triton_name, "us": us[triton_name]} if triton_skip is None
                else {"path": triton_name, "skipped": triton_skip})
    check_launched(ops, op, stats_before, 9 * args.calls * args.repeats)
    build_s = None
    try:
        us, build_s = raw_loop(bundle, ops, x, y, o, args.calls, args.repeats,
                               None)
        rows.append({"path": "C++ loop of cuLaunchKernel (floor)", "us": us})
    except Exception as e:
        rows.append({"path": "C++ loop of cuLaunchKernel (floor)", "skipped": f"{type(e).__name__}: {e}"})
    base = statistics.median(rows[0]["us"])
    for r in rows:
        if "us" in r:
            r["median_us"] = statistics.median(r["us"])
            r["min_us"] = min(r["us"])
            r["ratio_to_torch_add"] = r["median_us"] / base
    ratios = per_round_ratios({r["path"]: r["us"] for r in rows if "us" in r})
    meta = {
        "device": torch.cuda.get_device_name(), "device_target": ops.device_target(torch.cuda.current_device()),
        "torch": torch.__version__, "triton": triton_version, "python": platform.python_version(),
        "flyship_flavor": ops.flavor, "calls": args.calls, "repeats": args.repeats, "elements": SHAPE[0] * SHAPE[1],
        "raw_loop_build_seconds": build_s, "bundle": str(bundle),
    }
    (out_dir / "launch_overhead.json").write_text(json.dumps({"meta": meta, "rows": rows, "ratios": ratios},
                                                            indent=1))
    table = markdown(rows, meta) + ratio_table(ratios)
    (out_dir / "launch_overhead.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
