"""Emulated wave-instructions per second on the examples bundle (flyship's CDNA emulator, loader/emulate/).

Run in the workload Python on a built examples bundle::

    .venv-flydsl/bin/flyc-build examples/flydsl/ops.py -o /tmp/ex --arch gfx942 --arch gfx950
    .venv-workload/bin/python bench/emulate_rate.py /tmp/ex [--rounds 3] [--json out.json]

For every AMD variant of the bundle it runs one launch at the shapes below (the test shapes of
tests/emulate/test_examples.py, small enough for a CI core) once cold (decoding with llvm-objdump and compiling the
program included) and ``--rounds`` times warm (the decoded program cached), and prints the dynamic
wave-instructions, waves, the warm median seconds and instructions per second. An emulated run: nothing here
touches a GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.emulate.bundle_launch import launch  # noqa: E402
from tests.emulate.test_examples import SHAPES  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--op", action="append", help="only these ops (repeatable)")
    args = ap.parse_args(argv)
    manifest = json.loads((args.bundle / "manifest.json").read_text())
    rows = []
    total_i = total_s = 0.0
    print(f"{'op.spec':<22}{'target':<8}{'instructions':>13}{'waves':>7}{'cold s':>8}{'warm s':>8}{'instr/s':>10}")
    for op in manifest["ops"]:
        if op["name"] not in SHAPES or (args.op and op["name"] not in args.op):
            continue
        for spec in op["specializations"]:
            for variant in spec["variants"]:
                shapes = SHAPES[op["name"]]
                dtypes = {k: getattr(torch, v) for k, v in spec["guard"]["dtypes"].items()}
                ins = [a["name"] for a in op["args"] if a["kind"] == "tensor"]
                outs = [o["name"] for o in op["outputs"]]
                tensors = {a: torch.randn(shapes[a]).to(dtypes[a]) for a in ins}
                tensors.update({o: torch.zeros(shapes[o], dtype=dtypes[ins[0]]) for o in outs})
                scalars = dict(spec["example"]["scalars"])
                t0 = time.perf_counter()
                stats = launch(args.bundle, variant, tensors, scalars, set(outs))
                cold = time.perf_counter() - t0
                warm = []
                for _ in range(args.rounds):
                    warm.append(launch(args.bundle, variant, tensors, scalars, set(outs)).seconds)
                w = statistics.median(warm)
                rate = stats.instructions / w
                total_i += stats.instructions
                total_s += w
                name = f"{op['name']}.{spec['name']}"
                target = variant["code_object"]["target"]
                print(f"{name:<22}{target:<8}{stats.instructions:>13}{stats.waves:>7}{cold:>8.2f}{w:>8.3f}"
                      f"{rate:>10.0f}")
                rows.append(dict(op=name, target=target, instructions=stats.instructions, waves=stats.waves,
                                 cold_s=cold, warm_s=w, rate=rate))
    print(f"all: {total_i:.0f} wave-instructions in {total_s:.2f} s warm: {total_i / total_s:.0f} instr/s (emulated)")
    if args.json:
        args.json.write_text(json.dumps(dict(rows=rows, rate=total_i / total_s), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
