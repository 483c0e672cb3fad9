"""Leading batch dimensions: a (B, S, H) call reaches an (M, H) kernel as the view (B*S, H), outputs come back as
(B, S, ...). The C++ path is run on the recording driver (the kernargs it packs are read back); the fake and CPU
kernels through torch; the Python rule (flyship.bundle.batch) and the C++ one (csrc/batch.cpp) against each other.

The tiny bundle's kernels (data/make_tiny_bundle.py): ``add`` and ``addsub`` are rank-1 elementwise kernels (a
batched call flattens every dim), ``scale_rows`` is a rank-2 kernel that takes shapes and strides:
x at 0, out at 8, M (i32) at 16, N (i32) at 20, x's row stride (i64) at 24, x's column stride (i32) at 32, out's
row stride (i64) at 40, alpha (f32) at 48, bias (i32) at 52.
"""

from __future__ import annotations

import random
import struct
import warnings

import pytest
import torch

from flyship.bundle import batch as _batch
from flyship.bundle import manifest as _m
from flyship.errors import BundleError, CallError

pytestmark = pytest.mark.cpu


def _batch_everything(data: dict) -> None:
    data["schema_version"] = "1.2"
    for op in data["ops"]:
        for a in op["args"]:
            a["batch"] = a["kind"] == "tensor"
        for o in op["outputs"]:
            o["batch"] = True


@pytest.fixture
def batched_bundle(bundle_copy):
    return bundle_copy(_batch_everything)


def _scale_rows_args(kernargs: bytes) -> dict:
    m, n = struct.unpack_from("<ii", kernargs, 16)
    (sx0,) = struct.unpack_from("<q", kernargs, 24)
    (sx1,) = struct.unpack_from("<i", kernargs, 32)
    (so0,) = struct.unpack_from("<q", kernargs, 40)
    x, out = struct.unpack_from("<QQ", kernargs, 0)
    return {"x": x, "out": out, "M": m, "N": n, "x_stride": (sx0, sx1), "out_stride0": so0}


def test_a_batched_call_reaches_the_kernel_flattened_with_m_equal_to_b_times_s(recorded, batched_bundle, launches):
    ops = recorded(batched_bundle)
    x = torch.randn(3, 5, 64)
    y = ops.scale_rows(x, 2.0, 1)
    assert y.shape == (3, 5, 64) and y.is_contiguous() and y._base is None  # its own tensor, not a view
    (launch,) = launches()
    got = _scale_rows_args(launch["kernargs"])
    assert got == {"x": x.data_ptr(), "out": y.data_ptr(), "M": 15, "N": 64, "x_stride": (64, 1), "out_stride0": 64}
    assert tuple(launch["grid"]) == (1, 15, 1)
    assert ops.scale_rows.stats()["launches"] == {"f32": 1} and ops.scale_rows.stats()["fallbacks"] == {}


def test_a_padded_batched_view_is_passed_without_a_copy_with_its_row_stride(recorded, batched_bundle, launches):
    ops = recorded(batched_bundle)
    big = torch.randn(2, 4, 100)
    x = big[:, :, :64]  # rows of 64 with a pitch of 100: (2, 4) flattens to 8 rows of stride 100
    ops.scale_rows(x)
    got = _scale_rows_args(launches()[0]["kernargs"])
    assert got["x"] == x.data_ptr() and got["M"] == 8 and got["x_stride"] == (100, 1)


def test_four_leading_dims_flatten_into_one(recorded, batched_bundle, launches):
    ops = recorded(batched_bundle)
    x, y = torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4, 5)
    out = ops.add(x, y)
    assert out.shape == (2, 3, 4, 5)
    n = struct.unpack_from("<i", launches()[0]["kernargs"], 24)[0]  # add's n = x.numel of the flat view
    assert n == 120


def test_a_plain_call_of_the_kernel_rank_still_runs_the_kernel(recorded, batched_bundle, launches):
    ops = recorded(batched_bundle)
    x = torch.randn(6, 64)
    y = ops.scale_rows(x, 1.0, 0)
    assert y.shape == (6, 64)
    got = _scale_rows_args(launches()[0]["kernargs"])
    assert got["M"] == 6 and got["x_stride"] == (64, 1)


def test_a_transposed_batch_that_is_no_view_falls_back_with_the_reason(recorded, batched_bundle, launches):
    ops = recorded(batched_bundle)
    x = torch.randn(5, 3, 64).transpose(0, 1)  # (3, 5, 64) whose leading dims do not flatten without a copy
    with pytest.warns(UserWarning, match="batch: 'x' of shape \\[3, 5, 64\\] and strides \\[64, 192, 1\\] does not "
                                         "flatten to \\[15, 64\\] without a copy"):
        y = ops.scale_rows(x, 2.0, 1)
    assert launches() == []
    torch.testing.assert_close(y, x * 2.0 + 1)
    assert y.shape == (3, 5, 64) and y._base is None
    (reason,) = ops.scale_rows.stats()["fallbacks"]
    assert reason.startswith("batch: 'x'")
    assert ops.scale_rows.dispatch(x, target="gfx942").reason == reason


def test_a_transposed_batch_with_the_fallback_off_raises_naming_the_layout(recorded, batched_bundle):
    ops = recorded(batched_bundle, fallback=False)
    x = torch.randn(5, 3, 64).transpose(0, 1)
    with pytest.raises(CallError, match=r"no specialization fits these inputs \(batch: 'x' of shape \[3, 5, 64\].* "
                                        r"without a copy\) and the fallback is off"):
        ops.scale_rows(x)


def test_batched_inputs_that_disagree_on_their_leading_dims_are_refused(recorded, batched_bundle):
    ops = recorded(batched_bundle)
    with pytest.raises(CallError, match=r"expected the batched inputs to agree on their leading dimensions, got "
                                        r"\[2, 3\] for 'x' and \[6\] for 'y'; pass tensors with the same leading"):
        ops.add(torch.randn(2, 3), torch.randn(6))


def test_the_out_variant_takes_an_out_tensor_with_the_leading_dims(recorded, batched_bundle, launches):
    ops = recorded(batched_bundle)
    x, out = torch.randn(2, 3, 64), torch.empty(2, 3, 64)
    assert ops.scale_rows.out(x, out=out) is out
    got = _scale_rows_args(launches()[0]["kernargs"])
    assert got["out"] == out.data_ptr() and got["M"] == 6 and got["out_stride0"] == 64


def test_an_out_tensor_without_the_leading_dims_is_refused_naming_the_shape(recorded, batched_bundle):
    ops = recorded(batched_bundle)
    with pytest.raises(CallError, match=r"expected out tensor 'out' of shape \[2, 3, 64\] and dtype float32, got "
                                        r"shape \[6, 64\]"):
        ops.scale_rows.out(torch.randn(2, 3, 64), out=torch.empty(6, 64))


def test_a_transposed_out_tensor_is_filled_through_the_fallback(recorded, batched_bundle, launches):
    ops = recorded(batched_bundle)
    x = torch.randn(2, 3, 64)
    out = torch.empty(3, 2, 64).transpose(0, 1)
    with pytest.warns(UserWarning, match="batch: 'out'"):
        ops.scale_rows.out(x, 3.0, 0, out=out)
    assert launches() == []
    torch.testing.assert_close(out, x * 3.0)


def test_an_out_tensor_overlapping_a_batched_input_is_refused(recorded, batched_bundle):
    ops = recorded(batched_bundle)
    x = torch.randn(2, 3, 64)
    with pytest.raises(CallError, match="out tensor 'out' shares memory with input 'x'"):
        ops.scale_rows.out(x, out=x)


def test_the_fake_kernel_gives_the_leading_dims_back_with_dynamic_shapes(batched_bundle, ext):
    import uuid

    import flyship

    ops = flyship.load(batched_bundle, namespace=f"flyship_b{uuid.uuid4().hex[:8]}")
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def f(x, w):
        return ops.scale_rows(ops.add(x, w), 2.0) * 1

    cf = torch.compile(f, backend=backend, fullgraph=True, dynamic=True)
    meta = dict(device="meta")
    assert cf(torch.empty(2, 3, 64, **meta), torch.empty(2, 3, 64, **meta)).shape == (2, 3, 64)
    assert cf(torch.empty(4, 7, 32, **meta), torch.empty(4, 7, 32, **meta)).shape == (4, 7, 32)
    assert len(graphs) == 1


def test_opcheck_passes_for_batched_calls_on_the_cpu(batched_bundle, ext):
    import uuid

    import flyship

    ops = flyship.load(batched_bundle, namespace=f"flyship_b{uuid.uuid4().hex[:8]}")
    torch.library.opcheck(ops.scale_rows.default, (torch.randn(2, 3, 16), 2.0, 1))
    torch.library.opcheck(ops.add.default, (torch.randn(2, 3, 4), torch.randn(2, 3, 4)))
    torch.library.opcheck(ops.addsub.default, (torch.randn(2, 5), torch.randn(2, 5)))
    torch.library.opcheck(ops.scale_rows.out_overload, (torch.randn(2, 3, 16),), {"out": torch.empty(2, 3, 16)})


def test_the_cpu_reference_sees_the_flattened_shapes_and_the_result_gets_the_leading_dims(bundle_copy, ext):
    import uuid

    import flyship

    seen = []

    def scale_rows(x, alpha=1.0, bias=0):
        seen.append(tuple(x.shape))
        return x * alpha + bias

    ops = flyship.load(bundle_copy(_batch_everything), namespace=f"flyship_b{uuid.uuid4().hex[:8]}",
                       references={"scale_rows": scale_rows})
    x = torch.randn(5, 3, 8).transpose(0, 1)  # no view: the reference gets a flattened copy
    y = ops.scale_rows(x, 2.0)
    assert seen == [(15, 8)] and y.shape == (3, 5, 8) and y._base is None
    torch.testing.assert_close(y, x * 2.0)
    out = torch.empty(3, 5, 8)
    ops.scale_rows.out(x, 1.0, 1, out=out)
    torch.testing.assert_close(out, x + 1)


def test_backward_gets_and_returns_the_leading_dims(batched_bundle, ext):
    import uuid

    import flyship

    ops = flyship.load(batched_bundle, namespace=f"flyship_b{uuid.uuid4().hex[:8]}")
    x = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    y = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    s, d = ops.addsub(x, y)
    assert s.shape == d.shape == (2, 3, 4)
    (s * 2 + d).sum().backward()
    torch.testing.assert_close(x.grad, torch.full((2, 3, 4), 3.0, dtype=torch.float64))
    torch.testing.assert_close(y.grad, torch.full((2, 3, 4), 1.0, dtype=torch.float64))
    assert torch.autograd.gradcheck(lambda a, b: ops.addsub(a, b), (x.detach().requires_grad_(),
                                                                     y.detach().requires_grad_()))


def _random_shapes(rng: random.Random) -> tuple[tuple[int, ...], tuple[int, ...]]:
    lead = tuple(rng.choice((0, 1, 2, 3, 5)) for _ in range(rng.randint(0, 3)))
    other = lead if rng.random() < 0.7 else tuple(rng.choice((1, 2, 3)) for _ in range(rng.randint(0, 3)))
    return lead, other


def test_the_python_rule_and_the_cpp_rule_agree_on_random_shapes(recorded, batched_bundle, launches):
    """flyship.bundle.batch (fake and CPU kernels) and csrc/batch.cpp (the launch path): same rows, same output
    shapes, same refusals."""
    ops = recorded(batched_bundle)
    op = _m.read(batched_bundle).op("add")
    rng = random.Random(12)
    for _ in range(150):
        lead_x, lead_y = _random_shapes(rng)
        n = rng.choice((1, 4))
        x, y = torch.randn(*lead_x, n), torch.randn(*lead_y, n)
        try:
            b = _batch.split(op, {"x": x.shape, "y": y.shape}, "add")
            want = (b.full_shape([b.rows()] if b.active else list(x.shape)), None)
        except CallError as e:
            want = (None, str(e).split(": ", 1)[1])
        launches()
        try:
            got = (list(ops.add(x, y).shape), None)
        except CallError as e:
            got = (None, str(e).split(": ", 1)[1])
        assert got == want, (x.shape, y.shape)
        if got[0] is not None and x.numel():
            assert struct.unpack_from("<i", launches()[0]["kernargs"], 24)[0] == x.numel()


@pytest.mark.parametrize("edit, message", [
    (lambda op: op["args"][1].update(batch=True), "expected a tensor of rank >= 1 for leading batch dimensions, "
                                                  "got float 'alpha'"),
    (lambda op: op["outputs"][0].update(batch=True), "expected output 'out'\\'s first dimension to be a batched "
                                                     "input's first \\(no input is batched\\)"),
    (lambda op: (op["args"][0].update(batch=True), op["outputs"][0].update(shape=["x.shape[1]", "x.shape[0]"],
                                                                           batch=True)),
     "expected output 'out'\\'s first dimension to be a batched input's first \\(x.shape\\[0\\]\\), got "
     "'x.shape\\[1\\]'"),
])
def test_the_rule_book_refuses_a_batch_declaration_that_cannot_work(bundle_copy, edit, message):
    def change(data):
        data["schema_version"] = "1.2"
        edit(next(o for o in data["ops"] if o["name"] == "scale_rows"))

    with pytest.raises(BundleError, match=message):
        _m.read(bundle_copy(change))


def test_the_rule_book_refuses_a_backward_that_drops_the_batch(bundle_copy):
    def change(data):
        data["schema_version"] = "1.2"
        op = next(o for o in data["ops"] if o["name"] == "addsub")
        op["args"][0]["batch"] = True  # x batched; its gradient is addsub's own 'sum', not batched

    with pytest.raises(BundleError, match="grads\\['x'\\] = 'sum': 'x' is batched, so its gradient must be a batched "
                                          "output of addsub"):
        _m.read(bundle_copy(change))


def test_a_1_1_manifest_without_batch_keys_loads_unbatched(tiny_bundle):
    m = _m.read(tiny_bundle)
    assert m.schema_version == "1.1"
    assert not any(a.batch for o in m.ops for a in o.args) and not any(x.batch for o in m.ops for x in o.outputs)


def test_warnings_of_batched_fallbacks_name_the_callers_line(recorded, batched_bundle):
    ops = recorded(batched_bundle)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        ops.scale_rows(torch.randn(4, 2, 8).transpose(0, 1))
    assert [x.filename for x in w] == [__file__]


def test_flyship_list_says_which_tensors_take_leading_batch_dims(batched_bundle):
    from flyship.loader.tools.cli import describe

    text = describe(_m.read(batched_bundle))
    assert "leading batch dims: x (rank 2) flatten into their first dim; out get them back" in text


def _batch_everything_x_written_in_place(data: dict) -> None:
    _batch_everything(data)
    (op,) = [o for o in data["ops"] if o["name"] == "scale_rows"]
    op["args"][0]["mutable"] = True
    data["schema_version"] = "2.1"  # mutable is a must-understand key


def test_a_batched_input_written_in_place_reaches_the_kernel_as_a_view_or_is_refused(recorded, bundle_copy, launches):
    ops = recorded(bundle_copy(_batch_everything_x_written_in_place))
    x = torch.randn(2, 3, 64)
    ops.scale_rows(x, 2.0, 1)
    (launch,) = launches()
    assert struct.unpack_from("<Q", launch["kernargs"], 0)[0] == x.data_ptr()  # the caller's memory, no copy
    # No view: a copy would take the kernel's write, so the call is refused (not a fallback to the reference).
    with pytest.raises(CallError, match=r"input 'x', which the kernel writes in place, has shape \[3, 5, 64\] and "
                                        r"strides \[64, 192, 1\], which do not flatten to \[15, 64\] without a copy"):
        ops.scale_rows(torch.randn(5, 3, 64).transpose(0, 1), 2.0, 1)
    assert launches() == []


def test_the_cpu_reference_writes_a_batched_input_in_place_through_a_view_or_is_refused(bundle_copy, ext):
    import uuid

    import flyship

    def scale_rows(x, alpha=1.0, bias=0):
        x.mul_(alpha)
        return x + bias

    ops = flyship.load(bundle_copy(_batch_everything_x_written_in_place),
                       namespace=f"flyship_b{uuid.uuid4().hex[:8]}", references={"scale_rows": scale_rows})
    x = torch.ones(2, 3, 8)
    y = ops.scale_rows(x, 2.0, 1)
    torch.testing.assert_close(x, torch.full((2, 3, 8), 2.0))
    torch.testing.assert_close(y, torch.full((2, 3, 8), 3.0))
    with pytest.raises(CallError, match=r"input 'x', which the kernel writes in place, has shape \[3, 5, 8\] .* "
                                        r"do not flatten to \[15, 8\] without a copy"):
        ops.scale_rows(torch.ones(5, 3, 8).transpose(0, 1), 2.0)


def test_a_batched_input_whose_flat_copy_cannot_be_allocated_is_refused_naming_it(recorded, batched_bundle, launches):
    ops = recorded(batched_bundle, fallback=False)
    # 4 MiB of memory, shape (2^20, 2^20) with strides (1, 0): no flat view, so add's rank-1 kernel needs a 4 TiB copy.
    x = torch.ones(1 << 20, 1).expand(1 << 20, 1 << 20)
    with pytest.raises(CallError, match=r"::add: allocating a copy \(its leading dims flatten to no view\) of input "
                                        r"'x' of shape \[1099511627776\] and dtype float32 \(4398046511104 bytes\) on "
                                        r"cpu failed: .*DefaultCPUAllocator.*; free memory or pass smaller inputs"):
        ops.add(x, x)
    assert launches() == []
