// Everything in the core that takes the GIL: the variant choice (asked of Python once per device target),
// the reference (fallback) call and its warning, the counters as Python dicts, and the core's refusals as
// flyship exceptions.
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Layout.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <c10/util/strides.h>

#include <typeinfo>

#include "bundle.h"
#include "check.h"
#include "op.h"
#include "util.h"

namespace flyship {

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
      FLYSHIP_CHECK(false, "flyship: choosing code objects for target '", target, "' failed: ",
                  std::string(py::str(e.type().attr("__name__"))), ": ", std::string(py::str(e.value())));
    }
    auto per_op = r.cast<py::list>();
    FLYSHIP_CHECK(static_cast<int>(per_op.size()) == n_ops(), "flyship: target selection returned ", per_op.size(),
                " ops, expected ", n_ops());
    for (int k = 0; k < n_ops(); ++k) {
      auto per_spec = per_op[k].cast<py::list>();
      // The head's variant counts: the specs themselves may not be read yet (ensure_specs checks they agree).
      const auto& counts = ops_[k]->plan().spec_variants;
      FLYSHIP_CHECK(per_spec.size() == counts.size(), "flyship: target selection for op ", ops_[k]->plan().name,
                  " has the wrong number of specializations");
      std::vector<int> v;
      std::vector<std::string> why;
      for (size_t s = 0; s < counts.size(); ++s) {
        auto pr = per_spec[s].cast<py::sequence>();
        const int idx = pr[0].cast<int>();
        FLYSHIP_CHECK(idx >= kOnPurpose && idx < counts[s] && (idx != kOnPurpose || counts[s] == 0),
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

std::shared_ptr<const std::string> BundleCore::image(const VariantPlan& v) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (images_[v.id]) return images_[v.id];
  }
  // Ask Python without holding mu_; two threads may both ask, the first answer is kept.
  std::shared_ptr<const std::string> img;
  {
    py::gil_scoped_acquire gil;
    // A refused code object raises the rule book's BundleError, which reaches the caller as itself (torch's
    // Python bindings and pybind11 restore a py::error_already_set).
    py::object r = code_object_.get()(v.id);
    FLYSHIP_CHECK(py::isinstance<py::bytes>(r), "flyship: the code object of ", v.label, " came back as ",
                  std::string(py::str(py::type::handle_of(r).attr("__name__"))), ", expected bytes");
    img = std::make_shared<const std::string>(r.cast<std::string>());
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!images_[v.id]) images_[v.id] = std::move(img);
  return images_[v.id];
}

py::list BundleCore::specs_of(int k) const {
  // A refusal (the rule book's BundleError, for a manifest read lazily) reaches the caller as itself.
  py::object r = specs_.get()(k);
  FLYSHIP_CHECK(py::isinstance<py::list>(r), "flyship: the specializations of op ", ops_[k]->plan().name,
                " came back as ", std::string(py::str(py::type::handle_of(r).attr("__name__"))), ", expected a list");
  return r.cast<py::list>();
}

void OpState::ensure_specs() {
  if (specs_ready_.load(std::memory_order_acquire)) return;
  // Ask Python and parse without holding specs_mu_ (never wait for the GIL while holding a lock of ours); two
  // threads may both read them, the first result is kept.
  std::vector<SpecPlan> specs;
  bool uses_outputs = false;
  {
    py::gil_scoped_acquire gil;
    specs = parse_specs(bundle_->specs_of(index_), plan_, &uses_outputs);
  }
  // Variant ids follow flyship.bundle.rules.iter_variants: each variant, then its following launches.
  int id = plan_.first_variant;
  for (auto& s : specs)
    for (auto& v : s.variants) {
      v.id = id++;
      for (auto& t : v.then) t.id = id++;
    }
  FLYSHIP_PLAN_CHECK(id - plan_.first_variant == plan_.n_code_objects, "op " + plan_.name, "its specializations hold ",
                     id - plan_.first_variant, " code objects, its head announces ", plan_.n_code_objects);
  std::lock_guard<std::mutex> lock(specs_mu_);
  if (specs_ready_.load(std::memory_order_relaxed)) return;
  plan_.specs = std::move(specs);
  plan_.guard_uses_outputs = uses_outputs;
  specs_ready_.store(true, std::memory_order_release);
}

namespace {

// The call's inputs as Python values, in the op's argument order (the kernel's shapes: leading batch dims
// flattened), as the reference and the blame get them. Call with the GIL held.
py::tuple inputs_as_python(const OpPlan& p, const Call& c) {
  py::tuple args(p.n_inputs);
  for (int k = 0; k < p.n_inputs; ++k) {
    switch (p.slots[k].kind) {
      case kTensor: args[k] = py::cast(*c.t[k]); break;
      case kFloat: args[k] = py::float_(c.f[k]); break;
      case kInt: args[k] = py::int_(c.i[k]); break;
      default: args[k] = py::bool_(c.i[k] != 0); break;
    }
  }
  return args;
}

std::string exception_text(py::error_already_set& e) {
  return std::string(py::str(e.type().attr("__name__"))) + ": " + std::string(py::str(e.value()));
}

}  // namespace

std::string BundleCore::blame(int k, const py::dict& inputs, const std::string& failure, const char* fix,
                              bool about_dtypes) const {
  py::object r = blame_.get()(k, inputs, failure, fix, about_dtypes);
  FLYSHIP_CHECK(py::isinstance<py::str>(r), "flyship: the blame of op ", ops_[k]->plan().name, " came back as ",
                std::string(py::str(py::type::handle_of(r).attr("__name__"))), ", expected a str");
  return r.cast<std::string>();
}

std::string Fallback::blame(const Call& c, const std::string& failure, const char* fix, bool about_dtypes) const {
  py::gil_scoped_acquire gil;
  try {
    py::tuple args = inputs_as_python(plan_, c);
    py::dict inputs;
    for (int k = 0; k < plan_.n_inputs; ++k) inputs[py::str(plan_.slots[k].name)] = args[k];
    return bundle_->blame(index_, inputs, failure, fix, about_dtypes);
  } catch (py::error_already_set& e) {
    // The reference's failure is the error being raised; a failure to word the blame is said beside it, not
    // instead of it.
    return "the reference (fallback) " + failure + "; " + fix + " (flyship could not check the inputs for the " +
           "cause: " + exception_text(e) + ")";
  } catch (const c10::Error& e) {
    return "the reference (fallback) " + failure + "; " + fix + " (flyship could not check the inputs for the " +
           "cause: " + e.what_without_backtrace() + ")";
  }
}

// A tensor the reference returned, as the op returns it: a plain torch.Tensor that needs no gradient. A Parameter
// (or another subclass) would come back as that very Python object, and one that requires grad would make the
// op's output a leaf that requires grad: the op's outputs never need a gradient by themselves (autograd is the
// registered backward's business). A new TensorImpl on the same memory (variable_data) is both.
static at::Tensor plain_output(const py::handle& item) {
  at::Tensor t = item.cast<at::Tensor>();
  return THPVariable_CheckExact(item.ptr()) && !t.requires_grad() ? t : t.variable_data();
}

std::vector<at::Tensor> Fallback::call_reference(const Call& c) const {
  const OpPlan& p = plan_;
  std::vector<at::Tensor> out;
  std::string error;
  {
    py::gil_scoped_acquire gil;
    try {
      py::tuple args = inputs_as_python(p, c);
      py::object r = reference_.get()(*args);
      if (r.is_none() && p.outputs.empty()) {
        // An op that only writes inputs in place: its reference writes them too and returns nothing.
      } else if (THPVariable_Check(r.ptr())) {
        out.push_back(plain_output(r));
      } else if (py::isinstance<py::tuple>(r) || py::isinstance<py::list>(r)) {
        for (auto item : r.cast<py::sequence>()) {
          if (!THPVariable_Check(item.ptr())) {
            error = "returned a sequence holding a " + std::string(py::str(py::type::handle_of(item).attr("__name__")));
            break;
          }
          out.push_back(plain_output(item));
        }
      } else {
        error = "returned a " + std::string(py::str(py::type::handle_of(r).attr("__name__"))) + ", expected tensors";
      }
    } catch (py::error_already_set& e) {
      // Out of memory is not the reference's fault, and callers catch it (free memory, retry smaller): it
      // leaves as itself (torch's bindings restore a py::error_already_set), torch.OutOfMemoryError included.
      if (e.matches(PyExc_MemoryError) || e.matches(py::module_::import("torch").attr("OutOfMemoryError"))) throw;
      // Otherwise the exception's type and message; its Python traceback stays out of the one-line error.
      error = "raised " + exception_text(e);
    }
  }
  const std::string& in_place = p.mutable_hint;  // what the reference of an op with in-place inputs must do
  // A reference that raises, or returns another dtype, for inputs that do not fit together or dtypes no
  // specialization admits: say that first (an int tensor, a weight of the wrong length passed by mistake), not
  // only that the reference failed. loader/blame.py words it, for this path and the CPU one.
  const bool raised = error.rfind("raised ", 0) == 0;
  FLYSHIP_CHECK(error.empty(), label(), ": ", blame(c, raised ? error : error + in_place, "fix the reference", raised));
  FLYSHIP_CHECK(out.size() == p.outputs.size(), label(), ": ",
                blame(c, "returned " + std::to_string(out.size()) + " tensors, the op has " +
                          std::to_string(p.outputs.size()) + " outputs" + in_place, "fix the reference", false));
  for (size_t j = 0; j < out.size(); ++j) {
    // A sparse, mkldnn or nested result has no strides to copy or launch with: the reference must give a dense one.
    FLYSHIP_CHECK(out[j].layout() == at::kStrided && !out[j].is_nested(), label(), ": the reference (fallback) "
                  "returned output '", p.outputs[j].name, "' as a ", out[j].is_nested() ? "nested" :
                  torch::getTHPLayout(out[j].layout())->name, " tensor, expected a dense one (torch.strided); "
                  "return a dense tensor from the reference (e.g. result.to_dense())");
    if (out[j].sizes() == c10::IntArrayRef(c.out_shapes[j]) && out[j].scalar_type() == c.out_dtypes[j] &&
        out[j].device() == c.device)
      continue;
    FLYSHIP_CHECK(false, label(), ": ",
                  blame(c, "returned output '" + p.outputs[j].name + "' of shape " + shape_str(out[j].sizes()) +
                            ", dtype " + dtype_name(out[j].scalar_type()) + " on " + out[j].device().str() +
                            "; the manifest's rule gives " + shape_str(c.out_shapes[j]) + ", " +
                            dtype_name(c.out_dtypes[j]) + " on " + c.device.str(),
                        "fix the reference or the output rule", out[j].scalar_type() != c.out_dtypes[j]));
  }
  return out;
}

void Fallback::run(Call& c, const std::string& reason, bool is_out, bool on_purpose) {
  const OpPlan& p = plan_;
  std::vector<std::string> names;
  for (const auto& s : p.specs) names.push_back(s.name);
  FLYSHIP_CHECK(on_purpose || bundle_->fallback(), label(), ": no specialization fits these inputs (", reason,
              ") and the fallback is off (FLYSHIP_FALLBACK=0 or load(fallback=False)); specializations: ",
              join(names, ", "), "; change the inputs to fit one, or turn the fallback on to run the PyTorch "
              "reference");
  FLYSHIP_CHECK(!reference_.empty(), label(), ": no specialization fits these inputs (", reason, ") and the op has no "
              "reference to fall back to; pass one with load(..., references={'", p.name, "': fn})");
  if (on_purpose) {
    on_purpose_.fetch_add(1, std::memory_order_relaxed);
  } else if (count(reason)) {
    // Once per op and reason: a workload whose inputs never fit the kernel should not pass unnoticed.
    // (FLYSHIP_FALLBACK=0 turns this into an error; stats() counts every fallback.)
    py::gil_scoped_acquire gil;
    const std::string msg = label() + ": no specialization fits these inputs (" + reason +
                            "); running the PyTorch reference instead. This warning is shown once per reason; "
                            "ops.<op>.stats() counts fallbacks, FLYSHIP_FALLBACK=0 makes them errors.";
    // Warned from Python so that it points at the caller's line, not at flyship's or torch's frames.
    py::module_::import("flyship.loader.core").attr("warn_fallback")(msg);
  }
  std::vector<at::Tensor> out = call_reference(c);  // on the flattened tensors: the kernel's shapes
  if (is_out) {
    for (size_t j = 0; j < out.size(); ++j) {
      // The caller's out tensor (with its leading dims, whatever its layout): copy_ writes any strides.
      const at::Tensor& o = c.user_tensor(p.n_inputs + static_cast<int>(j));
      const_cast<at::Tensor&>(o).copy_(o.sizes() == out[j].sizes() ? out[j] : out[j].reshape(o.sizes()));
    }
  } else {
    c.fresh.clear();
    c.fresh.reserve(out.size());
    for (size_t j = 0; j < out.size(); ++j) {
      // The functional op promises what its fake kernel gives and a launch returns: a fresh tensor (the schema
      // has no alias annotation) of the rule's shape, with its leading dims, and contiguous strides. A result that
      // is not that (a view of an input, a transposed result of transposed inputs, the kernel's flattened shape)
      // is copied into one; torch.compile and opcheck compare the strides with the fake kernel's.
      const c10::SmallVector<int64_t, 6> want = binder_.user_shape(c, j);
      at::Tensor& o = out[j];
      bool own = o.sizes() == c10::IntArrayRef(want) && o.strides() == c10::IntArrayRef(c10::contiguous_strides(want));
      for (int k = 0; own && k < p.n_inputs; ++k) own = !(p.slots[k].kind == kTensor && o.is_alias_of(*c.t[k]));
      if (own) {
        c.fresh.push_back(std::move(o));
      } else {
        c.fresh.push_back(binder_.allocate(want, o.scalar_type(), c.device, false, "output", p.outputs[j].name));
        c.fresh.back().view(o.sizes()).copy_(o);
      }
    }
    for (size_t j = 0; j < out.size(); ++j) c.t[p.n_inputs + j] = &c.fresh[j];
  }
}

[[noreturn]] void raise_as_flyship(const c10::Error& e) {
  // Only the core's own refusals (FLYSHIP_CHECK / _TYPE: c10::Error, c10::TypeError); torch's specific errors
  // (out of memory, accelerator errors, ...) keep their own Python types.
  const char* cls = typeid(e) == typeid(c10::Error)       ? "CallError"
                    : typeid(e) == typeid(c10::TypeError) ? "CallTypeError"
                                                          : nullptr;
  if (cls == nullptr || !Py_IsInitialized()) throw;  // rethrows the exception being handled
  py::gil_scoped_acquire gil;
  py::object type = py::module_::import("flyship.errors").attr(cls);
  PyErr_SetObject(type.ptr(), py::str(e.what_without_backtrace()).ptr());
  throw py::error_already_set();
}

py::dict OpState::stats() const {
  py::dict launches;
  uint64_t total = 0;
  for (size_t s = 0; s < plan_.specs.size(); ++s) {
    const uint64_t n = launcher_.launches(s);
    launches[py::str(plan_.specs[s].name)] = n;
    total += n;
  }
  py::dict fallbacks;
  uint64_t fb_total = 0;
  for (const auto& [reason, n] : fallback_.counts()) {
    fallbacks[py::str(reason)] = n;
    fb_total += n;
  }
  const uint64_t empty = launcher_.empty();
  py::dict d;
  d["launches"] = launches;
  d["fallbacks"] = fallbacks;
  const uint64_t original = fallback_.on_purpose();
  d["empty"] = empty;
  d["original"] = original;  // calls a tuned bucket sent to the reference on purpose
  d["calls"] = total + fb_total + empty + original;
  return d;
}

void OpState::reset_stats() {
  launcher_.reset();
  fallback_.reset();
}

}  // namespace flyship
