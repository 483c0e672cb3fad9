// Registration of a bundle's ops with the dispatcher.
#pragma once

#include <torch/library.h>

#include <memory>
#include <vector>

#include "bundle.h"

namespace flyship {

// The Python handle of a loaded bundle: the core plus the dispatcher registrations it made.
struct Bundle {
  std::shared_ptr<BundleCore> core;
  std::vector<std::unique_ptr<torch::Library>> libraries;
};

// Register every op's boxed kernels (functional and .out) and its autograd kernels; once per bundle.
void register_kernels(Bundle& b);

}  // namespace flyship
