"""The captured artefacts of one normal FlyDSL compile (``compiler/frontends/flydsl/capture.py``) equal what
FlyDSL's own IR dump mode writes for the same kernels: a differential test, run in the FlyDSL Python."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from ..conftest import ROOT

pytestmark = pytest.mark.compile

_DIFFERENTIAL = r"""
import contextlib, dataclasses, io, json, os, sys, tempfile
from pathlib import Path
from flyship.compiler import frontends, toolchain as _tc
from flyship.compiler.frontends import WorkerSetup, writes
from flyship.compiler.frontends.flydsl import capture, host_ir, launches, proof, signature, trace, versions
from flyship.compiler.worker import load_spec_file

out = {}
tc = _tc.find_toolchain()
with _tc.rocm_root(tc) as rocm, tempfile.TemporaryDirectory() as scratch:
    frontends.get("flydsl").prepare_worker(WorkerSetup(target="gfx942", scratch_root=Path(scratch), rocm_root=rocm))
    from flydsl._mlir import ir
    adapter = versions.current()
    for op in load_spec_file(sys.argv[1]).ops:
        if op.name not in ("add", "softmax"):
            continue
        spec = op.specs[-1]
        pos, kw = trace._call_args(op, spec)
        name = signature.launcher_name(op.kernel)
        trace._forget_compiled(op.kernel)
        with contextlib.redirect_stdout(io.StringIO()), capture.capturing() as whole:
            adapter.compile(op.kernel, pos, kw)
        (c,) = whole.compiles
        (ours,) = host_ir.analyze_functions(c.origin_types[name], c.lowered[name], op, spec, ir)
        dump = Path(scratch) / f"dump-{op.name}"
        os.environ.update(FLYDSL_DUMP_IR="1", FLYDSL_DUMP_DIR=str(dump))
        trace._forget_compiled(op.kernel)
        with contextlib.redirect_stdout(io.StringIO()):
            adapter.compile(op.kernel, pos, kw)
        del os.environ["FLYDSL_DUMP_IR"]
        (kdir,) = [p for p in dump.iterdir() if p.is_dir()]
        theirs = host_ir.analyze(kdir, op, spec, name, adapter.mlir_context(), ir)
        out[f"{op.name}.{spec.name}"] = {
            "pipelines": whole.pipelines,
            "isa_equal": c.isa == [next(kdir.glob("*_final_isa.s")).read_text()],
            "objects_equal": [d for _, d in c.objects] == proof.extract_flydsl_binary(
                next(kdir.glob("*_gpu_module_to_binary.mlir")).read_text()),
            "host_equal": dataclasses.asdict(ours) == dataclasses.asdict(theirs),
            "grid": list(ours.grid),
            "llvm_ir": len(c.llvm_ir),
            "written": sorted(launches._written(c, ours.kernel_name, "test")[0] or []),
            "written_in_dump": sorted(writes.llvm_written_params(next(kdir.glob("*_llvm_ir.ll")).read_text(),
                                                                 ours.kernel_name)),
        }
print(json.dumps(out))
"""


def test_one_observed_compile_gives_exactly_what_the_ir_dump_mode_writes():
    """The ISA FlyDSL's serializer printed equals the dump's final_isa.s byte for byte; the gpu.binary objects
    equal the dump's bin strings; the host analysis of the in-memory function equals the dump-based one; the
    parameters the kernel writes, read from the printed LLVM IR, equal those read from the dump's LLVM IR."""
    pytest.importorskip("flydsl", reason="would compare one observed FlyDSL compile with FlyDSL's IR dump")
    from flyship.compiler.toolchain import ToolchainError, find_toolchain

    try:
        find_toolchain()
    except ToolchainError as e:
        pytest.skip(f"would compare one observed FlyDSL compile with FlyDSL's IR dump, but needs ld.lld: {e}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYDSL_DUMP")}
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(_DIFFERENTIAL), str(ROOT / "examples/flydsl/ops.py")],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(got) == {"add.bf16", "softmax.bf16"}
    for kernel, facts in got.items():
        assert facts["pipelines"] == 1, kernel
        assert facts["isa_equal"] and facts["objects_equal"] and facts["host_equal"], (kernel, facts)
        assert all(g for g in facts["grid"]), (kernel, facts)
        # The write check reads the LLVM IR the capture keeps: the same written parameters as the dump's IR.
        assert facts["llvm_ir"] >= 1 and facts["written"], (kernel, facts)
        assert facts["written"] == facts["written_in_dump"], (kernel, facts)
