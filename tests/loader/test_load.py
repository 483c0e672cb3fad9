"""Loading a bundle in the workload Python: the Ops object, registration, stats, no FlyDSL anywhere."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import flyship

pytestmark = pytest.mark.cpu
ROOT = Path(__file__).resolve().parents[2]


def test_the_workload_python_has_no_flydsl_and_the_loader_works_without_it(tiny_bundle, ext):
    code = f"""
import importlib.util, sys
assert importlib.util.find_spec("flydsl") is None, "flydsl is installed in the workload venv"
try:
    import flydsl
except ImportError:
    pass
else:
    raise SystemExit("import flydsl succeeded")
import torch, flyship
ops = flyship.load({str(tiny_bundle)!r})
d = ops.add.dispatch(torch.randn(8), torch.randn(8), target="gfx942")
assert d.spec == "f32", d
bad = sorted(m for m in sys.modules if m.split(".")[0] in ("flydsl", "triton"))
assert not bad, bad
print("ok", ops.names)
"""
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env=dict(os.environ))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok ('add', 'scale_rows', 'addsub')"


def test_ops_list_names_schemas_specializations_and_targets(tiny):
    assert tiny.names == ("add", "scale_rows", "addsub")
    assert len(tiny) == 3 and "add" in tiny and "mul" not in tiny
    assert [op.name for op in tiny] == list(tiny.names)
    assert tiny.targets == ("gfx942", "gfx950", "sm_90a")
    assert tiny.add.specializations == ("f32", "f16")
    assert tiny.add.schema == "add(Tensor x, Tensor y) -> Tensor"
    assert tiny["addsub"].out_schema == "addsub.out(Tensor x, Tensor y, *, Tensor(a!) sum, Tensor(b!) diff) -> ()"
    assert tiny.add.default is torch.ops.flyship_tiny.add.default
    assert tiny.namespace == "flyship_tiny" and tiny.flavor in ("hip", "cuda")


def test_an_unknown_op_lists_the_ops(tiny):
    with pytest.raises(AttributeError, match="no op 'mul'; it has add, scale_rows, addsub"):
        tiny.mul
    with pytest.raises(KeyError, match="no op 'mul'"):
        tiny["mul"]


def test_loading_the_same_bundle_again_returns_the_same_ops(tiny, tiny_bundle):
    assert flyship.load(tiny_bundle) is tiny
    assert flyship.load(str(tiny_bundle)) is tiny


def test_the_fallback_setting_comes_from_the_environment_or_load(fresh_ops, monkeypatch):
    monkeypatch.setenv("FLYSHIP_FALLBACK", "0")
    assert fresh_ops().fallback is False
    monkeypatch.setenv("FLYSHIP_FALLBACK", "1")
    ops = fresh_ops()
    assert ops.fallback is True
    ops.fallback = False
    assert ops.fallback is False
    assert fresh_ops(fallback=False).fallback is False


def test_stats_start_at_zero_and_count_per_specialization_and_reason(recorded_tiny):
    ops = recorded_tiny()
    assert ops.add.stats() == {"launches": {"f32": 0, "f16": 0}, "fallbacks": {}, "empty": 0, "original": 0,
                               "calls": 0}
    ops.add(torch.randn(8).double(), torch.randn(8).double())
    ops.add(torch.randn(8).double(), torch.randn(8).double())
    ops.scale_rows(torch.empty(70000, 1), 1.0, 0)
    assert ops.add.stats() == {"launches": {"f32": 0, "f16": 0}, "fallbacks": {"dtype x=float64": 2}, "empty": 0,
                               "original": 0, "calls": 2}
    assert ops.stats()["scale_rows"]["fallbacks"] == {"constraint 'x.shape[0] <= 65535' false": 1}
    ops.add.reset_stats()
    assert ops.add.stats()["calls"] == 0 and ops.scale_rows.stats()["calls"] == 1


@pytest.mark.parametrize("kwargs, message", [
    (dict(path=None), "flyship.load(path=): expected a bundle directory, its manifest.json or a packed bundle file as "
                      "a str or pathlib.Path, got None; pass the folder flyc-build wrote"),
    (dict(references=[1]), "flyship.load(references=): expected a mapping of op name -> PyTorch function, got list "
                           "[1]; pass references={'add': my_add}"),
    (dict(tuning={}), "flyship.load(tuning=): expected the path of a tuning table (`flyship tune` writes one) as a "
                      "str or pathlib.Path, got dict {}"),
    (dict(verify="no"), "flyship.load(verify=): expected True or False, got str no"),
])
def test_load_arguments_of_the_wrong_type_are_config_errors_saying_what_to_pass(tiny_bundle, kwargs, message):
    import re

    import flyship
    from flyship.errors import ConfigError

    with pytest.raises(ConfigError, match=re.escape(message)):
        flyship.load(**{"path": tiny_bundle, "namespace": "flyship_never_registered", **kwargs})


@pytest.mark.parametrize("name", ["FLYSHIP_FALLBACK", "FLYSHIP_FAST_CALL"])
@pytest.mark.parametrize("value", ["maybe", "2"])
def test_a_switch_set_to_anything_but_an_on_or_off_word_names_the_words_and_the_default(monkeypatch, name, value):
    import re

    from flyship import env
    from flyship.errors import ConfigError

    monkeypatch.setenv(name, value)
    read = env.fallback_enabled if name == "FLYSHIP_FALLBACK" else env.fast_call_enabled
    with pytest.raises(ConfigError, match=rf"{name}: expected one of 1/true/yes/on \(on\) or 0/false/no/off \(off\), "
                                          rf"any case; found {value!r}; .*unset {name} for the default \(on\)"):
        read()


@pytest.mark.parametrize("name", ["FLYSHIP_FALLBACK", "FLYSHIP_FAST_CALL"])
def test_a_switch_set_but_empty_is_its_default_as_for_every_other_option(monkeypatch, name):
    from flyship import env

    monkeypatch.setenv(name, " ")
    assert (env.fallback_enabled if name == "FLYSHIP_FALLBACK" else env.fast_call_enabled)() is True
