"""The loaded bundle as Python sees it: :class:`Ops` (one per bundle) and its :class:`OpHandle` per op, whose
eager calls enter the C++ core directly (the fast entry) or go through ``torch.ops``."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

from flyship import env
from flyship.bundle import manifest as _m
from flyship.bundle import rules as _rules
from flyship.bundle import targets as _targets
from flyship.bundle.errors import BundleError
from flyship.errors import CallError, CallTypeError, ConfigError, FlyshipError
from flyship.loader import cpu as _cpu
from flyship.loader import plan as _plan
from flyship.loader import plancache as _plancache
from flyship.loader import selection as _selection
from flyship.loader import target_dtypes as _target_dtypes
from flyship.loader.selection import Decision, device_index, failures_for, fallback_flag
from flyship.loader import opschema as _opschema



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
    both enter the C++ core directly when nothing but flyship's kernel would act on them (csrc/fast_call.cpp),
    as eager calls of the torch op itself do (:mod:`flyship.loader.torchops`); every other call, and
    torch.compile, takes the torch op.
    """

    def __init__(self, ops: "Ops", index: int, op: _m.Op) -> None:
        import torch

        self._ops = ops
        self._index = index
        self._head = op  # the op without its specializations: all a call from Python needs
        self._device_reads: Optional[list[str]] = None  # where its launch rules read the device (dispatch)
        self.name = op.name
        self.qualname = f"{ops.namespace}::{op.name}"
        self.packet = getattr(getattr(torch.ops, ops.namespace), op.name)
        self.default = self.packet.default
        # An op whose only effect is in place (mutable inputs, no outputs) has no .out variant.
        self.out_overload = self.packet.out if op.outputs else None
        self.schema, self.out_schema = _opschema.schemas(op)
        self._out_names = _opschema.out_names(op)
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
        misfit = _opschema.call_misfit(self._head, args, kwargs, outs)
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
        names, :func:`flyship.loader.opschema.out_names`); say how to call it when they are not all there."""
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
            ``{"calls": n, "launches": {spec: n}, "fallbacks": {reason: n}, "empty": n, "original": n}``;
            ``empty`` counts calls whose grid was empty (nothing to launch), ``original`` calls a tuning table
            sent to the reference on purpose (the original wins for their key; docs/tuning.md). A bundle built with ``--keep-going`` adds
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
        """The op's inputs in schema order, from positional and keyword arguments plus scalar defaults, for
        arguments :func:`flyship.loader.opschema.call_misfit` accepted (a float given as a Python int is a double,
        as torch's parser reads it)."""
        bound: dict[str, Any] = {**dict(zip((a.name for a in self._head.args), args)), **kwargs}
        out = []
        for a in self._head.args:
            v = bound[a.name] if a.name in bound else a.default
            out.append(_opschema.scalar_value(a.kind, v))
        return out

    def dispatch(self, *args: Any, target: str, out: Optional[tuple[Any, ...]] = None,
                 cu_count: Optional[int] = None, **kwargs: Any) -> Decision:
        """Which specialization a call would run on a device of ``target``, without a device: the same
        C++ checks, guards and launch checks (grid, kernarg value ranges) as a launch, on tensors of any one
        device. To run the whole call path without a GPU, tests use the recording driver
        (``FLYSHIP_FLAVOR=record``, docs/loader.md).

        Args:
            args, kwargs: the op's inputs, as for a call (scalar defaults apply).
            target: a device target ID, e.g. ``"gfx942:sramecc+:xnack-"`` or ``"sm_90"``.
            out: out tensors, to decide as the ``.out`` variant would.
            cu_count: the device's compute units (AMD CUs, NVIDIA SMs), required when the op's guards, grids,
                kernel arguments or workspaces read ``device.cu_count``: a target ID does not fix it (an MI300X
                and an MI308X are both gfx942, 304 and 80 CUs).

        Raises:
            ConfigError: a bad ``target``, or no ``cu_count`` for an op whose launch rules read it.
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
        if out is not None:  # an output whose dtype differs per target (loader/target_dtypes.py)
            _target_dtypes.check_dispatch_out(self.qualname, self._ops._declared.ops[self._index], self._head, target)
        misfit = _opschema.call_misfit(self._head, args, kwargs, ())  # the op call's own words, before the C++ core
        if misfit is None:
            misfit = next((f"expected out tensor {i} to be {w}" for i, t in enumerate(out or ())
                           if (w := _opschema.misfit_value("tensor", t))), None)
        if misfit is not None:
            raise CallTypeError(f"{self.qualname}.dispatch: {misfit}")
        values = [*self._bind(args, kwargs), *(out or ())]
        spec, variant, reason = self._ops._core.decide(self._index, target, values, out is not None,
                                                       self._dispatch_cu_count(target, cu_count))
        if spec < 0:
            return Decision(None, None, reason)
        return Decision(self.specializations[spec], self._ops._plan.spec_targets[self._index][spec][variant], "")

    def _dispatch_cu_count(self, target: str, cu_count: Optional[int]) -> int:
        if cu_count is None and self._device_reads is None:
            self._device_reads = _selection.device_reads(self.manifest)
        return _selection.dispatch_cu_count(f"{self.qualname}.dispatch", target, cu_count, self._device_reads or [])

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

    def run_specialization(self, spec: str | int, *args: Any, out: Sequence[Any] = ()) -> tuple[Any, ...]:
        """Run one specialization on a GPU through the op's C++ path (raises if the inputs do not fit it); with
        ``out`` (one tensor per output, in order) the out variant's path writes into them and returns them."""
        if out:
            self._ops._core.run(self._index, [*args, *out], True, self._spec_index(spec))
            return tuple(out)
        return tuple(self._ops._core.run(self._index, list(args), False, self._spec_index(spec)))


class Ops:
    """The ops of a loaded bundle: ``ops.add(x, y)``, ``ops["add"]``, ``for op in ops``.

    Attributes:
        path: the bundle directory.
        manifest: the parsed manifest (every op read on first access).
        namespace: the torch namespace (``torch.ops.<namespace>``).
        flavor: the driver shim of the extension (``"hip"`` or ``"cuda"``; ``"hip-nvidia"`` in the test-only run
            of the HIP shim on an NVIDIA GPU).
        tuning: what became of ``load(tuning=)``'s table, in words (``"applied: 3 of 4 entries for gfx942"``, or
            ``"not used: no GPU here ..."``); None when no table was given.
    """

    tuning: Optional[str] = None

    def __init__(self, path: Path, plan: _plancache.BundlePlan, namespace: str, core: Any, library: Any, ext: Any,
                 references: list[Optional[Callable[..., Any]]], digest: str, cpu: list[_cpu.CpuKernel],
                 code_objects: "_CodeObjects") -> None:
        self.path = path
        self._plan = plan
        self._declared = plan.head  # outputs as the manifest declares them (per-target dtypes: flyship.load sets it)
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
        for name, handle in self._ops.items():
            # a plain attribute (no __getattr__ on each `ops.add`), unless it would hide one of the class's or ours
            if not hasattr(type(self), name) and name not in self.__dict__:
                self.__dict__[name] = handle
        if handle_class is not OpHandle and env.fast_call_enabled():
            self._bind_fast(ext, core, plan.head.ops)

    def _bind_fast(self, ext: Any, core: Any, ops: Sequence[_m.Op]) -> None:
        """Bind the fast entry (csrc/fast_call.cpp) of each op it serves (:func:`_fast_entry_fits`): the handle and
        its ``.out``, and the torch side, ``torch.ops.<ns>.<op>``, ``.default`` and ``.out``
        (:mod:`flyship.loader.torchops`)."""
        from flyship.loader import torchops

        for i, (op, handle) in enumerate(zip(ops, self._ops.values())):
            if not _fast_entry_fits(op):
                continue
            defaults = [None if a.kind == "tensor" else a.default for a in op.args]
            ext.bind_fast(handle, core, i, False, handle._slow, defaults)
            ext.bind_fast(handle.out, core, i, True, handle._out, defaults)
            torchops.bind(ext, core, i, handle.packet, defaults)

    def __getattr__(self, name: str) -> OpHandle:
        ops = self.__dict__.get("_ops", {})
        if name in ops:
            return ops[name]
        composites = self.__dict__.get("_composites", {})  # composite ops (schema 1.4): torch.ops packets
        if name in composites:
            return composites[name]
        raise AttributeError(f"bundle {self.__dict__.get('namespace', '?')}: no op {name!r}; it has "
                             f"{', '.join([*ops, *composites]) or 'none'}")

    def __getitem__(self, name: str) -> OpHandle:
        if name in self.__dict__.get("_composites", {}):
            return self._composites[name]
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
        return sorted(set(super().__dir__()) | set(self._ops) | set(self.__dict__.get("_composites", {})))

    def __repr__(self) -> str:
        backwards = self.backwards
        ops = [f"{n} (backward: {backwards[n]})" if n in backwards else n for n in self._ops]
        composites = f"; composites: {', '.join(self.composites)}" if self.composites else ""
        return f"<flyship bundle {self.namespace} from {self.path}: {', '.join(ops)}{composites}>"

    @property
    def manifest(self) -> _m.Manifest:
        """The whole manifest (its ops are read on first access; a load reads only their heads)."""
        return self._plan.manifest

    @property
    def names(self) -> tuple[str, ...]:
        """The ops with kernels (``ops.<name>`` handles), in manifest order; composites: :attr:`composites`."""
        return tuple(self._ops)

    @property
    def composites(self) -> tuple[str, ...]:
        """The composite ops (schema 1.4): torch code over this bundle's ops, ``ops.<name>`` is their torch.ops
        packet."""
        return tuple(self.__dict__.get("_composites", {}))

    @property
    def backwards(self) -> dict[str, str]:
        """Each op or composite that has a derivative -> its backward op (an op or a composite of this bundle), so
        ``loss.backward()`` through it runs that op."""
        heads = [*self._plan.head.ops, *self._plan.head.composites]
        return {h.name: h.backward.op for h in heads if getattr(h, "backward", None) is not None}

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
        """Run every specialization against its reference on a GPU; see :func:`flyship.loader.tools.verify.verify`."""
        from flyship.loader.tools.verify import verify

        return verify(self, **kwargs)


_handle_class_cache: dict[int, tuple[type, type]] = {}



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
