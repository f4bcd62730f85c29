"""The dump on the code people train: tiny ``transformers`` models built from configs (random
weights, no download), trained with and without the dump (issue #32).

- the training's numbers are bit for bit the same under the dump (losses and final weights,
  ``torch.equal``), at module and mix level, statistics and tensor tasks;
- a module returning a ``ModelOutput`` (``LlamaModel``) has its backward entry;
- activation checkpointing: the recomputed forward is not a new call and the backward pairs
  with the original forward, reentrant or not.
"""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

import probe  # noqa: E402


def _model(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=128))
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4,
                                                                vocab_size=128))


def _train(kind: str, out=None, steps: int = 3, checkpoint: bool | None = None, **dump):
    model = _model(kind)
    if checkpoint is not None:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": checkpoint})
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    session = probe.start(model, out=str(out), quiet=True, **dump) if out is not None else None
    losses = []
    try:
        for _ in range(steps):
            ids = torch.randint(0, 128, (2, 16), generator=g)
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.detach())
    finally:
        if session is not None:
            probe.stop()
    return torch.stack(losses), {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["llama", "gpt2"])
@pytest.mark.parametrize("level,task", [("module", "statistics"), ("mix", "statistics"),
                                        ("module", "tensor"), ("mix", "tensor")])
def test_training_under_the_dump_is_bit_identical(tmp_path, kind, level, task):
    ref_losses, ref_weights = _train(kind)
    losses, weights = _train(kind, tmp_path, level=level, task=task)
    assert torch.equal(losses, ref_losses)
    assert [k for k in ref_weights if not torch.equal(ref_weights[k], weights[k])] == []
    assert list(tmp_path.rglob("dump.json"))


def test_a_module_returning_a_model_output_has_its_backward_entry(tmp_path):
    _train("llama", tmp_path, steps=1, level="module")
    data = json.loads(next(tmp_path.rglob("dump.json")).read_text())["data"]
    assert "Module.model.LlamaModel.backward.0" in data
    assert data["Module.model.LlamaModel.backward.0"]["input"]          # d(last_hidden_state)


@pytest.mark.slow
@pytest.mark.parametrize("reentrant", [True, False])
def test_a_checkpointed_forward_is_not_a_new_call(tmp_path, reentrant):
    ref_losses, ref_weights = _train("llama", steps=1, checkpoint=reentrant)
    losses, weights = _train("llama", tmp_path, steps=1, checkpoint=reentrant, level="module")
    assert torch.equal(losses, ref_losses)
    data = json.loads(next(tmp_path.rglob("dump.json")).read_text())["data"]
    down = [k for k in data if ".layers.0.mlp.down_proj." in k]
    assert sorted(down) == ["Module.model.layers.0.mlp.down_proj.Linear.backward.0",
                            "Module.model.layers.0.mlp.down_proj.Linear.forward.0",
                            "Module.model.layers.0.mlp.down_proj.Linear.parameters_grad.0"]


def test_a_plain_checkpoint_pairs_backward_with_the_original_forward(tmp_path):
    from torch.utils.checkpoint import checkpoint

    names = {}
    for reentrant in (True, False):
        torch.manual_seed(0)
        block = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 4))
        x = torch.randn(2, 4, requires_grad=True)
        out = tmp_path / str(reentrant)
        with probe.dump(block, out=str(out), auto_step=False, quiet=True, store=False):
            checkpoint(block, x, use_reentrant=reentrant).sum().backward()
        names[reentrant] = sorted(json.loads(next(out.rglob("dump.json")).read_text())["data"])
    assert names[True] == names[False]
    assert "Module.0.Linear.backward.0" in names[True] and not any(".forward.1" in n for n in names[True])


@pytest.mark.slow
def test_a_compiled_model_trains_bit_identically_under_the_dump(tmp_path):
    def run(out):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
        compiled = torch.compile(net)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        session = probe.start(compiled, out=str(out), level="mix", quiet=True) if out else None
        try:
            for i in range(2):
                compiled(torch.randn(4, 8, generator=torch.Generator().manual_seed(i))).pow(2).mean().backward()
                opt.step()
                opt.zero_grad()
        finally:
            if session is not None:
                probe.stop()
        return {k: v.detach().clone() for k, v in net.state_dict().items()}

    ref = run(None)
    got = run(tmp_path)
    assert all(torch.equal(ref[k], got[k]) for k in ref)
    data = json.loads((tmp_path / "step0" / "rank0" / "dump.json").read_text())["data"]
    assert "Module.0.Linear.parameters_grad.0" in data
