// Per-target variant choice and per-device state of a loaded bundle.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "check.h"
#include "driver.h"
#include "limits.h"

namespace flyship {

// A device index the core keeps state for: 0..kMaxDevices - 1 (limits.h, from bundle/limits.py MAX_DEVICES; the
// loader's flyship.loader.selection.device_index refuses the same in Python).
inline void check_device_index(int64_t index) {
  FLYSHIP_CHECK_VALUE(index >= 0 && index < kMaxDevices, "flyship: device index ", index, " out of range (0..",
                      kMaxDevices - 1, ")");
}

// kOnPurpose (limits.h, from bundle/limits.py VARIANT_ON_PURPOSE): a selection's variant index for a specialization
// that runs the op's reference on purpose (a tuned bucket the original wins): when its guard holds, the call runs the
// reference as a decision, not a failure (no fallback warning, run even with the fallback off, counted apart).

struct Selection {
  std::string target;
  std::vector<std::vector<int>> variant;  // [op][spec] -> variant index, -1 (none runs) or kOnPurpose
  std::vector<std::vector<std::string>> reason;  // [op][spec] -> why none (when -1)
};

struct LoadedKernel {
  void* function = nullptr;
  std::atomic<int64_t> dynamic_shared_allowed{48 * 1024};
};

struct DeviceState {
  DeviceState(int index, driver::DeviceInfo i, const Selection* s, size_t n_variants)
      : device(index), info(std::move(i)), selection(s), kernels(new std::atomic<LoadedKernel*>[n_variants]) {
    for (size_t k = 0; k < n_variants; ++k) kernels[k].store(nullptr, std::memory_order_relaxed);
  }
  int device;
  driver::DeviceInfo info;
  const Selection* selection;
  std::unique_ptr<std::atomic<LoadedKernel*>[]> kernels;  // by variant id, published once loaded
  std::mutex mu;
  std::vector<std::unique_ptr<LoadedKernel>> owned;
};

}  // namespace flyship
