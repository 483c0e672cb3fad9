"""What ``verify`` checks beyond the example call (issue 23, item 7), on the CPU: (a) outputs filled with a
sentinel before the launch, every element left unwritten reported per output with the ``zero=True`` fix; (c) each
specialization run again on the other layouts its guard admits, a mismatch naming the layout.

The recording driver takes the real C++ launch path but runs no kernel, so every launch it records leaves its
outputs as they were: the sentinel run must report each output wholly unwritten, and the recorded kernargs show
which layouts reached a kernel. Partly written outputs are checked on the sentinel helpers directly; the GPU test
(tests/gpu/test_verify_unwritten.py) runs a Triton kernel that returns early.
"""

from __future__ import annotations

import struct

import pytest

pytestmark = pytest.mark.cpu
torch = pytest.importorskip("torch")

from flyship.loader.tools import verify as V  # noqa: E402


def test_a_partly_written_float_output_is_found_element_by_element():
    want = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    got = V.sentinel_like(want)
    assert got.isnan().all()
    got[0] = want[0]  # the kernel wrote row 0 and returned early on rows 1 and 2
    mask = V.unwritten_mask(got, want)
    assert int(mask.sum()) == 8 and not mask[0].any() and mask[1:].all()
    # A NaN the reference itself computes is a written NaN, not a missed element.
    want[2, 3] = float("nan")
    got[2, 3] = float("nan")
    assert int(V.unwritten_mask(got, want).sum()) == 7


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8])
def test_integer_outputs_get_a_byte_pattern_sentinel(dtype):
    t = V.sentinel_like(torch.zeros(5, dtype=dtype))
    assert bytes(t.view(torch.uint8).tolist()) == bytes([V.SENTINEL_BYTE]) * (5 * t.element_size())
    want = torch.arange(5).to(dtype)
    t[:2] = want[:2]
    assert V.unwritten_mask(t, want).tolist() == [False, False, True, True, True]
    assert V.sentinel_like(torch.zeros(3, dtype=torch.bool)) is None  # no value of a bool is left over


def test_other_layouts_hold_the_same_values_in_padded_transposed_and_every_other_element_views():
    op = type("Op", (), {})()
    op.args = [type("A", (), {"kind": "tensor", "name": "x"})(), type("A", (), {"kind": "tensor", "name": "w"})(),
               type("A", (), {"kind": "float", "name": "eps"})()]
    x, w = torch.randn(3, 5), torch.randn(7)
    got = {label.split(" (")[0]: args for label, args in V.other_layouts(op, [x, w, 1e-6])}
    assert list(got) == ["x with padded rows", "x transposed", "w[::2]"]
    assert got["x with padded rows"][0].stride() == (8, 1) and got["x transposed"][0].stride() == (1, 3)
    assert got["w[::2]"][1].stride() == (2,)
    for args in got.values():
        assert torch.equal(args[0], x) and torch.equal(args[1], w) and args[2] == 1e-6


def test_other_layouts_follow_the_inputs_own_dim_order_and_swap_leading_dims():
    op = type("Op", (), {})()
    op.args = [type("A", (), {"kind": "tensor", "name": "b"})(), type("A", (), {"kind": "tensor", "name": "q"})()]
    b = torch.randn(5, 4).t()  # column-major (4, 5): strides (1, 4)
    q = torch.randn(6, 2, 8)  # (T, H, D)
    got = {label.split(" (")[0]: args for label, args in V.other_layouts(op, [b, q])}
    assert list(got) == ["b with padded columns", "b contiguous", "q with padded rows", "q transposed",
                         "q with dims 0 and 1 swapped in memory"]
    assert got["b with padded columns"][0].stride() == (1, 7) and got["b contiguous"][0].stride() == (5, 1)
    assert got["q with padded rows"][1].stride() == (22, 11, 1)  # each token H * (D + 3) apart
    assert got["q with dims 0 and 1 swapped in memory"][1].stride() == (8, 48, 1)  # q.transpose(0, 1) storage
    for args in got.values():
        assert torch.equal(args[0], b) and torch.equal(args[1], q)


def _row(ops, name):
    handle = ops[name]
    spec = handle.manifest.specializations[0]
    return V.verify_specialization(handle, spec, ops.reference(name), torch.device("cpu"))


def test_verify_reports_each_output_a_kernel_left_unwritten_naming_it_and_zero_true(recorded_tiny, launches):
    ops = recorded_tiny()
    row = _row(ops, "addsub")
    assert not row.ok
    for name in ("sum", "diff"):
        assert (f"the kernel left 3000 of 3000 elements of output {name!r} unwritten (first at [0]" in row.note
                and f"declare Output({name!r}, ..., zero=True)" in row.note)
    # The example call and the sentinel run launched; x[::2] and y[::2] were refused by the row-major guard the
    # loader keeps for a kernel that is passed no strides, so no kernel saw them.
    assert len(launches()) == 2


def test_verify_runs_a_specialization_on_every_layout_its_guard_admits_and_names_the_one_that_differs(
        recorded_tiny, launches):
    ops = recorded_tiny()
    row = _row(ops, "scale_rows")
    # scale_rows is passed both strides of x, so its guard admits padded rows: that run reached the kernel (its
    # row stride 1003 in the kernargs) and, the recording driver computing nothing, disagreed with the reference.
    assert "differs from the reference on x with padded rows (strides [1003, 1])" in row.note
    assert "pin the layout it needs in the spec's constraints" in row.note
    recorded = launches()
    assert len(recorded) == 3  # the example call, the sentinel run, the padded layout (it stops at the first)
    assert struct.pack("<q", 1003) in bytes(recorded[2]["kernargs"]) or struct.pack("<i", 1003) in bytes(
        recorded[2]["kernargs"])
    assert struct.pack("<i", 1003) not in bytes(recorded[0]["kernargs"])


def test_an_output_declared_zero_true_is_not_reported_unwritten(recorded, launches, tmp_path):
    from tests.conftest import ROOT, flydsl_python, run_build

    if flydsl_python() is None:
        pytest.skip("needs the build Python to build tests/gpu/data/early_return_spec.py; it would prove verify "
                    "exempts a zero=True output (the loader fills it with zeros) from the unwritten check")
    run_build(ROOT / "tests" / "gpu" / "data" / "early_return_spec.py", tmp_path / "b", ["sm_90"])
    ops = recorded(tmp_path / "b", target="sm_90")
    forgot, zeroed = _row(ops, "skip_rows"), _row(ops, "skip_rows_zeroed")
    assert "the kernel left 6400 of 6400 elements of output 'out' unwritten" in forgot.note
    assert "declare Output('out', ..., zero=True)" in forgot.note
    assert "unwritten" not in zeroed.note
    # x[::2]-like layouts: the kernel is passed no strides, so the guard refuses every other layout.
    assert "differs from the reference on" not in forgot.note + zeroed.note
    assert len(launches()) == 4  # two ops, each the example call and the sentinel run


def test_emulated_and_interpreted_notes_name_what_a_call_writes_and_the_declared_namespace():
    from flyship.bundle import manifest as M
    from flyship.loader.tools import verify_emulated as VE

    # outputs first, then the inputs the kernel writes in place in argument order (the order run_case compares)
    op = M.Op(name="k", frontend="triton", doc="", args=(M.Arg(name="acc", kind="tensor", rank=1, mutable=True),
                                                        M.Arg(name="x", kind="tensor", rank=1),
                                                        M.Arg(name="cache", kind="tensor", rank=1, mutable=True)),
              outputs=(M.Output(name="y", shape=("x.shape[0]",), dtype="x"),), reference=None, specializations=())
    assert [VE.written_name(op, k) for k in range(3)] == [
        "output 'y'", "input 'acc' (written in place)", "input 'cache' (written in place)"]
    note = "flyship flyship_dry_0123456789::k: these inputs do not fit specialization f32"
    assert VE.declared_names(note, "flyship_dry_0123456789", "mine") == \
        "flyship mine::k: these inputs do not fit specialization f32"
