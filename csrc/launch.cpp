// The per-call path, part 4: the boxed kernel's body (bind -> decide -> allocate -> launch or fall back)
// and the launch itself.
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <vector>

#include "bundle.h"
#include "check.h"
#include "driver.h"
#include "op.h"

namespace flyship {

bool& launch_refused_here() {
  thread_local bool refused = false;
  return refused;
}

// The driver's device index: torch's for a GPU tensor; 0 for a CPU tensor (the recording driver).
int device_index(const c10::Device& d) { return d.has_index() ? d.index() : 0; }

namespace {

// The bytes a tensor's sizes and strides span from its data pointer (torch strides are never negative); none when it
// holds no element.
driver::Region extent(const at::Tensor& t, bool writable, const std::string& name) {
  driver::Region r;
  r.address = reinterpret_cast<uintptr_t>(t.data_ptr());
  r.writable = writable;
  r.name = name;
  if (t.numel() == 0) return r;
  int64_t last = 0;
  for (int64_t d = 0; d < t.dim(); ++d) last += (t.sizes()[d] - 1) * t.strides()[d];
  r.nbytes = static_cast<size_t>((last + 1) * static_cast<int64_t>(t.element_size()));
  return r;
}

// What a launch on host tensors may touch: each tensor, workspace and scratch buffer its kernargs point at (a host
// driver's emulator refuses any access outside them), named by argument (a tensor) or kernarg field. Outputs, mutable
// inputs, workspaces and scratch are writable.
driver::Regions host_regions(const OpPlan& p, const VariantPlan& v, const Call& c,
                             const c10::SmallVector<at::Tensor, 2>& scratch) {
  driver::Regions out;
  size_t n_scratch = 0;
  for (const Field& f : v.fields) {
    if (f.kind == kPointer) {
      const bool writable = f.slot >= static_cast<int>(p.n_inputs) || p.slots[f.slot].is_mutable;
      out.push_back(extent(*c.t[f.slot], writable, p.slots[f.slot].name));
    } else if (f.kind == kWorkspace) {
      out.push_back(extent(c.workspaces[f.slot], true, f.label));
    } else if (f.kind == kScratch && n_scratch < scratch.size()) {
      out.push_back(extent(scratch[n_scratch++], true, f.label));  // pack_kernargs allocates one per field, in order
    }
  }
  return out;
}

}  // namespace

void OpState::run(torch::jit::Stack* stack, bool is_out, int forced_spec) {
  ensure_specs();
  const OpPlan& p = plan_;
  const size_t n_args = p.n_inputs + (is_out ? p.outputs.size() : 0);
  FLYSHIP_CHECK(stack->size() >= n_args, label(), ": internal error: stack holds ", stack->size(), " values");
  auto args = torch::jit::last(*stack, n_args);
  Call c;
  binder_.prepare(c, args, is_out, /*check_device=*/true);
  Decision d;
  if (!launcher_.try_launch(c, is_out, forced_spec, &d)) fallback_.run(c, d.reason, is_out, d.on_purpose);
  // Results: the fresh outputs; the out variant returns nothing (its schema mutates the out tensors and
  // returns (), the form torch.compile can functionalize for a custom op).
  torch::jit::drop(*stack, n_args);
  if (!is_out) {
    for (size_t j = 0; j < p.outputs.size(); ++j) stack->emplace_back(std::move(c.fresh[j]));
  }
}

bool Launcher::try_launch(Call& c, bool is_out, int forced_spec, Decision* d) {
  const OpPlan& p = plan_;
  DeviceState& ds = bundle_->device(device_index(c.device));
  c.device_properties[DEV_CU_COUNT] = ds.info.cu_count;  // read once per device (BundleCore::device)
  FLYSHIP_CHECK(forced_spec < static_cast<int>(p.specs.size()), label(), ": specialization index out of range");
  if (!c.batch_reason.empty()) {
    // A batched tensor that flattens only by copying (batch.cpp): no kernel runs on a copy of the caller's tensor.
    FLYSHIP_CHECK(forced_spec < 0, label(), ": these inputs do not fit specialization ", p.specs[forced_spec].name,
                  ": ", c.batch_reason);
    d->reason = c.batch_reason;
    return false;
  }
  if (forced_spec >= 0) {
    std::string why;
    FLYSHIP_CHECK(decider_.fits(c, forced_spec, *ds.selection, is_out, &why, &d->launch), label(),
                  ": these inputs do not fit specialization ", p.specs[forced_spec].name, ": ", why);
    d->variant = ds.selection->variant[index_][forced_spec];
    d->on_purpose = d->variant == kOnPurpose;
    d->spec = d->on_purpose ? -1 : forced_spec;
    if (d->on_purpose) d->reason = ds.selection->reason[index_][forced_spec];
  } else {
    *d = decider_.decide(c, *ds.selection, is_out);
  }
  if (d->spec < 0) return false;
  if (!is_out && c.fresh.empty()) binder_.allocate_outputs(c);
  if (is_out) binder_.zero_out_tensors(c);
  launch(c, ds, *d);
  return true;
}

// out= tensors of outputs the kernel accumulates into (manifest `zero`) start from zeros, as a fresh output does:
// filled on the current stream, before the launch, only when a kernel runs (the reference overwrites them).
void Binder::zero_out_tensors(Call& c) const {
  const OpPlan& p = plan_;
  for (size_t j = 0; j < p.outputs.size(); ++j) {
    if (p.outputs[j].zero) c.user_tensor(p.n_inputs + static_cast<int>(j)).zero_();
  }
}

void Launcher::launch(Call& c, DeviceState& ds, const Decision& d) {
  const VariantPlan& v = plan_.specs[d.spec].variants[d.variant];
  const LaunchShape& ls = d.launch;
  if (!v.then.empty() || !v.workspaces.empty()) {  // several kernels in one call (launches.cpp)
    launch_all(c, ds, v, ls);
    launches_[d.spec].fetch_add(1, std::memory_order_relaxed);
    return;
  }
  LoadedKernel& k = ready(ds, v, ls);
  if (ls.empty) {  // outputs that hold no elements: nothing to launch (a zero grid is a launch error)
    empty_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  enqueue(c, ds, v, k, ls);
  launches_[d.spec].fetch_add(1, std::memory_order_relaxed);
}

LoadedKernel& Launcher::ready(DeviceState& ds, const VariantPlan& v, const LaunchShape& ls) {
  const int dev = ds.device;
  LoadedKernel& k = bundle_->kernel(ds, v, *this);
  if (ls.empty) return k;
  const int64_t dyn = ls.dynamic_lds;
  FLYSHIP_CHECK(dyn >= 0 && v.static_lds + dyn <= ds.info.max_shared_per_block, label(), ": kernel ", v.label,
              " needs ", v.static_lds, " bytes of static + ", dyn, " bytes of dynamic LDS / shared memory for these "
              "inputs; device ", dev, " (", ds.info.target, ") allows ", ds.info.max_shared_per_block,
              " per workgroup");
  const int64_t* g = ls.grid;
  for (int d = 0; d < 3; ++d) {
    const int64_t items = g[d] * static_cast<int64_t>(v.block[d]);  // both <= 2^32: no overflow in int64
    FLYSHIP_CHECK(g[d] <= ds.info.max_grid[d] && items <= ds.info.max_grid_work_items, label(), ": kernel ",
                  v.label, " needs a grid of ", g[0], "x", g[1], "x", g[2], " workgroups of ", v.block[0], "x",
                  v.block[1], "x", v.block[2], " for these inputs; device ", dev, " (", ds.info.target,
                  ") allows at most ", ds.info.max_grid[0], "x", ds.info.max_grid[1], "x", ds.info.max_grid[2],
                  " workgroups", (ds.info.max_grid_work_items < INT64_MAX ? " and " +
                  std::to_string(ds.info.max_grid_work_items) + " work-items (workgroups x block) per dimension" :
                  std::string()), "; expected inputs within it: split the call, or add a guard constraint on the "
                  "grid's dimension ", "xyz"[d], " so larger inputs run the reference");
  }
  if (dyn > k.dynamic_shared_allowed.load(std::memory_order_relaxed)) {
    driver::Status s = driver::allow_dynamic_shared(dev, k.function, dyn);
    FLYSHIP_CHECK(s.ok(), label(), ": allowing ", dyn, " bytes of dynamic shared memory for ", v.label,
                " on device ", dev, " failed: ", s.message);
    k.dynamic_shared_allowed.store(dyn, std::memory_order_relaxed);
  }
  return k;
}

void Launcher::enqueue(Call& c, DeviceState& ds, const VariantPlan& v, LoadedKernel& k, const LaunchShape& ls) {
  const int dev = device_index(c.device);
  const int64_t* g = ls.grid;
  const int64_t dyn = ls.dynamic_lds;
  c10::DeviceGuard guard(c.device);
  alignas(kKernargBufferAlignment) uint8_t inline_buf[kInlineKernargBytes];
  std::vector<uint8_t> heap_buf;
  uint8_t* buf = inline_buf;
  if (static_cast<size_t>(v.kernarg_size) > kInlineKernargBytes) {
    constexpr uintptr_t kAlign = static_cast<uintptr_t>(kKernargBufferAlignment);  // a power of two (limits.py)
    heap_buf.resize(static_cast<size_t>(v.kernarg_size) + kAlign);
    buf = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(heap_buf.data()) + kAlign - 1) & ~(kAlign - 1));
  }
  c10::SmallVector<at::Tensor, 2> scratch;
  packer_.pack_kernargs(v, c, ls.programs, buf, &scratch);
  // torch's current stream of this device; Stream::native_handle gives the hipStream_t / cudaStream_t
  // without the CUDA or HIP torch headers (c10::Stream::native_handle, torch >= 2.2). CPU tensors (the
  // recording driver) have no stream: it gets a null one.
  void* stream = driver::host_tensors()
                     ? nullptr
                     : c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(c.device).native_handle();
  const uint32_t grid32[3] = {static_cast<uint32_t>(g[0]), static_cast<uint32_t>(g[1]), static_cast<uint32_t>(g[2])};
  const driver::Regions regions = driver::host_tensors() ? host_regions(plan_, v, c, scratch) : driver::Regions();
  driver::Status s = driver::launch(dev, k.function, grid32, v.block.data(), static_cast<uint32_t>(dyn), stream, buf,
                                    static_cast<size_t>(v.kernarg_size), regions);
  if (!s.ok()) launch_refused_here() = true;
  FLYSHIP_CHECK(s.ok(), label(), ": launching ", v.label, " on device ", dev, " (", ds.info.target, ") failed: ",
              s.message, " [grid ", g[0], "x", g[1], "x", g[2], ", block ", v.block[0], "x", v.block[1], "x",
              v.block[2], "]");
}

}  // namespace flyship
