// The Python module: the extension's functions and the Bundle class that flyship/loader/core.py drives.
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include "bundle.h"
#include "check.h"
#include "driver.h"
#include "module.h"
#include "register.h"

namespace py = pybind11;

namespace flyship {

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
      FLYSHIP_CHECK_TYPE(false, "flyship: expected tensors, floats, ints or bools, got ",
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
  m.doc() = "flyship launch core (see csrc/)";
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
        FLYSHIP_CHECK(s.ok(), "flyship: reading the properties of device ", device, " failed: ", s.message, " (",
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
            FLYSHIP_CHECK(spec >= 0 && spec < static_cast<int>(specs.size()), o.label(),
                        ": specialization index out of range");
            FLYSHIP_CHECK(variant >= 0 && variant < static_cast<int>(specs[spec].variants.size()), o.label(),
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
            FLYSHIP_CHECK(spec >= 0 && spec < static_cast<int>(specs.size()) && variant >= 0 &&
                            variant < static_cast<int>(specs[spec].variants.size()),
                        "flyship: specialization or variant index out of range");
            const VariantPlan& v = specs[spec].variants[variant];
            py::gil_scoped_release release;
            ModuleCache::instance().function(device, v);
          },
          "Load one variant's code object onto a device (no launch).");
}
