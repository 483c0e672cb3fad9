"""The Triton examples bundle's gfx942 code objects (examples/triton/ops.py, each op's first specialization and its
``__generic`` twin) executed on the
emulated device against the bundle's references, mutated arguments included. An emulated run, not a GPU run;
sm_90 cubins are not executed here."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from flyship.bundle import expr
from tests.emulate.bundle_launch import launch

pytestmark = pytest.mark.cpu
KEEP_SHAPES = {"gemm", "gemm_tma"}  # GEMMs at their example shapes (tails in M, N and K); the others at 2 rows


def _inputs(op, spec, gen):
    dtypes = {k: getattr(torch, v) for k, v in spec["guard"]["dtypes"].items()}
    tensors = {}
    for a in op["args"]:
        if a["kind"] != "tensor":
            continue
        shape = list(spec["example"]["shapes"][a["name"]])
        if op["name"] not in KEEP_SHAPES and len(shape) >= 2:
            shape[0] = 2
        tensors[a["name"]] = torch.randn(shape, generator=gen).to(dtypes[a["name"]])
    return tensors


def test_every_triton_example_runs_on_gfx942_and_matches_its_reference(triton_examples_bundle):
    bundle = triton_examples_bundle
    manifest = json.loads((bundle / "manifest.json").read_text())
    spec_ = importlib.util.spec_from_file_location("emulate_triton_refs", bundle / "references.py")
    refs = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(refs)
    failures, ran = [], 0
    for op in manifest["ops"]:
        # The first specialization of each op and its __generic twin (the suite's time; every one passes here too).
        first = op["specializations"][0]["name"].removesuffix("__generic")
        for spec in op["specializations"]:
            if spec["name"].removesuffix("__generic") != first:
                continue
            for variant in spec["variants"]:
                if variant["code_object"]["target"] != "gfx942":
                    continue
                gen = torch.Generator().manual_seed(ran)
                tensors = _inputs(op, spec, gen)
                scalars = dict(spec["example"]["scalars"])
                shapes = {k: tuple(t.shape) for k, t in tensors.items()}
                for o in op["outputs"]:
                    shape = [expr.evaluate_with_shapes(e, shapes, {}) for e in o["shape"]]
                    dtype = tensors[o["dtype"]].dtype if o["dtype"] in tensors else getattr(torch, o["dtype"])
                    tensors[o["name"]] = (torch.zeros(shape, dtype=dtype) if o["zero"]
                                          else torch.full(shape, float("nan")).to(dtype))
                mutable = {a["name"] for a in op["args"] if a.get("mutable")}
                ref_args = {k: t.clone() for k, t in tensors.items()}
                want = getattr(refs, op["reference"])(
                    *[ref_args[a["name"]] if a["kind"] == "tensor" else scalars[a["name"]] for a in op["args"]])
                want = () if want is None else (want if isinstance(want, tuple) else (want,))
                launch(bundle, variant, tensors, scalars, {o["name"] for o in op["outputs"]} | mutable)
                checks = list(zip([o["name"] for o in op["outputs"]], want)) + [(m, ref_args[m]) for m in mutable]
                for name, w in checks:
                    got = tensors[name]
                    tol = refs.TOLERANCES.get(got.dtype, dict(atol=1e-5, rtol=1e-5))
                    if got.shape != w.shape or not torch.allclose(got.float(), w.float(), **tol):
                        failures.append(f"{op['name']}.{spec['name']} {name}")
                ran += 1
    assert not failures, failures
    assert ran >= 9, ran
