"""The bundled engine's reference model as one tensor- and pipeline-parallel rank holds it.

The engine itself runs data parallel only; to simulate ``--tp``/``--pp`` its reference model is
cut as Megatron-LM cuts a Llama:

- tensor parallel: ``q_proj``, ``k_proj``, ``v_proj``, ``gate_proj``, ``up_proj`` split by output
  (column parallel: ``heads / tp`` heads, ``ffn_hidden / tp`` features), ``o_proj`` and
  ``down_proj`` by input (row parallel, their outputs all-reduced in forward); the input of each
  column-parallel block all-reduces its gradient in backward; the embedding and the LM head hold
  ``vocab / tp`` rows (the embedding's output all-reduced; the loss computed on the local logits,
  with the three small all-reduces of a vocabulary-parallel cross-entropy); norms are replicated;
- pipeline parallel: stage ``s`` of ``pp`` holds layers ``s*L/pp .. (s+1)*L/pp - 1``, the first
  also the embedding, the last also the final norm and the LM head.

Blocks are the engine's own :class:`probe.engine.model_reference.Block` forward with sharded attention
and MLP, module names as the reference model's (``layers.N.attn.q_proj``, N the global index).
Collectives are not run: each is reported to ``record(op, group, nbytes)``.

>>> import torch
>>> from probe.engine.config import get_preset
>>> cfg = get_preset("tiny")
>>> seen = []
>>> stage = ShardLlama(cfg, tp=2, layers=range(1, 2), first=False, last=True,
...                    record=lambda op, group, n: seen.append((op, group)))
>>> out = stage(torch.randn(2, 8, cfg.d_model))
>>> out.shape, stage.layers["1"].attn.q_proj.weight.shape, seen[0]
(torch.Size([2, 8, 128]), torch.Size([32, 64]), ('all_reduce', 'tp'))
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from probe.engine.config import ModelConfig
from probe.engine.model_reference import Attention, Block, RMSNorm

Record = Callable[[str, str, int], None]


class _CopyToTP(torch.autograd.Function):
    """Identity forward; the gradient is all-reduced over the tensor-parallel group."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, record: Record) -> torch.Tensor:
        ctx.record = record
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx.record("all_reduce", "tp", grad.numel() * grad.element_size())
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    """All-reduce forward (in place); identity backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, record: Record) -> torch.Tensor:
        record("all_reduce", "tp", x.numel() * x.element_size())
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class ShardAttention(nn.Module):
    #: the reference engine's attention over this rank's heads
    attend = Attention.attend

    def __init__(self, cfg: ModelConfig, tp: int, record: Record) -> None:
        super().__init__()
        self.n_heads, self.head_dim, self.theta = cfg.n_heads // tp, cfg.head_dim, cfg.rope_theta
        self.tp, self.record = tp, record
        d, local = cfg.d_model, cfg.d_model // tp
        self.q_proj = nn.Linear(d, local, bias=False)
        self.k_proj = nn.Linear(d, local, bias=False)
        self.v_proj = nn.Linear(d, local, bias=False)
        self.o_proj = nn.Linear(local, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _CopyToTP.apply(x, self.record) if self.tp > 1 else x
        out = self.o_proj(self.attend(x))
        return _ReduceFromTP.apply(out, self.record) if self.tp > 1 else out


class ShardMLP(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: int, record: Record) -> None:
        super().__init__()
        self.tp, self.record = tp, record
        local = cfg.ffn_hidden // tp
        self.gate_proj = nn.Linear(cfg.d_model, local, bias=False)
        self.up_proj = nn.Linear(cfg.d_model, local, bias=False)
        self.down_proj = nn.Linear(local, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _CopyToTP.apply(x, self.record) if self.tp > 1 else x
        out = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return _ReduceFromTP.apply(out, self.record) if self.tp > 1 else out


class ShardBlock(Block):
    """The engine's block (its forward) around a sharded attention and MLP."""

    def __init__(self, cfg: ModelConfig, tp: int, record: Record) -> None:
        nn.Module.__init__(self)
        self.input_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = ShardAttention(cfg, tp, record)
        self.post_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = ShardMLP(cfg, tp, record)


class ShardLlama(nn.Module):
    """One pipeline stage of one tensor-parallel rank (see the module docstring).

    ``forward(x)``: tokens on the first stage, else the hidden states received; returns hidden
    states, or on the last stage this rank's vocabulary slice of the logits.
    """

    def __init__(self, cfg: ModelConfig, *, tp: int, layers: Iterable[int], first: bool,
                 last: bool, record: Record) -> None:
        super().__init__()
        self.cfg, self.tp, self.record = cfg, tp, record
        self.first, self.last = first, last
        if first:
            self.embed = nn.Embedding(cfg.vocab_size // tp, cfg.d_model)
        self.layers = nn.ModuleDict({str(i): ShardBlock(cfg, tp, record) for i in layers})
        if last:
            self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
            self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size // tp, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            x = self.embed(x)
            if self.tp > 1:
                x = _ReduceFromTP.apply(x, self.record)
        for layer in self.layers.values():
            x = layer(x)
        if self.last:
            x = self.lm_head(_CopyToTP.apply(self.norm(x), self.record) if self.tp > 1 else self.norm(x))
        return x

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of this rank's logits (targets index its own vocabulary slice)."""
        if self.tp > 1:
            tokens = targets.numel() * logits.element_size()
            for _ in range(3):              # max, sum of exponentials, the target's logit
                self.record("all_reduce", "tp", tokens)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def check_shardable(cfg: ModelConfig, tp: int, pp: int) -> None:
    """A one-line ProbeError when ``cfg`` cannot be cut into ``tp`` x ``pp``."""
    from probe.ground.errors import ProbeError

    for what, value in (("heads", cfg.n_heads), ("FFN features", cfg.ffn_hidden),
                        ("vocabulary entries", cfg.vocab_size)):
        if value % tp:
            raise ProbeError(f"--tp {tp} does not divide the model's {value} {what}; "
                             f"choose a --tp that divides {value}")
    if cfg.n_layers % pp:
        raise ProbeError(f"--pp {pp} does not divide the model's {cfg.n_layers} layers; "
                         f"choose a --pp that divides {cfg.n_layers}")
