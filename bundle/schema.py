"""The manifest's JSON Schema (draft 2020-12), derived from the dataclasses in :mod:`.model`.

``schema.json`` beside this file is the committed copy that other tools and languages can read; a
test checks it equals :func:`generate` so the two never drift. Regenerate with
``python -m flyship.bundle.schema > bundle/schema.json``.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import typing
from typing import Any

from flyship.bundle import limits as L
from flyship.bundle import model as M
from flyship.bundle.rules.names import IDENTIFIER

# Closed vocabularies, beyond what the types say.
_ENUMS: dict[tuple[str, str], list[str]] = {
    ("KernargField", "kind"): list(M.FIELD_KINDS),
    ("KernargField", "type"): sorted(M.FIELD_TYPES),
    ("CodeObject", "format"): list(M.CODE_OBJECT_FORMATS),
    ("Arg", "kind"): ["tensor", *M.SCALAR_TYPES],
    ("Variant", "tensor_abi"): list(M.TENSOR_ABIS),
}
# Open vocabularies: any name (rules.check_name), so a new frontend needs no change to the bundle contract.
_NAMES = {("Op", "frontend"), ("Composite", "name"), ("Composite", "function")}


def _type_schema(tp: Any, defs: dict[str, Any]) -> dict[str, Any]:
    origin = typing.get_origin(tp)
    if origin is typing.Union or (origin is not None and str(origin) == "types.UnionType"):
        members = [a for a in typing.get_args(tp)]
        return {"anyOf": [_type_schema(a, defs) for a in members]}
    if tp is type(None):
        return {"type": "null"}
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return {"type": "array", "items": _type_schema(args[0], defs)}
        return {"type": "array", "prefixItems": [_type_schema(a, defs) for a in args], "minItems": len(args),
                "maxItems": len(args)}
    if origin is dict:
        _, vt = typing.get_args(tp)
        return {"type": "object", "additionalProperties": _type_schema(vt, defs)}
    if dataclasses.is_dataclass(tp):
        _define(tp, defs)
        return {"$ref": f"#/$defs/{tp.__name__}"}
    return {int: {"type": "integer"}, float: {"type": "number"}, str: {"type": "string"},
            bool: {"type": "boolean"}}.get(tp, {})


def _define(cls: Any, defs: dict[str, Any]) -> None:
    if cls.__name__ in defs:
        return
    defs[cls.__name__] = {}  # placeholder against recursion
    hints = typing.get_type_hints(cls)
    props = {}
    for f in dataclasses.fields(cls):
        s = _type_schema(hints[f.name], defs)
        if (cls.__name__, f.name) in _ENUMS:
            enum = {"enum": _ENUMS[(cls.__name__, f.name)]}
            s = {**s, "additionalProperties": enum} if s.get("type") == "object" else enum  # a dict's values
        if (cls.__name__, f.name) in _NAMES:
            s = {**s, "pattern": f"^{IDENTIFIER}$", "maxLength": L.MAX_NAME}
        props[f.name] = s
    defs[cls.__name__] = {
        "type": "object",
        "description": (cls.__doc__ or "").strip().split("\n")[0],
        "properties": props,
        "required": sorted(k for k in props if (cls.__name__, k) not in M.OMITTED_WHEN_EMPTY),
        "additionalProperties": False,
    }


def generate() -> dict[str, Any]:
    """The JSON Schema of ``manifest.json`` for this schema version."""
    defs: dict[str, Any] = {}
    top = _type_schema(M.Manifest, defs)
    root = dict(defs.pop("Manifest"))
    root["properties"] = dict(root["properties"])
    root["properties"]["format"] = {"const": M.FORMAT_NAME}
    root["properties"]["schema_version"] = {"type": "string",
                                           "pattern": rf"^({'|'.join(map(str, M.NEWEST_MINOR))})\.[0-9]+$"}
    root["required"] = sorted(root["properties"])
    del top
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://flyship.invalid/bundle-manifest-{M.SCHEMA_VERSION}.json",
        "title": f"flyship bundle manifest, schema version {M.SCHEMA_VERSION}",
        **root,
        "$defs": dict(sorted(defs.items())),
    }


def load() -> dict[str, Any]:
    """The committed schema (``schema.json``)."""
    from importlib.resources import files

    return json.loads(files(__package__).joinpath("schema.json").read_text())


if __name__ == "__main__":
    json.dump(generate(), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
