"""The one bounded JSON reader (flyship.bundle.files): its depth scan, its strictness and its file checks."""

from __future__ import annotations

import json
import os
import random
import re
import time

import pytest

from flyship.bundle import files
from flyship.errors import BundleError, ConfigError

pytestmark = pytest.mark.cpu


def depth(o: object) -> int:
    if isinstance(o, dict):
        return 1 + max([depth(v) for v in o.values()], default=0)
    if isinstance(o, list):
        return 1 + max([depth(v) for v in o], default=0)
    return 0


KEY_TAILS = ["", "[", "{", '"', "\\"]


def document(rng: random.Random, level: int = 0) -> object:
    r = rng.random()
    if level > 12 or r < 0.3:  # strings full of what a naive bracket count would trip on
        return rng.choice([1, None, "a[", "]}", '"[', "\\", "\\\\[", "\\u005b", "é{", "\u2028", [], {}])
    if r < 0.65:
        return [document(rng, level + 1) for _ in range(rng.randint(0, 3))]
    return {"k" + str(i) + rng.choice(KEY_TAILS): document(rng, level + 1) for i in range(rng.randint(0, 3))}


def test_the_depth_scan_agrees_with_a_recursive_depth_on_random_documents():
    rng = random.Random(22)
    for _ in range(2000):
        o = document(rng)
        text = json.dumps(o, indent=rng.choice([None, 1]), ensure_ascii=rng.random() < 0.5)
        for limit in (0, 1, 2, 5, 12):
            assert files.json_depth_exceeds(text, limit) == (depth(o) > limit), (text, limit)


def test_deep_or_unbalanced_brackets_are_scanned_without_recursion():
    assert files.json_depth_exceeds("[" * 1_000_000, 32)
    assert files.json_depth_exceeds("[" * 40 + "]" * 40, 32)
    assert not files.json_depth_exceeds("[" * 32 + "]" * 32, 32)
    assert not files.json_depth_exceeds("]" * 100_000, 32)  # not JSON: the parser refuses it


@pytest.mark.parametrize("raw, says", [
    (b"[" * 100_000, "nested at most 32 deep"),
    (b'{"a": 1, "a": 2}', "the key 'a' appears twice"),
    (b"[NaN]", "NaN is not JSON"),
    (b"\xef\xbb\xbf{}", "BOM"),
    (b'{"k": "\xff"}', "is not UTF-8 text"),
    (b'["\\ud800"]', "[0]: the string holds an unpaired surrogate"),
    (b"1" * 5000, "is not valid JSON"),
])
def test_what_is_not_strict_json_is_the_callers_flyship_error(raw, says):
    with pytest.raises(ConfigError, match="thing.*" + re.escape(says)):
        files.parse_json(raw, what="thing", error=ConfigError)


def test_strict_json_reads_as_the_standard_library_reads_it():
    raw = b'{"a": [1, 2.5, "\\ud83d\\ude00", {"b": null}], "c": true, "d": 1e999, "e": "\\u005b"}'
    assert files.parse_json(raw, what="x") == json.loads(raw)


def test_a_fifo_a_device_and_a_folder_are_refused_without_reading(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    t = time.monotonic()
    for path, found in ((tmp_path / "pipe", "a named pipe"), ("/dev/zero", "a character device"),
                        (tmp_path, "a directory"), (tmp_path / "none", "nothing")):
        with pytest.raises(BundleError, match=f"thing: expected a regular file at {re.escape(str(path))}, found {found}"):
            files.read_json(path, 1 << 20, what="thing")
    assert time.monotonic() - t < 10  # a FIFO that blocked would never return


def test_a_file_over_the_limit_is_refused_from_its_size(tmp_path):
    (tmp_path / "big.json").write_bytes(b" " * 2000 + b"{}")
    with pytest.raises(BundleError, match="expected at most 1000 bytes at .*big.json, got 2002"):
        files.read_json(tmp_path / "big.json", 1000, what="thing")
    assert files.read_json(tmp_path / "big.json", 2002, what="thing") == {}
