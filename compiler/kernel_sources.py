"""What a kernel closes over, as data for its build-cache key (:func:`flyship.compiler.cache.task_key`): the
function behind a DSL wrapper, the values its closure captures, and the user's files reachable from its module
(each with its sha256), recursively."""

from __future__ import annotations

import inspect
import sys
import types
from pathlib import Path
from typing import Any, Optional

from flyship.compiler.cache import is_user_file, sha256_bytes, sha256_file, versioned_packages

def underlying_function(obj: Any) -> Optional[types.FunctionType]:
    """The Python function behind a DSL wrapper (Triton ``JITFunction.fn``, FlyDSL ``JitFunction.func``,
    ``KernelFunction._func``, ``functools.wraps``), or the function itself."""
    for _ in range(4):
        if inspect.isfunction(obj):
            return obj
        nxt = None
        for attr in ("fn", "func", "_func", "__wrapped__"):
            cand = getattr(obj, attr, None) if not isinstance(obj, type) else None
            if cand is not None and cand is not obj:
                nxt = cand
                break
        if nxt is None:
            return None
        obj = nxt
    return None


def _value_fingerprint(v: Any, modules: list, depth: int) -> Any:
    """A captured value as data: plain values as themselves, functions by name (their module is walked)."""
    if v is None or isinstance(v, (bool, int, float, str, bytes)):
        return v if not isinstance(v, bytes) else sha256_bytes(v)
    if isinstance(v, (tuple, list)):
        return [_value_fingerprint(x, modules, depth) for x in v]
    if isinstance(v, dict):
        return {str(k): _value_fingerprint(x, modules, depth) for k, x in v.items()}
    if isinstance(v, types.ModuleType):
        modules.append(v)
        return f"module:{_module_name(v)}"
    fn = underlying_function(v)
    if fn is not None:
        mod = sys.modules.get(fn.__module__)
        if mod is not None:
            modules.append(mod)
        return {"function": _function_name(fn), "closure": _closure(fn, modules, depth + 1)}
    if isinstance(v, type):
        mod = sys.modules.get(v.__module__)
        if mod is not None:
            modules.append(mod)
        return f"class:{_module_name(mod) if mod else v.__module__}.{v.__qualname__}"
    r = repr(v)
    return f"{type(v).__module__}.{type(v).__qualname__}" + ("" if " at 0x" in r else f":{r}")


def _module_name(m: Any) -> str:
    """A module's stable name: its file when it is the user's (a spec file is imported under a name that changes
    from run to run), else its import name."""
    f = getattr(m, "__file__", None)
    return str(Path(f).resolve()) if f and is_user_file(f) else getattr(m, "__name__", "?")


def _function_name(fn: types.FunctionType) -> str:
    mod = sys.modules.get(fn.__module__)
    return f"{_module_name(mod) if mod is not None else fn.__code__.co_filename}:{fn.__qualname__}"


def _closure(fn: types.FunctionType, modules: list, depth: int = 0) -> list:
    if depth > 4 or not fn.__closure__:
        return []
    out = []
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__):
        try:
            out.append([name, _value_fingerprint(cell.cell_contents, modules, depth)])
        except ValueError:  # an empty cell
            out.append([name, None])
    return out


def kernel_sources(kernel: Any) -> dict[str, Any]:
    """What a kernel's code depends on among the user's files.

    Returns:
        ``{"function": module.qualname, "closure": captured values, "files": {path: sha256}}``: the files
        are the kernel's module and every user module reachable from its globals (modules, functions and
        DSL kernels imported from another of the user's files), recursively. A kernel that lives in an
        installed package (a kernel library in site-packages) has that package's modules walked the same
        way, so upgrading it changes the key. The DSLs (:func:`versioned_packages`) are left to their versions.
    """
    if isinstance(kernel, (list, tuple)):  # kernel=[Launch(...), ...]: every kernel's sources, in order
        return {"launches": [kernel_sources(getattr(k, "kernel", k)) for k in kernel]}
    fn = underlying_function(kernel)
    modules: list = []
    ident: dict[str, Any] = {"function": None, "closure": []}
    home = ""  # the installed package the kernel itself comes from, if any
    if fn is not None:
        top = fn.__module__.split(".")[0]
        if top not in versioned_packages() and not is_user_file(fn.__code__.co_filename or ""):
            home = top
        ident = {"function": _function_name(fn), "closure": _closure(fn, modules)}
        mod = sys.modules.get(fn.__module__)
        if mod is not None:
            modules.append(mod)
        elif fn.__code__.co_filename:  # a module executed without registering (rare): its file still counts
            modules.append(types.SimpleNamespace(__file__=fn.__code__.co_filename, __dict__={}))
    files: dict[str, str] = {}
    seen: set[int] = set()
    while modules:
        m = modules.pop()
        if id(m) in seen:
            continue
        seen.add(id(m))
        path = getattr(m, "__file__", None)
        in_home = bool(home) and getattr(m, "__name__", "").split(".")[0] == home
        if not path or not (is_user_file(path) or (in_home and Path(path).suffix == ".py")):
            continue
        files[str(Path(path).resolve())] = sha256_file(path) or "unreadable"
        for v in list(vars(m).values()):
            if isinstance(v, types.ModuleType):
                modules.append(v)
                continue
            owner = getattr(v, "__module__", None) if isinstance(v, type) or callable(v) else None
            f = underlying_function(v)
            for name in {owner if isinstance(owner, str) else None, f.__module__ if f is not None else None}:
                if name and name in sys.modules:
                    modules.append(sys.modules[name])
    ident["files"] = dict(sorted(files.items()))
    return ident
