// Plan parsing: the plan's dicts and lists into OpPlan, every index and code checked once per load.
#include "plan.h"

#include <cstring>

#include "check.h"
#include "util.h"

namespace flyship {

namespace {

// The code of `name` in a table of names, or a plan error listing the names.
template <size_t N>
int code_of(const char* const (&table)[N], const std::string& name, const char* what, const std::string& where) {
  for (size_t k = 0; k < N; ++k)
    if (name == table[k]) return static_cast<int>(k);
  std::string known;
  for (size_t k = 0; k < N; ++k) known += (k ? ", " : "") + std::string(table[k]);
  FLYSHIP_PLAN_CHECK(false, where, "expected a ", what, " (", known, "), got '", name, "'");
  return -1;
}

// What programs of `op` may read of each slot; with `inputs_only`, outputs read as nothing (an output's shape
// is computed before the output exists).
std::vector<SlotShape> slot_shapes(const OpPlan& op, bool inputs_only) {
  std::vector<SlotShape> shapes;
  for (size_t i = 0; i < op.slots.size(); ++i) {
    const Slot& s = op.slots[i];
    const bool readable = !inputs_only || static_cast<int>(i) < op.n_inputs;
    shapes.push_back(readable ? SlotShape{s.kind == kTensor, s.kind == kInt, s.rank} : SlotShape{false, false, 0});
  }
  return shapes;
}

// The contract's plain readers (plan_fields.h: one per reader name); `custom` keys are read by hand below, so
// their reader only checks that the key is there.
void read_str(const py::dict& d, const char* key, const std::string& w, std::string* out) {
  *out = need<std::string>(d, key, w);
}
void read_int(const py::dict& d, const char* key, const std::string& w, int* out) { *out = need<int>(d, key, w); }
void read_i64(const py::dict& d, const char* key, const std::string& w, int64_t* out) {
  *out = need<int64_t>(d, key, w);
}
void read_bool(const py::dict& d, const char* key, const std::string& w, bool* out) { *out = need<bool>(d, key, w); }
void read_ints(const py::dict& d, const char* key, const std::string& w, std::vector<int>* out) {
  *out = need<std::vector<int>>(d, key, w);
}
void read_arg_kind(const py::dict& d, const char* key, const std::string& w, int* out) {
  *out = code_of(kArgKindName, need<std::string>(d, key, w), "argument kind", w);
}
void read_field_kind(const py::dict& d, const char* key, const std::string& w, int* out) {
  *out = code_of(kFieldKindName, need<std::string>(d, key, w), "field kind", w);
}
void read_field_type(const py::dict& d, const char* key, const std::string& w, int* out) {
  *out = code_of(kTypeName, need<std::string>(d, key, w), "field type", w);
}
void read_dtype(const py::dict& d, const char* key, const std::string& w, at::ScalarType* out) {
  *out = dtype_from_name(need<std::string>(d, key, w));
}
template <class T>
void read_custom(const py::dict& d, const char* key, const std::string& w, T*) {
  need<py::object>(d, key, w);
}

// read_fields(d, where, &x): every key of x's struct, in the contract's order, each by its reader.
#define FLYSHIP_PLAN_READ(S, member, key, T, R, ...) read_##R(d, key, where, &x->member);
#define FLYSHIP_PLAN_READER(S) \
  void read_fields(const py::dict& d, const std::string& where, S* x) { FLYSHIP_PLAN_FIELDS_##S(FLYSHIP_PLAN_READ) }
FLYSHIP_PLAN_READER(OpPlan)
FLYSHIP_PLAN_READER(Slot)
FLYSHIP_PLAN_READER(OutputPlan)
FLYSHIP_PLAN_READER(SpecPlan)
FLYSHIP_PLAN_READER(VariantPlan)
FLYSHIP_PLAN_READER(Field)
FLYSHIP_PLAN_READER(WorkspacePlan)
#undef FLYSHIP_PLAN_READER
#undef FLYSHIP_PLAN_READ

// An element of a plan list that must be a dict.
py::dict as_dict(const py::handle& h, const char* key, const std::string& where) {
  return plan_value<py::dict>(h, key, where);
}

}  // namespace

// {"text": str, "code": [mnemonic, operands..., ...]}: mnemonics become opcodes (expr.h), operands stay ints.
Program parse_program(const py::handle& h, const std::vector<SlotShape>& shapes, const std::string& where) {
  auto d = as_dict(h, "program", where);
  Program p;
  p.text = need<std::string>(d, "text", where);
  auto words = need<py::list>(d, "code", where);
  FLYSHIP_PLAN_CHECK(words.size() <= static_cast<size_t>(kMaxProgramWords), where, "program for '", p.text, "' has ",
                     words.size(), " words, more than ", kMaxProgramWords);
  for (size_t i = 0; i < words.size();) {
    const auto name = words[i].cast<std::string>();
    const int64_t op = opcode_of(name);
    FLYSHIP_PLAN_CHECK(op >= 0, where, "program for '", p.text, "': unknown opcode '", name, "' at word ", i);
    p.code.push_back(op);
    const size_t n = static_cast<size_t>(detail::operand_count(op));
    FLYSHIP_PLAN_CHECK(i + 1 + n <= words.size(), where, "program for '", p.text, "': opcode ", name, " lacks operands");
    for (size_t k = 1; k <= n; ++k) p.code.push_back(words[i + k].cast<int64_t>());
    i += 1 + n;
  }
  std::string why = validate(p.code, shapes);
  FLYSHIP_PLAN_CHECK(why.empty(), where, "program for '", p.text, "' is malformed: ", why);
  return p;
}

namespace {

// What a variant's parts may read: every slot (fields, grid, LDS) or the inputs only (workspace sizes).
struct VariantScope {
  const std::vector<SlotShape>& shapes;
  const std::vector<SlotShape>& input_shapes;
  const std::vector<Slot>& slots;
};

// A top-level variant's workspaces (schema 1.2); a following launch (`following`) has none of its own.
void parse_workspaces(const py::dict& d, const VariantScope& scope, bool following, const std::string& vw,
                      VariantPlan* v) {
  auto list = need<py::list>(d, "workspaces", vw);
  if (following) {
    FLYSHIP_PLAN_CHECK(list.empty(), vw, "a following launch declares workspaces of its own");
    return;
  }
  for (auto wh : list) {
    auto w = as_dict(wh, "workspaces", vw);
    WorkspacePlan ws;
    read_fields(w, vw + " workspace", &ws);
    // Like an output's shape, a workspace's reads only the inputs.
    for (auto p : need<py::list>(w, "shape", vw)) ws.shape.push_back(parse_program(p, scope.input_shapes, vw));
    v->workspaces.push_back(std::move(ws));
  }
  FLYSHIP_PLAN_CHECK(v->workspaces.size() <= static_cast<size_t>(kMaxWorkspaces), vw, "expected at most ",
                     kMaxWorkspaces, " workspaces, got ", v->workspaces.size());
}

// Kernarg size and alignment, programs, grid, block and dynamic LDS.
void parse_launch(const py::dict& d, const VariantScope& scope, const std::string& vw, VariantPlan* v) {
  FLYSHIP_PLAN_CHECK(v->kernarg_size >= 0 && v->kernarg_size <= kMaxKernargBytes, vw, "kernarg size ",
                     v->kernarg_size);
  FLYSHIP_PLAN_CHECK(v->kernarg_align > 0 && v->kernarg_align <= kKernargBufferAlignment &&
                         (v->kernarg_align & (v->kernarg_align - 1)) == 0, vw, "kernarg alignment ", v->kernarg_align,
                     " is not a power of two up to ", kKernargBufferAlignment, " (the loader aligns its buffer to ",
                     kKernargBufferAlignment, " bytes)");
  for (auto p : need<py::list>(d, "programs", vw)) v->programs.push_back(parse_program(p, scope.shapes, vw));
  const int n_programs = static_cast<int>(v->programs.size());
  auto grid = need<std::vector<int>>(d, "grid", vw);
  auto block = need<std::vector<int64_t>>(d, "block", vw);
  FLYSHIP_PLAN_CHECK(grid.size() == 3 && block.size() == 3, vw, "grid and block need 3 entries");
  for (int i = 0; i < 3; ++i) {
    FLYSHIP_PLAN_CHECK(grid[i] >= 0 && grid[i] < n_programs, vw, "grid program index out of range");
    FLYSHIP_PLAN_CHECK(block[i] >= 1 && block[i] <= kMaxBlock, vw, "block size ", block[i],
                       " out of range");
    v->grid[i] = grid[i];
    v->block[i] = static_cast<uint32_t>(block[i]);
  }
  FLYSHIP_PLAN_CHECK(v->dynamic_lds >= 0 && v->dynamic_lds < n_programs, vw, "dynamic_lds program out of range");
}

// One kernarg field, checked against the variant's buffer, the op's slots and the variant's workspaces.
Field parse_field(const py::handle& fh, const VariantScope& scope, const VariantPlan& v, int n_workspaces,
                  const std::string& vw) {
  auto f = as_dict(fh, "fields", vw);
  Field x;
  const std::string fw = vw + " field " + need<std::string>(f, "label", vw);
  read_fields(f, fw, &x);
  const int64_t constant = need<int64_t>(f, "constant", fw);
  std::memcpy(x.constant.data(), &constant, 8);  // little-endian bytes, as Python packed them
  FLYSHIP_PLAN_CHECK(x.offset >= 0 && x.offset <= v.kernarg_size - kTypeSize[x.type], fw,
                     "lies outside the kernarg buffer of ", v.kernarg_size, " bytes");
  const bool needs_slot = x.kind == kPointer || x.kind == kShape || x.kind == kStride || x.kind == kScalar;
  if (needs_slot) {
    FLYSHIP_PLAN_CHECK(x.slot >= 0 && x.slot < static_cast<int>(scope.slots.size()), fw, "slot out of range");
    const Slot& s = scope.slots[x.slot];
    FLYSHIP_PLAN_CHECK((x.kind == kScalar) == (s.kind != kTensor), fw, "slot kind does not fit");
    if (x.kind == kShape || x.kind == kStride) {
      FLYSHIP_PLAN_CHECK(x.dim >= 0 && x.dim < s.rank, fw, "dim out of range");
    }
    if (x.kind == kScalar && s.kind == kFloat) {
      FLYSHIP_PLAN_CHECK(x.type >= kF64, fw, "a float scalar needs a float type");
    }
  }
  if (x.kind == kWorkspace) {
    FLYSHIP_PLAN_CHECK(x.slot >= 0 && x.slot < n_workspaces, fw, "workspace index ", x.slot,
                       " out of range for ", n_workspaces, " workspaces");
  }
  if (x.kind == kPointer || x.kind == kNull || x.kind == kScratch || x.kind == kWorkspace) {
    FLYSHIP_PLAN_CHECK(kTypeSize[x.type] == 8 && x.type <= kU64, fw, "a pointer needs an 8-byte type");
  }
  if (x.kind == kExpr) {
    FLYSHIP_PLAN_CHECK(x.program >= 0 && x.program < static_cast<int>(v.programs.size()), fw, "program out of range");
  }
  if (x.kind == kScratch) {
    FLYSHIP_PLAN_CHECK(x.bytes_per_program >= 0 && x.align > 0 && (x.align & (x.align - 1)) == 0, fw,
                       "scratch needs bytes_per_program >= 0 and a power-of-two alignment");
  }
  return x;
}

// One variant. A multi-launch variant (schema 1.2) has workspaces, then its following launches, whose workspace
// fields index the variant's workspaces (n_workspaces >= 0 marks a following launch: it has none of its own).
VariantPlan parse_variant(const py::dict& d, const VariantScope& scope, const std::string& where,
                          int n_workspaces = -1) {
  VariantPlan v;
  const std::string vw = where + " target " + need<std::string>(d, "target", where);
  read_fields(d, vw, &v);
  v.label = v.file + " (kernel " + v.symbol + ", built for " + v.target + ")";
  const bool following = n_workspaces >= 0;
  parse_workspaces(d, scope, following, vw, &v);
  if (!following) n_workspaces = static_cast<int>(v.workspaces.size());
  parse_launch(d, scope, vw, &v);
  for (auto fh : need<py::list>(d, "fields", vw)) v.fields.push_back(parse_field(fh, scope, v, n_workspaces, vw));
  auto then = need<py::list>(d, "then", vw);
  FLYSHIP_PLAN_CHECK(!following || then.empty(), vw, "a following launch has launches of its own");
  FLYSHIP_PLAN_CHECK(then.size() < static_cast<size_t>(kMaxLaunches), vw, "expected at most ", kMaxLaunches,
                     " launches, got ", then.size() + 1);
  for (size_t k = 0; k < then.size(); ++k) {
    v.then.push_back(parse_variant(as_dict(then[k], "then", vw), scope, vw + " launch " + std::to_string(k + 2),
                                   n_workspaces));
    FLYSHIP_PLAN_CHECK(v.then.back().target == v.target, vw, "launch ", k + 2, " is built for ",
                       v.then.back().target, ", expected its variant's target");
  }
  return v;
}

// The op's slots (inputs, then outputs), each checked alone.
void parse_slots(const py::dict& d, const std::string& where, OpPlan* op) {
  for (auto sh : need<py::list>(d, "slots", where)) {
    Slot slot;
    read_fields(as_dict(sh, "slots", where), where, &slot);
    FLYSHIP_PLAN_CHECK(!slot.is_mutable || slot.kind == kTensor, where, "argument '", slot.name,
                       "' is mutable but not a tensor");
    op->has_mutable |= slot.is_mutable;
    FLYSHIP_PLAN_CHECK(slot.rank >= 0 && slot.rank <= kMaxRank && (slot.kind == kTensor || slot.rank == 0), where,
                       "argument '", slot.name, "': expected a rank in 0..", kMaxRank, " (0 for a scalar), got ",
                       slot.rank);
    FLYSHIP_PLAN_CHECK(!slot.batch || (slot.kind == kTensor && slot.rank >= 1), where, "argument '", slot.name,
                       "' is batched but is not a tensor of rank >= 1");
    op->slots.push_back(std::move(slot));
  }
}

// The op's outputs: dtype rule and shape programs over the inputs (the outputs do not exist yet).
void parse_outputs(const py::dict& d, const std::string& where, OpPlan* op) {
  const std::vector<SlotShape> input_shapes = slot_shapes(*op, true);
  for (auto oh : need<py::list>(d, "outputs", where)) {
    auto o = as_dict(oh, "outputs", where);
    OutputPlan out;
    read_fields(o, where, &out);
    // A dtype rule reads a tensor's dtype: a slot of any other kind (a scalar named like a dtype) is refused
    // here, so a call never reads a tensor that was never bound.
    FLYSHIP_PLAN_CHECK(out.dtype_slot < op->n_inputs &&
                           (out.dtype_slot < 0 || op->slots[out.dtype_slot].kind == kTensor),
                       where, "output '", out.name, "' takes its dtype from slot ", out.dtype_slot,
                       ", expected an input tensor's slot or -1 (a fixed dtype)");
    if (out.dtype_slot < 0) out.dtype = dtype_from_name(need<std::string>(o, "dtype", where));
    for (auto p : need<py::list>(o, "shape", where)) out.shape.push_back(parse_program(p, input_shapes, where));
    op->outputs.push_back(std::move(out));
  }
}

}  // namespace

OpPlan parse_op(const py::dict& d) {
  OpPlan op;
  const std::string where = "op " + need<std::string>(d, "name", "op");
  read_fields(d, where, &op);
  parse_slots(d, where, &op);
  FLYSHIP_PLAN_CHECK(op.n_inputs >= 0 && op.n_inputs <= static_cast<int>(op.slots.size()), where, "n_inputs ",
                     op.n_inputs, " out of range for ", op.slots.size(), " slots");
  for (int i = 0; i < static_cast<int>(op.slots.size()); ++i) {
    if (op.slots[i].batch) (i < op.n_inputs ? op.batch_inputs : op.batch_outputs).push_back(i);
  }
  FLYSHIP_PLAN_CHECK(op.batch_outputs.empty() || !op.batch_inputs.empty(), where,
                     "an output is batched but no input is");
  FLYSHIP_CHECK(static_cast<int>(op.slots.size()) <= kMaxSlots, "flyship: op ", op.name, " has more than ", kMaxSlots,
                " arguments and outputs");
  bool has_tensor_input = false;
  for (int i = 0; i < op.n_inputs; ++i) has_tensor_input |= op.slots[i].kind == kTensor;
  FLYSHIP_CHECK(has_tensor_input, "flyship: op ", op.name, " takes no tensor; the loader needs one to know the device");
  parse_outputs(d, where, &op);
  FLYSHIP_PLAN_CHECK(op.n_inputs + op.outputs.size() == op.slots.size(), where, "slot count mismatch");
  for (size_t k = op.n_inputs; k < op.slots.size(); ++k) {
    FLYSHIP_PLAN_CHECK(!op.slots[k].is_mutable, where, "output '", op.slots[k].name, "' is marked mutable");
  }
  FLYSHIP_PLAN_CHECK(!op.outputs.empty() || op.has_mutable, where,
                     "the op has neither outputs nor inputs written in place");
  FLYSHIP_PLAN_CHECK(op.n_code_objects >= 0, where, "n_code_objects ", op.n_code_objects, " is negative");
  for (int n : op.spec_variants) {
    FLYSHIP_PLAN_CHECK(n >= 0, where, "a specialization has ", n, " variants");
  }
  return op;
}

std::vector<SpecPlan> parse_specs(const py::list& specs_list, const OpPlan& op, bool* guard_uses_outputs) {
  const std::string where = "op " + op.name;
  const std::vector<SlotShape> shapes = slot_shapes(op, false);
  const std::vector<SlotShape> input_shapes = slot_shapes(op, true);  // workspace sizes read the inputs only
  *guard_uses_outputs = false;
  FLYSHIP_PLAN_CHECK(specs_list.size() == op.spec_variants.size(), where, "the op's head announces ",
                     op.spec_variants.size(), " specializations, its specs hold ", specs_list.size());
  const VariantScope scope{shapes, input_shapes, op.slots};
  std::vector<SpecPlan> specs;
  for (auto sh : specs_list) {
    auto s = as_dict(sh, "specs", where);
    SpecPlan spec;
    const std::string sw = where + " specialization " + need<std::string>(s, "name", where);
    read_fields(s, sw, &spec);
    for (auto p : need<py::list>(s, "dtypes", sw)) {
      auto pr = p.cast<py::sequence>();
      spec.dtypes.emplace_back(pr[0].cast<int>(), dtype_from_name(pr[1].cast<std::string>()));
    }
    for (auto p : need<py::list>(s, "alignment", sw)) {
      auto pr = p.cast<py::sequence>();
      spec.alignment.emplace_back(pr[0].cast<int>(), pr[1].cast<int64_t>());
      FLYSHIP_PLAN_CHECK(spec.alignment.back().second > 0, sw, "alignment must be positive");
    }
    for (auto p : need<py::list>(s, "constraints", sw)) spec.constraints.push_back(parse_program(p, shapes, sw));
    for (auto p : need<py::list>(s, "out_constraints", sw)) {
      spec.out_constraints.push_back(parse_program(p, shapes, sw));
    }
    for (auto vh : need<py::list>(s, "variants", sw)) {
      spec.variants.push_back(parse_variant(as_dict(vh, "variants", sw), scope, sw));
    }
    for (const auto& pr : spec.dtypes) {
      FLYSHIP_PLAN_CHECK(pr.first >= 0 && pr.first < op.n_inputs && op.slots[pr.first].kind == kTensor, sw,
                         "dtype guard names no input tensor");
    }
    for (const auto& pr : spec.alignment) {
      // An alignment guard on an output does not force early allocation: a fresh output comes from
      // torch's allocator, aligned to at least 64 bytes (CPU) or 512 (CUDA/HIP caching allocator).
      FLYSHIP_PLAN_CHECK(pr.first >= 0 && pr.first < static_cast<int>(op.slots.size()) &&
                             op.slots[pr.first].kind == kTensor,
                         sw, "alignment guard names no tensor");
    }
    for (const auto& c : spec.constraints) {
      for (size_t i = 0; i < c.code.size();) {
        const int64_t o = c.code[i];
        const bool reads_tensor = o == OP_SHAPE || o == OP_STRIDE || o == OP_NUMEL;
        if (reads_tensor && c.code[i + 1] >= op.n_inputs) *guard_uses_outputs = true;
        i += 1 + detail::operand_count(o);
      }
    }
    specs.push_back(std::move(spec));
  }
  for (size_t k = 0; k < specs.size(); ++k) {
    FLYSHIP_PLAN_CHECK(static_cast<int>(specs[k].variants.size()) == op.spec_variants[k], where, "specialization ",
                       specs[k].name, " holds ", specs[k].variants.size(), " variants, the op's head announces ",
                       op.spec_variants[k]);
  }
  return specs;
}

}  // namespace flyship
