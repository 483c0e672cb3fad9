// One call's arguments by slot, the expression environment over them, and what the call decided.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>

#include <string>

#include "plan.h"

namespace flyship {

struct Call {
  const OpPlan* op = nullptr;
  const at::Tensor* t[kMaxSlots];  // tensors by slot (outputs once they exist)
  int64_t i[kMaxSlots];  // int and bool scalars
  double f[kMaxSlots];  // float scalars
  c10::SmallVector<at::Tensor, 4> fresh;  // outputs allocated by this call
  c10::SmallVector<c10::SmallVector<int64_t, 6>, 4> out_shapes;
  c10::SmallVector<c10::SmallVector<int64_t, 6>, 4> out_strides;  // contiguous, as at::empty gives them
  c10::SmallVector<int64_t, 4> out_numel;
  c10::SmallVector<at::ScalarType, 4> out_dtypes;
  c10::Device device = c10::Device(c10::DeviceType::CPU);
  int64_t device_properties[DEV_COUNT] = {0};  // the call's device, by DeviceProperty (set once it is known)
  c10::SmallVector<at::Tensor, 2> workspaces;  // a multi-launch variant's, allocated before its first launch

  // Leading batch dims (batch.cpp), set only when a batched tensor carries dims beyond the kernel's rank: then
  // t[s] of a batched slot points into `flat` (its (M, ...) view, or a copy when no view exists) and `user`
  // keeps the caller's tensor.
  c10::SmallVector<int64_t, 4> lead;  // the shared leading dims; empty: nothing is flattened in this call
  c10::SmallVector<at::Tensor, 4> flat;  // reserved before use: t[] points into it
  c10::SmallVector<std::pair<int, const at::Tensor*>, 4> user;
  std::string batch_reason;  // a batched tensor that flattens only by copying: the call falls back with this

  // The caller's tensor of slot s (with its leading dims), or the one the kernel sees when they are the same.
  const at::Tensor& user_tensor(int s) const {
    for (const auto& [slot, x] : user)
      if (slot == s) return *x;
    return *t[s];
  }

  // The expression environment. An output not allocated yet (t == nullptr) reads its rule's shape and
  // contiguous strides, so guards and launch checks run before anything is allocated.
  int64_t shape(int s, int d) const { return t[s] ? t[s]->sizes()[d] : out_shapes[s - op->n_inputs][d]; }
  int64_t stride(int s, int d) const { return t[s] ? t[s]->strides()[d] : out_strides[s - op->n_inputs][d]; }
  int64_t numel(int s) const { return t[s] ? t[s]->numel() : out_numel[s - op->n_inputs]; }
  int64_t scalar(int s) const { return i[s]; }
  int64_t device_property(int p) const { return device_properties[p]; }
};

// What a variant's launch needs from the call, computed (and checked) before anything is allocated.
struct LaunchShape {
  int64_t grid[3] = {0, 0, 0};
  int64_t programs = 0;  // grid[0] * grid[1] * grid[2]
  int64_t dynamic_lds = 0;
  bool empty = false;  // a zero grid and outputs that hold no elements: nothing to launch
};

struct Decision {
  int spec = -1;
  int variant = -1;
  LaunchShape launch;
  std::string reason;  // why nothing fits (spec == -1)
  bool on_purpose = false;  // spec == -1 by decision: a kOnPurpose specialization's guard holds (reason says why)
};

}  // namespace flyship
