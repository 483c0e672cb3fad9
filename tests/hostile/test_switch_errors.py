"""Folder switches and patch targets (issue 32 item 4): every OS error or failing import is a flyship error naming
the switch or the target, never a raw OSError or the target module's own exception."""

from __future__ import annotations

import os
import sys

import pytest

from flyship import env
from flyship.errors import ConfigError

pytestmark = pytest.mark.cpu

FOLDER_SWITCHES = {"FLYSHIP_EXTENSIONS_DIR": env.extensions_dir, "FLYSHIP_CACHE_DIR": env.cache_dir,
                   "FLYSHIP_BUNDLE_CACHE": env.bundle_cache_dir, "FLYSHIP_PLAN_CACHE": env.plan_cache_dir,
                   "FLYSHIP_LLVM_BIN": env.llvm_bin, "FLYSHIP_EXTENSION_PATH": env.extension_path}


def _loop(tmp_path):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    return str(tmp_path / "a")


def _file_component(tmp_path):
    (tmp_path / "f").write_text("x")
    return str(tmp_path / "f" / "sub")


VALUES = {
    "symlink-loop": (_loop, "Too many levels of symbolic links"),
    "inside-a-symlink-loop": (lambda t: _loop(t) + "/sub", "Too many levels of symbolic links"),
    "over-long-path": (lambda t: "/" + "x" * 5000, "File name too long"),
    "over-long-component": (lambda t: str(t / ("y" * 300)), "File name too long"),
    "a-file-as-a-component": (_file_component, "Not a directory"),
    "under-proc": (lambda t: "/proc/sys/kernel", "on a real file system"),
    "under-sys": (lambda t: "/sys/kernel", "on a real file system"),
}


@pytest.mark.parametrize("switch", sorted(FOLDER_SWITCHES))
@pytest.mark.parametrize("case", sorted(VALUES))
def test_a_folder_switch_that_the_os_refuses_is_a_config_error_naming_the_switch(tmp_path, monkeypatch, switch,
                                                                                  case):
    make, words = VALUES[case]
    monkeypatch.setenv(switch, make(tmp_path))
    with pytest.raises(ConfigError, match=rf"^{switch}: expected a folder.*{words}") as e:
        FOLDER_SWITCHES[switch]()
    assert "unset it" in str(e.value)


def test_a_missing_folder_is_still_accepted_it_is_created_when_used(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYSHIP_CACHE_DIR", str(tmp_path / "new" / "cache"))
    assert env.cache_dir() == tmp_path / "new" / "cache"


def test_patching_a_module_that_raises_at_import_is_a_patch_error_naming_it(tmp_path, monkeypatch):
    import flyship

    (tmp_path / "flyship_raises_at_import.py").write_text("raise ValueError('the module broke')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(flyship.PatchError, match=r"patch 'flyship_raises_at_import:f': expected "
                       r"'flyship_raises_at_import' to import, got ValueError raised by its code: the module broke") \
            as e:
        flyship.patch("flyship_raises_at_import:f", object())
    assert isinstance(e.value.__cause__, ValueError)  # the module's traceback stays reachable
    sys.modules.pop("flyship_raises_at_import", None)


def test_patching_through_an_attribute_that_raises_is_a_patch_error(tmp_path, monkeypatch):
    import flyship

    (tmp_path / "flyship_getattr_raises.py").write_text(
        "def __getattr__(name):\n    raise RuntimeError('no ' + name)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(flyship.PatchError, match=r"reading 'Cls' of .* raised RuntimeError: no Cls"):
        flyship.patch("flyship_getattr_raises:Cls.forward", object())
    sys.modules.pop("flyship_getattr_raises", None)
