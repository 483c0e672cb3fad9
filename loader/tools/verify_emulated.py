"""``flyship verify --emulate``: every AMD specialization run on the emulated device against its reference, no GPU.

For each AMD target (gfx942 and gfx950 by default) the bundle is loaded on the emulated device
(:mod:`flyship.loader.emulated_device`, ``FLYSHIP_FLAVOR=emulate``): each call takes the op's real C++ path on CPU
tensors and each launch runs on flyship's CDNA emulator. Every specialization with a code object for the target runs:

* a base case (the first row count of :func:`base_rows` the guard admits: 8, 16, ... 256 below the example's rows,
  else the example; inputs in the example's dim order, :func:`shaped_inputs`), once into fresh outputs (a user's
  call) and once into outputs filled with a sentinel (an element left holding it was never written; a second
  sentinel tells those from NaNs the kernel wrote);
* each other layout of the base inputs (:func:`flyship.loader.tools.verify.other_layouts`: padded lines, a
  transposed view, leading dims swapped in memory, contiguous, every other element) and boundary shapes
  (:func:`flyship.loader.tools.verify_shapes.shape_groups`: one row, row and column tails, the guard's largest
  column count, more than 256 rows and more than the base's grid covers, 513 and 1025 rows where affordable, the
  example itself), whenever the guard admits them (a shape or layout it refuses falls back to the reference and is
  listed as not admitted);
* each of those in both wave schedules (``forward``, ``reverse``): outputs that differ between them are a race, and
  a wrong result while two waves touched LDS with no barrier between names those LDS addresses.

A reference that raises on admitted inputs or returns outputs unlike the op's declared ones is reported as the
reference's fault. Notes name ops by the bundle's declared namespace, never the private one verify loads under.

Every tensor sits in its own buffer with a guard zone of :data:`RED_ZONE` bytes on each side, filled with
:data:`RED_BYTE` and outside the memory the launch may touch (the emulator refuses an access there); a changed guard
zone is reported too. sm_* code objects (Triton's cubins) are not executed: the emulator runs AMD code objects only;
with no targets asked each such specialization says so, with targets asked the summary counts them once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
import uuid
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

from flyship.bundle import manifest as _m
from flyship.bundle import targets as _targets
from flyship.loader.tools import verify as _verify
from flyship.loader.tools.verify_shapes import (LARGE_ROWS, LARGE_ROWS_ELEMENTS, _resize, base_rows,  # noqa: F401
                                                shape_groups, tied, upper_bound)

TARGETS = ("gfx942", "gfx950")
SCHEDULES = ("forward", "reverse")
RED_ZONE = 256  # bytes of guard zone before and after every tensor (a multiple of 64: the tensor stays aligned)
RED_BYTE = 0x5A
PAD_BYTE = 0x7B  # every byte an input's strides skip (padding): finite in every float dtype (1.3e36 as f32, 61280 as
# f16), so a kernel that reads padding computes wrong numbers rather than the outputs' NaN sentinel
SECOND_SENTINEL_BYTE = 0xA5  # a float output's second sentinel (-2.9e-16 as f32, -0.0227 as f16): not NaN
DEFAULT_BUDGET_S = 120.0  # emulated seconds per specialization and target before the rest is skipped for time


@dataclasses.dataclass(frozen=True)
class Run:
    """One line of the report: an op's specialization on one target, shape and layout, in both schedules.

    Attributes:
        result: ``ok``, ``FAIL``, ``not admitted`` (the guard refuses these inputs: they fall back),
            ``skipped`` (the time budget ran out, or no code object for the target) or ``not executed`` (sm_*).
        note: what failed (first wrong elements, the emulator's refusal, a race, a guard zone written) or why not run.
        instructions, seconds: what the emulator ran for this line (both schedules).
    """

    op: str
    spec: str
    target: str
    case: str
    result: str
    note: str = ""
    instructions: int = 0
    seconds: float = 0.0


@dataclasses.dataclass(frozen=True)
class Report:
    """The lines, and how many sm_* code objects were left out because only AMD targets were asked for."""

    runs: tuple[Run, ...]
    unasked_cubins: int = 0

    @property
    def ok(self) -> bool:
        """No line failed and at least one ran on the emulated device."""
        return any(r.result == "ok" for r in self.runs) and not any(r.result == "FAIL" for r in self.runs)

    def failures(self) -> list[Run]:
        return [r for r in self.runs if r.result == "FAIL"]

    def table(self) -> str:
        lines = [f"{'op':<16} {'spec':<10} {'target':<8} {'case':<44} result"]
        for r in self.runs:
            extra = f" ({r.note})" if r.note else ""
            cost = f" [{r.instructions} instructions, {r.seconds:.2f} s emulated]" if r.instructions else ""
            lines.append(f"{r.op:<16} {r.spec:<10} {r.target:<8} {r.case:<44} {r.result}{cost}{extra}")
        return "\n".join(lines)

    def summary(self) -> str:
        count = {k: sum(r.result == k for r in self.runs) for k in ("ok", "FAIL", "not admitted", "skipped",
                                                                   "not executed")}
        instructions = sum(r.instructions for r in self.runs)
        seconds = sum(r.seconds for r in self.runs)
        text = (f"emulated device: {count['ok']} ok, {count['FAIL']} failed, {count['not admitted']} not admitted by "
                f"the guard, {count['skipped']} skipped; {instructions} instructions emulated in {seconds:.1f} s "
                "(each case in both wave schedules; emulated, not run on a GPU)")
        cubins = count["not executed"] + self.unasked_cubins
        if cubins:
            text += (f"; {cubins} sm_* code objects NOT executed (the emulator runs AMD code objects "
                     "only; they were checked at load, not run)")
            from flyship.loader.tools import cubins  # and whether Triton's interpreter stood in for them

            text += "\n" + cubins.statement()
        return text


# -- tensors inside guard zones --------------------------------------------------------------------------------------

class Arena:
    """Tensors each in its own buffer between two guard zones (:data:`RED_ZONE` bytes of :data:`RED_BYTE`).

    The launch may touch only the tensor's own extent (csrc/launch.cpp hands the emulator exactly that), so an access
    into a guard zone is refused by the emulator; :meth:`changed` also compares the zones after the launch."""

    def __init__(self) -> None:
        self._buffers: list[tuple[Any, int, str]] = []

    def place(self, shape: Sequence[int], strides: Sequence[int], dtype: Any, name: str, fill: Any = None,
              second: bool = False) -> Any:
        """A tensor of ``shape``, ``strides`` and ``dtype`` between guard zones. Without ``fill`` (an output) its
        bytes hold the dtype's sentinel (NaN, or bytes 0xA5: an element left so was never written; with ``second``,
        every byte :data:`SECOND_SENTINEL_BYTE`, finite in every float dtype: it tells an element the kernel set to
        NaN from one it never wrote); with it (an input) ``fill`` is copied in and the bytes its strides skip hold
        :data:`PAD_BYTE`."""
        import torch

        item = torch.empty((), dtype=dtype).element_size()
        numel = 1
        for s in shape:
            numel *= int(s)
        span = 0 if numel == 0 else (sum((int(n) - 1) * int(st) for n, st in zip(shape, strides)) + 1) * item
        buf = torch.full((span + 2 * RED_ZONE,), RED_BYTE, dtype=torch.uint8)
        if fill is not None:
            buf[RED_ZONE:RED_ZONE + span] = PAD_BYTE
        elif second and span:
            buf[RED_ZONE:RED_ZONE + span] = SECOND_SENTINEL_BYTE
        elif dtype != torch.bool and span:
            buf[RED_ZONE:RED_ZONE + span].view(dtype).fill_(_verify._sentinel(dtype))
        t = torch.as_strided(buf.view(dtype), tuple(shape), tuple(strides), RED_ZONE // item)
        if fill is not None:
            t.copy_(fill)
        self._buffers.append((buf, span, name))
        return t

    def place_like(self, t: Any, name: str, fill: bool = True) -> Any:
        return self.place(tuple(t.shape), tuple(t.stride()), t.dtype, name, t if fill else None)

    def changed(self) -> list[str]:
        """The tensors whose guard zones no longer hold :data:`RED_BYTE` everywhere (written out of bounds)."""
        out = []
        for buf, span, name in self._buffers:
            if bool((buf[:RED_ZONE] != RED_BYTE).any()) or bool((buf[RED_ZONE + span:] != RED_BYTE).any()):
                out.append(name)
        return out


# -- one case, both schedules ----------------------------------------------------------------------------------------

def written_name(op: _m.Op, k: int) -> str:
    """How notes name the ``k``-th tensor a call writes (its outputs, then the inputs it writes in place, in the op's
    argument order): ``output 'out'`` or ``input 'x' (written in place)``."""
    if k < len(op.outputs):
        return f"output {op.outputs[k].name!r}"
    return f"input {[a.name for a in op.args if a.mutable][k - len(op.outputs)]!r} (written in place)"


def declared_names(note: str, private: str, declared: str) -> str:
    """``note`` with the ops of ``private`` (the namespace verify loads under) named in the bundle's ``declared``
    namespace: one owner for the emulated and the interpreted notes."""
    return note.replace(f"{private}::", f"{declared}::")


def _first_wrong(got: Any, want: Any, limit: int = 3) -> str:
    import torch

    rtol, atol = _verify.TOLERANCES.get(str(got.dtype).removeprefix("torch."), (0.0, 0.0))
    a, b = got.double(), want.double()
    if got.dtype.is_floating_point and b.numel():
        # A tenth of the relative tolerance of the output's largest magnitude as an absolute floor: a reduction over
        # random inputs cancels (softmax_bwd's sum(dy * y) over 1000 columns is ~30 for outputs near 0.01), and the
        # kernel's and the reference's summation orders differ by a few ulps of that sum. A wrong row or element
        # is off by the values' own size, far above it.
        atol = max(atol, rtol / 10 * float(b.abs().nan_to_num(0.0, 0.0, 0.0).max()))
    bad = ~torch.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
    n = int(bad.sum())
    if n == 0:
        return ""
    where = bad.nonzero()[:limit]
    items = ", ".join(f"{[int(i) for i in idx]}: got {float(a[tuple(idx)]):.6g}, want {float(b[tuple(idx)]):.6g}"
                      for idx in where)
    return f"{n} of {got.numel()} elements wrong, first {items}"


_conflicts: set[int] = set()  # LDS addresses the emulator saw two waves touch with no barrier between (this case)


def _run_once(handle: Any, spec: _m.Specialization, inputs: list[Any], want: tuple[Any, ...], order: str,
              fresh: bool, second: bool = False) -> tuple[tuple[Any, ...], list[str], int, float, str]:
    """The specialization on copies of ``inputs`` inside guard zones, outputs sentinel-filled (or fresh), waves in
    ``order``: (outputs and mutated inputs, problems found, instructions, emulated seconds, and why the guard does
    not admit the inputs, or "")."""
    from flyship.loader import emulated_device

    op = handle.manifest
    arena = Arena()
    mine = [arena.place_like(t, a.name) if a.kind == "tensor" else t for a, t in zip(op.args, inputs)]
    outs = () if fresh else tuple(arena.place(tuple(w.shape), tuple(w.stride()), w.dtype, o.name, second=second)
                                  for o, w in zip(op.outputs, want))
    with emulated_device.schedule(order), emulated_device.stats() as log:
        try:
            got = handle.run_specialization(spec.name, *mine, out=outs)
        except RuntimeError as e:
            if "do not fit specialization" in str(e):
                return (), [], 0, 0.0, str(e).splitlines()[0]
            if "expected out tensor" in str(e):  # outputs shaped as the reference returned them: its fault
                return (), [f"{order} schedule: the reference's result does not fit the op's declared output "
                            f"({_launch_words(e)}): the reference is wrong, not the kernel; fix the reference (or "
                            "the Output)"], 0, 0.0, ""
            return (), [f"{order} schedule: {_launch_words(e)}"], sum(s.instructions for s in log), \
                sum(s.seconds for s in log), ""
    got = tuple(got) + tuple(mine[i] for i, a in enumerate(op.args) if a.mutable)
    problems = [f"{order} schedule: wrote into the guard zone around {n!r} (out of bounds)" for n in arena.changed()]
    _conflicts.update(a for st in log for a in st.lds_conflicts)
    return got, problems, sum(s.instructions for s in log), sum(s.seconds for s in log), ""


def _launch_words(e: BaseException) -> str:
    """The emulator's refusal out of an op error (the core puts op, kernel, target, grid and block around it)."""
    text = str(e)
    cut = text.find("\nAt:\n")  # pybind11 appends the Python frames of the emulator's exception
    if cut >= 0:
        text = text[:cut] + text[text.find("\n [", cut):] if "\n [" in text[cut:] else text[:cut]
    return " ".join(text.split())[:800]


def run_case(handle: Any, spec: _m.Specialization, reference: Any, inputs: list[Any], fresh: bool = False
             ) -> tuple[str, str, int, float]:
    """One case in both schedules against the reference: (result, note, instructions, emulated seconds)."""
    import torch

    op = handle.manifest
    ref_inputs = [_verify._same_layout_copy(t) if isinstance(t, torch.Tensor) and a.mutable else t
                  for a, t in zip(op.args, inputs)]
    try:
        want = reference(*ref_inputs)
    except Exception as e:  # noqa: BLE001 - the user's reference, whatever it raises, is named as the culprit
        return _reference_raised(handle, spec, inputs, e)
    want = (want,) if isinstance(want, torch.Tensor) else () if want is None else tuple(want)
    bad = _reference_misfit(op, want)
    if bad:
        return "FAIL", bad, 0, 0.0
    want += tuple(ref_inputs[i] for i, a in enumerate(op.args) if a.mutable)
    results, problems, instructions, seconds = {}, [], 0, 0.0
    _conflicts.clear()
    orders = list(SCHEDULES)
    for order in orders:  # grows by "serial" when the lockstep orders agree over unsynchronised LDS accesses
        got, found, n, s, refused = _run_once(handle, spec, inputs, want[:len(op.outputs)], order, fresh)
        if refused:
            return "not admitted", refused, instructions, seconds
        instructions, seconds = instructions + n, seconds + s
        problems += found
        if not got:
            break
        results[order] = got
        for k, (g, w) in enumerate(zip(got, want)):
            name = written_name(op, k)
            if g.shape != w.shape or g.dtype != w.dtype:
                problems.append(f"{order}: {name} has shape {list(g.shape)} and dtype "
                                f"{str(g.dtype).removeprefix('torch.')}, the reference returned shape "
                                f"{list(w.shape)} and dtype {str(w.dtype).removeprefix('torch.')}: the reference "
                                "does not match the op's declared output; fix the reference (or the Output)")
                continue
            if not fresh and k < len(op.outputs) and not op.outputs[k].zero:
                mask = _verify.unwritten_mask(g, w)
                if bool(mask.any()):
                    problems.append(f"{order}: {name}: "
                                    + _unwritten(handle, spec, inputs, want, order, k, g, mask))
                    continue
            wrong = _first_wrong(g, w)
            if wrong:
                problems.append(f"{order}: {name}: {wrong}")
        if problems:
            break
        if order == orders[-1] and _conflicts and "serial" not in orders:
            orders.append("serial")  # lockstep runs a read after every wave's earlier writes: try whole turns
    if not problems and len(results) >= 2:
        problems += _schedule_differences(op, results)
    elif problems and _conflicts:  # a wrong result with an LDS race under it: the race is the likely cause
        problems.append(_race_words())
    if not problems and _conflicts:  # the same outputs either way: listed, not failed (the order did not matter here)
        lds = sorted(_conflicts)
        return "ok", (f"{len(lds)} LDS bytes two waves touched with no barrier between, same outputs in every order "
                      "(forward, reverse, one wave at a time): "
                      f"{[hex(a) for a in lds[:4]]}"), instructions, seconds
    return ("FAIL" if problems else "ok"), "; ".join(problems), instructions, seconds


def _race_words() -> str:
    lds = sorted(_conflicts)
    more = f" and {len(lds) - 8} more" if len(lds) > 8 else ""
    return (f"LDS race: LDS bytes two waves touched with no barrier between: {[hex(a) for a in lds[:8]]}{more} "
            "(a barrier, s_barrier / fx.barrier(), between the write and the other waves' reads is missing)")


def _schedule_differences(op: _m.Op, results: dict[str, tuple[Any, ...]]) -> list[str]:
    import torch

    problems = []
    for other in [o for o in results if o != "forward"]:
        for k, (f, r) in enumerate(zip(results["forward"], results[other])):
            same = torch.equal(f.contiguous().view(torch.uint8), r.contiguous().view(torch.uint8)) \
                if f.dtype != torch.bool else torch.equal(f, r)
            if not same:
                diff = (f.double() - r.double()).abs().nan_to_num(float("inf"))
                idx = [int(i) for i in (diff > 0).nonzero()[0]] if bool((diff > 0).any()) else []
                where = f"; {_race_words()}" if _conflicts else ""
                problems.append(f"race: {written_name(op, k)} differs between the forward and {other} wave "
                                f"schedules (first at {idx}): a result that depends on wave order, e.g. LDS read before another "
                                f"wave's write with no barrier between{where}")
        if problems:
            break
    return problems


def _unwritten(handle: Any, spec: _m.Specialization, inputs: list[Any], want: tuple[Any, ...], order: str, k: int,
               got: Any, mask: Any) -> str:
    """Words for the elements of output ``k`` left holding the NaN sentinel where the reference holds a number: for
    a float output the case runs once more into outputs holding :data:`SECOND_SENTINEL_BYTE`; an element holding it
    again was never written, one NaN again is a NaN the kernel computed."""
    import torch

    n = got.numel()
    if not got.dtype.is_floating_point:
        first = [int(i) for i in mask.nonzero()[0]]
        return f"{int(mask.sum())} of {n} elements never written (first at {first})"
    again, _f, _n, _s, _r = _run_once(handle, spec, inputs, want[:len(handle.manifest.outputs)], order, False,
                                      second=True)
    if not again:
        first = [int(i) for i in mask.nonzero()[0]]
        return f"{int(mask.sum())} of {n} elements never written (first at {first})"
    g2 = again[k]
    filler = torch.full((g2.element_size(),), SECOND_SENTINEL_BYTE, dtype=torch.uint8).view(g2.dtype)
    never = mask & (g2 == filler[0])  # a finite value: compared as a number
    nan = mask & ~never & g2.isnan()
    parts = []
    if bool(never.any()):
        parts.append(f"{int(never.sum())} of {n} elements never written (first at "
                     f"{[int(i) for i in never.nonzero()[0]]})")
    if bool(nan.any()):
        parts.append(f"the kernel wrote NaN at {int(nan.sum())} of {n} elements where the reference holds numbers "
                     f"(first at {[int(i) for i in nan.nonzero()[0]]}); they were written, not left unwritten")
    rest = mask & ~never & ~nan
    if bool(rest.any()):
        parts.append(f"{int(rest.sum())} of {n} elements differ between two runs (first at "
                     f"{[int(i) for i in rest.nonzero()[0]]}): the kernel reads what it writes")
    return "; ".join(parts)


def _reference_misfit(op: _m.Op, want: tuple[Any, ...]) -> str:
    """Why the reference's result cannot be the op's outputs (a count or a non-tensor), or ""."""
    import torch

    if len(want) != len(op.outputs) or not all(isinstance(w, torch.Tensor) for w in want):
        kinds = ", ".join(type(w).__name__ for w in want) or "nothing"
        return (f"the reference returned {len(want)} value(s) ({kinds}), the op declares {len(op.outputs)} output(s) "
                f"({', '.join(o.name for o in op.outputs)}): the reference is wrong, not the kernel; make it return "
                "one tensor per declared output")
    return ""


def _reference_raised(handle: Any, spec: _m.Specialization, inputs: list[Any], e: BaseException
                      ) -> tuple[str, str, int, float]:
    """The reference raised on ``inputs``: not admitted when the guard refuses them anyway (checked by a launch into
    fresh outputs), else a failure naming the reference."""
    try:
        handle.run_specialization(spec.name, *[_verify._same_layout_copy(t) if hasattr(t, "stride") else t
                                              for t in inputs])
    except RuntimeError as refused:
        if "do not fit specialization" in str(refused):
            return "not admitted", str(refused).splitlines()[0], 0, 0.0
    except Exception:  # noqa: BLE001 - the kernel's own failure is not what this case reports
        pass
    words = " ".join(f"{type(e).__name__}: {e}".split())[:300]
    return "FAIL", (f"the reference raised {words} on inputs the guard admits: the reference is wrong (or does not "
                    "take these inputs), not the kernel; fix the reference, or constrain the spec so these inputs "
                    "fall back"), 0, 0.0


# -- the whole bundle ------------------------------------------------------------------------------------------------

@contextlib.contextmanager
def _flavor(value: str) -> Iterator[None]:
    before = os.environ.get("FLYSHIP_FLAVOR")
    os.environ["FLYSHIP_FLAVOR"] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("FLYSHIP_FLAVOR", None)
        else:
            os.environ["FLYSHIP_FLAVOR"] = before


def load_emulated(bundle: str | Path, target: str, namespace: Optional[str] = None) -> Any:
    """The bundle loaded on an emulated device of ``target`` (device 0, under a fresh namespace unless given)."""
    import flyship
    from flyship.loader import emulated_device, extension

    ext = extension.extension("emulate")
    emulated_device.install(ext)
    emulated_device.describe(ext, target)
    with _flavor("emulate"):
        return flyship.load(bundle, namespace=namespace or f"flyship_e{uuid.uuid4().hex[:10]}")


def _base_inputs(op: _m.Op, spec: _m.Specialization, rows: int, example_layout: bool = True) -> list[Any]:
    """The base case's inputs at ``rows`` rows, in the example's layout (else row-major)."""
    shapes = {k: tuple(v) for k, v in spec.example.shapes.items()}
    first = next((a.name for a in op.args if a.kind == "tensor" and len(shapes.get(a.name, ())) >= 1), None)
    if first is None or (rows == shapes[first][0] and example_layout):
        return _verify.example_inputs(op, spec, "cpu")  # the example's own layout
    new = _resize(shapes, tied(spec, (first, 0)), rows)
    return shaped_inputs(op, spec, new) if example_layout else _verify.example_inputs(op, spec, "cpu", shapes=new)


def shaped_inputs(op: _m.Op, spec: _m.Specialization, shapes: dict[str, tuple[int, ...]], seed: int = 0) -> list[Any]:
    """Inputs of ``shapes`` (:func:`flyship.loader.tools.verify.example_inputs`), each tensor whose example has
    strides laid out densely in the example's dim order (a column-major example stays column-major at another
    shape): the layout the code was built for, so the other layouts are :func:`verify.other_layouts`' to try."""
    import torch

    out = _verify.example_inputs(op, spec, "cpu", seed=seed, shapes=shapes)
    for i, a in enumerate(op.args):
        strides = spec.example.strides.get(a.name) if a.kind == "tensor" else None
        if strides is None or len(strides) != out[i].dim():
            continue
        order = tuple(sorted(range(len(strides)), key=lambda d: (-int(strides[d]), d)))
        t = out[i]
        store = torch.empty(tuple(t.shape[d] for d in order), dtype=t.dtype)
        out[i] = store.permute(tuple(order.index(d) for d in range(t.dim()))).copy_(t)
    return out


def _bundle_root(bundle: str | Path) -> Path:
    """The folder holding ``bundle``'s manifest (a pack is opened as ``flyship.load`` opens it)."""
    from flyship.bundle import pack as _pack

    root = Path(bundle)
    return _pack.open_pack(root) if _pack.is_pack(root) else root


def bundle_targets(bundle: str | Path) -> tuple[str, ...]:
    """The AMD processors ``bundle`` has code objects for and the emulator models (``verify --emulate``'s default),
    read from its manifest (a pack is opened as ``flyship.load`` opens it)."""
    from flyship.loader.emulate.kernel import MODELLED_TARGETS

    names = dict.fromkeys(t.split(":", 1)[0] for t in _m.read(_bundle_root(bundle)).targets)
    return tuple(n for n in names if n in MODELLED_TARGETS)


def verify_emulated(bundle: str | Path, targets: Optional[Sequence[str]] = None, *, shapes: bool = True,
                    budget_s: float = DEFAULT_BUDGET_S, ops: Optional[Sequence[str]] = None,
                    echo: Any = None) -> Report:
    """Run every AMD specialization of ``bundle`` on emulated devices of ``targets`` (module docstring); ``ops``
    limits it to those op names, ``shapes=False`` leaves out the boundary shapes, ``budget_s`` bounds the emulated
    seconds per specialization and target (the cases after it are reported as skipped for time). ``echo`` gets each
    line as it is decided."""
    runs: list[Run] = []
    cubins: set[tuple[str, str, str]] = set()  # (op, specialization, target) of every non-AMD code object
    asked = bool(targets)  # only these targets' lines; the sm_* code objects are counted in the summary
    targets = tuple(targets) if targets else bundle_targets(bundle) or TARGETS  # none of its own: said per spec
    private = f"flyship_e{uuid.uuid4().hex[:10]}"  # the namespace this process loads under (never the user's)
    declared = _m.read(_bundle_root(bundle)).namespace

    def add(r: Run) -> None:
        r = dataclasses.replace(r, note=declared_names(r.note, private, declared))  # the user's op names
        runs.append(r)
        if echo is not None:
            echo(Report((r,)).table().splitlines()[1])

    for target in targets:
        loaded = load_emulated(bundle, target, namespace=private)
        loaded.check()
        for handle in loaded:
            op = handle.manifest
            if ops is not None and op.name not in ops:
                continue
            reference = loaded.reference(op.name)
            for spec in op.specializations:
                names = [v.target for v in spec.variants]
                cubins.update((op.name, spec.name, n) for n in names if not n.startswith("gfx"))
                chosen = _targets.select(names, target)
                if chosen is None:
                    add(Run(op.name, spec.name, target, "-", "skipped", f"no code object for {target}"))
                    continue
                if reference is None:
                    add(Run(op.name, spec.name, target, "-", "FAIL", "no reference to compare with"))
                    continue
                _verify_spec(handle, spec, reference, target, shapes, budget_s, add)
    if asked:
        return Report(tuple(runs), unasked_cubins=len(cubins))
    for op_name, spec_name, cubin in sorted(cubins):  # said once each, whatever the targets emulated
        add(Run(op_name, spec_name, cubin, "-", "not executed", "the emulator runs AMD code objects only; this one "
                "was checked at load (rules, code object), not run"))
    return Report(tuple(runs))


def _verify_spec(handle: Any, spec: _m.Specialization, reference: Any, target: str, shapes: bool, budget_s: float,
                 add: Any) -> None:
    """Every case of one specialization on one target (module docstring), cheapest first, within ``budget_s``."""
    op = handle.manifest
    t0 = time.perf_counter()

    def run(case: str, inputs: list[Any], fresh: bool, quiet_refusal: bool = False) -> str:
        if time.perf_counter() - t0 > budget_s:
            add(Run(op.name, spec.name, target, case, "skipped", f"time budget of {budget_s:.0f} s per "
                    "specialization spent (flyship verify --emulate --budget S)"))
            return "skipped"
        result, note, n, s = run_case(handle, spec, reference, inputs, fresh)
        if not (quiet_refusal and result == "not admitted"):
            add(Run(op.name, spec.name, target, case, result, note, n, s))
        return result

    rows = base_inputs = None
    # In the example's layout; where the guard refuses every row count in it (a bare-pointer operand's guard asks
    # for contiguous rows whatever the example's strides), row-major: the layout the guard admits, which the
    # kernel must then compute right.
    candidates = [(n, True) for n in base_rows(op, spec)]
    if spec.example.strides:
        candidates += [(n, False) for n in base_rows(op, spec)]
    for k, (n, example_layout) in enumerate(candidates):
        inputs = _base_inputs(op, spec, n, example_layout)
        layout = "" if example_layout or not spec.example.strides else " (row-major, not the example's layout)"
        result = run(f"{n} rows{layout}, fresh outputs", inputs, True, quiet_refusal=k + 1 < len(candidates))
        if result != "not admitted":
            rows, base, base_inputs, kept = n, f"{n} rows{layout}", inputs, example_layout
            break
    if base_inputs is None or rows is None:
        return
    run(base, base_inputs, False)
    for label, other in _verify.other_layouts(op, base_inputs):
        run(f"{base}, {label}", other, False)
    if not shapes:
        return
    for kind, alternatives in shape_groups(op, spec, rows):
        for k, (label, new) in enumerate(alternatives):
            inputs = (shaped_inputs(op, spec, new, seed=1) if kept
                      else _verify.example_inputs(op, spec, "cpu", seed=1, shapes=new))
            if run(f"{kind}: {label}", inputs, False, quiet_refusal=k + 1 < len(alternatives)) != "not admitted":
                break
