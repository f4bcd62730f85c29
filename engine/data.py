"""Synthetic, learnable token sequences, deterministic per (seed, step) and split across ranks.

Each sequence follows ``x[t+1] = (a_k * x[t] + c_k) mod V`` for one of four rules ``k`` fixed
by the seed, with 5% noise tokens, so the loss falls as the model learns the rules. The global batch of a step is the same
whatever the rank count; rank ``r`` of ``n`` takes rows ``r*B/n .. (r+1)*B/n``.

>>> from probe.engine.config import get_preset
>>> x, y = make_batch(get_preset("tiny"), step=0, rank=0, world_size=2, seed=0)
>>> x.shape, y.shape
(torch.Size([4, 32]), torch.Size([4, 32]))
"""

from __future__ import annotations

import torch

from probe.engine.config import ModelConfig
from probe.ground.errors import ProbeError

N_RULES = 4


def make_batch(cfg: ModelConfig, step: int, rank: int, world_size: int, seed: int,
               global_batch: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens, targets)`` of shape (global_batch / world_size, seq_len) for this rank."""
    batch = global_batch or cfg.global_batch
    if batch % world_size:
        raise ProbeError(f"global batch {batch} does not split over {world_size} ranks; "
                         f"use a rank count that divides {batch}")
    v, t = cfg.vocab_size, cfg.seq_len + 1
    rules = torch.Generator().manual_seed(seed)
    a_k = torch.randint(0, max(1, v // 2), (N_RULES,), generator=rules) * 2 + 1
    c_k = torch.randint(0, v, (N_RULES,), generator=rules)
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    k = torch.randint(0, N_RULES, (batch,), generator=gen)
    a, c = a_k[k], c_k[k]
    seq = torch.zeros((batch, t), dtype=torch.long)     # never uninitialised memory: a dump reads it
    seq[:, 0] = torch.randint(0, v, (batch,), generator=gen)
    for i in range(1, t):
        seq[:, i] = (a * seq[:, i - 1] + c) % v
    noise = torch.rand((batch, t), generator=gen) < 0.05
    seq = torch.where(noise, torch.randint(0, v, (batch, t), generator=gen), seq)
    per = batch // world_size
    rows = seq[rank * per:(rank + 1) * per]
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()
