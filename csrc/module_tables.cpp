// The module's plain parts: the driver shim's functions, the plan's tables and limits, the plan-program evaluator
// (declared in module_tables.h; bindings.cpp adds them to the module). Plain pybind11, no torch Python headers: a
// plain unit (loader/units.py), so the bridge unit bindings.cpp no longer generates their code.
#include "module_tables.h"

#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "check.h"
#include "device.h"
#include "driver.h"
#include "expr.h"
#include "limits.h"
#include "plan.h"

namespace py = pybind11;

namespace flyship {

// The driver shim: its flavor, runtime and device properties (and its own test hooks).
void add_driver_functions(py::module_& m) {
  m.attr("PLAN_VERSION") = kPlanVersion;
  m.def("flavor", [] { return std::string(driver::flavor()); },
        "The driver shim compiled in: 'hip' or 'cuda' (test-only: 'hip-nvidia', 'record').");
  m.def("runtime_version", &driver::runtime_version, "The GPU runtime's version, and the headers'.");
  m.def(
      "device_info",
      [](int device) {
        check_device_index(device);
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
#define FLYSHIP_LIMIT(name) limits[#name] = name;
    FLYSHIP_SHARED_LIMITS(FLYSHIP_LIMIT)
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

}  // namespace flyship
