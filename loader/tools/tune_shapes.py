"""The shapes file of ``flyship tune --shapes`` and the tune's dry run: every value checked before anything is made.

A shapes file is ``{"<op>": [{"<tensor>": [dims], "<scalar>": value, "dtypes": {"<tensor>": "float16"}}, ...]}``,
one call per item (docs/tuning.md). Each value is checked, with a message naming the entry (``add[2].x[1]``):

* a dimension is a JSON whole number (``8.7`` and ``true`` are refused, never coerced) from 1 to
  :data:`flyship.bundle.limits.MAX_TUNE_DIM`; a shape has the op's rank (at least it, for a batched input);
* a dtype is one of :data:`DTYPES` (a fixed list: the name never reaches ``getattr(torch, ...)`` unchecked);
* a scalar has its argument's kind (an int argument takes a whole number in int64, a float one a finite number, a
  bool one ``true``/``false``); a key that is no argument of the op is refused;
* the memory of a call's inputs is estimated from the shapes and dtypes before any tensor is allocated, and a call
  over :data:`flyship.bundle.limits.MAX_TUNE_CALL_BYTES` is refused.

:func:`dry_run` checks a bundle, a shapes file and an existing table together without a GPU (and without building
the extension): what ``flyship tune --dry-run`` prints.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

from flyship.bundle import expr as _expr
from flyship.bundle import files as _files
from flyship.bundle import limits as _limits
from flyship.bundle import manifest as _m
from flyship.errors import ConfigError, FlyshipError

# The dtypes a tune may make inputs of, with their sizes in bytes (torch's names).
DTYPES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int8": 1, "uint8": 1, "int16": 2, "int32": 4,
          "int64": 8, "bool": 1}
_DEFAULT_DTYPE = "float32"


def read_shapes(path: Path | str) -> dict[str, list[dict[str, Any]]]:
    """The shapes file at ``path``, checked for its form (:func:`check_calls` checks it against the ops).

    Raises:
        ConfigError: unreadable, not JSON, or not ``{op: [{...}, ...]}``.
    """
    data = _files.read_json(path, _limits.MAX_TUNING_BYTES, what="flyship tune --shapes", error=ConfigError)
    if not isinstance(data, dict) or not all(isinstance(v, list) and all(isinstance(c, dict) for c in v)
                                             for v in data.values()):
        raise ConfigError(f"flyship tune --shapes {path}: expected {{op: [{{tensor: [dims], ...}}, ...]}}, got "
                          f"{type(data).__name__}")
    return data


def _whole(v: Any) -> bool:
    return type(v) is int  # JSON true is a bool, 8.7 a float: neither is a dimension


def _check_shape(a: _m.Arg, dims: Any, where: str) -> tuple[int, ...]:
    if not isinstance(dims, list):
        raise ConfigError(f"{where}: expected a shape (a list of whole numbers), got {str(dims)[:60]!r}")
    rank_ok = len(dims) >= a.rank if a.batch else len(dims) == a.rank
    if not rank_ok or len(dims) > _limits.MAX_RANK:
        want = f"at least {a.rank}" if a.batch else f"{a.rank}"
        raise ConfigError(f"{where}: expected {want} dimensions (the op's input {a.name} has rank {a.rank}), got "
                          f"{len(dims)}")
    for i, d in enumerate(dims):
        if not _whole(d) or not 1 <= d <= _limits.MAX_TUNE_DIM:
            raise ConfigError(f"{where}[{i}]: expected a whole number from 1 to {_limits.MAX_TUNE_DIM}, got "
                              f"{repr(d)[:40]}{' (a fraction or a bool is not a dimension)' if not _whole(d) else ''}")
    return tuple(dims)


def _check_scalar(a: _m.Arg, v: Any, where: str) -> Any:
    ok = {"int": lambda x: _whole(x) and _limits.INT64_MIN <= x <= _limits.INT64_MAX,
          "float": lambda x: type(x) in (int, float) and math.isfinite(x),
          "bool": lambda x: type(x) is bool}[a.kind](v)
    if not ok:
        want = {"int": "a whole number in int64", "float": "a finite number", "bool": "true or false"}[a.kind]
        raise ConfigError(f"{where}: expected {want} (the op's {a.kind} argument {a.name}), got {repr(v)[:40]}")
    return v


def check_calls(op: _m.Op, calls: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    """Each call of ``op`` checked (module docstring); returns them as checked (shapes as tuples).

    Raises:
        ConfigError: naming the entry (``where[i].name``) and what it expected.
    """
    args = {a.name: a for a in op.args}
    base = op.specializations[0].guard.dtypes if op.specializations else {}
    out = []
    for ci, call in enumerate(calls):
        at = f"{where}[{ci}]"
        extra = sorted(set(call) - set(args) - {"dtypes"})
        if extra:
            raise ConfigError(f"{at}: expected the op's arguments ({', '.join(args)}) and 'dtypes', got also "
                              f"{', '.join(repr(k[:40]) for k in extra[:5])}; fix the shapes file")
        dtypes = call.get("dtypes", {})
        if not isinstance(dtypes, dict):
            raise ConfigError(f"{at}.dtypes: expected {{tensor: dtype}}, got {str(dtypes)[:60]!r}")
        checked: dict[str, Any] = {"dtypes": {}}
        total = 0
        for name, dt in dtypes.items():
            if name not in args or args[name].kind != "tensor":
                raise ConfigError(f"{at}.dtypes: expected tensor inputs of the op as keys, got {name[:40]!r}")
            if not isinstance(dt, str) or dt not in DTYPES:
                raise ConfigError(f"{at}.dtypes.{name}: expected one of {', '.join(DTYPES)}, got {repr(dt)[:40]}")
        for a in op.args:
            if a.kind == "tensor":
                if a.name not in call:
                    raise ConfigError(f"{at}: expected a shape for tensor {a.name!r}, got keys {sorted(call)}")
                shape = _check_shape(a, call[a.name], f"{at}.{a.name}")
                dt = dtypes.get(a.name) or base.get(a.name) or _DEFAULT_DTYPE
                if dt not in DTYPES:  # a bundle's own dtype this list lacks
                    raise ConfigError(f"{at}.{a.name}: the op's dtype {dt!r} is not one flyship tune makes inputs "
                                      f"of ({', '.join(DTYPES)}); give one in dtypes")
                checked[a.name], checked["dtypes"][a.name] = shape, dt
                total += math.prod(shape) * DTYPES[dt]
                if total > _limits.MAX_TUNE_CALL_BYTES:
                    raise ConfigError(f"{at}: expected inputs of at most {_limits.MAX_TUNE_CALL_BYTES >> 30} GiB in "
                                      f"all, got {total / (1 << 30):.1f} GiB by {a.name} {list(shape)} ({dt}); tune "
                                      "smaller shapes (the table's nearest bucket covers larger ones)")
            elif a.name in call:
                checked[a.name] = _check_scalar(a, call[a.name], f"{at}.{a.name}")
        out.append(checked)
    return out


def key_of(op: _m.Op, call: Mapping[str, Any]) -> tuple[int, ...]:
    """The op's tuning key evaluated on a checked call's shapes (the same expressions the guards use)."""
    shapes = {a.name: call[a.name] for a in op.args if a.kind == "tensor"}
    scalars = {a.name: call.get(a.name, a.default if a.default is not None else 1) for a in op.args
               if a.kind == "int"}
    return tuple(int(_expr.evaluate_with_shapes(k, shapes, scalars)) for k in op.tuning_key)


def check_file(manifest: _m.Manifest, shapes: dict[str, list[dict[str, Any]]],
               path: Path | str) -> dict[str, list[dict[str, Any]]]:
    """Every op of the shapes file checked against ``manifest``: present, tuned, each call checked.

    Raises:
        ConfigError: an op the bundle lacks or that has no tuning key, or a bad call (:func:`check_calls`).
    """
    ops = {op.name: op for op in manifest.ops}
    out = {}
    for name, calls in shapes.items():
        if name not in ops:
            raise ConfigError(f"flyship tune --shapes {path}: op {name[:60]!r} is not in the bundle "
                              f"({', '.join(ops)})")
        if not ops[name].tuning_key:
            raise ConfigError(f"flyship tune --shapes {path}: op {name} has no tuning key; declare it with configs= "
                              "and key= (docs/tuning.md)")
        out[name] = check_calls(ops[name], calls, f"flyship tune --shapes {path}: {name}")
    return out


def dry_run(bundle: Path | str, shapes: Path | str, table: Path | str | None = None) -> list[str]:
    """Check what ``flyship tune`` would do, without a GPU: the bundle (manifest and every file's sha256), the
    shapes file against its ops, each call's key, and an existing table at ``table`` (readable, keyed as the
    bundle). Returns the lines of the plan.

    Raises:
        ConfigError / BundleError: the first problem found, naming it.
    """
    from flyship.bundle import pack as _pack
    from flyship.bundle import rules as _rules
    from flyship.bundle import tuning as _tt

    root = _pack.bundle_dir(bundle)
    manifest = _m.read(root)
    _rules.check_bundle(root, manifest)
    calls = check_file(manifest, read_shapes(shapes), shapes)
    ops = {op.name: op for op in manifest.ops}
    lines = [f"flyship tune --dry-run: bundle {root} ({manifest.namespace}): checked"]
    for name, checked in calls.items():
        op = ops[name]
        keys = []
        for ci, call in enumerate(checked):
            try:
                keys.append(list(key_of(op, call)))
            except FlyshipError as e:
                raise ConfigError(f"flyship tune --shapes {shapes}: {name}[{ci}]: the key {list(op.tuning_key)} "
                                  f"cannot be evaluated on it: {e}") from None
        specs = ", ".join(s.name for s in op.specializations)
        lines.append(f"  {name}: {len(checked)} call(s), key {list(op.tuning_key)} = {keys}; candidates {specs} "
                     f"and {_tt.ORIGINAL} (each guard is checked on the GPU)")
    if table is not None and Path(table).exists():
        t = _tt.read(table)
        for name, key in t.keys.items():
            if name in ops and tuple(_expr.canonical(k) for k in key) != ops[name].tuning_key:
                raise ConfigError(f"flyship tune: the table {table} keys op {name} by {list(key)}, the bundle by "
                                  f"{list(ops[name].tuning_key)}; pass --no-merge to replace it")
        lines.append(f"  table {table}: {len(t.entries)} entries, merged into (--no-merge replaces it)")
    lines.append("  no GPU used: run without --dry-run on the GPU the table is for")
    return lines
