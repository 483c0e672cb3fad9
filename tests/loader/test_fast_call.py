"""The fast eager entry (csrc/fast_call.cpp) on the recording driver: ``ops.<op>(...)`` and ``ops.<op>.out(...)``
give exactly what the dispatcher path gives (results, launches, stats, warnings, exceptions), take only the calls
nothing but flyship's kernel would act on, and hand every other call to ``torch.ops``; torch.compile still traces
the handles as the torch ops. The Autograd-key kernel of ops without a backward is checked here too."""

from __future__ import annotations

import re
import threading
import warnings
from typing import Any, Callable

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.cpu


@pytest.fixture
def pair(recorded_tiny: Callable[..., Any], record_ext: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    """The tiny bundle loaded twice on the recording driver: with the fast entry, and without it
    (``FLYSHIP_FAST_CALL=0``: every handle call goes through torch.ops), each with its own counters."""
    fast = recorded_tiny()
    with monkeypatch.context() as m:
        m.setenv("FLYSHIP_FAST_CALL", "0")
        slow = recorded_tiny()
    return fast, slow


def counts(ext: Any, handle: Any) -> tuple[int, int]:
    c = ext.fast_call_counts(handle)
    return c["fast"], c["dispatcher"]


def outcome(ops: Any, call: Callable[[Any], Any], ext: Any) -> dict[str, Any]:
    """What a call did: its result (shapes and dtypes; values when they were computed by the reference), or its
    exception (type and message with the namespace normalised), the launches recorded (with kernargs when every
    pointer is the caller's), the warnings and the stats."""
    ext.recorded_launches(clear=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            r = call(ops)
            error = None
        except Exception as e:  # noqa: BLE001 - the exception is what is compared
            r, error = None, (type(e).__name__, str(e).replace(ops.namespace, "NS"))
    launched = ext.recorded_launches(clear=True)
    tensors = r if isinstance(r, tuple) else (r,) if r is not None else ()
    return {
        "error": error,
        "result": [(tuple(t.shape), t.dtype) for t in tensors],
        "launches": [(x["symbol"], tuple(x["grid"]), tuple(x["block"]), x["dynamic_lds"]) for x in launched],
        "warnings": [str(w.message).replace(ops.namespace, "NS") for w in caught],
        "stats": {name: ops[name].stats() for name in ops.names},
    }


def test_a_plain_call_takes_the_fast_entry_and_launches_what_torch_ops_launches(pair, record_ext):
    fast, slow = pair
    x, y = torch.randn(4096), torch.randn(4096)
    assert outcome(fast, lambda o: o.add(x, y), record_ext) == outcome(slow, lambda o: o.add(x, y), record_ext)
    assert counts(record_ext, fast.add) == (1, 0)
    assert counts(record_ext, slow.add) == (0, 0)  # never bound: its calls are torch.ops calls


def test_the_out_variant_writes_the_same_kernargs_and_returns_the_out_tensor(pair, record_ext, launches):
    fast, slow = pair
    x, y, o = torch.randn(4096), torch.randn(4096), torch.empty(4096)
    v = o._version
    assert fast.add.out(x, y, out=o) is o
    got = launches()
    assert o._version == v + 1  # bumped, as ADInplaceOrView does for the dispatcher path
    slow.add.out(x, y, out=o)
    want = launches()
    assert [g["kernargs"] for g in got] == [w["kernargs"] for w in want] and len(got) == 1
    assert counts(record_ext, fast.add.out) == (1, 0)
    s, d = torch.empty(4096), torch.empty(4096)
    assert fast.addsub.out(x, y, out=(s, d)) == (s, d)
    assert fast.addsub.out(x, y, sum=s, diff=d) == (s, d)
    assert counts(record_ext, fast.addsub.out) == (2, 0)


SHAPES = st.sampled_from([(8, 16), (4, 1024), (3, 5), (0, 8), (1, 4096), (2, 33)])
DTYPES = st.sampled_from([torch.float32, torch.float16, torch.float64])


@st.composite
def calls(draw: Any) -> Callable[[Any], Any]:
    """One call of a tiny-bundle op through its handle, of any form: fitting a specialization or not (shape,
    dtype, scalar range), positional or keyword, defaults used or not, functional or out, and some bad calls."""
    shape = draw(SHAPES)
    dtype = draw(DTYPES)
    x = torch.randn(*shape).to(dtype)
    flat = x.reshape(-1)
    kind = draw(st.sampled_from(["add", "add_kw", "add_out", "scale", "scale_kw", "scale_out", "addsub",
                                 "addsub_out", "bad_kw", "bad_type", "missing", "rank", "out_shape", "overlap"]))
    alpha = draw(st.sampled_from([1.0, -2.5, 3, 0.0]))
    bias = draw(st.sampled_from([0, 7, -1, 2**40]))
    if kind == "add":
        return lambda o: o.add(flat, flat.clone())
    if kind == "add_kw":
        return lambda o: o.add(y=flat.clone(), x=flat)
    if kind == "add_out":
        out = torch.empty_like(flat)
        return lambda o: o.add.out(flat, flat.clone(), out=out)
    if kind == "scale":
        return lambda o: o.scale_rows(x, alpha, bias)
    if kind == "scale_kw":
        if draw(st.booleans()):
            return lambda o: o.scale_rows(x, bias=bias)
        return lambda o: o.scale_rows(x, alpha=alpha)
    if kind == "scale_out":
        out = torch.empty_like(x)
        return lambda o: o.scale_rows.out(x, alpha, bias=bias, out=out)
    if kind == "addsub":
        return lambda o: o.addsub(flat, flat * 2)
    if kind == "addsub_out":
        s, d = torch.empty_like(flat), torch.empty_like(flat)
        return lambda o: o.addsub.out(flat, flat * 2, out=(s, d))
    if kind == "bad_kw":
        return lambda o: o.add(flat, flat, z=flat)
    if kind == "bad_type":
        return lambda o: o.scale_rows(x, "2.0")
    if kind == "missing":
        return lambda o: o.add(flat)
    if kind == "rank":
        return lambda o: o.scale_rows(flat)
    if kind == "out_shape":
        out = torch.empty(flat.numel() + 1, dtype=flat.dtype)
        return lambda o: o.add.out(flat, flat, out=out)
    return lambda o: o.add.out(flat, flat.clone(), out=flat)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(call=calls())
def test_every_call_gives_what_the_dispatcher_path_gives(pair, record_ext, call):
    fast, slow = pair
    for ops in (fast, slow):
        for h in ops:
            h.reset_stats()
    assert outcome(fast, call, record_ext) == outcome(slow, call, record_ext)


def test_a_fallback_runs_the_reference_through_torch_ops_and_warns_once_at_the_callers_line(pair, record_ext):
    fast, _ = pair
    x = torch.randn(3, 5, dtype=torch.float64)  # fits no specialization of scale_rows
    with pytest.warns(UserWarning, match="running the PyTorch reference") as w:
        r = fast.scale_rows(x, 2.0, 1)
    assert w[0].filename == __file__
    torch.testing.assert_close(r, fast.reference("scale_rows")(x, 2.0, 1))
    assert counts(record_ext, fast.scale_rows) == (0, 1)
    assert sum(fast.scale_rows.stats()["fallbacks"].values()) == 1


class _Subclass(torch.Tensor):
    pass


class _SeenFunctions(torch.overrides.TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


class _SeenOps(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


def test_a_torch_function_mode_sees_the_call_through_the_dispatcher_path(pair, record_ext):
    fast, _ = pair
    x = torch.randn(4096)
    with _SeenFunctions() as mode:
        fast.add(x, x)
    assert any(f"{fast.namespace}.add" in s for s in mode.seen)
    assert counts(record_ext, fast.add) == (0, 1)


def test_a_torch_dispatch_mode_sees_the_call_through_the_dispatcher_path(pair, record_ext):
    fast, _ = pair
    x, o = torch.randn(4096), torch.empty(4096)
    with _SeenOps() as mode:
        fast.add(x, x)
        fast.add.out(x, x, out=o)
    assert [s for s in mode.seen if fast.namespace in s] == [f"{fast.namespace}.add.default",
                                                              f"{fast.namespace}.add.out"]
    assert counts(record_ext, fast.add) == (0, 1) and counts(record_ext, fast.add.out) == (0, 1)


def test_a_tensor_subclass_goes_to_the_dispatcher_path(pair, record_ext):
    fast, _ = pair
    x = torch.randn(4096).as_subclass(_Subclass)
    fast.add(x, x)
    assert counts(record_ext, fast.add) == (0, 1)


def test_a_call_that_needs_grad_goes_to_autograd_and_backward_raises_torchs_error(pair, record_ext):
    fast, _ = pair
    x = torch.randn(4096, requires_grad=True)
    y = fast.add(x, torch.randn(4096))
    assert counts(record_ext, fast.add) == (0, 1)
    assert y.requires_grad and type(y.grad_fn).__name__ == "NotImplemented"
    with pytest.raises(RuntimeError, match=f"derivative for {fast.namespace}::add is not implemented"):
        y.sum().backward()
    with torch.no_grad():  # nothing needs grad: the fast entry takes it
        assert not fast.add(x, x).requires_grad
    assert counts(record_ext, fast.add) == (1, 1)
    with pytest.raises(RuntimeError, match="don't support automatic differentiation"):
        fast.add.out(x, x, out=torch.empty(4096))
    assert counts(record_ext, fast.add.out) == (0, 1)


def test_an_output_of_an_op_without_backward_that_needs_no_grad_has_no_grad_fn(pair):
    fast, _ = pair
    x = torch.randn(4096)
    s, d = fast.addsub(x, x)  # addsub has a backward of its own: its autograd kernel is torch's custom-op one
    assert s.grad_fn is None and d.grad_fn is None
    assert fast.add(x, torch.randn(4096, requires_grad=True)).grad_fn is not None


def test_forward_ad_is_refused_as_torchs_fallback_refuses_it(pair, record_ext):
    import torch.autograd.forward_ad as fwAD

    fast, slow = pair
    x = torch.randn(4096)
    for ops in (fast, slow):
        with fwAD.dual_level():
            dual = fwAD.make_dual(x, torch.ones_like(x))
            with pytest.raises(NotImplementedError, match=f"forward AD with {ops.namespace}::add"):
                ops.add(dual, x)
    assert counts(record_ext, fast.add) == (0, 1)


def test_inference_mode_takes_the_fast_entry_for_the_functional_op_and_torch_ops_for_out(pair, record_ext):
    fast, slow = pair
    x, o = torch.randn(4096), torch.empty(4096)
    with torch.inference_mode():
        y = fast.add(x, x)
        fast.add.out(x, x, out=o)
        want = slow.add(x, x)
    assert y.is_inference() == want.is_inference() is True
    assert counts(record_ext, fast.add) == (1, 0) and counts(record_ext, fast.add.out) == (0, 1)
    with torch.inference_mode():
        inf_out = torch.empty(4096)
    for ops in (fast, slow):  # writing into an inference tensor outside inference mode: torch's refusal
        with pytest.raises(RuntimeError, match="Inplace update to inference tensor outside InferenceMode"):
            ops.add.out(x, x, out=inf_out)


def test_vmap_goes_to_the_dispatcher_path(pair, record_ext):
    fast, _ = pair
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # functorch's "no batching rule" performance warning
        y = torch.vmap(fast.add)(torch.randn(3, 4096), torch.randn(3, 4096))  # functorch's per-sample fallback
    assert y.shape == (3, 4096)
    assert counts(record_ext, fast.add) == (0, 1)


def test_a_negative_view_goes_to_the_dispatcher_path(pair, record_ext):
    fast, _ = pair
    x = torch._neg_view(torch.randn(4096))
    assert x.is_neg()
    fast.add(x, x)
    assert counts(record_ext, fast.add) == (0, 1)


def test_meta_tensors_run_the_fake_kernel_through_the_dispatcher_path(pair, record_ext):
    fast, _ = pair
    y = fast.add(torch.empty(64, device="meta"), torch.empty(64, device="meta"))
    assert y.device.type == "meta" and y.shape == (64,)
    assert counts(record_ext, fast.add) == (0, 1)


def test_the_profiler_sees_the_op_through_the_dispatcher_path(pair, record_ext):
    fast, _ = pair
    x = torch.randn(4096)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fast.add(x, x)
    assert any(e.name == f"{fast.namespace}::add" for e in prof.events())
    assert counts(record_ext, fast.add) == (0, 1)


def test_a_bad_call_raises_exactly_the_dispatcher_paths_error(pair, record_ext):
    fast, slow = pair
    x = torch.randn(4096)
    for call in (lambda o: o.add(x), lambda o: o.add(x, x, x), lambda o: o.scale_rows(x.view(64, 64), "1"),
                 lambda o: o.add(x, torch.randn(4096, dtype=torch.float64).view(64, 64)),
                 lambda o: o.add(x, torch.randn(2048)), lambda o: o.scale_rows(x.view(64, 64), bias=1.5),
                 lambda o: o.add.out(x, x, out=x), lambda o: o.addsub.out(x, x, out=x),
                 lambda o: o.addsub.out(x, x, out=torch.empty(4096))):
        got, want = outcome(fast, call, record_ext), outcome(slow, call, record_ext)
        assert got["error"] is not None and got == want
    assert counts(record_ext, fast.add)[0] == 0


def test_the_fast_entry_is_off_with_FLYSHIP_FAST_CALL_0(pair, record_ext):
    _, slow = pair
    x = torch.randn(4096)
    slow.add(x, x)
    assert counts(record_ext, slow.add) == (0, 0)
    assert slow.add.stats()["launches"]["f32"] == 1


def test_calls_from_many_threads_count_every_launch(pair, record_ext):
    fast, _ = pair
    x = torch.randn(4096)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(200):
                fast.add(x, x)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert fast.add.stats()["launches"]["f32"] == 1600
    assert counts(record_ext, fast.add) == (1600, 0)
    record_ext.recorded_launches(clear=True)


def test_torch_compile_traces_the_fast_handles_as_the_torch_ops_in_one_graph(pair):
    fast, _ = pair
    graphs = []

    def backend(gm: Any, example_inputs: Any) -> Any:
        graphs.append(gm)
        return gm.forward

    add, out = fast.add, fast.add.out

    def f(x: torch.Tensor, y: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        out(x, y, out=o)
        return add(fast.add(x, y), o)

    meta = lambda: torch.empty(64, device="meta")  # noqa: E731
    r = torch.compile(f, backend=backend, fullgraph=True)(meta(), meta(), meta())
    assert r.shape == (64,) and len(graphs) == 1
    code = graphs[0].code
    assert f"{fast.namespace}.add.default" in code and f"{fast.namespace}.add.out" in code
    assert "FastCall" not in code and re.search(r"OpHandle", code) is None


def test_torch_jit_trace_records_the_op_through_the_dispatcher_path(pair, record_ext):
    fast, _ = pair
    x = torch.randn(4096)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's own warnings about its limits
        traced = torch.jit.trace(lambda a, b: fast.add(a, b), (x, x), check_trace=False)
    assert f"{fast.namespace}::add" in str(traced.graph)
    assert counts(record_ext, fast.add) == (0, 1)


def test_the_launch_bench_reports_each_target_as_a_median_of_per_round_ratios():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / "launch_overhead.py"
    spec = importlib.util.spec_from_file_location("launch_overhead", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    us = {"torch.add(x, y)": [10.0, 6.0, 6.0], "flyship ops.add(x, y) (fast entry)": [9.0, 6.6, 5.4],
          "Triton launcher add_kernel[grid](...)": [20.0, 12.0, 9.0]}
    ratios = {r["ratio"]: r for r in bench.per_round_ratios(us)}
    fast = ratios["flyship ops.add(x, y) (fast entry) / torch.add(x, y)"]
    assert fast["median"] == pytest.approx(0.9) and fast["met"] is True  # 0.9, 1.1, 0.9 per round
    triton = ratios["Triton launcher add_kernel[grid](...) / flyship ops.add(x, y) (fast entry)"]
    assert triton["median"] == pytest.approx(12 / 6.6) and triton["met"] is True  # 2.22, 1.82, 1.67 per round
    assert len(ratios) == 2  # targets whose paths were not timed are left out
    assert "| yes |" in bench.ratio_table(list(ratios.values()))


def test_torch_ops_out_bumps_each_written_tensor_once_and_refuses_grad_inputs(recorded_tiny, record_ext):
    # The .out variant's Autograd-key kernel bumps the out tensors' versions itself and skips ADInplaceOrView (one
    # boxed hop fewer); a version bumped twice, or not at all, would break torch's saved-tensor checks.
    ops = recorded_tiny()
    x, y, o = torch.randn(4096), torch.randn(4096), torch.empty(4096)
    s, d = torch.empty(4096), torch.empty(4096)
    for mode in (torch.enable_grad, torch.no_grad):
        with mode():
            v, vs, vd, vx = o._version, s._version, d._version, x._version
            ops.add.packet.out(x, y, out=o)
            ops.addsub.packet.out(x, y, sum=s, diff=d)
            assert (o._version, s._version, d._version, x._version) == (v + 1, vs + 1, vd + 1, vx), mode
    with torch._C._AutoDispatchBelowAutograd():  # ADInplaceOrView reached without autograd: its kernel bumps
        v = o._version
        ops.add.packet.out(x, y, out=o)
        assert o._version == v + 1
    with pytest.raises(Exception, match="don't support automatic differentiation"):
        ops.add.packet.out(x.requires_grad_(), y, out=o)
