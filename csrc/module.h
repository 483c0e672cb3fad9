// Code objects on devices: an owning Module per (device, sha256), loaded on first use, in a process-wide
// cache.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "plan.h"

namespace flyship {

class Module {
 public:
  Module(int device, const VariantPlan& v, const std::string& image);
  ~Module();
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // The kernel `v.symbol`; the caller holds the cache lock.
  void* function(const VariantPlan& v);

 private:
  int device_;
  void* image_ = nullptr;
  void* handle_ = nullptr;  // null until a load succeeds: a failed load is never unloaded
  std::map<std::string, void*> functions_;
};

class ModuleCache {
 public:
  // Deliberately never destroyed: unloading modules during static destruction races the runtime's own
  // teardown. Modules live as long as the process, as torch's own kernels do.
  static ModuleCache& instance();
  // `image`: the variant's code object, already checked (BundleCore::image).
  void* function(int device, const VariantPlan& v, const std::string& image);
  size_t size();

 private:
  std::mutex mu_;
  std::map<std::pair<int, std::string>, std::unique_ptr<Module>> modules_;
};

}  // namespace flyship
