"""``flyship tune --shapes``: every value checked before anything is allocated or a GPU is looked at, with a message
naming the entry (issue 32 item 6); ``--dry-run`` checks bundle, shapes and table with no GPU (issue 35 item 4)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flyship.bundle import tuning as tt
from flyship.errors import ConfigError
from flyship.loader.tools import tune_shapes

pytestmark = pytest.mark.cpu

ROOT = Path(__file__).resolve().parents[2]


def _tuned_add(data: dict) -> None:
    add = next(o for o in data["ops"] if o["name"] == "add")
    add["tuning_key"] = ["x.shape[0]"]


@pytest.fixture()
def tuned(bundle_copy):
    return bundle_copy(_tuned_add)


def _shapes(tmp_path, calls, op="add"):
    p = tmp_path / "shapes.json"
    p.write_text(json.dumps({op: calls}))
    return p


BAD = [
    ({"x": [-8], "y": [8]}, r"add\[0\]\.x\[0\]: expected a whole number from 1 to 2147483647, got -8"),
    ({"x": ["ab"], "y": [8]}, r"add\[0\]\.x\[0\]: expected a whole number .*got 'ab' \(a fraction or a bool"),
    ({"x": [1e300], "y": [8]}, r"add\[0\]\.x\[0\]: expected a whole number .*got 1e\+300"),
    ({"x": [2**62], "y": [8]},
     r"add\[0\]\.x\[0\]: expected a whole number from 1 to 2147483647, got 4611686018427387904"),
    ({"x": [8.7], "y": [8]}, r"add\[0\]\.x\[0\]: expected a whole number .*got 8\.7 \(a fraction or a bool"),
    ({"x": [True], "y": [8]}, r"add\[0\]\.x\[0\]: expected a whole number .*got True \(a fraction or a bool"),
    ({"x": [0], "y": [8]}, r"add\[0\]\.x\[0\]: expected a whole number from 1"),
    ({"x": [131072, 131072], "y": [8]}, r"add\[0\]\.x: expected 1 dimensions .*got 2"),
    ({"x": [(1 << 31) - 1], "y": [(1 << 31) - 1], "dtypes": {"x": "float64", "y": "float64"}},
     r"add\[0\]: expected inputs of at most 16 GiB in all, got 32\.0 GiB by y \[2147483647\] \(float64\)"),
    ({"x": [8], "y": [8], "dtypes": {"x": "manual_seed"}}, r"add\[0\]\.dtypes\.x: expected one of float16, .*got "
                                                             r"'manual_seed'"),
    ({"x": [8], "y": [8], "dtypes": {"x": "__class__"}}, r"add\[0\]\.dtypes\.x: expected one of .*got '__class__'"),
    ({"x": [8], "y": [8], "dtypes": {"q": "float16"}}, r"add\[0\]\.dtypes: expected tensor inputs of the op"),
    ({"x": [8], "y": [8], "alpha": 1},
     r"add\[0\]: expected the op's arguments \(x, y\) and 'dtypes', got also 'alpha'"),
    ({"x": 8, "y": [8]}, r"add\[0\]\.x: expected a shape"),
    ({"y": [8]}, r"add\[0\]: expected a shape for tensor 'x'"),
]


@pytest.mark.parametrize("call, words", BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_every_value_of_a_shapes_file_is_checked_with_a_message_naming_the_entry(tuned, tmp_path, call, words):
    with pytest.raises(ConfigError, match=words):
        tune_shapes.dry_run(tuned, _shapes(tmp_path, [{"x": [4], "y": [4]}, call][1:]))


def test_a_big_tensor_is_refused_from_its_estimate_before_anything_is_allocated(tuned, tmp_path):
    """[131072, 131072] float32 is 64 GiB: refused by the estimate (a rank-2 op would otherwise allocate it)."""
    from flyship.bundle import manifest as _m

    op = next(o for o in _m.read(tuned).ops if o.name == "add")
    import dataclasses

    wide = dataclasses.replace(op, args=tuple(dataclasses.replace(a, rank=2) if a.kind == "tensor" else a
                                              for a in op.args))
    with pytest.raises(ConfigError, match=r"add\[0\]: expected inputs of at most 16 GiB in all, got 64\.0 GiB by x"):
        tune_shapes.check_calls(wide, [{"x": [131072, 131072], "y": [1, 1]}], "add")


def test_a_dry_run_prints_each_op_s_keys_and_candidates_and_the_table_it_merges_into(tuned, tmp_path):
    table = tuned / "tuning.json"
    tt.write(tt.Table("flyship_tiny", {"add": ("x.shape[0]",)}, (tt.Entry("add", "gfx942", None, (8,), "f32"),)),
             table)
    lines = tune_shapes.dry_run(tuned, _shapes(tmp_path, [{"x": [8], "y": [8]}, {"x": [1000], "y": [1000]}]), table)
    text = "\n".join(lines)
    assert "add: 2 call(s), key ['x.shape[0]'] = [[8], [1000]]; candidates f32, f16" in text
    assert f"table {table}: 1 entries" in text


def test_a_dry_run_refuses_a_table_keyed_otherwise(tuned, tmp_path):
    table = tmp_path / "t.json"
    tt.write(tt.Table("flyship_tiny", {"add": ("y.shape[0]",)}, ()), table)
    with pytest.raises(ConfigError, match=r"keys op add by \['y.shape\[0\]'\], the bundle by \['x.shape\[0\]'\]"):
        tune_shapes.dry_run(tuned, _shapes(tmp_path, [{"x": [8], "y": [8]}]), table)


def _cli(*args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYSHIP_")}
    return subprocess.run([sys.executable, "-m", "flyship.loader.tools.cli", "tune", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env=env)


def test_tune_dry_run_through_the_cli_exits_0_with_the_plan_and_1_on_a_bad_shape(tuned, tmp_path):
    r = _cli(tuned, "--shapes", _shapes(tmp_path, [{"x": [64], "y": [64]}]), "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "add: 1 call(s)" in r.stdout and "no GPU used" in r.stdout
    r = _cli(tuned, "--shapes", _shapes(tmp_path, [{"x": [8.7], "y": [8]}]), "--dry-run")
    assert r.returncode == 1 and "add[0].x[0]: expected a whole number" in r.stderr, r.stderr


def test_tune_checks_the_shapes_file_before_it_looks_for_a_gpu(tuned, tmp_path):
    r = _cli(tuned, "--shapes", _shapes(tmp_path, [{"x": [-8], "y": [8]}]))
    assert r.returncode == 1 and "add[0].x[0]: expected a whole number from 1" in r.stderr, r.stderr
    assert "GPU" not in r.stderr
