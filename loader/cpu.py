"""The CPU kernel of an op: a call whose tensors are all on the CPU runs the op's PyTorch reference.

A bundle holds GPU code objects only, so on the CPU the reference is the op: ``torch.library.opcheck``,
unit tests and CPU-only CI of a model that uses the ops get real numbers. Such calls are counted in
``stats()`` under the fallback reason :data:`REASON`; with the fallback off (``FLYSHIP_FALLBACK=0`` or
``load(fallback=False)``) they raise, as every other fallback does.

A call is checked by the C++ core's own bind step before the reference runs (``check_call``: argument types,
ranks, one device, output rules, out= shapes and dtypes, memory overlap), so a call the GPU path refuses is
refused on the CPU with the same message. The reference's outputs are checked against the manifest's output
rules (the fake kernel's shapes and dtypes), and an output that aliases an input is copied, as the C++ fallback
does for GPU tensors. A reference that fails is blamed on the inputs when they are the cause (loader/blame.py,
which the C++ core asks too): sizes that break a guard constraint relating two arguments (``w.shape[0] ==
x.shape[1]``) in every specialization name the argument, expected vs got; dtypes no specialization admits are named
too. A misfit the reference serves (a broadcast) runs, as the GPU path's fallback would run it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from flyship.bundle import batch as _batch
from flyship.bundle import manifest as _m
from flyship.errors import CallError
from flyship.loader import opschema as _opschema
from flyship.loader import references as _references

REASON = "cpu"


class CpuKernel:
    """The CPU kernels (functional and ``.out``) of one op, with the count of calls they took.

    Args:
        op: the op's manifest entry.
        qualname: ``<namespace>::<name>``, for messages.
        reference: the op's PyTorch reference, or None.
        fallback_on: returns whether the bundle's fallback is on now (read per call: it can be switched).
        check_call: the C++ core's checks of a call (``Bundle.check_call`` for this op): takes the arguments in
            schema order (inputs, then out tensors for the out variant) and ``is_out``; raises CallError.
    """

    def __init__(self, op: _m.Op, qualname: str, reference: Callable[..., Any] | None,
                 fallback_on: Callable[[], bool], check_call: Callable[[list[Any], bool], None],
                 full_op: Callable[[], _m.Op] | None = None) -> None:
        self._op = op
        self._check_call = check_call
        self._full_op = full_op or (lambda: op)  # with the specializations (a plan-cache head has none)
        self._qualname = qualname
        self._reference = reference
        self._fallback_on = fallback_on
        self._arg_names = [a.name for a in op.args]
        self._defaults = {a.name: a.default for a in op.args if a.default is not None}
        self._out_names = _opschema.out_names(op)
        self._fake = _opschema.make_fake(op, False, qualname)
        self._expected_cache: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        self._lock = threading.Lock()
        self.calls = 0

    def reset(self) -> None:
        with self._lock:
            self.calls = 0

    def functional(self, *args: Any, **kwargs: Any) -> Any:
        outs = self._run(args, kwargs)
        if not outs:  # an op that only writes inputs in place returns ()
            return None
        return outs[0] if len(outs) == 1 else outs

    def out(self, *args: Any, **kwargs: Any) -> None:
        outs = self._run(args, kwargs, is_out=True)
        for name, got in zip(self._out_names, outs):
            kwargs[name].copy_(got)

    def _run(self, args: tuple[Any, ...], kwargs: dict[str, Any], is_out: bool = False) -> tuple[Any, ...]:
        import torch

        values = dict(self._defaults)
        values.update(zip(self._arg_names, args))
        values.update({k: v for k, v in kwargs.items() if k in self._arg_names})
        inputs = [values[n] for n in self._arg_names]
        # The launch path's own checks (one owner: csrc/bind.cpp), on these CPU tensors.
        self._check_call(inputs + ([kwargs.get(n) for n in self._out_names] if is_out else []), is_out)
        tensors = [(n, t) for n, t in zip(self._arg_names, inputs) if isinstance(t, torch.Tensor)]
        tensors += [(n, kwargs[n]) for n in self._out_names if n in kwargs]
        # Leading batch dims: the reference sees the kernel's shapes (flattened; a copy where no view exists), as
        # on the GPU; batched outputs get the leading dims back.
        batch = _batch.split(self._op, {a.name: values[a.name].shape for a in self._op.args if a.batch},
                             self._qualname)
        if batch.active:
            inputs = [self._flatten(n, v, batch.flat_shape(n, v.shape)) if n in batch.extra else v
                      for n, v in zip(self._arg_names, inputs)]
        kernel_values = dict(zip(self._arg_names, inputs))  # what the guards and the reference see
        want = self._expected(inputs)
        full = [batch.full_shape(list(w.shape)) if o.batch else list(w.shape) for o, w in zip(self._op.outputs, want)]
        if not self._fallback_on():
            raise CallError(f"flyship {self._qualname}: expected GPU tensors (the bundle has GPU code objects only), "
                            "got CPU tensors and the fallback is off (FLYSHIP_FALLBACK=0 or load(fallback=False)), so "
                            "the PyTorch reference cannot stand in; move inputs with .cuda() or turn the fallback on")
        if self._reference is None:
            raise CallError(f"flyship {self._qualname}: CPU tensors run the op's PyTorch reference and this op has "
                            f"none; pass one with load(..., references={{'{self._op.name}': fn}})")
        with self._lock:
            self.calls += 1
        try:
            got = self._reference(*inputs)
        except (torch.OutOfMemoryError, MemoryError):
            raise  # not the reference's fault, and callers catch it (free memory, retry smaller), as the C++ core
        except _references.ReferenceReentered:
            raise  # already says what is wrong with the reference (loader/references.py guarded)
        except Exception as e:
            raise CallError(self._blame(kernel_values, f"raised {type(e).__name__}: {e}", "fix the reference",
                                        True)) from e
        outs = tuple(got) if isinstance(got, (tuple, list)) else () if got is None else (got,)
        self._check(kernel_values, outs, want)
        outs = tuple(_plain(o) for o in outs)
        if is_out:  # copied into the caller's out tensors, whatever their layout (leading batch dims back)
            return tuple(o.reshape(shape) for o, shape in zip(outs, full))
        in_storages = {t.untyped_storage().data_ptr() for _, t in tensors if t.numel()}
        return tuple(_fresh(o, shape, in_storages) for o, shape in zip(outs, full))

    def _flatten(self, name: str, t: Any, shape: list[int]) -> Any:
        """A batched input in the kernel's shape: a view where one exists, else a copy; an input written in place
        must be a view (the reference's write to a copy would be lost), as the C++ core's batch step says."""
        if name not in self._op.mutable:
            return t.reshape(shape)
        try:
            return t.view(shape)
        except RuntimeError:
            raise CallError(f"flyship {self._qualname}: input '{name}', which the kernel writes in place, has shape "
                            f"{list(t.shape)} and strides {list(t.stride())}, which do not flatten to {shape} without "
                            "a copy (the write would be lost); pass a tensor whose leading dims flatten to a view "
                            "(.contiguous(), then copy the result back)") from None

    def _blame(self, values: dict[str, Any], failure: str, fix: str, about_dtypes: bool) -> str:
        """The message for a reference that failed: :func:`flyship.loader.blame.blame` words it (the C++ core's
        ``OpState::call_reference`` asks the same function), after the op's name."""
        from flyship.loader import blame  # a failing reference's message only: not imported by a load

        return f"flyship {self._qualname}: {blame.blame(self._full_op(), values, failure, fix, about_dtypes)}"

    def _expected(self, inputs: list[Any]) -> tuple[Any, ...]:
        """The outputs' meta tensors by the output rules (the fake kernel), cached per input layout."""
        import torch

        key = tuple((v.shape, v.stride(), v.dtype) if isinstance(v, torch.Tensor) else v for v in inputs)
        want = self._expected_cache.get(key)
        if want is None:
            want = self._fake(*[v.to("meta") if isinstance(v, torch.Tensor) else v for v in inputs])
            want = want if isinstance(want, tuple) else () if want is None else (want,)
            if len(self._expected_cache) >= 256:
                self._expected_cache.clear()
            self._expected_cache[key] = want
        return want

    def _check(self, values: dict[str, Any], outs: tuple[Any, ...], want: tuple[Any, ...]) -> None:
        import torch

        if len(outs) != len(want) or not all(isinstance(o, torch.Tensor) for o in outs):
            raise CallError(self._blame(values, f"returned {len(outs)} value(s) "
                                        f"({', '.join(type(o).__name__ for o in outs) or 'None'}), expected "
                                        f"{len(want)} tensor(s){mutable_hint(self._op)}", "fix the reference", False))
        for name, o, w in zip(self._out_names, outs, want):
            if o.layout != torch.strided or o.is_nested:  # no strides to copy from: as OpState::call_reference says
                kind = "nested" if o.is_nested else o.layout
                raise CallError(f"flyship {self._qualname}: the reference (fallback) returned output '{name}' as a "
                                f"{kind} tensor, expected a dense one (torch.strided); return a dense tensor from the "
                                "reference (e.g. result.to_dense())")
            if o.shape != w.shape or o.dtype != w.dtype or o.device.type != "cpu":
                dt = str(o.dtype).removeprefix("torch.")
                raise CallError(self._blame(values, f"returned output '{name}' of shape {list(o.shape)}, dtype {dt} "
                                            f"on {o.device}; the manifest's rule gives {list(w.shape)}, "
                                            f"{str(w.dtype).removeprefix('torch.')} on cpu",
                                            "fix the reference or the output rule", o.dtype != w.dtype))


def _plain(o: Any) -> Any:
    """A tensor the reference returned, as the op returns it (as ``plain_output`` in csrc/python_calls.cpp): a plain
    torch.Tensor that needs no gradient. A Parameter (or another subclass) would be handed back as that very object,
    and one that requires grad would make the op's output a leaf that requires grad; the op's outputs never need a
    gradient by themselves (autograd is the registered backward's business)."""
    import torch

    if type(o) is torch.Tensor and not o.requires_grad:
        return o
    o = o.detach()
    return o if type(o) is torch.Tensor else o.as_subclass(torch.Tensor)


def _fresh(o: Any, shape: list[int], in_storages: set[int]) -> Any:
    """The reference's output ``o`` as the functional op promises it (its fake kernel's ``new_empty``, a launch's
    allocation, the C++ fallback's ``OpState::fallback``): a tensor of its own, of ``shape`` (leading batch dims
    back), with contiguous strides. Anything else (a view of an input, the transposed result of transposed inputs,
    the kernel's flattened shape) is copied into one: opcheck and torch.compile compare strides with the fake's."""
    import torch

    fresh = torch.empty(shape, dtype=o.dtype, device="meta")  # the layout torch.empty gives: the rule's
    if (list(o.shape) == shape and o.stride() == fresh.stride()
            and not (o.numel() and o.untyped_storage().data_ptr() in in_storages)):
        return o
    out = torch.empty(shape, dtype=o.dtype, device=o.device)
    out.view(o.shape).copy_(o)
    return out


def mutable_hint(op: _m.Op) -> str:
    """What a reference of an op with in-place inputs must do, for the message that refuses one that did not."""
    if not op.mutable:
        return ""
    names = ", ".join(op.mutable)
    return (f" (the op's outputs only: the kernel writes {names} in place, so the reference must write "
            f"{names} in place too, e.g. {op.mutable[0]}.copy_(new_value), and return "
            f"{'None' if not op.outputs else 'only the outputs'}, never a new tensor in its place)")


def register(lib: Any, op: _m.Op, kernel: CpuKernel) -> None:
    """Register ``kernel`` for the CPU key of the op and of its ``.out`` variant (when it has outputs) on ``lib``."""
    lib.impl(op.name, kernel.functional, "CPU")
    if op.outputs:
        lib.impl(op.name + ".out", kernel.out, "CPU")
