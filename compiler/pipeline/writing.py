"""Writing the bundle atomically, and the whole-build cache entry that lets an unchanged build write it again
without importing the spec."""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Optional

from flyship.bundle import files as _files
from flyship.bundle import manifest as M
from flyship.bundle import rules as _rules
from flyship.compiler import cache as _cache
from flyship.compiler import hygiene as _hygiene
from flyship.compiler import signals as _signals
from flyship.compiler import toolchain as _tc
from flyship.compiler.pipeline.assembling import assemble_manifest, frontend_versions, offload_bundles
from flyship.compiler.pipeline.options import BuildOptions, Row
from flyship.compiler.pipeline.planning import check_replaceable
from flyship.compiler.spec import SpecFile
from flyship.errors import CompileError


def write_bundle(m: M.Manifest | bytes, files: dict[str, bytes], out_dir: Path, force: bool) -> None:
    """Write into a staging sibling folder, read it back, then move it into place (swapped atomically with an
    existing bundle under ``force``): a failure leaves ``out_dir`` as it was and no staging folder."""
    out_dir = out_dir.resolve()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{_hygiene.staging_prefix(out_dir)}{os.getpid()}-", dir=out_dir.parent))
    with _signals.on_abort(lambda: shutil.rmtree(tmp, ignore_errors=True)):  # a stop inside a native import
        try:
            # mkdtemp makes the folder private (0700); a bundle is shipped and read by other users (a container's
            # runtime user), so give it the permissions an ordinary folder gets under this umask.
            os.chmod(tmp, 0o777 & ~_files.umask())
            for name, data in sorted(files.items()):
                (tmp / name).write_bytes(data)
            if isinstance(m, bytes):  # from the build cache: its blobs were sha256-checked when read
                (tmp / M.MANIFEST_NAME).write_bytes(m)
            else:
                M.write(m, tmp / M.MANIFEST_NAME)
            written = M.read(tmp)  # what we wrote, fresh or cached, must read back (the rule book's own refusal) ...
            try:  # ... and pass every check the loader applies to the files
                _rules.check_bundle(tmp, written)
            except M.BundleError as e:
                raise CompileError(f"flyc-build: the bundle would be refused at load: {e}") from e
            if out_dir.exists() and not force:
                raise CompileError(f"flyc-build: output folder {out_dir} exists; pass --force to replace it")
            check_replaceable(out_dir)
            _hygiene.replace_dir(tmp, out_dir)
        except BaseException:
            with _signals.deferred():  # whole, even when a second signal arrives (compiler/signals.py)
                shutil.rmtree(tmp, ignore_errors=True)
            raise


def build_key(opts: BuildOptions, cache: _cache.BuildCache) -> str:
    """The whole-build key, known before the spec file is imported (tool versions are remembered by the cache,
    so a no-op rebuild starts no tool process)."""
    cache.load_tool_versions()
    try:
        tools = dict(_tc.find_toolchain(opts.llvm_bin).describe())
    except CompileError:
        tools = {}
    cache.save_tool_versions()
    return _cache.build_key(opts.spec_path, opts.archs, {"offload_bundle": opts.offload_bundle, "keep_ir": opts.keep_ir,
                                                         "code_object_version": opts.code_object_version}, tools)


def reuse_bundle(cache: _cache.BuildCache, key: str, out_dir: Path, force: bool,
                  progress: Callable[[str], None]) -> Optional[list[Row]]:
    """Write the cached bundle of an unchanged build (no spec import, no compile); None when there is none."""
    entry = cache.get_build(key)
    if entry is None or M.MANIFEST_NAME not in entry.files:
        return None
    write_bundle(entry.files[M.MANIFEST_NAME], {n: b for n, b in entry.files.items() if n != M.MANIFEST_NAME},
                 out_dir, force)
    progress(f"flyc-build: the spec and every file it reads are unchanged since a cached build; wrote its bundle "
             f"({len(entry.files)} files) without compiling")
    return [dataclasses.replace(Row(**r), cached=True) for r in entry.rows]


def remember_build(cache: _cache.BuildCache, key: str, deps: dict[str, str], spec_path: str, out_dir: Path,
                   rows: list[Row]) -> None:
    """Store the bundle just written with the files its spec read, for the next no-op rebuild."""
    deps = {**deps, str(Path(spec_path).resolve()): _cache.sha256_file(spec_path) or "unreadable"}
    written = {p.name: p.read_bytes() for p in sorted(out_dir.iterdir()) if p.is_file()}
    cache.put_build(key, deps, written, [dataclasses.asdict(r) for r in rows])


def write_results(sf: SpecFile, variants: dict, failures: tuple[M.Failure, ...], tools: dict[str, str],
                  toolchain: object, scratch: Path, out_dir: Path, opts: BuildOptions) -> None:
    """Offload bundles when asked, the manifest and its files from the variants, written to ``out_dir``."""
    offload, offload_files = offload_bundles(sf, variants, toolchain, scratch) if opts.offload_bundle else ({}, {})
    frontends_used = tuple(sorted({o.frontend for o in sf.ops}))
    m, files = assemble_manifest(sf, variants, tools, frontend_versions(frontends_used, variants), offload,
                                 offload_files, failures)
    write_bundle(m, {**files, **offload_files}, out_dir, opts.force)
