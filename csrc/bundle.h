// flyship's C++ launch core: per-call argument checks, specialization choice, output allocation,
// kernarg packing and the launch, registered as boxed torch kernels.
//
// Python (flyship/loader/plan.py) lowers the manifest once per load into a plan (plan.h, parsed by
// plan.cpp): codes, offsets and postfix programs (expr.h). Per call everything runs in C++ (bind.cpp ->
// decide.cpp -> kernargs.cpp -> launch.cpp); Python is entered only (a) once per (bundle, device target) to
// choose code-object variants (flyship.bundle.targets keeps the rules) and (b) to call an op's PyTorch
// reference when no specialization fits the inputs (python_calls.cpp). Code objects are loaded through the
// driver shim (driver.h, one driver_*.cpp per flavor) into a process-wide cache (module.h); register.cpp
// registers the kernels, bindings.cpp is the Python module, fast_call.cpp the handles' direct entry from Python
// (the same bind -> decide -> launch path without torch.ops). Checks use one vocabulary (check.h).
//
// One function owns the kernarg layout (the manifest, checked against the code object's metadata at
// load); a launch only copies values to offsets (kernargs.cpp).
//
// This header: a loaded bundle, its ops, the variant choice per device target and the state per device.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "device.h"
#include "op.h"
#include "plan.h"
#include "pyref.h"

namespace flyship {

class BundleCore {
 public:
  BundleCore(const py::dict& plan, py::object selector, bool fallback)
      : selector_(std::move(selector)),
        code_object_(need<py::object>(plan, "code_object", "bundle")),
        specs_(need<py::object>(plan, "specs", "bundle")),
        blame_(need<py::object>(plan, "blame", "bundle")) {
    const int version = need<int>(plan, "version", "bundle");
    FLYSHIP_CHECK(version == kPlanVersion, "flyship: plan version ", version, " from Python, extension reads ",
                kPlanVersion, "; the loader and its compiled extension are out of step, rebuild it (flyship prebuild)");
    ns_ = need<std::string>(plan, "namespace", "bundle");
    fallback_.store(fallback);
    for (int64_t d = 0; d < kMaxDevices; ++d) devices_[d].store(nullptr);
    auto ops = need<py::list>(plan, "ops", "bundle");
    auto refs = need<py::list>(plan, "references", "bundle");
    FLYSHIP_CHECK(refs.size() == ops.size(), "flyship plan: one reference entry per op expected");
    int64_t variant_id = 0;
    for (size_t k = 0; k < ops.size(); ++k) {
      OpPlan p = parse_op(ops[k].cast<py::dict>());
      p.first_variant = static_cast<int>(variant_id);
      variant_id += p.n_code_objects;
      FLYSHIP_CHECK(variant_id <= (int64_t{1} << 30), "flyship plan: too many variants");
      ops_.push_back(std::make_unique<OpState>(this, static_cast<int>(k), std::move(p),
                                               py::reinterpret_borrow<py::object>(refs[k])));
    }
    n_variants_ = static_cast<size_t>(variant_id);
    images_.resize(n_variants_);
  }

  const std::string& ns() const { return ns_; }
  OpState& op(int k) {
    FLYSHIP_CHECK(k >= 0 && k < static_cast<int>(ops_.size()), "flyship: op index ", k, " out of range");
    return *ops_[k];
  }
  int n_ops() const { return static_cast<int>(ops_.size()); }
  bool fallback() const { return fallback_.load(std::memory_order_relaxed); }
  void set_fallback(bool on) { fallback_.store(on); }

  // The variant choice for a device target ID, asked of Python once per target.
  const Selection& selection(const std::string& target);
  // The state of device `index`, created on first use (reads the device's target ID).
  DeviceState& device(int index);
  // The kernel of variant `v` on device `ds`, loaded on first use; checks the device limits.
  LoadedKernel& kernel(DeviceState& ds, const VariantPlan& v, const OpPart& op);
  // Variant `v`'s code object, asked of Python (which reads and checks it by the rule book) before its
  // first load onto any device; never called on the launch path once the kernel is loaded.
  std::shared_ptr<const std::string> image(const VariantPlan& v);
  // Op `k`'s specializations as the plan lowers them, asked of Python (call with the GIL held).
  py::list specs_of(int k) const;
  // The message (after the op's label) for op `k`'s reference that failed on `inputs` (name -> value, the
  // kernel's shapes), asked of Python (flyship.loader.blame, which the CPU path asks too; call with the GIL held).
  std::string blame(int k, const py::dict& inputs, const std::string& failure, const char* fix,
                    bool about_dtypes) const;

 private:
  std::string ns_;
  PyRef selector_;
  PyRef code_object_;
  PyRef specs_;
  PyRef blame_;
  std::atomic<bool> fallback_{true};
  std::vector<std::unique_ptr<OpState>> ops_;
  size_t n_variants_ = 0;
  std::mutex mu_;
  std::map<std::string, std::unique_ptr<Selection>> selections_;
  std::vector<std::shared_ptr<const std::string>> images_;  // per variant id, checked, filled on first load
  std::atomic<DeviceState*> devices_[kMaxDevices];
  std::vector<std::unique_ptr<DeviceState>> device_owned_;
};

}  // namespace flyship
