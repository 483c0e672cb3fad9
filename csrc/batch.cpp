// The per-call path, the batch step (after bind): leading batch dimensions. A batched tensor of kernel rank r
// may come with rank r + k; its first k + 1 sizes (the leading dims) are flattened into the kernel's first
// dimension, so (B, S, H) reaches an (M, H) kernel as the view (B*S, H). Every later step (output rules, guards,
// launch checks, kernargs, the reference) sees the flattened tensors; batched outputs get the leading dims back.
// flyship.bundle.batch states the same rule for the fake and CPU kernels; tests/loader/test_batch.py proves
// they agree. Nothing here runs for an op without batched tensors, or for a call without extra dims.
#include <ATen/TensorUtils.h>

#include "check.h"
#include "op.h"
#include "util.h"

namespace flyship {

namespace {

// x's leading dims for a kernel of rank `rank`: its first dim() - rank + 1 sizes.
c10::IntArrayRef leading(const at::Tensor& x, int rank) { return x.sizes().slice(0, x.dim() - rank + 1); }

}  // namespace

void Binder::flatten_batch(Call& c, bool is_out) const {
  const OpPlan& p = plan_;
  if (p.batch_inputs.empty()) return;
  const int s0 = p.batch_inputs[0];
  const c10::IntArrayRef lead = leading(*c.t[s0], p.slots[s0].rank);
  for (size_t k = 1; k < p.batch_inputs.size(); ++k) {
    const int s = p.batch_inputs[k];
    const c10::IntArrayRef mine = leading(*c.t[s], p.slots[s].rank);
    FLYSHIP_CHECK(mine == lead, label(), ": expected the batched inputs to agree on their leading dimensions, got ",
                  shape_str(lead), " for '", p.slots[s0].name, "' and ", shape_str(mine), " for '", p.slots[s].name,
                  "'; pass tensors with the same leading (batch) dimensions");
  }
  if (lead.size() == 1) return;  // no extra dims: the kernel's own shapes (the common, free case)
  int64_t rows = 1;
  for (int64_t d : lead) {
    FLYSHIP_CHECK(!__builtin_mul_overflow(rows, d, &rows), label(), ": the leading dimensions ", shape_str(lead),
                  " of '", p.slots[s0].name, "' multiply beyond int64; expected at most 2^63-1 rows");
  }
  c.lead.assign(lead.begin(), lead.end());
  c.flat.reserve(p.batch_inputs.size() + p.batch_outputs.size());  // t[] points into it: no reallocation later
  const int64_t extra = static_cast<int64_t>(lead.size()) - 1;
  auto flatten = [&](int s) {
    const at::Tensor& x = *c.t[s];
    at::DimVector shape{rows};
    for (int64_t d = extra + 1; d < x.dim(); ++d) shape.push_back(x.sizes()[d]);
    // The strides a view of that shape would have, if one exists (what Tensor::view decides by).
    std::optional<at::DimVector> strides = at::detail::computeStride(x.sizes(), x.strides(), shape);
    c.user.emplace_back(s, c.t[s]);
    if (strides) {
      c.flat.push_back(x.as_strided(shape, *strides));
    } else {
      // An input written in place cannot be a copy: the kernel's (or the reference's) write would be lost.
      FLYSHIP_CHECK(!p.slots[s].is_mutable, label(), ": input '", p.slots[s].name, "', which the kernel writes in "
                    "place, has shape ", shape_str(x.sizes()), " and strides ", shape_str(x.strides()),
                    ", which do not flatten to ", shape_str(shape), " without a copy (the write would be lost); pass a "
                    "tensor whose leading dims flatten to a view (.contiguous(), then copy the result back)");
      // No view: the kernel would need a copy of its own input (or would write a copy of the out tensor). The
      // call falls back with this reason (or raises, with the fallback off); the reference gets a copy.
      if (c.batch_reason.empty()) {
        c.batch_reason = "batch: '" + p.slots[s].name + "' of shape " + shape_str(x.sizes()) + " and strides " +
                         shape_str(x.strides()) + " does not flatten to " + shape_str(shape) + " without a copy";
      }
      // The copy is memory flyship takes for this call: through allocate, so that a failure names the input.
      c.flat.push_back(allocate(shape, x.scalar_type(), x.device(), false,
                                "a copy (its leading dims flatten to no view) of input", p.slots[s].name));
      c.flat.back().view(x.sizes()).copy_(x);
    }
    c.t[s] = &c.flat.back();
  };
  for (int s : p.batch_inputs) flatten(s);
  if (is_out) {
    // An out tensor with other leading dims stays as given: prepare's shape check then names the shape it expects.
    for (int s : p.batch_outputs) {
      const at::Tensor& o = *c.t[s];
      if (o.dim() == p.slots[s].rank + extra && o.sizes().slice(0, extra + 1) == c10::IntArrayRef(c.lead)) flatten(s);
    }
  }
}

c10::SmallVector<int64_t, 6> Binder::user_shape(const Call& c, size_t j) const {
  const c10::SmallVector<int64_t, 6>& flat = c.out_shapes[j];
  if (c.lead.empty() || !plan_.slots[plan_.n_inputs + j].batch) return flat;
  c10::SmallVector<int64_t, 6> full(c.lead.begin(), c.lead.end());
  full.append(flat.begin() + 1, flat.end());
  return full;
}

}  // namespace flyship
