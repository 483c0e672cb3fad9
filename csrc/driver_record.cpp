// Driver shim, record flavor: runs no kernel, records every launch. Test-only (FLYSHIP_FLAVOR=record).
//
// The core treats it as any other driver, so a test on a machine without a GPU runs the real call path
// (bind -> guards -> allocate -> grid -> pack -> launch) on CPU tensors and then reads what reached the
// "runtime": symbol, grid, block, dynamic LDS, the kernarg bytes, stream and device. The device a call
// runs on is described by set_recorded_device (target ID and limits), so dispatch per target is testable.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "driver.h"

namespace flyship::driver {
namespace {

namespace py = pybind11;

struct RecordedModule {
  int device;
  size_t image_size;
};

struct RecordedFunction {
  const RecordedModule* module;
  std::string symbol;
};

struct RecordedLaunch {
  int device;
  std::string symbol;
  uint32_t grid[3];
  uint32_t block[3];
  uint32_t dynamic_shared;
  uintptr_t stream;
  std::string kernargs;
};

struct Recorder {
  std::mutex mu;
  std::map<int, DeviceInfo> devices;
  std::vector<RecordedLaunch> launches;
  std::vector<std::unique_ptr<RecordedFunction>> functions;  // live as long as the process, like real ones
};

Recorder& recorder() {
  static Recorder* r = new Recorder();  // never destroyed: modules outlive static destruction
  return *r;
}

DeviceInfo default_device() {
  DeviceInfo d;
  d.target = "gfx942:sramecc+:xnack-";
  d.name = "flyship recording device";
  d.max_shared_per_block = 64 * 1024;
  d.max_threads_per_block = 1024;
  d.cu_count = 304;  // an MI300X
  set_hip_grid_limits(&d);
  return d;
}

}  // namespace

const char* flavor() { return "record"; }

std::string runtime_version() { return "flyship recording driver (no GPU runtime)"; }

bool host_tensors() { return true; }

Status device_info(int device, DeviceInfo* out) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.devices.find(device);
  *out = it == r.devices.end() ? default_device() : it->second;
  return {};
}

Status module_load(int device, const void* image, size_t size, void** module) {
  // As the runtimes do: an image must be an ELF (hsaco, cubin) or a clang offload bundle.
  static const char kBundleMagic[] = "__CLANG_OFFLOAD_BUNDLE__";
  const bool elf = size >= 4 && std::memcmp(image, "\x7f" "ELF", 4) == 0;
  const bool bundle = size >= sizeof(kBundleMagic) - 1 && std::memcmp(image, kBundleMagic, sizeof(kBundleMagic) - 1) == 0;
  if (!elf && !bundle) return {1, "record module_load: not an ELF code object or offload bundle"};
  *module = new RecordedModule{device, size};
  return {};
}

Status module_function(int, void* module, const std::string& symbol, void** function) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  r.functions.push_back(std::make_unique<RecordedFunction>(RecordedFunction{static_cast<RecordedModule*>(module), symbol}));
  *function = r.functions.back().get();
  return {};
}

void module_unload(int, void* module) { delete static_cast<RecordedModule*>(module); }

Status allow_dynamic_shared(int, void*, int64_t) { return {}; }

Status launch(int device, void* function, const uint32_t grid[3], const uint32_t block[3], uint32_t dynamic_shared,
              void* stream, void* args, size_t args_size) {
  RecordedLaunch l;
  l.device = device;
  l.symbol = static_cast<const RecordedFunction*>(function)->symbol;
  for (int k = 0; k < 3; ++k) {
    l.grid[k] = grid[k];
    l.block[k] = block[k];
  }
  l.dynamic_shared = dynamic_shared;
  l.stream = reinterpret_cast<uintptr_t>(stream);
  l.kernargs.assign(static_cast<const char*>(args), args_size);
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  r.launches.push_back(std::move(l));
  return {};
}

void add_python_bindings(void* module) {
  py::module_ m = py::reinterpret_borrow<py::module_>(py::handle(static_cast<PyObject*>(module)));
  m.def(
      "recorded_launches",
      [](bool clear) {
        Recorder& r = recorder();
        std::vector<RecordedLaunch> taken;
        {
          std::lock_guard<std::mutex> lock(r.mu);
          taken = r.launches;
          if (clear) r.launches.clear();
        }
        py::list out;
        for (const auto& l : taken) {
          py::dict d;
          d["device"] = l.device;
          d["symbol"] = l.symbol;
          d["grid"] = py::make_tuple(l.grid[0], l.grid[1], l.grid[2]);
          d["block"] = py::make_tuple(l.block[0], l.block[1], l.block[2]);
          d["dynamic_lds"] = l.dynamic_shared;
          d["stream"] = l.stream;
          d["kernargs"] = py::bytes(l.kernargs);
          out.append(d);
        }
        return out;
      },
      py::arg("clear") = true,
      "The launches recorded since the last clear, oldest first: dicts of device, symbol, grid, block, "
      "dynamic_lds, stream and kernargs (the bytes the runtime would have received).");
  m.def(
      "set_recorded_device",
      [](int device, const std::string& target, int64_t max_shared_per_block, int64_t max_threads_per_block,
         int64_t cu_count) {
        DeviceInfo d = default_device();
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
        Recorder& r = recorder();
        std::lock_guard<std::mutex> lock(r.mu);
        r.devices[device] = d;
      },
      py::arg("device"), py::arg("target"), py::arg("max_shared_per_block") = 64 * 1024,
      py::arg("max_threads_per_block") = 1024, py::arg("cu_count") = 304,
      "Describe recorded device `device` (CPU tensors run on device 0): its target ID, limits and CU count. A bundle "
      "reads a device once, at its first call there.");
}

}  // namespace flyship::driver
