"""The documented install leaves the user's FlyDSL alone: a fresh venv that already has torch and a chosen
FlyDSL gets ``pip install ".[compiler]"`` exactly as the README says; FlyDSL's version is unchanged after it,
numpy came with it (FlyDSL imports it undeclared), and the installed ``flyc-build`` builds the examples."""

from __future__ import annotations

import os
import subprocess
import tempfile
import pytest

from ..conftest import copy_checkout
from .conftest import PORTABLE, need_matrix

pytestmark = pytest.mark.matrix


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, cwd=tempfile.gettempdir(), **kw)
    assert r.returncode == 0, f"{' '.join(cmd)} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def test_pip_install_compiler_extra_keeps_the_installed_flydsl_and_builds_the_examples(tmp_path):
    oldest = min(need_matrix(), key=lambda c: c.parsed)  # the release furthest from the dev venv's
    venv = tmp_path / "venv"
    run([oldest.python, "-m", "venv", str(venv)])
    py = str(venv / "bin" / "python")
    pyv = run([py, "-c", "import sys; print('%d%d' % sys.version_info[:2])"]).stdout.strip()
    torch_pin = os.environ.get(f"FLYSHIP_MATRIX_TORCH_PY{pyv}", "torch")
    # The user's image: torch and FlyDSL, nothing of flyship's.
    run([py, "-m", "pip", "install", "-q", torch_pin])
    run([py, "-m", "pip", "install", "-q", "--no-deps", f"flydsl=={oldest.flydsl}"])
    # The README's step, from a clean copy of this checkout (no stale build/ folder).
    src = tmp_path / "src"
    copy_checkout(src)
    run([py, "-m", "pip", "install", "-q", f"{src}[compiler]"])
    show = run([py, "-c", "import flydsl, numpy; print(flydsl.__version__)"]).stdout.strip()
    assert show == oldest.flydsl
    listed = run([py, "-m", "pip", "list", "--format=freeze"]).stdout
    assert f"flydsl=={oldest.flydsl}" in listed.splitlines()
    out = tmp_path / "bundle"
    build = run([str(venv / "bin" / "flyc-build"), str(PORTABLE), "-o", str(out), "--arch", "gfx942"],
                env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert "wrote" in build.stdout
    assert (out / "manifest.json").is_file()
    assert run([py, "-c", "import flydsl; print(flydsl.__version__)"]).stdout.strip() == oldest.flydsl
