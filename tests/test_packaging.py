"""The installed package is complete: every module imports from a plain install, away from the source tree."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import copy_checkout, flydsl_python, site_view

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


_NOT_FLYSHIP = r"^(flyship|__editable__)"  # a dev venv's own flyship (its editable install), hidden from a fresh venv


def fresh_python(root: Path, sites: list[Path]) -> Path:
    """A venv at ``root`` with a ``pip`` command, layered over ``sites`` (site views): the packages there stand in
    for the index a fresh machine's pip would fetch them from (pip runs offline: PIP_NO_INDEX)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    py = root / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "_outer.pth").write_text("".join(f"{s}\n" for s in sites))
    (root / "bin" / "pip").write_text(f'#!/bin/sh\nexec "{py}" -m pip "$@"\n')
    (root / "bin" / "pip").chmod(0o755)
    return py


def offline_env(*path: Path) -> dict[str, str]:
    return {"PATH": os.pathsep.join([*map(str, path), "/usr/bin", "/bin"]), "HOME": os.environ.get("HOME", "/"),
            "PIP_NO_INDEX": "1", "PIP_NO_BUILD_ISOLATION": "0", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "LANG": "C.UTF-8"}


def readme_install_lines() -> list[str]:
    """The commands of the README's "Installing" block, comments dropped."""
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Installing\n", 1)[1]
    block = re.search(r"^```\n(.*?)^```$", section, flags=re.S | re.M).group(1)
    return [re.sub(r"\s+#.*$", "", line).strip() for line in block.splitlines() if line.strip()]


def test_the_readme_install_lines_work_as_written_in_fresh_venvs_both_profiles_both_ways(tmp_path):
    flydsl_py = flydsl_python()
    if flydsl_py is None:
        pytest.skip("needs the FlyDSL build Python (.venv-flydsl): the compile profile installs next to its FlyDSL")
    flydsl_site = subprocess.run([flydsl_py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 capture_output=True, text=True, check=True).stdout.strip()
    import sysconfig

    workload_view = site_view(sysconfig.get_paths()["purelib"], tmp_path / "views" / "workload", _NOT_FLYSHIP)
    flydsl_view = site_view(flydsl_site, tmp_path / "views" / "flydsl", _NOT_FLYSHIP)
    checkout = copy_checkout(tmp_path / "checkout")
    lines = readme_install_lines()
    assert not any(re.search(r"pip install\s+['\"]?flyship", line) for line in lines), \
        "a line installs flyship from a package index, which flyship is not on"
    shim = tmp_path / "shim"  # the Makefile's PY (python3.11): a fresh Python with pip, setuptools and wheel
    shim.mkdir()
    (shim / "python3.11").write_text(f'#!/bin/sh\nexec "{fresh_python(tmp_path / "make-py", [workload_view])}" "$@"\n')
    (shim / "python3.11").chmod(0o755)
    ran = []
    for i, line in enumerate(lines):
        if line == "make wheel":
            r = subprocess.run(["make", "wheel"], cwd=checkout, env=offline_env(shim), capture_output=True, text=True,
                               timeout=300)
            assert r.returncode == 0, r.stdout + r.stderr
            assert len(list((checkout / "dist").glob("flyship-*-py3-none-any.whl"))) == 1
            continue
        assert line.startswith("pip install "), line
        compiler = "compiler" in line
        venv = tmp_path / f"venv{i}"
        py = fresh_python(venv, [flydsl_view, workload_view] if compiler else [workload_view])
        r = subprocess.run(["/bin/sh", "-c", line], cwd=checkout, env=offline_env(venv / "bin"), capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, f"`{line}` failed:\n{r.stdout}\n{r.stderr}"
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir(exist_ok=True)
        if compiler:
            probe = [str(py), "-c", "import flydsl, flyship, flyship.compiler.cli, flyship.compiler.frontends.flydsl; "
                                    "print(flyship.__file__)"]
            tool = [str(venv / "bin" / "flyc-build"), "--help"]
        else:
            probe = [str(py), "-c", "import flyship, flyship.loader.core; print(flyship.__file__)"]
            tool = [str(venv / "bin" / "flyship"), "list", str(ROOT / "tests" / "loader" / "data" / "tiny")]
        r = subprocess.run(probe, cwd=elsewhere, env=offline_env(venv / "bin"), capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0 and r.stdout.startswith(str(venv)), f"`{line}`: {r.stdout}{r.stderr}"
        r = subprocess.run(tool, cwd=elsewhere, env=offline_env(venv / "bin"), capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, f"`{line}`: {' '.join(tool)}: {r.stdout}{r.stderr}"
        ran.append(("compiler" if compiler else "workload", "wheel" if "--find-links" in line else "checkout"))
    assert sorted(ran) == [("compiler", "checkout"), ("compiler", "wheel"), ("workload", "checkout"),
                           ("workload", "wheel")]


def test_a_script_beside_the_clone_folder_imports_the_dev_install_not_an_empty_namespace(tmp_path):
    # `make install` (scripts/dev_install.sh) into a fresh venv, then a script in the folder that holds the clone,
    # which is named flyship as `git clone` names it: without the checkout on sys.path, setuptools' editable finder
    # comes after the path finder, which makes the clone folder an empty namespace package ("no attribute 'load'").
    import sysconfig

    work = tmp_path / "work"
    clone = copy_checkout(work / "flyship")
    venv = tmp_path / "venv"
    py = fresh_python(venv, [site_view(sysconfig.get_paths()["purelib"], tmp_path / "view", _NOT_FLYSHIP)])
    r = subprocess.run(["sh", str(clone / "scripts" / "dev_install.sh"), str(py)], env=offline_env(venv / "bin"),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    (work / "use.py").write_text("import flyship\nprint(flyship.load.__module__, flyship.__file__)\n")
    r = subprocess.run([str(py), "use.py"], cwd=work, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["flyship", str(clone / "flyship" / "__init__.py")]
