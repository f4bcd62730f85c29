"""Build either implementation of the bundled engine and its shared initial weights.

>>> from probe.engine.config import get_preset
>>> cfg = get_preset("tiny")
>>> state = init_reference_state(cfg, seed=0)
>>> ref, fused = build_model("reference", cfg), build_model("fused", cfg)
>>> ref.load_reference_state(state); fused.load_reference_state(state)
"""

from __future__ import annotations

import math

import torch
from torch import nn

from probe.engine.config import ModelConfig
from probe.ground.errors import ProbeError

ENGINES = ("reference", "fused")


def build_model(engine: str, cfg: ModelConfig) -> nn.Module:
    """A fresh model of implementation ``engine`` (``reference`` or ``fused``)."""
    if engine == "reference":
        from probe.engine.model_reference import ReferenceLlama
        return ReferenceLlama(cfg)
    if engine == "fused":
        from probe.engine.model_fused import FusedLlama
        return FusedLlama(cfg)
    raise ProbeError(f"unknown engine {engine!r}; valid engines: {', '.join(ENGINES)}")


def init_reference_state(cfg: ModelConfig, seed: int) -> dict[str, torch.Tensor]:
    """Seeded initial weights in the reference format (GPT-2 style scaled normal init)."""
    from probe.engine.model_reference import ReferenceLlama

    gen = torch.Generator().manual_seed(seed)
    model = ReferenceLlama(cfg)
    state = {}
    std = 0.02
    out_std = std / math.sqrt(2 * cfg.n_layers)
    for name, p in model.state_dict().items():
        if name.endswith("norm.weight"):
            state[name] = torch.ones_like(p)
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            state[name] = torch.randn(p.shape, generator=gen) * out_std
        else:
            state[name] = torch.randn(p.shape, generator=gen) * std
    return state


def load_weights_file(path: str) -> dict[str, torch.Tensor]:
    """Reference-format weights from a safetensors file."""
    from safetensors.torch import load_file

    try:
        return load_file(path)
    except FileNotFoundError:
        raise ProbeError(f"{path}: no such weights file") from None
    except Exception as e:  # noqa: BLE001 - safetensors raises several kinds
        raise ProbeError(f"{path}: not a readable safetensors weights file ({e})") from None
