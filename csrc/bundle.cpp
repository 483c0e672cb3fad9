// BundleCore (bundle.h): devices and kernels on first use. The variant choice, which asks Python, is in
// python_calls.cpp.
#include "bundle.h"

#include "check.h"
#include "module.h"

namespace flyship {

DeviceState& BundleCore::device(int index) {
  check_device_index(index);
  DeviceState* ds = devices_[index].load(std::memory_order_acquire);
  if (ds != nullptr) return *ds;
  driver::DeviceInfo info;
  driver::Status s = driver::device_info(index, &info);
  FLYSHIP_CHECK(s.ok(), "flyship: reading the properties of device ", index, " failed: ", s.message, " (",
              driver::runtime_version(), ")");
  const Selection& sel = selection(info.target);
  auto fresh = std::make_unique<DeviceState>(index, info, &sel, n_variants_);
  std::lock_guard<std::mutex> lock(mu_);
  ds = devices_[index].load(std::memory_order_acquire);
  if (ds == nullptr) {
    ds = fresh.get();
    device_owned_.push_back(std::move(fresh));
    devices_[index].store(ds, std::memory_order_release);
  }
  return *ds;
}

LoadedKernel& BundleCore::kernel(DeviceState& ds, const VariantPlan& v, const OpPart& op) {
  LoadedKernel* k = ds.kernels[v.id].load(std::memory_order_acquire);
  if (k != nullptr) return *k;
  const int64_t threads = int64_t(v.block[0]) * v.block[1] * v.block[2];
  FLYSHIP_CHECK(threads <= ds.info.max_threads_per_block, op.label(), ": kernel ", v.label, " needs a workgroup of ",
              threads, " work-items; device ", ds.device, " (", ds.info.target, ") allows ",
              ds.info.max_threads_per_block, "; rebuild the kernel with a smaller block");
  FLYSHIP_CHECK(v.static_lds <= ds.info.max_shared_per_block, op.label(), ": kernel ", v.label, " needs ", v.static_lds,
              " bytes of static LDS / shared memory; device ", ds.device, " (", ds.info.target, ") allows ",
              ds.info.max_shared_per_block, " per workgroup; rebuild the kernel for this device");
  std::shared_ptr<const std::string> img = image(v);
  void* f = ModuleCache::instance().function(ds.device, v, *img);
  std::lock_guard<std::mutex> lock(ds.mu);
  k = ds.kernels[v.id].load(std::memory_order_acquire);
  if (k == nullptr) {
    auto fresh = std::make_unique<LoadedKernel>();
    fresh->function = f;
    k = fresh.get();
    ds.owned.push_back(std::move(fresh));
    ds.kernels[v.id].store(k, std::memory_order_release);
  }
  return *k;
}

}  // namespace flyship
