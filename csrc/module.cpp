// Module and ModuleCache (module.h): load, look up and unload code objects through the driver shim.
#include "module.h"

#include <cstdlib>
#include <cstring>

#include "check.h"
#include "driver.h"

namespace flyship {

Module::Module(int device, const VariantPlan& v, const std::string& image) : device_(device) {
  // A page-aligned private copy: the runtime may keep pointing into the image while the module lives.
  const size_t n = image.size();
  FLYSHIP_CHECK(posix_memalign(&image_, 4096, n ? n : 1) == 0, "flyship: out of host memory copying ", v.label);
  std::memcpy(image_, image.data(), n);
  void* handle = nullptr;
  driver::Status s = driver::module_load(device, image_, n, &handle);
  if (!s.ok()) {
    std::free(image_);
    // ROCR loads AMDHSA code object v6 from ROCm 6.2 (6.1 refuses it): name the version, and the way back to v5.
    const std::string version = v.code_object_version >= 6
        ? "; it is an AMDHSA code object v" + std::to_string(v.code_object_version) +
              ", which ROCm releases before 6.2 refuse: update ROCm, or rebuild the bundle with "
              "`flyc-build --code-object-version 5`"
        : "";
    FLYSHIP_CHECK(false, "flyship: loading code object ", v.label, " onto device ", device, " failed: ", s.message,
                  "; check that the device is visible to this process and the bundle has code for it (",
                  driver::runtime_version(), ")", version);
  }
  handle_ = handle;
}

Module::~Module() {
  if (handle_ != nullptr) driver::module_unload(device_, handle_);
  std::free(image_);
}

void* Module::function(const VariantPlan& v) {
  auto it = functions_.find(v.symbol);
  if (it != functions_.end()) return it->second;
  void* f = nullptr;
  driver::Status s = driver::module_function(device_, handle_, v.symbol, &f);
  FLYSHIP_CHECK(s.ok(), "flyship: code object ", v.label, " on device ", device_, " has no kernel '", v.symbol,
                "': ", s.message, "; the manifest and the code object disagree, rebuild the bundle");
  functions_.emplace(v.symbol, f);
  return f;
}

ModuleCache& ModuleCache::instance() {
  static ModuleCache* cache = new ModuleCache();
  return *cache;
}

void* ModuleCache::function(int device, const VariantPlan& v, const std::string& image) {
  std::lock_guard<std::mutex> lock(mu_);
  auto key = std::make_pair(device, v.sha256);
  auto it = modules_.find(key);
  if (it == modules_.end()) it = modules_.emplace(key, std::make_unique<Module>(device, v, image)).first;
  return it->second->function(v);
}

size_t ModuleCache::size() {
  std::lock_guard<std::mutex> lock(mu_);
  return modules_.size();
}

}  // namespace flyship
