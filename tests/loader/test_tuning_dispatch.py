"""Table-driven dispatch on the recording driver: ``load(bundle, tuning=TABLE)`` runs the table's winner for
each key bucket through the real C++ call path (guards, launch), picks the nearest bucket for key values the
table lacks, and ignores entries for another device with a warning."""

from __future__ import annotations

import copy
import json
import warnings

import pytest
import torch

from flyship.bundle import tuning as tt
from flyship.bundle.errors import BundleError

pytestmark = pytest.mark.cpu

GFX942 = "gfx942:sramecc+:xnack-"


def _tuned_add(data: dict) -> None:
    """The tiny bundle's add op as a config space of three specializations keyed by x.shape[0]."""
    add = next(o for o in data["ops"] if o["name"] == "add")
    f32 = next(s for s in add["specializations"] if s["name"] == "f32")
    copies = []
    for name in ("f32__small", "f32__large"):
        s = copy.deepcopy(f32)
        s["name"] = name
        copies.append(s)
    add["specializations"] = copies + add["specializations"]
    add["tuning_key"] = ["x.shape[0]"]


def _table(tmp_path, entries, name="tuning.json"):
    t = tt.Table("flyship_tiny", {"add": ("x.shape[0]",)}, tuple(entries))
    path = tmp_path / name
    tt.write(t, path)
    return path


def _ran(ops, n):
    ops.add.reset_stats()
    ops.add(torch.randn(n), torch.randn(n))
    (spec, count), = ((k, v) for k, v in ops.add.stats()["launches"].items() if v)
    assert count == 1
    return spec


def test_each_key_value_runs_the_winner_of_its_nearest_bucket(bundle_copy, recorded, tmp_path):
    table = _table(tmp_path, [tt.Entry("add", "gfx942", None, (1024,), "f32__small", {"f32__small": 1.0}),
                              tt.Entry("add", "gfx942", None, (65536,), "f32__large", {"f32__large": 2.0})])
    ops = recorded(bundle_copy(_tuned_add), target=GFX942, tuning=table)
    assert ops.tuning == f"applied: 2 of 2 entries for {GFX942}"
    # The boundary between 1024 and 65536 on a log2 scale is isqrt(1024 * 65536) = 8192.
    assert _ran(ops, 1024) == "f32__small__t0"
    assert _ran(ops, 8192) == "f32__small__t0"
    assert _ran(ops, 8193) == "f32__large__t1"
    assert _ran(ops, 1 << 20) == "f32__large__t1"
    assert _ran(ops, 3) == "f32__small__t0"


def test_without_a_table_the_first_guard_that_holds_runs(bundle_copy, recorded):
    ops = recorded(bundle_copy(_tuned_add), target=GFX942)
    assert _ran(ops, 100000) == "f32__small"


def test_entries_for_another_target_are_ignored_with_a_warning(bundle_copy, recorded, tmp_path):
    table = _table(tmp_path, [tt.Entry("add", "sm_90", 132, (1024,), "f32__large")])
    with pytest.warns(UserWarning, match="ignoring the entries of op add tuned for sm_90"):
        ops = recorded(bundle_copy(_tuned_add), target=GFX942, tuning=table)
    assert _ran(ops, 1024) == "f32__small"


def test_a_table_naming_a_specialization_the_bundle_lacks_is_refused(bundle_copy, recorded, tmp_path):
    table = _table(tmp_path, [tt.Entry("add", "gfx942", None, (1024,), "f32__huge")])
    with pytest.raises(BundleError, match="winner 'f32__huge' is not a specialization"):
        recorded(bundle_copy(_tuned_add), target=GFX942, tuning=table)


def test_a_table_keyed_differently_from_the_bundle_is_refused(bundle_copy, recorded, tmp_path):
    path = tmp_path / "t.json"
    data = tt.to_json_obj(tt.Table("ns", {"add": ("x.numel",)}, (tt.Entry("add", "gfx942", None, (4,), "f32"),)))
    path.write_text(json.dumps(data))
    with pytest.raises(BundleError, match="keyed by"):
        recorded(bundle_copy(_tuned_add), target=GFX942, tuning=path)


def test_inputs_the_winners_guard_refuses_fall_through_to_the_bundles_own_order(bundle_copy, recorded, tmp_path):
    table = _table(tmp_path, [tt.Entry("add", "gfx942", None, (1024,), "f32__large")])
    ops = recorded(bundle_copy(_tuned_add), target=GFX942, tuning=table)
    ops.add.reset_stats()
    ops.add(torch.randn(1024).half(), torch.randn(1024).half())  # the winners are float32: f16 runs
    assert {k for k, v in ops.add.stats()["launches"].items() if v} == {"f16"}
    assert _ran(ops, 1024) == "f32__large__t0"


def test_the_race_times_only_the_candidates_whose_guard_admits_the_call_and_keeps_the_fastest(
        bundle_copy, recorded, record_ext):
    from flyship.loader.tools import tune

    ops = recorded(bundle_copy(_tuned_add), target=GFX942)
    clock = {"f32__small": 5.0, "f32__large": 2.0, "f32": 3.0, "f16": 1.0}
    timed, last = [], []
    real = ops.add.run_specialization

    def run_specialization(spec, *args):  # the real C++ path; remembers which candidate the timer ran
        out = real(spec, *args)
        last.append(spec)
        return out

    ops.add.run_specialization = run_specialization

    def timer(fn):
        fn()
        timed.append(last[-1])
        return clock[last[-1]]

    table = tune.race(ops, {"add": [{"x": [1000], "y": [1000]}, {"x": [8], "y": [8]}]}, timer=timer,
                      tensor_device="cpu", progress=lambda s: None, originals={"add": None})
    assert set(timed) == {"f32__small", "f32__large", "f32"}  # f16's dtype guard refuses float32 inputs
    assert table.keys == {"add": ("x.shape[0]",)}
    assert sorted((e.key, e.spec, e.target) for e in table.entries) == [((8,), "f32__large", GFX942),
                                                                       ((1000,), "f32__large", GFX942)]
    assert table.entries[0].us == {"f32__small": 5.0, "f32__large": 2.0, "f32": 3.0}


def test_a_shapes_file_that_is_not_op_to_calls_is_refused(tmp_path):
    from flyship.errors import ConfigError
    from flyship.loader.tools import tune

    (tmp_path / "s.json").write_text('{"add": {"x": [4]}}')
    with pytest.raises(ConfigError, match="expected"):
        tune.read_shapes(tmp_path / "s.json")


# The original in the race (issue 24 item 6): race times the op's reference as (original); a table that says the
# original wins for one key and the kernel for another runs the reference on purpose for the first.
def _race(ops, tmp_path):
    """Race add at 8 and 1000 elements with a fake clock: the reference wins at 8, f32__large at 1000."""
    from flyship.loader.tools import tune

    ref = ops.reference("add")
    calls = []

    def original(x, y):
        calls.append(x.shape[0])
        return ref(x, y)

    def timer(fn):
        n = len(calls)
        fn()
        if len(calls) > n:  # the original ran: fast for small inputs, slow for large ones
            return 1.0 if calls[-1] < 100 else 9.0
        return 2.0

    table = tune.race(ops, {"add": [{"x": [8], "y": [8]}, {"x": [1000], "y": [1000]}]}, timer=timer,
                      tensor_device="cpu", progress=lambda s: None, originals={"add": original})
    path = tmp_path / "tuning.json"
    tt.write(table, path)
    return path


def test_the_original_races_and_wins_where_it_is_fastest(bundle_copy, recorded, tmp_path):
    ops = recorded(bundle_copy(_tuned_add), target=GFX942)
    path = _race(ops, tmp_path)
    data = json.loads(path.read_text())
    assert data["version"] == tt.VERSION == "1.1"
    won = {tuple(e["key"]): e["spec"] for e in data["entries"]}
    assert won == {(8,): tt.ORIGINAL, (1000,): "f32__small"}  # the first of the tied specializations
    small = next(e for e in data["entries"] if e["key"] == [8])
    assert small["us"][tt.ORIGINAL] == 1.0 and small["us"]["f32__small"] == 2.0


@pytest.mark.parametrize("fallback", [True, False])
def test_a_key_the_original_wins_runs_the_reference_on_purpose(bundle_copy, recorded, launches, tmp_path,
                                                               fallback):
    bundle = bundle_copy(_tuned_add)
    path = _race(recorded(bundle, target=GFX942), tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # neither the load nor any call below warns
        ops = recorded(bundle, target=GFX942, tuning=path, fallback=fallback)
        ops.add.reset_stats()
        x = torch.randn(8)
        torch.testing.assert_close(ops.add(x, x), x + x)
        assert launches() == []  # the reference ran: nothing was launched
        st = ops.add.stats()
        assert st["original"] == 1 and st["fallbacks"] == {} and st["calls"] == 1
        assert not any(st["launches"].values())
        ops.add(torch.randn(1000), torch.randn(1000))
        assert len(launches()) == 1
        st = ops.add.stats()
        assert st["original"] == 1 and st["calls"] == 2 and st["launches"]["f32__small__t1"] == 1
        # A key value the table lacks takes its nearest bucket: 20 is nearer 8 than 1000 on a log2 scale.
        ops.add(torch.randn(20), torch.randn(20))
        assert launches() == [] and ops.add.stats()["original"] == 2


def test_decide_says_the_original_wins(bundle_copy, recorded, tmp_path):
    bundle = bundle_copy(_tuned_add)
    path = _race(recorded(bundle, target=GFX942), tmp_path)
    ops = recorded(bundle, target=GFX942, tuning=path)
    d = ops.add.dispatch(torch.randn(8), torch.randn(8), target=GFX942)
    assert d.spec is None and d.reason == "tuned: the original wins for this key"


def test_a_version_1_0_table_cannot_name_the_original_and_old_tables_still_read(tmp_path):
    entry = {"op": "add", "target": "gfx942", "cus": None, "key": [8], "spec": "f32", "us": {}}
    data = {"format": "flyship-tuning", "version": "1.0", "namespace": "ns", "keys": {"add": ["x.shape[0]"]},
            "entries": [entry]}
    assert tt.from_json_obj(data).entries[0].spec == "f32"
    entry["spec"] = tt.ORIGINAL
    with pytest.raises(BundleError, match=r"version 1.0 table cannot name \(original\)"):
        tt.from_json_obj(data)
    data["version"] = "1.1"
    assert tt.from_json_obj(data).entries[0].spec == tt.ORIGINAL


def test_the_routing_report_says_the_original_wins_on_purpose():
    from flyship.loader.tools import report

    site = {"target": "m.f", "op": "ns::add", "active": True, "to_op": 3, "to_original": {}, "verdict": "ROUTED",
            "op_stats": {"launches": {"f32__t1": 2}, "fallbacks": {}, "empty": 0, "original": 1, "calls": 3}}
    text = report.format_report({"rank": None, "world_size": None, "pid": 1, "sites": [site], "errors": []})
    assert "1 to the reference on purpose (tuned: the original wins)" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="proves the load on a machine with no GPU")
def test_a_tuning_table_on_a_machine_with_no_gpu_is_set_aside_with_a_warning_and_calls_run_the_reference(
        bundle_copy, tmp_path, ext):
    import uuid

    import flyship

    if ext.flavor() == "record":
        pytest.skip("the recording driver has a device; this proves the hip/cuda flavor's load with no GPU")
    table = _table(tmp_path, [tt.Entry("add", "gfx942", None, (1024,), "f32__large")])
    with pytest.warns(UserWarning, match="the tuning table is not used: no GPU here"):
        ops = flyship.load(bundle_copy(_tuned_add), namespace=f"flyship_t{uuid.uuid4().hex[:8]}", tuning=table)
    assert ops.tuning.startswith("not used: no GPU here")  # said on the object too, not only in a warning
    x = torch.randn(1024)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback warning: CPU calls run the reference
        torch.testing.assert_close(ops.add(x, x), x + x)


@pytest.mark.skipif(torch.cuda.is_available(), reason="proves flyship tune's refusal on a machine with no GPU")
def test_tune_on_a_machine_with_no_gpu_is_a_flyship_error_naming_the_fix(bundle_copy, recorded):
    from flyship.errors import ConfigError
    from flyship.loader.tools import tune

    ops = recorded(bundle_copy(_tuned_add), target=GFX942)  # the recording driver reads a device: torch has none
    with pytest.raises(ConfigError, match="expected a GPU torch can put the race's tensors on, found none"):
        tune.race(ops, {"add": [{"x": [8], "y": [8]}]}, progress=lambda s: None)
