"""A tests-only frontend with a bug: tinydsl's frontend (tests/compiler/tiny_frontend.py) whose compile step raises a
KeyError, as a frontend's own bug would (a dict lookup that misses). Importing this module registers it as "buggy";
tests/compiler/test_bug_reports.py shows that such a bug reaches the user with its traceback, from a spawned worker.
"""

from __future__ import annotations

from typing import Any

from flyship.compiler import frontends
from flyship.compiler.frontends import BuildContext, KernelBuild
from flyship.compiler.spec import OpDecl, Spec
from tests.compiler.tiny_frontend import TinyFrontend


class BuggyKernel:
    """What the buggy DSL's decorator returns (not a TinyKernel: the tiny frontend must not take it)."""

    __name__ = "buggy_vadd"


class BuggyFrontend(TinyFrontend):
    name = "buggy"
    title = "buggy tinydsl kernel"
    packages = ("buggydsl",)
    env_prefixes = ("BUGGYDSL_",)
    env_names = ()

    def accepts(self, kernel: Any) -> bool:
        return isinstance(kernel, BuggyKernel)

    def compile(self, op: OpDecl, spec: Spec, target: str, ctx: BuildContext) -> KernelBuild:
        return self._lower({"vadd": "ok"}, op.name)

    def _lower(self, table: dict[str, str], name: str) -> KernelBuild:
        return table[name + "_lowered"]  # the bug: a key this table never has


FRONTEND = frontends.register(BuggyFrontend())
