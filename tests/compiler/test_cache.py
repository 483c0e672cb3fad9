"""The build cache end to end: flyc-build reuses cached code objects and proofs, recompiles only what changed,
writes bundles byte-identical to a cold build, and never trusts a damaged entry."""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import resource
import subprocess
from pathlib import Path

import pytest

from flyship.bundle import manifest as M

from ..conftest import ROOT, flydsl_python, run_build
from . import tiny_space

pytestmark = pytest.mark.compile


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _rows(stdout: str) -> list[list[str]]:
    """The summary table's rows (after the header and its rule, up to the blank line), each as its cells: op,
    spec and arch first, the compile seconds or ``cached`` last (the occupancy cell has spaces in it)."""
    rows = []
    for ln in stdout.splitlines()[2:]:
        if not ln.strip():
            break
        rows.append(ln.split())
    return rows


def compiled_rows(stdout: str) -> set[tuple[str, str, str]]:
    """(op, spec, arch) of the summary rows that were compiled in this run (not marked ``cached``)."""
    return {(c[0], c[1], c[2]) for c in _rows(stdout) if c[-1] != "cached"}


def table_rows(stdout: str) -> int:
    return len(_rows(stdout))


def kernel_count(bundle: Path) -> int:
    m = M.read(bundle)
    return sum(len(s.variants) for o in m.ops for s in o.specializations)


@pytest.fixture
def space(tmp_path) -> Path:
    return tiny_space.write_space(tmp_path / "space", 6)


def test_a_no_op_rebuild_of_the_examples_compiles_nothing_in_under_a_second_and_is_byte_identical(tmp_path,
                                                                                                example_bundle,
                                                                                                example_cache):
    args = ["-j", "2", "--offload-bundle", "--keep-ir"]
    run_build(ROOT / "examples/flydsl/ops.py", tmp_path / "warm", ["gfx942", "gfx950"], *args, cache=example_cache)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = run_build(ROOT / "examples/flydsl/ops.py", tmp_path / "again", ["gfx942", "gfx950"], *args, cache=example_cache)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert "without compiling" in r.stderr
    assert compiled_rows(r.stdout) == set() and table_rows(r.stdout) == kernel_count(example_bundle)
    # CPU time, not wall time: the machine is shared; docs/perf.md has the wall time on a quiet machine.
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert cpu < 1.0, f"a no-op rebuild used {cpu:.2f} s of CPU"
    assert files_of(tmp_path / "again") == files_of(example_bundle)


def test_cached_task_entries_alone_rebuild_the_examples_byte_identical(tmp_path, example_bundle, example_cache):
    args = ["-j", "2", "--offload-bundle", "--keep-ir"]
    run_build(ROOT / "examples/flydsl/ops.py", tmp_path / "warm", ["gfx942", "gfx950"], *args, cache=example_cache)
    for entry in (example_cache / "v1" / "builds").glob("*/*.json"):  # forget whole bundles, keep the kernels
        entry.unlink()
    r = run_build(ROOT / "examples/flydsl/ops.py", tmp_path / "again", ["gfx942", "gfx950"], *args, cache=example_cache)
    n = kernel_count(example_bundle)
    assert f"{n} of {n} kernels from the cache" in r.stderr
    assert compiled_rows(r.stdout) == set()
    assert files_of(tmp_path / "again") == files_of(example_bundle)


def test_changing_one_spec_recompiles_only_its_variants_and_matches_a_cold_build(tmp_path, space):
    cache = tmp_path / "cache"
    r = run_build(space, tmp_path / "a", ["sm_90"], "-j", "2", cache=cache)
    assert len(compiled_rows(r.stdout)) == 6
    configs = json.loads((space.parent / "configs.json").read_text())
    configs[0]["BLOCK"] = 32  # scale's first spec
    (space.parent / "configs.json").write_text(json.dumps(configs))
    r = run_build(space, tmp_path / "b", ["sm_90"], "-j", "2", cache=cache)
    assert compiled_rows(r.stdout) == {("scale", configs[0]["name"], "sm_90a")}
    assert "5 of 6 kernels from the cache" in r.stderr
    run_build(space, tmp_path / "cold", ["sm_90"], "-j", "2")  # --no-cache
    assert files_of(tmp_path / "b") == files_of(tmp_path / "cold")


def test_editing_a_module_the_kernels_import_recompiles_them(tmp_path, space):
    cache = tmp_path / "cache"
    run_build(space, tmp_path / "a", ["gfx942"], cache=cache)
    helpers = space.parent / "helpers.py"
    helpers.write_text(helpers.read_text() + "VERSION = 2\n")
    r = run_build(space, tmp_path / "b", ["gfx942"], cache=cache)
    assert len(compiled_rows(r.stdout)) == 6


def test_a_new_target_compiles_only_the_new_targets_variants(tmp_path, space):
    cache = tmp_path / "cache"
    run_build(space, tmp_path / "a", ["gfx942"], cache=cache)
    r = run_build(space, tmp_path / "b", ["gfx942", "sm_90"], cache=cache)
    assert {arch for _, _, arch in compiled_rows(r.stdout)} == {"sm_90a"}
    assert len(compiled_rows(r.stdout)) == 6


def test_a_kernel_defined_in_the_spec_file_itself_is_found_in_the_cache_by_another_process(tmp_path):
    # The spec file is imported under a name that changes from run to run; the key must not.
    folder = tmp_path / "inline"
    folder.mkdir()
    (folder / "ops.py").write_text(INLINE_SPEC)
    cache = tmp_path / "cache"
    run_build(folder / "ops.py", tmp_path / "a", ["gfx942"], cache=cache)
    for entry in (cache / "v1" / "builds").glob("*/*.json"):
        entry.unlink()
    r = run_build(folder / "ops.py", tmp_path / "b", ["gfx942"], cache=cache)
    assert "2 of 2 kernels from the cache" in r.stderr  # the spec's JIT variant and its generic one


INLINE_SPEC = """
import triton
import triton.language as tl

from flyship.compiler.spec import Constexpr, Output, Spec, Tensor, Value, namespace, op

namespace("inline")


@triton.jit
def shift_kernel(x, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) + 1, mask=m)


op("shift", kernel=shift_kernel, args=[Tensor("x", rank=1), Output("out", like="x"), Value("n", "x.numel"),
                                       Constexpr("BLOCK")],
   grid=("cdiv(x.numel, BLOCK)",), specs=[Spec("s", dtypes={"x": "float32"}, shapes={"x": (4096,)},
                                                constexprs={"BLOCK": 256})])
"""


def test_a_corrupt_cache_entry_is_rebuilt_never_trusted(tmp_path, space):
    cache = tmp_path / "cache"
    run_build(space, tmp_path / "a", ["gfx942"], cache=cache)
    for entry in (cache / "v1" / "builds").glob("*/*.json"):
        entry.unlink()
    # Damage one stored code object: flip a byte in the middle of the largest blob that is an ELF file.
    elves = [p for p in (cache / "v1" / "objects").glob("*/*") if p.read_bytes()[:4] == b"\x7fELF"]
    victim = max(elves, key=lambda p: p.stat().st_size)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    r = run_build(space, tmp_path / "b", ["gfx942"], cache=cache)
    assert 1 <= len(compiled_rows(r.stdout)) < 6  # the variant(s) whose code object it was, and no other
    assert files_of(tmp_path / "b") == files_of(tmp_path / "a")


def test_a_damaged_entry_file_is_ignored(tmp_path, space):
    cache = tmp_path / "cache"
    run_build(space, tmp_path / "a", ["gfx942"], cache=cache)
    for entry in (cache / "v1").glob("*/*/*.json"):
        entry.write_text("{not json")
    r = run_build(space, tmp_path / "b", ["gfx942"], cache=cache)
    assert len(compiled_rows(r.stdout)) == 6
    assert files_of(tmp_path / "b") == files_of(tmp_path / "a")


def test_no_cache_neither_reads_nor_writes_the_cache(tmp_path, space):
    cache = tmp_path / "cache"
    run_build(space, tmp_path / "a", ["gfx942"], "--no-cache", env={"FLYSHIP_CACHE_DIR": str(cache)})
    assert not cache.exists()


def test_the_cache_folder_defaults_to_the_per_user_cache(tmp_path, space):
    env = {k: v for k, v in os.environ.items() if k != "FLYSHIP_CACHE_DIR"}
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    py = flydsl_python()
    r = subprocess.run([py, "-m", "flyship.compiler.cli", str(space), "-o", str(tmp_path / "a"), "--arch", "gfx942"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    assert any((tmp_path / "xdg" / "flyship" / "build" / "v1" / "tasks").glob("*/*.json"))


def test_concurrent_builds_share_one_cache_safely(tmp_path, space):
    cache = tmp_path / "cache"
    with cf.ThreadPoolExecutor(2) as ex:
        futs = [ex.submit(run_build, space, tmp_path / f"out{i}", ["gfx942"], cache=cache) for i in range(2)]
        for f in futs:
            f.result()
    assert files_of(tmp_path / "out0") == files_of(tmp_path / "out1")
    r = run_build(space, tmp_path / "again", ["gfx942"], cache=cache)
    assert "without compiling" in r.stderr
    assert files_of(tmp_path / "again") == files_of(tmp_path / "out0")
