// What the host-tensor driver shims share (driver_record.cpp, driver_emulate.cpp): the described device a call
// "runs" on, set from Python per device index, and the runtimes' check that an image is a code object.
//
// Included by one shim per extension (only one driver_*.cpp is compiled in), so everything here is inline.
#pragma once

#include <pybind11/pybind11.h>

#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "driver.h"

namespace flyship::driver::host {

namespace py = pybind11;

// An MI300X, as a host driver describes device `device` until Python sets another description.
inline DeviceInfo default_device(const char* name) {
  DeviceInfo d;
  d.target = "gfx942:sramecc+:xnack-";
  d.name = name;
  d.max_shared_per_block = 64 * 1024;
  d.max_threads_per_block = 1024;
  d.cu_count = 304;
  set_hip_grid_limits(&d);
  return d;
}

// The described devices by index.
struct Devices {
  const char* default_name;
  std::mutex mu;
  std::map<int, DeviceInfo> described;

  DeviceInfo get(int device) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = described.find(device);
    return it == described.end() ? default_device(default_name) : it->second;
  }
};

// As the runtimes do: an image must be an ELF (hsaco, cubin) or a clang offload bundle. Returns the refusal, or "".
inline std::string image_refusal(const void* image, size_t size) {
  static const char kBundleMagic[] = "__CLANG_OFFLOAD_BUNDLE__";
  const bool elf = size >= 4 && std::memcmp(image, "\x7f" "ELF", 4) == 0;
  const bool bundle = size >= sizeof(kBundleMagic) - 1 && std::memcmp(image, kBundleMagic, sizeof(kBundleMagic) - 1) == 0;
  return elf || bundle ? std::string() : "not an ELF code object or offload bundle";
}

// Add `name`(device, target, max_shared_per_block, max_threads_per_block, cu_count) to the module: describe the
// device a call on CPU tensors runs on (its target ID picks the variants; its limits bound the launches).
inline void bind_describe_device(py::module_& m, const char* name, Devices& devices) {
  m.def(
      name,
      [&devices](int device, const std::string& target, int64_t max_shared_per_block, int64_t max_threads_per_block,
                 int64_t cu_count) {
        DeviceInfo d = default_device(devices.default_name);
        d.target = target;
        d.max_shared_per_block = max_shared_per_block;
        d.max_threads_per_block = max_threads_per_block;
        d.cu_count = cu_count;
        // The runtime the target stands for: CUDA's block limits for sm_*, HIP's work-item limit otherwise.
        if (target.rfind("sm_", 0) == 0) {
          set_cuda_grid_limits(&d, INT32_MAX, 65535, 65535);
        } else {
          set_hip_grid_limits(&d);
        }
        std::lock_guard<std::mutex> lock(devices.mu);
        devices.described[device] = d;
      },
      py::arg("device"), py::arg("target"), py::arg("max_shared_per_block") = 64 * 1024,
      py::arg("max_threads_per_block") = 1024, py::arg("cu_count") = 304,
      "Describe device `device` (CPU tensors run on device 0): its target ID, limits and CU count. A bundle reads a "
      "device once, at its first call there.");
}

}  // namespace flyship::driver::host
