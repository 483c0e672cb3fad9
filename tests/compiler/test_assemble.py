"""Assembling FlyDSL's ISA with LLVM, and proving the result equals FlyDSL's own code object.

Inputs are committed under tests/compiler/data (regenerate.py remakes them with FlyDSL); these tests need
llvm-mc and ld.lld but not FlyDSL.
"""

import dataclasses
import re
import struct
import subprocess
from pathlib import Path

import pytest

from flyship.bundle.codeobject import KERNEL_DESCRIPTOR_FIELDS, CodeObjectFile
from flyship.bundle.errors import CodeObjectError
from flyship.compiler.frontends.flydsl.assemble import (ASSEMBLE, Assembler, assemble, read_isa_header,
                                                        set_code_object_version)
from flyship.compiler.frontends.flydsl.proof import PROOF, extract_flydsl_binary, extract_flydsl_objects, prove
from flyship.compiler.toolchain import ToolchainError, check_targets, find_toolchain

pytestmark = pytest.mark.compile

DATA = Path(__file__).parent / "data"
KERNEL = "vadd_kernel_0"
ARCHS = ("gfx942", "gfx950")


@pytest.fixture(scope="module")
def toolchain():
    try:
        return find_toolchain()
    except ToolchainError as e:
        pytest.skip(f"needs llvm-mc and ld.lld to prove assembly matches FlyDSL: {e}")


def _usable(toolchain, arch):
    try:
        check_targets(toolchain, [arch])
    except ToolchainError as e:
        pytest.skip(f"would prove {arch} assembly, but this LLVM cannot: {e}")
    return toolchain


def isa(arch: str) -> str:
    return (DATA / f"vadd.{arch}.s").read_text()


def flydsl_code_object(arch: str) -> bytes:
    return (DATA / f"vadd.{arch}.hsaco").read_bytes()


def section(data: bytes, name: str) -> bytes:
    return CodeObjectFile(data).section_bytes(name)


def patched(data: bytes, section_name: str, offset: int, new: bytes) -> bytes:
    """A copy of ``data`` with ``new`` written at ``offset`` into ``section_name``."""
    co = CodeObjectFile(data)
    sec = co.elf.get_section_by_name(section_name)
    start = sec["sh_offset"] + offset
    return data[:start] + new + data[start + len(new):]


# -- extracting FlyDSL's own binary ------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_flydsl_binary_is_read_from_the_gpu_module_to_binary_dump(arch):
    mlir = (DATA / f"vadd.{arch}.gpu_module_to_binary.mlir").read_text()
    objects = extract_flydsl_objects(mlir)
    assert [o.target for o in objects] == [f'#rocdl.target<chip = "{arch}">']
    assert extract_flydsl_binary(mlir) == [flydsl_code_object(arch)]
    assert CodeObjectFile(objects[0].data).kernel(KERNEL)[".name"] == KERNEL


def test_a_binary_with_two_objects_gives_both():
    # The shape FlyDSL prints for a fast-math kernel: two #gpu.object entries in one gpu.binary.
    mlir = (DATA / "vadd.gfx942.gpu_module_to_binary.mlir").read_text()
    m = re.search(r'#gpu\.object<.*?bin = "(?:[^"\\]|\\.)*">', mlir, re.DOTALL)
    doubled = mlir[:m.end()] + ", " + m.group(0).replace('chip = "gfx942"', 'chip = "gfx942", flags = {fast}') \
        + mlir[m.end():]
    objects = extract_flydsl_objects(doubled)
    assert len(objects) == 2
    assert objects[0].data == objects[1].data == flydsl_code_object("gfx942")
    assert "fast" in objects[1].target


def test_text_without_a_binary_is_refused():
    with pytest.raises(CodeObjectError, match="expected a gpu.binary") as e:
        extract_flydsl_binary("module {}")
    assert e.value.kind == PROOF  # a failure reason reads "ProofError: ..."; the next step is chosen by it


# -- reading the ISA header -----------------------------------------------------------------------


def test_isa_header_gives_the_triple_for_both_flydsl_spellings():
    new = read_isa_header(isa("gfx942"))
    assert (new.triple, new.target, new.code_object_version) == ("amdgcn-amd-amdhsa-unknown", "gfx942", 6)
    old = read_isa_header('\t.amdgcn_target "amdgcn-amd-amdhsa--gfx950:sramecc+:xnack-"\n')
    assert (old.triple, old.processor, old.features) == ("amdgcn-amd-amdhsa", "gfx950", {"sramecc+", "xnack-"})
    generic = read_isa_header('\t.amdgcn_target "amdgcn-amd-amdhsa--gfx9-4-generic"\n')
    assert generic.processor == "gfx9-4-generic"


def test_version_change_touches_only_the_version_directive():
    v5 = set_code_object_version(isa("gfx942"), 5)
    changed = [(a, b) for a, b in zip(isa("gfx942").splitlines(), v5.splitlines()) if a != b]
    assert changed == [("\t.amdhsa_code_object_version 6", "\t.amdhsa_code_object_version 5")]


def test_generic_targets_are_refused_for_v5():
    text = '\t.amdgcn_target "amdgcn-amd-amdhsa-unknown-gfx9-4-generic"\n\t.amdhsa_code_object_version 6\n'
    with pytest.raises(ToolchainError, match="generic target gfx9-4-generic, which needs code object v6"):
        set_code_object_version(text, 5)


# -- assembling and proving ---------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_assembled_code_object_is_proven_equal_to_flydsls(arch, toolchain, tmp_path):
    ours = assemble(isa(arch), arch, _usable(toolchain, arch), tmp_path)
    theirs = flydsl_code_object(arch)
    assert section(ours, ".text") == section(theirs, ".text")
    proof = prove(ours, theirs, KERNEL)
    assert proof.method == "flydsl-binary"
    assert proof.identical_sections == (".text", ".rodata")
    assert (proof.kernel_descriptor, proof.metadata) == ("identical", "equal")
    assert len(proof.reference_sha256) == 64
    assert CodeObjectFile(ours).code_object_version == 6
    assert (tmp_path / f"{arch}.s").read_text() == isa(arch)  # the ISA went in unedited


@pytest.mark.parametrize("arch", ARCHS)
def test_v5_assembly_keeps_text_identical_and_reports_v5(arch, toolchain, tmp_path):
    ours = assemble(isa(arch), arch, _usable(toolchain, arch), tmp_path, code_object_version=5)
    co = CodeObjectFile(ours)
    assert co.code_object_version == 5
    assert co.elf["e_ident"]["EI_ABIVERSION"] == 3  # ELFABIVERSION_AMDGPU_HSA_V5
    assert co.metadata["amdhsa.version"] == [1, 2]
    assert section(ours, ".text") == section(flydsl_code_object(arch), ".text")
    assert prove(ours, flydsl_code_object(arch), KERNEL).kernel_descriptor == "identical"


def test_pre_0_3_1_target_spelling_assembles_to_the_same_code(toolchain, tmp_path):
    old = isa("gfx942").replace("amdgcn-amd-amdhsa-unknown-gfx942", "amdgcn-amd-amdhsa--gfx942")
    ours = assemble(old, "gfx942", toolchain, tmp_path)
    assert section(ours, ".text") == section(flydsl_code_object("gfx942"), ".text")


def test_isa_for_another_target_is_refused(toolchain, tmp_path):
    with pytest.raises(ToolchainError, match="expected an ISA for target gfx950, got .amdgcn_target "
                                             "amdgcn-amd-amdhsa-unknown-gfx942"):
        assemble(isa("gfx942"), "gfx950", toolchain, tmp_path)


def test_assembler_errors_carry_stderr_target_and_file(toolchain, tmp_path):
    bad = isa("gfx942").replace("\ts_endpgm\n", "\ts_not_an_instruction v0\n\ts_endpgm\n")
    with pytest.raises(ToolchainError) as e:
        assemble(bad, "gfx942", toolchain, tmp_path, name="broken")
    assert e.value.kind == ASSEMBLE  # a failure reason reads "AssembleError: ..."
    msg = str(e.value)
    assert f"assemble {tmp_path / 'broken.s'} for gfx942" in msg
    assert "s_not_an_instruction" in msg  # the assembler's own diagnostic


def test_undefined_symbol_is_refused_by_name(toolchain, tmp_path):
    text = (DATA / "calls_external.gfx942.s").read_text()
    with pytest.raises(ToolchainError, match=r"expected no undefined symbols, got external_fn;.*shared object init"):
        assemble(text, "gfx942", toolchain, tmp_path)


def test_ziglang_clang_assembles_the_same_text(tmp_path):
    pytest.importorskip("ziglang", reason="would prove the zig clang path; pip install ziglang to run it")
    zig = find_toolchain(environ={"PATH": ""}, system_dirs=[])
    assert zig.origin == "ziglang" and zig.assembler_is_clang
    ours = assemble(isa("gfx950"), "gfx950", zig, tmp_path)
    assert prove(ours, flydsl_code_object("gfx950"), KERNEL).identical_sections == (".text", ".rodata")


# -- the proof refuses differences ---------------------------------------------------------------


@pytest.fixture(scope="module")
def ours942(toolchain, tmp_path_factory):
    return assemble(isa("gfx942"), "gfx942", toolchain, tmp_path_factory.mktemp("ours"))


def test_a_changed_text_byte_fails_naming_text_sizes_and_offset(ours942):
    size = len(section(ours942, ".text"))
    bad = patched(ours942, ".text", 0x10, bytes([section(ours942, ".text")[0x10] ^ 0xFF]))
    assert bad != ours942
    with pytest.raises(CodeObjectError, match=rf"prove \.text: .*both {size} bytes.*offset 0x10 "):
        prove(bad, flydsl_code_object("gfx942"), KERNEL)


def test_longer_code_fails_naming_text_both_sizes_and_first_difference(toolchain, tmp_path):
    longer = isa("gfx942").replace("\ts_endpgm\n", "\ts_nop 0\n" * 300 + "\ts_endpgm\n")
    ours = assemble(longer, "gfx942", toolchain, tmp_path)
    theirs = flydsl_code_object("gfx942")
    sizes = len(section(theirs, ".text")), len(section(ours, ".text"))
    first = next(i for i, (a, b) in enumerate(zip(section(ours, ".text"), section(theirs, ".text"))) if a != b)
    with pytest.raises(CodeObjectError, match=rf"prove \.text: expected {sizes[0]} bytes like FlyDSL's, got "
                                              rf"{sizes[1]}; first difference at offset {first:#x}"):
        prove(ours, theirs, KERNEL)


def test_a_changed_kernel_descriptor_field_fails_naming_the_field(ours942):
    co = CodeObjectFile(ours942)
    kd = co.get_symbol(KERNEL + ".kd")
    offset = dict((n, o) for n, o, _ in KERNEL_DESCRIPTOR_FIELDS)["compute_pgm_rsrc2"]
    old = co.kernel_descriptor(KERNEL)["compute_pgm_rsrc2"]
    bad = patched(ours942, ".rodata", kd.value - co.section_addr(".rodata") + offset, struct.pack("<I", old ^ 0x1))
    with pytest.raises(CodeObjectError, match=f"field compute_pgm_rsrc2 = {old}.*got {old ^ 1}"):
        prove(bad, flydsl_code_object("gfx942"), KERNEL)


def test_a_changed_metadata_value_fails_naming_the_key(toolchain, tmp_path):
    text = isa("gfx942")
    assert "    .vgpr_count:     5\n" in text
    ours = assemble(text.replace("    .vgpr_count:     5\n", "    .vgpr_count:     6\n"), "gfx942", toolchain, tmp_path)
    assert section(ours, ".text") == section(flydsl_code_object("gfx942"), ".text")
    with pytest.raises(CodeObjectError, match=r"metadata of vadd_kernel_0: .*\.vgpr_count: 6 vs 5"):
        prove(ours, flydsl_code_object("gfx942"), KERNEL)


def test_another_linker_layout_is_identical_but_entry_offset(toolchain, tmp_path):
    # Move .text with the linker: same code, the descriptor's entry offset changes with the layout.
    assemble(isa("gfx942"), "gfx942", toolchain, tmp_path)
    moved = tmp_path / "moved.hsaco"
    subprocess.run([*toolchain.linker.argv, "-shared", "-Ttext=0x3000", str(tmp_path / "gfx942.o"), "-o", str(moved)],
                   check=True)
    ours, theirs = moved.read_bytes(), flydsl_code_object("gfx942")
    assert CodeObjectFile(ours).section_addr(".text") != CodeObjectFile(theirs).section_addr(".text")
    proof = prove(ours, theirs, KERNEL)
    assert proof.kernel_descriptor == "identical-but-entry-offset"
    assert proof.identical_sections == (".text",)


def test_an_unknown_kernel_symbol_is_named(ours942):
    with pytest.raises(CodeObjectError, match="no kernel 'nope'"):
        prove(ours942, flydsl_code_object("gfx942"), "nope")


# -- cross-checks with LLVM's own readers ------------------------------------------------------------


def test_objdump_lists_the_kernel_symbol(toolchain, ours942, tmp_path):
    if toolchain.objdump is None:
        pytest.skip("would check llvm-objdump disassembles the kernel; this toolchain has no llvm-objdump")
    path = tmp_path / "k.hsaco"
    path.write_bytes(ours942)
    out = subprocess.run([*toolchain.objdump.argv, "-d", "--mcpu=gfx942", str(path)], capture_output=True, text=True,
                         check=True).stdout
    assert f"<{KERNEL}>:" in out
    assert "s_endpgm" in out


def test_note_reader_agrees_with_llvm_readelf(toolchain, ours942, tmp_path):
    if toolchain.readelf is None:
        pytest.skip("would cross-check the metadata note reader; this toolchain has no llvm-readelf")
    path = tmp_path / "k.hsaco"
    path.write_bytes(ours942)
    notes = subprocess.run([*toolchain.readelf.argv, "--notes", str(path)], capture_output=True, text=True,
                           check=True).stdout
    meta = CodeObjectFile(ours942).kernel_metadata(KERNEL)
    assert meta.kernarg_segment_size == int(re.search(r"\.kernarg_segment_size:\s+(\d+)", notes).group(1))
    assert [a.offset for a in meta.args] == [int(x) for x in re.findall(r"\.offset:\s+(\d+)", notes)]
    assert [a.size for a in meta.args] == [int(x) for x in re.findall(r"\.size:\s+(\d+)", notes)]
    assert meta.kernarg_segment_size == 44 and len(meta.args) == 6


def test_proof_is_a_manifest_proof(ours942):
    from flyship.bundle.manifest import Proof

    proof = prove(ours942, flydsl_code_object("gfx942"), KERNEL)
    assert isinstance(proof, Proof)
    assert dataclasses.asdict(proof)["identical_sections"] == (".text", ".rodata")


# -- target IDs with features (issue 9, pattern 10) ----------------------------------------------


@pytest.mark.parametrize("arch, target, flags", [
    ("gfx942", "gfx942:sramecc+:xnack-", "xnack any -> off, sramecc any -> on"),
    ("gfx950", "gfx950:xnack+", "xnack any -> on")])
def test_a_processor_isa_declared_for_a_feature_target_differs_from_flydsls_only_where_the_proof_says(
        arch, target, flags, toolchain, tmp_path):
    from flyship.compiler.frontends.flydsl.assemble import set_target_features

    text = set_target_features(isa(arch), target)
    changed = [(a, b) for a, b in zip(isa(arch).splitlines(), text.splitlines()) if a != b]
    assert [b.split()[-1].strip('"') for _, b in changed] == [f"amdgcn-amd-amdhsa-unknown-{target}"] * 2
    ours = assemble(text, target, _usable(toolchain, arch), tmp_path)
    theirs = flydsl_code_object(arch)
    co = CodeObjectFile(ours)
    assert co.target == target and CodeObjectFile(theirs).target == arch
    proof = prove(ours, theirs, KERNEL, target)
    assert proof.identical_sections == (".text", ".rodata") and proof.kernel_descriptor == "identical"
    e_flags, meta = proof.differences
    assert flags in e_flags and f"as target ID {target} asks" in e_flags
    assert meta == (f"amdhsa.target amdgcn-amd-amdhsa-unknown-{arch} -> amdgcn-amd-amdhsa-unknown-{target}: the "
                    "metadata names the target ID the e_flags declare")
    with pytest.raises(CodeObjectError, match=r"expected e_flags 0x[0-9a-f]+ \(processor and features\) like "
                                              r"FlyDSL's"):
        prove(ours, theirs, KERNEL)  # a feature setting nobody asked for is a difference
    other = target.replace("+", "?").replace("-", "+").replace("?", "-")
    with pytest.raises(CodeObjectError, match=f"or only its any-settings set as {re.escape(other)} asks"):
        prove(ours, theirs, KERNEL, other)


def test_an_isa_that_already_names_other_features_is_not_redeclared():
    from flyship.compiler.frontends.flydsl.assemble import set_target_features

    text = isa("gfx942").replace("unknown-gfx942", "unknown-gfx942:xnack+")
    with pytest.raises(ToolchainError, match="expected an ISA for the bare processor gfx942"):
        set_target_features(text, "gfx942:xnack-")
    assert set_target_features(isa("gfx942"), "gfx942") == isa("gfx942")


def test_the_code_objects_target_keeps_features_whose_setting_is_a_dash():
    co = CodeObjectFile(flydsl_code_object("gfx942"))
    co._meta = {"amdhsa.target": "amdgcn-amd-amdhsa--gfx942:sramecc-:xnack-"}
    assert co.target == "gfx942:sramecc-:xnack-"
    co._meta = {"amdhsa.target": "amdgcn-amd-amdhsa--gfx9-4-generic:xnack+"}
    assert co.target == "gfx9-4-generic:xnack+"


# -- the assembler started before the ISA exists ------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_the_tools_started_before_the_isa_give_the_same_code_object_as_assemble(toolchain, tmp_path, arch):
    tc = _usable(toolchain, arch)
    with Assembler(tc, arch, read_isa_header(isa(arch)).triple, tmp_path / "early") as early:
        ours = early.assemble(isa(arch))
    assert ours == assemble(isa(arch), arch, tc, tmp_path / "late")
    prove(ours, flydsl_code_object(arch), KERNEL)


def test_the_early_assembler_sets_the_code_object_version_as_assemble_does(toolchain, tmp_path):
    tc = _usable(toolchain, "gfx942")
    with Assembler(tc, "gfx942", read_isa_header(isa("gfx942")).triple, tmp_path / "early") as early:
        ours = early.assemble(isa("gfx942"), code_object_version=5)
    assert CodeObjectFile(ours).code_object_version == 5
    assert ours == assemble(isa("gfx942"), "gfx942", tc, tmp_path / "late", code_object_version=5)


def test_an_isa_with_another_triple_than_guessed_is_assembled_the_usual_way(toolchain, tmp_path):
    tc = _usable(toolchain, "gfx942")
    with Assembler(tc, "gfx942", "amdgcn-amd-amdhsa", tmp_path / "early") as early:  # the ISA says -unknown
        ours = early.assemble(isa("gfx942"))
    assert (tmp_path / "early" / "sequential" / "gfx942.hsaco").read_bytes() == ours
    prove(ours, flydsl_code_object("gfx942"), KERNEL)


def test_leaving_the_early_assembler_without_an_isa_ends_both_tools(toolchain, tmp_path):
    tc = _usable(toolchain, "gfx942")
    with pytest.raises(RuntimeError, match="the DSL failed"):
        with Assembler(tc, "gfx942", "amdgcn-amd-amdhsa-unknown", tmp_path) as early:
            started = [p for p in (early._mc, early._lld) if p is not None]
            raise RuntimeError("the DSL failed")
    assert started and all(p.returncode is not None for p in started)


def test_a_bad_isa_through_the_early_assembler_fails_with_the_assembler_message(toolchain, tmp_path):
    tc = _usable(toolchain, "gfx942")
    bad = isa("gfx942").replace("s_endpgm", "s_no_such_instruction", 1)
    with Assembler(tc, "gfx942", "amdgcn-amd-amdhsa-unknown", tmp_path) as early:
        with pytest.raises(ToolchainError, match=r"(?s)assemble .*gfx942.s for gfx942: expected llvm-mc .* to "
                                                 r"succeed.*s_no_such_instruction"):
            early.assemble(bad)


def test_flydsl_for_gfx11_and_gfx12_is_reported_as_an_llvm_limit_not_a_kernel_error(tmp_path):
    """LLVM 22's AMDGPU printer writes .amdhsa_inst_pref_size as an instprefsize(...) expression its llvm-mc
    cannot parse; the build names the target, the directive, the LLVM and what to do, not the kernel."""
    import textwrap

    from ..conftest import ROOT, run_build

    spec = tmp_path / "spec.py"
    spec.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT / 'examples' / 'flydsl')!r})
        from elementwise import add
        from flyship.compiler.spec import Output, Spec, Tensor, namespace, op
        namespace("t")
        op("add", kernel=add, args=[Tensor("x", rank=2), Tensor("y", rank=2), Output("out", like="x")],
           specs=[Spec("f32", dtypes={{"x": "float32", "y": "float32"}}, shapes={{"x": (8, 100), "y": (8, 100)}})])
    """))
    r = run_build(spec, tmp_path / "o", ["gfx1100"], check=False)
    assert r.returncode == 1, r.stdout + r.stderr
    if "instprefsize" not in r.stderr:
        pytest.skip("this LLVM parses FlyDSL's gfx1100 ISA: the limit is gone")
    assert "ToolchainLimitError" in r.stderr and "got a toolchain limit, not a kernel or spec error" in r.stderr
    assert re.search(r"expected llvm-mc \d+\.\d+\.\d+ .* to parse the ISA FlyDSL wrote for gfx1100", r.stderr)
    assert ".amdhsa_inst_pref_size (instprefsize(...))" in r.stderr and "gfx942, gfx950" in r.stderr
    assert "next step: this LLVM cannot build FlyDSL kernels for gfx1100" in r.stderr
    assert "fix the kernel or the spec" not in r.stderr
