// torch.ops.<ns>.<op>, .default and .out through the fast entry. torch's OpOverloadPacket / OpOverload are Python
// classes: a call costs a Python frame (__call__), then the C++ callable (`_op`) boxes every argument and runs the
// dispatcher. loader/torchops.py swaps the class of our ops' packet and overloads for a subclass of torch's
// (FastOpOverloadPacket / FastOpOverload, `__slots__ = ()`, no methods of its own) whose tp_call is set here: a C
// function that reads the object's `_flyship_fast` binding (a FastCall bound with torch_surface, fast_call.cpp) and
// runs the call through fast_try, which takes it only when fast_take, the rule the handles use, says nothing but
// our kernel would act on it. Every other call goes to torch's own __call__ (found on the class as Python finds
// it), with the same arguments: its results, errors and dispatch are torch's, exactly.
//
// The class's Python attributes are torch's: dynamo, make_fx, torch.export and pickling see an OpOverload
// (isinstance holds, `__call__` is torch's function); only CPython's eager call takes the C slot.
#include <torch/csrc/utils/pybind.h>

#include <vector>

#include "check.h"
#include "fast_call.h"
#include "plan.h"

namespace flyship {

namespace py = pybind11;

namespace {

PyObject* binding_key() {
  static PyObject* key = PyUnicode_InternFromString("_flyship_fast");
  return key;
}

PyObject* call_key() {
  static PyObject* key = PyUnicode_InternFromString("__call__");
  return key;
}

// The binding stored on `self` (a borrowed reference), or nullptr: read from its instance dict without a lookup
// through the class (torch's classes define __getattr__, which a miss would run). _PyObject_GetDictPtr and
// _PyType_Lookup (torch_call) are CPython's unstable API, present from 3.9 through 3.13.
PyObject* binding_of(PyObject* self) {
  PyObject** dict = _PyObject_GetDictPtr(self);
  if (dict == nullptr || *dict == nullptr) return nullptr;
  return PyDict_GetItemWithError(*dict, binding_key());  // never raises for a str key
}

// The call's arguments by slot from the tuple and dict tp_call gets; false when the fast entry does not take
// such a call.
bool gather(const FastOp& f, PyObject* args, PyObject* kwargs, PyObject** slot) {
  const Py_ssize_t nargs = PyTuple_GET_SIZE(args);
  const int n = f.slots();
  if (nargs > f.inputs()) return false;  // out tensors are keyword-only in the schema
  for (int k = 0; k < n; ++k) slot[k] = k < nargs ? PyTuple_GET_ITEM(args, k) : nullptr;
  if (kwargs == nullptr) return true;
  Py_ssize_t pos = 0;
  PyObject *key, *value;
  while (PyDict_Next(kwargs, &pos, &key, &value))
    if (!fast_place(f, key, value, slot)) return false;
  return true;
}

// torch's own __call__ of `self`'s class (OpOverloadPacket.__call__ or OpOverload.__call__), called as Python
// would call it: torch's path, unchanged.
PyObject* torch_call(PyObject* self, PyObject* args, PyObject* kwargs) {
  PyObject* call = _PyType_Lookup(Py_TYPE(self), call_key());  // borrowed
  if (call == nullptr) {
    PyErr_Format(PyExc_TypeError, "flyship: expected %s to inherit torch's __call__, found none",
                 Py_TYPE(self)->tp_name);
    return nullptr;
  }
  const Py_ssize_t nargs = PyTuple_GET_SIZE(args);
  PyObject* small[8];
  std::vector<PyObject*> big;
  PyObject** all = small;
  if (nargs + 1 > 8) {
    big.resize(static_cast<size_t>(nargs + 1));
    all = big.data();
  }
  all[0] = self;
  for (Py_ssize_t k = 0; k < nargs; ++k) all[k + 1] = PyTuple_GET_ITEM(args, k);
  return PyObject_VectorcallDict(call, all, static_cast<size_t>(nargs + 1), kwargs);
}

PyObject* torch_op_tp_call(PyObject* self, PyObject* args, PyObject* kwargs) {
  // Held for the call: the launch runs without the GIL, while another thread might replace the attribute.
  const py::object binding = py::reinterpret_borrow<py::object>(binding_of(self));
  FastOp* f = fast_binding(binding.ptr());
  if (f != nullptr) {
    PyObject* result = fast_attempt(*f, [&](PyObject** slot) { return gather(*f, args, kwargs, slot); });
    if (result != nullptr || PyErr_Occurred()) return result;  // a result, or a launch refused (not run again)
  }
  return torch_call(self, args, kwargs);
}

PyTypeObject* checked_torch_op_class(const py::handle& cls) {
  py::module_ ops = py::module_::import("torch._ops");
  const py::object packet = ops.attr("OpOverloadPacket"), overload = ops.attr("OpOverload");
  const bool ok = PyType_Check(cls.ptr()) && cls.ptr() != packet.ptr() && cls.ptr() != overload.ptr() &&
                  (PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(cls.ptr()),
                                    reinterpret_cast<PyTypeObject*>(packet.ptr())) ||
                   PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(cls.ptr()),
                                    reinterpret_cast<PyTypeObject*>(overload.ptr())));
  FLYSHIP_CHECK_TYPE(ok, "enable_torch_op_call: expected a subclass of torch._ops.OpOverloadPacket or OpOverload "
                     "(not the class itself), got ", std::string(py::str(cls)),
                     "; pass loader/torchops.py's FastOpOverloadPacket / FastOpOverload");
  return reinterpret_cast<PyTypeObject*>(cls.ptr());
}

}  // namespace

void add_torch_op_call(py::module_& m) {
  m.def(
      "enable_torch_op_call",
      [](const py::handle& cls) {
        // A Python subclass inherits slot_tp_call (a Python frame per call, through torch's __call__); point its
        // tp_call at the C entry. Nothing is added to the class's dict: its __call__ stays torch's.
        PyTypeObject* t = checked_torch_op_class(cls);
        t->tp_call = torch_op_tp_call;
        PyType_Modified(t);
      },
      py::arg("cls"),
      "Make eager calls of instances of `cls` (a subclass of torch's OpOverloadPacket / OpOverload) try the fast "
      "entry first, then torch's own __call__.");
  m.def(
      "bind_torch_op",
      [](const py::handle& obj, const py::handle& binding) {
        FLYSHIP_CHECK_TYPE(fast_binding(binding.ptr()) != nullptr,
                           "bind_torch_op: expected a FastCall bound by bind_fast(..., torch_surface=True), got ",
                           std::string(py::str(py::type::handle_of(binding))));
        FLYSHIP_CHECK_TYPE(fast_binding(binding.ptr())->torch_surface,
                           "bind_torch_op: expected a binding made with torch_surface=True (torch's .out returns "
                           "nothing), got a handle's; bind a new FastCall");
        FLYSHIP_CHECK_TYPE(_PyObject_GetDictPtr(obj.ptr()) != nullptr, "bind_torch_op: expected an object with a "
                           "__dict__ (a torch OpOverloadPacket / OpOverload), got ",
                           std::string(py::str(py::type::handle_of(obj))));
        py::setattr(obj, binding_key(), binding);
      },
      py::arg("obj"), py::arg("binding"),
      "Store `binding` on the torch op `obj` as its `_flyship_fast` attribute, which its class's C tp_call reads.");
}

}  // namespace flyship
