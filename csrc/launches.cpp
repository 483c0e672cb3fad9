// The per-call path for a variant that launches several kernels (schema 1.2, manifest Variant.then): a split
// reduction's two phases, a sort's passes. Every check happens before the first launch, so a call is never
// half run: each workspace's size and each following launch's grid, LDS and values in decide (fits ->
// check_following), each kernel's load and its LDS against the device in launch_all. Then the workspaces are
// allocated from torch's caching allocator on the call's device (zero-filled on the current stream when the
// manifest asks), and the launches are enqueued in order on torch's current stream, so stream order (and a
// CUDA/HIP graph capture of the call) keeps them in sequence.
#include "check.h"
#include "op.h"
#include "util.h"

namespace flyship {

bool Packer::workspace_bytes(const WorkspacePlan& w, const Call& c, int64_t* bytes, std::string* why,
                              c10::SmallVector<int64_t, 6>* shape) const {
  int64_t n = static_cast<int64_t>(c10::elementSize(w.dtype));
  for (const Program& p : w.shape) {
    int64_t d = 0;
    const EvalStatus st = evaluate(p.code, c, &d);
    if (st != EvalStatus::kOk) {
      if (why) *why = "workspace " + w.name + " size '" + p.text + "' " + describe(st);
      return false;
    }
    if (d < 0) {
      if (why) *why = "workspace " + w.name + " size '" + p.text + "' is " + std::to_string(d) + ", expected >= 0";
      return false;
    }
    if (__builtin_mul_overflow(n, d, &n)) {
      if (why) *why = "workspace " + w.name + " bytes overflow int64 at size '" + p.text + "' = " + std::to_string(d);
      return false;
    }
    if (shape) shape->push_back(d);
  }
  *bytes = n;
  return true;
}

bool Packer::check_following(const VariantPlan& v, const Call& c, const LaunchShape& first, std::string* why) const {
  bool any = !first.empty;
  for (size_t k = 0; k < v.then.size(); ++k) {
    LaunchShape ls;
    if (!check_launch(v.then[k], c, &ls, why)) {
      if (why) *why = "launch " + std::to_string(k + 2) + " (" + v.then[k].symbol + "): " + *why;
      return false;
    }
    any |= !ls.empty;
  }
  for (const WorkspacePlan& w : v.workspaces) {
    int64_t bytes = 0;
    c10::SmallVector<int64_t, 6> shape;
    if (!workspace_bytes(w, c, &bytes, why, &shape)) return false;
    // A workspace of no elements is allocated without memory (a null pointer), and a kernel that runs would
    // write through it: refused (a fallback reason) unless no launch of the call runs at all.
    if (bytes == 0 && any) {
      std::string sizes;
      for (const Program& p : w.shape) sizes += (sizes.empty() ? "'" : ", '") + p.text + "'";
      if (why) *why = "workspace " + w.name + " has shape " + shape_str(shape) + " (sizes " + sizes + ") for these " +
                      "inputs, which holds no elements while its kernels run; expected at least one element";
      return false;
    }
  }
  return true;
}

void Launcher::launch_all(Call& c, DeviceState& ds, const VariantPlan& v, const LaunchShape& first) {
  const size_t n = 1 + v.then.size();
  FLYSHIP_INTERNAL_ASSERT(n <= static_cast<size_t>(kMaxLaunches), label(), ": ", n, " launches");
  LaunchShape shapes[kMaxLaunches];
  LoadedKernel* kernels[kMaxLaunches];
  const VariantPlan* steps[kMaxLaunches];
  steps[0] = &v;
  shapes[0] = first;
  bool any = !first.empty;
  for (size_t k = 1; k < n; ++k) {
    steps[k] = &v.then[k - 1];
    std::string why;
    // fits() proved every following launch for this call; recomputed here rather than carried in Decision.
    FLYSHIP_INTERNAL_ASSERT(packer_.check_launch(*steps[k], c, &shapes[k], &why), label(), ": launch ", k + 1, ": ", why);
    any |= !shapes[k].empty;
  }
  // Load every kernel and check it against the device before anything runs: a failure here leaves the call
  // with nothing launched.
  for (size_t k = 0; k < n; ++k) kernels[k] = &ready(ds, *steps[k], shapes[k]);
  if (!any) {  // outputs that hold no elements: nothing to launch
    empty_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  c.workspaces.clear();
  for (const WorkspacePlan& w : v.workspaces) {
    c10::SmallVector<int64_t, 6> shape;
    for (const Program& p : w.shape) shape.push_back(packer_.eval(v, p, c, "workspace shape"));
    c.workspaces.push_back(binder_.allocate(shape, w.dtype, c.device, w.zero, "workspace", w.name));
  }
  for (size_t k = 0; k < n; ++k) {
    if (!shapes[k].empty) enqueue(c, ds, *steps[k], *kernels[k], shapes[k]);
  }
}

}  // namespace flyship
