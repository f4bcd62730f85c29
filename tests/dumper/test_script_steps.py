"""``probe dump -- SCRIPT``: steps are exactly the optimizer steps; the set-up before the first
optimizer and the last step's logging are none of them; what runs between the optimizer and the
first forward (a batch, or a set-up done after the optimizer) belongs to step 0."""

from __future__ import annotations

import json
import textwrap

import pytest

from tests.conftest import run_probe

PLAIN = textwrap.dedent("""
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.to(torch.float64)                  # set-up after the optimizer: in step 0
    model.train()
    for p in model.parameters():
        p.data = p.data.to(torch.float64)
    total = torch.zeros((), dtype=torch.float64)
    for step in range(3):
        x = torch.randn(5, 4, dtype=torch.float64)
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        total += loss.detach()
    print("mean loss", (total / 3).item())  # logging after the last step: not a step
""")

HF_TRAINER = textwrap.dedent("""
    import tempfile
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, vocab_size=128))

    class Tokens(torch.utils.data.Dataset):
        def __len__(self):
            return 16

        def __getitem__(self, i):
            ids = torch.randint(0, 128, (8,), generator=torch.Generator().manual_seed(i))
            return {"input_ids": ids, "labels": ids.clone()}

    args = TrainingArguments(output_dir=tempfile.mkdtemp(), max_steps=3, per_device_train_batch_size=2,
                             report_to=[], logging_steps=1, save_strategy="no", use_cpu=True)
    Trainer(model, args, train_dataset=Tokens()).train()
""")


def _keys(out, step: int) -> list[str]:
    return list(json.loads((out / f"step{step}/rank0/dump.json").read_text())["data"])


def _dump(tmp_path, script: str, *options: str):
    path = tmp_path / "train.py"
    path.write_text(script)
    out = tmp_path / "d"
    r = run_probe("dump", *options, "--out", str(out), "--", str(path), cwd=str(tmp_path), timeout=600)
    assert r.returncode == 0, r.stderr
    return out


@pytest.mark.slow
def test_logging_after_the_last_step_makes_no_step_and_step_0_starts_at_the_optimizer(tmp_path):
    out = _dump(tmp_path, PLAIN, "--level", "mix", "--task", "tensor")
    assert sorted(p.name for p in out.glob("step*")) == ["step0", "step1", "step2"]
    keys = _keys(out, 0)
    assert {"Module.0.Linear.forward.0", "Torch.randn.0.forward"} <= set(keys)
    assert "Torch.zeros.0.forward" not in keys or keys.index("Torch.zeros.0.forward") < keys.index(
        "Torch.randn.0.forward")
    assert "Torch.randn.0.forward" in _keys(out, 1) and "Torch.randn.0.forward" in _keys(out, 2)


@pytest.mark.slow
def test_hf_trainer_at_mix_level_has_exactly_its_optimizer_steps(tmp_path):
    pytest.importorskip("transformers")
    out = _dump(tmp_path, HF_TRAINER, "--level", "mix")
    assert sorted(p.name for p in out.glob("step*")) == ["step0", "step1", "step2"]
    keys = _keys(out, 0)
    assert "Module.model.embed_tokens.Embedding.forward.0" in keys
    summary = json.loads((out / "dump_summary.json").read_text())
    assert summary["steps"] == [0, 1, 2]
    # stacks start at the call site; the loss's logging names Trainer's logging in every step
    for step in (1, 2):
        stacks = json.loads((out / f"step{step}/rank0/stack.json").read_text())
        lines = next(lines for names, lines in stacks.values() if "Tensor.mean.0.forward" in names)
        assert "_maybe_log_save_evaluate" in lines[0] and "module.py" not in "".join(lines)
