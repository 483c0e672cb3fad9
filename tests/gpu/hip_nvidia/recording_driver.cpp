// TEST-ONLY: a recording CUDA driver for the CPU test of the hip-nvidia mapping (tests/loader/test_hip_nvidia.py).
// It defines the cu* functions that csrc/driver_hip.cpp reaches through include/hip/hip_runtime_api.h, with
// the driver's documented behaviour where the test looks (a context must be current for module and launch
// calls; error names and strings as libcuda words them), and records each launch as the driver received it.
// Knobs (environment): FAKE_CUDA_INIT (cuInit's result), FAKE_CUDA_DRIVER_VERSION (default: CUDA_VERSION
// of the cuda.h it is compiled with).
#include "recording_driver.h"

#include <cstdlib>
#include <cstring>

namespace recording {
Launch last_launch;
int func_max_dynamic_shared = -1;
int func_attribute_calls = 0;
int primary_retains = 0;
}  // namespace recording

namespace {

struct Context {
  int device;
};
Context contexts[2] = {{0}, {1}};
constexpr int kDevices = 1;
thread_local Context* current = nullptr;
int module_storage = 0;
int function_storage = 0;

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

}  // namespace

extern "C" {

CUresult cuInit(unsigned int) { return static_cast<CUresult>(env_int("FAKE_CUDA_INIT", 0)); }

CUresult cuDriverGetVersion(int* v) {
  *v = env_int("FAKE_CUDA_DRIVER_VERSION", CUDA_VERSION);
  return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice* dev, int ordinal) {
  if (ordinal < 0 || ordinal >= kDevices) return CUDA_ERROR_INVALID_DEVICE;
  *dev = ordinal;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int* v, CUdevice_attribute a, CUdevice) {
  switch (a) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = 9; return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = 0; return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *v = 232448; return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *v = 1024; return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = 132; return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}

CUresult cuDeviceGetName(char* name, int len, CUdevice) {
  std::strncpy(name, "Recording H200", static_cast<size_t>(len));
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice dev) {
  ++recording::primary_retains;
  *ctx = reinterpret_cast<CUcontext>(&contexts[dev]);
  return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext* ctx) {
  *ctx = reinterpret_cast<CUcontext>(current);
  return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
  current = reinterpret_cast<Context*>(ctx);
  return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice* dev) {
  if (current == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  *dev = current->device;
  return CUDA_SUCCESS;
}

CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  if (current == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (std::memcmp(image, "\x7f" "ELF", 4) != 0) return CUDA_ERROR_INVALID_IMAGE;
  *module = reinterpret_cast<CUmodule>(&module_storage);
  return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction* f, CUmodule, const char* name) {
  if (current == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (std::strncmp(name, "no_such_", 8) == 0) return CUDA_ERROR_NOT_FOUND;  // any other name is found
  *f = reinterpret_cast<CUfunction>(&function_storage);
  return CUDA_SUCCESS;
}

CUresult cuModuleUnload(CUmodule) { return current == nullptr ? CUDA_ERROR_INVALID_CONTEXT : CUDA_SUCCESS; }

CUresult cuFuncSetAttribute(CUfunction, CUfunction_attribute a, int value) {
  if (a != CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) return CUDA_ERROR_INVALID_VALUE;
  recording::func_max_dynamic_shared = value;
  ++recording::func_attribute_calls;
  return CUDA_SUCCESS;
}

// Reads `extra` as the driver does: {BUFFER_POINTER, ptr, BUFFER_SIZE, &size_t, END}, in that order here.
CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shared, CUstream stream, void** params, void** extra) {
  if (current == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  recording::Launch l;
  l.function = f;
  l.grid[0] = gx, l.grid[1] = gy, l.grid[2] = gz;
  l.block[0] = bx, l.block[1] = by, l.block[2] = bz;
  l.shared = shared;
  l.stream = stream;
  l.params = params;
  l.extra_null = extra == nullptr;
  if (extra != nullptr) {
    if (extra[0] != CU_LAUNCH_PARAM_BUFFER_POINTER || extra[2] != CU_LAUNCH_PARAM_BUFFER_SIZE ||
        extra[4] != CU_LAUNCH_PARAM_END)
      return CUDA_ERROR_INVALID_VALUE;
    l.size = *static_cast<size_t*>(extra[3]);
    const auto* bytes = static_cast<const unsigned char*>(extra[1]);
    l.bytes.assign(bytes, bytes + l.size);
  }
  recording::last_launch = l;
  return CUDA_SUCCESS;
}

// The words of libcuda 580 for the codes this driver returns.
CUresult cuGetErrorName(CUresult e, const char** s) {
  switch (e) {
    case CUDA_ERROR_INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; return CUDA_SUCCESS;
    case CUDA_ERROR_NO_DEVICE: *s = "CUDA_ERROR_NO_DEVICE"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_DEVICE: *s = "CUDA_ERROR_INVALID_DEVICE"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_IMAGE: *s = "CUDA_ERROR_INVALID_IMAGE"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_CONTEXT: *s = "CUDA_ERROR_INVALID_CONTEXT"; return CUDA_SUCCESS;
    case CUDA_ERROR_NOT_FOUND: *s = "CUDA_ERROR_NOT_FOUND"; return CUDA_SUCCESS;
    default: *s = nullptr; return CUDA_ERROR_INVALID_VALUE;
  }
}

CUresult cuGetErrorString(CUresult e, const char** s) {
  switch (e) {
    case CUDA_ERROR_INVALID_VALUE: *s = "invalid argument"; return CUDA_SUCCESS;
    case CUDA_ERROR_NO_DEVICE: *s = "no CUDA-capable device is detected"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_DEVICE: *s = "invalid device ordinal"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_IMAGE: *s = "device kernel image is invalid"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_CONTEXT: *s = "invalid device context"; return CUDA_SUCCESS;
    case CUDA_ERROR_NOT_FOUND: *s = "named symbol not found"; return CUDA_SUCCESS;
    default: *s = nullptr; return CUDA_ERROR_INVALID_VALUE;
  }
}

}  // extern "C"
