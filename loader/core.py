"""Load a bundle: check it, lower it to the C++ plan, register its ops with torch.

Registration (per op, under the manifest's namespace or the one given to :func:`load`):

* ``torch.library.Library(ns, "FRAGMENT").define`` of the functional schema and of the ``.out`` variant;
* a fake kernel per overload (``torch.library.register_fake``), from the output rules;
* a CPU kernel per overload (:mod:`flyship.loader.cpu`): CPU tensors run the op's reference, counted as a
  fallback with reason ``"cpu"``;
* in C++: the boxed kernel for the CUDA key (ROCm torch uses it too) and torch's not-implemented autograd
  kernels;
* for an op whose manifest names a backward op, its derivative (:mod:`flyship.loader.autograd`).

The ops stay registered for the life of the process; loading the same bundle again returns the same
:class:`Ops`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

from flyship import env
from flyship.bundle import manifest as _m
from flyship.bundle import pack as _pack
from flyship.bundle import rules as _rules
from flyship.bundle import targets as _targets
from flyship.bundle.errors import BundleError
from flyship.errors import CallError, CallTypeError, ConfigError, FlyshipError
from flyship.loader import autograd as _autograd
from flyship.loader import blame as _blame
from flyship.loader import build as _build
from flyship.loader import cpu as _cpu
from flyship.loader import plan as _plan
from flyship.loader import plancache as _plancache
from flyship.loader import references as _references
from flyship.loader import schema as _schema
from flyship.loader import tuned as _tuned


@dataclasses.dataclass(frozen=True)
class Decision:
    """What a call would run.

    Attributes:
        spec: the specialization's name, or None when nothing fits (the call falls back).
        target: the chosen variant's target, or None.
        reason: why nothing fits (the fallback reason), or "".
    """

    spec: Optional[str]
    target: Optional[str]
    reason: str


def make_selector(plan: _plancache.BundlePlan | _m.Manifest) -> Callable[[str], list[list[tuple[int, str]]]]:
    """The variant chooser the C++ core calls once per (bundle, device target): per op, per
    specialization, the index of the variant to run (:func:`flyship.bundle.targets.select`) or -1 with
    the reason. It reads only the plan's variant targets (no op is read for it)."""
    if isinstance(plan, _m.Manifest):
        plan = _plancache.BundlePlan.of(plan)
    head, spec_names, spec_targets = plan.head, plan.spec_names, plan.spec_targets

    def select(device_target: str) -> list[list[tuple[int, str]]]:
        chosen: dict[tuple[str, ...], tuple[int, str]] = {}  # specializations mostly share their targets
        out = []
        for k, per_op in enumerate(spec_targets):
            per = []
            for si, cands in enumerate(per_op):
                if cands not in chosen:
                    i = _targets.select(list(cands), device_target)
                    chosen[cands] = (-1, _no_code_object(device_target, list(cands))) if i is None else (i, "")
                i, why = chosen[cands]
                if i < 0 and head.failed:  # a --keep-going bundle: the build's own reason when it has one
                    why = _not_built(head, head.ops[k].name, spec_names[k][si], device_target) or why
                per.append((i, why))
            out.append(per)
        return out

    return select


def failures_for(manifest: _m.Manifest, op: str, spec: Optional[str] = None) -> list[_m.Failure]:
    """The manifest's ``failed`` entries (a ``--keep-going`` build) of ``op`` (and of the declared spec that
    manifest specialization ``spec`` comes from: ``fp8`` or a per-target ``fp8__gfx942``)."""
    return [f for f in manifest.failed if f.op == op and (spec is None or spec == f.spec
                                                          or spec.startswith(f.spec + "__"))]


def _not_built(manifest: _m.Manifest, op: str, spec: str, device_target: str) -> str:
    """The fallback reason when the build of this specialization failed for the device's target, or ""."""
    for f in failures_for(manifest, op, spec):
        if _targets.is_compatible(f.target, device_target):
            return f"{op}.{f.spec} did not build for {f.target} (flyc-build --keep-going): {f.reason}"
    return ""


def warn_not_built(manifest: _m.Manifest, root: Path) -> None:
    """Say once at load that a ``--keep-going`` bundle lacks kernels: calls they would take fall back."""
    if not manifest.failed:
        return
    import warnings

    listed = "; ".join(f"{f.op}.{f.spec} on {f.target}: {f.reason.splitlines()[0][:200]}" for f in manifest.failed)
    warnings.warn(f"flyship.load {root}: the bundle was built with --keep-going and {len(manifest.failed)} kernel(s) "
                  f"did not build; calls they would take run the next specialization or the reference: {listed}",
                  UserWarning, stacklevel=3)


def _no_code_object(device_target: str, candidates: list[str]) -> str:
    """The fallback reason when no variant runs on a device: its target and the bundle's targets of the
    same vendor (all of them if it has none of that vendor)."""
    vendor = _targets.parse_target(device_target).vendor
    same = sorted({c for c in candidates if _targets.parse_target(c).vendor == vendor})
    if same:
        return f"no code object for {device_target}; bundle has {', '.join(same)}"
    names = {"amd": "AMD", "nvidia": "NVIDIA"}
    return (f"no code object for {device_target}; bundle has no {names[vendor]} code objects "
            f"({', '.join(sorted(set(candidates)))})")


class _OutCall:
    """``ops.<op>.out``: the out variant (:meth:`OpHandle._out`). A callable object of its own, not a method, so
    that its eager calls enter the C++ core directly like the handle's (:func:`_handle_classes`)."""

    def __init__(self, handle: "OpHandle") -> None:
        self._handle = handle
        self.__doc__ = OpHandle._out.__doc__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._handle._out(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<flyship op {self._handle.qualname}.out: {self._handle.out_schema}>"


class OpHandle:
    """One op of a loaded bundle.

    Calling it runs ``torch.ops.<ns>.<name>.default``; ``.out(...)`` runs the out variant
    (``ops.add.out(x, y, out=z)``, :meth:`_out`); ``.packet`` is ``torch.ops.<ns>.<name>``. Eager calls of
    both enter the C++ core directly when nothing but flyship's kernel would act on them (csrc/fast_call.cpp);
    every other call, and torch.compile, takes the torch op.
    """

    def __init__(self, ops: "Ops", index: int, op: _m.Op) -> None:
        import torch

        self._ops = ops
        self._index = index
        self._head = op  # the op without its specializations: all a call from Python needs
        self.name = op.name
        self.qualname = f"{ops.namespace}::{op.name}"
        self.packet = getattr(getattr(torch.ops, ops.namespace), op.name)
        self.default = self.packet.default
        # An op whose only effect is in place (mutable inputs, no outputs) has no .out variant.
        self.out_overload = self.packet.out if op.outputs else None
        self.schema, self.out_schema = _schema.schemas(op)
        self._out_names = _schema.out_names(op)
        self.out = ops._out_class(self)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # What torch.compile traces, and what a handle without the fast entry runs. Eager calls of a loaded
        # handle enter csrc/fast_call.cpp instead (tp_call), which hands every call it does not take to
        # self._slow with the same arguments.
        return self._slow(*args, **kwargs)

    def _slow(self, *args: Any, **kwargs: Any) -> Any:
        """The torch op, its argument parser's refusals (a wrong type, an unknown keyword, too many arguments)
        raised as :class:`CallTypeError` (:meth:`_refused`)."""
        try:
            return self.default(*args, **kwargs)
        except RuntimeError as e:
            self._refused(e, args, kwargs, ())
            raise

    def _refused(self, e: RuntimeError, args: tuple, kwargs: dict[str, Any], outs: tuple[str, ...]) -> None:
        """Raise a CallTypeError saying what is wrong when torch's argument parser refused a call (its
        RuntimeError would name a type, or dump a whole tensor, with nothing to do); return when the arguments
        fit the schema (the error is about something else and stands as it is)."""
        if isinstance(e, FlyshipError):
            return
        misfit = _schema.call_misfit(self._head, args, kwargs, outs)
        if misfit is not None:
            raise CallTypeError(f"{self.qualname}{'.out' if outs else ''}: {misfit}") from e

    def _out(self, *args: Any, **kwargs: Any) -> Any:
        """The out variant: ``ops.add.out(x, y, out=z)`` writes into ``z`` and returns it (a tuple for
        several outputs). The torch op ``torch.ops.<ns>.<name>.out`` itself returns nothing.

        An op with several outputs takes them by name (``ops.addsub.out(x, y, sum=s, diff=d)``) or as a
        tuple in output order (``out=(s, d)``). One of them may itself be called ``out``
        (``ops.scale_and_add_one.out(x, scaled=s, out=t)``): a tensor passed as ``out=`` is that output, a tuple
        is all of them in order.

        Raises:
            CallTypeError: ``out=`` is not one tensor per output, an output is missing or given twice, or the op
                has no outputs (it only writes its inputs in place: call it directly).
        """
        if self.out_overload is None:
            raise CallTypeError(f"{self.qualname}.out: expected an op with outputs, got one that only writes its "
                                f"inputs {', '.join(self.manifest.mutable)} in place ({self.schema}); call it "
                                "directly")
        self._out_kwargs(args, kwargs)
        try:
            self.out_overload(*args, **kwargs)
        except RuntimeError as e:
            self._refused(e, args, kwargs, tuple(self._out_names))
            raise
        outs = tuple(kwargs[n] for n in self._out_names)
        return outs[0] if len(outs) == 1 else outs

    def _out_usage(self) -> str:
        names = self._out_names
        if len(names) == 1:
            return "pass out=<tensor>"
        return f"pass out=({', '.join(names)}) or {', '.join(f'{o}=...' for o in names)}"

    def _out_kwargs(self, args: tuple, kwargs: dict[str, Any]) -> None:
        """Resolve the out tensors of an ``.out`` call in ``kwargs`` to one keyword per output (the out schema's
        names, :func:`flyship.loader.schema.out_names`); say how to call it when they are not all there."""
        names = self._out_names
        n_in = len(self._head.args)
        if len(args) > n_in:  # out tensors given by position: they are keyword-only in the schema
            raise CallTypeError(f"{self.qualname}.out: expected at most {n_in} positional arguments (the inputs "
                                f"{', '.join(a.name for a in self._head.args)}), got {len(args)}; the out tensors "
                                f"are keyword-only: {self._out_usage()}")
        given = kwargs.get("out")
        # out=(a, b, ...) is every output in order, also when one output is called "out": a tensor is never a
        # tuple, so the two readings cannot be confused.
        if len(names) > 1 and isinstance(given, (tuple, list)):
            twice = [n for n in names if n != "out" and n in kwargs]
            if twice:
                raise CallTypeError(f"{self.qualname}.out: expected each output once, got out=(...) and "
                                    f"{', '.join(f'{n}=' for n in twice)} too; {self._out_usage()}")
            if len(given) != len(names):
                raise CallTypeError(f"{self.qualname}.out: expected out= to hold {len(names)} tensors, one per "
                                    f"output ({', '.join(names)}), got {len(given)} tensors; {self._out_usage()}")
            del kwargs["out"]
            kwargs.update(zip(names, given))
        elif "out" in kwargs and "out" not in names:
            raise CallTypeError(f"{self.qualname}.out: expected out= to hold {len(names)} tensors, one per output "
                                f"({', '.join(names)}), got one {type(given).__name__}; {self._out_usage()}")
        missing = [n for n in names if n not in kwargs]
        if missing:
            got = ", ".join(f"{n}=" for n in names if n in kwargs) or "none"
            raise CallTypeError(f"{self.qualname}.out: expected the out tensors {', '.join(names)}, got {got} "
                                f"(missing {', '.join(missing)}); {self._out_usage()}")

    def __repr__(self) -> str:
        return f"<flyship op {self.qualname}: {self.schema}>"

    @property
    def manifest(self) -> _m.Op:
        """The op's manifest entry, specializations included (read on first use)."""
        return self._ops._plan.op(self._index)

    @property
    def specializations(self) -> tuple[str, ...]:
        return self._ops._plan.spec_names[self._index]

    def _spec_index(self, spec: str | int) -> int:
        names = self.specializations
        if isinstance(spec, int):
            if not 0 <= spec < len(names):
                raise ConfigError(f"{self.qualname}: specialization index {spec} out of range 0..{len(names) - 1}")
            return spec
        if spec not in names:
            raise ConfigError(f"{self.qualname}: no specialization {spec!r}; it has {', '.join(names)}")
        return names.index(spec)

    def stats(self) -> dict[str, Any]:
        """Counters since load (or the last :meth:`reset_stats`).

        Returns:
            ``{"calls": n, "launches": {spec: n}, "fallbacks": {reason: n}, "empty": n}``; ``empty``
            counts calls whose grid was empty (nothing to launch). A bundle built with ``--keep-going`` adds
            ``"not_built": {"<spec> <target>": reason}`` for this op's kernels that did not build.
        """
        d = self._ops._core.stats(self._index)
        not_built = failures_for(self._ops._plan.head, self.name)
        if not_built:  # a --keep-going bundle: what is missing, and why
            d["not_built"] = {f"{f.spec} {f.target}": f.reason for f in not_built}
        on_cpu = self._ops._cpu[self._index].calls
        if on_cpu:
            d["fallbacks"][_cpu.REASON] = on_cpu
            d["calls"] += on_cpu
        return d

    def reset_stats(self) -> None:
        self._ops._core.reset_stats(self._index)
        self._ops._cpu[self._index].reset()

    def _bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
        """The op's inputs in schema order, from positional and keyword arguments plus scalar defaults.

        Raises:
            TypeError: too many, unknown, repeated or missing arguments; shows the schema.
        """
        names = [a.name for a in self._head.args]
        if len(args) > len(names):
            raise TypeError(f"{self.qualname}: takes {len(names)} inputs ({self.schema}), got {len(args)}")
        bound: dict[str, Any] = dict(zip(names, args))
        for k, v in kwargs.items():
            if k not in names:
                raise TypeError(f"{self.qualname}: unknown argument {k!r}; the schema is {self.schema}")
            if k in bound:
                raise TypeError(f"{self.qualname}: argument {k!r} given twice")
            bound[k] = v
        out = []
        for a in self._head.args:
            if a.name in bound:
                out.append(bound[a.name])
            elif a.kind != "tensor" and a.default is not None:
                out.append(a.default)
            else:
                raise TypeError(f"{self.qualname}: missing argument {a.name!r}; the schema is {self.schema}")
        return out

    def dispatch(self, *args: Any, target: str, out: Optional[tuple[Any, ...]] = None, cu_count: int = 0,
                 **kwargs: Any) -> Decision:
        """Which specialization a call would run on a device of ``target``, without a device: the same
        C++ checks, guards and launch checks (grid, kernarg value ranges) as a launch, on tensors of any one
        device. To run the whole call path without a GPU, tests use the recording driver
        (``FLYSHIP_FLAVOR=record``, docs/loader.md).

        Args:
            args, kwargs: the op's inputs, as for a call (scalar defaults apply).
            target: a device target ID, e.g. ``"gfx942:sramecc+:xnack-"`` or ``"sm_90"``.
            out: out tensors, to decide as the ``.out`` variant would.
            cu_count: the device's compute units, for guards that name ``device.cu_count``.
        """
        import torch

        if not isinstance(target, str):
            raise ConfigError(f"{self.qualname}.dispatch: expected target= a device target ID string ('gfx942', "
                              f"'sm_90'), got {type(target).__name__}; ops.device_target(0) gives a GPU's")
        try:
            _targets.parse_target(target)
        except BundleError as e:
            raise ConfigError(f"{self.qualname}.dispatch: target=: {e}; ops.device_target(0) gives a GPU's") from None
        if isinstance(out, torch.Tensor):  # one out tensor, as .out(..., out=t) takes it
            out = (out,)
        values = [*self._bind(args, kwargs), *(out or ())]
        spec, variant, reason = self._ops._core.decide(self._index, target, values, out is not None, int(cu_count))
        if spec < 0:
            return Decision(None, None, reason)
        return Decision(self.specializations[spec], self._ops._plan.spec_targets[self._index][spec][variant], "")

    def load_kernel(self, spec: str | int, *, target: str, device: int) -> None:
        """Load one variant's code object onto GPU ``device`` now (normally this happens at the first call).

        Raises:
            RuntimeError: the runtime refused; the message carries its own error name and string.
        """
        si = self._spec_index(spec)
        self._ops._core.load_kernel(self._index, si, self._variant_index(si, target), int(device))

    def _variant_index(self, si: int, target: str) -> int:
        """The variant a device of ``target`` runs (a variant's own target, or a device target ID such as
        ``sm_90`` that an ``sm_90a`` cubin runs on); the rules are :func:`flyship.bundle.targets.select`."""
        targets = list(self._ops._plan.spec_targets[self._index][si])
        vi = targets.index(target) if target in targets else _targets.select(targets, target)
        if vi is None:
            raise ConfigError(f"{self.qualname}: specialization {self.specializations[si]} has no variant for "
                             f"{target!r}; it has {', '.join(targets)}")
        return vi

    def run_specialization(self, spec: str | int, *args: Any) -> tuple[Any, ...]:
        """Run one specialization on a GPU through the op's C++ path (raises if the inputs do not fit it)."""
        return tuple(self._ops._core.run(self._index, list(args), False, self._spec_index(spec)))


class Ops:
    """The ops of a loaded bundle: ``ops.add(x, y)``, ``ops["add"]``, ``for op in ops``.

    Attributes:
        path: the bundle directory.
        manifest: the parsed manifest (every op read on first access).
        namespace: the torch namespace (``torch.ops.<namespace>``).
        flavor: the driver shim of the extension (``"hip"`` or ``"cuda"``; ``"hip-nvidia"`` in the test-only run
            of the HIP shim on an NVIDIA GPU).
    """

    def __init__(self, path: Path, plan: _plancache.BundlePlan, namespace: str, core: Any, library: Any, ext: Any,
                 references: list[Optional[Callable[..., Any]]], digest: str, cpu: list[_cpu.CpuKernel],
                 code_objects: "_CodeObjects") -> None:
        self.path = path
        self._plan = plan
        self.namespace = namespace
        self.flavor = ext.flavor()
        self._ext = ext
        self._references = {op.name: fn for op, fn in zip(plan.head.ops, references)}
        self._core = core
        self._library = library  # keeps the torch.library registrations alive
        self._cpu = cpu
        self._digest = digest
        self._code_objects = code_objects
        handle_class, self._out_class = _handle_classes(ext)
        self._ops = {op.name: handle_class(self, i, op) for i, op in enumerate(plan.head.ops)}
        if handle_class is not OpHandle and env.fast_call_enabled():
            for i, (op, handle) in enumerate(zip(plan.head.ops, self._ops.values())):
                if not _fast_entry_fits(op):
                    continue
                defaults = [None if a.kind == "tensor" else a.default for a in op.args]
                ext.bind_fast(handle, core, i, False, handle._slow, defaults)
                ext.bind_fast(handle.out, core, i, True, handle._out, defaults)

    def __getattr__(self, name: str) -> OpHandle:
        ops = self.__dict__.get("_ops", {})
        if name in ops:
            return ops[name]
        raise AttributeError(f"bundle {self.__dict__.get('namespace', '?')}: no op {name!r}; it has "
                             f"{', '.join(ops) or 'none'}")

    def __getitem__(self, name: str) -> OpHandle:
        if name not in self._ops:
            raise KeyError(f"bundle {self.namespace}: no op {name!r}; it has {', '.join(self._ops)}")
        return self._ops[name]

    def __iter__(self) -> Iterator[OpHandle]:
        return iter(self._ops.values())

    def __len__(self) -> int:
        return len(self._ops)

    def __contains__(self, name: object) -> bool:
        return name in self._ops

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self._ops))

    def __repr__(self) -> str:
        return f"<flyship bundle {self.namespace} from {self.path}: {', '.join(self._ops)}>"

    @property
    def manifest(self) -> _m.Manifest:
        """The whole manifest (its ops are read on first access; a load reads only their heads)."""
        return self._plan.manifest

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._ops)

    @property
    def targets(self) -> tuple[str, ...]:
        return self._plan.targets

    @property
    def fallback(self) -> bool:
        """Whether calls that fit no specialization run the reference (else they raise)."""
        return self._core.fallback

    @fallback.setter
    def fallback(self, on: bool) -> None:
        self._core.fallback = fallback_flag(on, "ops.fallback")

    def reference(self, name: str) -> Optional[Callable[..., Any]]:
        """The PyTorch reference of op ``name`` (the fallback), or None."""
        self[name]
        return self._references[name]

    def device_target(self, index: int) -> str:
        """The target ID of GPU ``index`` as the runtime reports it (HIP gcnArchName, CUDA ``sm_XY``).

        Raises:
            ConfigError: ``index`` is not a GPU device.
            CallError: the runtime cannot read the device (no such device, no GPU visible): its own words, how
                many GPUs torch sees, and what to do.
        """
        return self._device_info(device_index(index, "ops.device_target"), "ops.device_target")["target"]

    def _device_info(self, index: int, where: str) -> dict[str, Any]:
        """The extension's ``device_info(index)``; a runtime refusal (hipErrorInvalidDevice when there is no GPU)
        said with how many GPUs torch sees and what to do."""
        try:
            return self._ext.device_info(index)
        except RuntimeError as e:
            import torch

            try:
                count = torch.cuda.device_count()
            except Exception:  # noqa: BLE001 - only for the message
                count = 0
            seen = f"torch sees {count} GPU{'s' if count != 1 else ''}" if count else "torch sees no GPU"
            todo = (f"pass an index below {count}" if count else
                    "run on a machine with a GPU, or check HIP_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES")
            raise CallError(f"{where}: expected a GPU the runtime can read at index {index}, got the runtime's "
                            f"refusal ({str(e).splitlines()[0][:300]}) and {seen}; {todo}") from e

    def preload(self, device: int | str | Any = 0) -> int:
        """Load, onto GPU ``device``, the code object each specialization would run there, so that first
        calls do not pay for it.

        Args:
            device: what ``torch.device`` takes for a GPU: an index (``0``), a string (``"cuda:0"``) or a
                ``torch.device``; ``"cuda"`` alone means torch's current device.

        Returns:
            The number of code objects loaded (or found loaded).

        Raises:
            ConfigError: ``device`` is not a GPU device (a float, a bool, ``"cpu"``, a malformed string).
            CallError: the runtime refused (its own words, and what to do), e.g. when there is no such device.
        """
        device = device_index(device, "ops.preload")
        target = self._device_info(device, "ops.preload")["target"]
        n = 0
        for handle in self:
            for si, cands in enumerate(self._plan.spec_targets[handle._index]):
                i = _targets.select(list(cands), target)
                if i is not None:
                    handle.load_kernel(si, target=cands[i], device=device)
                    n += 1
        return n

    def check(self) -> int:
        """Check everything now: the whole manifest by the rule book and its lowering (a load with a warm plan
        cache reads only the ops' heads; their specializations are read and lowered on first use), and every
        variant's code object (sha256, ELF, metadata against the manifest), as a first call or :meth:`preload`
        does for the variants it loads; ``load`` itself reads none.

        Returns:
            The number of variants checked.

        Raises:
            BundleError: the first rule the manifest or a variant breaks.
        """
        _rules.check_manifest(self.manifest)
        for op in self.manifest.ops:
            _plan.lower_specs(op)
        for i in range(len(self._code_objects)):
            self._code_objects(i)
        return len(self._code_objects)

    def stats(self) -> dict[str, dict[str, Any]]:
        """:meth:`OpHandle.stats` of every op."""
        return {name: op.stats() for name, op in self._ops.items()}

    def verify(self, **kwargs: Any) -> "Any":
        """Run every specialization against its reference on a GPU; see :func:`flyship.loader.verify.verify`."""
        from flyship.loader.verify import verify

        return verify(self, **kwargs)


_handle_class_cache: dict[int, tuple[type, type]] = {}


def fallback_flag(value: Any, where: str) -> bool:
    """``value`` as the fallback switch: a bool only. A string such as ``"off"`` or ``"0"`` is truthy in Python,
    so taking it would turn the fallback on when the caller meant off; refuse it instead.

    Raises:
        ConfigError: ``value`` is not a bool.
    """
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: expected True or False, got {value!r} ({type(value).__name__}); pass True to "
                          "run the reference when no specialization fits, False to raise instead")
    return value


def device_index(device: Any, where: str) -> int:
    """The GPU index ``device`` names, read as ``torch.device`` reads it: an int, a string (``"cuda:1"``) or a
    ``torch.device``; one without an index (``"cuda"``) is torch's current device.

    Raises:
        ConfigError: another type (a float, a bool), a string torch does not read, or a device that is not a GPU.
    """
    import torch

    usage = "pass a GPU index (0), a string ('cuda:0') or a torch.device"
    if isinstance(device, bool) or not isinstance(device, (int, str, torch.device)):
        raise ConfigError(f"{where}: expected a GPU device, got {device!r} ({type(device).__name__}); {usage}")
    if isinstance(device, int):
        if device < 0:
            raise ConfigError(f"{where}: expected a GPU index of 0 or more, got {device}; {usage}")
        return device
    try:
        d = torch.device(device)
    except (RuntimeError, ValueError, TypeError) as e:
        raise ConfigError(f"{where}: expected a GPU device, got {device!r}, which torch.device refuses ({e}); "
                          f"{usage}") from None
    if d.type not in ("cuda", "hip"):  # a ROCm build of torch calls its GPUs "cuda" too
        raise ConfigError(f"{where}: expected a GPU device, got {device!r} (a {d.type} device); {usage}")
    if d.index is not None:
        return d.index
    try:
        return torch.cuda.current_device()
    except (RuntimeError, AssertionError) as e:  # a CPU-only torch asserts
        raise ConfigError(f"{where}: expected a GPU device, got {device!r} without an index and torch has no "
                          f"current GPU ({e}); pass an index, e.g. 'cuda:0'") from None


def _fast_entry_fits(op: _m.Op) -> bool:
    """Whether the fast entry may take this op's eager calls: it binds inputs and fresh outputs only, so an op that
    writes an input in place (whose autograd kernel checks and rebases the written tensors) or has no outputs
    keeps every call on torch.ops."""
    return bool(op.outputs) and not any(getattr(a, "mutable", False) for a in op.args)


def _handle_classes(ext: Any) -> tuple[type, type]:
    """The handle classes for extension ``ext``: :class:`OpHandle` and :class:`_OutCall` over the extension's
    ``FastCall`` base, whose eager calls enter the C++ core directly (``enable_fast_call``: CPython calls
    the C entry, while dynamo still reads the Python ``__call__`` and traces the torch op). An extension without
    it gives the plain classes."""
    base = getattr(ext, "FastCall", None)
    if base is None:
        return OpHandle, _OutCall
    key = id(base)
    if key not in _handle_class_cache:
        handle = type("OpHandle", (OpHandle, base), {"__module__": __name__, "__doc__": OpHandle.__doc__})
        out = type("_OutCall", (_OutCall, base), {"__module__": __name__, "__doc__": _OutCall.__doc__})
        ext.enable_fast_call(handle)
        ext.enable_fast_call(out)
        _handle_class_cache[key] = (handle, out)
    return _handle_class_cache[key]


class _CodeObjects:
    """``code_object(variant_id) -> bytes`` for the C++ core: a variant's code object, read, sha256 checked and
    checked against its variant by the rule book (:func:`flyship.bundle.rules.check_variant_file`) when the
    core first loads it onto a device (a first call or :meth:`Ops.preload`), never at load: loading costs
    the same for 20 variants or 2,000. Each file is read once; each variant is checked once (the core keeps
    the bytes it got)."""

    def __init__(self, root: Path, plan: _plancache.BundlePlan) -> None:
        self._root = root
        self._plan = plan  # variant ids in the core's order; an op is read when one of its variants is asked for
        self._files: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._plan.n_variants

    def __call__(self, variant_id: int) -> bytes:
        where, v = self._plan.variant(variant_id)
        with self._lock:
            data = _rules.check_variant_file(self._root, v, where, self._files.get(v.code_object.file))
            self._files[v.code_object.file] = data
        return data


_lock = threading.Lock()
_loaded: dict[str, Ops] = {}


def _internal_dirs() -> tuple[str, ...]:
    """Folders whose frames a warning skips: flyship's packages (the mapped folders) and torch's."""
    import torch

    import flyship
    from flyship import bundle, loader

    return tuple(str(Path(m.__file__).parent) + "/" for m in (flyship, bundle, loader, torch))


def warn_fallback(message: str) -> None:
    """Issue the fallback warning (called by the C++ core) at the first frame outside flyship and torch: the
    user's line that called the op (``warnings.warn``'s ``stacklevel``), so its filename and line mean something
    and a ``-W`` filter on the user's module applies."""
    import sys
    import warnings

    skip = _internal_dirs()
    level, frame = 2, sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(skip):
        frame = frame.f_back
        level += 1
    warnings.warn(message, UserWarning, stacklevel=level)


def _beside(path: str | Path) -> Path:
    """The folder holding the bundle as the user named it (a folder, its manifest.json or a packed file), where a
    prebuilt extension may be shipped."""
    p = Path(path).resolve()
    return p.parent.parent if p.name == _m.MANIFEST_NAME and p.is_file() else p.parent


def _register(manifest: _m.Manifest, namespace: str, core: Any, references: list[Optional[Callable[..., Any]]],
              cpu_in_core: bool = False,
              full_op: Optional[Callable[[int], _m.Op]] = None) -> tuple[Any, list[_cpu.CpuKernel]]:
    import torch

    lib = torch.library.Library(namespace, "FRAGMENT")
    cpu_kernels = []
    for k, (op, reference) in enumerate(zip(manifest.ops, references)):
        functional, out = _schema.schemas(op)
        try:
            lib.define(functional)
            if out is not None:  # an in-place-only op has no .out variant
                lib.define(out)
        except RuntimeError as e:
            raise BundleError(f"register op {namespace}::{op.name}: torch refused the schema {functional!r} / {out!r}: "
                              f"{e}; load the bundle under another namespace (load(..., namespace='...'))") from e
        qual = f"{namespace}::{op.name}"
        torch.library.register_fake(qual, _schema.make_fake(op, False, qual), lib=lib)
        if out is not None:
            torch.library.register_fake(qual + ".out", _schema.make_fake(op, True, qual), lib=lib)
        # ``op`` may be the head alone (no specializations): the CPU kernel reads those only for an error message.
        cpu_kernel = _cpu.CpuKernel(op, qual, reference, lambda: core.fallback,
                                    lambda args, is_out, k=k: core.check_call(k, args, is_out),
                                    full_op=(lambda k=k: full_op(k)) if full_op else None)
        if not cpu_in_core:  # the recording driver's C++ kernel owns the CPU key (it launches on CPU tensors)
            _cpu.register(lib, op, cpu_kernel)
        cpu_kernels.append(cpu_kernel)
    core.register()
    _autograd.register(lib, namespace, manifest)
    return lib, cpu_kernels


def _check_load_args(path: Any, references: Any, verify: Any, tuning: Any) -> None:
    """The types of :func:`load`'s arguments that nothing later checks with a message of its own.

    Raises:
        ConfigError: naming the argument, what it takes and what it got.
    """
    import os

    def shown(v: Any) -> str:
        return f"{type(v).__name__} {str(v)[:40]}" if v is not None else "None"

    if not isinstance(path, (str, os.PathLike)):
        raise ConfigError(f"flyship.load(path=): expected a bundle directory, its manifest.json or a packed bundle "
                          f"file as a str or pathlib.Path, got {shown(path)}; pass the folder flyc-build wrote")
    if references is not None and not isinstance(references, Mapping):
        raise ConfigError(f"flyship.load(references=): expected a mapping of op name -> PyTorch function, got "
                          f"{shown(references)}; pass references={{'add': my_add}}")
    if not isinstance(verify, bool):
        raise ConfigError(f"flyship.load(verify=): expected True or False, got {shown(verify)}")
    if tuning is not None and not isinstance(tuning, (str, os.PathLike)):
        raise ConfigError(f"flyship.load(tuning=): expected the path of a tuning table (`flyship tune` writes one) "
                          f"as a str or pathlib.Path, got {shown(tuning)}; pass tuning='tuning.json'")


def load(path: str | Path, *, references: Optional[Mapping[str, Callable[..., Any]]] = None,
         fallback: Optional[bool] = None, verify: bool = False, namespace: Optional[str] = None,
         tuning: Optional[str | Path] = None, tuning_device: int = 0,
         trusted_keys: Optional[Sequence[str | Path]] = None) -> Ops:
    """Load a bundle built by ``flyc-build`` and register its ops with torch.

    Args:
        path: the bundle directory (holding ``manifest.json``), that ``manifest.json``, or a packed bundle
            file (``flyship pack``).
        references: op name -> PyTorch function, replacing or adding to the bundle's ``references.py``.
        fallback: run the reference when no specialization fits (default: ``FLYSHIP_FALLBACK``, on);
            False raises instead, saying what did not fit. A bool only (a string such as ``"off"`` is refused).
        verify: run each specialization once against its reference on a GPU and raise if one disagrees
            (:meth:`Ops.verify`); needs a GPU.
        namespace: torch namespace to register under (default: the manifest's).
        tuning: a tuning table (``flyship tune``; docs/tuning.md): its winners for the device
            ``tuning_device`` (target ID and CU count) are dispatched first, by guards the C++ core checks per
            call; entries for other devices are ignored with a warning.
        tuning_device: the GPU whose target and CU count select the table's entries.
        trusted_keys: public keys (``.pub`` files from ``flyship keygen`` or hex); when given (default:
            ``FLYSHIP_TRUSTED_KEYS``), only a pack signed by one of them loads (docs/security.md).

    Returns:
        The bundle's :class:`Ops`. Loading the same bundle again returns the same object.

    Raises:
        BundleError: the manifest or a code object is invalid, a packed file is damaged, or the namespace
            is taken by another bundle.
        ExtensionBuildError: the C++ extension could not be built.
        ConfigError: ``path``, ``references``, ``verify`` or ``tuning`` of the wrong type, ``fallback`` is not a
            bool, or ``tuning_device`` is not a GPU device.

    Example::

        ops = flyship.load("artifacts/examples")
        y = ops.add(x, y)
    """
    _check_load_args(path, references, verify, tuning)
    if fallback is not None:
        fallback = fallback_flag(fallback, "flyship.load(fallback=)")
    root = _pack.bundle_dir(path, trusted_keys)
    raw, where = _m.read_bytes(root)
    digest = hashlib.sha256(raw).hexdigest()
    # The checked, lowered plan: from the plan cache when it has this manifest (keyed by its sha256), else read
    # and checked by the rule book now. Each op's specializations are read when the core first uses the op.
    plan = _plancache.load_plan(raw, digest, where, Path(where))
    ns = plan.head.namespace if namespace is None else namespace
    _rules.check_namespace(ns, f"load bundle {root}: namespace")
    table = None
    if tuning is not None:
        from flyship.bundle import tuning as _tt

        table = _tt.read(tuning)
        digest = hashlib.sha256((digest + Path(tuning).read_text()).encode()).hexdigest()
    with _lock:
        existing = _loaded.get(ns)
        if existing is not None:
            if existing._digest != digest or existing.path.resolve() != root.resolve() or references:
                raise BundleError(f"load bundle {root}: namespace {ns!r} is already registered by the bundle at "
                                  f"{existing.path} in this process; torch ops cannot be replaced, so load this one "
                                  "with load(..., namespace='<another name>')")
            if fallback is not None:
                existing.fallback = fallback
            ops = existing
        else:
            refs = _references.resolve(root, plan.head, references)
            ext = _build.extension(near=_beside(path))
            if table is not None:
                gpu = device_index(tuning_device, "flyship.load(tuning_device=)")
                target = ext.device_info(gpu)["target"]
                tuned = _tuned.apply(plan.manifest, table, target, _tuned.device_cus(gpu))
                plan = _plancache.BundlePlan.of(tuned)
            code_objects = _CodeObjects(root, plan)
            heads = [_plan.lower_op(op, ns, [len(t) for t in plan.spec_targets[k]], sum(plan.spec_ids[k]))
                     for k, op in enumerate(plan.head.ops)]
            # The fallback paths run each reference guarded against falling back into itself; ops.reference()
            # gives the reference as it was given.
            guarded = [_references.guarded(r, f"{ns}::{op.name}") for r, op in zip(refs, plan.head.ops)]
            lowered = _plan.lower_bundle(heads, ns, guarded, plan.specs, code_objects,
                                         lambda k, *why: _blame.blame(plan.op(k), *why))
            core = ext.Bundle(lowered, make_selector(plan), env.fallback_enabled() if fallback is None else fallback)
            library, cpu_kernels = _register(plan.head, ns, core, guarded, cpu_in_core=ext.flavor() == "record",
                                             full_op=plan.op)
            ops = Ops(root, plan, ns, core, library, ext, refs, digest, cpu_kernels, code_objects)
            _loaded[ns] = ops
            warn_not_built(plan.head, root)
            if env.verbose():
                print(f"flyship: loaded {ops!r} ({ext.flavor()} flavor, {ext.runtime_version()})")
    if verify:
        report = ops.verify()
        report.raise_on_failure()
    return ops
