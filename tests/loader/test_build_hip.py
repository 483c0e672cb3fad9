"""Building the loader's HIP flavor against the installed HIP (Debian's libamdhip64-dev): compiled without linking
the HIP runtime, which it opens on first use, and a missing runtime reported then, naming the library."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile

from flyship.loader import extension, toolkits

from tests.conftest import HIP_HEADERS, ROOT, needs_hip

pytestmark = pytest.mark.hip


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
    code = ("import sys\nimport torch\nfrom flyship.loader import extension\n"
            "def hip_mapped():\n    return 'libamdhip64' in open('/proc/self/maps').read()\n"
            f"from pathlib import Path\nm = extension._import({cfg.name!r}, Path({str(cfg.library)!r}))\n"
            f"print(hip_mapped())\n{then}\nprint(hip_mapped())\n")
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)


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

