"""The IR readers behind flyc-build's write check (issue 9, pattern 7): which kernel parameters a kernel stores
through, in LLVM IR (FlyDSL) and in Triton's TTIR. Pure text: runs anywhere."""

from __future__ import annotations

import pytest

from flyship.compiler.frontends.writes import (llvm_accumulated_params, llvm_written_params, ttir_accumulated_params,
                                               ttir_written_params)

pytestmark = pytest.mark.cpu

LLVM = """
; ModuleID = 'k'
DEFINE
  %7 = extractvalue <{ <{ i32, i32 }>, <{ i64 }> }> %1, 1, 0
  %8 = getelementptr float, ptr addrspace(1) %0, i64 %7
  %9 = load float, ptr addrspace(1) %8, align 4
  %10 = load i32, ptr addrspace(1) %3, align 4
  %11 = sext i32 %10 to i64
  %12 = getelementptr float, ptr addrspace(1) %2, i64 %11
  store float %9, ptr addrspace(1) %12, align 4
  %13 = call ptr addrspace(8) @llvm.amdgcn.make.buffer.rsrc.p8.p1(ptr addrspace(1) %4, i16 0, i32 -1, i32 0)
  call void @llvm.amdgcn.raw.ptr.buffer.store.f32(float %9, ptr addrspace(8) %13, i32 0, i32 0, i32 0)
  ret void
}
""".replace("DEFINE", "define amdgpu_kernel void @k(ptr addrspace(1) %0, <{ <{ i32, i32 }>, <{ i64 }> }> %1, "
                      "ptr addrspace(1) %2, ptr addrspace(1) %3, ptr addrspace(1) %4, i32 %5) #0 {")


def test_llvm_stores_through_a_gep_and_a_buffer_resource_name_their_parameters():
    # %2 (via a GEP) and %4 (via a buffer resource) are written; %0 and %3 are only read; %1 is a layout struct
    # whose stride feeds %0's address only.
    assert llvm_written_params(LLVM, "k") == {2, 4}


def test_an_index_loaded_from_a_tensor_does_not_make_that_tensor_written():
    # %12 = gep %2 by a value loaded through %3: %3 is data for the address, not its base.
    assert 3 not in llvm_written_params(LLVM, "k")


def test_llvm_atomics_and_loop_carried_pointers_are_followed():
    ir = """
define amdgpu_kernel void @acc(ptr addrspace(1) %0, ptr addrspace(1) %1, i32 %2) {
entry:
  br label %loop
loop:
  %p = phi ptr addrspace(1) [ %0, %entry ], [ %q, %loop ]
  %v = load float, ptr addrspace(1) %1, align 4
  %old = atomicrmw fadd ptr addrspace(1) %p, float %v monotonic, align 4
  %q = getelementptr float, ptr addrspace(1) %p, i64 1
  br label %loop
}
"""
    assert llvm_written_params(ir, "acc") == {0}


def test_llvm_without_the_kernel_symbol_is_an_error():
    with pytest.raises(ValueError, match="no function @missing"):
        llvm_written_params(LLVM, "missing")


TTIR = """
module {
  TTFUNC
    %c0 = arith.constant 0 : i32 loc(#loc1)
    %cols = tt.make_range {end = 128 : i32, start = 0 : i32} : tensor<128xi32> loc(#loc2)
    %xp = tt.splat %x : !tt.ptr<f32> -> tensor<128x!tt.ptr<f32>> loc(#loc3)
    %xp_1 = tt.addptr %xp, %cols : tensor<128x!tt.ptr<f32>>, tensor<128xi32> loc(#loc3)
    %xv = tt.load %xp_1 : tensor<128x!tt.ptr<f32>> loc(#loc4)
    %i = tt.load %idx : !tt.ptr<i32> loc(#loc4)
    %rp = tt.addptr %r, %i : !tt.ptr<f32>, i32 loc(#loc5)
    %res:2 = scf.for %iv = %c0 to %n step %n iter_args(%p = %rp, %acc = %c0) -> (!tt.ptr<f32>, i32)  : i32 {
      %p2 = tt.addptr %p, %n : !tt.ptr<f32>, i32 loc(#loc6)
      scf.yield %p2, %acc : !tt.ptr<f32>, i32 loc(#loc6)
    } loc(#loc6)
    tt.store %res#0, %c0 : !tt.ptr<f32> loc(#loc7)
    %o = tt.addptr %out, %c0 : !tt.ptr<f32>, i32 loc(#loc8)
    %old = tt.atomic_rmw fadd, acq_rel, gpu, %o, %c0, %c0 : (!tt.ptr<f32>, f32, i1) -> f32 loc(#loc8)
    tt.return loc(#loc9)
  } loc(#loc)
} loc(#loc)
""".replace("TTFUNC", 'tt.func public @k(%x: !tt.ptr<f32> {tt.divisibility = 16 : i32} loc("x"(#loc)), '
                      '%r: !tt.ptr<f32> loc("r"(#loc)), %idx: !tt.ptr<i32> loc("idx"(#loc)), '
                      '%out: !tt.ptr<f32> loc("out"(#loc)), %n: i32 loc("n"(#loc))) attributes {noinline = false} {')


def test_ttir_stores_and_atomics_name_their_parameters_through_loops():
    params, written = ttir_written_params(TTIR)
    assert params == ["x", "r", "idx", "out", "n"]  # argument attributes and locations do not hide any
    assert {params[i] for i in written} - {"n"} == {"r", "out"}  # n only offsets addresses


def test_ttir_without_a_public_function_is_an_error():
    with pytest.raises(ValueError, match="no public tt.func"):
        ttir_written_params("module {}")


def test_ttir_parameters_are_read_by_position_with_their_types_whatever_the_printer_named_them():
    from flyship.compiler.frontends.writes import ttir_params

    head = ('tt.func public @k(%src: !tt.ptr<f32> {tt.divisibility = 16 : i32} loc("src"(#loc15)), '
            '%src_0: !tt.ptr<f32> loc("src"(#loc16)), %n: i32 loc("n"(#loc))) attributes {noinline = false} {')
    assert ttir_params(f"module {{\n  {head}\n    tt.return\n  }}\n}}") == [
        ("src", "!tt.ptr<f32>"), ("src_0", "!tt.ptr<f32>"), ("n", "i32")]


def _ttir(body: str) -> str:
    return ('module {\n  tt.func public @k(%x: !tt.ptr<f32> loc("x"(#loc)), %out: !tt.ptr<f32> loc("out"(#loc)), '
            '%n: i32 loc("n"(#loc)), %flag: i32 loc("flag"(#loc))) attributes {noinline = false} {\n'
            '    %c0 = arith.constant 0 : i32 loc(#loc1)\n    %cond = arith.cmpi sgt, %flag, %c0 : i32 loc(#loc2)\n'
            + body + '    tt.return loc(#loc9)\n  } loc(#loc)\n} loc(#loc)\n')


# What Triton 3.6 emits for "if flag > 0: dst, v = x + offs, v * 2 else: dst, v = out + offs, v + 1; store(dst, v)".
SCF_IF = """\
    %xp = tt.splat %x : !tt.ptr<f32> -> tensor<8x!tt.ptr<f32>> loc(#loc3)
    %v = tt.load %xp : tensor<8x!tt.ptr<f32>> loc(#loc3)
    %1:2 = scf.if %cond -> (tensor<8xf32>, tensor<8x!tt.ptr<f32>>) {
      %v_8 = arith.mulf %v, %v : tensor<8xf32> loc(#loc4)
      scf.yield %v_8, %xp : tensor<8xf32>, tensor<8x!tt.ptr<f32>> loc(#loc4)
    } else {
      %dst = tt.splat %out : !tt.ptr<f32> -> tensor<8x!tt.ptr<f32>> loc(#loc5)
      scf.yield %v, %dst : tensor<8xf32>, tensor<8x!tt.ptr<f32>> loc(#loc5)
    } loc(#loc6)
    tt.store %1#1, %1#0 : tensor<8x!tt.ptr<f32>> loc(#loc7)
"""


@pytest.mark.parametrize("body, written", [
    (SCF_IF, {"x", "out"}),
    # result 0 of the if is x's pointer in both branches, result 1 out's: only result 1 is stored through
    (SCF_IF.replace("tensor<8xf32>, tensor<8x!tt.ptr<f32>>) {", "tensor<8x!tt.ptr<f32>>, tensor<8x!tt.ptr<f32>>) {")
           .replace("scf.yield %v_8, %xp", "scf.yield %xp, %dst_x").replace("scf.yield %v, %dst", "scf.yield %xp, %dst")
           .replace("      %v_8 =", "      %dst_x = tt.splat %out : !tt.ptr<f32> -> tensor<8x!tt.ptr<f32>> loc(#loc4)\n"
                    "      %v_8 =")
           .replace("tt.store %1#1, %1#0", "tt.store %1#1, %v"), {"out"}),
    (SCF_IF.replace("scf.yield %v_8, %xp", "scf.yield %v_8, %dst_x").replace(
        "      %v_8 =", "      %dst_x = tt.splat %out : !tt.ptr<f32> -> tensor<8x!tt.ptr<f32>> loc(#loc4)\n      %v_8 ="),
     {"out"}),
    ("    %p = arith.select %cond, %x, %out : !tt.ptr<f32> loc(#loc3)\n"
     "    tt.store %p, %c0 : !tt.ptr<f32> loc(#loc3)\n", {"x", "out"}),
    # a loop that starts at out and moves to x: the loop-carried pointer and the loop's result are both
    ("    %r = scf.for %i = %c0 to %n step %n iter_args(%p = %out) -> (!tt.ptr<f32>)  : i32 {\n"
     "      tt.store %p, %c0 : !tt.ptr<f32> loc(#loc4)\n"
     "      scf.yield %x : !tt.ptr<f32> loc(#loc4)\n    } loc(#loc4)\n", {"x", "out"}),
    ("    %w = scf.while (%a = %out) : (!tt.ptr<f32>) -> !tt.ptr<f32> {\n"
     "      scf.condition(%cond) %a : !tt.ptr<f32> loc(#loc4)\n    } do {\n"
     "    ^bb0(%b: !tt.ptr<f32> loc(#loc4)):\n"
     "      tt.store %b, %c0 : !tt.ptr<f32> loc(#loc4)\n"
     "      scf.yield %x : !tt.ptr<f32> loc(#loc4)\n    } loc(#loc4)\n", {"x", "out"}),
])
def test_ttir_pointers_chosen_by_scf_if_select_or_a_loop_name_every_parameter_they_can_be(body, written):
    params, got = ttir_written_params(_ttir(body))
    assert params == ["x", "out", "n", "flag"] and {params[i] for i in got} == written


def test_llvm_a_pointer_selected_between_two_parameters_names_both():
    ir = ("define amdgpu_kernel void @k(ptr addrspace(1) %0, ptr addrspace(1) %1, i1 %2) {\n"
          "  %4 = select i1 %2, ptr addrspace(1) %0, ptr addrspace(1) %1\n"
          "  store float 0.0, ptr addrspace(1) %4, align 4\n  ret void\n}\n")
    assert llvm_written_params(ir, "k") == {0, 1}


ACCUMULATE_LLVM = """
DEFINE
  %v = load float, ptr addrspace(1) %0, align 4
  %a = getelementptr float, ptr addrspace(1) %1, i64 4
  %old = atomicrmw fadd ptr addrspace(1) %a, float %v syncscope("agent") monotonic, align 4
  %x = atomicrmw xchg ptr addrspace(1) %2, float %v monotonic, align 4
  %c = cmpxchg ptr addrspace(1) %3, i32 0, i32 1 monotonic monotonic, align 4
  %r = call ptr addrspace(8) @llvm.amdgcn.make.buffer.rsrc.p8.p1(ptr addrspace(1) %4, i16 0, i32 -1, i32 0)
  %f = call float @llvm.amdgcn.raw.ptr.buffer.atomic.fadd.f32(float %v, ptr addrspace(8) %r, i32 0, i32 0, i32 0)
  store float %v, ptr addrspace(1) %5, align 4
  ret void
}
""".replace("DEFINE", "define amdgpu_kernel void @k(ptr addrspace(1) %0, ptr addrspace(1) %1, ptr addrspace(1) %2, "
                      "ptr addrspace(1) %3, ptr addrspace(1) %4, ptr addrspace(1) %5) {")


def test_llvm_atomic_read_modify_writes_are_accumulations_and_exchanges_or_stores_are_not():
    # %1: atomicrmw fadd via a GEP; %3: cmpxchg (a CAS loop); %4: an AMDGPU buffer atomic through a resource made
    # from it. %2 (an exchange) and %5 (a store) are written but do not read the old value.
    assert llvm_written_params(ACCUMULATE_LLVM, "k") == {1, 2, 3, 4, 5}
    assert llvm_accumulated_params(ACCUMULATE_LLVM, "k") == {1, 3, 4}


def test_ttir_atomic_adds_are_accumulations_and_stores_or_exchanges_are_not():
    params, _ = ttir_written_params(TTIR)
    assert {params[i] for i in ttir_accumulated_params(TTIR)} == {"out"}  # r is a plain tt.store
    exch = TTIR.replace("tt.atomic_rmw fadd,", "tt.atomic_rmw exch,")
    assert ttir_accumulated_params(exch) == set()
    cas = TTIR.replace("%old = tt.atomic_rmw fadd, acq_rel, gpu, %o, %c0, %c0 : (!tt.ptr<f32>, f32, i1) -> f32",
                       "%old = tt.atomic_cas acq_rel, gpu, %o, %c0, %c0 : (!tt.ptr<f32>, f32, f32) -> f32")
    assert {params[i] for i in ttir_accumulated_params(cas)} == {"out"}
