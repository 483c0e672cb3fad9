"""Building the loader's C++ extension: flavor choice, the HIP flavor's name and flags, the cache. The builds of the
HIP flavor against Debian's HIP are in test_build_hip.py (hip tier)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from flyship.loader import extension, toolkits

from tests.conftest import HIP_HEADERS, ROOT, needs_hip

pytestmark = pytest.mark.cpu


def test_the_hip_library_names_are_its_soname_then_its_file_name_and_travel_as_one_flag(tmp_path):
    from flyship.loader import hip_library

    found = toolkits.find_hip_library()[0] if HIP_HEADERS is not None else None
    if found is not None and hip_library.soname(found):
        assert hip_library.names(found)[0] == hip_library.soname(found)
    not_elf = tmp_path / "libamdhip64.so.6"
    not_elf.write_bytes(b"not an ELF file")
    assert hip_library.names(not_elf) == ("libamdhip64.so.6",)
    assert hip_library.cflag(("libamdhip64.so.6", "libamdhip64.so")) == \
        "-DFLYSHIP_HIP_LIBRARY=libamdhip64.so.6:libamdhip64.so"
    with pytest.raises(ValueError, match="expected plain file names"):
        hip_library.cflag(("lib amd;rm.so",))


def test_flavor_comes_from_the_environment_first(monkeypatch):
    monkeypatch.setenv("FLYSHIP_FLAVOR", "cuda")
    assert extension.choose_flavor() == "cuda"
    monkeypatch.setenv("FLYSHIP_FLAVOR", "rocm")
    with pytest.raises(ValueError, match="expected 'hip', 'cuda' or 'emulate' .*, got 'rocm'"):
        extension.choose_flavor()


def test_cpu_only_torch_without_hip_headers_is_refused_listing_the_paths_tried(monkeypatch, tmp_path):
    import torch

    if torch.version.hip or torch.version.cuda:
        pytest.skip("this torch is a GPU build; the CPU-only rule does not apply")
    monkeypatch.delenv("FLYSHIP_FLAVOR", raising=False)
    monkeypatch.setattr(toolkits, "hip_roots", lambda: [tmp_path / "rocm"])
    with pytest.raises(extension.ExtensionBuildError, match="CPU-only torch") as e:
        extension.choose_flavor()
    assert str(tmp_path / "rocm" / "include" / "hip" / "hip_runtime_api.h") in str(e.value)


@needs_hip
def test_cpu_only_torch_with_hip_headers_builds_the_hip_flavor(monkeypatch):
    import torch

    if torch.version.hip or torch.version.cuda:
        pytest.skip("this torch is a GPU build; the CPU-only rule does not apply")
    monkeypatch.delenv("FLYSHIP_FLAVOR", raising=False)
    assert extension.choose_flavor() == "hip"


@needs_hip
def test_extension_name_carries_flavor_python_torch_and_a_source_hash(monkeypatch, tmp_path):
    import torch

    monkeypatch.setenv("FLYSHIP_FLAVOR", "hip")
    cfg = extension.config()
    assert cfg.name.startswith("flyship_hip_" + sys.implementation.cache_tag.replace("-", "_"))
    assert "torch" + extension._sanitize(torch.__version__) in cfg.name
    # Changing one source changes the name, so a stale build is never imported.
    csrc = tmp_path / "csrc"
    shutil.copytree(extension.CSRC, csrc)
    monkeypatch.setattr(extension, "CSRC", csrc)
    assert extension.config().name == cfg.name
    (csrc / "expr.h").write_text((csrc / "expr.h").read_text() + "\n// changed\n")
    assert extension.config().name != cfg.name


def test_a_cached_extension_imports_without_a_compiler_or_ninja(ext, tmp_path):
    # An empty PATH: no c++, no ninja. extension() must import the cached build directly.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    code = "from flyship.loader import extension; m = extension.extension(); print(m.flavor())"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "PATH": str(bindir)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == ext.flavor()
    assert shutil.which("ninja", path=str(bindir)) is None and shutil.which("c++", path=str(bindir)) is None


def test_an_extension_with_its_own_static_libstdcxx_is_refused(tmp_path):
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler to build the two sample libraries")
    src = tmp_path / "a.cpp"
    src.write_text('#include <sstream>\nstd::string f(long v) { std::ostringstream o; o << v; return o.str(); }\n')
    shared, static = tmp_path / "shared.so", tmp_path / "static.so"
    subprocess.run([cxx, "-shared", "-fPIC", str(src), "-o", str(shared)], check=True)
    r = subprocess.run([cxx, "-shared", "-fPIC", "-static-libstdc++", str(src), "-o", str(static)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"{cxx} cannot link libstdc++ statically here ({r.stderr.decode()[:200]})")
    extension.check_shared_libstdcxx(shared)
    with pytest.raises(extension.ExtensionBuildError, match=r"expected static\.so to link the shared libstdc\+\+ as torch "
                                                       r"does, got a static copy"):
        extension.check_shared_libstdcxx(static)


def test_a_load_that_finds_its_extension_cached_imports_no_build_tooling(ext, tiny_bundle):
    # Choosing the flavor and finding the cached library needs neither torch.utils.cpp_extension nor setuptools
    # (~150 ms of a first load): they are imported only to build.
    code = ("import sys, torch, flyship\n"
            f"flyship.load({str(tiny_bundle)!r}, namespace='flyship_warm_load')\n"
            "print(sorted(m for m in ('torch.utils.cpp_extension', 'setuptools') if m in sys.modules))\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=str(ROOT), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
