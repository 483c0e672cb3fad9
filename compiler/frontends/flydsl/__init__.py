"""The FlyDSL frontend (AMD targets): the frontend itself (``frontend``), the launcher's host IR
(``host_ir``; its printed types read by ``host_types``, its values by ``host_values``), flyship's own assembly
of FlyDSL's ISA (``assemble``), the proof against FlyDSL's binary (``proof``) and what differs between FlyDSL
releases (``versions``). Importing this package registers the frontend; nothing here imports ``flydsl`` until a
worker compiles. A spec that needs a newer FlyDSL than the oldest supported says so with :func:`requires`
(``requires("0.5.0", "fx.struct")``)."""

from flyship.compiler.frontends import register
from flyship.compiler.frontends.flydsl.frontend import FlydslFrontend
from flyship.compiler.frontends.flydsl.versions import requires

__all__ = ["FRONTEND", "requires"]

FRONTEND = register(FlydslFrontend())
