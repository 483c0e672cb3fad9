"""Signed packs: an Ed25519 signature over a pack's sha256 index, and the policy that requires one.

A signed pack (``flyship pack --sign KEY``, index version 2) holds a second member ``flyship-pack.sig``:
``{"format": "flyship-pack-signature", "version": 1, "algorithm": "ed25519", "public_key": hex, "signature": hex}``,
the signature over the exact bytes of the index member ``flyship-pack.json``, which records every other member's
sha256: verifying the signature and then every member against the index vouches for every byte extracted.

When trusted keys are given (``flyship.load(..., trusted_keys=[...])`` or ``FLYSHIP_TRUSTED_KEYS``), a bundle
loads only from a pack signed by one of them: an unsigned pack, a bad signature, an unknown key and a bundle
folder (which carries no signature) are refused. Without trusted keys a signature is not required (and not
checked: a signature from a key nobody trusts proves nothing). Keys come from ``flyship keygen``: the private
key as PKCS#8 PEM (mode 0600), the public key as one line ``ed25519 <64 hex digits>`` in ``KEY.pub``.

The Ed25519 code is the ``cryptography`` package's (an optional dependency: ``pip install flyship[sign]``).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Iterable

from flyship.bundle import files as _files
from flyship.bundle import limits as _limits
from flyship.bundle import trust as _trust
from flyship.bundle.errors import BundleError
from flyship.errors import ConfigError

SIG_NAME = "flyship-pack.sig"
SIG_FORMAT = "flyship-pack-signature"
_HEX_KEY = re.compile(r"^[0-9a-f]{64}$")
_MAX_KEY_FILE = 1 << 16


def _crypto() -> tuple[Any, Any]:
    """cryptography's ed25519 and serialization modules, imported when a signature is made or checked."""
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError as e:
        raise ConfigError(f"signed packs: expected the 'cryptography' package, got {e}; install it with "
                          "`pip install cryptography` (flyship's `sign` extra)") from None
    return ed25519, serialization


def generate_key(path: Path | str) -> tuple[Path, Path]:
    """Write a new Ed25519 private key to ``path`` (PEM, mode 0600, refused if it exists) and its public key to
    ``path.pub``.

    Returns:
        (private key path, public key path).
    """
    ed25519, serialization = _crypto()
    path = Path(path)
    key = ed25519.Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise ConfigError(f"flyship keygen: expected a new file, got an existing {path}; pick another name") from None
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    pub = path.with_name(path.name + ".pub")
    pub.write_text(f"ed25519 {_public_hex(key.public_key())}\n")
    return path, pub


def _public_hex(public: Any) -> str:
    _, serialization = _crypto()
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()


def sign(index: bytes, key_path: Path | str) -> bytes:
    """The ``flyship-pack.sig`` member for the index bytes ``index``, signed with the private key at ``key_path``."""
    ed25519, serialization = _crypto()
    pem = _files.read_regular(key_path, _MAX_KEY_FILE, what="flyship pack --sign", error=ConfigError,
                              hint="pass the private key file `flyship keygen` wrote")
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"flyship pack --sign {key_path}: expected an unencrypted Ed25519 private key (PEM) from "
                          f"`flyship keygen`, got {type(e).__name__}: {e}") from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise ConfigError(f"flyship pack --sign {key_path}: expected an Ed25519 key, got {type(key).__name__}")
    sig = {"format": SIG_FORMAT, "version": 1, "algorithm": "ed25519", "public_key": _public_hex(key.public_key()),
           "signature": key.sign(index).hex()}
    return (json.dumps(sig, sort_keys=True, indent=1) + "\n").encode()


def read_public_key(spec: str | os.PathLike) -> str:
    """A trusted key as 64 hex digits: given as the hex itself, or a ``.pub`` file ``flyship keygen`` wrote."""
    text = str(spec).strip()
    if _HEX_KEY.match(text.lower()):
        return text.lower()
    if not text:
        raise ConfigError("trusted key: expected a .pub file or 64 hex digits, got an empty string; name the key")
    # The trust anchor is read like every trusted file (bundle/trust.py): a regular file, not a link, owned by the
    # user or root and writable by no one else, in a folder with the same properties; once, through one descriptor.
    try:
        raw = _trust.read_trusted(Path(text).expanduser(), _MAX_KEY_FILE, what="trusted key")
    except (OSError, ValueError) as e:
        got = e.strerror if isinstance(e, OSError) and e.strerror else e
        raise ConfigError(f"trusted key {spec}: expected a .pub file `flyship keygen` wrote (yours or root's, "
                          f"writable only by its owner) or 64 hex digits, got {got}; copy the key into a folder only "
                          "you can write (chmod 644 the file, 755 or 700 the folder)") from None
    line = raw.decode("ascii", errors="replace").strip()
    kind, _, hexkey = line.partition(" ")
    if kind != "ed25519" or not _HEX_KEY.match(hexkey.strip()):
        # Never quote the file: a private key given by mistake would land in logs (its PEM body is the secret).
        what = ("a PRIVATE key (keep it off this machine; trust the .pub file `flyship keygen` wrote beside it)"
                if b"PRIVATE KEY" in raw else f"{len(raw)} bytes of something else")
        raise ConfigError(f"trusted key {spec}: expected a public key file, one line 'ed25519 <64 hex digits>', got "
                          f"{what}")
    return hexkey.strip()


def policy(trusted_keys: Iterable[str | os.PathLike] | None) -> frozenset[str] | None:
    """The keys a pack must be signed by; None when neither ``trusted_keys`` nor ``FLYSHIP_TRUSTED_KEYS`` is given
    (no signature required).

    It fails closed: an empty ``trusted_keys`` (``[]``, an exhausted generator) is an error, never "no policy", and
    an argument cannot weaken the environment's policy: with ``FLYSHIP_TRUSTED_KEYS`` set, ``trusted_keys`` may
    only narrow it (each of its keys must be one the environment trusts).

    Raises:
        ConfigError: an empty list, a key the environment does not trust, an unreadable or untrusted key file.
    """
    from flyship import env

    from_env = env.trusted_keys()
    env_keys = frozenset(read_public_key(s) for s in from_env) if from_env is not None else None
    if trusted_keys is None:
        return env_keys
    if isinstance(trusted_keys, (str, os.PathLike)):
        trusted_keys = [trusted_keys]  # one key given bare, not its characters
    keys = frozenset(read_public_key(s) for s in trusted_keys)
    if not keys:
        raise ConfigError("trusted_keys: expected at least one public key (.pub file or 64 hex digits), got an empty "
                          "list; pass the keys, or trusted_keys=None for the environment's policy "
                          "(FLYSHIP_TRUSTED_KEYS)")
    if env_keys is not None and not keys <= env_keys:
        extra = ", ".join(sorted(k[:16] + "..." for k in keys - env_keys))
        raise ConfigError(f"trusted_keys: expected keys among FLYSHIP_TRUSTED_KEYS (an argument may narrow the "
                          f"environment's policy, never widen it), got also {extra}; add them to "
                          "FLYSHIP_TRUSTED_KEYS, or leave trusted_keys out")
    return keys


def verify(index: bytes, sig_member: bytes | None, trusted: frozenset[str], where: str) -> str:
    """Check that ``sig_member`` is a valid signature of ``index`` by one of the ``trusted`` keys.

    Returns:
        The hex public key that signed.

    Raises:
        BundleError: no signature, a malformed one, a key not trusted, a signature that does not verify.
    """
    ed25519, _ = _crypto()
    keys = ", ".join(sorted(k[:16] + "..." for k in trusted))
    if sig_member is None:
        raise BundleError(f"open packed bundle {where}: expected a pack signed by a trusted key ({keys}), got an "
                          "unsigned pack; sign it with `flyship pack --sign KEY`, or unset FLYSHIP_TRUSTED_KEYS")
    try:
        sig = _files.parse_json(sig_member, what=SIG_NAME, limit=_limits.MAX_RECORD_BYTES)
        ok = (isinstance(sig, dict) and sig.get("format") == SIG_FORMAT and type(sig.get("version")) is int
              and sig["version"] == 1 and sig.get("algorithm") == "ed25519"
              and isinstance(sig.get("public_key"), str) and _HEX_KEY.match(sig["public_key"]))
        signature = bytes.fromhex(sig["signature"]) if ok and isinstance(sig.get("signature"), str) else b""
        ok = ok and len(signature) == 64
    except (BundleError, ValueError, KeyError):
        ok = False
    if not ok:
        raise BundleError(f"open packed bundle {where}: {SIG_NAME} is not an ed25519 {SIG_FORMAT} record; the file "
                          "is damaged or was altered")
    key = sig["public_key"]
    if key not in trusted:
        raise BundleError(f"open packed bundle {where}: expected a signature by a trusted key ({keys}), got one by "
                          f"the unknown key {key}; add its .pub to trusted_keys / FLYSHIP_TRUSTED_KEYS if you trust "
                          "its owner")
    from cryptography.exceptions import InvalidSignature

    try:
        ed25519.Ed25519PublicKey.from_public_bytes(bytes.fromhex(key)).verify(signature, index)
    except InvalidSignature:
        raise BundleError(f"open packed bundle {where}: the signature by key {key} does not match the pack's index; "
                          "the file was altered after it was signed") from None
    return key
