"""flyship takes the ISA, FlyDSL's code object and the host function from one normal FlyDSL compile
(``compiler/frontends/flydsl/capture.py``): the pure text helpers that cut the captured output apart. The
differential test against FlyDSL's own IR dump mode is in test_flydsl_capture_build.py (compile tier)."""

from __future__ import annotations

import pytest

from flyship.compiler.frontends.base import FrontendError
from flyship.compiler.frontends.flydsl.capture import split_isa, split_llvm_ir, split_pipeline

pytestmark = pytest.mark.cpu

ISA = ('\t.amdgcn_target "amdgcn-amd-amdhsa-unknown-gfx942"\n\ts_endpgm\n\t.amdgpu_metadata\n---\n...\n\n'
       '\t.end_amdgpu_metadata\n')


def test_a_pipeline_splits_into_its_top_level_fragments_only():
    text = ('builtin.module(fly-canonicalize,gpu.module(convert-scf-to-cf,cse,convert-gpu-to-rocdl{chipset=gfx942 '
            'index-bitwidth=0}),rocdl-attach-target{O=2 chip=gfx942 features=""},'
            'gpu-module-to-binary{format=fatbin opts="-a,b"})')
    assert split_pipeline(text) == [
        "fly-canonicalize", "gpu.module(convert-scf-to-cf,cse,convert-gpu-to-rocdl{chipset=gfx942 index-bitwidth=0})",
        'rocdl-attach-target{O=2 chip=gfx942 features=""}', 'gpu-module-to-binary{format=fatbin opts="-a,b"}']


@pytest.mark.parametrize("text", ["canonicalize,cse", "builtin.module(gpu.module(cse)", 'builtin.module(a{x="})'])
def test_a_pipeline_that_is_not_one_balanced_module_pipeline_is_refused(text):
    with pytest.raises(FrontendError, match="FlyDSL pipeline: expected|unbalanced"):
        split_pipeline(text)


def test_the_printed_isa_blocks_come_out_byte_exact_and_everything_else_stays_for_stderr():
    text = ("ld.lld: warning: before\n" + 'ISA for module: "kernels"\n' + ISA + "\n"
            + 'ISA for module: "kernels"\n' + ISA + "\n" + "ld.lld: warning: after\n")
    isas, rest = split_isa(text)
    assert isas == [ISA, ISA]
    assert rest == "ld.lld: warning: before\nld.lld: warning: after\n"


def test_an_isa_print_cut_short_is_not_taken_for_an_isa():
    text = 'ISA for module: "kernels"\n\t.amdgcn_target "amdgcn-amd-amdhsa-unknown-gfx942"\n\ts_endpgm\n'
    assert split_isa(text) == ([], text)


LLVM_IR = ('; ModuleID = \'kernels\'\ndefine amdgpu_kernel void @k(ptr addrspace(1) %0) {\n'
           '  store float 0.0, ptr addrspace(1) %0\n  ret void\n}\n')


def test_the_printed_llvm_ir_modules_come_out_whole_and_the_isa_prints_stay_for_split_isa():
    text = ("ld.lld: warning: before\n" + 'LLVM IR for module: "kernels"\n' + LLVM_IR + "\n"
            + 'ISA for module: "kernels"\n' + ISA + "\n")
    modules, rest = split_llvm_ir(text)
    assert modules == [LLVM_IR + "\n"]
    assert split_isa(rest) == ([ISA], "ld.lld: warning: before\n")
