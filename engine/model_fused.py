"""The fused implementation: same math as the reference, fused kernels, its own module names.

Names follow Megatron-style conventions, as a second framework would name them: ``embedding``,
``decoder.layers.N`` (FusedBlock) with ``pre_attn_norm``, ``self_attention`` (``linear_qkv``
fused Q/K/V projection, ``linear_proj``; ``scaled_dot_product_attention`` inline),
``pre_mlp_norm`` (fused residual-add + RMSNorm returning ``(normed, summed)``), ``mlp``
(``linear_fc1`` fused gate+up projection, fused SwiGLU inline, ``linear_fc2``), then
``decoder.final_norm`` and ``output_layer``. Blocks can be ``torch.compile``d in place
(module names are kept).

>>> import torch
>>> from probe.engine.config import get_preset
>>> m = FusedLlama(get_preset("tiny"))
>>> m(torch.zeros(2, 5, dtype=torch.long)).shape
torch.Size([2, 5, 256])
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from probe.engine.config import ModelConfig
from probe.engine.rotary import apply_rotary, rotary_tables


class FusedRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps, self.dim = eps, dim
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (self.dim,), self.weight, self.eps)


class FusedAddRMSNorm(nn.Module):
    """``(x, residual) -> (rms_norm(x + residual), x + residual)`` in one module."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps, self.dim = eps, dim
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        summed = x + residual
        return F.rms_norm(summed, (self.dim,), self.weight, self.eps), summed


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """Fused SwiGLU over a concatenated ``[gate | up]`` projection."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


class FusedSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.head_dim, self.theta = cfg.n_heads, cfg.head_dim, cfg.rope_theta
        self.linear_qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.linear_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        qkv = self.linear_qkv(x).view(b, t, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        cos, sin = rotary_tables(t, self.head_dim, self.theta, x.device, x.dtype)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.linear_proj(out.transpose(1, 2).reshape(b, t, d))


class FusedMLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(cfg.d_model, 2 * cfg.ffn_hidden, bias=False)
        self.linear_fc2 = nn.Linear(cfg.ffn_hidden, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(swiglu(self.linear_fc1(x)))


class FusedBlock(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.pre_attn_norm = FusedRMSNorm(cfg.d_model, cfg.norm_eps)
        self.self_attention = FusedSelfAttention(cfg)
        self.pre_mlp_norm = FusedAddRMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = FusedMLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        attn_out = self.self_attention(self.pre_attn_norm(x))
        normed, h = self.pre_mlp_norm(attn_out, x)
        return h + self.mlp(normed)


class FusedDecoder(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(FusedBlock(cfg) for _ in range(cfg.n_layers))
        self.final_norm = FusedRMSNorm(cfg.d_model, cfg.norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.final_norm(x)


class FusedLlama(nn.Module):
    """Llama-style decoder with fused kernels; ``forward(tokens) -> logits``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embedding = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.decoder = FusedDecoder(cfg)
        self.output_layer = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.output_layer(self.decoder(self.embedding(tokens)))

    def compile_blocks(self, **kwargs) -> None:
        """``torch.compile`` each block in place (module names and hooks stay where they are)."""
        for layer in self.decoder.layers:
            layer.compile(**kwargs)

    def load_reference_state(self, state: dict[str, torch.Tensor]) -> None:
        """Load weights in the shared (reference) format, fusing Q/K/V and gate/up."""
        self.load_state_dict(fused_from_reference(state, self.cfg.n_layers), strict=True)

    def reference_state(self) -> dict[str, torch.Tensor]:
        """Weights in the shared (reference) format."""
        return reference_from_fused(self.state_dict(), self.cfg.n_layers, self.cfg.d_model,
                                    self.cfg.ffn_hidden)


def fused_from_reference(ref: dict[str, torch.Tensor], n_layers: int) -> dict[str, torch.Tensor]:
    """Map a reference-format state dict to the fused model's names and fused layouts."""
    out = {
        "embedding.weight": ref["embed.weight"],
        "decoder.final_norm.weight": ref["norm.weight"],
        "output_layer.weight": ref["lm_head.weight"],
    }
    for i in range(n_layers):
        r, f = f"layers.{i}.", f"decoder.layers.{i}."
        out[f + "pre_attn_norm.weight"] = ref[r + "input_norm.weight"]
        out[f + "self_attention.linear_qkv.weight"] = torch.cat(
            [ref[r + "attn.q_proj.weight"], ref[r + "attn.k_proj.weight"], ref[r + "attn.v_proj.weight"]], 0)
        out[f + "self_attention.linear_proj.weight"] = ref[r + "attn.o_proj.weight"]
        out[f + "pre_mlp_norm.weight"] = ref[r + "post_norm.weight"]
        out[f + "mlp.linear_fc1.weight"] = torch.cat(
            [ref[r + "mlp.gate_proj.weight"], ref[r + "mlp.up_proj.weight"]], 0)
        out[f + "mlp.linear_fc2.weight"] = ref[r + "mlp.down_proj.weight"]
    return out


def reference_from_fused(fused: dict[str, torch.Tensor], n_layers: int, d_model: int,
                         ffn_hidden: int) -> dict[str, torch.Tensor]:
    """Inverse of :func:`fused_from_reference`."""
    out = {
        "embed.weight": fused["embedding.weight"].detach().clone(),
        "norm.weight": fused["decoder.final_norm.weight"].detach().clone(),
        "lm_head.weight": fused["output_layer.weight"].detach().clone(),
    }
    for i in range(n_layers):
        r, f = f"layers.{i}.", f"decoder.layers.{i}."
        q, k, v = fused[f + "self_attention.linear_qkv.weight"].detach().split(d_model, 0)
        gate, up = fused[f + "mlp.linear_fc1.weight"].detach().split(ffn_hidden, 0)
        out.update({
            r + "input_norm.weight": fused[f + "pre_attn_norm.weight"].detach().clone(),
            r + "attn.q_proj.weight": q.clone(), r + "attn.k_proj.weight": k.clone(),
            r + "attn.v_proj.weight": v.clone(),
            r + "attn.o_proj.weight": fused[f + "self_attention.linear_proj.weight"].detach().clone(),
            r + "post_norm.weight": fused[f + "pre_mlp_norm.weight"].detach().clone(),
            r + "mlp.gate_proj.weight": gate.clone(), r + "mlp.up_proj.weight": up.clone(),
            r + "mlp.down_proj.weight": fused[f + "mlp.linear_fc2.weight"].detach().clone(),
        })
    return out
