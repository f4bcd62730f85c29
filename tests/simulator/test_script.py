"""A user's script, simulated unchanged: value reads get placeholders, real-data needs are named."""

from __future__ import annotations

import json
import textwrap

SCRIPT = textwrap.dedent("""\
    import torch
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 32), torch.randint(0, 4, (64,)))
    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.Adam(model.parameters())
    for epoch in range(100):
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            print("loss", loss, float(loss), loss.item())
            if loss > 10:
                print("diverged")
    """)


def test_a_script_runs_unchanged_with_placeholders_and_stops_after_max_steps(tmp_path, probe_cli):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / "out"
    code, stdout, stderr = probe_cli("simulate", "--level", "1", "--max-steps", "3", "--out", str(out),
                                     "--", str(script))
    assert code == 0, stderr
    doc = json.loads((out / "simulation.json").read_text())
    assert doc["params"] == 32 * 64 + 64 + 64 * 4 + 4
    assert doc["workload"]["steps_traced"] == 3
    assert stdout.count("loss FakeTensor") == 2            # the third step stops in opt.step()
    notes = "\n".join(doc["notes"])
    assert "train.py:13" in notes and "read tensor values" in notes
    assert "train.py:14" in notes and "took a branch on a tensor value" in notes
    assert "train.py:8" in notes                            # the shuffling sampler's reads


def test_a_script_needing_real_data_gets_the_line_named_and_what_ran_is_kept(tmp_path, probe_cli):
    script = tmp_path / "needs.py"
    script.write_text(textwrap.dedent("""\
        import torch
        model = torch.nn.Linear(16, 16)
        x = torch.randn(4, 16)
        labels = torch.unique(torch.randint(0, 3, (10,)))
        print(labels)
        """))
    out = tmp_path / "out"
    code, _, stderr = probe_cli("simulate", "--level", "1", "--out", str(out), "--", str(script))
    assert code == 1
    assert "needs.py:4" in stderr and "needs the tensor's values" in stderr
    assert len(stderr.strip().splitlines()) <= 2 and "Traceback" not in stderr
    doc = json.loads((out / "simulation.json").read_text())
    assert doc["operators"]["total_ops_traced"] > 0
    assert any("no optimizer step" in n for n in doc["notes"])


def test_a_script_that_reads_a_missing_file_is_one_line_naming_it(tmp_path, probe_cli):
    script = tmp_path / "reads.py"
    script.write_text("import torch\nweights = torch.load('weights.pt')\n")
    code, _, stderr = probe_cli("simulate", "--level", "0", "--out", str(tmp_path / "out"), "--", str(script))
    assert code == 1
    assert "reads.py:2" in stderr and "weights.pt" in stderr


def test_a_data_parallel_script_runs_as_rank_0_of_nproc_with_ddp(tmp_path, probe_cli):
    script = tmp_path / "ddp.py"
    script.write_text(textwrap.dedent("""\
        import torch, torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        model = DDP(torch.nn.Linear(256, 256))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(10):
            model(torch.randn(32, 256)).sum().backward()
            opt.step()
            opt.zero_grad()
            print("rank", dist.get_rank(), "of", dist.get_world_size())
        dist.destroy_process_group()
        """))
    out = tmp_path / "out"
    code, stdout, stderr = probe_cli("simulate", "--nproc", "4", "--zero", "1", "--level", "3",
                                     "--out", str(out), "--", str(script))
    assert code == 0, stderr
    assert "rank 0 of 4" in stdout
    doc = json.loads((out / "simulation.json").read_text())
    assert doc["params"] == 256 * 256 + 256 and len(doc["ranks"][0]["ranks_like"]) == 4
    assert doc["step"]["comm_s"] > 0                     # the gradient sync DDP would run


def test_a_script_that_stops_before_any_tensor_keeps_its_exit_code_and_writes_empty_figures(tmp_path, probe_cli):
    script = tmp_path / "args.py"
    script.write_text("import argparse\nargparse.ArgumentParser().parse_args()\n")
    out = tmp_path / "out"
    code, _, stderr = probe_cli("simulate", "--level", "3", "--out", str(out), "--", str(script), "--bogus")
    assert code == 2 and "unrecognized arguments: --bogus" in stderr and "internal error" not in stderr
    doc = json.loads((out / "simulation.json").read_text())
    assert doc["operators"]["total_ops_traced"] == 0 and doc["ranks"][0]["memory"]["peak"] == 0
