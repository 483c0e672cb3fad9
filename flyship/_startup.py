"""What ``flyship hook install``'s ``.pth`` line runs when an interpreter starts: light on purpose.

Every Python of the environment runs it (pip, torchrun's launcher and each of its ranks), so it imports
the standard library only: it reads the patches file's module names and puts a finder on
``sys.meta_path``. The bundle is loaded and the patches are applied (:mod:`flyship.loader.tools.hook`) only
when one of those modules is first imported; a process that never imports them pays for a JSON read.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from flyship.errors import FlyshipError


def _warn(message: str) -> None:
    print(f"flyship hook: {message}", file=sys.stderr)


class _Finder:
    """A meta path finder that wraps the loaders of the patched modules: after such a module executes,
    its patches are applied."""

    def __init__(self, path: str, modules: set[str]) -> None:
        self.path = path
        self.pending = set(modules)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in self.pending:
            return None
        import importlib.util

        self.pending.discard(fullname)  # also keeps find_spec below from finding this finder again
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Loader(spec.loader, self.path)
        return spec


class _Loader:
    def __init__(self, inner: Any, path: str) -> None:
        self.inner = inner
        self.path = path

    def create_module(self, spec: Any) -> Any:
        return self.inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.inner.exec_module(module)
        _apply(self.path, module.__name__)

    def __getattr__(self, name: str) -> Any:  # get_source, is_package, ... of the real loader
        return getattr(self.inner, name)


def _apply(path: str, module_name: str) -> None:
    try:
        from flyship.loader.tools.hook import apply_for_module

        apply_for_module(path, module_name)
    except Exception as e:  # noqa: BLE001 - a hook must never stop the user's import; it says what failed
        _warn(f"patches for {module_name} from {path} not applied: {type(e).__name__}: {e}")


def _modules(path: str) -> set[str]:
    """The modules the patches file at ``path`` patches. The file is read bounded and as a regular file only
    (:func:`flyship.bundle.files.read_json`: a FIFO or ``/dev/zero`` there is refused at once, never waited on),
    and only the targets' module names are taken here; :func:`flyship.loader.tools.hook.read_patches` checks the
    whole file when one of them is imported (it imports the loader: too heavy for every interpreter start)."""
    from flyship.bundle import files, limits
    from flyship.errors import ConfigError

    data = files.read_json(path, limits.MAX_PATCHES_BYTES, what="cannot read the patches file", error=ConfigError)
    patches = data.get("patches") if type(data) is dict else None
    if type(patches) is not list or not all(type(p) is dict and type(p.get("target")) is str for p in patches):
        raise ConfigError(f'cannot read the patches file {path}: expected {{"bundle": ..., "patches": '
                          '[{"target": ...}, ...]}')
    return {p["target"].partition(":")[0] for p in patches}


def activate(path: str) -> None:
    """Watch for the modules the patches file at ``path`` patches (``FLYSHIP_HOOK=0`` turns this off)."""
    from flyship import env
    from flyship.errors import ConfigError

    try:
        if not env.hook_enabled():
            return
    except ConfigError as e:  # a bad switch value must never stop the interpreter: say so, patch nothing
        _warn(f"{e}; nothing is patched")
        return
    try:
        modules = _modules(path)
    except Exception as e:  # noqa: BLE001 - a broken hook must never stop the interpreter from starting
        said = e if isinstance(e, FlyshipError) else f"cannot read the patches file {path}: {type(e).__name__}: {e}"
        _warn(f"{said}; nothing is patched (fix it, or run `flyship hook remove`)")
        return
    already = sorted(m for m in modules if m in sys.modules)
    sys.meta_path.insert(0, _Finder(path, modules - set(already)))
    for m in already:
        _apply(path, m)
