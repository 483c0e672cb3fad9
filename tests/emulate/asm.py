"""Assemble a few instructions into a kernel (a code object with a kernel descriptor) for emulator tests, and run
it over 64-lane inputs.

Kernel ABI of these tests: user SGPRs s[0:1] = kernarg segment pointer, s2 = workgroup id X; the kernarg segment
holds three pointers: out (s[4:5] after the prologue), in0 (s[6:7]) and in1 (s[8:9]). The prologue loads
``v2 = in0[tid]``, ``v3 = in1[tid]`` and ``v1 = tid * 4`` (tid = the work-item id X); the test body leaves its
result in ``v4`` (and optionally ``v5``), which the epilogue stores to ``out[tid]`` (``out[64 + tid]``).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

from flyship.loader import emulate
from flyship.loader.emulate.decode import find_objdump

PROLOGUE = """
  s_load_dwordx4 s[4:7], s[0:1], 0x0
  s_load_dwordx2 s[8:9], s[0:1], 0x10
  s_waitcnt lgkmcnt(0)
  v_and_b32 v1, 0x3ff, v0
  v_lshlrev_b32 v1, 2, v1
  global_load_dword v2, v1, s[6:7]
  global_load_dword v3, v1, s[8:9]
  s_waitcnt vmcnt(0)
"""
EPILOGUE = """
  s_mov_b64 exec, -1
  global_store_dword v1, v4, s[4:5]
  global_store_dword v1, v5, s[4:5] offset:256
  s_endpgm
"""


def llvm_tools() -> tuple[str, str]:
    """llvm-mc and ld.lld beside the llvm-objdump the emulator decodes with (skip the test when absent)."""
    try:
        folder = Path(find_objdump()).parent
    except emulate.EmulationError as e:
        pytest.skip(f"needs LLVM (llvm-objdump, llvm-mc, ld.lld) to assemble test kernels: {e}")
    mc, lld = folder / "llvm-mc", folder / "ld.lld"
    if not mc.is_file() or not lld.is_file():
        mc_p, lld_p = shutil.which("llvm-mc"), shutil.which("ld.lld")
        if not (mc_p and lld_p):
            pytest.skip(f"needs llvm-mc and ld.lld beside {folder} or on PATH to assemble test kernels")
        return mc_p, lld_p
    return str(mc), str(lld)


def assemble(body: str, target: str, *, name: str = "k", lds: int = 0, denorm32: int = 3,
             raw: bool = False, store: bool = True, extra_directives: str = "") -> bytes:
    """A code object holding kernel ``name`` made of ``body`` (wrapped in PROLOGUE/EPILOGUE unless ``raw``;
    without the epilogue's stores of v4/v5 when not ``store``)."""
    mc, lld = llvm_tools()
    text = body if raw else PROLOGUE + body + (EPILOGUE if store else "  s_endpgm\n")
    src = f"""
.amdgcn_target "amdgcn-amd-amdhsa--{target}"
.text
.globl {name}
.p2align 8
.type {name},@function
{name}:
{text}
.section .rodata,"a",@progbits
.p2align 6
.amdhsa_kernel {name}
  .amdhsa_user_sgpr_kernarg_segment_ptr 1
  .amdhsa_system_sgpr_workgroup_id_x 1
  .amdhsa_group_segment_fixed_size {lds}
  .amdhsa_next_free_vgpr 64
  .amdhsa_next_free_sgpr 32
  .amdhsa_accum_offset 32
  .amdhsa_float_denorm_mode_32 {denorm32}
{extra_directives}
.end_amdhsa_kernel
.amdgpu_metadata
---
amdhsa.version: [ 1, 2 ]
amdhsa.target: amdgcn-amd-amdhsa--{target}
amdhsa.kernels:
  - .name: {name}
    .symbol: {name}.kd
    .kernarg_segment_size: 24
    .kernarg_segment_align: 8
    .group_segment_fixed_size: {lds}
    .private_segment_fixed_size: 0
    .wavefront_size: 64
    .sgpr_count: 32
    .vgpr_count: 64
    .max_flat_workgroup_size: 1024
    .args:
      - {{ .offset: 0, .size: 8, .value_kind: global_buffer, .address_space: global }}
      - {{ .offset: 8, .size: 8, .value_kind: global_buffer, .address_space: global }}
      - {{ .offset: 16, .size: 8, .value_kind: global_buffer, .address_space: global }}
...
.end_amdgpu_metadata
"""
    with tempfile.TemporaryDirectory(prefix="flyship-emu-test-") as tmp:
        s, o, h = Path(tmp) / "k.s", Path(tmp) / "k.o", Path(tmp) / "k.hsaco"
        s.write_text(src)
        r = subprocess.run([mc, "-triple", "amdgcn-amd-amdhsa", f"-mcpu={target}", "-filetype=obj", str(s), "-o",
                            str(o)], capture_output=True, text=True)
        if r.returncode != 0:
            raise AssertionError(f"llvm-mc failed:\n{r.stderr}\n{src}")
        r = subprocess.run([lld, "-shared", str(o), "-o", str(h)], capture_output=True, text=True)
        if r.returncode != 0:
            raise AssertionError(f"ld.lld failed:\n{r.stderr}")
        return h.read_bytes()


def run_lanes(image: bytes, in0, in1=None, *, block: int = 64, grid: int = 1, out_words: int = 128,
              schedule: str = "forward", name: str = "k", out_init=0,
              ) -> tuple[np.ndarray, emulate.RunStats]:
    """Run ``name`` with in0/in1 (uint32 per lane) and return (out as uint32 [out_words], stats)."""
    a = _words(in0)
    b = np.zeros_like(a) if in1 is None else _words(in1)
    out = np.full(out_words, out_init, np.uint32)
    mem = emulate.Memory()
    mem.add(a.ctypes.data, a.nbytes, writable=False, name="in0")
    mem.add(b.ctypes.data, b.nbytes, writable=False, name="in1")
    mem.add(out.ctypes.data, out.nbytes, writable=True, name="out")
    kernargs = np.array([out.ctypes.data, a.ctypes.data, b.ctypes.data], np.uint64).tobytes()
    stats = emulate.run(image, name, grid=(grid, 1, 1), block=(block, 1, 1), dynamic_lds=0, kernargs=kernargs,
                        memory=mem, schedule=schedule)
    return out, stats


def _words(x) -> np.ndarray:
    """Lane inputs as uint32 words: float32 by their bits, integers by value (mod 2**32)."""
    x = np.asarray(x)
    if x.dtype == np.float32:
        return np.ascontiguousarray(x.view(np.uint32))
    return np.ascontiguousarray((x.astype(np.int64) & 0xFFFFFFFF).astype(np.uint32))
