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


__all__ = ["__version__", "load"]
