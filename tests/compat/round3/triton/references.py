# Frozen compatibility corpus (tests/compat/README.md): do not edit.
import torch


def mul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * w


def mul_inc(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * w + 1
