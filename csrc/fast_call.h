// The fast eager entry: the user-facing handles ops.<op>(...) and ops.<op>.out(...) as CPython vectorcall
// objects, and torch.ops.<ns>.<op> / .default / .out themselves (torch_op_call.cpp), binding Python arguments
// straight into a Call (fast_call.cpp).
#pragma once

#include <torch/csrc/utils/pybind.h>

#include <cstdint>
#include <exception>
#include <memory>
#include <vector>

#include "limits.h"

namespace flyship {

struct BundleCore;
struct OpState;

// One bound entry: which op, which overload, and how a call of it returns.
struct FastOp {
  std::shared_ptr<BundleCore> core;  // keeps the op alive
  OpState* op = nullptr;
  bool is_out = false;
  // The torch.ops surface: .out returns what its schema says (nothing) and takes the outputs by their schema
  // names only; the handle's .out returns the out tensors and also takes `out=(a, b)`.
  bool torch_surface = false;
  pybind11::object slow;  // a handle's: called with the same arguments when the fast path does not take the call
  std::vector<pybind11::object> defaults;  // per input slot: the scalar default, or None (required)
  std::vector<pybind11::object> names;  // slot names, inputs then outputs (interned)
  bool out_tuple = false;  // handle .out: `out=(a, b)` names the outputs in order (no output is called "out")
  // .out of an op with one output named otherwise (a Triton kernel's `output_ptr`, `c_ptr`, `Y`): its slot, which
  // `out=` fills (torch's out schema always calls a lone output `out`: loader/opschema.py out_names); else -1.
  int out_alias = -1;
  uint64_t taken = 0, handed = 0;  // calls the fast path ran / handed on (under the GIL; for tests)

  int slots() const;  // the call's argument slots: inputs, plus outputs for .out
  int inputs() const;  // the op's inputs (the slots that may be given by position)
};

// The FastOp bound to `obj` (a FastCall instance), or nullptr when `obj` is not one or is unbound.
FastOp* fast_binding(PyObject* obj);

// Puts keyword argument `key`=`value` into its slot; false when the fast entry does not take such a call (an
// unknown keyword, one given twice): the caller's own path then parses it and says why.
bool fast_place(const FastOp& f, PyObject* key, PyObject* value, PyObject** slot);

// Runs the call whose arguments are in `slot` (FastOp::slots() of them, nullptr where not given) when the fast
// rule (fast_take in fast_call.cpp) takes it; false when it must go the torch path (nothing has run). On success
// *result is the new reference the call returns. Throws on errors raised before a launch.
bool fast_try(FastOp& f, PyObject** slot, PyObject** result);

// Clears the launch-refused mark (op.h launch_refused_here) before a fast call.
void forget_launch_refusal();

// For an error out of fast_try: when it is a launch the driver refused (op.h launch_refused_here), sets it as the
// Python error the torch path would raise (flyship.errors.CallError) and returns true; else false.
bool raise_launch_refusal(const c10::Error& e);

// One eager call through the fast entry, for both entries (handles and torch.ops): `gather(slot)` puts the
// call's arguments into kMaxSlots slots (false when the fast entry does not take such a call), then fast_try runs
// it. Returns the call's result (a new reference; counted in f.taken), or nullptr with no Python error set
// (counted in f.handed) when the caller must take its own path: that path runs the call again, so an error raised
// before any launch is the one it raises. A launch the driver refused (the emulator's refusal of an instruction,
// a GPU's launch error) is not run again: nullptr with that error set (callers return it).
template <class Gather>
PyObject* fast_attempt(FastOp& f, Gather&& gather) {
  forget_launch_refusal();
  try {
    PyObject* slot[kMaxSlots];
    PyObject* result = nullptr;
    if (gather(slot) && fast_try(f, slot, &result)) {
      ++f.taken;
      return result;
    }
  } catch (pybind11::error_already_set&) {
  } catch (const c10::Error& e) {
    if (raise_launch_refusal(e)) return nullptr;
  } catch (const std::exception&) {
  }
  PyErr_Clear();
  ++f.handed;
  return nullptr;
}

// Adds FastCall (the C base of the handle classes), enable_fast_call(cls), bind_fast(...) and
// fast_call_counts(obj) to the module.
void add_fast_call(pybind11::module_& m);

// Adds enable_torch_op_call(cls) and bind_torch_op(obj, binding) (torch_op_call.cpp).
void add_torch_op_call(pybind11::module_& m);

}  // namespace flyship
