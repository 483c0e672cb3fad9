"""Running ``triton.compile`` on a plan and reading back what it made: the kernel's metadata from the cubin or
hsaco itself, the kernarg layout at its offsets (Triton's two hidden pointers included), the parameters the
kernel writes, the tool versions.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import re
from typing import Any, Optional

from flyship.bundle import targets as _targets
from flyship.bundle.codeobject import CodeObjectFile
from flyship.bundle.cubin import CubinFile
from flyship.bundle.errors import BundleError
from flyship.bundle.manifest import KernargField, KernargLayout, KernelMetadata
from flyship.compiler.frontends import writes
from flyship.compiler.frontends.base import BuildContext, DSLError, FrontendError
from flyship.compiler.frontends.triton.planning import OWN_OPTIONS, TritonPlan


HIDDEN_PARAMS = ("global_scratch", "profile_scratch")


def version() -> str:
    """The installed Triton version."""
    import triton

    return str(triton.__version__)


def triton_target(target: _targets.TargetID) -> Any:
    """The ``triton.backends.compiler.GPUTarget`` for a target ID (warp size from the target's limits)."""
    from triton.backends.compiler import GPUTarget

    warp = _targets.limits(target)["wavefront_size"]
    if target.vendor == "nvidia":
        return GPUTarget("cuda", target.sm, warp)
    return GPUTarget("hip", target.processor, warp)


@contextlib.contextmanager
def _triton_cache(ctx: BuildContext):
    """Point Triton's compile cache at this variant's work folder, so every build really compiles."""
    from triton import knobs

    with knobs.cache.scope():
        knobs.cache.dir = str(ctx.workdir / "triton-cache")
        yield


def run_triton(p: TritonPlan, tid: _targets.TargetID, ctx: BuildContext, where: str) -> Any:
    """``triton.compile`` the plan for one target; returns Triton's ``CompiledKernel``.

    Raises:
        FrontendError: carrying Triton's own message, or an option Triton's backend does not know.
    """
    import triton
    from triton.compiler import ASTSource, make_backend

    gpu_target = triton_target(tid)
    backend = make_backend(gpu_target)
    known = {f.name for f in dataclasses.fields(backend.parse_options({}))}
    unknown = set(p.options) - known
    if unknown:
        close = {u: difflib.get_close_matches(u, [*known, *OWN_OPTIONS], n=1) for u in sorted(unknown)}
        meant = "; ".join(f"did you mean {m[0]!r} for {u!r}?" for u, m in close.items() if m)
        raise FrontendError(f"{where}: options {sorted(unknown)} are not Triton {gpu_target.backend} options; "
                            f"{meant + ' ' if meant else ''}known: {', '.join(sorted(known))} (plus flyship's "
                            f"{', '.join(OWN_OPTIONS)})")
    try:
        with _triton_cache(ctx):
            return triton.compile(ASTSource(p.fn, p.signature, p.constexprs, p.attrs), target=gpu_target,
                                  options=dict(p.options))
    except Exception as e:
        raise DSLError(f"{where}: Triton failed to compile {p.fn.__name__}: {type(e).__name__}: {e}") from None


def read_metadata(binary: bytes, fmt: str, symbol: str, p: TritonPlan, tid: _targets.TargetID,
                  where: str) -> tuple[KernelMetadata, str, Optional[int]]:
    """The kernel's metadata from the code object itself, with the parameter names of the signature.

    Returns:
        (metadata, the code object's own target ID, AMDHSA code object version or None).

    Raises:
        FrontendError: the code object's target is not the one asked for, or its parameters are not the
            signature's plus Triton's two hidden pointers (count, sizes, pointer kinds).
    """
    names = [x.name for x in p.params] + list(HIDDEN_PARAMS)
    pointers = [i for i, x in enumerate(p.params) if x.kind == "pointer"] + [len(p.params), len(p.params) + 1]
    limit = _targets.limits(tid)["max_workgroup_size"]
    try:
        if fmt == "cubin":
            cubin = CubinFile(binary, f"{symbol}.cubin")
            n = len(cubin.kernel_params(symbol))
            if n != len(names):
                raise FrontendError(f"{where}: the cubin's kernel {symbol} has {n} parameters; expected the "
                                    f"{len(p.params)} of the signature plus Triton's 2 hidden pointers ({names})")
            meta = cubin.kernel_metadata(symbol, pointer_ordinals=pointers, names=names, max_threads=limit)
            co_target, co_version = cubin.target, None
            co = _targets.parse_target(co_target)
            if co.sm != tid.sm:
                raise FrontendError(f"{where}: Triton built a cubin for {co_target}, expected sm_{tid.sm}")
        else:
            hsaco = CodeObjectFile(binary, f"{symbol}.hsaco")
            meta = hsaco.kernel_metadata(symbol)
            co_target, co_version = hsaco.target, hsaco.code_object_version
            co = _targets.parse_target(co_target)
            asked = dict(tid.features)
            if co.processor != tid.processor or any(asked.get(k, v) != v for k, v in co.features):
                raise FrontendError(f"{where}: Triton built an hsaco for {co_target}, which does not run on "
                                    f"{tid.text}")
            explicit = [a for a in meta.args if not a.hidden]
            if len(explicit) != len(names):
                raise FrontendError(f"{where}: the hsaco's kernel {symbol} has {len(explicit)} explicit arguments; "
                                    f"expected the {len(p.params)} of the signature plus Triton's 2 hidden pointers "
                                    f"({names})")
            kinds = {i: a.value_kind for i, a in enumerate(explicit)}
            bad = [names[i] for i in pointers if kinds[i] != "global_buffer"]
            if bad:
                raise FrontendError(f"{where}: hsaco arguments {bad} should be global_buffer pointers")
            renamed = iter(names)
            meta = dataclasses.replace(meta, args=tuple(
                a if a.hidden else dataclasses.replace(a, name=next(renamed)) for a in meta.args))
    except BundleError as e:
        raise FrontendError(f"{where}: {e}") from None
    explicit = sorted((a for a in meta.args if not a.hidden), key=lambda a: a.offset)
    for a, x in zip(explicit, p.params):
        if a.size != x.size:
            raise FrontendError(f"{where}: kernel parameter {x.name} ({x.signature}) is {a.size} bytes in the code "
                                f"object, expected {x.size}")
    return meta, co_target, co_version


def kernarg_layout(meta: KernelMetadata, p: TritonPlan, global_scratch: tuple[int, int], where: str) -> KernargLayout:
    """One kernarg field per explicit parameter at the code object's own offsets.

    Args:
        meta: the kernel's metadata (explicit args in parameter order, hidden pointers last).
        p: the plan (what each parameter is bound to).
        global_scratch: ``(bytes per program, alignment)``; ``(0, _)`` when the kernel needs none.
        where: for messages.

    Returns:
        The layout (the common tail checks it against the metadata).
    """
    explicit = sorted((a for a in meta.args if not a.hidden), key=lambda a: a.offset)
    fields = []
    for a, x in zip(explicit, p.params):
        fields.append(KernargField(offset=a.offset, size=x.size, kind=x.kind, type=x.field_type, arg=x.arg,
                                   dim=x.dim, expr=x.expr, value=x.value, kernel_arg=x.name))
    g, prof = explicit[len(p.params)], explicit[len(p.params) + 1]
    size, align = global_scratch
    if size > 0:
        fields.append(KernargField(offset=g.offset, size=8, kind="scratch", type="ptr", bytes_per_program=size,
                                   align=align, kernel_arg=HIDDEN_PARAMS[0]))
    else:
        fields.append(KernargField(offset=g.offset, size=8, kind="null", type="ptr", kernel_arg=HIDDEN_PARAMS[0]))
    fields.append(KernargField(offset=prof.offset, size=8, kind="null", type="ptr", kernel_arg=HIDDEN_PARAMS[1]))
    extent = max(a.offset + a.size for a in explicit)
    return KernargLayout(size=extent, alignment=max(8, meta.kernarg_segment_align), fields=tuple(fields))


def ptxas_version(arch: int) -> Optional[str]:
    """ptxas's version (``12.8.93``) as Triton runs it for ``sm_<arch>``, or None if it cannot be asked."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas_version

        m = re.search(r"V(\d+\.\d+\.\d+)", get_ptxas_version(arch))
        return m.group(1) if m else None
    except Exception:
        return None


def written_params(kernel: Any, p: TritonPlan, where: str) -> tuple[frozenset[int], frozenset[int]]:
    """The runtime parameters (code-object order: the signature's non-constexpr ones) that the kernel's TTIR
    stores or atomically updates through (:func:`flyship.compiler.frontends.writes.ttir_written_params`), and
    those it updates with an atomic read-modify-write (:func:`~flyship.compiler.frontends.writes.
    ttir_accumulated_params`).

    Raises:
        FrontendError: the TTIR's parameters are not the plan's, position by position (count, pointer or not):
            the binding would be wrong.
    """
    try:
        ttir = str(kernel.asm["ttir"])
        declared = writes.ttir_params(ttir)
        _names, written = writes.ttir_written_params(ttir)
        accumulated = writes.ttir_accumulated_params(ttir)
    except (KeyError, ValueError) as e:
        raise FrontendError(f"{where}: cannot read which parameters the kernel writes from its TTIR: {e}") from None
    # By position: the TTIR's argument names are the printer's, taken from the last local a kernel binds each
    # argument to (``src = out; if flag: src = x`` prints both as %src, %src_0), not the parameter names.
    got = [("pointer" if t.startswith("!tt.ptr") else "value") for _n, t in declared]
    want = [("pointer" if q.kind == "pointer" else "value") for q in p.params]
    if got != want:
        raise FrontendError(f"{where}: expected the TTIR to declare the kernel's runtime parameters "
                            f"{[q.name for q in p.params]} ({', '.join(want)}), got {len(got)}: "
                            f"{', '.join(f'{n}: {t}' for n, t in declared)}; report this with the kernel (Triton "
                            f"{version()})")
    return frozenset(written), frozenset(accumulated)


def _cubin_target(binary: bytes, symbol: str, where: str) -> str:
    try:
        return CubinFile(binary, f"{symbol}.cubin").target
    except BundleError as e:
        raise FrontendError(f"{where}: {e}") from None
