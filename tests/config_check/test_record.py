"""Recording a run's setup (engine_adapter.run_config, engine_adapter.checksum) on small models."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from probe.engine_adapter import checksum
from probe.engine_adapter.callbacks import TrainContext
from probe.engine_adapter.checksum import Checksummer, to_hex
from probe.engine_adapter.config_format import config_path
from probe.engine_adapter.run_config import RunConfigCallback, record_config, watch_config
from probe.engine_adapter.run_facts import REDACTED


def _hex(*tensors):
    sums = Checksummer()
    return to_hex([sums(t) for t in tensors])


def test_a_checksum_follows_the_bits_not_the_layout_or_the_reduction_order():
    a = torch.randn(7, 5)
    same, transposed_back, flipped = _hex(a, a.t().contiguous().t(), a.flip(0))[0:3]
    assert same == transposed_back != flipped
    b = a.clone()
    b[3, 2] = torch.nextafter(b[3, 2], torch.tensor(float("inf")))      # one ulp
    assert _hex(a)[0] != _hex(b)[0]
    d = torch.randn(6, dtype=torch.float64)
    assert _hex(d)[0] != _hex(-d)[0]                                     # every sign bit flipped
    assert _hex(torch.ones(3, dtype=torch.bool), torch.ones(3, dtype=torch.int8))[0] is not None
    assert _hex(torch.empty(0, device="meta")) == [None]


def test_chunks_count_where_the_data_sits_and_tables_grow_without_changing_results(monkeypatch):
    monkeypatch.setattr(checksum, "CHUNK", 64)
    x = torch.randn(256)
    swapped = torch.cat([x[64:128], x[:64], x[128:]])
    grown = Checksummer()
    grown(torch.randn(3))                                                # small tables first
    assert to_hex([grown(x)]) == _hex(x) != _hex(swapped)


def test_record_config_writes_model_optimizer_and_only_the_first_batches(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.8, 0.9))
    rec = record_config(model, opt, str(tmp_path), seed=7)
    for step in range(5):
        model(torch.full((2, 4), float(step))).sum().backward()
        opt.step()
    assert not model._forward_pre_hooks                                  # removed after 3 steps
    rec.close()
    data = json.loads(open(config_path(str(tmp_path), 0)).read())
    assert [b["step"] for b in data["batches"]] == [0, 1, 2]
    inputs = [b["inputs"] for b in data["batches"]]
    assert all(len(i) == 1 and i[0]["path"] == "args.0" and i[0]["shape"] == [2, 4] for i in inputs)
    assert len({i[0]["checksum"] for i in inputs}) == 3
    params = data["model"]["parameters"]
    assert sorted(params) == ["0.bias", "0.weight", "1.bias", "1.weight"]
    assert params["0.weight"]["shape"] == [3, 4] and params["0.weight"]["dtype"] == "float32"
    assert "1.running_mean" in data["model"]["buffers"]
    assert data["model"]["modules"][:2] == [["", "Sequential"], ["0", "Linear"]]
    group = data["hyperparameters"]["optimizers"][0]["param_groups"][0]
    assert group["betas"] == [0.8, 0.9] and group["params"] == 4 and group["numel"] == 21
    det = data["determinism"]
    assert det["seed"] == 7 and det["torch_initial_seed"] == 0 and len(det["torch_rng_state"]) == 16
    assert data["run"]["rank"] == 0 and data["run"]["world_size"] == 1
    assert "torch" in data["packages"] and data["platform"]["device"] == "cpu"


def test_weights_are_taken_before_the_first_update(tmp_path):
    model = nn.Linear(3, 3)
    before = _hex(model.weight)[0]
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    rec = record_config(model, opt, str(tmp_path))
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    rec.close()
    data = json.loads(open(config_path(str(tmp_path), 0)).read())
    assert data["model"]["parameters"]["weight"]["checksum"] == before != _hex(model.weight)[0]


def test_secret_looking_variables_are_redacted_and_the_run_folder_is_a_placeholder(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_sekret1")
    monkeypatch.setenv("my_api_key", "sekret2")
    monkeypatch.setenv("DB_PASSWORD", "sekret3")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "sekret4")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    rec = record_config(nn.Linear(2, 2), None, str(tmp_path))
    rec.close()
    text = open(config_path(str(tmp_path), 0)).read()
    assert "sekret" not in text
    env = json.loads(text)["environment"]
    assert env["HF_TOKEN"] == env["my_api_key"] == env["DB_PASSWORD"] == REDACTED
    assert env["TORCHINDUCTOR_CACHE_DIR"] == "{OUT}/cache"
    assert "CUBLAS_WORKSPACE_CONFIG" not in env
    assert json.loads(text)["determinism"]["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"


def test_the_recording_is_invisible_to_an_api_level_dump(tmp_path):
    from probe.dumper.session import DumpSession

    model = nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batch = torch.ones(2, 4)
    with DumpSession(None, out=str(tmp_path / "dump"), level="api", store=False, auto_step=False):
        rec = record_config(model, opt, str(tmp_path / "run"))
        torch.nn.functional.relu(model.weight)
        rec.record_batch((batch,), {})
        rec.close()
    data = json.loads((tmp_path / "dump" / "step0" / "rank0" / "dump.json").read_text())["data"]
    assert sorted(data) == ["Functional.relu.0.forward"]


def test_a_failing_batch_hook_reports_once_and_never_breaks_the_forward(tmp_path, logged):
    model = nn.Linear(2, 2)
    rec = record_config(model, None, str(tmp_path))

    def broken(t):
        raise RuntimeError("no device")
    rec._sums = broken
    model(torch.ones(1, 2))
    model(torch.ones(1, 2))
    rec.close()
    err = logged()
    assert err.count("\n") == 1 and "the first batches" in err and "no device" in err
    assert not model._forward_pre_hooks


def test_a_script_is_watched_from_its_first_forward_and_optimizer_steps(tmp_path):
    rec = watch_config(str(tmp_path))
    try:
        torch.manual_seed(3)
        model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
        opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
        for _ in range(4):
            model(torch.ones(1, 2)).sum().backward()
            opt.step()
    finally:
        rec.close()
    data = json.loads(open(config_path(str(tmp_path), 0)).read())
    assert data["model"]["class"] == "Sequential" and data["determinism"]["torch_initial_seed"] == 3
    assert [b["step"] for b in data["batches"]] == [0, 1, 2]
    assert data["hyperparameters"]["optimizers"][0]["param_groups"][0]["momentum"] == 0.9


def test_nothing_is_recorded_in_a_fake_tensor_run(tmp_path):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True):
        model = nn.Linear(2, 2)
        ctx = TrainContext(rank=0, world_size=1, run="r", out_dir=str(tmp_path), engine="reference",
                           preset="tiny", device=torch.device("cpu"), model=model, optimizer=None,
                           config=None, max_steps=1, store=None)
        callback = RunConfigCallback()
        callback.on_train_start(ctx)
        callback.on_train_end(ctx)
        assert watch_config(str(tmp_path)) is None
    assert not (tmp_path / "config").exists()


@pytest.mark.parametrize("value", [float("nan"), torch.tensor(0.5), (1, 2), {"a": object()}])
def test_hyperparameters_of_any_type_become_json(tmp_path, value):
    rec = record_config(nn.Linear(1, 1), None, str(tmp_path))
    rec.add_hyperparameters(odd=value)
    rec.close()
    json.loads(open(config_path(str(tmp_path), 0)).read())
