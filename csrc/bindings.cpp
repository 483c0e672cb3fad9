// The Python module: the extension's functions and the Bundle class that flyship/loader/core.py drives.
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include "bundle.h"
#include "check.h"
#include "driver.h"
#include "fast_call.h"
#include "module.h"
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

// The driver shim: its flavor, runtime and device properties (and its own test hooks).
void add_driver_functions(py::module_& m) {
  m.attr("PLAN_VERSION") = kPlanVersion;
  m.def("flavor", [] { return std::string(driver::flavor()); },
        "The driver shim compiled in: 'hip' or 'cuda' (test-only: 'hip-nvidia', 'record').");
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
        d["cu_count"] = info.cu_count;
        return d;
      });
  driver::add_python_bindings(m.ptr());
}

// The tables the plan and the limits share with Python, as this extension was compiled with them.
void add_plan_tables(py::module_& m) {
  {
    // The names the plan uses for codes, and the program limits: the only tables (plan.h, expr.h).
    py::dict tables;
    py::list opcodes, arg_kinds, field_kinds;
    for (const char* n : kOpcodeNames) opcodes.append(n);
    for (const char* n : kArgKindName) arg_kinds.append(n);
    for (const char* n : kFieldKindName) field_kinds.append(n);
    py::dict field_types;
    for (int k = 0; k < kFieldTypeCount; ++k) field_types[kTypeName[k]] = kTypeSize[k];
    tables["opcodes"] = opcodes;
    tables["arg_kinds"] = arg_kinds;
    tables["field_kinds"] = field_kinds;
    tables["field_types"] = field_types;
    tables["max_program_depth"] = kMaxProgramDepth;
    tables["max_program_words"] = kMaxProgramWords;
    m.attr("PLAN_TABLES") = tables;
  }
  {
    // The plan's keys as this extension was compiled with them (plan_fields.h, generated from
    // bundle/plan_contract.py): (struct, key, reader, C++ type) per key, in the contract's order.
    py::list fields;
#define FLYSHIP_PLAN_EXPORT(S, member, key, T, R, ...) fields.append(py::make_tuple(#S, key, #R, #T));
#define FLYSHIP_PLAN_EXPORT_STRUCT(S) FLYSHIP_PLAN_FIELDS_##S(FLYSHIP_PLAN_EXPORT)
    FLYSHIP_PLAN_STRUCTS(FLYSHIP_PLAN_EXPORT_STRUCT)
#undef FLYSHIP_PLAN_EXPORT_STRUCT
#undef FLYSHIP_PLAN_EXPORT
    m.attr("PLAN_FIELDS") = fields;
  }
  {
    // The shared limits as this extension was compiled with them (limits.h, generated from bundle/limits.py).
    py::dict limits;
#define FLYSHIP_LIMIT(name) limits[#name] = name
    FLYSHIP_LIMIT(kPlanVersion);
    FLYSHIP_LIMIT(kMaxSlots);
    FLYSHIP_LIMIT(kMaxLaunches);
    FLYSHIP_LIMIT(kMaxWorkspaces);
    FLYSHIP_LIMIT(kMaxKernargBytes);
    FLYSHIP_LIMIT(kKernargBufferAlignment);
    FLYSHIP_LIMIT(kMaxBlock);
    FLYSHIP_LIMIT(kMaxRank);
    FLYSHIP_LIMIT(kMaxProgramWords);
    FLYSHIP_LIMIT(kMaxProgramDepth);
    FLYSHIP_LIMIT(kOnPurpose);
#undef FLYSHIP_LIMIT
    m.attr("LIMITS") = limits;
  }
}

// One plan program evaluated over given shapes, for the differential test of the two evaluators.
void add_evaluate_program(py::module_& m) {
  m.def(
      "evaluate_program",
      [](const py::dict& program, const std::vector<std::vector<int64_t>>& shapes,
         const std::vector<std::vector<int64_t>>& strides, const std::vector<int64_t>& scalars,
         int64_t cu_count) -> py::tuple {
        // One slot per entry: a tensor when its shape list is non-empty, else an int scalar (scalars[k]).
        struct Env {
          const std::vector<std::vector<int64_t>>& shapes;
          const std::vector<std::vector<int64_t>>& strides;
          const std::vector<int64_t>& scalars;
          std::vector<int64_t> numels;
          int64_t cu_count;
          int64_t shape(int s, int d) const { return shapes[s][d]; }
          int64_t device_property(int p) const { return p == DEV_CU_COUNT ? cu_count : 0; }
          int64_t stride(int s, int d) const { return strides[s][d]; }
          int64_t numel(int s) const { return numels[s]; }
          int64_t scalar(int s) const { return scalars[s]; }
        } env{shapes, strides, scalars, {}, cu_count};
        FLYSHIP_CHECK_VALUE(strides.size() == shapes.size() && scalars.size() == shapes.size(),
                            "evaluate_program: expected one shape, stride list and scalar per slot");
        std::vector<SlotShape> slots;
        for (size_t k = 0; k < shapes.size(); ++k) {
          const bool tensor = !shapes[k].empty();
          FLYSHIP_CHECK_VALUE(strides[k].size() == shapes[k].size(), "evaluate_program: slot ", k,
                              " has ", shapes[k].size(), " sizes and ", strides[k].size(), " strides");
          int64_t n = 1;
          for (int64_t d : shapes[k]) {
            FLYSHIP_CHECK_VALUE(d >= 0 && !__builtin_mul_overflow(n, d, &n), "evaluate_program: slot ", k,
                                " has no int64 element count");
          }
          env.numels.push_back(n);
          slots.push_back({tensor, !tensor, static_cast<int>(shapes[k].size())});
        }
        Program p = parse_program(program, slots, "evaluate_program");
        int64_t out = 0;
        const EvalStatus st = evaluate(p.code, env, &out);
        if (st != EvalStatus::kOk) return py::make_tuple(describe(st), py::none());
        return py::make_tuple("ok", out);
      },
      py::arg("program"), py::arg("shapes"), py::arg("strides"), py::arg("scalars"), py::arg("cu_count") = 0,
      "Evaluate one plan program (flyship.bundle.expr.compile_program's {'text', 'code'}) over slots given by "
      "shape, strides and scalar value, on a device of `cu_count` compute units: ('ok', value), or (why, None) when it divides by zero or overflows. "
      "For the differential test of the two evaluators.");
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
