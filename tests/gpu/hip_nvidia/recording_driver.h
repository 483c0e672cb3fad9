// TEST-ONLY: what recording_driver.cpp saw (see there).
#pragma once

#include <cuda.h>

#include <cstddef>
#include <vector>

namespace recording {

struct Launch {
  CUfunction function = nullptr;
  unsigned grid[3] = {0, 0, 0};
  unsigned block[3] = {0, 0, 0};
  unsigned shared = 0;
  CUstream stream = nullptr;
  void** params = nullptr;
  bool extra_null = true;
  size_t size = 0;  // the size_t the extra array pointed to
  std::vector<unsigned char> bytes;  // the kernarg buffer, `size` bytes
};

extern Launch last_launch;
extern int func_max_dynamic_shared;  // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES last set, or -1
extern int func_attribute_calls;  // how many times it was set
extern int primary_retains;

}  // namespace recording
