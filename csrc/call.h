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
  c10::SmallVector<at::ScalarType, 4> out_dtypes;
  c10::Device device = c10::Device(c10::DeviceType::CPU);

  int64_t shape(int s, int d) const { return t[s]->sizes()[d]; }
  int64_t stride(int s, int d) const { return t[s]->strides()[d]; }
  int64_t numel(int s) const { return t[s]->numel(); }
  int64_t scalar(int s) const { return i[s]; }
};

struct Decision {
  int spec = -1;
  int variant = -1;
  std::string reason;  // why nothing fits (spec == -1)
};

}  // namespace flyship
