"""The cubin reader against the CUDA driver itself: every cubin of the bundle loaded with
``cuModuleLoadData`` and asked ``cuFuncGetAttribute`` / ``cuFuncGetParamInfo`` (CUDA 12.4+), through
ctypes on ``libcuda.so.1``. What the manifest recorded at build time (on a machine without a GPU) must be
what the driver reports on the H200."""

from __future__ import annotations

import ctypes
import json

import pytest

from flyship.bundle import manifest as M
from flyship.bundle import rules
from flyship.bundle.cubin import CubinFile

from .conftest import out_dir

pytestmark = pytest.mark.gpu

# CUfunction_attribute (CUDA driver API, cuda.h).
CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0
CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES = 1
CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES = 3
CU_FUNC_ATTRIBUTE_NUM_REGS = 4
CU_FUNC_ATTRIBUTE_BINARY_VERSION = 6


class Driver:
    """The few libcuda calls the test needs, each result checked."""

    def __init__(self) -> None:
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            pytest.skip(f"libcuda.so.1 not loadable ({e}); the test would ask the CUDA driver about each cubin")
        self.check(self.lib.cuInit(0), "cuInit")

    def check(self, rc: int, what: str) -> None:
        if rc != 0:
            name = ctypes.c_char_p()
            self.lib.cuGetErrorName(rc, ctypes.byref(name))
            raise RuntimeError(f"{what} failed: {rc} {name.value.decode() if name.value else ''}")

    def ensure_context(self, device: int) -> None:
        cur = ctypes.c_void_p()
        self.check(self.lib.cuCtxGetCurrent(ctypes.byref(cur)), "cuCtxGetCurrent")
        if not cur.value:
            dev, ctx = ctypes.c_int(), ctypes.c_void_p()
            self.check(self.lib.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
            self.check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
            self.check(self.lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    def load(self, image: bytes, symbol: str) -> tuple[ctypes.c_void_p, ctypes.c_void_p]:
        mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
        buf = ctypes.create_string_buffer(image, len(image))
        self.check(self.lib.cuModuleLoadData(ctypes.byref(mod), buf), "cuModuleLoadData")
        self.check(self.lib.cuModuleGetFunction(ctypes.byref(fn), mod, symbol.encode()),
                   f"cuModuleGetFunction({symbol})")
        return mod, fn

    def attribute(self, fn: ctypes.c_void_p, attr: int) -> int:
        v = ctypes.c_int()
        self.check(self.lib.cuFuncGetAttribute(ctypes.byref(v), attr, fn), f"cuFuncGetAttribute({attr})")
        return v.value

    def params(self, fn: ctypes.c_void_p) -> list[tuple[int, int]] | None:
        """(offset, size) of every parameter via cuFuncGetParamInfo, or None when the driver lacks it."""
        if not hasattr(self.lib, "cuFuncGetParamInfo"):
            return None
        out = []
        while True:
            off, size = ctypes.c_size_t(), ctypes.c_size_t()
            rc = self.lib.cuFuncGetParamInfo(fn, ctypes.c_size_t(len(out)), ctypes.byref(off), ctypes.byref(size))
            if rc != 0:
                return out
            out.append((off.value, size.value))


def test_every_cubin_is_what_the_driver_reports(gpu, ops, bundle):
    device = gpu.cuda.current_device()
    target = ops.device_target(device)
    if not target.startswith("sm_"):
        pytest.skip(f"this GPU is {target}, not NVIDIA; the test asks the CUDA driver about the bundle's cubins")
    gpu.empty(1, device="cuda")  # the runtime makes the primary context current on this thread
    drv = Driver()
    drv.ensure_context(device)
    evidence = []
    checked = 0
    for op in ops.manifest.ops:
        for s in op.specializations:
            for v in s.variants:
                if v.code_object.format != "cubin":
                    continue
                image = (bundle / v.code_object.file).read_bytes()
                cubin = CubinFile(image, v.code_object.file)
                mod, fn = drv.load(image, v.code_object.symbol)
                try:
                    got = {
                        "registers": drv.attribute(fn, CU_FUNC_ATTRIBUTE_NUM_REGS),
                        "static_shared": drv.attribute(fn, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES),
                        "local_bytes": drv.attribute(fn, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES),
                        "max_threads": drv.attribute(fn, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK),
                        "binary_version": drv.attribute(fn, CU_FUNC_ATTRIBUTE_BINARY_VERSION),
                        "params": drv.params(fn),
                    }
                finally:
                    drv.lib.cuModuleUnload(mod)
                meta = v.metadata
                want = {
                    "registers": meta.vgpr_count,
                    "static_shared": meta.group_segment_fixed_size,
                    "local_bytes": meta.private_segment_fixed_size,
                    "block": v.launch.block[0],
                    "binary_version": int(cubin.target[3:].rstrip("a")),
                    "params": [(a.offset, a.size) for a in meta.args],
                }
                evidence.append({"variant": f"{op.name}.{s.name}.{v.target}", "file": v.code_object.file,
                                 "driver": got, "manifest": want})
                rules.check_layout(v.kernargs, meta, v.code_object.file)
    d = out_dir()
    if d is not None:  # evidence first, so a disagreement leaves both sides on record
        (d / "cubin_vs_driver.json").write_text(json.dumps(evidence, indent=1))
    for e in evidence:
        got, want, where = e["driver"], e["manifest"], e["variant"]
        for key in ("registers", "static_shared", "local_bytes", "binary_version"):
            assert got[key] == want[key], f"{where}: {key}: driver {got[key]}, manifest {want[key]}"
        assert got["max_threads"] >= want["block"], where
        if got["params"] is not None:
            assert [tuple(p) for p in got["params"]] == want["params"], where
        checked += 1
    assert checked > 0, "the bundle has no cubin for this NVIDIA GPU"
