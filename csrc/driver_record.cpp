// Driver shim, record flavor: runs no kernel, records every launch. Test-only (FLYSHIP_FLAVOR=record).
//
// The core treats it as any other driver, so a test on a machine without a GPU runs the real call path
// (bind -> guards -> allocate -> grid -> pack -> launch) on CPU tensors and then reads what reached the
// "runtime": symbol, grid, block, dynamic LDS, the kernarg bytes, stream and device. The device a call
// runs on is described by set_recorded_device (target ID and limits), so dispatch per target is testable.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "driver.h"
#include "driver_host.h"

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
  Regions regions;
};

struct Recorder {
  std::mutex mu;
  host::Devices devices{"flyship recording device"};
  std::vector<RecordedLaunch> launches;
  std::vector<std::unique_ptr<RecordedFunction>> functions;  // live as long as the process, like real ones
};

Recorder& recorder() {
  static Recorder* r = new Recorder();  // never destroyed: modules outlive static destruction
  return *r;
}

}  // namespace

const char* flavor() { return "record"; }

std::string runtime_version() { return "flyship recording driver (no GPU runtime)"; }

bool host_tensors() { return true; }

Status device_info(int device, DeviceInfo* out) {
  *out = recorder().devices.get(device);
  return {};
}

Status module_load(int device, const void* image, size_t size, void** module) {
  const std::string refused = host::image_refusal(image, size);
  if (!refused.empty()) return {1, "record module_load: " + refused};
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
              void* stream, void* args, size_t args_size, const Regions& regions) {
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
  l.regions = regions;
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
          py::list regions;
          for (const Region& g : l.regions) regions.append(py::make_tuple(g.address, g.nbytes, g.writable, g.name));
          d["regions"] = regions;
          out.append(d);
        }
        return out;
      },
      py::arg("clear") = true,
      "The launches recorded since the last clear, oldest first: dicts of device, symbol, grid, block, "
      "dynamic_lds, stream, kernargs (the bytes the runtime would have received) and regions (the memory the launch "
      "may touch: (address, nbytes, writable, argument) per tensor, workspace and scratch buffer).");
  host::bind_describe_device(m, "set_recorded_device", recorder().devices);
}

}  // namespace flyship::driver
