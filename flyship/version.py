"""flyship's version, in a module of its own: what reads it (the build cache, the manifest's build info, the plan
cache's key) imports this, never the ``flyship`` package, whose ``load`` imports the loader."""

__version__ = "0.1.0"
