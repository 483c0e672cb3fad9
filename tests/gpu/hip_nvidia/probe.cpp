// TEST-ONLY: drives csrc/driver_hip.cpp, compiled for HIP's NVIDIA platform, against recording_driver.cpp and
// prints what the shim returned and what the driver received, as JSON (tests/loader/test_hip_nvidia.py).
//   probe           every call in turn: flavor, version, device info, module load/function, launches, errors
//   probe device    only device_info(0) (run with FAKE_CUDA_* knobs to see refusals)
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "driver.h"
#include "recording_driver.h"

namespace d = flyship::driver;

namespace {

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string status(const d::Status& s) {
  return "{\"code\": " + std::to_string(s.code) + ", \"message\": " + quoted(s.message) + "}";
}

std::string device(int index) {
  d::DeviceInfo info;
  d::Status s = d::device_info(index, &info);
  return "{\"status\": " + status(s) + ", \"target\": " + quoted(info.target) + ", \"name\": " + quoted(info.name) +
         ", \"max_shared_per_block\": " + std::to_string(info.max_shared_per_block) +
         ", \"max_threads_per_block\": " + std::to_string(info.max_threads_per_block) +
         ", \"cu_count\": " + std::to_string(info.cu_count) + "}";
}

std::string launch_record() {
  const recording::Launch& l = recording::last_launch;
  std::string bytes = "[";
  for (size_t i = 0; i < l.bytes.size(); ++i) bytes += (i ? ", " : "") + std::to_string(l.bytes[i]);
  bytes += "]";
  char stream[32];
  std::snprintf(stream, sizeof(stream), "%p", static_cast<void*>(l.stream));
  return "{\"grid\": [" + std::to_string(l.grid[0]) + ", " + std::to_string(l.grid[1]) + ", " +
         std::to_string(l.grid[2]) + "], \"block\": [" + std::to_string(l.block[0]) + ", " +
         std::to_string(l.block[1]) + ", " + std::to_string(l.block[2]) + "], \"shared\": " +
         std::to_string(l.shared) + ", \"stream\": " + quoted(stream) + ", \"params_null\": " +
         (l.params ? "false" : "true") + ", \"extra_null\": " + (l.extra_null ? "true" : "false") +
         ", \"size\": " + std::to_string(l.size) + ", \"bytes\": " + bytes +
         ", \"max_dynamic_shared_attribute\": " + std::to_string(recording::func_max_dynamic_shared) + "}";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "device") == 0) {
    std::printf("{\"device\": %s}\n", device(0).c_str());
    return 0;
  }
  std::string out = "{\"flavor\": " + quoted(d::flavor()) + ", \"runtime_version\": " + quoted(d::runtime_version());
  out += ", \"device\": " + device(0) + ", \"missing_device\": " + device(3);

  static const char elf[] = "\x7f" "ELF rest of a cubin";
  void* module = nullptr;
  void* function = nullptr;
  // From a fresh thread, as torch's worker threads call: no context is current there.
  d::Status loaded;
  std::thread([&] { loaded = d::module_load(0, elf, sizeof(elf), &module); }).join();
  out += ", \"load\": " + status(loaded);
  out += ", \"load_garbage\": " + status(d::module_load(0, "not a code object", 17, &module));
  out += ", \"function_missing\": " + status(d::module_function(0, module, "no_such_kernel", &function));
  out += ", \"function\": " + status(d::module_function(0, module, "kernel", &function));

  unsigned char args[20];
  for (int i = 0; i < 20; ++i) args[i] = static_cast<unsigned char>(i * 7 + 1);
  const uint32_t grid[3] = {70000, 3, 2}, block[3] = {256, 1, 1};
  void* stream = reinterpret_cast<void*>(0x5eed);
  d::Status s;
  std::thread([&] { s = d::launch(0, function, grid, block, 65536, stream, args, sizeof(args), {}); }).join();
  out += ", \"launch\": " + status(s) + ", \"launched\": " + launch_record();
  s = d::launch(0, function, grid, block, 50000, stream, args, sizeof(args), {});  // below the high-water mark
  out += ", \"launch_smaller\": " + status(s) + ", \"attribute_calls\": " +
         std::to_string(recording::func_attribute_calls);
  s = d::launch(0, function, grid, block, 0, nullptr, nullptr, 0, {});
  out += ", \"launch_no_args\": " + status(s) + ", \"launched_no_args\": " + launch_record();
  d::module_unload(0, module);
  out += ", \"primary_retains\": " + std::to_string(recording::primary_retains) + "}";
  std::printf("%s\n", out.c_str());
  return 0;
}
