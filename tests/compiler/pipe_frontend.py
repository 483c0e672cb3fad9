"""A tests-only frontend that marks its trace (``pipelined``): "tinypipe", the tiny frontend whose compile holds
``ctx.trace_slot`` for a timed trace, then spends as long again outside it (as the FlyDSL frontend's assembler and
proof do), writing both intervals to ``$TINYPIPE_LOG``. Importing this module registers it."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from flyship.compiler import frontends
from flyship.compiler.frontends import BuildContext, KernelBuild
from flyship.compiler.spec import OpDecl, Spec
from tests.compiler.tiny_frontend import TinyFrontend

STEP_S = 0.4


class PipeKernel:
    __name__ = "pipe_vadd"


class PipeFrontend(TinyFrontend):
    name = "tinypipe"
    pipelined = True

    def accepts(self, kernel: Any) -> bool:
        return isinstance(kernel, PipeKernel)

    def compile(self, op: OpDecl, spec: Spec, target: str, ctx: BuildContext) -> KernelBuild:
        with ctx.trace_slot():
            t0 = time.time()
            time.sleep(STEP_S)
            t1 = time.time()
        time.sleep(STEP_S)  # "assembly and proof": outside the slot
        with open(os.environ["TINYPIPE_LOG"], "a") as f:
            f.write(json.dumps({"spec": spec.name, "pid": os.getpid(), "trace": [t0, t1], "end": time.time()}) + "\n")
        return super().compile(op, spec, target, ctx)


FRONTEND = frontends.register(PipeFrontend())
