"""Shared fixtures: the two Pythons and the example bundles, built once per session through flyc-build.

The build side (FlyDSL venv) is ``FLYSHIP_TEST_FLYDSL_PY`` (the Makefile sets it) or the running Python
when it has flydsl. Bundles are built into a session temp folder, as a user would, with the CLI.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flyship.loader import toolkits

ROOT = Path(__file__).resolve().parents[1]

# What a clean copy of the checkout leaves out: at the root only (the root's build/ is setuptools' scratch that it
# would reuse stale, dist/ holds make wheel's wheels; no source folder is named build/), and caches anywhere.
_ROOT_ONLY = {".git", "build", "dist", "artifacts", ".dev", ".whl", ".matrix", ".pytest_cache", ".hypothesis"}
_ANYWHERE = ("__pycache__", "*.egg-info", ".venv-*")


def copy_checkout(dest: Path) -> Path:
    """A clean copy of this checkout at ``dest`` (what a fresh clone holds, without git), for install tests."""
    import fnmatch
    import shutil

    def ignore(folder: str, names: list[str]) -> set[str]:
        out = {n for n in names if any(fnmatch.fnmatch(n, p) for p in _ANYWHERE)}
        return out | (set(names) & _ROOT_ONLY if Path(folder).resolve() == ROOT else set())

    shutil.copytree(ROOT, dest, symlinks=True, ignore=ignore)
    return dest


def site_view(site: Path | str, dest: Path, exclude: str) -> Path:
    """A folder of links to every entry of ``site`` (a site-packages folder) whose name does not match the regex
    ``exclude``: a venv layered over it (a path line in a .pth) sees those packages and not the excluded ones."""
    import re

    dest.mkdir(parents=True)
    for entry in Path(site).iterdir():
        if not re.match(exclude, entry.name, flags=re.I):
            (dest / entry.name).symlink_to(entry)
    return dest


# The loader's HIP flavor builds against HIP's headers (Debian's libamdhip64-dev): found once for every test that
# builds it (tests/loader/test_build.py, test_build_hip.py).
HIP_HEADERS = toolkits.find_hip_headers()
needs_hip = pytest.mark.skipif(
    HIP_HEADERS is None,
    reason="no HIP headers (hip/hip_runtime_api.h); install libamdhip64-dev to build the HIP flavor")


def flydsl_python() -> str | None:
    env = os.environ.get("FLYSHIP_TEST_FLYDSL_PY")
    if env and Path(env).exists():
        return env
    if importlib.util.find_spec("flydsl") is not None:
        return sys.executable
    cand = ROOT / ".venv-flydsl" / "bin" / "python"
    return str(cand) if cand.exists() else None



def need_flydsl_python(would: str) -> str:
    """The FlyDSL build Python, or skip the test saying what it ``would`` do with it."""
    py = flydsl_python()
    if py is None:
        pytest.skip(f"needs the FlyDSL build Python (make install creates .venv-flydsl); it would {would}")
    return py

def run_build(spec: Path | str, out: Path, archs: list[str], *extra: str, check: bool = True,
              env: dict | None = None, cache: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``flyc-build`` in the build Python as a subprocess (what a user types).

    Tests never touch the user's build cache: without ``cache`` the build runs with ``--no-cache`` (it really
    compiles); with it, ``FLYSHIP_CACHE_DIR`` points there.
    """
    py = need_flydsl_python("build bundles")
    cmd = [py, "-m", "flyship.compiler.cli", str(spec), "-o", str(out), *sum((["--arch", a] for a in archs), []),
           *extra, *(() if cache is not None else ("--no-cache",))]
    e = dict(os.environ, **(env or {}))  # flyship is installed (editable) in the build Python
    if cache is not None:
        e["FLYSHIP_CACHE_DIR"] = str(cache)
    r = subprocess.run(cmd, capture_output=True, text=True, env=e, cwd=str(ROOT), timeout=900)
    if check and r.returncode != 0:
        raise AssertionError(f"flyc-build failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r


def children_of(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (read from /proc)."""
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                stat = (p / "stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2:].split()[1]) == pid:
                out.append(int(p.name))
    return out


def wait_for(cond, seconds: float, what: str) -> None:
    """Poll ``cond`` every 0.1 s; fail the test naming ``what`` if it is still false after ``seconds``."""
    end = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > end:
            pytest.fail(f"timed out after {seconds}s waiting for {what}")
        time.sleep(0.1)


@pytest.fixture(scope="session")
def example_cache(tmp_path_factory) -> Path:
    """The build cache the example bundle is built with (fresh per session, so that build is a cold one)."""
    return tmp_path_factory.mktemp("build-cache")


@pytest.fixture(scope="session")
def example_bundle(tmp_path_factory, example_cache) -> Path:
    """The FlyDSL example bundle for gfx942 + gfx950 (with an offload bundle and the ISA kept)."""
    pre = os.environ.get("FLYSHIP_EXAMPLE_BUNDLE")
    if pre and (Path(pre) / "manifest.json").exists():
        return Path(pre)
    out = tmp_path_factory.mktemp("bundles") / "examples"
    run_build(ROOT / "examples/flydsl/ops.py", out, ["gfx942", "gfx950"], "-j", "2", "--offload-bundle", "--keep-ir",
              cache=example_cache)
    return out


@pytest.fixture(scope="session")
def pertarget_build(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """examples/flydsl/pertarget.py for gfx942 + gfx950 with --keep-going: (the bundle, the CLI's result). One
    spec needs 80 KiB of LDS, so the gfx942 kernel of it fails and the build exits 1 after writing the rest."""
    out = tmp_path_factory.mktemp("bundles") / "pertarget"
    r = run_build(ROOT / "examples/flydsl/pertarget.py", out, ["gfx942", "gfx950"], "-j", "2", "--keep-going",
                  check=False)
    if r.returncode != 1 or not (out / "manifest.json").is_file():
        raise AssertionError(f"expected flyc-build --keep-going to write {out} and exit 1, got {r.returncode}:\n"
                             f"{r.stdout}\n{r.stderr}")
    return out, r


@pytest.fixture(scope="session")
def patterns_bundle(tmp_path_factory) -> Path:
    """The issue-9 launcher-pattern bundle (examples/flydsl/patterns.py) for gfx942 + gfx950."""
    out = tmp_path_factory.mktemp("bundles") / "patterns"
    run_build(ROOT / "examples/flydsl/patterns.py", out, ["gfx942", "gfx950"], "-j", "2")
    return out


@pytest.fixture(scope="session")
def multilaunch_build(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """The two-phase Triton ops (examples/triton/multilaunch.py: two launches and a workspace per call) for
    gfx942, gfx950 and sm_90: (the bundle, flyc-build's result, its summary table on stdout)."""
    out = tmp_path_factory.mktemp("bundles") / "multilaunch"
    r = run_build(ROOT / "examples/triton/multilaunch.py", out, ["gfx942", "gfx950", "sm_90"], "-j", "2")
    return out, r


@pytest.fixture(scope="session")
def multilaunch_bundle(multilaunch_build) -> Path:
    """The bundle of :func:`multilaunch_build`."""
    return multilaunch_build[0]


@pytest.fixture(scope="session")
def triton_examples_bundle(tmp_path_factory) -> Path:
    """The Triton example bundle (examples/triton/ops.py) for sm_90 + gfx942: the one `make bundles` built
    (artifacts/triton, or FLYSHIP_GPU_BUNDLE) when it holds every op of the spec, else built here once."""
    import json

    pre = Path(os.environ.get("FLYSHIP_GPU_BUNDLE") or ROOT / "artifacts" / "triton")
    if (pre / "manifest.json").is_file():
        have = {o["name"] for o in json.loads((pre / "manifest.json").read_text())["ops"]}
        if {"fused_add_rmsnorm", "accumulate", "rowsum_atomic_out"} <= have:
            return pre
    if flydsl_python() is None:
        pytest.skip("no up-to-date Triton example bundle and no build Python to make one")
    out = tmp_path_factory.mktemp("bundles") / "triton"
    run_build(ROOT / "examples/triton/ops.py", out, ["sm_90", "gfx942"], "-j", "2")
    return out


@pytest.fixture(scope="session")
def training_bundle(tmp_path_factory) -> Path:
    """The training ops (examples/triton/training.py: autograd pairs that write gradients in place, composites) for
    sm_90: ``artifacts/training`` when `make bundles` built it from this spec, else built here once."""
    pre = ROOT / "artifacts" / "training"
    if (pre / "manifest.json").is_file() and (pre / "references.py").read_bytes() == \
            (ROOT / "examples/triton/training_references.py").read_bytes():
        return pre
    out = tmp_path_factory.mktemp("bundles") / "training"
    run_build(ROOT / "examples/triton/training.py", out, ["sm_90"], "-j", "2")
    return out
