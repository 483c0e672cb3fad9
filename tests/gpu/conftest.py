"""Fixtures of the GPU tests: a GPU, a Triton bundle built elsewhere, its ops loaded once per session.

The bundle comes from ``FLYSHIP_GPU_BUNDLE`` (default ``artifacts/triton``), built on a machine without a
GPU by ``flyc-build examples/triton/ops.py -o artifacts/triton --arch sm_90 --arch gfx942``. Every test
skips, saying what it would prove, when there is no GPU or no bundle, or when the bundle has no code
object for this GPU.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

import pytest

from ..conftest import ROOT


def example_bundle(env_var: str, name: str, proves: str, tmp_path_factory: Any) -> Path:
    """An example bundle for a GPU test: ``$env_var``, else ``artifacts/<name>`` when built, else built here from
    ``examples/triton/<name>.py`` for this GPU; skips (saying what the test would prove) when neither can be had."""
    import subprocess
    import sys

    import torch

    b = Path(os.environ.get(env_var) or ROOT / "artifacts" / name)
    if (b / "manifest.json").is_file():
        return b
    how = f"flyc-build examples/triton/{name}.py -o artifacts/{name} --arch sm_90"
    pytest.importorskip("triton", reason=f"no bundle at {b} and no Triton here to build one; build it with {how} "
                                         f"to prove {proves}")
    major, minor = torch.cuda.get_device_capability()
    out = tmp_path_factory.mktemp(name) / name
    r = subprocess.run([sys.executable, "-m", "flyship.compiler.cli", str(ROOT / f"examples/triton/{name}.py"),
                        "-o", str(out), "--arch", f"sm_{major}{minor}", "--no-cache"],
                       capture_output=True, text=True, cwd=str(ROOT), timeout=600)
    if r.returncode != 0:
        pytest.skip(f"no bundle at {b}, and building one here failed ({r.stderr.strip()[-400:]}); build it "
                    f"elsewhere with {how}")
    return out


def bundle_dir() -> Path:
    return Path(os.environ.get("FLYSHIP_GPU_BUNDLE") or ROOT / "artifacts" / "triton")


def out_dir() -> Path | None:
    """Where tests may leave evidence (``FLYSHIP_GPU_OUT``, set by scripts/gpu_check.sh), or None."""
    d = os.environ.get("FLYSHIP_GPU_OUT")
    if not d:
        return None
    Path(d).mkdir(parents=True, exist_ok=True)
    return Path(d)


@pytest.fixture(scope="session")
def gpu() -> ModuleType:
    """torch, once a GPU is known to be there."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU (torch.cuda.is_available() is False); these tests launch the bundle's Triton "
                    "kernels through flyship's loader and compare every op with its PyTorch reference")
    return torch


@pytest.fixture(scope="session")
def bundle(gpu) -> Path:
    d = bundle_dir()
    if not (d / "manifest.json").is_file():
        pytest.skip(f"no bundle at {d} (set FLYSHIP_GPU_BUNDLE, or build one with flyc-build "
                    "examples/triton/ops.py -o artifacts/triton --arch sm_90 --arch gfx942); the tests would run it")
    return d


@pytest.fixture(scope="session")
def ops(gpu, bundle) -> Any:
    import flyship
    from flyship.bundle import targets

    o = flyship.load(bundle, fallback=True)
    device = o.device_target(gpu.cuda.current_device())
    if targets.select(list(o.targets), device) is None:
        pytest.skip(f"the bundle at {bundle} has code objects for {', '.join(o.targets)}, none of which runs on this "
                    f"GPU ({device}); rebuild it with --arch for this device")
    return o


@pytest.fixture(scope="session")
def refs(bundle) -> ModuleType:
    """The bundle's own ``references.py`` (what the fallback runs)."""
    spec = importlib.util.spec_from_file_location("flyship_gpu_test_references", bundle / "references.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Counts:
    """Change of an op's stats over a block: launches per specialization, fallbacks per reason, empty calls."""

    def __init__(self, op: Any) -> None:
        self.op = op
        self.before = op.stats()
        self.launches: dict[str, int] = {}
        self.variants: dict[str, int] = {}
        self.fallbacks: dict[str, int] = {}
        self.empty = 0
        self.calls = 0

    def close(self) -> None:
        after = self.op.stats()
        # variants: per specialization as the manifest names them; launches: per declared spec, a Triton spec's
        # generic specialization (<spec>__generic, after the JIT's variant: docs/triton.md) counted as the spec
        self.variants = {k: v - self.before["launches"].get(k, 0) for k, v in after["launches"].items()
                         if v != self.before["launches"].get(k, 0)}
        self.launches = {}
        for k, v in self.variants.items():
            base = k[:-len("__generic")] if k.endswith("__generic") else k
            self.launches[base] = self.launches.get(base, 0) + v
        self.fallbacks = {k: v - self.before["fallbacks"].get(k, 0) for k, v in after["fallbacks"].items()
                          if v != self.before["fallbacks"].get(k, 0)}
        self.empty = after["empty"] - self.before["empty"]
        self.calls = after["calls"] - self.before["calls"]

    @property
    def launched(self) -> int:
        return sum(self.launches.values())

    @property
    def fell_back(self) -> int:
        return sum(self.fallbacks.values())


@contextlib.contextmanager
def counting(op: Any) -> Iterator[Counts]:
    c = Counts(op)
    try:
        yield c
    finally:
        c.close()


@contextlib.contextmanager
def fallback_off(ops: Any) -> Iterator[None]:
    was = ops.fallback
    ops.fallback = False
    try:
        yield
    finally:
        ops.fallback = was


def kernel_streams(run: Any, trace: Path) -> list[tuple[str, int]]:
    """(name, stream) of every GPU kernel that ``run()`` launched, in start order, as the profiler saw them execute:
    CUPTI's stream id of each kernel (torch.profiler's trace, ``args.stream``). A fact about where each kernel ran,
    not a guess from timing."""
    import json

    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    prof.export_chrome_trace(str(trace))
    events = json.loads(trace.read_text()).get("traceEvents", [])
    kernels = sorted((e for e in events if str(e.get("cat", "")).lower() == "kernel"), key=lambda e: e.get("ts", 0))
    if not kernels:
        pytest.fail("the profiler recorded no GPU kernel (CUPTI unavailable?): cannot tell which stream ran the op")
    return [(e["name"], int(e["args"]["stream"])) for e in kernels]


def assert_on_the_current_stream(call: Any, trace_dir: Path) -> None:
    """``call()`` launches every kernel on the current stream, not the default one: run on the default stream, its
    kernels' stream is the default's; run under a side stream (after a probe kernel there, ``torch.cuda._sleep``), every
    kernel, the probe's included, runs on one stream that is not the default's. Decided by the profiler's stream ids,
    so no timing is involved."""
    import torch

    on_default = kernel_streams(call, trace_dir / "default.json")
    default_ids = {s for _, s in on_default}
    assert len(default_ids) == 1, f"run on the default stream, the kernels ran on several streams: {on_default}"
    side = torch.cuda.Stream()

    def on_side() -> None:
        with torch.cuda.stream(side):
            torch.cuda._sleep(1000)  # the probe: a kernel known to run on `side`
            call()

    launched = kernel_streams(on_side, trace_dir / "side.json")
    probe = [s for name, s in launched if "spin_kernel" in name]
    assert len(probe) == 1, f"expected the probe kernel once, got {launched}"
    assert {s for _, s in launched} == set(probe), f"kernels that left the current stream: {launched}"
    assert probe[0] not in default_ids, f"the side stream is the default stream's ({default_ids}): {launched}"
    assert len(launched) >= 1 + len(on_default), f"the op launched fewer kernels on the side stream: {launched}"
