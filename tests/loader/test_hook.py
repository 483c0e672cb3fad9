"""flyship hook: a .pth in a throwaway environment patches every process that imports the target module,
torchrun's ranks included (CPU, gloo); the real venv is never touched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from flyship.errors import ConfigError
from flyship.loader.tools import hook

pytestmark = pytest.mark.cpu

MODEL_DIR = Path(__file__).parent / "data" / "dropin"

TRAIN = """
import json, os
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
import dropin_model  # the first import: the hook loads the bundle and patches dropin_model.add

x, y = torch.randn(16), torch.randn(16)
for _ in range(3):
    torch.testing.assert_close(dropin_model.add(x, y), x + y)
dropin_model.add(x.double(), y.double())
t = torch.ones(1)
dist.all_reduce(t)
import flyship
report = flyship.routing_report()
report["calls_to_original"] = list(dropin_model.CALLS)
with open(os.path.join(os.environ["OUT_DIR"], f"rank{dist.get_rank()}.json"), "w") as f:
    json.dump(report, f)
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def env_python(tmp_path_factory, ext) -> Path:
    """A throwaway venv whose site-packages layers over this one (torch, flyship): the hook goes there."""
    root = tmp_path_factory.mktemp("hookenv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    py = root / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    here = sysconfig.get_paths()["purelib"]
    Path(site, "_layer.pth").write_text(f"import site; site.addsitedir({here!r})\n")
    return py


def patches_file(tmp_path: Path, tiny_bundle: Path, **extra) -> Path:
    p = tmp_path / "patches.json"
    p.write_text(json.dumps({"bundle": str(tiny_bundle), "patches": [
        {"target": "dropin_model:add", "op": "add", "args": {"x": "a", "y": "b"}, "cpu_target": "gfx942", **extra}]}))
    return p


def run(py: Path, *args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    e = dict(os.environ, PYTHONPATH=str(MODEL_DIR), **(env or {}))
    e.pop("RANK", None)
    e.pop("WORLD_SIZE", None)
    return subprocess.run([str(py), *args], capture_output=True, text=True, env=e, cwd=cwd, timeout=300)


def test_every_torchrun_rank_routes_calls_to_the_op(env_python, tmp_path, tiny_bundle):
    r = run(env_python, "-m", "flyship.loader.tools.cli", "hook", "install", "--patches",
            str(patches_file(tmp_path, tiny_bundle)))
    assert r.returncode == 0, r.stderr
    assert "zz_flyship_hook.pth" in r.stdout and "dropin_model:add -> add" in r.stdout
    (tmp_path / "train.py").write_text(TRAIN)
    r = run(env_python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "train.py",
            env={"OUT_DIR": str(tmp_path), "FLYSHIP_REPORT": "1", "OMP_NUM_THREADS": "1"}, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    for rank in (0, 1):
        rep = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert rep["rank"] == rank and rep["world_size"] == 2
        (site,) = rep["sites"]
        assert site["target"] == "dropin_model:add" and site["to_op"] == 3, site
        assert list(site["to_original"].values()) == [1] and "float64" in next(iter(site["to_original"]))
        assert site["verdict"] == "PARTLY ROUTED" and rep["calls_to_original"] == ["add"]
        assert f"flyship routing [rank {rank}/2, pid " in r.stderr  # FLYSHIP_REPORT=1, at each rank's exit
    assert r.stderr.count("dropin_model:add -> flyship_tiny::add  PARTLY ROUTED  3 to op, 1 to original") == 2


def test_a_process_that_never_imports_the_target_loads_nothing(env_python, tmp_path, tiny_bundle):
    assert run(env_python, "-m", "flyship.loader.tools.cli", "hook", "install", "--patches",
               str(patches_file(tmp_path, tiny_bundle))).returncode == 0
    r = run(env_python, "-c", "import sys; print(sorted(m for m in sys.modules if m.startswith(('torch', "
                              "'flyship'))), [type(f).__name__ for f in sys.meta_path][0])")
    assert r.returncode == 0, r.stderr
    # The start-up hook reads FLYSHIP_HOOK with the switch parser (flyship.env, its switch table a @frozen class)
    # and the patches file with the one bounded reader (bundle/files.py), and nothing else:
    # no torch, no loader, no bundle until the target module is imported.
    assert r.stdout.strip() == ("['flyship', 'flyship._startup', 'flyship.bundle', 'flyship.bundle.errors', "
                                "'flyship.bundle.files', 'flyship.bundle.frozen', 'flyship.bundle.limits', 'flyship.env', "
                                "'flyship.errors', 'flyship.version'] _Finder")
    r = run(env_python, "-c", "import sys, dropin_model; print(dropin_model.add.__flyship_patch__)",
            env={"FLYSHIP_HOOK": "0"})
    assert r.returncode == 1 and "has no attribute '__flyship_patch__'" in r.stderr


def test_hook_status_and_remove_report_and_undo_the_install(env_python, tmp_path, tiny_bundle):
    pf = patches_file(tmp_path, tiny_bundle)
    assert run(env_python, "-m", "flyship.loader.tools.cli", "hook", "install", "--patches", str(pf)).returncode == 0
    r = run(env_python, "-m", "flyship.loader.tools.cli", "hook", "status")
    assert r.returncode == 0 and f"patches: {pf}" in r.stdout and "dropin_model:add -> add" in r.stdout
    pf.write_text("{broken")
    r = run(env_python, "-m", "flyship.loader.tools.cli", "hook", "status")
    assert r.returncode == 1 and "cannot read the patches file" in r.stderr and "JSON" in r.stderr
    r = run(env_python, "-c", "import dropin_model")
    assert r.returncode == 0 and "flyship hook: cannot read the patches file" in r.stderr
    r = run(env_python, "-m", "flyship.loader.tools.cli", "hook", "remove")
    assert r.returncode == 0 and "removed" in r.stdout and "zz_flyship_hook.pth" in r.stdout
    r = run(env_python, "-m", "flyship.loader.tools.cli", "hook", "status")
    assert r.returncode == 0 and "no flyship hook" in r.stdout


def test_a_patch_the_hook_cannot_make_is_reported_and_the_import_still_works(env_python, tmp_path, tiny_bundle):
    pf = tmp_path / "patches.json"
    pf.write_text(json.dumps({"bundle": str(tiny_bundle), "patches": [{"target": "dropin_model:add", "op": "add"}]}))
    assert run(env_python, "-m", "flyship.loader.tools.cli", "hook", "install", "--patches", str(pf)).returncode == 0
    r = run(env_python, "-c", "import dropin_model, flyship; print(flyship.routing_report()['errors'])")
    assert r.returncode == 0, r.stderr
    assert "flyship hook: not patched: dropin_model:add -> add" in r.stderr and "have no source" in r.stdout


def test_the_hook_takes_the_packed_file_docs_shipping_ships_and_refuses_an_altered_one(env_python, tmp_path,
                                                                                      tiny_bundle, monkeypatch):
    from flyship.bundle import pack as _pack
    from flyship.errors import BundleError

    packed = _pack.pack(tiny_bundle, tmp_path / "tiny.flyship")
    pf = tmp_path / "patches.json"
    pf.write_text(json.dumps({"bundle": "tiny.flyship", "patches": [  # relative to the patches file, as a folder is
        {"target": "dropin_model:add", "op": "add", "args": {"x": "a", "y": "b"}, "cpu_target": "gfx942"}]}))
    r = run(env_python, "-m", "flyship.loader.tools.cli", "hook", "install", "--patches", str(pf))
    assert r.returncode == 0, r.stderr
    r = run(env_python, "-c", "import dropin_model; print(dropin_model.add.__flyship_patch__.op.qualname)",
            env={"FLYSHIP_BUNDLE_CACHE": str(tmp_path / "cache")})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("add")
    monkeypatch.setenv("FLYSHIP_BUNDLE_CACHE", str(tmp_path / "cache"))
    blob = bytearray(packed.read_bytes())
    blob[-200] ^= 1  # a byte of the last member (the zip directory is smaller than that)
    packed.write_bytes(bytes(blob))
    with pytest.raises(BundleError, match="tiny.flyship"):
        hook.install(pf, tmp_path)


def test_install_refuses_a_bad_patches_file_naming_the_problem(tmp_path, tiny_bundle):
    bad = tmp_path / "p.json"
    bad.write_text(json.dumps({"bundle": str(tiny_bundle), "patches": [{"target": "m.f", "op": "add"}]}))
    with pytest.raises(ConfigError, match=r"patches\[0\]: expected a target 'package.module:Class.method', got 'm.f'"):
        hook.install(bad, tmp_path)
    bad.write_text(json.dumps({"bundle": "nowhere", "patches": []}))
    with pytest.raises(ConfigError, match=r"expected a bundle \(a folder with manifest.json, or a packed .flyship file\) at .*nowhere"):
        hook.install(bad, tmp_path)
    bad.write_text(json.dumps({"bundle": str(tiny_bundle), "patches": [{"target": "m:f", "op": "add",
                                                                         "args": {"x": 3}}]}))
    with pytest.raises(ConfigError, match=r'args\["x"\]: expected a parameter name'):
        hook.read_patches(bad)


def test_a_patches_file_says_what_a_compiled_trace_of_each_site_gets(tmp_path, tiny_bundle):
    assert hook.read_patches(patches_file(tmp_path, tiny_bundle)).patches[0].compiled == "op"
    pf = hook.read_patches(patches_file(tmp_path, tiny_bundle, compiled="original"))
    assert pf.patches[0].compiled == "original"
    with pytest.raises(ConfigError, match=r"patches\[0\]: compiled: expected one of 'op', 'original', got 'maybe'"):
        hook.read_patches(patches_file(tmp_path, tiny_bundle, compiled="maybe"))
