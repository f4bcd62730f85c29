"""The ranks the service knows while it runs, and the command queue of each.

Each (job, rank) has one :class:`RankState`: who registered it last (its ``agent_id``), when
it was last heard of, the collective it last said it was in (for hang diagnosis), and the
queue its command stream reads. A rank that registers again with
another agent replaces the earlier one: the old command stream is ended. A command for a rank
whose stream is not open waits, and is handed over when the stream opens. Nothing here is
persisted; the store keeps the rest.

>>> reg = RankRegistry()
>>> reg.register("job", 0, agent_id="a", world_size=2, host="h", pid=1, engine="e")
False
>>> reg.send("job", 0, "a command")                     # no stream open yet: it waits
False
>>> reg.open_stream("job", 0, "a").get_nowait()
'a command'
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RankState:
    """What the service knows of a rank while it runs (not persisted; the store has the rest)."""

    job: str
    rank: int
    world_size: int = 0
    host: str = ""
    pid: int = 0
    engine: str = ""
    agent_id: str = ""
    last_seen: float = 0.0
    last_step: int = -1
    final: bool = False
    connected: bool = False
    commands: "queue.Queue[Any]" = field(default_factory=queue.Queue)
    lost_alerted: bool = False
    #: from the rank's last batch or heartbeat: the step it is in, the collective it entered
    #: and has not left (op, seq, group, bytes, peer, waiting_s then), the last sequence number
    #: it entered per group, and when (service clock) that report came
    step_in: int = -1
    pending: dict[str, Any] | None = None
    entered: dict[str, int] = field(default_factory=dict)
    reported_at: float = 0.0

    def report(self, step_in: int, pending: dict[str, Any] | None, entered: dict[str, int],
               now: float) -> None:
        """Take the collective state a batch or heartbeat carried."""
        self.step_in, self.pending, self.entered, self.reported_at = step_in, pending, entered, now

    def collective_report(self, now: float) -> dict[str, Any]:
        """What :func:`probe.monitor.detectors.step_detectors.hangs` reads of this rank, aged to ``now``.

        >>> st = RankState("j", 1)
        >>> st.report(7, {"op": "all_reduce", "seq": 8, "group": "world", "waiting_s": 2.0}, {"world": 8}, 100.0)
        >>> st.collective_report(103.0)["pending"]["waiting_s"]
        5.0
        """
        pending = None
        if self.pending:
            age = max(0.0, now - self.reported_at)
            pending = dict(self.pending, waiting_s=float(self.pending.get("waiting_s", 0.0)) + age)
        heard = max(self.last_seen, self.reported_at)
        return {"rank": self.rank, "step": self.step_in, "pending": pending,
                "entered": dict(self.entered), "final": self.final,
                "heard_s": now - heard if heard else None,
                "reported_s": now - self.reported_at if self.reported_at else None}


class RankRegistry:
    """Every rank's :class:`RankState`, and the commands waiting for each; thread-safe."""

    def __init__(self) -> None:
        self._ranks: dict[tuple[str, int], RankState] = {}
        self._lock = threading.Lock()
        self._undelivered: dict[tuple[str, int], list[Any]] = {}

    def state(self, job: str, rank: int) -> RankState:
        """The rank's state, made (blank) on first use."""
        with self._lock:
            st = self._ranks.get((job, rank))
            if st is None:
                st = self._ranks[(job, rank)] = RankState(job=job, rank=rank)
            return st

    def get(self, job: str, rank: int) -> RankState | None:
        """The rank's state, or None when it was never heard of."""
        return self._ranks.get((job, rank))

    def states(self) -> list[RankState]:
        """Every rank's state, now."""
        with self._lock:
            return list(self._ranks.values())

    def ranks_of(self, job: str) -> list[int]:
        """The ranks of ``job`` heard of since the service started."""
        with self._lock:
            return [r for (j, r) in self._ranks if j == job]

    def register(self, job: str, rank: int, *, agent_id: str, world_size: int, host: str,
                 pid: int, engine: str) -> bool:
        """Record a registration; True when it replaces another agent of the rank."""
        st = self.state(job, rank)
        replaced = False
        with self._lock:
            if st.agent_id and st.agent_id != agent_id:
                replaced = True
                st.connected = False
                st.commands.put(None)           # ends the old agent's command stream
                st.commands = queue.Queue()
            st.world_size, st.host, st.pid = world_size, host, pid
            st.engine, st.agent_id = engine, agent_id
            st.last_seen, st.final, st.lost_alerted = time.time(), False, False
        return replaced

    def open_stream(self, job: str, rank: int, agent_id: str) -> "queue.Queue[Any] | None":
        """The command queue for the agent's stream, with the commands that waited for it;
        None when ``agent_id`` is not the agent registered for the rank."""
        st = self.state(job, rank)
        with self._lock:
            if st.agent_id and agent_id != st.agent_id:
                return None
            commands = st.commands
            st.connected = True
            waiting = self._undelivered.pop((job, rank), [])
        for cmd in waiting:
            commands.put(cmd)
        return commands

    def close_stream(self, job: str, rank: int, commands: "queue.Queue[Any]") -> None:
        """The stream reading ``commands`` ended: the rank is not connected (unless replaced)."""
        st = self.state(job, rank)
        with self._lock:
            if st.commands is commands:
                st.connected = False

    def send(self, job: str, rank: int, cmd: Any) -> bool:
        """Hand ``cmd`` to the rank's open stream (True), or keep it until one opens (False)."""
        with self._lock:
            st = self._ranks.get((job, rank))
            if st is not None and st.connected:
                st.commands.put(cmd)
                return True
            self._undelivered.setdefault((job, rank), []).append(cmd)
            return False
