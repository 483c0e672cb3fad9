"""Tracing a FlyDSL launcher on the CPU: build the example call (placeholder tensors, pointers, streams), run
it compile-only while recording each ``@flyc.jit`` launcher call and what FlyDSL compiled for it
(:class:`LauncherCall`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
from pathlib import Path
from typing import Any

from flyship.compiler.frontends.base import DSLError, FrontendError, example_device
from flyship.compiler.frontends.flydsl import capture as _capture
from flyship.compiler.frontends.flydsl import versions as _versions
from flyship.compiler.frontends.flydsl.capture import Capture, Compile
from flyship.compiler.frontends.flydsl.entry import _entry_bindings, _torch_dtype, workspace_example_shape
from flyship.compiler.frontends.flydsl.signature import _is_stream, entry_arguments, launcher_name, pointer_parameters
from flyship.compiler.spec import Entry, OpDecl, Output, Scalar, Spec, Tensor, Value, Workspace


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
            named[a.name] = values[a.name] if a.float_literal() is not None else int(values[a.name])
        elif isinstance(a, Output):
            t = torch.empty(shapes[a.name], dtype=_torch_dtype(op.output_dtype_for(a, spec)))
            named[a.name] = _pointer_to(t, a.pointee or op.output_dtype_for(a, spec)) if a.name in pointers else t
        elif isinstance(a, Workspace) and not is_entry:  # an entry allocates its own
            named[a.name] = torch.zeros(workspace_example_shape(op, a, spec), dtype=_torch_dtype(a.dtype))
        elif isinstance(a, Scalar):
            if scalars[a.name] is None:
                raise FrontendError(f"op {op.name} spec {spec.name}: scalar {a.name} needs an example value "
                                    "(Spec(scalars=...) or Scalar(default=...))")
            named[a.name] = {"float": float, "int": int, "bool": bool}[a.type](scalars[a.name])
    kw = dict(spec.constexprs)
    if is_entry:
        # Each int its own object (CPython shares only -5..256), so an int the entry passes through unchanged is
        # bound to the declared argument it is, by identity, even when two are equal (Q's and O's row strides).
        return [int(str(v)) if type(v) is int else v for v in named.values()], kw
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


# torch dtype names -> FlyDSL numeric type names (``flydsl.expr``), for fx.Pointer element types.
_FX_NUMERIC = {"float64": "Float64", "float32": "Float32", "float16": "Float16", "bfloat16": "BFloat16",
               "int64": "Int64", "int32": "Int32", "int16": "Int16", "int8": "Int8", "uint8": "Uint8",
               "bool": "Boolean", "float8_e4m3fn": "Float8E4M3FN", "float8_e4m3fnuz": "Float8E4M3FNUZ",
               "float8_e5m2": "Float8E5M2", "float8_e5m2fnuz": "Float8E5M2FNUZ"}


def _pointer_to(t: Any, dtype: str) -> Any:
    """What a user passes for an ``fx.Pointer`` parameter: the tensor's data pointer as a FlyDSL pointer to
    ``dtype`` elements (its alignment defaults to the element size, as the guard's)."""
    import flydsl.compiler as flyc
    import flydsl.expr as fx

    if not hasattr(flyc, "from_c_void_p"):
        raise FrontendError(f"fx.Pointer parameters need FlyDSL >= 0.5.0 (flyc.from_c_void_p); this is "
                            f"{_versions.current().version}")
    return flyc.from_c_void_p(getattr(fx, _FX_NUMERIC[dtype]), t.data_ptr())


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
        raise FrontendError(f"entry points: this FlyDSL ({_versions.current().version}) has no "
                            "JitFunction._compile_or_execute for flyship to record the launch with (FlyDSL 0.5.0 "
                            "has); name the @flyc.jit launcher")

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
