"""Tuning on the workload side: race a bundle's config space on a GPU, and dispatch through a tuning table.

``flyship tune BUNDLE --shapes FILE`` (:func:`tune`) needs torch and a GPU, never a DSL or a compiler: for
every op with a tuning key (``Op.tuning_key``, written by ``flyc-build`` from a config space) and every
shape in the shapes file, it runs each specialization whose guard admits the inputs through the op's own
C++ path, with warm-up, repeats, an L2 flush before each timed call and device events, and records the
median. The op's reference (what the op replaces: the PyTorch function the loader falls back to) races too,
under the name ``(original)``: where it is fastest, the table says so and the loaded op runs the reference
for that key on purpose (never slower than what it replaces). The fastest wins; the table (:mod:`flyship.bundle.tuning`) is keyed by the device's target ID, its
CU / SM count and the key's values.

``flyship.load(bundle, tuning=PATH)`` calls :func:`apply`: the table's winners for this device become
guards placed before the bundle's own specializations (nearest-bucket policy, documented in
:mod:`flyship.bundle.tuning` and docs/tuning.md), so the C++ core dispatches by them per call with no
Python on the hot path.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any, Callable, Optional

from flyship.bundle import expr as _expr
from flyship.bundle import manifest as _m
from flyship.bundle import tuning as _tt
from flyship.errors import ConfigError
from flyship.loader import core as _core
from flyship.loader.tools.tune_shapes import check_file, read_shapes  # noqa: F401  (read_shapes re-exported)
from flyship.loader.tuned import apply, device_cus  # noqa: F401  (the load-time step, re-exported)


def _inputs(op: _m.Op, call: dict[str, Any], device: Any) -> list[Any]:
    """The tensors and scalars of one call checked by :func:`flyship.loader.tools.tune_shapes.check_calls` (shapes,
    dtypes from its fixed list and the memory bound already checked: nothing here trusts the file)."""
    import torch

    out = []
    for a in op.args:
        if a.kind == "tensor":
            dt = getattr(torch, call["dtypes"][a.name])
            shape = call[a.name]
            t = torch.randn(shape, device=device).to(dt) if dt.is_floating_point else \
                torch.randint(0 if dt == torch.bool else -8, 2 if dt == torch.bool else 8, shape, device=device).to(dt)
            out.append(t)
        else:
            v = call.get(a.name, a.default)
            out.append({"int": 1, "float": 1.0, "bool": False}[a.kind] if v is None else v)
    return out


def key_values(op: _m.Op, inputs: list[Any]) -> tuple[int, ...]:
    """The op's key evaluated on a call's inputs (the same expressions the guards use)."""
    shapes = {a.name: tuple(t.shape) for a, t in zip(op.args, inputs) if a.kind == "tensor"}
    scalars = {a.name: v for a, v in zip(op.args, inputs) if a.kind == "int"}
    return tuple(int(_expr.evaluate_with_shapes(k, shapes, scalars)) for k in op.tuning_key)


def time_call(fn: Callable[[], Any], *, warmup: int = 5, repeats: int = 20, flush_bytes: int = 256 << 20) -> float:
    """Median microseconds of ``fn`` on the current stream: ``warmup`` untimed calls, then ``repeats``
    calls each after writing ``flush_bytes`` (larger than L2) and timed by a pair of device events."""
    import torch

    flush = torch.empty(flush_bytes, dtype=torch.uint8, device="cuda")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)
    return statistics.median(times)


def race(ops: Any, shapes: dict[str, list[dict[str, Any]]], *, device: int = 0, warmup: int = 5, repeats: int = 20,
         progress: Callable[[str], None] = lambda s: print(s, file=sys.stderr),
         timer: Optional[Callable[[Callable[[], Any]], float]] = None, tensor_device: Any = None,
         originals: Optional[dict[str, Optional[Callable[..., Any]]]] = None) -> _tt.Table:
    """Race every candidate of every tuned op for each call in ``shapes`` on GPU ``device``.

    ``timer`` (default :func:`time_call` with ``warmup`` / ``repeats``) and ``tensor_device`` (default GPU
    ``device``) are replaceable so that the race's logic runs on the recording driver in tests.

    Candidates are the specializations whose guard admits the call (checked by the C++ core with
    ``dispatch``), and the original (:data:`flyship.bundle.tuning.ORIGINAL`): ``originals[op]`` when given
    (a callable taking the op's inputs, e.g. a patched site's original function adapted to them; None races
    no original), else the op's reference. A candidate that raises is skipped with a message. Key values
    seen twice keep the first measurement.

    Raises:
        ConfigError: an op in ``shapes`` the bundle lacks or that has no tuning key; a call no
            specialization admits.
    """
    import torch

    checked = check_file(ops.manifest, shapes, "(shapes)")  # every value, before the GPU is looked at
    target = ops.device_target(device)
    if tensor_device is None and not torch.cuda.is_available():
        raise ConfigError(f"flyship tune: expected a GPU torch can put the race's tensors on, found none (torch "
                          f"{torch.__version__}, the {ops.flavor} flavor); run flyship tune on a machine with the "
                          "GPU the table is for")
    cus = device_cus(device)
    dev = tensor_device if tensor_device is not None else torch.device("cuda", device)
    timer = timer or (lambda fn: time_call(fn, warmup=warmup, repeats=repeats))
    keys, entries = {}, {}
    for name, calls in checked.items():
        h = ops[name]
        op = h.manifest
        keys[name] = op.tuning_key
        for ci, call in enumerate(calls):
            where = f"flyship tune: op {name} call {ci}"
            inputs = _inputs(op, call, dev)
            kv = key_values(op, inputs)
            if (name, kv) in entries:
                continue
            us = _race_specs(h, op, inputs, timer, lambda msg: progress(f"  {name} {list(kv)} {msg}"))
            orig = originals[name] if originals and name in originals else ops.reference(name)
            if orig is not None:
                us.update(_race_original(orig, inputs, timer, lambda msg: progress(f"  {name} {list(kv)} {msg}")))
            if not any(k != _tt.ORIGINAL for k in us):
                raise ConfigError(f"{where}: no specialization admits shapes {call}; fix the shapes file")
            best = min(us, key=us.get)
            progress(f"{name} key={list(kv)}: {best} {us[best]:.1f} us (of {len(us)})")
            entries[(name, kv)] = _tt.Entry(name, target, cus, kv, best, us)
    return _tt.Table(ops.manifest.namespace, keys, tuple(entries.values()))


def _race_specs(h: Any, op: _m.Op, inputs: list[Any], timer: Callable[[Callable[[], Any]], float],
                say: Callable[[str], None]) -> dict[str, float]:
    """Each specialization of ``op`` that admits ``inputs``, timed through the op's C++ path."""
    us: dict[str, float] = {}
    for s in op.specializations:
        try:
            # The guard, as the core checks it: only candidates that admit the call are raced.
            h.run_specialization(s.name, *inputs)
        except Exception as e:
            say(f"{s.name}: skipped ({type(e).__name__}: {str(e)[:120]})")
            continue
        us[s.name] = timer(lambda s=s: h.run_specialization(s.name, *inputs))
    return us


def _race_original(fn: Callable[..., Any], inputs: list[Any], timer: Callable[[Callable[[], Any]], float],
                   say: Callable[[str], None]) -> dict[str, float]:
    """The original (the op's reference or a patched site's original) timed on ``inputs``; {} if it raises."""
    try:
        fn(*inputs)
    except Exception as e:
        say(f"{_tt.ORIGINAL}: skipped ({type(e).__name__}: {str(e)[:120]})")
        return {}
    return {_tt.ORIGINAL: timer(lambda: fn(*inputs))}


def tune(bundle: Path | str, shapes: Path | str, out: Optional[Path | str] = None, *, device: int = 0,
         warmup: int = 5, repeats: int = 20, merge: bool = True, original: bool = True) -> Path:
    """Race a bundle's tuned ops on GPU ``device`` and write the table (default ``BUNDLE/tuning.json``);
    with ``merge``, entries of an existing table at ``out`` for other keys or devices are kept. With
    ``original`` (the default) each op's reference races too (:func:`race`).

    Returns:
        The table's path.
    """
    shape_calls = read_shapes(shapes)  # read and checked before the bundle loads or a GPU is looked at
    from flyship.bundle import manifest as _manifest
    from flyship.bundle import pack as _pack

    check_file(_manifest.read(_pack.bundle_dir(bundle)), shape_calls, shapes)
    ops = _core.load(bundle)
    table = race(ops, shape_calls, device=device, warmup=warmup, repeats=repeats,
                 originals=None if original else {name: None for name in shape_calls})
    path = Path(out) if out else Path(bundle) / "tuning.json"
    if merge and path.is_file():
        table = _tt.merge(_tt.read(path), table)
    _tt.write(table, path)
    return path
