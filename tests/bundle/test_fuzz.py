"""Property tests over the bundle readers: whatever a damaged or hostile bundle holds, reading it gives a
manifest (or a passed check) or a BundleError, never another exception, a crash or a hang.

A fixed budget (derandomized, no example database) keeps ``make test`` fast and repeatable;
``scripts/fuzz_bundle.py`` runs 10,000+ random cases per reader. Every failure either finds becomes an
explicit case in ``test_hostile.py``.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

hypothesis = pytest.importorskip("hypothesis", reason="hypothesis drives the property tests over the bundle readers")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from flyship.bundle import manifest as M  # noqa: E402
from flyship.bundle import rules  # noqa: E402
from flyship.bundle.errors import BundleError  # noqa: E402

pytestmark = pytest.mark.cpu

TINY = Path(__file__).resolve().parents[1] / "loader" / "data" / "tiny"
COMPILER_DATA = Path(__file__).resolve().parents[1] / "compiler" / "data"
BUDGET = settings(max_examples=250, deadline=None, derandomize=True, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

BASE = json.loads((TINY / M.MANIFEST_NAME).read_text())


def _paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, prefix + (i,))
    return out


PATHS = [p for p in _paths(BASE) if p]
EDGE_INTS = st.sampled_from([0, 1, -1, 3, 64, 1024, 2048, 2**31, 2**32, 2**63 - 1, 2**63, -(2**63) - 1, 10**30])
EDGE_STRINGS = st.sampled_from(["", "x", "y", "out", "float32", "aten", "../x", "/abs", "x.shape[0]", "x.shape[9]",
                                "cdiv(x.shape[0], 0)", "99999999999999999999", "-1", "a" * 5000, "\ud800", "é"])
SCALARS = st.one_of(st.none(), st.booleans(), EDGE_INTS, st.integers(), st.floats(allow_nan=False), EDGE_STRINGS,
                    st.text(max_size=8))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                        st.dictionaries(st.sampled_from(["name", "kind", "x"]), inner,
                                                                        max_size=3)),
                      max_leaves=8)
EDIT = st.tuples(st.sampled_from(PATHS), st.sampled_from(["set", "set", "set", "delete", "duplicate"]), VALUES)


def apply(edits: list[tuple[tuple, str, Any]]) -> dict:
    data = copy.deepcopy(BASE)
    for path, op, value in edits:
        parent = data
        try:
            for p in path[:-1]:
                parent = parent[p]
            key = path[-1]
            if op == "set":
                parent[key] = value
            elif op == "delete":
                del parent[key]
            elif isinstance(parent, list):
                parent.insert(key, copy.deepcopy(parent[key]))
        except (KeyError, IndexError, TypeError):
            pass  # an earlier edit removed the path
    return data


@BUDGET
@given(st.lists(EDIT, min_size=1, max_size=3))
def test_any_edit_of_a_real_manifest_reads_as_a_manifest_or_a_bundle_error(edits):
    raw = json.dumps(apply(edits)).encode("utf-8", "surrogatepass")
    try:
        M.parse(raw, "fuzz/manifest.json")
    except BundleError as e:
        assert "fuzz/manifest.json" in str(e)


@BUDGET
@given(st.binary(max_size=64), st.integers(min_value=0, max_value=len(json.dumps(BASE))))
def test_bytes_spliced_into_a_real_manifest_read_as_a_manifest_or_a_bundle_error(junk, at):
    text = json.dumps(BASE).encode()
    try:
        M.parse(text[:at] + junk + text[at:], "fuzz/manifest.json")
    except BundleError:
        pass


def _pool(fmt: str) -> list[tuple[Any, bytes, str]]:
    m = M.read(TINY)
    out = [(v, (TINY / v.code_object.file).read_bytes(), where) for where, v in rules.iter_variants(m)
           if v.code_object.format == fmt]
    if fmt == "hsaco":  # FlyDSL code objects too, each checked against its own undamaged facts
        for path in sorted(COMPILER_DATA.glob("*.hsaco")):
            data = path.read_bytes()
            meta, target = rules.read_facts("hsaco", data, _symbol(data), path.name)
            tmpl = out[0][0]
            v = M.Variant(target=target, code_object=M.CodeObject(file=path.name, sha256="0" * 64, format="hsaco",
                                                                  target=target, symbol=_symbol(data)),
                          metadata=meta, kernargs=tmpl.kernargs, launch=M.Launch(("1", "1", "1"), (64, 1, 1)),
                          proof=tmpl.proof, toolchain={})
            out.append((v, data, path.name))
    return out


def _symbol(data: bytes) -> str:
    from flyship.bundle.codeobject import CodeObjectFile

    return str(CodeObjectFile(data).kernel()[".name"])


def damaged(fmt: str):
    pool = _pool(fmt)
    flips = st.lists(st.tuples(st.floats(min_value=0, max_value=1, exclude_max=True), st.integers(1, 255)),
                     min_size=0, max_size=8)
    return st.tuples(st.sampled_from(pool), st.floats(min_value=0, max_value=1), flips)


def _damage(data: bytes, keep: float, flips: list[tuple[float, int]]) -> bytes:
    b = bytearray(data)
    for where, xor in flips:
        b[int(where * len(b))] ^= xor
    return bytes(b[:int(keep * len(b))] if keep < 0.98 else b)


@pytest.mark.parametrize("fmt", ["hsaco", "cubin"])
def test_a_truncated_or_bit_flipped_code_object_is_checked_or_refused_with_a_bundle_error(fmt):
    @BUDGET
    @given(damaged(fmt))
    def prop(case):
        (v, data, where), keep, flips = case
        try:
            rules.check_code_object(v, _damage(data, keep, flips), where)
        except BundleError as e:
            assert where in str(e)

    prop()
