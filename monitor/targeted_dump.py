"""Targeted dumps: the service asks ranks to dump chosen modules for chosen steps, no restart.

``probe monitor dump --job J --ranks R --steps S-T --scope PATTERN`` (or a numerics alert, with
``probe monitor serve --dump-on-alert N``) makes the service queue a ``dump`` command for the
ranks; each rank's agent receives it on its command thread (:mod:`probe.monitor.agent.command_listener`),
and :class:`~probe.monitor.agent.callback.MonitorAgentCallback` files it in the
:class:`DumpSchedule` of its own runner (:class:`probe.monitor.agent.dump_runner.TargetedDumps`), which
takes each order at its first step, opens a dump session of the matching modules for exactly
those steps, closes it again, and writes msprobe's layout into the run folder::

    OUT/monitor_dumps/<dump id>/step{N}/rank{R}/dump.json, construct.json, stack.json

then sends the folder (or why there is none) back to the service through the agent
(``ReportDump``); ``probe monitor dumps`` lists them.

This module is the part both sides share: the order, the schedule, the folder layout and the
scope that picks one module (and what is inside it).

>>> s = DumpSchedule()
>>> s.add(DumpOrder("d1", -1, -1, next_steps=2, scope=module_scope("layers.1")), current=4)
DumpOrder(dump_id='d1', start=5, end=6, next_steps=2, scope='^Module\\\\.layers\\\\.1\\\\.', task='statistics', level='module')
>>> s.due(4), [o.dump_id for o in s.due(5)], s.due(5)
([], ['d1'], [])
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass, replace
from typing import Any

#: The folder of the run where targeted dumps go: ``OUT/monitor_dumps/<dump id>/``.
DUMP_DIR = "monitor_dumps"
#: What a targeted dump records: statistics (max, min, mean, norm per tensor) or whole tensors.
TASKS = ("statistics", "tensor")
#: Which entries: modules only, or modules and every API call inside them.
LEVELS = ("module", "mix")


@dataclass(frozen=True)
class DumpOrder:
    """One rank's share of a targeted dump: steps ``start..end`` (inclusive) of the entries
    whose name ``scope`` matches (``re.search``; empty: all)."""

    dump_id: str
    start: int
    end: int
    next_steps: int = 0
    scope: str = ""
    task: str = "statistics"
    level: str = "module"

    @classmethod
    def from_command(cls, cmd: Any) -> "DumpOrder":
        """The order of a ``dump`` command (:class:`probe.monitor.proto.monitor_pb2.Command`)."""
        return cls(cmd.id, int(cmd.start_step), int(cmd.end_step), int(cmd.next_steps),
                   cmd.scope, cmd.task or "statistics", cmd.level or "module")


def check_order(task: str, level: str, scope: str) -> str:
    """Why a dump cannot be asked for like this ("" when it can).

    >>> check_order("statistics", "module", "layers\\\\.0"), check_order("md5", "module", "")
    ('', "task 'md5': use statistics or tensor")
    >>> check_order("tensor", "api", ""), check_order("tensor", "mix", "(").split(" (")[0]
    ("level 'api': use module or mix", "scope '(': not a regular expression")
    """
    if task not in TASKS:
        return f"task {task!r}: use {' or '.join(TASKS)}"
    if level not in LEVELS:
        return f"level {level!r}: use {' or '.join(LEVELS)}"
    try:
        re.compile(scope or "")
    except re.error as e:
        return f"scope {scope!r}: not a regular expression ({e})"
    return ""


def module_scope(module: str) -> str:
    """The scope of one module and every module inside it: its dump entries are named
    ``Module.<path>.<Class>...`` (``Module.layers.1.mlp.MLP.forward.0``), and ``layers.1``
    must not pick ``layers.10``.

    >>> rx = re.compile(module_scope("layers.1"))
    >>> [bool(rx.search(n)) for n in ("Module.layers.1.Block.forward.0",
    ...  "Module.layers.1.mlp.down_proj.Linear.backward.0", "Module.layers.10.Block.forward.0")]
    [True, True, False]
    """
    return r"^Module\." + re.escape(module) + r"\."


def dump_folder(out_dir: str, dump_id: str) -> str:
    """Where a rank writes the dump ``dump_id``: ``<run folder>/monitor_dumps/<dump_id>``.

    >>> dump_folder("runs/live", "3f2a9c81d0be")
    'runs/live/monitor_dumps/3f2a9c81d0be'
    """
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", dump_id).strip(".") or "dump"
    return os.path.join(out_dir, DUMP_DIR, safe)


class DumpSchedule:
    """One rank's targeted-dump orders, between the command thread and the training thread.

    ``add`` (command thread) files an order, placing "the next N steps" after ``current``;
    ``due(step)`` (training thread) hands over the orders whose first step has come.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: list[DumpOrder] = []

    def add(self, order: DumpOrder, current: int) -> DumpOrder:
        if order.start < 0:
            start = current + 1
            order = replace(order, start=start, end=start + max(1, order.next_steps) - 1)
        with self._lock:
            self._pending.append(order)
        return order

    def due(self, step: int) -> list[DumpOrder]:
        if not self._pending:
            return []
        with self._lock:
            due = [o for o in self._pending if o.start <= step]
            self._pending = [o for o in self._pending if o.start > step]
        return due

    def drain(self) -> list[DumpOrder]:
        """Every order not started yet (the run ends)."""
        with self._lock:
            out, self._pending = self._pending, []
        return out

    def __len__(self) -> int:
        return len(self._pending)


def folder_size(path: str) -> tuple[int, int]:
    """(files, bytes) under ``path``."""
    files = nbytes = 0
    for root, _, names in os.walk(path):
        for name in names:
            try:
                nbytes += os.path.getsize(os.path.join(root, name))
                files += 1
            except OSError:
                pass
    return files, nbytes
