"""flyship: compile FlyDSL (and Triton) kernels in one Python, run them as torch ops in another.

The workload side needs torch and ninja only::

    import flyship
    ops = flyship.load("artifacts/examples")
    y = ops.softmax(x)

The compile side is the ``flyc-build`` command (``flyship.compiler``), run under the Python that
has FlyDSL.
"""

from flyship.version import __version__


def _source_tree_root(package_dir: str) -> str | None:
    """The checkout root when this ``flyship/`` folder is the one in a source tree, else None.

    In a checkout the subpackages are sibling folders (``loader/``, ``bundle/``, ``compiler/``, ``csrc/``) that
    ``setup.py`` maps onto ``flyship.*`` at install time. A Python started in the checkout's root puts the root on
    ``sys.path`` first, so it imports this folder rather than the installed package; extending ``__path__`` to the
    root makes ``flyship.loader`` etc. resolve to the siblings, so such a Python gets a whole, consistent flyship
    (the checkout's own), installed or not, editable or not. An installed package's parent (site-packages) never
    holds this layout, so nothing changes there.
    """
    import os.path

    root = os.path.dirname(package_dir)
    marks = ("setup.py", os.path.join("loader", "__init__.py"), os.path.join("bundle", "__init__.py"),
             os.path.join("compiler", "__init__.py"))
    if all(os.path.isfile(os.path.join(root, m)) for m in marks):
        return root
    return None


_root = _source_tree_root(__path__[0])  # noqa: F821 (a package's __path__)
if _root is not None and _root not in __path__:  # noqa: F821
    __path__.append(_root)  # noqa: F821
del _root


def load(path, **kwargs):
    """Load a bundle and register its ops with torch; see :func:`flyship.loader.load`."""
    from flyship.loader import load as _load

    return _load(path, **kwargs)


# The drop-in API, imported on first use (``import flyship`` stays light: a .pth hook imports it at start-up).
_LAZY = {
    "patch": "flyship.loader.tools.patch", "Patch": "flyship.loader.tools.patch", "PatchError": "flyship.loader.tools.patch",
    "Const": "flyship.loader.tools.patch", "Prepared": "flyship.loader.tools.patch",
    "routing_report": "flyship.loader.tools.report", "bench": "flyship.loader.tools.bench",
    # the recording driver's public face: a bundle's real call path on a CPU-only machine (docs/loader.md)
    "dry_run": "flyship.loader.record", "DryRun": "flyship.loader.record", "RecordedLaunch": "flyship.loader.record",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'flyship' has no attribute {name!r}")


__all__ = ["__version__", "load", *_LAZY]
