"""Clang offload bundles of the committed FlyDSL code objects: uncompressed, 4096-aligned, byte for byte."""

import dataclasses
import subprocess
from pathlib import Path

import pytest

from flyship.compiler.offload import (
    BUNDLE_MAGIC,
    entry_id,
    entry_offsets,
    make_offload_bundle,
    read_offload_bundle,
    unbundle,
)
from flyship.compiler.toolchain import ToolchainError, find_toolchain

pytestmark = pytest.mark.compile

DATA = Path(__file__).parent / "data"
TARGETS = ("gfx942", "gfx950")


@pytest.fixture(scope="module")
def toolchain():
    try:
        tc = find_toolchain()
    except ToolchainError as e:
        pytest.skip(f"needs clang-offload-bundler to prove offload bundles: {e}")
    if tc.offload_bundler is None:
        pytest.skip(f"needs clang-offload-bundler beside {tc.assembler.path} (clang-22) to prove offload bundles")
    return tc


@pytest.fixture(scope="module")
def code_objects():
    return {t: (DATA / f"vadd.{t}.hsaco").read_bytes() for t in TARGETS}


def test_bundle_is_uncompressed_aligned_and_unbundles_byte_for_byte(toolchain, code_objects, tmp_path):
    out = make_offload_bundle(code_objects, toolchain, tmp_path / "vadd.offload")
    data = out.read_bytes()
    assert data.startswith(BUNDLE_MAGIC)
    offsets = entry_offsets(data)
    assert sorted(offsets) == sorted([entry_id(t) for t in TARGETS] + ["host-x86_64-unknown-linux-gnu-"])
    for t in TARGETS:
        assert offsets[entry_id(t)] % 4096 == 0
    assert read_offload_bundle(data)["host-x86_64-unknown-linux-gnu-"] == b""
    assert unbundle(out, list(TARGETS)) == code_objects


def test_the_bundlers_own_unbundle_agrees(toolchain, code_objects, tmp_path):
    out = make_offload_bundle(code_objects, toolchain, tmp_path / "vadd.offload")
    for t in TARGETS:
        got = tmp_path / f"{t}.hsaco"
        subprocess.run([*toolchain.offload_bundler.argv, "-type=o", "-unbundle", f"-input={out}",
                        f"-targets={entry_id(t)}", f"-output={got}"], check=True)
        assert got.read_bytes() == code_objects[t]


def test_compression_requested_by_the_environment_is_ignored(toolchain, code_objects, tmp_path, monkeypatch):
    monkeypatch.setenv("OFFLOAD_BUNDLER_COMPRESS", "1")
    out = make_offload_bundle({"gfx942": code_objects["gfx942"]}, toolchain, tmp_path / "one.offload")
    assert out.read_bytes().startswith(BUNDLE_MAGIC)


def test_a_compressed_bundle_is_refused(toolchain, code_objects, tmp_path):
    src = tmp_path / "k.hsaco"
    src.write_bytes(code_objects["gfx942"])
    host = tmp_path / "host"
    host.write_bytes(b"")
    out = tmp_path / "compressed.offload"
    r = subprocess.run([*toolchain.offload_bundler.argv, "-type=o", "-compress",
                        f"-targets=host-x86_64-unknown-linux-gnu,{entry_id('gfx942')}", f"-input={host}",
                        f"-input={src}", f"-output={out}"], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"would show a CCOB bundle refused; this bundler cannot compress: {r.stderr.strip()}")
    with pytest.raises(ToolchainError, match="got a compressed one \\(CCOB\\)"):
        unbundle(out, ["gfx942"])


def test_a_missing_target_lists_the_entries(toolchain, code_objects, tmp_path):
    out = make_offload_bundle({"gfx942": code_objects["gfx942"]}, toolchain, tmp_path / "one.offload")
    with pytest.raises(ToolchainError, match="expected entries for gfx950, got .*hipv4-amdgcn-amd-amdhsa--gfx942"):
        unbundle(out, ["gfx950"])


def test_a_toolchain_without_bundler_says_what_to_install(toolchain, code_objects, tmp_path):
    bare = dataclasses.replace(toolchain, offload_bundler=None)
    with pytest.raises(ToolchainError, match="expected clang-offload-bundler.*apt-get install clang-22"):
        make_offload_bundle(code_objects, bare, tmp_path / "x.offload")


def test_a_plain_code_object_is_not_a_bundle(code_objects):
    with pytest.raises(ToolchainError, match="expected magic __CLANG_OFFLOAD_BUNDLE__"):
        read_offload_bundle(code_objects["gfx942"])
