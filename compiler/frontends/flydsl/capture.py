"""Take what flyship needs from ONE normal FlyDSL compile, without FlyDSL's IR dump mode.

flyship needs three artefacts of a FlyDSL compile: the final ISA text (what it assembles), FlyDSL's own
code object (what it proves its assembly equal to) and the launcher's host function once its arguments are
lowered (grid expressions and kernarg bindings, :mod:`.host_ir`). FlyDSL's dump mode (``FLYDSL_DUMP_IR=1``)
writes all three, but runs each of ~20 pipeline stages as its own pass manager, prints the whole module
with debug info after each, and runs the LLVM backend a second time for the ISA: about half of flyship's
build time (docs/perf.md). Here FlyDSL compiles as it does for any user, and flyship watches:

* **The pipeline.** Every release from 0.1.5 to 0.5.0 lowers a launcher with one
  ``PassManager.parse("builtin.module(<fragments>)")`` and ``pm.run(module)`` in
  ``flydsl.compiler.jit_function`` (module global ``PassManager``). While :func:`capturing` is active that
  name is a shim: the pipeline that holds ``gpu-module-to-binary`` runs the same fragments in the same order
  on the same module, split into a few pass managers (one per fragment until the host function's arguments
  are lowered, as FlyDSL's own dump and external-codegen modes split them; then the rest before the binary
  step; then the binary step), with the verifier and printing settings FlyDSL made. Between them flyship only
  reads: the host function's argument types before the pipeline, a detached clone of the host function after
  the first fragment that lowers its arguments (the stage ``host_ir.find_stages`` picks in a dump), and the
  ``gpu.binary`` objects at the end. (A Python-defined pass between fragments would do the same reading but
  costs a whole-module verification after each, the verifier being on: measured ~10% of a compile.)
* **The ISA.** MLIR's ROCDL serializer prints the ISA it is about to assemble under the LLVM debug type
  ``serialize-to-isa`` (``ISA for module: "<name>"`` + the text; LLVM_DEBUG is compiled into every FlyDSL
  wheel). With that one debug type on and file descriptor 2 sent to a file while the binary step runs,
  flyship gets the exact text FlyDSL's own code object was assembled from, from the same backend run (the
  dump mode's ``final_isa.s`` came from a second run). Everything else written to stderr meanwhile is
  written back to stderr afterwards.

Only the frontend calls this, inside a worker; it imports ``flydsl`` lazily.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import sys
import tempfile
from typing import Any, Callable, Iterator

from flyship.compiler.frontends.base import FrontendError

ISA_DEBUG_TYPE = "serialize-to-isa"  # mlir/lib/Target/LLVM/ROCDL/Target.cpp: DEBUG_TYPE around the ISA print
LLVM_DEBUG_TYPE = "serialize-to-llvm"  # the same file: DEBUG_TYPE around the print of the LLVM IR it compiles
_ISA_HEADER_RE = re.compile(r'^ISA for module: "[^"\n]*"\n', re.M)
_LLVM_HEADER_RE = re.compile(r'^LLVM IR for module: "?[^"\n]*"?\n', re.M)
_ISA_END_RE = re.compile(r"^[ \t]*\.end_amdgpu_metadata[ \t]*\n", re.M)
_BINARY_PASS = "gpu-module-to-binary"


@dataclasses.dataclass
class Compile:
    """What one FlyDSL compile pipeline showed flyship.

    Attributes:
        isa: the ISA text of each module the ROCDL serializer assembled, in order (one per ``#gpu.object``).
        llvm_ir: the LLVM IR of each module the serializer compiled to that ISA, in order (what flyship reads
            for the stores a kernel makes, :mod:`flyship.compiler.frontends.writes`); empty when this FlyDSL
            does not print it.
        objects: FlyDSL's own code objects, ``(target attribute text, bytes)`` per ``#gpu.object``.
        origin_types: host function name -> its argument types before the pipeline (``!fly.memref<...>``).
        lowered: host function name -> a detached clone of it after the first fragment that left none of its
            arguments with a ``!fly.`` type (and that still launches with ``gpu.launch_func``).
    """

    isa: list[str] = dataclasses.field(default_factory=list)
    llvm_ir: list[str] = dataclasses.field(default_factory=list)
    objects: list[tuple[str, bytes]] = dataclasses.field(default_factory=list)
    origin_types: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    lowered: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Capture:
    """Every compile pipeline FlyDSL ran while :func:`capturing` was active, in order (one per launcher
    compiled: an entry point that calls two launchers gives two)."""

    compiles: list[Compile] = dataclasses.field(default_factory=list)

    @property
    def pipelines(self) -> int:
        return len(self.compiles)


def split_pipeline(pipeline: str) -> list[str]:
    """``"builtin.module(a,b{x=1 y=\"p,q\"},gpu.module(c,d))"`` -> ``["a", "b{...}", "gpu.module(c,d)"]``.

    Raises:
        FrontendError: the text is not one ``builtin.module(...)`` with balanced brackets and quotes.
    """
    text = pipeline.strip()
    head = "builtin.module("
    if not text.startswith(head) or not text.endswith(")"):
        raise FrontendError(f"FlyDSL pipeline: expected 'builtin.module(<passes>)', got {pipeline[:80]!r}")
    body = text[len(head):-1]
    parts, depth, quoted, start = [], 0, False, 0
    for i, ch in enumerate(body):
        if quoted:
            quoted = ch != '"'
        elif ch == '"':
            quoted = True
        elif ch in "({":
            depth += 1
        elif ch in ")}":
            depth -= 1
            if depth < 0:
                break
        elif ch == "," and depth == 0:
            parts.append(body[start:i].strip())
            start = i + 1
    if depth != 0 or quoted:
        raise FrontendError(f"FlyDSL pipeline: unbalanced brackets or quotes in {pipeline[:120]!r}")
    parts.append(body[start:].strip())
    return [p for p in parts if p]


def _host_funcs(module_op: Any) -> list[Any]:
    return [op for op in module_op.regions[0].blocks[0].operations if op.operation.name == "func.func"]


def _func_name(func: Any) -> str:
    return str(func.operation.attributes["sym_name"]).strip('"')


def _arg_types(func: Any) -> list[str]:
    return [str(a.type) for a in func.regions[0].blocks[0].arguments if "async.token" not in str(a.type)]


def _launches(func: Any) -> bool:
    return any(o.operation.name == "gpu.launch_func" for o in func.regions[0].blocks[0].operations)


def _observe_origin(module_op: Any, capture: Compile) -> None:
    for f in _host_funcs(module_op):
        capture.origin_types[_func_name(f)] = _arg_types(f)


def _observe_lowered(module_op: Any, capture: Compile) -> bool:
    """Clone each host function the first time its arguments are all lowered; True when every one is."""
    pending = False
    for f in _host_funcs(module_op):
        name = _func_name(f)
        if name in capture.lowered or name not in capture.origin_types:
            continue
        if _launches(f) and not any(t.startswith("!fly.") for t in _arg_types(f)):
            capture.lowered[name] = f.operation.clone(ip=False)
        else:
            pending = True
    return not pending


def _observe_binaries(module_op: Any, capture: Compile) -> None:
    from flydsl._mlir.dialects import gpu

    for b in module_op.regions[0].blocks[0].operations:
        if b.operation.name == "gpu.binary":
            for attr in b.operation.attributes["objects"]:
                obj = gpu.ObjectAttr(attr)
                capture.objects.append((str(obj.target), bytes(obj.object)))


@contextlib.contextmanager
def _stderr_to_file() -> Iterator[Callable[[], str]]:
    """Send file descriptor 2 to a temporary file while the block runs; yields a reader of what was written.

    In a lone worker (a task rerun alone after a crash) the file is the named one the build reads when the worker
    dies (:func:`flyship.compiler.hygiene.step_stderr_file`): a native abort inside the block (``LLVM ERROR: ...``
    then abort, no Python unwinding) would otherwise take its words with the anonymous file."""
    from flyship.compiler import hygiene

    sys.stderr.flush()
    saved = os.dup(2)
    named = hygiene.step_stderr_file()
    tmp = open(named, "w+b") if named else tempfile.TemporaryFile(mode="w+b")
    os.dup2(tmp.fileno(), 2)
    try:
        yield lambda: (tmp.seek(0), tmp.read())[1].decode("utf-8", "replace")
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        tmp.close()
        if named:
            with contextlib.suppress(OSError):
                os.unlink(named)


def split_isa(text: str) -> tuple[list[str], str]:
    """The ISA blocks the ROCDL serializer printed, and the rest of the text (to write back to stderr).

    Each block is the text after ``ISA for module: "<name>"`` up to and including its
    ``.end_amdgpu_metadata`` line (the last directive of an AMDHSA ISA file); the newline the print adds
    after it is dropped, so a block is byte-identical to the dump mode's ``NN_final_isa.s``.
    """
    isas, rest, pos = [], [], 0
    for m in _ISA_HEADER_RE.finditer(text):
        if m.start() < pos:
            continue
        end = _ISA_END_RE.search(text, m.end())
        if end is None:
            break
        rest.append(text[pos:m.start()])
        isas.append(text[m.end():end.end()])
        pos = end.end() + (1 if text[end.end():end.end() + 1] == "\n" else 0)
    rest.append(text[pos:])
    return isas, "".join(rest)


def split_llvm_ir(text: str) -> tuple[list[str], str]:
    """The LLVM IR modules the serializer printed (``LLVM IR for module: <name>`` + the module, up to the next
    ``ISA for module`` / ``LLVM IR for module`` header or the end), and the rest of the text."""
    blocks, rest, pos = [], [], 0
    for m in _LLVM_HEADER_RE.finditer(text):
        if m.start() < pos:
            continue
        nxt = [x.start() for x in (_ISA_HEADER_RE.search(text, m.end()), _LLVM_HEADER_RE.search(text, m.end())) if x]
        end = min(nxt, default=len(text))
        rest.append(text[pos:m.start()])
        blocks.append(text[m.end():end])
        pos = end
    rest.append(text[pos:])
    return blocks, "".join(rest)


class _ObservedPassManager:
    """Stands in for the ``PassManager`` FlyDSL parses its compile pipeline into; records the settings FlyDSL
    makes and, on :meth:`run`, runs the same fragments in the same order, reading the module in between.

    The fragments up to the one that lowers the host function's arguments run one pass manager each (as
    FlyDSL's own dump and external-codegen modes split them), the rest up to ``gpu-module-to-binary`` in one,
    the binary step in one; nothing is added to the pipeline (a Python pass would cost a whole-module
    verification after it, the verifier being on).
    """

    def __init__(self, real: type, pipeline: str, context: Any, capture: Capture):
        self._real, self._context, self._capture = real, context, capture
        self._fragments = split_pipeline(pipeline)
        self._settings: list[tuple[str, tuple, dict]] = []

    def __getattr__(self, name: str) -> Callable[..., None]:
        if name.startswith("enable_"):  # enable_verifier, enable_ir_printing, enable_timing, ...
            return lambda *a, **k: self._settings.append((name, a, k))
        raise AttributeError(name)

    def _run(self, fragments: list[str], op: Any, args: tuple, kwargs: dict) -> None:
        text = f"builtin.module({','.join(fragments)})"
        pm = self._real.parse(text, context=self._context) if self._context is not None else self._real.parse(text)
        for name, a, k in self._settings:
            getattr(pm, name)(*a, **k)
        pm.run(op, *args, **kwargs)

    def run(self, op: Any, *args: Any, **kwargs: Any) -> None:
        capture, frags = Compile(), self._fragments
        self._capture.compiles.append(capture)
        _observe_origin(op, capture)
        binary = next((k for k, f in enumerate(frags) if f.startswith(_BINARY_PASS)), len(frags))
        i, lowered = 0, False
        while i < binary and not lowered:
            self._run(frags[i:i + 1], op, args, kwargs)
            i += 1
            lowered = _observe_lowered(op, capture)
        if i < binary:
            self._run(frags[i:binary], op, args, kwargs)
        if binary < len(frags):
            self._run_printing_isa(frags[binary:], op, args, kwargs, capture)
        _observe_binaries(op, capture)

    def _run_printing_isa(self, fragments: list[str], op: Any, args: tuple, kwargs: dict, capture: Compile) -> None:
        """Run the binary step with the one LLVM debug type on (only here: LLVM_DEBUG sites cost a check of
        the type list once the global flag is set) and stderr in a file; keep the ISA blocks it printed."""
        from flydsl._mlir import ir

        debug = ir._GlobalDebug
        was, rest = debug.flag, ""
        try:
            with _stderr_to_file() as read:
                debug.set_types([ISA_DEBUG_TYPE, LLVM_DEBUG_TYPE])
                debug.flag = True
                try:
                    self._run(fragments, op, args, kwargs)
                finally:
                    debug.flag = was
                    llvm_ir, rest = split_llvm_ir(read())
                    isas, rest = split_isa(rest)
                    capture.isa.extend(isas)
                    capture.llvm_ir.extend(llvm_ir)
        finally:
            if rest:  # whatever else reached stderr meanwhile (a linker warning, an LLVM message)
                sys.stderr.write(rest)


@contextlib.contextmanager
def capturing() -> Iterator[Capture]:
    """While the block runs, FlyDSL's compile pipelines are observed (module docstring); yields the
    :class:`Capture` they fill.

    Raises:
        FrontendError: this FlyDSL has no ``jit_function.PassManager`` to observe.
    """
    from flydsl.compiler import jit_function

    real = getattr(jit_function, "PassManager", None)
    if real is None:
        raise FrontendError("FlyDSL compile: expected flydsl.compiler.jit_function.PassManager (every release from "
                            "0.1.5 to 0.5.0 has it), got none; the version adapter does not fit this release")
    capture = Capture()

    class PassManagerShim:
        """``PassManager`` for FlyDSL's module while flyship captures: its compile pipeline is observed."""

        def __new__(cls, *args: Any, **kwargs: Any) -> Any:
            return real(*args, **kwargs)

        @staticmethod
        def parse(pipeline: str, *args: Any, **kwargs: Any) -> Any:
            if _BINARY_PASS not in pipeline or not pipeline.strip().startswith("builtin.module("):
                return real.parse(pipeline, *args, **kwargs)
            context = kwargs.get("context", args[0] if args else None)
            return _ObservedPassManager(real, pipeline, context, capture)

    jit_function.PassManager = PassManagerShim
    try:
        yield capture
    finally:
        jit_function.PassManager = real


__all__ = ["Capture", "Compile", "capturing", "split_isa", "split_llvm_ir", "split_pipeline", "ISA_DEBUG_TYPE",
           "LLVM_DEBUG_TYPE"]
