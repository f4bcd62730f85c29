"""Rotary position embedding shared by both implementations (the same math, so they differ
only by rounding).

>>> import torch
>>> cos, sin = rotary_tables(8, 4, 10000.0, torch.device("cpu"), torch.float32)
>>> cos.shape
torch.Size([8, 4])
"""

from __future__ import annotations

import torch


def rotary_tables(seq_len: int, head_dim: int, theta: float, device: torch.device,
                  dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables of shape (seq_len, head_dim) in the rotate-half layout."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    t = torch.arange(seq_len, device=device, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` of shape (B, H, T, hd) by position."""
    return x * cos + rotate_half(x) * sin
