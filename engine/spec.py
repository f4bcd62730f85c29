"""The picklable description of one run of the bundled engine.

>>> spec = RunSpec(engine="fused", preset="tiny", nproc=2, max_steps=3, out_dir="/tmp/r")
>>> spec.engine, spec.nproc
('fused', 2)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from probe.engine_adapter.callbacks import CallbackSpec


@dataclass(frozen=True)
class RunSpec:
    """Everything a rank needs to build the model, the data and its callbacks."""

    engine: str = "reference"          # reference | fused
    preset: str = "tiny"
    nproc: int = 1                     # ranks launched (data parallel, gradients all-reduced)
    max_steps: int = 10
    seed: int = 0
    faults: tuple[str, ...] = ()       # "scale:<param>:<factor>", "nan:<module>:<step>", "slow:<rank>:<factor>",
                                       # "perturb:<api>:<call index>"
    dtype: str = "fp32"                # fp32 | bf16 (forward and loss under bfloat16 autocast, fp32 weights)
    out_dir: str = "runs/train"
    device: str = "cpu"
    compile: bool | None = None        # torch.compile the fused engine; None = auto (on where it works)
    callbacks: tuple[CallbackSpec, ...] = ()  # built in each rank, in order
    weights: str | None = None         # reference-format safetensors file to load instead of seeded init
    global_batch: int | None = None    # override the preset's global batch (sequences per step)
    seq_len: int | None = None         # override the preset's sequence length
    lr: float = 3e-3
    quiet: bool = False                # no progress from rank 0 (engine.progress)
    log_every: int = 10                # progress: a line every this many steps (in a pipe)
    allow_nan: bool = False            # train on after a NaN/Inf loss or gradient norm (else stop there)
    owner: str = "train"               # the verb whose run directory this is (ground.outdir.claim)
    fsync: str = "step"                # store durability: "step" | "never" (collectors.store)
    force: bool = False                # replace entries of the run directory probe cannot prove it wrote
    extra_env: tuple[tuple[str, str], ...] = field(default_factory=tuple)
