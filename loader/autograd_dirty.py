"""Autograd pairs whose forward writes inputs in place (schema 5.0): the ``torch.autograd.Function`` +
``ctx.mark_dirty`` contract, for an op of the bundle.

An op declared with a backward and ``Tensor(..., mutable=True)`` inputs (its schema says ``Tensor(a!)``) gets this
autograd kernel instead of torch's generated one (:func:`flyship.loader.autograd.register`):

1. outside grad mode, or when no input requires grad, it runs the op below autograd, like any in-place op;
2. else it refuses, before the kernel writes anything, what autograd refuses for an in-place write
   (:func:`check_writable`): a leaf that requires grad, a view of one, and a view torch cannot rebase (an output of
   a function that returns several views, a view made in no-grad or inference mode, or inside a custom Function);
3. it runs the op below autograd *with grad mode on* (so torch.compile's functionalization sees a mutation autograd
   must follow, and AOTAutograd replays it with the input's gradient), and counts the write on each written input's
   version counter when the kernel (a launch through a pointer) did not: a tensor another op saved for backward is
   then refused by autograd's own check at backward time ("modified by an inplace operation"), never read stale;
4. it hands the written inputs and the fresh outputs to a :class:`torch.autograd.Function` that marks them dirty:
   their history is rebased onto the pair's node, as ``ctx.mark_dirty`` does (a view's base gets a ``CopySlices``).
   The op returns its declared outputs; each written input is the caller's own tensor object, now carrying the
   pair's history (as ``x.add_(y)`` leaves ``x``).

The backward reads ``"grad:<input>"``, the gradient flowing into a written input's new value. A written input
whose gradient the backward does not read (cross-entropy writes its gradient over the logits) must not be used
afterwards in a differentiable computation: a gradient that reaches it raises instead of being silently dropped.
"""

from __future__ import annotations

from typing import Any

from flyship.bundle import manifest as _m
from flyship.errors import CallError
from flyship.loader import autograd_owners as _owners

_CREATION = {  # torch's CreationMeta names -> what the view is, for the refusal
    "MULTI_OUTPUT_NODE": "an output of a function that returns several views (chunk, split, unbind)",
    "NO_GRAD_MODE": "a view made in no-grad mode",
    "INFERENCE_MODE": "a view made in inference mode",
    "IN_CUSTOM_FUNCTION": "a view made inside a custom autograd Function",
}


def check_writable(qualname: str, name: str, t: Any) -> None:
    """Refuse writing ``t`` in place with autograd recording it, where torch's in-place check would refuse it
    (``check_inplace`` / ``handle_view_on_rebase``): checked before the kernel runs, so a refused call changes
    nothing.

    Raises:
        CallError: naming the op, the argument and what to pass instead.
    """
    import torch

    if t._is_view():
        meta = torch._C._autograd._get_creation_meta(t)
        if meta != torch._C._autograd.CreationMeta.DEFAULT:
            what = _CREATION.get(meta.name, f"a view autograd cannot rebase ({meta.name})")
            raise CallError(f"flyship {qualname}: expected '{name}' that autograd can record an in-place write "
                            f"on, got {what}; pass a tensor of its own (.clone()), or call it under "
                            "torch.no_grad()")
        if t.requires_grad and t._base.is_leaf:
            raise CallError(f"flyship {qualname}: expected '{name}' that is not a view of a leaf tensor that "
                            f"requires grad (the op writes it in place, which would change the leaf), got one of "
                            f"shape {list(t.shape)}; pass a copy (.clone()) or a tensor computed from the leaf")
    if t.is_leaf and t.requires_grad:
        raise CallError(f"flyship {qualname}: expected '{name}' that is not a leaf tensor requiring grad (the op "
                        f"writes it in place), got a leaf of shape {list(t.shape)} with requires_grad=True; pass a "
                        "copy (.clone()), or call it under torch.no_grad() to update the leaf itself")


def make_kernel(overload: Any, rule: Any) -> Any:
    """The autograd kernel (``with_keyset``) of an op whose forward writes inputs in place (see the module doc).
    ``rule`` is the op's :class:`flyship.loader.autograd._Rule`."""
    import torch
    from torch._library.utils import fill_defaults

    qualname = f"{rule.namespace}::{rule.fwd.name}"
    n_args = len(rule.fwd.args)
    dirty_at = [i for i, a in enumerate(rule.fwd.args) if a.mutable]
    dirty = [rule.fwd.args[i].name for i in dirty_at]
    n_outs = len(rule.out_names)
    # Written inputs whose gradient the backward does not read: a gradient reaching them would be dropped.
    unread = {n for n in dirty if _m.GRAD_PREFIX + n not in rule.b.inputs.values()}

    def run_below(keyset: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        plain = [args[i] for i in dirty_at if type(args[i]) is torch.Tensor]
        versions = [t._version for t in plain]
        with torch._C._AutoDispatchBelowAutograd():
            result = overload.redispatch(keyset & torch._C._after_autograd_keyset, *args, **kwargs)
        for t, v in zip(plain, versions):
            if t._version == v:  # a launch writes through a pointer, which torch does not see
                torch.autograd.graph.increment_version(t)
        return result

    def forward(ctx: Any, *flat: Any) -> tuple[Any, ...]:
        args, outs = flat[:n_args], flat[n_args:]
        ctx.set_materialize_grads(False)
        rule.setup_context(ctx, args, outs)
        written = tuple(args[i] for i in dirty_at)
        ctx.mark_dirty(*written, *outs)
        ctx.flyship_like = [(t.shape, t.dtype, t.device) for t in (*outs, *written)]
        return (*outs, *written)

    def backward(ctx: Any, *grads: Any) -> tuple[Any, ...]:
        # First: who else holds each incoming gradient (flyship.loader.autograd_owners, measured on this path).
        held = (_owners.held(_owners.references(grads), "function") if rule.consumes_grads
                else frozenset(range(len(grads))))
        filled = []
        for name, g, (shape, dtype, device) in zip(rule.grad_names, grads, ctx.flyship_like):
            if g is not None and name in unread:
                message = (f"flyship {qualname} backward: a gradient flows into '{name}' after the op wrote it "
                           f"in place, but its backward op {rule.bwd.name} does not read that gradient (the op's "
                           f"new value of '{name}' has no derivative); use '{name}' only as the op leaves it for "
                           "its backward, or compute with a copy taken before the call")
                if type(g) is torch.Tensor:  # eager: autograd passes None unless something used the new value
                    raise RuntimeError(message)
                # Traced (torch.compile): AOTAutograd hands a mutated graph input a tangent, zero unless the new
                # value is used after the graph; that can only be decided when the graph runs.
                torch._assert_async(torch.logical_not(g.any()), message)
                g = None
            if g is None and name not in unread and _m.GRAD_PREFIX + name in rule.b.inputs.values():
                g = torch.zeros(shape, dtype=dtype, device=device)
            filled.append(g)
        return (*rule.backward(ctx, *filled, held=held), *([None] * n_outs))

    # Named after the op: autograd's messages say "output 0 of flyship_<op>Backward".
    pair = type(f"flyship_{rule.fwd.name}", (torch.autograd.Function,),
                {"forward": staticmethod(forward), "backward": staticmethod(backward)})

    def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        if not (torch.is_grad_enabled() and torch._C._any_requires_grad(*args)):
            return run_below(keyset, args, kwargs)
        # The dispatcher drops trailing arguments equal to their defaults: the pair's node takes every one.
        args, kwargs = fill_defaults(overload._schema, args, kwargs)
        for i in dirty_at:
            check_writable(qualname, rule.fwd.args[i].name, args[i])
        result = run_below(keyset, args, kwargs)
        outs = tuple(result) if isinstance(result, (tuple, list)) else (() if result is None else (result,))
        tracked = pair.apply(*args, *outs)[:len(outs)]
        return result if not outs else tracked[0] if len(outs) == 1 and not isinstance(result, (tuple, list)) \
            else tuple(tracked)

    return kernel
