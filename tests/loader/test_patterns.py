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
from flyship.loader.verify import example_inputs

pytestmark = pytest.mark.cpu
FMT = {"ptr": "<Q", "i32": "<i", "i64": "<q", "f32": "<f"}
I32_MAX = 2**31 - 1


@pytest.fixture(scope="module")
def patterns(patterns_bundle, ext):
    return patterns_bundle, flyship.load(patterns_bundle, namespace=f"flyship_p{uuid.uuid4().hex[:8]}")


def test_every_pattern_example_packs_each_field_at_the_code_objects_own_offset(patterns):
    bundle, ops = patterns
    checked = 0
    for handle in ops:
        for spec in handle.manifest.specializations:
            inputs = example_inputs(handle.manifest, spec, "cpu")
            values = {a.name: t for a, t in zip(handle.manifest.args, inputs)}
            for v in spec.variants:
                meta = CodeObjectFile((bundle / v.code_object.file).read_bytes()).kernel_metadata(
                    v.code_object.symbol)
                explicit = [a for a in meta.args if not a.hidden]
                p = handle.pack_kernargs(spec.name, *inputs, target=v.target)
                values.update({o.name: t for o, t in zip(handle.manifest.outputs, p.outputs)})
                assert len(p.buffer) == explicit[-1].offset + explicit[-1].size
                starts = {a.offset for a in explicit}
                for f in v.kernargs.fields:
                    t = values.get(f.arg)
                    want = {"pointer": lambda: t.data_ptr(), "shape": lambda: t.shape[f.dim],
                            "stride": lambda: t.stride(f.dim), "scalar": lambda: t,
                            "expr": lambda: evaluate_with_shapes(f.expr, {k: tuple(x.shape) for k, x in values.items()
                                                                          if isinstance(x, torch.Tensor)})}[f.kind]()
                    got = struct.unpack_from(FMT[f.type], p.buffer, f.offset)[0]
                    assert got == pytest.approx(want), (handle.name, spec.name, v.target, f)
                    if f.kind in ("pointer", "expr"):
                        assert f.offset in starts  # a whole kernel argument of its own
                    checked += 1
                assert p.grid == tuple(spec.example.grid)
    assert checked > 50


def test_the_column_major_example_is_packed_with_its_real_strides(patterns):
    _, ops = patterns
    spec = ops.scale.manifest.specializations[1]
    (x, alpha) = example_inputs(ops.scale.manifest, spec, "cpu")
    assert x.stride() == (1, 1000)
    v = spec.variants[0]
    p = ops.scale.pack_kernargs(spec.name, x, alpha, target=v.target)
    (f,) = [f for f in v.kernargs.fields if f.arg == "x" and f.kind == "stride"]
    assert struct.unpack_from("<q", p.buffer, f.offset)[0] == 1000


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
