// The plan: what Python (flyship/loader/plan.py) lowered from the manifest, as the core reads it: each op's
// head at load (parse_op), its specializations on the op's first use (parse_specs). docs/loader.md documents
// each field.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/utils/pybind.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "check.h"
#include "expr.h"
#include "limits.h"  // generated from bundle/limits.py: kPlanVersion, kMaxSlots, kMaxLaunches, ...

namespace flyship {

namespace py = pybind11;

constexpr int kMaxDevices = 64;
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

struct Slot {
  std::string name;
  int kind = kTensor;
  int rank = 0;  // the kernel's rank (a batched tensor may have more: leading batch dims, batch.cpp)
  bool batch = false;
  bool is_mutable = false;  // an input tensor the kernel writes in place (manifest 1.2 args[].mutable)
};

struct OutputPlan {
  std::string name;
  int dtype_slot = -1;  // an input tensor whose dtype the output takes, or -1
  at::ScalarType dtype = at::kFloat;  // the fixed dtype when dtype_slot < 0
  std::vector<Program> shape;  // one program per dimension, over the inputs
  bool zero = false;  // allocated zero-filled, an out= tensor zero-filled before the launch (manifest 1.3 zero)
};

struct Field {
  int kind = kNull;
  int type = kPtr;
  int64_t offset = 0;
  int slot = -1;
  int dim = -1;
  int program = -1;
  uint8_t constant[8] = {0};
  int64_t bytes_per_program = 0;
  int64_t align = 0;
  std::string label;
};

// Device memory a multi-launch variant allocates per call, before its first launch (manifest Workspace).
struct WorkspacePlan {
  std::string name;
  at::ScalarType dtype = at::kFloat;
  bool zero = false;
  std::vector<Program> shape;  // one program per dimension, over the inputs
};

struct VariantPlan {
  int id = -1;  // index among all variants of the bundle
  std::string target, format, file, symbol, sha256;
  int64_t kernarg_size = 0;
  int64_t kernarg_align = 8;
  std::vector<Field> fields;
  std::vector<Program> programs;  // referenced by fields (expr), grid and dynamic_lds
  int grid[3] = {-1, -1, -1};
  int dynamic_lds = -1;
  uint32_t block[3] = {1, 1, 1};
  int64_t static_lds = 0;
  std::string label;  // "add.f32.gfx942.hsaco (kernel add_kernel, built for gfx942)"
  std::vector<VariantPlan> then;  // the launches after this one, in order (schema 1.2); none of their own
  std::vector<WorkspacePlan> workspaces;  // allocated before the first launch; kWorkspace fields index them
};

struct SpecPlan {
  std::string name;
  std::vector<std::pair<int, at::ScalarType>> dtypes;
  std::vector<std::pair<int, int64_t>> alignment;
  std::vector<Program> constraints;
  std::vector<Program> out_constraints;  // layout checks on out= tensors (fresh outputs meet them)
  std::vector<VariantPlan> variants;
};

struct OpPlan {
  std::string name, qualname;
  std::vector<Slot> slots;  // inputs, then outputs
  int n_inputs = 0;
  std::vector<OutputPlan> outputs;
  std::vector<int> spec_variants;  // from the head: variants per specialization (the specs themselves load later)
  int n_code_objects = 0;  // from the head: its variants and their following launches (each has a variant id)
  int first_variant = 0;  // bundle-wide id of the op's first variant (ids number variants in manifest order)
  // Filled on the op's first use (OpState::ensure_specs); read only after it.
  std::vector<SpecPlan> specs;
  bool guard_uses_outputs = false;  // a guard reads an output: allocate outputs before choosing
  bool has_mutable = false;  // some input is written in place (Tensor(a!) in the functional schema)
  // What the reference of an op with inputs written in place must do, for the message refusing one that did not
  // ("" for other ops); its one owner is flyship/loader/cpu.py mutable_hint, the text travels in the plan.
  std::string mutable_hint;
  std::vector<int> batch_inputs;  // slots of the batched input tensors (leading batch dims), in order
  std::vector<int> batch_outputs;  // slots of the batched outputs
};

// Read one program of the plan ({"text", "code"}), mapping mnemonics to opcodes and validating it.
Program parse_program(const py::handle& h, const std::vector<SlotShape>& shapes, const std::string& where);

// Read one op's head (slots, outputs, variants per specialization), checking every index and code in it
// (FLYSHIP_PLAN_CHECK).
OpPlan parse_op(const py::dict& d);

// Read one op's specializations (the list the bundle's `specs` callable returns for it), checking each against
// the head `op`; *guard_uses_outputs says whether a guard reads an output.
std::vector<SpecPlan> parse_specs(const py::list& specs, const OpPlan& op, bool* guard_uses_outputs);

// d[key] as T, or a plan error naming `where`.
template <class T>
T need(const py::dict& d, const char* key, const std::string& where) {
  FLYSHIP_CHECK(d.contains(key), "flyship plan: ", where, " lacks key '", key,
              "'; the loader and the extension disagree, rebuild the extension (flyship prebuild)");
  return d[key].cast<T>();
}

}  // namespace flyship
