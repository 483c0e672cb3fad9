"""Load-time checks of a bundle's code objects against its manifest.

Per variant: the file exists and its sha256 matches; an AMDGPU code object (hsaco) is read with
:mod:`flyship.bundle.codeobject` and must hold the kernel symbol and its descriptor, have the
manifest's kernarg segment and explicit arguments (checked with
:func:`flyship.bundle.manifest.check_layout` against the *file's* metadata), a required workgroup size
equal to the launch block (the HIP runtime would silently replace the block: ROCm/clr does not check
``.reqd_workgroup_size``), and static LDS within the target's limit. A cubin must hold the kernel
kernel, and its SM, parameters, ``.reqntid`` and static shared memory must agree with the manifest
(read with :mod:`flyship.bundle.cubin`).

Everything is refused here, before any launch, with the op, specialization, target and file named.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from flyship.bundle import manifest as _m
from flyship.bundle import targets as _targets
from flyship.bundle.errors import BundleError, CodeObjectError


def _where(op: _m.Op, spec: _m.Specialization, v: _m.Variant) -> str:
    return f"op {op.name} specialization {spec.name} target {v.target} ({v.code_object.file})"


def read_code_object(root: Path, v: _m.Variant, where: str) -> bytes:
    """The file's bytes, checked against the manifest's sha256.

    Raises:
        BundleError: missing file or digest mismatch.
    """
    rel = Path(v.code_object.file)
    if rel.is_absolute() or ".." in rel.parts:
        raise BundleError(f"{where}: expected a code-object path inside the bundle, got {v.code_object.file!r}")
    path = root / rel
    if not path.is_file():
        raise BundleError(f"{where}: expected the code object at {path}, found no file; the bundle is incomplete, "
                          "rebuild or re-copy it")
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != v.code_object.sha256:
        raise BundleError(f"{where}: sha256 mismatch: the manifest says {v.code_object.sha256}, the file has {digest}; "
                          "the code object was changed after the build, rebuild the bundle")
    return data


def _explicit(meta: _m.KernelMetadata) -> list[tuple[int, int, str]]:
    return [(a.offset, a.size, a.value_kind) for a in meta.args if not a.hidden]


def check_hsaco(v: _m.Variant, data: bytes, where: str) -> None:
    """Check an AMDGPU code object against its variant (see the module docstring).

    Raises:
        BundleError: the first disagreement, naming both values.
    """
    from flyship.bundle.codeobject import CodeObjectFile

    co = CodeObjectFile(data, where)
    symbol = v.code_object.symbol
    try:
        co.kernel(symbol)
        co.get_symbol(symbol + ".kd")
    except CodeObjectError as e:
        raise BundleError(f"{where}: {e}; the manifest names a kernel the code object does not have") from None
    meta = co.kernel_metadata(symbol)
    if co.target:
        file_target = _targets.parse_target(co.target)
        if file_target != _targets.parse_target(v.target):
            raise BundleError(f"{where}: the code object is built for {file_target.text}, the manifest says "
                              f"{v.target}; rebuild the bundle")
    man = v.metadata
    for name in ("kernarg_segment_size", "group_segment_fixed_size", "private_segment_fixed_size", "wavefront_size"):
        a, b = getattr(meta, name), getattr(man, name)
        if a != b:
            raise BundleError(f"{where}: {name} is {a} in the code object, {b} in the manifest; rebuild the bundle")
    if _explicit(meta) != _explicit(man):
        raise BundleError(f"{where}: explicit kernel arguments (offset, size, kind) differ: code object "
                          f"{_explicit(meta)}, manifest {_explicit(man)}; rebuild the bundle")
    _m.check_layout(v.kernargs, meta, where)
    req = meta.reqd_workgroup_size
    if req is not None and tuple(req) != tuple(v.launch.block):
        raise BundleError(f"{where}: launch block {list(v.launch.block)} differs from the code object's required "
                          f"workgroup size {list(req)}; the HIP runtime would silently launch {list(req)}, so this "
                          "bundle is refused; rebuild it")
    threads = v.launch.block[0] * v.launch.block[1] * v.launch.block[2]
    if threads > meta.max_flat_workgroup_size:
        raise BundleError(f"{where}: block of {threads} work-items exceeds the code object's max flat workgroup size "
                          f"{meta.max_flat_workgroup_size}")
    try:
        limit = _targets.limits(v.target)["lds_bytes"]
    except BundleError:
        limit = None  # an unknown processor: the device's own limit is checked before the first launch
    if limit is not None and meta.group_segment_fixed_size > limit:
        raise BundleError(f"{where}: the kernel needs {meta.group_segment_fixed_size} bytes of static LDS, "
                          f"{v.target} has {limit} per workgroup")


def check_cubin(v: _m.Variant, data: bytes, where: str) -> None:
    """Check an NVIDIA cubin against its variant with :mod:`flyship.bundle.cubin` (the ``.nv.info``
    attributes): the kernel exists, the SM matches, the parameters (offset, size) and their byte count are
    the manifest's explicit arguments, ``.reqntid`` equals the launch block (CUDA refuses another block at
    launch; refusing at load says why), the block fits ``.maxntid``, static shared memory is the manifest's.

    Raises:
        BundleError: the first disagreement, naming both values.
    """
    from flyship.bundle.cubin import CubinFile

    try:
        cubin = CubinFile(data, where)
        kernels = cubin.kernel_names()
        symbol = v.code_object.symbol
        if symbol not in kernels:
            raise BundleError(f"{where}: the cubin defines no kernel {symbol!r}; it has {kernels}")
        meta = cubin.kernel_metadata(symbol)
        file_target = _targets.parse_target(cubin.target)
    except CodeObjectError as e:
        raise BundleError(f"{where}: {e}; rebuild the bundle") from None
    # The same SM is accepted: a cubin built arch-specific (sm_90a) may be recorded as sm_90.
    if file_target.sm != _targets.parse_target(v.target).sm:
        raise BundleError(f"{where}: the cubin is built for {file_target.text}, the manifest says {v.target}; "
                          "rebuild the bundle")
    file_args = [(a.offset, a.size) for a in meta.args]
    man_args = [(a.offset, a.size) for a in v.metadata.args if not a.hidden]
    if file_args != man_args:
        raise BundleError(f"{where}: kernel parameters (offset, size) differ: cubin {file_args}, manifest {man_args}; "
                          "rebuild the bundle")
    for name in ("kernarg_segment_size", "group_segment_fixed_size"):
        a, b = getattr(meta, name), getattr(v.metadata, name)
        if a != b:
            raise BundleError(f"{where}: {name} is {a} in the cubin, {b} in the manifest; rebuild the bundle")
    req = meta.reqd_workgroup_size
    if req is not None and tuple(req) != tuple(v.launch.block):
        raise BundleError(f"{where}: launch block {list(v.launch.block)} differs from the cubin's required block "
                          f"{list(req)} (.reqntid); rebuild the bundle")
    threads = v.launch.block[0] * v.launch.block[1] * v.launch.block[2]
    if threads > meta.max_flat_workgroup_size:
        raise BundleError(f"{where}: block of {threads} threads exceeds the cubin's limit "
                          f"{meta.max_flat_workgroup_size}")


def check_bundle(root: Path, manifest: _m.Manifest) -> dict[str, bytes]:
    """Read and check every code object of a manifest.

    Returns:
        file (as in the manifest) -> bytes.

    Raises:
        BundleError: see :func:`read_code_object`, :func:`check_hsaco`, :func:`check_cubin`.
    """
    images: dict[str, bytes] = {}
    for op in manifest.ops:
        for spec in op.specializations:
            for v in spec.variants:
                where = _where(op, spec, v)
                data = read_code_object(root, v, where)
                if v.code_object.format == "hsaco":
                    check_hsaco(v, data, where)
                elif v.code_object.format == "cubin":
                    check_cubin(v, data, where)
                else:
                    raise BundleError(f"{where}: expected code object format 'hsaco' or 'cubin', got "
                                      f"{v.code_object.format!r}")
                images[v.code_object.file] = data
    return images
