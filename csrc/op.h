// An op of a loaded bundle (OpState) and the parts that own each step of a call over its plan: Binder (bind.cpp,
// batch.cpp), Decider (decide.cpp), Packer (kernargs.cpp, launches.cpp), Launcher (launch.cpp, launches.cpp) and
// Fallback (python_calls.cpp, for what takes the GIL).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/stack.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "call.h"
#include "device.h"
#include "plan.h"
#include "pyref.h"

namespace flyship {

class BundleCore;

// Raise a refusal of the core (a c10::Error from FLYSHIP_CHECK, while it is being handled) as the flyship
// exception it is in Python (flyship.errors.CallError / CallTypeError; torch's HANDLE_TH_ERRORS and pybind11
// restore it); any other c10 error is rethrown as it is. Takes the GIL.
[[noreturn]] void raise_as_flyship(const c10::Error& e);

// Set (on this thread) when the driver refused a launch the core made (Launcher::enqueue): the error being raised
// is the launch's own, and running the call again would launch again. fast_attempt clears and reads it.
bool& launch_refused_here();

// The driver's device index of a tensor's device (CPU tensors, for the recording driver: 0).
int device_index(const c10::Device& d);

// The op's plan as the parts of an op read it (each part is owned by the op's OpState, which owns the plan),
// and the label every message of the op starts with.
class OpPart {
 public:
  explicit OpPart(const OpPlan& plan) : plan_(plan) {}
  std::string label() const { return "flyship " + plan_.qualname; }

 protected:
  const OpPlan& plan_;
};

// Binding (bind.cpp, batch.cpp): a call's arguments into a Call, checked; the output rules, the outputs'
// allocation and the memory-overlap checks. Holds no state of its own beyond the plan: every call is its own.
class Binder : public OpPart {
 public:
  using OpPart::OpPart;
  // bind + prepare_bound.
  void prepare(Call& c, c10::ArrayRef<c10::IValue> args, bool is_out, bool check_device) const;
  // After binding: output rules + out-tensor checks (+ early allocation when a guard reads an output).
  void prepare_bound(Call& c, bool is_out) const;
  // Bind `args` (inputs, then out tensors when is_out) into `c`, checking kinds, then check_tensors.
  void bind(Call& c, c10::ArrayRef<c10::IValue> args, bool is_out, bool check_device) const;
  // The checks of a bound call's tensors (slots 0..n-1, already in c.t): defined, of the manifest rank and,
  // when `check_device`, on the device type the driver launches on; any call refuses tensors on two devices,
  // or real tensors mixed with meta ones. Sets c.device. Shared by bind() and the fast entry (fast_call.cpp).
  void check_tensors(Call& c, size_t n, bool check_device) const;
  // The batch step (batch.cpp): check that the batched inputs share their leading dims and, when they carry dims
  // beyond the kernel's rank, point c.t at their flattened (M, ...) views (copies, with c.batch_reason, when no
  // view exists); out tensors of batched outputs too (is_out).
  void flatten_batch(Call& c, bool is_out) const;
  // Output j's shape as the caller sees it: the rule's shape, with the leading dims back for a batched output.
  c10::SmallVector<int64_t, 6> user_shape(const Call& c, size_t j) const;
  // The device type the driver launches on: a GPU's (cuda), or the CPU for the recording driver.
  void check_device_type(const at::Tensor& x, const std::string& name) const;
  // Output shapes and dtypes from the plan's rules.
  void output_rules(Call& c) const;
  // Allocate the outputs (functional form) on the call's device.
  void allocate_outputs(Call& c) const;
  // out= tensors of outputs the kernel accumulates into (manifest `zero`) start from zeros.
  void zero_out_tensors(Call& c) const;
  void check_no_overlap(const Call& c) const;
  // A tensor the kernel writes has no two elements at one address (else raises, naming it).
  void check_no_self_overlap(const at::Tensor& t, const char* what, const std::string& name) const;
  // Inputs written in place share no memory with other inputs (else raises, naming both).
  void check_mutable_not_shared(const Call& c) const;
  // Fresh memory of `shape` and `dtype` on `device` from torch's allocator (zero-filled when `zero`) for `kind`
  // `name` (output 'y', workspace 'acc', scratch of kernel ...; only a failure builds the words). torch's
  // OutOfMemoryError leaves as itself (callers catch it); any other allocator failure is raised naming them,
  // the shape, dtype and bytes.
  at::Tensor allocate(c10::IntArrayRef shape, at::ScalarType dtype, c10::Device device, bool zero, const char* kind,
                      const std::string& name) const;
};

// Packing (kernargs.cpp, launches.cpp): what a variant's launch is for a call (grid, LDS, scratch, workspaces,
// every value against its type, all overflow-checked) and its kernarg bytes.
class Packer : public OpPart {
 public:
  Packer(const OpPlan& plan, const Binder& binder) : OpPart(plan), binder_(binder) {}
  // The grid, dynamic LDS and scratch of variant `v` for call `c`, and every value field against its type,
  // all overflow-checked; a zero grid passes only when every output holds no elements. False with *why.
  bool check_launch(const VariantPlan& v, const Call& c, LaunchShape* ls, std::string* why) const;
  // A multi-launch variant (launches.cpp): every workspace's size and every following launch's grid, LDS and
  // values for call `c`, checked before anything is allocated or launched; `first` is the first launch's shape
  // (a workspace of no elements passes only when no launch runs). False with *why.
  bool check_following(const VariantPlan& v, const Call& c, const LaunchShape& first, std::string* why) const;
  // The bytes of workspace `w` for call `c` (each size >= 0, the product within int64), and its shape when
  // `shape` is not null; false with *why.
  bool workspace_bytes(const WorkspacePlan& w, const Call& c, int64_t* bytes, std::string* why,
                       c10::SmallVector<int64_t, 6>* shape = nullptr) const;
  // Pack the kernarg buffer of variant `v` for call `c` into `buf` (v.kernarg_size bytes).
  void pack_kernargs(const VariantPlan& v, const Call& c, int64_t programs, uint8_t* buf,
                     c10::SmallVector<at::Tensor, 2>* scratch) const;
  // Evaluate program `p` of variant `v` (grid, dynamic LDS, expr fields).
  int64_t eval(const VariantPlan& v, const Program& p, const Call& c, const char* what) const;

 private:
  const Binder& binder_;  // allocates scratch
};

// Deciding (decide.cpp): the first specialization whose guard holds and that has code for the device's target.
class Decider : public OpPart {
 public:
  Decider(const OpPlan& plan, int index, const Packer& packer) : OpPart(plan), index_(index), packer_(packer) {}
  // The first specialization whose guard holds and that has code for `sel`'s target.
  Decision decide(const Call& c, const Selection& sel, bool is_out) const;
  // Whether specialization `s` fits: code for the target, its guard, and a launch its variant can take
  // (check_launch); fills *why when it does not (why may be null) and *ls when it does (ls may be null).
  bool fits(const Call& c, int s, const Selection& sel, bool is_out, std::string* why, LaunchShape* ls) const;

 private:
  int index_;  // the op's row in a Selection
  const Packer& packer_;
};

// Launching (launch.cpp, launches.cpp): a prepared call onto its device, and the launch counters.
class Launcher : public OpPart {
 public:
  Launcher(const OpPlan& plan, int index, BundleCore* bundle, const Binder& binder, const Decider& decider,
           const Packer& packer)
      : OpPart(plan), index_(index), bundle_(bundle), binder_(binder), decider_(decider), packer_(packer),
        launches_(new std::atomic<uint64_t>[plan.spec_variants.size() ? plan.spec_variants.size() : 1]) {
    reset();
  }
  // A prepared call on its device: decide (or take `forced_spec` >= 0, raising when it does not fit), then
  // allocate and launch. False, with d->reason, when no specialization fits: nothing was launched or
  // counted, and the caller falls back (run) or hands the call to the dispatcher (the fast entry).
  bool try_launch(Call& c, bool is_out, int forced_spec, Decision* d);
  // Launches of specialization s; calls whose outputs held no elements (nothing launched).
  uint64_t launches(size_t s) const { return launches_[s].load(); }
  uint64_t empty() const { return empty_.load(); }
  void reset() {
    for (size_t s = 0; s < plan_.spec_variants.size(); ++s) launches_[s].store(0);
    empty_.store(0);
  }

 private:
  void launch(Call& c, DeviceState& ds, const Decision& d);
  // Launch variant `v` and every following launch in order on one stream (launches.cpp): every kernel loaded
  // and checked against the device, and the workspaces allocated, before the first launch.
  void launch_all(Call& c, DeviceState& ds, const VariantPlan& v, const LaunchShape& first);
  // The kernel of one launch, loaded and checked against the device's LDS limit for `ls`.
  LoadedKernel& ready(DeviceState& ds, const VariantPlan& v, const LaunchShape& ls);
  // Pack and enqueue one launch on torch's current stream.
  void enqueue(Call& c, DeviceState& ds, const VariantPlan& v, LoadedKernel& k, const LaunchShape& ls);

  int index_;
  BundleCore* bundle_;
  const Binder& binder_;
  const Decider& decider_;
  const Packer& packer_;
  std::unique_ptr<std::atomic<uint64_t>[]> launches_;  // per specialization
  std::atomic<uint64_t> empty_{0};
};

// The fallback (python_calls.cpp): the op's PyTorch reference, run when no specialization fits, its checks and
// messages, and the fallback counters by reason.
class Fallback : public OpPart {
 public:
  Fallback(const OpPlan& plan, int index, BundleCore* bundle, const Binder& binder, py::object reference)
      : OpPart(plan), index_(index), bundle_(bundle), binder_(binder), reference_(std::move(reference)) {}
  // No specialization fits: run the reference (or raise when the fallback is off), counting the reason. With
  // `on_purpose` (Decision::on_purpose) the reference runs as a decision: no warning, even with the fallback off,
  // counted apart (stats()["original"]).
  void run(Call& c, const std::string& reason, bool is_out, bool on_purpose = false);
  std::vector<at::Tensor> call_reference(const Call& c) const;
  // The message for a reference that failed on call `c` (what it did: `failure`; what to do when the inputs are
  // not the cause: `fix`): the input that does not fit the others, or input dtypes no specialization admits (when
  // `about_dtypes`), named first. Worded by Python (BundleCore::blame), as on the CPU path; takes the GIL.
  std::string blame(const Call& c, const std::string& failure, const char* fix, bool about_dtypes) const;
  // Counts a fallback; true the first time this reason is seen (the caller then warns once).
  bool count(const std::string& reason) {
    std::lock_guard<std::mutex> lock(mu_);
    return ++counts_[reason] == 1;
  }
  std::map<std::string, uint64_t> counts() const {
    std::lock_guard<std::mutex> lock(mu_);
    return counts_;
  }
  void reset() {
    std::lock_guard<std::mutex> lock(mu_);
    counts_.clear();
    on_purpose_.store(0, std::memory_order_relaxed);
  }
  uint64_t on_purpose() const { return on_purpose_.load(std::memory_order_relaxed); }

 private:
  int index_;
  BundleCore* bundle_;
  const Binder& binder_;
  PyRef reference_;
  mutable std::mutex mu_;
  std::map<std::string, uint64_t> counts_;
  std::atomic<uint64_t> on_purpose_{0};
};

// An op of a loaded bundle: it owns the plan (its specializations read on first use) and composes the parts
// that run a call over it: bind -> decide -> pack + launch, or fall back.
class OpState {
 public:
  OpState(BundleCore* bundle, int index, OpPlan plan, py::object reference)
      : bundle_(bundle), index_(index), plan_(std::move(plan)), binder_(plan_), packer_(plan_, binder_),
        decider_(plan_, index, packer_), launcher_(plan_, index, bundle, binder_, decider_, packer_),
        fallback_(plan_, index, bundle, binder_, std::move(reference)) {}

  // The op's plan; its specs (and guard_uses_outputs) only after ensure_specs().
  const OpPlan& plan() const { return plan_; }
  // Read the op's specializations on first use: asks Python (the bundle's `specs` callable, which reads,
  // checks and lowers them, or takes them from the plan cache) without holding a lock, then publishes them
  // once. Every entry point that reads specs calls it first; afterwards it is one acquire load.
  void ensure_specs();
  int index() const { return index_; }
  std::string label() const { return binder_.label(); }

  // The boxed kernel: the last arguments on `stack` are the op's inputs (and out tensors for .out).
  // `forced_spec` >= 0 runs that specialization or raises (verification).
  void run(torch::jit::Stack* stack, bool is_out, int forced_spec);

  const Binder& binder() const { return binder_; }
  const Decider& decider() const { return decider_; }
  Launcher& launcher() { return launcher_; }

  py::dict stats() const;
  void reset_stats();

 private:
  BundleCore* bundle_;
  int index_;
  OpPlan plan_;
  std::atomic<bool> specs_ready_{false};
  std::mutex specs_mu_;
  Binder binder_;
  Packer packer_;
  Decider decider_;
  Launcher launcher_;
  Fallback fallback_;
};

}  // namespace flyship
