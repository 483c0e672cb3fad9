"""The build cache's key and store without a compiler: what changes a key, what does not, and how the store
treats damaged or foreign entries."""

from __future__ import annotations

import dataclasses
import importlib
import pickle
import sys
from pathlib import Path

import pytest
from flyship.compiler import cache as C
from flyship.compiler.kernel_sources import kernel_sources
from flyship.compiler.spec import Constexpr, OpDecl, Output, Spec, Tensor

pytestmark = pytest.mark.cpu

CONTEXT = {"flyship": "test", "tools": {"llvm-mc": "22.1.8"}, "environment": {}}


def _op(kernel, **spec_kw) -> tuple[OpDecl, Spec]:
    spec = Spec("s", dtypes={"x": "float32"}, shapes={"x": (64,)}, constexprs={"BLOCK": 64}, **spec_kw)
    op = OpDecl(name="k", kernel=kernel, args=(Tensor("x", rank=1), Output("out", like="x"), Constexpr("BLOCK")),
                specs=(spec,), reference=None, doc="", grid=("x.numel",), frontend="triton")
    return op, spec


@pytest.fixture
def user_pkg(tmp_path, monkeypatch):
    """Two user modules: ``kmod`` (a kernel) imports ``khelp``."""
    (tmp_path / "khelp.py").write_text("SCALE = 2\n")
    (tmp_path / "kmod.py").write_text("import khelp\n\ndef kernel(x):\n    return x * khelp.SCALE\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for m in ("kmod", "khelp"):
        sys.modules.pop(m, None)
    yield tmp_path
    for m in ("kmod", "khelp"):
        sys.modules.pop(m, None)


def test_the_kernel_sources_are_its_module_and_the_user_modules_it_imports(user_pkg):
    kmod = importlib.import_module("kmod")
    src = kernel_sources(kmod.kernel)
    assert src["function"] == f"{(user_pkg / 'kmod.py').resolve()}:kernel"
    assert set(src["files"]) == {str((user_pkg / "kmod.py").resolve()), str((user_pkg / "khelp.py").resolve())}
    # installed packages (pytest here) and the standard library are keyed by version, not by file
    assert not any("site-packages" in f or f.endswith("/pathlib.py") for f in src["files"])


def test_a_wrapper_is_seen_through_to_its_function_and_closure_values_count(user_pkg):
    def make(block):
        def kernel(x):
            return x[:block]
        return kernel

    class Jit:  # a DSL wrapper holding the function as .fn (Triton) or .func (FlyDSL)
        def __init__(self, fn):
            self.fn = fn

    a, b = kernel_sources(Jit(make(64))), kernel_sources(Jit(make(128)))
    assert a["function"].endswith("make.<locals>.kernel")
    assert a["closure"] == [["block", 64]] and b["closure"] == [["block", 128]]


def test_every_input_of_a_compile_changes_the_key_and_nothing_else_does(user_pkg):
    kmod = importlib.import_module("kmod")
    src = kernel_sources(kmod.kernel)
    op, spec = _op(kmod.kernel)
    base = C.task_key(op, spec, "gfx942", CONTEXT, src)
    assert C.task_key(op, spec, "gfx942", CONTEXT, src) == base  # deterministic
    changed = {
        "target": C.task_key(op, spec, "gfx950", CONTEXT, src),
        "constexpr": C.task_key(op, dataclasses.replace(spec, constexprs={"BLOCK": 128}), "gfx942", CONTEXT, src),
        "option": C.task_key(op, dataclasses.replace(spec, options={"num_warps": 8}), "gfx942", CONTEXT, src),
        "dtype": C.task_key(op, dataclasses.replace(spec, dtypes={"x": "float16"}), "gfx942", CONTEXT, src),
        "grid": C.task_key(dataclasses.replace(op, grid=("x.numel // 2",)), spec, "gfx942", CONTEXT, src),
        "tools": C.task_key(op, spec, "gfx942", {**CONTEXT, "tools": {"llvm-mc": "23.0.0"}}, src),
        "env": C.task_key(op, spec, "gfx942", {**CONTEXT, "environment": {"TRITON_F": "1"}}, src),
    }
    (user_pkg / "khelp.py").write_text("SCALE = 3\n")
    changed["imported module"] = C.task_key(op, spec, "gfx942", CONTEXT, kernel_sources(kmod.kernel))
    assert base not in changed.values() and len(set(changed.values())) == len(changed)
    # the op's documentation and the spec's name in another op do not change the code
    assert C.task_key(dataclasses.replace(op, doc="other words"), spec, "gfx942", CONTEXT, src) == base


def test_a_kernel_from_an_installed_package_is_keyed_by_that_packages_files(tmp_path, monkeypatch):
    site = tmp_path / "site-packages" / "kernlib"
    site.mkdir(parents=True)
    (site / "__init__.py").write_text("from kernlib import ops\n")
    (site / "ops.py").write_text("def kernel(x):\n    return x\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site-packages"))
    try:
        ops = importlib.import_module("kernlib.ops")
        before = kernel_sources(ops.kernel)
        assert set(before["files"]) == {str((site / "ops.py").resolve())}
        (site / "ops.py").write_text("def kernel(x):\n    return x + 1\n")  # an upgrade of the library
        assert kernel_sources(ops.kernel)["files"] != before["files"]
    finally:
        for m in ("kernlib", "kernlib.ops"):
            sys.modules.pop(m, None)


def test_the_dsl_environment_leaves_out_cache_and_dump_folders():
    env = C.dsl_environment({"TRITON_CACHE_DIR": "/x", "FLYDSL_DUMP_DIR": "/y", "TRITON_DEBUG": "1", "HOME": "/h",
                             "FLYDSL_GPU_ARCH": "gfx942"})
    assert env == {"FLYDSL_GPU_ARCH": "gfx942", "TRITON_DEBUG": "1"}


def test_a_blob_that_does_not_match_its_sha256_is_dropped(tmp_path):
    store = C.BuildCache(tmp_path)
    sha = store.put_blob(b"code object bytes")
    assert store.get_blob(sha) == b"code object bytes"
    path = next((tmp_path / "v1" / "objects").glob("*/*"))
    path.write_bytes(b"tampered")
    assert store.get_blob(sha) is None and not path.exists()


def test_an_entry_naming_a_foreign_class_is_refused_not_unpickled(tmp_path):
    store = C.BuildCache(tmp_path)
    evil = store.put_blob(pickle.dumps(Path("/etc/passwd")))
    code = store.put_blob(b"\x7fELF")
    store._write_entry("tasks", "ab" * 32, {"blobs": {"variant": evil, "code_object": code, "isa": None}})
    assert store.get_variant("ab" * 32) is None
    assert not store._entry_path("tasks", "ab" * 32).exists()  # dropped, rebuilt by the next build


def test_the_cache_folder_follows_flyship_cache_dir_then_xdg(monkeypatch, tmp_path):
    from flyship import env

    monkeypatch.setenv("FLYSHIP_CACHE_DIR", str(tmp_path / "mine"))
    assert env.cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("FLYSHIP_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert env.cache_dir() == tmp_path / "xdg" / "flyship" / "build"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert env.cache_dir() == tmp_path / "home" / ".cache" / "flyship" / "build"
