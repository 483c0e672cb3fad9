# SPDX-License-Identifier: Apache-2.0
"""CPU-only compile check for the FlyDSL example kernels (no GPU needed).

Usage (one arch per process; FlyDSL reads the arch from the environment)::

    ROCM_PATH=/tmp/rocmroot .venv-flydsl/bin/python examples/flydsl/compile_check.py \
        --arch gfx942 --out /tmp/flydsl-dumps [--kernels add softmax rmsnorm gemm]

For every kernel/dtype it compiles with ``flyc.compile(launcher, *cpu_tensors)``
under ``COMPILE_ONLY=1`` (CPU tensors are compile placeholders) and
``FLYDSL_DUMP_IR=1``, writing ``<out>/<kernel>_<dtype>_<arch>/<kernel_fn>_0/NN_*``.
It then checks that ``*_final_isa.s`` and ``*_gpu_module_to_binary.mlir`` exist
(and for GEMM that the ISA contains ``v_mfma``).  Exit status 0 = all passed.
"""

import argparse
import glob
import os
import re
import shutil
import sys
import traceback


def _parse():
    p = argparse.ArgumentParser()
    p.add_argument("--arch", required=True, choices=["gfx942", "gfx950"])
    p.add_argument("--out", default="/tmp/flydsl-dumps")
    p.add_argument("--kernels", nargs="*", default=["add", "softmax", "rmsnorm", "gemm"])
    return p.parse_args()


ARGS = _parse()
# Must be set before FlyDSL compiles anything; one arch per process.
os.environ["FLYDSL_GPU_ARCH"] = ARGS.arch
os.environ["COMPILE_ONLY"] = "1"
os.environ["FLYDSL_DUMP_IR"] = "1"
os.environ["FLYDSL_RUNTIME_ENABLE_CACHE"] = "0"  # always really compile (and dump)
os.environ.setdefault("ROCM_PATH", "/tmp/rocmroot")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import flydsl.compiler as flyc  # noqa: E402

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def _cases():
    """(kernel, dtype_name, launcher, args) -- CPU tensors as placeholders."""
    cases = []
    if "add" in ARGS.kernels:
        from elementwise import add

        for dn in ("f32", "bf16", "f16"):
            dt = DTYPES[dn]
            M, N = 1000, 1000  # not tile multiples: exercises the tails
            x, y = torch.randn(M, N, dtype=dt), torch.randn(M, N, dtype=dt)
            cases.append(("add", dn, add, (x, y, torch.empty(M, N, dtype=dt))))
    if "softmax" in ARGS.kernels:
        from softmax import softmax

        for dn in ("f32", "bf16", "f16"):
            dt = DTYPES[dn]
            M, N = 512, 1000
            cases.append(("softmax", dn, softmax, (torch.randn(M, N, dtype=dt), torch.empty(M, N, dtype=dt))))
    if "rmsnorm" in ARGS.kernels:
        from rmsnorm import rmsnorm

        for dn in ("f32", "bf16", "f16"):
            dt = DTYPES[dn]
            M, N = 256, 4096
            x, w = torch.randn(M, N, dtype=dt), torch.randn(N, dtype=dt)
            cases.append(("rmsnorm", dn, rmsnorm, (x, w, torch.empty(M, N, dtype=dt), 1e-6)))
    if "gemm" in ARGS.kernels:
        from gemm import gemm

        M = N = K = 512
        a = torch.randn(M, K, dtype=torch.bfloat16)
        b = torch.randn(N, K, dtype=torch.bfloat16)  # B is given as [N, K]
        cases.append(("gemm", "bf16", gemm, (a, b, torch.empty(M, N, dtype=torch.bfloat16))))
    return cases


def main():
    failures = []
    for kernel, dn, launcher, args in _cases():
        tag = f"{kernel}_{dn}_{ARGS.arch}"
        dump = os.path.join(ARGS.out, tag)
        shutil.rmtree(dump, ignore_errors=True)
        os.environ["FLYDSL_DUMP_DIR"] = dump
        try:
            flyc.compile(launcher, *args)
        except Exception:
            traceback.print_exc()
            failures.append(f"{tag}: compile raised")
            continue
        isa = glob.glob(os.path.join(dump, "*", "*_final_isa.s"))
        binary = glob.glob(os.path.join(dump, "*", "*_gpu_module_to_binary.mlir"))
        problems = []
        if not isa:
            problems.append("no *_final_isa.s")
        if not binary:
            problems.append("no *_gpu_module_to_binary.mlir")
        if isa and kernel == "gemm":
            with open(isa[0]) as f:
                n_mfma = sum(1 for line in f if "v_mfma" in line)
            if n_mfma == 0:
                problems.append("no v_mfma in ISA")
            else:
                print(f"  {tag}: {n_mfma} v_mfma instructions")
        if isa:
            with open(isa[0]) as f:
                txt = f.read()
            if not re.search(r"\.amdgcn_target \"amdgcn-amd-amdhsa-[a-z]*-" + ARGS.arch, txt):
                problems.append(f"ISA target is not {ARGS.arch}")
        status = "OK" if not problems else "FAIL: " + ", ".join(problems)
        print(f"[{status}] {tag} -> {os.path.dirname(isa[0]) if isa else dump}")
        if problems:
            failures.append(f"{tag}: {problems}")
    if failures:
        print("FAILURES:\n  " + "\n  ".join(failures))
        return 1
    print("all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
