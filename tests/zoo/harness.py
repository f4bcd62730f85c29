"""Train a zoo model with or without the dump, with the test's own hooks beside it.

``train(...)`` returns the losses, the final weights and what the test's own forward hooks saw
at step 0 (each module's path, class, whether its output takes part in the backward, and the
statistics of a plain tensor output), so a test can hold the dump to the run without it."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tests.zoo.models import MODELS, batch, loss_of

SETUPS = ("plain", "accumulation", "checkpoint-reentrant", "checkpoint", "autocast-bf16", "lora",
          "compile")


@dataclasses.dataclass
class Seen:
    cls: str
    requires_grad: bool
    stats: tuple[float, float, float, float] | None      # max, min, mean, norm of a tensor output


@dataclasses.dataclass
class Run:
    losses: list[float]
    weights: dict[str, torch.Tensor]
    seen: dict[str, Seen]


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [t for f in dataclasses.fields(value) for t in _tensors(getattr(value, f.name))]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _watch(model: nn.Module, seen: dict[str, Seen]) -> list[Any]:
    handles = []
    for path, module in model.named_modules():
        if not path:
            continue

        def hook(mod, args, out, path=path):
            if path in seen:
                return
            ts = _tensors(out)
            stats = None
            if isinstance(out, torch.Tensor) and out.is_floating_point() and out.numel():
                with torch.no_grad():
                    f = out.detach().float()
                    stats = (float(f.max()), float(f.min()), float(f.mean()), float(f.norm()))
            seen[path] = Seen(type(mod).__name__, any(t.requires_grad for t in ts), stats)

        handles.append(module.register_forward_hook(hook))
    return handles


def build(name: str, setup: str, fault: tuple[str, float] | None = None) -> nn.Module:
    torch.manual_seed(0)
    model = MODELS[name]()
    if fault is not None:
        with torch.no_grad():
            dict(model.named_parameters())[fault[0]].mul_(fault[1])
    if setup == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    if setup.startswith("checkpoint"):
        model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": setup == "checkpoint-reentrant"})
    model.train()
    return model


def train(name: str, setup: str = "plain", steps: int = 2, dump: dict[str, Any] | None = None,
          fault: tuple[str, float] | None = None) -> Run:
    """Train ``name`` under ``setup`` for ``steps`` optimizer steps, dumped with ``dump``
    (``probe.dump``'s keyword arguments) when given."""
    import probe

    model = build(name, setup, fault)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    forward = torch.compile(model, backend="aot_eager") if setup == "compile" else model
    micro = 2 if setup == "accumulation" else 1
    seen: dict[str, Seen] = {}
    handles = _watch(model, seen)
    losses = []
    ctx = probe.dump(model, **dump) if dump is not None else contextlib.nullcontext()
    with ctx:
        for step in range(steps):
            for m in range(micro):
                amp = (torch.autocast("cpu", dtype=torch.bfloat16) if setup == "autocast-bf16"
                       else contextlib.nullcontext())
                with amp:
                    loss = loss_of(forward(**batch(step * micro + m))) / micro
                loss.backward()
                losses.append(loss.item())
            opt.step()
            opt.zero_grad()
    for h in handles:
        h.remove()
    return Run(losses, {k: v.detach().clone() for k, v in model.state_dict().items()}, seen)


def entries(out: Path, step: int = 0, rank: int = 0) -> tuple[dict[str, Any], dict[str, Any]]:
    """(dump.json's data, construct.json) of a step."""
    folder = Path(out) / f"step{step}" / f"rank{rank}"
    return (json.loads((folder / "dump.json").read_text())["data"],
            json.loads((folder / "construct.json").read_text()))
