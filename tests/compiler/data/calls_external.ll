; A kernel that calls a function nothing defines: its linked code object keeps an undefined symbol.
; tests/compiler/test_assemble.py checks that assemble() refuses it, naming the symbol.
; regenerate.py turns this into calls_external.gfx942.s with llc.
target triple = "amdgcn-amd-amdhsa"

declare float @external_fn(float)

define amdgpu_kernel void @calls_external(ptr addrspace(1) %p) {
  %v = load float, ptr addrspace(1) %p
  %r = call float @external_fn(float %v)
  store float %r, ptr addrspace(1) %p
  ret void
}

!llvm.module.flags = !{!0}
!0 = !{i32 1, !"amdhsa_code_object_version", i32 600}
