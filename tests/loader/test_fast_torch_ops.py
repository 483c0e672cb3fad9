"""``torch.ops.<ns>.<op>``, ``.default`` and ``.out`` through the fast entry (loader/torchops.py,
csrc/torch_op_call.cpp): eager calls give what torch's own ``__call__`` gives (results, launches, stats, errors),
take only the calls the fast rule takes, and leave every tool that looks at the op (dispatch modes, FakeTensor,
vmap, autograd, make_fx, torch.compile, torch.export, opcheck) seeing torch's op. ``record`` tests run the C++ path
on the recording driver; ``fresh_ops`` ones run on this machine's flavor, where CPU tensors run the references
(real numbers)."""

from __future__ import annotations

import io
import warnings
from typing import Any, Callable

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flyship.loader import torchops

pytestmark = pytest.mark.cpu

PACKET_CALL = torch._ops.OpOverloadPacket.__call__  # torch's own path, as an unpatched packet runs it
OVERLOAD_CALL = torch._ops.OpOverload.__call__


def ns_of(ops: Any) -> Any:
    return getattr(torch.ops, ops.namespace)


def counts(ext: Any, obj: Any) -> tuple[int, int]:
    c = ext.fast_call_counts(obj)
    return c["fast"], c["dispatcher"]


def outcome(ops: Any, ext: Any, call: Callable[[], Any]) -> dict[str, Any]:
    """A call's result (shapes, dtypes; values when no kernel ran, i.e. the reference computed them) or its error,
    the launches recorded and the stats."""
    ext.recorded_launches(clear=True)
    try:
        r, error = call(), None
    except Exception as e:  # noqa: BLE001 - the exception is what is compared
        r, error = None, (type(e).__name__, str(e))
    launched = ext.recorded_launches(clear=True)
    tensors = r if isinstance(r, tuple) else (r,) if r is not None else ()
    values = [t.tolist() for t in tensors] if not launched else None
    return {"error": error, "result": [(tuple(t.shape), t.dtype) for t in tensors], "values": values,
            "launches": [(x["symbol"], tuple(x["grid"]), tuple(x["block"])) for x in launched],
            "stats": {h.name: h.stats() for h in ops}}


def test_plain_calls_take_the_fast_entry_and_launch_what_torchs_own_call_launches(recorded_tiny, record_ext,
                                                                                   launches):
    ops = recorded_tiny()
    add = ns_of(ops).add
    assert isinstance(add, torchops.FastOpOverloadPacket) and add is ops.add.packet
    assert all(isinstance(o, torchops.FastOpOverload) for o in (add.default, add.out, ops.add.default))
    x, y, o = torch.randn(4096), torch.randn(4096), torch.empty(4096)
    v = o._version
    assert add.out(x, y, out=o) is None  # the schema returns (): so does the fast entry
    assert o._version == v + 1
    fast = launches()
    assert OVERLOAD_CALL(add.out, x, y, out=o) is None
    assert [g["kernargs"] for g in fast] == [w["kernargs"] for w in launches()] and len(fast) == 1
    assert add(x, y).shape == add.default(x, y).shape == (4096,)
    assert len(launches()) == 2
    assert [counts(record_ext, p) for p in (add, add.default, add.out)] == [(1, 0), (1, 0), (1, 0)]
    s, d = torch.empty(4096), torch.empty(4096)
    assert ns_of(ops).addsub.out(x, y, sum=s, diff=d) is None and len(launches()) == 1
    # out=(s, d) is the handle's form only: torch's .out refuses it, and so does its fast path
    with pytest.raises(RuntimeError) as fast_error:
        ns_of(ops).addsub.out(x, y, out=(s, d))
    with pytest.raises(RuntimeError) as torch_error:
        OVERLOAD_CALL(ns_of(ops).addsub.out, x, y, out=(s, d))
    assert str(fast_error.value) == str(torch_error.value)
    assert counts(record_ext, ns_of(ops).addsub.out) == (1, 1)


SHAPES = st.sampled_from([(8, 16), (4, 1024), (3, 5), (0, 8), (1, 4096), (2, 33)])
DTYPES = st.sampled_from([torch.float32, torch.float16, torch.float64])
KINDS = st.sampled_from(["packet", "default", "default_kw", "out", "scale", "scale_kw", "scale_out", "addsub",
                         "bad_kw", "bad_type", "missing", "out_shape", "out_positional"])


def torch_ops_call(kind: str, shape: tuple[int, ...], dtype: torch.dtype, alpha: float,
                   bias: int) -> tuple[Callable[[Any, bool], Any], Any]:
    """One call of a tiny-bundle op through torch.ops, as ``call(ns, fast)``: through the (swapped) object itself,
    or (``fast=False``) through torch's own ``__call__`` of the same object; and the reference's result (None where
    the call is refused or returns nothing)."""
    x = torch.randn(*shape).to(dtype)
    flat, other = x.reshape(-1), x.reshape(-1).clone()
    out = torch.empty_like(flat)

    def call(ns: Any, fast: bool) -> Any:
        def run(obj: Any, *args: Any, **kwargs: Any) -> Any:
            own = PACKET_CALL if isinstance(obj, torch._ops.OpOverloadPacket) else OVERLOAD_CALL
            return obj(*args, **kwargs) if fast else own(obj, *args, **kwargs)

        table = {
            "packet": lambda: run(ns.add, flat, other),
            "default": lambda: run(ns.add.default, flat, other),
            "default_kw": lambda: run(ns.add.default, y=other, x=flat),
            "out": lambda: (run(ns.add.out, flat, other, out=out), out)[1],
            "scale": lambda: run(ns.scale_rows, x, alpha, bias),
            "scale_kw": lambda: run(ns.scale_rows.default, x, bias=bias),
            "scale_out": lambda: run(ns.scale_rows.out, x, alpha, bias=bias, out=torch.empty_like(x)),
            "addsub": lambda: run(ns.addsub.default, flat, other),
            "bad_kw": lambda: run(ns.add.default, flat, other, z=flat),
            "bad_type": lambda: run(ns.scale_rows.default, x, "2.0"),
            "missing": lambda: run(ns.add.default, flat),
            "out_shape": lambda: run(ns.add.out, flat, other, out=torch.empty(flat.numel() + 1, dtype=dtype)),
            "out_positional": lambda: run(ns.add.out, flat, other, out),
        }
        return table[kind]()

    refs = {"packet": flat + other, "default": flat + other, "default_kw": flat + other, "out": flat + other,
            "scale": x * alpha + bias, "scale_kw": x + bias, "addsub": (flat + other, flat - other)}
    return call, refs.get(kind)


_loaded: dict[int, Any] = {}  # one recorded load for every example of the hypothesis test


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=KINDS, shape=SHAPES, dtype=DTYPES, alpha=st.sampled_from([1.0, -2.5, 3]), bias=st.sampled_from([0, 7]))
def test_every_torch_ops_call_gives_what_torchs_own_call_gives(recorded_tiny, record_ext, kind, shape, dtype, alpha,
                                                               bias):
    ops = _loaded.get(id(record_ext)) or _loaded.setdefault(id(record_ext), recorded_tiny())
    call, ref = torch_ops_call(kind, shape, dtype, alpha, bias)
    results = []
    for fast in (True, False):
        for h in ops:
            h.reset_stats()
        results.append(outcome(ops, record_ext, lambda: call(ns_of(ops), fast)))
    got, want = results
    assert got == want
    if got["values"] is not None and ref is not None and got["error"] is None:  # no launch: the reference ran
        refs = ref if isinstance(ref, tuple) else (ref,)
        assert len(got["values"]) == len(refs)
        for v, r in zip(got["values"], refs):
            torch.testing.assert_close(torch.tensor(v, dtype=r.dtype).reshape(r.shape), r)


def test_dispatch_modes_fake_tensors_and_vmap_take_torchs_path(recorded_tiny, record_ext):
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    ops = recorded_tiny()
    add = ns_of(ops).add

    class Seen(torch.utils._python_dispatch.TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[str] = []

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            self.seen.append(str(func))
            return func(*args, **(kwargs or {}))

    x = torch.randn(4096)
    with Seen() as mode:
        add(x, x)
        add.out(x, x, out=torch.empty(4096))
    assert [s for s in mode.seen if ops.namespace in s] == [f"{ops.namespace}.add.default",
                                                             f"{ops.namespace}.add.out"]
    with FakeTensorMode() as fake_mode:
        fx = fake_mode.from_tensor(x)
        y = add.default(fx, fx)
    assert isinstance(y, FakeTensor) and y.shape == (4096,)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # functorch's "no batching rule" performance warning
        assert torch.vmap(add.default)(torch.randn(3, 4096), torch.randn(3, 4096)).shape == (3, 4096)
    # handed to torch: the calls under the modes and vmap. Taken: the mode's own func(...) calls of .default and
    # .out, which run with the mode off the stack (what torch's path would run is then our kernel alone).
    assert counts(record_ext, add) == (0, 1)
    assert counts(record_ext, add.out) == (1, 1) and counts(record_ext, add.default) == (1, 2)


def test_an_input_that_requires_grad_takes_torchs_path_and_the_gradients_are_right(recorded_tiny, record_ext,
                                                                                     fresh_ops):
    ops = recorded_tiny()
    x = torch.randn(4096, requires_grad=True)
    y = ns_of(ops).add(x, torch.randn(4096))
    assert type(y.grad_fn).__name__ == "NotImplemented" and counts(record_ext, ns_of(ops).add) == (0, 1)
    with torch.no_grad():  # nothing needs a graph: the fast entry takes it
        ns_of(ops).add(x, x)
    assert counts(record_ext, ns_of(ops).add) == (1, 1)
    cpu = fresh_ops()  # this machine's flavor: CPU tensors run the references, so gradients are real numbers
    a = torch.randn(16, dtype=torch.float64, requires_grad=True)
    b = torch.randn(16, dtype=torch.float64, requires_grad=True)
    gs, gd = torch.randn(16, dtype=torch.float64), torch.randn(16, dtype=torch.float64)
    gx, gy = torch.autograd.grad(ns_of(cpu).addsub(a, b), (a, b), (gs, gd))
    torch.testing.assert_close(gx, gs + gd)
    torch.testing.assert_close(gy, gs - gd)
    assert torch.autograd.gradcheck(lambda p, q: ns_of(cpu).addsub.default(p, q), (a, b))


def test_make_fx_and_torch_compile_trace_the_swapped_ops_in_one_graph(recorded_tiny):
    from torch.fx.experimental.proxy_tensor import make_fx

    ops = recorded_tiny()
    ns = ns_of(ops)

    def f(x: torch.Tensor, y: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        ns.add.out(x, y, out=o)
        return ns.add(ns.add.default(x, y), o)

    meta = lambda: torch.empty(64, device="meta")  # noqa: E731
    code = make_fx(f)(meta(), meta(), meta()).code
    assert f"{ops.namespace}.add.default" in code and f"{ops.namespace}.add.out" in code
    graphs = []

    def backend(gm: Any, example_inputs: Any) -> Any:
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    r = torch.compile(f, backend=backend, fullgraph=True)(meta(), meta(), meta())  # fullgraph: a break raises
    assert r.shape == (64,) and len(graphs) == 1
    assert f"{ops.namespace}.add.default" in graphs[0].code and f"{ops.namespace}.add.out" in graphs[0].code


def test_torch_export_saves_and_loads_a_program_calling_the_op(fresh_ops):
    ops = fresh_ops()
    ns = ns_of(ops)

    class M(torch.nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            s, d = ns.addsub(x, y)
            return ns.add(s, d)

    x, y = torch.randn(4096), torch.randn(4096)
    program = torch.export.export(M(), (x, y))
    assert f"{ops.namespace}.addsub.default" in str(program.graph)
    buf = io.BytesIO()
    torch.export.save(program, buf)
    buf.seek(0)
    loaded = torch.export.load(buf)
    torch.testing.assert_close(loaded.module()(x, y), 2 * x)


def test_opcheck_passes_on_the_swapped_overloads(fresh_ops):
    ops = fresh_ops()
    ns = ns_of(ops)
    assert isinstance(ns.add.default, torch._ops.OpOverload) and type(ns.add.default) is not torch._ops.OpOverload
    x, y = torch.randn(64), torch.randn(64)
    torch.library.opcheck(ns.add.default, (x, y))
    torch.library.opcheck(ns.add.out, (x, y), {"out": torch.empty(64)})
    torch.library.opcheck(ns.addsub.default, (x.clone().requires_grad_(), y.clone().requires_grad_()))
    torch.testing.assert_close(ns.add(x, y), x + y)


def test_FLYSHIP_FAST_CALL_0_leaves_torchs_classes(recorded_tiny, record_ext, monkeypatch):
    monkeypatch.setenv("FLYSHIP_FAST_CALL", "0")
    ops = recorded_tiny()
    ns = ns_of(ops)
    for name in ops.names:
        packet = getattr(ns, name)
        assert type(packet) is torch._ops.OpOverloadPacket
        assert type(packet.default) is type(packet.out) is torch._ops.OpOverload
        assert not hasattr(packet.default, "_flyship_fast")
    x = torch.randn(4096)
    ns.add(x, x)
    assert counts(record_ext, ns.add) == (0, 0) and ops.add.stats()["launches"]["f32"] == 1


def test_ops_that_write_an_input_in_place_keep_torchs_classes(triton_examples_bundle, recorded):
    # _fast_entry_fits refuses them (their autograd kernel checks and rebases the written tensors): torch's path only
    ops = recorded(triton_examples_bundle)
    ns = ns_of(ops)
    for name in ("fused_add_rmsnorm", "accumulate"):
        assert type(getattr(ns, name)) is torch._ops.OpOverloadPacket
        assert type(getattr(ns, name).default) is torch._ops.OpOverload
    assert type(ns.fused_add_rmsnorm.out) is torch._ops.OpOverload
    assert isinstance(ns.softmax, torchops.FastOpOverloadPacket)  # an op it serves, in the same bundle
