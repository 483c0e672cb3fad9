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
