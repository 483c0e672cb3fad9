"""Rules on the kernarg layout: each field's own rules, and the fields against the code object's metadata."""

from __future__ import annotations

import struct

from flyship.bundle import expr as _expr
from flyship.bundle import limits as L
from flyship.bundle import model as _m
from flyship.bundle.errors import BundleError
from flyship.bundle.rules.common import count as _count
from flyship.bundle.rules.common import fail as _fail
from flyship.bundle.rules.common import is_pow2 as _is_pow2
from flyship.bundle.rules.expressions import check_expression

_INT_TYPES = {"i64": (L.INT64_MIN, L.INT64_MAX), "u64": (0, (1 << 64) - 1), "i32": (-(1 << 31), (1 << 31) - 1),
              "u32": (0, (1 << 32) - 1), "i16": (-(1 << 15), (1 << 15) - 1), "i8": (-(1 << 7), (1 << 7) - 1)}
_FLOAT_TYPES = ("f64", "f32", "f16", "bf16")
# The struct format a float constant is packed with (bf16 through its float32 bits, as the loader packs it).
_FLOAT_FORMATS = {"f64": "<d", "f32": "<f", "f16": "<e", "bf16": "<f"}
# Field kinds -> the kernarg types they may have, and whether they name a tensor / a scalar argument.
_POINTER_KINDS = ("pointer", "null", "scratch", "workspace")
_TENSOR_KINDS = ("pointer", "shape", "stride")


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
    if not _is_pow2(layout.alignment) or layout.alignment > L.KERNARG_BUFFER_ALIGNMENT:
        raise _fail(f"{where}.alignment", f"expected a power of two up to {L.KERNARG_BUFFER_ALIGNMENT} (the loader's "
                                          f"kernarg buffer alignment), got {layout.alignment}")
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
            check_expression(f.expr or "", slots, f"{fw}.expr")
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
        try:
            struct.pack(_FLOAT_FORMATS[f.type], float(v))
        except OverflowError:
            raise _fail(f"{fw}.value", f"expected a number that fits {f.type}, got {v!r}, which is out of its "
                                       "range") from None
    else:
        raise _fail(f"{fw}.type", f"a constant of type {f.type!r}; expected an integer or float type")
