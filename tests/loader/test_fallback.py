"""The fallback path in C++ (reference call under the GIL, checks, counting, the fallback-off error),
exercised without a GPU through dry_run: the call is taken as a device of the given target would take
it, up to the launch."""

from __future__ import annotations

import uuid

import pytest
import torch

import flyship

pytestmark = pytest.mark.cpu


def test_inputs_that_fit_nothing_run_the_reference(fresh_ops):
    ops = fresh_ops()
    x, y = torch.randn(100, dtype=torch.float64), torch.randn(100, dtype=torch.float64)
    r = ops.add.dry_run(x, y, target="gfx942")
    assert r.spec is None
    torch.testing.assert_close(r.outputs[0], x + y)
    assert ops.add.stats()["fallbacks"] == {"dtype x=float64": 1}


def test_inputs_that_fit_a_specialization_do_not_run_the_reference(fresh_ops):
    ops = fresh_ops(references={"add": lambda x, y: pytest.fail("the reference ran")})
    r = ops.add.dry_run(torch.randn(100), torch.randn(100), target="gfx942")
    assert r.spec == "f32" and r.outputs == ()


def test_the_out_variant_falls_back_into_the_out_tensors(fresh_ops):
    ops = fresh_ops()
    x, y = torch.randn(300), torch.randn(300)
    s, d = torch.empty(600)[::2], torch.empty(300)  # `sum` is strided: the kernel cannot write it
    r = ops.addsub.dry_run(x, y, target="sm_90", out=(s, d))
    assert r.spec is None
    torch.testing.assert_close(s, x + y)
    torch.testing.assert_close(d, x - y)
    assert ops.addsub.stats()["fallbacks"] == {"constraint 'sum.shape[0] <= 1 or sum.stride[0] == 1' false": 1}


def test_scalars_reach_the_reference(fresh_ops):
    ops = fresh_ops()
    x = torch.randn(4, 5, dtype=torch.float64)
    r = ops.scale_rows.dry_run(x, 0.5, -2, target="gfx942")
    torch.testing.assert_close(r.outputs[0], x * 0.5 - 2)


def test_with_the_fallback_off_the_error_says_what_did_not_fit(fresh_ops):
    ops = fresh_ops(fallback=False)
    with pytest.raises(RuntimeError) as e:
        ops.add.dry_run(torch.randn(8).half(), torch.randn(8).half(), target="gfx950")
    msg = str(e.value)
    assert "flyship_t" in msg and ("::add: no specialization fits these inputs (f32: dtype x=float16; f16: no code "
                                   "object for gfx950; bundle has gfx942) and the fallback is off "
                                   "(FLYSHIP_FALLBACK=0 or load(fallback=False))") in msg
    assert ops.add.stats()["fallbacks"] == {}


def test_an_op_without_reference_raises_instead_of_falling_back(bundle_copy, ext):
    def edit(d):
        next(o for o in d["ops"] if o["name"] == "add")["reference"] = None

    ops = flyship.load(bundle_copy(edit), namespace=f"flyship_t{uuid.uuid4().hex[:8]}")
    with pytest.raises(RuntimeError, match=r"no specialization fits these inputs \(dtype x=float64\) and the op has no "
                                           r"reference to fall back to; pass one with load\(\.\.\., references="):
        ops.add.dry_run(torch.randn(8).double(), torch.randn(8).double(), target="gfx942")


def test_a_reference_that_breaks_the_output_rule_is_reported(fresh_ops):
    ops = fresh_ops(references={"add": lambda x, y: (x + y)[:-1]})
    with pytest.raises(RuntimeError, match=r"the reference returned output 'out' of shape \[7\], dtype float64 on cpu; "
                                           r"the manifest's rule gives \[8\], float64 on cpu"):
        ops.add.dry_run(torch.randn(8).double(), torch.randn(8).double(), target="gfx942")


def test_a_reference_that_raises_is_reported_with_its_message(fresh_ops):
    def broken(x, y):
        raise ValueError("reference is broken")

    ops = fresh_ops(references={"add": broken})
    with pytest.raises(RuntimeError, match=r"the reference \(fallback\) raised ValueError: reference is broken"):
        ops.add.dry_run(torch.randn(8).double(), torch.randn(8).double(), target="gfx942")


def test_the_first_fallback_for_a_reason_warns_once(fresh_ops):
    ops = fresh_ops()
    x, y = torch.randn(10, dtype=torch.float64), torch.randn(10, dtype=torch.float64)
    with pytest.warns(UserWarning, match=r"no specialization fits these inputs \(dtype x=float64\); running the "
                                         r"PyTorch reference"):
        ops.add.dry_run(x, y, target="gfx942")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same reason again: counted, not warned
        ops.add.dry_run(x, y, target="gfx942")
    assert ops.add.stats()["fallbacks"] == {"dtype x=float64": 2}


def test_dispatch_and_pack_take_keywords_and_scalar_defaults_like_a_call(fresh_ops):
    ops = fresh_ops()
    x = torch.randn(4, 300)
    assert ops.scale_rows.dispatch(x, target="gfx942").spec == ops.scale_rows.dispatch(
        x, 1.0, 0, target="gfx942").spec
    a = ops.scale_rows.pack_kernargs(0, x, alpha=2.5, target="gfx942")
    b = ops.scale_rows.pack_kernargs(0, x, 2.5, 0, target="gfx942")
    assert a.buffer[:8] == b.buffer[:8] and len(a.buffer) == len(b.buffer)
    with pytest.raises(TypeError, match="unknown argument 'alpah'"):
        ops.scale_rows.dispatch(x, alpah=2.0, target="gfx942")
    with pytest.raises(TypeError, match="missing argument 'x'"):
        ops.scale_rows.dispatch(target="gfx942")


def test_an_out_tensor_that_shares_memory_with_an_input_is_refused(fresh_ops):
    ops = fresh_ops()
    x, y = torch.randn(100), torch.randn(100)
    with pytest.raises(RuntimeError, match="out tensor 'out' shares memory with input 'x'"):
        ops.add.dry_run(x, y, target="gfx942", out=(x,))
    base = torch.randn(164)
    with pytest.raises(RuntimeError, match="shares memory with input 'y'"):
        ops.add.dry_run(x, base[:100], target="gfx942", out=(base[64:],))  # partial overlap
    assert ops.add.dry_run(x, y, target="gfx942", out=(torch.empty(100),)).spec == "f32"


def test_a_reference_that_returns_its_input_gives_a_fresh_tensor(fresh_ops):
    ops = fresh_ops(references={"add": lambda x, y: x})
    x = torch.randn(10, dtype=torch.float64)
    r = ops.add.dry_run(x, x.clone(), target="gfx942")
    assert r.spec is None
    assert torch.equal(r.outputs[0], x) and not r.outputs[0]._is_view() and r.outputs[0].data_ptr() != x.data_ptr()
