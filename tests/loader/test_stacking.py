"""Our ops inside compiled graphs (issue 24 item 5): which path torch takes into the kernel per call.

On the recording driver the real C++ kernel owns the CPU key, so CPU inductor (g++) compiles a graph that calls
it, as CUDA inductor does on a GPU. The tests check behaviour, not timings (bench/dropin_block.py --modes times
them): the compiled wrapper calls the op's overload directly, nothing of flyship's Python runs per call (no fake
kernel, no Python kernel, no handle code), each call launches once, and a ``.out`` variant writing a buffer of the
graph is re-inplaced (no ``auto_functionalized`` copy at runtime).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

import pytest

pytestmark = pytest.mark.cpu
torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
# Python code that counts as "flyship at runtime": the mapped package folders (checkout and installed alike).
_OURS = tuple(str(ROOT / d) + "/" for d in ("loader", "bundle", "flyship", "compiler"))


def python_calls(fn: Callable[[], Any]) -> list[str]:
    """The Python functions of flyship's own folders that run during one call of ``fn``."""
    seen: list[str] = []

    def hook(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(_OURS):
            seen.append(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")

    sys.setprofile(hook)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen


def compiled_code(fn: Callable[..., Any], *args: Any) -> tuple[Callable[..., Any], str]:
    """``fn`` compiled by CPU inductor, and the wrapper code it generated."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="inductor", dynamic=False)
    try:
        _, codes = run_and_get_code(compiled, *args)
    except Exception as e:  # noqa: BLE001 - no C++ compiler for inductor here: the property cannot be observed
        if "compil" in str(e).lower() and ("g++" in str(e) or "cxx" in str(e).lower() or "CppCompileError" in
                                           type(e).__name__):
            pytest.skip(f"CPU inductor cannot compile here ({type(e).__name__}), so the compiled call path of our "
                        "ops is unchecked")
        raise
    return compiled, "\n".join(codes)


@pytest.fixture
def rec_ops(recorded_tiny: Callable[..., Any]) -> Any:
    return recorded_tiny()


def test_compiled_graph_calls_the_kernel_directly(rec_ops: Any, launches: Callable[[], list[dict]]) -> None:
    """The functional op in an inductor graph: one direct call of the overload per call, no Python of ours."""
    ns = getattr(torch.ops, rec_ops.namespace)

    def fn(a: Any, b: Any) -> Any:
        return ns.add(a, b) * 2

    x, y = torch.randn(256), torch.randn(256)
    compiled, code = compiled_code(fn, x, y)
    assert f"torch.ops.{rec_ops.namespace}.add.default(" in code
    assert "auto_functionalized" not in code
    launches()
    compiled(x, y)  # the recording driver records launches and computes nothing: the launch is the result
    assert [entry["symbol"] for entry in launches()] == [launches_symbol(rec_ops, "add", x, y)]
    compiled(x, y)  # warm
    launches()
    assert python_calls(lambda: compiled(x, y)) == []
    assert len(launches()) == 1


def launches_symbol(ops: Any, name: str, *args: Any) -> str:
    """The kernel symbol an eager call of the op launches (what the compiled call must launch too)."""
    from flyship.loader import extension

    rec = extension.extension("record")
    rec.recorded_launches(clear=True)
    getattr(ops, name)(*args)
    (entry,) = rec.recorded_launches(clear=True)
    return entry["symbol"]


def test_out_variant_is_reinplaced(rec_ops: Any, launches: Callable[[], list[dict]]) -> None:
    """A ``.out`` call writing a buffer the graph allocates: inductor calls ``.out`` in place, with no
    ``auto_functionalized`` (which would clone the buffer and run Python per call)."""
    ns = getattr(torch.ops, rec_ops.namespace)

    def fn(a: Any, b: Any) -> Any:
        o = torch.empty_like(a)
        ns.add.out(a, b, out=o)
        return o * 2

    x, y = torch.randn(256), torch.randn(256)
    compiled, code = compiled_code(fn, x, y)
    assert f"torch.ops.{rec_ops.namespace}.add.out(" in code
    assert "auto_functionalized" not in code
    compiled(x, y)
    launches()
    assert python_calls(lambda: compiled(x, y)) == []
    assert len(launches()) == 1


def test_handle_in_graph_traces_the_op(rec_ops: Any, launches: Callable[[], list[dict]]) -> None:
    """The Python handle inside a compiled function: no graph break, the graph calls the op's overload, and the
    handle's Python code does not run per call."""
    def fn(a: Any, b: Any) -> Any:
        return rec_ops.add(a, b) * 2

    x, y = torch.randn(256), torch.randn(256)
    explained = torch._dynamo.explain(fn)(x, y)
    assert explained.graph_break_count == 0
    compiled, code = compiled_code(fn, x, y)
    assert f"torch.ops.{rec_ops.namespace}.add.default(" in code
    compiled(x, y)
    launches()
    assert python_calls(lambda: compiled(x, y)) == []
    assert len(launches()) == 1


def test_routing_report_says_where_fusion_was_lost(rec_ops: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bench's compiled races (bench/dropin_block.py records them) show per site in the routing report: the
    measured cost when the patched graph loses to the graph compiled alone, the gain when it wins."""
    import flyship
    from flyship.loader.tools import report

    monkeypatch.syspath_prepend(str(Path(__file__).parent / "data" / "dropin"))
    p = flyship.patch("dropin_model:add", rec_ops.add, args={"x": "a", "y": "b"}, cpu_target="gfx942")
    try:
        target = p.stats()["target"]
        monkeypatch.setattr(report, "_compiled", {})
        report.note_compiled([target], "default", patched_s=400e-6, alone_s=333e-6)
        report.note_compiled([target], "reduce-overhead", patched_s=100e-6, alone_s=120e-6)
        site = next(s for s in flyship.routing_report()["sites"] if s["target"] == target)
        assert site["compiled"]["default"] == {"patched_s": 400e-6, "alone_s": 333e-6, "sites": [target]}
        text = report.format_report(flyship.routing_report())
        assert "compiled (default): 0.4000 ms patched vs 0.3330 ms compiled alone: FUSION LOST, +67.0 us" in text
        assert 'leave this site to torch.compile (patch(..., compiled="original"))' in text
        assert "compiled (reduce-overhead): 0.1000 ms patched vs 0.1200 ms compiled alone: wins, 20.0 us" in text
    finally:
        p.undo()


def test_a_site_left_to_the_compiler_traces_the_original_and_runs_the_op_eagerly(
        rec_ops: Any, launches: Callable[[], list[dict]], monkeypatch: pytest.MonkeyPatch) -> None:
    """``compiled="original"`` (what the report advises for a site that loses fusion): a compiled graph holds the
    original's torch ops, fused, and no flyship op; the same site called eagerly still launches the kernel."""
    import flyship

    monkeypatch.syspath_prepend(str(Path(__file__).parent / "data" / "dropin"))
    import dropin_model

    def fn(a: Any, b: Any) -> Any:
        return dropin_model.add(a, b) * 2

    x, y = torch.randn(256), torch.randn(256)
    for compiled, in_graph in (("op", True), ("original", False)):
        with flyship.patch("dropin_model:add", rec_ops.add, args={"x": "a", "y": "b"}, cpu_target="gfx942",
                           compiled=compiled) as p:
            _, code = compiled_code(fn, x, y)
            assert (f"torch.ops.{rec_ops.namespace}.add" in code) is in_graph
            launches()
            fn(x, y)
            assert len(launches()) == 1 and p.stats()["to_op"] == 1
    with pytest.raises(flyship.PatchError, match=r"compiled= expected one of 'op', 'original', got 'never'"):
        flyship.patch("dropin_model:add", rec_ops.add, args={"x": "a", "y": "b"}, compiled="never")


def test_dropin_bench_modes(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--modes``: ``all`` is every compile mode, the export arm and the probe; an unknown mode is refused by name."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import dropin_block

    assert dropin_block.parse_modes("all") == ["default", "reduce-overhead", "max-autotune-no-cudagraphs", "export",
                                               "probe"]
    assert dropin_block.parse_modes("none") == []
    assert dropin_block.parse_modes("export,default") == ["export", "default"]
    with pytest.raises(SystemExit, match="got max-autotune$"):
        dropin_block.parse_modes("default,max-autotune")
