// Postfix integer programs: the C++ side of flyship/bundle/expr.py (compile_program).
//
// A program is a flat list of int64 words: an opcode, then its operands (const: value; shape/stride:
// slot, dim; numel/scalar: slot; device: property index in kDevicePropertyNames). The plan names opcodes by mnemonic ("shape", "cdiv", ...); parse_program
// maps them once through kOpcodeNames below, the one table of opcodes (exported to Python as
// PLAN_TABLES["opcodes"]).
//
// Semantics (bundle/expr.py evaluates exactly these, and tests/loader/test_expr_differential.py proves it):
// signed 64-bit integers; every operation gives its mathematical result, and a result outside int64 is an
// error (never a silent wrap); // and % floor as Python's do, cdiv(a, b) is the ceiling of a / b; a zero
// divisor is an error; comparisons and and/or/not give 0 / 1, and every operand is evaluated (no short
// circuit), so the first error in postfix order is the one reported.
//
// This header has no torch dependency: the argument accessors come from an Env template parameter.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "limits.h"  // kMaxProgramWords, kMaxProgramDepth (generated from bundle/limits.py)

namespace flyship {

enum Opcode : int64_t {
  OP_CONST, OP_SHAPE, OP_STRIDE, OP_NUMEL, OP_SCALAR,
  OP_ADD, OP_SUB, OP_MUL, OP_FLOORDIV, OP_MOD, OP_CDIV, OP_MIN, OP_MAX, OP_NEG,
  OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_AND, OP_OR, OP_NOT, OP_DEVICE,
  OP_COUNT
};

// Mnemonics by opcode, as the plan spells them.
constexpr const char* kOpcodeNames[OP_COUNT] = {
    "const", "shape", "stride", "numel", "scalar",
    "add", "sub", "mul", "floordiv", "mod", "cdiv", "min", "max", "neg",
    "eq", "ne", "lt", "le", "gt", "ge", "and", "or", "not", "device"};

// Device properties a program may read (OP_DEVICE's operand), as bundle/expr.py DEVICE_PROPERTIES names them;
// the loader reads them once per device (driver::DeviceInfo).
enum DeviceProperty : int64_t { DEV_CU_COUNT, DEV_COUNT };
constexpr const char* kDevicePropertyNames[DEV_COUNT] = {"cu_count"};

// Limits of a program; flyship/bundle/expr.py enforces the same when it compiles an expression, so a bundle
// that flyc-build accepts never fails here (a test compares them through PLAN_TABLES).

// The opcode of a mnemonic, or -1.
inline int64_t opcode_of(const std::string& name) {
  for (int64_t k = 0; k < OP_COUNT; ++k)
    if (name == kOpcodeNames[k]) return k;
  return -1;
}

// One compiled expression: its words and its source text (for error messages and fallback reasons).
struct Program {
  std::vector<int64_t> code;
  std::string text;
};

// What validate() needs to know about each argument slot.
struct SlotShape {
  bool tensor;  // a tensor, else a scalar
  bool int_scalar;  // an int scalar (the only scalars expressions may name)
  int rank;
};

// Why an evaluation failed.
enum class EvalStatus { kOk, kDivisionByZero, kOverflow };

inline const char* describe(EvalStatus s) {
  switch (s) {
    case EvalStatus::kOk: return "ok";
    case EvalStatus::kDivisionByZero: return "divides by zero";
    default: return "overflows int64";
  }
}

namespace detail {

inline int operand_count(int64_t op) {
  switch (op) {
    case OP_CONST: case OP_DEVICE: return 1;
    case OP_SHAPE: case OP_STRIDE: return 2;
    case OP_NUMEL: case OP_SCALAR: return 1;
    default: return 0;
  }
}

inline int arity(int64_t op) {
  if (op < 0 || op >= OP_COUNT) return -1;
  switch (op) {
    case OP_CONST: case OP_SHAPE: case OP_STRIDE: case OP_NUMEL: case OP_SCALAR: case OP_DEVICE: return 0;
    case OP_NEG: case OP_NOT: return 1;
    default: return 2;
  }
}

// Floor division and modulo (Python's); b != 0 and not (a == INT64_MIN and b == -1), checked by the caller.
inline int64_t floordiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) q -= 1;
  return q;
}

inline int64_t floormod(int64_t a, int64_t b) {
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

// a op b for a binary opcode, into *r; the status says why there is no int64 result.
inline EvalStatus binary(int64_t op, int64_t a, int64_t b, int64_t* r) {
  switch (op) {
    case OP_ADD: return __builtin_add_overflow(a, b, r) ? EvalStatus::kOverflow : EvalStatus::kOk;
    case OP_SUB: return __builtin_sub_overflow(a, b, r) ? EvalStatus::kOverflow : EvalStatus::kOk;
    case OP_MUL: return __builtin_mul_overflow(a, b, r) ? EvalStatus::kOverflow : EvalStatus::kOk;
    case OP_FLOORDIV: case OP_MOD: case OP_CDIV:
      if (b == 0) return EvalStatus::kDivisionByZero;
      if (b == -1) {  // a / -1 is -a: only INT64_MIN has no int64 result; a % -1 is 0 (C++'s would be UB)
        if (op == OP_MOD) *r = 0;
        else if (a == INT64_MIN) return EvalStatus::kOverflow;
        else *r = -a;
        return EvalStatus::kOk;
      }
      if (op == OP_FLOORDIV) *r = floordiv(a, b);
      else if (op == OP_MOD) *r = floormod(a, b);
      else *r = floordiv(a, b) + (floormod(a, b) != 0 ? 1 : 0);  // |b| >= 2: no overflow
      return EvalStatus::kOk;
    case OP_MIN: *r = a < b ? a : b; return EvalStatus::kOk;
    case OP_MAX: *r = a > b ? a : b; return EvalStatus::kOk;
    case OP_EQ: *r = a == b; return EvalStatus::kOk;
    case OP_NE: *r = a != b; return EvalStatus::kOk;
    case OP_LT: *r = a < b; return EvalStatus::kOk;
    case OP_LE: *r = a <= b; return EvalStatus::kOk;
    case OP_GT: *r = a > b; return EvalStatus::kOk;
    case OP_GE: *r = a >= b; return EvalStatus::kOk;
    case OP_AND: *r = (a != 0) && (b != 0); return EvalStatus::kOk;
    default: *r = (a != 0) || (b != 0); return EvalStatus::kOk;  // OP_OR (validate() admits nothing else)
  }
}

}  // namespace detail

// Check a program against the op's slots. Returns "" when it is well formed, else why not.
inline std::string validate(const std::vector<int64_t>& code, const std::vector<SlotShape>& slots) {
  if (code.size() > static_cast<size_t>(kMaxProgramWords)) {
    return std::to_string(code.size()) + " words, more than " + std::to_string(kMaxProgramWords);
  }
  int depth = 0;
  size_t i = 0;
  while (i < code.size()) {
    const int64_t op = code[i];
    const int a = detail::arity(op);
    if (a < 0) return "unknown opcode " + std::to_string(op) + " at word " + std::to_string(i);
    const int n = detail::operand_count(op);
    if (i + 1 + n > code.size()) {
      return std::string("opcode ") + kOpcodeNames[op] + " at word " + std::to_string(i) + " lacks operands";
    }
    if (op == OP_DEVICE && (code[i + 1] < 0 || code[i + 1] >= DEV_COUNT)) {
      return "device property " + std::to_string(code[i + 1]) + " unknown at word " + std::to_string(i);
    }
    if (op == OP_SHAPE || op == OP_STRIDE || op == OP_NUMEL || op == OP_SCALAR) {
      const int64_t slot = code[i + 1];
      if (slot < 0 || slot >= static_cast<int64_t>(slots.size())) {
        return "slot " + std::to_string(slot) + " out of range";
      }
      const SlotShape& s = slots[slot];
      if (op == OP_SCALAR && !s.int_scalar) return "slot " + std::to_string(slot) + " is not an int scalar";
      if (op != OP_SCALAR && !s.tensor) return "slot " + std::to_string(slot) + " is not a tensor";
      if (op == OP_SHAPE || op == OP_STRIDE) {
        const int64_t dim = code[i + 2];
        if (dim < 0 || dim >= s.rank) {
          return "dimension " + std::to_string(dim) + " out of range for slot " + std::to_string(slot);
        }
      }
    }
    depth -= a;
    if (depth < 0) return "stack underflow at word " + std::to_string(i);
    depth += 1;
    if (depth > kMaxProgramDepth) return "deeper than " + std::to_string(kMaxProgramDepth) + " values";
    i += 1 + n;
  }
  if (depth != 1) return "leaves " + std::to_string(depth) + " values instead of one";
  return "";
}

// Evaluate a validated program. Env provides shape(slot, dim), stride(slot, dim), numel(slot),
// scalar(slot) and device_property(property), all int64.
template <class Env>
inline EvalStatus evaluate(const std::vector<int64_t>& code, const Env& env, int64_t* out) {
  int64_t st[kMaxProgramDepth];
  int sp = 0;
  const int64_t* w = code.data();
  const int64_t* end = w + code.size();
  while (w < end) {
    const int64_t op = *w++;
    switch (op) {
      case OP_CONST: st[sp++] = *w++; break;
      case OP_SHAPE: st[sp++] = env.shape(static_cast<int>(w[0]), static_cast<int>(w[1])); w += 2; break;
      case OP_STRIDE: st[sp++] = env.stride(static_cast<int>(w[0]), static_cast<int>(w[1])); w += 2; break;
      case OP_NUMEL: st[sp++] = env.numel(static_cast<int>(*w++)); break;
      case OP_SCALAR: st[sp++] = env.scalar(static_cast<int>(*w++)); break;
      case OP_DEVICE: st[sp++] = env.device_property(static_cast<int>(*w++)); break;
      case OP_NEG:
        if (st[sp - 1] == INT64_MIN) return EvalStatus::kOverflow;
        st[sp - 1] = -st[sp - 1];
        break;
      case OP_NOT: st[sp - 1] = st[sp - 1] == 0 ? 1 : 0; break;
      default: {
        const int64_t b = st[--sp];
        const EvalStatus s = detail::binary(op, st[sp - 1], b, &st[sp - 1]);
        if (s != EvalStatus::kOk) return s;
      }
    }
  }
  *out = st[0];
  return EvalStatus::kOk;
}

}  // namespace flyship
