"""The manifest as JSON: the one reader (JSON data -> :mod:`flyship.bundle.model` dataclasses) and writer.

Reading checks keys, types and the sizes of :mod:`flyship.bundle.limits`. The schema version (an unknown major
is refused, naming both versions) is :mod:`flyship.bundle.manifest`'s, and the rules are
:mod:`flyship.bundle.rules`', which :func:`flyship.bundle.manifest.parse` runs after reading. The manifest is
sorted-key JSON, so a rebuild from the same inputs gives the same bytes.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import types
import typing
from pathlib import Path
from typing import Any, Callable

from flyship.bundle import files as _files
from flyship.bundle import limits as _limits
from flyship.bundle.errors import BundleError
from flyship.bundle.model import FORMAT_NAME, OMITTED_WHEN_EMPTY, Manifest


def to_json_obj(obj: Any) -> Any:
    """A manifest dataclass as plain JSON data (tuples as lists, every field present but an empty one of
    ``OMITTED_WHEN_EMPTY``)."""
    if dataclasses.is_dataclass(obj):
        name = type(obj).__name__
        return {f.name: to_json_obj(v) for f in dataclasses.fields(obj)
                if (v := getattr(obj, f.name)) or (name, f.name) not in OMITTED_WHEN_EMPTY}
    if isinstance(obj, (list, tuple)):
        return [to_json_obj(x) for x in obj]
    if isinstance(obj, dict):
        return {str(k): to_json_obj(v) for k, v in obj.items()}
    return obj


# The reader is compiled once per dataclass and type (no type reflection per object). A value's JSON path
# travels as a chain of (parent, suffix) pairs and becomes text only in an error message.
Where = Any  # str, or (Where, str): the parent's path and this value's suffix


def _w(where: Where) -> str:
    parts = []
    while isinstance(where, tuple):
        where, suffix = where
        parts.append(suffix)
    return where + "".join(reversed(parts))


def _scalar(data: Any, where: Where) -> int | float | bool:
    """A JSON scalar that stands for a kernel or argument value: a bool, an int within int64, or a finite float."""
    if isinstance(data, bool):
        return data
    if isinstance(data, int):
        if not _limits.INT64_MIN <= data <= _limits.INT64_MAX:
            raise BundleError(f"manifest {_w(where)}: expected an integer within int64, got one of "
                              f"{data.bit_length()} bits")
        return data
    if isinstance(data, float):
        if not math.isfinite(data):
            raise BundleError(f"manifest {_w(where)}: expected a finite number, got {data!r}")
        return data
    raise BundleError(f"manifest {_w(where)}: expected a number or a bool, got {type(data).__name__}")


def _too_many(data: Any, where: Where) -> None:
    if len(data) > _limits.MAX_ITEMS:
        raise BundleError(f"manifest {_w(where)}: expected at most {_limits.MAX_ITEMS} items, got {len(data)}")


def _read_str(data: Any, where: Where, lenient: bool) -> str:
    if type(data) is not str:
        raise BundleError(f"manifest {_w(where)}: expected a string, got {type(data).__name__}")
    if len(data) > _limits.MAX_STRING:
        raise BundleError(f"manifest {_w(where)}: expected at most {_limits.MAX_STRING} characters, got {len(data)}")
    if not data.isascii():
        try:
            data.encode("utf-8")
        except UnicodeEncodeError:
            raise BundleError(f"manifest {_w(where)}: the string holds an unpaired surrogate escape; expected "
                              "valid Unicode text") from None
    return data


def _read_bool(data: Any, where: Where, lenient: bool) -> bool:
    if not isinstance(data, bool):
        raise BundleError(f"manifest {_w(where)}: expected a bool, got {type(data).__name__}")
    return data


def _read_int(data: Any, where: Where, lenient: bool) -> int:
    if not isinstance(data, int) or isinstance(data, bool):
        raise BundleError(f"manifest {_w(where)}: expected an integer, got {type(data).__name__}")
    if not _limits.INT64_MIN <= data <= _limits.INT64_MAX:
        return _scalar(data, where)  # raises
    return data


def _read_float(data: Any, where: Where, lenient: bool) -> float:
    if not isinstance(data, (int, float)) or isinstance(data, bool):
        raise BundleError(f"manifest {_w(where)}: expected a number, got {type(data).__name__}")
    return float(_scalar(data, where))


Reader = Callable[[Any, Where, bool], Any]


def _check_list(data: Any, where: Where) -> None:
    """A JSON list of at most MAX_ITEMS items (an object there is counted first, so a huge one is named as such)."""
    if type(data) is not list:
        if isinstance(data, dict):
            _too_many(data, where)
        raise BundleError(f"manifest {_w(where)}: expected a list, got {type(data).__name__}")
    _too_many(data, where)


@functools.lru_cache(maxsize=None)
def _reader(cls: Any) -> Reader:
    """The function that builds ``cls`` from JSON data, checking keys, types and the sizes of
    :mod:`flyship.bundle.limits` (list and object lengths, string lengths, int64 range, finite floats);
    built once per type."""
    origin = typing.get_origin(cls)
    if origin is typing.Union or origin is types.UnionType:
        args = typing.get_args(cls)
        members = [a for a in args if a is not type(None)]
        nullable = type(None) in args
        inner = _reader(members[0]) if len(members) == 1 else _scalar_reader

        def read_union(data: Any, where: Where, lenient: bool) -> Any:
            if data is None:
                if nullable:
                    return None
                raise BundleError(f"manifest {_w(where)}: expected a value, got null")
            return inner(data, where, lenient)

        return read_union
    if origin is tuple:
        args = typing.get_args(cls)
        if len(args) == 2 and args[1] is Ellipsis:
            item = _reader(args[0])

            def read_seq(data: Any, where: Where, lenient: bool) -> tuple:
                _check_list(data, where)
                return tuple([item(x, (where, f"[{i}]"), lenient) for i, x in enumerate(data)])

            return read_seq
        items = [_reader(a) for a in args]

        def read_fixed(data: Any, where: Where, lenient: bool) -> tuple:
            _check_list(data, where)
            if len(items) != len(data):
                raise BundleError(f"manifest {_w(where)}: expected {len(items)} items, got {len(data)}")
            return tuple([r(x, (where, f"[{i}]"), lenient) for i, (r, x) in enumerate(zip(items, data))])

        return read_fixed
    if origin is dict:
        _, vt = typing.get_args(cls)
        value = _reader(vt)

        def read_dict(data: Any, where: Where, lenient: bool) -> dict:
            if type(data) is not dict:
                if isinstance(data, list):
                    _too_many(data, where)
                raise BundleError(f"manifest {_w(where)}: expected an object, got {type(data).__name__}")
            _too_many(data, where)
            out = {}
            for k, v in data.items():
                _read_str(k, (where, " key"), lenient)
                out[k] = value(v, (where, f".{k[:40]}"), lenient)
            return out

        return read_dict
    if dataclasses.is_dataclass(cls):
        return _dataclass_reader(cls)
    simple = {str: _read_str, bool: _read_bool, int: _read_int, float: _read_float}
    if cls in simple:
        return simple[cls]
    raise TypeError(f"manifest reader: no rule for type {cls!r}")  # a bug in the dataclasses


def _scalar_reader(data: Any, where: Where, lenient: bool) -> int | float | bool:
    return _scalar(data, where)


def _dataclass_reader(cls: Any) -> Reader:
    fields = dataclasses.fields(cls)
    names = frozenset(f.name for f in fields)
    required = [f.name for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    # The field plan: (name, ".name", required, reader) per field, resolved on first use (a class may refer to
    # itself through its fields). It is built whole into a local and published by one assignment: an exception
    # mid-build (a RecursionError deep in a reference) publishes nothing and the next read builds it again, and
    # another thread sees either no plan or the whole plan, never half of one.
    published: list[tuple[tuple[str, str, bool, Reader], ...] | None] = [None]

    def field_plan() -> tuple[tuple[str, str, bool, Reader], ...]:
        plan = published[0]
        if plan is None:
            hints = typing.get_type_hints(cls)
            plan = tuple([(f.name, f".{f.name}", f.name in required, _reader(hints[f.name])) for f in fields])
            published[0] = plan
        return plan

    def read_object(data: Any, where: Where, lenient: bool) -> Any:
        plan = field_plan()
        if type(data) is not dict:
            if isinstance(data, list):
                _too_many(data, where)
            raise BundleError(f"manifest {_w(where)}: expected an object for {cls.__name__}, got {type(data).__name__}")
        _too_many(data, where)
        if not lenient and not names.issuperset(data):
            unknown = set(data) - names
            raise BundleError(
                f"manifest {_w(where)}: unknown keys {sorted(k[:40] for k in unknown)} for {cls.__name__}; "
                f"expected only {sorted(names)}"
            )
        kwargs = {}
        for name, suffix, needed, read in plan:
            if name not in data:
                if needed:
                    raise BundleError(f"manifest {_w(where)}: missing key {name!r} for {cls.__name__}")
                continue
            kwargs[name] = read(data[name], (where, suffix), lenient)
        return cls(**kwargs)

    return read_object


def from_data(cls: Any, data: Any, where: str, lenient: bool) -> Any:
    """Build dataclass (or type) ``cls`` from JSON ``data``; see :func:`_reader`."""
    return _reader(cls)(data, where, lenient)


def to_json_data(manifest: Manifest) -> dict:
    """The manifest as the JSON object written to disk (with the ``format`` key)."""
    out = to_json_obj(manifest)
    out["format"] = FORMAT_NAME
    return out


def write(manifest: Manifest, path: Path) -> None:
    """Write ``manifest.json`` (sorted keys, trailing newline)."""
    Path(path).write_text(json.dumps(to_json_data(manifest), sort_keys=True, indent=1, allow_nan=False) + "\n")


def decode(data: bytes, where: str) -> Any:
    """Manifest bytes as JSON data (:func:`flyship.bundle.files.parse_json`): at most the size limit, UTF-8, strict
    JSON (no NaN or Infinity, no key twice), nested at most ``MAX_JSON_DEPTH`` deep.

    Raises:
        BundleError: naming ``where``; says the bundle is damaged.
    """
    if len(data) > _limits.MAX_MANIFEST_BYTES:
        raise BundleError(f"read bundle: expected a manifest of at most {_limits.MAX_MANIFEST_BYTES} bytes, {where} "
                          f"has {len(data)}; is this a flyship bundle?")
    return _files.parse_json(data, what=f"read bundle: {where}", hint="the bundle is damaged, rebuild it")
