// A Python object held by C++ objects that may outlive the interpreter.
#pragma once

#include <pybind11/pybind11.h>

namespace flyship {

namespace py = pybind11;

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

}  // namespace flyship
