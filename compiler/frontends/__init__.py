"""Frontends: the registry, keyed by name. The protocol and the common tail are in :mod:`.base`.

Each frontend is a package beside this file whose ``__init__`` calls :func:`register` with an instance of
its :class:`~flyship.compiler.frontends.base.Frontend`. Adding a frontend = its own folder + one line in
:data:`FRONTEND_MODULES`. A frontend registered from any other module (a plugin, a test) works the same way:
:func:`origin` names the module that defines it, and each build worker imports that module before it
imports the spec file.
"""

from __future__ import annotations

import importlib
from typing import Any

from flyship.compiler.frontends.base import (
    BuildContext,
    CompiledVariant,
    Frontend,
    FrontendError,
    KernelBuild,
    WorkerSetup,
)
from flyship.compiler.frontends.tail import compile_variant, finish

__all__ = ["BuildContext", "CompiledVariant", "Frontend", "FrontendError", "KernelBuild", "WorkerSetup",
           "compile_variant", "detect", "finish", "get", "names", "origin", "register",
           "registered"]

# The modules that register a frontend when imported, in the order declarations are matched against them.
# Importing them imports no DSL (frontends import theirs lazily), so every name below is always available.
FRONTEND_MODULES = (
    "flyship.compiler.frontends.flydsl",
    "flyship.compiler.frontends.triton",
)

_REGISTRY: dict[str, Frontend] = {}


def register(fe: Frontend) -> Frontend:
    """Add a frontend under ``fe.name`` (called by the frontend's own package on import).

    Raises:
        FrontendError: another frontend already holds that name.
    """
    held = _REGISTRY.get(fe.name)
    if held is not None and type(held) is not type(fe):
        raise FrontendError(f"frontend registry: expected one frontend named {fe.name!r}, got "
                            f"{type(held).__qualname__} and {type(fe).__qualname__}")
    _REGISTRY[fe.name] = fe
    return fe


def _registry() -> dict[str, Frontend]:
    for m in FRONTEND_MODULES:
        importlib.import_module(m)
    return _REGISTRY


def origin(name: str) -> str:
    """The module that defines the frontend registered as ``name``: importing it registers the frontend (a
    worker process does, before it imports the spec file).

    Raises:
        FrontendError: no such frontend; the message lists the registered ones.
    """
    return type(get(name)).__module__


def registered() -> list[Frontend]:
    """The registered frontends, in matching order."""
    return list(_registry().values())


def names() -> list[str]:
    """The registered frontends' names, in matching order."""
    return list(_registry())


def get(name: str) -> Frontend:
    """The frontend registered as ``name``.

    Raises:
        FrontendError: no such frontend; the message lists the registered ones.
    """
    reg = _registry()
    if name not in reg:
        raise FrontendError(f"frontend: expected one of {', '.join(repr(n) for n in reg)}, got {name!r}")
    return reg[name]


def detect(kernel: Any) -> Frontend | None:
    """The frontend whose DSL made ``kernel`` (an op declaration's ``kernel=``), or None."""
    return next((fe for fe in _registry().values() if fe.accepts(kernel)), None)
