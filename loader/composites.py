"""Composite ops (schema 1.4): ops the bundle composes in torch code from its own ops and torch ops.

Each composite of the manifest (:class:`flyship.bundle.manifest.Composite`) is a function of the bundle's references
module, the one Python file a bundle ships: imported from the bytes checked against ``references_sha256``
(:func:`flyship.loader.references.import_references`), so loading a bundle runs no code but the bundle's own, checked
code. It is registered as ``torch.ops.<namespace>.<name>`` with one ``CompositeImplicitAutograd`` kernel that calls
``function(torch.ops.<namespace>, *args)``:

* autograd runs through what it calls: the bundle's autograd pairs and torch's own ops (a host step such as
  ``partial.sum(0).to(w.dtype)`` or ``loss.sum() / (target != ignore_index).sum()`` is differentiated by torch);
* ``torch.compile`` decomposes it while tracing (CompositeImplicitAutograd), so the graph holds the bundle's ops
  and torch ops, each with its fake kernel: no graph break, and fake tensors flow through the same code;
* it runs alike on every device (the ops it calls choose kernels or references).

A composite's workspaces (schema 1.5) are allocated per call on the device of its first tensor argument and passed
after its arguments, ``function(ops, *args, *workspaces)``; a shape reading ``device.cu_count`` is sized for that
device (a CUDA/HIP device's count as the extension reads it, the recording or emulated device's for CPU tensors
under those flavors, 1 for other CPU tensors, which only references run on).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from flyship.bundle import expr as _expr
from flyship.bundle import manifest as _m
from flyship.bundle.errors import BundleError
from flyship.errors import CallError, CallTypeError
from flyship.loader import opschema as _opschema
from flyship.loader import references as _references


def schema(c: _m.Composite) -> str:
    """The torch schema of a composite: ``cross_entropy(Tensor logits, Tensor target, int ignore_index=-100) ->
    Tensor`` (a tuple of Tensors for several returns)."""
    return _opschema.schemas(_m.composite_head(c))[0]


def workspaces(c: _m.Composite, args: tuple[Any, ...], cu_count: Callable[[Any], int], qual: str) -> list[Any]:
    """The composite's workspaces for one call with ``args`` (its schema's values), on the first tensor's device.

    Args:
        cu_count: the device's CUs/SMs for ``device.cu_count`` (called only when a shape reads it).

    Raises:
        CallError: a shape that cannot be evaluated for the call or gives a negative size.
    """
    import torch

    tensors = [(a.name, t) for a, t in zip(c.args, args) if a.kind == "tensor"]
    device = tensors[0][1].device
    shapes = {k: tuple(int(n) for n in t.shape) for k, t in tensors}
    strides = {k: tuple(int(n) for n in t.stride()) for k, t in tensors}
    scalars = {a.name: v for a, v in zip(c.args, args)
               if a.kind == "int" and isinstance(v, int) and not isinstance(v, bool)}
    props = None
    out = []
    for w in c.workspaces:
        if props is None and any(_expr.names_device(e) for e in w.shape):
            props = {"cu_count": int(cu_count(device))}
        try:
            size = [_expr.evaluate_with_shapes(e, shapes, scalars, strides, device=props) for e in w.shape]
        except BundleError as e:
            raise CallError(f"flyship {qual}: workspace {w.name} shape {list(w.shape)} for this call: {e}") from None
        if any(n < 0 for n in size):
            raise CallError(f"flyship {qual}: workspace {w.name} shape {list(w.shape)} is {size} for this call; "
                            "expected sizes >= 0")
        make = torch.zeros if w.zero else torch.empty
        out.append(make(size, dtype=getattr(torch, w.dtype), device=device))
    return out


def _kernel(c: _m.Composite, fn: Callable[..., Any], namespace: str,
            cu_count: Callable[[Any], int]) -> Callable[..., Any]:
    """The composite's kernel: ``fn(torch.ops.<namespace>, *args, *workspaces)``, its result checked against the
    schema so a composite that returns the wrong thing names itself instead of failing inside torch's conversion."""
    import torch

    n = len(c.returns)
    qual = f"{namespace}::{c.name}"

    def composite_kernel(*args: Any) -> Any:
        spaces = workspaces(c, args, cu_count, qual) if c.workspaces else ()
        out = fn(getattr(torch.ops, namespace), *args, *spaces)
        got = out if isinstance(out, (tuple, list)) else (out,)
        if len(got) != n or not all(isinstance(t, torch.Tensor) for t in got) or (n == 1) != (not isinstance(
                out, (tuple, list))):
            shown = type(out).__name__ if not isinstance(out, (tuple, list)) else \
                f"a {type(out).__name__} of {[type(t).__name__ for t in out]}"
            raise CallError(f"flyship {qual}: expected its function to return "
                            f"{'a Tensor' if n == 1 else f'a tuple of {n} Tensors'} ({', '.join(c.returns)}), got "
                            f"{shown}; fix the composite in the bundle's references module and rebuild")
        return out

    composite_kernel.__name__ = f"composite_{c.name}"
    return composite_kernel


def register(lib: Any, namespace: str, root: Path, manifest: _m.Manifest,
             cu_count: Callable[[Any], int] = lambda device: 1) -> dict[str, Any]:
    """Define and register every composite of ``manifest`` on ``lib`` (a ``torch.library.Library`` fragment of
    ``namespace``).

    Args:
        cu_count: a torch device -> its CUs/SMs, for workspace shapes that read ``device.cu_count``
            (:func:`flyship.loader.core` passes the extension's reading).

    Returns:
        Composite name -> its ``torch.ops`` packet (``torch.ops.<namespace>.<name>``).

    Raises:
        BundleError: the references module lacks a composite's function, or torch refuses its schema.
    """
    import torch

    if not manifest.composites:
        return {}
    module = _references.import_references(root, manifest)
    out = {}
    for c in manifest.composites:
        fn = getattr(module, c.function, None) if module is not None else None
        if not callable(fn):
            raise BundleError(f"load bundle {root}: composite {c.name} runs {c.function!r}, which "
                              f"{manifest.references or 'the references module'} does not define; rebuild the bundle")
        text = schema(c)
        try:
            lib.define(text)
        except RuntimeError as e:
            raise BundleError(f"register composite {namespace}::{c.name}: torch refused the schema {text!r}: {e}; "
                              "load the bundle under another namespace (load(..., namespace='...'))") from e
        lib.impl(c.name, _kernel(c, fn, namespace, cu_count), "CompositeImplicitAutograd")
        out[c.name] = packet = getattr(getattr(torch.ops, namespace), c.name)
        packet.dispatch = _no_dispatch(namespace, c)  # a flyship answer where torch would raise its AttributeError
    return out


def _no_dispatch(namespace: str, c: _m.Composite) -> Callable[..., Any]:
    """``ops.<composite>.dispatch``: a composite runs torch code that calls ops, so no one specialization answers
    for it; the refusal names what to ask instead."""
    def dispatch(*args: Any, **kwargs: Any) -> Any:
        raise CallTypeError(f"{namespace}::{c.name}.dispatch: expected an op with kernels, got a composite (torch code "
                            f"in {c.function}() over this bundle's ops), which has no dispatch of its own; ask "
                            "dispatch(...) of each op it calls, e.g. ops.<op>.dispatch(*args, target=...), or run it "
                            "under flyship.dry_run(...) and read .launches()")
    return dispatch
