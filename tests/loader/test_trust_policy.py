"""The signature policy fails closed (issue 32, S2) and the trust anchor is checked like any trusted file (S3)."""

from __future__ import annotations

import os

import pytest

from flyship.bundle import pack as _pack
from flyship.errors import BundleError, ConfigError

pytestmark = pytest.mark.cpu


@pytest.fixture()
def keys(tmp_path):
    pytest.importorskip("cryptography", reason="signed packs need the optional 'cryptography' (flyship[sign])")
    from flyship.bundle import signing

    os.chmod(tmp_path, 0o700)
    return signing.generate_key(tmp_path / "k1"), signing.generate_key(tmp_path / "k2")


@pytest.fixture()
def unsigned(tiny_bundle, tmp_path, monkeypatch):
    monkeypatch.delenv("FLYSHIP_TRUSTED_KEYS", raising=False)
    return _pack.pack(tiny_bundle, tmp_path / "unsigned.flyship")


@pytest.mark.parametrize("given", [[], "generator", ()], ids=["empty-list", "exhausted-generator", "empty-tuple"])
def test_an_empty_trusted_keys_argument_is_an_error_not_no_policy(unsigned, tmp_path, given):
    if given == "generator":
        given = (k for k in ["x"])
        list(given)  # exhausted
    with pytest.raises(ConfigError, match=r"trusted_keys: expected at least one public key.*got an empty list"):
        _pack.open_pack(unsigned, tmp_path / "cache", trusted_keys=given)
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("value", [":", " ", "::", " : ", "\t"])
def test_a_trusted_keys_switch_of_blanks_or_separators_is_an_error_not_no_policy(unsigned, tmp_path, monkeypatch,
                                                                                   value):
    monkeypatch.setenv("FLYSHIP_TRUSTED_KEYS", value)
    with pytest.raises(ConfigError, match=r"FLYSHIP_TRUSTED_KEYS: expected .*which has an empty entry"):
        _pack.open_pack(unsigned, tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def test_an_empty_argument_does_not_override_a_set_switch(unsigned, tmp_path, monkeypatch, keys):
    (_, pub1), _ = keys
    monkeypatch.setenv("FLYSHIP_TRUSTED_KEYS", str(pub1))
    with pytest.raises(ConfigError, match="got an empty list"):
        _pack.open_pack(unsigned, tmp_path / "cache", trusted_keys=[])
    with pytest.raises(BundleError, match="got an unsigned pack"):
        _pack.open_pack(unsigned, tmp_path / "cache")


def test_an_argument_may_narrow_the_switch_but_never_widen_it(tiny_bundle, tmp_path, monkeypatch, keys):
    (k1, pub1), (k2, pub2) = keys
    signed2 = _pack.pack(tiny_bundle, tmp_path / "by2.flyship", sign_key=k2)
    monkeypatch.setenv("FLYSHIP_TRUSTED_KEYS", str(pub1))
    with pytest.raises(ConfigError, match=r"expected keys among FLYSHIP_TRUSTED_KEYS .*never widen it"):
        _pack.open_pack(signed2, tmp_path / "cache", trusted_keys=[pub2])
    with pytest.raises(BundleError, match="unknown key"):
        _pack.open_pack(signed2, tmp_path / "cache", trusted_keys=[pub1])
    monkeypatch.setenv("FLYSHIP_TRUSTED_KEYS", f"{pub1}{os.pathsep}{pub2}")  # narrowing to one of two: allowed
    assert _pack.open_pack(signed2, tmp_path / "cache", trusted_keys=[pub2]).is_dir()


def _refused(unsigned, tmp_path, spec, words):
    with pytest.raises(ConfigError, match=words):
        _pack.open_pack(unsigned, tmp_path / "cache", trusted_keys=[spec])


def test_a_key_file_writable_by_others_is_refused(unsigned, tmp_path, keys):
    (_, pub1), _ = keys
    os.chmod(pub1, 0o666)
    _refused(unsigned, tmp_path, pub1, r"trusted key .*: expected a \.pub file .*writable by group or others")


def test_a_key_file_in_a_folder_writable_by_others_is_refused(unsigned, tmp_path, keys):
    (_, pub1), _ = keys
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    (shared / "k.pub").write_bytes(pub1.read_bytes())
    _refused(unsigned, tmp_path, shared / "k.pub", r"its folder is writable by group or others")


def test_a_link_to_a_key_file_is_refused(unsigned, tmp_path, keys):
    (_, pub1), _ = keys
    (tmp_path / "link.pub").symlink_to(pub1)
    _refused(unsigned, tmp_path, tmp_path / "link.pub", r"it is a symbolic link")


@pytest.mark.skipif(os.getuid() != 0, reason="giving a file to another user needs root (chown)")
def test_a_key_file_owned_by_another_user_is_refused(unsigned, tmp_path, keys):
    (_, pub1), _ = keys
    os.chown(pub1, 4242, 4242)
    _refused(unsigned, tmp_path, pub1, r"owned by uid 4242")


def test_a_private_key_given_as_a_trusted_key_is_refused_without_quoting_it(keys, unsigned, tmp_path):
    from flyship.bundle import signing

    private = keys[0][0]  # (private key, public key) as flyship keygen writes them
    secret = private.read_bytes()
    assert b"PRIVATE KEY" in secret
    with pytest.raises(ConfigError, match="got a PRIVATE key") as e:
        signing.read_public_key(private)
    body = b"".join(secret.splitlines()[1:-1]).decode()
    assert body[:16] not in str(e.value) and "BEGIN" not in str(e.value)  # nothing of the secret in the message
