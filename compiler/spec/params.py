"""The spec API's parameter declarations: what an op's ``args=[...]`` lists, in the kernel's order."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

from flyship.compiler.configs import kernel_name as _kernel_name
from flyship.errors import SpecError


@dataclasses.dataclass(frozen=True)
class Tensor:
    """An input tensor parameter.

    Args:
        name: argument name in the op's schema.
        rank: number of dimensions.
        alignment: required data-pointer alignment in bytes (default: the element size).
        pointee: for a FlyDSL launcher parameter annotated ``fx.Pointer``: the element type of the pointer
            flyship passes for this tensor (a dtype name; default: the tensor's dtype). Upstream builders often
            pass bytes: ``flyc.from_c_void_p(fx.Uint8, t.data_ptr())`` is ``pointee="uint8"``.
        mutable: the kernel writes this input in place (a KV cache, an accumulator, the residual of a fused
            add + RMSNorm). The torch schema says ``Tensor(a!) name``, no fresh output is made for it, and the
            op's reference must write it in place too. flyc-build refuses a kernel that stores through a tensor
            declared neither an ``Output`` nor ``mutable``.
        batch: accept leading batch dimensions: a call's ``(B, S, H)`` reaches the kernel, written for ``rank``
            dims ``(M, H)``, as the view ``(B*S, H)`` (no copy; a layout that does not flatten to a view falls
            back to the reference, or raises with the fallback off). Batched inputs of one call must share
            their leading dims. See docs/spec-api.md, "Leading batch dimensions".

    Example::

        op("fused_add_rmsnorm", kernel=..., args=[Tensor("x", rank=2), Tensor("residual", rank=2, mutable=True),
                                               Tensor("w", rank=1), Output("out", like="x"), Scalar("eps")], ...)
    """

    name: str
    rank: int
    alignment: Optional[int] = None
    pointee: Optional[str] = None
    mutable: bool = False
    batch: bool = False


@dataclasses.dataclass(frozen=True)
class Output:
    """An output tensor parameter, allocated by the loader.

    Args:
        name: output name.
        like: allocate with the shape and dtype of this input tensor.
        shape: one expression per dimension (``("a.shape[0]", "b.shape[1]")``), instead of ``like``.
        dtype: an input tensor's name or a torch dtype name (default: ``like``'s dtype, else the first input's);
            with ``like`` it sets the dtype while ``like`` gives the shape (``Output("y", like="x",
            dtype="float32")``).
        batch: return the output with the batched inputs' leading dims back (``(B*S, N)`` -> ``(B, S, N)``); its
            first dimension must be a batched input's first. Default: batched when ``like`` names a batched input.
        zero: the kernel accumulates into it (atomic adds from several programs): the loader allocates it filled
            with zeros (and zero-fills an ``out=`` tensor) before the launch. flyc-build refuses a kernel whose
            IR accumulates atomically into an output not declared ``zero=True``.
        pointee: for a FlyDSL launcher parameter annotated ``fx.Pointer``: the element type of the pointer
            flyc-build passes, when it is not the output's dtype (as for ``Tensor``: a caller that passes bytes,
            ``flyc.from_c_void_p(fx.Uint8, c.data_ptr())``, is ``pointee="uint8"``).
        per_target: a processor (``"gfx942"``) or full target ID -> the output's dtype there, as ``dtype`` takes
            it, where it differs from ``dtype`` (``Output("y", like="x", dtype="float8_e4m3fn",
            per_target={"gfx942": "float8_e4m3fnuz"})``); ``dtype`` serves every other target and the CPU path.
            Each target's kernel is built with its dtype; the loader allocates the output with the dtype of the
            device's target (manifest ``target_dtypes``, schema 6.0). Kept as sorted ``(target, dtype)`` pairs.
    """

    name: str
    like: Optional[str] = None
    shape: Optional[tuple[str, ...]] = None
    dtype: Optional[str] = None
    batch: Optional[bool] = None
    zero: bool = False
    pointee: Optional[str] = None
    per_target: Any = ()

    def __post_init__(self) -> None:
        pt = {} if self.per_target is None else self.per_target
        if isinstance(pt, tuple) and all(isinstance(p, tuple) and len(p) == 2 for p in pt):
            pt = dict(pt)
        if not isinstance(pt, dict) or not all(isinstance(k, str) and isinstance(v, str) and v
                                               for k, v in pt.items()):
            raise SpecError(f"Output {self.name!r}: expected per_target to be a dict of target -> dtype name "
                            f"({{'gfx942': 'float8_e4m3fnuz'}}), got {pt!r}")
        from flyship.bundle import targets as _targets

        for key in pt:
            try:
                _targets.check_known(key)
            except Exception as e:  # noqa: BLE001 - said as the spec's error
                raise SpecError(f"Output {self.name!r}: per_target[{key!r}]: {e}") from None
        object.__setattr__(self, "per_target", tuple(sorted(pt.items())))

    def for_target(self, target: str) -> "Output":
        """This output as built for ``target``: its ``per_target`` dtype for the full target ID, else for the
        processor (as :meth:`Spec.for_target` picks an entry), as its ``dtype``; itself when none applies."""
        pt = dict(self.per_target)
        dtype = pt.get(target, pt.get(target.split(":")[0]))
        if dtype is None and not pt:
            return self
        return dataclasses.replace(self, dtype=dtype or self.dtype, per_target=())


@dataclasses.dataclass(frozen=True)
class Scalar:
    """A runtime scalar parameter (``int``, ``float`` or ``bool``), part of the op's schema."""

    name: str
    type: str = "float"
    default: Optional[float | int | bool] = None


@dataclasses.dataclass(frozen=True)
class Constexpr:
    """A compile-time parameter; each specialization gives its value in ``Spec.constexprs``."""

    name: str


@dataclasses.dataclass(frozen=True)
class Value:
    """An integer parameter computed from the inputs (``Value("n", "x.numel", type="i32")``); the expression
    may read ``device.cu_count``, and a literal (``Value("m", "64")``) is a constant an entry passes itself. A
    float literal an entry passes itself (``launcher(x, out, 1e-6)``) is ``Value("eps", "1e-6", type="f32")``:
    packed as an f32 constant, never computed."""

    name: str
    expr: str
    type: str = "i32"

    def __post_init__(self) -> None:
        if self.type in FLOAT_VALUE_TYPES and self.float_literal() is None:
            raise SpecError(f"Value({self.name!r}, {self.expr!r}, type={self.type!r}): expected a float literal "
                            f"(\"1e-6\") for a {self.type} Value, got an expression; a float computed from the "
                            "inputs is not supported: compute it in the kernel, or declare a Scalar")

    def float_literal(self) -> Optional[float]:
        """The constant of a float Value (``type="f32"``), else None."""
        if self.type not in FLOAT_VALUE_TYPES:
            return None
        try:
            v = float(self.expr.strip())
        except ValueError:
            return None
        return v if v == v and abs(v) != float("inf") else None


FLOAT_VALUE_TYPES = ("f32",)  # the one float type a kernarg constant of a Value is packed as (bundle/rules/layout)


@dataclasses.dataclass(frozen=True)
class Workspace:
    """Device memory the op's launches share within one call (a split reduction's partial sums), allocated by
    the loader per call before the first launch, never part of the op's schema (docs/spec-api.md).

    Args:
        name: the name the launches' parameters use.
        shape: one expression per dimension over the inputs and the constexprs (``("x.shape[0]", "SPLIT")``).
        dtype: a torch dtype name.
        zero: fill it with zeros before the first launch (kernels that accumulate into it).
    """

    name: str
    shape: tuple[str, ...]
    dtype: str = "float32"
    zero: bool = False


Param = Tensor | Output | Scalar | Constexpr | Value | Workspace


@dataclasses.dataclass(frozen=True)
class Launch:
    """One kernel of an op that launches several in order (``op(kernel=[Launch(...), Launch(...)])``, Triton).

    Args:
        kernel: the ``@triton.jit`` kernel.
        args: the kernel's parameters in order, each the name of a declaration in the op's ``args``
            (a :class:`Tensor`, :class:`Output`, :class:`Scalar`, :class:`Constexpr`, :class:`Value` or
            :class:`Workspace`).
        grid: up to three expressions over the inputs and constexprs.
        options: this kernel's own launch configuration, over the spec's ``options`` (Triton's ``num_warps``,
            ``num_stages``, ``waves_per_eu``, ..., also nested per vendor or target as in ``Spec.options``):
            ``Launch(copy_kernel, args=[...], grid=(...), options={"num_warps": 4})`` keeps a copy kernel at 4 warps
            while the spec's ``num_warps=32`` sizes the op's main kernel. Default: the spec's options, every launch
            alike. ``specialize`` and ``divisible_by_16`` describe the specialization's guard, so they stay the
            spec's.
    """

    kernel: Any
    args: tuple[str, ...]
    grid: tuple[str, ...]
    options: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        for field in ("args", "grid"):
            value = getattr(self, field)
            if isinstance(value, str) or not all(isinstance(x, str) for x in value):
                raise SpecError(f"Launch({_kernel_name(self.kernel)!r}): {field} must be a "
                                f"list of strings, got {value!r}")
            object.__setattr__(self, field, tuple(value))
        if not isinstance(self.options, dict):
            raise SpecError(f"Launch({_kernel_name(self.kernel)!r}): options must be a dict of launch options "
                            f"(options={{'num_warps': 4}}), got {type(self.options).__name__}")
        spec_only = [k for k in LAUNCH_SPEC_ONLY if k in self.options or any(
            isinstance(v, dict) and k in v for v in self.options.values())]
        if spec_only:
            raise SpecError(f"Launch({_kernel_name(self.kernel)!r}): options sets {spec_only}, which belong to the "
                            "whole specialization (one guard for every launch of a call); give them in "
                            "Spec(options=...)")


# Spec.options keys a Launch's own options may not set: they shape the specialization's guard, shared by its
# launches (the Triton frontend's own keys).
LAUNCH_SPEC_ONLY = ("specialize", "divisible_by_16")


@dataclasses.dataclass(frozen=True)
class Entry:
    """A plain Python entry point around a DSL launcher (see :func:`entry`)."""

    fn: Callable[..., Any]
    frontend: str = "flydsl"

    @property
    def __name__(self) -> str:  # noqa: A003 - messages name the entry like a function
        return _kernel_name(self.fn)


def entry(fn: Callable[..., Any], frontend: str = "flydsl") -> Entry:
    """Name a plain Python function that the user calls, which calls a ``@flyc.jit`` launcher.

    FlyDSL builders often return such a wrapper: it sets compile hints (fast-math, LLVM options), substitutes
    placeholder arguments and marks layouts dynamic, then calls the inner launcher. flyc-build calls the
    entry as the user would, with the declared arguments positionally (``args`` are the entry's *leading*
    parameters, in order; every later parameter must have a default; a constant the entry passes a launcher
    itself is a ``Value("m", "64")``, not an entry parameter), records each launcher call it makes (several
    launchers in sequence: one code object per call), and proves each code object against FlyDSL's own from that
    same call. Naming the inner launcher instead would lose the wrapper's hints and build other code.
    """
    if not callable(fn):
        raise SpecError(f"entry: expected a callable, got {type(fn).__name__}")
    return Entry(fn, frontend)
