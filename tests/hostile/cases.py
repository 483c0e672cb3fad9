"""The explicit hostile inputs of the readers, one per process (tests/hostile/test_reader_cases.py).

    python -m tests.hostile.cases NAME TMPDIR

runs case NAME with its files under TMPDIR and prints one line: ``REFUSED <class> <flyship?> <message>`` when the
reader raised, ``READ <value>`` when it returned; any other ending (a traceback, a signal, the time limit) is the
parent's to see. Each case is a function taking the folder and returning what the reader returned.
"""

from __future__ import annotations

import io
import json
import os
import sys
import zipfile
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "loader" / "data" / "tiny"
DEEP = b"[" * 100_000
CASES: dict[str, Callable[[Path], Any]] = {}


def case(fn: Callable[[Path], Any]) -> Callable[[Path], Any]:
    CASES[fn.__name__] = fn
    return fn


def fifo(tmp: Path, name: str) -> Path:
    p = tmp / name
    os.mkfifo(p)
    return p


def written(tmp: Path, name: str, data: bytes | dict) -> Path:
    p = tmp / name
    p.write_bytes(data if isinstance(data, bytes) else json.dumps(data).encode())
    return p


def tuning_doc(**entry: Any) -> dict:
    e = {"op": "add", "target": "gfx942", "cus": None, "key": [1024], "spec": "s", "us": {}}
    e.update(entry)
    return {"format": "flyship-tuning", "version": "1.0", "namespace": "ns", "keys": {"add": ["x.numel"]},
            "entries": [e]}


def patches_doc(**patch: Any) -> dict:
    p = {"target": "mymodel:gelu", "op": "gelu"}
    p.update(patch)
    return {"bundle": str(TINY), "patches": [p]}


def manifest_with_target(target: Any) -> bytes:
    d = json.loads((TINY / "manifest.json").read_text())
    d["ops"][0]["specializations"][0]["variants"][0]["target"] = target
    return json.dumps(d).encode()


def pack_with_index(tmp: Path, index: bytes, sig: bytes | None = None) -> Path:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("flyship-pack.json", index)
        if sig is not None:
            z.writestr("flyship-pack.sig", sig)
        z.writestr("manifest.json", (TINY / "manifest.json").read_bytes())
    return written(tmp, "t.flyship", buf.getvalue())


# -- non-regular files: refused at once, never read or waited on ------------------------------------------------

@case
def tuning_table_fifo(tmp: Path) -> Any:
    from flyship.bundle import tuning

    return tuning.read(fifo(tmp, "tuning.json"))


@case
def tuning_table_dev_zero(tmp: Path) -> Any:
    from flyship.bundle import tuning

    return tuning.read("/dev/zero")


@case
def tuning_table_folder(tmp: Path) -> Any:
    from flyship.bundle import tuning

    return tuning.read(tmp)


@case
def patches_file_fifo(tmp: Path) -> Any:
    from flyship.loader.tools import hook

    return hook.read_patches(fifo(tmp, "patches.json"))


@case
def patches_file_dev_zero(tmp: Path) -> Any:
    from flyship.loader.tools import hook

    return hook.read_patches("/dev/zero")


@case
def manifest_fifo(tmp: Path) -> Any:
    from flyship.bundle import manifest

    (tmp / "b").mkdir()
    fifo(tmp / "b", "manifest.json")
    return manifest.read(tmp / "b")


@case
def pack_fifo(tmp: Path) -> Any:
    from flyship.bundle import pack

    return pack.open_pack(fifo(tmp, "t.flyship"), cache=tmp / "cache")


# -- nesting -----------------------------------------------------------------------------------------------------

@case
def tuning_table_deep(tmp: Path) -> Any:
    from flyship.bundle import tuning

    return tuning.read(written(tmp, "tuning.json", DEEP))


@case
def patches_file_deep(tmp: Path) -> Any:
    from flyship.loader.tools import hook

    return hook.read_patches(written(tmp, "patches.json", DEEP))


@case
def manifest_deep(tmp: Path) -> Any:
    from flyship.bundle import manifest

    return manifest.parse(b'{"format": "flyship-bundle", "ops": ' + DEEP + b"}", "deep/manifest.json")


@case
def pack_index_deep(tmp: Path) -> Any:
    from flyship.bundle import pack

    return pack.open_pack(pack_with_index(tmp, DEEP), cache=tmp / "cache")


@case
def pack_signature_deep(tmp: Path) -> Any:
    from flyship.bundle import pack

    index = json.dumps({"format": "flyship-pack", "version": 2, "members": {}}).encode()
    return pack.open_pack(pack_with_index(tmp, index, sig=DEEP), cache=tmp / "cache", trusted_keys=["0" * 64])


# -- wrong types, named by field -----------------------------------------------------------------------------------

@case
def tuning_op_is_a_list(tmp: Path) -> Any:
    from flyship.bundle import tuning

    return tuning.read(written(tmp, "tuning.json", tuning_doc(op=["add"])))


@case
def tuning_key_is_a_bool(tmp: Path) -> Any:
    from flyship.bundle import tuning

    return tuning.read(written(tmp, "tuning.json", tuning_doc(key=[True])))


@case
def patches_op_is_a_list(tmp: Path) -> Any:
    from flyship.loader.tools import hook

    return hook.read_patches(written(tmp, "patches.json", patches_doc(op=["gelu"])))


@case
def patches_args_is_a_list(tmp: Path) -> Any:
    from flyship.loader.tools import hook

    return hook.read_patches(written(tmp, "patches.json", patches_doc(args=["x"])))


@case
def pack_index_member_hash_is_a_list(tmp: Path) -> Any:
    from flyship.bundle import pack

    index = json.dumps({"format": "flyship-pack", "version": 1, "members": {"manifest.json": ["0" * 64]}})
    return pack.open_pack(pack_with_index(tmp, index.encode()), cache=tmp / "cache")


@case
def pack_index_version_true(tmp: Path) -> Any:
    from flyship.bundle import pack

    raw = (TINY / "manifest.json").read_bytes()
    import hashlib

    index = json.dumps({"format": "flyship-pack", "version": True,
                        "members": {"manifest.json": hashlib.sha256(raw).hexdigest()}})
    return pack.open_pack(pack_with_index(tmp, index.encode()), cache=tmp / "cache")


@case
def expression_negated_string_index(tmp: Path) -> Any:
    from flyship.bundle import expr

    return expr.parse("x.shape[-'a']")


@case
def expression_negated_bool_index(tmp: Path) -> Any:
    from flyship.bundle import expr

    return expr.parse("x.shape[-True]")


# -- targets: one strict parser ------------------------------------------------------------------------------------

@case
def manifest_target_with_a_space(tmp: Path) -> Any:
    from flyship.bundle import manifest

    return manifest.parse(manifest_with_target("gfx942 "), "t/manifest.json")


@case
def manifest_target_features_out_of_order(tmp: Path) -> Any:
    from flyship.bundle import manifest

    return manifest.parse(manifest_with_target("gfx942:xnack-:sramecc+"), "t/manifest.json")


@case
def tuning_target_with_a_space(tmp: Path) -> Any:
    from flyship.bundle import tuning

    return tuning.read(written(tmp, "tuning.json", tuning_doc(target="gfx942 ")))


@case
def tuning_target_feature_twice(tmp: Path) -> Any:
    from flyship.bundle import tuning

    return tuning.read(written(tmp, "tuning.json", tuning_doc(target="gfx942:xnack+:xnack+")))


@case
def tuning_target_unknown_feature(tmp: Path) -> Any:
    from flyship.bundle import tuning

    return tuning.read(written(tmp, "tuning.json", tuning_doc(target="gfx942:fast+")))


@case
def tuning_target_empty_feature(tmp: Path) -> Any:
    from flyship.bundle import tuning

    return tuning.read(written(tmp, "tuning.json", tuning_doc(target="gfx942:")))


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(ROOT))
    from flyship.errors import FlyshipError

    name, tmp = argv[0], Path(argv[1])
    try:
        value = CASES[name](tmp)
    except FlyshipError as e:
        print(f"REFUSED {type(e).__name__} flyship {e}")
        return 0
    print(f"READ {value!r}"[:500])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
