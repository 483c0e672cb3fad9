// The module's plain parts (module_tables.cpp): the driver shim's functions, the tables and limits the plan shares
// with Python, and the plan-program evaluator for the differential test. They need plain pybind11 only, so they are
// compiled apart from the bridge units that include torch's Python headers (loader/units.py).
#pragma once

#include <pybind11/pybind11.h>

namespace flyship {

void add_driver_functions(pybind11::module_& m);
void add_plan_tables(pybind11::module_& m);
void add_evaluate_program(pybind11::module_& m);

}  // namespace flyship
