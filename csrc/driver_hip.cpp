// Driver shim, HIP flavor: the HIP module API of libamdhip64 (ROCm), see driver.h.
//
// Sources: HIP API reference (hipModuleLoadData, hipModuleGetFunction, hipModuleLaunchKernel with the
// HIP_LAUNCH_PARAM_BUFFER_POINTER / _SIZE / _END "extra" array; hipGetDeviceProperties).
// What the runtime does with the buffer (ROCm/clr KernelParameters::captureAndSet): it copies each
// explicit argument from buf + .offset into the kernarg segment and fills the hidden arguments
// itself; newer runtimes read the size, so it is passed exactly, as a size_t.
// The AMD platform unless one is chosen: __HIP_PLATFORM_NVIDIA__ is set only by the test-only hip-nvidia
// flavor (flyship/loader/extension.py, tests/gpu/hip_nvidia), which runs this file's code on an NVIDIA GPU.
//
// The runtime is not linked: it is opened on first use (hip_runtime(): dlopen, then dlsym of each function below),
// so importing the extension costs no 14 MB runtime where no op reaches a GPU (loader/hip_library.py says why and
// gives the names, FLYSHIP_HIP_LIBRARY, at build time; the rpath to its folder is kept).
#if !defined(__HIP_PLATFORM_AMD__) && !defined(__HIP_PLATFORM_NVIDIA__)
#define __HIP_PLATFORM_AMD__ 1
#endif
#include <dlfcn.h>
#include <hip/hip_runtime_api.h>
#include <hip/hip_version.h>

#include <mutex>
#include <string>

#include "driver.h"

// The names to open, "a.so.5:a.so" (preprocessor tokens made a string: no quotes through ninja and the shell).
#define FLYSHIP_STR2(x) #x
#define FLYSHIP_STR(x) FLYSHIP_STR2(x)
#ifndef FLYSHIP_HIP_LIBRARY
#define FLYSHIP_HIP_LIBRARY libamdhip64.so
#endif

// The runtime functions the shim calls. A name the headers define as a macro (ROCm 6: hipGetDeviceProperties ->
// hipGetDevicePropertiesR0600) is expanded before it is made the field and the looked-up symbol, so both match
// the headers the extension was built with.
#define FLYSHIP_HIP_FUNCTIONS(X)                                                                            \
  X(hipGetErrorName) X(hipGetErrorString) X(hipRuntimeGetVersion) X(hipGetDevice) X(hipSetDevice)           \
  X(hipGetDeviceProperties) X(hipModuleLoadData) X(hipModuleGetFunction) X(hipModuleUnload)                 \
  X(hipModuleLaunchKernel)

namespace flyship::driver {
namespace {

struct HipApi {
#define FLYSHIP_HIP_FIELD(f) decltype(&::f) f = nullptr;
  FLYSHIP_HIP_FUNCTIONS(FLYSHIP_HIP_FIELD)
#undef FLYSHIP_HIP_FIELD
};

// Open the runtime: one already in the process first (RTLD_NOLOAD: ROCm torch's own copy; two HIP runtimes in one
// process are a bug), else each name through the normal search (the extension's rpath, LD_LIBRARY_PATH, ld.so's
// cache). On the NVIDIA platform (test-only) the functions are the header's own inline ones.
Status open_hip(HipApi* api) {
#if defined(__HIP_PLATFORM_NVIDIA__)
#define FLYSHIP_HIP_DIRECT(f) api->f = &::f;
  FLYSHIP_HIP_FUNCTIONS(FLYSHIP_HIP_DIRECT)
#undef FLYSHIP_HIP_DIRECT
  return {};
#else
  const std::string names = FLYSHIP_STR(FLYSHIP_HIP_LIBRARY);
  std::string wanted, errors;
  void* lib = nullptr;
  for (int mode : {RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD, RTLD_NOW | RTLD_LOCAL}) {
    for (size_t at = 0; lib == nullptr && at <= names.size();) {
      const size_t end = names.find(':', at) == std::string::npos ? names.size() : names.find(':', at);
      const std::string name = names.substr(at, end - at);
      at = end + 1;
      lib = dlopen(name.c_str(), mode);
      if (lib == nullptr && !(mode & RTLD_NOLOAD)) {
        const char* why = dlerror();
        errors += (errors.empty() ? "" : "; ") + std::string(why ? why : name + ": not found");
      }
      if (mode & RTLD_NOLOAD) wanted += (wanted.empty() ? "" : " or ") + name;
    }
    if (lib != nullptr) break;
  }
  if (lib == nullptr) {
    return {-1, "flyship: opening the HIP runtime: expected " + wanted + " (loaded in this process, or on the "
                "library path or the extension's rpath), found none (" + errors + "); install the HIP runtime "
                "(ROCm's hip-runtime-amd, or Debian's libamdhip64-5), or add the folder that holds it to "
                "LD_LIBRARY_PATH"};
  }
#define FLYSHIP_HIP_SYMBOL(f)                                                                                  \
  api->f = reinterpret_cast<decltype(&::f)>(dlsym(lib, FLYSHIP_STR(f)));                                      \
  if (api->f == nullptr) {                                                                                    \
    return {-1, "flyship: opening the HIP runtime: expected the function " FLYSHIP_STR(f) " in " + names +     \
                    ", found none; install a HIP runtime of the major version the extension was built with (" + \
                    std::to_string(HIP_VERSION_MAJOR) + ") or rebuild it (`flyship prebuild`)"};              \
  }
  FLYSHIP_HIP_FUNCTIONS(FLYSHIP_HIP_SYMBOL)
#undef FLYSHIP_HIP_SYMBOL
  return {};
#endif
}

// The runtime, opened once per process on first use (a function-local static: thread-safe, and after the first
// call one check per use); `opened` says why its functions are missing.
struct HipRuntime {
  HipApi api;
  Status opened;
};

const HipRuntime& hip_runtime() {
  static const HipRuntime runtime = [] {
    HipRuntime r;
    r.opened = open_hip(&r.api);
    return r;
  }();
  return runtime;
}

// The functions, for code reached only after hip_runtime() opened them (a device was read, a module loaded).
const HipApi& hip() { return hip_runtime().api; }

Status status(hipError_t e, const char* call) {
  if (e == hipSuccess) return {};
  return {static_cast<int>(e),
          std::string(call) + ": " + hip().hipGetErrorName(e) + " (" + hip().hipGetErrorString(e) + ")"};
}

// The extension was compiled against one HIP's headers; the process may run another's runtime
// (ROCm torch wheels carry their own libamdhip64). Structures such as hipDeviceProp_t changed between
// major versions (ROCm 6 renamed hipGetDeviceProperties to hipGetDevicePropertiesR0600), so refuse a
// major-version mismatch instead of reading garbage.
Status check_runtime() {
  static std::once_flag once;
  static Status result;
  std::call_once(once, [] {
    result = hip_runtime().opened;
    if (!result.ok()) return;
    int v = 0;
    result = status(hip().hipRuntimeGetVersion(&v), "hipRuntimeGetVersion");
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
    st_ = status(hip().hipGetDevice(&prev_), "hipGetDevice");
    if (st_.ok() && prev_ != device) {
      st_ = status(hip().hipSetDevice(device), "hipSetDevice");
      changed_ = st_.ok();
    }
  }
  ~DeviceScope() {
    if (changed_) (void)hip().hipSetDevice(prev_);
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
  std::string headers = std::to_string(HIP_VERSION_MAJOR) + "." + std::to_string(HIP_VERSION_MINOR) + "." +
                        std::to_string(HIP_VERSION_PATCH);
  const Status& opened = hip_runtime().opened;
  if (!opened.ok()) return "HIP runtime not loaded (" + opened.message + "), headers " + headers;
  int v = 0;
  hipError_t e = hip().hipRuntimeGetVersion(&v);
  if (e != hipSuccess) return std::string("HIP runtime unknown (") + hip().hipGetErrorName(e) + "), headers " + headers;
  return "HIP runtime " + std::to_string(v) + ", headers " + headers;
}

Status device_info(int device, DeviceInfo* out) {
  Status s = check_runtime();
  if (!s.ok()) return s;
  hipDeviceProp_t p;
  s = status(hip().hipGetDeviceProperties(&p, device), "hipGetDeviceProperties");
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
  s = status(hip().hipModuleLoadData(&m, image), "hipModuleLoadData");
  if (s.ok()) *module = m;
  return s;
}

Status module_function(int device, void* module, const std::string& symbol, void** function) {
  DeviceScope scope(device);
  if (!scope.result().ok()) return scope.result();
  hipFunction_t f = nullptr;
  Status s = status(hip().hipModuleGetFunction(&f, static_cast<hipModule_t>(module), symbol.c_str()),
                    "hipModuleGetFunction");
  if (s.ok()) *function = f;
  return s;
}

void module_unload(int device, void* module) {
  DeviceScope scope(device);
  (void)hip().hipModuleUnload(static_cast<hipModule_t>(module));
}

Status allow_dynamic_shared(int, void*, int64_t) { return {}; }

Status launch(int, void* function, const uint32_t grid[3], const uint32_t block[3], uint32_t dynamic_shared,
              void* stream, void* args, size_t args_size, const Regions&) {
  // The size travels by pointer: HIP reads a size_t from it.
  size_t size = args_size;
  void* extra[] = {HIP_LAUNCH_PARAM_BUFFER_POINTER, args, HIP_LAUNCH_PARAM_BUFFER_SIZE, &size, HIP_LAUNCH_PARAM_END};
  return status(hip().hipModuleLaunchKernel(static_cast<hipFunction_t>(function), grid[0], grid[1], grid[2],
                                            block[0], block[1], block[2], dynamic_shared,
                                            static_cast<hipStream_t>(stream), nullptr, args_size ? extra : nullptr),
                "hipModuleLaunchKernel");
}

}  // namespace flyship::driver
