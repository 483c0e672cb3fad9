"""Verification: run every specialization once on a GPU against the op's PyTorch reference.

Inputs come from each specialization's ``example`` (the shapes and scalars the build traced), with the
dtypes its guard names; the kernel runs through the op's own C++ path with that specialization forced.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

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


def example_inputs(op: _m.Op, spec: _m.Specialization, device: Any, seed: int = 0) -> list[Any]:
    """Inputs for a specialization's example call: random tensors of its shapes and guard dtypes, and its
    scalars (else the defaults)."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(seed)
    out: list[Any] = []
    for a in op.args:
        if a.kind == "tensor":
            shape = tuple(spec.example.shapes[a.name])
            dtype = getattr(torch, spec.guard.dtypes.get(a.name) or (a.dtypes[0] if a.dtypes else "float32"))
            if dtype.is_floating_point:
                t = torch.randn(shape, generator=g).to(dtype)
            elif dtype == torch.bool:
                t = torch.randint(0, 2, shape, generator=g).bool()
            else:
                t = torch.randint(-100, 100, shape, generator=g).to(dtype)
            strides = spec.example.strides.get(a.name)
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


def unwritten_counts(run_out: Callable[[list[Any]], None], outputs: Sequence[Any]) -> list[int]:
    """How many elements of each output a kernel leaves unwritten (an early return before the stores, a
    kernel that needs ``zero=True``): ``run_out(outs)`` runs it into fresh tensors laid out like ``outputs``,
    twice, filled first with zero bytes and then with 0x01 bytes; an element that still holds its fill after
    both runs was never written (a deterministic store cannot equal both)."""
    import torch

    stuck = []
    for fill in (0, 1):
        outs = [torch.empty_like(o) for o in outputs]
        for t in outs:
            bits = _bits(t)
            if bits is not None:
                bits.fill_(_pattern(fill, t.element_size()))
        run_out(outs)
        stuck.append([_bits(t).eq(_pattern(fill, t.element_size())) if _bits(t) is not None
                      else torch.zeros(t.shape, dtype=torch.bool, device=t.device) for t in outs])
    return [int((a & b).sum()) for a, b in zip(*stuck)]


def _bits(t: Any) -> Any:
    """``t`` viewed as integers of its element size (same strides), or None for a size with no integer dtype."""
    import torch

    dt = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}.get(t.element_size())
    return None if dt is None else t.view(dt)


def _pattern(byte: int, size: int) -> int:
    """The integer whose ``size`` little-endian bytes all equal ``byte``."""
    return int.from_bytes(bytes([byte]) * size, "little", signed=size > 1)


def _unwritten_note(handle: Any, spec: str, inputs: list[Any], written: list[int], op: _m.Op) -> str:
    """A note naming the outputs the kernel leaves partly unwritten (and how many elements), else ""."""
    got = handle.run_specialization(spec, *inputs)

    def run_out(outs: list[Any]) -> None:
        fresh = [_same_layout_copy(t) if i in written else t for i, t in enumerate(inputs)]
        handle.run_specialization(spec, *fresh, out=outs)

    counts = unwritten_counts(run_out, got)
    bad = [f"{o.name}: {n} of {t.numel()} elements" for o, t, n in zip(op.outputs, got, counts) if n]
    if not bad:
        return ""
    return (f"leaves outputs unwritten ({'; '.join(bad)}): a fresh output holds garbage there; if the kernel "
            "skips those elements on purpose (an early return), declare the output zero=True, else store them")


def verify(ops: "Ops", device: Optional[Any] = None) -> Report:
    """Run each op's specializations on ``device`` (default: the current GPU) against the references.

    Raises:
        VerificationError: no GPU; the message says why one is needed.
    """
    import torch

    if not torch.cuda.is_available():
        raise VerificationError("verify: expected a GPU (torch.cuda.is_available()), got none; verification runs each "
                                "kernel against its reference, so it needs a GPU and a ROCm or CUDA build of torch")
    device = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
    target = ops.device_target(device.index)
    rows: list[Row] = []
    for handle in ops:
        op = handle.manifest
        reference = ops.reference(handle.name)
        for spec in op.specializations:
            chosen = _targets.select([v.target for v in spec.variants], target)
            if chosen is None:
                rows.append(Row(op.name, spec.name, None, float("nan"), float("nan"), True,
                                f"no code object for {target}", skipped=True))
                continue
            ran = spec.variants[chosen].target
            if reference is None:
                rows.append(Row(op.name, spec.name, ran, float("nan"), float("nan"), False,
                                "no reference to compare with"))
                continue
            inputs = example_inputs(op, spec, device)
            # In-place inputs: the kernel and the reference each write their own copy; both copies are compared.
            written = [i for i, a in enumerate(op.args) if a.mutable]
            ref_inputs = [_same_layout_copy(t) if i in written else t for i, t in enumerate(inputs)]
            try:
                got = handle.run_specialization(spec.name, *inputs) + tuple(inputs[i] for i in written)
            except RuntimeError as e:
                rows.append(Row(op.name, spec.name, ran, float("nan"), float("nan"), False, str(e).splitlines()[0]))
                continue
            want = reference(*ref_inputs)
            want = (want,) if isinstance(want, torch.Tensor) else () if want is None else tuple(want)
            want += tuple(ref_inputs[i] for i in written)
            torch.cuda.synchronize(device)
            max_abs = max_rel = 0.0
            ok = len(got) == len(want)
            for a, b in zip(got, want):
                rtol, atol = TOLERANCES.get(str(a.dtype).removeprefix("torch."), (0.0, 0.0))
                diff = (a.double() - b.double()).abs()
                if diff.numel():
                    max_abs = max(max_abs, float(diff.max()))
                    max_rel = max(max_rel, float((diff / b.double().abs().clamp_min(1e-12)).max()))
                ok = ok and a.shape == b.shape and bool(torch.allclose(a.double(), b.double(), rtol=rtol, atol=atol))
            note = _unwritten_note(handle, spec.name, inputs, written, op) if ok and op.outputs else ""
            rows.append(Row(op.name, spec.name, ran, max_abs, max_rel, ok and not note, note))
    return Report(tuple(rows), f"{device} ({torch.cuda.get_device_name(device)}, {target})")
