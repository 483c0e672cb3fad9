"""The FlyDSL version matrix: one cached venv per (Python, FlyDSL release), each building the portable
kernels (examples/flydsl_portable) through flyc-build; the bundles are then loaded here, in the workload
Python. ``make test-matrix`` sets the variables below; without them every test skips with the reason.

* ``FLYSHIP_MATRIX``: ``"<python>:<flydsl version> ..."`` (space-separated), e.g.
  ``"python3.11:0.1.5 python3.11:0.5.0 /usr/bin/python3.12:0.2.4"``;
* ``FLYSHIP_MATRIX_DIR``: the venv cache (reused between runs);
* ``FLYSHIP_MATRIX_TORCH_PY311`` etc.: the torch requirement for that Python's base venv (default ``torch``).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from ..conftest import ROOT

SCRIPT = ROOT / "scripts" / "matrix_venv.sh"
PORTABLE = ROOT / "examples" / "flydsl_portable" / "ops.py"
ARCHS = ("gfx942", "gfx950")


@dataclasses.dataclass(frozen=True)
class Cell:
    python: str
    flydsl: str

    @property
    def id(self) -> str:
        return f"{Path(self.python).name}-flydsl{self.flydsl}"

    @property
    def parsed(self) -> tuple[int, ...]:
        return tuple(int(p) for p in self.flydsl.split("."))


def cells() -> list[Cell]:
    out = []
    for item in os.environ.get("FLYSHIP_MATRIX", "").split():
        py, _, ver = item.rpartition(":")
        out.append(Cell(py, ver))
    return out


def matrix_dir() -> Path:
    return Path(os.environ.get("FLYSHIP_MATRIX_DIR") or Path.home() / ".cache" / "flyship-matrix" / "venvs")


def need_matrix() -> list[Cell]:
    c = cells()
    if not c:
        pytest.skip("FLYSHIP_MATRIX is not set (make test-matrix sets it); these tests would build the portable "
                    "kernels with each FlyDSL release 0.1.5-0.5.0 and load the bundles side by side")
    return c


def venv_python(cell: Cell) -> str:
    """The cell's cached venv (created on first use by scripts/matrix_venv.sh)."""
    r = subprocess.run(["bash", str(SCRIPT), cell.python, cell.flydsl, str(matrix_dir())], capture_output=True,
                       text=True, timeout=3600)
    if r.returncode != 0:
        raise AssertionError(f"matrix venv {cell.id}: scripts/matrix_venv.sh failed:\n{r.stderr[-4000:]}")
    return r.stdout.strip().splitlines()[-1]


def flyship_site(tmp: Path) -> Path:
    """A folder laid out like an installed flyship, made of symlinks into this checkout: on PYTHONPATH it
    gives a cached matrix venv this checkout's flyship without installing anything into the venv."""
    site = tmp / "site"
    pkg = site / "flyship"
    pkg.mkdir(parents=True, exist_ok=True)
    for f in (ROOT / "flyship").glob("*.py"):
        (pkg / f.name).symlink_to(f)
    for sub in ("bundle", "compiler", "loader", "csrc"):
        (pkg / sub).symlink_to(ROOT / sub)
    return site


@dataclasses.dataclass
class Built:
    cell: Cell
    python: str
    bundle: Path | None
    log: str


@pytest.fixture(scope="session")
def matrix_builds(tmp_path_factory) -> dict[str, Built]:
    """Every cell's venv and portable bundle, built once per session (cells that fail keep their log)."""
    tmp = tmp_path_factory.mktemp("matrix")
    site = flyship_site(tmp)
    out: dict[str, Built] = {}
    for cell in need_matrix():
        py = venv_python(cell)
        bundle = tmp / cell.id
        env = dict(os.environ, PYTHONPATH=str(site), PYTHONWARNINGS="ignore")
        env.pop("VIRTUAL_ENV", None)
        cmd = [py, "-m", "flyship.compiler.cli", str(PORTABLE), "-o", str(bundle), "-j", "2",
               *sum((["--arch", a] for a in ARCHS), [])]
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tempfile.gettempdir(), timeout=1800)
        out[cell.id] = Built(cell, py, bundle if r.returncode == 0 else None, r.stdout + r.stderr)
    return out


@pytest.fixture(scope="session")
def site_dir(tmp_path_factory) -> Path:
    return flyship_site(tmp_path_factory.mktemp("site"))
