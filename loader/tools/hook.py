"""Patch every process of an environment, torchrun's ranks included: ``flyship hook install``.

``install`` writes one ``.pth`` file into the environment's site-packages. Python runs a ``.pth`` line
that starts with ``import`` at every start-up, in every interpreter of that environment (a
``usercustomize.py`` does not reach a venv whose user site is off, and editing the installed model code
is undone by the next ``pip install``). That line (:mod:`flyship._startup`) reads the patches file and
waits on ``sys.meta_path``: when a patched module is first imported, the bundle is loaded (once per
process) and the patches are applied to the fresh module, before the code that imported it runs.

The patches file (JSON)::

    {
      "bundle": "artifacts/triton",            # relative to this file's folder, or absolute
      "namespace": null,                       # optional: load(..., namespace=)
      "patches": [
        {"target": "mymodel.layers:RMSNorm.forward", "op": "rmsnorm",
         "args": {"x": "hidden", "w": "self.weight", "eps": "self.eps"},
         "inplace": null, "ignore": [], "cpu_target": null, "compiled": "op"}
      ]
    }

``args`` values are parameter names or attribute paths (``"self.eps"``), or ``{"const": value}``;
the other keys are those of :func:`flyship.patch`. ``FLYSHIP_HOOK=0`` turns the hook off for a process.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sysconfig
import tempfile
import threading
import unicodedata
from pathlib import Path
from typing import Any

from flyship.bundle import files as _files
from flyship.bundle import limits as _limits
from flyship.bundle import targets as _targets
from flyship.errors import BundleError, ConfigError
from flyship.loader.tools.patch import COMPILED_CHOICES as _COMPILED_CHOICES  # flyship.patch's compiled=

PTH_NAME = "zz_flyship_hook.pth"  # .pth files run in name order: after the ones that put flyship on sys.path
_MARK = "# flyship hook: "
_KEYS = {"target", "op", "args", "inplace", "ignore", "cpu_target", "compiled"}
_MAX_PATCHES = 4096
_MAX_NAME_TEXT = 512  # a dotted module path or attribute path


@dataclasses.dataclass(frozen=True)
class PatchSpec:
    target: str
    op: str
    args: dict[str, Any]
    inplace: str | None = None
    ignore: tuple[str, ...] = ()
    cpu_target: str | None = None
    compiled: str = "op"

    @property
    def module(self) -> str:
        return self.target.partition(":")[0]


@dataclasses.dataclass(frozen=True)
class PatchFile:
    path: Path
    bundle: Path
    namespace: str | None
    patches: tuple[PatchSpec, ...]


def _is_path(text: Any, *, dotted: bool) -> bool:
    """Whether ``text`` is an identifier (``dotted``: identifiers joined by dots, an attribute path)."""
    return (type(text) is str and 0 < len(text) <= _MAX_NAME_TEXT
            and all(part.isidentifier() for part in (text.split(".") if dotted else (text,))))


def _read_patch(p: Any, at: str) -> PatchSpec:
    """One item of ``patches``, every value typed and checked before use."""
    if type(p) is not dict or type(p.get("target")) is not str or type(p.get("op")) is not str:
        raise ConfigError(f'{at}: expected {{"target": "module:Name", "op": "<op>", ...}}, got {_shown(p)}')
    module, sep, qual = p["target"].partition(":")
    if not sep or not _is_path(module, dotted=True) or not _is_path(qual, dotted=True):
        raise ConfigError(f"{at}: expected a target 'package.module:Class.method', got {_shown(p['target'])}")
    bad = sorted(set(p) - _KEYS)
    if bad:
        raise ConfigError(f"{at}: unknown keys {', '.join(k[:40] for k in bad)}; expected {', '.join(sorted(_KEYS))}")
    if not _is_path(p["op"], dotted=False):
        raise ConfigError(f"{at}: op: expected an op name, got {_shown(p['op'])}")
    args = p.get("args")
    if args is None:
        args = {}
    if type(args) is not dict:
        raise ConfigError(f"{at}: args: expected an object op input -> source, got {_shown(args)}")
    for k, v in args.items():
        if not (_is_path(k, dotted=False) and (_is_path(v, dotted=True) or (type(v) is dict and set(v) == {"const"}))):
            raise ConfigError(f'{at}: args["{k[:40]}"]: expected a parameter name, "param.attribute" or '
                              f'{{"const": value}} for an op input name, got {_shown(v)}')
    inplace, cpu_target, ignore = p.get("inplace"), p.get("cpu_target"), p.get("ignore")
    if inplace is not None and not _is_path(inplace, dotted=False):
        raise ConfigError(f"{at}: inplace: expected a parameter name or null, got {_shown(inplace)}")
    if ignore is not None and (type(ignore) is not list or not all(_is_path(x, dotted=False) for x in ignore)):
        raise ConfigError(f"{at}: ignore: expected a list of parameter names, got {_shown(ignore)}")
    if cpu_target is not None:
        try:
            _targets.parse_target(cpu_target)
        except BundleError as e:
            raise ConfigError(f"{at}: cpu_target: {e}") from None
    compiled = p.get("compiled", "op")
    if compiled not in _COMPILED_CHOICES:
        raise ConfigError(f"{at}: compiled: expected one of {', '.join(map(repr, _COMPILED_CHOICES))}, got "
                          f"{_shown(compiled)}")
    return PatchSpec(p["target"], p["op"], dict(args), inplace, tuple(ignore or ()), cpu_target, compiled)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def read_patches(path: str | Path) -> PatchFile:
    """Read and check a patches file (without importing anything it names): a regular file of at most
    ``MAX_PATCHES_BYTES`` read once (a FIFO or a device is refused at once), strict JSON
    (:func:`flyship.bundle.files.read_json`), every key and value typed before use.

    Raises:
        ConfigError: the file is missing, not a regular file, too large, not JSON, nested too deep, or a key is
            missing, unknown or of the wrong type.
    """
    try:
        path = Path(path).resolve()
    except (OSError, RuntimeError, ValueError):  # a symlink loop (RuntimeError before 3.13), a NUL byte
        path = Path(os.path.abspath(path))
    where = f"patches file {path}"
    data = _files.read_json(path, _limits.MAX_PATCHES_BYTES, what="patches file", error=ConfigError,
                            hint="fix the file (the format is in `flyship hook --help`), or `flyship hook remove`")
    if type(data) is not dict or type(data.get("bundle")) is not str or type(data.get("patches")) is not list:
        raise ConfigError(f'{where}: expected {{"bundle": "<path>", "patches": [...]}}, got {_shown(data)}')
    unknown = sorted(set(data) - {"bundle", "namespace", "patches"})
    if unknown:
        raise ConfigError(f"{where}: unknown keys {', '.join(k[:40] for k in unknown)}; expected bundle, namespace, "
                          "patches")
    if not data["bundle"] or "\0" in data["bundle"] or len(data["bundle"]) > _limits.MAX_STRING:
        raise ConfigError(f"{where}: bundle: expected a path, got {_shown(data['bundle'])}")
    namespace = data.get("namespace")
    if namespace is not None and not _is_path(namespace, dotted=False):
        raise ConfigError(f"{where}: namespace: expected a namespace name or null, got {_shown(namespace)}")
    if len(data["patches"]) > _MAX_PATCHES:
        raise ConfigError(f"{where}: patches: expected at most {_MAX_PATCHES}, got {len(data['patches'])}")
    specs = tuple(_read_patch(p, f"{where}, patches[{i}]") for i, p in enumerate(data["patches"]))
    bundle = Path(data["bundle"])
    return PatchFile(path, bundle if bundle.is_absolute() else path.parent / bundle, namespace, specs)


_lock = threading.Lock()
_applied: dict[tuple[str, str], list[Any]] = {}


def apply_for_module(path: str | Path, module: str) -> list[Any]:
    """Load the bundle (once per process) and apply the patches of ``path`` whose target is in ``module``.
    A patch that cannot be made is reported (stderr and the routing summary) and skipped.

    Returns:
        The :class:`~flyship.loader.tools.patch.Patch` objects applied.
    """
    import sys

    from flyship.errors import FlyshipError
    from flyship.loader import core
    from flyship.loader.tools import report as _report
    from flyship.loader.tools.patch import Const, patch

    pf = read_patches(path)
    key = (str(pf.path), module)
    with _lock:
        if key in _applied:
            return _applied[key]
        ops = core.load(pf.bundle, namespace=pf.namespace)
        done = []
        for spec in pf.patches:
            if spec.module != module:
                continue
            try:
                args = {k: Const(v["const"]) if isinstance(v, dict) else v for k, v in spec.args.items()}
                done.append(patch(spec.target, ops[spec.op], args=args, inplace=spec.inplace, ignore=spec.ignore,
                                  cpu_target=spec.cpu_target, compiled=spec.compiled))
            except (FlyshipError, KeyError) as e:
                msg = f"{spec.target} -> {spec.op}: {e}"
                _report.note_error(msg)
                print(f"flyship hook: not patched: {msg}", file=sys.stderr)
        _applied[key] = done
        return done


def site_dir(folder: str | Path | None = None) -> Path:
    """Where the hook's ``.pth`` goes: ``folder`` (a site-packages directory) or this environment's."""
    return Path(folder) if folder is not None else Path(sysconfig.get_paths()["purelib"])


def install(patches: str | Path, folder: str | Path | None = None) -> Path:
    """Check the patches file and write the ``.pth`` that activates it at every start-up.

    Returns:
        The ``.pth`` file written (replacing an earlier flyship hook there).

    Raises:
        ConfigError: the patches file is invalid or its bundle has no manifest; the folder does not exist.
    """
    from flyship.bundle import pack as _pack

    pf = read_patches(patches)
    if not (pf.bundle / "manifest.json").is_file() and not _pack.is_pack(pf.bundle):
        raise ConfigError(f"hook install: expected a bundle (a folder with manifest.json, or a packed .flyship file) "
                          f"at {pf.bundle}, named by {pf.path}; build it with flyc-build or fix \"bundle\"")
    if _pack.is_pack(pf.bundle):  # every member and the signature policy checked now, not at every start-up
        _pack.bundle_dir(pf.bundle)
    target = site_dir(folder)
    if not target.is_dir():
        raise ConfigError(f"hook install: expected a site-packages folder, got {target} (no such folder)")
    pth = target / PTH_NAME
    text = _pth_text(pf.path).encode("ascii")  # ASCII only: Python decodes a .pth in the locale's encoding
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{PTH_NAME}.", suffix=".tmp", dir=target)  # no .pth suffix: never run
        with os.fdopen(fd, "wb") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, pth)  # atomic: a Python starting meanwhile sees the old hook or the new one, never half
        tmp = None
    except OSError as e:
        raise ConfigError(f"hook install: cannot write {pth}: {e}; run it as the environment's owner, or pass "
                          "--site-dir") from e
    finally:
        if tmp is not None:  # nothing half-written stays in site-packages
            Path(tmp).unlink(missing_ok=True)
    return pth


def _pth_text(patches: Path) -> str:
    """The ``.pth`` text, built from data: Python runs every line of a ``.pth`` that starts with ``import``, so a
    path that could end a line (a newline, any control character) would add a line of code; such a path is refused,
    and the path enters both lines only as a JSON/Python string literal, never pasted."""
    text = str(patches)
    bad = [c for c in text if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")]
    if bad:
        raise ConfigError(f"hook install: expected a patches-file path without control characters, got {text!r} "
                          f"(contains {', '.join(sorted({repr(c) for c in bad}))}); move or rename the file")
    literal = json.dumps(text)  # a JSON string is also a valid Python string literal for this alphabet
    return f"{_MARK}{literal}\nimport flyship._startup as _flyship_startup; _flyship_startup.activate({literal})\n"


def _pth_patches(pth: Path) -> str:
    """The patches path the hook's ``.pth`` names, or ``"?"`` when it is empty, garbage or not flyship's."""
    try:
        first = (pth.read_text(encoding="utf-8", errors="replace").splitlines() or [""])[0]
    except OSError:
        return "?"
    if not first.startswith(_MARK):
        return "?"
    rest = first[len(_MARK):]
    try:
        value = json.loads(rest)
    except ValueError:
        return rest  # a hook written before the path was stored as a JSON string
    return value if isinstance(value, str) else "?"


def status(folder: str | Path | None = None) -> dict[str, Any] | None:
    """The installed hook of a site folder, or None: ``{"pth", "patches", "ok", "error", "targets"}``."""
    pth = site_dir(folder) / PTH_NAME
    if not pth.is_file():
        return None
    path = _pth_patches(pth)
    try:
        pf = read_patches(path)
        return {"pth": str(pth), "patches": path, "ok": True, "error": "",
                "targets": [f"{p.target} -> {p.op}" for p in pf.patches], "bundle": str(pf.bundle)}
    except ConfigError as e:
        return {"pth": str(pth), "patches": path, "ok": False, "error": str(e), "targets": [], "bundle": ""}


def remove(folder: str | Path | None = None) -> Path | None:
    """Delete the hook's ``.pth`` from a site folder; returns it, or None when there was none."""
    pth = site_dir(folder) / PTH_NAME
    if not pth.is_file():
        return None
    try:
        pth.unlink()
    except OSError as e:
        raise ConfigError(f"hook remove: cannot delete {pth}: {e}; run it as the environment's owner, or pass "
                          "--site-dir") from e
    return pth
