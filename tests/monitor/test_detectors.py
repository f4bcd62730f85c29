"""Detectors are pure functions over per-(rank, step) series: they find what persists beyond
the noise they measure on the job, and nothing else."""

import math
import random

import numpy as np
import pyarrow as pa

from probe.monitor.detectors.step_detectors import (StepMatrix, derive, detect, hang_threshold_s,
                                                    hangs, memory_growth, nonfinite, slow_steps,
                                                    stragglers)


def sync_job(n_ranks=4, n_steps=12, slow_rank=None, factor=3.0, phase="compute", seed=0,
             jitter=0.05, onset=0):
    """Rows of a synchronous data-parallel job: everyone waits in comm for the slowest rank."""
    rng = random.Random(seed)
    rows = []
    for step in range(n_steps):
        work = {}
        for r in range(n_ranks):
            compute = 80.0 * math.exp(rng.gauss(0, jitter))
            data = 5.0 * math.exp(rng.gauss(0, 2 * jitter))
            if r == slow_rank and step >= onset:
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


def noisy_job(n_ranks=64, n_steps=200, seed=0, slow_rank=None, factor=1.0, onset=60):
    """A big job with heavy-tailed noise: 5% jitter, 1% of rank-steps a Pareto-tailed hiccup
    (up to 10x), each rank's garbage collection every ~50 steps, a bursty neighbour on one rank
    in 16 (1.1-1.4x for 1-3 steps, starting in 5% of steps)."""
    rng = np.random.default_rng(seed)
    S, R = n_steps, n_ranks
    compute = 100.0 * np.exp(rng.normal(0, 0.05, (S, R)))
    hit = rng.random((S, R)) < 0.01
    compute += np.where(hit, 100.0 * np.minimum(0.2 * (rng.pareto(1.5, (S, R)) + 1), 10), 0.0)
    gc = ((np.arange(S)[:, None] + rng.integers(0, 60, R)) % rng.integers(40, 61, R)) == 0
    compute += np.where(gc, rng.uniform(30, 80, (S, R)), 0.0)
    for r in range(7, R, 16):
        s = 0
        while s < S:
            if rng.random() < 0.05:
                n = int(rng.integers(1, 4))
                compute[s:s + n, r] *= rng.uniform(1.1, 1.4)
                s += n
            s += 1
    if slow_rank is not None:
        compute[onset:, slow_rank] *= factor
    data = 5.0 * np.exp(rng.normal(0, 0.1, (S, R)))
    own = compute + data
    comm = own.max(axis=1, keepdims=True) - own + 20.0
    return StepMatrix(np.arange(S), np.arange(R), {
        "compute_time_ms": compute, "data_time_ms": data, "comm_time_ms": comm,
        "step_time_ms": own + comm}, "j")


def test_straggler_names_only_the_slow_rank_and_compute_as_cause_once_it_persists():
    alerts = stragglers(sync_job(slow_rank=2))
    assert alerts and {a["rank"] for a in alerts} == {2}
    first = alerts[0]
    assert first["evidence"]["cause"] == "compute" and first["evidence"]["ratio"] > 2.5
    # four ranks: the noise is measured on 3 peers' few steps, and the detectors judge by the
    # noise the job may have (a standard error above what it showed, NOISE_SE), so a young job
    # needs ten steps, all of them slow, before the chance of it is below ALPHA
    assert 4 <= first["step"] <= 9
    assert first["evidence"]["k"] == first["evidence"]["n"] and first["evidence"]["chance"] < 1e-9
    assert f"in {first['evidence']['k']} of its last {first['evidence']['n']} steps" in first["message"]


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
    assert stragglers(rows) == []


def test_two_ranks_suffice_and_the_healthy_one_is_never_named():
    rows = sync_job(n_ranks=2, n_steps=14, slow_rank=1)
    alerts = stragglers(rows)
    assert {a["rank"] for a in alerts} == {1}
    # one peer: its noise is measured on one sample a step, and the rate (e + 1) / (n + 2)
    # stays near 1 / steps, so a 3x rank needs a dozen steps (the 14-step demo has them)
    assert alerts[0]["step"] <= 11


def test_a_balanced_job_with_heavy_tailed_noise_raises_nothing():
    m = noisy_job(n_ranks=64, n_steps=200, seed=3)
    assert detect(m, job="j") == []


def test_a_1_5x_straggler_in_a_noisy_64_rank_job_is_found_within_10_steps_and_alone():
    m = noisy_job(n_ranks=64, n_steps=120, seed=4, slow_rank=21, factor=1.5, onset=60)
    alerts = [a for a in detect(m, job="j") if a["kind"] == "straggler"]
    assert {a["rank"] for a in alerts} == {21}
    assert 60 <= alerts[0]["step"] <= 70


def test_a_1_2x_straggler_is_found_within_30_steps():
    m = noisy_job(n_ranks=64, n_steps=100, seed=5, slow_rank=9, factor=1.2, onset=60)
    alerts = stragglers(m)
    assert {a["rank"] for a in alerts} == {9} and alerts[0]["step"] <= 90


def test_a_rank_with_short_bursts_is_judged_by_its_own_past_not_named():
    m = noisy_job(n_ranks=16, n_steps=200, seed=6)
    c = m.cols["compute_time_ms"]
    for start in range(10, 200, 9):          # 2 steps of 1.6x out of every 9, all run long
        c[start:start + 2, 5] *= 1.6
    assert stragglers(m) == []


def test_a_lone_huge_hiccup_is_no_straggler_and_no_slow_step():
    rows = sync_job(n_steps=30)
    for row in rows:
        if row["step"] == 20 and row["rank"] == 0:
            row["compute_time_ms"] *= 10
            row["step_time_ms"] += 720.0
    assert detect(rows) == []


def test_a_persistent_job_slowdown_is_a_slow_step_with_its_phase_but_one_slow_step_is_not():
    rows = sync_job(n_steps=60, seed=1)
    for row in rows:                         # every rank computes 1.6x slower from step 40
        if row["step"] >= 40:
            row["compute_time_ms"] *= 1.6
            row["step_time_ms"] += 0.6 * 80.0
    alerts = slow_steps(rows)
    assert alerts and alerts[0]["rank"] is None and 44 <= alerts[0]["step"] <= 50
    assert alerts[0]["evidence"]["phase"] == "compute"
    assert stragglers(rows) == []            # nobody is slower than the others


def test_slow_links_slow_every_rank_and_are_a_slow_step_in_communication():
    rows = sync_job(n_steps=60, seed=2)
    for row in rows:                         # transfers 4x from step 40 (10 -> 40 ms)
        if row["step"] >= 40:
            row["comm_time_ms"] += 30.0
            row["step_time_ms"] += 30.0
    alerts = detect(rows)
    assert [a["kind"] for a in alerts][:1] == ["slow_step"]
    assert alerts[0]["evidence"]["phase"] == "communication"
    assert not [a for a in alerts if a["kind"] == "straggler"]



def test_a_slower_link_in_a_big_noisy_job_is_found_on_the_transfers_own_scale():
    """512 ranks: each step waits for the slowest rank's hiccup (steps of ~300 ms), so
    transfers going 20 -> 60 ms add only ~15% to the step, within the step's own noise; on
    their own scale they tripled, far above theirs."""
    healthy = noisy_job(n_ranks=512, n_steps=120, seed=8)
    assert not [a for a in detect(healthy) if a["kind"] in ("slow_step", "straggler")]
    slow = noisy_job(n_ranks=512, n_steps=120, seed=8)
    extra = np.where(np.arange(120) >= 80, 40.0, 0.0)[:, None]
    slow.cols["comm_time_ms"] = slow.cols["comm_time_ms"] + extra
    slow.cols["step_time_ms"] = slow.cols["step_time_ms"] + extra
    alerts = [a for a in detect(slow) if a["kind"] in ("slow_step", "straggler")]
    assert alerts and {a["kind"] for a in alerts} == {"slow_step"}
    first = alerts[0]
    assert first["evidence"]["phase"] == "communication" and first["evidence"]["own_scale"]
    assert 80 <= first["step"] <= 90 and "communication" in first["message"]

def test_a_job_slowed_by_a_new_straggler_is_not_a_slow_step():
    rows = sync_job(n_steps=60, slow_rank=3, factor=2.0, onset=40)
    kinds = {(a["kind"], a["rank"]) for a in detect(rows)}
    assert kinds == {("straggler", 3)}


def test_the_slow_step_threshold_follows_the_jobs_own_noise():
    rng = random.Random(1)
    noisy = [{"rank": 0, "step": s, "step_time_ms": rng.uniform(100.0, 170.0) + (10.0 if s >= 50 else 0)}
             for s in range(80)]                # 10 ms more, within its 70 ms swing
    assert slow_steps(noisy) == []
    steady = [{"rank": 0, "step": s, "step_time_ms": 100.0 + (s % 3)} for s in range(70)]
    for row in steady[50:]:                     # 40 ms more, far outside its 2 ms swing
        row["step_time_ms"] = 140.0
    assert 52 <= [a["step"] for a in slow_steps(steady)][0] <= 57


def test_detectors_only_judge_the_asked_steps_and_need_a_whole_window():
    rows = sync_job(n_steps=12, slow_rank=1)
    assert stragglers(rows, steps=[3]) == []              # 4 steps: shorter than any window
    assert [a["step"] for a in stragglers(rows, steps=[9, 10])] == [9, 10]
    assert stragglers(rows, steps=[40]) == []


def test_nonfinite_names_the_rank_whose_loss_went_nan_not_those_it_spread_to():
    rows = [{"rank": r, "step": s, "loss": 1.0, "grad_norm": 1.0, "nonfinite_grads": 0.0}
            for s in range(3) for r in range(4)]
    for row in rows:
        if row["step"] == 1:                 # rank 2's loss is NaN; the all-reduce spreads it
            row["grad_norm"], row["nonfinite_grads"] = math.nan, 12.0
            if row["rank"] == 2:
                row["loss"] = math.nan
        if row["step"] == 2 and row["rank"] == 3:
            row["grad_norm"] = math.inf
    alerts = nonfinite(rows)
    assert [(a["rank"], a["step"]) for a in alerts] == [(2, 1), (3, 2)]
    assert "loss = nan" in alerts[0]["message"] and "gradients on 4 of 4" in alerts[0]["message"]
    assert alerts[0]["evidence"]["loss_ranks"] == [2]


def test_a_missing_value_is_not_a_nan():
    rows = [{"rank": 0, "step": 0, "loss": 1.0}, {"rank": 1, "step": 0, "grad_norm": 2.0}]
    assert nonfinite(rows) == [] and nonfinite(pa.Table.from_pylist(rows)) == []


def test_memory_growing_on_one_rank_is_found_but_warm_up_on_all_is_not():
    rows = [{"rank": r, "step": s,
             "device_mem_mb": 20000.0 + 500.0 * min(s, 3) + (20.0 * max(0, s - 30) if r == 2 else 0)
             + (s * 7 + r * 3) % 5 * 0.1}
            for s in range(60) for r in range(8)]
    alerts = memory_growth(rows)
    assert {a["rank"] for a in alerts} == {2}
    assert 30 < alerts[0]["step"] <= 45 and alerts[0]["evidence"]["growth"] >= 0.01
    assert memory_growth([r for r in rows if r["step"] < 30]) == []


def test_arrow_tables_and_row_lists_read_the_same():
    rows = sync_job(slow_rank=0)
    by_arrow = detect(pa.Table.from_pylist(rows), steps=range(12), job="j")
    assert [(a["kind"], a["rank"], a["step"]) for a in by_arrow] == \
        [(a["kind"], a["rank"], a["step"]) for a in detect(rows, job="j")]
    assert by_arrow and all({"job", "rank", "step", "message", "evidence"} <= set(a) for a in by_arrow)


def test_series_derived_step_by_step_equal_those_derived_at_once():
    m = noisy_job(n_ranks=16, n_steps=80, seed=7)
    m.cols["traced"] = np.zeros_like(m.cols["step_time_ms"])
    m.cols["traced"][30:33, 4] = 1.0
    whole = derive(StepMatrix(m.steps, m.ranks, dict(m.cols), "j"))
    chunks = {}
    for lo, hi in ((0, 25), (25, 31), (31, 32), (32, 80)):
        sub = StepMatrix(m.steps[:hi], m.ranks, {k: v[:hi] for k, v in m.cols.items()}, "j",
                         derived={k: v[:lo] for k, v in chunks.items()})
        for k, v in derive(sub, lo).items():
            chunks[k] = v if k not in chunks else np.concatenate([chunks[k][:lo], v])
    for k, v in whole.items():
        np.testing.assert_array_equal(chunks[k], v, err_msg=k)


def test_steps_run_under_a_deep_trace_do_not_make_the_traced_ranks_stragglers_or_slow():
    rows = sync_job(n_ranks=8, n_steps=24, slow_rank=2)
    for row in rows:                         # rank 0 traced at steps 6-13: 3.5x its work
        if row["rank"] == 0 and 6 <= row["step"] <= 13:
            row["compute_time_ms"] *= 3.5
            row["step_time_ms"] += 2.5 * 80.0
            row["traced"] = 1.0
    alerts = detect(rows)
    assert {a["rank"] for a in alerts if a["kind"] == "straggler"} == {2}
    assert not [a for a in alerts if a["kind"] == "slow_step"]
    # the untraced steps after the trace still see the slow rank against its peers
    assert any(a["rank"] == 2 and a["step"] >= 15 for a in alerts if a["kind"] == "straggler")
    # without the flag the same numbers would have blamed the traced rank too
    for row in rows:
        row.pop("traced", None)
    assert 0 in {a["rank"] for a in stragglers(rows)}


def test_ranks_waiting_for_a_deep_trace_elsewhere_are_not_stragglers_or_slow():
    """4 ranks, rank 2 slow; ranks 0 and 3 traced at steps 4-5: ranks 1 and 2 wait 3 s for their
    profiler at step 6, and rank 1 computes longer while sharing the CPU with the profilers."""
    rows = sync_job(n_steps=12, slow_rank=2)
    for row in rows:
        r, s = row["rank"], row["step"]
        if r in (0, 3) and s in (4, 5):
            row["traced"] = 1.0
        if r == 1 and s in (4, 5):
            row["compute_time_ms"] = 400.0
        if r in (1, 2) and s == 6:
            row["comm_time_ms"] += 3000.0
            row["step_time_ms"] += 3000.0
    alerts = detect(rows)
    assert {(a["kind"], a["rank"]) for a in alerts} == {("straggler", 2)}
    assert {a["evidence"]["cause"] for a in alerts} == {"compute"}
    # steps 4-5 have two untraced ranks (one peer each): not judged
    assert not {4, 5} & {s for a in alerts for s in a["evidence"]["outlier_steps"]}


def _reports(waiting=(0, 2, 3), culprit=1, seq=8, wait_s=9.0, op="all_reduce"):
    reps = [{"rank": r, "step": 7, "pending": {"op": op, "seq": seq, "group": "world",
                                                "bytes": 4 << 20, "waiting_s": wait_s},
             "entered": {"world": seq}, "reported_s": 0.5} for r in waiting]
    if culprit is not None:
        reps.append({"rank": culprit, "step": 7, "pending": None, "entered": {"world": seq - 1},
                     "reported_s": 0.4})
    return reps


def test_a_hang_names_the_rank_that_never_entered_and_what_the_others_wait_in():
    [alert] = hangs(_reports(), threshold_s=5.0, job="j")
    assert alert["kind"] == "hang" and alert["rank"] == 1
    assert alert["message"].startswith("hang: rank 1 never entered all_reduce #8 (group world, 4.0 MiB)")
    assert "ranks 0, 2, 3 have waited in it for 9.0 s" in alert["message"]
    assert alert["evidence"]["culprits"] == [1] and alert["evidence"]["waiting_ranks"] == [0, 2, 3]


def test_a_rank_that_entered_the_collective_later_waits_in_it_too():
    """Rank 0 entered the all-reduce after ranks 2 and 3 (a loaded machine): its own wait is
    below the threshold while theirs is above it. It waits in the same collective; it is no
    rank "in all_reduce #8 instead" (the full end-to-end suite once named it, not rank 1)."""
    reps = _reports()
    reps[0]["pending"] = dict(reps[0]["pending"], waiting_s=4.0)
    [alert] = hangs(reps, threshold_s=5.0)
    assert alert["rank"] == 1 and alert["evidence"]["culprits"] == [1]
    assert alert["evidence"]["waiting_ranks"] == [0, 2, 3] and alert["evidence"]["elsewhere"] == []


def test_no_hang_before_the_threshold_nor_for_point_to_point_waits():
    assert hangs(_reports(wait_s=3.0), threshold_s=5.0) == []
    assert hangs(_reports(op="recv"), threshold_s=5.0) == []


def test_a_rank_in_another_collective_is_named_as_a_mismatch():
    reps = _reports(culprit=None)
    reps.append({"rank": 1, "step": 7, "pending": {"op": "broadcast", "seq": 8, "group": "world",
                                                   "waiting_s": 9.0}, "entered": {"world": 8},
                 "reported_s": 0.3})
    [alert] = hangs(reps, threshold_s=5.0)
    assert alert["rank"] == 1 and "is not in all_reduce #8" in alert["message"]
    assert "in broadcast #8 instead" in alert["message"]


def test_a_rank_not_heard_of_since_the_others_entered_is_awaited_then_blamed_if_silent():
    reps = _reports()
    reps[-1]["reported_s"] = 9.5             # its last report is older than the wait: unknown
    assert [a["rank"] for a in hangs(reps, threshold_s=5.0)] == [1]   # silent 9.5 s: frozen
    assert "silent for 9.5 s" in hangs(reps, threshold_s=5.0)[0]["message"]
    reps = _reports(wait_s=2.5)
    reps[-1]["reported_s"] = 2.7             # not heard of since they entered, but only just
    assert hangs(reps, threshold_s=2.0) == []
    reps[-1].pop("reported_s")               # a rank that never reports its collectives
    assert hangs(_reports()[:3] + [dict(reps[-1], reported_s=None)], threshold_s=5.0) == []


def test_when_every_rank_waits_the_collective_itself_is_blamed():
    [alert] = hangs(_reports(waiting=(0, 1, 2, 3), culprit=None), threshold_s=5.0)
    assert alert["rank"] is None and "no rank is missing" in alert["message"]


def test_hang_threshold_follows_the_jobs_step_times():
    assert hang_threshold_s([]) == 60.0                   # nothing finished yet: start-up
    assert hang_threshold_s([3000.0, 40.0, 50.0]) == 5.0  # the first step's start-up is not counted
    assert hang_threshold_s([1000.0] * 10) == 10.0        # ten typical steps
    assert hang_threshold_s([1000.0, 1000.0, 30000.0]) == 60.0   # twice the longest (a checkpoint)
