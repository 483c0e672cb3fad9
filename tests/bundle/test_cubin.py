"""The cubin reader, cross-checked against ``cuobjdump -elf`` on cubins Triton builds here (no GPU needed).

Triton's wheel ships NVIDIA's ``cuobjdump`` (``triton/backends/nvidia/bin``); the cubins come from
``triton.compile`` for sm_80 / sm_90 / sm_100 / sm_120, so both ELF ABI versions (7 and 8) are covered.
"""

from __future__ import annotations

import re
import struct
import subprocess
from pathlib import Path

import pytest

from flyship.bundle.codeobject import CodeObjectFile
from flyship.bundle.cubin import EIATTR_KPARAM_INFO, EIATTR_NAMES, CubinFile
from flyship.bundle.errors import CodeObjectError

from ..conftest import ROOT

pytestmark = pytest.mark.compile

KERNELS = '''
import triton
import triton.language as tl


@triton.jit
def add_kernel(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)


@triton.jit
def mixed_kernel(out, a, b, c, d, e, f):
    v = a.to(tl.float32) + b + c.to(tl.float32) + d.to(tl.float32) + e.to(tl.float32)
    if f:
        v = v * 2
    tl.store(out + tl.arange(0, 64), tl.full((64,), 0, tl.float32) + v)


@triton.jit
def transpose_kernel(x, out, n, BLOCK: tl.constexpr):
    r = tl.arange(0, BLOCK)
    tile = tl.load(x + r[:, None] * n + r[None, :])
    tl.store(out + r[:, None] * n + r[None, :], tl.trans(tile))
'''
# name -> (signature, constexprs)
SIGNATURES = {
    "add_kernel": ({"x": "*fp32", "y": "*fp32", "out": "*fp32", "n": "i32", "BLOCK": "constexpr"}, {"BLOCK": 1024}),
    "mixed_kernel": ({"out": "*fp32", "a": "i32", "b": "fp32", "c": "fp16", "d": "i64", "e": "bf16", "f": "i1"}, {}),
    "transpose_kernel": ({"x": "*fp16", "out": "*fp16", "n": "i32", "BLOCK": "constexpr"}, {"BLOCK": 64}),
}
SIZES = {"i1": 1, "i32": 4, "fp32": 4, "fp16": 2, "bf16": 2, "i64": 8}
ARCHS = (80, 90, 100, 120)


def cuobjdump() -> Path:
    triton = pytest.importorskip("triton", reason="needs triton (the FlyDSL venv) to build cubins and run cuobjdump")
    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not path.exists():
        pytest.skip(f"cuobjdump not found at {path}; it would cross-check the cubin reader")
    return path


@pytest.fixture(scope="module")
def cubins(tmp_path_factory) -> dict[tuple[str, int], Path]:
    """(kernel, sm) -> cubin file, compiled by Triton on the CPU."""
    cuobjdump()
    import importlib.util

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    d = tmp_path_factory.mktemp("cubins")
    (d / "cubin_kernels.py").write_text(KERNELS)
    spec = importlib.util.spec_from_file_location("cubin_kernels", d / "cubin_kernels.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = {}
    with triton.knobs.cache.scope():
        triton.knobs.cache.dir = str(d / "cache")
        for name, (sig, cx) in SIGNATURES.items():
            for sm in ARCHS if name == "add_kernel" else (90,):
                k = triton.compile(ASTSource(getattr(mod, name), sig, cx), target=GPUTarget("cuda", sm, 32),
                                   options={"num_warps": 4})
                path = d / f"{name}.sm_{sm}.cubin"
                path.write_bytes(k.asm["cubin"])
                out[(name, sm)] = path
    return out


def dump(path: Path) -> str:
    return subprocess.run([str(cuobjdump()), "-elf", str(path)], capture_output=True, text=True, check=True).stdout


def info_block(text: str, section: str) -> str:
    """The lines cuobjdump prints for one ``.nv.info*`` section."""
    m = re.search(rf"^{re.escape(section)}\n(.*?)(?=^\.\S|\Z)", text, re.M | re.S)
    assert m, f"cuobjdump printed no {section}"
    return m.group(1)


def test_target_comes_from_e_flags_for_both_elf_abi_versions(cubins):
    for sm in ARCHS:
        path = cubins[("add_kernel", sm)]
        want = re.search(r"sm=(\w+)", dump(path)).group(1)
        cubin = CubinFile(path.read_bytes(), str(path))
        assert cubin.target == f"sm_{want}"
        assert cubin.abi_version == (8 if sm >= 100 else 7)
    assert CubinFile(cubins[("add_kernel", 90)].read_bytes()).target == "sm_90a"
    assert CubinFile(cubins[("add_kernel", 80)].read_bytes()).target == "sm_80"


def test_every_attribute_record_is_the_one_cuobjdump_prints(cubins):
    for (name, sm), path in cubins.items():
        text = dump(path)
        cubin = CubinFile(path.read_bytes(), str(path))
        for section in (".nv.info", f".nv.info.{name}"):
            want = re.findall(r"Attribute:\s+(\w+)", info_block(text, section))
            got = [a.name for a in cubin.iter_attributes(section)]
            assert got == want, (name, sm, section)
            assert all(a.code in EIATTR_NAMES for a in cubin.iter_attributes(section))


def test_parameters_agree_with_cuobjdump_field_by_field(cubins):
    pat = re.compile(r"Ordinal\s*:\s*(0x[0-9a-f]+)\s+Offset\s*:\s*(0x[0-9a-f]+)\s+Size\s*:\s*(0x[0-9a-f]+)\s+"
                     r"Pointee's logAlignment\s*:\s*(0x[0-9a-f]+)\s+Space\s*:\s*(0x[0-9a-f]+)\s+cbank\s*:\s*"
                     r"(0x[0-9a-f]+)\s+Parameter Space\s*:\s*(\w+)")
    for (name, sm), path in cubins.items():
        block = info_block(dump(path), f".nv.info.{name}")
        want = sorted((int(o, 16), int(off, 16), int(sz, 16), int(la, 16), int(sp, 16), int(cb, 16), ps)
                      for o, off, sz, la, sp, cb, ps in pat.findall(block))
        cubin = CubinFile(path.read_bytes(), str(path))
        got = [(p.ordinal, p.offset, p.size, p.log_alignment, p.space, p.cbank, "CBANK" if p.in_cbank else "SMEM")
               for p in cubin.kernel_params(name)]
        assert got == want and got, (name, sm)
        m = re.search(r"EIATTR_CBANK_PARAM_SIZE\s+Format:\s+\w+\s+Value:\s+(0x[0-9a-f]+)", block)
        assert cubin.param_bytes(name) == int(m.group(1), 16)


def test_registers_frame_and_block_agree_with_cuobjdump(cubins):
    for (name, sm), path in cubins.items():
        text = dump(path)
        cubin = CubinFile(path.read_bytes(), str(path))
        regs = re.search(rf"function: {name}\(0x[0-9a-f]+\)\s+register count: (\d+)", text)
        frame = re.search(rf"function: {name}\(0x[0-9a-f]+\)\s+frame size: (0x[0-9a-f]+)", text)
        req = re.search(r"EIATTR_REQNTID\s+Format:\s+\w+\s+Value:\s+(0x[0-9a-f]+) (0x[0-9a-f]+) (0x[0-9a-f]+)", text)
        assert cubin.registers(name) == int(regs.group(1))
        assert cubin.frame_size(name) == int(frame.group(1), 16)
        assert cubin.reqntid(name) == tuple(int(v, 16) for v in req.groups()) == (128, 1, 1)
        sizes = {m.group(2): int(m.group(1), 16)
                 for m in re.finditer(r"^\s+\w+\s+\w+\s+([0-9a-f]+)\s+\w+\s+\w+\s+NOBITS.*?(\S+)$", text, re.M)}
        section = sizes.get(f".nv.shared.{name}", 0)
        assert cubin.static_shared(name) + (cubin.reserved_shared() if section else 0) == section


def test_metadata_follows_the_triton_signature_with_natural_alignment(cubins):
    for (name, sm), path in cubins.items():
        sig, _ = SIGNATURES[name]
        runtime = [t for t in sig.values() if t != "constexpr"]
        sizes = [8 if t.startswith("*") else SIZES[t] for t in runtime] + [8, 8]  # + Triton's two hidden pointers
        pointers = [i for i, t in enumerate(runtime) if t.startswith("*")] + [len(runtime), len(runtime) + 1]
        names = [k for k, t in sig.items() if t != "constexpr"] + ["global_scratch", "profile_scratch"]
        meta = CubinFile(path.read_bytes()).kernel_metadata(name, pointer_ordinals=pointers, names=names)
        assert [a.size for a in meta.args] == sizes
        assert [a.name for a in meta.args] == names
        assert all(a.offset % a.size == 0 for a in meta.args)
        assert [a.value_kind for a in meta.args] == ["global_buffer" if i in pointers else "by_value"
                                                     for i in range(len(sizes))]
        assert meta.kernarg_segment_size == meta.args[-1].offset + 8
        assert meta.wavefront_size == 32 and meta.reqd_workgroup_size == (128, 1, 1)
        assert meta.max_flat_workgroup_size == 128 and meta.sgpr_count == 0


def test_a_pointer_claim_on_a_four_byte_parameter_is_refused(cubins):
    cubin = CubinFile(cubins[("add_kernel", 90)].read_bytes())
    with pytest.raises(CodeObjectError, match="parameter 3 should be an 8-byte pointer, got size 4"):
        cubin.kernel_metadata("add_kernel", pointer_ordinals=[3])
    with pytest.raises(CodeObjectError, match="has 6 parameters, got 2 names"):
        cubin.kernel_metadata("add_kernel", names=["a", "b"])


def test_unknown_kernels_and_foreign_files_are_refused_with_what_exists(cubins):
    data = cubins[("add_kernel", 90)].read_bytes()
    with pytest.raises(CodeObjectError, match=r"no kernel 'nope'; it has \['add_kernel'\]"):
        CubinFile(data).kernel_params("nope")
    with pytest.raises(CodeObjectError, match="expected an ELF file"):
        CubinFile(b"not an elf at all" * 8)
    hsaco = ROOT / "tests" / "compiler" / "data" / "vadd.gfx942.hsaco"
    if hsaco.exists():
        CodeObjectFile(hsaco.read_bytes())  # a real AMDGPU code object...
        with pytest.raises(CodeObjectError, match="expected a CUDA ELF"):
            CubinFile(hsaco.read_bytes())  # ...is not a cubin


def test_a_truncated_attribute_record_is_reported_not_misread(cubins):
    path = cubins[("add_kernel", 90)]
    cubin = CubinFile(path.read_bytes())
    sec = cubin.elf.get_section_by_name(".nv.info.add_kernel")
    rec = next(a for a in cubin.iter_attributes(".nv.info.add_kernel") if a.code == EIATTR_KPARAM_INFO)
    data = bytearray(path.read_bytes())
    struct.pack_into("<H", data, sec["sh_offset"] + rec.offset + 2, 0x7FFF)  # claim a 32 KiB payload
    with pytest.raises(CodeObjectError, match="claims 32767 bytes"):
        list(CubinFile(bytes(data)).iter_attributes(".nv.info.add_kernel"))
