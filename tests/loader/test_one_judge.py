"""One judge per rule: the rule book (``flyship.bundle.rules``) alone decides whether a manifest is acceptable.
flyc-build's write check, the manifest reader and ``flyship.load`` refuse a broken rule with the rule book's own
words; the spec API refuses a declaration whose manifest would break one with the same words; the loader's lowering
(``loader/plan.py``) judges nothing, and a frontend is an open name the loader needs no table of."""

from __future__ import annotations

import dataclasses
import json
import shutil
import uuid
from pathlib import Path
from typing import Any, Callable

import pytest

import flyship
from flyship.bundle import manifest as M
from flyship.bundle import rules
from flyship.bundle.errors import BundleError
from flyship.errors import SpecError
from flyship.loader import plan as _plan

pytestmark = pytest.mark.cpu

TINY = Path(__file__).parent / "data" / "tiny"


def edited(edit: Callable[[dict], Any]) -> dict:
    d = json.loads((TINY / M.MANIFEST_NAME).read_text())
    edit(d)
    return d


def fields(d: dict, op: str = "scale_rows") -> list[dict]:
    o = next(o for o in d["ops"] if o["name"] == op)
    return next(v for v in o["specializations"][0]["variants"] if v["target"] == "gfx942")["kernargs"]["fields"]


# Rules that loader/plan.py used to judge on its own, more leniently (a pointer typed u64/i64, a negative dim), one
# it did not judge at all (a float constant its type cannot hold crashed the lowering), and rules only the C++ core
# judged (its 64-byte kernarg buffer, an op with no tensor to take the device from).
BROKEN = {
    "a pointer field typed u64": (lambda d: fields(d)[0].update(type="u64"),
                                  r"fields\[0\]\.type: a pointer field has type 'u64'"),
    "a negative dimension": (lambda d: fields(d)[2].update(dim=-1),
                             r"fields\[2\]\.dim: expected a dimension of 'x' \(rank 2\), got -1"),
    "an f32 constant out of range": (lambda d: fields(d)[7].update(kind="constant", value=1e39, arg=None),
                                     r"fields\[7\]\.value: expected a number that fits f32, got 1e\+39"),
    "kernargs aligned beyond the loader's buffer": (lambda d: [v["kernargs"].update(alignment=128) for v in next(
        o for o in d["ops"] if o["name"] == "add")["specializations"][0]["variants"]],
        r"kernargs\.alignment: expected a power of two up to 64"),
    "a frontend that is not a name": (lambda d: d["ops"][0].update(frontend="my-dsl"),
                                      r"ops\[0\] \(op add\)\.frontend: expected an ASCII identifier"),
}


def _tail(message: str) -> str:
    """A refusal's words after the file it names (each path names the manifest its own way)."""
    return message.split("manifest.json: ", 1)[-1]


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_rule_is_refused_by_the_rule_book_in_the_reader_and_at_load_with_the_same_words(case, tmp_path):
    edit, message = BROKEN[case]
    d = edited(edit)
    with pytest.raises(BundleError, match=message) as judged:
        rules.check_manifest(M.from_json_obj(d))
    with pytest.raises(BundleError, match=message) as read:
        M.parse(json.dumps(d).encode(), "bad/manifest.json")
    root = tmp_path / "bundle"
    shutil.copytree(TINY, root)
    (root / M.MANIFEST_NAME).write_text(json.dumps(d))
    with pytest.raises(BundleError, match=message) as loaded:
        flyship.load(root, namespace=f"flyship_j{uuid.uuid4().hex[:8]}")
    assert _tail(str(read.value)) == _tail(str(loaded.value)) == str(judged.value)


def test_flyc_builds_write_check_refuses_a_broken_rule_with_the_words_load_uses(tmp_path):
    from flyship.compiler import pipeline

    good = M.read(TINY)
    op = good.op("add")
    broken = dataclasses.replace(good, ops=(dataclasses.replace(op, frontend="my-dsl"), *good.ops[1:]))
    files = {p.name: p.read_bytes() for p in TINY.iterdir() if p.name != M.MANIFEST_NAME}
    with pytest.raises(BundleError, match=BROKEN["a frontend that is not a name"][1]) as written:
        pipeline.write_bundle(broken, files, tmp_path / "out", force=False)
    assert not (tmp_path / "out").exists()
    with pytest.raises(BundleError) as judged:
        rules.check_manifest(broken)
    assert _tail(str(written.value)) == str(judged.value)


def test_a_new_frontend_needs_no_change_to_the_bundle_contract():
    d = edited(lambda d: d["ops"][0].update(frontend="mydsl"))
    m = M.parse(json.dumps(d).encode(), "new/manifest.json")
    assert m.ops[0].frontend == "mydsl"
    old = M.read(TINY)
    assert _plan.lower_specs(m.ops[0]) == _plan.lower_specs(old.ops[0])
    assert _plan.lower_op(m.ops[0], "ns") == _plan.lower_op(old.ops[0], "ns")
    assert {"flydsl", "triton"} >= {o.frontend for o in old.ops}  # old bundles still read


def test_the_spec_api_refuses_a_declaration_with_the_rule_books_words():
    from flyship.compiler.spec import OpDecl, Output, Spec, Tensor, validate

    decl = OpDecl(name="k", kernel=None, args=(Tensor("x", rank=1), Output("out", shape=("x.shape[0]",),
                                                                            dtype="float33")),
                  specs=(Spec("f", dtypes={"x": "float32"}, shapes={"x": (8,)}),), reference=None, doc="",
                  grid=("x.numel",), frontend="triton")
    with pytest.raises(SpecError) as declared:
        validate(decl)
    head = M.Op(name="k", frontend="triton", doc="", args=(M.Arg(name="x", kind="tensor", rank=1),),
                outputs=(M.Output(name="out", shape=("x.shape[0]",), dtype="float33"),), reference=None,
                specializations=())
    with pytest.raises(BundleError) as judged:
        rules.check_op_head(head, "op k")
    assert str(declared.value) == str(judged.value)
    assert "output out dtype 'float33' is neither a dtype nor an input tensor (x)" in str(declared.value)


def test_the_schema_builders_rules_are_the_rule_books_and_refused_when_the_manifest_is_read():
    from flyship.loader import opschema as schema

    op = M.Op(name="k", frontend="triton", doc="", args=(M.Arg(name="out", kind="tensor", rank=1),),
              outputs=(M.Output(name="y", shape=("out.shape[0]",), dtype="out"),), reference=None,
              specializations=())
    with pytest.raises(BundleError, match=r"op k: input names \['out'\] collide with the out= argument names") as built:
        schema.out_names(op)
    with pytest.raises(BundleError) as judged:
        rules.check_op_head(op, "op k")
    assert str(built.value) == str(judged.value)
    many = dataclasses.replace(op, args=tuple(M.Arg(name=f"x{i}", kind="tensor", rank=1, mutable=True)
                                              for i in range(27)), outputs=())
    with pytest.raises(BundleError, match=r"expected at most 26 outputs and in-place inputs together"):
        rules.check_op_head(many, "op k")
    with pytest.raises(BundleError, match=r"expected at most 26 outputs and in-place inputs together"):
        schema.schemas(many)
