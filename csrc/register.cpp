// Registration with the dispatcher: the boxed kernels, autograd for the .out variant, version bumps.
#include "register.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/VariableTypeUtils.h>
#include <torch/csrc/autograd/edge.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/variable.h>

#include <memory>
#include <type_traits>

#include "check.h"
#include "driver.h"

namespace flyship {

class OpKernel final : public c10::OperatorKernel {
 public:
  OpKernel(std::shared_ptr<BundleCore> bundle, int op, bool is_out)
      : bundle_(std::move(bundle)), op_(op), is_out_(is_out) {}
  void operator()(const c10::OperatorHandle&, c10::DispatchKeySet, torch::jit::Stack* stack) {
    try {
      bundle_->op(op_).run(stack, is_out_, -1);
    } catch (const c10::Error& e) {
      raise_as_flyship(e);
    }
  }

 private:
  std::shared_ptr<BundleCore> bundle_;
  int op_;
  bool is_out_;
};

// torch's autograd graph holds nodes by std::shared_ptr before torch 2.12 and by c10::intrusive_ptr from 2.12
// on; the pointer type of an Edge says which, so one source compiles against both (no version macros).
using NodePtr = decltype(torch::autograd::Edge::function);

template <class Ptr>
struct NodeMaker;
template <class T>
struct NodeMaker<std::shared_ptr<T>> {
  template <class N, class... A>
  static std::shared_ptr<T> make(A&&... a) { return std::make_shared<N>(std::forward<A>(a)...); }
};
template <class T>
struct NodeMaker<c10::intrusive_ptr<T>> {
  template <class N, class... A>
  static c10::intrusive_ptr<T> make(A&&... a) { return c10::make_intrusive<N>(std::forward<A>(a)...); }
};

// Autograd for the functional op of an op without a backward, in place of torch's boxed
// autogradNotImplementedFallback (which walks the schema and redispatches boxed on every call, grad or not):
// with grad mode off or no input that requires grad, straight on below autograd; otherwise the outputs get
// torch's NotImplemented node, so backward() raises torch's own "derivative for <ns>::<op> is not implemented"
// (never a silent missing gradient). Forward AD is refused as torch's fallback refuses it. Ops with a backward
// (flyship.loader.autograd) register per-backend autograd kernels, which take precedence over this one.
class FunctionalAutogradKernel final : public c10::OperatorKernel {
 public:
  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
    const auto& schema = op.schema();
    const size_t n_args = schema.arguments().size();
    const bool grad_mode = at::GradMode::is_enabled();
    torch::autograd::edge_list edges;
    bool any_requires_grad = false;
    for (const c10::IValue& v : torch::jit::last(*stack, n_args)) {
      if (!v.isTensor()) continue;
      const at::Tensor& t = v.toTensor();
      if (!t.defined()) continue;
      TORCH_CHECK_NOT_IMPLEMENTED(!t._fw_grad(/*level=*/0).defined(), "Trying to use forward AD with ",
                                  schema.operator_name().name, " that does not support it.");
      if (grad_mode && t.requires_grad()) {
        any_requires_grad = true;
        edges.push_back(torch::autograd::impl::gradient_edge(t));
      }
    }
    if (!any_requires_grad) {
      at::AutoDispatchBelowADInplaceOrView guard;
      op.redispatchBoxed(ks & c10::after_ADInplaceOrView_keyset, stack);
      return;
    }
    NodePtr grad_fn = NodeMaker<NodePtr>::make<torch::autograd::NotImplemented>(schema.operator_name().name);
    grad_fn->set_next_edges(std::move(edges));
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      op.redispatchBoxed(ks & c10::after_ADInplaceOrView_keyset, stack);
    }
    const size_t n_ret = schema.returns().size();
    for (const c10::IValue& v : torch::jit::last(*stack, n_ret)) {
      if (!v.isTensor()) continue;
      const at::Tensor& t = v.toTensor();
      if (!t.defined()) {
        grad_fn->add_input_metadata(torch::autograd::Node::undefined_input());
      } else if (torch::autograd::isDifferentiableType(t.scalar_type())) {
        const uint32_t nr = grad_fn->add_input_metadata(t);
        torch::autograd::impl::set_gradient_edge(t, {grad_fn, nr});
      }
    }
  }
};

// Autograd for the .out variant: aten's rule for out= functions (no automatic differentiation through
// them), then straight on below ADInplaceOrView, bumping the written tensors' versions here (what
// OutVersionKernel does when ADInplaceOrView is reached without autograd): one boxed hop fewer per call on the
// torch.ops path.
class OutAutogradKernel final : public c10::OperatorKernel {
 public:
  OutAutogradKernel(std::string qualname, std::vector<size_t> written)
      : qualname_(std::move(qualname)), written_(std::move(written)) {}
  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
    const auto& schema_args = op.schema().arguments();
    if (at::GradMode::is_enabled()) {
      auto args = torch::jit::last(*stack, schema_args.size());
      for (size_t k = 0; k < args.size(); ++k) {
        FLYSHIP_CHECK(!(args[k].isTensor() && args[k].toTensor().requires_grad()), "flyship ", qualname_,
                    ".out: functions with out=... arguments don't support automatic differentiation, but argument '",
                    schema_args[k].name(), "' requires grad; call it under torch.no_grad() or torch.inference_mode()");
      }
    }
    c10::SmallVector<at::Tensor, 4> outs;
    {
      auto args = torch::jit::last(*stack, schema_args.size());
      for (size_t k : written_) outs.push_back(args[k].toTensor());
    }
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      op.redispatchBoxed(ks & c10::after_ADInplaceOrView_keyset, stack);
    }
    for (const auto& t : outs) torch::autograd::impl::bump_version(t);
  }

 private:
  std::string qualname_;
  std::vector<size_t> written_;
};

// Autograd for an op that writes inputs in place and has no derivative: torch's rule for in-place ops. A leaf
// that requires grad (or a view of one) cannot be written (torch's own check_inplace); the written tensors'
// versions are bumped, so a backward that saved their old value is refused; and when any input requires grad,
// the written tensors and the fresh outputs get a NotImplemented history, so a backward through the op raises
// "derivative for <op> is not implemented" instead of silently using the old history of a rewritten tensor.
// (torch's autogradNotImplementedFallback does neither the version bump nor the rebase for mutated inputs.)
class MutableAutogradKernel final : public c10::OperatorKernel {
 public:
  MutableAutogradKernel(std::string qualname, size_t n_inputs, std::vector<size_t> written)
      : qualname_(std::move(qualname)), n_inputs_(n_inputs), written_(std::move(written)) {}
  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
    auto args = torch::jit::last(*stack, n_inputs_);
    std::vector<at::Tensor> inputs, written;
    for (const auto& v : args)
      if (v.isTensor()) inputs.push_back(v.toTensor());
    for (size_t k : written_) written.push_back(args[k].toTensor());
    bool requires_grad = false;
    if (at::GradMode::is_enabled()) {
      for (const auto& t : inputs) requires_grad |= t.defined() && t.requires_grad();
    }
    for (const auto& t : written) torch::autograd::check_inplace(t, requires_grad);
    NodePtr node;
    if (requires_grad) {
      node = NodeMaker<NodePtr>::make<torch::autograd::NotImplemented>(
          qualname_, torch::autograd::collect_next_edges(at::ArrayRef<at::Tensor>(inputs)));
    }
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      op.redispatchBoxed(ks & c10::after_ADInplaceOrView_keyset, stack);
    }
    for (const auto& t : written) torch::autograd::impl::bump_version(t);
    if (node) {
      torch::autograd::rebase_history(written, node);
      const size_t n_out = op.schema().returns().size();
      for (const auto& r : torch::jit::last(*stack, n_out)) {
        const at::Tensor& t = r.toTensor();
        if (torch::autograd::isDifferentiableType(t.scalar_type())) torch::autograd::set_history(t, node);
      }
    }
  }

 private:
  std::string qualname_;
  size_t n_inputs_;
  std::vector<size_t> written_;
};

// ADInplaceOrView for the .out variant: bump the versions of the tensors it writes (the out tensors and any
// input written in place), as torch does for every in-place write, so autograd notices if a tensor it saved was
// overwritten.
class OutVersionKernel final : public c10::OperatorKernel {
 public:
  // `written`: positions, among the variant's `n_args` arguments, of the tensors the kernel writes.
  OutVersionKernel(size_t n_args, std::vector<size_t> written) : n_args_(n_args), written_(std::move(written)) {}
  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
    c10::SmallVector<at::Tensor, 4> outs;
    auto args = torch::jit::last(*stack, n_args_);
    for (size_t k : written_) outs.push_back(args[k].toTensor());
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      op.redispatchBoxed(ks & c10::after_ADInplaceOrView_keyset, stack);
    }
    for (const auto& t : outs) torch::autograd::impl::bump_version(t);
  }

 private:
  size_t n_args_;
  std::vector<size_t> written_;
};


// Conjugate and Negative (the math bits of a view such as z.conj() or z.conj().imag): torch's boxed math-bits
// fallback (ATen/native/MathBitsFallback.h) would otherwise run first. It materializes the inputs, but for an
// argument the op writes it clones, runs the op on the clone and reads the op's return as the written tensor: our
// out variant returns () and an op with an input written in place returns its outputs, so torch's fallback
// asserts (or reads past the stack and the process aborts). Here, per op: an argument the op writes (an out tensor,
// an input written in place) with a math bit is refused, naming it (the kernel writes memory, the bit would have
// to be applied to every write); a read-only one is materialized (resolve_conj / resolve_neg, as torch's fallback
// does), and the call goes on below both keys. One kernel serves both keys: the Negative one runs first and
// clears both bits.
class MathBitsKernel final : public c10::OperatorKernel {
 public:
  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
    const auto& schema = op.schema();
    const auto& args = schema.arguments();
    const size_t first = stack->size() - args.size();
    try {
      for (size_t k = 0; k < args.size(); ++k) {
        c10::IValue& v = (*stack)[first + k];
        if (!v.isTensor()) continue;
        const at::Tensor& t = v.toTensor();
        if (!t.defined() || !(t.is_neg() || t.is_conj())) continue;
        const bool written = args[k].alias_info() != nullptr && args[k].alias_info()->isWrite();
        if (written) {
          const std::string& name = args[k].name();
          const bool neg = t.is_neg();
          FLYSHIP_CHECK_TYPE(false, "flyship ", schema.name(), schema.overload_name().empty() ? "" : ".",
                             schema.overload_name(), ": expected argument '", name,
                             "', which the kernel writes, to be a tensor of its own, got a view with the ",
                             neg ? "negative bit (is_neg(), e.g. z.conj().imag)" : "conjugate bit (is_conj(), "
                             "e.g. z.conj())", ", whose writes torch would have to ", neg ? "negate" : "conjugate",
                             "; pass ", name, neg ? ".resolve_neg()" : ".resolve_conj()", " (or ", name,
                             ".clone()) and copy the result back into the view if you need it there");
        }
        v = t.resolve_conj().resolve_neg();
      }
    } catch (const c10::Error& e) {
      raise_as_flyship(e);
    }
    op.redispatchBoxed(ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::Conjugate), stack);
  }
};

// The .out variant's written arguments: the inputs written in place, then every out tensor.
static std::vector<size_t> written_by_out_variant(const OpPlan& p) {
  std::vector<size_t> w;
  for (size_t k = 0; k < p.slots.size(); ++k) {
    if (p.slots[k].is_mutable || static_cast<int>(k) >= p.n_inputs) w.push_back(k);
  }
  return w;
}

void register_kernels(Bundle& b) {
  FLYSHIP_CHECK(b.libraries.empty(), "flyship: bundle ", b.core->ns(), " is already registered");
  auto make = [&](c10::DispatchKey key) {
    b.libraries.push_back(
        std::make_unique<torch::Library>(torch::Library::IMPL, b.core->ns(), key, __FILE__, __LINE__));
    return b.libraries.back().get();
  };
  // The real kernel for GPU tensors (ROCm torch dispatches HIP tensors under the CUDA key too). CPU
  // tensors run the op's reference: that kernel is Python, registered beside the fake kernel
  // (flyship/loader/cpu.py), so the CPU key is left to it. The recording driver launches on CPU tensors:
  // there the real kernel takes the CPU key (and loader/core.py registers no Python CPU kernel).
  for (c10::DispatchKey key : {driver::host_tensors() ? c10::DispatchKey::CPU : c10::DispatchKey::CUDA}) {
    torch::Library* lib = make(key);
    for (int k = 0; k < b.core->n_ops(); ++k) {
      const OpPlan& p = b.core->op(k).plan();
      lib->impl(p.name.c_str(), torch::CppFunction::makeFromBoxedKernel(
                            c10::BoxedKernel::makeFromFunctor(std::make_unique<OpKernel>(b.core, k, false))));
      if (p.outputs.empty()) continue;  // an op that only writes inputs in place has no .out variant
      lib->impl((p.name + ".out").c_str(), torch::CppFunction::makeFromBoxedKernel(
                                     c10::BoxedKernel::makeFromFunctor(std::make_unique<OpKernel>(b.core, k, true))));
    }
  }
  // No derivatives. The functional op runs with inputs that require grad and its backward raises
  // "derivative for <op> is not implemented" (torch's NotImplemented node, FunctionalAutogradKernel) rather than
  // silently giving no gradient; the out variant refuses such inputs up front, as aten's out= functions do.
  // Views with a math bit, on every backend and both overloads (MathBitsKernel).
  for (c10::DispatchKey key : {c10::DispatchKey::Negative, c10::DispatchKey::Conjugate}) {
    torch::Library* lib = make(key);
    for (int k = 0; k < b.core->n_ops(); ++k) {
      const OpPlan& p = b.core->op(k).plan();
      lib->impl(p.name.c_str(), torch::CppFunction::makeFromBoxedKernel(
                                    c10::BoxedKernel::makeFromFunctor(std::make_unique<MathBitsKernel>())));
      if (p.outputs.empty()) continue;
      lib->impl((p.name + ".out").c_str(), torch::CppFunction::makeFromBoxedKernel(
                                               c10::BoxedKernel::makeFromFunctor(std::make_unique<MathBitsKernel>())));
    }
  }
  torch::Library* autograd = make(c10::DispatchKey::Autograd);
  torch::Library* inplace = make(c10::DispatchKey::ADInplaceOrView);
  for (int k = 0; k < b.core->n_ops(); ++k) {
    const OpPlan& p = b.core->op(k).plan();
    if (p.has_mutable) {  // writes inputs in place (Tensor(a!) in its schema): torch's rule for in-place ops
      std::vector<size_t> written;
      for (int j = 0; j < p.n_inputs; ++j)
        if (p.slots[j].is_mutable) written.push_back(j);
      autograd->impl(p.name.c_str(), torch::CppFunction::makeFromBoxedKernel(c10::BoxedKernel::makeFromFunctor(
                                         std::make_unique<MutableAutogradKernel>(p.qualname, p.n_inputs, written))));
    } else {
      autograd->impl(p.name.c_str(),
                     torch::CppFunction::makeFromBoxedKernel(
                         c10::BoxedKernel::makeFromFunctor(std::make_unique<FunctionalAutogradKernel>())));
    }
    if (p.outputs.empty()) continue;  // an op that only writes inputs in place has no .out variant
    autograd->impl((p.name + ".out").c_str(),
                   torch::CppFunction::makeFromBoxedKernel(
                       c10::BoxedKernel::makeFromFunctor(
                           std::make_unique<OutAutogradKernel>(p.qualname, written_by_out_variant(p)))));
    inplace->impl((p.name + ".out").c_str(),
                  torch::CppFunction::makeFromBoxedKernel(
                      c10::BoxedKernel::makeFromFunctor(std::make_unique<OutVersionKernel>(
                          p.slots.size(), written_by_out_variant(p)))));
  }
}

}  // namespace flyship
