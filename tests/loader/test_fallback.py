"""The fallback path in C++ (reference call under the GIL, checks, counting, the fallback-off error),
exercised without a GPU on the recording driver: real calls on CPU tensors, as a device of the given
target would take them; a call that fits a specialization is recorded instead of launched."""

from __future__ import annotations


import pytest
import torch

from flyship.errors import CallTypeError


pytestmark = pytest.mark.cpu


def test_inputs_that_fit_nothing_run_the_reference(recorded_tiny):
    ops = recorded_tiny()
    x, y = torch.randn(100, dtype=torch.float64), torch.randn(100, dtype=torch.float64)
    torch.testing.assert_close(ops.add(x, y), x + y)
    assert ops.add.stats()["fallbacks"] == {"dtype x=float64": 1}


def test_inputs_that_fit_a_specialization_do_not_run_the_reference(recorded_tiny, launches):
    ops = recorded_tiny(references={"add": lambda x, y: pytest.fail("the reference ran")})
    ops.add(torch.randn(100), torch.randn(100))
    assert [launch["symbol"] for launch in launches()] == ["add_kernel"]
    assert ops.add.stats()["launches"]["f32"] == 1


def test_the_out_variant_falls_back_into_the_out_tensors(recorded_tiny):
    ops = recorded_tiny(target="sm_90")
    x, y = torch.randn(300), torch.randn(300)
    s, d = torch.empty(600)[::2], torch.empty(300)  # `sum` is strided: the kernel cannot write it
    ops.addsub.out(x, y, sum=s, diff=d)
    torch.testing.assert_close(s, x + y)
    torch.testing.assert_close(d, x - y)
    assert ops.addsub.stats()["fallbacks"] == {"constraint 'sum.shape[0] <= 1 or sum.stride[0] == 1' false": 1}


def test_scalars_reach_the_reference(recorded_tiny):
    ops = recorded_tiny()
    x = torch.randn(4, 5, dtype=torch.float64)
    torch.testing.assert_close(ops.scale_rows(x, 0.5, -2), x * 0.5 - 2)


def test_with_the_fallback_off_the_error_says_what_did_not_fit(recorded_tiny):
    ops = recorded_tiny(fallback=False, target="gfx950")
    with pytest.raises(RuntimeError) as e:
        ops.add(torch.randn(8).half(), torch.randn(8).half())
    msg = str(e.value)
    assert "flyship_dry_" in msg and ("::add: no specialization fits these inputs (f32: dtype x=float16; f16: no code "
                                   "object for gfx950; bundle has gfx942) and the fallback is off "
                                   "(FLYSHIP_FALLBACK=0 or load(fallback=False))") in msg
    assert ops.add.stats()["fallbacks"] == {}


def test_an_op_without_reference_raises_instead_of_falling_back(bundle_copy, recorded):
    def edit(d):
        next(o for o in d["ops"] if o["name"] == "add")["reference"] = None

    ops = recorded(bundle_copy(edit))
    with pytest.raises(RuntimeError, match=r"no specialization fits these inputs \(dtype x=float64\) and the op has no "
                                           r"reference to fall back to; pass one with load\(\.\.\., references="):
        ops.add(torch.randn(8).double(), torch.randn(8).double())


def test_a_reference_that_breaks_the_output_rule_is_reported(recorded_tiny):
    ops = recorded_tiny(references={"add": lambda x, y: (x + y)[:-1]})
    with pytest.raises(RuntimeError, match=r"the reference \(fallback\) returned output 'out' of shape \[7\], dtype "
                                           r"float64 on cpu; the manifest's rule gives \[8\], float64 on cpu"):
        ops.add(torch.randn(8).double(), torch.randn(8).double())


def test_a_reference_that_raises_is_reported_with_its_message(recorded_tiny):
    def broken(x, y):
        raise ValueError("reference is broken")

    ops = recorded_tiny(references={"add": broken})
    with pytest.raises(RuntimeError, match=r"the reference \(fallback\) raised ValueError: reference is broken"):
        ops.add(torch.randn(8).double(), torch.randn(8).double())


def test_the_first_fallback_for_a_reason_warns_once(recorded_tiny):
    ops = recorded_tiny()
    x, y = torch.randn(10, dtype=torch.float64), torch.randn(10, dtype=torch.float64)
    with pytest.warns(UserWarning, match=r"no specialization fits these inputs \(dtype x=float64\); running the "
                                         r"PyTorch reference"):
        ops.add(x, y)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same reason again: counted, not warned
        ops.add(x, y)
    assert ops.add.stats()["fallbacks"] == {"dtype x=float64": 2}


def test_the_fallback_warning_points_at_the_callers_line_not_at_flyship(recorded_tiny):
    ops = recorded_tiny()
    x = torch.randn(10, dtype=torch.float64)
    with pytest.warns(UserWarning, match="running the PyTorch reference") as record:
        getattr(torch.ops, ops.namespace).add(x, x)  # through torch's own frames too
    assert record[0].filename == __file__, record[0].filename


def test_dispatch_and_calls_take_keywords_and_scalar_defaults(recorded_tiny, launches):
    ops = recorded_tiny()
    x = torch.randn(4, 300)
    assert ops.scale_rows.dispatch(x, target="gfx942").spec == ops.scale_rows.dispatch(
        x, 1.0, 0, target="gfx942").spec
    ops.scale_rows(x, alpha=2.5)
    ops.scale_rows(x, 2.5, 0)
    a, b = launches()
    assert a["kernargs"][:8] == b["kernargs"][:8] == x.data_ptr().to_bytes(8, "little")
    assert len(a["kernargs"]) == len(b["kernargs"])
    with pytest.raises(CallTypeError, match="expected keyword arguments among x, alpha, bias, got alpah=float 2.0"):
        ops.scale_rows.dispatch(x, alpah=2.0, target="gfx942")
    with pytest.raises(CallTypeError, match="expected argument 'x', got none"):
        ops.scale_rows.dispatch(target="gfx942")


def test_an_out_tensor_that_shares_memory_with_an_input_is_refused(recorded_tiny):
    ops = recorded_tiny()
    x, y = torch.randn(100), torch.randn(100)
    with pytest.raises(RuntimeError, match="out tensor 'out' shares memory with input 'x'"):
        ops.add.out(x, y, out=x)
    base = torch.randn(164)
    with pytest.raises(RuntimeError, match="shares memory with input 'y'"):
        ops.add.out(x, base[:100], out=base[64:])  # partial overlap
    ops.add.out(x, y, out=torch.empty(100))
    assert ops.add.stats()["launches"]["f32"] == 1


def test_a_reference_that_returns_its_input_gives_a_fresh_tensor(recorded_tiny):
    ops = recorded_tiny(references={"add": lambda x, y: x})
    x = torch.randn(10, dtype=torch.float64)
    out = ops.add(x, x.clone())
    assert torch.equal(out, x) and not out._is_view() and out.data_ptr() != x.data_ptr()


@pytest.mark.parametrize("value", ["off", "0", 0, None])
def test_the_fallback_switch_takes_a_bool_only_so_off_cannot_turn_it_on(recorded_tiny, value):
    from flyship.errors import ConfigError

    ops = recorded_tiny(fallback=False)
    with pytest.raises(ConfigError, match=rf"ops.fallback: expected True or False, got {value!r}"):
        ops.fallback = value
    assert ops.fallback is False
    ops.fallback = True
    assert ops.fallback is True


@pytest.mark.parametrize("value", ["0", "off", 1])
def test_load_refuses_a_fallback_that_is_not_a_bool(tiny_bundle, value):
    import flyship
    from flyship.errors import ConfigError

    with pytest.raises(ConfigError, match=r"flyship.load\(fallback=\): expected True or False, got .*; pass True"):
        flyship.load(tiny_bundle, fallback=value, namespace="flyship_never_registered")


@pytest.fixture(params=["record", "cpu"])
def loaded_with(request, recorded_tiny, fresh_ops):
    """``loaded_with(references)``: the tiny bundle on the C++ path (recording driver, gfx90a: nothing fits, every
    call falls back) or on the CPU path, and the ops in ``holder["ops"]`` for references that call them."""
    holder = {}

    def make(references):
        ops = recorded_tiny(target="gfx90a", references=references) if request.param == "record" else \
            fresh_ops(references=references)
        holder["ops"] = ops
        return ops

    return make, holder


def test_a_reference_that_falls_back_into_itself_is_refused_in_one_message(loaded_with):
    from flyship.errors import CallError
    from flyship.loader.references import MAX_ACTIVE

    make, holder = loaded_with
    ops = make({"add": lambda x, y: holder["ops"].add(x.double(), y.double()).float()})  # double falls back too
    with pytest.raises(CallError, match=rf"flyship {ops.namespace}::add: expected a reference that does not fall back "
                                        rf"into itself, got it nested {MAX_ACTIVE + 1} deep \(it calls ops.add, whose "
                                        r"inputs fit no specialization either") as e:
        ops.add(torch.randn(8), torch.randn(8))
    assert str(e.value).count("expected a reference that does not fall back") == 1 and len(str(e.value)) < 600
    ok = make({"add": lambda x, y: x + y})
    torch.testing.assert_close(ok.add(torch.ones(3), torch.ones(3)), torch.full((3,), 2.0))


def test_a_reference_may_call_its_own_op_once_more_with_other_inputs(loaded_with):
    make, holder = loaded_with

    def add(x, y):  # upcast once: the float64 call falls back too, and its reference computes it
        return x + y if x.dtype == torch.float64 else holder["ops"].add(x.double(), y.double()).to(x.dtype)

    ops = make({"add": add})
    x, y = torch.randn(8), torch.randn(8)
    torch.testing.assert_close(ops.add(x, y), x + y)
