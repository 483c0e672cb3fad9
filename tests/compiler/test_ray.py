"""Distributed builds: flyc-build --executor ray:ADDRESS against a real Ray head on 127.0.0.1 with two worker CPUs.

The head runs in its own process session, is stopped at the end (even when a test fails) by signalling that
session only, and everything stays on loopback. Deselect with ``-m "not ray"``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from ..conftest import ROOT, flydsl_python, run_build
from . import tiny_space

pytestmark = [pytest.mark.compile, pytest.mark.ray]

# Ray swaps 127.0.0.1 for the machine's outward address unless told it is not forming a multi-machine cluster;
# a token in ~/.ray (left by any earlier Ray on this machine) would otherwise switch the test head to token auth.
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_head():
    """A Ray head on 127.0.0.1 with 2 CPUs (two worker processes at a time); yields its address."""
    py = flydsl_python()
    if py is None or subprocess.run([py, "-c", "import ray"], capture_output=True).returncode != 0:
        pytest.skip("needs ray in the FlyDSL build Python (pip install 'flyship[ray]'); it would prove that a Ray "
                    "cluster builds bundles byte-identical to a local build")
    port = _free_port()
    tmp = tempfile.mkdtemp(prefix="flyray-")  # short: Ray's socket paths live under it
    log = open(Path(tmp) / "head.log", "w")
    env = dict(os.environ, **LOOPBACK_ENV)
    head = subprocess.Popen([py, "-m", "ray.scripts.scripts", "start", "--head", "--block",
                             "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=2",
                             "--include-dashboard=false", "--disable-usage-stats", "--object-store-memory=100000000",
                             f"--temp-dir={tmp}"], stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True, cwd=str(ROOT))
    try:
        deadline = time.monotonic() + 120
        while "Ray runtime started" not in (Path(tmp) / "head.log").read_text():
            if head.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the Ray head did not start:\n{(Path(tmp) / 'head.log').read_text()[-3000:]}")
            time.sleep(0.5)
        yield f"127.0.0.1:{port}"
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):  # the head's session holds GCS, raylet and the workers
            try:
                os.killpg(head.pid, sig)
            except ProcessLookupError:
                break
            try:
                head.wait(timeout=20)
            except subprocess.TimeoutExpired:
                continue
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGKILL)  # stragglers whose parent already left
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_the_examples_built_on_a_ray_cluster_equal_a_local_build(tmp_path, ray_head, example_bundle):
    r = run_build(ROOT / "examples/flydsl/ops.py", tmp_path / "ray", ["gfx942", "gfx950"], "-j", "2",
                  "--offload-bundle", "--keep-ir", "--executor", f"ray:{ray_head}", env=LOOPBACK_ENV)
    assert "(ray)" in r.stderr
    assert files_of(tmp_path / "ray") == files_of(example_bundle)


def test_a_tuning_space_of_200_triton_configs_built_on_ray_equals_a_local_build(tmp_path, ray_head):
    spec = tiny_space.write_space(tmp_path / "space", 200)
    r = run_build(spec, tmp_path / "ray", ["gfx942"], "--executor", f"ray:{ray_head}", env=LOOPBACK_ENV)
    assert r.stderr.count("(ray)") == 200
    run_build(spec, tmp_path / "local", ["gfx942"], "-j", "2")
    assert files_of(tmp_path / "ray") == files_of(tmp_path / "local")
    assert len(files_of(tmp_path / "ray")) == 201  # 200 code objects + the manifest


def test_a_kernel_failing_on_ray_is_reported_like_a_local_failure(tmp_path, ray_head):
    spec = tiny_space.write_space(tmp_path / "space", 3)
    cfg = tmp_path / "space" / "configs.json"
    cfg.write_text(cfg.read_text().replace('"BLOCK": 64', '"BLOCK": 100', 1))  # tl.arange needs a power of 2
    ray = run_build(spec, tmp_path / "ray", ["gfx942"], "--executor", f"ray:{ray_head}", check=False, env=LOOPBACK_ENV)
    local = run_build(spec, tmp_path / "local", ["gfx942"], check=False)
    assert ray.returncode == local.returncode == 1
    failure = [ln for ln in local.stderr.splitlines() if "kernels failed" in ln]
    assert failure and failure[0] in ray.stderr and "1 of 3 kernels failed" in failure[0]
    assert not (tmp_path / "ray").exists()


def test_an_address_where_no_ray_head_listens_fails_fast_saying_what_to_do(tmp_path):
    spec = tiny_space.write_space(tmp_path / "space", 1)
    port = _free_port()
    t0 = time.monotonic()
    r = run_build(spec, tmp_path / "out", ["gfx942"], "--executor", f"ray:127.0.0.1:{port}", check=False)
    assert r.returncode == 1 and time.monotonic() - t0 < 60
    assert f"expected a Ray head listening at 127.0.0.1:{port}" in r.stderr and "ray start --head" in r.stderr


def test_a_local_build_never_imports_ray(tmp_path):
    spec = tiny_space.write_space(tmp_path / "space", 1)
    py = flydsl_python()
    if py is None:
        pytest.skip("needs the FlyDSL build Python; it would prove local builds need no Ray")
    code = ("import sys; from flyship.compiler.pipeline import BuildOptions, build; "
            f"build(BuildOptions(spec_path={str(spec)!r}, out_dir={str(tmp_path / 'out')!r}, archs=('gfx942',), "
            "cache=False), progress=lambda s: None); assert 'ray' not in sys.modules, 'ray was imported'")
    r = subprocess.run([py, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
