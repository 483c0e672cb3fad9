"""Every supported FlyDSL release builds the portable kernels for gfx942 and gfx950, proves them equal to
FlyDSL's own code objects, records its version and tensor ABI, and the loader packs their kernargs as the
code objects' metadata says; bundles of the oldest and newest release load side by side in one process.

Runs in the workload Python (torch + the loader's extension); the builds run in the matrix venvs.
"""

from __future__ import annotations

import os
import struct
import subprocess
import tempfile
import uuid

import pytest
import torch

from flyship.bundle import manifest as M
from flyship.bundle.codeobject import CodeObjectFile
from flyship.loader.tools.verify import example_inputs

from .conftest import ARCHS, Built, cells

pytestmark = pytest.mark.matrix

IDS = [c.id for c in cells()] or ["unset"]
OPS = ("add", "row_sum", "block_sum")


def built(matrix_builds: dict[str, Built], cell_id: str) -> Built:
    if cell_id == "unset":
        pytest.skip("FLYSHIP_MATRIX is not set (make test-matrix sets it)")
    b = matrix_builds[cell_id]
    assert b.bundle is not None, f"flyc-build failed with FlyDSL {b.cell.flydsl} ({b.cell.python}):\n{b.log[-6000:]}"
    return b


def expected_abi(b: Built) -> str:
    return "static" if b.cell.parsed < (0, 2, 0) else "dynamic"


@pytest.mark.parametrize("cell_id", IDS)
def test_each_release_builds_and_proves_the_portable_kernels_for_both_targets(matrix_builds, cell_id):
    b = built(matrix_builds, cell_id)
    m = M.read(b.bundle)
    assert m.build.frontends == {"flydsl": b.cell.flydsl}
    assert {o.name for o in m.ops} == set(OPS)
    for op in m.ops:
        (spec,) = op.specializations
        assert sorted(v.target for v in spec.variants) == sorted(ARCHS)
        for v in spec.variants:
            assert v.toolchain["flydsl"] == b.cell.flydsl
            assert v.proof.method == "flydsl-binary"
            assert ".text" in v.proof.identical_sections and v.proof.metadata == "equal", (op.name, v.target)
            assert v.proof.kernel_descriptor.startswith("identical"), (op.name, v.target)
            tensors = [a.name for a in op.args if a.kind == "tensor"] + [o.name for o in op.outputs]
            assert v.tensor_abi == {t: expected_abi(b) for t in sorted(tensors)}, (op.name, v.target)
        if op.name == "block_sum":
            assert all(v.metadata.group_segment_fixed_size >= 256 * 4 for v in spec.variants)  # the LDS kernel


@pytest.mark.parametrize("cell_id", IDS)
def test_the_adapter_facts_hold_for_the_installed_release(matrix_builds, site_dir, cell_id):
    """What versions.py says about a release (authoring API, ISA dump name, triple) is what the wheel does."""
    b = built(matrix_builds, cell_id)
    code = r"""
import os, sys, glob, tempfile, warnings
warnings.simplefilter("ignore")
from flyship.compiler.frontends.flydsl import versions as V
a = V.current()
assert a.version == sys.argv[1], (a.version, sys.argv[1])
import flydsl.expr as fx
from flydsl.expr.typing import IntTuple
assert hasattr(IntTuple, "unpack") == a.has_unpack, "unpack"
assert hasattr(fx, "make_rmem_tensor") == a.has_rmem_tensor, "make_rmem_tensor"
print(type(a).__name__, a.tensor_abi, a.triple, a.isa_dump_name())
"""
    env = dict(os.environ, PYTHONPATH=str(site_dir), PYTHONWARNINGS="ignore")
    r = subprocess.run([b.python, "-c", code, b.cell.flydsl], capture_output=True, text=True, env=env,
                       cwd=tempfile.gettempdir(), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    name, abi, triple, isa = r.stdout.split()
    assert abi == expected_abi(b)
    assert triple == ("amdgcn-amd-amdhsa-unknown" if b.cell.parsed >= (0, 3, 1) else "amdgcn-amd-amdhsa-")
    assert isa == ("22_final_isa.s" if b.cell.parsed >= (0, 3, 4) else "21_final_isa.s")


def _check_packing(bundle, name: str) -> None:
    """Each variant's kernargs, as the loader packs them for the example call on the recording driver (the real
    C++ call path, launches recorded instead of run), against the code object's own metadata."""
    import flyship
    from flyship.loader import extension

    record = extension.extension("record")
    manifest = M.read(bundle)
    op = manifest.op(name)
    for target in sorted({v.target for s in op.specializations for v in s.variants}):
        record.set_recorded_device(0, target)  # read once, at the namespace's first call
        old = os.environ.get("FLYSHIP_FLAVOR")
        os.environ["FLYSHIP_FLAVOR"] = "record"
        try:
            handle = flyship.load(bundle, namespace=f"flyship_p{uuid.uuid4().hex[:8]}", fallback=False)[name]
        finally:
            os.environ.pop("FLYSHIP_FLAVOR") if old is None else os.environ.__setitem__("FLYSHIP_FLAVOR", old)
        for spec in op.specializations:
            v = next((v for v in spec.variants if v.target == target), None)
            if v is None:
                continue
            inputs = example_inputs(manifest.op(name), spec, "cpu")
            record.recorded_launches(clear=True)
            outs = handle(*inputs)
            outs = outs if isinstance(outs, tuple) else (outs,)
            (launch,) = record.recorded_launches(clear=True)
            buffer = launch["kernargs"]
            values = {a.name: t for a, t in zip(op.args, inputs)}
            values.update({o.name: t for o, t in zip(op.outputs, outs)})
            meta = CodeObjectFile((bundle / v.code_object.file).read_bytes()).kernel_metadata(v.code_object.symbol)
            explicit = [a for a in meta.args if not a.hidden]
            assert launch["symbol"] == v.code_object.symbol
            assert len(buffer) == explicit[-1].offset + explicit[-1].size
            assert launch["grid"] == tuple(spec.example.grid) and launch["block"] == tuple(v.launch.block)
            tensors = [n for n in v.tensor_abi]
            # static: one 8-byte global_buffer per tensor; dynamic: pointer + by-value layout struct each
            per_tensor = 1 if set(v.tensor_abi.values()) == {"static"} else 2
            assert len(explicit) == per_tensor * len(tensors), (name, v.target, explicit)
            for i, tname in enumerate(handle_tensor_order(op)):
                ptr_arg = explicit[i * per_tensor]
                assert ptr_arg.value_kind == "global_buffer" and ptr_arg.size == 8
                assert struct.unpack_from("<Q", buffer, ptr_arg.offset)[0] == values[tname].data_ptr()
                if per_tensor == 2:
                    lay = explicit[i * per_tensor + 1]
                    assert lay.value_kind == "by_value"
                    t = values[tname]
                    # the struct holds the dynamic shape (i32 each) then the non-unit strides (i64 each)
                    dims = struct.unpack_from(f"<{t.dim()}i", buffer, lay.offset)
                    assert dims == tuple(t.shape), (name, tname, dims)
                    if t.dim() == 2:
                        assert struct.unpack_from("<q", buffer, lay.offset + 8)[0] == t.stride(0)


def handle_tensor_order(op) -> list[str]:
    """The launcher's tensor parameters in order: inputs then outputs (the portable launchers' order)."""
    return [a.name for a in op.args if a.kind == "tensor"] + [o.name for o in op.outputs]


@pytest.mark.parametrize("cell_id", IDS)
def test_the_loader_packs_each_release_kernargs_as_the_code_object_says(matrix_builds, cell_id):
    import flyship

    b = built(matrix_builds, cell_id)
    for name in OPS:
        _check_packing(b.bundle, name)


def test_one_process_loads_the_oldest_and_newest_release_bundles_side_by_side(matrix_builds):
    import flyship

    from .conftest import need_matrix

    cs = need_matrix()
    oldest = min(cs, key=lambda c: c.parsed)
    newest = max(cs, key=lambda c: c.parsed)
    if oldest == newest:
        pytest.skip("the matrix has one FlyDSL release; it needs two to load side by side")
    old, new = built(matrix_builds, oldest.id), built(matrix_builds, newest.id)
    a = flyship.load(old.bundle, namespace=f"flyship_old{uuid.uuid4().hex[:6]}")
    z = flyship.load(new.bundle, namespace=f"flyship_new{uuid.uuid4().hex[:6]}")
    for ops, bundle in ((a, old.bundle), (z, new.bundle)):
        for name in OPS:
            _check_packing(bundle, name)
    x = torch.randn(1000)
    # Both take the example shape on either target; the static-layout (oldest) bundle is pinned to it.
    for arch in ARCHS:
        assert a.add.dispatch(x, x, target=arch).spec == "f32"
        assert z.add.dispatch(x, x, target=arch).spec == "f32"
    other = torch.randn(1500)
    assert z.add.dispatch(other, other, target="gfx942").spec == "f32"
    if expected_abi(old) == "static":  # shape compiled in: another shape takes the reference, as a launch would
        assert a.add.dispatch(other, other, target="gfx942").spec is None
        torch.testing.assert_close(a.add(other, other), other + other)  # CPU tensors: the reference
