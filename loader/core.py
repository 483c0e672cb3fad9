"""Load a bundle: check it, lower it to the C++ plan, register its ops with torch.

Registration (per op, under the manifest's namespace or the one given to :func:`load`):

* ``torch.library.Library(ns, "FRAGMENT").define`` of the functional schema and of the ``.out`` variant;
* a fake kernel per overload (``torch.library.register_fake``), from the output rules;
* a CPU kernel per overload (:mod:`flyship.loader.cpu`): CPU tensors run the op's reference, counted as a
  fallback with reason ``"cpu"``;
* in C++: the boxed kernel for the CUDA key (ROCm torch uses it too) and torch's not-implemented autograd
  kernels;
* for an op whose manifest names a backward op, its derivative (:mod:`flyship.loader.autograd`);
* each composite (schema 1.4): a CompositeImplicitAutograd kernel running the bundle's own function
  (:mod:`flyship.loader.composites`).

The ops stay registered for the life of the process; loading the same content again (the same manifest, from any
path) returns the same :class:`Ops`. ``load(..., reload=True)`` replaces a namespace's ops (a rebuilt bundle in a
notebook): torch.library cannot define a schema twice, so the earlier registrations are removed first, the C++
kernels (:func:`_unregister`) and then the Python ``Library`` (its defs, fake, CPU, autograd and composite kernels;
``Library._destroy`` also drops ``torch.ops``' cached packets).
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import threading
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from flyship import env
from flyship.bundle import manifest as _m
from flyship.bundle import pack as _pack
from flyship.bundle import rules as _rules
from flyship.bundle.errors import BundleError
from flyship.errors import ConfigError
from flyship.loader import autograd as _autograd
from flyship.loader import extension as _extension
from flyship.loader import cpu as _cpu
from flyship.loader import plan as _plan
from flyship.loader import plancache as _plancache
from flyship.loader import references as _references
from flyship.loader import opschema as _opschema
from flyship.loader import target_dtypes as _target_dtypes
from flyship.loader.handles import Ops, _CodeObjects
from flyship.loader.selection import device_index, fallback_flag, make_selector, warn_not_built



_lock = threading.Lock()
_loaded: dict[str, Ops] = {}

# The driver a load in this context binds its ops to (None: the process's GPU flavor). Set only by
# flyship.loader.record.dry_run, around its own load, so no environment switch is changed for other threads.
DRIVER: contextvars.ContextVar[Optional[str]] = contextvars.ContextVar("flyship_load_driver", default=None)


def _internal_dirs() -> tuple[str, ...]:
    """Folders whose frames a warning skips: flyship's packages (the mapped folders) and torch's."""
    import torch

    from flyship import bundle

    # flyship's own folders: this package's (loader/), env.py's (flyship/), the bundle's; then torch's
    return tuple(str(Path(f).parent) + "/" for f in (__file__, env.__file__, bundle.__file__, torch.__file__))


def warn_fallback(message: str) -> None:
    """Issue the fallback warning (called by the C++ core) at the first frame outside flyship and torch: the
    user's line that called the op (``warnings.warn``'s ``stacklevel``), so its filename and line mean something
    and a ``-W`` filter on the user's module applies."""
    import sys
    import warnings

    skip = _internal_dirs()
    level, frame = 2, sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(skip):
        frame = frame.f_back
        level += 1
    warnings.warn(message, UserWarning, stacklevel=level)


def _blame(op: _m.Op, *why: Any) -> Any:
    """:func:`flyship.loader.blame.blame` (imported when a refusal needs it, not at load)."""
    from flyship.loader import blame

    return blame.blame(op, *why)


def _register_composites(library: Any, ns: str, root: Path, head: _m.Manifest, ext: Any) -> Any:
    """:func:`flyship.loader.composites.register`; a bundle without composites does not import that module."""
    if not head.composites:
        return {}
    from flyship.loader import composites

    host = ext.flavor() in _extension.HOST_FLAVORS

    def cu_count(device: Any) -> int:
        """``device.cu_count`` of a composite's workspace: the GPU's, the recording or emulated device's for CPU
        tensors on those flavors, else 1 (CPU tensors run the references; a meta tensor has no device)."""
        import torch

        if device.type == "cuda":  # torch's HIP builds name their devices "cuda" too
            return int(ext.device_info(device.index if device.index is not None else torch.cuda.current_device())
                       ["cu_count"])
        return int(ext.device_info(0)["cu_count"]) if device.type == "cpu" and host else 1

    return composites.register(library, ns, root, head, cu_count)


def _beside(path: str | Path) -> Path:
    """The folder holding the bundle as the user named it (a folder, its manifest.json or a packed file), where a
    prebuilt extension may be shipped."""
    p = Path(path).resolve()
    return p.parent.parent if p.name == _m.MANIFEST_NAME and p.is_file() else p.parent


def _register(manifest: _m.Manifest, namespace: str, core: Any, references: list[Optional[Callable[..., Any]]],
              cpu_in_core: bool = False,
              full_op: Optional[Callable[[int], _m.Op]] = None) -> tuple[Any, list[_cpu.CpuKernel]]:
    import torch

    lib = torch.library.Library(namespace, "FRAGMENT")
    cpu_kernels = []
    for k, (op, reference) in enumerate(zip(manifest.ops, references)):
        functional, out = _opschema.schemas(op)
        try:
            lib.define(functional)
            if out is not None:  # an in-place-only op has no .out variant
                lib.define(out)
        except RuntimeError as e:
            raise BundleError(f"register op {namespace}::{op.name}: torch refused the schema {functional!r} / {out!r}: "
                              f"{e}; load the bundle under another namespace (load(..., namespace='...'))") from e
        qual = f"{namespace}::{op.name}"
        torch.library.register_fake(qual, _opschema.make_fake(op, False, qual), lib=lib)
        if out is not None:
            torch.library.register_fake(qual + ".out", _opschema.make_fake(op, True, qual), lib=lib)
        # ``op`` may be the head alone (no specializations): the CPU kernel reads those only for an error message.
        cpu_kernel = _cpu.CpuKernel(op, qual, reference, lambda: core.fallback,
                                    lambda args, is_out, k=k: core.check_call(k, args, is_out),
                                    full_op=(lambda k=k: full_op(k)) if full_op else None)
        if not cpu_in_core:  # the recording driver's C++ kernel owns the CPU key (it launches on CPU tensors)
            _cpu.register(lib, op, cpu_kernel)
        cpu_kernels.append(cpu_kernel)
    core.register()
    _autograd.register(lib, namespace, manifest)
    return lib, cpu_kernels


def _check_load_args(path: Any, references: Any, verify: Any, tuning: Any, reload: Any = False) -> None:
    """The types of :func:`load`'s arguments that nothing later checks with a message of its own.

    Raises:
        ConfigError: naming the argument, what it takes and what it got.
    """
    import os

    def shown(v: Any) -> str:
        return f"{type(v).__name__} {str(v)[:40]}" if v is not None else "None"

    if not isinstance(path, (str, os.PathLike)):
        raise ConfigError(f"flyship.load(path=): expected a bundle directory, its manifest.json or a packed bundle "
                          f"file as a str or pathlib.Path, got {shown(path)}; pass the folder flyc-build wrote")
    if references is not None and not isinstance(references, Mapping):
        raise ConfigError(f"flyship.load(references=): expected a mapping of op name -> PyTorch function, got "
                          f"{shown(references)}; pass references={{'add': my_add}}")
    for name, value in (("verify", verify), ("reload", reload)):
        if not isinstance(value, bool):
            raise ConfigError(f"flyship.load({name}=): expected True or False, got {shown(value)}")
    if tuning is not None and not isinstance(tuning, (str, os.PathLike)):
        raise ConfigError(f"flyship.load(tuning=): expected the path of a tuning table (`flyship tune` writes one) "
                          f"as a str or pathlib.Path, got {shown(tuning)}; pass tuning='tuning.json'")


def load(path: str | Path, *, references: Optional[Mapping[str, Callable[..., Any]]] = None,
         fallback: Optional[bool] = None, verify: bool = False, namespace: Optional[str] = None,
         tuning: Optional[str | Path] = None, tuning_device: int = 0,
         trusted_keys: Optional[Sequence[str | Path]] = None, reload: bool = False) -> Ops:
    """Load a bundle built by ``flyc-build`` and register its ops with torch.

    Args:
        path: the bundle directory (holding ``manifest.json``), that ``manifest.json``, or a packed bundle
            file (``flyship pack``).
        references: op name -> PyTorch function, replacing or adding to the bundle's ``references.py``.
        fallback: run the reference when no specialization fits (default: ``FLYSHIP_FALLBACK``, on);
            False raises instead, saying what did not fit. A bool only (a string such as ``"off"`` is refused).
        verify: run each specialization once against its reference on a GPU and raise if one disagrees
            (:meth:`Ops.verify`); needs a GPU.
        namespace: torch namespace to register under (default: the manifest's).
        tuning: a tuning table (``flyship tune``; docs/tuning.md): its winners for the device
            ``tuning_device`` (target ID and CU count) are dispatched first, by guards the C++ core checks per
            call; entries for other devices are ignored with a warning.
        tuning_device: the GPU whose target and CU count select the table's entries.
        trusted_keys: public keys (``.pub`` files from ``flyship keygen`` or hex); when given (default:
            ``FLYSHIP_TRUSTED_KEYS``), only a pack signed by one of them loads (docs/security.md). It fails closed:
            an empty list is a ConfigError, and with ``FLYSHIP_TRUSTED_KEYS`` set it may only narrow that set.
        reload: replace the ops already registered under this namespace by another bundle or other content (a
            rebuilt bundle, in one process), with a warning: ``torch.ops.<ns>.*`` and later loads get the new ops;
            an :class:`Ops` object from the earlier load keeps calling the earlier kernels, and a function compiled
            earlier keeps its graph (``torch._dynamo.reset()`` before compiling again).

    Returns:
        The bundle's :class:`Ops`. Loading the same bundle again returns the same object.

    Raises:
        BundleError: the manifest or a code object is invalid, a packed file is damaged, or the namespace
            is taken by other content (without ``reload=True``).
        ExtensionBuildError: the C++ extension could not be built.
        ConfigError: ``path``, ``references``, ``verify`` or ``tuning`` of the wrong type, ``fallback`` is not a
            bool, or ``tuning_device`` is not a GPU device.

    Example::

        ops = flyship.load("artifacts/examples")
        y = ops.add(x, y)
    """
    _check_load_args(path, references, verify, tuning, reload)
    if fallback is not None:
        fallback = fallback_flag(fallback, "flyship.load(fallback=)")
    root = _pack.bundle_dir(path, trusted_keys)
    raw, where = _m.read_bytes(root)
    digest = hashlib.sha256(raw).hexdigest()
    # The checked, lowered plan: from the plan cache when it has this manifest (keyed by its sha256), else read
    # and checked by the rule book now. Each op's specializations are read when the core first uses the op.
    plan = _plancache.load_plan(raw, digest, where, Path(where))
    ns = plan.head.namespace if namespace is None else namespace
    _rules.check_namespace(ns, f"load bundle {root}: namespace")
    table = None
    if tuning is not None:
        from flyship.bundle import tuning as _tt

        table = _tt.read(tuning)  # read once, bounded; the digest is of what was read, not of a second read
        text = json.dumps(_tt.to_json_obj(table), sort_keys=True)
        digest = hashlib.sha256((digest + text).encode()).hexdigest()
    with _lock:
        existing = _loaded.get(ns)
        if existing is not None and not reload and existing._digest == digest and not references:
            if fallback is not None:  # the same content, from this path or another: the ops registered already
                existing.fallback = fallback
            ops = existing
        elif existing is not None and not reload:
            raise BundleError(f"load bundle {root}: namespace {ns!r} is already registered in this process by the "
                              f"bundle at {existing.path}, with other content; pass reload=True to replace its ops "
                              "(a rebuilt bundle), or load this one with load(..., namespace='<another name>')")
        else:
            if existing is not None:
                _unregister(existing, root)
            ops = _load_new(path, root, plan, ns, references, fallback, table, tuning_device, digest)
            _loaded[ns] = ops
    if verify:
        report = ops.verify()
        report.raise_on_failure()
    return ops


def _unregister(old: Ops, root: Path) -> None:
    """Remove the registrations of ``old`` (``reload=True``): its C++ kernels, then its ``torch.library`` fragment,
    whose destruction removes the schemas, so that the namespace can be defined again."""
    import warnings

    old._core.unregister()
    old._library._destroy()
    warnings.warn(f"flyship.load(reload=True): replaced the ops of namespace {old.namespace!r} (bundle {old.path} -> "
                  f"{root}); the Ops object of the earlier load keeps its kernels, functions compiled before keep "
                  "their graphs: use the returned ops, and torch._dynamo.reset() before compiling again",
                  UserWarning, stacklevel=3)


def _load_new(path: str | Path, root: Path, plan: _plancache.BundlePlan, ns: str,
              references: Optional[Mapping[str, Callable[..., Any]]], fallback: Optional[bool], table: Any,
              tuning_device: int, digest: str) -> Ops:
    """A bundle not loaded in this process yet: its references, the extension, the tuning table's winners for the
    device, the lowered plan handed to the C++ core, and the ops registered with torch."""
    refs = _references.resolve(root, plan.head, references)
    ext = _extension.extension(DRIVER.get(), near=_beside(path))
    tuning_status = None
    host = ext.flavor() in _extension.HOST_FLAVORS
    if ext.flavor() == "emulate":
        from flyship.loader import emulated_device  # only on the emulated device: its launches run there

        emulated_device.install(ext)
    if table is not None:
        plan, tuning_status = _tuned_plan(plan, table, tuning_device, ext)
    declared = plan.head
    plan, _target = _target_dtypes.resolve(plan, lambda: _target_dtypes.device_targets(ext))
    code_objects = _CodeObjects(root, plan)
    heads = [_plan.lower_op(op, ns, [len(t) for t in plan.spec_targets[k]], sum(plan.spec_ids[k]))
             for k, op in enumerate(plan.head.ops)]
    # The fallback paths run each reference guarded against falling back into itself; ops.reference()
    # gives the reference as it was given.
    guarded = [_references.guarded(_target_dtypes.convert_reference(r, d, op), f"{ns}::{op.name}")
               for r, d, op in zip(refs, declared.ops, plan.head.ops)]
    lowered = _plan.lower_bundle(heads, ns, guarded, plan.specs, code_objects, lambda k, *why: _blame(plan.op(k), *why))
    core = ext.Bundle(lowered, make_selector(plan), env.fallback_enabled() if fallback is None else fallback)
    library, cpu_kernels = _register(plan.head, ns, core, guarded, cpu_in_core=host,
                                     full_op=plan.op)
    ops = Ops(root, plan, ns, core, library, ext, refs, digest, cpu_kernels, code_objects)
    ops._composites = _register_composites(library, ns, root, plan.head, ext)
    ops._declared = declared  # the outputs' per-target dtypes, for dispatch(target=) on another target
    ops.tuning = tuning_status
    warn_not_built(plan.head, root)
    if env.verbose():
        print(f"flyship: loaded {ops!r} ({ext.flavor()} flavor, {ext.runtime_version()})")
    return ops


def _tuned_plan(plan: _plancache.BundlePlan, table: Any, tuning_device: Any,
                ext: Any) -> tuple[_plancache.BundlePlan, str]:
    """The plan with the tuning table's winners for the GPU ``tuning_device``, and what became of the table in
    words (:attr:`Ops.tuning`). On a machine with no GPU (calls run the references, which no table tunes) the
    table is set aside with a warning and ``Ops.tuning`` says so, so one load line serves both."""
    import torch

    gpu = device_index(tuning_device, "flyship.load(tuning_device=)")
    try:
        target = ext.device_info(gpu)["target"]
    except RuntimeError as e:
        if ext.flavor() not in _extension.HOST_FLAVORS and not torch.cuda.is_available():
            import warnings

            why = ("not used: no GPU here (its winners are chosen per device target; calls here run the op's "
                   "reference)")
            warnings.warn(f"flyship.load(tuning=): the tuning table is {why}", UserWarning, stacklevel=3)
            return plan, why
        raise ConfigError(f"flyship.load(tuning=): expected to read the target of GPU {gpu} to pick the table's "
                          f"winners, but the runtime failed: {e}; pass tuning_device= a GPU this process sees") from None
    from flyship.loader import tuned as _tuned  # only with a tuning table

    cus = _tuned.device_cus(gpu)
    from flyship.bundle import tuning as _tt

    mine = len(_tt.entries_for(table, target, cus, lambda _msg: None))
    status = f"applied: {mine} of {len(table.entries)} entries for {target}" + (f" ({cus} CUs)" if cus else "")
    return _plancache.BundlePlan.of(_tuned.apply(plan.manifest, table, target, cus)), status
