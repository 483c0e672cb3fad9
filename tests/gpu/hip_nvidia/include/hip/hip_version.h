// TEST-ONLY (see hip_runtime_api.h here): the "HIP version" of the HIP-on-NVIDIA mapping is the CUDA headers'
// version, so driver_hip.cpp's major-version check compares the CUDA driver (hipRuntimeGetVersion) with the
// CUDA headers the extension was compiled against.
#pragma once

#include <cuda.h>

#define HIP_VERSION_MAJOR (CUDA_VERSION / 1000)
#define HIP_VERSION_MINOR (CUDA_VERSION % 1000 / 10)
#define HIP_VERSION_PATCH 0
