"""One table of limits for both languages (``bundle/limits.py``; ``csrc/limits.h`` is generated from it).

Each shared limit is proven the same on both sides at its edge: a manifest at the limit is accepted by the rule
book and its lowered plan by the C++ core; one past it is refused by both, each naming the limit. The C++ side is
reached directly with a plan the rule book never saw (lowering judges nothing), so its own check is what answers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest

from flyship.bundle import limits as L
from flyship.bundle import manifest as M
from flyship.bundle import rules
from flyship.bundle.errors import BundleError
from flyship.loader import plan as _plan

pytestmark = pytest.mark.cpu

ROOT = Path(__file__).resolve().parents[2]
TINY = Path(__file__).parent / "data" / "tiny"


def test_the_committed_header_is_what_bundle_limits_generates():
    assert (ROOT / "csrc" / L.HEADER).read_text() == L.cxx_header(), \
        "csrc/limits.h is stale: run `python scripts/limits_header.py --write`"


def test_the_compiled_extension_holds_every_shared_limit_of_the_python_table(ext, record_ext):
    expected = {cxx: getattr(L, name) for cxx, name in L.CXX_CONSTANTS}
    assert dict(ext.LIMITS) == expected and dict(record_ext.LIMITS) == expected
    assert ext.PLAN_VERSION == _plan.PLAN_VERSION == L.PLAN_VERSION


def _op(d: dict, name: str = "add") -> dict:
    return next(o for o in d["ops"] if o["name"] == name)


def _variants(d: dict) -> list[dict]:
    return [v for s in _op(d)["specializations"] for v in s["variants"]]


def _slots(n: int) -> Callable[[dict], None]:
    def edit(d: dict) -> None:  # the add op (x, y -> out) with int scalars until it has n slots
        o = _op(d)
        o["args"] += [{"default": 0, "dtypes": [], "kind": "int", "name": f"s{i}", "rank": 0}
                      for i in range(n - len(o["args"]) - len(o["outputs"]))]
    return edit


def _alignment(a: int) -> Callable[[dict], None]:
    def edit(d: dict) -> None:
        for v in _variants(d):
            v["kernargs"]["alignment"] = a
    return edit


def _block(b: int) -> Callable[[dict], None]:
    def edit(d: dict) -> None:
        for v in _variants(d):
            v["launch"]["block"] = [b, 1, 1]
            v["metadata"]["max_flat_workgroup_size"] = min(b, L.MAX_BLOCK)
            v["metadata"]["reqd_workgroup_size"] = None
    return edit


def _kernarg_bytes(n: int) -> Callable[[dict], None]:
    def edit(d: dict) -> None:
        for v in _variants(d):
            v["kernargs"]["size"] = n
            v["metadata"]["kernarg_segment_size"] = min(n, L.MAX_KERNARG_BYTES)
    return edit


# limit name -> (edit at a value, the words each side refuses one past the limit with)
EDGES: dict[str, tuple[Callable[[int], Callable[[dict], None]], str, str]] = {
    "MAX_SLOTS": (_slots, "arguments and outputs together", "more than 64 arguments and outputs"),
    "KERNARG_BUFFER_ALIGNMENT": (_alignment, "power of two up to 64", "kernarg alignment 128"),
    "MAX_BLOCK": (_block, "block dimensions in 1..1024", "block size 1025 out of range"),
    "MAX_KERNARG_BYTES": (_kernarg_bytes, "expected a kernarg size in 0..65536, got 65537", "kernarg size 65537"),
}


def _manifest(edit: Callable[[dict], None]) -> M.Manifest:
    d = json.loads((TINY / M.MANIFEST_NAME).read_text())
    d["ops"] = [_op(d)]
    edit(d)
    return M.from_json_obj(d)  # typed, not judged: the rule book is asked below


def _cxx_accepts(ext: Any, m: M.Manifest) -> None:
    """The C++ core parses the op's lowered head and its specializations (what load and first use hand it)."""
    op = m.ops[0]
    lowered = _plan.lower_bundle([_plan.lower_op(op, "flyship_edge")], "flyship_edge", [None],
                                 lambda k: _plan.lower_specs(op), lambda vid: b"", lambda *a: "")
    core = ext.Bundle(lowered, lambda target: [[(-1, "no device")] * len(op.specializations)], False)
    core.stats(0)  # parses the specializations (the op's first use)


@pytest.mark.parametrize("limit", sorted(EDGES))
def test_each_shared_limit_is_accepted_at_its_edge_and_refused_one_past_it_by_both_languages(limit, record_ext):
    edit, python_words, cxx_words = EDGES[limit]
    value = getattr(L, limit)
    at = _manifest(edit(value))
    if limit != "MAX_KERNARG_BYTES":  # a 64 KiB segment needs more fields than one layout may have to tile
        rules.check_manifest(at)  # the rule book accepts the limit ...
    _cxx_accepts(record_ext, at)  # ... and so does the C++ core
    past = _manifest(edit(value * 2 if limit == "KERNARG_BUFFER_ALIGNMENT" else value + 1))  # (powers of two)
    with pytest.raises(BundleError, match=python_words):
        rules.check_manifest(past)
    with pytest.raises(Exception, match=cxx_words):
        _cxx_accepts(record_ext, past)
