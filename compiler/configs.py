"""The data of a config space, shared by the spec API, the frontends and :mod:`flyship.compiler.tuning`.

A leaf: it imports nothing of the compile stage, so the spec API (which declares ``configs=[Config(...)]``)
and every frontend (which reads its DSL's own config objects into a :class:`Config`) can use it without
importing each other.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, NamedTuple, Optional

from flyship.errors import SpecError


@dataclasses.dataclass(frozen=True)
class Config:
    """One point of a config space: keyword -> value (constexprs and compile options alike).

    Args:
        name: short name used in specialization names (default: built from the values).
        **values: ``BLOCK_M=64, num_warps=4, ...``.
    """

    values: dict[str, Any]
    name: Optional[str] = None

    def __init__(self, name: Optional[str] = None, **values: Any) -> None:
        object.__setattr__(self, "values", dict(values))
        object.__setattr__(self, "name", name)

    def label(self) -> str:
        if self.name:
            return self.name
        short = {"num_warps": "w", "num_stages": "s", "waves_per_eu": "wpe"}
        parts = [f"{short.get(k, k.removeprefix('BLOCK_'))}{v}" for k, v in self.values.items()]
        return re.sub(r"[^A-Za-z0-9_]", "_", "_".join(parts)) or "default"


@dataclasses.dataclass(frozen=True)
class ConfigSpace:
    """What an op's config space expanded into: spec name -> (base spec name, config), the key, the
    user's prune function and the objects it is given (the DSL's own Config objects when read from an
    autotuned kernel, else :class:`Config`)."""

    key: tuple[str, ...]
    configs: dict[str, tuple[str, Config, Any]]
    prune: Optional[Callable[..., Any]] = None


class Autotuned(NamedTuple):
    """What a frontend reads from its DSL's autotuned kernel (:meth:`Frontend.read_autotuner`).

    Attributes:
        kernel: the bare kernel under the autotuner.
        configs: [(Config, the DSL's own config object)], or None when the autotuner's configs are a function of
            the call's arguments (``op(configs=...)`` must then give them).
        key: the autotuner's key argument names.
        prune: its prune function, or None.
    """

    kernel: Any
    configs: Optional[list[tuple[Config, Any]]]
    key: list[str]
    prune: Optional[Callable[..., Any]]


def kernel_name(fn: Any) -> str:
    """A kernel's name for messages: its function's ``__name__`` (a ``triton.jit`` kernel carries it, a FlyDSL
    ``JitFunction`` wraps the function as ``.func``, an autotuner as ``.fn``), else its repr."""
    for _ in range(4):
        name = getattr(fn, "__name__", None) or getattr(fn, "__qualname__", None)
        if isinstance(name, str):
            return name
        inner = getattr(fn, "func", None) or getattr(fn, "fn", None)
        if inner is None or inner is fn:
            break
        fn = inner
    return repr(fn)


def is_native(obj: Any, class_name: str, packages: tuple[str, ...]) -> bool:
    """Whether ``obj`` is an instance of a class named ``class_name`` defined under one of ``packages`` (a DSL's
    ``Autotuner`` or ``Config``, recognised without importing the DSL)."""
    mod = type(obj).__module__ or ""
    return type(obj).__name__ == class_name and mod.split(".")[0] in packages


def native_pairs(autotuner: Any, read: Callable[[Any], Optional[Config]],
                 dsl: str) -> Optional[list[tuple[Config, Any]]]:
    """An autotuner's ``configs`` as [(Config, the DSL's object)], each read by the frontend's ``read``; None when
    they are a function of the call's arguments.

    Raises:
        SpecError: a config that is not one of the DSL's ``Config`` objects.
    """
    if callable(autotuner.configs) and not isinstance(autotuner.configs, (list, tuple)):
        return None
    out = []
    for c in autotuner.configs:
        cfg = read(c)
        if cfg is None:
            raise SpecError(f"autotuned kernel {kernel_name(autotuner.fn)}: expected its configs to be "
                            f"{dsl}.Config objects, got {type(c).__name__}")
        out.append((cfg, c))
    return out


def refuse_pre_hook(c: Any) -> None:
    """flyship launches from C++ and runs no Python hook per launch: a DSL config with a ``pre_hook`` is refused.

    Raises:
        SpecError: naming the config and what to do instead.
    """
    if getattr(c, "pre_hook", None) is not None:
        raise SpecError(f"config {c}: expected no pre_hook, got {c.pre_hook!r}; flyship launches the kernel from C++ "
                        "and runs no Python hook before it: drop the hook (zero an output with Output(zero=True))")
