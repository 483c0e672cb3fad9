// TEST-ONLY. The part of HIP's runtime API that csrc/driver_hip.cpp uses, mapped onto the CUDA driver API,
// so the HIP driver shim's own code runs on an NVIDIA GPU (issue 16). Never used by a production build:
// flyship/loader/extension.py puts this folder on the include path only for FLYSHIP_FLAVOR=hip-nvidia.
//
// Why not HIP's own NVIDIA platform: Debian's HIP 5.2 `hip/nvidia_detail/` headers do not compile against
// CUDA 13 (cudaDeviceProp lost clockRate etc.; see /work/shared/FIELD-NOTES.md, 2026-12-01).
//
// The mapping, call by call (CUDA Driver API reference):
//   hipError_t                      = CUresult: a failed call carries CUDA's own code
//   hipGetErrorName / String        = cuGetErrorName / cuGetErrorString: the driver's own words
//   hipModuleLoadData / GetFunction / Unload = cuModuleLoadData / cuModuleGetFunction / cuModuleUnload
//   hipModuleLaunchKernel           = cuLaunchKernel; `extra` is passed through untouched, since
//                                     HIP_LAUNCH_PARAM_* are CU_LAUNCH_PARAM_*: the driver itself reads the
//                                     buffer pointer and the size_t the shim points to
//   hipStream_t                     = CUstream (torch's cudaStream_t is the same pointer)
//   hipGetDeviceProperties          = cuDeviceGetAttribute + cuDeviceGetName
//   hipRuntimeGetVersion            = cuDriverGetVersion, in HIP's encoding (see hip_version.h)
//   hipGetDevice / hipSetDevice     = the thread's device; hipSetDevice makes its primary context current
//
// Two places where HIP's semantics (what the shim was written for) differ from the CUDA driver's, and the
// mapping follows HIP's, each said where it is done:
//   - HIP has no contexts: every call works on the thread's current device. CUDA driver calls need a
//     current context, so each mapped call first makes the primary context of the thread's device current
//     when none is (as the CUDA runtime does lazily; torch works in the same primary contexts).
//   - HIP needs no opt-in for dynamic LDS up to the device's limit (driver_hip.cpp's allow_dynamic_shared
//     is a no-op); CUDA needs one above 48 KiB. So sharedMemPerBlock reports the opt-in limit and
//     hipModuleLaunchKernel sets CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES when a launch asks for more
//     than the kernel was allowed so far (once per new high-water mark, as the CUDA shim's core does).
#pragma once

#if !defined(__HIP_PLATFORM_NVIDIA__) || defined(__HIP_PLATFORM_AMD__)
#error "tests/gpu/hip_nvidia is the test-only HIP-on-NVIDIA mapping: build with -D__HIP_PLATFORM_NVIDIA__ only"
#endif

#include <cuda.h>

#include <cstddef>
#include <cstdio>
#include <mutex>
#include <unordered_map>

typedef CUresult hipError_t;
typedef CUmodule hipModule_t;
typedef CUfunction hipFunction_t;
typedef CUstream hipStream_t;

constexpr hipError_t hipSuccess = CUDA_SUCCESS;

#define HIP_LAUNCH_PARAM_BUFFER_POINTER CU_LAUNCH_PARAM_BUFFER_POINTER
#define HIP_LAUNCH_PARAM_BUFFER_SIZE CU_LAUNCH_PARAM_BUFFER_SIZE
#define HIP_LAUNCH_PARAM_END CU_LAUNCH_PARAM_END

// The fields the shim reads, named as in HIP's hipDeviceProp_t.
struct hipDeviceProp_t {
  char name[256];
  char gcnArchName[256];  // the device's target ID as flyship writes NVIDIA ones: "sm_90"
  size_t sharedMemPerBlock;  // the opt-in limit (see the top of this file)
  int maxThreadsPerBlock;
  int multiProcessorCount;  // SMs (HIP: compute units)
  int major;
  int minor;
};

namespace flyship_hip_nvidia {

constexpr int kMaxDevices = 64;
constexpr unsigned kDefaultDynamicShared = 48 * 1024;  // CUDA's limit without the opt-in attribute

inline thread_local int current_device = 0;  // HIP: each thread starts on device 0

inline CUresult init() {
  static const CUresult result = cuInit(0);  // once per process, thread-safe
  return result;
}

// The primary context of `device`, retained once and kept for the process (torch allocates in it).
inline CUresult primary_context(int device, CUcontext* ctx) {
  static std::mutex mu;
  static CUcontext retained[kMaxDevices] = {};
  if (device < 0 || device >= kMaxDevices) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard<std::mutex> lock(mu);
  if (retained[device] == nullptr) {
    CUdevice dev = 0;
    CUresult e = cuDeviceGet(&dev, device);
    if (e != CUDA_SUCCESS) return e;
    e = cuDevicePrimaryCtxRetain(&retained[device], dev);
    if (e != CUDA_SUCCESS) return e;
  }
  *ctx = retained[device];
  return CUDA_SUCCESS;
}

// HIP has no contexts: make the thread's device's primary context current unless a context is current.
inline CUresult bind() {
  CUresult e = init();
  if (e != CUDA_SUCCESS) return e;
  CUcontext cur = nullptr;
  e = cuCtxGetCurrent(&cur);
  if (e != CUDA_SUCCESS || cur != nullptr) return e;
  CUcontext ctx = nullptr;
  e = primary_context(current_device, &ctx);
  if (e != CUDA_SUCCESS) return e;
  return cuCtxSetCurrent(ctx);
}

// Raise `f`'s dynamic shared memory limit to `bytes` unless it is that high already. Once per new high-water
// mark, so the first (warm-up) launch sets it and a launch under CUDA-graph capture does not call it again.
inline CUresult allow_dynamic_shared(CUfunction f, unsigned bytes) {
  static std::mutex mu;
  static std::unordered_map<CUfunction, unsigned> allowed;
  std::lock_guard<std::mutex> lock(mu);
  unsigned& have = allowed[f];
  if (bytes <= have) return CUDA_SUCCESS;
  CUresult e = cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, static_cast<int>(bytes));
  if (e == CUDA_SUCCESS) have = bytes;
  return e;
}

}  // namespace flyship_hip_nvidia

inline const char* hipGetErrorName(hipError_t e) {
  const char* s = nullptr;
  if (cuGetErrorName(e, &s) != CUDA_SUCCESS || s == nullptr) return "unknown CUresult";
  return s;
}

inline const char* hipGetErrorString(hipError_t e) {
  const char* s = nullptr;
  if (cuGetErrorString(e, &s) != CUDA_SUCCESS || s == nullptr) return "unknown CUresult";
  return s;
}

// The driver's CUDA version (1000 * major + 10 * minor) in HIP's encoding (10000000 * major + 100000 * minor),
// so the shim's major-version check compares the driver with the CUDA headers (hip_version.h).
inline hipError_t hipRuntimeGetVersion(int* version) {
  int v = 0;
  CUresult e = cuDriverGetVersion(&v);
  if (e == CUDA_SUCCESS) *version = (v / 1000) * 10000000 + (v % 1000 / 10) * 100000;
  return e;
}

inline hipError_t hipGetDevice(int* device) {
  CUresult e = flyship_hip_nvidia::init();
  if (e != CUDA_SUCCESS) return e;
  CUcontext cur = nullptr;
  e = cuCtxGetCurrent(&cur);
  if (e != CUDA_SUCCESS) return e;
  if (cur == nullptr) {
    *device = flyship_hip_nvidia::current_device;
    return CUDA_SUCCESS;
  }
  CUdevice d = 0;
  e = cuCtxGetDevice(&d);
  if (e == CUDA_SUCCESS) *device = static_cast<int>(d);
  return e;
}

inline hipError_t hipSetDevice(int device) {
  CUresult e = flyship_hip_nvidia::init();
  if (e != CUDA_SUCCESS) return e;
  CUcontext ctx = nullptr;
  e = flyship_hip_nvidia::primary_context(device, &ctx);
  if (e != CUDA_SUCCESS) return e;
  e = cuCtxSetCurrent(ctx);
  if (e == CUDA_SUCCESS) flyship_hip_nvidia::current_device = device;
  return e;
}

inline hipError_t hipGetDeviceProperties(hipDeviceProp_t* p, int device) {
  CUresult e = flyship_hip_nvidia::init();
  if (e != CUDA_SUCCESS) return e;
  CUdevice dev = 0;
  e = cuDeviceGet(&dev, device);
  if (e != CUDA_SUCCESS) return e;
  int shared = 0;
  const struct {
    int* value;
    CUdevice_attribute attribute;
  } attributes[] = {{&p->major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR},
                    {&p->minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR},
                    {&shared, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN},
                    {&p->maxThreadsPerBlock, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK},
                    {&p->multiProcessorCount, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT}};
  for (const auto& a : attributes) {
    e = cuDeviceGetAttribute(a.value, a.attribute, dev);
    if (e != CUDA_SUCCESS) return e;
  }
  p->sharedMemPerBlock = static_cast<size_t>(shared);
  e = cuDeviceGetName(p->name, sizeof(p->name) - 1, dev);
  if (e != CUDA_SUCCESS) return e;
  p->name[sizeof(p->name) - 1] = '\0';
  std::snprintf(p->gcnArchName, sizeof(p->gcnArchName), "sm_%d%d", p->major, p->minor);
  return CUDA_SUCCESS;
}

inline hipError_t hipModuleLoadData(hipModule_t* module, const void* image) {
  CUresult e = flyship_hip_nvidia::bind();
  return e != CUDA_SUCCESS ? e : cuModuleLoadData(module, image);
}

inline hipError_t hipModuleGetFunction(hipFunction_t* function, hipModule_t module, const char* name) {
  CUresult e = flyship_hip_nvidia::bind();
  return e != CUDA_SUCCESS ? e : cuModuleGetFunction(function, module, name);
}

inline hipError_t hipModuleUnload(hipModule_t module) {
  CUresult e = flyship_hip_nvidia::bind();
  return e != CUDA_SUCCESS ? e : cuModuleUnload(module);
}

inline hipError_t hipModuleLaunchKernel(hipFunction_t f, unsigned gridX, unsigned gridY, unsigned gridZ,
                                        unsigned blockX, unsigned blockY, unsigned blockZ, unsigned sharedMemBytes,
                                        hipStream_t stream, void** kernelParams, void** extra) {
  CUresult e = flyship_hip_nvidia::bind();
  if (e != CUDA_SUCCESS) return e;
  if (sharedMemBytes > flyship_hip_nvidia::kDefaultDynamicShared) {
    e = flyship_hip_nvidia::allow_dynamic_shared(f, sharedMemBytes);
    if (e != CUDA_SUCCESS) return e;
  }
  return cuLaunchKernel(f, gridX, gridY, gridZ, blockX, blockY, blockZ, sharedMemBytes, stream, kernelParams, extra);
}
