"""Spec mistakes that used to pass silently (issue 23, item 7): the IR readers that name the parameters a kernel never
reads or never stores through, tested on small IR texts. The builds that refuse such a spec on a real Triton kernel
are in test_silent_mistakes_build.py (compile tier)."""

from __future__ import annotations

import pytest

from flyship.compiler.frontends import writes

pytestmark = pytest.mark.cpu

LLVM = """
define amdgpu_kernel void @k(ptr addrspace(1) %x, ptr addrspace(1) %w, i32 %w_stride, i32 %n) {
entry:
  %i = call i32 @llvm.amdgcn.workitem.id.x()
  %c = icmp slt i32 %i, %n
  %p = getelementptr float, ptr addrspace(1) %x, i32 %i
  %v = load float, ptr addrspace(1) %p
  %q = getelementptr float, ptr addrspace(1) %w, i32 %i
  store float %v, ptr addrspace(1) %q
  ret void
}
"""

TTIR = """
module {
  tt.func public @k(%x: !tt.ptr<f32> loc("x"), %w: !tt.ptr<f32>, %w_stride: i32, %n: i32) attributes {noinline = false} {
    %0 = tt.get_program_id x : i32
    %1 = tt.splat %x : !tt.ptr<f32> -> tensor<4x!tt.ptr<f32>>
    %2 = arith.muli %0, %n : i32
    tt.return
  } loc(#loc)
}
"""


def test_the_llvm_reader_names_the_parameters_a_kernel_never_uses():
    assert writes.llvm_unread_params(LLVM, "k") == {2}
    with pytest.raises(ValueError, match="no function @other"):
        writes.llvm_unread_params(LLVM, "other")


def test_the_ttir_reader_names_the_parameters_a_kernel_never_uses():
    assert writes.ttir_unread_params(TTIR) == {1, 2}

