"""Building the loader's C++ extension: flavor choice, the HIP flavor against Debian's HIP, the cache."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile

from flyship.loader import extension, toolkits

ROOT = Path(__file__).resolve().parents[2]
HIP_HEADERS = toolkits.find_hip_headers()
needs_hip = pytest.mark.skipif(
    HIP_HEADERS is None,
    reason="no HIP headers (hip/hip_runtime_api.h); install libamdhip64-dev to build the HIP flavor")


def dynamic_tags(path: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    with open(path, "rb") as f:
        for sec in ELFFile(f).iter_sections():
            if isinstance(sec, DynamicSection):
                for tag in sec.iter_tags():
                    if tag.entry.d_tag == "DT_NEEDED":
                        out.setdefault("needed", []).append(tag.needed)
                    elif tag.entry.d_tag == "DT_RUNPATH":
                        out.setdefault("runpath", []).append(tag.runpath)
                    elif tag.entry.d_tag == "DT_RPATH":
                        out.setdefault("runpath", []).append(tag.rpath)
    return out


def fresh_import(cfg: extension.BuildConfig, then: str) -> subprocess.CompletedProcess:
    """Import the extension built from ``cfg`` in a fresh process (as load() does), print whether a HIP runtime is
    mapped into the process, run ``then`` (``m`` is the module) and print it again."""
    code = ("import sys\nfrom pathlib import Path\nimport torch\nfrom flyship.loader import extension\n"
            "def hip_mapped():\n    return 'libamdhip64' in open('/proc/self/maps').read()\n"
            f"m = extension._import({cfg.name!r}, Path({str(cfg.library)!r}), group_ok=True)\n"
            f"print(hip_mapped())\n{then}\nprint(hip_mapped())\n")
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.hip
@needs_hip
def test_hip_flavor_compiles_against_the_installed_hip_and_opens_its_runtime_on_first_use(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYSHIP_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setenv("FLYSHIP_FLAVOR", "hip")
    cfg = extension.config()
    assert cfg.flavor == "hip" and cfg.directory.parent == tmp_path / "flyship"
    lib = extension.build(cfg, verbose=False)
    tags = dynamic_tags(lib)
    hip = toolkits.find_hip_library()[0]
    assert not any(n.startswith("libamdhip64") for n in tags["needed"]), tags  # not linked: opened on first use
    assert str(hip.parent) in ":".join(tags.get("runpath", [])), tags  # where the link would have found it
    # Importing it maps no HIP runtime; the first runtime call opens it (RTLD_NOLOAD first, then the rpath).
    r = fresh_import(cfg, "print(m.flavor(), '|', m.runtime_version())")
    assert r.returncode == 0, r.stderr
    before, answer, after = r.stdout.strip().splitlines()
    assert (before, after) == ("False", "True"), r.stdout
    flavor, version = answer.split(" | ")
    header_version = (HIP_HEADERS / "hip" / "hip_version.h").read_text()
    major = next(line.split()[-1] for line in header_version.splitlines() if "define HIP_VERSION_MAJOR" in line)
    assert flavor == "hip" and version.startswith("HIP runtime ") and f"headers {major}." in version


@pytest.mark.hip
@needs_hip
def test_a_missing_hip_runtime_is_reported_at_first_use_naming_the_library_and_what_to_install(tmp_path,
                                                                                                 monkeypatch):
    from flyship.loader import hip_library

    monkeypatch.setenv("FLYSHIP_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setenv("FLYSHIP_FLAVOR", "hip")
    monkeypatch.setattr(hip_library, "names", lambda library: ("libamdhip64_absent.so.9",))
    cfg = extension.config()
    assert "-DFLYSHIP_HIP_LIBRARY=libamdhip64_absent.so.9" in cfg.cflags
    extension.build(cfg, verbose=False)
    r = fresh_import(cfg, "print(m.runtime_version())\n"
                          "try:\n    m.device_info(0)\nexcept RuntimeError as e:\n    print(str(e).splitlines()[0])")
    assert r.returncode == 0, r.stderr  # the import itself needs no runtime
    before, version, error, after = r.stdout.strip().splitlines()
    assert (before, after) == ("False", "False"), r.stdout
    assert version.startswith("HIP runtime not loaded (flyship: opening the HIP runtime: expected "
                              "libamdhip64_absent.so.9 ")
    assert "reading the properties of device 0 failed: flyship: opening the HIP runtime: expected " \
           "libamdhip64_absent.so.9 (loaded in this process, or on the library path or the extension's rpath), " \
           "found none (libamdhip64_absent.so.9: cannot open shared object file" in error, error
    assert "; install the HIP runtime (ROCm's hip-runtime-amd, or Debian's libamdhip64-5)" in error, error


@pytest.mark.cpu
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


@pytest.mark.cpu
def test_flavor_comes_from_the_environment_first(monkeypatch):
    monkeypatch.setenv("FLYSHIP_FLAVOR", "cuda")
    assert extension.choose_flavor() == "cuda"
    monkeypatch.setenv("FLYSHIP_FLAVOR", "rocm")
    with pytest.raises(ValueError, match="expected 'hip', 'cuda' or 'emulate' .*, got 'rocm'"):
        extension.choose_flavor()


@pytest.mark.cpu
def test_cpu_only_torch_without_hip_headers_is_refused_listing_the_paths_tried(monkeypatch, tmp_path):
    import torch

    if torch.version.hip or torch.version.cuda:
        pytest.skip("this torch is a GPU build; the CPU-only rule does not apply")
    monkeypatch.delenv("FLYSHIP_FLAVOR", raising=False)
    monkeypatch.setattr(toolkits, "hip_roots", lambda: [tmp_path / "rocm"])
    with pytest.raises(extension.ExtensionBuildError, match="CPU-only torch") as e:
        extension.choose_flavor()
    assert str(tmp_path / "rocm" / "include" / "hip" / "hip_runtime_api.h") in str(e.value)


@pytest.mark.cpu
@needs_hip
def test_cpu_only_torch_with_hip_headers_builds_the_hip_flavor(monkeypatch):
    import torch

    if torch.version.hip or torch.version.cuda:
        pytest.skip("this torch is a GPU build; the CPU-only rule does not apply")
    monkeypatch.delenv("FLYSHIP_FLAVOR", raising=False)
    assert extension.choose_flavor() == "hip"


@pytest.mark.cpu
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


@pytest.mark.cpu
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


@pytest.mark.cpu
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


@pytest.mark.cpu
def test_a_load_that_finds_its_extension_cached_imports_no_build_tooling(ext, tiny_bundle):
    # Choosing the flavor and finding the cached library needs neither torch.utils.cpp_extension nor setuptools
    # (~150 ms of a first load): they are imported only to build.
    code = ("import sys, torch, flyship\n"
            f"flyship.load({str(tiny_bundle)!r}, namespace='flyship_warm_load')\n"
            "print(sorted(m for m in ('torch.utils.cpp_extension', 'setuptools') if m in sys.modules))\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=str(ROOT), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
