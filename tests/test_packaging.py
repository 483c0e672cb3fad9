"""The installed package is complete: every module imports from a plain install, away from the source tree."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.cpu


def test_a_plain_install_holds_every_module_csrc_and_the_schema(tmp_path):
    # Build from a clean copy: setuptools reuses a stale build/ folder, which would hide a missing package.
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv-*", "build", "*.egg-info", "artifacts", "__pycache__", ".pytest_cache", ".dev", ".whl"))
    target = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                        "--target", str(target), str(src)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    sources = {p.relative_to(ROOT).with_suffix("") for folder in ("bundle", "compiler", "loader")
               for p in (ROOT / folder).rglob("*.py")}
    modules = sorted("flyship." + ".".join(s.parts) for s in sources if s.name != "__init__")
    code = ("import importlib, sys\n"
            f"for m in {modules!r}:\n"  # frontends import their DSL lazily: every module loads without it
            "    importlib.import_module(m)\n"
            "import flyship\n"
            "assert flyship.__file__.startswith(sys.argv[1]), flyship.__file__\n")
    r = subprocess.run([sys.executable, "-c", code, str(target)], cwd=str(tmp_path), capture_output=True, text=True,
                       env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"}, timeout=300)
    assert r.returncode == 0, r.stderr
    installed = target / "flyship"
    for name in ("bundle.h", "plan.cpp", "driver.h", "driver_hip.cpp", "driver_cuda.cpp", "driver_record.cpp", "expr.h"):
        assert (installed / "csrc" / name).is_file(), name
    assert (installed / "bundle" / "schema.json").is_file()
    assert not (target / "compiler").exists() and not (target / "loader").exists()  # one import name only
