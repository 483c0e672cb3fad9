"""The PyTorch references of a bundle's ops: the fallback when no specialization fits, and the
yardstick of verification.

A bundle may carry ``references.py`` (it imports torch only); each op's manifest ``reference`` names a
function in it. ``load(..., references={"add": fn})`` replaces or adds references.
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Mapping, Optional

from flyship.bundle import manifest as _m
from flyship.bundle import rules as _rules
from flyship.bundle.errors import BundleError
from flyship.errors import CallError


def import_references(root: Path, manifest: _m.Manifest) -> Optional[ModuleType]:
    """Import the bundle's references module, or None when the manifest names none. The bytes run are the
    bytes checked: contained in the bundle, bounded and matching ``references_sha256``
    (:func:`flyship.bundle.rules.references_source`).

    Raises:
        BundleError: the file is missing, escapes the bundle, was changed, or raises on import.
    """
    if not manifest.references:
        return None
    source = _rules.references_source(root, manifest)
    path = _rules.contained_path(root, manifest.references, f"load bundle {root}: references")
    digest = hashlib.sha256(str(path).encode() + source).hexdigest()[:12]
    module = ModuleType(f"flyship_references_{manifest.namespace}_{digest}")
    module.__file__ = str(path)
    try:
        exec(compile(source, str(path), "exec"), module.__dict__)  # noqa: S102 - the bundle's own, checked code
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
    # A named module is always checked and imported, even when overrides leave no op using it: a bundle whose
    # references.py was changed is refused by every path alike (load, ``flyship list``, pack, flyc-build).
    module = import_references(root, manifest)
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
            raise BundleError(f"load bundle {root}: op {op.name} names reference {op.reference!r} but the manifest "
                              "names no references file")
        fn = getattr(module, op.reference, None)
        if not callable(fn):
            defined = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
            raise BundleError(f"load bundle {root}: {manifest.references} has no function {op.reference!r} for op "
                              f"{op.name}; it defines {', '.join(defined) or 'none'}")
        out.append(fn)
    return out


# How many calls of one op's reference may be active at once in one thread. A reference may call its own op (upcast,
# then run the kernel); when those inputs fall back too, the reference runs again inside itself. Once or twice can be
# a deliberate chain (bf16 -> f32 -> torch); more is a loop that would end in a RecursionError wrapped once per level
# (a message of kilobytes).
MAX_ACTIVE = 3


class ReferenceReentered(CallError):
    """An op's reference re-entered itself through its own op more than :data:`MAX_ACTIVE` times."""


def guarded(reference: Optional[Callable[..., Any]], qualname: str) -> Optional[Callable[..., Any]]:
    """``reference`` as the fallback paths call it: refusing, with one message, a reference that falls back into
    itself through its own op (:data:`MAX_ACTIVE`). While that refusal unwinds, every level raises it as it is, so
    what leaves the outermost call is that one message, not one wrapped per level."""
    if reference is None:
        return None
    state = threading.local()
    op = qualname.split("::")[-1]

    def call_reference(*args: Any, **kwargs: Any) -> Any:
        depth = getattr(state, "depth", 0)
        if depth >= MAX_ACTIVE:
            state.refused = ReferenceReentered(
                f"flyship {qualname}: expected a reference that does not fall back into itself, got it nested "
                f"{depth + 1} deep (it calls ops.{op}, whose inputs fit no specialization either, so "
                f"that call runs the reference again); compute the result with torch ops in the reference, or call "
                f"ops.{op} only with inputs a specialization takes")
            raise state.refused
        state.depth = depth + 1
        try:
            return reference(*args, **kwargs)
        except Exception:
            refused = getattr(state, "refused", None)
            if refused is None:
                raise
            raise refused from None  # the fallback path between two levels wrapped it: drop the wrapping
        finally:
            state.depth = depth
            if depth == 0:
                state.refused = None

    call_reference.__wrapped__ = reference  # type: ignore[attr-defined]
    return call_reference
