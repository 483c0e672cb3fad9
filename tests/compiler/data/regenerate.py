# SPDX-License-Identifier: Apache-2.0
"""Recreate the committed inputs of the compiler tests (run from the repo root, with the FlyDSL venv)::

    .venv-flydsl/bin/python tests/compiler/data/regenerate.py [--archs gfx942 gfx950] [--llvm-bin DIR]

Writes, beside this script:

* ``vadd.<arch>.s``: FlyDSL's ``NN_final_isa.s`` of the 1-D vector add below;
* ``vadd.<arch>.gpu_module_to_binary.mlir``: FlyDSL's ``NN_gpu_module_to_binary.mlir`` of the same compile;
* ``vadd.<arch>.hsaco``: FlyDSL's own code object, the ``bin = "..."`` string of that dump;
* ``calls_external.gfx942.s``: ``llc`` output of ``calls_external.ll`` (a kernel calling an undefined
  function), for the undefined-symbol test; needs only LLVM.

Each arch compiles in its own process (FlyDSL reads ``FLYDSL_GPU_ARCH`` once; FIELD-NOTES), on the CPU:
``COMPILE_ONLY=1``, CPU tensors as placeholders, ``FLYDSL_DUMP_IR=1``, and ``ROCM_PATH`` set to a
ROCm-shaped root made by :func:`flyship.compiler.toolchain.rocm_root`. Generated with flydsl 0.5.0 and
Debian LLVM 22.1.8.
"""


import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
KERNEL = "vadd_kernel_0"


def _compile_in_this_process() -> None:
    """Child: compile the vector add once; FlyDSL dumps to $FLYDSL_DUMP_DIR."""
    import flydsl.compiler as flyc
    import flydsl.expr as fx
    import torch

    @flyc.kernel
    def vadd_kernel(A: fx.Tensor, B: fx.Tensor, C: fx.Tensor):
        i = fx.block_idx.x * 64 + fx.thread_idx.x
        C[i] = A[i] + B[i]

    @flyc.jit
    def vadd(a: fx.Tensor, b: fx.Tensor, c: fx.Tensor, stream: fx.Stream = fx.Stream(None)):
        n = a.shape.unpack()
        vadd_kernel(a, b, c).launch(grid=((n + 63) // 64, 1, 1), block=(64, 1, 1), stream=stream)

    x = torch.randn(4096)
    flyc.compile(vadd, x, x.clone(), torch.empty(4096))


def _one(path_glob: str, folder: Path) -> Path:
    found = sorted(folder.glob(path_glob))
    if len(found) != 1:
        raise SystemExit(f"regenerate: expected one {path_glob} under {folder}, got {[str(p) for p in found]}; "
                         "did FlyDSL compile (FLYDSL_DUMP_IR=1, ROCM_PATH)?")
    return found[0]


def _flydsl(arch: str, rocm: Path) -> None:
    from flyship.compiler.frontends.flydsl.proof import extract_flydsl_binary

    with tempfile.TemporaryDirectory(prefix="flyship-regen-") as dump:
        environ = dict(os.environ, FLYDSL_GPU_ARCH=arch, COMPILE_ONLY="1", FLYDSL_DUMP_IR="1",
                       FLYDSL_DUMP_DIR=dump, FLYDSL_RUNTIME_ENABLE_CACHE="0", ROCM_PATH=str(rocm))
        environ.pop("ARCH", None)  # a bare ARCH overrides FLYDSL_GPU_ARCH
        subprocess.run([sys.executable, __file__, "--child"], check=True, env=environ, cwd=ROOT,
                       stdout=subprocess.DEVNULL)
        isa = _one(f"{KERNEL}/*_final_isa.s", Path(dump))
        mlir = _one(f"{KERNEL}/*_gpu_module_to_binary.mlir", Path(dump))
        shutil.copyfile(isa, HERE / f"vadd.{arch}.s")
        shutil.copyfile(mlir, HERE / f"vadd.{arch}.gpu_module_to_binary.mlir")
        objects = extract_flydsl_binary(mlir.read_text())
        if len(objects) != 1:
            raise SystemExit(f"regenerate: expected one code object in {mlir}, got {len(objects)}")
        (HERE / f"vadd.{arch}.hsaco").write_bytes(objects[0])
        print(f"{arch}: vadd.{arch}.s, vadd.{arch}.gpu_module_to_binary.mlir, vadd.{arch}.hsaco")


def _calls_external(toolchain) -> None:
    llc = toolchain.folder / "llc"
    if not llc.is_file():
        raise SystemExit(f"regenerate: expected llc beside {toolchain.assembler.path}, got none; pass --llvm-bin")
    subprocess.run([str(llc), "-mtriple=amdgcn-amd-amdhsa", "-mcpu=gfx942", str(HERE / "calls_external.ll"),
                    "-o", str(HERE / "calls_external.gfx942.s")], check=True)
    print("calls_external.gfx942.s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--archs", nargs="*", default=["gfx942", "gfx950"])
    p.add_argument("--llvm-bin", default=None)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        _compile_in_this_process()
        return
    from flyship.compiler.toolchain import check_targets, find_toolchain, rocm_root

    toolchain = find_toolchain(args.llvm_bin)
    check_targets(toolchain, args.archs)
    with rocm_root(toolchain) as rocm:
        for arch in args.archs:
            _flydsl(arch, rocm)
    _calls_external(toolchain)


if __name__ == "__main__":
    main()
