// Postfix integer programs: the C++ side of flyship/bundle/expr.py (compile_program).
//
// A program is a flat list of int64 words: an opcode, then its operands (CONST: value; SHAPE/STRIDE:
// slot, dim; NUMEL/SCALAR: slot). Arithmetic is signed 64-bit with Python's floor semantics for
// // and %; booleans are 0 / 1. Programs are checked once when a bundle loads (validate), so the
// per-call evaluator only has to guard against division by zero.
//
// This header has no torch dependency: the argument accessors come from an Env template parameter.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace flyship {

// Opcodes: keep in step with flyship/bundle/expr.py (OP_*).
enum Opcode : int64_t {
  OP_CONST = 0,
  OP_SHAPE = 1,
  OP_STRIDE = 2,
  OP_NUMEL = 3,
  OP_SCALAR = 4,
  OP_ADD = 10,
  OP_SUB = 11,
  OP_MUL = 12,
  OP_FLOORDIV = 13,
  OP_MOD = 14,
  OP_CDIV = 15,
  OP_MIN = 16,
  OP_MAX = 17,
  OP_NEG = 18,
  OP_EQ = 20,
  OP_NE = 21,
  OP_LT = 22,
  OP_LE = 23,
  OP_GT = 24,
  OP_GE = 25,
  OP_AND = 26,
  OP_OR = 27,
  OP_NOT = 28,
};

// Deepest evaluation stack a program may need; validate() refuses deeper ones.
constexpr int kMaxProgramDepth = 32;

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

namespace detail {

inline int operand_count(int64_t op) {
  switch (op) {
    case OP_CONST: return 1;
    case OP_SHAPE: case OP_STRIDE: return 2;
    case OP_NUMEL: case OP_SCALAR: return 1;
    default: return 0;
  }
}

inline int arity(int64_t op) {
  switch (op) {
    case OP_CONST: case OP_SHAPE: case OP_STRIDE: case OP_NUMEL: case OP_SCALAR: return 0;
    case OP_NEG: case OP_NOT: return 1;
    case OP_ADD: case OP_SUB: case OP_MUL: case OP_FLOORDIV: case OP_MOD: case OP_CDIV: case OP_MIN:
    case OP_MAX: case OP_EQ: case OP_NE: case OP_LT: case OP_LE: case OP_GT: case OP_GE: case OP_AND:
    case OP_OR:
      return 2;
    default: return -1;
  }
}

// Python's a // b; b != 0 and not (a == INT64_MIN and b == -1) are checked by the caller.
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

// Wrapping arithmetic without signed-overflow undefined behaviour.
inline int64_t wrap_add(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}
inline int64_t wrap_sub(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) - static_cast<uint64_t>(b));
}
inline int64_t wrap_mul(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
}

}  // namespace detail

// Check a program against the op's slots. Returns "" when it is well formed, else why not.
inline std::string validate(const std::vector<int64_t>& code, const std::vector<SlotShape>& slots) {
  int depth = 0;
  size_t i = 0;
  while (i < code.size()) {
    const int64_t op = code[i];
    const int a = detail::arity(op);
    if (a < 0) return "unknown opcode " + std::to_string(op) + " at word " + std::to_string(i);
    const int n = detail::operand_count(op);
    if (i + 1 + n > code.size()) {
      return "opcode " + std::to_string(op) + " at word " + std::to_string(i) + " lacks operands";
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

// Evaluate a validated program. Env provides shape(slot, dim), stride(slot, dim), numel(slot) and
// scalar(slot), all int64. Returns false on division by zero (the only run-time failure).
template <class Env>
inline bool evaluate(const std::vector<int64_t>& code, const Env& env, int64_t* out) {
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
      case OP_NEG: st[sp - 1] = detail::wrap_sub(0, st[sp - 1]); break;
      case OP_NOT: st[sp - 1] = st[sp - 1] == 0 ? 1 : 0; break;
      default: {
        const int64_t b = st[--sp];
        const int64_t a = st[sp - 1];
        int64_t r = 0;
        switch (op) {
          case OP_ADD: r = detail::wrap_add(a, b); break;
          case OP_SUB: r = detail::wrap_sub(a, b); break;
          case OP_MUL: r = detail::wrap_mul(a, b); break;
          case OP_FLOORDIV: case OP_MOD: case OP_CDIV:
            if (b == 0 || (b == -1 && a == INT64_MIN)) return false;
            r = op == OP_FLOORDIV ? detail::floordiv(a, b)
                : op == OP_MOD    ? detail::floormod(a, b)
                                  : detail::wrap_sub(0, detail::floordiv(detail::wrap_sub(0, a), b));
            break;
          case OP_MIN: r = a < b ? a : b; break;
          case OP_MAX: r = a > b ? a : b; break;
          case OP_EQ: r = a == b; break;
          case OP_NE: r = a != b; break;
          case OP_LT: r = a < b; break;
          case OP_LE: r = a <= b; break;
          case OP_GT: r = a > b; break;
          case OP_GE: r = a >= b; break;
          case OP_AND: r = (a != 0) && (b != 0); break;
          case OP_OR: r = (a != 0) || (b != 0); break;
          default: return false;  // unreachable after validate()
        }
        st[sp - 1] = r;
      }
    }
  }
  *out = st[0];
  return true;
}

}  // namespace flyship
