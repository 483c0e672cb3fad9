"""The workload half of `make demo`: load a bundle in a Python that has torch but no FlyDSL.

    python examples/demo_workload.py artifacts/examples

Shows the handoff: the bundle was built by another Python (the manifest says which); this one has no
flydsl. Prints every op with its targets and specializations, then, per op, what a call with the
specialization's example inputs would run on each of the bundle's targets (decided by the real C++
dispatch, without a GPU). On a machine with a GPU it also runs every op and checks it against its
reference: kernels for a matching target launch, others go to the reference (and say why).
"""

from __future__ import annotations

import importlib.util
import platform
import sys

import torch

import flyship
from flyship.bundle import manifest as M
from flyship.loader.tools.cli import describe
from flyship.loader.tools.verify import example_inputs


def main(path: str) -> int:
    manifest = M.read(path)
    # A regular package has an origin (its __init__.py); a bare folder named flydsl on sys.path (this
    # script's own examples/flydsl/) only makes a namespace package without one, which is not FlyDSL.
    spec = importlib.util.find_spec("flydsl")
    print(f"workload Python {platform.python_version()} ({sys.executable}); "
          f"FlyDSL installed here: {spec is not None and spec.origin is not None}")
    print(f"bundle {path}: built under Python {manifest.build.python} with "
          f"{', '.join(f'{k} {v}' for k, v in manifest.build.frontends.items())}\n")
    print(describe(manifest))

    ops = flyship.load(path)
    print(f"\nloaded {len(ops.names)} ops as torch.ops.{manifest.namespace}.* (driver shim: {ops.flavor})")
    print("\ndispatch of each specialization's example call, per target (no launch):")
    for handle in ops:
        for spec in handle.manifest.specializations:
            inputs = example_inputs(handle.manifest, spec, "cpu")
            for target in manifest.targets:
                d = handle.dispatch(*inputs, target=target)
                what = f"runs {d.spec} ({d.target})" if d.spec else f"falls back: {d.reason}"
                print(f"  {handle.name + '.' + spec.name:<14} on {target:<8} {what}")

    if not torch.cuda.is_available():
        print("\nno GPU here: nothing launched. On a GPU machine this script runs every op against its reference.")
        return 0
    device = torch.cuda.current_device()
    print(f"\nGPU {torch.cuda.get_device_name(device)} (target {ops.device_target(device)}): verifying every op")
    report = ops.verify()
    print(report.table())
    if any(not r.skipped for r in report.rows):
        return 0 if report.ok else 1
    # No code object in this bundle runs on this GPU (e.g. AMD code objects on an NVIDIA card): every call
    # goes to the reference, and the op's stats say why. Show that path, checked against the reference.
    print("\nno kernel here for this GPU; calls go to the references (fallback), e.g.:")
    for handle in ops:
        spec = handle.manifest.specializations[0]
        inputs = example_inputs(handle.manifest, spec, "cuda")
        got = handle(*inputs)
        want = ops.reference(handle.name)(*inputs)
        same = torch.equal(got, want)
        print(f"  {handle.name:<8} output {tuple(got.shape)} {got.dtype} on {got.device}, equal to the reference: "
              f"{same}; stats {handle.stats()['fallbacks']}")
        if not same:
            return 1
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: demo_workload.py BUNDLE")
    sys.exit(main(sys.argv[1]))
