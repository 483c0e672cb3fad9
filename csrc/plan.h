// The plan: what Python (flyship/loader/plan.py) lowered from the manifest, as the core reads it: each op's
// head at load (parse_op), its specializations on the op's first use (parse_specs). docs/loader.md documents
// each field.
#pragma once

// Plain pybind11 (no torch type casters: the plan holds only ints, strings, lists and dicts) and c10's dtype; the
// units that convert tensors through pybind11 include torch/csrc/utils/pybind.h themselves (docs/perf.md: the
// extension's cold build, cut by unit). pybind11/stl.h is needed for plan_value<std::vector<...>>: without it a
// translation unit of plain units only instantiates pybind11's generic caster for std::vector, which fails at run
// time ("out of range for a list of ints") and breaks the one-definition rule against the bridge units' copy.
#include <c10/core/ScalarType.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "check.h"
#include "expr.h"
#include "limits.h"  // generated from bundle/limits.py: kPlanVersion, kMaxSlots, kMaxLaunches, ...
#include "plan_fields.h"  // generated from bundle/plan_contract.py: the plan's keys per struct

namespace flyship {

namespace py = pybind11;

// Kernarg buffers up to this size live on the stack; bigger ones on the heap.
constexpr size_t kInlineKernargBytes = 1024;

// The plan names argument kinds, kernarg field kinds and field types as the manifest does ("tensor",
// "pointer", "i32"); parse_op maps each name once through these tables, the only place their codes exist.
// bindings.cpp exports them as PLAN_TABLES, and tests compare them with flyship.bundle's.
enum ArgKind : int { kTensor, kInt, kFloat, kBool, kArgKindCount };
constexpr const char* kArgKindName[kArgKindCount] = {"tensor", "int", "float", "bool"};
enum FieldKind : int {
  kPointer, kShape, kStride, kScalar, kExpr, kConstant, kNull, kScratch, kWorkspace, kFieldKindCount
};
constexpr const char* kFieldKindName[kFieldKindCount] = {"pointer", "shape", "stride", "scalar",   "expr",
                                                         "constant", "null", "scratch", "workspace"};
enum FieldType : int { kPtr, kI64, kU64, kI32, kU32, kI16, kI8, kF64, kF32, kF16, kBF16, kFieldTypeCount };
constexpr const char* kTypeName[kFieldTypeCount] = {"ptr", "i64", "u64", "i32", "u32", "i16",
                                                    "i8",  "f64", "f32", "f16", "bf16"};
constexpr int kTypeSize[kFieldTypeCount] = {8, 8, 8, 4, 4, 2, 1, 8, 4, 2, 2};

// The plan's structs. Their plan members are declared by the contract (plan_fields.h, generated from
// bundle/plan_contract.py: key, C++ type, reader, initializer); the members below each list are the core's own,
// derived at parse or filled later.
#define FLYSHIP_PLAN_MEMBER(S, member, key, T, R, ...) T member{__VA_ARGS__};

struct Slot {
  FLYSHIP_PLAN_FIELDS_Slot(FLYSHIP_PLAN_MEMBER)
  // rank: the kernel's rank (a batched tensor may have more: leading batch dims, batch.cpp); is_mutable: an input
  // tensor the kernel writes in place (manifest 1.2 args[].mutable).
};
using Slots = std::vector<Slot>;
using Programs = std::vector<Program>;

struct OutputPlan {
  // dtype_slot: an input tensor whose dtype the output takes, or -1 (then dtype is the fixed one); shape: one
  // program per dimension, over the inputs; zero: allocated zero-filled, an out= tensor zero-filled before the
  // launch (manifest 1.3 zero).
  FLYSHIP_PLAN_FIELDS_OutputPlan(FLYSHIP_PLAN_MEMBER)
};
using OutputPlans = std::vector<OutputPlan>;

using Bytes8 = std::array<uint8_t, 8>;
struct Field {
  FLYSHIP_PLAN_FIELDS_Field(FLYSHIP_PLAN_MEMBER)
};
using Fields = std::vector<Field>;

// Device memory a multi-launch variant allocates per call, before its first launch (manifest Workspace).
struct WorkspacePlan {
  FLYSHIP_PLAN_FIELDS_WorkspacePlan(FLYSHIP_PLAN_MEMBER)  // shape: one program per dimension, over the inputs
};
using WorkspacePlans = std::vector<WorkspacePlan>;

using Int3 = std::array<int, 3>;
using U32x3 = std::array<uint32_t, 3>;
struct VariantPlan;
using VariantPlans = std::vector<VariantPlan>;
struct VariantPlan {
  // programs: referenced by fields (expr), grid and dynamic_lds; then: the launches after this one, in order
  // (schema 1.2), none of their own; workspaces: allocated before the first launch, kWorkspace fields index them.
  FLYSHIP_PLAN_FIELDS_VariantPlan(FLYSHIP_PLAN_MEMBER)
  int id = -1;  // index among all variants of the bundle
  std::string label;  // "add.f32.gfx942.hsaco (kernel add_kernel, built for gfx942)"
};

using DtypeGuards = std::vector<std::pair<int, at::ScalarType>>;
using AlignmentGuards = std::vector<std::pair<int, int64_t>>;
struct SpecPlan {
  // out_constraints: layout checks on out= tensors (fresh outputs meet them).
  FLYSHIP_PLAN_FIELDS_SpecPlan(FLYSHIP_PLAN_MEMBER)
};

struct OpPlan {
  // slots: inputs, then outputs; spec_variants: from the head, variants per specialization (the specs themselves
  // load later); n_code_objects: its variants and their following launches (each has a variant id);
  // mutable_hint: what the reference of an op with inputs written in place must do, for the message refusing one
  // that did not ("" for other ops); its one owner is flyship/loader/cpu.py mutable_hint, the text travels in
  // the plan.
  FLYSHIP_PLAN_FIELDS_OpPlan(FLYSHIP_PLAN_MEMBER)
  int first_variant = 0;  // bundle-wide id of the op's first variant (ids number variants in manifest order)
  // Filled on the op's first use (OpState::ensure_specs); read only after it.
  std::vector<SpecPlan> specs;
  bool guard_uses_outputs = false;  // a guard reads an output: allocate outputs before choosing
  bool has_mutable = false;  // some input is written in place (Tensor(a!) in the functional schema)
  std::vector<int> batch_inputs;  // slots of the batched input tensors (leading batch dims), in order
  std::vector<int> batch_outputs;  // slots of the batched outputs
};
#undef FLYSHIP_PLAN_MEMBER

// Read one program of the plan ({"text", "code"}), mapping mnemonics to opcodes and validating it.
Program parse_program(const py::handle& h, const std::vector<SlotShape>& shapes, const std::string& where);

// Read one op's head (slots, outputs, variants per specialization), checking every index and code in it
// (FLYSHIP_PLAN_CHECK).
OpPlan parse_op(const py::dict& d);

// Read one op's specializations (the list the bundle's `specs` callable returns for it), checking each against
// the head `op`; *guard_uses_outputs says whether a guard reads an output.
std::vector<SpecPlan> parse_specs(const py::list& specs, const OpPlan& op, bool* guard_uses_outputs);

namespace detail {
// What Python type a plan value read as C++ type T must have (strict: a bool is no int, a tuple no list).
inline bool is_int(PyObject* o) { return PyLong_Check(o) && !PyBool_Check(o); }
template <class T> struct PlanType;
template <> struct PlanType<std::string> {
  static bool is(PyObject* o) { return PyUnicode_Check(o); }
  static constexpr const char* name = "a str";
};
template <> struct PlanType<int> {
  static bool is(PyObject* o) { return is_int(o); }
  static constexpr const char* name = "an int";
};
template <> struct PlanType<int64_t> : PlanType<int> {};
template <> struct PlanType<bool> {
  static bool is(PyObject* o) { return PyBool_Check(o); }
  static constexpr const char* name = "a bool";
};
template <> struct PlanType<py::list> {
  static bool is(PyObject* o) { return PyList_Check(o); }
  static constexpr const char* name = "a list";
};
template <> struct PlanType<py::dict> {
  static bool is(PyObject* o) { return PyDict_Check(o); }
  static constexpr const char* name = "a dict";
};
template <> struct PlanType<py::object> {
  static bool is(PyObject*) { return true; }
  static constexpr const char* name = "a value";
};
template <class E> struct PlanType<std::vector<E>> {
  static bool is(PyObject* o) {
    if (!PyList_Check(o)) return false;
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(o); ++k)
      if (!is_int(PyList_GET_ITEM(o, k))) return false;
    return true;
  }
  static constexpr const char* name = "a list of ints";
};
}  // namespace detail

// h as T (the plan's value at `key`), or a plan error naming the key, the type expected and the type found.
template <class T>
T plan_value(const py::handle& h, const char* key, const std::string& where) {
  FLYSHIP_PLAN_CHECK(detail::PlanType<T>::is(h.ptr()), where, "key '", key, "': expected ",
                     detail::PlanType<T>::name, ", got ", Py_TYPE(h.ptr())->tp_name,
                     "; the loader and the extension disagree, rebuild the extension (flyship prebuild)");
  try {
    return h.cast<T>();
  } catch (const py::cast_error&) {
    FLYSHIP_PLAN_CHECK(false, where, "key '", key, "': ", py::str(h).cast<std::string>(),
                       " is out of range for ", detail::PlanType<T>::name);
  }
  return T();
}

// d[key] as T, or a plan error naming `where` and the key (missing, or of another type).
template <class T>
T need(const py::dict& d, const char* key, const std::string& where) {
  FLYSHIP_PLAN_CHECK(d.contains(key), where, "lacks key '", key,
                     "'; the loader and the extension disagree, rebuild the extension (flyship prebuild)");
  return plan_value<T>(d[key], key, where);
}

}  // namespace flyship
