"""Patch a Python callable with a bundle's op: inputs that fit a specialization run the op, every other
call runs the original function, and each call is counted by where it went and why.

    import flyship
    ops = flyship.load("artifacts/triton")
    p = flyship.patch("mymodel.layers:RMSNorm.forward", ops.rmsnorm,
                      args={"x": "hidden", "w": "self.weight", "eps": "self.eps"})
    ...
    p.stats()    # {"to_op": 120, "to_original": {"cpu tensors": 8}, ...}
    p.undo()     # or: with flyship.patch(...): ...

"Fits" is the loader's own decision (:meth:`flyship.loader.OpHandle.dispatch`, the C++ guards and
checks a launch runs), made for the device the inputs are on; nothing here re-implements a guard.
Under ``torch.compile`` the wrapper sends every call to the op (the op is a custom op with a fake
kernel, so the model stays one graph); there the op's own ``stats()`` counts launches and fallbacks.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from flyship.errors import ConfigError
from flyship.loader.tools import report as _report  # the patch registry; FLYSHIP_REPORT's summary at exit

_MISSING = object()
# What a torch.compile trace of a patched site gets (Patch.compiled): the op in the graph, or the original traced.
COMPILED_CHOICES = ("op", "original")


# A patch cannot be made (the target does not resolve, or its signature does not match the op's): a ConfigError,
# kept under this exported name (flyship.PatchError) for code that catches it; nothing tells it apart by class.
PatchError = ConfigError


# -- argument sources --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Const:
    """An op input that is always ``value`` (``args={"eps": flyship.Const(1e-6)}``)."""

    value: Any


class Prepared:
    """An op input prepared once from a weight: ``fn(weight)`` is cached per tensor and recomputed when the
    tensor is replaced or updated in place.

    The cache key is the tensor's identity *and* its version counter (``t._version``, which every in-place
    write bumps: ``optimizer.step()``, ``copy_``, ``mul_``), never ``data_ptr()`` alone: an optimizer
    updates a weight without moving it, and a freed tensor's address is soon reused by another.

    Args:
        source: where the weight comes from, as in a patch's ``args`` (``"self.weight"``), or None when
            the object is called directly (``prep(t)``).
        fn: the preparation (a transposed, pre-shuffled or quantized copy); takes a tensor and returns a new
            one (not a view of it: a view would keep the weight, and so its cache entry, alive).

    Example::

        wt = flyship.Prepared("self.weight", lambda w: w.t().contiguous())
        flyship.patch("m:Linear.forward", ops.gemm, args={"a": "x", "b": wt})
    """

    def __init__(self, source: str | None, fn: Callable[[Any], Any]) -> None:
        self.source = source
        self.fn = fn
        self.prepares = 0
        self.hits = 0
        self._cache: dict[int, tuple[weakref.ref, int, Any]] = {}
        self._lock = threading.Lock()

    def __call__(self, t: Any) -> Any:
        import torch

        if torch.compiler.is_compiling():
            return self.fn(t)  # inside a graph the preparation is part of the graph
        key = id(t)
        with self._lock:
            entry = self._cache.get(key)
            if entry is not None and entry[0]() is t and entry[1] == t._version:
                self.hits += 1
                return entry[2]
        with torch.no_grad():
            prepared = self.fn(t)
        with self._lock:
            if entry is None or entry[0]() is not t:
                weakref.finalize(t, self._cache.pop, key, None)  # drop the copy with the weight
            self._cache[key] = (weakref.ref(t), t._version, prepared)
            self.prepares += 1
        return prepared

    def __repr__(self) -> str:
        return f"Prepared({self.source!r}, {getattr(self.fn, '__name__', self.fn)!r})"


Source = Any  # str (a parameter or a dotted attribute path of one), Const, Prepared, or a callable(bound) -> value


def _param_of(source: tuple[str, Any]) -> str | None:
    """The original's parameter a source reads, or None (constants, defaults, callables)."""
    kind, v = source
    if kind == "param":
        return v
    if kind == "attr":
        return v[0]
    return _param_of(v[1]) if kind == "prepared" else None


# -- the target -------------------------------------------------------------------------------------------


def _resolve(target: str) -> tuple[Any, str, Any]:
    """``"pkg.module:Class.method"`` -> (owner object, attribute name, the raw attribute as stored)."""
    module_name, sep, qual = target.partition(":")
    if not sep or not module_name or not qual:
        raise PatchError(f"patch {target!r}: expected 'package.module:Name' or 'package.module:Class.method', "
                         f"got {target!r}")
    try:
        owner: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise PatchError(f"patch {target!r}: cannot import {module_name!r}: {e}") from e
    except Exception as e:  # the module's own code failed at import: its error, named, with its traceback chained
        raise PatchError(f"patch {target!r}: expected {module_name!r} to import, got {type(e).__name__} raised by "
                         f"its code: {str(e)[:200]}; fix the module (import it alone to see the traceback) or patch "
                         "another target") from e
    parts = qual.split(".")
    for part in parts[:-1]:
        try:
            owner = getattr(owner, part)
        except AttributeError:
            raise PatchError(f"patch {target!r}: {owner!r} has no attribute {part!r}") from None
        except Exception as e:  # a property or module __getattr__ that raises
            raise PatchError(f"patch {target!r}: reading {part!r} of {owner!r} raised {type(e).__name__}: "
                             f"{str(e)[:200]}; patch another target") from e
    name = parts[-1]
    raw = _MISSING
    for klass in (owner.__mro__ if isinstance(owner, type) else ()):
        if name in vars(klass):
            raw = vars(klass)[name]
            break
    if raw is _MISSING:
        raw = getattr(owner, name, _MISSING)
    if raw is _MISSING:
        raise PatchError(f"patch {target!r}: {owner!r} has no attribute {name!r}")
    return owner, name, raw


@dataclasses.dataclass(frozen=True)
class _Param:
    name: str
    kind: Any
    default: Any


class _Signature:
    """The original's signature, prepared once so that binding a call is a few dict operations (also
    traceable by torch.compile)."""

    def __init__(self, fn: Callable[..., Any], target: str) -> None:
        P = inspect.Parameter
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError) as e:
            raise PatchError(f"patch {target!r}: cannot read the signature of {fn!r}: {e}; patch a Python "
                             "function") from e
        self.params = [_Param(p.name, p.kind, p.default) for p in sig.parameters.values()]
        self.names = [p.name for p in self.params if p.kind not in (P.VAR_POSITIONAL, P.VAR_KEYWORD)]
        self.positional = [p.name for p in self.params if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)]
        self.name_set = set(self.names)
        self.defaults = {p.name: p.default for p in self.params if p.name in self.names and p.default is not P.empty}

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | None:
        """The call's arguments by name, defaults filled in; None when they do not bind or go to ``*args`` /
        ``**kwargs`` (the original then gets the call and says what is wrong)."""
        if len(args) > len(self.positional):
            return None
        bound = dict(zip(self.positional, args))
        for k, v in kwargs.items():
            if k in bound or k not in self.name_set:
                return None
            bound[k] = v
        if len(bound) < len(self.names):
            for k, v in self.defaults.items():
                bound.setdefault(k, v)
            if len(bound) < len(self.names):
                return None  # a required parameter is missing
        return bound


# -- the patch --------------------------------------------------------------------------------------------



class Patch:
    """One patched call site. Made by :func:`patch`; a context manager (``with flyship.patch(...):``).

    Attributes:
        target: the patched site, ``"pkg.module:Class.method"``.
        op: the op calls are routed to.
        active: whether the site is patched now.
    """

    def __init__(self, target: str, op: Any, *, args: Mapping[str, Source] | None = None,
                 inplace: str | None = None, result: Callable[[Any, dict], Any] | None = None,
                 ignore: Sequence[str] = (), cpu_target: str | None = None, compiled: str = "op") -> None:
        self.target = target
        self.op = op
        self.cpu_target = cpu_target
        if compiled not in COMPILED_CHOICES:
            raise PatchError(f"patch {target!r}: compiled= expected one of {', '.join(map(repr, COMPILED_CHOICES))}, "
                             f"got {compiled!r}")
        self.compiled = compiled
        self._owner, self._name, self._raw = _resolve(target)
        self._kind = ("staticmethod" if isinstance(self._raw, staticmethod) else
                      "classmethod" if isinstance(self._raw, classmethod) else "function")
        self.original = self._raw.__func__ if self._kind != "function" else self._raw
        if not callable(self.original):
            raise PatchError(f"patch {target!r}: expected a function, got a {type(self.original).__name__}")
        self._sig = _Signature(self.original, target)
        self._params = self._sig.params
        self._sources = self._match(dict(args or {}), set(ignore), inplace)
        self._inplace = inplace
        self._result = result
        self._had_own = isinstance(self._owner, type) and self._name in vars(self._owner) or \
            not isinstance(self._owner, type)
        self._lock = threading.Lock()
        self._to_op = 0
        self._to_original: dict[str, int] = {}
        self._targets: dict[int, str] = {}
        self._decide = op._ops._core.decide
        self.active = False
        self._wrapper = self._make_wrapper()

    # -- matching the signatures, once -------------------------------------------------------------------

    def _match(self, args: dict[str, Source], ignore: set[str], inplace: str | None) -> list[tuple[str, Any]]:
        """Per op input, in schema order: ("param", name) / ("attr", (name, path)) / ("const", v) /
        ("prepared", (Prepared, resolved source)) / ("call", fn) / ("default", None)."""
        P = inspect.Parameter
        names = [p.name for p in self._params]
        op_args = list(self.op.manifest.args)
        op_names = [a.name for a in op_args]
        unknown = sorted(set(args) - set(op_names))
        if unknown:
            raise PatchError(f"patch {self.target!r} with {self.op.qualname}: args= names {', '.join(unknown)}, which "
                             f"the op does not have; its inputs are {', '.join(op_names)}")
        for extra in sorted(ignore | ({inplace} if inplace else set())):
            if extra not in names:
                raise PatchError(f"patch {self.target!r}: '{extra}' is not a parameter of the original "
                                 f"({', '.join(names)})")

        sources: list[tuple[str, Any]] = []
        missing = []
        for a in op_args:
            if a.name in args:
                sources.append(self._source(args[a.name], a.name, names))
            elif a.name in names:
                sources.append(("param", a.name))
            elif a.kind != "tensor" and a.default is not None:
                sources.append(("default", a.default))
            else:
                missing.append(a.name)
        if missing:
            raise PatchError(f"patch {self.target!r} with {self.op.qualname}: the op's inputs {', '.join(missing)} "
                             f"have no source among the original's parameters ({', '.join(names)}); map them with "
                             f"args={{'{missing[0]}': '<parameter>' or '<parameter>.<attribute>'}}")
        used = {_param_of(s) for s in sources} | ignore | ({inplace} if inplace else set())
        first_is_self = self._kind in ("function", "classmethod") and isinstance(self._owner, type)
        self._free = []  # unused parameters with defaults: a call that sets them goes to the original
        unused_required = []
        for i, p in enumerate(self._params):
            if p.name in used or (i == 0 and first_is_self) or p.kind in (P.VAR_POSITIONAL, P.VAR_KEYWORD):
                continue
            if p.default is P.empty:
                unused_required.append(p.name)
            else:
                self._free.append(p)
        if unused_required and not any(s[0] == "call" for s in sources):
            raise PatchError(f"patch {self.target!r} with {self.op.qualname}: the original's parameters "
                             f"{', '.join(unused_required)} feed no op input ({', '.join(op_names)}), so the op would "
                             "ignore them; map them with args=, or list them in ignore= if they do not change the "
                             "result")
        return sources

    def _source(self, src: Any, for_arg: str, names: list[str]) -> tuple[str, Any]:
        """One ``args=`` value as a source: ("param", name) / ("attr", (name, path)) / ("const", v) /
        ("prepared", (Prepared, source)) / ("call", fn)."""
        if isinstance(src, str):
            head, _, path = src.partition(".")
            if head not in names:
                raise PatchError(f"patch {self.target!r} with {self.op.qualname}: the source {src!r} of op input "
                                 f"'{for_arg}' names no parameter of the original; its parameters are "
                                 f"{', '.join(names)}")
            return ("attr", (head, path.split("."))) if path else ("param", head)
        if isinstance(src, Const):
            return "const", src.value
        if isinstance(src, Prepared):
            if src.source is None:
                raise PatchError(f"patch {self.target!r}: Prepared for op input '{for_arg}' needs a source "
                                 "(Prepared('self.weight', fn))")
            return "prepared", (src, self._source(src.source, for_arg, names))
        if callable(src):
            return "call", src
        return "const", src

    # -- routing ---------------------------------------------------------------------------------------

    def _value(self, src: tuple[str, Any], bound: dict[str, Any]) -> Any:
        kind, v = src
        if kind == "param":
            return bound[v]
        if kind == "attr":
            obj = bound[v[0]]
            for part in v[1]:
                obj = getattr(obj, part)
            return obj
        if kind in ("const", "default"):
            return v
        if kind == "prepared":
            return v[0](self._value(v[1], bound))
        return v(bound)

    def _finish(self, out: Any, bound: dict[str, Any]) -> Any:
        if self._inplace is not None:
            dest = bound[self._inplace]
            dest.copy_(out)
            out = dest
        return out if self._result is None else self._result(out, bound)

    def _device_target(self, index: int) -> str | None:
        """The target the decision is made for: GPU ``index``'s (asked once), or ``cpu_target`` (index -1)."""
        if index < 0:
            return self.cpu_target
        target = self._targets.get(index)
        if target is None:
            target = self._targets[index] = self.op._ops.device_target(index)
        return target

    def route(self, bound: dict[str, Any] | None) -> tuple[list[Any] | None, str]:
        """Where a call goes: (the op's inputs, "") when a specialization fits, else (None, the reason)."""
        import torch

        if bound is None:
            return None, "arguments do not bind to the signature"
        for p in self._free:
            v = bound[p.name]
            if v is not p.default and not (isinstance(v, (int, float, str, bool, type(None))) and v == p.default):
                return None, f"argument '{p.name}' set"
        try:
            values = [self._value(s, bound) for s in self._sources]
        except AttributeError as e:
            return None, f"argument source: {e}"
        devices = {v.get_device() for v in values if isinstance(v, torch.Tensor)}  # -1: CPU
        if len(devices) != 1:
            return None, "tensors on several devices" if devices else "no tensor inputs"
        target = self._device_target(devices.pop())
        if target is None:
            return None, "cpu tensors"
        try:  # OpHandle.dispatch's decision, called directly: the values are already in schema order
            spec, _, reason = self._decide(self.op._index, target, values, False)
        except (RuntimeError, TypeError, ValueError) as e:
            msg = str(e).splitlines()[0]
            return None, msg.split(": ", 1)[1] if msg.startswith("flyship ") and ": " in msg else msg
        return (values, "") if spec >= 0 else (None, reason)

    def _make_wrapper(self) -> Callable[..., Any]:
        import functools

        import torch

        original, sig, op_default = self.original, self._sig, self.op.default

        @functools.wraps(original)
        def flyship_patched(*args: Any, **kwargs: Any) -> Any:
            if not self.active:
                return original(*args, **kwargs)
            if torch.compiler.is_compiling():
                # One graph: the custom op (with its fake kernel) goes in; its guards run at call time. With
                # compiled="original" the compiler traces the original instead and fuses it with its neighbours.
                bound = sig.bind(args, kwargs) if self.compiled == "op" else None
                if bound is None:
                    return original(*args, **kwargs)
                return self._finish(op_default(*[self._value(s, bound) for s in self._sources]), bound)
            bound = sig.bind(args, kwargs)
            values, reason = self.route(bound)
            if values is None:
                with self._lock:
                    self._to_original[reason] = self._to_original.get(reason, 0) + 1
                return original(*args, **kwargs)
            with self._lock:
                self._to_op += 1
            return self._finish(op_default(*values), bound)

        flyship_patched.__flyship_patch__ = self  # type: ignore[attr-defined]
        return flyship_patched

    # -- apply / undo ------------------------------------------------------------------------------------

    def apply(self) -> Patch:
        """Install the wrapper at the target (a no-op when active)."""
        if self.active:
            return self
        current = getattr(self._owner, self._name, None)
        if getattr(current, "__flyship_patch__", None) is not None and current.__flyship_patch__ is not self:
            raise PatchError(f"patch {self.target!r}: already patched with {current.__flyship_patch__.op.qualname}; "
                             "undo that patch first")
        wrapper: Any = self._wrapper
        if self._kind == "staticmethod":
            wrapper = staticmethod(wrapper)
        elif self._kind == "classmethod":
            wrapper = classmethod(wrapper)
        setattr(self._owner, self._name, wrapper)
        self.active = True
        _report.register(self)
        return self

    def undo(self) -> None:
        """Put the original back (a no-op when not active); counters are kept."""
        if not self.active:
            return
        if self._had_own:
            setattr(self._owner, self._name, self._raw)
        else:
            delattr(self._owner, self._name)
        self.active = False

    def __enter__(self) -> Patch:
        return self.apply()

    def __exit__(self, *exc: object) -> None:
        self.undo()

    def stats(self) -> dict[str, Any]:
        """This site's routing in this process: ``{"target", "op", "active", "to_op", "to_original": {reason:
        n}}``; calls traced by ``torch.compile`` are counted by the op's own ``stats()`` instead."""
        with self._lock:
            return {"target": self.target, "op": self.op.qualname, "active": self.active, "to_op": self._to_op,
                    "to_original": dict(self._to_original)}

    def reset_stats(self) -> None:
        with self._lock:
            self._to_op = 0
            self._to_original.clear()

    def __repr__(self) -> str:
        return f"<flyship patch {self.target} -> {self.op.qualname} ({'active' if self.active else 'undone'})>"


def patch(target: str, op: Any, *, args: Mapping[str, Source] | None = None, inplace: str | None = None,
          result: Callable[[Any, dict], Any] | None = None, ignore: Sequence[str] = (),
          cpu_target: str | None = None, compiled: str = "op") -> Patch:
    """Replace the callable at ``target`` so that calls whose inputs fit one of ``op``'s specializations run
    ``op`` and all others call the original, each counted by reason (:meth:`Patch.stats`).

    Args:
        target: ``"package.module:function"`` or ``"package.module:Class.method"`` (static and class
            methods too). Code that copied the function before the patch (``from m import f``) keeps the
            original: patch before that import, or use ``flyship hook`` to patch at first import.
        op: an op of a loaded bundle (``ops.rmsnorm``).
        args: op input -> source: a parameter name of the original (``"hidden"``), an attribute path from
            one (``"self.eps"``), :class:`Const`, :class:`Prepared`, or a callable taking the bound arguments
            (a dict) and returning the value. Op inputs not mapped take the same-named parameter, else
            the op's default. A callable's reads are not known: list the parameters with defaults it
            reads in ``ignore=`` (else setting them sends the call to the original).
        inplace: the original writes its result into this parameter (and returns it): the op's output is
            copied into it.
        result: turns the op's output into what the original returns, ``result(out, bound)`` (e.g. a view
            with the caller's leading dimensions).
        ignore: parameters of the original the op does not need and whose value does not change the result.
            Other unmapped parameters with defaults send a call to the original when set.
        cpu_target: decide calls on CPU tensors as a device of this target would (tests, CPU-only CI: the op
            then runs its reference on the CPU); by default CPU calls go to the original.
        compiled: what a ``torch.compile`` trace of the site gets: ``"op"`` (default) puts the op into the graph;
            ``"original"`` traces the original, so the compiler fuses it with its neighbours, while eager calls
            still run the op: for a site the routing report shows ``FUSION LOST`` under compile.

    Returns:
        The active :class:`Patch`; ``.undo()`` or leave its ``with`` block to restore the original.

    Raises:
        PatchError: the target does not resolve, or an op input has no source, or a required parameter of
            the original feeds no op input (the message names them).

    Example::

        with flyship.patch("mymodel:RMSNorm.forward", ops.rmsnorm, args={"w": "self.weight", "eps": "self.eps"}):
            model(x)
    """
    return Patch(target, op, args=args, inplace=inplace, result=result, ignore=ignore, cpu_target=cpu_target,
                 compiled=compiled).apply()


def patches() -> list[Patch]:
    """Every patch made in this process (active or undone), in the order they were applied."""
    return _report.patches()
