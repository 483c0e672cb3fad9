// The fast eager entry. `ops.<op>(...)` through torch.ops costs two Python frames (OpOverloadPacket /
// OpOverload.__call__), boxing every argument into an IValue, the dispatcher's key computation and the
// autograd kernel. The handle classes (loader/handles.py) derive from FastCall, a C type whose instances
// are called through CPython's vectorcall protocol: the arguments go from the Python call straight into a
// Call (slots by name, scalar defaults), then through the SAME path as the dispatcher's kernel
// (Binder::check_tensors -> prepare_bound -> Launcher::try_launch: guards, allocation, kernarg packing, launch).
//
// It takes a call only when the dispatcher would do nothing but run our kernel (fast_take, the one rule that
// torch.ops' own fast path in torch_op_call.cpp asks too): every tensor a plain
// torch.Tensor, no TorchFunctionMode or TorchDispatchMode, no functorch/vmap, functionalization, tracing or
// profiling in effect, no conjugate/negative view, no gradient needed (grad mode on and an input that requires
// grad, or a forward-AD tangent), and for .out outside inference mode. Any other call, any argument it does not
// recognise, any error before a launch and any call that no specialization fits (the fallback) goes to the
// handle's slow path, the dispatcher path itself (torch.ops.<ns>.<op>.default, or the Python .out wrapper),
// with the same arguments: the results, stats, warnings and exceptions are the dispatcher path's own.
//
// torch.compile cannot trace a C callable. The handle classes keep a Python __call__ (what dynamo inlines:
// the torch op) and enable_fast_call points the class's tp_call at vectorcall, so CPython's eager calls take
// the C path while inspect.getattr_static(cls, "__call__") still finds the Python one.
#include "fast_call.h"

#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/variable.h>

#include <cstddef>
#include <memory>
#include <vector>

#include "bundle.h"
#include "check.h"
#include "op.h"
#include "register.h"

namespace flyship {

namespace py = pybind11;

namespace {

struct FastCallObject {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  FastOp* fast;
};

// The functionality keys of a call that only our kernel acts on: the backend's dense kernel, autograd (checked
// separately: no gradient needed), ADInplaceOrView (the .out version bump, done here), and BackendSelect and
// autocast (fallthroughs for a custom op; torch's thread state always includes BackendSelect). Any other key in
// effect (Python, Functionalize, FuncTorch*, Tracer, Conjugate, Negative, ZeroTensor, PreDispatch, Sparse, ...)
// means the dispatcher does something of its own.
const c10::DispatchKeySet kPlainKeys = c10::DispatchKeySet(
    {c10::DispatchKey::Dense, c10::DispatchKey::ADInplaceOrView, c10::DispatchKey::BackendSelect,
     c10::DispatchKey::AutogradFunctionality, c10::DispatchKey::AutocastCPU, c10::DispatchKey::AutocastCUDA});

int slot_of(const FastOp& f, PyObject* key, int n) {
  for (int s = 0; s < n; ++s)
    if (f.names[s].ptr() == key) return s;  // keywords of a call site are interned, as our names are
  for (int s = 0; s < n; ++s) {
    const int eq = PyObject_RichCompareBool(f.names[s].ptr(), key, Py_EQ);
    if (eq < 0) PyErr_Clear();
    if (eq > 0) return s;
  }
  return -1;
}

// The call's arguments by slot (positional, then keywords); false when the call does not fit the fast entry's
// shapes (the handle's slow path then parses it and says why).
bool fast_gather(const FastOp& f, PyObject* const* args, size_t nargsf, PyObject* kwnames, PyObject** slot) {
  const int n = f.slots();
  const Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  if (nargs > f.inputs()) return false;
  for (int k = 0; k < n; ++k) slot[k] = k < nargs ? args[k] : nullptr;
  const Py_ssize_t nkw = kwnames == nullptr ? 0 : PyTuple_GET_SIZE(kwnames);
  for (Py_ssize_t k = 0; k < nkw; ++k)
    if (!fast_place(f, PyTuple_GET_ITEM(kwnames, k), args[nargs + k], slot)) return false;
  return true;
}

// A Python int as a long long; false (error cleared) when it does not fit.
bool fast_long(PyObject* v, long long* out) {
  int overflow = 0;
  const long long i = PyLong_AsLongLongAndOverflow(v, &overflow);
  if (overflow != 0 || (i == -1 && PyErr_Occurred())) {
    PyErr_Clear();
    return false;
  }
  *out = i;
  return true;
}

// Bind slot k's value `v` into `c` by the slot's kind, gathering the tensors' dispatch keys; false when the
// dispatcher path must take it (a tensor subclass, a forward-mode gradient, a value of another Python type).
bool fast_bind(int kind, PyObject* v, int k, Call& c, c10::DispatchKeySet* keys, bool* requires_grad) {
  long long i = 0;
  switch (kind) {
    case kTensor: {
      if (!THPVariable_CheckExact(v)) return false;  // a subclass may override __torch_function__
      const at::Tensor& t = THPVariable_Unpack(v);
      if (!t.defined()) return false;
      *keys = *keys | t.key_set();
      *requires_grad |= t.requires_grad();
      if (t._fw_grad(/*level=*/0).defined()) return false;
      c.t[k] = &t;
      return true;
    }
    case kFloat:
      if (PyFloat_CheckExact(v)) {
        c.f[k] = PyFloat_AS_DOUBLE(v);
        return true;
      }
      if (!PyLong_CheckExact(v) || !fast_long(v, &i)) return false;
      c.f[k] = static_cast<double>(i);
      return true;
    case kInt:
      if (!PyLong_CheckExact(v) || !fast_long(v, &i)) return false;  // bool is not an exact int
      c.i[k] = i;
      return true;
    default:
      if (v != Py_True && v != Py_False) return false;
      c.i[k] = v == Py_True ? 1 : 0;
      return true;
  }
}

// Whether the dispatcher would run only the plain kernel for these tensors' keys (no mode, no autograd, no
// profiler, no inference-mode out= tensors): else the fast entry steps aside.
bool fast_plain(const FastOp& f, const Call& c, c10::DispatchKeySet keys, bool requires_grad) {
  // What the dispatcher would see: the tensors' keys with the thread's included/excluded keys applied.
  if (at::impl::torch_function_mode_enabled() || c10::impl::dispatch_mode_enabled()) return false;
  const c10::impl::LocalDispatchKeySet local = c10::impl::tls_local_dispatch_key_set();
  const c10::DispatchKeySet effective = (keys | local.included_) - local.excluded_;
  if ((effective - kPlainKeys).highestFunctionalityKey() != c10::DispatchKey::Undefined) return false;
  if (requires_grad && at::GradMode::is_enabled()) return false;  // autograd's kernel decides
  if (f.is_out) {
    // Inference mode skips ADInplaceOrView, and an inference tensor refuses the version bump: the dispatcher's.
    if (c10::InferenceMode::is_enabled()) return false;
    for (int j = f.op->plan().n_inputs; j < f.slots(); ++j)
      if (c.t[j]->is_inference()) return false;
  }
  return !at::getStepCallbacksUnlessEmpty(at::RecordScope::FUNCTION).has_value();  // a profiler
}

// The fast rule: whether a call with these arguments may take the fast entry, binding them into `c` (scalar
// defaults filled in). It takes a call only when the dispatcher would do nothing but run our kernel (fast_bind,
// fast_plain); handles and torch.ops alike ask it, so they take exactly the same calls.
bool fast_take(const FastOp& f, PyObject** slot, Call& c) {
  const OpPlan& p = f.op->plan();
  const int n = f.slots();
  c.op = &p;
  c10::DispatchKeySet keys;
  bool requires_grad = false;
  for (int k = 0; k < n; ++k) {
    if (slot[k] == nullptr) {
      if (k >= p.n_inputs || f.defaults[k].is_none()) return false;
      slot[k] = f.defaults[k].ptr();
    }
    if (!fast_bind(p.slots[k].kind, slot[k], k, c, &keys, &requires_grad)) return false;
  }
  return fast_plain(f, c, keys, requires_grad);
}

// What a launched call returns: its out= tensors (version bumped, as ADInplaceOrView does) or its fresh outputs;
// one output alone, several as a tuple; torch's .out overload returns nothing, as its schema says. A new reference.
PyObject* fast_result(const FastOp& f, Call& c, PyObject* const* slot, int n_in, int n_out) {
  if (f.is_out) {
    for (int j = n_in; j < n_in + n_out; ++j) torch::autograd::impl::bump_version(*c.t[j]);
    if (f.torch_surface) Py_RETURN_NONE;
    if (n_out == 1) {
      Py_INCREF(slot[n_in]);
      return slot[n_in];
    }
    PyObject* tuple = PyTuple_New(n_out);
    if (tuple == nullptr) throw py::error_already_set();
    for (int j = 0; j < n_out; ++j) {
      Py_INCREF(slot[n_in + j]);
      PyTuple_SET_ITEM(tuple, j, slot[n_in + j]);
    }
    return tuple;
  }
  if (n_out == 1) {
    PyObject* t = THPVariable_Wrap(std::move(c.fresh[0]));
    if (t == nullptr) throw py::error_already_set();
    return t;
  }
  py::tuple out(n_out);
  for (int j = 0; j < n_out; ++j) {
    PyObject* t = THPVariable_Wrap(std::move(c.fresh[j]));
    if (t == nullptr) throw py::error_already_set();
    PyTuple_SET_ITEM(out.ptr(), j, t);
  }
  return out.release().ptr();
}

// type(self).__call__(self, *args): a FastCall whose entry was never bound.
PyObject* call_python(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  PyObject* call = PyObject_GetAttrString(reinterpret_cast<PyObject*>(Py_TYPE(self)), "__call__");
  if (call == nullptr) return nullptr;
  const Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  const Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  std::vector<PyObject*> all(static_cast<size_t>(nargs + nkw + 1));
  all[0] = self;
  for (Py_ssize_t k = 0; k < nargs + nkw; ++k) all[k + 1] = args[k];
  PyObject* r = PyObject_Vectorcall(call, all.data(), static_cast<size_t>(nargs + 1), kwnames);
  Py_DECREF(call);
  return r;
}

PyObject* fast_vectorcall(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  FastOp* f = reinterpret_cast<FastCallObject*>(self)->fast;
  if (f == nullptr) return call_python(self, args, nargsf, kwnames);
  PyObject* result =
      fast_attempt(*f, [&](PyObject** slot) { return fast_gather(*f, args, nargsf, kwnames, slot); });
  if (result != nullptr || PyErr_Occurred()) return result;  // a result, or a launch refused (not run again)
  return PyObject_Vectorcall(f->slow.ptr(), args, nargsf, kwnames);
}

PyObject* fast_new(PyTypeObject* type, PyObject*, PyObject*) {
  PyObject* self = type->tp_alloc(type, 0);
  if (self == nullptr) return nullptr;
  auto* o = reinterpret_cast<FastCallObject*>(self);
  o->vectorcall = fast_vectorcall;
  o->fast = nullptr;
  return self;
}

void fast_dealloc(PyObject* self) {
  auto* o = reinterpret_cast<FastCallObject*>(self);
  if (o->fast != nullptr) {
    FastOp* f = o->fast;
    o->fast = nullptr;
    delete f;
  }
  Py_TYPE(self)->tp_free(self);
}

PyTypeObject fast_call_type = [] {
  PyTypeObject t{PyVarObject_HEAD_INIT(nullptr, 0)};
  t.tp_name = "flyship.FastCall";
  t.tp_basicsize = sizeof(FastCallObject);
  t.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_VECTORCALL;
  t.tp_vectorcall_offset = offsetof(FastCallObject, vectorcall);
  t.tp_call = PyVectorcall_Call;
  t.tp_new = fast_new;
  t.tp_dealloc = fast_dealloc;
  t.tp_doc = "The C base of flyship's op handles: eager calls enter the C++ core directly (csrc/fast_call.cpp).";
  return t;
}();

PyTypeObject* checked_subclass(const py::handle& cls) {
  FLYSHIP_CHECK_TYPE(PyType_Check(cls.ptr()) && PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(cls.ptr()),
                                                                &fast_call_type),
                     "flyship: expected a subclass of FastCall, got ", std::string(py::str(cls)));
  return reinterpret_cast<PyTypeObject*>(cls.ptr());
}

}  // namespace

int FastOp::slots() const {
  const OpPlan& p = op->plan();
  return p.n_inputs + (is_out ? static_cast<int>(p.outputs.size()) : 0);
}

int FastOp::inputs() const { return op->plan().n_inputs; }

FastOp* fast_binding(PyObject* obj) {
  if (obj == nullptr || !PyObject_TypeCheck(obj, &fast_call_type)) return nullptr;
  return reinterpret_cast<FastCallObject*>(obj)->fast;
}

bool fast_place(const FastOp& f, PyObject* key, PyObject* value, PyObject** slot) {
  const int n = f.slots();
  const int s = PyUnicode_Check(key) ? slot_of(f, key, n) : -1;
  if (s >= 0) {
    if (slot[s] != nullptr) return false;
    slot[s] = value;
    return true;
  }
  if (!PyUnicode_Check(key) || PyUnicode_CompareWithASCIIString(key, "out") != 0) return false;
  // one output named otherwise: `out=t` is that output (a tuple goes on to the handle's out=(t,) below)
  if (f.out_alias >= 0 && !PyTuple_CheckExact(value) && !PyList_CheckExact(value)) {
    if (slot[f.out_alias] != nullptr) return false;
    slot[f.out_alias] = value;
    return true;
  }
  // handle .out only: out=(a, b, ...) is every output in order
  if (!f.out_tuple) return false;
  if (!PyTuple_CheckExact(value) && !PyList_CheckExact(value)) return false;
  const int n_in = f.op->plan().n_inputs;
  if (PySequence_Fast_GET_SIZE(value) != n - n_in) return false;
  for (int j = n_in; j < n; ++j) {
    if (slot[j] != nullptr) return false;
    slot[j] = PySequence_Fast_GET_ITEM(value, j - n_in);
  }
  return true;
}

void forget_launch_refusal() { launch_refused_here() = false; }

bool raise_launch_refusal(const c10::Error& e) {
  if (!launch_refused_here()) return false;
  launch_refused_here() = false;
  try {
    raise_as_flyship(e);
  } catch (py::error_already_set& err) {
    err.restore();
    return true;
  } catch (const c10::Error&) {  // not one of the core's own refusals: the torch path raises it as torch does
  }
  return false;
}

bool fast_try(FastOp& f, PyObject** slot, PyObject** result) {
  OpState& op = *f.op;
  const OpPlan& p = op.plan();
  Call c;
  if (!fast_take(f, slot, c)) return false;
  op.ensure_specs();  // the op's specializations, read on its first call (one acquire load afterwards)
  {
    py::gil_scoped_release nogil;  // as torch's own ops run: other Python threads go on meanwhile
    op.binder().check_tensors(c, static_cast<size_t>(f.slots()), /*check_device=*/true);
    op.binder().prepare_bound(c, f.is_out);
    Decision d;
    if (!op.launcher().try_launch(c, f.is_out, -1, &d)) return false;  // the fallback: torch's path counts it
  }
  *result = fast_result(f, c, slot, p.n_inputs, static_cast<int>(p.outputs.size()));
  return true;
}

void add_fast_call(py::module_& m) {
  if (PyType_Ready(&fast_call_type) < 0) throw py::error_already_set();
  Py_INCREF(&fast_call_type);
  m.add_object("FastCall", reinterpret_cast<PyObject*>(&fast_call_type));
  m.def(
      "enable_fast_call",
      [](const py::handle& cls) {
        // A Python subclass that defines __call__ gets slot_tp_call (a Python frame per call); point tp_call back
        // at vectorcall. Its __call__ stays in the class for torch.compile (dynamo reads it, never tp_call).
        PyTypeObject* t = checked_subclass(cls);
        t->tp_vectorcall_offset = offsetof(FastCallObject, vectorcall);
        t->tp_call = PyVectorcall_Call;
        t->tp_flags |= Py_TPFLAGS_HAVE_VECTORCALL;
        PyType_Modified(t);
      },
      py::arg("cls"), "Make eager calls of instances of `cls` (a FastCall subclass) enter the C++ core directly.");
  m.def(
      "bind_fast",
      [](const py::handle& handle, Bundle& b, int op, bool is_out, py::object slow, const py::list& defaults,
         bool torch_surface) {
        checked_subclass(py::type::handle_of(handle));
        OpState& state = b.core->op(op);
        const OpPlan& p = state.plan();
        FLYSHIP_CHECK_VALUE(static_cast<int>(defaults.size()) == p.n_inputs, "bind_fast: expected ", p.n_inputs,
                            " defaults, got ", defaults.size());
        auto f = std::make_unique<FastOp>();
        f->core = b.core;
        f->op = &state;
        f->is_out = is_out;
        f->torch_surface = torch_surface;
        f->slow = std::move(slow);
        for (auto d : defaults) f->defaults.push_back(py::reinterpret_borrow<py::object>(d));
        bool named_out = false;  // an output called "out" takes out= itself
        for (size_t k = 0; k < p.slots.size(); ++k) {
          PyObject* name = PyUnicode_InternFromString(p.slots[k].name.c_str());
          if (name == nullptr) throw py::error_already_set();
          f->names.push_back(py::reinterpret_steal<py::object>(name));
          named_out |= static_cast<int>(k) >= p.n_inputs && p.slots[k].name == "out";
        }
        f->out_tuple = is_out && !named_out && !torch_surface;
        if (is_out && !named_out && p.outputs.size() == 1) f->out_alias = p.n_inputs;
        auto* o = reinterpret_cast<FastCallObject*>(handle.ptr());
        delete o->fast;
        o->fast = f.release();
      },
      py::arg("handle"), py::arg("bundle"), py::arg("op"), py::arg("is_out"), py::arg("slow"), py::arg("defaults"),
      py::arg("torch_surface") = false,
      "Bind a FastCall instance to op `op` of `bundle` (its .out overload when is_out); calls the fast path does "
      "not take go to `slow` with the same arguments. torch_surface: the binding of a torch.ops overload (its .out "
      "returns nothing and takes its outputs by name only; bind_torch_op).");
  m.def(
      "fast_call_counts",
      [](const py::handle& handle) {
        // a handle, or a torch.ops packet / overload carrying its binding (bind_torch_op)
        const bool torch_op = !PyObject_TypeCheck(handle.ptr(), &fast_call_type);
        py::object binding = torch_op ? py::getattr(handle, "_flyship_fast", py::none())
                                      : py::reinterpret_borrow<py::object>(handle);
        if (!torch_op) checked_subclass(py::type::handle_of(handle));
        const FastOp* f = fast_binding(binding.ptr());
        py::dict d;
        d["fast"] = f ? f->taken : 0;
        d["dispatcher"] = f ? f->handed : 0;
        return d;
      },
      py::arg("handle"),
      "{'fast': calls the fast entry ran, 'dispatcher': calls it handed to the dispatcher path} of a handle or of a "
      "torch.ops packet / overload (zeros when it has no binding)");
}

}  // namespace flyship
