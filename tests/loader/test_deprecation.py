"""The one deprecation path (flyship/deprecation.py, issue 34 item 1): an old form warns for one minor version with
its migration, then is refused with the same words; CHANGELOG.md lists every announced change."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

import flyship
from flyship import deprecation
from flyship.errors import ConfigError, SpecError

pytestmark = pytest.mark.cpu

ROOT = Path(__file__).resolve().parents[2]


def test_the_round_1_extension_module_warns_with_its_migration_and_forwards_to_the_new_one():
    from flyship.loader import extension

    build = importlib.import_module("flyship.loader.build")
    with pytest.warns(FutureWarning,
                      match=r"import flyship.loader.build .*deprecated since flyship 0.2.0, refused from 0.3.0; use "
                            r"flyship.dry_run\(bundle, target=...\)"):
        got = build.extension_name
    assert got is extension.extension_name


def test_an_old_form_is_refused_with_the_same_migration_once_this_flyship_reaches_refused_in(monkeypatch):
    build = importlib.import_module("flyship.loader.build")
    monkeypatch.setattr(flyship, "__version__", "0.3.0.dev1")
    with pytest.raises(ConfigError, match=r"refused since flyship 0.3.0; use flyship.dry_run.*\(CHANGELOG.md, "
                                          r"loader.build\)"):
        build.extension_name
    monkeypatch.setitem(deprecation.CHANGES, "spec.test", deprecation.Change(
        "spec.test", "Spec(old=...)", "0.2.0", "0.3.0", "write Spec(new=...)", "spec"))
    with pytest.raises(SpecError, match=r"Spec\(old=...\): refused since flyship 0.3.0; write Spec\(new=...\)"):
        deprecation.met("spec.test")


@pytest.mark.parametrize("text, expected", [("0.2.0", (0, 2, 0)), ("0.3.0.dev1", (0, 3, 0)), ("1.0rc2", (1, 0, 0)),
                                            ("2", (2, 0, 0))])
def test_versions_compare_as_their_release_numbers(text, expected):
    assert deprecation.version_tuple(text) == expected


def test_the_changelog_lists_every_announced_change_with_its_versions_and_migration():
    text = (ROOT / "CHANGELOG.md").read_text()
    assert "## Spec API" in text and "## Loader API" in text
    for c in deprecation.CHANGES.values():
        assert f"`{c.key}`" in text, f"CHANGELOG.md does not list {c.key}"
        section = text[text.index(f"`{c.key}`"):].split("\n- ", 1)[0]
        assert f"from {c.since}" in section and f"from {c.refused_in}" in section, section
