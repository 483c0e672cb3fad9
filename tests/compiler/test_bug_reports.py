"""A bug is never flattened into a one-line error (flyship/errors.py's policy): an unexpected exception in a
frontend reaches the user with its traceback (chained in this process; as text from a spawned worker, printed by
``flyc-build --verbose`` or written to a file the error names), while a deliberate refusal (a SpecError) stays one
line. Runs on the CPU: the frontends are tests-only (tests/compiler/tiny_frontend.py, buggy_frontend.py)."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from flyship.compiler import pipeline as B
from flyship.compiler import frontends
from flyship.errors import CompileError

from ..conftest import ROOT

pytestmark = pytest.mark.cpu

SPEC = """
    from flyship.compiler.spec import *
    from tests.compiler.{module} import {kernel}

    namespace("bug_ops")
    op("vadd", kernel={kernel}(), grid=("cdiv(a.numel, 64)",),
       args=[Tensor("a", rank=1), Tensor("b", rank=1), Output("c", like="a")],
       specs=[Spec("f32", dtypes={{"a": "float32", "b": "float32"}}, shapes={{"a": (4096,), "b": (4096,)}}{extra})])
"""


def spec_file(tmp_path: Path, module: str, kernel: str, extra: str = "") -> Path:
    p = tmp_path / f"{module}_spec.py"
    p.write_text(textwrap.dedent(SPEC.format(module=module, kernel=kernel, extra=extra)))
    return p


@pytest.fixture
def registry(monkeypatch):
    """The tests-only frontends, registered for one test (the registry is restored afterwards)."""
    monkeypatch.setattr(frontends, "_REGISTRY", dict(frontends._registry()))
    for module in ("tests.compiler.tiny_frontend", "tests.compiler.buggy_frontend"):
        frontends.register(importlib.import_module(module).FRONTEND)


def flyc_build(spec: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    """flyc-build as a user runs it, in this Python (the frontends are tests-only: no DSL needed)."""
    return subprocess.run([sys.executable, "-m", "flyship.compiler.cli", str(spec), "-o", str(out), "--arch",
                           "gfx942", "--no-cache", *extra], capture_output=True, text=True, cwd=str(ROOT), timeout=300)


def test_a_frontend_bug_in_a_worker_keeps_its_traceback_in_the_builds_error(registry, tmp_path):
    opts = B.BuildOptions(spec_path=str(spec_file(tmp_path, "buggy_frontend", "BuggyKernel")),
                          out_dir=str(tmp_path / "out"), archs=("gfx942",), cache=False)
    with pytest.raises(CompileError) as e:
        B.build(opts, progress=lambda line: None)
    msg = str(e.value)
    assert "vadd.f32 on gfx942: KeyError: 'vadd_lowered'" in msg and "an unexpected exception, a bug" in msg
    assert "Traceback" not in msg  # the message stays a list of failures, one line each with a next step
    tb = e.value.details  # the worker's traceback, carried back as text
    assert tb.startswith("--- vadd.f32 on gfx942 ---\nTraceback (most recent call last):")
    assert "in _lower" in tb and "return table[name + \"_lowered\"]" in tb and "KeyError: 'vadd_lowered'" in tb
    assert not (tmp_path / "out").exists()


def test_a_bug_in_a_frontends_declaration_check_is_chained_with_its_traceback(registry, tmp_path, monkeypatch):
    def check_declaration(self, op):
        return {}["missing"]

    monkeypatch.setattr(type(frontends.get("tiny")), "check_declaration", check_declaration)
    with pytest.raises(CompileError) as e:
        B.read_declarations(str(spec_file(tmp_path, "tiny_frontend", "TinyKernel")), B.check_archs(("gfx942",)))
    assert str(e.value).startswith("flyc-build: frontend tiny's check of op vadd raised an unexpected KeyError: "
                                   "'missing'; this is a bug")
    assert isinstance(e.value.__cause__, KeyError)  # chained, not `from None`
    assert "in check_declaration" in e.value.details and e.value.details.rstrip().endswith("KeyError: 'missing'")


def test_flyc_build_writes_a_bugs_traceback_to_a_file_it_names_and_prints_it_with_verbose(tmp_path):
    spec = spec_file(tmp_path, "buggy_frontend", "BuggyKernel")
    r = flyc_build(spec, tmp_path / "out")
    assert r.returncode == 1 and "KeyError: 'vadd_lowered'" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    m = re.search(r"the traceback of the unexpected exception is in (\S+) \(flyc-build --verbose prints it\)",
                  r.stderr)
    assert m, r.stderr
    saved = Path(m.group(1))
    try:
        assert "Traceback (most recent call last)" in saved.read_text() and "in _lower" in saved.read_text()
    finally:
        saved.unlink()
    r = flyc_build(spec, tmp_path / "out", "--verbose")
    assert r.returncode == 1 and "traceback of the unexpected exception:\n--- vadd.f32 on gfx942 ---" in r.stderr
    assert "in _lower" in r.stderr and "is in " not in r.stderr


def test_a_spec_error_stays_one_line_without_a_traceback(tmp_path):
    spec = spec_file(tmp_path, "tiny_frontend", "TinyKernel", extra=', constraints=("a.shape[0] <",)')
    r = flyc_build(spec, tmp_path / "out")
    assert r.returncode == 1 and r.stderr.startswith("error: "), r.stderr
    assert "Traceback" not in r.stderr and "traceback" not in r.stderr
    assert len([line for line in r.stderr.splitlines() if line.strip()]) == 1, r.stderr
