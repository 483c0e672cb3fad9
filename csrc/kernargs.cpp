// The per-call path, part 3: grid, dynamic LDS and kernarg packing. Values to offsets, nothing else.
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstring>

#include "check.h"
#include "op.h"

namespace flyship {

namespace {

template <class T>
void put(uint8_t* buf, int64_t offset, T v) {
  std::memcpy(buf + offset, &v, sizeof(T));
}

void put_float(uint8_t* buf, const Field& f, double v) {
  switch (f.type) {
    case kF64: put<double>(buf, f.offset, v); break;
    case kF32: put<float>(buf, f.offset, static_cast<float>(v)); break;
    case kF16: put<uint16_t>(buf, f.offset, c10::Half(static_cast<float>(v)).x); break;
    case kBF16: put<uint16_t>(buf, f.offset, c10::BFloat16(static_cast<float>(v)).x); break;
    default: FLYSHIP_CHECK(false, "flyship: internal error: put_float with type ", kTypeName[f.type]);
  }
}

// Write integer `v` as the field's type; false if it does not fit.
bool put_int(uint8_t* buf, const Field& f, int64_t v) {
  switch (f.type) {
    case kPtr: case kI64: put<int64_t>(buf, f.offset, v); return true;
    case kU64: if (v < 0) return false; put<uint64_t>(buf, f.offset, static_cast<uint64_t>(v)); return true;
    case kI32:
      if (v < INT32_MIN || v > INT32_MAX) return false;
      put<int32_t>(buf, f.offset, static_cast<int32_t>(v));
      return true;
    case kU32:
      if (v < 0 || v > UINT32_MAX) return false;
      put<uint32_t>(buf, f.offset, static_cast<uint32_t>(v));
      return true;
    case kI16:
      if (v < INT16_MIN || v > INT16_MAX) return false;
      put<int16_t>(buf, f.offset, static_cast<int16_t>(v));
      return true;
    case kI8:
      if (v < INT8_MIN || v > INT8_MAX) return false;
      put<int8_t>(buf, f.offset, static_cast<int8_t>(v));
      return true;
    default: put_float(buf, f, static_cast<double>(v)); return true;
  }
}

}  // namespace

int64_t OpState::eval(const VariantPlan& v, const Program& p, const Call& c, const char* what) const {
  int64_t out = 0;
  FLYSHIP_CHECK(evaluate(p.code, c, &out), label(), ": ", what, " expression '", p.text, "' of ", v.label,
              " divides by zero for these inputs");
  return out;
}

void OpState::grid(const VariantPlan& v, const Call& c, int64_t g[3]) const {
  for (int k = 0; k < 3; ++k) {
    g[k] = eval(v, v.programs[v.grid[k]], c, "grid");
    FLYSHIP_CHECK(g[k] >= 0 && g[k] <= UINT32_MAX, label(), ": grid expression '", v.programs[v.grid[k]].text, "' gives ",
                g[k], " workgroups; expected 0..", UINT32_MAX);
  }
}

void OpState::pack_kernargs(const VariantPlan& v, const Call& c, int64_t programs, uint8_t* buf,
                            c10::SmallVector<at::Tensor, 2>* scratch) const {
  std::memset(buf, 0, v.kernarg_size);  // padding and null fields read as zero
  for (const Field& f : v.fields) {
    int64_t value = 0;
    switch (f.kind) {
      case kPointer: put<uint64_t>(buf, f.offset, reinterpret_cast<uintptr_t>(c.t[f.slot]->data_ptr())); continue;
      case kNull: continue;
      case kConstant: std::memcpy(buf + f.offset, f.constant, kTypeSize[f.type]); continue;
      case kScalar: {
        const int kind = plan_.slots[f.slot].kind;
        if (kind == kFloat) {
          put_float(buf, f, c.f[f.slot]);
          continue;
        }
        value = c.i[f.slot];
        break;
      }
      case kShape: value = c.shape(f.slot, f.dim); break;
      case kStride: value = c.stride(f.slot, f.dim); break;
      case kExpr: value = eval(v, v.programs[f.program], c, "kernarg"); break;
      case kScratch: {
        // bytes_per_program x programs of fresh device memory, aligned. The tensor is kept alive until
        // the launch is enqueued; torch's stream-ordered allocator then reuses it only after the kernel.
        const int64_t bytes = f.bytes_per_program * programs;
        at::Tensor t = at::empty({bytes + f.align}, at::TensorOptions().dtype(at::kByte).device(c.device));
        const uintptr_t base = reinterpret_cast<uintptr_t>(t.data_ptr());
        const uintptr_t aligned = (base + f.align - 1) & ~static_cast<uintptr_t>(f.align - 1);
        put<uint64_t>(buf, f.offset, aligned);
        scratch->push_back(std::move(t));
        continue;
      }
      default: FLYSHIP_CHECK(false, "flyship: internal error: field kind ", f.kind);
    }
    FLYSHIP_CHECK(put_int(buf, f, value), label(), ": kernel argument ", f.label, " of ", v.label, " (",
                kTypeName[f.type], ") cannot hold the value ", value, " of these inputs; the bundle needs a guard for "
                "it (rebuild with a constraint), or call with smaller inputs");
  }
}

}  // namespace flyship
