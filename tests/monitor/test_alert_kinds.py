"""One table of alert kinds: the service's trigger parsing, the CLI help and the web banner read
it, so a kind added to it is accepted, documented and shown with nothing else to change."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from probe.ground.errors import ProbeError
from probe.monitor import alert_kinds
from probe.monitor.alert_kinds import ALERT_KINDS, AlertKind, urgency
from probe.monitor.service.server import parse_trace_on_alert
from probe.visualizer.cluster import open_alerts


def _help(*args: str) -> str:
    from probe.commands.monitor import command

    res = CliRunner().invoke(command, [*args, "--help"])
    assert res.exit_code == 0, res.output
    return " ".join(res.output.split())


def _banner(alerts: list[dict]) -> str:
    from probe.web.pages.live import banner

    return " | ".join("".join(getattr(part, "children", part) for part in line.children)
                      for line in banner(open_alerts(alerts, 10, urgency())))


def test_every_kind_in_the_table_is_in_the_cli_help_and_accepted_as_a_trigger():
    serve, alerts = _help("serve"), _help("alerts")
    dump_help = serve.split("--dump-on-alert STEPS")[1].split("--dump-on-alert-task")[0]
    for kind in ALERT_KINDS:
        assert kind.name in serve and f"{kind.name} ({kind.means})" in alerts
        assert parse_trace_on_alert([f"{kind.name}:2"]) == {kind.name: 2}
        assert (f" {kind.name}," in dump_help or f"({kind.name}," in dump_help
                or f" {kind.name})" in dump_help) == kind.dumps
    with pytest.raises(ProbeError, match="KIND one of nonfinite, "):
        parse_trace_on_alert(["no_such_kind:2"])


def test_the_banner_names_every_open_alert_most_urgent_first_hang_included():
    alerts = [{"kind": k.name, "rank": 1, "step": 9, "state": "open", "message": k.means} for k in ALERT_KINDS]
    text = _banner(list(reversed(alerts)) + [{"kind": "straggler", "rank": 2, "step": 3, "state": "closed"}])
    lines = text.split(" | ")
    assert [line.split(":")[0] for line in lines] == [f"⚠ {k.label}" for k in ALERT_KINDS]
    assert "hang: rank 1" in text and "rank 2" not in text


def test_a_kind_added_to_the_table_is_accepted_and_shown(monkeypatch):
    disk = AlertKind("disk_full", "a rank's disk is full", "disk full", "#c9184a")
    monkeypatch.setattr(alert_kinds, "ALERT_KINDS", (disk, *ALERT_KINDS))
    assert parse_trace_on_alert(["disk_full:3"]) == {"disk_full": 3}
    text = _banner([{"kind": "straggler", "rank": 0, "step": 9, "state": "open"},
                    {"kind": "disk_full", "rank": 4, "step": 8, "state": "open", "message": "no space"}])
    assert text.index("disk full: rank 4") < text.index("straggler: rank 0")
