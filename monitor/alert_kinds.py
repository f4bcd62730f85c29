"""The one table of alert kinds: what each means, how the live banner shows it, what it may trigger.

Every reader consults :data:`ALERT_KINDS`: the service's ``--trace-on-alert`` parsing and its
``--dump-on-alert`` hook (:mod:`probe.monitor.service.server`,
:mod:`probe.monitor.service.remote_control`), the help of ``probe monitor serve`` and
``probe monitor alerts``, and the web's live banner, which names every open alert in the table's
order (most urgent first) with its label and colour. A new kind of alert is one new row here and
a detector that raises it.

Every kind may trigger a deep trace of the rank it names (``--trace-on-alert KIND:STEPS``); a
kind with ``dumps`` names a module too, and ``--dump-on-alert`` dumps that module on that rank.

>>> [k.name for k in ALERT_KINDS][:3]
['nonfinite', 'numerics_nonfinite', 'hang']
>>> alert_kind("straggler").label, alert_kind("no such kind")
('straggler', None)
>>> urgency()["nonfinite"] < urgency()["slow_step"]
True
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AlertKind:
    """One kind of alert: its ``name`` (the ``kind`` of every alert of it), what it ``means`` in
    words, the banner's ``label`` and ``colour``, and whether it ``dumps`` (names a module that
    ``--dump-on-alert`` dumps)."""

    name: str
    means: str
    label: str
    colour: str
    dumps: bool = False


_RED, _ORANGE, _AMBER = "#c9184a", "#d9480f", "#b7791f"

#: Every alert kind the service raises, most urgent first (the banner's and the alert list's order).
ALERT_KINDS: tuple[AlertKind, ...] = (
    AlertKind("nonfinite", "NaN/Inf in the loss or the gradients, at the rank where it showed first",
              "NaN/Inf", _RED),
    AlertKind("numerics_nonfinite", "NaN/Inf in a module's output, weights or gradients, at the "
              "first module in execution order that has it", "NaN/Inf in a module", _RED, dumps=True),
    AlertKind("hang", "the ranks of a group stopped in a collective that a rank never entered",
              "hang", _RED),
    AlertKind("straggler", "a rank whose own work, or communication, stays slower than its peers'",
              "straggler", _ORANGE),
    AlertKind("rank_lost", "a rank that sent no batch or heartbeat for a while", "rank lost", _ORANGE),
    AlertKind("memory_growth", "a rank whose memory rises sample after sample", "memory growth",
              _AMBER),
    AlertKind("slow_step", "the job's steps became slower than its own recent history",
              "slow steps", _AMBER),
    AlertKind("numerics_update", "the optimizer step changed a weight by a large fraction of itself",
              "large update", _AMBER, dumps=True),
    AlertKind("numerics_outlier", "a module's value far outside its own recent history",
              "numerics outlier", _AMBER, dumps=True),
    AlertKind("numerics_layer_ratio", "a module's norm against the other modules' breaks its "
              "pattern", "layer ratio", _AMBER, dumps=True),
)


def kind_names() -> tuple[str, ...]:
    """The names of every alert kind, most urgent first.

    >>> "hang" in kind_names()
    True
    """
    return tuple(k.name for k in ALERT_KINDS)


def alert_kind(name: str) -> AlertKind | None:
    """The kind called ``name``, or None when the table has none.

    >>> alert_kind("numerics_update").dumps
    True
    """
    return next((k for k in ALERT_KINDS if k.name == name), None)


def urgency() -> dict[str, int]:
    """Each kind's place in the table: 0 is the most urgent.

    >>> urgency()["nonfinite"]
    0
    """
    return {k.name: i for i, k in enumerate(ALERT_KINDS)}
