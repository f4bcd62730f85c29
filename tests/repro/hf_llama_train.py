"""A user's script: a Hugging Face Llama built from a small config (random weights, no hub),
one AdamW step on random tokens. ``--scale NAME:FACTOR`` plants a weight fault (multiplies one
parameter before training).

    python hf_llama_train.py [--scale model.layers.0.mlp.down_proj.weight:1.5] [--steps 1]
"""

import argparse

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", default=None)
    ap.add_argument("--steps", type=int, default=1)
    args = ap.parse_args()
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
    cfg._attn_implementation = "eager"
    model = LlamaForCausalLM(cfg)
    if args.scale:
        name, factor = args.scale.rsplit(":", 1)
        with torch.no_grad():
            dict(model.named_parameters())[name].mul_(float(factor))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1)
    for _ in range(args.steps):
        tokens = torch.randint(0, 128, (2, 16), generator=gen)
        out = model(input_ids=tokens, labels=tokens)
        out.loss.backward()
        opt.step()
        opt.zero_grad()


if __name__ == "__main__":
    main()
