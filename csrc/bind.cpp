// The per-call path, part 1: bind the call's arguments, apply the output rules, check out tensors.
#include <ATen/MemoryOverlap.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <algorithm>

#include "bundle.h"
#include "check.h"
#include "driver.h"
#include "op.h"
#include "util.h"

namespace flyship {

void Binder::check_device_type(const at::Tensor& x, const std::string& name) const {
  if (driver::host_tensors()) {
    FLYSHIP_CHECK(x.device().is_cpu(), label(), ": expected CPU tensors (this extension is the ", driver::flavor(),
                  " driver, FLYSHIP_FLAVOR=", driver::flavor(), ", which runs no GPU), got ", x.device().str(),
                  " for argument '", name, "'; unset FLYSHIP_FLAVOR to launch on a GPU");
  } else {
    FLYSHIP_CHECK(x.is_cuda(), label(), ": expected tensors on a GPU device, got ", x.device().str(),
                  " for argument '", name, "'; move inputs with .cuda()");
  }
}

void Binder::bind(Call& c, c10::ArrayRef<c10::IValue> args, bool is_out, bool check_device) const {
  const OpPlan& p = plan_;
  c.op = &p;
  const size_t expect = p.n_inputs + (is_out ? p.outputs.size() : 0);
  FLYSHIP_CHECK(args.size() == expect, label(), ": expected ", expect, " arguments, got ", args.size());
  for (size_t k = 0; k < expect; ++k) {
    const Slot& s = p.slots[k];
    const c10::IValue& v = args[k];
    if (s.kind == kTensor) {
      FLYSHIP_CHECK_TYPE(v.isTensor(), label(), ": expected a tensor for argument '", s.name, "', got ", v.tagKind());
      c.t[k] = &v.toTensor();
    } else if (s.kind == kFloat) {
      FLYSHIP_CHECK_TYPE(v.isDouble() || v.isInt(), label(), ": expected a float for argument '", s.name, "', got ",
                       v.tagKind());
      c.f[k] = v.isDouble() ? v.toDouble() : static_cast<double>(v.toInt());
    } else if (s.kind == kInt) {
      FLYSHIP_CHECK_TYPE(v.isInt() && !v.isBool(), label(), ": expected an int for argument '", s.name, "', got ",
                       v.tagKind());
      c.i[k] = v.toInt();
    } else {
      FLYSHIP_CHECK_TYPE(v.isBool(), label(), ": expected a bool for argument '", s.name, "', got ", v.tagKind());
      c.i[k] = v.toBool() ? 1 : 0;
    }
  }
  check_tensors(c, expect, check_device);
}

void Binder::check_tensors(Call& c, size_t n, bool check_device) const {
  const OpPlan& p = plan_;
  c.op = &p;
  const at::Tensor* first = nullptr;
  int first_slot = -1;
  for (size_t k = 0; k < n; ++k) {
    const Slot& s = p.slots[k];
    if (s.kind != kTensor) continue;
    const at::Tensor& x = *c.t[k];
    // None for a Tensor argument reaches a kernel as an undefined tensor (the dispatcher's conversion).
    FLYSHIP_CHECK_TYPE(x.defined(), label(), ": expected a tensor for argument '", s.name, "', got None");
    if (s.batch) {
      FLYSHIP_CHECK(x.dim() >= s.rank, label(), ": expected '", s.name, "' of rank ", s.rank, " or more (rank ",
                    s.rank, " for the kernel, more for leading batch dimensions), got rank ", x.dim(), " (shape ",
                    shape_str(x.sizes()), "); pass a tensor of rank ", s.rank, " or more");
    } else {
      FLYSHIP_CHECK(x.dim() == s.rank, label(), ": expected '", s.name, "' of rank ", s.rank, ", got rank ", x.dim(),
                    " (shape ", shape_str(x.sizes()), "); pass a tensor of rank ", s.rank);
    }
    if (first == nullptr) {
      first = &x;
      first_slot = static_cast<int>(k);
      if (check_device) check_device_type(x, s.name);
    } else {
      // Refused before anything runs: a meta tensor has no memory to read or write, and a kernel
      // launched on one device cannot reach another's.
      FLYSHIP_CHECK(x.is_meta() == first->is_meta(), label(), ": expected all tensors real or all meta, got ",
                    first->device().str(), " for '", p.slots[first_slot].name, "' and ", x.device().str(),
                    " for '", s.name, "'; a meta tensor has no data, so pass real tensors only (a call on meta "
                    "tensors alone runs the op's fake kernel)");
      FLYSHIP_CHECK(x.device() == first->device(), label(), ": expected all tensors on one device, got ",
                    first->device().str(), " for '", p.slots[first_slot].name, "' and ", x.device().str(),
                    " for '", s.name, "'; move them to one device");
    }
  }
  for (size_t k = n; k < p.slots.size(); ++k) c.t[k] = nullptr;
  c.device = first->device();
}

void Binder::output_rules(Call& c) const {
  const OpPlan& p = plan_;
  c.out_shapes.clear();
  c.out_strides.clear();
  c.out_numel.clear();
  c.out_dtypes.clear();
  for (const OutputPlan& o : p.outputs) {
    c10::SmallVector<int64_t, 6> shape;
    for (const Program& prog : o.shape) {
      int64_t d = 0;
      const EvalStatus st = evaluate(prog.code, c, &d);
      FLYSHIP_CHECK(st == EvalStatus::kOk, label(), ": output '", o.name, "' shape expression '", prog.text, "' ",
                    describe(st), " for these inputs");
      FLYSHIP_CHECK(d >= 0, label(), ": output '", o.name, "' shape expression '", prog.text, "' gives ", d,
                  " for these inputs; expected a size >= 0");
      shape.push_back(d);
    }
    const at::ScalarType dtype = o.dtype_slot >= 0 ? c.t[o.dtype_slot]->scalar_type() : o.dtype;
    // Element count, bytes and contiguous strides, each checked: a wrapped product would allocate a buffer
    // smaller than the grid writes.
    int64_t numel = 1, bytes = 0, stride = 1;
    c10::SmallVector<int64_t, 6> strides(shape.size());
    bool overflow = false;
    for (size_t k = shape.size(); k-- > 0;) {
      strides[k] = stride;
      overflow |= __builtin_mul_overflow(numel, shape[k], &numel);
      overflow |= __builtin_mul_overflow(stride, std::max<int64_t>(shape[k], 1), &stride);
    }
    overflow |= __builtin_mul_overflow(numel, static_cast<int64_t>(c10::elementSize(dtype)), &bytes);
    FLYSHIP_CHECK(!overflow, label(), ": output '", o.name, "' of shape ", shape_str(shape), " and dtype ",
                  dtype_name(dtype), " overflows int64 (elements, strides or bytes) for these inputs; expected "
                  "an output that fits in memory");
    c.out_shapes.push_back(std::move(shape));
    c.out_strides.push_back(std::move(strides));
    c.out_numel.push_back(numel);
    c.out_dtypes.push_back(dtype);
  }
}

at::Tensor Binder::allocate(c10::IntArrayRef shape, at::ScalarType dtype, c10::Device device, bool zero,
                             const char* kind, const std::string& name) const {
  const auto opts = at::TensorOptions().dtype(dtype).device(device);
  try {
    return zero ? at::zeros(shape, opts) : at::empty(shape, opts);
  } catch (const c10::OutOfMemoryError&) {
    throw;  // torch.OutOfMemoryError in Python, as torch raises it: code that frees memory and retries catches it
  } catch (const c10::Error& e) {
    // The CPU allocator's failure is a plain c10::Error ("DefaultCPUAllocator: can't allocate memory"): say what
    // flyship was allocating, for which call.
    FLYSHIP_CHECK(false, label(), ": allocating ", kind, " '", name, "' of shape ", shape_str(shape), " and dtype ",
                  dtype_name(dtype), " (", c10::multiply_integers(shape) * static_cast<int64_t>(c10::elementSize(dtype)),
                  " bytes) on ", device.str(), " failed: ", e.what_without_backtrace(), "; free memory or pass "
                  "smaller inputs");
  }
}

void Binder::allocate_outputs(Call& c) const {
  const OpPlan& p = plan_;
  c.fresh.clear();
  c.fresh.reserve(p.outputs.size());  // pointers into `fresh` are kept in c.t
  for (size_t j = 0; j < p.outputs.size(); ++j) {
    const std::string& name = p.outputs[j].name;
    const bool zero = p.outputs[j].zero;  // an output the kernel accumulates into (atomics) starts from zeros
    c.fresh.push_back(c.lead.empty() ? allocate(c.out_shapes[j], c.out_dtypes[j], c.device, zero, "output", name)
                                     : allocate(user_shape(c, j), c.out_dtypes[j], c.device, zero, "output", name));
  }
  for (size_t j = 0; j < p.outputs.size(); ++j) {
    const int s = p.n_inputs + static_cast<int>(j);
    if (!c.lead.empty() && p.slots[s].batch) {
      // The caller gets (B, S, ...) (fresh[j], not a view); the kernel writes through its (B*S, ...) view.
      c.flat.push_back(c.fresh[j].view(c.out_shapes[j]));
      c.t[s] = &c.flat.back();
    } else {
      c.t[s] = &c.fresh[j];
    }
  }
}

namespace {
// Bytes [first, last) a tensor's elements can touch (strides are non-negative in torch).
std::pair<uintptr_t, uintptr_t> byte_span(const at::Tensor& t) {
  const auto start = reinterpret_cast<uintptr_t>(t.data_ptr());
  if (t.numel() == 0) return {start, start};
  int64_t last = 0;
  for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
  return {start, start + static_cast<uintptr_t>((last + 1) * t.element_size())};
}

// Whether no two elements of t share memory. torch's has_internal_overlap answers No only for dense tensors
// (contiguous in some dim order) and Yes only for a zero stride; every other strided view, legal ones such as a
// column slice x[:, :4] included, is TooHard. For those: sort the dims of more than one element by stride; the
// elements are apart when each stride is at least the span of the dims inside it ((size-1)*stride summed, plus
// one element). Layouts this cannot prove apart (strides that interleave) are refused with the rest.
bool elements_apart(const at::Tensor& t) {
  const at::MemOverlap o = at::has_internal_overlap(t);
  if (o != at::MemOverlap::TooHard) return o == at::MemOverlap::No;
  if (t.numel() <= 1) return true;
  c10::SmallVector<std::pair<int64_t, int64_t>, 6> dims;  // (stride, size) of the dims of more than one element
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) > 1) dims.emplace_back(t.stride(d), t.size(d));
  }
  std::sort(dims.begin(), dims.end());
  int64_t span = 1;  // elements from the first to one past the last that the inner dims reach
  for (const auto& [stride, size] : dims) {
    int64_t reach = 0;
    if (stride < span || __builtin_mul_overflow(size - 1, stride, &reach) ||
        __builtin_add_overflow(span, reach, &span))
      return false;
  }
  return true;
}
}  // namespace

// A tensor the kernel writes (an out= tensor, an input written in place) must not have elements that share
// memory (an expand()ed or as_strided view): the kernel's writes to them would race, and torch refuses such
// writes too. Only a layout proven apart passes (elements_apart). what/name: "out tensor '" + name, or
// "input '" + name.
void Binder::check_no_self_overlap(const at::Tensor& t, const char* what, const std::string& name) const {
  FLYSHIP_CHECK(elements_apart(t), label(), ": ", what, name, "', which the kernel writes, has elements that share "
                "memory (strides ", shape_str(t.strides()), " for shape ", shape_str(t.sizes()), ", e.g. from "
                "expand()); its writes would race, so pass a tensor whose elements do not overlap "
                "(.clone() or .contiguous())");
}

// The out variant's tensors must not share memory with an input or with each other. A kernel may read an
// input after writing an output (a GEMM reads A and B across the whole K loop), so even an exact alias can
// give wrong results silently; flyship cannot know which kernels tolerate it, so it refuses all overlap.
void Binder::check_no_overlap(const Call& c) const {
  const OpPlan& p = plan_;
  const int n = p.n_inputs + static_cast<int>(p.outputs.size());
  for (int j = p.n_inputs; j < n; ++j) {
    check_no_self_overlap(c.user_tensor(j), "out tensor '", p.slots[j].name);
    const auto [o0, o1] = byte_span(c.user_tensor(j));
    if (o0 == o1) continue;
    for (int k = 0; k < j; ++k) {
      if (p.slots[k].kind != kTensor) continue;
      const auto [a0, a1] = byte_span(c.user_tensor(k));
      FLYSHIP_CHECK(a0 == a1 || o1 <= a0 || a1 <= o0, label(), ": out tensor '", p.slots[j].name,
                  "' shares memory with ", (k < p.n_inputs ? "input '" : "out tensor '"), p.slots[k].name,
                  "'; a kernel may read its inputs after writing its outputs, so out= must not overlap them; "
                  "pass a separate tensor (or call the functional op)");
    }
  }
}

// An input the kernel writes in place must not share memory with another input: the kernel may read that input
// after writing (fused add + RMSNorm reads x while it updates the residual), so a view of one through the other
// gives wrong results silently. The same rule as out= tensors.
void Binder::check_mutable_not_shared(const Call& c) const {
  const OpPlan& p = plan_;
  for (int j = 0; j < p.n_inputs; ++j) {
    if (!p.slots[j].is_mutable) continue;
    check_no_self_overlap(*c.t[j], "input '", p.slots[j].name);
    const auto [m0, m1] = byte_span(*c.t[j]);
    if (m0 == m1) continue;
    for (int k = 0; k < p.n_inputs; ++k) {
      if (k == j || p.slots[k].kind != kTensor) continue;
      const auto [a0, a1] = byte_span(*c.t[k]);
      FLYSHIP_CHECK(a0 == a1 || m1 <= a0 || a1 <= m0, label(), ": input '", p.slots[j].name, "', which the kernel "
                    "writes in place, shares memory with input '", p.slots[k].name, "'; the kernel may read '",
                    p.slots[k].name, "' after writing '", p.slots[j].name, "', so pass tensors that do not overlap "
                    "(clone one of them)");
    }
  }
}

void Binder::prepare(Call& c, c10::ArrayRef<c10::IValue> args, bool is_out, bool check_device) const {
  bind(c, args, is_out, check_device);
  prepare_bound(c, is_out);
}

void Binder::prepare_bound(Call& c, bool is_out) const {
  const OpPlan& p = plan_;
  if (p.has_mutable && !c.device.is_meta()) check_mutable_not_shared(c);
  flatten_batch(c, is_out);
  output_rules(c);
  if (is_out) {
    for (size_t j = 0; j < p.outputs.size(); ++j) {
      const at::Tensor& o = c.user_tensor(p.n_inputs + static_cast<int>(j));
      const c10::SmallVector<int64_t, 6> full = c.lead.empty() ? c10::SmallVector<int64_t, 6>() : user_shape(c, j);
      const c10::SmallVector<int64_t, 6>& want = c.lead.empty() ? c.out_shapes[j] : full;  // no copy unbatched
      FLYSHIP_CHECK(o.sizes() == c10::IntArrayRef(want) && o.scalar_type() == c.out_dtypes[j], label(),
                  ": expected out tensor '", p.slots[p.n_inputs + j].name, "' of shape ", shape_str(want),
                  " and dtype ", dtype_name(c.out_dtypes[j]), ", got shape ", shape_str(o.sizes()), " and dtype ",
                  dtype_name(o.scalar_type()), "; allocate it with torch.empty(", shape_str(want),
                  ", dtype=torch.", dtype_name(c.out_dtypes[j]), ", device=x.device)");
    }
    check_no_overlap(c);
  } else if (p.guard_uses_outputs) {
    allocate_outputs(c);
  }
}

}  // namespace flyship
