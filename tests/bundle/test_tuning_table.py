"""Tuning tables: the format (round trip, refusals), the nearest-bucket policy its guards encode, device
filtering, merging, and the importers (aiter-style CSV, FlyDSL 0.5.0's autotune cache)."""

from __future__ import annotations

import json

import pytest

from flyship.bundle import expr as E
from flyship.bundle import tuning as tt
from flyship.compiler import tuning as T
from flyship.errors import BundleError, SpecError

pytestmark = pytest.mark.cpu


def entry(key, spec, target="gfx942", cus=304, us=None):
    return tt.Entry("gemm", target, cus, tuple(key), spec, us or {})


def table(*entries):
    return tt.Table("ns", {"gemm": ("a.shape[0]", "b.shape[0]")}, tuple(entries))


def test_a_table_round_trips_through_its_json_file(tmp_path):
    t = table(entry((1, 4096), "s", us={"s": 3.25, "l": 9.5}), entry((4096, 4096), "l", "sm_90", 132))
    tt.write(t, tmp_path / "t.json")
    back = tt.read(tmp_path / "t.json")
    assert back.keys == t.keys and sorted(back.entries, key=str) == sorted(t.entries, key=str)
    assert json.loads((tmp_path / "t.json").read_text())["format"] == "flyship-tuning"


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(format="other"), "format: expected 'flyship-tuning'"),
    (lambda d: d.update(version="2.0"), "version: expected major version 1"),
    (lambda d: d["entries"][0].update(key=[1]), "key: expected 2 integers"),
    (lambda d: d["entries"][0].update(op="nope"), "op: expected an op named in keys"),
    (lambda d: d["entries"][0].update(cus=0), "cus: expected a positive integer or null"),
    (lambda d: d["entries"][0]["us"].update(s=float("nan")), "us: expected an object spec -> finite microseconds"),
    (lambda d: d["entries"].append(dict(d["entries"][0], spec="other")), "two winners"),
])
def test_a_malformed_table_is_refused_naming_what_is_wrong(edit, message):
    d = tt.to_json_obj(table(entry((1, 4096), "s", us={"s": 1.0})))
    edit(d)
    with pytest.raises(BundleError, match=message):
        tt.from_json_obj(d, "t.json")


def test_a_file_that_is_not_json_is_a_tuning_error(tmp_path):
    (tmp_path / "t.json").write_text("{")
    with pytest.raises(BundleError, match=r"t\.json is not valid JSON"):
        tt.read(tmp_path / "t.json")


def test_entries_for_another_processor_or_cu_count_are_ignored_with_one_note_each():
    t = table(entry((1, 1), "a"), entry((2, 1), "b"), entry((1, 1), "c", "sm_90", 132), entry((1, 1), "d", cus=256))
    notes = []
    got = tt.entries_for(t, "gfx942:sramecc+:xnack-", 304, notes.append)
    assert [e.spec for e in got] == ["a", "b"]
    assert len(notes) == 2 and any("tuned for sm_90" in n for n in notes) and any("on 256 CUs" in n for n in notes)
    assert [e.spec for e in tt.entries_for(t, "gfx942", None, notes.append)] == ["a", "b", "d"]


def test_the_dispatch_guards_send_every_key_value_to_exactly_its_nearest_bucket():
    es = [entry((m, n), f"s{m}_{n}") for m in (1, 16, 128, 4096) for n in (1024, 8192)]
    plan = tt.dispatch_plan(("a.shape[0]", "b.shape[0]"), es)
    ms, ns = [1, 16, 128, 4096], [1024, 8192]
    for m in range(1, 9000, 7):
        for n in (1, 1000, 2896, 2897, 100000):
            held = [spec for spec, cons in plan
                    if all(E.evaluate_with_shapes(c, {"a": (m, 1), "b": (n, 1)}) for c in cons)]
            assert held == [f"s{tt.nearest(ms, m)}_{tt.nearest(ns, n)}"], (m, n)


def test_nearest_is_measured_on_a_log2_scale():
    assert tt.nearest([16, 4096], 256) == 16 and tt.nearest([16, 4096], 257) == 4096
    assert tt.nearest([1, 16], 4) == 1 and tt.nearest([1, 16], 5) == 16


def test_merging_replaces_the_same_key_and_keeps_the_others():
    old = table(entry((1, 1), "a"), entry((2, 2), "b"))
    new = table(entry((1, 1), "z"))
    assert sorted(e.spec for e in tt.merge(old, new).entries) == ["b", "z"]


AITER_CSV = """cu_num,M,N,K,kernelId,splitK,us,kernelName,BLOCK_M,BLOCK_N
304,1,4096,4096,3,0,5.5,k3,16,64
304,64,4096,4096,7,0,9.25,k7,64,64
304,4096,4096,4096,9,0,310.0,k9,128,128
"""


def test_an_aiter_csv_becomes_a_table_and_the_configs_it_names(tmp_path):
    (tmp_path / "tuned.csv").write_text(AITER_CSV)
    t, configs = T.import_aiter_csv(tmp_path / "tuned.csv", op="gemm", key=("a.shape[0]", "b.shape[0]", "a.shape[1]"),
                                    key_columns=("M", "N", "K"), config_columns=("BLOCK_M", "BLOCK_N"),
                                    target="gfx942", spec_prefix="f16__")
    assert [c.values for c in configs] == [{"BLOCK_M": 16, "BLOCK_N": 64}, {"BLOCK_M": 64, "BLOCK_N": 64},
                                           {"BLOCK_M": 128, "BLOCK_N": 128}]
    e = sorted(t.entries, key=lambda e: e.key)[0]
    assert (e.key, e.spec, e.cus, e.us) == ((1, 4096, 4096), "f16__M16_N64", 304, {"f16__M16_N64": 5.5})


def test_an_aiter_csv_missing_a_column_is_refused(tmp_path):
    (tmp_path / "tuned.csv").write_text(AITER_CSV)
    with pytest.raises(SpecError, match=r"expected columns \['GROUP_M'\]"):
        T.import_aiter_csv(tmp_path / "tuned.csv", op="gemm", key=("a.shape[0]",), key_columns=("M",),
                           config_columns=("GROUP_M",), target="gfx942")


def test_flydsls_autotune_cache_becomes_a_table(tmp_path):
    # FlyDSL 0.5.0 _save_disk_cache: {json.dumps(list(key)): Config.to_dict()}; key = key args, then fingerprints.
    cache = {json.dumps([[1, 4096], 4096, ["x:torch.float16"], ["x:(s, 1)"], "gfx942"]): {"BLOCK": 64, "num_warps": 4},
             json.dumps([[512, 4096], 4096, ["x:torch.float16"], ["x:(s, 1)"], "gfx942"]): {"BLOCK": 256, "num_warps": 8}}
    (tmp_path / "add.json").write_text(json.dumps(cache))
    t, configs = T.import_flydsl_cache(tmp_path / "add.json", op="gemm",
                                       key=("x.shape[0]", "x.shape[1]", "n"), target="gfx942", spec_prefix="f16__")
    assert sorted((e.key, e.spec) for e in t.entries) == [((1, 4096, 4096), "f16__BLOCK64_w4"),
                                                         ((512, 4096, 4096), "f16__BLOCK256_w8")]
    assert [c.label() for c in configs] == ["BLOCK64_w4", "BLOCK256_w8"]
