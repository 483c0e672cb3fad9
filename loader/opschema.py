"""The torch side of an op: its schema strings and its fake (meta) kernel.

The schema follows from the manifest's ``args`` and ``outputs`` (docs/bundle-format.md)::

    add(Tensor x, Tensor y) -> Tensor
    add.out(Tensor x, Tensor y, *, Tensor(a!) out) -> ()
    addsub.out(Tensor x, Tensor y, *, Tensor(a!) sum, Tensor(b!) diff) -> ()
    fused_add_rmsnorm(Tensor x, Tensor(a!) residual, Tensor w, float eps=1e-06) -> Tensor
    kv_write(Tensor(a!) cache, Tensor new, Tensor pos) -> ()          (an in-place op: no .out variant)

The fake kernel computes output shapes with flyship's one expression interpreter
(:func:`flyship.bundle.expr.evaluate`, the C++ core's semantics) on Python ints or SymInts, so
torch.compile traces the op with dynamic shapes without a graph break.
"""

from __future__ import annotations

import string
from typing import Any, Callable, Optional

from flyship.bundle import batch as _batch
from flyship.bundle import expr as _expr
from flyship.bundle import manifest as _m
from flyship.errors import CallError

_TYPES = {"tensor": "Tensor", "int": "int", "float": "float", "bool": "bool"}


def _default(a: _m.Arg) -> str:
    if a.kind == "bool":
        return "True" if a.default else "False"
    if a.kind == "int":
        return str(int(a.default))
    return repr(float(a.default))


def out_names(op: _m.Op) -> list[str]:
    """Keyword names of the out tensors: ``out`` for one output (torch's convention), else the outputs' names,
    one of which may itself be ``out`` (``scale_and_add_one.out(..., *, Tensor(a!) scaled, Tensor(b!) out)``;
    the Python ``.out`` wrapper then reads ``out=(s, t)`` as every output in order, :meth:`OpHandle._out`).

    Raises:
        BundleError: an out name collides with an input name.
    """
    from flyship.bundle import rules as _rules

    _rules.check_out_names(op, f"op {op.name}")
    return ["out"] if len(op.outputs) == 1 else [o.name for o in op.outputs]


def schemas(op: _m.Op) -> tuple[str, Optional[str]]:
    """The functional schema and the ``.out`` schema of an op (without namespace).

    Each input the kernel writes in place (``mutable``, schema 1.2) is ``Tensor(a!) name``, taking the alias
    letters before the out tensors; an op whose only effect is in place returns ``()`` and has no ``.out``
    variant (its out schema is ``None``).

    Raises:
        BundleError: an op with neither outputs nor in-place inputs, or too many of them for alias letters.
    """
    from flyship.bundle import rules as _rules

    _rules.check_effects(op, f"op {op.name}")
    _rules.check_alias_letters(op, f"op {op.name}")
    letters = iter(string.ascii_lowercase)
    params = []
    for a in op.args:
        p = f"{_TYPES[a.kind]}({next(letters)}!) {a.name}" if a.mutable else f"{_TYPES[a.kind]} {a.name}"
        if a.kind != "tensor" and a.default is not None:
            p += "=" + _default(a)
        params.append(p)
    n = len(op.outputs)
    ret = "Tensor" if n == 1 else "(" + ", ".join(["Tensor"] * n) + ")"
    functional = f"{op.name}({', '.join(params)}) -> {ret}"
    if not n:
        return functional, None
    outs = [f"Tensor({letter}!) {name}" for letter, name in zip(letters, out_names(op))]
    # The out variant returns nothing: torch.compile functionalizes a custom op that mutates its
    # arguments only if its outputs carry no alias annotation (a `-> Tensor(a!)` return is refused).
    out = f"{op.name}.out({', '.join(params + ['*'] + outs)}) -> ()"
    return functional, out


def check_inputs(op: _m.Op, qualname: str, values: dict[str, Any]) -> Any:
    """The checks of the C++ core's bind step that need no data: each input tensor's rank (a batched one: the
    kernel's or more) and one device for all (all real or all meta). Returns the first input tensor.

    Raises:
        CallError: naming the argument, what was expected and what to pass.
    """
    first = None
    for a in op.args:
        if a.kind != "tensor":
            continue
        v = values[a.name]
        if not a.batch and v.dim() != a.rank:
            raise CallError(f"flyship {qualname}: expected '{a.name}' of rank {a.rank}, got rank {v.dim()} "
                            f"(shape {list(v.shape)}); pass a tensor of rank {a.rank}")
        if first is not None and v.device != first.device:
            # As the C++ core refuses it: a real tensor mixed with a meta one (the dispatcher picks this
            # fake kernel for such a call) or tensors on two devices.
            raise CallError(f"flyship {qualname}: expected all tensors on one device (all real or all "
                            f"meta), got {first.device} and {v.device} for '{a.name}'; move them to one "
                            "device")
        first = first if first is not None else v
    return first


def check_out(qualname: str, name: str, t: Any, shape: list[Any], dtype: Any) -> None:
    """An out tensor must have exactly the shape and dtype the output rules give (as the C++ core checks).

    Raises:
        CallError: naming both, and how to allocate the right one.
    """
    if list(t.shape) != list(shape) or t.dtype != dtype:
        dt = str(dtype).removeprefix("torch.")
        raise CallError(f"flyship {qualname}: expected out tensor '{name}' of shape {list(shape)} and dtype {dt}, "
                        f"got shape {list(t.shape)} and dtype {str(t.dtype).removeprefix('torch.')}; allocate it "
                        f"with torch.empty({list(shape)}, dtype=torch.{dt}, device=x.device)")


def make_fake(op: _m.Op, is_out: bool, qualname: str) -> Callable[..., Any]:
    """The fake kernel of the functional op (fresh outputs) or of its ``.out`` variant (checks the out tensors,
    returns nothing).

    It checks what the C++ core checks without data: argument ranks, and out tensors' shapes and dtypes.
    """
    import torch

    slots = _m.slots(op)
    inputs_only = {k: s for k, s in slots.items() if s.index < len(op.args)}
    for o in op.outputs:  # refuse, at load, a rule that names anything but the inputs
        for e in o.shape:
            _expr.compile_program(e, inputs_only)
    symbolic = _expr.Symbolic(min=torch.sym_min, max=torch.sym_max)
    arg_names = [a.name for a in op.args]
    defaults = {a.name: a.default for a in op.args if a.default is not None}
    outs = out_names(op)

    def fake(*args: Any, **kwargs: Any) -> Any:
        values = dict(defaults)
        values.update(zip(arg_names, args))
        values.update({k: v for k, v in kwargs.items() if k in arg_names})
        first = check_inputs(op, qualname, values)
        batch = _batch.split(op, {a.name: values[a.name].shape for a in op.args if a.batch}, qualname)

        def env(name: str, what: str, idx: int | None) -> Any:
            v = values[name]
            k = batch.extra.get(name, 0)  # a batched input is read as its flattened (M, ...) view
            if what == "shape":
                return batch.flat_shape(name, v.shape)[idx]
            if what == "stride":  # dims counted on the kernel's rank (idx may be negative: from the end)
                return v.stride(idx + k if idx >= 0 else idx)
            return {"numel": v.numel, "scalar": lambda: v}[what]()

        results = []
        for o in op.outputs:
            shape = [_expr.evaluate(e, env, symbolic=symbolic) for e in o.shape]
            if o.batch:
                shape = batch.full_shape(shape)
            is_tensor = o.dtype in inputs_only and inputs_only[o.dtype].kind == "tensor"
            dtype = values[o.dtype].dtype if is_tensor else getattr(torch, o.dtype)
            results.append((shape, dtype))
        if is_out:
            got = [kwargs[n] for n in outs]
            for name, t, (shape, dtype) in zip(outs, got, results):
                if t.device != first.device:
                    raise CallError(f"flyship {qualname}: expected all tensors on one device (all real or all "
                                    f"meta), got {first.device} and {t.device} for '{name}'; move them to one "
                                    "device")
                check_out(qualname, name, t, shape, dtype)
            return None
        # In-place inputs are written by the real kernel only: a fake tensor has no data, and the schema's
        # Tensor(a!) tells functionalization to copy the new value back (auto_functionalized).
        made = [first.new_empty(shape, dtype=dtype) for shape, dtype in results]
        if not made:
            return None
        return made[0] if len(made) == 1 else tuple(made)

    fake.__name__ = f"{op.name}_{'out_' if is_out else ''}fake"
    return fake


_INT64 = (-(2**63), 2**63 - 1)


def scalar_value(kind: str, v: Any) -> Any:
    """``v`` as torch's argument parser passes it for a schema type ``kind`` it accepted (:func:`misfit_value`): a
    one-element tensor as its value for a scalar (truncated for an int, as torch does), a Python int as a float
    for a float; anything else as it is."""
    import torch

    if kind in ("bool", "int", "float") and isinstance(v, torch.Tensor):
        v = v.item()
        return bool(v) if kind == "bool" else int(v) if kind == "int" else float(v)
    if kind == "float" and isinstance(v, int) and not isinstance(v, bool):
        return float(v)
    return v


def misfit_value(kind: str, v: Any) -> Optional[str]:
    """What is wrong with ``v`` for a schema type ``kind`` (as torch's argument parser would refuse it), or None."""
    import numbers

    import torch

    if kind == "tensor":
        if not isinstance(v, torch.Tensor):
            return f"a tensor, got {_kind_of(v)}"
        if v.layout != torch.strided or v.is_nested or v.is_quantized:  # no kernel or reference of flyship's takes one
            what = "nested" if v.is_nested else "quantized" if v.is_quantized else str(v.layout).replace("torch.", "")
            return f"a dense tensor (torch.strided), got a {what} tensor of shape {list(v.shape)}"
        return None
    if isinstance(v, torch.Tensor) and v.numel() == 1 and kind in ("bool", "int", "float"):
        return None  # torch's parser takes a one-element tensor for a scalar, as its .item() (scalar_value)
    if kind == "bool":
        return None if isinstance(v, bool) else f"a bool, got {_kind_of(v)}"
    if kind == "int":
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            return f"an int, got {_kind_of(v)}"
        if not _INT64[0] <= int(v) <= _INT64[1]:
            return f"an int in the int64 range [-2**63, 2**63 - 1], got {int(v)}"
        return None
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        return f"a float, got {_kind_of(v)}"
    try:
        float(v)
    except OverflowError:
        return f"a float in the double range, got an int of {int(v).bit_length()} bits"
    return None


def _kind_of(v: Any) -> str:
    """A value's type for a message, without its (possibly huge) contents."""
    import torch

    if isinstance(v, torch.Tensor):
        return f"a tensor of shape {list(v.shape)}"
    if isinstance(v, (tuple, list)):
        return f"a {type(v).__name__} of length {len(v)}"
    if isinstance(v, (str, bytes)):
        return f"{type(v).__name__} {v[:40]!r}"  # quoted: str '2' is not the number 2
    return "None" if v is None else f"{type(v).__name__} {str(v)[:40]}"


def call_misfit(op: _m.Op, args: tuple, kwargs: dict[str, Any],
                outs: tuple[str, ...] | list[str] = ()) -> Optional[str]:
    """Why torch's argument parser refuses a call of the op (``outs``: the out tensors' keyword names for the
    ``.out`` variant, empty for the functional op), as ``expected X, got Y; what to do``; None when the arguments
    fit the schema (then the refusal was about something else, and its own message stands). Run only after torch
    refused a call: it costs nothing on calls that work."""
    names = [a.name for a in op.args]
    keyword_outs = ", *, " + ", ".join(f"{o}=" for o in outs) if outs else ""
    usage = f"{op.name}{'.out' if outs else ''}({', '.join(names)}{keyword_outs})"
    if len(args) > len(names):
        extra = (f"; the out tensors are keyword-only: pass {', '.join(f'{o}=...' for o in outs)}" if outs else
                 "; to write into a tensor you have, call .out(..., out=<tensor>)" if op.outputs else "")
        return (f"expected at most {len(names)} positional arguments ({', '.join(names)}), got {len(args)}"
                f"{extra}; call it as {usage}")
    given = dict(zip(names, args))
    for k, v in kwargs.items():
        if k in given:
            return f"expected {k!r} once, got it both by position and as {k}=; call it as {usage}"
        if k not in names and k not in outs:
            hint = ("; the functional op returns fresh outputs: to write into a tensor you have, call "
                    f".out(..., out=<tensor>)" if k == "out" and not outs and op.outputs else "")
            allowed = names + list(outs)
            return (f"expected keyword arguments among {', '.join(allowed)}, got {k}={_kind_of(v)}{hint}; "
                    f"call it as {usage}")
        given[k] = v
    for a in op.args:
        if a.name not in given:
            if a.kind == "tensor" or a.default is None:
                return f"expected argument {a.name!r}, got none; call it as {usage}"
            continue
        wrong = misfit_value(a.kind, given[a.name])
        if wrong:
            return f"expected {a.name!r} to be {wrong}; pass {_pass_hint(a.kind)}"
    for o in outs:
        if o not in given:
            return f"expected the out tensor {o}=, got none; call it as {usage}"
        wrong = misfit_value("tensor", given[o])
        if wrong:
            return f"expected out tensor {o}= to be {wrong}; pass one preallocated tensor per output"
    return None


def _pass_hint(kind: str) -> str:
    return {"tensor": "a torch.Tensor (a dense one: x.to_dense(), x.dequantize())", "bool": "True or False",
            "int": "a Python int in the int64 range",
            "float": "a Python float (or int)"}[kind]
