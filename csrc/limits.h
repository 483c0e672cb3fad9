// GENERATED from bundle/limits.py by `python scripts/limits_header.py --write`: do not edit.
// The limits the rule book and the C++ core share; a test keeps this file equal to the generator's output
// and compares the compiled values (the extension's LIMITS) with flyship.bundle.limits.
#pragma once

#include <cstdint>

namespace flyship {

constexpr int64_t kPlanVersion = 10;  // PLAN_VERSION
constexpr int64_t kMaxSlots = 64;  // MAX_SLOTS
constexpr int64_t kMaxLaunches = 16;  // MAX_LAUNCHES
constexpr int64_t kMaxWorkspaces = 16;  // MAX_WORKSPACES
constexpr int64_t kMaxKernargBytes = 65536;  // MAX_KERNARG_BYTES
constexpr int64_t kKernargBufferAlignment = 64;  // KERNARG_BUFFER_ALIGNMENT
constexpr int64_t kMaxBlock = 1024;  // MAX_BLOCK
constexpr int64_t kMaxRank = 16;  // MAX_RANK
constexpr int64_t kMaxProgramWords = 256;  // MAX_PROGRAM_WORDS
constexpr int64_t kMaxProgramDepth = 32;  // MAX_PROGRAM_DEPTH
constexpr int64_t kMaxDevices = 64;  // MAX_DEVICES
constexpr int64_t kOnPurpose = -2;  // VARIANT_ON_PURPOSE

}  // namespace flyship

// Every constant above, for code that lists them all (the extension's LIMITS): X(name) each.
#define FLYSHIP_SHARED_LIMITS(X) \
  X(kPlanVersion) \
  X(kMaxSlots) \
  X(kMaxLaunches) \
  X(kMaxWorkspaces) \
  X(kMaxKernargBytes) \
  X(kKernargBufferAlignment) \
  X(kMaxBlock) \
  X(kMaxRank) \
  X(kMaxProgramWords) \
  X(kMaxProgramDepth) \
  X(kMaxDevices) \
  X(kOnPurpose)
