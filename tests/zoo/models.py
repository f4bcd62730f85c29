"""The zoo's models: real Hugging Face architectures built from small configs with random
weights (no hub download), and plain PyTorch modules with dict, ``ModelOutput`` and dataclass
outputs and keyword-only inputs. Each builder gives a model and a batch of a step."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch
from torch import nn

VOCAB, SEQ, BATCH = 128, 8, 2


def _tokens(step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)


def _causal(step: int) -> dict[str, Any]:
    x = _tokens(step)
    return {"input_ids": x, "labels": x}


def llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2,
                                        vocab_size=VOCAB, max_position_embeddings=64))


def gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=VOCAB,
                                      n_positions=64))        # lm_head tied to wte


def bert() -> nn.Module:
    from transformers import BertConfig, BertForMaskedLM

    return BertForMaskedLM(BertConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, vocab_size=VOCAB,
                                      max_position_embeddings=64))


def t5() -> nn.Module:
    from transformers import T5Config, T5ForConditionalGeneration

    return T5ForConditionalGeneration(T5Config(d_model=32, d_ff=64, d_kv=8, num_layers=2,
                                               num_heads=4, vocab_size=VOCAB,
                                               decoder_start_token_id=0, pad_token_id=0))


def moe() -> nn.Module:
    from transformers import MixtralConfig, MixtralForCausalLM

    return MixtralForCausalLM(MixtralConfig(hidden_size=32, intermediate_size=64,
                                            num_hidden_layers=2, num_attention_heads=4,
                                            num_key_value_heads=2, vocab_size=VOCAB,
                                            num_local_experts=4, num_experts_per_tok=2,
                                            max_position_embeddings=64))


@dataclasses.dataclass
class Prediction:
    """A plain dataclass output (not a ModelOutput)."""

    logits: torch.Tensor
    hidden: torch.Tensor


class DataclassBody(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        self.proj = nn.Linear(32, 32)

    def forward(self, *, input_ids: torch.Tensor) -> Prediction:      # keyword-only input
        h = torch.tanh(self.proj(self.embed(input_ids)))
        return Prediction(logits=h.sum(-1), hidden=h)


class DictHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.out = nn.Linear(32, VOCAB)

    def forward(self, hidden: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"logits": self.out(hidden)}


class Outputs(nn.Module):
    """Children that return a dataclass and a dict, a keyword-only input, a loss like HF's."""

    def __init__(self) -> None:
        super().__init__()
        self.body = DataclassBody()
        self.head = DictHead()

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        pred = self.body(input_ids=input_ids)
        logits = self.head(pred.hidden)["logits"]
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return {"loss": loss + 0.0 * pred.logits.sum()}


MODELS: dict[str, Callable[[], nn.Module]] = {
    "llama": llama, "gpt2": gpt2, "bert": bert, "t5": t5, "moe": moe, "outputs": Outputs,
}


def batch(step: int) -> dict[str, Any]:
    return _causal(step)


def loss_of(out: Any) -> torch.Tensor:
    return out["loss"] if isinstance(out, dict) else out.loss
