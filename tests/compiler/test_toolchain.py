"""Finding the LLVM tools, checking they know the targets, and the ROCm-shaped root for FlyDSL."""

import os
import re
import subprocess
from pathlib import Path

import pytest

from flyship.compiler.toolchain import (
    ToolchainError,
    candidate_dirs,
    check_targets,
    find_device_bitcode,
    find_toolchain,
    rocm_root,
)

pytestmark = pytest.mark.compile


@pytest.fixture(scope="module")
def toolchain():
    try:
        return find_toolchain()
    except ToolchainError as e:
        pytest.skip(f"needs llvm-mc and ld.lld on this machine: {e}")


def _old_llvm_mc() -> Path | None:
    """An llvm-mc older than LLVM 20 (the first to know gfx950), e.g. Debian 12's LLVM 14 or 19."""
    for d in sorted(Path("/usr/lib").glob("llvm-*/bin/llvm-mc")):
        m = re.fullmatch(r"llvm-(\d+)", d.parent.parent.name)
        if m and int(m.group(1)) < 20:
            return d
    return None


def test_found_toolchain_describes_each_tool_with_version_and_path(toolchain):
    described = toolchain.describe()
    assert {"llvm-mc", "ld.lld"} <= set(described) or {"zig clang", "zig ld.lld"} <= set(described)
    for name, text in described.items():
        tool = next(t for t in toolchain.tools() if t.name == name)
        assert text == f"{tool.version} ({' '.join(tool.argv)})"
        assert re.match(r"\d+\.\d+", tool.version), text
        assert tool.path.is_file()


def test_named_folder_is_the_only_place_looked_at(tmp_path, toolchain):
    if toolchain.assembler_is_clang:
        pytest.skip("would check a named llvm-mc folder; this machine's toolchain is ziglang")
    (tmp_path / "llvm-mc").symlink_to(toolchain.assembler.path)
    (tmp_path / "ld.lld").symlink_to(toolchain.linker.path)
    found = find_toolchain(tmp_path)
    assert (found.origin, found.folder) == ("--llvm-bin", tmp_path)
    assert found.offload_bundler is None  # nothing is borrowed from another folder
    via_env = find_toolchain(environ={"FLYSHIP_LLVM_BIN": str(tmp_path), "PATH": ""})
    assert (via_env.origin, via_env.folder) == ("FLYSHIP_LLVM_BIN", tmp_path)


def test_empty_llvm_bin_names_the_folder_and_the_packages(tmp_path):
    with pytest.raises(ToolchainError) as e:
        find_toolchain(tmp_path)
    msg = str(e.value)
    assert f"got no llvm-mc or ld.lld in {tmp_path}" in msg
    assert "apt-get install llvm-22 lld-22 clang-22" in msg
    assert "/opt/rocm/llvm/bin" in msg and "pip install ziglang" in msg


def test_nothing_found_lists_every_path_tried(tmp_path):
    rocm, system, on_path = tmp_path / "rocm", tmp_path / "llvm-99" / "bin", tmp_path / "bin"
    for d in (rocm, system, on_path):
        d.mkdir(parents=True)
    (system / "llvm-mc").write_text("#!/bin/sh\n")
    (system / "llvm-mc").chmod(0o755)
    environ = {"ROCM_PATH": str(rocm), "PATH": f"{on_path}{os.pathsep}{tmp_path / 'missing'}"}
    with pytest.raises(ToolchainError) as e:
        find_toolchain(environ=environ, system_dirs=[system], use_ziglang=False)
    msg = str(e.value)
    assert f"{rocm / 'llvm' / 'bin'} (ROCM_PATH): no such folder" in msg
    assert f"{system} ({system}): no ld.lld" in msg
    assert f"{on_path} (PATH): no llvm-mc or ld.lld" in msg
    assert f"{tmp_path / 'missing'} (PATH): no such folder" in msg
    assert "apt-get install llvm-22 lld-22 clang-22" in msg and "pip install ziglang" in msg


def test_default_search_order_puts_rocm_first_and_newest_llvm_before_older():
    dirs = candidate_dirs({"ROCM_PATH": "/somewhere/rocm", "PATH": ""})
    origins = [o for o, _ in dirs]
    assert dirs[0] == ("ROCM_PATH", Path("/somewhere/rocm/llvm/bin"))
    assert origins[1] == "/opt/rocm"
    versions = [int(o.rsplit("-", 1)[1]) for o in origins if o.startswith("/usr/lib/llvm-")]
    assert versions == sorted(versions, reverse=True)


def test_recent_llvm_knows_gfx942_and_gfx950(toolchain):
    if int(re.match(r"\d+", toolchain.assembler.version).group()) < 20:
        pytest.skip(f"would check gfx950 support; this LLVM is {toolchain.assembler.version}")
    check_targets(toolchain, ["gfx942", "gfx950", "gfx942:sramecc+:xnack-"])


def test_unknown_processor_is_refused_with_tool_version_and_fix(toolchain):
    with pytest.raises(ToolchainError) as e:
        check_targets(toolchain, ["gfx9999"])
    msg = str(e.value)
    assert "check target gfx9999: expected an assembler that knows gfx9999" in msg
    assert toolchain.assembler.describe() in msg
    assert "apt-get install llvm-22 lld-22 clang-22" in msg


def test_old_llvm_refuses_gfx950_with_the_check_targets_message(tmp_path, toolchain):
    old = _old_llvm_mc()
    if old is None:
        pytest.skip("would show an LLVM older than 20 refusing gfx950; no /usr/lib/llvm-N (N < 20) llvm-mc here")
    (tmp_path / "llvm-mc").symlink_to(old)
    (tmp_path / "ld.lld").symlink_to(toolchain.linker.path)
    old_tc = find_toolchain(tmp_path)
    with pytest.raises(ToolchainError) as e:
        check_targets(old_tc, ["gfx950"])
    msg = str(e.value)
    assert "expected an assembler that knows gfx950" in msg
    assert f"llvm-mc {old_tc.assembler.version} ({tmp_path / 'llvm-mc'})" in msg
    assert "'gfx950' is not a recognized processor" in msg
    assert "apt-get install llvm-22 lld-22 clang-22" in msg and "bookworm-security" in msg


def test_rocm_root_links_ld_lld_and_device_bitcode(toolchain, tmp_path):
    bitcode = tmp_path / "bitcode"
    bitcode.mkdir()
    (bitcode / "ocml.bc").write_bytes(b"BC")
    with rocm_root(toolchain, environ={}, bitcode_dirs=[bitcode]) as root:
        lld = root / "llvm" / "bin" / "ld.lld"
        out = subprocess.run([str(lld), "--version"], capture_output=True, text=True, check=True).stdout
        assert toolchain.linker.version in out
        assert (root / "amdgcn" / "bitcode" / "ocml.bc").read_bytes() == b"BC"
    assert not root.exists()


def test_rocm_root_keeps_a_complete_rocm_path(toolchain, tmp_path):
    (tmp_path / "llvm" / "bin").mkdir(parents=True)
    (tmp_path / "llvm" / "bin" / "ld.lld").symlink_to(toolchain.linker.path)
    (tmp_path / "amdgcn" / "bitcode").mkdir(parents=True)
    (tmp_path / "amdgcn" / "bitcode" / "ockl.bc").write_bytes(b"BC")
    with rocm_root(toolchain, environ={"ROCM_PATH": str(tmp_path)}) as root:
        assert root == tmp_path
    assert (tmp_path / "amdgcn" / "bitcode" / "ockl.bc").exists()  # the user's root is left alone


def test_rocm_root_takes_bitcode_from_an_incomplete_rocm_path(toolchain, tmp_path):
    (tmp_path / "amdgcn" / "bitcode").mkdir(parents=True)
    (tmp_path / "amdgcn" / "bitcode" / "oclc_abi_version_600.bc").write_bytes(b"BC")
    with rocm_root(toolchain, environ={"ROCM_PATH": str(tmp_path)}, bitcode_dirs=[]) as root:
        assert root != tmp_path
        assert (root / "amdgcn" / "bitcode" / "oclc_abi_version_600.bc").exists()
        assert (root / "llvm" / "bin" / "ld.lld").exists()


def test_missing_device_bitcode_names_rocm_device_libs_and_folders(tmp_path):
    with pytest.raises(ToolchainError) as e:
        find_device_bitcode(environ={"ROCM_PATH": str(tmp_path)}, candidates=[tmp_path / "none"])
    msg = str(e.value)
    assert "rocm-device-libs" in msg
    assert str(tmp_path / "amdgcn" / "bitcode") in msg and str(tmp_path / "none") in msg
