"""The installed package is complete: every module imports from a plain install, away from the source tree."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import copy_checkout

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.cpu


def test_a_plain_install_holds_every_module_csrc_and_the_schema(tmp_path):
    # Build from a clean copy: setuptools reuses a stale build/ folder, which would hide a missing package.
    src = tmp_path / "src"
    copy_checkout(src)
    target = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                        "--target", str(target), str(src)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    sources = {p.relative_to(ROOT).with_suffix("") for folder in ("bundle", "compiler", "loader")
               for p in (ROOT / folder).rglob("*.py")}
    modules = sorted("flyship." + ".".join(s.parts) for s in sources if s.name != "__init__")
    code = ("import importlib, sys\n"
            f"for m in {modules!r}:\n"  # frontends import their DSL lazily: every module loads without it
            "    f = importlib.import_module(m).__file__\n"
            "    assert f.startswith(sys.argv[1]), (m, f)\n"  # from the install, never an editable finder's checkout
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


def test_a_python_started_in_the_checkout_root_imports_a_whole_flyship_after_a_non_editable_install(
        tmp_path, example_bundle):
    # The README's way: a venv, `pip install .` (not editable), then the quickstart, run from the repository root,
    # where the root is first on sys.path and the checkout's flyship/ folder (the package root only) shadows the
    # installed package. torch comes from this Python (a .pth line), so the venv installs nothing but flyship.
    import sysconfig

    src = tmp_path / "checkout"
    copy_checkout(src)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "_outer.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # torch, pip, setuptools
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", str(src)],
                       capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert Path(site, "flyship", "loader", "__init__.py").is_file()  # a real (non-editable) install
    quickstart = ("import sys, torch, flyship\n"
                  "import flyship.loader\n"
                  "ops = flyship.load(sys.argv[1])\n"
                  "x = torch.randn(4, 8)\n"
                  "assert torch.allclose(ops.add(x, x), x + x)\n"
                  "print(flyship.__file__, flyship.loader.__file__)\n")
    r = subprocess.run([str(py), "-c", quickstart, str(example_bundle)], cwd=str(src), capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    root_file, loader_file = r.stdout.split()
    # Started in the checkout: the checkout's flyship, whole (its loader too), never half of each.
    assert root_file == str(src / "flyship" / "__init__.py")
    assert loader_file == str(src / "loader" / "__init__.py")
    r = subprocess.run([str(py), "-c", "import flyship.loader; print(flyship.loader.__file__)"], cwd=str(tmp_path),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(Path(site, "flyship", "loader", "__init__.py"))  # elsewhere: the installed one
