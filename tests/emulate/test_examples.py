"""The examples bundle's code objects (FlyDSL, gfx942 and gfx950) executed on the emulated device with CPU
tensors, against the bundle's PyTorch references, in both wave schedules. An emulated run, not a GPU run."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from tests.emulate.bundle_launch import launch

pytestmark = pytest.mark.cpu

# Shapes the guards admit, smaller than the examples (emulation runs every wave in Python), with tails that are not
# a multiple of the block: (op, specialization) -> {tensor: shape}; scalars come from the example.
SHAPES = {
    "add": {"x": [9, 200], "y": [9, 200], "out": [9, 200]},
    "softmax": {"x": [3, 1000], "out": [3, 1000]},
    "softmax_bwd": {"dy": [3, 1000], "y": [3, 1000], "dx": [3, 1000]},
    "rmsnorm": {"x": [2, 4096], "w": [4096], "out": [2, 4096]},
    "gemm": {"a": [128, 64], "b": [128, 64], "c": [128, 128]},
}


def _cases(bundle):
    manifest = json.loads((bundle / "manifest.json").read_text())
    for op in manifest["ops"]:
        for spec in op["specializations"]:
            for variant in spec["variants"]:
                yield op, spec, variant


@pytest.fixture(scope="module")
def references(example_bundle):
    spec = importlib.util.spec_from_file_location("emulate_example_refs", example_bundle / "references.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_example_specialization_executes_and_matches_its_reference(example_bundle, references):
    seen = set()
    failures = []
    for op, spec, variant in _cases(example_bundle):
        target = variant["code_object"]["target"]
        seen.add((op["name"], spec["name"], target))
        shapes = SHAPES[op["name"]]
        dtypes = {k: getattr(torch, v) for k, v in spec["guard"]["dtypes"].items()}
        ins = [a["name"] for a in op["args"] if a["kind"] == "tensor"]
        outs = [o["name"] for o in op["outputs"]]
        scalars = dict(spec["example"]["scalars"])
        gen = torch.Generator().manual_seed(len(seen))
        tensors = {a: torch.randn(shapes[a], generator=gen).to(dtypes[a]) for a in ins}
        ref = getattr(references, op["reference"])(*[tensors[a] for a in ins],
                                                   *[scalars[a["name"]] for a in op["args"] if a["kind"] != "tensor"])
        ref = ref if isinstance(ref, tuple) else (ref,)
        results = {}
        for schedule in ("forward", "reverse"):
            for o in outs:  # sentinel-filled outputs: an element never written shows as NaN
                tensors[o] = torch.full(shapes[o], float("nan")).to(dtypes[ins[0]])
            stats = launch(example_bundle, variant, tensors, scalars, set(outs), schedule)
            assert stats.instructions > 0 and stats.lds_conflicts == [], (op["name"], target, stats)
            results[schedule] = [tensors[o].clone() for o in outs]
        for o, want, got, got_rev in zip(outs, ref, results["forward"], results["reverse"]):
            tol = references.TOLERANCES[got.dtype]
            if not torch.allclose(got.float(), want.float(), **tol) or not torch.equal(got, got_rev):
                bad = (~torch.isclose(got.float(), want.float(), **tol)).nonzero()[:3].tolist()
                failures.append(f"{op['name']}.{spec['name']} {target} {o}: first wrong elements {bad}")
    assert not failures, failures
    targets = {t for _, _, t in seen}
    assert targets == {"gfx942", "gfx950"} and len(seen) == 18, sorted(seen)


def test_a_spec_runs_from_its_offload_bundle_picking_each_target(example_bundle, references):
    manifest = json.loads((example_bundle / "manifest.json").read_text())
    if not manifest["offload_bundles"]:  # only a FLYSHIP_EXAMPLE_BUNDLE built without --offload-bundle
        pytest.skip(f"{example_bundle} has no offload bundles (the example_bundle fixture builds them)")
    key, file = next(iter(sorted(manifest["offload_bundles"].items())))
    op_name, spec_name = key.split(".", 1)
    op = next(o for o in manifest["ops"] if o["name"] == op_name)
    spec = next(s for s in op["specializations"] if s["name"] == spec_name)
    image = (example_bundle / file).read_bytes()
    assert image.startswith(b"__CLANG_OFFLOAD_BUNDLE__")
    shapes = SHAPES[op_name]
    dtypes = {k: getattr(torch, v) for k, v in spec["guard"]["dtypes"].items()}
    ins = [a["name"] for a in op["args"] if a["kind"] == "tensor"]
    outs = [o["name"] for o in op["outputs"]]
    scalars = dict(spec["example"]["scalars"])
    targets = set()
    for variant in spec["variants"]:
        tensors = {a: torch.randn(shapes[a]).to(dtypes[a]) for a in ins}
        tensors.update({o: torch.full(shapes[o], float("nan")).to(dtypes[ins[0]]) for o in outs})
        launch(example_bundle, variant, tensors, scalars, set(outs), image=image)
        want = getattr(references, op["reference"])(*[tensors[a] for a in ins], *[
            scalars[a["name"]] for a in op["args"] if a["kind"] != "tensor"])
        want = want if isinstance(want, tuple) else (want,)
        for o, w in zip(outs, want):
            torch.testing.assert_close(tensors[o].float(), w.float(), **references.TOLERANCES[tensors[o].dtype])
        targets.add(variant["code_object"]["target"])
    assert targets == {"gfx942", "gfx950"}
