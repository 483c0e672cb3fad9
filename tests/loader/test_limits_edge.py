"""One table of limits for both languages (``bundle/limits.py``; ``csrc/limits.h`` is generated from it).

Each shared limit is proven the same on both sides at its edge: a manifest at the limit is accepted by the rule
book and its lowered plan by the C++ core; one past it is refused by both, each naming the limit. The C++ side is
reached directly with a plan the rule book never saw (lowering judges nothing), so its own check is what answers.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any, Callable

import pytest

from flyship.bundle import expr as E
from flyship.bundle import limits as L
from flyship.bundle import manifest as M
from flyship.bundle import rules
from flyship.bundle.errors import BundleError
from flyship.bundle.rules.ops import input_slots
from flyship.errors import ConfigError
from flyship.loader import plan as _plan
from flyship.loader import selection

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


def _launches(n: int) -> Callable[[dict], None]:
    def edit(d: dict) -> None:  # the variant and n - 1 following launches of its kernel
        for v in _variants(d):
            step = {k: x for k, x in v.items() if k not in ("then", "workspaces")}
            v["then"] = [copy.deepcopy(step) for _ in range(n - 1)]
    return edit


def _workspaces(n: int) -> Callable[[dict], None]:
    def edit(d: dict) -> None:
        for v in _variants(d):
            v["workspaces"] = [{"name": f"w{i}", "dtype": "float32", "shape": ["1"]} for i in range(n)]
    return edit


def _rank(n: int) -> Callable[[dict], None]:
    def edit(d: dict) -> None:  # one more input tensor, of rank n
        o = _op(d)
        o["args"].append({"default": None, "dtypes": ["float32"], "kind": "tensor", "name": "z", "rank": n})
        for s in o["specializations"]:
            s["guard"]["dtypes"]["z"] = "float32"
            s["example"]["shapes"]["z"] = [1] * n
    return edit


# limit name -> (edit at a value, the words each side refuses one past the limit with)
EDGES: dict[str, tuple[Callable[[int], Callable[[dict], None]], str, str]] = {
    "MAX_SLOTS": (_slots, "arguments and outputs together", "more than 64 arguments and outputs"),
    "KERNARG_BUFFER_ALIGNMENT": (_alignment, "power of two up to 64", "kernarg alignment 128"),
    "MAX_BLOCK": (_block, "block dimensions in 1..1024", "block size 1025 out of range"),
    "MAX_KERNARG_BYTES": (_kernarg_bytes, "expected a kernarg size in 0..65536, got 65537", "kernarg size 65537"),
    "MAX_LAUNCHES": (_launches, "expected at most 16 launches, got 17", "expected at most 16 launches, got 17"),
    "MAX_WORKSPACES": (_workspaces, "expected at most 16 workspaces, got 17", "expected at most 16 workspaces, got 17"),
    "MAX_RANK": (_rank, "expected a rank in 0..16, got 17", "argument 'z': expected a rank in 0..16"),
}


def _manifest(edit: Callable[[dict], None]) -> M.Manifest:
    d = json.loads((TINY / M.MANIFEST_NAME).read_text())
    d["ops"] = [_op(d)]
    edit(d)
    m = M.from_json_obj(d)  # typed, not judged: the rule book is asked below
    return dataclasses.replace(m, schema_version=M.version_for(m))  # e.g. 2.x once it has following launches


def _python_judges(limit: str, m: M.Manifest) -> None:
    """The rule book's verdict on ``m``; for workspaces the rule that counts them (a whole manifest also asks
    that each is bound to a kernel argument, which the tiny kernel has none for)."""
    if limit == "MAX_WORKSPACES":
        op = m.ops[0]
        v = op.specializations[0].variants[0]
        rules.check_workspaces(v.workspaces, M.slots(op), input_slots(op), "variant")
    else:
        rules.check_manifest(m)


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
        _python_judges(limit, at)  # the rule book accepts the limit ...
    _cxx_accepts(record_ext, at)  # ... and so does the C++ core
    past = _manifest(edit(value * 2 if limit == "KERNARG_BUFFER_ALIGNMENT" else value + 1))  # (powers of two)
    with pytest.raises(BundleError, match=python_words):
        _python_judges(limit, past)
    with pytest.raises(Exception, match=cxx_words):
        _cxx_accepts(record_ext, past)


def _chain(n: int) -> str:
    """``0 + 0 + ...`` of n constants, left to right: 3n - 1 words, two stack entries."""
    return " + ".join(["0"] * n)


def _nested(n: int) -> str:
    """``0 + (0 + (... + 0))`` of n constants: every constant is pushed before the first add, n stack entries."""
    return "0" if n == 1 else f"0 + ({_nested(n - 1)})"


def _cxx_program(ext: Any, text: str, code: list) -> tuple:
    return tuple(ext.evaluate_program({"text": text, "code": code}, [], [], [], 0))


def test_the_program_word_limit_is_the_same_in_the_expression_compiler_and_the_core(record_ext):
    # 125 + 128 words, one add: 254, then two negations: 256 (two chains, so the syntax tree nests within
    # MAX_EXPR_NESTING: one chain of 85 would nest 84 levels deep and be refused for that first)
    at = "-(" * 2 + f"({_chain(42)}) + ({_chain(43)})" + ")" * 2
    code = E.compile_program(at, {})
    assert len(code) == L.MAX_PROGRAM_WORDS
    assert _cxx_program(record_ext, at, code) == ("ok", 0)
    past = "-" + at  # one more word
    with pytest.raises(BundleError, match=f"compiles to {L.MAX_PROGRAM_WORDS + 1} words"):
        E.parse(past)
    with pytest.raises(Exception, match=f"has {L.MAX_PROGRAM_WORDS + 1} words, more than {L.MAX_PROGRAM_WORDS}"):
        _cxx_program(record_ext, past, [*code, "neg"])  # the words the compiler would have made


def test_the_program_depth_limit_is_the_same_in_the_expression_compiler_and_the_core(record_ext):
    at = _nested(L.MAX_PROGRAM_DEPTH)
    code = E.compile_program(at, {})
    assert code[: 2 * L.MAX_PROGRAM_DEPTH] == ["const", 0] * L.MAX_PROGRAM_DEPTH  # every constant first
    assert _cxx_program(record_ext, at, code) == ("ok", 0)
    past = _nested(L.MAX_PROGRAM_DEPTH + 1)
    with pytest.raises(BundleError, match=f"needing {L.MAX_PROGRAM_DEPTH + 1} stack entries"):
        E.parse(past)
    with pytest.raises(Exception, match=f"deeper than {L.MAX_PROGRAM_DEPTH} values"):
        _cxx_program(record_ext, past, ["const", 0] * (L.MAX_PROGRAM_DEPTH + 1) + ["add"] * L.MAX_PROGRAM_DEPTH)


def test_the_device_index_limit_is_the_same_in_the_loader_and_the_core(record_ext):
    last = L.MAX_DEVICES - 1
    assert selection.device_index(last, "edge") == last
    assert record_ext.device_info(last)["target"]  # the core keeps state for it
    with pytest.raises(ConfigError, match=f"expected a GPU index in 0..{last}, got {L.MAX_DEVICES}"):
        selection.device_index(L.MAX_DEVICES, "edge")
    with pytest.raises(ValueError, match=f"device index {L.MAX_DEVICES} out of range \\(0..{last}\\)"):
        record_ext.device_info(L.MAX_DEVICES)


def test_every_shared_limit_has_an_edge_test_on_both_sides():
    """The shared limits are csrc/limits.h's constants that are limits (not the plan version or a marker value);
    each is proven above at its edge, in Python and in C++."""
    shared = {name for _cxx, name in L.CXX_CONSTANTS} - {"PLAN_VERSION", "VARIANT_ON_PURPOSE"}
    proven = {*EDGES, "MAX_PROGRAM_WORDS", "MAX_PROGRAM_DEPTH", "MAX_DEVICES"}
    assert shared == proven, f"shared limits without an edge test: {sorted(shared - proven)}"
    assert len(shared) == 10
