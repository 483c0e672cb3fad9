"""A builder's wrapper given as ``kernel=``: the spec API asks the frontends which DSL launcher a plain Python
function reaches (kept apart from :mod:`.params`, which the frontends import, so the declarations never import the
frontends that read them)."""

from __future__ import annotations

import inspect
from typing import Any

from flyship.compiler.spec.params import Entry
from flyship.errors import SpecError


def builder_entry(op_name: str, kernel: Any) -> Any:
    """A builder's returned wrapper given as ``kernel=`` (a plain Python function that calls a DSL launcher it
    closes over or reads from its module, as FlyDSL's RoPE / attention builders return) becomes the
    :func:`entry` it is; any other kernel is returned as given. A plain function that reaches no launcher is
    refused naming the op and the fix."""
    from flyship.compiler import frontends

    if isinstance(kernel, Entry) or not inspect.isfunction(kernel) or frontends.detect(kernel) is not None:
        return kernel
    code = kernel.__code__
    reached = [c.cell_contents for c in (kernel.__closure__ or ()) if _filled(c)]
    reached += [kernel.__globals__[n] for n in code.co_names if n in kernel.__globals__]
    name = getattr(kernel, "__qualname__", repr(kernel))
    for obj in reached:
        fe = frontends.detect(obj)
        if fe is not None and fe.accepts(Entry(kernel, fe.name)):
            return Entry(kernel, fe.name)
        if fe is not None:
            raise SpecError(f"op {op_name}: kernel= is the plain Python function {name!r}, which calls a {fe.title}; "
                            f"{fe.name} ops name the kernel itself (kernel=<the kernel>), not a Python wrapper")
    raise SpecError(f"op {op_name}: kernel= is the plain Python function {name!r}, expected a DSL launcher or "
                    f"entry(...); it reaches no launcher flyship can see (none in its closure or module globals). If "
                    f"it calls one through another object (a builder's wrapper), declare "
                    f"kernel=entry({name.split('.')[-1]}) (from flyship.compiler.spec import entry); else name the "
                    "launcher itself")


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # an empty cell (a name assigned after the closure was made)
        return False
    return True
