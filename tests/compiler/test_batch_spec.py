"""The spec API's leading batch dimensions: Tensor(batch=True) / Output(batch=), checked before compiling by the
rule book's own batch rules (flyship.bundle.rules.check_batch)."""

from __future__ import annotations

import pytest

from flyship.compiler.spec import OpDecl, Output, Scalar, Spec, Tensor, validate
from flyship.errors import SpecError

pytestmark = pytest.mark.cpu


def _decl(*args, backward=None) -> OpDecl:
    shapes = {a.name: (8,) * a.rank for a in args if isinstance(a, Tensor)}
    dtypes = {a.name: "float32" for a in args if isinstance(a, Tensor)}
    return OpDecl(name="norm", kernel=None, args=tuple(args), specs=(Spec("f32", dtypes=dtypes, shapes=shapes),),
                  reference=None, doc="", grid=("1",), frontend="triton", backward=backward)


def test_an_output_like_a_batched_input_is_batched_unless_it_says_otherwise():
    d = _decl(Tensor("x", rank=2, batch=True), Tensor("w", rank=1), Output("out", like="x"),
              Output("plain", like="x", batch=False), Output("wout", like="w"))
    validate(d)
    assert [d.output_batch(o) for o in d.outputs] == [True, False, False]


def test_a_batched_output_whose_first_dim_is_not_a_batched_rows_count_is_a_spec_error():
    d = _decl(Tensor("x", rank=2, batch=True), Output("out", shape=("x.shape[1]",), dtype="x", batch=True))
    with pytest.raises(SpecError, match=r"expected output 'out''s first dimension to be a batched input's first "
                                        r"\(x.shape\[0\]\), got 'x.shape\[1\]'; mark the input batched, or the output"):
        validate(d)


def test_a_batched_rank_0_tensor_is_a_spec_error():
    d = _decl(Tensor("s", rank=0, batch=True), Tensor("x", rank=1), Output("out", like="x"), Scalar("eps"))
    with pytest.raises(SpecError, match="expected a tensor of rank >= 1 for leading batch dimensions, got tensor 's' "
                                        "of rank 0"):
        validate(d)


def test_the_built_manifest_records_the_batch_of_each_argument_and_output():
    from flyship.bundle import manifest as M

    arg = M.Arg(name="x", kind="tensor", rank=2, batch=True)
    data = M.to_json_obj(arg)
    assert data["batch"] is True and M.SCHEMA_VERSION == "1.5"
    assert M.to_json_obj(M.Output(name="o", shape=("x.shape[0]",), dtype="x"))["batch"] is False
