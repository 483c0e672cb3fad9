"""The Triton frontend (NVIDIA and AMD targets). Importing this package registers it; nothing here imports
``triton`` until a worker compiles."""

from flyship.compiler.frontends import register
from flyship.compiler.frontends.triton.frontend import TritonFrontend

FRONTEND = register(TritonFrontend())
