"""Launch a bundle specialization's code object on the emulated device with CPU tensors (tests only).

Packs the explicit kernarg bytes from the manifest's kernarg fields (pointer = the tensor's data_ptr(), shape /
stride = its sizes and strides in elements, scalar = the value), evaluates the launch's grid and block from the
shapes, and registers each tensor's bytes as a memory region (outputs writable)."""

from __future__ import annotations

import struct
from pathlib import Path

import torch

from flyship.bundle import expr
from flyship.loader import emulate

_FMT = {"i32": "<i", "i64": "<q", "u32": "<I", "u64": "<Q", "f32": "<f", "f64": "<d", "ptr": "<Q", "i16": "<h",
        "i8": "<b", "u8": "<B", "u16": "<H", "bf16": None, "f16": "<e"}


def pack_kernargs(fields: list[dict], tensors: dict[str, torch.Tensor], scalars: dict[str, float]) -> bytes:
    size = max((f["offset"] + f["size"] for f in fields), default=0)
    buf = bytearray(size)
    for f in fields:
        kind, arg = f["kind"], f["arg"]
        if kind in ("pointer", "workspace"):  # a workspace: the test passes its buffer as a tensor
            value = tensors[arg].data_ptr()
        elif kind == "shape":
            value = tensors[arg].shape[f["dim"]]
        elif kind == "stride":
            value = tensors[arg].stride(f["dim"])
        elif kind == "scalar":
            value = scalars[arg]
        elif kind == "null":
            value = 0
        elif kind == "expr":
            value = expr.evaluate_with_shapes(f["expr"], {k: tuple(t.shape) for k, t in tensors.items()},
                                              {k: v for k, v in scalars.items() if isinstance(v, int)})
        elif f.get("value") is not None:
            value = f["value"]
        else:
            raise AssertionError(f"kernarg field kind {kind!r} is not packed by this test helper: {f}")
        struct.pack_into(_FMT[f["type"]], buf, f["offset"], value)
    return bytes(buf)


def launch(bundle: Path, variant: dict, tensors: dict[str, torch.Tensor], scalars: dict[str, float],
           outputs: set[str], schedule: str = "forward", image: bytes | None = None) -> emulate.RunStats:
    """One emulated launch of ``variant`` (its code object, or ``image``: e.g. the spec's offload bundle)."""
    shapes = {k: tuple(t.shape) for k, t in tensors.items()}
    launch_ = variant["launch"]
    grid = tuple(int(expr.evaluate_with_shapes(g, shapes, {})) for g in launch_["grid"])
    block = tuple(int(b) for b in launch_["block"])
    dyn = int(expr.evaluate_with_shapes(launch_["dynamic_lds"], shapes, {}))
    mem = emulate.Memory()
    for name, t in tensors.items():
        if t.untyped_storage().nbytes() == 0:  # an empty tensor (a null pointer, as on the GPU): no region
            continue
        mem.add(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes(), writable=name in outputs, name=name)
    co = variant["code_object"]
    image = (bundle / co["file"]).read_bytes() if image is None else image
    return emulate.run(image, co["symbol"], grid=grid, block=block, dynamic_lds=dyn,
                       kernargs=pack_kernargs(variant["kernargs"]["fields"], tensors, scalars), memory=mem,
                       schedule=schedule, target=co["target"])
