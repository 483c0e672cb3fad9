"""Explicit hostile inputs of the readers (issue 22), each in a fresh process under a time and a memory limit.

A FIFO or ``/dev/zero`` where a tuning table, the hook's patches file, a manifest or a pack is expected is refused
at once (it used to hang the load or every interpreter start, or read /dev/zero until the OOM killer came);
100,000 ``[`` is a flyship error in every JSON reader (it used to raise RecursionError); a wrong type is a flyship
error naming the field (``"op": [...]`` was a TypeError); ``x.shape[-'a']`` is an ExprError; a target that is not
written exactly as the one target parser reads it (``"gfx942 "``) is refused by the manifest and tuning tables
alike. The cases themselves are in tests/hostile/cases.py.
"""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.cpu

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "loader" / "data" / "tiny"
SECONDS = 30  # a refusal takes well under a second; a read that blocks or runs on hits this
MEMORY = 1 << 30

# case -> (the flyship error class, a regular expression its message must match)
EXPECTED = {
    "tuning_table_fifo": ("BundleError", "tuning table: expected a regular file at .*, found a named pipe"),
    "tuning_table_dev_zero": ("BundleError", "expected a regular file at /dev/zero, found a character device"),
    "tuning_table_folder": ("BundleError", "expected a regular file at .*, found a directory"),
    "patches_file_fifo": ("ConfigError", "patches file: expected a regular file at .*, found a named pipe"),
    "patches_file_dev_zero": ("ConfigError", "expected a regular file at /dev/zero, found a character device"),
    "manifest_fifo": ("BundleError", "read bundle: expected a manifest at .*manifest.json, found a named pipe"),
    "pack_fifo": ("BundleError", "expected a packed bundle file at .*t.flyship, found a named pipe"),
    "tuning_table_deep": ("BundleError", re.escape("nested at most 32 deep")),
    "patches_file_deep": ("ConfigError", re.escape("nested at most 32 deep")),
    "manifest_deep": ("BundleError", re.escape("nested at most 32 deep")),
    "pack_index_deep": ("BundleError", re.escape("flyship-pack.json is not valid JSON")),
    "pack_signature_deep": ("BundleError", re.escape("flyship-pack.sig is not an ed25519")),
    "tuning_op_is_a_list": ("BundleError", re.escape("entries[0].op: expected an op named in keys")),
    "tuning_key_is_a_bool": ("BundleError", re.escape("entries[0].key: expected 1 integers")),
    "patches_op_is_a_list": ("ConfigError", re.escape('patches[0]: expected {"target": "module:Name", "op": "<op>"')),
    "patches_args_is_a_list": ("ConfigError", re.escape("patches[0]: args: expected an object")),
    "pack_index_member_hash_is_a_list": ("BundleError", re.escape("members['manifest.json']: expected a sha256")),
    "pack_index_version_true": ("BundleError", re.escape("expected a flyship-pack index of version 1")),
    "expression_negated_string_index": ("ExprError", re.escape("expected x.shape[<int>]")),
    "expression_negated_bool_index": ("ExprError", re.escape("expected x.shape[<int>]")),
    "manifest_target_with_a_space": ("BundleError",
                                     re.escape("target ID 'gfx942 ': expected no surrounding whitespace")),
    "manifest_target_features_out_of_order": ("BundleError", re.escape("write 'gfx942:sramecc+:xnack-'")),
    "tuning_target_with_a_space": ("BundleError", re.escape("entries[0].target: target ID 'gfx942 '")),
    "tuning_target_feature_twice": ("BundleError", re.escape("feature 'xnack' given twice")),
    "tuning_target_unknown_feature": ("BundleError", re.escape("unknown feature 'fast'")),
    "tuning_target_empty_feature": ("BundleError",
                                    re.escape("entries[0].target: target ID 'gfx942:': expected an AMD target")),
}


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


def isolated(args: list[str], tmp_path: Path) -> tuple[subprocess.CompletedProcess, float]:
    """Run ``python ARGS`` in a fresh process under the memory and time limits; returns it and its wall time."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYSHIP_")}
    t = time.monotonic()
    try:
        r = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=SECONDS, preexec_fn=_limits)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{args}: still running after {SECONDS} s (a read that blocks or never ends)")
    return r, time.monotonic() - t


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_hostile_input_is_a_flyship_error_in_bounded_time(name, tmp_path):
    from tests.hostile import cases

    assert set(cases.CASES) == set(EXPECTED)
    r, _ = isolated(["-m", "tests.hostile.cases", name, str(tmp_path)], tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("REFUSED "), f"rc {r.returncode}\n{r.stdout}\n{r.stderr[-2000:]}"
    cls, message = EXPECTED[name]
    _, got_cls, flyship, got = r.stdout.rstrip("\n").split(" ", 3)
    assert (got_cls, flyship) == (cls, "flyship") and re.search(message, got), r.stdout


@pytest.mark.parametrize("kind", ["fifo", "dev_zero"])
def test_a_hook_whose_patches_file_became_a_fifo_or_dev_zero_never_stops_an_interpreter_start(kind, tmp_path):
    from flyship.loader.tools import hook

    patches = tmp_path / "patches.json"
    patches.write_text('{"bundle": "%s", "patches": [{"target": "mymodel:gelu", "op": "gelu"}]}' % TINY)
    site = tmp_path / "site"
    site.mkdir()
    if kind == "fifo":
        hook.install(patches, site)
        patches.unlink()
        os.mkfifo(patches)  # what the .pth names is now a pipe nobody writes
    else:
        hook.install(patches, site)
        (site / hook.PTH_NAME).write_text((site / hook.PTH_NAME).read_text().replace(str(patches), "/dev/zero"))
    r, took = isolated(["-c", f"import site; site.addsitedir({str(site)!r}); print('started')"], tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "started", r.stderr
    what = "a named pipe" if kind == "fifo" else "a character device"
    named = patches if kind == "fifo" else "/dev/zero"
    assert f"expected a regular file at {named}, found {what}" in r.stderr, r.stderr
    assert "nothing is patched" in r.stderr, r.stderr
