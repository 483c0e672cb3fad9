"""No compiler at run time: a prebuilt extension is found whatever HOME, CXX or the current directory; a build
announces itself in one line, runs once under torchrun, and an interrupted one leaves nothing to trust."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flyship.bundle import pack as _pack
from flyship.loader import extension

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable

pytestmark = pytest.mark.cpu


def bare_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A process with another HOME, a CXX that does not exist and no compiler or ninja on PATH."""
    home, bindir = tmp_path / "other_home", tmp_path / "empty_bin"
    home.mkdir(exist_ok=True)
    bindir.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("FLYSHIP_EXTENSIONS_DIR", "TORCH_EXTENSIONS_DIR",
                                                            "FLYSHIP_EXTENSION_PATH")}
    env.update(HOME=str(home), CXX=str(tmp_path / "no" / "c++"), CC=str(tmp_path / "no" / "cc"), PATH=str(bindir),
               FLYSHIP_BUNDLE_CACHE=str(tmp_path / "bundle_cache"), **extra)
    return env


DISPATCH = """
import sys
sys.prefix = sys.argv[2]  # the environment the extension may be installed into
import torch, flyship
ops = flyship.load(sys.argv[1])
x = torch.randn(1000)
print(ops.add.dispatch(x, x, target="gfx942").spec, ops.addsub.dispatch(x, x, target="sm_90").spec)
"""


@pytest.fixture(scope="module")
def shipped(ext, tmp_path_factory) -> Path:
    """`flyship prebuild -o ship/` next to a copy of the tiny bundle and its packed file."""
    ship = tmp_path_factory.mktemp("ship")
    r = subprocess.run([PY, "-m", "flyship.loader.tools.cli", "prebuild", "-o", str(ship)], cwd=ROOT, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    assert (ship / f"{extension.extension_name(ext.flavor())}.so").is_file()
    shutil.copytree(ROOT / "tests" / "loader" / "data" / "tiny", ship / "tiny")
    _pack.pack(ship / "tiny", ship / "tiny.flyship")
    return ship


@pytest.mark.parametrize("which", ["tiny", "tiny.flyship"])
def test_a_prebuilt_extension_beside_the_bundle_loads_with_no_compiler_another_home_another_cxx(shipped, tmp_path,
                                                                                                which):
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    r = subprocess.run([PY, "-c", DISPATCH, str(shipped / which), str(tmp_path / "empty_prefix")], cwd=elsewhere,
                       capture_output=True, text=True, env=bare_env(tmp_path), timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["f32", "f32"]
    assert "building" not in r.stderr
    assert not (tmp_path / "other_home" / ".cache" / "torch_extensions").exists()


NO_EXTENSION = """
import sys, flyship
from flyship.errors import FlyshipError
try:
    flyship.load(sys.argv[1])
except FlyshipError as e:
    print(e, file=sys.stderr)
    sys.exit(3)
"""


def test_no_prebuilt_extension_and_no_compiler_is_one_paragraph_naming_prebuild_and_the_extension_path(tmp_path,
                                                                                                      tiny_bundle):
    env = bare_env(tmp_path, FLYSHIP_EXTENSIONS_DIR=str(tmp_path / "ext"))  # nothing cached: a load must build
    r = subprocess.run([PY, "-c", NO_EXTENSION, str(tiny_bundle)], cwd=tmp_path, capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 3, r.stderr
    message = r.stderr.strip()
    assert "\n" not in message and len(message) < 1200, message  # one paragraph, not the compiler command lines
    assert f"CXX={str(tmp_path / 'no' / 'c++')!r} is not an executable file or on PATH" in message
    assert "`flyship prebuild -o DIR`" in message and "FLYSHIP_EXTENSION_PATH" in message
    assert "building" not in message


def test_a_compiler_that_fails_gives_the_telling_line_and_the_full_log_in_a_file_it_names(tmp_path, tiny_bundle):
    fake = tmp_path / "fake-g++"  # answers torch's version probe, then fails every compile with 40 lines of noise
    fake.write_text('#!/bin/sh\ncase "$1" in -v|--version|-dumpversion) echo "g++ (GCC) 12.2.0"; exit 0;; esac\n'
                    'i=0; while [ $i -lt 40 ]; do echo "noise line $i"; i=$((i+1)); done\n'
                    'echo "plan.cpp:1:1: error: this compiler is broken on purpose" >&2; exit 1\n')
    fake.chmod(0o755)
    env = dict(bare_env(tmp_path, FLYSHIP_EXTENSIONS_DIR=str(tmp_path / "ext")), CXX=str(fake),
               PATH=str(Path(sys.executable).parent))  # ninja, from this venv
    r = subprocess.run([PY, "-c", NO_EXTENSION, str(tiny_bundle)], cwd=tmp_path, capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 3, r.stderr
    message = r.stderr.strip().splitlines()[-1]
    assert "error: this compiler is broken on purpose" in message and "noise line" not in message, message
    assert len(message) < 1200 and "`flyship prebuild -o DIR`" in message
    log = Path(re.search(r"the full log is (\S+\.build\.log)", message).group(1))
    text = log.read_text()
    assert "noise line 39" in text and "broken on purpose" in text


def recipe_copies(stage: str) -> list[tuple[str, str]]:
    """The (source glob, destination) of each ``COPY --from=STAGE`` line of docs/shipping.md's container recipe."""
    text = (ROOT / "docs" / "shipping.md").read_text()
    block = text.split("```dockerfile", 1)[1].split("```", 1)[0]
    copies = []
    for line in block.splitlines():
        words = line.split()
        if words[:2] == ["COPY", f"--from={stage}"]:
            copies.append((words[2], words[3]))
    return copies


def test_the_container_recipe_copies_what_prebuild_writes_and_the_runtime_stage_loads_with_it(shipped, tmp_path):
    # The recipe's extension stage runs `flyship prebuild -o /out`; `shipped` is that /out. Follow the recipe's own
    # COPY lines: what they leave behind (a library without its .json record) the load would refuse and rebuild.
    copies = recipe_copies("extension")
    assert copies, "docs/shipping.md's recipe copies nothing from the extension stage"
    runtime = tmp_path / "opt_kernels"
    runtime.mkdir()
    for src, dst in copies:
        assert src.startswith("/out/") and dst == "/opt/kernels/", (src, dst)
        for f in shipped.glob(src[len("/out/"):]):
            if f.is_file():
                shutil.copy2(f, runtime / f.name)
    written = sorted(f.name for f in shipped.iterdir() if f.is_file() and f.name.startswith("flyship_"))
    assert sorted(f.name for f in runtime.iterdir()) == written
    _pack.pack(shipped / "tiny", runtime / "tiny.flyship")
    r = subprocess.run([PY, "-c", DISPATCH, str(runtime / "tiny.flyship"), str(tmp_path / "empty_prefix")],
                       cwd=tmp_path, capture_output=True, text=True, env=bare_env(tmp_path), timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["f32", "f32"]
    assert "building" not in r.stderr


def test_a_prebuilt_extension_installed_into_the_environment_is_found_from_anywhere(shipped, tmp_path):
    prefix = tmp_path / "prefix"
    inst = f"import sys; sys.prefix = {str(prefix)!r}; from flyship.loader.tools.cli import main; main(['prebuild'])"
    r = subprocess.run([PY, "-c", inst], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    assert list((prefix / "share" / "flyship" / "extensions").glob("flyship_*.so"))
    bundle = tmp_path / "bundle"
    shutil.copytree(shipped / "tiny", bundle)  # no extension beside this one
    r = subprocess.run([PY, "-c", DISPATCH, str(bundle), str(prefix)], cwd=tmp_path, capture_output=True, text=True,
                       env=bare_env(tmp_path), timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["f32", "f32"]


def test_the_extension_name_does_not_depend_on_home_cxx_or_the_cache_folder(monkeypatch, tmp_path, ext):
    name = extension.extension_name(ext.flavor())
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("CXX", "/opt/other/clang++")
    monkeypatch.setenv("FLYSHIP_EXTENSIONS_DIR", str(tmp_path / "x"))
    monkeypatch.chdir(tmp_path)
    assert extension.extension_name(ext.flavor()) == name


INTERRUPTED = """
import sys, time
from pathlib import Path
from flyship.loader import extension
def slow(cfg, work, verbose):
    out = work / cfg.library.name
    out.write_bytes(b"")          # a linker that was killed after creating its output
    print("linking", flush=True)
    time.sleep(600)
extension._compile = slow
extension.build(extension.config())
"""


def test_a_build_killed_while_linking_leaves_no_library_a_later_load_would_trust(tmp_path, ext):
    env = {**os.environ, "FLYSHIP_EXTENSIONS_DIR": str(tmp_path)}
    p = subprocess.Popen([PY, "-c", INTERRUPTED], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        assert p.stdout.readline().strip() == "linking"
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=60)
    code = "from flyship.loader import extension; cfg = extension.config(); print(cfg.library, cfg.library.exists())"
    r = subprocess.run([PY, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    library, exists = r.stdout.split()
    assert exists == "False", r.stdout
    assert list(Path(library).parent.glob(".build-*"))  # the partial output stayed in the private work folder


def test_a_failed_build_removes_its_work_folder_and_installs_nothing(tmp_path, monkeypatch, ext):
    monkeypatch.setenv("FLYSHIP_EXTENSIONS_DIR", str(tmp_path))
    cfg = extension.config()

    def fail(cfg, work, verbose):
        (work / cfg.library.name).write_bytes(b"\x7fELF partial")
        raise extension.ExtensionBuildError("linker died")

    monkeypatch.setattr(extension, "_compile", fail)
    with pytest.raises(extension.ExtensionBuildError, match="linker died"):
        extension.build(cfg)
    assert not cfg.library.exists() and not list(cfg.directory.glob(".build-*"))


RANK = """
import os, sys, time
t0 = float(sys.argv[1])
sys.prefix = sys.argv[2]  # an environment with no extension installed: this rank must find or build one
while time.time() < t0:
    time.sleep(0.005)
from flyship.loader import extension
m = extension.extension()
print("rank", os.environ["RANK"], m.flavor(), flush=True)
"""


@pytest.mark.skipif(shutil.which("c++") is None and not os.environ.get("CXX"), reason="needs a C++ compiler: proves 8 "
                    "ranks starting at once with an empty cache build the extension once")
def test_eight_ranks_starting_at_once_with_an_empty_cache_build_once_and_each_say_at_most_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "FLYSHIP_EXTENSION_PATH"}
    env["FLYSHIP_EXTENSIONS_DIR"] = str(tmp_path / "ext")
    start = time.time() + 3
    procs = [subprocess.Popen([PY, "-c", RANK, str(start), str(tmp_path / "prefix")], cwd=ROOT,
                              env={**env, "RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(8)]
    results = [p.communicate(timeout=900) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e[-2000:] for _, e in results]
    lines = [[ln for ln in err.splitlines() if ln.startswith("flyship:")] for _, err in results]
    assert all(len(ls) <= 1 for ls in lines), lines
    assert sum(1 for ls in lines for ln in ls if ln.startswith("flyship: building")) == 1, lines
    built = list((tmp_path / "ext" / "flyship").glob("*/*.so"))
    assert len(built) == 1 and not list((tmp_path / "ext" / "flyship").glob("*/.build-*"))
    assert sorted(out.split()[1] for out, _ in results) == [str(r) for r in range(8)]
