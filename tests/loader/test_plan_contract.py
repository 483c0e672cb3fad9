"""The plan contract (``bundle/plan_contract.py``) is what both languages use: the committed C++ header is what the
table generates, the compiled extension exports the same keys, Python lowers exactly those keys, and the C++ parser
reads every one of them: a plan with any key missing, or of the wrong type, is refused naming that key.
"""

from __future__ import annotations

import copy
import uuid
from pathlib import Path
from typing import Any

import pytest

from flyship.bundle import manifest as M
from flyship.bundle import plan_contract as C
from flyship.loader import plan as _plan

pytestmark = pytest.mark.cpu

ROOT = Path(__file__).resolve().parents[2]
TINY = Path(__file__).parent / "data" / "tiny"


def test_the_committed_plan_header_is_what_the_contract_generates():
    assert (ROOT / "csrc" / C.HEADER).read_text() == C.cxx_header(), \
        "csrc/plan_fields.h is stale: run `python scripts/limits_header.py --write`"


def test_the_compiled_extensions_read_the_keys_the_python_contract_declares(ext, record_ext):
    expected = C.as_rows()
    assert [tuple(r) for r in ext.PLAN_FIELDS] == expected
    assert [tuple(r) for r in record_ext.PLAN_FIELDS] == expected


def _plan_of(op_name: str = "add") -> tuple[dict, list]:
    """The tiny bundle's op as load and first use hand it to the core, with a workspace and a following launch
    added to its first variant so that every struct of the contract occurs (lowering judges nothing)."""
    m = M.read(TINY)
    op = m.op(op_name)
    specs = _plan.lower_specs(op)
    v = specs[0]["variants"][0]
    follower = copy.deepcopy(v)
    v["workspaces"] = [{"name": "w", "dtype": "float32", "zero": False, "shape": [_plan.lower_program("4", {})]}]
    v["then"] = [follower]
    head = _plan.lower_op(op, "flyship_contract")
    head["n_code_objects"] += 1  # the following launch has a variant id too
    head["outputs"][0]["dtype_slot"] = -1  # a fixed dtype, so the core reads the output's "dtype" key
    head["outputs"][0]["dtype"] = "float32"
    plan = _plan.lower_bundle([head], "flyship_contract", [None], lambda k: specs, lambda vid: b"", lambda *a: "")
    return plan, specs


def _instances(plan: dict, specs: list) -> dict[str, dict]:
    """One dict of each struct of the contract in `plan` (the one the core reads first)."""
    op = plan["ops"][0]
    variant = specs[0]["variants"][0]
    return {"Bundle": plan, "OpPlan": op, "Slot": op["slots"][0], "OutputPlan": op["outputs"][0],
            "SpecPlan": specs[0], "VariantPlan": variant, "Field": variant["fields"][0],
            "WorkspacePlan": variant["workspaces"][0]}


def _parse(ext: Any, plan: dict) -> None:
    core = ext.Bundle(plan, lambda target: None, False)  # parses the op heads
    core.stats(0)  # parses the op's specializations (its first use)


def test_the_parser_accepts_the_plan_the_tests_edit(record_ext):
    _parse(record_ext, _plan_of()[0])


def test_python_lowers_exactly_the_keys_of_the_contract_for_every_struct():
    plan, specs = _plan_of()
    for struct, d in _instances(plan, specs).items():
        assert list(d) == [f.key for f in C.fields_of(struct)], struct
    assert set(C.STRUCTS) == {f.struct for f in C.FIELDS}


def test_a_lowering_that_lacks_or_adds_a_key_is_a_contract_error():
    with pytest.raises(RuntimeError, match=r"lacks \['dtype_slot'\] and adds \['extra'\]"):
        _plan.lower_by_contract("OutputPlan", M.read(TINY).ops[0].outputs[0],
                                {"dtype": "", "shape": [], "extra": 1})


# A value of the wrong type for each reader or C++ type a key is read as (py::object keys take any value: the
# callables).
WRONG = {"arg_kind": 1, "field_kind": 1, "field_type": 1, "dtype": 1, "std::string": 1, "int": "1", "int64_t": "1",
         "bool": 1, "std::vector<int>": ["1"], "Int3": [0, "1", 2], "U32x3": "1", "Bytes8": 1.5, "at::ScalarType": 1}
ROWS = list(C.FIELDS)


@pytest.mark.parametrize("field", ROWS, ids=[f"{f.struct}.{f.key}" for f in ROWS])
def test_the_parser_refuses_a_plan_that_lacks_a_key_naming_it(field, record_ext):
    plan, specs = _plan_of()
    del _instances(plan, specs)[field.struct][field.key]
    with pytest.raises(RuntimeError, match=f"lacks key '{field.key}'"):
        _parse(record_ext, plan)


TYPED = [f for f in C.FIELDS if f.cxx != "py::object"]


@pytest.mark.parametrize("field", TYPED, ids=[f"{f.struct}.{f.key}" for f in TYPED])
def test_the_parser_refuses_a_key_of_the_wrong_type_naming_it(field, record_ext):
    plan, specs = _plan_of()
    wrong = WRONG.get(field.reader, WRONG.get(field.cxx, 1))  # every other type is a list (of dicts, programs or pairs)
    _instances(plan, specs)[field.struct][field.key] = wrong
    with pytest.raises(RuntimeError, match=f"key '{field.key}': expected"):
        _parse(record_ext, plan)


@pytest.mark.parametrize("version", [5, 6])
def test_the_code_object_version_travels_in_the_plan_and_a_failed_v6_load_says_which_rocm_loads_it(
        version, record_ext):
    op = M.read(TINY).op("add")
    specs = _plan.lower_specs(op)
    v = specs[0]["variants"][0]
    assert v["code_object_version"] == (op.specializations[0].variants[0].code_object.code_object_version or 0)
    v["code_object_version"] = version
    v["sha256"] = uuid.uuid4().hex  # a code object no earlier test loaded (the module cache keys on it)
    plan = _plan.lower_bundle([_plan.lower_op(op, "flyship_cov")], "flyship_cov", [None], lambda k: specs,
                              lambda vid: b"not a code object", lambda *a: "")
    core = record_ext.Bundle(plan, lambda target: None, False)
    with pytest.raises(RuntimeError, match="not an ELF code object") as e:
        core.load_kernel(0, 0, 0, 0)  # the recording driver refuses the image as a runtime would
    assert ("code object v6, which ROCm releases before 6.2 refuse" in str(e.value)) == (version == 6)
    assert ("--code-object-version 5" in str(e.value)) == (version == 6)
