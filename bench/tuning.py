"""Tuned dispatch against the best single fixed config, per shape regime, on one GPU (builds nothing there).

    python3 bench/tuning.py --bundle artifacts/tuned --out /tmp/out

The bundle is built elsewhere (no GPU needed) from ``examples/triton/tuned.py``::

    flyc-build examples/triton/tuned.py -o artifacts/tuned --arch gfx942 --arch gfx950 --arch sm_90

Steps: write the shapes file (three M regimes per op: decode, mid, prefill), run ``flyship tune`` on it
(a subprocess: the command a user types) into ``--out/tuning.json``, then load the bundle twice (with and
without the table) and time, per regime, the tuned call (``ops.gemm(a, b)``, dispatched by the table's
guards in the C++ core) against every config run alone (``run_specialization``). The *best single
fixed config* is the one config with the least total time over all regimes of an op, i.e. what one would
ship without a table. Each figure is the median of ``--repeats`` device-event timings, each call after an
L2 flush. Checks that each tuned call ran the table's winner with no fallback and matches the reference.
Writes ``tuning_bench.json`` and ``tuning_bench.md`` to ``--out``; about two minutes on an H200.

``--original`` races each op's PyTorch reference too (``flyship tune`` without ``--no-original``; issue 24
item 6): where torch is fastest (cuBLAS on the prefill gemm) the table says ``(original)`` and the tuned call
runs the reference on purpose (counted in ``stats()["original"]``, with the fallback off); the table gains a
column with the reference alone, so each row shows the tuned call against torch as well.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Three M regimes per op (decode, mid, prefill) at a fixed inner size.
REGIMES = {
    "gemm": [("decode M=8", {"a": [8, 4096], "b": [4096, 4096]}),
             ("mid M=256", {"a": [256, 4096], "b": [4096, 4096]}),
             ("prefill M=4096", {"a": [4096, 4096], "b": [4096, 4096]})],
    "rmsnorm": [("decode M=4", {"x": [4, 4096], "w": [4096]}),
                ("mid M=512", {"x": [512, 4096], "w": [4096]}),
                ("prefill M=32768", {"x": [32768, 4096], "w": [4096]})],
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bundle", default=str(ROOT / "artifacts" / "tuned"))
    p.add_argument("--out", default="/tmp/flyship-tuning-bench")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--original", action="store_true", help="race the ops' PyTorch references too")
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    shapes = out / "shapes.json"
    shapes.write_text(json.dumps({op: [s for _, s in regs] for op, regs in REGIMES.items()}, indent=1))
    table = out / "tuning.json"
    table.unlink(missing_ok=True)
    subprocess.run([sys.executable, "-m", "flyship.loader.tools.cli", "tune", a.bundle, "--shapes", str(shapes),
                    "-o", str(table), "--repeats", "15", *([] if a.original else ["--no-original"])], check=True)

    import torch

    import flyship
    from flyship.bundle.targets import select
    from flyship.loader.tools.tune import key_values, time_call

    fixed = flyship.load(a.bundle, namespace=f"tb_fixed_{uuid.uuid4().hex[:6]}")
    tuned = flyship.load(a.bundle, namespace=f"tb_tuned_{uuid.uuid4().hex[:6]}", tuning=table)
    tuned.fallback = False
    target = fixed.device_target(0)
    rows, results = [], []
    for op, regs in REGIMES.items():
        h, ht = fixed[op], tuned[op]
        configs = [s.name for s in h.manifest.specializations
                   if select([v.target for v in s.variants], target) is not None]
        per: dict[str, dict[str, float]] = {}  # regime -> config -> us
        tuned_us, picks, res, orig_us = {}, {}, {}, {}
        for label, shp in regs:
            inputs = [torch.randn(shp[arg.name], device="cuda").half() if arg.kind == "tensor" else arg.default
                      for arg in h.manifest.args]
            per[label] = {}
            for c in configs:
                try:
                    h.run_specialization(c, *inputs)
                except Exception as e:  # a guard that does not admit these inputs
                    print(f"{op} {label} {c}: skipped ({e})", file=sys.stderr)
                    continue
                per[label][c] = time_call(lambda c=c: h.run_specialization(c, *inputs), repeats=a.repeats)
            ht.reset_stats()
            got = ht(*inputs)
            st = ht.stats()
            ran = [k for k, v in st["launches"].items() if v]
            picks[label] = ran[0] if ran else "(original)" if st["original"] else "fallback"
            assert not st["fallbacks"], f"{op} {label}: the tuned call fell back: {st['fallbacks']}"
            ref = tuned.reference(op)(*inputs)
            orig_us[label] = time_call(lambda: tuned.reference(op)(*inputs), repeats=a.repeats)
            torch.testing.assert_close(got.float(), ref.float(), atol=5e-2, rtol=5e-2)
            tuned_us[label] = time_call(lambda: ht(*inputs), repeats=a.repeats)
            res[label] = {"op": op, "regime": label, "key": list(key_values(h.manifest, inputs)),
                            "tuned_pick": picks[label], "tuned_us": tuned_us[label], "configs_us": per[label],
                          "original_us": orig_us[label]}
            results.append(res[label])
        common = [c for c in configs if all(c in per[lb] for lb, _ in regs)]
        best_fixed = min(common, key=lambda c: sum(per[lb][c] for lb, _ in regs))
        for label, _ in regs:
            f = per[label][best_fixed]
            oracle = min(per[label], key=per[label].get)
            o = orig_us[label]
            rows.append((op, label, picks[label], tuned_us[label], best_fixed, f, f / tuned_us[label], oracle, o,
                         o / tuned_us[label]))
            res[label]["best_fixed"] = best_fixed

    head = ("| op | regime | tuned pick | tuned us | best single fixed config | fixed us | gain | fastest alone "
            "| torch reference us | vs torch |\n| --- | --- | --- | ---: | --- | ---: | ---: | --- | ---: | ---: |")
    lines = [head] + [f"| {o} | {r} | {p_} | {t:.1f} | {bf} | {f:.1f} | {g:.2f}x | {orc} | {ou:.1f} | {og:.2f}x |"
                      for o, r, p_, t, bf, f, g, orc, ou, og in rows]
    md = f"Device: {torch.cuda.get_device_name(0)} ({target})\n\n" + "\n".join(lines) + "\n"
    print(md)
    (out / "tuning_bench.md").write_text(md)
    (out / "tuning_bench.json").write_text(json.dumps({"device": target, "rows": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
