"""Verification: run every specialization once on a GPU against the op's PyTorch reference.

Inputs come from each specialization's ``example`` (the shapes and scalars the build traced), with the
dtypes its guard names; the kernel runs through the op's own C++ path with that specialization forced.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Optional

from flyship.bundle import manifest as _m
from flyship.bundle import targets as _targets
from flyship.errors import LoadError

if TYPE_CHECKING:
    from flyship.loader.handles import Ops

# (rtol, atol) per output dtype: a kernel and the reference may round differently.
TOLERANCES = {
    "float64": (1e-7, 1e-7),
    "float32": (1e-4, 1e-5),
    "float16": (1e-2, 1e-3),
    "bfloat16": (2e-2, 1e-2),
}


class VerificationError(LoadError, RuntimeError):
    """A kernel disagreed with its reference, or verification could not run."""


@dataclasses.dataclass(frozen=True)
class Row:
    """One specialization's result.

    Attributes:
        op, spec: which kernel.
        target: the variant that ran (the device's choice), or None.
        max_abs, max_rel: largest absolute / relative difference over all outputs.
        ok: within tolerance (``torch.allclose`` per output); True for a skipped row.
        note: why it failed or did not run, or "".
        skipped: the bundle has no code object of this specialization for the device.
    """

    op: str
    spec: str
    target: Optional[str]
    max_abs: float
    max_rel: float
    ok: bool
    note: str = ""
    skipped: bool = False


@dataclasses.dataclass(frozen=True)
class Report:
    """All rows, with a table view."""

    rows: tuple[Row, ...]
    device: str

    @property
    def ok(self) -> bool:
        """Every specialization that has code for the device ran and matched, and at least one did."""
        return any(not r.skipped for r in self.rows) and all(r.ok for r in self.rows)

    def table(self) -> str:
        lines = [f"verification on {self.device}",
                 f"{'op':<20} {'spec':<14} {'target':<26} {'max abs err':>12} {'max rel err':>12}  result"]
        for r in self.rows:
            result = "skipped" if r.skipped else "ok" if r.ok else "FAIL"
            note = f" ({r.note})" if r.note else ""
            lines.append(f"{r.op:<20} {r.spec:<14} {r.target or '-':<26} {r.max_abs:>12.3e} {r.max_rel:>12.3e}  "
                         f"{result}{note}")
        return "\n".join(lines)

    def raise_on_failure(self) -> None:
        """Raise VerificationError unless :attr:`ok`; the message holds the table."""
        if all(r.skipped for r in self.rows):
            raise VerificationError(f"verify: expected code for this GPU in at least one specialization, got none "
                                    f"ran:\n{self.table()}")
        bad = [r for r in self.rows if not r.ok]
        if bad:
            raise VerificationError("verify: expected every specialization to match its reference, got "
                                    f"{len(bad)} failing:\n{self.table()}")


def example_inputs(op: _m.Op, spec: _m.Specialization, device: Any, seed: int = 0,
                   shapes: Optional[dict[str, tuple[int, ...]]] = None) -> list[Any]:
    """Inputs for a specialization's example call: random tensors of its shapes (or ``shapes``: argument name ->
    shape, for a boundary shape the guard may admit) and guard dtypes, and its scalars (else the defaults)."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(seed)
    out: list[Any] = []
    for a in op.args:
        if a.kind == "tensor":
            shape = tuple((shapes or spec.example.shapes)[a.name])
            dtype = getattr(torch, spec.guard.dtypes.get(a.name) or (a.dtypes[0] if a.dtypes else "float32"))
            if dtype.is_floating_point:
                t = torch.randn(shape, generator=g).to(dtype)
            elif dtype == torch.bool:
                t = torch.randint(0, 2, shape, generator=g).bool()
            else:
                t = torch.randint(-100, 100, shape, generator=g).to(dtype)
            strides = spec.example.strides.get(a.name) if shapes is None else None
            if strides is not None:  # the layout the code was built for (a transposed weight): same values
                t = torch.empty_strided(shape, tuple(strides), dtype=dtype).copy_(t)
            out.append(t.to(device) if strides is None else _strided_to(t, device))
        else:
            v = spec.example.scalars.get(a.name, a.default)
            if v is None:
                v = {"int": 1, "float": 1.0, "bool": False}[a.kind]
            out.append({"int": int, "float": float, "bool": bool}[a.kind](v))
    return out


def _strided_to(t: Any, device: Any) -> Any:
    """``t`` on ``device`` with ``t``'s strides (``Tensor.to`` would make it contiguous)."""
    import torch

    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device).copy_(t)


def _same_layout_copy(t: Any) -> Any:
    """A copy of tensor ``t`` with its strides (``clone`` of a transposed view would be contiguous)."""
    import torch

    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).copy_(t)


def verify(ops: "Ops", device: Optional[Any] = None) -> Report:
    """Run each op's specializations on ``device`` (default: the current GPU) against the references; see
    :func:`verify_specialization` for what each run checks.

    Raises:
        VerificationError: no GPU; the message says why one is needed.
    """
    import torch

    if not torch.cuda.is_available():
        raise VerificationError("verify: expected a GPU (torch.cuda.is_available()), got none; verification runs each "
                                "kernel against its reference, so it needs a GPU and a ROCm or CUDA build of torch; "
                                "without one, `flyship verify --emulate BUNDLE` runs the AMD code objects on the "
                                "emulated device")
    device = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
    target = ops.device_target(device.index)
    rows: list[Row] = []
    for handle in ops:
        op = handle.manifest
        for spec in op.specializations:
            chosen = _targets.select([v.target for v in spec.variants], target)
            if chosen is None:
                rows.append(Row(op.name, spec.name, None, float("nan"), float("nan"), True,
                                f"no code object for {target}", skipped=True))
                continue
            rows.append(verify_specialization(handle, spec, ops.reference(handle.name), device,
                                              spec.variants[chosen].target))
    return Report(tuple(rows), f"{device} ({torch.cuda.get_device_name(device)}, {target})")


def verify_specialization(handle: Any, spec: _m.Specialization, reference: Any, device: Any,
                          ran: Optional[str] = None) -> Row:
    """Run one specialization on ``device`` and compare it with ``reference``, three ways:

    1. on the example's inputs, as a user's call runs (fresh outputs);
    2. again through the out path, into outputs filled with a sentinel first (NaN; for integers every byte 0xA5):
       an element still holding it where the reference holds something else was never written (a kernel that
       returns early before its stores, issue 23 item 7a), reported per output with the ``zero=True`` fix;
    3. on each other layout of the inputs the specialization's guard admits (:func:`other_layouts`: padded rows,
       a transposed view, every other element): a kernel built for one fixed layout whose spec does not say so
       accepts them and computes garbage (item 7c); the first that disagrees is named.
    """
    op = handle.manifest
    if reference is None:
        return Row(op.name, spec.name, ran, float("nan"), float("nan"), False, "no reference to compare with")
    inputs = example_inputs(op, spec, device)
    try:
        got, want, cmp = _run_and_compare(handle, spec, reference, inputs)
        notes = [_unwritten_note(op, spec, handle, reference, inputs, got)]
        for label, other in other_layouts(op, inputs):
            try:
                _g, _w, alt = _run_and_compare(handle, spec, reference, other, out=_sentinel_outputs(op, got))
            except RuntimeError as e:
                if "do not fit specialization" in str(e):
                    continue  # the guard refuses this layout: the call falls back, no kernel sees it
                raise
            if not alt[2]:
                notes.append(f"differs from the reference on {label} (max abs err {alt[0]:.3e}), a layout the guard "
                             "admits: the kernel was built for a fixed layout the spec does not declare; make the "
                             "kernel follow the strides it is passed, or pin the layout it needs in the spec's "
                             "constraints (e.g. x.stride[1] == 1) so other layouts fall back")
                break
    except RuntimeError as e:
        return Row(op.name, spec.name, ran, float("nan"), float("nan"), False, str(e).splitlines()[0])
    notes = [n for n in notes if n]
    return Row(op.name, spec.name, ran, cmp[0], cmp[1], cmp[2] and not notes, "; ".join(notes))


def _sentinel_outputs(op: _m.Op, got: tuple[Any, ...]) -> tuple[Any, ...]:
    """Outputs for a run on another layout, filled with the sentinel: a fresh output could be the block the
    previous run freed, still holding the right values, and hide a kernel that wrote nothing (the caching
    allocator hands the same block back). ``()`` (fresh outputs) when some output is bool."""
    outs = tuple(sentinel_like(t) for t in got[:len(op.outputs)])
    return () if any(o is None for o in outs) else outs


def _run_and_compare(handle: Any, spec: _m.Specialization, reference: Any, inputs: list[Any],
                     out: tuple[Any, ...] = ()) -> tuple[tuple[Any, ...], tuple[Any, ...], tuple[float, float, bool]]:
    """Run the specialization on ``inputs`` (into ``out`` when given) and the reference on copies: (got, want,
    (max abs, max rel, within tolerance)). In-place inputs: the kernel and the reference each write their own copy;
    both copies are compared. The caller's ``inputs`` are left as they were."""
    import torch

    written = [i for i, a in enumerate(handle.manifest.args) if a.mutable]
    mine = [_same_layout_copy(t) if i in written else t for i, t in enumerate(inputs)]
    ref_inputs = [_same_layout_copy(t) if i in written else t for i, t in enumerate(inputs)]
    got = handle.run_specialization(spec.name, *mine, out=out) + tuple(mine[i] for i in written)
    want = reference(*ref_inputs)
    want = (want,) if isinstance(want, torch.Tensor) else () if want is None else tuple(want)
    want += tuple(ref_inputs[i] for i in written)
    if got and got[0].device.type == "cuda":
        torch.cuda.synchronize(got[0].device)
    return got, want, _compare(got, want)


def _compare(got: tuple[Any, ...], want: tuple[Any, ...]) -> tuple[float, float, bool]:
    import torch

    max_abs = max_rel = 0.0
    ok = len(got) == len(want)
    for a, b in zip(got, want):
        rtol, atol = TOLERANCES.get(str(a.dtype).removeprefix("torch."), (0.0, 0.0))
        ok = ok and a.shape == b.shape
        if not ok:
            continue
        diff = (a.double() - b.double()).abs()
        if diff.numel():
            max_abs = max(max_abs, float(diff.nan_to_num(float("inf")).max()))
            max_rel = max(max_rel, float((diff / b.double().abs().clamp_min(1e-12)).nan_to_num(float("inf")).max()))
        ok = ok and bool(torch.allclose(a.double(), b.double(), rtol=rtol, atol=atol, equal_nan=True))
    return max_abs, max_rel, ok


# -- unwritten outputs (issue 23, item 7a) --------------------------------------------------------------------------

SENTINEL_BYTE = 0xA5  # every byte of an integer output before the launch (-91 as int8, 0xA5A5 as int16, ...)


def sentinel_like(t: Any) -> Any:
    """A tensor of ``t``'s shape, strides and dtype holding the sentinel: NaN for floats, every byte 0xA5 for
    integers; None for bool (no value of it is left over)."""
    import torch

    if t.dtype == torch.bool:
        return None
    out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    return out.fill_(_sentinel(t.dtype))


def _sentinel(dtype: Any) -> Any:
    import torch

    if dtype.is_floating_point:
        return float("nan")
    width = torch.empty((), dtype=dtype).element_size()
    return torch.tensor([SENTINEL_BYTE] * width, dtype=torch.uint8).view(dtype).item()


def unwritten_mask(out: Any, want: Any) -> Any:
    """Elements of ``out`` (filled by :func:`sentinel_like` before the launch) still holding the sentinel where
    the reference ``want`` holds another value."""
    s = _sentinel(out.dtype)
    if out.dtype.is_floating_point:
        return out.isnan() & ~want.to(out.device).isnan()
    return (out == s) & (want.to(out.device) != s)


def _unwritten_note(op: _m.Op, spec: _m.Specialization, handle: Any, reference: Any, inputs: list[Any],
                    got: tuple[Any, ...]) -> str:
    """Run the specialization again into sentinel-filled outputs; say which outputs it left partly unwritten."""
    fresh = got[:len(op.outputs)]
    outs = tuple(sentinel_like(t) for t in fresh)
    if not outs or any(o is None for o in outs):
        return ""
    got2, want, _cmp = _run_and_compare(handle, spec, reference, inputs, out=outs)
    notes = []
    for o, g, w in zip(op.outputs, got2, want):
        if g.shape != w.shape or o.zero:
            continue
        mask = unwritten_mask(g, w)
        n = int(mask.sum())
        if n:
            first = tuple(int(i) for i in mask.nonzero()[0])
            notes.append(f"the kernel left {n} of {g.numel()} elements of output {o.name!r} unwritten (first at "
                         f"{list(first)}; a kernel that returns before its stores), where a fresh output holds "
                         "garbage; "
                         f"declare Output({o.name!r}, ..., zero=True) if those elements are meant to be 0, or make "
                         "the kernel store every element")
    return "; ".join(notes)


# -- other layouts the guard admits (issue 23, item 7c) -------------------------------------------------------------

def other_layouts(op: _m.Op, inputs: list[Any]) -> list[tuple[str, list[Any]]]:
    """The example inputs again, with one tensor at a time in another layout holding the same values: ``x with
    padded rows`` (rank >= 2: each line along the contiguous dim followed by unused elements, in the tensor's own
    dim order, so a column-major input gets padded columns), ``x transposed`` (rank >= 2: column-major storage),
    ``x with dims 0 and 1 swapped in memory`` (rank >= 3: ``t.transpose(0, 1)`` of a contiguous tensor, the last dim
    still contiguous: a per-token stride that is not ``H * D``), ``x contiguous`` (an input whose example is not
    row-major), ``x[::2]`` (rank 1: every other element of a buffer twice as long). Whether the guard admits each
    is for the specialization to say (a refused one falls back and is skipped). Layouts equal to the input's are
    left out."""
    import torch

    out: list[tuple[str, list[Any]]] = []
    for i, (a, t) in enumerate(zip(op.args, inputs)):
        if a.kind != "tensor" or t.numel() <= 1:
            continue
        shape = tuple(t.shape)
        if t.dim() >= 2:
            inner = min(range(t.dim()), key=lambda d: (t.stride(d), -d))  # the contiguous dim
            lines = "rows" if inner == t.dim() - 1 else "columns" if t.dim() == 2 else f"lines along dim {inner}"
            views = [(f"{a.name} with padded {lines}", _padded(t)),
                     (f"{a.name} transposed", _in_order(t, tuple(reversed(range(t.dim())))))]
            if t.dim() >= 3:
                views.append((f"{a.name} with dims 0 and 1 swapped in memory",
                              _in_order(t, (1, 0, *range(2, t.dim())))))
            if not t.is_contiguous():
                views.append((f"{a.name} contiguous", torch.empty(shape, dtype=t.dtype, device=t.device)))
        elif t.dim() == 1:
            views = [(f"{a.name}[::2]", torch.empty(2 * shape[0], dtype=t.dtype, device=t.device)[::2])]
        else:
            continue
        for label, v in views:
            if v.stride() != t.stride():
                out.append((f"{label} (strides {list(v.stride())})", [*inputs[:i], v.copy_(t), *inputs[i + 1:]]))
    return out


def _in_order(t: Any, order: tuple[int, ...]) -> Any:
    """An empty tensor of ``t``'s shape whose dims lie in memory outermost-first in ``order`` (dense)."""
    import torch

    store = torch.empty(tuple(t.shape[d] for d in order), dtype=t.dtype, device=t.device)
    return store.permute(tuple(order.index(d) for d in range(t.dim())))


def _padded(t: Any) -> Any:
    """An empty tensor of ``t``'s shape in ``t``'s dim order (by stride) with 3 unused elements after each line
    along its innermost dim."""
    import torch

    order = tuple(sorted(range(t.dim()), key=lambda d: (-t.stride(d), d)))
    store = [t.shape[d] for d in order]
    store[-1] += 3
    base = torch.empty(tuple(store), dtype=t.dtype, device=t.device)[..., :t.shape[order[-1]]]
    return base.permute(tuple(order.index(d) for d in range(t.dim())))
