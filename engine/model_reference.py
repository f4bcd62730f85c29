"""The reference implementation: plain PyTorch modules, one op at a time.

Module names follow the TinyLlama of msprobe's examples: ``embed``, ``layers.N`` (Block) with
``input_norm``, ``attn`` (``q_proj k_proj v_proj o_proj``), ``post_norm``, ``mlp``
(``gate_proj up_proj down_proj``), then ``norm`` and ``lm_head``.

>>> import torch
>>> from probe.engine.config import get_preset
>>> m = ReferenceLlama(get_preset("tiny"))
>>> m(torch.zeros(2, 5, dtype=torch.long)).shape
torch.Size([2, 5, 256])
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from probe.engine.config import ModelConfig
from probe.engine.rotary import apply_rotary, rotary_tables


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(variance + self.eps) * self.weight


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.head_dim, self.theta = cfg.n_heads, cfg.head_dim, cfg.rope_theta
        d = cfg.d_model
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.o_proj(self.attend(x))

    def attend(self, x: torch.Tensor) -> torch.Tensor:
        """Causal self-attention over this module's heads, before the output projection:
        ``[batch, tokens, n_heads * head_dim]``."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        cos, sin = rotary_tables(t, self.head_dim, self.theta, x.device, x.dtype)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        mask = torch.full((t, t), float("-inf"), device=x.device, dtype=x.dtype).triu(1)
        probs = F.softmax(scores + mask, dim=-1)
        return torch.matmul(probs, v).transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.d_model, cfg.ffn_hidden, bias=False)
        self.up_proj = nn.Linear(cfg.d_model, cfg.ffn_hidden, bias=False)
        self.down_proj = nn.Linear(cfg.ffn_hidden, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.post_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attn(self.input_norm(x))
        return h + self.mlp(self.post_norm(h))


class ReferenceLlama(nn.Module):
    """Llama-style decoder, unfused; ``forward(tokens) -> logits``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))

    def load_reference_state(self, state: dict[str, torch.Tensor]) -> None:
        """Load weights in the shared (reference) format."""
        self.load_state_dict(state, strict=True)

    def reference_state(self) -> dict[str, torch.Tensor]:
        """Weights in the shared (reference) format."""
        return {k: v.detach().clone() for k, v in self.state_dict().items()}
