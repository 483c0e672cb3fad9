// The driver shim: the few GPU runtime calls the loader makes, one implementation per vendor.
//
// driver_hip.cpp (HIP module API, libamdhip64), driver_cuda.cpp (CUDA driver API, libcuda) or
// driver_record.cpp (no runtime; records launches for tests) or driver_emulate.cpp (no runtime; each launch runs on
// flyship's CDNA emulator, flyship.loader.emulate) is compiled into the extension, chosen when it is built
// (flyship/loader/extension.py). This header and
// those files do not include torch: the core (csrc/*.cpp) turns a failed Status into a TORCH_CHECK
// error with the op, kernel, target and device around the runtime's own words.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace flyship::driver {

// The result of a runtime call. `message` names the API call and carries the runtime's own error
// name and string (hipGetErrorName/hipGetErrorString, cuGetErrorName/cuGetErrorString).
struct Status {
  int code = 0;
  std::string message;
  bool ok() const { return code == 0; }
};

// What the loader needs to know about a device before its first launch there.
struct DeviceInfo {
  std::string target;  // target ID: HIP gcnArchName ("gfx942:sramecc+:xnack-"), CUDA "sm_90"
  std::string name;  // marketing name, for messages
  int64_t max_shared_per_block = 0;  // bytes of LDS / shared memory one workgroup may use (CUDA: opt-in limit)
  int64_t max_threads_per_block = 0;  // work-items per workgroup
  int64_t cu_count = 0;  // compute units (AMD CUs, NVIDIA SMs): expressions' device.cu_count
  // Launch grid limits, per dimension. CUDA counts blocks: x <= 2^31-1, y and z <= 65535 (the device's
  // MAX_GRID_DIM_* attributes). HIP counts work-items: the AQL dispatch packet's grid_size_x/y/z are 32-bit
  // (HSA spec, hsa_kernel_dispatch_packet_t), so workgroups x block size <= 2^32-1 per dimension.
  int64_t max_grid[3] = {UINT32_MAX, UINT32_MAX, UINT32_MAX};  // workgroups (blocks) per dimension
  int64_t max_grid_work_items = INT64_MAX;  // workgroups x block size per dimension
};

// The grid limits of each vendor's runtime (DeviceInfo::max_grid, max_grid_work_items).
inline void set_cuda_grid_limits(DeviceInfo* d, int64_t x, int64_t y, int64_t z) {
  d->max_grid[0] = x;
  d->max_grid[1] = y;
  d->max_grid[2] = z;
  d->max_grid_work_items = INT64_MAX;
}
inline void set_hip_grid_limits(DeviceInfo* d) {
  for (int64_t& g : d->max_grid) g = UINT32_MAX;
  d->max_grid_work_items = UINT32_MAX;
}

// "hip", "cuda", "record" (driver_record.cpp: runs nothing, records each launch; test-only) or "emulate"
// (driver_emulate.cpp: each launch runs on the CPU emulator).
const char* flavor();

// Whether the driver launches on tensors in host memory (record, emulate: CPU tensors, device 0)
// rather than on a GPU's (torch device type cuda, which ROCm torch uses for HIP devices too).
bool host_tensors();

// Add the flavor's own functions to the extension's Python module (a PyObject*); the recording driver adds
// its launch log. A no-op for the GPU drivers.
void add_python_bindings(void* module);

// Runtime version, e.g. "HIP runtime 50221153 (headers 5.2.21153)" or "CUDA driver 13000".
std::string runtime_version();

// Properties of device `device` (runtime device index, as torch numbers devices).
Status device_info(int device, DeviceInfo* out);

// Load a code object (raw ELF or offload bundle; cubin) onto `device`. `image` must stay valid and
// unchanged while the module lives. On failure *module is left untouched.
Status module_load(int device, const void* image, size_t size, void** module);

// Look up kernel `symbol` in a loaded module.
Status module_function(int device, void* module, const std::string& symbol, void** function);

// Unload a module that module_load returned. Errors are ignored (nothing useful can be done).
void module_unload(int device, void* module);

// Let `function` use `dynamic_shared` bytes of dynamic shared memory (CUDA needs an opt-in above
// 48 KiB: CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES); a no-op on HIP.
Status allow_dynamic_shared(int device, void* function, int64_t dynamic_shared);

// A range of memory a launch may touch: one tensor, workspace or scratch buffer the kernargs point at, the extent its
// sizes and strides span (never its whole storage, so a guard zone around a tensor is outside it). Computed for
// host-tensor drivers only (the emulator refuses any access outside them); GPU drivers get none.
struct Region {
  uintptr_t address = 0;
  size_t nbytes = 0;
  bool writable = false;  // an output, a mutable input, a workspace or scratch
  std::string name;  // the kernel argument, for messages
};
using Regions = std::vector<Region>;

// Launch `function` on `stream` (a hipStream_t / CUstream) with the kernarg buffer `args` of
// `args_size` bytes (HIP_LAUNCH_PARAM_BUFFER_* / CU_LAUNCH_PARAM_BUFFER_*). The device must be current
// (the core holds a c10::DeviceGuard).
Status launch(int device, void* function, const uint32_t grid[3], const uint32_t block[3], uint32_t dynamic_shared,
              void* stream, void* args, size_t args_size, const Regions& regions);

}  // namespace flyship::driver
