"""The FlyDSL frontend (AMD targets): the frontend itself (``frontend``), the launcher's host IR
(``host_ir``), flyship's own assembly of FlyDSL's ISA (``assemble``) and the proof against FlyDSL's
binary (``proof``). Importing this package registers the frontend; nothing here imports ``flydsl``
until a worker compiles."""

from flyship.compiler.frontends import register
from flyship.compiler.frontends.flydsl.frontend import FlydslFrontend

FRONTEND = register(FlydslFrontend())
