"""The FlyDSL frontend (AMD targets): the frontend itself (``frontend``), the launcher's host IR
(``host_ir``), flyship's own assembly of FlyDSL's ISA (``assemble``), the proof against FlyDSL's
binary (``proof``) and what differs between FlyDSL releases (``versions``). Importing this package
registers the frontend; nothing here imports ``flydsl`` until a worker compiles."""

from flyship.compiler.frontends import register
from flyship.compiler.frontends.flydsl.frontend import FlydslFrontend

FRONTEND = register(FlydslFrontend())
