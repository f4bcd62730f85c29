"""A small PyTorch training script to try ``probe`` on your own code.

A two-layer MLP learns a fixed random regression on synthetic data with AdamW, a few steps,
printing its loss. Nothing in it knows about dumps or traces except two ``mstx`` ranges
(``data`` and ``train_step``) and a mark: with no profiling session they cost nothing, and under
``probe profile`` they show in the trace beside the steps probe finds from the optimizer.

    python examples/train.py --steps 3                                       # alone
    probe dump --level mix --steps 0,2 --out runs/mine -- examples/train.py --steps 3
    probe profile --out runs/mine-prof -- examples/train.py --steps 3
    probe simulate --nproc 8 --zero 2 -- examples/train.py
    probe config-check --record runs/mine-setup -- examples/train.py --lr 3e-4
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

from probe import mstx


class TinyMLP(nn.Module):
    """``fc1`` -> GELU -> ``fc2``: the modules a dump records as ``Module.fc1.Linear...``."""

    def __init__(self, width: int = 32, hidden: int = 64) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


def batch(step: int, size: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthetic inputs and targets of one step (the same for every run with the same seed)."""
    g = torch.Generator().manual_seed(step)
    x = torch.randn(size, width, generator=g)
    return x, x[:, :4].sum(dim=1, keepdim=True)


def main(argv: list[str] | None = None) -> float:
    ap = argparse.ArgumentParser(description="Train a tiny MLP on synthetic data.")
    ap.add_argument("--steps", type=int, default=5, help="optimizer steps (default 5)")
    ap.add_argument("--lr", type=float, default=1e-2, help="AdamW learning rate (default 1e-2)")
    ap.add_argument("--batch", type=int, default=16, help="samples per step (default 16)")
    ap.add_argument("--seed", type=int, default=0, help="weights' seed (default 0)")
    args = ap.parse_args(argv)

    torch.manual_seed(args.seed)
    model = TinyMLP()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loss = torch.zeros(())
    for step in range(args.steps):
        with mstx.range("data", domain="example"):
            x, y = batch(step, args.batch, 32)
        with mstx.range("train_step", domain="example"):
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()                    # probe counts a step here
            opt.zero_grad()
        print(f"step {step}: loss {loss.item():.4f}")
    mstx.mark("training done", domain="example")
    return loss.item()


if __name__ == "__main__":
    main()
