"""``probe train`` while it runs: progress lines in a pipe, --quiet, and a NaN/Inf loss reported
at its step with its rank, stopping the run with exit code 4 unless --allow-nan."""

from __future__ import annotations

import re

from probe.ground.errors import EXIT_NONFINITE
from tests.conftest import run_probe

PROGRESS = re.compile(r"^step (\d+) \((\d+)/(\d+)\): loss \d+\.\d{4}, \d+\.\d ms/step \[reference/tiny x1\]$")


def test_train_prints_plain_progress_lines_in_a_pipe_and_quiet_silences_them(tmp_path):
    r = run_probe("train", "--max-steps", "12", "--log-every", "5", "--out", str(tmp_path / "a"))
    assert r.returncode == 0, r.stderr
    assert "\r" not in r.stderr and "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("step ")]
    assert all(PROGRESS.match(ln) for ln in lines), lines
    assert [int(PROGRESS.match(ln).group(1)) for ln in lines] == [0, 4, 9, 11]   # first, every 5, last
    assert "trained reference/tiny on 1 rank for 12 steps (0-11); final loss" in r.stdout
    q = run_probe("train", "--max-steps", "2", "--quiet", "--out", str(tmp_path / "q"))
    assert q.returncode == 0 and q.stderr == "", q.stderr
    assert "for 2 steps (0-1)" in q.stdout


def test_a_nan_loss_is_reported_at_its_step_and_rank_and_stops_with_exit_code_4(tmp_path):
    r = run_probe("train", "--nproc", "2", "--max-steps", "6", "--fault", "nan:layers.0.attn:2",
                  "--quiet", "--out", str(tmp_path / "n"))
    assert r.returncode == EXIT_NONFINITE == 4, r.stderr
    assert "Traceback" not in r.stderr
    nan_lines = [ln for ln in r.stderr.splitlines() if "step 2: loss = nan" in ln]
    assert nan_lines == ["probe: ranks 0,1 step 2: loss = nan (gradient norm nan); training stops at "
                         "this step (exit code 4; --allow-nan trains on)"], r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("probe: error: the loss or gradient norm is "
                                                        "not finite at step 2")
    table = [ln.split()[0] for ln in r.stdout.splitlines() if ln.strip()[:1].isdigit()]
    assert table == ["0", "1", "2"]                     # stopped at the NaN step, which is recorded
    assert "for 3 steps (0-2); final loss nan" in r.stdout


def test_allow_nan_trains_on_to_the_end_and_exits_0(tmp_path):
    r = run_probe("train", "--max-steps", "4", "--fault", "nan:layers.0.attn:1", "--allow-nan",
                  "--quiet", "--out", str(tmp_path / "a"))
    assert r.returncode == 0, r.stderr
    assert r.stderr.strip() == "probe: rank 0 step 1: loss = nan (gradient norm nan); --allow-nan: training goes on"
    assert "for 4 steps (0-3); final loss nan" in r.stdout


def test_help_documents_the_exit_code_and_the_flags():
    r = run_probe("train", "--help")
    text = " ".join(r.stdout.split())
    assert "--allow-nan" in text and "--quiet" in text and "--log-every" in text
    assert "4 the loss or gradient norm turned NaN/Inf" in text


class _NanGradientAt:
    """A callback that turns one parameter's gradient NaN at one step (the loss stays finite)."""

    def __init__(self, step: int) -> None:
        self.step, self.handle = step, None

    def on_step_start(self, ctx, step):
        if step == self.step:
            param = next(ctx.model.parameters())
            self.handle = param.register_hook(lambda g: g * float("nan"))

    def on_step_end(self, ctx, step, metrics):
        if self.handle is not None:
            self.handle.remove()
            self.handle = None


def test_a_nan_gradient_with_a_finite_loss_names_the_rank_and_stops(tmp_path, logged):
    from probe.engine.launch import run_training
    from probe.engine.spec import RunSpec
    from probe.engine_adapter.callbacks import CallbackSpec, TrainCallback

    cls = type("NanGradientAt", (_NanGradientAt, TrainCallback), {})
    result = run_training(RunSpec(max_steps=4, out_dir=str(tmp_path), quiet=True,
                                  callbacks=(CallbackSpec(cls, {"step": 1}),)))
    err = logged()
    assert [r["step"] for r in result.steps] == [0, 1]
    assert re.search(r"^probe: rank 0 step 1: gradient norm = nan \(loss \d+\.\d{4}\); training stops", err, re.M), err
    row = result.first_nonfinite
    assert row["step"] == 1 and row["loss"] == row["loss"]        # the loss itself is finite


def test_dump_and_profile_of_a_nan_run_exit_4_after_writing_unless_allow_nan(tmp_path):
    d = run_probe("dump", "--fault", "nan:layers.0.attn:1", "--max-steps", "3", "-q", "--out", str(tmp_path / "d"))
    assert d.returncode == 4, d.stderr
    assert sorted(p.name for p in (tmp_path / "d").glob("step*")) == ["step0", "step1"]   # the NaN step is dumped
    assert "probe dump: module/statistics: 2 steps (0-1) on 1 rank" in d.stdout
    p = run_probe("profile", "--fault", "nan:layers.0.attn:1", "--max-steps", "3", "-q", "--allow-nan",
                  "--out", str(tmp_path / "p"))
    assert p.returncode == 0, p.stderr
    assert "for 3 steps (0-2)" in p.stdout and "step 1: loss = nan" in p.stderr


def test_finite_gradients_past_float32s_squares_train_on_with_their_norm(tmp_path):
    """lm_head scaled by 1e21: every gradient is finite, their norm ~1e21; float32's sum of
    squares overflowed, the step read the norm as inf and stopped the run at step 0 as a
    NaN/Inf gradient. The norm is summed again in float64 then."""
    from probe.collectors.store import open_store

    out = tmp_path / "big"
    r = run_probe("train", "--max-steps", "3", "--fault", "scale:lm_head.weight:1e21", "--quiet",
                  "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "for 3 steps (0-2)" in r.stdout
    norms = [v for (v,) in open_store(out).sql("select grad_norm from steps order by step").fetchall()]
    assert len(norms) == 3 and all(1e20 < v < 1e22 for v in norms), norms
