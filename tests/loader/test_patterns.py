"""The issue-9 pattern ops (examples/flydsl/patterns.py) in the workload Python: the loader packs each
example call exactly where the code object's metadata puts each argument, and dispatches by layout and by
the 32-bit edge as the guards say."""

from __future__ import annotations

import struct
import uuid
import pytest
import torch

import flyship
from flyship.bundle.codeobject import CodeObjectFile
from flyship.bundle.expr import evaluate_with_shapes
from flyship.loader.tools.verify import example_inputs

pytestmark = pytest.mark.cpu
FMT = {"ptr": "<Q", "i32": "<i", "i64": "<q", "f32": "<f"}
I32_MAX = 2**31 - 1


@pytest.fixture(scope="module")
def patterns(patterns_bundle, ext):
    return patterns_bundle, flyship.load(patterns_bundle, namespace=f"flyship_p{uuid.uuid4().hex[:8]}")


def test_every_pattern_example_launches_each_field_at_the_code_objects_own_offset(patterns_bundle, recorded,
                                                                                 launches):
    checked = 0
    for target in ("gfx942", "gfx950"):
        ops = recorded(patterns_bundle, target=target)
        for handle in ops:
            for spec in handle.manifest.specializations:
                v = next(v for v in spec.variants if v.target == target)
                inputs = example_inputs(handle.manifest, spec, "cpu")
                assert handle.dispatch(*inputs, target=target).spec == spec.name, (handle.name, spec.name)
                result = handle(*inputs)
                outputs = result if isinstance(result, tuple) else (result,)
                got_launches = launches()
                assert [g["symbol"] for g in got_launches] == [t.code_object.symbol for t in v.launches]
                values = {a.name: t for a, t in zip(handle.manifest.args, inputs)}
                values.update({o.name: t for o, t in zip(handle.manifest.outputs, outputs)})
                shapes = {k: tuple(x.shape) for k, x in values.items() if isinstance(x, torch.Tensor)}
                workspaces: dict[str, int] = {}  # one buffer per workspace, shared by every launch of the call
                for step, launch in zip(v.launches, got_launches):
                    meta = CodeObjectFile((patterns_bundle / step.code_object.file).read_bytes()).kernel_metadata(
                        step.code_object.symbol)
                    explicit = [a for a in meta.args if not a.hidden]
                    buf = launch["kernargs"]
                    assert len(buf) == explicit[-1].offset + explicit[-1].size
                    assert tuple(launch["grid"]) == tuple(evaluate_with_shapes(g, shapes) for g in step.launch.grid)
                    starts = {a.offset for a in explicit}
                    for f in step.kernargs.fields:
                        t = values.get(f.arg)
                        got = struct.unpack_from(FMT[f.type], buf, f.offset)[0]
                        if f.kind == "workspace":
                            assert got != 0 and workspaces.setdefault(f.arg, got) == got, (handle.name, f)
                            continue
                        want = {"pointer": lambda: t.data_ptr(), "shape": lambda: t.shape[f.dim],
                                "stride": lambda: t.stride(f.dim), "scalar": lambda: t,
                                "expr": lambda: evaluate_with_shapes(f.expr, shapes)}[f.kind]()
                        assert got == pytest.approx(want), (handle.name, spec.name, target, f)
                        if f.kind == "pointer" or (f.kind == "expr" and not v.workspaces):
                            assert f.offset in starts  # a whole kernel argument of its own (a Value)
                        checked += 1
                buf = got_launches[0]["kernargs"]
                assert tuple(got_launches[0]["grid"]) == tuple(spec.example.grid)
                if handle.name == "scale" and spec.name == "f32_colmajor":
                    assert values["x"].stride() == (1, 1000)
                    (f,) = [f for f in v.kernargs.fields if f.arg == "x" and f.kind == "stride"]
                    assert struct.unpack_from("<q", buf, f.offset)[0] == 1000  # the real stride, never 1
    assert checked > 50


def test_a_call_goes_to_the_specialization_built_for_its_layout(patterns):
    _, ops = patterns
    w = torch.randn(512, 1000)
    assert ops.scale.dispatch(w.t(), 2.0, target="gfx942").spec == "f32_colmajor"
    assert ops.scale.dispatch(w.t().contiguous(), 2.0, target="gfx942").spec == "f32"


def test_a_grid_that_would_wrap_in_the_launchers_i32_arithmetic_is_not_launched(patterns):
    _, ops = patterns
    fits = torch.empty((1, I32_MAX - 255), device="meta")
    wraps = torch.empty((1, I32_MAX - 254), device="meta")
    assert ops.scale.dispatch(fits, 2.0, target="gfx942").spec == "f32"
    assert ops.scale.dispatch(wraps, 2.0, target="gfx942").spec is None


def test_an_op_with_an_output_called_out_takes_its_outputs_by_name_or_as_one_tuple(patterns):
    _, ops = patterns
    x = torch.randn(4, 256)
    s, t = torch.empty(4, 256), torch.empty(4, 256)
    assert ops.scale_and_add_one.out(x, 2.0, scaled=s, out=t) == (s, t)
    torch.testing.assert_close((s, t), (2 * x, 2 * x + 1))
    s2, t2 = torch.empty(4, 256), torch.empty(4, 256)
    got = ops.scale_and_add_one.out(x, 3.0, out=(s2, t2))
    assert got[0] is s2 and got[1] is t2
    torch.testing.assert_close((s2, t2), (3 * x, 3 * x + 1))


@pytest.mark.parametrize("outs, message", [
    (lambda s, t: {"out": s}, r"expected the out tensors scaled, out, got out= \(missing scaled\)"),
    (lambda s, t: {"scaled": s}, r"expected the out tensors scaled, out, got scaled= \(missing out\)"),
    (lambda s, t: {}, r"got none \(missing scaled, out\)"),
    (lambda s, t: {"out": (s, t, t)}, r"expected out= to hold 2 tensors, one per output \(scaled, out\), got 3"),
    (lambda s, t: {"scaled": s, "out": (s, t)}, r"expected each output once, got out=\(...\) and scaled="),
], ids=["out-alone", "scaled-alone", "none", "three", "twice"])
def test_a_wrong_out_call_of_an_op_with_an_output_called_out_says_how_to_call_it(patterns, outs, message):
    from flyship.errors import CallTypeError

    _, ops = patterns
    x, s, t = torch.randn(4, 256), torch.empty(4, 256), torch.empty(4, 256)
    with pytest.raises(CallTypeError, match=message + r".*; pass out=\(scaled, out\) or scaled=..., out=..."):
        ops.scale_and_add_one.out(x, 2.0, **outs(s, t))
