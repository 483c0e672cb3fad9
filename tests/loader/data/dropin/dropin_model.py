"""A stand-in for a user's model code, patched by the drop-in tests (importable as ``dropin_model``).

Every original function records its calls in ``CALLS`` so a test can tell the original from the op.
"""

import torch

CALLS: list[str] = []


def add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    CALLS.append("add")
    return a + b


def add_into(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    CALLS.append("add_into")
    torch.add(a, b, out=out)


def add_masked(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    CALLS.append("add_masked")
    return (a + b) * mask


def add_scaled(a: torch.Tensor, b: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    CALLS.append("add_scaled")
    return (a + b) * scale


class Scale(torch.nn.Module):
    """hidden * alpha + bias, with alpha a module attribute."""

    def __init__(self, alpha: float) -> None:
        super().__init__()
        self.alpha = alpha

    def forward(self, hidden: torch.Tensor, bias: int = 0) -> torch.Tensor:
        CALLS.append("Scale.forward")
        return hidden * self.alpha + bias


class Block(torch.nn.Module):
    """A small model that calls the patched pieces: a linear layer, Scale, and ``add`` as a residual."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(n, n)
        self.scale = Scale(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.scale(torch.relu(self.lin(x)))
        return add(h.flatten(), x.flatten()).view_as(x)


def bench_case() -> tuple:
    """The factory ``flyship bench dropin_model:bench_case`` times: (fn, args)."""
    torch.manual_seed(0)
    return Block(4), (torch.randn(3, 4),)


class Util:
    @staticmethod
    def add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        CALLS.append("Util.add")
        return a + b
