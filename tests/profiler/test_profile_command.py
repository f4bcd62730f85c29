"""``probe profile`` end to end: a 2-rank gloo run of the bundled engine gives one valid trace."""

from __future__ import annotations

import json
import textwrap

import pytest

from probe.collectors.store import open_store
from probe.engine.config import get_preset
from tests.conftest import run_probe
from tests.profiler.test_flops import hand_count
from tests.profiler.trace_schema import inside, slices_of, trace_problems

PEAK_TFLOPS = 0.05


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory):
    """The 2-rank run; its spans also go over OTLP to a real receiver (the ``otlp`` extra: when
    it is installed, as in dev), kept in ``two_rank_run[2]`` (None without it)."""
    out = tmp_path_factory.mktemp("prof")
    receiver = None
    try:
        from tests.profiler.otlp_receiver import GrpcReceiver
        import opentelemetry.exporter.otlp.proto.grpc  # noqa: F401 - the exporter the run needs

        receiver = GrpcReceiver()
    except ImportError:
        pass
    otel = ["--otel", "otlp"] if receiver is not None else []
    env = {**receiver.env(), "OTEL_SERVICE_NAME": "tiny"} if receiver is not None else {}
    try:
        res = run_probe("profile", "--nproc", "2", "--max-steps", "3", "--steps", "1-2",
                        "--engine", "fused", "--peak-tflops", str(PEAK_TFLOPS), "--out", str(out),
                        *otel, env=env)
    finally:
        if receiver is not None:
            receiver.stop()         # each rank flushed its spans before it exited
    assert res.returncode == 0, res.stderr
    return out, res, receiver.spans if receiver is not None else None


def test_two_rank_trace_is_one_valid_perfetto_json_with_a_track_per_rank(two_rank_run):
    out, res, _ = two_rank_run
    trace = json.loads((out / "trace.json").read_text())
    assert trace_problems(trace) == []
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1"}
    assert "trace.json" in res.stdout
    for rank in (0, 1):
        loss = [e for e in trace["traceEvents"] if e["ph"] == "C" and e["pid"] == rank
                and e["name"] == "loss"]
        mfu = [e for e in trace["traceEvents"] if e["ph"] == "C" and e["pid"] == rank
               and e["name"] == "mfu"]
        assert len(loss) == len(mfu) == 2 and all(e["args"]["mfu"] > 0 for e in mfu)


def test_each_rank_has_step_user_and_all_reduce_ranges_nested_and_in_order(two_rank_run):
    out, _, _ = two_rank_run
    trace = json.loads((out / "trace.json").read_text())
    for rank in (0, 1):
        slices = slices_of(trace, rank)
        steps = [e for e in slices if e["cat"] == "step"]
        assert [e["name"] for e in steps] == ["step 1", "step 2"]
        for step in steps:
            within = [e for e in slices if e is not step and inside(e, step) and e["tid"] == step["tid"]]
            order = [e["name"] for e in within]
            assert order == ["fetch", "forward", "backward", "all_reduce", "optimizer"], order
            ar = within[3]
            assert ar["cat"] == "communication"
            assert ar["args"]["op"] == "all_reduce" and ar["args"]["group_size"] == 2
            assert ar["args"]["bytes"] > 0 and ar["args"]["step"] == step["args"]["step"]


def test_rank_clocks_are_aligned_so_the_same_all_reduce_overlaps_on_both_tracks(two_rank_run):
    out, _, _ = two_rank_run
    trace = json.loads((out / "trace.json").read_text())
    offsets = trace["otherData"]["ranks"]
    assert set(offsets) == {"0", "1"} and offsets["0"]["clock_offset_ns"] == 0
    # both ranks run on this host's one monotonic clock: what is measured is the method's error
    assert abs(offsets["1"]["clock_offset_ns"]) < 2_000_000
    by_rank = [[e for e in slices_of(trace, r) if e["name"] == "all_reduce"] for r in (0, 1)]
    slack_us = 5_000
    for a, b in zip(*by_rank):
        assert a["ts"] <= b["ts"] + b["dur"] + slack_us and b["ts"] <= a["ts"] + a["dur"] + slack_us


def test_each_rank_streamed_its_spans_over_otlp_all_reduce_nested_in_its_step(two_rank_run):
    _, _, spans = two_rank_run
    if spans is None:
        pytest.skip("the otlp extra is not installed")
    assert len(spans) == 24                                     # 2 ranks x 2 steps x 6
    for rank in (0, 1):
        mine = [s for s in spans if s["resource"]["probe.rank"] == rank]
        assert {s["attributes"]["probe.rank"] for s in mine} == {rank}
        for step in (1, 2):
            (root,) = [s for s in mine if s["name"] == f"step {step}"]
            assert root["parent_span_id"] == "" and root["attributes"]["probe.step"] == step
            children = sorted((s for s in mine if s["parent_span_id"] == root["span_id"]),
                              key=lambda s: s["start"])
            assert [c["name"] for c in children] == ["fetch", "forward", "backward", "all_reduce",
                                                     "optimizer"]
            comm = children[3]["attributes"]
            assert (comm["probe.kind"], comm["probe.op"], comm["probe.group_size"]) == ("comm", "all_reduce", 2)
            assert {c["trace_id"] for c in children} == {root["trace_id"]}
        resource = mine[0]["resource"]
        assert (resource["service.name"], resource["probe.world_size"]) == ("tiny", 2)


def test_event_records_and_flops_metrics_are_in_the_store_and_match_the_hand_count(two_rank_run):
    out, _, _ = two_rank_run
    con = open_store(out)
    kinds = dict(con.sql("select kind, count(*) from events group by kind").fetchall())
    assert kinds["step"] == 4 and kinds["comm"] == 4 and kinds["range"] == 16
    cfg = get_preset("tiny")
    expected = hand_count(cfg, batch=cfg.global_batch // 2)
    rows = con.sql("""select rank, step, max(case when name='flops' then value end),
                             max(case when name='mfu' then value end),
                             max(case when name='hfu' then value end),
                             max(case when name='step_time_ms' then value end)
                      from metrics group by rank, step""").fetchall()
    assert len(rows) == 6
    for rank, step, flops, mfu, hfu, ms in rows:
        assert abs(flops - expected) / expected < 0.02
        assert mfu == pytest.approx(flops / (ms / 1e3 * PEAK_TFLOPS * 1e12), rel=1e-6)
        assert hfu > mfu


def test_profile_runs_a_script_in_process_with_steps_from_the_optimizer(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import torch
        from probe.profiler import mstx
        model = torch.nn.Linear(8, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for i in range(4):
            with mstx.range("compute", domain="user"):
                model(torch.randn(2, 8)).sum().backward()
            opt.step()
    """))
    out = tmp_path / "out"
    res = run_probe("profile", "--steps", "1-2", "--peak-tflops", "1", "--out", str(out), "--",
                    str(script))
    assert res.returncode == 0, res.stderr
    trace = json.loads((out / "trace.json").read_text())
    assert trace_problems(trace) == []
    names = [e["name"] for e in slices_of(trace, 0)]
    assert names == ["step 1", "compute", "step 2", "compute"]
    con = open_store(out)
    assert con.sql("select count(*) from metrics where name = 'mfu'").fetchall()[0][0] == 4


def test_bad_options_are_one_line_errors(tmp_path):
    res = run_probe("profile", "--schedule", "1,x", "--out", str(tmp_path))
    assert res.returncode == 2 and "--schedule" in res.stderr and "Traceback" not in res.stderr
    res = run_probe("profile", "--out", str(tmp_path), "--", str(tmp_path / "missing.py"))
    assert res.returncode == 2 and "no such script" in res.stderr
    res = run_probe("profile", "--steps", "5", "--max-steps", "2", "--out", str(tmp_path))
    assert res.returncode == 2 and "--max-steps" in res.stderr


def test_drop_with_a_tiny_buffer_puts_the_drop_count_in_the_trace_the_store_and_the_summary(tmp_path):
    script = tmp_path / "loud.py"
    script.write_text(textwrap.dedent("""
        import torch
        from probe.profiler import mstx
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for i in range(2):
            for _ in range(5000):
                mstx.mark("tick", domain="user")
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
    """))
    out = tmp_path / "out"
    res = run_probe("profile", "--overflow", "drop", "--max-buffer", "100", "--no-flops",
                    "--out", str(out), "--", str(script))
    assert res.returncode == 0, res.stderr
    con = open_store(out)
    [(dropped,)] = con.sql("select value::BIGINT from metrics where name = 'mstx_dropped_records'").fetchall()
    [(kept,)] = con.sql("select count(*) from events where kind = 'mark'").fetchall()
    assert dropped > 0 and kept + dropped == 10_000
    trace = json.loads((out / "trace.json").read_text())
    assert trace_problems(trace) == []
    (label,) = [e for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "process_labels"]
    assert label["args"]["mstx_dropped_records"] == dropped
    assert f"{dropped} mstx records dropped (overflow drop)" in res.stdout            # the session's line
    assert f"{dropped} mstx records dropped under --overflow drop (rank 0: {dropped})" in res.stdout  # the trace's


def test_profile_refuses_an_out_that_probe_train_wrote_and_replaces_it_with_force(tmp_path):
    out = tmp_path / "run"
    assert run_probe("train", "--max-steps", "1", "--out", str(out)).returncode == 0
    res = run_probe("profile", "--max-steps", "1", "--no-flops", "--out", str(out))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "'probe train'" in res.stderr and "--force" in res.stderr
    assert not (out / "trace").exists()
    res = run_probe("profile", "--max-steps", "1", "--no-flops", "--force", "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert (out / "trace.json").exists()
    res = run_probe("profile", "--max-steps", "1", "--no-flops", "--fsync", "never", "--out", str(out))
    assert res.returncode == 0, res.stderr               # its own earlier output: replaced


def test_under_a_launcher_each_rank_replaces_only_its_own_part(tmp_path, monkeypatch):
    from probe.ground.errors import ProbeError
    from probe.ground.outdir import claim, owner
    from probe.commands.profile import ENTRIES, _claim

    out = tmp_path / "prof"
    claim(out, "profile", ENTRIES)
    for rank in (0, 1):
        (out / "store" / "event" / f"rank{rank}").mkdir(parents=True)
        (out / "trace").mkdir(exist_ok=True)
        (out / "trace" / f"rank{rank}.json").write_text("{}")
    (out / "trace.json").write_text("{}")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    _claim(str(out), force=False)
    assert sorted(p.name for p in (out / "store" / "event").iterdir()) == ["rank0"]
    assert sorted(p.name for p in (out / "trace").iterdir()) == ["rank0.json"]
    assert (out / "trace.json").exists()                  # rank 0's alone
    monkeypatch.setenv("RANK", "0")
    _claim(str(out), force=False)
    assert list((out / "store" / "event").iterdir()) == [] and not (out / "trace.json").exists()
    assert all(owner(out, name) == "profile" for name in ENTRIES)

    trained = tmp_path / "trained"
    claim(trained, "train", ["store"])
    (trained / "store" / "metric" / "rank1").mkdir(parents=True)
    for rank in ("0", "1"):
        monkeypatch.setenv("RANK", rank)
        with pytest.raises(ProbeError, match="'probe train'"):
            _claim(str(trained), force=False)
    assert (trained / "store" / "metric" / "rank1").is_dir()


@pytest.mark.slow
def test_a_script_under_torchrun_gives_one_trace_with_both_ranks_aligned_after_init(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "ddp.py"
    script.write_text(textwrap.dedent("""
        import torch, torch.distributed as dist
        from probe.profiler import mstx
        dist.init_process_group("gloo")
        model = torch.nn.Linear(16, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for i in range(3):
            with mstx.range("compute", domain="user"):
                model(torch.randn(8, 16)).sum().backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
            opt.step()
        dist.destroy_process_group()
    """))
    out = tmp_path / "out"
    with __import__("socket").socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                          "--master-port", str(port), "-m", "probe.cli", "profile", "--steps", "1",
                          "--out", str(out), "--", str(script)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    trace = json.loads((out / "trace.json").read_text())
    assert trace_problems(trace) == []
    assert set(trace["otherData"]["ranks"]) == {"0", "1"}
    for rank in (0, 1):
        slices = slices_of(trace, rank)
        (step,) = [e for e in slices if e["cat"] == "step"]
        inner = [e["name"] for e in slices if e is not step and inside(e, step)]
        assert inner == ["compute", "all_reduce", "all_reduce"]
