"""The live page's numbers: per-rank rows, alerts grouped and open, heat-map columns."""

from probe.visualizer.cluster import alert_groups, complete_steps, open_alerts, rank_summary, series

#: Alert kinds, most urgent first, as the monitor's table orders them.
URGENCY = {"nonfinite": 0, "straggler": 1, "slow_step": 2}


def points(steps, slow_rank=1, ranks=3):
    out = []
    for s in steps:
        for r in range(ranks):
            k = 3.0 if r == slow_rank else 1.0
            out += [{"rank": r, "step": s, "name": n, "value": v} for n, v in (
                ("compute_time_ms", 30.0 * k), ("step_time_ms", 100.0), ("comm_time_ms", 100.0 - 30.0 * k))]
    return out


def test_each_rank_is_measured_against_its_peers_and_the_straggler_named_by_an_alert_is_on_top():
    data = series(points(range(30)))
    rows = rank_summary(data, [{"kind": "straggler", "rank": 1, "step": 25, "message": "rank 1 computes 3x"}],
                        health={0: "ok", 1: "ok", 2: "stale"})
    assert [r["rank"] for r in rows][0] == 1 and rows[0]["straggler"] and rows[0]["ratio"] == 3.0
    assert rows[0]["peer_ms"] == 30.0 and rows[0]["comm_share"] == 0.1 and rows[0]["last_step"] == 29
    assert {r["rank"]: r["health"] for r in rows}[2] == "stale"
    # no alert: no straggler mark, the slowest still first
    rows = rank_summary(data)
    assert rows[0]["rank"] == 1 and not any(r["straggler"] for r in rows)


def test_alerts_are_counted_per_kind_and_rank_and_only_open_ones_reach_the_banner():
    flood = [{"kind": "slow_step", "rank": 0, "step": s, "message": f"step {s} slow"} for s in range(20)]
    alerts = flood + [{"kind": "straggler", "rank": 2, "step": 5, "last_step": 40, "count": 30, "state": "open",
                       "message": "rank 2"},
                      {"kind": "nonfinite", "rank": 1, "step": 3, "count": 1, "state": "closed", "message": "nan"}]
    groups = alert_groups(alerts, last_step=30, urgency=URGENCY)
    assert [(g["kind"], g["rank"], g["count"], g["open"]) for g in groups] == [
        ("straggler", 2, 30, True), ("slow_step", 0, 20, True), ("nonfinite", 1, 1, False)]
    assert groups[1]["first_step"] == 0 and groups[1]["last_step"] == 19 and groups[1]["message"] == "step 19 slow"
    assert [(a["kind"], a["rank"]) for a in open_alerts(alerts, last_step=40, urgency=URGENCY)] == [("straggler", 2)]
    # without a state, an alert is open while its cause was seen in the last steps
    assert open_alerts([{"kind": "straggler", "rank": 0, "step": 1}], last_step=100, urgency=URGENCY) == []


def test_heat_map_columns_are_the_steps_every_rank_has_reported():
    data = series(points(range(4)) + [{"rank": 0, "step": 4, "name": "compute_time_ms", "value": 30.0}])
    steps, values = complete_steps(data, "compute_time_ms", after=1)
    assert steps == [2, 3] and values[0] == [30.0, 90.0, 30.0]
