"""Sharded and freed parameters (FSDP1, FSDP2, ZeRO-3-style): the dump never reads freed memory,
records each parameter as the logical tensor (its unsharded values as the module runs, its
gradient), names modules as the unwrapped model does, and leaves the training bit-identical.

The FSDP runs are real: two ranks on gloo (CPU), a tiny random ``LlamaForCausalLM``.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from pathlib import Path

import pytest
import torch

STEPS = 2


def _model() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=128)
    return LlamaForCausalLM(config)


def _train(model: torch.nn.Module, out: str | None, level: str) -> list[torch.Tensor]:
    """``STEPS`` SGD steps on fixed tokens, dumped to ``out`` when given; the losses."""
    import probe

    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(1))
    losses = []
    dump = probe.dump(model, out=out, level=level, quiet=True) if out else contextlib.nullcontext()
    with dump:
        for _ in range(STEPS):
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.detach().clone())
    return losses


def _rank(rank: int, world: int, port: int, kind: str, level: str, out: str, result: str) -> None:
    """One rank of an FSDP run (``kind``: fsdp1 or fsdp2); rank 0 saves losses and full weights."""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        model = _model()
        if kind == "fsdp2":
            from torch.distributed.fsdp import fully_shard
            for layer in model.model.layers:
                fully_shard(layer)
            fully_shard(model)
        else:
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            from torch.distributed.fsdp.wrap import ModuleWrapPolicy
            from transformers.models.llama.modeling_llama import LlamaDecoderLayer
            model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({LlamaDecoderLayer}),
                         device_id=torch.device("cpu"))
        losses = _train(model, out or None, level)
        if kind == "fsdp2":
            state = {k: v.full_tensor() for k, v in model.state_dict().items()}
        else:
            from torch.distributed.fsdp import FullStateDictConfig, StateDictType
            config = FullStateDictConfig(offload_to_cpu=False, rank0_only=False)
            with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, config):
                state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        if rank == 0:
            torch.save({"losses": losses, "state": state}, result)
    finally:
        dist.destroy_process_group()


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(kind: str, level: str, out: Path | None, result: Path) -> dict:
    import torch.multiprocessing as mp

    mp.spawn(_rank, args=(2, _port(), kind, level, str(out) if out else "", str(result)), nprocs=2)
    return torch.load(result)


def _data(out: Path, step: int, rank: int = 0) -> dict:
    return json.loads((out / f"step{step}" / f"rank{rank}" / "dump.json").read_text())["data"]


def _modules(data: dict) -> list[str]:
    return sorted(k for k in data if k.startswith("Module."))


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> tuple[Path, dict]:
    """A single-process dump of the model at mix level, and its training's losses and weights."""
    out = tmp_path_factory.mktemp("single")
    model = _model()
    losses = _train(model, str(out / "dump"), "mix")
    return out / "dump", {"losses": losses, "state": model.state_dict()}


@pytest.fixture(scope="module", params=[("fsdp2", "module"), ("fsdp1", "mix")], ids=["fsdp2-module", "fsdp1-mix"])
def sharded(request, tmp_path_factory) -> tuple[str, Path, dict, dict]:
    """(kind, dump folder, the dumped run's result, the same run's result without the dump)."""
    kind, level = request.param
    base = tmp_path_factory.mktemp(kind)
    dumped = _spawn(kind, level, base / "dump", base / "dumped.pt")
    plain = _spawn(kind, level, None, base / "plain.pt")
    return kind, base / "dump", dumped, plain


@pytest.mark.slow
def test_a_sharded_run_trains_bit_identically_with_the_dump(sharded):
    kind, out, dumped, plain = sharded
    assert all(torch.equal(a, b) for a, b in zip(dumped["losses"], plain["losses"]))
    assert dumped["state"].keys() == plain["state"].keys()
    assert all(torch.equal(dumped["state"][k], plain["state"][k]) for k in plain["state"])


@pytest.mark.slow
def test_a_sharded_dump_has_the_single_process_module_names_on_every_rank(sharded, single):
    kind, out, _, _ = sharded
    single_out, _ = single
    for step in range(STEPS):
        expected = _modules(_data(single_out, step))
        for rank in (0, 1):
            names = _modules(_data(out, step, rank))
            assert names == expected, (kind, step, rank, set(names) ^ set(expected))
            assert not any("_fsdp_wrapped_module" in n or ".FSDP" in n or "FullyShardedDataParallel" in n
                           for n in names)


@pytest.mark.slow
def test_sharded_parameters_are_recorded_as_the_logical_tensors_with_their_gradients(sharded, single):
    """Each parameter has its logical shape and the single-process run's statistics (both ranks
    train on the same tokens, so the weights are the same), and every gradient is there."""
    kind, out, _, _ = sharded
    single_out, _ = single
    for step in range(STEPS):
        ref, got = _data(single_out, step), _data(out, step)
        with_params = [k for k in ref if k.startswith("Module.") and "parameters" in ref[k]]
        assert with_params
        for name in with_params:
            for p, e in ref[name]["parameters"].items():
                g = got[name]["parameters"][p]
                assert g["shape"] == e["shape"] and "note" not in g, (name, p, g)
                assert (g["Max"], g["Min"]) == (e["Max"], e["Min"]), (name, p)
                assert g["Norm"] == pytest.approx(e["Norm"], rel=1e-6)
        grads = [k for k in ref if ".parameters_grad." in k]
        assert grads and [k for k in got if ".parameters_grad." in k and k.startswith("Module.")] != []
        for name in grads:
            for p, [e] in ref[name].items():
                [g] = got[name][p]
                assert g["shape"] == e["shape"], (name, p)
                assert g["Max"] == pytest.approx(e["Max"], rel=1e-5, abs=1e-9), (name, p)


@pytest.mark.parametrize("native", ["1", "0"], ids=["native", "python"])
def test_a_storage_freed_between_steps_is_not_read_and_training_is_unchanged(tmp_path, monkeypatch, native, logged):
    """ZeRO-3's way without FSDP: a parameter's storage resized to 0 between uses, and a call
    recorded on it while freed: the entry says so, nothing crashes, the weights are the run's
    without the dump."""
    import probe

    monkeypatch.setenv("PROBE_NATIVE", native)

    def run(out: Path | None) -> tuple[list, dict]:
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        weight = net[2].weight
        losses = []
        dump = probe.dump(net, out=str(out), level="mix", quiet=True) if out else contextlib.nullcontext()
        with dump:
            for _ in range(3):
                loss = net(torch.ones(3, 4)).pow(2).mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
                losses.append(loss.detach().clone())
                kept = weight.detach().clone()
                weight.data.untyped_storage().resize_(0)        # partitioned away
                weight.view(-1)                                 # a call on the freed tensor
                weight.data.untyped_storage().resize_(kept.numel() * kept.element_size())
                with torch.no_grad():
                    weight.copy_(kept)                          # gathered back
        return losses, {k: v.clone() for k, v in net.state_dict().items()}

    losses, state = run(tmp_path / "d")
    plain_losses, plain_state = run(None)
    assert all(torch.equal(a, b) for a, b in zip(losses, plain_losses))
    assert all(torch.equal(state[k], plain_state[k]) for k in state)
    data = _data(tmp_path / "d", 1)        # the call after step 0's optimizer step: step 1's
    [view] = [v for k, v in data.items() if k.startswith("Tensor.view.")]
    freed = view["input_args"][0]
    assert freed["Max"] is None and freed["shape"] == [2, 8] and "storage freed" in freed["note"]
    assert "tensor_id" not in freed
    assert data["Module.2.Linear.forward.0"]["parameters"]["weight"]["Max"] is not None


def test_a_freed_or_meta_tensor_is_not_read_by_the_statistics():
    from probe.engine_adapter.torch_stats import TorchStats, readable

    stats = TorchStats()
    t = torch.arange(8.0)
    view = t[2:6]
    t.untyped_storage().resize_(0)
    assert readable(view) == (None, readable(t)[1]) and stats.reduce(view, "float") is None
    assert stats.digest(view) is None
    assert readable(torch.empty(3, device="meta"))[0] is None


def test_wrapper_segments_and_wrapper_classes_are_not_in_the_names():
    from probe.engine_adapter.torch_sharding import ModelLayout

    class DistributedDataParallel(torch.nn.Module):     # the root wrapper, by its name
        def __init__(self, module):
            super().__init__()
            self.module = module

    inner = torch.nn.Sequential(torch.nn.Linear(2, 2))
    layout = ModelLayout(DistributedDataParallel(inner))
    assert layout.path("module") == "" and layout.path("module.0") == "0"
    assert layout.path("module._orig_mod.0._checkpoint_wrapped_module") == "0"
    assert layout.is_wrapper(DistributedDataParallel(inner)) and not layout.is_wrapper(inner)
