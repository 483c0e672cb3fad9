"""The rule book: every rule a bundle must satisfy, alone and against its code objects and files.

One owner per rule. The compile stage runs :func:`check_manifest` before it writes a bundle and
:func:`check_resources` on each kernel it builds; the loader runs :func:`check_manifest` when it reads
a manifest (:func:`flyship.bundle.manifest.read`) and :func:`check_bundle_files` before it lowers
anything to the C++ core, so whatever reaches C++ has passed every rule here (C++ keeps only cheap
internal asserts). The numbers live in :mod:`flyship.bundle.limits`.

Rules, by subject:

* names: namespace, op, argument, output and specialization names are ASCII identifiers of at most
  ``MAX_NAME`` characters, unique where they must be; the namespace is not one of torch's own;
  an output's ``dtype`` rule names either an input tensor or a dtype, never something that is both
  or a scalar; ``device`` is reserved for device properties (:func:`check_names`); an output's shape
  never reads the device (``device.cu_count``);
* values: scalar defaults and example scalars fit the scalar's type, alignments are powers of two,
  blocks are 1..``MAX_BLOCK`` per dimension, literal grids fit ``MAX_GRID``, ranks ``MAX_RANK``,
  every count its limit (:func:`check_manifest`);
* kernarg layout against the metadata: fields tile the explicit kernel arguments exactly, each field's
  kind, type, size, argument slot and dimension agree (:func:`check_layout`, :func:`check_fields`);
* resources against the target: required workgroup size equals the launch block (the HIP runtime would
  silently replace it: ROCm/clr does not check ``.reqd_workgroup_size``), the block fits the kernel's
  max flat workgroup size, static LDS fits the target (:func:`check_resources`), no scratch unless
  allowed (:func:`check_scratch`);
* leading batch dimensions (schema 1.2): a batched argument is a tensor of rank >= 1; a batched output's
  first dimension is a batched input's first (``x.shape[0]``), so the flattened rows map back to the leading
  dims; an autograd pair keeps the batch: a backward input fed from a batched tensor and a gradient of a
  batched input are batched in the backward op (:func:`check_batch`, :func:`check_backward`);
* files: every path the manifest names stays inside the bundle after resolving links, is at most
  ``MAX_CODE_OBJECT_BYTES`` and has the sha256 the manifest records (:func:`read_bundle_file`);
* code objects against the manifest: the kernel and its descriptor exist, the file's target, kernarg
  segment, explicit arguments and resources are the manifest's (:func:`check_code_object`).

Every refusal is a :class:`~flyship.errors.BundleError` naming the file (where it has one), the op,
specialization and target, and the JSON path of the bad value.
"""

from __future__ import annotations

import ast
import hashlib
import os
import re
import struct
import warnings
from pathlib import Path
from typing import Iterator, Optional

from flyship.bundle import expr as _expr
from flyship.bundle import files as _files
from flyship.bundle import limits as L
from flyship.bundle import manifest as _m
from flyship.bundle import targets as _targets
from flyship.bundle.errors import BundleError, CodeObjectError

# torch's own operator namespaces (torch/_ops.py, torch/library.py, torch/_refs, torch/_prims, c10d and
# the compiler's higher-order ops); a bundle registering there would shadow or clash with torch's ops.
RESERVED_NAMESPACES = frozenset({
    "aten", "prim", "prims", "_prims", "_refs", "refs", "quantized", "_quantized", "torch", "_torch", "c10",
    "c10d", "_c10d_functional", "_c10d_functional_autograd", "c10d_functional", "_dtensor", "profiler",
    "mkldnn", "mkl", "onednn", "xnnpack", "cudnn", "miopen", "_inductor", "inductor", "higher_order",
    "_higher_order_ops", "_export", "export", "debugprims", "rngprims", "_nested", "sparse", "fft", "linalg",
    "special", "nested", "_test", "ops", "_library", "autograd", "functorch", "torchvision", "torchaudio",
    "debug_mode_ops",
})
# Attributes of torch.ops itself (torch/_ops.py _Ops: its methods and module attributes): torch.ops.<ns> for one of
# these is that attribute, not an op namespace, so ops registered there cannot be reached. Dunder names
# (__init__, __class__...) are refused as a family.
TORCH_OPS_ATTRIBUTES = frozenset({"load_library", "import_module", "loaded_libraries", "_dir", "_native"})
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_SHA256 = re.compile(r"[0-9a-f]{64}\Z")
_INT_TYPES = {"i64": (L.INT64_MIN, L.INT64_MAX), "u64": (0, (1 << 64) - 1), "i32": (-(1 << 31), (1 << 31) - 1),
              "u32": (0, (1 << 32) - 1), "i16": (-(1 << 15), (1 << 15) - 1), "i8": (-(1 << 7), (1 << 7) - 1)}
_FLOAT_TYPES = ("f64", "f32", "f16", "bf16")
# Field kinds -> the kernarg types they may have, and whether they name a tensor / a scalar argument.
_POINTER_KINDS = ("pointer", "null", "scratch", "workspace")
_TENSOR_KINDS = ("pointer", "shape", "stride")


def _is_pow2(n: object) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n > 0 and n & (n - 1) == 0


def _fail(where: str, what: str) -> BundleError:
    return BundleError(f"{where}: {what}")


# ---------------------------------------------------------------------------------------------
# Names


def check_name(name: object, where: str) -> None:
    """A namespace, op, argument, output or specialization name: an ASCII identifier of at most
    ``MAX_NAME`` characters (torch schemas and C++ identifiers take nothing else)."""
    if not isinstance(name, str) or len(name) > L.MAX_NAME or not _IDENT.match(name):
        shown = name[:40] + "..." if isinstance(name, str) and len(name) > 40 else name
        raise _fail(where, f"expected an ASCII identifier of at most {L.MAX_NAME} characters, got {shown!r}")


def check_namespace(ns: object, where: str) -> None:
    """A torch namespace a bundle may register ops under: an identifier, not one of torch's own.

    Raises:
        BundleError: naming the namespace; says to load under another one.
    """
    check_name(ns, where)
    what = None
    if ns in RESERVED_NAMESPACES or str(ns).startswith("_torch"):
        what = "is one of torch's own operator namespaces; a bundle cannot register ops there"
    elif ns == "_":
        what = "is torch's wildcard namespace (TORCH_LIBRARY_IMPL(_, ...)); no op can be defined in it"
    elif ns in TORCH_OPS_ATTRIBUTES or (ns.startswith("__") and ns.endswith("__")):
        what = f"names an attribute of torch.ops itself (torch.ops.{ns}), so ops registered there cannot be reached"
    if what:
        raise _fail(where, f"expected a namespace of your own, got {ns!r}, which {what}; rebuild with another "
                           "namespace or load(..., namespace='...')")


def check_names(op: _m.Op, where: str) -> None:
    """Argument and output names are identifiers, unique, and every output ``dtype`` rule means one thing:
    an input tensor's name (same dtype as that input) or a dtype name, never both, never a scalar or an
    output (the C++ core would read a tensor that is not there)."""
    names = [a.name for a in op.args] + [o.name for o in op.outputs]
    for i, a in enumerate(op.args):
        check_name(a.name, f"{where}.args[{i}].name")
    for i, o in enumerate(op.outputs):
        check_name(o.name, f"{where}.outputs[{i}].name")
    if len(set(names)) != len(names):
        raise _fail(where, f"argument names repeat: {names}; give every input and output its own name")
    if _expr.DEVICE in names:
        raise _fail(where, f"argument name {_expr.DEVICE!r} is reserved: expressions read the device's properties "
                           f"through it ({_expr.DEVICE}.cu_count); rename the argument")
    tensor_in = {a.name for a in op.args if a.kind == "tensor"}
    for i, o in enumerate(op.outputs):
        ow = f"{where}.outputs[{i}].dtype"
        if o.dtype in names and o.dtype not in tensor_in:
            raise _fail(ow, f"output {o.name} takes its dtype from {o.dtype!r}, which is a scalar or an output, "
                            "expected an input tensor's name or a dtype name")
        if o.dtype in tensor_in and o.dtype in _m.DTYPES:
            raise _fail(ow, f"output {o.name} dtype rule {o.dtype!r} is ambiguous: it is both an input tensor and a "
                            "dtype name; rename the input")
        if o.dtype not in _m.DTYPES and o.dtype not in tensor_in:
            raise _fail(ow, f"output {o.name} dtype {o.dtype!r} is neither a dtype nor an input tensor "
                            f"({', '.join(sorted(tensor_in)) or 'none'})")


# ---------------------------------------------------------------------------------------------
# Values


def _count(items: object, limit: int, what: str, where: str) -> None:
    if len(items) > limit:  # type: ignore[arg-type]
        raise _fail(where, f"expected at most {limit} {what}, got {len(items)}")  # type: ignore[arg-type]


def check_scalar_value(kind: str, value: object, where: str) -> None:
    """A scalar value (default, example value) fits the scalar's type: an int for ``int`` (within int64),
    a number for ``float``, a bool for ``bool``; a float is never silently truncated to an int."""
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool) and L.INT64_MIN <= value <= L.INT64_MAX,
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
    }.get(kind, False)
    if not ok:
        raise _fail(where, f"expected a value of scalar type {kind}, got {value!r}")


def check_block(block: tuple[int, ...], where: str) -> int:
    """Each block dimension is 1..``MAX_BLOCK`` and so is their product. Returns the work-items per block."""
    if any(not isinstance(b, int) or not 1 <= b <= L.MAX_BLOCK for b in block):
        raise _fail(where, f"expected block dimensions in 1..{L.MAX_BLOCK}, got {list(block)}")
    threads = block[0] * block[1] * block[2]
    if threads > L.MAX_BLOCK:
        raise _fail(where, f"expected at most {L.MAX_BLOCK} work-items per block, got {list(block)} = {threads}")
    return threads


def _literal(text: str) -> Optional[int]:
    """The value of an expression that is an integer literal (``"1"``, ``"-3"``), else None."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
        v = node.operand.value
        return -v if isinstance(v, int) and not isinstance(v, bool) else None
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    return None


def _compile(text: str, slots: dict[str, _expr.Slot], where: str) -> None:
    """An expression compiles against the op's slots and every literal in it fits int64 (the C++ core's
    type: a larger one would fail to cross into C++ at load, not be refused here)."""
    try:
        _expr.compile_program(text, slots)
        for node in ast.walk(_expr.parse(text)):
            if isinstance(node, ast.Constant) and isinstance(node.value, int) \
                    and not L.INT64_MIN <= node.value <= L.INT64_MAX:
                raise _fail(where, f"expression {text[:60]!r}: literal {node.value} does not fit int64")
    except _expr.ExprError as e:
        raise _fail(where, str(e)) from None
    except BundleError:
        raise
    except (RecursionError, MemoryError, ValueError) as e:  # deep nesting or a huge literal
        raise _fail(where, f"expression {text[:60]!r}... cannot be compiled ({type(e).__name__}); "
                           "simplify it") from None


# ---------------------------------------------------------------------------------------------
# Kernarg layout against the metadata


def check_layout(layout: _m.KernargLayout, meta: _m.KernelMetadata, where: str) -> None:
    """Check that kernarg fields tile the metadata's explicit arguments exactly.

    Every field lies inside one explicit argument; fields do not overlap; each explicit argument's
    bytes are covered except alignment padding (a gap smaller than the next field's size inside a
    by-value struct); ``layout.size`` is the end of the last explicit argument.

    Raises:
        BundleError: naming the field or argument, its offset and size.
    """
    explicit = sorted((a for a in meta.args if not a.hidden), key=lambda a: a.offset)
    extent = max((a.offset + a.size for a in explicit), default=0)
    if layout.size != extent:
        raise BundleError(f"{where}: kernarg size {layout.size} != explicit-argument extent {extent} "
                          "from the code object metadata")
    fields = sorted(layout.fields, key=lambda f: f.offset)
    prev_end = 0
    for f in fields:
        if f.kind not in _m.FIELD_KINDS or f.type not in _m.FIELD_TYPES or _m.FIELD_TYPES[f.type] != f.size:
            raise BundleError(f"{where}: field at offset {f.offset}: kind {f.kind!r} / type {f.type!r} / "
                              f"size {f.size} are inconsistent")
        if f.offset < prev_end:
            raise BundleError(f"{where}: kernarg field at offset {f.offset} overlaps the previous one "
                              f"(ends at {prev_end})")
        prev_end = f.offset + f.size
        owner = [a for a in explicit if a.offset <= f.offset and f.offset + f.size <= a.offset + a.size]
        if not owner:
            raise BundleError(f"{where}: kernarg field {f.kind} at offset {f.offset} (size {f.size}) lies "
                              "outside every explicit kernel argument of the metadata")
    for a in explicit:  # both lists are bounded (MAX_KERNARG_FIELDS, MAX_METADATA_ARGS)
        inside = [f for f in fields if a.offset <= f.offset < a.offset + a.size]
        if not inside:
            raise BundleError(f"{where}: kernel argument {a.name or '?'} at offset {a.offset} (size {a.size}, "
                              f"{a.value_kind}) has no kernarg field; the loader would leave it unset")
        pos = a.offset
        for f in inside:
            gap = f.offset - pos
            if gap < 0 or gap >= f.size:
                raise BundleError(f"{where}: kernel argument {a.name or '?'} at offset {a.offset}: bytes "
                                  f"{pos}..{f.offset} are neither a field nor alignment padding")
            pos = f.offset + f.size
        tail = a.offset + a.size - pos
        if tail < 0 or tail >= max(f.size for f in inside):
            raise BundleError(f"{where}: kernel argument {a.name or '?'} at offset {a.offset}: its last "
                              f"{tail} bytes are not covered by a field")


def check_fields(layout: _m.KernargLayout, slots: dict[str, _expr.Slot], where: str,
                 workspaces: tuple[str, ...] = ()) -> None:
    """Each kernarg field's own rules: its kind and type agree (pointers are ``ptr``, values are not), it
    names an argument of the right kind (a tensor for pointer/shape/stride, a scalar for scalar, one of
    ``workspaces`` for workspace), its dimension is in range, a constant fits its type, a scratch field's size
    and alignment are sane."""
    if not 0 <= layout.size <= L.MAX_KERNARG_BYTES:
        raise _fail(f"{where}.size", f"expected a kernarg size in 0..{L.MAX_KERNARG_BYTES}, got {layout.size}")
    if not _is_pow2(layout.alignment) or layout.alignment > L.MAX_ALIGNMENT:
        raise _fail(f"{where}.alignment", f"expected a power of two up to {L.MAX_ALIGNMENT}, got {layout.alignment}")
    _count(layout.fields, L.MAX_KERNARG_FIELDS, "kernarg fields", f"{where}.fields")
    for i, f in enumerate(layout.fields):
        fw = f"{where}.fields[{i}]"
        if f.kind not in _m.FIELD_KINDS:
            raise _fail(f"{fw}.kind", f"expected one of {', '.join(_m.FIELD_KINDS)}, got {f.kind!r}")
        if f.type not in _m.FIELD_TYPES or _m.FIELD_TYPES[f.type] != f.size:
            raise _fail(fw, f"type {f.type!r} and size {f.size} disagree (types: "
                            f"{', '.join(f'{k}={v}' for k, v in _m.FIELD_TYPES.items())})")
        if not 0 <= f.offset <= L.MAX_KERNARG_BYTES:
            raise _fail(f"{fw}.offset", f"expected an offset in 0..{L.MAX_KERNARG_BYTES}, got {f.offset}")
        if (f.kind in _POINTER_KINDS) != (f.type == "ptr"):
            raise _fail(f"{fw}.type", f"a {f.kind} field has type {f.type!r}; pointers, null, scratch and "
                                      "workspace fields are 'ptr' and no other kind is")
        if f.kind in _TENSOR_KINDS or f.kind == "scalar":
            if f.arg not in slots:
                raise _fail(f"{fw}.arg", f"kernarg field at {f.offset} names unknown argument {f.arg!r}")
            want = "tensor" if f.kind in _TENSOR_KINDS else "scalar"
            got = "tensor" if slots[f.arg].kind == "tensor" else "scalar"
            if want != got:
                raise _fail(f"{fw}.arg", f"a {f.kind} field needs a {want} argument, {f.arg!r} is a {got}")
        if f.kind == "workspace" and f.arg not in workspaces:
            raise _fail(f"{fw}.arg", f"a workspace field names {f.arg!r}, expected a workspace of the variant "
                                     f"({', '.join(workspaces) or 'it declares none'})")
        if f.kind in ("shape", "stride") and (not isinstance(f.dim, int) or not 0 <= f.dim < slots[f.arg].rank):
            raise _fail(f"{fw}.dim", f"expected a dimension of {f.arg!r} (rank {slots[f.arg].rank}), got {f.dim!r}")
        if f.kind == "scalar" and slots[f.arg].kind == "float" and f.type not in _FLOAT_TYPES:
            raise _fail(f"{fw}.type", f"float scalar {f.arg!r} is packed as {f.type}; expected a float type")
        if f.kind == "expr":
            _compile(f.expr or "", slots, f"{fw}.expr")
        if f.kind == "constant":
            _check_constant(f, fw)
        if f.kind == "scratch":
            bpp = f.bytes_per_program
            if not isinstance(bpp, int) or not 0 <= bpp <= L.MAX_SCRATCH_BYTES_PER_PROGRAM:
                raise _fail(f"{fw}.bytes_per_program", f"expected 0..{L.MAX_SCRATCH_BYTES_PER_PROGRAM}, got {bpp!r}")
            if f.align is not None and (not _is_pow2(f.align) or f.align > L.MAX_ALIGNMENT):
                raise _fail(f"{fw}.align", f"expected a power of two up to {L.MAX_ALIGNMENT}, got {f.align!r}")


def _check_constant(f: _m.KernargField, fw: str) -> None:
    v = f.value
    if f.type in _INT_TYPES:
        lo, hi = _INT_TYPES[f.type]
        if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
            raise _fail(f"{fw}.value", f"expected an integer that fits {f.type} ({lo}..{hi}), got {v!r}")
    elif f.type in _FLOAT_TYPES:
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise _fail(f"{fw}.value", f"expected a number for a {f.type} constant, got {v!r}")
    else:
        raise _fail(f"{fw}.type", f"a constant of type {f.type!r}; expected an integer or float type")


# ---------------------------------------------------------------------------------------------
# Resources against the target


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
        raise BundleError(f"{where}: the kernel spills to scratch ({meta.private_segment_fixed_size} bytes per "
                          "work-item); reduce register pressure or set Spec(allow_scratch=True)")


def _check_metadata(meta: _m.KernelMetadata, where: str) -> None:
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


# ---------------------------------------------------------------------------------------------
# The manifest


def check_manifest(m: _m.Manifest) -> None:
    """Every rule a manifest must pass on its own (the JSON Schema covers the shapes of values).

    Raises:
        BundleError: naming the JSON path (``ops[0].specializations[1]...``), op, specialization and target.
    """
    check_namespace(m.namespace, "manifest namespace")
    _count(m.ops, L.MAX_OPS, "ops", "manifest ops")
    if m.references is not None:
        check_relative_path(m.references, "manifest references")
        if m.references_sha256 is not None and not _SHA256.match(m.references_sha256):
            raise _fail("manifest references_sha256", f"expected 64 lowercase hex digits, got {m.references_sha256!r}")
    for key, f in m.offload_bundles.items():
        check_relative_path(f, f"manifest offload_bundles.{key}")
    for f, digest in m.offload_bundles_sha256.items():
        if not _SHA256.match(digest):
            raise _fail(f"manifest offload_bundles_sha256.{f}", f"expected 64 lowercase hex digits, got {digest!r}")
    seen_ops: set[str] = set()
    for i, op in enumerate(m.ops):
        check_name(op.name, f"manifest ops[{i}].name")
        if op.name in seen_ops:
            raise _fail(f"manifest ops[{i}].name", f"op name {op.name!r} is duplicated")
        seen_ops.add(op.name)
        check_op(op, f"manifest ops[{i}] (op {op.name})")
    for op in m.ops:
        if op.backward is not None:
            check_backward(m, op, op.backward)
    check_failures(m)
    check_must_understand(m)


def check_must_understand(m: _m.Manifest) -> None:
    """A manifest that uses a must-understand key says a major version whose readers understand it
    (``docs/bundle-format.md``): a loader of an older major refuses it instead of ignoring the key.

    Raises:
        BundleError: ``then``, ``workspaces`` or ``mutable`` under 1.x, ``zero`` under 1.x or 2.x.
    """
    major = int(m.schema_version.split(".")[0])
    late = [k for k in _m.must_understand(m) if _m.MUST_UNDERSTAND[k] > major]
    if late:
        raise _fail("manifest schema_version",
                    f"expected {_m.version_for(m)} for a bundle that uses {', '.join(late)}, got "
                    f"{m.schema_version!r}: a {major}.x loader would ignore {'that key' if len(late) == 1 else 'those keys'} "
                    "and run the ops wrongly; rebuild the bundle with this flyc-build")


def check_failures(m: _m.Manifest) -> None:
    """``failed`` (a ``--keep-going`` build's kernels that did not build): each names an op of the bundle, a
    specialization name, a target ID and a reason, once per (op, spec, target).

    Raises:
        BundleError: naming the entry.
    """
    _count(m.failed, L.MAX_OPS * L.MAX_SPECIALIZATIONS, "failed kernels", "manifest failed")
    names = {o.name for o in m.ops}
    seen: set[tuple[str, str, str]] = set()
    for i, f in enumerate(m.failed):
        where = f"manifest failed[{i}]"
        if f.op not in names:
            raise _fail(f"{where}.op", f"expected an op of this bundle, got {f.op!r}")
        check_name(f.spec, f"{where}.spec")
        try:
            _targets.parse_target(f.target)
        except BundleError as e:
            raise _fail(f"{where}.target", str(e)) from None
        if not isinstance(f.reason, str) or not f.reason:
            raise _fail(f"{where}.reason", f"expected the build's message, got {f.reason!r}")
        key = (f.op, f.spec, f.target)
        if key in seen:
            raise _fail(where, f"({f.op}, {f.spec}, {f.target}) is listed twice")
        seen.add(key)


def check_backward(m: _m.Manifest, op: _m.Op, b: _m.Backward) -> None:
    """Check an op's :class:`Backward` against the bundle: the backward op exists, each of its inputs is fed
    from a forward input, output or output gradient of the right kind, and gradients go to tensor inputs.

    Raises:
        BundleError: naming the op, the backward op and the argument.
    """
    where = f"op {op.name} backward {b.op}"
    names = [o.name for o in m.ops]
    if b.op not in names:
        raise BundleError(f"{where}: expected an op of this bundle, got {b.op!r}; the bundle has {', '.join(names)}")
    bwd = m.op(b.op)
    # An in-place write overwrites what autograd would save (torch's version counter then refuses the backward),
    # and a gradient through a buffer the kernel overwrites is not the op's derivative: no autograd pairs here.
    for which, o in (("op", op), ("backward op", bwd)):
        if o.mutable:
            raise BundleError(f"{where}: expected ops without in-place inputs, got {which} {o.name} writing "
                              f"{', '.join(o.mutable)} in place; an op that writes an input cannot declare a backward "
                              "(declare the write as an Output to train through it)")
    fwd_kind = {a.name: a.kind for a in op.args} | {o.name: "tensor" for o in op.outputs}
    outs = [o.name for o in op.outputs]
    bwd_kind = {a.name: a.kind for a in bwd.args}
    missing = [a.name for a in bwd.args
               if a.name not in b.inputs and not (a.kind != "tensor" and a.default is not None)]
    if missing:
        raise BundleError(f"{where}: backward inputs {missing} have no source; map each to a forward input or output "
                          f"or to 'grad:<output>' ({', '.join(outs)})")
    for k, src in b.inputs.items():
        if k not in bwd_kind:
            raise BundleError(f"{where}: expected inputs of {b.op} ({', '.join(bwd_kind)}), got {k!r}")
        if src.startswith(_m.GRAD_PREFIX):
            o = src[len(_m.GRAD_PREFIX):]
            if o not in outs:
                raise BundleError(f"{where}: input {k} = {src!r}: expected 'grad:' of an output ({', '.join(outs)})")
            kind = "tensor"
        elif src in fwd_kind:
            kind = fwd_kind[src]
        else:
            raise BundleError(f"{where}: input {k} = {src!r}: expected a forward input or output "
                              f"({', '.join(fwd_kind)}) or 'grad:<output>'")
        if (kind == "tensor") != (bwd_kind[k] == "tensor"):
            raise BundleError(f"{where}: input {k} is a {bwd_kind[k]} but its source {src!r} is a {kind}")
    bwd_outs = [o.name for o in bwd.outputs]
    for x, g in b.grads.items():
        if fwd_kind.get(x) != "tensor" or x in outs:
            raise BundleError(f"{where}: grads: expected a tensor input of {op.name}, got {x!r}")
        if g not in bwd_outs:
            raise BundleError(f"{where}: grads[{x!r}] = {g!r}: expected an output of {b.op} ({', '.join(bwd_outs)})")
    if not b.grads:
        raise BundleError(f"{where}: grads is empty; name the inputs that get gradients")
    # Leading batch dims flow through training: what the forward saw batched, the backward sees batched.
    fwd_batch = {a.name for a in op.args if a.batch} | {o.name for o in op.outputs if o.batch}
    bwd_batch = {a.name for a in bwd.args if a.batch} | {o.name for o in bwd.outputs if o.batch}
    for k, src in b.inputs.items():
        tensor = src[len(_m.GRAD_PREFIX):] if src.startswith(_m.GRAD_PREFIX) else src
        if tensor in fwd_batch and k not in bwd_batch:
            raise BundleError(f"{where}: input {k} = {src!r} comes from a batched tensor of {op.name} (leading batch "
                              f"dimensions), but {b.op}'s {k!r} is not batched; declare it batched too")
    for x, g in b.grads.items():
        if x in fwd_batch and g not in bwd_batch:
            raise BundleError(f"{where}: grads[{x!r}] = {g!r}: {x!r} is batched, so its gradient must be a batched "
                              f"output of {b.op}; declare {g!r} batched too")


def check_batch(args: tuple[_m.Arg, ...] | list[_m.Arg], outputs: tuple[_m.Output, ...] | list[_m.Output],
                where: str) -> None:
    """Leading batch dimensions (:mod:`flyship.bundle.batch`): a batched argument is a tensor of rank >= 1, and a
    batched output's first dimension is a batched input's first, so the call can give it the leading dims back.

    Raises:
        BundleError: naming the argument or output and what to declare instead.
    """
    batched = []
    for i, a in enumerate(args):
        if a.batch and (a.kind != "tensor" or a.rank < 1):
            raise _fail(f"{where}.args[{i}].batch", f"expected a tensor of rank >= 1 for leading batch dimensions, "
                        f"got {a.kind} {a.name!r} of rank {a.rank}; only tensors with a first dimension to flatten "
                        "into can be batched")
        if a.batch:
            batched.append(a.name)
    for i, o in enumerate(outputs):
        if not o.batch:
            continue
        first = _expr.canonical(o.shape[0]) if o.shape else ""
        rows = [f"{n}.shape[0]" for n in batched]
        if first not in rows:
            raise _fail(f"{where}.outputs[{i}].batch", f"expected output {o.name!r}'s first dimension to be a batched "
                        f"input's first ({' or '.join(rows) or 'no input is batched'}), got "
                        f"{first or 'a rank-0 output'!r}; mark the input batched, or the output not batched")


def check_effects(op: _m.Op, where: str) -> None:
    """An op has an effect: a fresh output or an input it writes in place (schema 1.2), or both. The one rule for
    the spec API (flyc-build), the manifest reader and the loader's schema builder."""
    if not op.outputs and not op.mutable:
        raise _fail(f"{where}.outputs", "expected at least one output or one input the kernel writes in place "
                                        "(mutable), got neither; declare Output(...) or Tensor(..., mutable=True)")


def check_op(op: _m.Op, where: str) -> None:
    """One op's rules: names, arguments, outputs, specializations and their variants."""
    if op.frontend not in _m.FRONTENDS:
        raise _fail(f"{where}.frontend", f"expected one of {', '.join(_m.FRONTENDS)}, got {op.frontend!r}")
    if op.reference is not None:
        check_name(op.reference, f"{where}.reference")
    _count(op.args, L.MAX_ARGS, "arguments", f"{where}.args")
    _count(op.outputs, L.MAX_OUTPUTS, "outputs", f"{where}.outputs")
    _count(op.specializations, L.MAX_SPECIALIZATIONS, "specializations", f"{where}.specializations")
    for i, a in enumerate(op.args):
        aw = f"{where}.args[{i}]"
        if a.kind not in ("tensor", *_m.SCALAR_TYPES):
            raise _fail(f"{aw}.kind", f"expected tensor or one of {', '.join(_m.SCALAR_TYPES)}, got {a.kind!r}")
        if a.kind == "tensor":
            if not 0 <= a.rank <= L.MAX_RANK:
                raise _fail(f"{aw}.rank", f"expected a rank in 0..{L.MAX_RANK}, got {a.rank}")
            if a.default is not None:
                raise _fail(f"{aw}.default", f"a tensor argument has no default, got {a.default!r}")
        elif a.rank != 0 or a.dtypes:
            raise _fail(aw, f"a {a.kind} scalar has rank 0 and no dtypes, got rank {a.rank}, dtypes {list(a.dtypes)}")
        for d in a.dtypes:
            if d not in _m.DTYPES:
                raise _fail(f"{aw}.dtypes", f"expected dtype names ({', '.join(_m.DTYPES)}), got {d!r}")
        if a.default is not None:
            check_scalar_value(a.kind, a.default, f"{aw}.default")
        if a.mutable and a.kind != "tensor":
            raise _fail(f"{aw}.mutable", f"only a tensor can be written in place, got a mutable {a.kind} {a.name!r}")
    check_effects(op, where)
    for i, o in enumerate(op.outputs):
        if len(o.shape) > L.MAX_RANK:
            raise _fail(f"{where}.outputs[{i}].shape", f"expected a rank up to {L.MAX_RANK}, got {len(o.shape)}")
    check_names(op, where)
    sl = _m.slots(op)
    inputs = {k: v for k, v in sl.items() if k not in {o.name for o in op.outputs}}
    for i, o in enumerate(op.outputs):
        for j, e in enumerate(o.shape):
            _compile(e, inputs, f"{where}.outputs[{i}].shape[{j}]")
            if _expr.names_device(e):
                raise _fail(f"{where}.outputs[{i}].shape[{j}]", f"expected a shape over the inputs, got {e!r}, "
                            "which reads the device; an output's shape must not depend on which GPU runs the call "
                            "(fake kernels have no device); compute it from the inputs")
    check_batch(op.args, op.outputs, where)
    _count(op.tuning_key, L.MAX_RANK * L.MAX_ARGS, "tuning key expressions", f"{where}.tuning_key")
    for j, e in enumerate(op.tuning_key):
        _compile(e, inputs, f"{where}.tuning_key[{j}]")
    tensor_in = {a.name for a in op.args if a.kind == "tensor"}
    tensors = tensor_in | {o.name for o in op.outputs}
    kinds = {a.name: a.kind for a in op.args}
    seen: set[str] = set()
    for si, s in enumerate(op.specializations):
        sw = f"{where}.specializations[{si}] ({s.name})"
        check_name(s.name, f"{sw}.name")
        if s.name in seen:
            raise _fail(f"{sw}.name", f"specialization name {s.name!r} is duplicated")
        seen.add(s.name)
        for t, d in s.guard.dtypes.items():
            if t not in tensor_in or d not in _m.DTYPES:
                raise _fail(f"{sw}.guard.dtypes", f"guard dtype {t}={d} names no input tensor or no known dtype")
        _count(s.guard.constraints, L.MAX_CONSTRAINTS, "constraints", f"{sw}.guard.constraints")
        for j, c in enumerate(s.guard.constraints):
            _compile(c, sl, f"{sw}.guard.constraints[{j}]")
        for t, a in s.guard.alignment.items():
            if t not in tensors:
                raise _fail(f"{sw}.guard.alignment", f"{t!r} names no tensor of the op")
            if not _is_pow2(a) or a > L.MAX_ALIGNMENT:
                raise _fail(f"{sw}.guard.alignment.{t}", f"expected a power of two up to {L.MAX_ALIGNMENT}, got {a}")
        for t, shape in s.example.shapes.items():
            if len(shape) > L.MAX_RANK or any(d < 0 for d in shape):
                raise _fail(f"{sw}.example.shapes.{t}", f"expected up to {L.MAX_RANK} sizes >= 0, got {list(shape)}")
        if any(g < 0 or g > L.MAX_GRID for g in s.example.grid):
            raise _fail(f"{sw}.example.grid", f"expected 0..{L.MAX_GRID} per dimension, got {list(s.example.grid)}")
        for k, v in s.example.scalars.items():
            if k in kinds and kinds[k] != "tensor":
                check_scalar_value(kinds[k], v, f"{sw}.example.scalars.{k}")
        if not s.variants:
            raise _fail(f"{sw}.variants", "no compiled variants")
        _count(s.variants, L.MAX_VARIANTS, "variants", f"{sw}.variants")
        for vi, v in enumerate(s.variants):
            vw = f"{sw}.variants[{vi}] (target {v.target})"
            check_workspaces(v.workspaces, sl, inputs, vw)
            names = tuple(w.name for w in v.workspaces)
            check_variant(v, sl, vw, names)
            _count(v.launches, L.MAX_LAUNCHES, "launches", f"{vw}.then")
            for k, t in enumerate(v.then):
                tw = f"{vw}.then[{k}]"
                if t.target != v.target:
                    raise _fail(f"{tw}.target", f"a following launch runs on its variant's target {v.target}, got "
                                                f"{t.target!r}")
                if t.then or t.workspaces:
                    raise _fail(tw, "a following launch has no then or workspaces of its own; list every launch of "
                                    "the call in the variant's then, and its workspaces in the variant's")
                check_variant(t, sl, tw, names)
            used = {f.arg for t in v.launches for f in t.kernargs.fields if f.kind == "workspace"}
            unused = [n for n in names if n not in used]
            if unused:
                raise _fail(f"{vw}.workspaces", f"workspaces {unused} are passed to no launch; drop them or bind them "
                                                "to a kernel argument")


def check_workspaces(workspaces: tuple[_m.Workspace, ...], slots: dict[str, _expr.Slot],
                     inputs: dict[str, _expr.Slot], where: str) -> None:
    """A variant's workspaces: identifiers unique among themselves and the op's arguments and outputs, a known
    dtype, a shape of at most ``MAX_RANK`` expressions over the inputs that never read the device (the
    allocation is sized like an output; the loader checks each size is >= 0 and the bytes fit int64 per call)."""
    _count(workspaces, L.MAX_WORKSPACES, "workspaces", f"{where}.workspaces")
    seen: set[str] = set()
    for i, w in enumerate(workspaces):
        ww = f"{where}.workspaces[{i}]"
        check_name(w.name, f"{ww}.name")
        if w.name in slots or w.name in seen or w.name == "device":
            raise _fail(f"{ww}.name", f"workspace name {w.name!r} repeats an argument, output or workspace name")
        seen.add(w.name)
        if w.dtype not in _m.DTYPES:
            raise _fail(f"{ww}.dtype", f"expected a dtype name ({', '.join(_m.DTYPES)}), got {w.dtype!r}")
        if len(w.shape) > L.MAX_RANK:
            raise _fail(f"{ww}.shape", f"expected a rank up to {L.MAX_RANK}, got {len(w.shape)}")
        for j, e in enumerate(w.shape):
            _compile(e, inputs, f"{ww}.shape[{j}]")
            if _expr.names_device(e):
                raise _fail(f"{ww}.shape[{j}]", f"expected a shape over the inputs, got {e!r}, which reads the device")


def check_variant(v: _m.Variant, slots: dict[str, _expr.Slot], where: str, workspaces: tuple[str, ...] = ()) -> None:
    """One launch's rules: its target, code object entry, metadata, kernarg layout and launch (``workspaces``:
    the names its ``workspace`` fields may use)."""
    try:
        tid = _targets.parse_target(v.target)
    except BundleError as e:
        raise _fail(f"{where}.target", str(e)) from None
    co = v.code_object
    if co.format not in _m.CODE_OBJECT_FORMATS:
        raise _fail(f"{where}.code_object.format", f"expected one of {', '.join(_m.CODE_OBJECT_FORMATS)}, "
                                                   f"got {co.format!r}")
    want = "hsaco" if tid.vendor == "amd" else "cubin"
    if co.format != want:
        raise _fail(f"{where}.code_object.format", f"a {tid.vendor} target takes {want} code objects, got {co.format}")
    check_relative_path(co.file, f"{where}.code_object.file")
    if not _SHA256.match(co.sha256):
        raise _fail(f"{where}.code_object.sha256", f"expected 64 lowercase hex digits, got {co.sha256!r}")
    if not co.symbol or len(co.symbol) > L.MAX_STRING:
        raise _fail(f"{where}.code_object.symbol", f"expected a kernel symbol, got {co.symbol!r}")
    _check_metadata(v.metadata, f"{where}.metadata")
    check_fields(v.kernargs, slots, f"{where}.kernargs", workspaces)
    check_layout(v.kernargs, v.metadata, where)
    for j, e in enumerate(v.launch.grid):
        _compile(e, slots, f"{where}.launch.grid[{j}]")
        lit = _literal(e)
        if lit is not None and not 0 <= lit <= L.MAX_GRID:
            raise _fail(f"{where}.launch.grid[{j}]", f"expected a grid dimension in 0..{L.MAX_GRID}, got {lit}")
    _compile(v.launch.dynamic_lds, slots, f"{where}.launch.dynamic_lds")
    lit = _literal(v.launch.dynamic_lds)
    if lit is not None and not 0 <= lit <= L.MAX_RESOURCE:
        raise _fail(f"{where}.launch.dynamic_lds", f"expected 0..{L.MAX_RESOURCE} bytes, got {lit}")
    check_block(v.launch.block, f"{where}.launch.block")
    check_resources(v.metadata, v.launch.block, v.target, where)


# ---------------------------------------------------------------------------------------------
# Files


def check_relative_path(rel: str, where: str) -> None:
    """A path the manifest names: relative, inside the bundle lexically (no ``..``, no drive, no NUL)."""
    p = Path(rel)
    if (not rel or "\x00" in rel or "\\" in rel or p.is_absolute() or ".." in p.parts or len(rel) > L.MAX_STRING
            or p.drive):
        raise _fail(where, f"expected a path inside the bundle, got {rel[:80]!r}")


def contained_path(root: Path, rel: str, where: str) -> Path:
    """``root / rel`` resolved (links followed), refused unless it stays inside the resolved ``root``."""
    check_relative_path(rel, where)
    base = Path(root).resolve()
    try:
        path = (base / rel).resolve()
    except (OSError, RuntimeError):  # a symlink loop: RuntimeError before Python 3.13, OSError (ELOOP) since
        raise _fail(where, f"expected a file inside the bundle at {base / rel}, found "
                           f"{_files.found_at(base / rel)}; re-copy the bundle without links") from None
    if path != base and base not in path.parents:
        raise _fail(where, f"expected a file inside the bundle {base}, but {rel!r} resolves to {path} (a link "
                           "leads out); re-copy the bundle without links")
    return path


def read_bundle_file(root: Path, rel: str, sha256: Optional[str], limit: int, where: str,
                     what: str = "file") -> bytes:
    """A file the manifest names (``what``: "code object", "references module"...): contained in the
    bundle, a regular file of at most ``limit`` bytes (checked before reading), whose sha256 is the
    manifest's (``None``: not checked, for 1.0 bundles).

    Raises:
        BundleError: escape, missing file, oversize file, digest mismatch.
    """
    path = contained_path(root, rel, where)
    if not path.is_file():
        raise _fail(where, f"expected the {what} at {path}, found {_files.found_at(path)}; the bundle is incomplete, "
                           "rebuild or re-copy it")
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size > limit:
                raise _fail(where, f"expected at most {limit} bytes in {path}, the file has {size}; the bundle is "
                                   "damaged or not a flyship bundle")
            data = fh.read(limit + 1)
    except OSError as e:
        raise _fail(where, f"cannot read {path}: {e}") from None
    if len(data) > limit:
        raise _fail(where, f"expected at most {limit} bytes in {path}, it grew while being read")
    if sha256 is not None:
        digest = hashlib.sha256(data).hexdigest()
        if digest != sha256:
            raise _fail(where, f"sha256 mismatch: the manifest says {sha256}, the file has {digest}; the file "
                               "was changed after the build, rebuild the bundle")
    return data


# ---------------------------------------------------------------------------------------------
# Code objects against the manifest

# What a malformed ELF can make pyelftools, msgpack and our readers raise (bit flips turn offsets,
# sizes, string tables and msgpack maps into anything). Caught only around reading a file's facts.
_READ_ERRORS: tuple[type[BaseException], ...] = (
    ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError, struct.error, UnicodeError,
    RecursionError, MemoryError, EOFError, AssertionError,
)


def _elf_errors() -> tuple[type[BaseException], ...]:
    from elftools.common.exceptions import ELFError
    from msgpack import UnpackException

    errs: list[type[BaseException]] = [ELFError, UnpackException]
    try:
        from elftools.construct.core import ConstructError  # pyelftools' vendored construct
        errs.append(ConstructError)
    except ImportError:  # pragma: no cover - layout of other pyelftools versions
        pass
    return tuple(errs) + _READ_ERRORS


def read_facts(fmt: str, data: bytes, symbol: str, where: str) -> tuple[_m.KernelMetadata, str]:
    """The kernel's metadata and the file's target ID as the code object itself states them.

    Every failure to read a damaged file is a :class:`CodeObjectError` naming ``where``; nothing a
    truncated or bit-flipped ELF makes the parsers raise escapes.
    """
    try:
        if fmt == "hsaco":
            from flyship.bundle.codeobject import CodeObjectFile

            co = CodeObjectFile(data, where)
            co.kernel(symbol)
            co.get_symbol(symbol + ".kd")
            meta = co.kernel_metadata(symbol)
            target = co.target
        elif fmt == "cubin":
            from flyship.bundle.cubin import CubinFile

            cubin = CubinFile(data, where)
            kernels = cubin.kernel_names()
            if symbol not in kernels:
                raise CodeObjectError(f"{where}: the cubin defines no kernel {symbol!r}; it has {kernels}")
            meta = cubin.kernel_metadata(symbol)
            target = cubin.target
        else:
            raise CodeObjectError(f"{where}: expected code object format 'hsaco' or 'cubin', got {fmt!r}")
        _check_metadata(meta, f"{where} metadata")
        if target:
            target = _targets.parse_target(target).text
    except CodeObjectError as e:
        raise CodeObjectError(f"{where}: {e}; the code object is damaged or is not the one the manifest names, "
                              "rebuild the bundle") from None
    except BundleError as e:
        raise CodeObjectError(f"{where}: {e}; rebuild the bundle") from None
    except _elf_errors() as e:
        raise CodeObjectError(f"{where}: the code object is damaged ({type(e).__name__}: {str(e)[:200]}); rebuild "
                              "or re-copy the bundle") from None
    return meta, target


def _explicit(meta: _m.KernelMetadata) -> list[tuple[int, int, str]]:
    return [(a.offset, a.size, a.value_kind) for a in meta.args if not a.hidden]


def check_code_object(v: _m.Variant, data: bytes, where: str) -> None:
    """A code object's own facts against its variant: the kernel and (AMDGPU) its descriptor exist; the
    file's target is the variant's (for a cubin, the same SM: one built arch-specific, ``sm_90a``, may be
    recorded as ``sm_90``); kernarg segment, explicit arguments (AMDGPU: offset, size, kind; cubin: offset,
    size), static LDS, scratch and register counts (AMDGPU ``.vgpr_count`` / ``.agpr_count`` / ``.sgpr_count``;
    cubin: registers per thread) are the manifest's (``flyship inspect`` and the occupancy figures show the
    manifest's, so a tampered or mixed manifest must not pass); the layout tiles the *file's* arguments; the
    launch fits the file's required and maximum workgroup size and the target's LDS.

    Raises:
        CodeObjectError: the first disagreement, naming both values.
    """
    fmt = v.code_object.format
    meta, file_target = read_facts(fmt, data, v.code_object.symbol, where)
    man = v.metadata
    if fmt == "hsaco":
        if file_target and _targets.parse_target(file_target) != _targets.parse_target(v.target):
            raise CodeObjectError(f"{where}: the code object is built for {file_target}, the manifest says "
                                  f"{v.target}; rebuild the bundle")
        compared = ("kernarg_segment_size", "group_segment_fixed_size", "private_segment_fixed_size", "wavefront_size",
                    "vgpr_count", "agpr_count", "sgpr_count")
        if _explicit(meta) != _explicit(man):
            raise CodeObjectError(f"{where}: explicit kernel arguments (offset, size, kind) differ: code object "
                                  f"{_explicit(meta)}, manifest {_explicit(man)}; rebuild the bundle")
    else:
        if _targets.parse_target(file_target).sm != _targets.parse_target(v.target).sm:
            raise CodeObjectError(f"{where}: the cubin is built for {file_target}, the manifest says {v.target}; "
                                  "rebuild the bundle")
        compared = ("kernarg_segment_size", "group_segment_fixed_size", "private_segment_fixed_size", "vgpr_count")
        file_args = [(a.offset, a.size) for a in meta.args]
        man_args = [(a.offset, a.size) for a in man.args if not a.hidden]
        if file_args != man_args:
            raise CodeObjectError(f"{where}: kernel parameters (offset, size) differ: cubin {file_args}, manifest "
                                  f"{man_args}; rebuild the bundle")
    for name in compared:
        a, b = getattr(meta, name), getattr(man, name)
        if a != b:
            raise CodeObjectError(f"{where}: {name} is {a} in the code object, {b} in the manifest (the manifest was "
                                  "edited, or mixed with another build's code objects); rebuild the bundle")
    try:
        if fmt == "hsaco":
            check_layout(v.kernargs, meta, where)
        check_resources(meta, v.launch.block, v.target, where)
    except CodeObjectError:
        raise
    except BundleError as e:
        raise CodeObjectError(str(e)) from None


def iter_variants(m: _m.Manifest) -> Iterator[tuple[str, _m.Variant]]:
    """``(where, variant)`` for every variant, ``where`` naming op, specialization, target and file."""
    for op in m.ops:
        for s in op.specializations:
            for v in s.variants:
                yield f"op {op.name} specialization {s.name} target {v.target} ({v.code_object.file})", v
                for k, t in enumerate(v.then):  # the core numbers following launches right after their variant
                    yield (f"op {op.name} specialization {s.name} target {v.target} launch {k + 2} "
                           f"({t.code_object.file})"), t


def check_variant_file(root: Path, v: _m.Variant, where: str, data: Optional[bytes] = None) -> bytes:
    """Read (unless ``data``, bytes already read and sha256 checked for the same file, is given) and check one
    variant's code object: contained, bounded, sha256 checked, and its facts against the variant
    (:func:`check_code_object`). The loader calls it when a variant is first selected or preloaded, so a
    load costs nothing per variant and no byte reaches a driver unchecked.

    Returns:
        The code object's bytes.

    Raises:
        BundleError: see :func:`read_bundle_file` and :func:`check_code_object`.
    """
    if data is None:
        data = read_bundle_file(root, v.code_object.file, v.code_object.sha256, L.MAX_CODE_OBJECT_BYTES, where,
                                "code object")
    check_code_object(v, data, where)
    return data


def check_bundle_files(root: Path, m: _m.Manifest) -> dict[str, bytes]:
    """Read and check the code objects (against their variants) and offload bundles a manifest names:
    contained, bounded, sha256 checked. The references module is checked when it is imported
    (:func:`references_source`), so the bytes checked are the bytes run.

    Returns:
        code-object file (as in the manifest) -> bytes.

    Raises:
        BundleError: see :func:`read_bundle_file` and :func:`check_code_object`.
    """
    images: dict[str, bytes] = {}
    for where, v in iter_variants(m):
        images[v.code_object.file] = check_variant_file(root, v, where, images.get(v.code_object.file))
    for key, f in m.offload_bundles.items():
        read_bundle_file(root, f, m.offload_bundles_sha256.get(f), L.MAX_CODE_OBJECT_BYTES,
                         f"offload bundle {key} ({f})", "offload bundle")
    return images


def check_bundle(root: Path, m: _m.Manifest) -> dict[str, bytes]:
    """Every file a manifest names, as a load would find it: :func:`check_bundle_files` and the references module
    (:func:`references_source`). What ``flyship list``, ``flyship pack`` and ``flyc-build`` run before they
    vouch for a bundle.

    Returns:
        code-object file (as in the manifest) -> bytes.

    Raises:
        BundleError: see :func:`check_bundle_files` and :func:`references_source`.
    """
    images = check_bundle_files(root, m)
    if m.references:
        references_source(root, m)
    return images


def references_source(root: Path, m: _m.Manifest) -> bytes:
    """The bytes of the references module, contained, bounded and checked against ``references_sha256``.

    Raises:
        BundleError: escape, missing file, oversize, digest mismatch.
    """
    assert m.references
    if m.references_sha256 is None:
        warnings.warn(f"bundle {root}: the manifest (schema {m.schema_version}) records no sha256 for "
                      f"{m.references}, so a change to it goes unnoticed; rebuild the bundle with flyc-build",
                      stacklevel=3)
    return read_bundle_file(root, m.references, m.references_sha256, L.MAX_REFERENCES_BYTES,
                            f"load bundle {root}: references {m.references!r}", "references module")
