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
"""

from __future__ import annotations

from typing import Any

from flyship.bundle import manifest as _m

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
        self.saved = b.saved(fwd)
        self.scalars = sorted({src for src in b.inputs.values() if src in self.in_names
                               and fwd.args[self.in_names.index(src)].kind != "tensor"})
        self.bwd_outs = [o.name for o in bwd.outputs]

    def setup_context(self, ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        outs = output if isinstance(output, (tuple, list)) else (output,)
        values = dict(zip(self.in_names, inputs)) | dict(zip(self.out_names, outs))
        ctx.save_for_backward(*(values[n] for n in self.saved))
        ctx.flyship_scalars = {n: values[n] for n in self.scalars}

    def backward(self, ctx: Any, *grads: Any) -> tuple[Any, ...]:
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
        for name, g in zip(self.out_names, grads):
            values[_m.GRAD_PREFIX + name] = g.contiguous() if g is not None else None
        args = []
        for a in self.bwd.args:
            src = self.b.inputs.get(a.name)
            args.append(a.default if src is None else values[src])
        result = getattr(getattr(torch.ops, self.namespace), self.bwd.name).default(*args)
        outs = result if isinstance(result, (tuple, list)) else (result,)
        by_name = dict(zip(self.bwd_outs, outs))
        return tuple(by_name[self.b.grads[n]] if n in self.b.grads else None for n in self.in_names)


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
        rule = _Rule(namespace, op, manifest.op(op.backward.op), op.backward)
        overload = getattr(getattr(torch.ops, namespace), op.name).default
        kernel = _reverse_mode_only(make_autograd_impl(overload, Info(rule.backward, rule.setup_context)),
                                    f"{namespace}::{op.name}", op.backward.op)
        for key in AUTOGRAD_KEYS:
            lib.impl(op.name, kernel, key, with_keyset=True)
        done.append(op.name)
    return done
