"""Triton ops checked on their *source* under Triton's interpreter (``TRITON_INTERPRET=1``), no GPU.

An sm_* cubin cannot execute on a CPU. ``flyc-build --verify`` runs this module in a child process of the build
Python (which has Triton) with ``TRITON_INTERPRET=1`` set before anything imports Triton, so ``@triton.jit``
kernels become Triton's interpreted functions. Every Triton specialization then runs the same cases as
``flyship verify --emulate`` (:mod:`.verify_emulated`: a base case into fresh and into sentinel-filled outputs, each
admitted layout, the boundary shapes) through the op's real call path on the recording driver
(:func:`flyship.loader.record.dry_run`): the guard, the binding and the kernarg packing of the C++ launch path run,
and each recorded launch is replayed on the interpreter with exactly its grid and the arguments decoded from its
kernarg bytes (a pointer becomes the tensor it points into, an integer or float its value), the constexprs the
build compiled in added by name. The outputs are compared with the op's reference.

What is executed is Triton's interpretation of the kernel's Python source, not the cubin's SASS (nor the AMD
code object's ISA, which the emulator runs): a wrong launch mapping (a stride of the wrong tensor, a grid too small
for an admitted shape, a guard admitting a layout the kernel does not handle) shows; a miscompile or a
hardware-specific effect does not.

Where the kernel source comes from: the build's plan (:mod:`flyship.compiler.interpreting`, JSON), naming each
launch's module file and function and the sha256 of every user file the kernel reaches. A file whose bytes changed
since the build is refused, so what runs is the user's code as built. A bundle carries no kernel source, so
``flyship verify --emulate BUNDLE`` alone does not interpret (:func:`flyship.loader.tools.cubins.statement` says what
was not executed).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import struct
import sys
import time
from pathlib import Path
from typing import Any, Optional

from flyship.bundle import manifest as _m
from flyship.bundle import targets as _targets
from flyship.errors import LoadError
from flyship.loader.tools import verify as _verify
from flyship.loader.tools import verify_emulated as _ve

TARGET_LABEL = "interp"  # the report's target column: Triton's interpreter, not a device
PLAN_FORMAT = "flyship-interpret-plan/1"
PLAN_KIND = "InterpretPlanError"  # LoadError kinds: the plan or a kernel file it names cannot be used
REPLAY_KIND = "NotReplayable"  # a recorded launch the interpreter cannot take (said as a skip)
MAX_PLAN_BYTES = 16 << 20
MAX_SOURCE_BYTES = 8 << 20
_UNPACK = {"i64": "<q", "u64": "<Q", "i32": "<i", "u32": "<I", "i16": "<h", "i8": "<b", "f64": "<d", "f32": "<f",
           "f16": "<e", "ptr": "<Q"}


def plan_error(message: str) -> LoadError:
    """The plan or a kernel file it names cannot be used (unreadable, changed since the build, not a kernel)."""
    return LoadError(message, kind=PLAN_KIND)


# -- the plan and the kernels it names -------------------------------------------------------------------------------

def read_plan(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_PLAN_BYTES + 1)
    except OSError as e:
        raise plan_error(f"read the interpreter plan {path}: {e.strerror}") from None
    if len(data) > MAX_PLAN_BYTES:
        raise plan_error(f"read the interpreter plan {path}: expected at most {MAX_PLAN_BYTES} bytes, got more")
    try:
        plan = json.loads(data)
    except ValueError as e:
        raise plan_error(f"read the interpreter plan {path}: not JSON ({e})") from None
    if not isinstance(plan, dict) or plan.get("format") != PLAN_FORMAT:
        raise plan_error(f"read the interpreter plan {path}: expected format {PLAN_FORMAT!r}, got "
                        f"{plan.get('format') if isinstance(plan, dict) else type(plan).__name__!r}")
    return plan


def _sha256_bounded(path: str) -> Optional[bytes]:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SOURCE_BYTES + 1)
    except OSError:
        return None
    return data if len(data) <= MAX_SOURCE_BYTES else None


def numpy_compat() -> str:
    """Triton 3.6's interpreter converts a one-element tensor to an index with ``int(array)``, which NumPy 2.4 refuses
    for arrays of ``ndim > 0`` (triton-lang/triton#9171, fixed upstream by #9172: ``int(data.squeeze())``): every
    ``range(tl.cdiv(...))`` loop then fails with "only 0-dimensional arrays can be converted to Python scalars".
    In this child process only, and only when that conversion fails here, the tensor's ``__index__`` gets the upstream
    fix. Returns what was done, for the report ("" when nothing was needed)."""
    import numpy as np

    try:
        int(np.zeros(1, dtype=np.int32))
        return ""
    except TypeError:
        pass
    from triton.runtime import interpreter as _interp

    original = getattr(_interp, "_patch_lang_tensor", None)
    if original is None or getattr(original, "_flyship_index", False):
        return ""

    def patched(tensor: Any, scope: Any) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    patched._flyship_index = True  # type: ignore[attr-defined]
    _interp._patch_lang_tensor = patched
    return (f"NumPy {np.__version__}: Triton's interpreter given upstream's int(data.squeeze()) for a tensor's "
            "__index__ (triton-lang/triton#9171)")


class Kernels:
    """The interpreted kernels of a plan, each imported once, after every user file it reaches was found unchanged."""

    def __init__(self, plan: dict[str, Any]) -> None:
        if os.environ.get("TRITON_INTERPRET") != "1":
            raise plan_error("interpret Triton kernels: expected TRITON_INTERPRET=1 in the environment before Triton "
                            "is imported, got it unset; run this module as flyc-build --verify does")
        for p in plan.get("paths", []):
            if isinstance(p, str) and p not in sys.path:
                sys.path.insert(0, p)  # the spec's folder, as the build had it: kernels import their neighbours
        self._cache: dict[tuple[str, str], Any] = {}

    def get(self, entry: dict[str, Any]) -> Any:
        key = (entry["file"], entry["qualname"])
        if key not in self._cache:
            self._cache[key] = self._load(entry)
        return self._cache[key]

    @staticmethod
    def _load(entry: dict[str, Any]) -> Any:
        for path, digest in entry.get("files", {}).items():
            data = _sha256_bounded(path)
            if data is None or hashlib.sha256(data).hexdigest() != digest:
                raise plan_error(f"interpret {entry['qualname']}: expected {path} as the build hashed it (sha256 "
                                f"{digest[:12]}...), got {'no readable file' if data is None else 'other bytes'}; "
                                "rebuild (the file changed since the build)")
        name, path = entry["module"], entry["file"]
        mod = sys.modules.get(name)
        if mod is None or Path(getattr(mod, "__file__", "") or "").resolve() != Path(path):
            spec = importlib.util.spec_from_file_location(name, path)
            if spec is None or spec.loader is None:
                raise plan_error(f"interpret {entry['qualname']}: cannot import {path}")
            mod = importlib.util.module_from_spec(spec)
            sys.modules[name] = mod
            spec.loader.exec_module(mod)
        obj: Any = mod
        for part in entry["qualname"].split("."):
            obj = getattr(obj, part, None)
        from triton.runtime.interpreter import InterpretedFunction

        if not isinstance(obj, InterpretedFunction):
            raise plan_error(f"interpret {entry['qualname']}: expected a @triton.jit kernel in {path} turned "
                            f"interpreted by TRITON_INTERPRET=1, got {type(obj).__name__} (Triton imported before?)")
        return obj


# -- one recorded launch, replayed -----------------------------------------------------------------------------------

def not_replayable(message: str) -> LoadError:
    """A recorded launch that cannot be replayed on the interpreter (said as a skip, with the reason)."""
    return LoadError(message, kind=REPLAY_KIND)


def _pointer_target(p: int, tensors: list[Any]) -> Any:
    """A one-element view at address ``p`` of the tensor whose storage holds it (its dtype), for the interpreter,
    which reads a pointer argument's ``data_ptr()`` and element type."""
    import torch

    for t in tensors:
        st = t.untyped_storage()
        base, item = st.data_ptr(), t.element_size()
        if base <= p < base + max(st.nbytes(), 1) and (p - base) % item == 0:
            return torch.empty(0, dtype=t.dtype).set_(st, (p - base) // item, (1,), (1,))
    raise not_replayable(f"the launch passes pointer {p:#x}, inside none of the call's tensors (memory the loader "
                         "allocated itself: a scratch buffer, freed after the recorded call)")


def workspaces(op: _m.Op, variant: _m.Variant, inputs: list[Any], outputs: tuple[Any, ...],
               device: dict[str, int]) -> dict[str, Any]:
    """The call's workspaces, allocated here as the loader does (shape from the manifest's expressions over the
    call's inputs and outputs; zeroed when it says ``zero``, else filled with the dtype's sentinel, as uninitialised
    device memory could hold anything): the recorded pointers were the loader's own allocations, freed when the
    recorded call returned, so every launch of the call gets these instead."""
    import torch

    from flyship.bundle.expr import evaluate_with_shapes

    shapes = {a.name: tuple(t.shape) for a, t in zip(op.args, inputs) if a.kind == "tensor"}
    strides = {a.name: tuple(t.stride()) for a, t in zip(op.args, inputs) if a.kind == "tensor"}
    for o, t in zip(op.outputs, outputs):
        shapes[o.name], strides[o.name] = tuple(t.shape), tuple(t.stride())
    scalars = {a.name: t for a, t in zip(op.args, inputs) if a.kind == "int"}
    out = {}
    for ws in variant.workspaces:
        shape = tuple(int(evaluate_with_shapes(e, shapes, scalars, strides, device)) for e in ws.shape)
        dtype = getattr(torch, ws.dtype)
        out[ws.name] = (torch.zeros(shape, dtype=dtype) if ws.zero
                        else torch.full(shape, _verify._sentinel(dtype), dtype=dtype))
    return out


def launch_arguments(kernel: Any, variant: _m.Variant, kernargs: bytes, constexprs: dict[str, Any],
                     tensors: list[Any], work: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """The interpreted kernel's arguments by parameter name: each runtime parameter decoded from the recorded kernarg
    bytes at its manifest field (a pointer as the tensor it points into), each constexpr as compiled (a parameter
    with a default in the kernel's signature and neither takes its default, as in Triton's own launch)."""
    import inspect

    fields = {f.kernel_arg: f for f in variant.kernargs.fields if f.kernel_arg}
    params = inspect.signature(kernel.fn).parameters
    args: dict[str, Any] = {}
    for name in kernel.arg_names:
        if name in constexprs:
            args[name] = constexprs[name]
            continue
        f = fields.get(name)
        if f is None and params[name].default is not inspect.Parameter.empty:
            continue
        if f is None or f.type not in _UNPACK and f.type != "bf16":
            raise not_replayable(f"kernel parameter {name!r} is neither a kernarg field of the {variant.target} "
                                 "variant nor a constexpr of the build")
        raw = kernargs[f.offset:f.offset + f.size]
        if len(raw) != f.size:
            raise not_replayable(f"kernel parameter {name!r}: the recorded kernargs end before its field at {f.offset}")
        if f.type == "bf16":
            value: Any = struct.unpack("<f", b"\0\0" + raw)[0]
        else:
            value = struct.unpack(_UNPACK[f.type], raw)[0]
        if f.kind == "workspace" and work is not None and f.arg in work:
            args[name] = work[f.arg]
            continue
        if f.kind in ("workspace", "scratch"):
            raise not_replayable(f"kernel parameter {name!r} is a {f.kind} pointer the loader allocated for the call")
        args[name] = _pointer_target(value, tensors) if f.type == "ptr" else value
    return args


@dataclasses.dataclass
class Target:
    """The recording device the launches come from and the build's plan for each op."""

    dry: Any
    plan: dict[str, Any]
    kernels: Kernels
    device: dict[str, int]  # the recording device's properties (``device.cu_count`` in expressions)


def _run_once(tg: Target, handle: Any, spec: _m.Specialization, inputs: list[Any], want: tuple[Any, ...],
              fresh: bool) -> tuple[tuple[Any, ...], list[str], str, str]:
    """The specialization's call on the recording driver, each launch replayed on the interpreter: (outputs and
    mutated inputs, problems, why the guard refused the inputs or "", why a launch could not be replayed or "")."""
    op = handle.manifest
    arena = _ve.Arena()
    mine = [arena.place_like(t, a.name) if a.kind == "tensor" else t for a, t in zip(op.args, inputs)]
    outs = () if fresh else tuple(arena.place(tuple(w.shape), tuple(w.stride()), w.dtype, o.name)
                                  for o, w in zip(op.outputs, want))
    tg.dry.launches(clear=True)
    try:
        got = handle.run_specialization(spec.name, *mine, out=outs)
    except RuntimeError as e:
        if "do not fit specialization" in str(e):
            return (), [], str(e).splitlines()[0], ""
        return (), [f"the call on the recording driver raised: {_ve._launch_words(e)}"], "", ""
    got = tuple(got) if isinstance(got, (tuple, list)) else (got,) if got is not None else ()
    launches = tg.dry.launches(clear=True)
    entries = tg.plan["ops"][op.name].get(spec.name)
    if entries is None:
        return (), [], "", "the build's plan names no launches for this specialization (a bundle of another build?)"
    names = [v.target for v in spec.variants]
    chosen = _targets.select(names, tg.dry.target)
    variant = spec.variants[chosen].launches if chosen is not None else ()
    if len(launches) != len(entries) or len(launches) != len(variant):
        return (), [], "", (f"{len(launches)} launches recorded, the build planned {len(entries)} and the "
                            f"{tg.dry.target} variant has {len(variant)}")
    tensors = [t for t in (*mine, *got) if hasattr(t, "untyped_storage")]
    work = (workspaces(op, variant[0], mine, got[:len(op.outputs)], tg.device)
            if variant and variant[0].workspaces else {})
    for k, (rec, entry, v) in enumerate(zip(launches, entries, variant)):
        if "refused" in entry:
            return (), [], "", entry["refused"]
        if rec.symbol != entry["symbol"]:
            return (), [], "", f"launch {k + 1} is {rec.symbol!r}, the build planned {entry['symbol']!r}"
        kernel = tg.kernels.get(entry)
        try:
            args = launch_arguments(kernel, v, rec.kernargs, entry["constexprs"], tensors, work)
        except LoadError as e:
            if e.kind != REPLAY_KIND:
                raise
            return (), [], "", f"launch {k + 1}: {e}"
        try:
            kernel[tuple(rec.grid)](**args)
        except Exception as e:  # noqa: BLE001 - the compiler took this source, so the interpreter is what failed
            return (), [], "", (f"launch {k + 1} ({rec.symbol}, grid {list(rec.grid)}) raised under Triton's "
                                "interpreter, which does not run every construct its compiler accepts (the kernel "
                                f"built): {' '.join(str(e).split())[:400]}")
    got = got + tuple(mine[i] for i, a in enumerate(op.args) if a.mutable)
    problems = [f"wrote into the guard zone around {n!r} (out of bounds)" for n in arena.changed()]
    return got, problems, "", ""


def run_case(tg: Target, handle: Any, spec: _m.Specialization, reference: Any, inputs: list[Any],
             fresh: bool = False) -> tuple[str, str]:
    """One case against the reference: (result, note) as :class:`flyship.loader.tools.verify_emulated.Run` has."""
    import torch

    op = handle.manifest
    ref_inputs = [_verify._same_layout_copy(t) if isinstance(t, torch.Tensor) and a.mutable else t
                  for a, t in zip(op.args, inputs)]
    try:
        want = reference(*ref_inputs)
    except Exception as e:  # noqa: BLE001 - the case's inputs do not suit the reference: nothing to compare with
        return "skipped", f"not checked: the reference raised {type(e).__name__}: {' '.join(str(e).split())[:300]}"
    want = (want,) if isinstance(want, torch.Tensor) else () if want is None else tuple(want)
    want += tuple(ref_inputs[i] for i, a in enumerate(op.args) if a.mutable)
    got, problems, refused, unreplayed = _run_once(tg, handle, spec, inputs, want[:len(op.outputs)], fresh)
    if refused:
        return "not admitted", refused
    if unreplayed:
        return "skipped", f"not interpreted: {unreplayed}"
    values: list[str] = []  # wrong numbers (unwritten elements, shapes, guard zones and refusals are problems)
    for k, (g, w) in enumerate(zip(got, want) if not problems else ()):
        name = _ve.written_name(op, k)
        if g.shape != w.shape:
            problems.append(f"{name} has shape {list(g.shape)}, the reference {list(w.shape)}")
            continue
        if not fresh and k < len(op.outputs) and not op.outputs[k].zero:
            mask = _verify.unwritten_mask(g, w)
            left = int(mask.sum())
            if left:
                problems.append(f"{name}: {left} of {g.numel()} elements never written (first at "
                                f"{[int(i) for i in mask.nonzero()[0]]})")
                continue
        wrong = _ve._first_wrong(g, w)
        if wrong:
            values.append(f"{name}: {wrong}")
    if values and not problems and _has_bfloat16(op, inputs, got):
        return "skipped", (f"not checked: {BF16_UNSUPPORTED}; under it: {'; '.join(values)}")
    problems += values
    return ("FAIL" if problems else "ok"), "; ".join(problems)


BF16_UNSUPPORTED = ("Triton's interpreter does not compute bfloat16 arithmetic (it holds bfloat16 as uint16 bit "
                    "patterns: Triton's debugging guide, triton-lang/triton#11584), so wrong values of a bfloat16 "
                    "specialization say nothing about the kernel; its float16/float32 specializations check the same "
                    "launch mapping")


def _has_bfloat16(op: _m.Op, inputs: list[Any], got: tuple[Any, ...]) -> bool:
    import torch

    return any(getattr(t, "dtype", None) == torch.bfloat16 for t in (*inputs, *got))


# -- every Triton specialization ---------------------------------------------------------------------------------------

def _verify_spec(tg: Target, handle: Any, spec: _m.Specialization, reference: Any, budget_s: float, add: Any) -> None:
    """The cases :func:`flyship.loader.tools.verify_emulated.verify_emulated` runs, cheapest first, in ``budget_s``."""
    op = handle.manifest
    t0 = time.perf_counter()

    def run(case: str, inputs: list[Any], fresh: bool, quiet_refusal: bool = False) -> str:
        if time.perf_counter() - t0 > budget_s:
            add(_ve.Run(op.name, spec.name, TARGET_LABEL, case, "skipped", f"time budget of {budget_s:.0f} s per "
                        "specialization spent (flyc-build --verify-budget S)"))
            return "skipped"
        s0 = time.perf_counter()
        result, note = run_case(tg, handle, spec, reference, inputs, fresh)
        if not (quiet_refusal and result == "not admitted"):
            add(_ve.Run(op.name, spec.name, TARGET_LABEL, case, result, note, 0, time.perf_counter() - s0))
        return result

    rows = base_inputs = None
    candidates = _ve.base_rows(op, spec)
    for k, n in enumerate(candidates):
        inputs = _ve._base_inputs(op, spec, n)
        result = run(f"{n} rows, fresh outputs", inputs, True, quiet_refusal=k + 1 < len(candidates))
        if result != "not admitted":
            rows, base_inputs = n, inputs
            break
    if base_inputs is None or rows is None or time.perf_counter() - t0 > budget_s:
        return
    run(f"{rows} rows", base_inputs, False)
    for label, other in _verify.other_layouts(op, base_inputs):
        run(f"{rows} rows, {label}", other, False)
    for kind, alternatives in _ve.shape_groups(op, spec, rows):
        for k, (label, new) in enumerate(alternatives):
            inputs = _verify.example_inputs(op, spec, "cpu", seed=1, shapes=new)
            if run(f"{kind}: {label}", inputs, False, quiet_refusal=k + 1 < len(alternatives)) != "not admitted":
                break


def verify_interpreted(bundle: str | Path, plan: dict[str, Any], *, budget_s: float = _ve.DEFAULT_BUDGET_S,
                       echo: Any = None) -> _ve.Report:
    """Every specialization of the plan's ops in ``bundle`` replayed on Triton's interpreter (module docstring);
    ``echo`` gets each line as it is decided. Needs ``TRITON_INTERPRET=1`` set before Triton was imported."""
    from flyship.loader.record import dry_run

    runs: list[_ve.Run] = []
    kernels = Kernels(plan)
    compat = numpy_compat()
    if compat and echo is not None:
        echo(f"note: {compat}")
    lim = _targets.limits(plan["target"])  # the device the build planned for, as the guards and launch checks see it
    cus = _targets.usual_cu_count(plan["target"])  # the build's example device
    dev = dry_run(bundle, target=plan["target"], max_shared_per_block=lim["lds_bytes"],
                  max_threads_per_block=lim["max_workgroup_size"], cu_count=cus)
    declared = _m.read(_ve._bundle_root(bundle)).namespace

    def add(r: _ve.Run) -> None:  # notes name the user's ops, never the dry run's private namespace
        r = dataclasses.replace(r, note=_ve.declared_names(r.note, dev.ops.namespace, declared))
        runs.append(r)
        if echo is not None:
            echo(_ve.Report((r,)).table().splitlines()[1])

    tg = Target(dev, plan, kernels, {"cu_count": cus})
    tg.dry.ops.check()
    for handle in tg.dry.ops:
        op = handle.manifest
        if op.name not in plan["ops"]:
            continue
        reference = tg.dry.ops.reference(op.name)
        for spec in op.specializations:
            if _targets.select([v.target for v in spec.variants], tg.dry.target) is None:
                add(_ve.Run(op.name, spec.name, TARGET_LABEL, "-", "skipped", f"no variant for {tg.dry.target}, "
                            "whose launch the interpreter replays"))
            elif reference is None:
                add(_ve.Run(op.name, spec.name, TARGET_LABEL, "-", "FAIL", "no reference to compare with"))
            else:
                _verify_spec(tg, handle, spec, reference, budget_s, add)
    return _ve.Report(tuple(runs))


def summary(report: _ve.Report) -> str:
    count = {k: sum(r.result == k for r in report.runs) for k in ("ok", "FAIL", "not admitted", "skipped")}
    seconds = sum(r.seconds for r in report.runs)
    return (f"Triton interpreter: {count['ok']} ok, {count['FAIL']} failed, {count['not admitted']} not admitted by "
            f"the guard, {count['skipped']} skipped, in {seconds:.1f} s (each kernel's source under "
            "TRITON_INTERPRET=1 with the recorded launches' grids and arguments; the sm_* cubins themselves were not "
            "executed: no NVIDIA GPU)")


def main(argv: Optional[list[str]] = None) -> int:
    """``python -m flyship.loader.tools.verify_interpreted BUNDLE PLAN [BUDGET_S]`` (what flyc-build --verify runs):
    every line as decided, the summary, and exit status 1 with the first failure as the last line of stderr."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) not in (2, 3):
        print("usage: python -m flyship.loader.tools.verify_interpreted BUNDLE PLAN [BUDGET_S]", file=sys.stderr)
        return 2
    from flyship.errors import FlyshipError

    try:
        budget = float(argv[2]) if len(argv) == 3 else _ve.DEFAULT_BUDGET_S
        report = verify_interpreted(argv[0], read_plan(Path(argv[1])), budget_s=budget,
                                    echo=lambda line: print(line, flush=True))
    except (FlyshipError, ValueError) as e:
        print(f"verify --interpret: {e}", file=sys.stderr)
        return 1
    print(summary(report), flush=True)
    bad = report.failures()
    if bad:
        first = bad[0]
        print(f"{len(bad)} failing under Triton's interpreter; first: op {first.op!r}, specialization "
              f"{first.spec!r}, {first.case}: {first.note}", file=sys.stderr)
        return 1
    if not any(r.result == "ok" for r in report.runs):  # said, not refused: nothing ran, nothing was found wrong
        print("no Triton specialization ran under the interpreter (every case skipped or not admitted: see the "
              "reasons above); their sm_* cubins are unchecked by execution", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
