"""The PyTorch references of a bundle's ops: the fallback when no specialization fits, and the
yardstick of verification.

A bundle may carry ``references.py`` (it imports torch only); each op's manifest ``reference`` names a
function in it. ``load(..., references={"add": fn})`` replaces or adds references.
"""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Mapping, Optional

from flyship.bundle import manifest as _m
from flyship.bundle.errors import BundleError


def import_references(root: Path, manifest: _m.Manifest) -> Optional[ModuleType]:
    """Import the bundle's references module, or None when the manifest names none.

    Raises:
        BundleError: the file is missing or raises on import.
    """
    if not manifest.references:
        return None
    path = root / manifest.references
    if not path.is_file():
        raise BundleError(f"load bundle {root}: the manifest names references {manifest.references!r}, found no file "
                          f"at {path}; re-copy the bundle")
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
    name = f"flyship_references_{manifest.namespace}_{digest}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise BundleError(f"load bundle {root}: cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - any error in user code is reported with its file
        raise BundleError(f"load bundle {root}: importing {path} raised {type(e).__name__}: {e}") from e
    return module


def resolve(root: Path, manifest: _m.Manifest,
            overrides: Optional[Mapping[str, Callable[..., Any]]] = None) -> list[Optional[Callable[..., Any]]]:
    """One reference callable (or None) per op, in manifest order.

    Raises:
        BundleError: a named function is missing, an override names an unknown op or is not callable.
    """
    overrides = dict(overrides or {})
    names = [op.name for op in manifest.ops]
    unknown = sorted(set(overrides) - set(names))
    if unknown:
        raise BundleError(f"load bundle {root}: references={{...}} names ops {unknown} the bundle does not have; "
                          f"its ops are {', '.join(names)}")
    module = None
    out: list[Optional[Callable[..., Any]]] = []
    for op in manifest.ops:
        if op.name in overrides:
            fn = overrides[op.name]
            if not callable(fn):
                raise BundleError(f"load bundle {root}: the reference given for {op.name} is a {type(fn).__name__}, "
                                  "expected a callable")
            out.append(fn)
            continue
        if op.reference is None:
            out.append(None)
            continue
        if module is None:
            module = import_references(root, manifest)
        if module is None:
            raise BundleError(f"load bundle {root}: op {op.name} names reference {op.reference!r} but the manifest "
                              "names no references file")
        fn = getattr(module, op.reference, None)
        if not callable(fn):
            defined = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
            raise BundleError(f"load bundle {root}: {manifest.references} has no function {op.reference!r} for op "
                              f"{op.name}; it defines {', '.join(defined) or 'none'}")
        out.append(fn)
    return out
