"""Model size presets of the bundled engine.

>>> cfg = get_preset("tiny")
>>> cfg.d_model, cfg.n_layers
(64, 2)
>>> round(get_preset("small").n_params() / 1e6)
27
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from probe.ground.errors import ProbeError


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the Llama-style decoder and of its synthetic training batch."""

    vocab_size: int = 256
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    ffn_hidden: int = 172
    seq_len: int = 32
    global_batch: int = 8          # sequences per step over all ranks
    norm_eps: float = 1e-6
    rope_theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def n_params(self) -> int:
        """Parameter count (embedding and LM head untied)."""
        d, h, v = self.d_model, self.ffn_hidden, self.vocab_size
        per_layer = 4 * d * d + 3 * d * h + 2 * d
        return 2 * v * d + self.n_layers * per_layer + d

    def with_overrides(self, **kw) -> "ModelConfig":
        return replace(self, **{k: v for k, v in kw.items() if v is not None})


PRESETS: dict[str, ModelConfig] = {
    # unit tests: ~0.2M parameters, a step in a few ms on a CPU core
    "tiny": ModelConfig(),
    # the shape of msprobe's benchmark TinyLlama: 2.1M parameters, 256 tokens
    "mini": ModelConfig(vocab_size=1000, d_model=256, n_layers=2, n_heads=4, ffn_hidden=688,
                        seq_len=64, global_batch=4),
    # demos and benchmarks: ~27M parameters
    "small": ModelConfig(vocab_size=8192, d_model=512, n_layers=6, n_heads=8, ffn_hidden=1376,
                         seq_len=128, global_batch=8),
    # GPUs
    "medium": ModelConfig(vocab_size=32000, d_model=1024, n_layers=12, n_heads=16, ffn_hidden=2816,
                          seq_len=512, global_batch=16),
    "1b": ModelConfig(vocab_size=32000, d_model=2048, n_layers=16, n_heads=16, ffn_hidden=5632,
                      seq_len=1024, global_batch=8),
    "7b": ModelConfig(vocab_size=32000, d_model=4096, n_layers=32, n_heads=32, ffn_hidden=11008,
                      seq_len=2048, global_batch=4),
}


def get_preset(name: str) -> ModelConfig:
    """The preset called ``name``; a ProbeError lists the valid names otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ProbeError(f"unknown preset {name!r}; valid presets: {', '.join(PRESETS)}") from None
