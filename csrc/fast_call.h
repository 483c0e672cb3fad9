// The fast eager entry: the user-facing handles ops.<op>(...) and ops.<op>.out(...) as CPython vectorcall
// objects that bind Python arguments straight into a Call (fast_call.cpp).
#pragma once

#include <torch/csrc/utils/pybind.h>

namespace flyship {

// Adds FastCall (the C base of the handle classes), enable_fast_call(cls) and bind_fast(...) to the module.
void add_fast_call(pybind11::module_& m);

}  // namespace flyship
