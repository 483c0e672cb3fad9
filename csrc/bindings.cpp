// The Python module: the extension's functions and the Bundle class that flyship/loader/core.py drives.
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include "bundle.h"
#include "check.h"
#include "driver.h"
#include "fast_call.h"
#include "module.h"
#include "module_tables.h"
#include "register.h"

namespace py = pybind11;

namespace flyship {

// Python values (tensors, floats, ints, bools) as IValues, for the test and verification entry points.
std::vector<c10::IValue> to_ivalues(const py::sequence& seq) {
  std::vector<c10::IValue> out;
  for (auto item : seq) {
    if (item.is_none()) {
      out.emplace_back();  // bind names the argument that wanted a value ("expected a tensor ..., got None")
    } else if (THPVariable_Check(item.ptr())) {
      out.emplace_back(item.cast<at::Tensor>());
    } else if (py::isinstance<py::bool_>(item)) {
      out.emplace_back(item.cast<bool>());
    } else if (py::isinstance<py::int_>(item)) {
      out.emplace_back(item.cast<int64_t>());
    } else if (py::isinstance<py::float_>(item)) {
      out.emplace_back(item.cast<double>());
    } else {
      FLYSHIP_CHECK_TYPE(false, "flyship: expected tensors, floats, ints or bools, got ",
                       std::string(py::str(py::type::handle_of(item).attr("__name__"))));
    }
  }
  return out;
}

// Bind a call from Python values without touching a device (OpHandle.dispatch): the same checks, rules and
// guards as a launch, on tensors of any one device (CPU tensors stand in for GPU ones).
void bind_without_device(Call& c, OpState& op, const std::vector<c10::IValue>& args, bool is_out) {
  op.binder().prepare(c, args, is_out, /*check_device=*/false);
}

// The Bundle entry points that run one call's steps (decide, check, run, load ahead).
void add_bundle_calls(py::class_<Bundle, std::shared_ptr<Bundle>>& cls) {
  cls.def(
          "decide",
          [](Bundle& b, int op, const std::string& target, const py::sequence& args, bool is_out,
             int64_t cu_count) -> py::tuple {
            OpState& o = b.core->op(op);
            o.ensure_specs();
            const Selection& sel = b.core->selection(target);
            auto iv = to_ivalues(args);
            Call c;
            bind_without_device(c, o, iv, is_out);
            if (!c.batch_reason.empty()) return py::make_tuple(-1, -1, c.batch_reason);
            c.device_properties[DEV_CU_COUNT] = cu_count;
            Decision d = o.decider().decide(c, sel, is_out);
            return py::make_tuple(d.spec, d.variant, d.reason);
          },
          py::arg("op"), py::arg("target"), py::arg("args"), py::arg("is_out"), py::arg("cu_count") = 0,
          "Which specialization and variant a call would run for a device target (of `cu_count` compute units), "
          "or why none fits.")
      .def(
          "check_call",
          [](Bundle& b, int op, const py::sequence& args, bool is_out) {
            OpState& o = b.core->op(op);
            o.ensure_specs();
            auto iv = to_ivalues(args);
            Call c;
            bind_without_device(c, o, iv, is_out);
          },
          py::arg("op"), py::arg("args"), py::arg("is_out"),
          "Check a call as the launch path does before it launches (argument types, one device, shapes the output "
          "rules accept, out= tensors, memory overlap), on tensors of any one device: the CPU kernel's checks.")
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
            OpState& o = b.core->op(op);
            o.ensure_specs();
            const auto& specs = o.plan().specs;
            FLYSHIP_CHECK(spec >= 0 && spec < static_cast<int>(specs.size()) && variant >= 0 &&
                            variant < static_cast<int>(specs[spec].variants.size()),
                        "flyship: specialization or variant index out of range");
            const VariantPlan& v = specs[spec].variants[variant];
            std::vector<const VariantPlan*> steps{&v};  // and every launch that follows it (schema 1.2)
            for (const VariantPlan& t : v.then) steps.push_back(&t);
            std::vector<std::shared_ptr<const std::string>> imgs;
            for (const VariantPlan* t : steps) imgs.push_back(b.core->image(*t));
            py::gil_scoped_release release;
            for (size_t k = 0; k < steps.size(); ++k) ModuleCache::instance().function(device, *steps[k], *imgs[k]);
          },
          "Load one variant's code objects (every launch of a call) onto a device (no launch).");
}

// The core's refusals as flyship exceptions, torch's errors as torch raises them.
void add_error_translator(py::module_& m) {
  py::register_local_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const c10::ValueError& e) {
      PyErr_SetString(PyExc_ValueError, e.what_without_backtrace());
    } catch (const c10::Error& e) {
      // The core's refusals as flyship.errors.CallError / CallTypeError (the one exception tree); others as is.
      try {
        raise_as_flyship(e);
      } catch (py::error_already_set& fly) {
        fly.restore();
      } catch (const c10::Error&) {
        // torch's own errors as torch raises them: c10::OutOfMemoryError as torch.OutOfMemoryError (callers
        // catch it), the others as their Python types.
        torch::translate_exception_to_python(std::current_exception());
      }
    }
  });
}

// The Bundle class: a loaded bundle's core, built from its plan, and the entry points Python drives.
void add_bundle_class(py::module_& m) {
  // module_local: a second flyship extension in the process (the recording driver beside a GPU flavor) has its
  // own Bundle type; pybind11 would otherwise refuse to register the C++ type twice.
  auto cls = py::class_<Bundle, std::shared_ptr<Bundle>>(m, "Bundle", py::module_local());
  cls
      .def(py::init([](const py::dict& plan, py::object selector, bool fallback) {
             auto b = std::make_shared<Bundle>();
             b->core = std::make_shared<BundleCore>(plan, std::move(selector), fallback);
             return b;
           }),
           py::arg("plan"), py::arg("selector"), py::arg("fallback"))
      .def("register", [](Bundle& b) { register_kernels(b); })
      // load(..., reload=True): the kernels registered above go (each torch::Library deregisters what it made), so
      // the namespace's schemas can be defined again; calls already holding the core keep it alive.
      .def("unregister", [](Bundle& b) { b.libraries.clear(); })
      .def_property(
          "fallback", [](const Bundle& b) { return b.core->fallback(); },
          [](Bundle& b, bool on) { b.core->set_fallback(on); })
      .def("stats",
           [](Bundle& b, int op) {
             OpState& o = b.core->op(op);
             o.ensure_specs();  // the counters are named by specialization
             return o.stats();
           })
      .def("reset_stats", [](Bundle& b, int op) { b.core->op(op).reset_stats(); });
  add_bundle_calls(cls);
}

}  // namespace flyship

// ---------------------------------------------------------------------------------------------
// Python module.

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace flyship;
  m.doc() = "flyship launch core (see csrc/)";
  add_error_translator(m);
  add_driver_functions(m);
  add_plan_tables(m);
  add_evaluate_program(m);
  add_fast_call(m);
  add_torch_op_call(m);
  m.def("loaded_modules", [] { return ModuleCache::instance().size(); });
  add_bundle_class(m);
}
