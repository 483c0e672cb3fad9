"""The FlyDSL frontend: trace a ``@flyc.jit`` launcher on the CPU, assemble its ISA, prove, bind kernargs.

The only module that imports ``flydsl`` (lazily, inside the worker process of one target). What differs
between FlyDSL releases (how to compile without launching, target triple, tensor ABI) is asked of the version
adapter (:mod:`flyship.compiler.frontends.flydsl.versions`). The target comes from ``FLYDSL_GPU_ARCH`` (a
bare ``ARCH`` overrides it, so both are set). FlyDSL compiles once per launcher call (an entry point may call
several launchers), as for any user, with its IR dump off; :mod:`flyship.compiler.frontends.flydsl.capture`
takes the final ISA, FlyDSL's own code object and the host function from each compile. The disk cache is
turned off so every build really compiles.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
from pathlib import Path
from typing import Any, Sequence

from flyship.bundle import targets as _targets
from flyship.bundle.manifest import DTYPES, FIELD_TYPES, KernargField, KernargLayout, KernelMetadata, Launch
from flyship.compiler.configs import Autotuned, Config, is_native, native_pairs, refuse_pre_hook
from flyship.compiler.frontends.base import (BuildContext, DSLError, Frontend, FrontendError, KernelBuild,
                                            WorkerSetup, example_device)
from flyship.compiler.frontends.flydsl import capture as _capture
from flyship.compiler.frontends.flydsl import host_ir
from flyship.compiler.frontends.flydsl.capture import Capture, Compile
from flyship.compiler.frontends.flydsl import versions as _versions
from flyship.compiler.spec import Constexpr, Entry, OpDecl, Output, Scalar, Spec, Tensor, Value, Workspace


def target_environment(target: str) -> dict[str, str]:
    """The variables FlyDSL reads the target from at import: ``FLYDSL_GPU_ARCH`` and the bare ``ARCH``, which
    overrides it (FlyDSL falls back to gfx942 silently when neither is set and no GPU answers)."""
    processor = target.split(":")[0]
    return {"FLYDSL_GPU_ARCH": processor, "ARCH": processor}


def setup_environment(target: str, rocm_root: Path | None, cache_dir: Path) -> None:
    """Set the process environment FlyDSL reads, before flydsl is imported (worker initializer)."""
    _versions.apply_compile_environment(os.environ)
    os.environ.update(target_environment(target))
    os.environ["FLYDSL_RUNTIME_CACHE_DIR"] = str(cache_dir)
    if rocm_root is not None:
        os.environ["ROCM_PATH"] = str(rocm_root)


def version() -> str:
    return _versions.current().version


def _torch_dtype(name: str) -> Any:
    import torch

    if name not in DTYPES:
        raise FrontendError(f"dtype {name!r}: expected one of {', '.join(DTYPES)}")
    return getattr(torch, name)


def _call_args(op: OpDecl, spec: Spec, target: str | None = None) -> tuple[list[Any], dict[str, Any]]:
    """The example call: placeholder CPU tensors and scalars, constexprs and stream placeholders.

    A launcher gets every argument by parameter name (upstream launchers put ``stream`` or a constexpr before
    runtime parameters: ``(x, stream, n: Constexpr, out)``; ``check_signature`` made the declared names the
    launcher's own). An entry gets its declared arguments positionally (they are its leading parameters,
    :func:`entry_arguments`) and the constexprs by keyword.

    Returns:
        (positional arguments, keyword arguments).
    """
    import torch

    shapes = op.example_shapes(spec)
    strides = op.example_strides(spec)
    scalars = op.example_scalars(spec)
    values = op.example_values(spec, example_device(spec, target))
    is_entry = isinstance(op.kernel, Entry)
    passed = entry_arguments(op) if is_entry else op.args
    named: dict[str, Any] = {}
    pointers = set() if is_entry else pointer_parameters(op.kernel)
    for a in passed:
        if isinstance(a, Tensor):
            # A strided example (a transposed weight) is a view of a buffer just large enough for it.
            t = torch.empty_strided(shapes[a.name], strides[a.name], dtype=_torch_dtype(spec.dtypes[a.name]))
            named[a.name] = _pointer_to(t, a.pointee or spec.dtypes[a.name]) if a.name in pointers else t
        elif isinstance(a, Value):
            named[a.name] = int(values[a.name])
        elif isinstance(a, Output):
            t = torch.empty(shapes[a.name], dtype=_torch_dtype(op.output_dtype_for(a, spec)))
            named[a.name] = _pointer_to(t, op.output_dtype_for(a, spec)) if a.name in pointers else t
        elif isinstance(a, Workspace) and not is_entry:  # an entry allocates its own
            named[a.name] = torch.zeros(workspace_example_shape(op, a, spec), dtype=_torch_dtype(a.dtype))
        elif isinstance(a, Scalar):
            if scalars[a.name] is None:
                raise FrontendError(f"op {op.name} spec {spec.name}: scalar {a.name} needs an example value "
                                    "(Spec(scalars=...) or Scalar(default=...))")
            named[a.name] = {"float": float, "int": int, "bool": bool}[a.type](scalars[a.name])
    kw = dict(spec.constexprs)
    if is_entry:
        return list(named.values()), kw
    kw.update(_stream_placeholders(op.kernel))
    if not _takes_keywords(op.kernel, named):
        return list(named.values()), kw
    return [], {**named, **kw}


def _takes_keywords(kernel: Any, names: dict[str, Any]) -> bool:
    """Whether the launcher takes each of ``names`` as a keyword (no positional-only or ``*args`` parameter
    among them; a signature flyship cannot read keeps the declared order positionally)."""
    import inspect

    fn = getattr(kernel, "func", None) or kernel
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return all(n in params and params[n].kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                   inspect.Parameter.KEYWORD_ONLY) for n in names)


def launcher_constant(a: Any) -> bool:
    """A ``Value`` whose expression is an integer literal (``Value("block", "128")``): in an entry's
    declaration, the constant the entry itself passes to a launcher (``launcher(x, out, 128)``), not one of the
    entry's parameters."""
    return isinstance(a, Value) and a.expr.strip().lstrip("+-").isdigit()


def entry_arguments(op: OpDecl) -> list[Tensor | Output | Scalar | Value]:
    """What flyship passes an entry, in order: its declared Tensor/Output/Scalar/Value parameters, but not the
    constants the entry passes its launchers itself (:func:`launcher_constant`)."""
    return [a for a in op.args if isinstance(a, (Tensor, Output, Scalar, Value)) and not launcher_constant(a)]


# torch dtype names -> FlyDSL numeric type names (``flydsl.expr``), for fx.Pointer element types.
_FX_NUMERIC = {"float64": "Float64", "float32": "Float32", "float16": "Float16", "bfloat16": "BFloat16",
               "int64": "Int64", "int32": "Int32", "int16": "Int16", "int8": "Int8", "uint8": "Uint8",
               "bool": "Boolean", "float8_e4m3fn": "Float8E4M3FN", "float8_e4m3fnuz": "Float8E4M3FNUZ",
               "float8_e5m2": "Float8E5M2", "float8_e5m2fnuz": "Float8E5M2FNUZ"}


def pointer_parameters(kernel: Any) -> set[str]:
    """Names of the launcher's runtime parameters annotated ``fx.Pointer`` (FlyDSL 0.5.0: a raw global pointer
    argument, passed as ``flyc.from_c_void_p(<element type>, address)``)."""
    return {n for n, ann in (runtime_parameters(kernel) or []) if _annotation_name(ann) == "Pointer"}


def _pointer_to(t: Any, dtype: str) -> Any:
    """What a user passes for an ``fx.Pointer`` parameter: the tensor's data pointer as a FlyDSL pointer to
    ``dtype`` elements (its alignment defaults to the element size, as the guard's)."""
    import flydsl.compiler as flyc
    import flydsl.expr as fx

    if not hasattr(flyc, "from_c_void_p"):
        raise FrontendError(f"fx.Pointer parameters need FlyDSL >= 0.5.0 (flyc.from_c_void_p); this is "
                            f"{version()}")
    return flyc.from_c_void_p(getattr(fx, _FX_NUMERIC[dtype]), t.data_ptr())


def workspace_example_shape(op: OpDecl, w: Workspace, spec: Spec) -> tuple[int, ...]:
    """A workspace's shape at the spec's example call."""
    from flyship.bundle import expr as _expr

    shapes = op.example_shapes(spec)
    scal = {k: v for k, v in op.example_scalars(spec).items() if isinstance(v, int) and not isinstance(v, bool)}
    return tuple(_expr.evaluate_with_shapes(e, shapes, scal) for e in op.workspace_shape(w, spec))


def _stream_placeholders(kernel: Any) -> dict[str, Any]:
    """``{name: fx.Stream(None)}`` for each ``fx.Stream`` parameter the launcher declares without a default.

    FlyDSL binds a launcher's arguments with ``inspect``, so a ``stream: fx.Stream`` with no default must be
    passed; ``fx.Stream(None)`` is the default queue, which FlyDSL accepts on a machine with no GPU (the
    stream is a launch-time argument, never part of the code object).
    """
    import inspect

    import flydsl.expr as fx

    fn = getattr(kernel, "func", None) or kernel
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return {}
    return {p.name: fx.Stream(None) for p in params
            if p.default is inspect.Parameter.empty and _is_stream(p.annotation)}


def _is_stream(annotation: Any) -> bool:
    name = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    return name.split(".")[-1] == "Stream" or getattr(annotation, "_is_stream_param", False)


@dataclasses.dataclass
class LauncherCall:
    """One ``@flyc.jit`` launcher call of a trace and the one FlyDSL compile it made.

    Attributes:
        compile: what FlyDSL's pipeline for this call showed flyship (:class:`.capture.Compile`).
        op: the declaration in this launcher's parameter order (an entry's arguments mapped back to the op's).
        name: the launcher's name (its host function's symbol).
        where: how messages name this call (``op .. spec .. target ..``, plus ``launcher k (name)`` when an
            entry calls several).
    """

    compile: Compile
    op: OpDecl
    name: str
    where: str


def _trace(op: OpDecl, spec: Spec, target: str) -> list[LauncherCall]:
    """Compile the launcher without launching (as the version adapter says), or call the entry point as the
    user does, capturing what flyship needs from each compile (:mod:`.capture`).

    An entry may call several ``@flyc.jit`` launchers in sequence (phase 1, then phase 2 reading a buffer the
    entry allocated): each call is its own FlyDSL compile (its own pipeline, ISA, code object and host
    function), recorded in call order.

    Returns:
        One :class:`LauncherCall` per launcher call, in order (one for a launcher named directly).
    """
    pos, kw = _call_args(op, spec, target)
    launcher = op.kernel.fn if isinstance(op.kernel, Entry) else op.kernel
    log = io.StringIO()  # what FlyDSL prints; kept for error reports only
    hints = getattr(launcher, "compile_hints", None)
    _forget_compiled(launcher)
    launches: list[tuple[Any, tuple, dict, list[Compile]]] = []
    try:
        if spec.options:
            launcher.compile_hints = {**(hints or {}), **spec.options}
        with contextlib.redirect_stdout(log), _capture.capturing() as captured:
            if isinstance(op.kernel, Entry):
                # The user's own call path: the launcher is called directly, which compiles without
                # launching only under COMPILE_ONLY=1 (read at call time).
                with _recording(launches, captured), _compile_only():
                    launcher(*pos, **kw)
            elif pointer_parameters(op.kernel):
                # A raw pointer is no compile placeholder to FlyDSL 0.5.0 (a CPU tensor is): without
                # COMPILE_ONLY it would load the HIP runtime to launch.
                with _compile_only():
                    _versions.current().compile(launcher, pos, kw)
            else:
                _versions.current().compile(launcher, pos, kw)
    except FrontendError:
        raise
    except Exception as e:  # the DSL's own message, with where it happened
        raise DSLError(f"op {op.name} spec {spec.name} target {target}: FlyDSL failed to trace/compile "
                       f"launcher {launcher_name(op.kernel)!r}: {type(e).__name__}: {e}{_user_frame(e)}") from None
    finally:
        if spec.options:
            launcher.compile_hints = hints
    where = f"op {op.name} spec {spec.name} target {target}"
    if not isinstance(op.kernel, Entry):
        _check_pipelines(len(captured.compiles), where, "")
        return [LauncherCall(captured.compiles[0], op, launcher_name(op.kernel), where)]
    if not launches:
        raise FrontendError(f"{where}: expected entry {op.kernel.__name__!r} to call a @flyc.jit launcher, got no "
                            "call; flyship builds the launches an entry makes")
    calls = []
    for k, (jit, _, _, compiles) in enumerate(launches):
        at = where if len(launches) == 1 else f"{where} launcher {k + 1} ({launcher_name(jit)})"
        _check_pipelines(len(compiles), at, f" for launcher {launcher_name(jit)!r}")
        calls.append((jit, compiles[0], at))
    if captured.pipelines != len(launches):
        raise FrontendError(f"{where}: expected FlyDSL to run one compile pipeline per @flyc.jit call of entry "
                            f"{op.kernel.__name__!r} ({len(launches)}), got {captured.pipelines}; flyship builds "
                            "what the entry's launcher calls compile, nothing compiled outside them")
    bound = _entry_bindings(op, spec, [(jit, args, kwargs) for jit, args, kwargs, _ in launches], pos, where,
                            target)
    return [LauncherCall(c, traced, launcher_name(jit), at) for (jit, c, at), traced in zip(calls, bound)]


def _check_pipelines(n: int, where: str, which: str) -> None:
    """Each launcher call must run exactly one FlyDSL compile pipeline."""
    if n != 1:
        raise FrontendError(f"{where}: expected FlyDSL to run one compile pipeline{which}, got {n}; "
                            + ("a cached compile runs none (is FLYDSL_RUNTIME_ENABLE_CACHE=0 set?)"
                               if not n else "flyship builds launchers that compile one module"))


@contextlib.contextmanager
def _compile_only():
    prev = os.environ.get("COMPILE_ONLY")
    os.environ["COMPILE_ONLY"] = "1"
    try:
        yield
    finally:
        if prev is None:
            os.environ.pop("COMPILE_ONLY", None)
        else:
            os.environ["COMPILE_ONLY"] = prev


@contextlib.contextmanager
def _recording(launches: list, captured: Capture):
    """Record each outermost ``@flyc.jit`` call made while the block runs as (launcher, args, kwargs, the
    compile pipelines it ran) (FlyDSL 0.5.0: ``JitFunction._compile_or_execute``; a call inside a trace has a
    current MLIR context). Each call compiles afresh: a second call of one launcher with the same types would
    otherwise hit FlyDSL's in-memory cache and run no pipeline to take its artefacts from."""
    from flydsl._mlir import ir
    from flydsl.compiler.jit_function import JitFunction

    orig = getattr(JitFunction, "_compile_or_execute", None)
    if orig is None:
        raise FrontendError(f"entry points: this FlyDSL ({version()}) has no JitFunction._compile_or_execute for "
                            "flyship to record the launch with (FlyDSL 0.5.0 has); name the @flyc.jit launcher")

    def record(self, args, kwargs, *, execute, return_compiled=False):
        if ir.Context.current is not None:
            return orig(self, args, kwargs, execute=execute, return_compiled=return_compiled)
        _forget_compiled(self)
        first = captured.pipelines
        result = orig(self, args, kwargs, execute=execute, return_compiled=return_compiled)
        launches.append((self, tuple(args), dict(kwargs), captured.compiles[first:]))
        return result

    JitFunction._compile_or_execute = record
    try:
        yield
    finally:
        JitFunction._compile_or_execute = orig


def _entry_bindings(op: OpDecl, spec: Spec, calls: list[tuple[Any, tuple, dict]], pos: list,
                    where: str, target: str | None = None) -> list[OpDecl]:
    """The op's declaration in each launcher call's parameter order (:func:`_entry_binding`), in call order. A
    buffer the entry allocated is one declared Workspace in every call that receives it (by identity: the
    recorded arguments keep each buffer alive, so no two share an ``id``); every declared workspace must be
    passed to some launcher."""
    _check_constants_pinned(op, spec, pos, where)
    allocated: dict[int, Workspace] = {}
    bound = [_entry_binding(op, spec, jit, args, kwargs, pos, allocated,
                            where if len(calls) == 1 else f"{where} launcher {k + 1} ({launcher_name(jit)})", target)
             for k, (jit, args, kwargs) in enumerate(calls)]
    spare = [w.name for w in op.workspaces if w not in allocated.values()]
    if spare:
        launchers = "its launchers" if len(calls) > 1 else "the launcher"
        raise FrontendError(f"{where}: entry {op.kernel.__name__!r} passes {launchers} no tensor for {spare}; declare "
                            "only the workspaces the entry allocates")
    return bound


def _example_sizes(op: OpDecl, pos: list) -> list[tuple[str, int]]:
    """(expression, example value) of every dimension and element count of the op's example input tensors, in
    declaration order: ``("x.shape[0]", 128)``, ..., ``("x.numel", 524288)``."""
    import torch

    sizes: list[tuple[str, int]] = []
    for a, v in zip(entry_arguments(op), pos):
        if isinstance(a, Tensor) and isinstance(v, torch.Tensor):
            sizes += [(f"{a.name}.shape[{i}]", int(d)) for i, d in enumerate(v.shape)]
            sizes.append((f"{a.name}.numel", int(v.numel())))
    return sizes


def _check_constants_pinned(op: OpDecl, spec: Spec, pos: list, where: str) -> None:
    """A constant ``Value("m", "64")`` equal to an example input's dimension (or element count) is baked into
    the kernel: the spec must pin that size with a constraint (``"x.shape[0] == 64"``), else a call of another
    size would dispatch to a kernel fixed to the example's."""
    pins = {c.replace(" ", "") for c in (*spec.constraints, *op.constraints(spec))}
    sizes = _example_sizes(op, pos)
    for a in op.args:
        if not launcher_constant(a):
            continue
        value = int(a.expr.strip())
        same = [e for e, v in sizes if v == value]
        if same and not any(f"{e}=={value}" in pins or f"{value}=={e}" in pins for e in same):
            raise FrontendError(
                f"{where}: constant Value({a.name!r}, {a.expr!r}) equals the example's {' / '.join(same)}, expected a "
                f"constraint pinning that size (e.g. constraints=({same[0] + ' == ' + str(value)!r},)), got none; "
                "without it the kernel is fixed to this size and a call of another size would run it: if the entry "
                f"computes the value from the tensor, make it an entry parameter declared Value({a.name!r}, "
                f"{same[0]!r}) instead; if it is that fixed size, add the constraint; if it is unrelated, give the "
                "example another size")


def _shape_hint(op: OpDecl, pos: list, name: str, value: Any) -> str:
    """For an int the entry passes that equals an example input's size: how to declare it (the entry takes
    it as a parameter, declared ``Value(name, "x.shape[0]")``), else ""."""
    if type(value) is not int:
        return ""
    same = [e for e, v in _example_sizes(op, pos) if v == value]
    if not same:
        return ""
    return (f"; {value} is the example's {' / '.join(same)}: if the entry computes it from the tensor, take it as "
            f"an entry parameter instead and declare Value({name!r}, {same[0]!r}) in args= (the entry passes it on "
            f"to the launcher), so each call gets its own size")


def _entry_binding(op: OpDecl, spec: Spec, jit: Any, args: tuple, kwargs: dict, pos: list,
                   allocated: dict[int, Workspace], where: str, target: str | None = None) -> OpDecl:
    """The op's declaration in one inner launcher's parameter order: each runtime argument the entry passed
    is one of the op's own (a tensor passed through, by identity, bare or wrapped by ``flyc.from_torch_tensor``
    / ``flyc.from_dlpack``; a scalar equal to exactly one declared scalar's example, or to a declared constant
    ``Value("n", "128")``), or a buffer the entry allocated: the Workspace ``allocated`` maps it to (an earlier
    launcher received it), else the next unused declared Workspace of its shape and dtype (recorded in
    ``allocated``). An argument the entry computed itself cannot be bound, and is refused."""
    import inspect

    import torch

    sig = inspect.signature(jit.func)
    bound = sig.bind(*args, **kwargs)
    declared = entry_arguments(op)
    values = op.example_values(spec, example_device(spec, target))
    constants = [(a, values[a.name]) for a in op.args if launcher_constant(a)]
    mapped: list = []
    for name, value in bound.arguments.items():
        ann = sig.parameters[name].annotation
        if _is_stream(ann) or (ann is not inspect.Parameter.empty and _is_compile_time(ann)):
            continue
        wrapped = _wrapped_tensor(value)
        if wrapped is not None and wrapped is not value:
            value = wrapped  # flyc.from_torch_tensor(t).mark_layout_dynamic(...): the launcher reads t's storage
        if isinstance(value, torch.Tensor):
            hit = [a for a, v in zip(declared, pos) if v is value]
            if not hit and id(value) in allocated:
                hit = [allocated[id(value)]]
            if not hit:  # a buffer the entry allocated: the next unused Workspace of its shape and dtype
                used = list(allocated.values())
                hit = [w for w in op.workspaces if w not in used
                       and tuple(value.shape) == workspace_example_shape(op, w, spec)
                       and value.dtype == _torch_dtype(w.dtype) and value.is_contiguous()][:1]
                if hit:
                    allocated[id(value)] = hit[0]
            if not hit:
                raise FrontendError(f"{where}: entry {op.kernel.__name__!r} passes launcher parameter {name!r} a "
                                    f"tensor that is none of the op's arguments (shape {tuple(value.shape)}, "
                                    f"{value.dtype}: a view, a fresh tensor, or one buffer more than the declared "
                                    "workspaces); flyship binds tensors the entry passes through unchanged (or "
                                    "wrapped by flyc.from_torch_tensor / from_dlpack), and buffers it allocates as "
                                    "declared Workspace(...)s of the same shape rule and dtype (contiguous), one per "
                                    "buffer; for a view (t.view(-1), t.view(torch.int8), t.reshape(...)), pass the "
                                    "tensor itself and let the launcher index it, or declare the op's tensor as the "
                                    "launcher sees it (a flat 1-D Tensor with rules on its numel, or the dtype the "
                                    "launcher reads) so the entry passes it unchanged")
        elif isinstance(value, (bool, int, float)):
            hit = [a for a, v in zip(declared, pos) if isinstance(a, (Scalar, Value)) and type(v) is type(value)
                   and v == value]
            hit += [a for a, v in constants if type(value) is int and v == value]
            if len(hit) != 1:
                shape = _shape_hint(op, pos, name, value) if not hit else ""
                constant = (f"; {'else ' if shape else ''}a constant the entry passes itself (a fixed size, pinned "
                            f"by a constraint if it equals an input's) is declared Value({name!r}, {str(value)!r}) "
                            "in args=" if type(value) is int and not hit else "")
                constant = shape + constant
                raise FrontendError(f"{where}: entry {op.kernel.__name__!r} passes launcher parameter {name!r} the "
                                    f"value {value!r}, which is {'none' if not hit else 'more than one'} of the op's "
                                    "scalar arguments; flyship binds scalars the entry passes through (give the "
                                    f"example scalars distinct values){constant}")
        else:
            raise FrontendError(f"{where}: entry {op.kernel.__name__!r} passes launcher parameter {name!r} a "
                                f"{type(value).__module__}.{type(value).__qualname__}, expected a torch tensor (or "
                                "one wrapped by flyc.from_torch_tensor / flyc.from_dlpack) or a Python scalar; "
                                "flyship binds only the op's tensors and scalars the entry passes through: pass the "
                                "tensor itself, or name the launcher in op(kernel=...)")
        mapped.append(hit[0])
    consts = tuple(a for a in op.args if not isinstance(a, (Tensor, Output, Scalar, Value, Workspace)))
    return op.call_view(tuple(mapped) + consts)


def _wrapped_tensor(value: Any) -> Any:
    """The torch tensor a FlyDSL tensor argument wraps (FlyDSL 0.5.0: ``flyc.from_torch_tensor(t)`` keeps ``t`` as
    ``torch_tensor``, ``flyc.from_dlpack(t)`` as ``dltensor``; ``mark_layout_dynamic`` returns the same wrapper),
    else None."""
    import torch

    if isinstance(value, torch.Tensor):
        return value
    for attr in ("torch_tensor", "dltensor"):
        inner = getattr(value, attr, None)
        if isinstance(inner, torch.Tensor):
            return inner
    return None


def _forget_compiled(kernel: Any) -> None:
    """Drop what the launcher compiled earlier in this worker: two specializations with the same FlyDSL cache
    key (same dtypes and constexprs, other constraints) would otherwise hit FlyDSL's in-memory cache and
    run no pipeline for the second (FlyDSL 0.5.0: ``JitFunction._mem_cache``, ``cache_manager``)."""
    cache = getattr(kernel, "_mem_cache", None)
    if isinstance(cache, dict):
        cache.clear()
    manager = getattr(kernel, "cache_manager", None)
    if isinstance(getattr(manager, "memory_cache", None), dict):
        manager.memory_cache.clear()
    if hasattr(kernel, "_last_compiled"):
        kernel._last_compiled = None


def launcher_name(kernel: Any) -> str:
    """The Python name of a ``@flyc.jit`` launcher (also its host function's symbol in the IR)."""
    if isinstance(kernel, Entry):
        return kernel.__name__
    fn = getattr(kernel, "func", None) or getattr(kernel, "__wrapped__", None) or kernel
    return getattr(fn, "__name__", repr(kernel))


def _is_compile_time(annotation: Any) -> bool:
    """Whether FlyDSL bakes a parameter with this annotation into the code (``fx.Constexpr[...]``, a
    ``Type[...]`` parameter, an ``@fx.struct`` of constexpr fields): asked of FlyDSL itself where it can say."""
    try:
        from flydsl.compiler.jit_argument import is_type_param_annotation
        from flydsl.expr.typing import Constexpr

        if Constexpr.is_constexpr_annotation(annotation) or is_type_param_annotation(annotation):
            return True
    except Exception:  # an annotation FlyDSL's helpers cannot classify: fall back to the name
        pass
    return "Constexpr" in str(annotation) or _is_constexpr_struct(annotation)


def _is_constexpr_struct(annotation: Any) -> bool:
    """An ``@fx.struct`` whose fields are all ``fx.Constexpr[...]``: it has no storage, FlyDSL bakes it in."""
    fields = getattr(annotation, "__annotations__", None) if isinstance(annotation, type) else None
    if not fields or not hasattr(annotation, "replace"):  # fx.struct classes have .replace()
        return False
    return all(_is_compile_time(f) for f in fields.values())


def runtime_parameters(kernel: Any) -> list[tuple[str, Any]] | None:
    """The launcher's runtime parameters, in order, as ``(name, annotation)``: every parameter but the
    compile-time ones and the stream. None when the signature is unreadable."""
    import inspect

    fn = getattr(kernel, "func", None) or kernel
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    return [(p.name, p.annotation) for p in params if not _is_stream(p.annotation)
            and not (p.annotation is not inspect.Parameter.empty and _is_compile_time(p.annotation))]


def _compile_time(kernel: Any, required: bool = True) -> list[str] | None:
    """Names of the launcher's compile-time parameters (constexprs, constexpr structs): those without a default
    (``required``), or all of them; None when the signature is unreadable or takes ``**kwargs``."""
    import inspect

    fn = getattr(kernel, "func", None) or kernel
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return [p.name for p in params if (p.default is inspect.Parameter.empty or not required)
            and p.annotation is not inspect.Parameter.empty and _is_compile_time(p.annotation)]


def _check_constexpr_keys(op: OpDecl, declared: set[str]) -> None:
    """Every key of a spec's ``constexprs=`` (and of its per-target forms) is a compile-time parameter of the
    launcher: a declared ``Constexpr``, or one the launcher gives a default (which the spec may override
    without declaring it). A typo would otherwise reach FlyDSL as an unexpected keyword, per spec and target."""
    known = _compile_time(op.kernel, required=False)
    if known is None:
        return
    known = set(known) | declared
    for s in op.specs:
        forms = [("", s.constexprs)] + [(f" (per_target {t})", dict(e).get("constexprs", {}))
                                        for t, e in s.per_target.items()]
        for where, values in forms:
            unknown = sorted(set(values) - known)
            if unknown:
                raise FrontendError(
                    f"op {op.name} spec {s.name}{where}: constexprs= gives {unknown}, which launcher "
                    f"{launcher_name(op.kernel)!r} does not take as a compile-time parameter (it takes "
                    f"{sorted(known) or 'none'}); fix the name or remove the key")


# FlyDSL's numeric annotation names -> the spec's Scalar type they take.
_NUMERIC_KIND = {"Float16": "float", "BFloat16": "float", "Float32": "float", "Float64": "float",
                 "Int8": "int", "Int16": "int", "Int32": "int", "Int64": "int", "Uint8": "int", "Uint16": "int",
                 "Uint32": "int", "Uint64": "int", "Boolean": "bool", "float": "float", "int": "int", "bool": "bool"}


def _annotation_name(annotation: Any) -> str:
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    return text.split(".")[-1]


def check_signature(op: OpDecl) -> None:
    """The spec's ``args`` must name the launcher's runtime parameters, in the launcher's order, and each
    ``Scalar`` must have the kind (int/float/bool) of the launcher's parameter annotation.

    A swapped pair (say the output declared before the input) would otherwise build, and the kernel
    would read the fresh output and write the caller's input; an ``int`` Scalar against an ``fx.Float32``
    parameter would give an ``int`` schema and an f32 kernel argument.

    Raises:
        FrontendError: naming both lists, or the scalar and both types.
    """
    if isinstance(op.kernel, Entry):
        _check_entry_signature(op)
        return
    params = runtime_parameters(op.kernel)
    if params is None:
        return
    # A parameter the spec declares a Constexpr is the user's word that FlyDSL bakes it in (FlyDSL says so
    # by the trace): never ask to declare it again.
    constexprs = {a.name for a in op.args if isinstance(a, Constexpr)}
    params = [(n, ann) for n, ann in params if n not in constexprs]
    _check_constexpr_keys(op, constexprs)
    undeclared = [n for n in _compile_time(op.kernel) or [] if n not in constexprs]
    if undeclared:
        raise FrontendError(
            f"op {op.name}: launcher {launcher_name(op.kernel)!r} takes compile-time parameters "
            f"{', '.join(undeclared)} with no default; declare {', '.join(f'Constexpr({n!r})' for n in undeclared)} "
            "in args= and give each a value per spec in Spec(constexprs=...)")
    want = [n for n, _ in params]
    declared = [a for a in op.args if isinstance(a, (Tensor, Output, Scalar, Value, Workspace))]
    got = [a.name for a in declared]
    if got != want:
        missing = [n for n in want if n not in got]
        extra = [n for n in got if n not in want]
        hint = []
        if missing:
            hint.append(f"declare {', '.join(missing)}")
        if extra:
            hint.append(f"remove {', '.join(extra)} (not a runtime parameter of the launcher)")
        if not hint:
            hint.append("reorder them")
        raise FrontendError(
            f"op {op.name}: args= declares the runtime parameters ({', '.join(got)}) but launcher "
            f"{launcher_name(op.kernel)!r} takes ({', '.join(want)}); {'; '.join(hint)} (Tensor/Output/Scalar in "
            "the launcher's order, Value for integers computed from them, Workspace for buffers the call allocates; "
            "constexprs and the stream are not listed)")
    for a, (_, ann) in zip(declared, params):
        kind = _NUMERIC_KIND.get(_annotation_name(ann))
        if isinstance(a, Scalar) and kind is not None and kind != a.type:
            raise FrontendError(
                f"op {op.name}: Scalar({a.name!r}, {a.type!r}) declares an {a.type} but launcher "
                f"{launcher_name(op.kernel)!r} annotates {a.name} as {_annotation_name(ann)} ({kind}); declare "
                f"Scalar({a.name!r}, {kind!r}) so the schema and the kernel argument agree")
        if isinstance(a, Value) and kind is not None and (kind != "int" or (
                _annotation_name(ann) in ("Int32", "Int64") and _annotation_name(ann) != f"Int{a.type[1:]}")):
            raise FrontendError(
                f"op {op.name}: Value({a.name!r}, type={a.type!r}) but launcher {launcher_name(op.kernel)!r} "
                f"annotates {a.name} as {_annotation_name(ann)}; give the Value the parameter's integer type")
        if isinstance(a, (Tensor, Output, Workspace)) and kind is not None:
            raise FrontendError(f"op {op.name}: {a.name} is declared a tensor but launcher "
                                f"{launcher_name(op.kernel)!r} annotates it as {_annotation_name(ann)}; declare "
                                f"Scalar({a.name!r}, {kind!r})")


def _check_entry_signature(op: OpDecl) -> None:
    """An entry is called with the declared arguments positionally: they are its leading parameters, in order,
    and every later parameter has a default."""
    import inspect

    try:
        params = list(inspect.signature(op.kernel.fn).parameters.values())
    except (TypeError, ValueError):
        return
    got = [a.name for a in entry_arguments(op)]
    lead = [p.name for p in params[:len(got)]]
    rest = [p.name for p in params[len(got):] if p.default is inspect.Parameter.empty
            and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    takes = f"entry {op.kernel.__name__!r} takes ({', '.join(p.name for p in params)})"
    if got != lead:
        # flyship calls the entry with the declared arguments positionally: they must be its first parameters.
        raise FrontendError(
            f"op {op.name}: expected args= to declare the first {len(got)} parameters of entry "
            f"{op.kernel.__name__!r} in its order ({', '.join(lead)}), got ({', '.join(got)}); {takes}: flyship "
            "passes the declared Tensor/Output/Scalar/Value arguments positionally, so declare its leading "
            "parameters in its order")
    if rest:
        raise FrontendError(
            f"op {op.name}: args= declares ({', '.join(got)}) and {takes}; flyship calls the entry with the declared "
            f"arguments only, so every later parameter needs a default, got {', '.join(rest)} without one; declare "
            "them too, or give them defaults")


# Spec.options keys the FlyDSL frontend passes to FlyDSL as the launcher's compile hints (FlyDSL 0.5.0:
# ``JitFunction.compile_hints``); every other key is refused. ``maxnreg`` FlyDSL itself refuses (it never
# reached LLVM on ROCm); use ``waves_per_eu``.
COMPILE_HINT_OPTIONS = ("waves_per_eu", "fast_fp_math", "unsafe_fp_math", "llvm_options")


def check_options(op: OpDecl) -> None:
    """Refuse ``Spec.options`` keys FlyDSL would not read.

    Raises:
        FrontendError: naming the op, the spec and the keys flyship passes.
    """
    for s in (form for spec in op.specs for _, form in spec.resolved()):
        if s.options and isinstance(op.kernel, Entry):
            raise FrontendError(f"op {op.name} spec {s.name}: options are compile hints for a launcher, but entry "
                                f"{op.kernel.__name__!r} is called as the user calls it; set the hints in the entry "
                                "(CompilationContext.compile_hints) or name the launcher")
        bad = [k for k in s.options if k not in COMPILE_HINT_OPTIONS]
        if bad:
            why = (" (FlyDSL refuses maxnreg on ROCm: it never reached LLVM; use waves_per_eu to target occupancy)"
                   if "maxnreg" in bad else "")
            raise FrontendError(f"op {op.name} spec {s.name}: options {bad} are not read by the FlyDSL frontend"
                                f"{why}; it passes {', '.join(COMPILE_HINT_OPTIONS)} to FlyDSL as compile hints")


def _user_frame(e: BaseException) -> str:
    """`` (at file:line in function)`` for the innermost traceback frame outside FlyDSL and flyship: where in
    the user's kernel or launcher the error happened."""
    import traceback

    import flydsl
    import torch

    skip = tuple(str(Path(m.__file__).resolve().parent) for m in (flydsl, torch))
    ours = str(Path(__file__).resolve().parents[2])  # flyship's compiler package
    frames = [f for f in traceback.extract_tb(e.__traceback__)
              if not str(Path(f.filename).resolve()).startswith((*skip, ours))]
    if not frames:
        return ""
    f = frames[-1]
    return f" (at {f.filename}:{f.lineno} in {f.name}: {(f.line or '').strip()})"


def _artefacts(captured: Compile, name: str, where: str) -> tuple[str, list[bytes], list[str], Any]:
    """From one compile's capture: the ISA to assemble, FlyDSL's own code object(s), the host function's
    argument types before lowering and the lowered host function.

    Raises:
        FrontendError: an artefact is missing, naming what FlyDSL did instead.
    """
    if not captured.objects:
        raise FrontendError(f"{where}: FlyDSL's pipeline made no gpu.binary; FlyDSL writes it only when the compile "
                            "reaches the binary step (is ROCM_PATH a toolkit with ld.lld and the AMDGPU bitcode?)")
    if not captured.isa:
        raise FrontendError(f"{where}: FlyDSL's ROCDL serializer printed no ISA under the LLVM debug type "
                            f"{_capture.ISA_DEBUG_TYPE!r}; external codegen (FLYDSL_COMPILE_LLVM_DIR) does not "
                            "serialize in-process: unset it for flyc-build")
    origin = captured.origin_types.get(name)
    lowered = captured.lowered.get(name)
    if origin is None or lowered is None:
        found = sorted(captured.origin_types)
        raise FrontendError(f"{where}: expected host function {name!r} with gpu.launch_func and lowered arguments in "
                            f"FlyDSL's pipeline, got {'host functions ' + str(found) if found else 'no host function'}"
                            f"{'' if origin is None else ' (never lowered)'}; this FlyDSL lowers differently than "
                            "flyship knows")
    return captured.isa[0], [data for _, data in captured.objects], origin, lowered


def _written(captured: Compile, symbol: str, where: str) -> tuple[frozenset[int] | None, frozenset[int]]:
    """The kernel parameters whose pointers reach a store or an atomic in the LLVM IR the capture kept, and those
    that reach an atomic read-modify-write (:func:`flyship.compiler.frontends.writes.llvm_written_params`,
    :func:`~flyship.compiler.frontends.writes.llvm_accumulated_params`); (None, empty) when this FlyDSL printed
    none."""
    from flyship.compiler.frontends import writes

    modules = [text for text in captured.llvm_ir if f"@{symbol}(" in text or f'@"{symbol}"(' in text]
    if not modules:
        return None, frozenset()
    try:
        return (frozenset(writes.llvm_written_params(modules[-1], symbol)),
                frozenset(writes.llvm_accumulated_params(modules[-1], symbol)))
    except ValueError as e:
        raise FrontendError(f"{where}: cannot read which parameters kernel {symbol} writes from its LLVM IR: {e}"
                            ) from None


def _layout(analysis: host_ir.HostAnalysis, meta, where: str) -> KernargLayout:
    """Place each kernel argument's fields at the metadata offset of that argument."""
    explicit = [a for a in meta.args if not a.hidden]
    if len(explicit) != len(analysis.kernel_args):
        raise FrontendError(f"{where}: the code object has {len(explicit)} explicit kernel arguments but the launcher "
                            f"passes {len(analysis.kernel_args)}")
    fields = []
    for i, (marg, plans, size) in enumerate(zip(explicit, analysis.kernel_args, analysis.kernel_arg_sizes)):
        if marg.size != size:
            raise FrontendError(f"{where}: kernel argument {i} is {marg.size} bytes in the code object metadata but "
                                f"{size} bytes as FlyDSL lowered it")
        for p in plans:
            fields.append(KernargField(
                offset=marg.offset + p.rel_offset, size=FIELD_TYPES[p.type], kind=p.kind, type=p.type, arg=p.arg,
                dim=p.dim, expr=p.expr, kernel_arg=marg.name or f"arg{i}"))
    extent = max((a.offset + a.size for a in explicit), default=0)
    return KernargLayout(size=extent, alignment=max(8, meta.kernarg_segment_align), fields=tuple(fields))


def _launch_builds(call: LauncherCall, isa: str, ours: bytes, theirs_all: list[bytes], origin_types: list[str],
                   lowered: Any, op: OpDecl, spec: Spec, target: str, ctx: BuildContext, flydsl_version: str,
                   ir: Any) -> list[KernelBuild]:
    """One build per ``gpu.launch_func`` of one launcher call, in launch order: a multi-phase launcher
    launches several kernels, all in the one code object FlyDSL built for that call."""
    from flyship.compiler.frontends.flydsl import proof as _proof

    analyses = host_ir.analyze_functions(origin_types, lowered, call.op, spec, ir,
                                         device=example_device(spec, target))
    alignment = {a.name: a.alignment or DTYPES[spec.dtypes[a.name]] for a in op.args if isinstance(a, Tensor)}
    builds = []
    for analysis in analyses:
        symbol = analysis.kernel_name
        written, accumulated = _written(call.compile, symbol, call.where)
        # A kernel with fast-math hints can carry several code objects in one gpu.binary (same code, other
        # target flags): ours must equal each of them, for every kernel it launches.
        proofs = [_proof.prove(ours, theirs, symbol, target) for theirs in theirs_all]
        builds.append(KernelBuild(
            target=target, code_object=ours, format="hsaco", symbol=symbol,
            launch=Launch(grid=analysis.grid, block=analysis.block, dynamic_lds=analysis.dynamic_lds),
            proof=proofs[0], toolchain={**ctx.toolchain.describe(), "flydsl": flydsl_version},
            example_grid=analysis.grid_at_example, constraints=analysis.constraints, alignment=alignment,
            tensor_abi=analysis.tensor_abi,
            isa=isa if ctx.keep_ir and not builds else None, facts=analysis,
            written=written, accumulated=accumulated))
    return builds


class FlydslFrontend(Frontend):
    """FlyDSL ``@flyc.jit`` launchers, for AMD targets: trace on the CPU, assemble FlyDSL's ISA with flyship's
    LLVM toolchain, prove the code object equal to FlyDSL's own, read grid and bindings from the host IR."""

    name = "flydsl"
    title = "FlyDSL launcher"
    vendors = frozenset({"amd"})
    needs_llvm = True
    declares_grid = False
    config_options = COMPILE_HINT_OPTIONS  # flydsl.Config's num_warps and kwargs are launcher keywords: Constexprs
    packages = ("flydsl",)
    # MLIR_: FlyDSL's pipeline is MLIR's; ARCH and COMPILE_ONLY: bare names FlyDSL reads (docs/flydsl-versions.md).
    env_prefixes = ("FLYDSL_", "MLIR_")
    env_names = ("ARCH", "COMPILE_ONLY")
    install_hint = ("run flyc-build from the build environment (make install creates .venv-flydsl: "
                    ".venv-flydsl/bin/flyc-build), or pip install flydsl==0.5.0 there")

    def accepts(self, kernel: Any) -> bool:
        if isinstance(kernel, Entry):
            return kernel.frontend == self.name
        return (type(kernel).__module__ or "").startswith("flydsl")

    def prepare_planning(self, amd_target: str | None) -> None:
        # Kernel modules may read the arch at import time: the planning import of a target sees what its worker
        # sees (setup_environment), and never falls back to a GPU probe.
        if amd_target:
            os.environ.update(target_environment(amd_target))

    def target_environment(self, target: _targets.TargetID) -> dict[str, str]:
        return target_environment(target.text) if target.vendor == "amd" else {}

    def check_installed(self, targets: Sequence[_targets.TargetID]) -> None:
        _versions.check_installed()  # before the spec file imports flydsl: a release outside the range is refused

    def read_autotuner(self, kernel: Any) -> Autotuned | None:
        # FlyDSL 0.5.0 flydsl.autotune.Autotuner: .fn, .configs, .key, .prune_configs_by(configs, named_args).
        if not is_native(kernel, "Autotuner", self.packages):
            return None
        return Autotuned(kernel.fn, native_pairs(kernel, self.read_config, "flydsl"), list(kernel.key),
                         kernel.prune_configs_by)

    def read_config(self, config: Any) -> Config | None:
        # FlyDSL 0.5.0 flydsl.autotune.Config: kwargs and num_warps are keywords of the launcher (Constexprs of
        # the op), waves_per_eu a compile hint.
        if not is_native(config, "Config", self.packages):
            return None
        refuse_pre_hook(config)
        values = dict(config.kwargs)
        if config.num_warps is not None:
            values["num_warps"] = config.num_warps
        if config.waves_per_eu is not None:
            values["waves_per_eu"] = config.waves_per_eu
        return Config(**values)

    def prepare_worker(self, setup: WorkerSetup) -> None:
        import tempfile

        cache = Path(tempfile.mkdtemp(prefix="flydsl-cache-", dir=setup.scratch_root))
        setup_environment(setup.target, setup.rocm_root, cache)

    def check_declaration(self, op: OpDecl) -> None:
        check_signature(op)
        check_options(op)

    def version(self) -> str:
        return version()

    def compile(self, op: OpDecl, spec: Spec, target: str, ctx: BuildContext) -> KernelBuild:
        """Compile one specialization of a FlyDSL op for one AMD target and prove the code object(s).

        An entry that calls several ``@flyc.jit`` launchers gives one code object per launcher call, each
        assembled from that call's ISA and proved against that call's own FlyDSL code object; the launches of
        all calls, in order, are the variant's launches.

        Returns:
            A :class:`KernelBuild` whose code object flyship assembled from the ISA FlyDSL's own code object
            was assembled from, and proved equal to that code object; ``facts`` is the host-IR analysis;
            ``then`` the launches after the first.

        Raises:
            FrontendError: trace/compile failure (with FlyDSL's message), or IR flyship cannot bind.
            flyship.compiler.frontends.flydsl.proof.ProofError: our code object differs from FlyDSL's.
        """
        from flydsl._mlir import ir

        from flyship.compiler.frontends.flydsl import assemble as _assemble

        check_signature(op)
        adapter = _versions.current()
        triple = adapter.triple.rstrip("-")

        def assemble_call(call: LauncherCall, asm: Any) -> tuple[str, bytes, list[bytes], list[str], Any]:
            """The call's ISA (features declared) and our code object, then FlyDSL's code object(s), the host
            function's argument types and the lowered host function (:func:`_artefacts`)."""
            isa, theirs_all, origin_types, lowered = _artefacts(call.compile, call.name, call.where)
            adapter.check_isa_target(isa, call.where)
            # FlyDSL compiles for the bare processor (features "any"; its pipeline takes no target features,
            # and LLVM refuses xnack/sramecc as subtarget features): a target ID with features is declared on
            # that ISA, and the proof allows, and records, exactly what that changes.
            isa = _assemble.set_target_features(isa, target, call.where)
            ours = asm.assemble(isa, code_object_version=ctx.code_object_version)
            return isa, ours, theirs_all, origin_types, lowered

        # The assembler and linker start now and load while FlyDSL compiles; they get the ISA at the end.
        with _assemble.Assembler(ctx.toolchain, target, triple, ctx.workdir / "asm") as asm:
            calls = _trace(op, spec, target)
            assembled = [assemble_call(calls[0], asm)]
        for k, call in enumerate(calls[1:], 2):  # each further launcher call: its own code object
            with _assemble.Assembler(ctx.toolchain, target, triple, ctx.workdir / f"asm{k}") as asm:
                assembled.append(assemble_call(call, asm))
        builds: list[KernelBuild] = []
        for call, artefacts in zip(calls, assembled):
            builds.extend(_launch_builds(call, *artefacts, op, spec, target, ctx, adapter.version, ir))
        return dataclasses.replace(builds[0], then=tuple(builds[1:]))

    def kernarg_layout(self, build: KernelBuild, meta: KernelMetadata, where: str) -> KernargLayout:
        return _layout(build.facts, meta, where)
