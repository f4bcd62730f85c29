"""Detectors are pure functions over per-(rank, step) tables."""

import math
import random

import pyarrow as pa

from monitor.detectors import detect, nonfinite, slow_steps, stragglers


def sync_job(n_ranks=4, n_steps=12, slow_rank=None, factor=3.0, phase="compute", seed=0):
    """Rows of a synchronous data-parallel job: everyone waits in comm for the slowest rank."""
    rng = random.Random(seed)
    rows = []
    for step in range(n_steps):
        work = {}
        for r in range(n_ranks):
            compute, data = 80.0 * rng.uniform(0.95, 1.05), 5.0 * rng.uniform(0.9, 1.1)
            if r == slow_rank:
                if phase == "compute":
                    compute *= factor
                else:
                    data += 80.0 * (factor - 1)
            work[r] = (compute, data)
        slowest = max(c + d for c, d in work.values())
        for r, (compute, data) in work.items():
            comm = 10.0 + slowest - (compute + data)
            rows.append({"job": "j", "rank": r, "step": step, "compute_time_ms": compute,
                         "data_time_ms": data, "comm_time_ms": comm,
                         "step_time_ms": compute + data + comm, "loss": 2.0, "grad_norm": 1.0,
                         "nonfinite_grads": 0.0})
    return rows


def test_straggler_names_only_the_slow_rank_and_compute_as_cause():
    alerts = stragglers(sync_job(slow_rank=2))
    assert alerts and {a["rank"] for a in alerts} == {2}
    assert alerts[0]["evidence"]["cause"] == "compute"
    assert alerts[0]["step"] <= 3          # persist=3: flagged at the third slow step
    assert alerts[0]["evidence"]["ratio"] > 2.5


def test_straggler_in_data_loading_is_named_data_loading():
    alerts = stragglers(sync_job(slow_rank=1, phase="data"))
    assert {a["rank"] for a in alerts} == {1}
    assert {a["evidence"]["cause"] for a in alerts} == {"data loading"}


def test_straggler_in_communication_when_own_work_is_equal():
    rows = sync_job()
    for row in rows:
        if row["rank"] == 3:                 # its transfers take longer, so its steps do too
            row["comm_time_ms"] += 200.0
            row["step_time_ms"] += 200.0
    alerts = stragglers(rows)
    assert {a["rank"] for a in alerts} == {3}
    assert alerts[0]["evidence"]["cause"] == "communication"


def test_ranks_that_only_wait_longer_in_a_collective_are_not_stragglers():
    rows = sync_job()
    for row in rows:                         # ranks 0 and 1 wait; every step time stays equal
        if row["rank"] in (0, 1):
            row["comm_time_ms"] += 60.0
            row["compute_time_ms"] -= 60.0
    assert [a for a in stragglers(rows) if a["evidence"]["cause"] == "communication"] == []


def test_no_straggler_in_a_balanced_job_with_noise():
    assert stragglers(sync_job(seed=5)) == []
    assert slow_steps(sync_job(seed=5)) == []


def test_a_single_slow_step_is_not_a_straggler_but_is_a_slow_step():
    rows = sync_job(n_steps=15)
    for row in rows:
        if row["step"] == 12 and row["rank"] == 0:
            row["compute_time_ms"] *= 6
            row["step_time_ms"] += 400.0
    assert stragglers(rows) == []
    slow = slow_steps(rows)
    assert [(a["rank"], a["step"]) for a in slow] == [(0, 12)]
    assert slow[0]["evidence"]["phase"] == "compute"
    assert slow[0]["evidence"]["ratio"] > 3


def test_slow_step_threshold_follows_the_ranks_own_noise():
    noisy = [{"rank": 0, "step": s, "step_time_ms": 100.0 + (60.0 if s % 2 else 0.0)}
             for s in range(20)]
    noisy.append({"rank": 0, "step": 20, "step_time_ms": 170.0})   # within its usual spread
    assert slow_steps(noisy) == []
    steady = [{"rank": 0, "step": s, "step_time_ms": 100.0} for s in range(20)]
    steady.append({"rank": 0, "step": 20, "step_time_ms": 200.0})
    assert [a["step"] for a in slow_steps(steady)] == [20]


def test_slow_steps_need_history_and_only_look_at_asked_steps():
    rows = [{"rank": 0, "step": s, "step_time_ms": 10.0} for s in range(3)]
    rows.append({"rank": 0, "step": 3, "step_time_ms": 100.0})
    assert slow_steps(rows) == []            # 3 steps of history < min_history
    rows = [{"rank": 0, "step": s, "step_time_ms": 10.0 if s != 8 else 90.0} for s in range(12)]
    assert [a["step"] for a in slow_steps(rows, steps=[8])] == [8]
    assert slow_steps(rows, steps=[9, 10]) == []


def test_nonfinite_flags_nan_loss_inf_grad_norm_and_bad_gradients():
    rows = [{"rank": 0, "step": 0, "loss": 1.0, "grad_norm": 1.0, "nonfinite_grads": 0.0},
            {"rank": 1, "step": 1, "loss": math.nan, "grad_norm": 1.0, "nonfinite_grads": 0.0},
            {"rank": 2, "step": 2, "loss": 1.0, "grad_norm": math.inf, "nonfinite_grads": 12.0}]
    alerts = nonfinite(rows)
    assert [(a["rank"], a["step"]) for a in alerts] == [(1, 1), (2, 2)]
    assert "12 non-finite gradient values" in alerts[1]["message"]
    assert alerts[1]["evidence"]["nonfinite_grads"] == 12.0


def test_detect_takes_an_arrow_table_and_returns_alerts_with_evidence():
    table = pa.Table.from_pylist(sync_job(slow_rank=0))
    alerts = detect(table, steps=range(12), job="j")
    assert alerts and all(a["kind"] == "straggler" and a["rank"] == 0 for a in alerts)
    assert all({"job", "rank", "step", "message", "evidence"} <= set(a) for a in alerts)


def test_steps_run_under_a_deep_trace_do_not_make_the_traced_ranks_stragglers_or_slow():
    rows = sync_job(n_steps=16, slow_rank=2)
    for row in rows:                         # rank 0 traced at steps 6-9: 3.5x its work
        if row["rank"] == 0 and 6 <= row["step"] <= 9:
            row["compute_time_ms"] *= 3.5
            row["step_time_ms"] += 2.5 * 80.0
            row["traced"] = 1.0
    alerts = detect(rows)
    assert {a["rank"] for a in alerts if a["kind"] == "straggler"} == {2}
    assert not [a for a in alerts if a["kind"] == "slow_step" and a["rank"] == 0]
    # the untraced steps after the trace still see the slow rank against its peers
    assert any(a["rank"] == 2 and a["step"] >= 10 for a in alerts if a["kind"] == "straggler")
    # without the flag the same numbers would have blamed the traced ranks
    for row in rows:
        row.pop("traced", None)
    assert {a["rank"] for a in stragglers(rows)} == {0, 2}


def _traced_job_with_victims(slow_rank=2):
    """4 ranks, rank 2 slow; ranks 0 and 3 traced at steps 4-5. The profiler's start and its
    export after step 5 run outside the traced ranks' measured steps, so ranks 1 and 2 wait for
    them in the next collective (3 s of communication at step 6); at the traced steps the two
    untraced ranks share the CPU with the profilers, and rank 1 happens to compute longer."""
    rows = sync_job(n_steps=12, slow_rank=slow_rank)
    for row in rows:
        r, s = row["rank"], row["step"]
        if r in (0, 3) and s in (4, 5):
            row["traced"] = 1.0
        if r == 1 and s in (4, 5):
            row["compute_time_ms"] = 400.0
        if r in (1, 2) and s == 6:
            row["comm_time_ms"] += 3000.0
            row["step_time_ms"] += 3000.0
    return rows


def test_ranks_waiting_for_a_deep_trace_elsewhere_are_not_stragglers_or_slow():
    rows = _traced_job_with_victims()
    alerts = stragglers(rows)
    assert {a["rank"] for a in alerts} == {2}, [a["message"] for a in alerts]
    assert {a["evidence"]["cause"] for a in alerts} == {"compute"}
    # nor is their 3 s wait a slow step of theirs
    assert not [a for a in detect(rows) if a["kind"] == "slow_step"]
    # steps 4-5 have two untraced ranks (one peer each): not judged
    assert not {4, 5} & {s for a in alerts for s in a["evidence"]["outlier_steps"]}
    # without the rule, rank 1 was blamed for its compute at 4-5 and for waiting at 6
    assert {a["rank"] for a in stragglers([dict(r, traced=0.0) for r in rows
                                           if not r.get("traced")])} == {1, 2}


def test_a_communication_straggler_is_still_found_away_from_traces():
    rows = _traced_job_with_victims(slow_rank=None)
    for row in rows:                        # rank 3's link is slow from step 8 on
        if row["step"] >= 8:
            row["comm_time_ms"] += 300.0 if row["rank"] == 3 else 0.0
            row["step_time_ms"] += 300.0 if row["rank"] == 3 else 0.0
    alerts = stragglers(rows, steps=[10, 11])
    assert any(a["rank"] == 3 and a["evidence"]["cause"] == "communication" for a in alerts), \
        [a["message"] for a in alerts]
