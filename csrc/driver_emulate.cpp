// Driver shim, emulate flavor (FLYSHIP_FLAVOR=emulate): no GPU runtime; each launch runs on flyship's CDNA emulator.
//
// The core treats it as any other driver, so a call on CPU tensors goes the real way (bind -> guards -> allocate ->
// grid -> pack -> launch); here the launch hands the code object, the kernel's symbol, grid, block, dynamic LDS, the
// kernarg bytes and the memory the launch may touch (the tensors' extents, driver.h Region) to the Python function
// registered with set_emulator (flyship.loader.emulated_device.launch, which runs flyship.loader.emulate). Its
// exception becomes the launch's failed Status, so an instruction the emulator refuses or an access outside the
// call's tensors surfaces as the op's error, never a crash. The device is described as for the recording driver
// (set_emulated_device: target ID and limits; gfx942 by default).
#include <pybind11/pybind11.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "driver.h"
#include "driver_host.h"

namespace flyship::driver {
namespace {

namespace py = pybind11;

struct EmulatedModule {
  int device;
  const void* image;  // the core keeps it valid and unchanged while the module lives (driver.h module_load)
  size_t size;
};

struct EmulatedFunction {
  const EmulatedModule* module;
  std::string symbol;
};

struct Emulator {
  std::mutex mu;
  host::Devices devices{"flyship emulated device"};
  std::vector<std::unique_ptr<EmulatedFunction>> functions;  // live as long as the process, like real ones
  PyObject* run = nullptr;  // the registered Python function (a strong reference, never released)
};

Emulator& emulator() {
  static Emulator* e = new Emulator();  // never destroyed: modules outlive static destruction
  return *e;
}

}  // namespace

const char* flavor() { return "emulate"; }

std::string runtime_version() { return "flyship emulated device (CDNA emulator on the CPU, no GPU runtime)"; }

bool host_tensors() { return true; }

Status device_info(int device, DeviceInfo* out) {
  *out = emulator().devices.get(device);
  return {};
}

Status module_load(int device, const void* image, size_t size, void** module) {
  const std::string refused = host::image_refusal(image, size);
  if (!refused.empty()) return {1, "emulate module_load: " + refused};
  *module = new EmulatedModule{device, image, size};
  return {};
}

Status module_function(int, void* module, const std::string& symbol, void** function) {
  Emulator& e = emulator();
  std::lock_guard<std::mutex> lock(e.mu);
  e.functions.push_back(std::make_unique<EmulatedFunction>(EmulatedFunction{static_cast<EmulatedModule*>(module), symbol}));
  *function = e.functions.back().get();
  return {};
}

void module_unload(int, void* module) { delete static_cast<EmulatedModule*>(module); }

Status allow_dynamic_shared(int, void*, int64_t) { return {}; }

Status launch(int device, void* function, const uint32_t grid[3], const uint32_t block[3], uint32_t dynamic_shared,
              void*, void* args, size_t args_size, const Regions& regions) {
  const auto* f = static_cast<const EmulatedFunction*>(function);
  const std::string target = emulator().devices.get(device).target;
  py::gil_scoped_acquire gil;  // the op may run with the GIL released (torch's dispatcher)
  PyObject* run = emulator().run;
  if (run == nullptr) {
    return {1, "emulate launch: expected an emulator registered with set_emulator, got none; load bundles with "
               "flyship.load (it registers flyship.loader.emulated_device.launch)"};
  }
  try {
    py::list memory;
    for (const Region& r : regions) memory.append(py::make_tuple(r.address, r.nbytes, r.writable, r.name));
    py::object fn = py::reinterpret_borrow<py::object>(run);
    fn(py::arg("image") = py::bytes(static_cast<const char*>(f->module->image), f->module->size),
       py::arg("symbol") = f->symbol, py::arg("grid") = py::make_tuple(grid[0], grid[1], grid[2]),
       py::arg("block") = py::make_tuple(block[0], block[1], block[2]), py::arg("dynamic_lds") = dynamic_shared,
       py::arg("kernargs") = py::bytes(static_cast<const char*>(args), args_size), py::arg("regions") = memory,
       py::arg("device") = device, py::arg("target") = target);
  } catch (py::error_already_set& e) {
    return {1, std::string("emulated launch: ") + e.what()};
  } catch (const std::exception& e) {
    return {1, std::string("emulated launch: ") + e.what()};
  }
  return {};
}

void add_python_bindings(void* module) {
  py::module_ m = py::reinterpret_borrow<py::module_>(py::handle(static_cast<PyObject*>(module)));
  m.def(
      "set_emulator",
      [](py::object run) {
        Emulator& e = emulator();
        std::lock_guard<std::mutex> lock(e.mu);
        PyObject* old = e.run;
        e.run = run.release().ptr();
        Py_XDECREF(old);
      },
      py::arg("run"),
      "Register the function each launch calls: run(image=, symbol=, grid=, block=, dynamic_lds=, kernargs=, "
      "regions=, device=, target=); regions lists (address, nbytes, writable, argument) per tensor, workspace and "
      "scratch buffer the launch may touch. An exception it raises fails the launch with its message.");
  m.def("has_emulator", [] { return emulator().run != nullptr; }, "Whether set_emulator registered a function.");
  host::bind_describe_device(m, "set_emulated_device", emulator().devices);
}

}  // namespace flyship::driver
