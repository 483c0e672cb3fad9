"""``@frozen``: a frozen dataclass without ``dataclasses``' cost at import.

``@dataclasses.dataclass(frozen=True)`` writes each method as source text and compiles it with ``exec`` when the
class is defined (Python 3.11: six methods per class, about 0.5 ms a class here); the manifest model alone has 18
classes, so a fresh process paid 15-20 ms for it before its first load read a byte (docs/perf.md, "The first load
cut to its parts"). ``@frozen`` makes the same class (a real dataclass: ``dataclasses.fields``, ``asdict``,
``replace``, ``is_dataclass`` and ``__match_args__`` work on it; equality, hash, repr and the frozen refusal are
those of ``dataclass(frozen=True)``) with its methods built as plain closures over the field names, and
``__init__``, the one method worth compiling (it runs per object), compiled on first use: a class never
instantiated in a process never pays for it.

Supported: fields with a default or ``dataclasses.field(default=..., default_factory=..., repr=..., compare=...,
hash=..., metadata=...)``, inheritance from other frozen dataclasses, ``__post_init__``, a method the class writes
itself (kept, as ``dataclass`` keeps it). Refused with a TypeError naming the class and the field: ``ClassVar``,
``InitVar`` and ``KW_ONLY`` annotations, ``field(init=False)`` and ``field(kw_only=True)`` (use
``@dataclasses.dataclass(frozen=True)`` for such a class).
"""

from __future__ import annotations

import dataclasses
import operator
import threading
from typing import Any, Callable, TypeVar

T = TypeVar("T")

_FIELD = dataclasses._FIELD  # what dataclasses.fields() keeps (not a ClassVar or InitVar pseudo-field)
_HAS_FACTORY = dataclasses._HAS_DEFAULT_FACTORY  # __init__'s default for a default_factory field (repr: <factory>)
_PSEUDO = {"ClassVar": "a ClassVar annotation", "InitVar": "an InitVar annotation", "KW_ONLY": "a KW_ONLY marker"}


def _params() -> Any:
    """``__dataclass_params__`` of a frozen, eq, non-ordered dataclass (3.10-3.11 take six flags, 3.12+ ten)."""
    try:
        return dataclasses._DataclassParams(True, True, True, False, False, True)
    except TypeError:
        return dataclasses._DataclassParams(True, True, True, False, False, True, True, False, False, False)


_PARAMS = _params()


def _refusal(cls: type, name: str, what: str) -> TypeError:
    return TypeError(f"@frozen class {cls.__qualname__}, field {name!r}: expected a plain field (a default or "
                     f"dataclasses.field(default=/default_factory=)), found {what}; declare this class with "
                     "@dataclasses.dataclass(frozen=True) instead")


def _pseudo_kind(annotation: Any) -> str | None:
    """Which pseudo-field an annotation declares (ClassVar, InitVar, KW_ONLY), as words, or None. A string
    annotation (``from __future__ import annotations``) is read as ``dataclasses`` reads it: by its leading name."""
    if isinstance(annotation, str):
        head = annotation.strip().split("[", 1)[0].rsplit(".", 1)[-1].strip()
        return _PSEUDO.get(head)
    if annotation is dataclasses.KW_ONLY:
        return _PSEUDO["KW_ONLY"]
    if annotation is dataclasses.InitVar or isinstance(annotation, dataclasses.InitVar):
        return _PSEUDO["InitVar"]
    import typing

    if annotation is typing.ClassVar or typing.get_origin(annotation) is typing.ClassVar:
        return _PSEUDO["ClassVar"]
    return None


def _own_field(cls: type, name: str, annotation: Any) -> dataclasses.Field:
    """The Field of one annotated name of ``cls`` (its class attribute, if any, becomes the default)."""
    what = _pseudo_kind(annotation)
    if what is not None:
        raise _refusal(cls, name, what)
    default = cls.__dict__.get(name, dataclasses.MISSING)
    if isinstance(default, dataclasses.Field):
        f = default
        if not f.init:
            raise _refusal(cls, name, "dataclasses.field(init=False)")
        if f.kw_only is True:
            raise _refusal(cls, name, "dataclasses.field(kw_only=True)")
        if f.default is dataclasses.MISSING:
            delattr(cls, name)
        else:
            setattr(cls, name, f.default)
    else:
        f = dataclasses.field(default=default)
    if f.default is not dataclasses.MISSING and type(f.default).__hash__ is None:  # dataclasses' own rule
        raise ValueError(f"mutable default {type(f.default)} for field {name} is not allowed: use default_factory")
    f.name, f.type, f._field_type = name, annotation, _FIELD
    f.kw_only = False  # as dataclasses leaves a positional field
    return f


def _collect(cls: type) -> dict[str, dataclasses.Field]:
    """Every field of ``cls``: its dataclass bases' first (in MRO order, as ``dataclasses`` does), then its own."""
    fields: dict[str, dataclasses.Field] = {}
    for base in cls.__mro__[-1:0:-1]:
        fields.update(getattr(base, "__dataclass_fields__", None) or {})
    for name, annotation in cls.__dict__.get("__annotations__", {}).items():
        fields[name] = _own_field(cls, name, annotation)
    seen_default = None
    for f in fields.values():
        has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        if seen_default and not has_default:
            raise TypeError(f"non-default argument {f.name!r} follows default argument")
        seen_default = seen_default or has_default
    return fields


def _getter(names: tuple[str, ...]) -> Callable[[Any], tuple]:
    """``obj -> (obj.a, obj.b, ...)``, always a tuple (what dataclasses compares and hashes)."""
    if len(names) > 1:
        return operator.attrgetter(*names)
    if names:
        one = names[0]
        return lambda obj: (getattr(obj, one),)
    return lambda obj: ()


_repr_running: set[tuple[int, int]] = set()  # (id, thread) of the reprs in progress: a cycle prints "..."


def _methods(cls: type, fields: dict[str, dataclasses.Field]) -> dict[str, Any]:
    """``__repr__``, ``__eq__``, ``__hash__``, ``__setattr__`` and ``__delattr__`` as closures."""
    shown = tuple(f.name for f in fields.values() if f.repr)
    compared = _getter(tuple(f.name for f in fields.values() if f.compare))
    hashed = _getter(tuple(f.name for f in fields.values() if (f.compare if f.hash is None else f.hash)))
    names = frozenset(fields)

    def __repr__(self: Any) -> str:
        key = (id(self), threading.get_ident())
        if key in _repr_running:
            return "..."
        _repr_running.add(key)
        try:
            return f"{type(self).__qualname__}({', '.join(f'{n}={getattr(self, n)!r}' for n in shown)})"
        finally:
            _repr_running.discard(key)

    def __eq__(self: Any, other: Any) -> Any:
        if other.__class__ is self.__class__:
            return compared(self) == compared(other)
        return NotImplemented

    def __hash__(self: Any) -> int:
        return hash(hashed(self))

    def __setattr__(self: Any, name: str, value: Any) -> None:
        if type(self) is cls or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
        super(cls, self).__setattr__(name, value)

    def __delattr__(self: Any, name: str) -> None:
        if type(self) is cls or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")
        super(cls, self).__delattr__(name)

    out = {"__repr__": __repr__, "__eq__": __eq__, "__hash__": __hash__, "__setattr__": __setattr__,
           "__delattr__": __delattr__}
    for f in out.values():
        f.__qualname__ = f"{cls.__qualname__}.{f.__name__}"
    return out


def _make_init(cls: type) -> Callable[..., None]:
    """Compile ``cls.__init__`` (as ``dataclasses`` writes it: one positional-or-keyword parameter per field, a
    default_factory called per object, ``__post_init__`` last)."""
    fields = tuple(f for f in cls.__dataclass_fields__.values() if f._field_type is _FIELD)
    env: dict[str, Any] = {"_set": object.__setattr__, "_HAS_FACTORY": _HAS_FACTORY}
    params, body = [], []
    for k, f in enumerate(fields):
        if f.default_factory is not dataclasses.MISSING:
            env[f"_factory{k}"] = f.default_factory
            params.append(f"{f.name}=_HAS_FACTORY")
            body.append(f"_set(self, {f.name!r}, _factory{k}() if {f.name} is _HAS_FACTORY else {f.name})")
        else:
            if f.default is not dataclasses.MISSING:
                env[f"_default{k}"] = f.default
            params.append(f.name if f.default is dataclasses.MISSING else f"{f.name}=_default{k}")
            body.append(f"_set(self, {f.name!r}, {f.name})")
    if hasattr(cls, "__post_init__"):
        body.append("self.__post_init__()")
    source = f"def __init__(self, {', '.join(params)}):\n    " + "\n    ".join(body or ["pass"]) + "\n"
    exec(source, env)  # noqa: S102 - our own text, built from identifiers (the field names)
    init = env["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__annotations__ = {**{f.name: f.type for f in fields}, "return": None}
    return init


class _LazyInit:
    """The class's ``__init__`` until first used: the first lookup (an instantiation, ``inspect.signature``)
    compiles the real one and puts it on the class in its place."""

    __slots__ = ("cls",)

    def __init__(self, cls: type) -> None:
        self.cls = cls

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        init = _make_init(self.cls)
        if self.cls.__dict__.get("__init__") is self:  # another thread may have got there first: either is right
            type.__setattr__(self.cls, "__init__", init)
        return init if obj is None else init.__get__(obj, owner)


def frozen(cls: type[T]) -> type[T]:
    """Make ``cls`` a frozen dataclass (equal to ``@dataclasses.dataclass(frozen=True)`` for the fields it supports;
    module docstring).

    Raises:
        TypeError: a ClassVar, InitVar or KW_ONLY annotation, ``field(init=False)`` or ``field(kw_only=True)``
            (naming the class and the field), a field without a default after one with a default, or a class that
            writes its own ``__setattr__`` / ``__delattr__`` (a frozen dataclass owns those).
        ValueError: a mutable default (a list, dict or set; use ``default_factory``).

    Example::

        @frozen
        class Point:
            x: int
            y: int = 0

        assert Point(1) == Point(1, 0) and dataclasses.fields(Point)[1].default == 0
    """
    fields = _collect(cls)
    for name in ("__setattr__", "__delattr__"):
        if name in cls.__dict__:
            raise TypeError(f"Cannot overwrite attribute {name} in class {cls.__name__}")
    type.__setattr__(cls, "__dataclass_fields__", fields)
    type.__setattr__(cls, "__dataclass_params__", _PARAMS)
    methods = _methods(cls, fields)
    if "__eq__" in cls.__dict__:  # dataclass keeps a class's own __eq__; its __hash__ rule then reads the class
        del methods["__eq__"]
    explicit_hash = cls.__dict__.get("__hash__", dataclasses.MISSING)
    if not (explicit_hash is dataclasses.MISSING or (explicit_hash is None and "__eq__" in cls.__dict__)):
        del methods["__hash__"]  # the class wrote its own __hash__: dataclass(frozen=True) keeps it
    if "__repr__" in cls.__dict__:
        del methods["__repr__"]
    if "__init__" not in cls.__dict__:
        methods["__init__"] = _LazyInit(cls)
    if "__match_args__" not in cls.__dict__:
        methods["__match_args__"] = tuple(fields)
    if hasattr(dataclasses, "_replace"):  # Python 3.13's copy.replace()
        methods["__replace__"] = dataclasses._replace
    for name, value in methods.items():
        type.__setattr__(cls, name, value)
    return cls
