"""Autograd pairs: an op whose manifest names a backward op (:class:`flyship.bundle.manifest.Backward`)
gets a derivative that runs that op.

The C++ core registers torch's not-implemented autograd kernel under the ``Autograd`` alias key for every
op (a backward through an op without a derivative raises "derivative ... is not implemented" instead of
silently giving no gradient). An op with a backward gets torch's own custom-op autograd kernel (the one
``torch.library.register_autograd`` builds) under the per-backend keys ``AutogradCUDA`` (ROCm torch uses
it for HIP tensors too), ``AutogradCPU`` and ``AutogradMeta``. A per-backend kernel takes precedence over
the alias, so nothing is overridden (torch's "overriding a previously registered kernel" warning would
otherwise show), and ``torch.compile`` traces forward and backward as two calls of our ops. Forward-mode AD
(``torch.autograd.forward_ad``) is refused with a CallError (:func:`_reverse_mode_only`): torch's generated kernel
would silently give no tangent.

A backward op may write inputs in place (schema 1.4, :meth:`flyship.bundle.manifest.Backward.consumed`): it
*consumes* a buffer fed from a saved forward tensor or an incoming gradient, and a buffer named in ``grads`` becomes
that gradient. A tensor the user (or another node of the graph) still holds is never overwritten: the buffer is
handed over only when nothing but this backward references its memory (:func:`_private`), else the backward gets a
copy. The check reads the memory's owners, not Python references: the forward saves a private alias of each tensor
the backward consumes (``detach()``, a tensor object of its own that shares the version counter, so autograd's
modified-in-place check still applies), and at backward time the storage must have no tensor but that alias, and
an incoming gradient no owner but the engine's buffer. Under ``torch.compile`` the tensors are traced (fake,
functional), nothing can be proven private, and the backward always gets a copy: the graph then holds
``clone`` + the in-place op, which functionalization records correctly (docs/training.md, "Cost").

A *forward* op may write inputs in place too (schema 5.0, :meth:`flyship.bundle.manifest.Backward.dirty`): such a pair
gets :mod:`flyship.loader.autograd_dirty`'s kernel (the ``ctx.mark_dirty`` contract) instead of torch's generated one,
with the same :class:`_Rule`; the gradients flowing into the written inputs follow the outputs' (``grad_names``).
"""

from __future__ import annotations

from typing import Any

from flyship.bundle import manifest as _m
from flyship.loader import autograd_dirty as _dirty
from flyship.loader import autograd_owners as _owners

# Where the kernel goes: every backend whose tensors reach our ops (CUDA also carries ROCm's HIP tensors;
# CPU runs the reference; Meta is what shape-only tracing uses).
AUTOGRAD_KEYS = ("AutogradCUDA", "AutogradCPU", "AutogradMeta")


class _Rule:
    """The forward's saving and the backward's call for one op, from its :class:`~flyship.bundle.manifest.Backward`."""

    def __init__(self, namespace: str, fwd: _m.Op, bwd: _m.Op, b: _m.Backward) -> None:
        self.namespace = namespace
        self.fwd, self.bwd, self.b = fwd, bwd, b
        self.in_names = [a.name for a in fwd.args]
        self.out_names = [o.name for o in fwd.outputs]
        # What a gradient flows into, in the order the backward receives them: the outputs, then (schema 5.0) the
        # inputs the forward writes in place (flyship.loader.autograd_dirty).
        self.grad_names = self.out_names + list(b.dirty(fwd))
        self.saved = b.saved(fwd)
        self.scalars = sorted({src for src in b.inputs.values() if src in self.in_names
                               and fwd.args[self.in_names.index(src)].kind != "tensor"})
        self.bwd_outs = [o.name for o in bwd.outputs]
        self.consumed = b.consumed(bwd)  # backward input -> its source, for the buffers it overwrites
        self.private_saves = set(self.consumed.values()) & set(self.saved)
        self.consumes_grads = any(src.startswith(_m.GRAD_PREFIX) for src in self.consumed.values())
        # Outputs whose gradient the backward does not read have no derivative: torch treats them as constants
        # (requires_grad False) instead of silently dropping a gradient that flows into them.
        sources = set(b.inputs.values())
        self.constant_outs = [i for i, n in enumerate(self.out_names) if _m.GRAD_PREFIX + n not in sources]
        # A backward op with a backward of its own, writing no buffer in place, is differentiable again through
        # its own autograd pair; any other backward computes first derivatives only (see ``_first_order_only``).
        self.twice = bwd.backward is not None and not self.consumed

    def setup_context(self, ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        outs = output if isinstance(output, (tuple, list)) else (output,)
        values = dict(zip(self.in_names, inputs)) | dict(zip(self.out_names, outs))
        # A tensor the backward may consume is saved as an alias of its own (see the module's doc).
        ctx.save_for_backward(*(values[n].detach() if n in self.private_saves else values[n] for n in self.saved))
        ctx.flyship_scalars = {n: values[n] for n in self.scalars}
        if self.constant_outs:
            ctx.mark_non_differentiable(*(outs[i] for i in self.constant_outs))

    def backward(self, ctx: Any, *grads: Any, held: frozenset[int] | None = None) -> tuple[Any, ...]:
        # First: who else holds each incoming gradient's Python object (flyship.loader.autograd_owners; ``held`` is
        # given when autograd_dirty's Function measured it on its own path).
        if held is None:  # (the counts are taken before anything here holds a gradient; only a consumer asks)
            held = (_owners.held(_owners.references(grads), "generated") if self.consumes_grads
                    else frozenset(range(len(grads))))
        import torch

        if self.twice or not torch.is_grad_enabled():
            return self._backward(ctx, *grads, held=held)
        # create_graph=True: the gradients may be used, but a second derivative through them would silently miss
        # this op's part (the kernel's results carry no graph), so differentiating them again raises.
        anchors = [t for t in (*grads, *ctx.saved_tensors) if isinstance(t, torch.Tensor) and t.requires_grad]
        if not anchors and any(ctx.needs_input_grad):
            # Nothing this backward holds carries the inputs' graph (the forward saved no input that requires grad):
            # the second derivative of its term could not even be detected later, so refuse it now.
            raise RuntimeError(_first_order_message(self.namespace, self.fwd.name, self.bwd.name) + "; a gradient "
                               "of this op cannot be taken with create_graph=True at all (nothing it saved carries "
                               "the inputs' graph), so compute it without create_graph")
        with torch.no_grad():
            result = self._backward(ctx, *grads, held=held)
        return _first_order_only(result, anchors, self.namespace, self.fwd.name, self.bwd.name) if anchors else result

    def _backward(self, ctx: Any, *grads: Any, held: frozenset[int]) -> tuple[Any, ...]:
        import torch

        # An input the backward gives no gradient to must not silently get none.
        for name, needed in zip(self.in_names, ctx.needs_input_grad):
            if needed and name not in self.b.grads:
                raise RuntimeError(
                    f"flyship {self.namespace}::{self.fwd.name} backward: expected gradients only for "
                    f"{', '.join(self.b.grads)} (its backward op {self.bwd.name} gives no others), got an input "
                    f"{name!r} that requires grad; detach it (or declare its gradient in the spec's Backward)")
        values = dict(zip(self.saved, ctx.saved_tensors)) | ctx.flyship_scalars
        # Incoming gradients are often expanded views (the gradient of .sum() has stride 0): give the kernel
        # the dense layout its guards expect instead of falling back.
        fresh = set()
        for name, g in zip(self.grad_names, grads):
            key = _m.GRAD_PREFIX + name
            if g is not None and key in self.consumed.values() and not g.is_contiguous():
                fresh.add(key)  # .contiguous() copies: the copy is ours
            values[key] = g.contiguous() if g is not None else None
        held_grads = {_m.GRAD_PREFIX + self.grad_names[i] for i in held if i < len(self.grad_names)}
        handed = {}
        for k, src in self.consumed.items():
            t = values[src]
            if t is None:  # an output with no gradient flowing in: the buffer starts at zero
                t = _zeros_like_saved(self, src, values)
            elif not (src in fresh or src not in held_grads and _private(t, grad=src.startswith(_m.GRAD_PREFIX))):
                t = t.clone(memory_format=torch.contiguous_format)
            handed[k] = t
        args = []
        for a in self.bwd.args:
            src = self.b.inputs.get(a.name)
            args.append(handed[a.name] if a.name in handed else a.default if src is None else values[src])
        del values  # the backward's own references to saved tensors end here
        versions = {k: t._version for k, t in handed.items() if type(t) is torch.Tensor}
        result = getattr(getattr(torch.ops, self.namespace), self.bwd.name).default(*args)
        # A kernel writes through a pointer, which torch does not see: count the write on the buffer's version, so a
        # second backward through a kept graph (retain_graph=True) is refused by autograd's check of saved tensors
        # instead of reading the gradient the first one left there.
        for k, v in versions.items():
            if handed[k]._version == v:
                torch.autograd.graph.increment_version(handed[k])
        outs = result if isinstance(result, (tuple, list)) else (result,)
        by_name = dict(zip(self.bwd_outs, outs)) | handed
        return tuple(by_name[self.b.grads[n]] if n in self.b.grads else None for n in self.in_names)


def _first_order_only(grads: tuple[Any, ...], anchors: list[Any], namespace: str, op: str,
                      bwd: str) -> tuple[Any, ...]:
    """``grads`` as tensors whose own derivative raises, like ``torch.autograd.function.once_differentiable``, with a
    message naming the op. The raising node hangs off ``anchors`` (the incoming gradients and saved tensors that carry
    a graph), so ``torch.autograd.grad(..., inputs=...)`` cannot prune it and silently miss this op's term."""
    message = _first_order_message(namespace, op, bwd)
    live = [i for i, g in enumerate(grads) if g is not None and g.is_floating_point()]
    if not live:
        return grads
    wrapped = _first_order_function().apply(message, len(live), *(grads[i] for i in live), *anchors)
    out = list(grads)
    for i, w in zip(live, wrapped):
        out[i] = w
    return tuple(out)


def _first_order_message(namespace: str, op: str, bwd: str) -> str:
    return (f"flyship {namespace}::{op}: a double backward (differentiating a gradient taken with create_graph=True) "
            f"needs the derivative of its backward op {bwd}, which computes first derivatives only (it declares no "
            f"Backward, or writes gradients in place); compute this term with torch ops, or declare a Backward for "
            f"{bwd} that writes no input")


_FIRST_ORDER: list[Any] = []


def _first_order_function() -> Any:
    """The autograd Function behind :func:`_first_order_only` (made on first use: torch is imported lazily)."""
    if not _FIRST_ORDER:
        import torch

        class FirstOrderOnly(torch.autograd.Function):
            @staticmethod
            def forward(ctx: Any, message: str, n: int, *tensors: Any) -> tuple[Any, ...]:
                ctx.message = message
                return tuple(t.view_as(t) for t in tensors[:n])

            @staticmethod
            def backward(ctx: Any, *grads: Any) -> Any:
                raise RuntimeError(ctx.message)

        _FIRST_ORDER.append(FirstOrderOnly)
    return _FIRST_ORDER[0]


def _zeros_like_saved(rule: _Rule, src: str, values: dict[str, Any]) -> Any:
    """A zero gradient for ``grad:<output>`` when none flows into that output (torch passes None): shaped like the
    forward output, which the rule then must have saved; else the pair cannot be run."""
    import torch

    out = src[len(_m.GRAD_PREFIX):]
    like = values.get(out)
    if like is None:
        raise RuntimeError(f"flyship {rule.namespace}::{rule.fwd.name} backward: no gradient flows into output "
                           f"{out!r}, whose gradient buffer {rule.bwd.name} overwrites; use {out!r} in the loss, or "
                           f"save {out!r} for backward so a zero buffer can be made")
    return torch.zeros_like(like, memory_format=torch.contiguous_format)


# The owners a saved alias may have at backward time, counted by torch itself, as (storage owners, tensor owners):
# its storage is held by that one tensor object plus the Python handle ``untyped_storage()`` makes to count it, and
# the tensor by the saved variable and its Python object (tests/loader/test_training.py proves both directions: held
# -> copied, dropped -> consumed). An incoming gradient's owners are judged at the backward's first line by
# flyship.loader.autograd_owners, against counts measured on torch's own path: they differ between torch versions
# (the engine keeps its own reference during the call on 2.11, not on 2.13), and a second tensor owner is the buffer
# of another node that gets the same gradient (``a + b`` hands one tensor to both sides), which must not see it change.
_SAVED_OWNERS = (2, 2)


def _private(t: Any, grad: bool) -> bool:
    """True when nothing but this backward holds ``t``'s memory, so a kernel may overwrite it (see the module doc).
    Traced tensors (torch.compile's fake or functional tensors) are never private."""
    import torch

    if type(t) is not torch.Tensor or torch._is_functional_tensor(t) or t.device.type == "meta":
        return False
    if t.untyped_storage().nbytes() != t.numel() * t.element_size() or not t.is_contiguous():
        return False  # a part of a larger buffer, or a layout the kernel's guards may refuse: copy
    if grad:  # its owners were judged at the backward's first line (autograd_owners), before anything took a reference
        return True
    most_storage, most_tensor = _SAVED_OWNERS
    return torch._C._storage_Use_Count(t.untyped_storage()._cdata) <= most_storage and t._use_count() <= most_tensor


def _reverse_mode_only(kernel: Any, qualname: str, bwd: str) -> Any:
    """``kernel`` (torch's custom-op autograd kernel), refusing inputs that carry a forward-mode AD tangent.

    A manifest's backward gives reverse-mode gradients only, and the autograd.Function torch generates has no jvp:
    under ``torch.autograd.forward_ad`` it returns outputs whose tangent is silently None (a wrong Jacobian-vector
    product, not an error). A jvp is not derivable from a vector-Jacobian op, so we refuse rather than degrade.
    """
    import torch
    import torch.autograd.forward_ad as fwad

    from flyship.errors import CallError

    def kernel_or_refuse(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        if fwad._current_level >= 0:  # inside a dual_level(): only then can an input carry a tangent
            dual = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and fwad.unpack_dual(a).tangent
                    is not None]
            if dual:
                raise CallError(
                    f"flyship {qualname}: expected inputs without forward-mode AD tangents (its backward op {bwd} "
                    f"gives reverse-mode gradients only), got a dual tensor as argument {dual[0]}; use reverse mode "
                    "(.backward() / torch.autograd.grad), or run the op's reference for forward AD "
                    f"(ops.reference({qualname.split('::')[1]!r}))")
        return kernel(keyset, *args, **kwargs)

    return kernel_or_refuse


def register(lib: Any, namespace: str, manifest: _m.Manifest) -> list[str]:
    """Register the derivative of every op of ``manifest`` that declares a backward, on ``lib`` (a
    ``torch.library.Library`` fragment of ``namespace``).

    Returns:
        The names of the ops that got a derivative.
    """
    import torch
    from torch._library.autograd import Info, make_autograd_impl

    done = []
    for op in manifest.ops:
        if op.backward is None:
            continue
        rule = _Rule(namespace, op, manifest.backward_op(op.backward.op), op.backward)
        if rule.consumes_grads:  # measure now, in plain eager mode, not first inside a backward (or a trace)
            _owners.baseline("function" if op.mutable else "generated")
        overload = getattr(getattr(torch.ops, namespace), op.name).default
        # A forward that writes inputs in place (schema 5.0) gets the mark_dirty kernel; torch's generated one
        # supports functional ops only.
        inner = (_dirty.make_kernel(overload, rule) if op.mutable
                 else make_autograd_impl(overload, Info(rule.backward, rule.setup_context)))
        kernel = _reverse_mode_only(inner, f"{namespace}::{op.name}", op.backward.op)
        for key in AUTOGRAD_KEYS:
            lib.impl(op.name, kernel, key, with_keyset=True)
        done.append(op.name)
    return done
