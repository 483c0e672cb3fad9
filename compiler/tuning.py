"""Config spaces: one op, many configs, built for every target, pruned per target, keyed for dispatch.

A spec declares a config space on an op (docs/tuning.md)::

    op("gemm", kernel=gemm_kernel, args=[...], grid=(...),
       specs=[Spec("f16", dtypes=..., shapes=...)],               # the base specializations
       configs=[Config(BLOCK_M=16, BLOCK_N=64, num_warps=4), ...],  # or a flydsl.autotune / triton.autotune kernel
       key=("a.shape[0]", "b.shape[1]", "a.shape[1]"),            # expressions naming every tiled dim
       prune=my_prune)                                            # optional: (configs, named_args) -> configs

Each base spec x each config becomes one specialization (:func:`expand`), named
``<base>__<config name>``. ``flyc-build`` prunes per target before compiling (:func:`prune_tasks`: the
block must fit the target, and the user's prune function sees the target's limits), checks the key
against the grid and the guards (:func:`key_warnings`), and writes the key into the manifest
(``Op.tuning_key``). ``flyship tune`` races the specializations on a GPU and writes a tuning table
(:mod:`flyship.bundle.tuning`). Importers for tuned configs people already have: :func:`import_aiter_csv`
and :func:`import_flydsl_cache`.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import re
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence

from flyship.bundle import expr as _expr
from flyship.bundle import files as _files
from flyship.bundle import limits as _limits
from flyship.bundle import targets as _targets
from flyship.bundle import tuning as _tt
from flyship.compiler import frontends as _frontends
from flyship.compiler.configs import Autotuned, Config, ConfigSpace, kernel_name
from flyship.compiler.spec.params import Constexpr, Scalar, Tensor, Value
from flyship.errors import SpecError

_MAX_AUTOTUNE_CACHE = _limits.MAX_TUNING_BYTES  # an imported autotune cache is a tuning table in another format

__all__ = ["Autotuned", "Config", "ConfigSpace", "drop_over_limits", "expand", "from_autotuner", "from_native_config",
           "import_aiter_csv", "import_flydsl_cache", "key_from_names", "key_warnings", "kernel_name", "named_args",
           "prune_tasks", "target_facts"]


def from_autotuner(kernel: Any) -> Optional[Autotuned]:
    """Read an autotuned kernel through the frontend whose DSL made it (:meth:`Frontend.read_autotuner`).

    Returns:
        (the bare kernel, [(Config, the DSL's config object)] or None when the autotuner's configs are a function
        of the call's arguments (op()'s ``configs=`` must then give them), key argument names, prune function),
        or None when ``kernel`` is not autotuned.
    """
    return next((a for fe in _frontends.registered() if (a := fe.read_autotuner(kernel)) is not None), None)


def from_native_config(c: Any) -> Optional[Config]:
    """A DSL's own config object as a :class:`Config`, read by the frontend whose DSL made it
    (:meth:`Frontend.read_config`), or None when ``c`` is no frontend's config.

    Raises:
        SpecError: a config flyship cannot launch (a ``pre_hook``, an option only one value of which it launches).
    """
    return next((cfg for fe in _frontends.registered() if (cfg := fe.read_config(c)) is not None), None)


def key_from_names(names: Sequence[str], args: Sequence[Any]) -> tuple[str, ...]:
    """A DSL autotuner's key (argument names) as flyship key expressions: a tensor gives every dim of its
    shape (as FlyDSL's key does), a Value its expression, an int scalar its name; a Constexpr gives nothing (each
    spec fixes its value, so the spec already tells its calls apart)."""
    by_name = {a.name: a for a in args}
    out: list[str] = []
    for n in names:
        a = by_name.get(n)
        if isinstance(a, Tensor):
            out += [f"{n}.shape[{d}]" for d in range(a.rank)]
        elif isinstance(a, Value):
            out.append(_expr.canonical(a.expr))
        elif isinstance(a, Scalar) and a.type == "int":
            out.append(n)
        elif isinstance(a, Constexpr):
            continue
        else:
            raise SpecError(f"autotune key {n!r}: expected an input tensor, a Value, an int Scalar or a Constexpr "
                            f"of the op, got {type(a).__name__ if a else 'no such argument'}; pass key=(...) "
                            "expressions")
    return tuple(out)


def expand(op_name: str, frontend: str, args: Sequence[Any], specs: Sequence[Any],
           configs: Sequence[tuple[Config, Any]]) -> tuple[list[Any], dict[str, tuple[str, Config, Any]]]:
    """Every base spec x every config, as specializations (constexprs and options merged in).

    Raises:
        SpecError: a config keyword the frontend does not understand (neither a ``Constexpr`` of the op nor
            one of the frontend's options), or two configs with the same name.
    """
    constexprs = {a.name for a in args if isinstance(a, Constexpr)}
    options = _frontends.get(frontend).config_options  # the frontend that reads the options owns their list
    out, space = [], {}
    for i, (cfg, _native) in enumerate(configs):
        unknown = [k for k in cfg.values if k not in constexprs and k not in options]
        if unknown:
            raise SpecError(f"op {op_name}: config {i} ({cfg.label()}) sets {unknown}, which the {frontend} frontend "
                            f"does not understand; expected constexprs of the op ({sorted(constexprs)}) or options "
                            f"({list(options)}); declare Constexpr(...) for kernel parameters")
    for base in specs:
        for cfg, native in configs:
            name = f"{base.name}__{cfg.label()}"
            if name in space:
                raise SpecError(f"op {op_name}: two configs are both named {name!r}; give Config(name=...)")
            cx = {k: v for k, v in cfg.values.items() if k in constexprs}
            opts = {k: v for k, v in cfg.values.items() if k not in constexprs}
            out.append(dataclasses.replace(base, name=name, constexprs={**base.constexprs, **cx},
                                           options={**base.options, **opts}))
            space[name] = (base.name, cfg, native)
    return out, space


def target_facts(target: _targets.TargetID) -> dict[str, Any]:
    """What a prune function is told about the target: ``target`` (the ID), ``lds_bytes``,
    ``wavefront_size``, ``max_workgroup_size``."""
    return {"target": target.text, **_targets.limits(target)}


def named_args(op: Any, spec: Any, target: _targets.TargetID) -> dict[str, Any]:
    """The example call as a prune function sees it: tensors as ``meta`` tensors of the example shapes and
    dtypes (shape and dtype only; torch is imported when present), scalars, constexprs, and the target's
    facts (:func:`target_facts`)."""
    out: dict[str, Any] = dict(target_facts(target))
    shapes = op.example_shapes(spec)
    dtypes = {**{o.name: op.output_dtype_for(o, spec) for o in op.outputs}, **spec.dtypes}
    try:
        import torch

        for name, shp in shapes.items():
            out[name] = torch.empty(shp, dtype=getattr(torch, dtypes.get(name, "float32")), device="meta")
    except ImportError:
        out.update(shapes)
    out.update(op.example_scalars(spec))
    out.update(spec.constexprs)
    return out


def prune_tasks(ops: Iterable[Any], tasks: list[tuple[str, str, str]]
                ) -> tuple[list[tuple[str, str, str]], list[str]]:
    """Drop the (op, spec, target) tasks a config space prunes on that target, before anything compiles.

    Two rules: a config whose block (as its frontend computes it before compiling,
    :meth:`Frontend.config_block`: Triton's ``num_warps`` x the target's wavefront size) exceeds the target's
    maximum workgroup size; and the op's ``prune`` function, called once per (base spec, target)
    as ``prune(configs, named_args)`` with the DSL's own config objects when the configs came from an
    autotuned kernel and :func:`named_args` (which holds the target's limits). A config it does not return
    is pruned.

    Returns:
        (the tasks to run, one report line per (op, target) that lost configs: how many and why).

    Raises:
        SpecError: the prune function raised, or returned something that is not a subset of its input, or
            every config of a base spec was pruned on a target.
    """
    by_op = {o.name: o for o in ops}
    drop: dict[tuple[str, str, str], str] = {}
    for o in by_op.values():
        space: Optional[ConfigSpace] = getattr(o, "tuning", None)
        if space is None:
            continue
        fe = _frontends.get(o.frontend)
        targets = sorted({t for (on, _s, t) in tasks if on == o.name})
        bases: dict[str, list[str]] = {}
        for sname, (base, _c, _n) in space.configs.items():
            bases.setdefault(base, []).append(sname)
        for t in targets:
            tid = _targets.parse_target(t)
            max_wg = _targets.limits(tid)["max_workgroup_size"]
            for base, snames in bases.items():
                alive = []
                for s in snames:
                    blk = fe.config_block(space.configs[s][1], tid)
                    if blk is not None and blk > max_wg:
                        drop[(o.name, s, t)] = f"block {blk} over {tid.processor}'s {max_wg}"
                    else:
                        alive.append(s)
                if space.prune is not None and alive:
                    natives = [space.configs[s][2] for s in alive]
                    spec = next(sp for sp in o.specs if sp.name == alive[0]).for_target(t)
                    try:
                        kept = space.prune(list(natives), named_args(o, spec, tid))
                    except Exception as e:
                        raise SpecError(f"op {o.name}: the prune function raised on {t}: {type(e).__name__}: {e}") \
                            from None
                    kept_ids = {id(k) for k in (kept or [])}
                    if not kept_ids <= {id(n) for n in natives}:
                        raise SpecError(f"op {o.name}: the prune function returned configs it was not given on {t}; "
                                        "it must return a subset of its first argument")
                    for s, n in zip(alive, natives):
                        if id(n) not in kept_ids:
                            drop[(o.name, s, t)] = "the op's prune function"
                    alive = [s for s, n in zip(alive, natives) if id(n) in kept_ids]
                if not alive:
                    raise SpecError(f"op {o.name} spec {base}: every config was pruned on {t} "
                                    f"({', '.join(sorted({drop[(o.name, s, t)] for s in snames}))}); widen the "
                                    "config space or drop the target")
    report: dict[tuple[str, str], dict[str, int]] = {}
    for (on, _s, t), why in drop.items():
        r = report.setdefault((on, t), {})
        r[why] = r.get(why, 0) + 1
    lines = []
    for (on, t), whys in sorted(report.items()):
        total = sum(1 for (o2, _s, t2) in tasks if o2 == on and t2 == t)
        n = sum(whys.values())
        lines.append(f"op {on} on {t}: pruned {n} of {total} configs ("
                     + "; ".join(f"{w}: {c}" for w, c in sorted(whys.items())) + ")")
    return [x for x in tasks if x not in drop], lines


def drop_over_limits(ops: Iterable[Any], results: list[Any]) -> tuple[list[Any], list[str]]:
    """After compiling: a config-space variant refused for a target resource (LDS, registers, spills: the
    common tail's ``ResourceError``) is pruned, not a failure, unless no config of its base spec is left on
    that target. Other failures stay failures.

    Returns:
        (the results without the pruned ones, one report line per pruned variant).
    """
    spaces = {o.name: o.tuning for o in ops if getattr(o, "tuning", None) is not None}
    dropped = [r for r in results if r.error and getattr(r, "resource", False) and r.spec in
               spaces.get(r.op, ConfigSpace((), {})).configs]
    ok = {(r.op, spaces[r.op].configs[r.spec][0], r.target) for r in results
          if r.variant is not None and r.op in spaces and r.spec in spaces[r.op].configs}
    keep_failed = [r for r in dropped if (r.op, spaces[r.op].configs[r.spec][0], r.target) not in ok]
    gone = [r for r in dropped if r not in keep_failed]
    lines = [f"op {r.op} on {r.target}: pruned config {r.spec} after compiling: {r.error.split(': ', 1)[-1]}"
             for r in sorted(gone, key=lambda r: (r.op, r.target, r.spec))]
    return [r for r in results if r not in gone], lines


def _dims(text: str, op: Any, depth: int = 0) -> set[str]:
    """The input dimensions (``x.shape[0]``) an expression depends on; an output's dims through its shape rule,
    ``x.numel`` as every dim of ``x``."""
    out: set[str] = set()
    tensors = {a.name: a for a in op.args if isinstance(a, Tensor)}
    outputs = {o.name: o for o in op.outputs}
    try:
        reads = _expr.reads(text)
    except _expr.ExprError:
        return out
    for name, what, d in reads:
        if what not in ("shape", "numel"):
            continue
        if name in tensors:
            rank = tensors[name].rank
            ds = [d % rank] if d is not None else range(rank)
            out |= {f"{name}.shape[{i}]" for i in ds}
        elif name in outputs and depth < 4:
            rule = op.output_shape(outputs[name])
            ds = [d % len(rule)] if d is not None else range(len(rule))
            for i in ds:
                out |= _dims(rule[i], op, depth + 1)
    return out


def _comparison(c: str) -> Optional[tuple[str, str, str]]:
    """:func:`flyship.bundle.expr.comparison` of a constraint, None for one outside the grammar."""
    try:
        return _expr.comparison(c)
    except _expr.ExprError:
        return None


def _is_range_guard(c: str) -> bool:
    cmp = _comparison(c)
    return cmp is not None and cmp[0] == "le" and cmp[2] in ("2147483647", "4294967295", "9223372036854775807")


def _pinned(constraints: Sequence[str], op: Any) -> set[str]:
    """Dimensions a spec's guard pins to a constant (``x.shape[1] == 8192``, a constexpr written in, or equal to
    a dimension pinned so): one value only, so a key need not name them."""
    pinned: set[str] = set()
    for _ in range(3):
        for c in constraints:
            cmp = _comparison(c)
            if cmp is None or cmp[0] != "eq":
                continue
            for a, b in ((cmp[1], cmp[2]), (cmp[2], cmp[1])):
                dim = _expr.dimension(a)
                if dim is None or dim[1] != "shape":
                    continue  # only a single dimension is pinned by an equality (not a product of several)
                if _expr.is_constant(b) or (_dims(b, op) and _dims(b, op) <= pinned):
                    pinned |= _dims(a, op)
    return pinned


def key_warnings(op: Any, grids: dict[str, Sequence[str]]) -> list[str]:
    """Dimensions a variant's grid or the spec's own guard constraints depend on that the op's key leaves
    out (range guards such as ``x.shape[0] <= 2147483647`` do not count). One line per (spec, dimension)
    group; empty when the key covers them or the op has no key.

    Args:
        op: the :class:`~flyship.compiler.spec.OpDecl`.
        grids: spec name -> grid expressions (as built).
    """
    space: Optional[ConfigSpace] = getattr(op, "tuning", None)
    if space is None:
        return []
    covered: set[str] = set()
    for k in space.key:
        covered |= _dims(k, op)
    # A dimension the guards pin equal to a covered one is covered too (``b.shape[1] == a.shape[1]``).
    for _ in range(3):
        for s in op.specs:
            for c in s.constraints:
                cmp = _comparison(c)
                if cmp is not None and cmp[0] == "eq":
                    lhs, rhs = _dims(cmp[1], op), _dims(cmp[2], op)
                    if lhs and lhs <= covered:
                        covered |= rhs
                    if rhs and rhs <= covered:
                        covered |= lhs
    missing: dict[str, set[str]] = {}
    for s in op.specs:
        pinned = _pinned(op.constraints(s), op)
        exprs = list(grids.get(s.name, ())) + [c for c in s.constraints if not _is_range_guard(c)]
        for e in exprs:
            for d in _dims(e, op) - covered - pinned:
                missing.setdefault(d, set()).add(s.name)
    # One line per dimension: names the guards make equal (``w.shape[0] == x.shape[1]``) are one dimension.
    same = _equal_dims(op)
    groups: dict[str, tuple[set[str], set[str]]] = {}
    for d, ss in missing.items():
        names, specs = groups.setdefault(same(d), (set(), set()))
        names.add(d)
        specs |= ss
    lines = []
    for names, ss in sorted(groups.values(), key=lambda g: sorted(g[0])):
        d, *aliases = sorted(names)
        also = f" (= {', '.join(aliases)})" if aliases else ""
        lines.append(f"op {op.name}: key {list(space.key)} leaves out {d}{also}, which the grid or guard of "
                     f"{len(ss)} specialization(s) depends on (e.g. {sorted(ss)[0]}); a tuning table would reuse one "
                     f"config across every value of {d}: add it to key=")
    return lines


def _equal_dims(op: Any) -> Any:
    """A function naming each dimension's class: dimensions the specs' guards make equal (``a == b``, each side one
    dimension) share one."""
    parent: dict[str, str] = {}

    def find(d: str) -> str:
        while parent.get(d, d) != d:
            d = parent[d]
        return d

    for s in op.specs:
        for c in s.constraints:
            cmp = _comparison(c)
            if cmp is None or cmp[0] != "eq":
                continue
            lhs, rhs = _dims(cmp[1], op), _dims(cmp[2], op)
            if len(lhs) == 1 and len(rhs) == 1:
                a, b = find(next(iter(lhs))), find(next(iter(rhs)))
                if a != b:
                    parent[max(a, b)] = min(a, b)
    return find


# --------------------------------------------------------------------------------------------------
# Importers


def import_aiter_csv(path: Path | str, *, op: str, key: Sequence[str], key_columns: Sequence[str],
                     config_columns: Sequence[str], target: str, cus: Optional[int] = None,
                     namespace: str = "", spec_prefix: str = "",
                     label: Callable[[dict[str, str]], str] = None) -> tuple[_tt.Table, list[Config]]:
    """An aiter-style tuned-config CSV (one row per shape: shape columns such as ``M,N,K``, the winner's
    config columns, often ``us`` and ``cu_num``) as a tuning table and the configs it names.

    Columns read: ``key_columns`` (integers, in the order of ``key``), ``config_columns`` (the winner's
    config; integers where they parse), ``cu_num`` when present (the CU count, overriding ``cus``) and
    ``us`` when present (the winner's time). Other columns are ignored.

    Returns:
        (the table: one entry per row, spec ``<spec_prefix><config label>``; the distinct configs, to give
        ``op(configs=...)`` so that the bundle has those specializations).

    Raises:
        SpecError: a missing column or a value that is not an integer where one is needed.
    """
    p = Path(path)
    raw = _files.read_regular(p, _MAX_AUTOTUNE_CACHE, what="aiter CSV", error=SpecError)
    try:
        rows = list(csv.DictReader(io.StringIO(raw.decode("utf-8"), newline="")))
    except (UnicodeDecodeError, csv.Error) as e:
        raise SpecError(f"aiter CSV {p}: expected UTF-8 CSV, got {type(e).__name__}: {e}") from None
    if not rows:
        raise SpecError(f"aiter CSV {p}: expected a header and at least one row, got none")
    need = list(key_columns) + list(config_columns)
    missing = [c for c in need if c not in rows[0]]
    if missing:
        raise SpecError(f"aiter CSV {p}: expected columns {missing}, got {list(rows[0])}")
    if len(key) != len(key_columns):
        raise SpecError(f"aiter CSV {p}: key has {len(key)} expressions but {len(key_columns)} key columns")

    def num(v: str, col: str, i: int) -> Any:
        try:
            return int(v)
        except ValueError:
            if col in key_columns or col == "cu_num":
                raise SpecError(f"aiter CSV {p} row {i + 2}: column {col}: expected an integer, got {v!r}") from None
            try:
                return float(v)
            except ValueError:
                return v

    configs: dict[str, Config] = {}
    entries = []
    for i, r in enumerate(rows):
        cfg = Config(**{c: num(r[c], c, i) for c in config_columns})
        lab = label(r) if label else cfg.label()
        configs.setdefault(lab, cfg)
        row_cus = num(r["cu_num"], "cu_num", i) if r.get("cu_num") not in (None, "") else cus
        us = {f"{spec_prefix}{lab}": float(r["us"])} if r.get("us") not in (None, "") else {}
        entries.append(_tt.Entry(op=op, target=target, cus=row_cus,
                                 key=tuple(num(r[c], c, i) for c in key_columns), spec=f"{spec_prefix}{lab}", us=us))
    table = _tt.from_json_obj(_tt.to_json_obj(_tt.Table(namespace, {op: tuple(key)}, tuple(entries))), str(p))
    return table, [Config(name=n, **c.values) for n, c in configs.items()]


def import_flydsl_cache(path: Path | str, *, op: str, key: Sequence[str], target: str, cus: Optional[int] = None,
                        namespace: str = "", spec_prefix: str = "") -> tuple[_tt.Table, list[Config]]:
    """FlyDSL 0.5.0's autotune disk cache (``$FLYDSL_AUTOTUNE_CACHE_DIR/<kernel>.json``, default
    ``~/.flydsl/autotune``: ``{json(list(cache key)): Config.to_dict()}``) as a tuning table.

    FlyDSL's cache key starts with one value per ``key=`` argument (a tensor's whole shape as a list, an int
    as itself), then dtype, stride and toolchain fingerprints, which are not read. The leading values are
    flattened (shapes into their dims) and must give ``len(key)`` integers.

    Raises:
        SpecError: unreadable file, or a key that does not flatten to ``len(key)`` integers.
    """
    p = Path(path)
    data = _files.read_json(p, _MAX_AUTOTUNE_CACHE, what="FlyDSL autotune cache", error=SpecError)
    if not isinstance(data, dict):
        raise SpecError(f"FlyDSL autotune cache {p}: expected an object, got {type(data).__name__}")
    configs: dict[str, Config] = {}
    entries = []
    for ks, cfg_d in data.items():
        kv = _files.parse_json(ks.encode(), what=f"FlyDSL autotune cache {p}: key {ks[:60]!r}", error=SpecError)
        if type(kv) is not list:
            raise SpecError(f"FlyDSL autotune cache {p}: expected each key to be a JSON list, got {ks[:60]!r}")
        flat: list[int] = []
        for v in kv:
            if len(flat) >= len(key):
                break
            if isinstance(v, list) and all(type(x) is int for x in v):
                flat += v
            elif isinstance(v, int) and not isinstance(v, bool):
                flat.append(v)
            else:
                break
        if len(flat) != len(key):
            raise SpecError(f"FlyDSL autotune cache {p}: key {kv[:3]!r}... gives {len(flat)} integers "
                            f"{flat}, expected {len(key)} for key {list(key)}")
        cfg = Config(**cfg_d)
        configs.setdefault(cfg.label(), cfg)
        entries.append(_tt.Entry(op, target, cus, tuple(flat), f"{spec_prefix}{cfg.label()}"))
    table = _tt.from_json_obj(_tt.to_json_obj(_tt.Table(namespace, {op: tuple(key)}, tuple(entries))), str(p))
    return table, list(configs.values())
