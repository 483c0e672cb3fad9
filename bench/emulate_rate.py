"""Emulated wave-instructions per second on the examples bundle (flyship's CDNA emulator, loader/emulate/).

Run in the workload Python on a built examples bundle::

    .venv-flydsl/bin/flyc-build examples/flydsl/ops.py -o /tmp/ex --arch gfx942 --arch gfx950
    .venv-workload/bin/python bench/emulate_rate.py /tmp/ex [--rounds 3] [--json out.json]

For every AMD variant of the bundle it runs one launch at the shapes below (the test shapes of
tests/emulate/test_examples.py, small enough for a CI core) once cold (decoding with llvm-objdump and compiling the
program included) and ``--rounds`` times warm (the decoded program cached), and prints the dynamic
wave-instructions, waves, the warm median wall seconds, instructions per wall second and per CPU second of this
process (``instr/cpu-s``: the per-core rate, which a shared machine's load does not dilute), and the ratio of the
emulated launch's wall time to the recording driver's host time per launch of the same op call
(``FLYSHIP_FLAVOR=record`` through ``flyship.dry_run``: the real C++ call path on CPU tensors, launches recorded,
not executed; ``--record-calls`` calls, median of 5 rounds). An emulated run: nothing here touches a GPU.
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
    ap.add_argument("--record-calls", type=int, default=200, help="op calls per round on the recording driver")
    args = ap.parse_args(argv)
    manifest = json.loads((args.bundle / "manifest.json").read_text())
    rows = []
    total_i = total_s = total_c = 0.0
    recorders: dict[str, object] = {}
    print(f"{'op.spec':<22}{'target':<8}{'instructions':>13}{'waves':>7}{'cold s':>8}{'warm s':>8}{'instr/s':>10}"
          f"{'instr/cpu-s':>12}{'record us':>10}{'emu/record':>11}")
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
                warm, cpu = [], []
                for _ in range(args.rounds):
                    st = launch(args.bundle, variant, tensors, scalars, set(outs))
                    warm.append(st.seconds)
                    cpu.append(st.cpu_seconds)
                w, c = statistics.median(warm), statistics.median(cpu)
                rate = stats.instructions / w
                crate = stats.instructions / c if c > 0 else float("inf")
                total_i += stats.instructions
                total_s += w
                total_c += c
                name = f"{op['name']}.{spec['name']}"
                target = variant["code_object"]["target"]
                rec = _record_seconds(recorders, args.bundle, op, target, tensors, scalars, args.record_calls)
                print(f"{name:<22}{target:<8}{stats.instructions:>13}{stats.waves:>7}{cold:>8.2f}{w:>8.3f}"
                      f"{rate:>10.0f}{crate:>12.0f}{rec * 1e6:>10.1f}{w / rec:>11.0f}")
                rows.append(dict(op=name, target=target, instructions=stats.instructions, waves=stats.waves,
                                 cold_s=cold, warm_s=w, cpu_s=c, rate=rate, cpu_rate=crate, record_s=rec,
                                 emulated_over_record=w / rec))
    print(f"all: {total_i:.0f} wave-instructions in {total_s:.2f} s warm: {total_i / total_s:.0f} instr/s, "
          f"{total_i / total_c:.0f} instr/cpu-s (emulated)")
    if args.json:
        args.json.write_text(json.dumps(dict(rows=rows, rate=total_i / total_s, cpu_rate=total_i / total_c),
                                        indent=1))
    return 0


def _record_seconds(recorders: dict, bundle: Path, op: dict, target: str, tensors: dict, scalars: dict,
                    calls: int) -> float:
    """Host seconds per call of ``op`` on the recording driver (``FLYSHIP_FLAVOR=record``) as a ``target`` device
    runs it, with the same tensors and scalars: median over 5 rounds of ``calls`` calls."""
    import flyship
    from flyship.loader import extension

    if target not in recorders:
        recorders[target] = flyship.dry_run(bundle, target=f"{target}:sramecc+:xnack-").ops
    ops = recorders[target]
    fn = getattr(ops, op["name"])
    call_args = [tensors[a["name"]] if a["kind"] == "tensor" else scalars[a["name"]] for a in op["args"]]
    ext = extension.extension("record")
    fn(*call_args)
    got = ext.recorded_launches(clear=True)
    if not got:
        raise SystemExit(f"{op['name']} on {target}: expected a recorded launch, got none")
    rounds = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn(*call_args)
        rounds.append((time.perf_counter() - t0) / calls)
        ext.recorded_launches(clear=True)
    return statistics.median(rounds)


if __name__ == "__main__":
    raise SystemExit(main())
