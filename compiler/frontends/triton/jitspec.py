"""What Triton's JIT would specialize for a spec's example call, and the specializations a Triton op builds by
default: the JIT's for aligned inputs (guarded) and the generic one (docs/triton.md, "What is compiled").

Triton 3.6's JIT (``triton/runtime/jit.py``, ``specialize_impl`` with ``align=True``) marks, per call:

* a tensor argument whose data pointer is 16-byte aligned with ``tt.divisibility = 16`` (``"D"``);
* an int argument equal to 1 as the constant 1 (the parameter leaves the kernel's signature);
* any other int argument divisible by 16 (negative ones too) with ``tt.divisibility = 16``;
* nothing for float and bool arguments, for a parameter in ``do_not_specialize``, and no ``"D"`` for one in
  ``do_not_specialize_on_alignment`` (an int equal to 1 is still a constant).

flyship cannot see a call's pointers at build time, so the JIT variant assumes every tensor, output and
workspace pointer aligned (fresh torch tensors are) and takes each int's value from the example call. Its guard
says exactly that (alignment 16, ``expr == 1``, ``expr % 16 == 0``); the generic specialization after it takes
every other call.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from flyship.bundle import expr as _expr
from flyship.bundle.errors import BundleError
from flyship.compiler.frontends.base import FrontendError, example_device
from flyship.compiler.spec import Constexpr, OpDecl, Output, Scalar, Spec, Tensor, Value, Workspace

# Spec.options["specialize"]: "jit" (as Triton's JIT would for the example call, aligned pointers) or
# "declared" (only what the spec declares). A spec that gives neither is built both ways (expand_specs).
SPECIALIZE_MODES = ("jit", "declared")

# The name of the generic specialization built after a spec's JIT one.
GENERIC_SUFFIX = "__generic"


def jit_function(kernel: Any, where: str) -> Any:
    """The ``JITFunction`` behind a spec's ``kernel=`` (unwrapping ``@triton.heuristics``).

    Raises:
        FrontendError: an ``@triton.autotune`` kernel not declared through ``op()`` (docs/tuning.md) or
            anything that is not a ``@triton.jit`` function.
    """
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    if isinstance(kernel, Autotuner):
        raise FrontendError(f"{where}: kernel {kernel.fn.__name__} is @triton.autotune'd; declare it with op() (which "
                            "reads its configs as a config space, docs/tuning.md) or declare each config as a "
                            "Spec(constexprs=..., options={'num_warps': ...}) with the bare @triton.jit function")
    fn = kernel
    while not isinstance(fn, JITFunction) and hasattr(fn, "fn"):
        fn = fn.fn
    if not isinstance(fn, JITFunction):
        raise FrontendError(f"{where}: expected a @triton.jit function, got {type(kernel).__module__}."
                            f"{type(kernel).__name__}")
    return fn


def int_params(op: OpDecl) -> list[Any]:
    """The op's int kernel parameters (int Values and int scalars; a float Value is an fp32 constant)."""
    return [a for a in op.args if (isinstance(a, Value) and a.float_literal() is None)
            or (isinstance(a, Scalar) and a.type == "int")]


def example_ints(op: OpDecl, spec: Spec, target: Optional[str], scope: Optional[OpDecl], where: str) -> dict[str, int]:
    """Each Value and int scalar of ``op`` at the spec's example call (``scope``: the whole op of a launch view)."""
    whole = scope or op
    cx = {k: v for k, v in spec.constexprs.items() if isinstance(v, int) and not isinstance(v, bool)}
    scalars = {k: v for k, v in whole.example_scalars(spec).items() if isinstance(v, int) and not isinstance(v, bool)}
    out: dict[str, int] = {}
    try:
        shapes, strides = whole.example_shapes(spec), whole.example_strides(spec)
        device = example_device(spec, target)
        for a in int_params(op):
            if isinstance(a, Scalar):
                if scalars.get(a.name) is not None:
                    out[a.name] = int(scalars[a.name])
                continue
            text = _expr.substitute(a.expr, cx)
            if whole.workspaces:  # a Value may read a workspace's layout: its shape rule over the inputs
                text = _expr.substitute_tensors(text, {w.name: whole.workspace_shape(w, spec) for w in whole.workspaces})
            out[a.name] = _expr.evaluate_with_shapes(text, shapes, scalars, strides, device=device)
    except BundleError as e:
        raise FrontendError(f"{where}: cannot evaluate the kernel's int parameters at the example call: {e}") \
            from None
    return out


def jit_hints(op: OpDecl, spec: Spec, target: Optional[str], fn: Any, scope: Optional[OpDecl] = None,
              where: str = "") -> dict[str, str]:
    """What Triton's JIT specializes for the example call with aligned pointers: parameter name -> ``"D"``
    (``tt.divisibility = 16``) or ``"1"`` (the constant 1). ``fn`` is the kernel's ``JITFunction`` (its
    ``params`` carry ``do_not_specialize`` / ``do_not_specialize_on_alignment``)."""
    values = example_ints(op, spec, target, scope, where)
    out: dict[str, str] = {}
    for a, kp in zip(op.args, fn.params):
        if isinstance(a, Constexpr) or kp.do_not_specialize:
            continue
        align = not kp.do_not_specialize_on_alignment
        if isinstance(a, (Tensor, Output, Workspace)):
            if align:
                out[a.name] = "D"
        elif a.name in values:
            v = values[a.name]
            if v == 1:
                out[a.name] = "1"
            elif v % 16 == 0 and align:
                out[a.name] = "D"
    return out


def jit_int_type(v: int) -> str:
    """The signature type Triton's JIT gives an int argument of value ``v`` (``specialize_impl``)."""
    if -(2**31) <= v < 2**31:
        return "i32"
    return "i64" if -(2**63) <= v < 2**63 else "u64"


def type_difference(op: OpDecl, spec: Spec, target: Optional[str], scope: Optional[OpDecl], built: dict[str, str],
                    signature: dict[str, str], where: str) -> str:
    """Where the compile passes an int parameter in another type than Triton's JIT would for the example value
    (``Value(type="i64")`` for a value that fits in 32 bits, say): the JIT's binary would differ."""
    values = example_ints(op, spec, target, scope, where)
    names = dict(zip((a.name for a in op.args), signature))  # op name -> the kernel's parameter name
    odd = [f"{a} as {jit_int_type(v)} (compiled {signature[names[a]]})" for a, v in sorted(values.items())
           if built.get(a) != "1" and signature.get(names[a]) not in (None, "constexpr", jit_int_type(v))]
    return f"the JIT would pass {', '.join(odd)}" if odd else ""


def declared_hints(op: OpDecl, divisible: list[str]) -> dict[str, str]:
    """What a spec declares itself: parameter name -> ``"D"`` (``divisible_by_16``, ``Tensor(alignment=16k)``)."""
    out = {d: "D" for d in divisible}
    for a in op.args:
        if isinstance(a, Tensor) and a.alignment and a.alignment % 16 == 0:
            out[a.name] = "D"
    return out


def difference(built: dict[str, str], jit: dict[str, str]) -> str:
    """How a compile's specialization differs from the JIT's (empty when it is the JIT's): one phrase per kind."""
    parts = []
    for what, mark in (("tt.divisibility=16", "D"), ("the constant 1", "1")):
        missing = sorted(k for k, v in jit.items() if v == mark and built.get(k) != mark)
        extra = sorted(k for k, v in built.items() if v == mark and jit.get(k) != mark)
        if missing:
            parts.append(f"the JIT would give {', '.join(missing)} {what}")
        if extra:
            parts.append(f"{', '.join(extra)} get {what}, the JIT's would not")
    return "; ".join(parts)


def expand_specs(op: OpDecl, kernel_fn: Any) -> tuple[Spec, ...]:
    """The specializations a Triton op builds: each spec that sets no ``options["specialize"]`` as the JIT's
    variant for aligned inputs (its own name) followed by the generic one (``<name>__generic``), unless the JIT
    would specialize nothing beyond what the spec declares (then the spec alone), or unless an earlier spec of the op
    already takes every call the JIT's variant would (a hand-hinted ``Spec("bf16_a16", options={"divisible_by_16":
    [...]})`` listed first): that variant could never run, so the spec is built as declared only, as before the JIT
    default (round 2), and :func:`jit_duplicate` says so in flyc-build's notes. An op with a config space keeps its
    specs as declared (its tuning table names them)."""
    if op.tuning is not None:
        return op.specs
    out: list[Spec] = []
    for s in op.specs:
        if "specialize" in s.options:
            out.append(s)
            continue
        if not _jit_adds(op, s, kernel_fn) or _duplicated_by(op, s, kernel_fn, out):
            out.append(dataclasses.replace(s, options={**s.options, "specialize": "declared"}))
            continue
        out.append(dataclasses.replace(s, options={**s.options, "specialize": "jit"}))
        out.append(dataclasses.replace(s, name=s.name + GENERIC_SUFFIX, options={**s.options, "specialize": "declared"}))
    return tuple(out)


def _jit_adds(op: OpDecl, s: Spec, kernel_fn: Any) -> bool:
    """Whether the JIT would specialize some parameter of some launch beyond what ``s`` declares, in any form
    of ``s`` (``per_target``)."""
    views = [(op.launch_view(launch), op, launch.kernel) for launch in op.launches] or [(op, None, kernel_fn)]
    for _key, form in s.resolved():
        div = form.options.get("divisible_by_16", [])
        div = [div] if isinstance(div, str) else list(div)
        for view, scope, kernel in views:
            fn = jit_function(kernel, f"op {op.name} spec {s.name}")
            try:
                jit = jit_hints(view, form, None, fn, scope, f"op {op.name} spec {s.name}")
            except FrontendError:  # e.g. a Value over device.cu_count, known per target: build both
                return True
            if set(jit.items()) - set(declared_hints(view, div).items()):
                return True
    return False


def _views(op: OpDecl, kernel_fn: Any) -> list[tuple[OpDecl, Optional[OpDecl], Any]]:
    return [(op.launch_view(launch), op, launch.kernel) for launch in op.launches] or [(op, None, kernel_fn)]


def _guard_hints(op: OpDecl, s: Spec, kernel_fn: Any, jit: bool) -> Optional[list[set[tuple[str, str]]]]:
    """Per launch, the hints the guard of ``s`` is built from (declared, plus the JIT's when ``jit``); None when
    they cannot be told without a target (a Value over ``device.cu_count``)."""
    div = s.options.get("divisible_by_16", [])
    div = [div] if isinstance(div, str) else list(div)
    out = []
    for view, scope, kernel in _views(op, kernel_fn):
        hints = set(declared_hints(view, div).items())
        if jit:
            try:
                hints |= set(jit_hints(view, s, None, jit_function(kernel, f"op {op.name} spec {s.name}"), scope,
                                       f"op {op.name} spec {s.name}").items())
            except FrontendError:
                return None
        out.append(hints)
    return out


def _duplicated_by(op: OpDecl, s: Spec, kernel_fn: Any, earlier: list[Spec]) -> Optional[Spec]:
    """The earlier spec that takes every call the JIT's variant of ``s`` would take (tried first, so that variant
    could never run), or None. The test mirrors the build's reachability check on what is known before compiling:
    the same dtypes, layouts, targets and device size, the earlier spec's constraints among ``s``'s, and its
    specialization hints (each a guard fact: alignment 16, ``% 16 == 0``, ``== 1``) among those of the JIT's
    variant, with each hinted int computed by the same expression in both. Specs with ``per_target`` are left to
    the build's check."""
    if s.per_target:
        return None
    mine = _guard_hints(op, s, kernel_fn, jit=True)
    if mine is None:
        return None
    ints = {a.name: a.expr for a in op.args if isinstance(a, Value)}
    for t in earlier:
        if (t.per_target or t.dtypes != s.dtypes or t.strides != s.strides or t.cu_count != s.cu_count
                or not set(t.constraints) <= set(s.constraints)
                or (t.targets and not (s.targets and set(s.targets) <= set(t.targets)))):
            continue
        theirs = _guard_hints(op, t, kernel_fn, jit=t.options.get("specialize") == "jit")
        if theirs is None or not all(h <= m for h, m in zip(theirs, mine)):
            continue
        cx = [{k: v for k, v in x.constexprs.items() if isinstance(v, int) and not isinstance(v, bool)} for x in (t, s)]
        named = {k for h in theirs for k, _ in h if k in ints}
        if all(_expr.substitute(ints[k], cx[0]) == _expr.substitute(ints[k], cx[1]) for k in named):
            return t
    return None


def jit_duplicate(op: OpDecl, spec: Spec) -> str:
    """flyc-build's note for a spec that :func:`expand_specs` built as declared only because its JIT variant would
    duplicate an earlier spec (empty for any other spec)."""
    if (op.tuning is not None or spec.options.get("specialize") != "declared" or spec.name.endswith(GENERIC_SUFFIX)
            or any(s.name == spec.name + GENERIC_SUFFIX for s in op.specs)):
        return ""
    plain = dataclasses.replace(spec, options={k: v for k, v in spec.options.items() if k != "specialize"})
    earlier = list(op.specs[:[s.name for s in op.specs].index(spec.name)]) if spec in op.specs else []
    if not _jit_adds(op, plain, op.kernel):
        return ""
    t = _duplicated_by(op, plain, op.kernel, earlier)
    if t is None:
        return ""
    return (f"built as declared only: the JIT-like variant flyship builds by default for a spec without "
            f"options['specialize'] (since round 2) would take only calls {t.name!r}, listed first, already takes, "
            f"so it could never run; set options={{'specialize': 'declared'}} on {spec.name!r} to say so, or list "
            f"{spec.name!r} before {t.name!r} to build its JIT variant")
