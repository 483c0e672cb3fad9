"""PyTorch references of the tiny test bundle's ops (imports torch only)."""

import torch


def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x + y


def scale_rows(x: torch.Tensor, alpha: float = 1.0, bias: int = 0) -> torch.Tensor:
    return x * alpha + bias


def addsub(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x + y, x - y
