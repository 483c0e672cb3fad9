"""What a FlyDSL launcher (or an ``Entry``) declares, read from its Python signature without tracing: its runtime
parameters in order, which are compile-time (``fx.Constexpr``, ``@fx.struct``), streams and pointers, checked
against the op's ``args=`` before any worker starts; and the compile hints a spec's options may set.
"""

from __future__ import annotations

from typing import Any

from flyship.compiler.frontends.base import FrontendError
from flyship.compiler.spec import Constexpr, Entry, OpDecl, Output, Scalar, Tensor, Value, Workspace


def _literal(a: Any) -> bool:
    return isinstance(a, Value) and (a.expr.strip().lstrip("+-").isdigit() or a.float_literal() is not None)


def launcher_constant(a: Any, op: OpDecl | None = None) -> bool:
    """A ``Value`` whose expression is an integer literal (``Value("block", "128")``): in an entry's
    declaration, the constant the entry itself passes to a launcher (``launcher(x, out, 128)``), not one of the
    entry's parameters. Given ``op``, a literal ``Value`` that falls where the entry's positional parameter of its
    name is (``Value("Q_stride1", "4096")`` fifth for ``_launch(Q, K, V, O, Q_stride1, ...)``) is that parameter, a
    constant the caller passes, not one the entry passes itself (:func:`entry_arguments`)."""
    if not _literal(a):
        return False
    return op is None or not any(b is a for b in entry_arguments(op))


def _entry_positional(op: OpDecl) -> list[str]:
    """The names of the op's entry's positional parameters in order (those flyship can pass a declared argument);
    none when the kernel is no entry."""
    import inspect

    if not isinstance(op.kernel, Entry):
        return []
    try:
        params = inspect.signature(op.kernel.fn).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def entry_arguments(op: OpDecl) -> list[Tensor | Output | Scalar | Value]:
    """What flyship passes an entry, in order: its declared Tensor/Output/Scalar/Value parameters, but not the
    constants the entry passes its launchers itself: a literal ``Value`` is passed only where it falls on the
    entry's positional parameter of its name (so a spec whose constants the entry passes on itself reads as
    before)."""
    names = _entry_positional(op)
    out: list = []
    for a in op.args:
        if not isinstance(a, (Tensor, Output, Scalar, Value)):
            continue
        if _literal(a) and not (len(out) < len(names) and names[len(out)] == a.name):
            continue
        out.append(a)
    return out


def pointer_parameters(kernel: Any) -> set[str]:
    """Names of the launcher's runtime parameters annotated ``fx.Pointer`` (FlyDSL 0.5.0: a raw global pointer
    argument, passed as ``flyc.from_c_void_p(<element type>, address)``)."""
    return {n for n, ann in (runtime_parameters(kernel) or []) if _annotation_name(ann) == "Pointer"}


def _is_stream(annotation: Any) -> bool:
    name = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    return name.split(".")[-1] == "Stream" or getattr(annotation, "_is_stream_param", False)


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
        if isinstance(a, Value) and kind is not None and a.float_literal() is not None:
            if _annotation_name(ann) != "Float32":
                raise FrontendError(
                    f"op {op.name}: Value({a.name!r}, {a.expr!r}, type='f32') but launcher "
                    f"{launcher_name(op.kernel)!r} annotates {a.name} as {_annotation_name(ann)}; a float Value is "
                    "packed as f32: annotate the parameter fx.Float32, or declare a Scalar")
        elif isinstance(a, Value) and kind is not None and (kind != "int" or (
                _annotation_name(ann) in ("Int32", "Int64") and _annotation_name(ann) != f"Int{a.type[1:]}")):
            raise FrontendError(
                f"op {op.name}: Value({a.name!r}, type={a.type!r}) but launcher {launcher_name(op.kernel)!r} "
                f"annotates {a.name} as {_annotation_name(ann)}; give the Value the parameter's integer type")
        if isinstance(a, (Tensor, Output, Workspace)) and kind is not None:
            raise FrontendError(f"op {op.name}: {a.name} is declared a tensor but launcher "
                                f"{launcher_name(op.kernel)!r} annotates it as {_annotation_name(ann)}; declare "
                                f"Scalar({a.name!r}, {kind!r})")


def _check_entry_signature(op: OpDecl) -> None:
    """An entry is called with the declared arguments positionally: they are its leading parameters, in order
    (an entry taking ``*args``, as upstream FlyDSL's attention builders return, receives those past its named
    positional parameters there), and every parameter that receives none has a default."""
    import inspect

    try:
        params = list(inspect.signature(op.kernel.fn).parameters.values())
    except (TypeError, ValueError):
        return
    got = [a.name for a in entry_arguments(op)]
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    star = any(p.kind is p.VAR_POSITIONAL for p in params)
    lead = [p.name for p in positional[:len(got)]]
    order = ", ".join(lead + [_shown(p) for p in params if p.kind is p.VAR_POSITIONAL and len(got) > len(lead)])
    rest = [p.name for p in positional[len(got):] + [p for p in params if p.kind is p.KEYWORD_ONLY]
            if p.default is inspect.Parameter.empty]
    takes = f"entry {op.kernel.__name__!r} takes ({', '.join(_shown(p) for p in params)})"
    if got[:len(lead)] != lead or (len(got) > len(lead) and not star):
        # flyship calls the entry with the declared arguments positionally: they must be its first parameters.
        raise FrontendError(
            f"op {op.name}: expected args= to declare the first {len(got)} parameters of entry "
            f"{op.kernel.__name__!r} in its order ({order}), got ({', '.join(got)}); {takes}: flyship "
            "passes the declared Tensor/Output/Scalar/Value arguments positionally, so declare its leading "
            "parameters in its order")
    if rest:
        raise FrontendError(
            f"op {op.name}: args= declares ({', '.join(got)}) and {takes}; flyship calls the entry with the declared "
            f"arguments only, so every later parameter needs a default, got {', '.join(rest)} without one; declare "
            "them too, or give them defaults")


def _shown(p: Any) -> str:
    """A parameter as an error message names it: ``x``, ``*args``, ``**kwargs``."""
    return {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "") + p.name


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


def _is_launcher(obj: Any) -> bool:
    """A ``@flyc.jit`` launcher (FlyDSL 0.5.0: ``flydsl.compiler.jit_function.JitFunction``)."""
    t = type(obj)
    return (t.__module__ or "").startswith("flydsl") and t.__name__ == "JitFunction"


def reaches_launcher(fn: Any, depth: int = 3) -> bool:
    """Whether plain Python function ``fn`` can call a ``@flyc.jit`` launcher: one held in its closure (what a
    builder returns: ``def build(...): @flyc.jit def launch(...) ...; def run(...): launch(...); return run``) or
    named as a global it reads, directly or through plain functions it reaches the same way (``depth`` levels)."""
    import inspect

    seen: set[int] = set()
    todo = [(fn, 0)]
    while todo:
        f, d = todo.pop()
        if id(f) in seen or not inspect.isfunction(f):
            continue
        seen.add(id(f))
        cells = []
        for c in f.__closure__ or ():
            try:
                cells.append(c.cell_contents)
            except ValueError:  # an empty cell (a name bound later)
                continue
        names = [f.__globals__[n] for n in f.__code__.co_names if n in f.__globals__]
        for obj in (*cells, *names):
            if _is_launcher(obj):
                return True
            if d < depth and inspect.isfunction(obj):
                todo.append((obj, d + 1))
    return False
