"""The build cache is trusted on read only as far as it was verified: a link, a file someone else owns or anyone
can write is a miss, and a bundle taken from the cache passes the same checks as a fresh build before it is
written out (a self-consistent forgery with swapped code objects or another references.py is refused)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from flyship.bundle import manifest as M
from flyship.compiler import pipeline as _build
from flyship.compiler import cache as _cache
from flyship.errors import CompileError

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "loader" / "data" / "tiny"

pytestmark = pytest.mark.cpu


def tiny_files() -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(TINY.iterdir()) if p.is_file()}


def cached(tmp_path: Path) -> tuple[_cache.BuildCache, str]:
    c = _cache.BuildCache(tmp_path / "cache")
    spec = tmp_path / "spec.py"
    spec.write_text("# spec\n")
    key = "ab" * 32
    c.put_build(key, {str(spec): _cache.sha256_file(spec)}, tiny_files(), [])
    return c, key


def test_an_entry_written_by_the_user_is_read_back(tmp_path):
    c, key = cached(tmp_path)
    assert c.get_build(key).files == tiny_files()


def test_an_entry_that_is_a_link_is_a_miss(tmp_path):
    c, key = cached(tmp_path)
    p = c._entry_path("builds", key)
    forged = tmp_path / "elsewhere.json"
    shutil.copy(p, forged)
    p.unlink()
    p.symlink_to(forged)
    assert c.get_build(key) is None


def test_a_blob_anyone_can_write_is_a_miss_and_is_rewritten_by_the_next_put(tmp_path):
    c, key = cached(tmp_path)
    sha = _cache.sha256_bytes(tiny_files()[M.MANIFEST_NAME])
    os.chmod(c._blob_path(sha), 0o666)
    assert c.get_blob(sha) is None
    c.put_blob(tiny_files()[M.MANIFEST_NAME])
    assert c.get_blob(sha) == tiny_files()[M.MANIFEST_NAME]


def test_an_entry_owned_by_another_user_is_a_miss(tmp_path):
    if os.getuid() != 0:
        pytest.skip("making a file owned by another user needs root")
    c, key = cached(tmp_path)
    os.chown(c._entry_path("builds", key), 65534, 65534)
    assert c.get_build(key) is None


def test_a_cached_bundle_with_two_code_objects_swapped_is_refused_before_it_is_written(tmp_path):
    files = tiny_files()
    m = json.loads(files[M.MANIFEST_NAME])
    objs = sorted({v["launches"][0]["code_object"]["file"] if "launches" in v else v["code_object"]["file"]
                   for op in m["ops"] for s in op["specializations"] for v in s["variants"]})
    assert len(objs) >= 2
    files[objs[0]], files[objs[1]] = files[objs[1]], files[objs[0]]
    out = tmp_path / "out"
    with pytest.raises(CompileError, match="would be refused at load: .*sha256 mismatch"):
        _build.write_bundle(files.pop(M.MANIFEST_NAME), files, out, force=False)
    assert not out.exists()


def test_a_cached_bundle_with_another_references_module_is_refused(tmp_path):
    files = tiny_files()
    files["references.py"] = b"import os\nos.system('echo pwned')\n"
    out = tmp_path / "out"
    with pytest.raises(CompileError, match="references"):
        _build.write_bundle(files.pop(M.MANIFEST_NAME), files, out, force=False)
    assert not out.exists()
