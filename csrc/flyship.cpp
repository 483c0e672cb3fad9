// flyship's C++ launch core: per-call argument checks, specialization choice, output allocation,
// kernarg packing and the launch, registered as boxed torch kernels.
//
// Python (flyship/loader/plan.py) lowers the manifest once per load into a plan: integer codes,
// offsets and postfix programs (csrc/expr.h). Per call everything below runs in C++; Python is entered
// only (a) once per (bundle, device target) to choose code-object variants (flyship.bundle.targets keeps
// the rules) and (b) to call an op's PyTorch reference when no specialization fits the inputs.
//
// One function owns the kernarg layout (the manifest, checked against the code object's metadata at
// load); a launch only copies values to offsets (pack_kernargs below).
#include <torch/csrc/utils/pybind.h>
#include <torch/library.h>

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/ops/empty.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/variable.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "driver.h"
#include "expr.h"

namespace py = pybind11;

namespace flyship {

// Plan format version: flyship/loader/plan.py PLAN_VERSION.
constexpr int kPlanVersion = 1;
constexpr int kMaxDevices = 64;
constexpr int kMaxSlots = 64;
// Kernarg buffers up to this size live on the stack; bigger ones on the heap.
constexpr size_t kInlineKernargBytes = 1024;

// Codes shared with flyship/loader/plan.py.
enum ArgKind : int { kTensor = 0, kInt = 1, kFloat = 2, kBool = 3 };
enum FieldKind : int {
  kPointer = 0, kShape = 1, kStride = 2, kScalar = 3, kExpr = 4, kConstant = 5, kNull = 6, kScratch = 7
};
enum FieldType : int {
  kPtr = 0, kI64 = 1, kU64 = 2, kI32 = 3, kU32 = 4, kI16 = 5, kI8 = 6, kF64 = 7, kF32 = 8, kF16 = 9, kBF16 = 10
};
constexpr int kTypeSize[] = {8, 8, 8, 4, 4, 2, 1, 8, 4, 2, 2};
constexpr const char* kTypeName[] = {"ptr", "i64", "u64", "i32", "u32", "i16", "i8", "f64", "f32", "f16", "bf16"};

// ---------------------------------------------------------------------------------------------
// Small helpers

std::string shape_str(c10::IntArrayRef s) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  o << "]";
  return o.str();
}

std::string join(const std::vector<std::string>& parts, const char* sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? sep : "") + parts[i];
  return out;
}

at::ScalarType dtype_from_name(const std::string& name) {
  static const std::map<std::string, at::ScalarType> table = {
      {"float64", at::kDouble}, {"float32", at::kFloat}, {"float16", at::kHalf}, {"bfloat16", at::kBFloat16},
      {"float8_e4m3fn", at::kFloat8_e4m3fn}, {"float8_e5m2", at::kFloat8_e5m2},
      {"float8_e4m3fnuz", at::kFloat8_e4m3fnuz}, {"float8_e5m2fnuz", at::kFloat8_e5m2fnuz},
      {"int64", at::kLong}, {"int32", at::kInt}, {"int16", at::kShort}, {"int8", at::kChar}, {"uint8", at::kByte},
      {"bool", at::kBool}};
  auto it = table.find(name);
  TORCH_CHECK(it != table.end(), "flyship plan: unknown dtype '", name, "'");
  return it->second;
}

// torch's dtype names as the manifest writes them ("float32", not "Float").
std::string dtype_name(at::ScalarType t) {
  std::string s = c10::toString(t);
  static const std::map<std::string, std::string> table = {
      {"Double", "float64"}, {"Float", "float32"}, {"Half", "float16"}, {"BFloat16", "bfloat16"}, {"Long", "int64"},
      {"Int", "int32"}, {"Short", "int16"}, {"Char", "int8"}, {"Byte", "uint8"}, {"Bool", "bool"},
      {"Float8_e4m3fn", "float8_e4m3fn"}, {"Float8_e5m2", "float8_e5m2"}, {"Float8_e4m3fnuz", "float8_e4m3fnuz"},
      {"Float8_e5m2fnuz", "float8_e5m2fnuz"}};
  auto it = table.find(s);
  return it == table.end() ? s : it->second;
}

// Holds a Python object; drops the reference only while the interpreter runs (a registration may
// outlive it: the dispatcher is torn down after Python at exit, and then the reference is leaked).
class PyRef {
 public:
  PyRef() = default;
  explicit PyRef(py::object o) : p_(o.release().ptr()) {}
  ~PyRef() {
    if (p_ != nullptr && Py_IsInitialized()) {
      py::gil_scoped_acquire gil;
      Py_DECREF(p_);
    }
  }
  PyRef(const PyRef&) = delete;
  PyRef& operator=(const PyRef&) = delete;
  bool empty() const { return p_ == nullptr || p_ == Py_None; }
  py::handle get() const { return py::handle(p_); }

 private:
  PyObject* p_ = nullptr;
};

template <class T>
T need(const py::dict& d, const char* key, const std::string& where) {
  TORCH_CHECK(d.contains(key), "flyship plan: ", where, " lacks key '", key,
              "'; the loader and the extension disagree, rebuild the extension (flyship prebuild)");
  return d[key].cast<T>();
}

// ---------------------------------------------------------------------------------------------
// The plan: what Python lowered from the manifest (flyship/loader/plan.py documents each field).

struct Slot {
  std::string name;
  int kind = kTensor;
  int rank = 0;
};

struct OutputPlan {
  std::string name;
  int dtype_slot = -1;  // an input tensor whose dtype the output takes, or -1
  at::ScalarType dtype = at::kFloat;  // the fixed dtype when dtype_slot < 0
  std::vector<Program> shape;  // one program per dimension, over the inputs
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

struct VariantPlan {
  int id = -1;  // index among all variants of the bundle
  std::string target, format, file, symbol, sha256;
  std::string image;  // the code object's bytes
  int64_t kernarg_size = 0;
  int64_t kernarg_align = 8;
  std::vector<Field> fields;
  std::vector<Program> programs;  // referenced by fields (expr), grid and dynamic_lds
  int grid[3] = {-1, -1, -1};
  int dynamic_lds = -1;
  uint32_t block[3] = {1, 1, 1};
  int64_t static_lds = 0;
  std::string label;  // "add.f32.gfx942.hsaco (kernel add_kernel, built for gfx942)"
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
  std::vector<SpecPlan> specs;
  bool guard_uses_outputs = false;  // a guard reads an output: allocate outputs before choosing
};

Program parse_program(const py::handle& h, const std::vector<SlotShape>& shapes, const std::string& where) {
  auto pair = h.cast<py::sequence>();
  TORCH_CHECK(pair.size() == 2, "flyship plan: ", where, ": expected (text, program)");
  Program p;
  p.text = pair[0].cast<std::string>();
  p.code = pair[1].cast<std::vector<int64_t>>();
  std::string why = validate(p.code, shapes);
  TORCH_CHECK(why.empty(), "flyship plan: ", where, ": program for '", p.text, "' is malformed: ", why);
  return p;
}

VariantPlan parse_variant(const py::dict& d, const std::vector<SlotShape>& shapes, const std::vector<Slot>& slots,
                          const std::string& where) {
  VariantPlan v;
  v.target = need<std::string>(d, "target", where);
  const std::string vw = where + " target " + v.target;
  v.format = need<std::string>(d, "format", vw);
  v.file = need<std::string>(d, "file", vw);
  v.symbol = need<std::string>(d, "symbol", vw);
  v.sha256 = need<std::string>(d, "sha256", vw);
  v.image = need<py::bytes>(d, "image", vw);
  v.kernarg_size = need<int64_t>(d, "kernarg_size", vw);
  v.kernarg_align = need<int64_t>(d, "kernarg_align", vw);
  v.static_lds = need<int64_t>(d, "static_lds", vw);
  v.label = v.file + " (kernel " + v.symbol + ", built for " + v.target + ")";
  TORCH_CHECK(v.kernarg_size >= 0 && v.kernarg_size <= (1 << 20), "flyship plan: ", vw, ": kernarg size ",
              v.kernarg_size);
  TORCH_CHECK(v.kernarg_align > 0 && v.kernarg_align <= 64 && (v.kernarg_align & (v.kernarg_align - 1)) == 0,
              "flyship plan: ", vw, ": kernarg alignment ", v.kernarg_align,
              " is not a power of two up to 64 (the loader aligns its buffer to 64 bytes)");
  for (auto p : need<py::list>(d, "programs", vw)) v.programs.push_back(parse_program(p, shapes, vw));
  const int n_programs = static_cast<int>(v.programs.size());
  auto grid = need<std::vector<int>>(d, "grid", vw);
  auto block = need<std::vector<int64_t>>(d, "block", vw);
  TORCH_CHECK(grid.size() == 3 && block.size() == 3, "flyship plan: ", vw, ": grid and block need 3 entries");
  for (int i = 0; i < 3; ++i) {
    TORCH_CHECK(grid[i] >= 0 && grid[i] < n_programs, "flyship plan: ", vw, ": grid program index out of range");
    TORCH_CHECK(block[i] >= 1 && block[i] <= 65536, "flyship plan: ", vw, ": block size ", block[i], " out of range");
    v.grid[i] = grid[i];
    v.block[i] = static_cast<uint32_t>(block[i]);
  }
  v.dynamic_lds = need<int>(d, "dynamic_lds", vw);
  TORCH_CHECK(v.dynamic_lds >= 0 && v.dynamic_lds < n_programs, "flyship plan: ", vw,
              ": dynamic_lds program out of range");
  for (auto fh : need<py::list>(d, "fields", vw)) {
    auto f = fh.cast<py::sequence>();
    TORCH_CHECK(f.size() == 10, "flyship plan: ", vw, ": a field needs 10 entries");
    Field x;
    x.kind = f[0].cast<int>();
    x.type = f[1].cast<int>();
    x.offset = f[2].cast<int64_t>();
    x.slot = f[3].cast<int>();
    x.dim = f[4].cast<int>();
    x.program = f[5].cast<int>();
    const int64_t constant = f[6].cast<int64_t>();
    std::memcpy(x.constant, &constant, 8);  // little-endian bytes, as Python packed them
    x.bytes_per_program = f[7].cast<int64_t>();
    x.align = f[8].cast<int64_t>();
    x.label = f[9].cast<std::string>();
    const std::string fw = vw + " field " + x.label;
    TORCH_CHECK(x.kind >= kPointer && x.kind <= kScratch, "flyship plan: ", fw, ": unknown kind ", x.kind);
    TORCH_CHECK(x.type >= kPtr && x.type <= kBF16, "flyship plan: ", fw, ": unknown type ", x.type);
    TORCH_CHECK(x.offset >= 0 && x.offset + kTypeSize[x.type] <= v.kernarg_size, "flyship plan: ", fw,
                ": lies outside the kernarg buffer of ", v.kernarg_size, " bytes");
    const bool needs_slot = x.kind == kPointer || x.kind == kShape || x.kind == kStride || x.kind == kScalar;
    if (needs_slot) {
      TORCH_CHECK(x.slot >= 0 && x.slot < static_cast<int>(slots.size()), "flyship plan: ", fw, ": slot out of range");
      const Slot& s = slots[x.slot];
      TORCH_CHECK((x.kind == kScalar) == (s.kind != kTensor), "flyship plan: ", fw, ": slot kind does not fit");
      if (x.kind == kShape || x.kind == kStride) {
        TORCH_CHECK(x.dim >= 0 && x.dim < s.rank, "flyship plan: ", fw, ": dim out of range");
      }
      if (x.kind == kScalar && s.kind == kFloat) {
        TORCH_CHECK(x.type >= kF64, "flyship plan: ", fw, ": a float scalar needs a float type");
      }
    }
    if (x.kind == kPointer || x.kind == kNull || x.kind == kScratch) {
      TORCH_CHECK(kTypeSize[x.type] == 8 && x.type <= kU64, "flyship plan: ", fw, ": a pointer needs an 8-byte type");
    }
    if (x.kind == kExpr) {
      TORCH_CHECK(x.program >= 0 && x.program < n_programs, "flyship plan: ", fw, ": program out of range");
    }
    if (x.kind == kScratch) {
      TORCH_CHECK(x.bytes_per_program >= 0 && x.align > 0 && (x.align & (x.align - 1)) == 0, "flyship plan: ", fw,
                  ": scratch needs bytes_per_program >= 0 and a power-of-two alignment");
    }
    v.fields.push_back(std::move(x));
  }
  return v;
}

OpPlan parse_op(const py::dict& d) {
  OpPlan op;
  op.name = need<std::string>(d, "name", "op");
  op.qualname = need<std::string>(d, "qualname", "op " + op.name);
  const std::string where = "op " + op.name;
  for (auto sh : need<py::list>(d, "slots", where)) {
    auto s = sh.cast<py::dict>();
    op.slots.push_back({need<std::string>(s, "name", where), need<int>(s, "kind", where), need<int>(s, "rank", where)});
  }
  op.n_inputs = need<int>(d, "n_inputs", where);
  TORCH_CHECK(static_cast<int>(op.slots.size()) <= kMaxSlots, "flyship: op ", op.name, " has more than ", kMaxSlots,
              " arguments and outputs");
  std::vector<SlotShape> shapes, input_shapes;
  for (size_t i = 0; i < op.slots.size(); ++i) {
    const Slot& s = op.slots[i];
    SlotShape ss{s.kind == kTensor, s.kind == kInt, s.rank};
    shapes.push_back(ss);
    // Output shapes may read only the inputs (the outputs do not exist yet).
    input_shapes.push_back(static_cast<int>(i) < op.n_inputs ? ss : SlotShape{false, false, 0});
  }
  bool has_tensor_input = false;
  for (int i = 0; i < op.n_inputs; ++i) has_tensor_input |= op.slots[i].kind == kTensor;
  TORCH_CHECK(has_tensor_input, "flyship: op ", op.name, " takes no tensor; the loader needs one to know the device");
  for (auto oh : need<py::list>(d, "outputs", where)) {
    auto o = oh.cast<py::dict>();
    OutputPlan out;
    out.name = need<std::string>(o, "name", where);
    out.dtype_slot = need<int>(o, "dtype_slot", where);
    if (out.dtype_slot < 0) out.dtype = dtype_from_name(need<std::string>(o, "dtype", where));
    for (auto p : need<py::list>(o, "shape", where)) out.shape.push_back(parse_program(p, input_shapes, where));
    op.outputs.push_back(std::move(out));
  }
  TORCH_CHECK(op.n_inputs + op.outputs.size() == op.slots.size(), "flyship plan: ", where, ": slot count mismatch");
  for (auto sh : need<py::list>(d, "specs", where)) {
    auto s = sh.cast<py::dict>();
    SpecPlan spec;
    spec.name = need<std::string>(s, "name", where);
    const std::string sw = where + " specialization " + spec.name;
    for (auto p : need<py::list>(s, "dtypes", sw)) {
      auto pr = p.cast<py::sequence>();
      spec.dtypes.emplace_back(pr[0].cast<int>(), dtype_from_name(pr[1].cast<std::string>()));
    }
    for (auto p : need<py::list>(s, "alignment", sw)) {
      auto pr = p.cast<py::sequence>();
      spec.alignment.emplace_back(pr[0].cast<int>(), pr[1].cast<int64_t>());
      TORCH_CHECK(spec.alignment.back().second > 0, "flyship plan: ", sw, ": alignment must be positive");
    }
    for (auto p : need<py::list>(s, "constraints", sw)) spec.constraints.push_back(parse_program(p, shapes, sw));
    for (auto p : need<py::list>(s, "out_constraints", sw)) {
      spec.out_constraints.push_back(parse_program(p, shapes, sw));
    }
    for (auto vh : need<py::list>(s, "variants", sw)) {
      spec.variants.push_back(parse_variant(vh.cast<py::dict>(), shapes, op.slots, sw));
    }
    for (const auto& pr : spec.dtypes) {
      TORCH_CHECK(pr.first >= 0 && pr.first < op.n_inputs && op.slots[pr.first].kind == kTensor, "flyship plan: ", sw,
                  ": dtype guard names no input tensor");
    }
    for (const auto& pr : spec.alignment) {
      // An alignment guard on an output does not force early allocation: a fresh output comes from
      // torch's allocator, aligned to at least 64 bytes (CPU) or 512 (CUDA/HIP caching allocator).
      TORCH_CHECK(pr.first >= 0 && pr.first < static_cast<int>(op.slots.size()) && op.slots[pr.first].kind == kTensor,
                  "flyship plan: ", sw, ": alignment guard names no tensor");
    }
    for (const auto& c : spec.constraints) {
      for (size_t i = 0; i < c.code.size();) {
        const int64_t o = c.code[i];
        const bool reads_tensor = o == OP_SHAPE || o == OP_STRIDE || o == OP_NUMEL;
        if (reads_tensor && c.code[i + 1] >= op.n_inputs) op.guard_uses_outputs = true;
        i += 1 + detail::operand_count(o);
      }
    }
    op.specs.push_back(std::move(spec));
  }
  return op;
}

// ---------------------------------------------------------------------------------------------
// Code objects on devices: an owning Module per (device, sha256), loaded on first use.

class Module {
 public:
  Module(int device, const VariantPlan& v) : device_(device) {
    // A page-aligned private copy: the runtime may keep pointing into the image while the module lives.
    const size_t n = v.image.size();
    TORCH_CHECK(posix_memalign(&image_, 4096, n ? n : 1) == 0, "flyship: out of host memory copying ", v.label);
    std::memcpy(image_, v.image.data(), n);
    void* handle = nullptr;
    driver::Status s = driver::module_load(device, image_, n, &handle);
    if (!s.ok()) {
      std::free(image_);
      TORCH_CHECK(false, "flyship: loading code object ", v.label, " onto device ", device, " failed: ", s.message,
                  "; check that the device is visible to this process and the bundle has code for it (",
                  driver::runtime_version(), ")");
    }
    handle_ = handle;
  }
  ~Module() {
    if (handle_ != nullptr) driver::module_unload(device_, handle_);
    std::free(image_);
  }
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // The kernel `v.symbol`; the caller holds the cache lock.
  void* function(const VariantPlan& v) {
    auto it = functions_.find(v.symbol);
    if (it != functions_.end()) return it->second;
    void* f = nullptr;
    driver::Status s = driver::module_function(device_, handle_, v.symbol, &f);
    TORCH_CHECK(s.ok(), "flyship: code object ", v.label, " on device ", device_, " has no kernel '", v.symbol,
                "': ", s.message, "; the manifest and the code object disagree, rebuild the bundle");
    functions_.emplace(v.symbol, f);
    return f;
  }

 private:
  int device_;
  void* image_ = nullptr;
  void* handle_ = nullptr;  // null until a load succeeds: a failed load is never unloaded
  std::map<std::string, void*> functions_;
};

class ModuleCache {
 public:
  // Deliberately never destroyed: unloading modules during static destruction races the runtime's own
  // teardown. Modules live as long as the process, as torch's own kernels do.
  static ModuleCache& instance() {
    static ModuleCache* cache = new ModuleCache();
    return *cache;
  }
  void* function(int device, const VariantPlan& v) {
    std::lock_guard<std::mutex> lock(mu_);
    auto key = std::make_pair(device, v.sha256);
    auto it = modules_.find(key);
    if (it == modules_.end()) it = modules_.emplace(key, std::make_unique<Module>(device, v)).first;
    return it->second->function(v);
  }
  size_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    return modules_.size();
  }

 private:
  std::mutex mu_;
  std::map<std::pair<int, std::string>, std::unique_ptr<Module>> modules_;
};

// ---------------------------------------------------------------------------------------------
// Per-target variant choice and per-device state.

struct Selection {
  std::string target;
  std::vector<std::vector<int>> variant;  // [op][spec] -> variant index, or -1
  std::vector<std::vector<std::string>> reason;  // [op][spec] -> why none (when -1)
};

struct LoadedKernel {
  void* function = nullptr;
  std::atomic<int64_t> dynamic_shared_allowed{48 * 1024};
};

struct DeviceState {
  DeviceState(int index, driver::DeviceInfo i, const Selection* s, size_t n_variants)
      : device(index), info(std::move(i)), selection(s), kernels(new std::atomic<LoadedKernel*>[n_variants]) {
    for (size_t k = 0; k < n_variants; ++k) kernels[k].store(nullptr, std::memory_order_relaxed);
  }
  int device;
  driver::DeviceInfo info;
  const Selection* selection;
  std::unique_ptr<std::atomic<LoadedKernel*>[]> kernels;  // by variant id, published once loaded
  std::mutex mu;
  std::vector<std::unique_ptr<LoadedKernel>> owned;
};

class BundleCore;

// ---------------------------------------------------------------------------------------------
// One call's arguments by slot, and the expression environment over them.

struct Call {
  const OpPlan* op = nullptr;
  const at::Tensor* t[kMaxSlots];  // tensors by slot (outputs once they exist)
  int64_t i[kMaxSlots];  // int and bool scalars
  double f[kMaxSlots];  // float scalars
  c10::SmallVector<at::Tensor, 4> fresh;  // outputs allocated by this call
  c10::SmallVector<c10::SmallVector<int64_t, 6>, 4> out_shapes;
  c10::SmallVector<at::ScalarType, 4> out_dtypes;
  c10::Device device = c10::Device(c10::DeviceType::CPU);

  int64_t shape(int s, int d) const { return t[s]->sizes()[d]; }
  int64_t stride(int s, int d) const { return t[s]->strides()[d]; }
  int64_t numel(int s) const { return t[s]->numel(); }
  int64_t scalar(int s) const { return i[s]; }
};

struct Decision {
  int spec = -1;
  int variant = -1;
  std::string reason;  // why nothing fits (spec == -1)
};

// ---------------------------------------------------------------------------------------------
// An op: its plan, reference and counters.

class OpState {
 public:
  OpState(BundleCore* bundle, int index, OpPlan plan, py::object reference)
      : bundle_(bundle), index_(index), plan_(std::move(plan)), reference_(std::move(reference)),
        launches_(new std::atomic<uint64_t>[plan_.specs.size() ? plan_.specs.size() : 1]) {
    for (size_t s = 0; s < plan_.specs.size(); ++s) launches_[s].store(0);
  }

  const OpPlan& plan() const { return plan_; }
  int index() const { return index_; }

  // The boxed kernel: the last arguments on `stack` are the op's inputs (and out tensors for .out).
  // `forced_spec` >= 0 runs that specialization or raises (verification).
  void run(torch::jit::Stack* stack, bool is_out, int forced_spec);

  // Bind `args` (inputs, then out tensors when is_out) into `c`, checking kinds, ranks and, when
  // `check_device`, that every tensor is on one GPU.
  void bind(Call& c, c10::ArrayRef<c10::IValue> args, bool is_out, bool check_device) const;
  // Output shapes and dtypes from the plan's rules.
  void output_rules(Call& c) const;
  // Allocate the outputs (functional form) on the call's device.
  void allocate_outputs(Call& c) const;
  // The first specialization whose guard holds and that has code for `sel`'s target.
  Decision decide(const Call& c, const Selection& sel, bool is_out) const;
  // Whether specialization `s` fits; fills *why when it does not and why != nullptr.
  bool fits(const Call& c, int s, const Selection& sel, bool is_out, std::string* why) const;
  // Pack the kernarg buffer of variant `v` for call `c` into `buf` (v.kernarg_size bytes).
  void pack_kernargs(const VariantPlan& v, const Call& c, int64_t programs, uint8_t* buf,
                     c10::SmallVector<at::Tensor, 2>* scratch) const;
  // Evaluate program `p` of variant `v` (grid, dynamic LDS, expr fields).
  int64_t eval(const VariantPlan& v, const Program& p, const Call& c, const char* what) const;
  void grid(const VariantPlan& v, const Call& c, int64_t g[3]) const;

  py::dict stats() const;
  void reset_stats();
  // Counts a fallback; true the first time this reason is seen (the caller then warns once).
  bool count_fallback(const std::string& reason) {
    std::lock_guard<std::mutex> lock(stats_mu_);
    return ++fallbacks_[reason] == 1;
  }

  std::vector<at::Tensor> call_reference(const Call& c) const;
  // bind + output rules + out-tensor checks (+ early allocation when a guard reads an output).
  void prepare(Call& c, c10::ArrayRef<c10::IValue> args, bool is_out, bool check_device) const;
  void check_no_overlap(const Call& c) const;
  // No specialization fits: run the reference (or raise when the fallback is off), counting the reason.
  void fallback(Call& c, const std::string& reason, bool is_out);
  std::vector<at::Tensor> outputs(const Call& c) const;

  std::string label() const { return "flyship " + plan_.qualname; }

 private:
  void launch(Call& c, DeviceState& ds, int spec, int variant);

  BundleCore* bundle_;
  int index_;
  OpPlan plan_;
  PyRef reference_;
  std::unique_ptr<std::atomic<uint64_t>[]> launches_;
  std::atomic<uint64_t> empty_{0};
  mutable std::mutex stats_mu_;
  std::map<std::string, uint64_t> fallbacks_;
};

// ---------------------------------------------------------------------------------------------
// A loaded bundle.

class BundleCore {
 public:
  BundleCore(const py::dict& plan, py::object selector, bool fallback) : selector_(std::move(selector)) {
    const int version = need<int>(plan, "version", "bundle");
    TORCH_CHECK(version == kPlanVersion, "flyship: plan version ", version, " from Python, extension reads ",
                kPlanVersion, "; the loader and its compiled extension are out of step, rebuild it (flyship prebuild)");
    ns_ = need<std::string>(plan, "namespace", "bundle");
    fallback_.store(fallback);
    for (size_t d = 0; d < kMaxDevices; ++d) devices_[d].store(nullptr);
    auto ops = need<py::list>(plan, "ops", "bundle");
    auto refs = need<py::list>(plan, "references", "bundle");
    TORCH_CHECK(refs.size() == ops.size(), "flyship plan: one reference entry per op expected");
    int variant_id = 0;
    for (size_t k = 0; k < ops.size(); ++k) {
      OpPlan p = parse_op(ops[k].cast<py::dict>());
      for (auto& s : p.specs)
        for (auto& v : s.variants) v.id = variant_id++;
      ops_.push_back(std::make_unique<OpState>(this, static_cast<int>(k), std::move(p),
                                               py::reinterpret_borrow<py::object>(refs[k])));
    }
    for (auto& o : ops_)
      for (auto& s : o->plan().specs)
        for (auto& v : s.variants) variants_.push_back(&v);
  }

  const std::string& ns() const { return ns_; }
  OpState& op(int k) {
    TORCH_CHECK(k >= 0 && k < static_cast<int>(ops_.size()), "flyship: op index ", k, " out of range");
    return *ops_[k];
  }
  int n_ops() const { return static_cast<int>(ops_.size()); }
  bool fallback() const { return fallback_.load(std::memory_order_relaxed); }
  void set_fallback(bool on) { fallback_.store(on); }

  // The variant choice for a device target ID, asked of Python once per target.
  const Selection& selection(const std::string& target);
  // The state of device `index`, created on first use (reads the device's target ID).
  DeviceState& device(int index);
  // The kernel of variant `v` on device `ds`, loaded on first use; checks the device limits.
  LoadedKernel& kernel(DeviceState& ds, const VariantPlan& v, const OpState& op);

 private:
  std::string ns_;
  PyRef selector_;
  std::atomic<bool> fallback_{true};
  std::vector<std::unique_ptr<OpState>> ops_;
  std::vector<const VariantPlan*> variants_;
  std::mutex mu_;
  std::map<std::string, std::unique_ptr<Selection>> selections_;
  std::atomic<DeviceState*> devices_[kMaxDevices];
  std::vector<std::unique_ptr<DeviceState>> device_owned_;
};

const Selection& BundleCore::selection(const std::string& target) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = selections_.find(target);
    if (it != selections_.end()) return *it->second;
  }
  // Ask Python without holding mu_ (never wait for the GIL while holding a lock of ours).
  auto sel = std::make_unique<Selection>();
  sel->target = target;
  {
    py::gil_scoped_acquire gil;
    py::object r;
    try {
      r = selector_.get()(target);
    } catch (py::error_already_set& e) {
      TORCH_CHECK(false, "flyship: choosing code objects for target '", target, "' failed: ",
                  std::string(py::str(e.type().attr("__name__"))), ": ", std::string(py::str(e.value())));
    }
    auto per_op = r.cast<py::list>();
    TORCH_CHECK(static_cast<int>(per_op.size()) == n_ops(), "flyship: target selection returned ", per_op.size(),
                " ops, expected ", n_ops());
    for (int k = 0; k < n_ops(); ++k) {
      auto per_spec = per_op[k].cast<py::list>();
      const auto& specs = ops_[k]->plan().specs;
      TORCH_CHECK(per_spec.size() == specs.size(), "flyship: target selection for op ", ops_[k]->plan().name,
                  " has the wrong number of specializations");
      std::vector<int> v;
      std::vector<std::string> why;
      for (size_t s = 0; s < specs.size(); ++s) {
        auto pr = per_spec[s].cast<py::sequence>();
        const int idx = pr[0].cast<int>();
        TORCH_CHECK(idx >= -1 && idx < static_cast<int>(specs[s].variants.size()),
                    "flyship: target selection index out of range");
        v.push_back(idx);
        why.push_back(pr[1].cast<std::string>());
      }
      sel->variant.push_back(std::move(v));
      sel->reason.push_back(std::move(why));
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = selections_.find(target);
  if (it == selections_.end()) it = selections_.emplace(target, std::move(sel)).first;
  return *it->second;
}

DeviceState& BundleCore::device(int index) {
  TORCH_CHECK(index >= 0 && index < kMaxDevices, "flyship: device index ", index, " out of range (0..",
              kMaxDevices - 1, ")");
  DeviceState* ds = devices_[index].load(std::memory_order_acquire);
  if (ds != nullptr) return *ds;
  driver::DeviceInfo info;
  driver::Status s = driver::device_info(index, &info);
  TORCH_CHECK(s.ok(), "flyship: reading the properties of device ", index, " failed: ", s.message, " (",
              driver::runtime_version(), ")");
  const Selection& sel = selection(info.target);
  auto fresh = std::make_unique<DeviceState>(index, info, &sel, variants_.size());
  std::lock_guard<std::mutex> lock(mu_);
  ds = devices_[index].load(std::memory_order_acquire);
  if (ds == nullptr) {
    ds = fresh.get();
    device_owned_.push_back(std::move(fresh));
    devices_[index].store(ds, std::memory_order_release);
  }
  return *ds;
}

LoadedKernel& BundleCore::kernel(DeviceState& ds, const VariantPlan& v, const OpState& op) {
  LoadedKernel* k = ds.kernels[v.id].load(std::memory_order_acquire);
  if (k != nullptr) return *k;
  const int64_t threads = int64_t(v.block[0]) * v.block[1] * v.block[2];
  TORCH_CHECK(threads <= ds.info.max_threads_per_block, op.label(), ": kernel ", v.label, " needs a workgroup of ",
              threads, " work-items; device ", ds.device, " (", ds.info.target, ") allows ",
              ds.info.max_threads_per_block, "; rebuild the kernel with a smaller block");
  TORCH_CHECK(v.static_lds <= ds.info.max_shared_per_block, op.label(), ": kernel ", v.label, " needs ", v.static_lds,
              " bytes of static LDS / shared memory; device ", ds.device, " (", ds.info.target, ") allows ",
              ds.info.max_shared_per_block, " per workgroup; rebuild the kernel for this device");
  void* f = ModuleCache::instance().function(ds.device, v);
  std::lock_guard<std::mutex> lock(ds.mu);
  k = ds.kernels[v.id].load(std::memory_order_acquire);
  if (k == nullptr) {
    auto fresh = std::make_unique<LoadedKernel>();
    fresh->function = f;
    k = fresh.get();
    ds.owned.push_back(std::move(fresh));
    ds.kernels[v.id].store(k, std::memory_order_release);
  }
  return *k;
}

// ---------------------------------------------------------------------------------------------
// OpState: binding, rules, guards.

void OpState::bind(Call& c, c10::ArrayRef<c10::IValue> args, bool is_out, bool check_device) const {
  const OpPlan& p = plan_;
  c.op = &p;
  const size_t expect = p.n_inputs + (is_out ? p.outputs.size() : 0);
  TORCH_CHECK(args.size() == expect, label(), ": expected ", expect, " arguments, got ", args.size());
  const at::Tensor* first = nullptr;
  int first_slot = -1;
  for (size_t k = 0; k < expect; ++k) {
    const Slot& s = p.slots[k];
    const c10::IValue& v = args[k];
    if (s.kind == kTensor) {
      TORCH_CHECK_TYPE(v.isTensor(), label(), ": expected a tensor for argument '", s.name, "', got ", v.tagKind());
      const at::Tensor& x = v.toTensor();
      TORCH_CHECK(x.defined(), label(), ": argument '", s.name, "' is an undefined tensor");
      TORCH_CHECK(x.dim() == s.rank, label(), ": expected '", s.name, "' of rank ", s.rank, ", got rank ", x.dim(),
                  " (shape ", shape_str(x.sizes()), ")");
      c.t[k] = &x;
      if (check_device) {
        TORCH_CHECK(x.is_cuda(), label(), ": expected tensors on a GPU device, got ", x.device().str(),
                    " for argument '", s.name, "'; move inputs with .cuda()");
      }
      if (first == nullptr) {
        first = &x;
        first_slot = static_cast<int>(k);
      } else if (check_device) {
        TORCH_CHECK(x.device() == first->device(), label(), ": expected all tensors on one device, got ",
                    first->device().str(), " for '", p.slots[first_slot].name, "' and ", x.device().str(), " for '",
                    s.name, "'");
      }
    } else if (s.kind == kFloat) {
      TORCH_CHECK_TYPE(v.isDouble() || v.isInt(), label(), ": expected a float for argument '", s.name, "', got ",
                       v.tagKind());
      c.f[k] = v.isDouble() ? v.toDouble() : static_cast<double>(v.toInt());
    } else if (s.kind == kInt) {
      TORCH_CHECK_TYPE(v.isInt() && !v.isBool(), label(), ": expected an int for argument '", s.name, "', got ",
                       v.tagKind());
      c.i[k] = v.toInt();
    } else {
      TORCH_CHECK_TYPE(v.isBool(), label(), ": expected a bool for argument '", s.name, "', got ", v.tagKind());
      c.i[k] = v.toBool() ? 1 : 0;
    }
  }
  for (size_t k = expect; k < p.slots.size(); ++k) c.t[k] = nullptr;
  c.device = first->device();
}

void OpState::output_rules(Call& c) const {
  const OpPlan& p = plan_;
  c.out_shapes.clear();
  c.out_dtypes.clear();
  for (const OutputPlan& o : p.outputs) {
    c10::SmallVector<int64_t, 6> shape;
    for (const Program& prog : o.shape) {
      int64_t d = 0;
      TORCH_CHECK(evaluate(prog.code, c, &d), label(), ": output '", o.name, "' shape expression '", prog.text,
                  "' divides by zero for these inputs");
      TORCH_CHECK(d >= 0, label(), ": output '", o.name, "' shape expression '", prog.text, "' gives ", d,
                  " for these inputs; expected a size >= 0");
      shape.push_back(d);
    }
    c.out_shapes.push_back(std::move(shape));
    c.out_dtypes.push_back(o.dtype_slot >= 0 ? c.t[o.dtype_slot]->scalar_type() : o.dtype);
  }
}

void OpState::allocate_outputs(Call& c) const {
  const OpPlan& p = plan_;
  c.fresh.clear();
  c.fresh.reserve(p.outputs.size());  // pointers into `fresh` are kept in c.t
  for (size_t j = 0; j < p.outputs.size(); ++j) {
    c.fresh.push_back(at::empty(c.out_shapes[j], at::TensorOptions().dtype(c.out_dtypes[j]).device(c.device)));
  }
  for (size_t j = 0; j < p.outputs.size(); ++j) c.t[p.n_inputs + j] = &c.fresh[j];
}

bool OpState::fits(const Call& c, int si, const Selection& sel, bool is_out, std::string* why) const {
  const OpPlan& p = plan_;
  const SpecPlan& s = p.specs[si];
  if (sel.variant[index_][si] < 0) {
    if (why) *why = sel.reason[index_][si];
    return false;
  }
  for (const auto& [slot, dt] : s.dtypes) {
    if (c.t[slot]->scalar_type() != dt) {
      if (why) *why = "dtype " + p.slots[slot].name + "=" + dtype_name(c.t[slot]->scalar_type());
      return false;
    }
  }
  for (const auto& [slot, align] : s.alignment) {
    if (c.t[slot] == nullptr) continue;  // a fresh output: the allocator aligns it
    if (reinterpret_cast<uintptr_t>(c.t[slot]->data_ptr()) % static_cast<uintptr_t>(align) != 0) {
      if (why) *why = "alignment " + p.slots[slot].name + " not " + std::to_string(align) + "-byte aligned";
      return false;
    }
  }
  auto holds = [&](const Program& prog) {
    int64_t v = 0;
    if (!evaluate(prog.code, c, &v)) {
      if (why) *why = "constraint '" + prog.text + "' divides by zero";
      return false;
    }
    if (v == 0) {
      if (why) *why = "constraint '" + prog.text + "' false";
      return false;
    }
    return true;
  };
  for (const Program& prog : s.constraints)
    if (!holds(prog)) return false;
  if (is_out) {
    for (const Program& prog : s.out_constraints)
      if (!holds(prog)) return false;
  }
  return true;
}

Decision OpState::decide(const Call& c, const Selection& sel, bool is_out) const {
  Decision d;
  const int n = static_cast<int>(plan_.specs.size());
  for (int s = 0; s < n; ++s) {
    if (fits(c, s, sel, is_out, nullptr)) {
      d.spec = s;
      d.variant = sel.variant[index_][s];
      return d;
    }
  }
  // Nothing fits: say why, once per specialization (the slow path only).
  std::vector<std::string> whys;
  bool all_same = true;
  for (int s = 0; s < n; ++s) {
    std::string why;
    fits(c, s, sel, is_out, &why);
    if (!whys.empty() && why != whys.front()) all_same = false;
    whys.push_back(why);
  }
  if (n == 0) {
    d.reason = "the op has no specializations";
  } else if (all_same) {
    d.reason = whys.front();
  } else {
    std::vector<std::string> parts;
    for (int s = 0; s < n; ++s) parts.push_back(plan_.specs[s].name + ": " + whys[s]);
    d.reason = join(parts, "; ");
  }
  return d;
}

// ---------------------------------------------------------------------------------------------
// Kernarg packing: values to offsets, nothing else.

namespace {

template <class T>
void put(uint8_t* buf, int64_t offset, T v) {
  std::memcpy(buf + offset, &v, sizeof(T));
}

void put_float(uint8_t* buf, const Field& f, double v) {
  switch (f.type) {
    case kF64: put<double>(buf, f.offset, v); break;
    case kF32: put<float>(buf, f.offset, static_cast<float>(v)); break;
    case kF16: put<uint16_t>(buf, f.offset, c10::Half(static_cast<float>(v)).x); break;
    case kBF16: put<uint16_t>(buf, f.offset, c10::BFloat16(static_cast<float>(v)).x); break;
    default: TORCH_CHECK(false, "flyship: internal error: put_float with type ", kTypeName[f.type]);
  }
}

// Write integer `v` as the field's type; false if it does not fit.
bool put_int(uint8_t* buf, const Field& f, int64_t v) {
  switch (f.type) {
    case kPtr: case kI64: put<int64_t>(buf, f.offset, v); return true;
    case kU64: if (v < 0) return false; put<uint64_t>(buf, f.offset, static_cast<uint64_t>(v)); return true;
    case kI32:
      if (v < INT32_MIN || v > INT32_MAX) return false;
      put<int32_t>(buf, f.offset, static_cast<int32_t>(v));
      return true;
    case kU32:
      if (v < 0 || v > UINT32_MAX) return false;
      put<uint32_t>(buf, f.offset, static_cast<uint32_t>(v));
      return true;
    case kI16:
      if (v < INT16_MIN || v > INT16_MAX) return false;
      put<int16_t>(buf, f.offset, static_cast<int16_t>(v));
      return true;
    case kI8:
      if (v < INT8_MIN || v > INT8_MAX) return false;
      put<int8_t>(buf, f.offset, static_cast<int8_t>(v));
      return true;
    default: put_float(buf, f, static_cast<double>(v)); return true;
  }
}

}  // namespace

int64_t OpState::eval(const VariantPlan& v, const Program& p, const Call& c, const char* what) const {
  int64_t out = 0;
  TORCH_CHECK(evaluate(p.code, c, &out), label(), ": ", what, " expression '", p.text, "' of ", v.label,
              " divides by zero for these inputs");
  return out;
}

void OpState::grid(const VariantPlan& v, const Call& c, int64_t g[3]) const {
  for (int k = 0; k < 3; ++k) {
    g[k] = eval(v, v.programs[v.grid[k]], c, "grid");
    TORCH_CHECK(g[k] >= 0 && g[k] <= UINT32_MAX, label(), ": grid expression '", v.programs[v.grid[k]].text, "' gives ",
                g[k], " workgroups; expected 0..", UINT32_MAX);
  }
}

void OpState::pack_kernargs(const VariantPlan& v, const Call& c, int64_t programs, uint8_t* buf,
                            c10::SmallVector<at::Tensor, 2>* scratch) const {
  std::memset(buf, 0, v.kernarg_size);  // padding and null fields read as zero
  for (const Field& f : v.fields) {
    int64_t value = 0;
    switch (f.kind) {
      case kPointer: put<uint64_t>(buf, f.offset, reinterpret_cast<uintptr_t>(c.t[f.slot]->data_ptr())); continue;
      case kNull: continue;
      case kConstant: std::memcpy(buf + f.offset, f.constant, kTypeSize[f.type]); continue;
      case kScalar: {
        const int kind = plan_.slots[f.slot].kind;
        if (kind == kFloat) {
          put_float(buf, f, c.f[f.slot]);
          continue;
        }
        value = c.i[f.slot];
        break;
      }
      case kShape: value = c.shape(f.slot, f.dim); break;
      case kStride: value = c.stride(f.slot, f.dim); break;
      case kExpr: value = eval(v, v.programs[f.program], c, "kernarg"); break;
      case kScratch: {
        // bytes_per_program x programs of fresh device memory, aligned. The tensor is kept alive until
        // the launch is enqueued; torch's stream-ordered allocator then reuses it only after the kernel.
        const int64_t bytes = f.bytes_per_program * programs;
        at::Tensor t = at::empty({bytes + f.align}, at::TensorOptions().dtype(at::kByte).device(c.device));
        const uintptr_t base = reinterpret_cast<uintptr_t>(t.data_ptr());
        const uintptr_t aligned = (base + f.align - 1) & ~static_cast<uintptr_t>(f.align - 1);
        put<uint64_t>(buf, f.offset, aligned);
        scratch->push_back(std::move(t));
        continue;
      }
      default: TORCH_CHECK(false, "flyship: internal error: field kind ", f.kind);
    }
    TORCH_CHECK(put_int(buf, f, value), label(), ": kernel argument ", f.label, " of ", v.label, " (",
                kTypeName[f.type], ") cannot hold the value ", value, " of these inputs; the bundle needs a guard for "
                "it (rebuild with a constraint), or call with smaller inputs");
  }
}

// ---------------------------------------------------------------------------------------------
// The call path.

namespace {
// Bytes [first, last) a tensor's elements can touch (strides are non-negative in torch).
std::pair<uintptr_t, uintptr_t> byte_span(const at::Tensor& t) {
  const auto start = reinterpret_cast<uintptr_t>(t.data_ptr());
  if (t.numel() == 0) return {start, start};
  int64_t last = 0;
  for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
  return {start, start + static_cast<uintptr_t>((last + 1) * t.element_size())};
}
}  // namespace

// The out variant's tensors must not share memory with an input or with each other. A kernel may read an
// input after writing an output (a GEMM reads A and B across the whole K loop), so even an exact alias can
// give wrong results silently; flyship cannot know which kernels tolerate it, so it refuses all overlap.
void OpState::check_no_overlap(const Call& c) const {
  const OpPlan& p = plan_;
  const int n = p.n_inputs + static_cast<int>(p.outputs.size());
  for (int j = p.n_inputs; j < n; ++j) {
    const auto [o0, o1] = byte_span(*c.t[j]);
    if (o0 == o1) continue;
    for (int k = 0; k < j; ++k) {
      if (p.slots[k].kind != kTensor) continue;
      const auto [a0, a1] = byte_span(*c.t[k]);
      TORCH_CHECK(a0 == a1 || o1 <= a0 || a1 <= o0, label(), ": out tensor '", p.slots[j].name,
                  "' shares memory with ", (k < p.n_inputs ? "input '" : "out tensor '"), p.slots[k].name,
                  "'; a kernel may read its inputs after writing its outputs, so out= must not overlap them; "
                  "pass a separate tensor (or call the functional op)");
    }
  }
}

void OpState::prepare(Call& c, c10::ArrayRef<c10::IValue> args, bool is_out, bool check_device) const {
  const OpPlan& p = plan_;
  bind(c, args, is_out, check_device);
  output_rules(c);
  if (is_out) {
    for (size_t j = 0; j < p.outputs.size(); ++j) {
      const at::Tensor& o = *c.t[p.n_inputs + j];
      TORCH_CHECK(o.sizes() == c10::IntArrayRef(c.out_shapes[j]) && o.scalar_type() == c.out_dtypes[j], label(),
                  ": expected out tensor '", p.slots[p.n_inputs + j].name, "' of shape ", shape_str(c.out_shapes[j]),
                  " and dtype ", dtype_name(c.out_dtypes[j]), ", got shape ", shape_str(o.sizes()), " and dtype ",
                  dtype_name(o.scalar_type()), "; allocate it with torch.empty(", shape_str(c.out_shapes[j]),
                  ", dtype=torch.", dtype_name(c.out_dtypes[j]), ", device=x.device)");
    }
    check_no_overlap(c);
  } else if (p.guard_uses_outputs) {
    allocate_outputs(c);
  }
}

void OpState::run(torch::jit::Stack* stack, bool is_out, int forced_spec) {
  const OpPlan& p = plan_;
  const size_t n_args = p.n_inputs + (is_out ? p.outputs.size() : 0);
  TORCH_CHECK(stack->size() >= n_args, label(), ": internal error: stack holds ", stack->size(), " values");
  auto args = torch::jit::last(*stack, n_args);
  Call c;
  prepare(c, args, is_out, /*check_device=*/true);
  DeviceState& ds = bundle_->device(c.device.index());
  Decision d;
  if (forced_spec >= 0) {
    TORCH_CHECK(forced_spec < static_cast<int>(p.specs.size()), label(), ": specialization index out of range");
    std::string why;
    TORCH_CHECK(fits(c, forced_spec, *ds.selection, is_out, &why), label(), ": these inputs do not fit specialization ",
                p.specs[forced_spec].name, ": ", why);
    d.spec = forced_spec;
    d.variant = ds.selection->variant[index_][forced_spec];
  } else {
    d = decide(c, *ds.selection, is_out);
  }
  if (d.spec >= 0) {
    if (!is_out && c.fresh.empty()) allocate_outputs(c);
    launch(c, ds, d.spec, d.variant);
  } else {
    fallback(c, d.reason, is_out);
  }
  // Results: the fresh outputs; the out variant returns nothing (its schema mutates the out tensors and
  // returns (), the form torch.compile can functionalize for a custom op).
  std::vector<at::Tensor> results;
  if (!is_out) results = outputs(c);
  torch::jit::drop(*stack, n_args);
  for (auto& r : results) stack->emplace_back(std::move(r));
}

std::vector<at::Tensor> OpState::outputs(const Call& c) const {
  std::vector<at::Tensor> results;
  results.reserve(plan_.outputs.size());
  for (size_t j = 0; j < plan_.outputs.size(); ++j) results.push_back(*c.t[plan_.n_inputs + j]);
  return results;
}

void OpState::launch(Call& c, DeviceState& ds, int spec, int variant) {
  const VariantPlan& v = plan_.specs[spec].variants[variant];
  const int dev = c.device.index();
  LoadedKernel& k = bundle_->kernel(ds, v, *this);
  int64_t g[3];
  grid(v, c, g);
  if (g[0] == 0 || g[1] == 0 || g[2] == 0) {  // empty inputs: nothing to launch (a zero grid is a launch error)
    empty_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  const int64_t dyn = eval(v, v.programs[v.dynamic_lds], c, "dynamic LDS");
  TORCH_CHECK(dyn >= 0 && v.static_lds + dyn <= ds.info.max_shared_per_block, label(), ": kernel ", v.label,
              " needs ", v.static_lds, " bytes of static + ", dyn, " bytes of dynamic LDS / shared memory for these "
              "inputs; device ", dev, " (", ds.info.target, ") allows ", ds.info.max_shared_per_block,
              " per workgroup");
  if (dyn > k.dynamic_shared_allowed.load(std::memory_order_relaxed)) {
    driver::Status s = driver::allow_dynamic_shared(dev, k.function, dyn);
    TORCH_CHECK(s.ok(), label(), ": allowing ", dyn, " bytes of dynamic shared memory for ", v.label,
                " on device ", dev, " failed: ", s.message);
    k.dynamic_shared_allowed.store(dyn, std::memory_order_relaxed);
  }
  c10::DeviceGuard guard(c.device);
  alignas(64) uint8_t inline_buf[kInlineKernargBytes];
  std::vector<uint8_t> heap_buf;
  uint8_t* buf = inline_buf;
  if (static_cast<size_t>(v.kernarg_size) > kInlineKernargBytes) {
    heap_buf.resize(static_cast<size_t>(v.kernarg_size) + 64);
    buf = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(heap_buf.data()) + 63) & ~uintptr_t(63));
  }
  c10::SmallVector<at::Tensor, 2> scratch;
  pack_kernargs(v, c, g[0] * g[1] * g[2], buf, &scratch);
  // torch's current stream of this device; Stream::native_handle gives the hipStream_t / cudaStream_t
  // without the CUDA or HIP torch headers (c10::Stream::native_handle, torch >= 2.2).
  void* stream = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(c.device).native_handle();
  const uint32_t grid32[3] = {static_cast<uint32_t>(g[0]), static_cast<uint32_t>(g[1]), static_cast<uint32_t>(g[2])};
  driver::Status s = driver::launch(dev, k.function, grid32, v.block, static_cast<uint32_t>(dyn), stream, buf,
                                    static_cast<size_t>(v.kernarg_size));
  TORCH_CHECK(s.ok(), label(), ": launching ", v.label, " on device ", dev, " (", ds.info.target, ") failed: ",
              s.message, " [grid ", g[0], "x", g[1], "x", g[2], ", block ", v.block[0], "x", v.block[1], "x",
              v.block[2], "]");
  launches_[spec].fetch_add(1, std::memory_order_relaxed);
}

std::vector<at::Tensor> OpState::call_reference(const Call& c) const {
  const OpPlan& p = plan_;
  std::vector<at::Tensor> out;
  std::string error;
  {
    py::gil_scoped_acquire gil;
    try {
      py::tuple args(p.n_inputs);
      for (int k = 0; k < p.n_inputs; ++k) {
        switch (p.slots[k].kind) {
          case kTensor: args[k] = py::cast(*c.t[k]); break;
          case kFloat: args[k] = py::float_(c.f[k]); break;
          case kInt: args[k] = py::int_(c.i[k]); break;
          default: args[k] = py::bool_(c.i[k] != 0); break;
        }
      }
      py::object r = reference_.get()(*args);
      if (THPVariable_Check(r.ptr())) {
        out.push_back(r.cast<at::Tensor>());
      } else if (py::isinstance<py::tuple>(r) || py::isinstance<py::list>(r)) {
        for (auto item : r.cast<py::sequence>()) {
          if (!THPVariable_Check(item.ptr())) {
            error = "returned a sequence holding a " + std::string(py::str(py::type::handle_of(item).attr("__name__")));
            break;
          }
          out.push_back(item.cast<at::Tensor>());
        }
      } else {
        error = "returned a " + std::string(py::str(py::type::handle_of(r).attr("__name__"))) + ", expected tensors";
      }
    } catch (py::error_already_set& e) {
      // The exception's type and message; its Python traceback stays out of the one-line error.
      error = "raised " + std::string(py::str(e.type().attr("__name__"))) + ": " + std::string(py::str(e.value()));
    }
  }
  TORCH_CHECK(error.empty(), label(), ": the reference (fallback) ", error);
  // The functional op promises fresh outputs (its schema has no alias annotation): a reference that returns
  // an input, or a view of one, is given a copy.
  for (auto& o : out) {
    for (int k = 0; k < p.n_inputs; ++k) {
      if (p.slots[k].kind == kTensor && o.is_alias_of(*c.t[k])) {
        o = o.clone();
        break;
      }
    }
  }
  TORCH_CHECK(out.size() == p.outputs.size(), label(), ": the reference returned ", out.size(), " tensors, the op has ",
              p.outputs.size(), " outputs");
  for (size_t j = 0; j < out.size(); ++j) {
    TORCH_CHECK(out[j].sizes() == c10::IntArrayRef(c.out_shapes[j]) && out[j].scalar_type() == c.out_dtypes[j] &&
                    out[j].device() == c.device,
                label(), ": the reference returned output '", p.outputs[j].name, "' of shape ",
                shape_str(out[j].sizes()), ", dtype ", dtype_name(out[j].scalar_type()), " on ", out[j].device().str(),
                "; the manifest's rule gives ", shape_str(c.out_shapes[j]), ", ", dtype_name(c.out_dtypes[j]), " on ",
                c.device.str(), "; fix the reference or the output rule");
  }
  return out;
}

void OpState::fallback(Call& c, const std::string& reason, bool is_out) {
  const OpPlan& p = plan_;
  std::vector<std::string> names;
  for (const auto& s : p.specs) names.push_back(s.name);
  TORCH_CHECK(bundle_->fallback(), label(), ": no specialization fits these inputs (", reason,
              ") and the fallback is off (FLYSHIP_FALLBACK=0 or load(fallback=False)); specializations: ",
              join(names, ", "), "; change the inputs to fit one, or turn the fallback on to run the PyTorch "
              "reference");
  TORCH_CHECK(!reference_.empty(), label(), ": no specialization fits these inputs (", reason, ") and the op has no "
              "reference to fall back to; pass one with load(..., references={'", p.name, "': fn})");
  if (count_fallback(reason)) {
    // Once per op and reason: a workload whose inputs never fit the kernel should not pass unnoticed.
    // (FLYSHIP_FALLBACK=0 turns this into an error; stats() counts every fallback.)
    py::gil_scoped_acquire gil;
    const std::string msg = label() + ": no specialization fits these inputs (" + reason +
                            "); running the PyTorch reference instead. This warning is shown once per reason; "
                            "ops.<op>.stats() counts fallbacks, FLYSHIP_FALLBACK=0 makes them errors.";
    if (PyErr_WarnEx(PyExc_UserWarning, msg.c_str(), 1) != 0) throw py::error_already_set();
  }
  std::vector<at::Tensor> out = call_reference(c);
  if (is_out) {
    for (size_t j = 0; j < out.size(); ++j) const_cast<at::Tensor*>(c.t[p.n_inputs + j])->copy_(out[j]);
  } else {
    c.fresh.clear();
    c.fresh.reserve(out.size());
    for (auto& t : out) c.fresh.push_back(std::move(t));
    for (size_t j = 0; j < out.size(); ++j) c.t[p.n_inputs + j] = &c.fresh[j];
  }
}

py::dict OpState::stats() const {
  py::dict launches;
  uint64_t total = 0;
  for (size_t s = 0; s < plan_.specs.size(); ++s) {
    const uint64_t n = launches_[s].load();
    launches[py::str(plan_.specs[s].name)] = n;
    total += n;
  }
  py::dict fallbacks;
  uint64_t fb_total = 0;
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    for (const auto& [reason, n] : fallbacks_) {
      fallbacks[py::str(reason)] = n;
      fb_total += n;
    }
  }
  py::dict d;
  d["launches"] = launches;
  d["fallbacks"] = fallbacks;
  d["empty"] = empty_.load();
  d["calls"] = total + fb_total + empty_.load();
  return d;
}

void OpState::reset_stats() {
  for (size_t s = 0; s < plan_.specs.size(); ++s) launches_[s].store(0);
  empty_.store(0);
  std::lock_guard<std::mutex> lock(stats_mu_);
  fallbacks_.clear();
}

// ---------------------------------------------------------------------------------------------
// Registration with the dispatcher.

class OpKernel final : public c10::OperatorKernel {
 public:
  OpKernel(std::shared_ptr<BundleCore> bundle, int op, bool is_out)
      : bundle_(std::move(bundle)), op_(op), is_out_(is_out) {}
  void operator()(const c10::OperatorHandle&, c10::DispatchKeySet, torch::jit::Stack* stack) {
    bundle_->op(op_).run(stack, is_out_, -1);
  }

 private:
  std::shared_ptr<BundleCore> bundle_;
  int op_;
  bool is_out_;
};

// Autograd for the .out variant: aten's rule for out= functions (no automatic differentiation through
// them), then on below autograd, keeping ADInplaceOrView so the out tensors' versions are bumped.
class OutAutogradKernel final : public c10::OperatorKernel {
 public:
  explicit OutAutogradKernel(std::string qualname) : qualname_(std::move(qualname)) {}
  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
    const auto& schema_args = op.schema().arguments();
    if (at::GradMode::is_enabled()) {
      auto args = torch::jit::last(*stack, schema_args.size());
      for (size_t k = 0; k < args.size(); ++k) {
        TORCH_CHECK(!(args[k].isTensor() && args[k].toTensor().requires_grad()), "flyship ", qualname_,
                    ".out: functions with out=... arguments don't support automatic differentiation, but argument '",
                    schema_args[k].name(), "' requires grad; call it under torch.no_grad() or torch.inference_mode()");
      }
    }
    at::AutoDispatchBelowAutograd guard;
    op.redispatchBoxed(ks & c10::after_autograd_keyset, stack);
  }

 private:
  std::string qualname_;
};

// ADInplaceOrView for the .out variant: bump the out tensors' version counters, as torch does for
// every in-place write, so autograd notices if a tensor it saved was overwritten.
class OutVersionKernel final : public c10::OperatorKernel {
 public:
  explicit OutVersionKernel(size_t n_out) : n_out_(n_out) {}
  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
    c10::SmallVector<at::Tensor, 4> outs;
    for (const auto& v : torch::jit::last(*stack, n_out_)) outs.push_back(v.toTensor());
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      op.redispatchBoxed(ks & c10::after_ADInplaceOrView_keyset, stack);
    }
    for (const auto& t : outs) torch::autograd::impl::bump_version(t);
  }

 private:
  size_t n_out_;
};

// The Python handle of a loaded bundle: the core plus the dispatcher registrations it made.
struct Bundle {
  std::shared_ptr<BundleCore> core;
  std::vector<std::unique_ptr<torch::Library>> libraries;
};

void register_kernels(Bundle& b) {
  TORCH_CHECK(b.libraries.empty(), "flyship: bundle ", b.core->ns(), " is already registered");
  auto make = [&](c10::DispatchKey key) {
    b.libraries.push_back(
        std::make_unique<torch::Library>(torch::Library::IMPL, b.core->ns(), key, __FILE__, __LINE__));
    return b.libraries.back().get();
  };
  // The real kernel for GPU tensors (ROCm torch dispatches HIP tensors under the CUDA key too). CPU
  // tensors run the op's reference: that kernel is Python, registered beside the fake kernel
  // (flyship/loader/cpu.py), so the CPU key is left to it.
  for (c10::DispatchKey key : {c10::DispatchKey::CUDA}) {
    torch::Library* lib = make(key);
    for (int k = 0; k < b.core->n_ops(); ++k) {
      const std::string& name = b.core->op(k).plan().name;
      lib->impl(name.c_str(), torch::CppFunction::makeFromBoxedKernel(
                          c10::BoxedKernel::makeFromFunctor(std::make_unique<OpKernel>(b.core, k, false))));
      lib->impl((name + ".out").c_str(), torch::CppFunction::makeFromBoxedKernel(
                                   c10::BoxedKernel::makeFromFunctor(std::make_unique<OpKernel>(b.core, k, true))));
    }
  }
  // No derivatives. The functional op runs with inputs that require grad and its backward raises
  // "derivative for <op> is not implemented" (torch's NotImplemented node) rather than silently giving no
  // gradient; the out variant refuses such inputs up front, as aten's out= functions do.
  torch::Library* autograd = make(c10::DispatchKey::Autograd);
  torch::Library* inplace = make(c10::DispatchKey::ADInplaceOrView);
  for (int k = 0; k < b.core->n_ops(); ++k) {
    const OpPlan& p = b.core->op(k).plan();
    autograd->impl(p.name.c_str(), torch::autograd::autogradNotImplementedFallback());
    autograd->impl((p.name + ".out").c_str(),
                   torch::CppFunction::makeFromBoxedKernel(
                       c10::BoxedKernel::makeFromFunctor(std::make_unique<OutAutogradKernel>(p.qualname))));
    inplace->impl((p.name + ".out").c_str(),
                  torch::CppFunction::makeFromBoxedKernel(
                      c10::BoxedKernel::makeFromFunctor(std::make_unique<OutVersionKernel>(p.outputs.size()))));
  }
}

// Python values (tensors, floats, ints, bools) as IValues, for the test and verification entry points.
std::vector<c10::IValue> to_ivalues(const py::sequence& seq) {
  std::vector<c10::IValue> out;
  for (auto item : seq) {
    if (THPVariable_Check(item.ptr())) {
      out.emplace_back(item.cast<at::Tensor>());
    } else if (py::isinstance<py::bool_>(item)) {
      out.emplace_back(item.cast<bool>());
    } else if (py::isinstance<py::int_>(item)) {
      out.emplace_back(item.cast<int64_t>());
    } else if (py::isinstance<py::float_>(item)) {
      out.emplace_back(item.cast<double>());
    } else {
      TORCH_CHECK_TYPE(false, "flyship: expected tensors, floats, ints or bools, got ",
                       std::string(py::str(py::type::handle_of(item).attr("__name__"))));
    }
  }
  return out;
}

// Bind a call from Python values without touching a device: the same checks, rules and guards as a
// launch, on tensors of any device (CPU tensors stand in for GPU ones when there is no GPU).
// `allocate`: give a functional call its outputs now (packing needs their pointers).
void bind_for_test(Call& c, OpState& op, const std::vector<c10::IValue>& args, bool is_out, bool allocate) {
  op.prepare(c, args, is_out, /*check_device=*/false);
  if (!is_out && allocate && c.fresh.empty()) op.allocate_outputs(c);
}

}  // namespace flyship

// ---------------------------------------------------------------------------------------------
// Python module.

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace flyship;
  m.doc() = "flyship launch core (see csrc/flyship.cpp)";
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const c10::TypeError& e) {
      PyErr_SetString(PyExc_TypeError, e.what_without_backtrace());
    } catch (const c10::ValueError& e) {
      PyErr_SetString(PyExc_ValueError, e.what_without_backtrace());
    } catch (const c10::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
    }
  });
  m.attr("PLAN_VERSION") = kPlanVersion;
  m.def("flavor", [] { return std::string(driver::flavor()); },
        "The driver shim compiled in: 'hip' or 'cuda' (test-only: 'hip-nvidia').");
  m.def("runtime_version", &driver::runtime_version, "The GPU runtime's version, and the headers'.");
  m.def(
      "device_info",
      [](int device) {
        driver::DeviceInfo info;
        driver::Status s;
        {
          py::gil_scoped_release release;  // the runtime may block (first initialisation)
          s = driver::device_info(device, &info);
        }
        TORCH_CHECK(s.ok(), "flyship: reading the properties of device ", device, " failed: ", s.message, " (",
                    driver::runtime_version(), ")");
        py::dict d;
        d["target"] = info.target;
        d["name"] = info.name;
        d["max_shared_per_block"] = info.max_shared_per_block;
        d["max_threads_per_block"] = info.max_threads_per_block;
        return d;
      });
  m.def("loaded_modules", [] { return ModuleCache::instance().size(); });

  py::class_<Bundle, std::shared_ptr<Bundle>>(m, "Bundle")
      .def(py::init([](const py::dict& plan, py::object selector, bool fallback) {
             auto b = std::make_shared<Bundle>();
             b->core = std::make_shared<BundleCore>(plan, std::move(selector), fallback);
             return b;
           }),
           py::arg("plan"), py::arg("selector"), py::arg("fallback"))
      .def("register", [](Bundle& b) { register_kernels(b); })
      .def_property(
          "fallback", [](const Bundle& b) { return b.core->fallback(); },
          [](Bundle& b, bool on) { b.core->set_fallback(on); })
      .def("stats", [](Bundle& b, int op) { return b.core->op(op).stats(); })
      .def("reset_stats", [](Bundle& b, int op) { b.core->op(op).reset_stats(); })
      .def(
          "decide",
          [](Bundle& b, int op, const std::string& target, const py::sequence& args, bool is_out) {
            OpState& o = b.core->op(op);
            const Selection& sel = b.core->selection(target);
            auto iv = to_ivalues(args);
            Call c;
            bind_for_test(c, o, iv, is_out, /*allocate=*/false);
            Decision d = o.decide(c, sel, is_out);
            return py::make_tuple(d.spec, d.variant, d.reason);
          },
          "Which specialization and variant a call would run for a device target, or why none fits.")
      .def(
          "pack",
          [](Bundle& b, int op, int spec, int variant, const py::sequence& args, bool is_out) {
            OpState& o = b.core->op(op);
            const auto& specs = o.plan().specs;
            TORCH_CHECK(spec >= 0 && spec < static_cast<int>(specs.size()), o.label(),
                        ": specialization index out of range");
            TORCH_CHECK(variant >= 0 && variant < static_cast<int>(specs[spec].variants.size()), o.label(),
                        ": variant index out of range");
            const VariantPlan& v = specs[spec].variants[variant];
            auto iv = to_ivalues(args);
            Call c;
            bind_for_test(c, o, iv, is_out, /*allocate=*/true);
            int64_t g[3];
            o.grid(v, c, g);
            const int64_t dyn = o.eval(v, v.programs[v.dynamic_lds], c, "dynamic LDS");
            std::vector<uint8_t> buf(static_cast<size_t>(v.kernarg_size) + 1);
            c10::SmallVector<at::Tensor, 2> scratch;
            o.pack_kernargs(v, c, g[0] * g[1] * g[2], buf.data(), &scratch);
            py::dict d;
            d["buffer"] = py::bytes(reinterpret_cast<const char*>(buf.data()), static_cast<size_t>(v.kernarg_size));
            d["grid"] = py::make_tuple(g[0], g[1], g[2]);
            d["block"] = py::make_tuple(v.block[0], v.block[1], v.block[2]);
            d["dynamic_lds"] = dyn;
            py::list outs, scr;
            for (size_t j = 0; j < o.plan().outputs.size(); ++j) outs.append(py::cast(*c.t[o.plan().n_inputs + j]));
            for (auto& t : scratch) scr.append(py::cast(t));
            d["outputs"] = outs;
            d["scratch"] = scr;
            return d;
          },
          "The kernarg bytes, grid, block and dynamic LDS of a call (no launch).")
      .def(
          "call_on_target",
          [](Bundle& b, int op, const std::string& target, const py::sequence& args, bool is_out) {
            OpState& o = b.core->op(op);
            const Selection& sel = b.core->selection(target);
            auto iv = to_ivalues(args);
            Call c;
            bind_for_test(c, o, iv, is_out, /*allocate=*/false);
            Decision d = o.decide(c, sel, is_out);
            py::list out;
            if (d.spec >= 0) return py::make_tuple(d.spec, out);
            {
              py::gil_scoped_release release;
              o.fallback(c, d.reason, is_out);
            }
            for (auto& t : o.outputs(c)) out.append(py::cast(t));
            return py::make_tuple(d.spec, out);
          },
          "A call as a device of `target` would take it, without a device: returns (spec, []) when a "
          "specialization fits (nothing is launched), else runs the fallback exactly as a launch would.")
      .def(
          "run",
          [](Bundle& b, int op, const py::sequence& args, bool is_out, int forced_spec) {
            OpState& o = b.core->op(op);
            torch::jit::Stack stack = to_ivalues(args);
            {
              py::gil_scoped_release release;
              o.run(&stack, is_out, forced_spec);
            }
            py::list out;
            for (auto& v : stack) out.append(py::cast(v.toTensor()));
            return out;
          },
          "Run the op through the same path as the torch kernel, optionally forcing a specialization.")
      .def(
          "load_kernel",
          [](Bundle& b, int op, int spec, int variant, int device) {
            const auto& specs = b.core->op(op).plan().specs;
            TORCH_CHECK(spec >= 0 && spec < static_cast<int>(specs.size()) && variant >= 0 &&
                            variant < static_cast<int>(specs[spec].variants.size()),
                        "flyship: specialization or variant index out of range");
            const VariantPlan& v = specs[spec].variants[variant];
            py::gil_scoped_release release;
            ModuleCache::instance().function(device, v);
          },
          "Load one variant's code object onto a device (no launch).");
}
