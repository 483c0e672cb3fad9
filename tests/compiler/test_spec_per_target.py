"""Spec(per_target=...): how a spec's fields vary per target under one name, and the mistakes refused when the
spec file is read (issue 9, pattern 8)."""

from __future__ import annotations

import pytest

from flyship.compiler.spec import Constexpr, OpDecl, Output, Spec, Tensor, validate
from flyship.errors import SpecError

pytestmark = pytest.mark.cpu

FP8 = Spec("fp8", dtypes={"x": "float8_e4m3fnuz"}, shapes={"x": (256, 1024)}, constexprs={"BLOCK": 64},
           constraints=("x.shape[1] <= 8192",),
           per_target={"gfx950": dict(dtypes={"x": "float8_e4m3fn"}, constexprs={"BLOCK": 128},
                                      constraints=("x.shape[0] >= 1",), options={"num_warps": 8})})


def _op(*specs: Spec) -> OpDecl:
    return OpDecl(name="k", kernel=None, args=(Tensor("x", rank=2), Output("out", like="x"), Constexpr("BLOCK")),
                  specs=specs, reference=None, doc="", grid=("x.numel",), frontend="triton")


def test_a_per_target_entry_is_merged_over_the_spec_for_its_processor_and_any_of_its_target_ids():
    for target in ("gfx950", "gfx950:sramecc+:xnack-"):
        s = FP8.for_target(target)
        assert s.name == "fp8" and s.per_target == {}
        assert s.dtypes == {"x": "float8_e4m3fn"} and s.constexprs == {"BLOCK": 128}
        assert s.constraints == ("x.shape[1] <= 8192", "x.shape[0] >= 1")  # added to the spec's own
        assert s.options == {"num_warps": 8} and s.shapes == {"x": (256, 1024)}
    assert FP8.for_target("gfx942") is FP8


def test_an_entry_for_a_full_target_id_wins_over_one_for_its_processor():
    s = Spec("f", dtypes={"x": "float32"}, shapes={"x": (8, 8)}, constexprs={"BLOCK": 1},
             per_target={"gfx942": dict(constexprs={"BLOCK": 2}),
                          "gfx942:sramecc+:xnack-": dict(constexprs={"BLOCK": 3})})
    assert s.for_target("gfx942").constexprs == {"BLOCK": 2}
    assert s.for_target("gfx942:sramecc-:xnack+").constexprs == {"BLOCK": 2}
    assert s.for_target("gfx942:sramecc+:xnack-").constexprs == {"BLOCK": 3}


def test_every_form_of_a_spec_is_checked_against_the_op():
    validate(_op(FP8))
    bad = Spec("fp8", dtypes={"x": "float8_e4m3fnuz"}, shapes={"x": (256, 1024)}, constexprs={"BLOCK": 64},
               per_target={"gfx950": dict(dtypes={"x": "float8_e4m3"})})
    with pytest.raises(SpecError, match=r"op k \(per_target gfx950\) spec fp8: dtype of 'x' missing or unknown"):
        validate(_op(bad))


def test_a_spec_whose_own_fields_are_incomplete_is_told_to_limit_its_targets():
    only = dict(dtypes={"x": "float32"})
    s = Spec("f", dtypes={}, shapes={"x": (8, 8)}, constexprs={"BLOCK": 1}, per_target={"gfx942": only})
    with pytest.raises(SpecError, match=r"write targets=\('gfx942',\) to build it only there"):
        validate(_op(s))
    validate(_op(Spec("f", dtypes={}, shapes={"x": (8, 8)}, constexprs={"BLOCK": 1}, targets=("gfx942",),
                      per_target={"gfx942": only})))


@pytest.mark.parametrize("per_target, message", [
    ({"gfx942:xnack": {}}, r"per_target\['gfx942:xnack'\]: target ID 'gfx942:xnack': expected an AMD target"),
    ({"gfx950": {"name": "g"}}, r"\['name'\] cannot vary per target; it takes dtypes, shapes"),
    ({"gfx950": ["dtypes"]}, r"expected a dict of Spec fields"),
    ({"gfx950": {"cu_count": 80}}, r"cu_count is given for the whole spec \(304\) and per target"),
])
def test_a_per_target_mistake_is_refused_naming_the_entry(per_target, message):
    with pytest.raises(SpecError, match=message):
        Spec("f", dtypes={"x": "float32"}, shapes={"x": (8, 8)}, cu_count=304 if "cu_count" in str(per_target)
             else None, per_target=per_target)


def test_an_entry_for_a_target_the_spec_is_not_limited_to_is_refused_as_never_built():
    with pytest.raises(SpecError, match=r"limited to targets=\('gfx950',\), which never includes gfx942"):
        Spec("f", dtypes={"x": "float32"}, shapes={"x": (8, 8)}, targets=("gfx950",),
             per_target={"gfx942": dict(constexprs={"BLOCK": 2})})


def test_an_fx_pointer_must_point_to_the_tensors_dtype_or_the_declared_pointee():
    from flyship.compiler.frontends.base import FrontendError
    from flyship.compiler.frontends.flydsl.host_ir import check_pointee

    op = _op(FP8)
    spec = Spec("f", dtypes={"x": "float32"}, shapes={"x": (8, 8)}, constexprs={"BLOCK": 1})
    check_pointee("!fly.ptr<f32, global, align<4>>", op.args[0], op, spec, "w")
    with pytest.raises(FrontendError, match=r"parameter x is an fx.Pointer of type !fly.ptr<i8, global>; expected a "
                                            r"global pointer to f32 \(the tensor's dtype float32"):
        check_pointee("!fly.ptr<i8, global>", op.args[0], op, spec, "w")
    check_pointee("!fly.ptr<i8, global>", Tensor("x", rank=2, pointee="uint8"), op, spec, "w")
    with pytest.raises(FrontendError, match="expected a global pointer"):
        check_pointee("!fly.ptr<f32, shared>", op.args[0], op, spec, "w")


def test_an_output_dtype_in_a_specs_dtypes_is_refused_naming_output_per_target():
    # Issue 34 item 2: the refusal said "'out' names no input tensor"; an output's dtype is the op's, on its Output.
    op = OpDecl(name="quant", kernel=None, args=(Tensor("x", rank=1), Output("out", like="x", dtype="float8_e4m3fnuz"),
                                                 Constexpr("BLOCK")),
                specs=(Spec("bf16", dtypes={"x": "bfloat16"}, shapes={"x": (1000,)}, constexprs={"BLOCK": 256},
                            per_target={"gfx950": dict(dtypes={"out": "float8_e4m3fn"})}),),
                reference=None, doc="", grid=("x.numel",), frontend="triton")
    with pytest.raises(SpecError, match=r"op quant \(per_target gfx950\) spec bf16: dtypes names output 'out'; an "
                                        r"output's dtype is the op's, declared on its Output .* Output\('out', \.\.\., "
                                        r"dtype='float8_e4m3fn', per_target=\{'gfx942': 'float8_e4m3fnuz'\}\)"):
        validate(op)


def _fp8_op(**output):
    return OpDecl(name="quant", kernel=None, args=(Tensor("x", rank=1), Output("out", like="x", **output),
                                                   Constexpr("BLOCK")),
                  specs=(Spec("bf16", dtypes={"x": "bfloat16"}, shapes={"x": (1000,)}, constexprs={"BLOCK": 256}),),
                  reference=None, doc="", grid=("x.numel",), frontend="triton")


def test_an_output_dtype_per_target_is_the_outputs_dtype_where_it_applies():
    from flyship.compiler.spec.checks import manifest_head

    op = _fp8_op(dtype="float8_e4m3fn", per_target={"gfx942": "float8_e4m3fnuz", "gfx90a:xnack+": "bfloat16"})
    validate(op)
    spec = op.specs[0]
    assert op.outputs[0].per_target == (("gfx90a:xnack+", "bfloat16"), ("gfx942", "float8_e4m3fnuz"))
    got = {t: op.for_target(t).output_dtype_for(op.for_target(t).outputs[0], spec)
           for t in ("gfx942", "gfx942:sramecc+:xnack-", "gfx950", "gfx90a", "gfx90a:xnack+")}
    assert got == {"gfx942": "float8_e4m3fnuz", "gfx942:sramecc+:xnack-": "float8_e4m3fnuz",
                   "gfx950": "float8_e4m3fn", "gfx90a": "float8_e4m3fn", "gfx90a:xnack+": "bfloat16"}
    out = manifest_head(op).outputs[0]
    assert out.dtype == "float8_e4m3fn" and out.target_dtypes == {"gfx942": "float8_e4m3fnuz",
                                                                  "gfx90a:xnack+": "bfloat16"}
    assert op.output_target_dtypes(op.outputs[0], ["gfx950", "gfx942"]) == {"gfx942": "float8_e4m3fnuz"}


@pytest.mark.parametrize("output, message", [
    (dict(dtype="float8_e4m3fn", per_target={"gfx0942": "float8_e4m3fnuz"}), r"per_target\['gfx0942'\]: .*gfx942"),
    (dict(dtype="float8_e4m3fn", per_target={"gfx942": 8}), r"expected per_target to be a dict of target -> dtype"),
    (dict(dtype="float8_e4m3fn", per_target={"gfx942": "float9"}), r"dtype 'float9' is neither a dtype"),
    (dict(dtype="float8_e4m3fn", per_target={"gfx942": "float8_e4m3fn"}), r"its dtype everywhere \(dtype\) too"),
])
def test_a_bad_per_target_output_dtype_is_refused_when_declared(output, message):
    with pytest.raises(SpecError, match=message):
        validate(_fp8_op(**output))
