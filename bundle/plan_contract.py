"""The plan contract: every key of the plan that Python lowers (:mod:`flyship.loader.plan`) and the C++ core parses
(``csrc/plan.cpp``), declared once.

Each :class:`PlanField` row names a key of one plan dict, the C++ struct member it fills, how the core reads it
(``reader``) and, when the value is a plain copy of a manifest attribute, where the lowering finds it (``source``, a
dotted path on the manifest object the dict is lowered from). ``csrc/plan_fields.h`` is generated from this table
(``python scripts/limits_header.py --write``): one X-macro list per struct, from which ``csrc/plan.h`` declares the
members and ``csrc/plan.cpp`` expands the reads of every key with a plain reader; keys with the ``custom`` reader
(lists of nested dicts, programs, pairs) are declared here and read by hand there. The lowering builds each dict by
this table (:func:`flyship.loader.plan.lower_by_contract`), so a key it lacks or adds is an error, and the extension
exports the list it was compiled with (``PLAN_FIELDS``), which a test compares with :data:`FIELDS`.

Adding a key that the C++ path reads: a row here (with ``source`` when it copies a manifest attribute), the
C++ code that uses the member, and the manifest field in :mod:`flyship.bundle.model` when it is new; then
``scripts/limits_header.py --write`` and a bump of :data:`flyship.bundle.limits.PLAN_VERSION`.
"""

from __future__ import annotations

from typing import Any, Optional

from flyship.bundle.frozen import frozen

# reader -> the C++ type of the member it fills. "custom" rows give their own type (a type name plan.h defines).
READERS: dict[str, str] = {
    "str": "std::string",
    "int": "int",
    "i64": "int64_t",
    "bool": "bool",
    "ints": "std::vector<int>",  # a list of ints
    "arg_kind": "int",  # a name of kArgKindName, stored as its code
    "field_kind": "int",  # a name of kFieldKindName
    "field_type": "int",  # a name of kTypeName
    "dtype": "at::ScalarType",  # a dtype as the manifest spells it ("float32")
    "custom": "",  # read by hand in csrc/plan.cpp (nested dicts, programs, pairs)
}
STRUCTS = ("Bundle", "OpPlan", "Slot", "OutputPlan", "SpecPlan", "VariantPlan", "Field", "WorkspacePlan")
"""The plan's dicts, outermost first; "Bundle" (the plan handed to ``_C.Bundle``) is read by ``BundleCore``, which is
no plain struct: its rows are keys only (no members are generated for it)."""


@frozen
class PlanField:
    """One key of one plan dict.

    Attributes:
        struct: the C++ struct it fills (one of :data:`STRUCTS`).
        key: the dict key.
        reader: how the core reads it (a key of :data:`READERS`).
        member: the C++ member's name (default: the key).
        cxx_type: the member's C++ type for a ``custom`` reader (a single token: plan.h defines the aliases).
        default: the member's C++ initializer (brace contents), for structs made before they are parsed.
        source: a dotted attribute path on the manifest object the dict is lowered from, when the value is a plain
            copy of it (None: the lowering computes it).
        none_as: what the plan carries when the ``source`` attribute is None (an optional manifest key).
    """

    struct: str
    key: str
    reader: str
    member: str = ""
    cxx_type: str = ""
    default: str = ""
    source: Optional[str] = None
    none_as: Any = None

    @property
    def cxx_member(self) -> str:
        return self.member or self.key

    @property
    def cxx(self) -> str:
        return self.cxx_type or READERS[self.reader]


F = PlanField
FIELDS: tuple[PlanField, ...] = (
    # The plan handed to _C.Bundle (loader/plan.py lower_bundle; csrc/bundle.h BundleCore).
    F("Bundle", "version", "int"),
    F("Bundle", "namespace", "str"),
    F("Bundle", "ops", "custom", cxx_type="py::list"),
    F("Bundle", "references", "custom", cxx_type="py::list"),
    F("Bundle", "specs", "custom", cxx_type="py::object"),
    F("Bundle", "blame", "custom", cxx_type="py::object"),
    F("Bundle", "code_object", "custom", cxx_type="py::object"),
    # One op's head, read at load (lower_op; parse_op).
    F("OpPlan", "name", "str", source="name"),
    F("OpPlan", "qualname", "str"),
    F("OpPlan", "slots", "custom", cxx_type="Slots"),
    F("OpPlan", "n_inputs", "int"),
    F("OpPlan", "outputs", "custom", cxx_type="OutputPlans"),
    F("OpPlan", "spec_variants", "ints"),
    F("OpPlan", "n_code_objects", "int"),
    F("OpPlan", "mutable_hint", "str"),
    F("Slot", "name", "str"),
    F("Slot", "kind", "arg_kind", default="kTensor"),
    F("Slot", "rank", "int"),
    F("Slot", "batch", "bool"),
    F("Slot", "mutable", "bool", member="is_mutable"),
    F("OutputPlan", "name", "str", source="name"),
    F("OutputPlan", "dtype_slot", "int", default="-1"),
    F("OutputPlan", "dtype", "custom", cxx_type="at::ScalarType", default="at::kFloat"),  # only when dtype_slot < 0
    F("OutputPlan", "shape", "custom", cxx_type="Programs"),
    F("OutputPlan", "zero", "bool", source="zero"),
    # One op's specializations, read on its first use (lower_specs; parse_specs).
    F("SpecPlan", "name", "str", source="name"),
    F("SpecPlan", "dtypes", "custom", cxx_type="DtypeGuards"),
    F("SpecPlan", "alignment", "custom", cxx_type="AlignmentGuards"),
    F("SpecPlan", "constraints", "custom", cxx_type="Programs"),
    F("SpecPlan", "out_constraints", "custom", cxx_type="Programs"),
    F("SpecPlan", "variants", "custom", cxx_type="VariantPlans"),
    F("VariantPlan", "target", "str", source="target"),
    F("VariantPlan", "format", "str", source="code_object.format"),
    F("VariantPlan", "file", "str", source="code_object.file"),
    F("VariantPlan", "symbol", "str", source="code_object.symbol"),
    F("VariantPlan", "sha256", "str", source="code_object.sha256"),
    F("VariantPlan", "code_object_version", "int", source="code_object.code_object_version", none_as=0),  # 0: cubin
    F("VariantPlan", "kernarg_size", "i64", source="kernargs.size"),
    F("VariantPlan", "kernarg_align", "i64", default="8", source="kernargs.alignment"),
    F("VariantPlan", "static_lds", "i64", source="metadata.group_segment_fixed_size"),
    F("VariantPlan", "fields", "custom", cxx_type="Fields"),
    F("VariantPlan", "programs", "custom", cxx_type="Programs"),
    F("VariantPlan", "grid", "custom", cxx_type="Int3", default="-1, -1, -1"),
    F("VariantPlan", "dynamic_lds", "int", default="-1"),
    F("VariantPlan", "block", "custom", cxx_type="U32x3", default="1, 1, 1", source="launch.block"),
    F("VariantPlan", "then", "custom", cxx_type="VariantPlans"),
    F("VariantPlan", "workspaces", "custom", cxx_type="WorkspacePlans"),
    F("Field", "kind", "field_kind", default="kNull", source="kind"),
    F("Field", "type", "field_type", default="kPtr", source="type"),
    F("Field", "offset", "i64", source="offset"),
    F("Field", "slot", "int", default="-1"),
    F("Field", "dim", "int", default="-1"),
    F("Field", "program", "int", default="-1"),
    F("Field", "constant", "custom", cxx_type="Bytes8"),  # little-endian bytes, as an int64
    F("Field", "bytes_per_program", "i64"),
    F("Field", "align", "i64"),
    F("Field", "label", "str"),
    F("WorkspacePlan", "name", "str", source="name"),
    F("WorkspacePlan", "dtype", "dtype", default="at::kFloat", source="dtype"),
    F("WorkspacePlan", "zero", "bool", source="zero"),
    F("WorkspacePlan", "shape", "custom", cxx_type="Programs"),
)
del F

HEADER = "plan_fields.h"
"""The generated header's name in csrc/."""


def fields_of(struct: str) -> tuple[PlanField, ...]:
    """The rows of one struct, in table order (the order the lowering writes and the core reads the keys)."""
    return tuple(f for f in FIELDS if f.struct == struct)


def as_rows() -> list[tuple[str, str, str, str]]:
    """(struct, key, reader, C++ type) of every row: what the extension exports as ``PLAN_FIELDS``."""
    return [(f.struct, f.key, f.reader, f.cxx) for f in FIELDS]


def source_value(obj: Any, f: PlanField) -> Any:
    """The value of ``f`` copied from ``obj`` (its dotted ``source`` path), as the plan carries it: tuples become
    lists, None becomes ``f.none_as``."""
    for part in (f.source or "").split("."):
        obj = getattr(obj, part)
    if obj is None:
        return f.none_as
    return list(obj) if isinstance(obj, tuple) else obj


def cxx_header() -> str:
    """The text of csrc/plan_fields.h: one X-macro list per struct, generated from :data:`FIELDS`."""
    lines = ["// GENERATED from bundle/plan_contract.py by `python scripts/limits_header.py --write`: do not edit.",
             "// The plan's keys, one X-macro list per struct: X(struct, member, \"key\", C++ type, reader, default).",
             "// csrc/plan.h declares the members from them, csrc/plan.cpp expands the reads; a test keeps this file",
             "// equal to the generator's output and compares the extension's PLAN_FIELDS with the Python table.",
             "#pragma once", "",
             "#define FLYSHIP_PLAN_STRUCTS(X) " + " ".join(f"X({s})" for s in STRUCTS), ""]
    for struct in STRUCTS:
        rows = fields_of(struct)
        lines.append(f"#define FLYSHIP_PLAN_FIELDS_{struct}(X) \\")
        for k, f in enumerate(rows):
            end = " \\" if k < len(rows) - 1 else ""
            lines.append(f'  X({struct}, {f.cxx_member}, "{f.key}", {f.cxx}, {f.reader}, {f.default}){end}')
        lines.append("")
    return "\n".join(lines)

