"""The ``flyship`` command, run as a subprocess: exit codes, stdout and stderr."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.cpu
ROOT = Path(__file__).resolve().parents[2]


def flyship_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flyship.loader.tools.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


def test_list_shows_ops_schemas_specializations_and_targets(tiny_bundle):
    r = flyship_cli("list", str(tiny_bundle))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "namespace flyship_tiny (schema 1.1" in out
    assert "targets: gfx942, gfx950, sm_90a" in out
    assert "flyship_tiny::add(Tensor x, Tensor y) -> Tensor" in out
    assert "flyship_tiny::addsub.out(Tensor x, Tensor y, *, Tensor(a!) sum, Tensor(b!) diff) -> ()" in out
    assert ("  f16: x=float16; y=float16; x.shape[0] == y.shape[0]; out aligned to 16; x aligned to 16; "
            "y aligned to 16") in out
    assert ("    layout (implied by the kernargs): x.shape[0] <= 1 or x.stride[0] == 1; "
            "y.shape[0] <= 1 or y.stride[0] == 1; out.shape[0] <= 1 or out.stride[0] == 1") in out
    assert "    targets: gfx942 (hsaco), sm_90a (cubin)" in out


def test_list_of_a_folder_without_a_bundle_fails_with_one_clear_line(tmp_path):
    r = flyship_cli("list", str(tmp_path))
    assert r.returncode == 1
    assert r.stderr.strip() == (f"Error: read bundle: expected a manifest at {tmp_path / 'manifest.json'}, found "
                                "nothing; pass a bundle directory built by flyc-build (it holds manifest.json)")


@pytest.mark.parametrize("command", ["list", "inspect"])
@pytest.mark.parametrize("kind", ["symlink loop", "character device", "folder named manifest.json", "folder's "
                                  "manifest.json is a folder", "nothing"])
def test_a_bundle_path_that_is_no_bundle_says_what_it_found_in_one_line(tmp_path, command, kind):
    if kind == "symlink loop":
        os.symlink(tmp_path / "b", tmp_path / "a")
        os.symlink(tmp_path / "a", tmp_path / "b")
        given, shown, found = tmp_path / "a", tmp_path / "a", "a symlink loop"
    elif kind == "character device":
        given, shown, found = Path(os.devnull), Path(os.devnull), "a character device"
    elif kind == "folder named manifest.json":
        (tmp_path / "manifest.json").mkdir()
        given, shown, found = tmp_path / "manifest.json", tmp_path / "manifest.json", "a directory"
    elif kind == "nothing":
        given, shown, found = tmp_path / "absent", tmp_path / "absent", "nothing"
    else:
        (tmp_path / "b" / "manifest.json").mkdir(parents=True)
        given, shown, found = tmp_path / "b", tmp_path / "b" / "manifest.json", "a directory"
    r = flyship_cli(command, str(given))
    assert r.returncode == 1 and r.stdout == "" and "Traceback" not in r.stderr
    assert r.stderr.startswith("Error: ") and r.stderr.count("\n") == 1, r.stderr
    assert f" at {shown}, found {found}; pass " in r.stderr, r.stderr


@pytest.mark.parametrize("damage", ["huge rank", "not utf-8", "truncated code object"])
def test_list_of_a_damaged_bundle_prints_the_message_and_lists_nothing(bundle_copy, damage):
    if damage == "huge rank":
        root = bundle_copy(lambda d: d["ops"][0]["args"][0].update(rank=10**7))
        expect = r"args\[0\]\.rank: expected a rank in 0\.\.16, got 10000000"
    elif damage == "not utf-8":
        root = bundle_copy()
        (root / "manifest.json").write_bytes(b"\xff" + (root / "manifest.json").read_bytes())
        expect = "is not UTF-8 text"
    else:
        root = bundle_copy()
        (root / "add.f32.gfx942.hsaco").write_bytes((root / "add.f32.gfx942.hsaco").read_bytes()[:100])
        expect = r"add\.f32\.gfx942\.hsaco\): sha256 mismatch"
    r = flyship_cli("list", str(root))
    assert r.returncode == 1
    assert r.stdout == ""
    assert "Traceback" not in r.stderr
    assert r.stderr.startswith("Error: ") and r.stderr.count("\n") == 1
    assert re.search(expect, r.stderr), r.stderr


def test_list_refuses_a_changed_references_module_as_load_does(bundle_copy, ext):
    import flyship
    from flyship.errors import BundleError

    root = bundle_copy()
    with open(root / "references.py", "a") as f:
        f.write("\nimport os  # changed after the build\n")
    with pytest.raises(BundleError, match="sha256 mismatch") as e:
        flyship.load(root, namespace="flyship_refs_changed")
    r = flyship_cli("list", str(root))
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr == f"Error: {e.value}\n"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present; this proves the no-GPU message")
def test_verify_without_a_gpu_fails_saying_it_needs_one(tiny_bundle, ext):
    r = flyship_cli("verify", str(tiny_bundle))
    assert r.returncode == 1
    assert r.stderr.startswith("Error: verify: expected a GPU (torch.cuda.is_available()), got none")
    assert "without one, `flyship verify --emulate BUNDLE`" in r.stderr  # what to do on a machine without a GPU


def _no_gfx950(data: dict) -> None:
    """The tiny bundle as a gfx942 (+ sm_*) build: every gfx950 variant left out."""
    for op in data["ops"]:
        for spec in op["specializations"]:
            spec["variants"] = [v for v in spec["variants"] if not v["target"].startswith("gfx950")]


def test_verify_emulate_for_a_target_the_bundle_lacks_names_the_targets_it_has(bundle_copy, ext):
    # A trial user's gfx942-only bundle with --target gfx950 was told "(an sm_*-only bundle is not executed)".
    r = flyship_cli("verify", "--emulate", "--target", "gfx950", "--op", "add", str(bundle_copy(_no_gfx950)))
    assert r.returncode == 1
    assert "the bundle has no gfx950 code objects (it has gfx942); pass --target gfx942 or leave --target out" \
        in r.stderr, r.stderr


def test_prebuild_builds_or_finds_the_extension_and_puts_it_where_asked(ext, tmp_path):
    r = flyship_cli("prebuild", "-o", str(tmp_path))  # -o: leave the test environment's own folder alone
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"flyship extension ({ext.flavor()}) ready: ")
    path = Path(r.stdout.split("ready: ")[1].strip())
    assert path.is_file() and path.parent == tmp_path


def test_prebuild_into_a_folder_it_cannot_make_says_so_and_what_to_pass(ext, tmp_path):
    (tmp_path / "a_file").write_text("in the way")
    r = flyship_cli("prebuild", "-o", str(tmp_path / "a_file" / "ext"))
    assert r.returncode == 1
    assert r.stderr.startswith(f"Error: install the flyship extension into {tmp_path / 'a_file' / 'ext'}: expected a "
                               "folder it can create and write, got "), r.stderr
    assert "; pass a writable folder (flyship prebuild -o DIR)" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("given", ["manifest", "packed"])
def test_pack_takes_a_bundles_manifest_or_packed_file_as_docs_loader_md_says(tiny_bundle, tmp_path, given):
    from flyship.bundle import pack as _pack

    src = tiny_bundle / "manifest.json" if given == "manifest" else _pack.pack(tiny_bundle, tmp_path / "in.flyship")
    out = tmp_path / "o.flyship"
    r = subprocess.run([sys.executable, "-m", "flyship.loader.tools.cli", "pack", str(src), "-o", str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=600,
                       env={**os.environ, "FLYSHIP_BUNDLE_CACHE": str(tmp_path / "cache")})
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == _pack.pack_bytes(tiny_bundle)


def test_pack_into_a_folder_it_cannot_make_says_so_in_one_line(tiny_bundle, tmp_path):
    (tmp_path / "a_file").write_text("in the way")
    r = flyship_cli("pack", str(tiny_bundle), "-o", str(tmp_path / "a_file" / "o.flyship"))
    assert r.returncode == 1
    assert r.stderr.startswith(f"Error: flyship pack -o {tmp_path / 'a_file' / 'o.flyship'}: expected a file it can "
                               "write, got FileExistsError"), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
