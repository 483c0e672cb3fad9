"""Loading costs no code-object work: a variant's code object is read and checked (sha256, ELF, metadata against
the manifest, by the rule book) when the variant is first loaded onto a device, never at ``flyship.load``.

The bundles here are generated from the tiny bundle: the same seven ops (so torch's own registration costs the
same), with 1 or 96 specializations of three variants each (21 or 2,016 variants)."""

from __future__ import annotations

import copy
import json
import shutil
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import pytest

import flyship
from flyship.bundle.errors import BundleError

pytestmark = pytest.mark.cpu

N_OPS = 7


def generated_bundle(tiny_bundle: Path, out: Path, specs_per_op: int) -> Path:
    """The tiny bundle's ``add`` f32 specialization (variants for gfx942, gfx950, sm_90a) copied into
    ``N_OPS`` ops of ``specs_per_op`` specializations each; every variant names the tiny bundle's files."""
    shutil.copytree(tiny_bundle, out)
    data = json.loads((tiny_bundle / "manifest.json").read_text())
    add = next(o for o in data["ops"] if o["name"] == "add")
    base = next(s for s in add["specializations"] if s["name"] == "f32")
    ops = []
    for j in range(N_OPS):
        op = copy.deepcopy(add)
        op["name"] = f"add{j}"
        op["specializations"] = [dict(copy.deepcopy(base), name=f"f32_{k}") for k in range(specs_per_op)]
        ops.append(op)
    data["ops"] = ops
    (out / "manifest.json").write_text(json.dumps(data, sort_keys=True, indent=1) + "\n")
    return out


def best_load_time(bundle: Path, load: Callable[..., Any], repeats: int = 2) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        load(bundle, namespace=f"flyship_l{uuid.uuid4().hex[:10]}")
        best = min(best, time.perf_counter() - t)
    return best


def test_load_reads_no_code_object_and_a_damaged_one_is_refused_when_its_variant_is_first_loaded(
        tiny_bundle, recorded, launches, tmp_path):
    root = generated_bundle(tiny_bundle, tmp_path / "b", 2)
    path = root / "add.f32.gfx942.hsaco"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    (root / "add.f32.sm_90a.cubin").unlink()
    ops = recorded(root, target="gfx942:sramecc+:xnack-")  # the load reads neither file
    import torch

    x = torch.randn(4096)
    with pytest.raises(BundleError, match=r"add\.f32\.gfx942\.hsaco\): sha256 mismatch"):
        ops.add0(x, x)
    with pytest.raises(BundleError, match=r"sha256 mismatch"):
        ops.check()
    assert launches() == []  # nothing reached the driver


def test_a_good_variant_is_checked_once_at_its_first_call_and_launches(tiny_bundle, recorded, launches, tmp_path):
    root = generated_bundle(tiny_bundle, tmp_path / "b", 2)
    ops = recorded(root, target="gfx942:sramecc+:xnack-")
    import torch

    x = torch.randn(4096)
    assert ops.add0(x, x).shape == x.shape  # the recording driver records the launch, it runs no kernel
    assert ops.add1(x, x).shape == x.shape
    assert [launch["symbol"] for launch in launches()] == ["add_kernel", "add_kernel"]
    assert ops.check() == N_OPS * 2 * 3


def test_load_time_does_not_scale_with_code_objects(tiny_bundle, ext, tmp_path):
    # 2,016 variants against 21, same ops: the code objects are never read at load. What still grows with the
    # variant count is reading, checking and lowering the manifest itself (JSON, about 4 KB per variant);
    # docs/perf.md gives the per-variant cost. The bound is loose for a noisy shared 2-core machine.
    small = generated_bundle(tiny_bundle, tmp_path / "small", 1)
    large = generated_bundle(tiny_bundle, tmp_path / "large", 96)
    best_load_time(small, flyship.load, 1)  # warm up: torch's first registrations, imports
    t_small = best_load_time(small, flyship.load)
    t_large = best_load_time(large, flyship.load)
    per_variant = (t_large - t_small) / (N_OPS * 95 * 3)
    assert per_variant < 5e-3, f"load: {t_small * 1e3:.1f} ms for 21 variants, {t_large * 1e3:.1f} ms for 2,016"
