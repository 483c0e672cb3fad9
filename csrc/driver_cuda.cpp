// Driver shim, CUDA flavor: the CUDA driver API of libcuda, see driver.h.
//
// Sources: CUDA Driver API reference (cuModuleLoadData, cuModuleGetFunction, cuLaunchKernel with the
// CU_LAUNCH_PARAM_BUFFER_POINTER / _SIZE / _END "extra" array, cuFuncSetAttribute with
// CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, primary contexts).
//
// torch allocates through the CUDA runtime, which works in each device's primary context. Driver
// calls need a current context; a thread on which the runtime has not made one current yet has none,
// so the shim makes the device's primary context current when there is none (or another device's).
#include <cuda.h>

#include <mutex>
#include <string>
#include <utility>

#include "driver.h"
#include "limits.h"  // kMaxDevices (bundle/limits.py MAX_DEVICES)

namespace flyship::driver {
namespace {


Status status(CUresult e, const char* call) {
  if (e == CUDA_SUCCESS) return {};
  const char* name = nullptr;
  const char* text = nullptr;
  if (cuGetErrorName(e, &name) != CUDA_SUCCESS || name == nullptr) name = "unknown CUresult";
  if (cuGetErrorString(e, &text) != CUDA_SUCCESS || text == nullptr) text = "no description";
  return {static_cast<int>(e), std::string(call) + ": " + name + " (" + text + ")"};
}

Status init() {
  static std::once_flag once;
  static Status result;
  std::call_once(once, [] { result = status(cuInit(0), "cuInit"); });
  return result;
}

// The primary context of `device`, retained once per process and never released: torch's runtime
// allocations live in it for the life of the process.
Status primary_context(int device, CUcontext* ctx) {
  static std::mutex mu;
  static CUcontext retained[kMaxDevices] = {};
  if (device < 0 || device >= kMaxDevices) return {-1, "device index " + std::to_string(device) + " out of range"};
  std::lock_guard<std::mutex> lock(mu);
  if (retained[device] == nullptr) {
    CUdevice dev = 0;
    Status s = status(cuDeviceGet(&dev, device), "cuDeviceGet");
    if (!s.ok()) return s;
    s = status(cuDevicePrimaryCtxRetain(&retained[device], dev), "cuDevicePrimaryCtxRetain");
    if (!s.ok()) return s;
  }
  *ctx = retained[device];
  return {};
}

// Make sure a context of `device` is current on this thread.
Status ensure_context(int device) {
  CUcontext cur = nullptr;
  Status s = status(cuCtxGetCurrent(&cur), "cuCtxGetCurrent");
  if (!s.ok()) return s;
  if (cur != nullptr) {
    CUdevice d = -1;
    if (cuCtxGetDevice(&d) == CUDA_SUCCESS && d == device) return {};
  }
  CUcontext ctx = nullptr;
  s = primary_context(device, &ctx);
  if (!s.ok()) return s;
  return status(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
}

// Pushes the primary context of `device` for the scope (module loading outside a torch device guard).
class ContextScope {
 public:
  explicit ContextScope(int device) {
    st_ = init();
    CUcontext ctx = nullptr;
    if (st_.ok()) st_ = primary_context(device, &ctx);
    if (st_.ok()) st_ = status(cuCtxPushCurrent(ctx), "cuCtxPushCurrent");
    pushed_ = st_.ok();
  }
  ~ContextScope() {
    CUcontext popped = nullptr;
    if (pushed_) (void)cuCtxPopCurrent(&popped);
  }
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;
  const Status& result() const { return st_; }

 private:
  bool pushed_ = false;
  Status st_;
};

}  // namespace

const char* flavor() { return "cuda"; }

bool host_tensors() { return false; }

void add_python_bindings(void*) {}

std::string runtime_version() {
  int v = 0;
  if (cuDriverGetVersion(&v) != CUDA_SUCCESS) return "CUDA driver unknown";
  return "CUDA driver " + std::to_string(v) + ", headers " + std::to_string(CUDA_VERSION);
}

Status device_info(int device, DeviceInfo* out) {
  Status s = init();
  if (!s.ok()) return s;
  CUdevice dev = 0;
  s = status(cuDeviceGet(&dev, device), "cuDeviceGet");
  if (!s.ok()) return s;
  int major = 0, minor = 0, shared = 0, threads = 0, sms = 0, grid_x = 0, grid_y = 0, grid_z = 0;
  char name[256] = {0};
  const std::pair<int*, CUdevice_attribute> attributes[] = {
      {&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR},
      {&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR},
      {&shared, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN},
      {&threads, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK},
      {&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT},
      {&grid_x, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X},
      {&grid_y, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y},
      {&grid_z, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z}};
  for (const auto& [value, attribute] : attributes) {
    s = status(cuDeviceGetAttribute(value, attribute, dev), "cuDeviceGetAttribute");
    if (!s.ok()) return s;
  }
  s = status(cuDeviceGetName(name, sizeof(name) - 1, dev), "cuDeviceGetName");
  if (!s.ok()) return s;
  out->target = "sm_" + std::to_string(major) + std::to_string(minor);
  out->name = name;
  out->max_shared_per_block = shared;
  out->max_threads_per_block = threads;
  out->cu_count = sms;
  set_cuda_grid_limits(out, grid_x, grid_y, grid_z);
  return {};
}

Status module_load(int device, const void* image, size_t /*size*/, void** module) {
  ContextScope scope(device);
  if (!scope.result().ok()) return scope.result();
  CUmodule m = nullptr;
  Status s = status(cuModuleLoadData(&m, image), "cuModuleLoadData");
  if (s.ok()) *module = m;
  return s;
}

Status module_function(int device, void* module, const std::string& symbol, void** function) {
  ContextScope scope(device);
  if (!scope.result().ok()) return scope.result();
  CUfunction f = nullptr;
  Status s = status(cuModuleGetFunction(&f, static_cast<CUmodule>(module), symbol.c_str()), "cuModuleGetFunction");
  if (s.ok()) *function = f;
  return s;
}

void module_unload(int device, void* module) {
  ContextScope scope(device);
  if (scope.result().ok()) (void)cuModuleUnload(static_cast<CUmodule>(module));
}

Status allow_dynamic_shared(int device, void* function, int64_t dynamic_shared) {
  if (dynamic_shared <= 48 * 1024) return {};
  ContextScope scope(device);
  if (!scope.result().ok()) return scope.result();
  return status(cuFuncSetAttribute(static_cast<CUfunction>(function), CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                    static_cast<int>(dynamic_shared)),
                "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
}

Status launch(int device, void* function, const uint32_t grid[3], const uint32_t block[3], uint32_t dynamic_shared,
              void* stream, void* args, size_t args_size, const Regions&) {
  Status s = ensure_context(device);
  if (!s.ok()) return s;
  size_t size = args_size;
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, args, CU_LAUNCH_PARAM_BUFFER_SIZE, &size, CU_LAUNCH_PARAM_END};
  return status(cuLaunchKernel(static_cast<CUfunction>(function), grid[0], grid[1], grid[2], block[0], block[1],
                               block[2], dynamic_shared, static_cast<CUstream>(stream), nullptr,
                               args_size ? extra : nullptr),
                "cuLaunchKernel");
}

}  // namespace flyship::driver
