"""The spec API: how a spec file declares the ops ``flyc-build`` compiles.

A spec file is plain Python run under the build Python. It imports its kernels and declares ops::

    from flyship.compiler.spec import Tensor, Output, Scalar, Constexpr, Spec, namespace, references, op
    from elementwise import add                     # a FlyDSL @flyc.jit launcher

    namespace("flyship_examples")                   # torch.ops.flyship_examples.*
    references("references.py")                     # torch-only module copied into the bundle

    op("add", kernel=add,
       args=[Tensor("x", rank=2), Tensor("y", rank=2), Output("out", like="x")],  # kernel parameter order
       reference="add_ref",
       specs=[Spec("f32", dtypes={"x": "float32", "y": "float32"}, shapes={"x": (1000, 1000), "y": (1000, 1000)})])

``args`` lists the kernel's parameters in order. ``Tensor`` and ``Scalar`` become the op's inputs
(in that order), ``Output`` its outputs; ``Constexpr`` takes a per-specialization value; ``Value``
passes an integer computed from the inputs (Triton kernels take ``n_elements`` this way). A FlyDSL
launcher's grid and kernarg layout are read from what FlyDSL lowered; a Triton kernel declares its
grid (``grid=("cdiv(x.numel, BLOCK)",)``), an expression over the inputs and constexprs.
See docs/spec-api.md.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, Optional, Sequence

from flyship.bundle import expr as _expr
from flyship.bundle import rules as _rules
from flyship.bundle.errors import BundleError
from flyship.bundle.model import Backward
from flyship.compiler.spec.builders import builder_entry
from flyship.compiler.spec.checks import validate
from flyship.compiler.spec.composite import composite_entry
from flyship.compiler.spec.opdecl import OpDecl
from flyship.compiler.spec.params import (
    Constexpr,
    Entry,
    Launch,
    Output,
    Param,
    Scalar,
    Tensor,
    Value,
    Workspace,
    entry,
)
from flyship.compiler.spec.specialization import PER_TARGET_FIELDS, Spec, admits
from flyship.compiler import tuning as _tuning
from flyship.compiler.configs import Config  # noqa: F401  (re-exported: a spec file declares configs=[Config(...)])
from flyship.compiler.configs import ConfigSpace
from flyship.compiler.configs import kernel_name as _kernel_name
from flyship.errors import SpecError

__all__ = [
    "Backward", "Config", "Constexpr", "Entry", "Launch", "OpDecl", "Output", "PER_TARGET_FIELDS", "Param",
    "Scalar", "Spec", "SpecError", "SpecFile", "Tensor", "Value", "Workspace", "admits", "composite", "entry",
    "namespace", "op",
    "references", "run_spec_file", "validate",
]


@dataclasses.dataclass
class SpecFile:
    """What a spec file declared: the namespace, the references module, the ops and the composites."""

    path: str
    namespace: str = ""
    references: Optional[str] = None
    ops: list[OpDecl] = dataclasses.field(default_factory=list)
    composites: list[Any] = dataclasses.field(default_factory=list)  # flyship.bundle.model.Composite


_CURRENT: Optional[SpecFile] = None


def _current() -> SpecFile:
    if _CURRENT is None:
        raise SpecError("spec API: namespace()/references()/op() must be called while flyc-build loads a spec file")
    return _CURRENT


def namespace(name: str) -> None:
    """Set the torch op namespace of the bundle (a Python identifier)."""
    try:  # the rule book's rule: an ASCII identifier, not one of torch's own namespaces
        _rules.check_namespace(name, "namespace")
    except BundleError as e:
        raise SpecError(str(e)) from None
    _current().namespace = name


def references(path: str) -> None:
    """Name the module (relative to the spec file) holding the PyTorch references; it must import only
    torch and the standard library, since it is copied into the bundle and run without FlyDSL."""
    _current().references = path


def _frontends_get(name: str) -> Any:
    from flyship.compiler import frontends

    return frontends.get(name)


def _detect_frontend(kernel: Any) -> str:
    from flyship.compiler import frontends

    if isinstance(kernel, (list, tuple)):  # several launches: one frontend for all
        if not kernel or not all(isinstance(k, Launch) for k in kernel):
            raise SpecError(f"op kernel: a list of kernels must hold Launch(kernel, args=[...], grid=(...)) "
                            f"entries, got {[type(k).__name__ for k in kernel]}")
        names = {_detect_frontend(k.kernel) for k in kernel}
        if len(names) != 1:
            raise SpecError(f"op kernel: every Launch of one op must use one frontend, got {sorted(names)}")
        return names.pop()
    fe = frontends.detect(kernel)
    if fe is None:
        titles = " or a ".join(frontends.get(n).title for n in frontends.names())
        raise SpecError(f"op kernel: expected a {titles}, got {type(kernel).__module__}.{type(kernel).__name__}")
    return fe.name


def op(name: str, *, kernel: Any, args: Sequence[Param], specs: Sequence[Spec], reference: Optional[str] = None,
       doc: str = "", grid: Optional[Sequence[str]] = None, backward: Optional[Backward] = None,
       configs: Optional[Sequence[Any]] = None, key: Optional[Sequence[str]] = None,
       prune: Optional[Callable[..., Any]] = None, mutable: Sequence[str] | bool = ()) -> OpDecl:
    """Declare an op.

    Args:
        name: op name (identifier); ``torch.ops.<namespace>.<name>``.
        kernel: a FlyDSL ``@flyc.jit`` launcher or a ``@triton.jit`` kernel.
        args: the kernel's parameters in order (:class:`Tensor`, :class:`Output`, :class:`Scalar`,
            :class:`Constexpr`, :class:`Value`).
        specs: specializations to build, tried in this order at run time.
        reference: name of the reference function in the references module.
        doc: one-line description.
        grid: Triton only: up to three expressions for the launch grid.
        backward: the op's derivative as another op of the spec file, e.g.
            ``Backward("rmsnorm_bwd", inputs={"dy": "grad:out", "x": "x", "w": "w"}, grads={"x": "dx", "w": "dw"})``:
            each backward input comes from a forward input or output (saved for backward) or from
            ``"grad:<output>"``; ``grads`` maps forward inputs to the backward op's outputs, or to inputs the
            backward op writes in place (``Tensor(..., mutable=True)``): the buffer it overwrites with the
            gradient, e.g. ``Backward("swiglu_bwd", inputs={"dc": "grad:c", "a": "a", "b": "b"},
            grads={"a": "a", "b": "b"})`` (docs/training.md). The loader registers it with torch autograd
            (checked against the bundle when the manifest is written).
        configs: a config space (:class:`flyship.compiler.tuning.Config` objects, or the DSL's own
            ``flydsl.Config`` / ``triton.Config``, converted): each spec x each config
            becomes a specialization ``<spec>__<config>``. Implied when ``kernel`` is ``flydsl.autotune`` /
            ``triton.autotune``'d (its configs, key and prune function are read). See docs/tuning.md.
        key: expressions over the inputs naming every tiled dimension (required with a config space unless
            the autotuned kernel names one); ``flyship tune`` keys its table by their values.
        prune: ``prune(configs, named_args) -> configs``, called per target before compiling
            (``named_args`` holds the example call and the target's limits).
        mutable: the input tensors the kernel writes in place, all at once (``mutable=["KeyCache",
            "ValueCache"]``): the same as ``Tensor(..., mutable=True)`` on each, which the write check's refusal
            names in this form; ``mutable=True``: every input tensor the compiled kernel stores through, as the
            write check finds them (the union over specs and targets), is mutable in the manifest.

    Raises:
        SpecError: naming the op and what is inconsistent.
    """
    written = mutable is True
    args = _mark_mutable(name, args, () if written else mutable)
    kernel, specs, space, args = _config_space(name, kernel, args, specs, configs, key, prune)
    kernel = builder_entry(name, kernel)  # a builder's wrapper around a launcher is the entry it is
    frontend = _detect_frontend(kernel)
    if inspect.isfunction(kernel):  # a plain wrapper the frontend itself accepts: called as the user calls it
        kernel = Entry(kernel, frontend)
    first = kernel[0].kernel if isinstance(kernel, (list, tuple)) and kernel else kernel
    kernel = list(kernel) if isinstance(kernel, tuple) else kernel
    decl = OpDecl(name=name, kernel=kernel, args=tuple(args), specs=tuple(specs), reference=reference,
                  doc=doc or (getattr(getattr(first, "fn", first), "__doc__", "") or "").strip().split("\n")[0],
                  grid=tuple(grid) if grid else None, frontend=frontend, backward=_backward(name, backward),
                  tuning=space, mutable_written=written)
    validate(decl)
    expanded = _frontends_get(frontend).expand_specs(decl)
    if expanded != decl.specs:  # e.g. Triton's JIT variant + the generic one (docs/triton.md)
        decl = dataclasses.replace(decl, specs=tuple(expanded))
        validate(decl)
    sf = _current()
    if any(o.name == name for o in sf.ops):
        raise SpecError(f"op {name}: declared twice in spec file {sf.path}; expected one op(...) per name (each is "
                        f"torch.ops.{sf.namespace or '<namespace>'}.{name}); rename one, or give the one op several "
                        "specs=[...]")
    sf.ops.append(decl)
    return decl


def _mark_mutable(name: str, args: Sequence[Param], mutable: Sequence[str]) -> Sequence[Param]:
    """``args`` with each input Tensor that ``op(..., mutable=[...])`` names declared ``mutable=True``."""
    if isinstance(mutable, (str, bool)) or not all(isinstance(n, str) for n in mutable):
        raise SpecError(f"op {name}: mutable: expected a list of the input tensors the kernel writes in place "
                        f"(mutable=[\"KeyCache\", \"ValueCache\"]) or True (every one the kernel writes), got "
                        f"{mutable!r}")
    tensors = {a.name for a in args if isinstance(a, Tensor)}
    unknown = [n for n in mutable if n not in tensors]
    if unknown:
        raise SpecError(f"op {name}: mutable={list(mutable)!r}: expected names of the op's input Tensors "
                        f"({', '.join(sorted(tensors)) or 'none'}), got {', '.join(map(repr, unknown))}; an Output is "
                        "written by definition, and only a tensor can be written in place")
    return [dataclasses.replace(a, mutable=True) if isinstance(a, Tensor) and a.name in mutable else a for a in args]


def _config_space(name: str, kernel: Any, args: Sequence[Param], specs: Sequence[Spec],
                  configs: Optional[Sequence[Any]], key: Optional[Sequence[str]],
                  prune: Optional[Callable[..., Any]]) -> tuple[Any, Sequence[Spec], Any, Sequence[Param]]:
    """An op's config space (``configs=``, or an autotuned kernel's): the kernel unwrapped, each spec x each config
    as a specialization, the :class:`~flyship.compiler.tuning.ConfigSpace` (None without configs), and ``args``
    with the compile-time launcher parameters an autotuned FlyDSL kernel's configs set declared
    (:func:`_tuned_constexprs`)."""
    space = None
    tuned = _tuning.from_autotuner(kernel)
    if tuned is not None:
        kernel, pairs, names, auto_prune = tuned
        if configs is None and pairs is None:
            raise SpecError(f"op {name}: autotuned kernel {_kernel_name(kernel)}: expected a list of configs, "
                            "got a function of the call's arguments; flyship builds ahead of time, so give the "
                            "configs to build: op(..., configs=[Config(...), ...])")
        if configs is None:
            configs = pairs
        args, names = _tuned_constexprs(kernel, args, names, configs)
        key = key if key is not None else (_tuning.key_from_names(names, args) if names else None)
        prune = prune or auto_prune
    if configs is not None:
        pairs = [c if isinstance(c, tuple) else (c, c) if isinstance(c, Config)
                 else (_tuning.from_native_config(c), c) for c in configs]
        if not pairs or not all(isinstance(c, Config) for c, _ in pairs):
            raise SpecError(f"op {name}: configs= expects a non-empty list of flyship.compiler.tuning.Config (or the "
                            f"DSL's own flydsl.Config / triton.Config, converted), got "
                            f"{[type(n).__name__ for _, n in pairs][:3]}; e.g. configs=[Config(BLOCK=256, "
                            "waves_per_eu=2)]")
        if not key:
            raise SpecError(f"op {name}: a config space needs key=(...): expressions naming every tiled dimension, "
                            "e.g. key=('a.shape[0]', 'b.shape[1]')")
        try:
            key = tuple(_expr.canonical(k) for k in key)
        except _expr.ExprError as e:
            raise SpecError(f"op {name}: key expression: {e}; a key is an integer expression over the inputs") \
                from None
        specs, table = _tuning.expand(name, _detect_frontend(kernel), args, specs, pairs)
        space = ConfigSpace(key=key, configs=table, prune=prune)
    elif key or prune:
        raise SpecError(f"op {name}: key= and prune= go with configs= (a config space); add configs=[Config(...)]")
    return kernel, specs, space, args


def _tuned_constexprs(kernel: Any, args: Sequence[Param], names: Sequence[str],
                      configs: Sequence[Any]) -> tuple[Sequence[Param], Sequence[str]]:
    """An autotuned launcher as its autotuner calls it (the frontend says which parameters are compile-time:
    FlyDSL's ``fx.Constexpr``; Triton's, none here): a compile-time parameter that a
    config sets and ``args`` does not declare is declared ``Constexpr`` (each config gives its value: upstream's
    ``Config(BLOCK_THREADS=256)``), and one the key names that neither ``args`` nor a config gives keeps the
    launcher's default, the same in every call, so it leaves the key (upstream's RMSNorm keys on
    ``weight_dtype_str``, default ``""``). Returns (args, key names)."""
    baked = {n: d for n, d in _frontends_get(_detect_frontend(kernel)).compile_time_parameters(kernel).items()
             if n not in {a.name for a in args}}
    if not baked:
        return args, names
    set_by: set[str] = set()
    for c in configs:
        c = c[0] if isinstance(c, tuple) else c
        c = c if isinstance(c, Config) else _tuning.from_native_config(c)
        set_by |= set(c.values) if c is not None else set()
    extra = [n for n in baked if n in set_by]
    defaulted = {n for n, has_default in baked.items() if has_default and n not in extra}
    return [*args, *(Constexpr(n) for n in extra)], [n for n in (names or ()) if n not in defaulted]


def composite(name: str, *, function: str, args: Sequence[Param], returns: Sequence[str], doc: str = "",
              workspaces: Sequence[Workspace] = ()) -> None:
    """Declare a composite op (schema 1.4): ``torch.ops.<namespace>.<name>``, run as ``function(ops, *args)`` from
    the references module, where ``ops`` is ``torch.ops.<namespace>`` (the bundle's ops, under the namespace the
    bundle is loaded with). It composes the bundle's ops and torch ops: host steps between launches, or a whole
    training op whose gradients come from the autograd pairs of the ops it calls.

    Args:
        name: op name (unique among the spec file's ops and composites).
        function: the function's name in the references module.
        args: its inputs in schema order: :class:`Tensor` (name and rank) and :class:`Scalar`.
        returns: the names of the tensors it returns (one: a Tensor; more: a tuple).
        doc: one-line description (default: the function's docstring is not read; give one).
        workspaces: buffers the loader allocates per call (schema 1.5, written as 5.0) on the device of the first
            tensor argument and passes after ``args``, as ``function(ops, *args, *workspaces)``; never part of the
            schema. A shape may read ``device.cu_count`` (the CUs/SMs of that device; 1 for CPU tensors that no
            recording or emulated device runs), so a per-CU partial buffer can be handed to an op that writes it in
            place (``Tensor("partial", rank=2, mutable=True)``) and reduced in torch after it::

                composite("colsum", function="colsum", args=[Tensor("x", rank=2)], returns=["y"],
                          workspaces=[Workspace("partial", shape=("device.cu_count", "x.shape[1]"), zero=True)])

    Example::

        composite("cross_entropy", function="cross_entropy", returns=["loss"],
                  args=[Tensor("logits", rank=2), Tensor("target", rank=1), Scalar("ignore_index", "int", -100)])

    Raises:
        SpecError: naming the composite and what is wrong (checked against the ops when the manifest is built).
    """
    sf = _current()
    entry = composite_entry(name, function, args, returns, doc, workspaces)
    if any(c.name == name for c in sf.composites):
        raise SpecError(f"composite {name}: declared twice in spec file {sf.path}; expected one composite(...) per "
                        "name")
    sf.composites.append(entry)


def _backward(name: str, b: Optional[Backward]) -> Optional[Backward]:
    """The declared backward with plain dicts (checked against the other ops when the manifest is built)."""
    if b is None:
        return None
    if not isinstance(b, Backward) or not isinstance(b.inputs, dict) or not isinstance(b.grads, dict):
        raise SpecError(f"op {name}: backward must be Backward(op, inputs={{...}}, grads={{...}}), got {b!r}")
    return Backward(op=b.op, inputs=dict(sorted(b.inputs.items())), grads=dict(sorted(b.grads.items())))



def run_spec_file(path: str, run: Callable[[], None]) -> SpecFile:
    """Run ``run`` (which executes the spec file) collecting its declarations."""
    global _CURRENT
    prev, _CURRENT = _CURRENT, SpecFile(path=path)
    try:
        run()
        sf = _CURRENT
    finally:
        _CURRENT = prev
    if not sf.namespace:
        raise SpecError(f"spec file {path}: call namespace('<name>') to name the torch op namespace")
    if not sf.ops:
        raise SpecError(f"spec file {path}: declares no ops; call op(...)", kind=NO_OPS)
    return sf


# SpecError.kind of a spec file that declares no op (flyship.compiler.declarations builds the other targets when
# only some targets' imports declare none).
NO_OPS = "NoOpsDeclared"
