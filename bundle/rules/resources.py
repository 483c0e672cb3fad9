"""Rules on resources: a kernel's metadata values, and its launch against its own limits and its target's."""

from __future__ import annotations

from typing import Optional

from flyship.bundle import limits as L
from flyship.bundle import model as _m
from flyship.bundle import targets as _targets
from flyship.bundle.errors import BundleError
from flyship.bundle.rules.common import count as _count
from flyship.bundle.rules.common import fail as _fail
from flyship.bundle.rules.values import check_block


def check_resources(meta: _m.KernelMetadata, block: tuple[int, int, int], target: str, where: str) -> None:
    """A kernel's launch against its own limits and its target's: the required workgroup size equals the
    launch block (the HIP runtime would silently launch the required one; CUDA refuses at launch), the
    block fits the kernel's max flat workgroup size, static LDS fits the target's per-workgroup LDS.

    Raises:
        BundleError: naming both values.
    """
    req = meta.reqd_workgroup_size
    if req is not None and tuple(req) != tuple(block):
        raise BundleError(f"{where}: launch block {list(block)} differs from the code object's required workgroup "
                          f"size {list(req)}; the HIP runtime would silently launch {list(req)}, so this bundle is "
                          "refused; rebuild it")
    threads = block[0] * block[1] * block[2]
    if threads > meta.max_flat_workgroup_size:
        raise BundleError(f"{where}: block of {threads} work-items exceeds the kernel's max flat workgroup size "
                          f"{meta.max_flat_workgroup_size}")
    lds = lds_limit(target)
    if lds is not None and meta.group_segment_fixed_size > lds:
        raise BundleError(f"{where}: the kernel needs {meta.group_segment_fixed_size} bytes of static LDS, "
                          f"{target} has {lds} per workgroup")


def lds_limit(target: str) -> Optional[int]:
    """Bytes of LDS / shared memory per workgroup on ``target``, or None for a processor flyship has no
    table entry for (the device's own limit is then checked before the first launch)."""
    try:
        return _targets.limits(target)["lds_bytes"]
    except BundleError:
        return None


def check_scratch(meta: _m.KernelMetadata, allow_scratch: bool, where: str) -> None:
    """No scratch (spills to private / local memory) unless the spec allows it (compile stage)."""
    if meta.private_segment_fixed_size > 0 and not allow_scratch:
        raise BundleError(f"{where}: the kernel spills to scratch / local memory ({meta.private_segment_fixed_size} "
                          "bytes per work-item); reduce register pressure or set Spec(allow_scratch=True)")


def check_metadata(meta: _m.KernelMetadata, where: str) -> None:
    for name in ("kernarg_segment_size", "group_segment_fixed_size", "private_segment_fixed_size", "sgpr_count",
                 "vgpr_count", "agpr_count"):
        v = getattr(meta, name)
        if not 0 <= v <= L.MAX_RESOURCE:
            raise _fail(f"{where}.{name}", f"expected 0..{L.MAX_RESOURCE}, got {v}")
    if not 1 <= meta.kernarg_segment_align <= L.MAX_ALIGNMENT:
        raise _fail(f"{where}.kernarg_segment_align", f"expected 1..{L.MAX_ALIGNMENT}, got "
                                                      f"{meta.kernarg_segment_align}")
    if meta.wavefront_size not in (32, 64):
        raise _fail(f"{where}.wavefront_size", f"expected 32 or 64, got {meta.wavefront_size}")
    if not 1 <= meta.max_flat_workgroup_size <= L.MAX_BLOCK:
        raise _fail(f"{where}.max_flat_workgroup_size", f"expected 1..{L.MAX_BLOCK}, got "
                                                        f"{meta.max_flat_workgroup_size}")
    if meta.reqd_workgroup_size is not None:
        check_block(meta.reqd_workgroup_size, f"{where}.reqd_workgroup_size")
    _count(meta.args, L.MAX_METADATA_ARGS, "kernel arguments", f"{where}.args")
    for i, a in enumerate(meta.args):
        if not 0 <= a.offset <= L.MAX_KERNARG_BYTES or not 0 <= a.size <= L.MAX_KERNARG_BYTES:
            raise _fail(f"{where}.args[{i}]", f"expected offset and size in 0..{L.MAX_KERNARG_BYTES}, got "
                                              f"offset {a.offset} size {a.size}")
