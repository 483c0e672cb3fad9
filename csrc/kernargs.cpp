// The per-call path, part 3: grid, dynamic LDS and kernarg packing. Values to offsets, nothing else.
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

// Whether integer `v` fits a field of type `type` (float types hold any integer, rounded).
bool int_fits(int type, int64_t v) {
  switch (type) {
    case kU64: return v >= 0;
    case kI32: return v >= INT32_MIN && v <= INT32_MAX;
    case kU32: return v >= 0 && v <= UINT32_MAX;
    case kI16: return v >= INT16_MIN && v <= INT16_MAX;
    case kI8: return v >= INT8_MIN && v <= INT8_MAX;
    default: return true;
  }
}

int64_t Packer::eval(const VariantPlan& v, const Program& p, const Call& c, const char* what) const {
  int64_t out = 0;
  const EvalStatus st = evaluate(p.code, c, &out);
  FLYSHIP_CHECK(st == EvalStatus::kOk, label(), ": ", what, " expression '", p.text, "' of ", v.label, " ",
                describe(st), " for these inputs");
  return out;
}

bool Packer::check_launch(const VariantPlan& v, const Call& c, LaunchShape* ls, std::string* why) const {
  auto fail = [&](const std::string& s) {
    if (why) *why = s;
    return false;
  };
  auto value = [&](const Program& p, const char* what, int64_t* out) {
    const EvalStatus st = evaluate(p.code, c, out);
    return st == EvalStatus::kOk || fail(std::string(what) + " '" + p.text + "' " + describe(st));
  };
  ls->programs = 1;
  for (int k = 0; k < 3; ++k) {
    const Program& p = v.programs[v.grid[k]];
    if (!value(p, "grid", &ls->grid[k])) return false;
    if (ls->grid[k] < 0 || ls->grid[k] > UINT32_MAX) {
      return fail("grid '" + p.text + "' gives " + std::to_string(ls->grid[k]) + " workgroups, expected 0.." +
                  std::to_string(UINT32_MAX));
    }
    if (__builtin_mul_overflow(ls->programs, ls->grid[k], &ls->programs)) return fail("grid overflows int64");
  }
  ls->empty = ls->programs == 0;
  if (ls->empty) {
    // A zero grid launches nothing (the runtimes refuse it): right only when there is nothing to write. A grid
    // rule that rounds down to 0 for a non-empty output would return uninitialised memory.
    // The same for inputs written in place: a zero grid would leave them unwritten.
    for (size_t j = 0; j < plan_.slots.size(); ++j) {
      const bool written = static_cast<int>(j) >= plan_.n_inputs || plan_.slots[j].is_mutable;
      const int64_t n = written ? c.numel(static_cast<int>(j)) : 0;
      if (n != 0) {
        int k = ls->grid[0] == 0 ? 0 : ls->grid[1] == 0 ? 1 : 2;
        return fail("grid '" + v.programs[v.grid[k]].text + "' gives 0 workgroups, but " +
                    (static_cast<int>(j) < plan_.n_inputs ? "in-place input '" : "output '") + plan_.slots[j].name +
                    "' holds " + std::to_string(n) + " elements");
      }
    }
    return true;
  }
  if (!value(v.programs[v.dynamic_lds], "dynamic LDS", &ls->dynamic_lds)) return false;
  if (ls->dynamic_lds < 0 || ls->dynamic_lds > UINT32_MAX) {
    return fail("dynamic LDS '" + v.programs[v.dynamic_lds].text + "' gives " + std::to_string(ls->dynamic_lds) +
                " bytes");
  }
  for (const Field& f : v.fields) {
    int64_t x = 0;
    switch (f.kind) {
      case kScalar:
        if (plan_.slots[f.slot].kind == kFloat) continue;
        x = c.i[f.slot];
        break;
      case kShape: x = c.shape(f.slot, f.dim); break;
      case kStride: x = c.stride(f.slot, f.dim); break;
      case kExpr:
        if (!value(v.programs[f.program], "kernel argument", &x)) return false;
        break;
      case kScratch: {
        int64_t bytes = 0;
        if (__builtin_mul_overflow(f.bytes_per_program, ls->programs, &bytes) ||
            __builtin_add_overflow(bytes, f.align, &bytes)) {
          return fail("scratch " + f.label + ": " + std::to_string(f.bytes_per_program) + " bytes x " +
                      std::to_string(ls->programs) + " programs overflows int64");
        }
        continue;
      }
      default: continue;
    }
    if (!int_fits(f.type, x)) {
      return fail("kernel argument " + f.label + " cannot hold the value " + std::to_string(x));
    }
  }
  return true;
}

void Packer::pack_kernargs(const VariantPlan& v, const Call& c, int64_t programs, uint8_t* buf,
                            c10::SmallVector<at::Tensor, 2>* scratch) const {
  std::memset(buf, 0, v.kernarg_size);  // padding and null fields read as zero
  for (const Field& f : v.fields) {
    int64_t value = 0;
    switch (f.kind) {
      case kPointer: put<uint64_t>(buf, f.offset, reinterpret_cast<uintptr_t>(c.t[f.slot]->data_ptr())); continue;
      case kNull: continue;
      case kWorkspace:  // launch_all allocated every workspace before the first launch
        put<uint64_t>(buf, f.offset, reinterpret_cast<uintptr_t>(c.workspaces[f.slot].data_ptr()));
        continue;
      case kConstant: std::memcpy(buf + f.offset, f.constant.data(), kTypeSize[f.type]); continue;
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
        const int64_t bytes = f.bytes_per_program * programs;  // check_launch proved it fits
        at::Tensor t = binder_.allocate({bytes + f.align}, at::kByte, c.device, false, "scratch for", v.label);
        const uintptr_t base = reinterpret_cast<uintptr_t>(t.data_ptr());
        const uintptr_t aligned = (base + f.align - 1) & ~static_cast<uintptr_t>(f.align - 1);
        put<uint64_t>(buf, f.offset, aligned);
        scratch->push_back(std::move(t));
        continue;
      }
      default: FLYSHIP_CHECK(false, "flyship: internal error: field kind ", f.kind);
    }
    // check_launch refused every value a type cannot hold before anything was allocated.
    FLYSHIP_INTERNAL_ASSERT(put_int(buf, f, value), label(), ": kernel argument ", f.label, " of ", v.label,
                            " cannot hold the value ", value);
  }
}

}  // namespace flyship
