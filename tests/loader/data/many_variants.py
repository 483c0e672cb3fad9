"""Bundles of many variants, generated from the tiny bundle for load-time tests and ``bench/load_time.py``.

``generated_bundle(tiny, out, specs_per_op)`` copies the tiny bundle to ``out`` and replaces its ops with
``N_OPS`` copies of its ``add`` op, each holding ``specs_per_op`` copies of the ``f32`` specialization (variants
for gfx942, gfx950 and sm_90a, naming the tiny bundle's code objects): 21 variants for 1, 2,016 for 96. The ops
are the same whatever the count, so torch's own registration costs the same.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

N_OPS = 7


def generated_bundle(tiny_bundle: Path, out: Path, specs_per_op: int) -> Path:
    """Write the generated bundle to ``out`` (which must not exist) and return it."""
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
