"""``flyship check FILE``: everything a deploy step can know about a pack before it ships, with an exit code per
kind of refusal, so CI can gate on it.

It checks, without a GPU, torch or a compiler: the pack's signature against the trusted keys (``--trusted-key``,
else ``FLYSHIP_TRUSTED_KEYS``), every member against the pack's sha256 index, the manifest against the rule book,
every code object against its sha256 and variant; then it says which targets the bundle holds and, per op, on which
device targets it would launch kernels (the rest runs its PyTorch reference).

Exit codes (docs/shipping.md, "Checking a pack in CI"):

    0  the pack is sound (and signed by a trusted key when keys are given)
    1  not a pack / a bundle that breaks a rule (the message says which)
    2  a usage error (click's)
    3  unsigned, while trusted keys are given
    4  damaged or altered: a signature that does not verify, a member that differs from the index, a bad archive
    5  signed, but by a key that is not trusted
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path
from typing import Iterable

from flyship.bundle import manifest as _m
from flyship.bundle import pack as _pack
from flyship.bundle import rules as _rules
from flyship.bundle import signing as _signing
from flyship.bundle import targets as _targets
from flyship.errors import BundleError, FlyshipError

# A refusal is a BundleError whose kind names it (flyship/errors.py: words, not a class per failure); its exit code:
EXIT_CODES = {"PackInvalid": 1, "PackUnsigned": 3, "PackAltered": 4, "PackUntrusted": 5}


def exit_code(e: FlyshipError) -> int:
    """The exit code of a refusal :func:`check` raised (1 for any other flyship error)."""
    return EXIT_CODES.get(e.kind, 1)


@dataclasses.dataclass(frozen=True)
class CheckReport:
    path: Path
    signer: str | None  # the key that signed (verified), None when unsigned
    trusted: bool  # the signer is one of the trusted keys (False when no keys were given)
    manifest: _m.Manifest
    devices: tuple[str, ...]  # the device targets the op table is for

    def text(self) -> str:
        m = self.manifest
        if self.signer is None:
            sig = "unsigned (no trusted keys given: not required)"
        else:
            sig = f"signed by {self.signer} ({'trusted' if self.trusted else 'valid, but no trusted keys given'})"
        lines = [f"{self.path}: OK", f"  signature: {sig}",
                 f"  members: every sha256 matches the index; manifest and code objects pass the rule book",
                 f"  namespace {m.namespace}, schema {m.schema_version}, built by flyship {m.build.flyship_version}",
                 f"  targets: {', '.join(m.targets)}", "  ops (kernels per device target; the rest runs the reference):"]
        width = max([len(op.name) for op in m.ops] + [len(c.name) for c in m.composites] + [4])
        for op in m.ops:
            cells = []
            for d in self.devices:
                n = sum(1 for s in op.specializations if any(_targets.is_compatible(v.target, d) for v in s.variants))
                cells.append(f"{d}: {n}/{len(op.specializations)} specs")
            back = f"  (backward: {op.backward.op})" if op.backward is not None else ""
            lines.append(f"    {op.name.ljust(width)}  {'; '.join(cells)}{back}")
        for c in m.composites:
            lines.append(f"    {c.name.ljust(width)}  composite (torch code over this bundle's ops)")
        return "\n".join(lines)


def _verify_signature(path: Path, keys: frozenset[str] | None) -> tuple[str | None, frozenset[str] | None]:
    """(the signer, the keys open_pack must verify against): refusals for unsigned / untrusted before anything."""
    try:
        signer = _pack.signer(path)
    except BundleError as e:
        raise BundleError(str(e), kind="PackAltered") from None
    if keys is not None and signer is None:
        raise BundleError(f"flyship check {path}: expected a pack signed by a trusted key ({len(keys)} given), got an "
                          "unsigned pack; sign it: `flyc-build ... --pack --sign KEY` or `flyship pack BUNDLE -o F "
                          "--sign KEY`", kind="PackUnsigned")
    if keys is not None and signer not in keys:
        raise BundleError(f"flyship check {path}: expected a signature by a trusted key, got one by {signer}; sign "
                          "with a trusted key, or trust this key's .pub if you trust its owner", kind="PackUntrusted")
    # Without trusted keys a signed pack is still checked against its own key: altered bytes are caught either way.
    return signer, keys if keys is not None else (frozenset({signer}) if signer else None)


def check(path: Path | str, trusted_keys: Iterable[str | os.PathLike] | None = None,
          devices: Iterable[str] = ()) -> CheckReport:
    """Check the pack ``path`` (see the module docstring).

    Args:
        path: a ``.flyship`` file.
        trusted_keys: public keys (hex or ``.pub`` files); None: ``FLYSHIP_TRUSTED_KEYS``; empty: none.
        devices: device target IDs for the op table (default: the bundle's own targets).

    Raises:
        BundleError: the refusal, its ``kind`` one of :data:`EXIT_CODES` (:func:`exit_code`).
    """
    p = Path(path)
    if p.is_dir() or not _pack.is_pack(p):
        raise BundleError(f"flyship check: expected a packed bundle (a .flyship file), got {p} (not a zip archive); "
                          "pack the bundle folder with `flyship pack BUNDLE -o FILE`", kind="PackInvalid")
    for d in devices:
        _targets.parse_target(d)  # a misspelt target: a BundleError listing the accepted forms
    keys = _signing.policy(trusted_keys)
    signer, verify_with = _verify_signature(p, keys)
    with tempfile.TemporaryDirectory(prefix="flyship-check-") as cache:  # nothing of it outlives the check
        try:
            # None: no signature required (no policy: an unsigned pack, no keys given or set)
            root = _pack.open_pack(p, cache=cache, trusted_keys=sorted(verify_with) if verify_with else None)
        except BundleError as e:  # the signature does not verify, a member differs, the archive is damaged
            raise BundleError(str(e), kind="PackAltered") from None
        try:
            manifest = _m.read(root)
            _rules.check_bundle(root, manifest)
        except FlyshipError as e:
            raise BundleError(str(e), kind="PackInvalid") from None
    return CheckReport(p, signer, keys is not None, manifest, tuple(devices) or tuple(manifest.targets))
