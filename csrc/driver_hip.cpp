// Driver shim, HIP flavor: the HIP module API of libamdhip64 (ROCm), see driver.h.
//
// Sources: HIP API reference (hipModuleLoadData, hipModuleGetFunction, hipModuleLaunchKernel with the
// HIP_LAUNCH_PARAM_BUFFER_POINTER / _SIZE / _END "extra" array; hipGetDeviceProperties).
// What the runtime does with the buffer (ROCm/clr KernelParameters::captureAndSet): it copies each
// explicit argument from buf + .offset into the kernarg segment and fills the hidden arguments
// itself; newer runtimes read the size, so it is passed exactly, as a size_t.
// The AMD platform unless one is chosen: __HIP_PLATFORM_NVIDIA__ is set only by the test-only hip-nvidia
// flavor (flyship/loader/build.py, tests/gpu/hip_nvidia), which runs this file's code on an NVIDIA GPU.
#if !defined(__HIP_PLATFORM_AMD__) && !defined(__HIP_PLATFORM_NVIDIA__)
#define __HIP_PLATFORM_AMD__ 1
#endif
#include <hip/hip_runtime_api.h>
#include <hip/hip_version.h>

#include <mutex>
#include <string>

#include "driver.h"

namespace flyship::driver {
namespace {

Status status(hipError_t e, const char* call) {
  if (e == hipSuccess) return {};
  return {static_cast<int>(e), std::string(call) + ": " + hipGetErrorName(e) + " (" + hipGetErrorString(e) + ")"};
}

// The extension was compiled against one HIP's headers; the process may run another's runtime
// (ROCm torch wheels carry their own libamdhip64). Structures such as hipDeviceProp_t changed between
// major versions (ROCm 6 renamed hipGetDeviceProperties to hipGetDevicePropertiesR0600), so refuse a
// major-version mismatch instead of reading garbage.
Status check_runtime() {
  static std::once_flag once;
  static Status result;
  std::call_once(once, [] {
    int v = 0;
    result = status(hipRuntimeGetVersion(&v), "hipRuntimeGetVersion");
    if (result.ok() && v / 10000000 != HIP_VERSION_MAJOR) {
      result = {-1, "HIP runtime version " + std::to_string(v) + " has another major version than the headers the "
                    "flyship extension was built with (" + std::to_string(HIP_VERSION_MAJOR) + "." +
                    std::to_string(HIP_VERSION_MINOR) + "); rebuild it against this ROCm (`flyship prebuild`, with "
                    "FLYSHIP_HIP_PATH or ROCM_PATH naming the ROCm that torch uses)"};
    }
  });
  return result;
}

// Makes `device` current for the scope, restoring the previous device afterwards.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    st_ = status(hipGetDevice(&prev_), "hipGetDevice");
    if (st_.ok() && prev_ != device) {
      st_ = status(hipSetDevice(device), "hipSetDevice");
      changed_ = st_.ok();
    }
  }
  ~DeviceScope() {
    if (changed_) (void)hipSetDevice(prev_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  const Status& result() const { return st_; }

 private:
  int prev_ = 0;
  bool changed_ = false;
  Status st_;
};

}  // namespace

#if defined(__HIP_PLATFORM_NVIDIA__)
const char* flavor() { return "hip-nvidia"; }  // test-only: this shim over HIP's NVIDIA platform
#else
const char* flavor() { return "hip"; }
#endif

bool host_tensors() { return false; }

void add_python_bindings(void*) {}

std::string runtime_version() {
  int v = 0;
  hipError_t e = hipRuntimeGetVersion(&v);
  std::string headers = std::to_string(HIP_VERSION_MAJOR) + "." + std::to_string(HIP_VERSION_MINOR) + "." +
                        std::to_string(HIP_VERSION_PATCH);
  if (e != hipSuccess) return std::string("HIP runtime unknown (") + hipGetErrorName(e) + "), headers " + headers;
  return "HIP runtime " + std::to_string(v) + ", headers " + headers;
}

Status device_info(int device, DeviceInfo* out) {
  Status s = check_runtime();
  if (!s.ok()) return s;
  hipDeviceProp_t p;
  s = status(hipGetDeviceProperties(&p, device), "hipGetDeviceProperties");
  if (!s.ok()) return s;
  out->target = p.gcnArchName;
  out->name = p.name;
  out->max_shared_per_block = static_cast<int64_t>(p.sharedMemPerBlock);
  out->max_threads_per_block = p.maxThreadsPerBlock;
  out->cu_count = p.multiProcessorCount;
  set_hip_grid_limits(out);
  return {};
}

Status module_load(int device, const void* image, size_t /*size*/, void** module) {
  Status s = check_runtime();
  if (!s.ok()) return s;
  DeviceScope scope(device);
  if (!scope.result().ok()) return scope.result();
  hipModule_t m = nullptr;
  s = status(hipModuleLoadData(&m, image), "hipModuleLoadData");
  if (s.ok()) *module = m;
  return s;
}

Status module_function(int device, void* module, const std::string& symbol, void** function) {
  DeviceScope scope(device);
  if (!scope.result().ok()) return scope.result();
  hipFunction_t f = nullptr;
  Status s = status(hipModuleGetFunction(&f, static_cast<hipModule_t>(module), symbol.c_str()), "hipModuleGetFunction");
  if (s.ok()) *function = f;
  return s;
}

void module_unload(int device, void* module) {
  DeviceScope scope(device);
  (void)hipModuleUnload(static_cast<hipModule_t>(module));
}

Status allow_dynamic_shared(int, void*, int64_t) { return {}; }

Status launch(int, void* function, const uint32_t grid[3], const uint32_t block[3], uint32_t dynamic_shared,
              void* stream, void* args, size_t args_size) {
  // The size travels by pointer: HIP reads a size_t from it.
  size_t size = args_size;
  void* extra[] = {HIP_LAUNCH_PARAM_BUFFER_POINTER, args, HIP_LAUNCH_PARAM_BUFFER_SIZE, &size, HIP_LAUNCH_PARAM_END};
  return status(hipModuleLaunchKernel(static_cast<hipFunction_t>(function), grid[0], grid[1], grid[2], block[0],
                                      block[1], block[2], dynamic_shared, static_cast<hipStream_t>(stream), nullptr,
                                      args_size ? extra : nullptr),
                "hipModuleLaunchKernel");
}

}  // namespace flyship::driver
