"""flyship: compile FlyDSL (and Triton) kernels in one Python, run them as torch ops in another.

The workload side needs torch and ninja only::

    import flyship
    ops = flyship.load("artifacts/examples")
    y = ops.softmax(x)

The compile side is the ``flyc-build`` command (``flyship.compiler``), run under the Python that
has FlyDSL.
"""

__version__ = "0.1.0"


def load(path, **kwargs):
    """Load a bundle and register its ops with torch; see :func:`flyship.loader.load`."""
    from flyship.loader import load as _load

    return _load(path, **kwargs)


# The drop-in API, imported on first use (``import flyship`` stays light: a .pth hook imports it at start-up).
_LAZY = {
    "patch": "flyship.loader.patch", "Patch": "flyship.loader.patch", "PatchError": "flyship.loader.patch",
    "Const": "flyship.loader.patch", "Prepared": "flyship.loader.patch",
    "routing_report": "flyship.loader.report", "bench": "flyship.loader.bench",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'flyship' has no attribute {name!r}")


__all__ = ["__version__", "load", *_LAZY]
