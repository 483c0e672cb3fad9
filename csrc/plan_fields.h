// GENERATED from bundle/plan_contract.py by `python scripts/limits_header.py --write`: do not edit.
// The plan's keys, one X-macro list per struct: X(struct, member, "key", C++ type, reader, default).
// csrc/plan.h declares the members from them, csrc/plan.cpp expands the reads; a test keeps this file
// equal to the generator's output and compares the extension's PLAN_FIELDS with the Python table.
#pragma once

#define FLYSHIP_PLAN_STRUCTS(X) X(Bundle) X(OpPlan) X(Slot) X(OutputPlan) X(SpecPlan) X(VariantPlan) X(Field) X(WorkspacePlan)

#define FLYSHIP_PLAN_FIELDS_Bundle(X) \
  X(Bundle, version, "version", int, int, ) \
  X(Bundle, namespace, "namespace", std::string, str, ) \
  X(Bundle, ops, "ops", py::list, custom, ) \
  X(Bundle, references, "references", py::list, custom, ) \
  X(Bundle, specs, "specs", py::object, custom, ) \
  X(Bundle, blame, "blame", py::object, custom, ) \
  X(Bundle, code_object, "code_object", py::object, custom, )

#define FLYSHIP_PLAN_FIELDS_OpPlan(X) \
  X(OpPlan, name, "name", std::string, str, ) \
  X(OpPlan, qualname, "qualname", std::string, str, ) \
  X(OpPlan, slots, "slots", Slots, custom, ) \
  X(OpPlan, n_inputs, "n_inputs", int, int, ) \
  X(OpPlan, outputs, "outputs", OutputPlans, custom, ) \
  X(OpPlan, spec_variants, "spec_variants", std::vector<int>, ints, ) \
  X(OpPlan, n_code_objects, "n_code_objects", int, int, ) \
  X(OpPlan, mutable_hint, "mutable_hint", std::string, str, )

#define FLYSHIP_PLAN_FIELDS_Slot(X) \
  X(Slot, name, "name", std::string, str, ) \
  X(Slot, kind, "kind", int, arg_kind, kTensor) \
  X(Slot, rank, "rank", int, int, ) \
  X(Slot, batch, "batch", bool, bool, ) \
  X(Slot, is_mutable, "mutable", bool, bool, )

#define FLYSHIP_PLAN_FIELDS_OutputPlan(X) \
  X(OutputPlan, name, "name", std::string, str, ) \
  X(OutputPlan, dtype_slot, "dtype_slot", int, int, -1) \
  X(OutputPlan, dtype, "dtype", at::ScalarType, custom, at::kFloat) \
  X(OutputPlan, shape, "shape", Programs, custom, ) \
  X(OutputPlan, zero, "zero", bool, bool, )

#define FLYSHIP_PLAN_FIELDS_SpecPlan(X) \
  X(SpecPlan, name, "name", std::string, str, ) \
  X(SpecPlan, dtypes, "dtypes", DtypeGuards, custom, ) \
  X(SpecPlan, alignment, "alignment", AlignmentGuards, custom, ) \
  X(SpecPlan, constraints, "constraints", Programs, custom, ) \
  X(SpecPlan, out_constraints, "out_constraints", Programs, custom, ) \
  X(SpecPlan, variants, "variants", VariantPlans, custom, )

#define FLYSHIP_PLAN_FIELDS_VariantPlan(X) \
  X(VariantPlan, target, "target", std::string, str, ) \
  X(VariantPlan, format, "format", std::string, str, ) \
  X(VariantPlan, file, "file", std::string, str, ) \
  X(VariantPlan, symbol, "symbol", std::string, str, ) \
  X(VariantPlan, sha256, "sha256", std::string, str, ) \
  X(VariantPlan, code_object_version, "code_object_version", int, int, ) \
  X(VariantPlan, kernarg_size, "kernarg_size", int64_t, i64, ) \
  X(VariantPlan, kernarg_align, "kernarg_align", int64_t, i64, 8) \
  X(VariantPlan, static_lds, "static_lds", int64_t, i64, ) \
  X(VariantPlan, fields, "fields", Fields, custom, ) \
  X(VariantPlan, programs, "programs", Programs, custom, ) \
  X(VariantPlan, grid, "grid", Int3, custom, -1, -1, -1) \
  X(VariantPlan, dynamic_lds, "dynamic_lds", int, int, -1) \
  X(VariantPlan, block, "block", U32x3, custom, 1, 1, 1) \
  X(VariantPlan, then, "then", VariantPlans, custom, ) \
  X(VariantPlan, workspaces, "workspaces", WorkspacePlans, custom, )

#define FLYSHIP_PLAN_FIELDS_Field(X) \
  X(Field, kind, "kind", int, field_kind, kNull) \
  X(Field, type, "type", int, field_type, kPtr) \
  X(Field, offset, "offset", int64_t, i64, ) \
  X(Field, slot, "slot", int, int, -1) \
  X(Field, dim, "dim", int, int, -1) \
  X(Field, program, "program", int, int, -1) \
  X(Field, constant, "constant", Bytes8, custom, ) \
  X(Field, bytes_per_program, "bytes_per_program", int64_t, i64, ) \
  X(Field, align, "align", int64_t, i64, ) \
  X(Field, label, "label", std::string, str, )

#define FLYSHIP_PLAN_FIELDS_WorkspacePlan(X) \
  X(WorkspacePlan, name, "name", std::string, str, ) \
  X(WorkspacePlan, dtype, "dtype", at::ScalarType, dtype, at::kFloat) \
  X(WorkspacePlan, zero, "zero", bool, bool, ) \
  X(WorkspacePlan, shape, "shape", Programs, custom, )
