"""The daily loop in one process: the same content loads again from anywhere; a rebuilt bundle with other content
replaces the namespace's ops with load(..., reload=True) (torch.library cannot define a schema twice: the earlier
registrations go first), and is refused without it, saying so."""

from __future__ import annotations

import shutil
import uuid

import pytest
import torch

import flyship
from flyship.errors import BundleError, ConfigError

pytestmark = pytest.mark.cpu


def rename_add(data: dict) -> None:
    next(o for o in data["ops"] if o["name"] == "add")["name"] = "add2"  # another schema: add is gone, add2 is new


def test_the_same_content_from_another_folder_returns_the_loaded_ops(tiny_bundle, tmp_path, ext):
    ns = f"flyship_r{uuid.uuid4().hex[:8]}"
    first = flyship.load(tiny_bundle, namespace=ns)
    rebuilt = shutil.copytree(tiny_bundle, tmp_path / "rebuilt")  # a rebuild that produced the same bytes
    assert flyship.load(rebuilt, namespace=ns) is first


def test_other_content_is_refused_naming_reload_and_replaces_the_ops_with_it(bundle_copy, ext):
    ns = f"flyship_r{uuid.uuid4().hex[:8]}"
    original, renamed = bundle_copy(), bundle_copy(rename_add)
    x = torch.randn(16)
    flyship.load(original, namespace=ns)
    torch.testing.assert_close(getattr(torch.ops, ns).add(x, x), x + x)
    with pytest.raises(BundleError, match=rf"namespace '{ns}' is already registered .* pass reload=True"):
        flyship.load(renamed, namespace=ns)
    with pytest.warns(UserWarning, match="replaced the ops of namespace"):
        ops = flyship.load(renamed, namespace=ns, reload=True)
    assert "add2" in ops.names and not hasattr(getattr(torch.ops, ns), "add")
    torch.testing.assert_close(getattr(torch.ops, ns).add2(x, x), x + x)
    torch.testing.assert_close(ops.add2(x, x), x + x)
    with pytest.warns(UserWarning, match="replaced the ops of namespace"):  # and back: each schema defined twice
        ops = flyship.load(original, namespace=ns, reload=True)
    assert not hasattr(getattr(torch.ops, ns), "add2")
    torch.testing.assert_close(getattr(torch.ops, ns).add(x, x), x + x)
    assert flyship.load(original, namespace=ns) is ops


def test_reload_takes_a_bool_only(tiny_bundle):
    with pytest.raises(ConfigError, match=r"flyship.load\(reload=\): expected True or False, got str"):
        flyship.load(tiny_bundle, reload="yes")
