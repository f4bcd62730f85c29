"""The agent's channel to the monitor service: opened once, registered again after each loss.

:meth:`AgentConnection.register` registers the rank (job, rank, world size, host, pid,
engine, agent id) and marks the connection up. A call that fails (the service is away, or
refused the token) goes to :meth:`AgentConnection.lost`: the connection is down, the reason is
said once per outage, ``on_lost`` is called (the agent spools what is unacknowledged), and the
next registration waits out a backoff that doubles from 0.2 s up to 2 s. A bad address or bad credentials are said once and tried again every 5 s.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any, Callable

from probe.monitor.limits import MAX_MESSAGE_BYTES


class AgentConnection:
    """One agent's gRPC channel and stub; see the module docstring.

    ``say(message)`` tells the user; ``lost_note`` ends the "unreachable" message (where the
    points go meanwhile); ``on_lost()`` is called each time the connection is lost.
    """

    def __init__(self, addr: str, *, job: str, rank: int, world_size: int, engine: str,
                 agent_id: str, token: str | None, ca: str | None, say: Callable[[str], None],
                 lost_note: str, on_lost: Callable[[], None]) -> None:
        from probe.monitor import auth

        self.addr, self.ca = addr, ca
        self.job, self.rank, self.world_size = job, rank, world_size
        self.engine, self.agent_id = engine, agent_id
        self.metadata = auth.token_metadata(token)
        self.say, self.lost_note, self.on_lost = say, lost_note, on_lost
        self.channel: Any = None
        self.stub: Any = None
        self.connected = False
        self._next_try = 0.0
        self._backoff = 0.2
        self._said: set[str] = set()

    def _say_once(self, key: str, message: str) -> None:
        if key not in self._said:
            self._said.add(key)
            self.say(message)

    def register(self) -> Any | None:
        """Register the rank; the service's reply, or None when not connected (yet)."""
        import grpc

        from probe.monitor import auth
        from probe.monitor.proto import monitor_pb2 as pb
        from probe.monitor.proto import monitor_pb2_grpc as pb_grpc

        if time.monotonic() < self._next_try:
            return None
        try:
            if self.channel is None:
                self.channel = auth.open_channel(
                    self.addr, self.ca, [("grpc.max_send_message_length", MAX_MESSAGE_BYTES)])
                self.stub = pb_grpc.MonitorStub(self.channel)
            reply = self.stub.Register(pb.RegisterRequest(
                job=self.job, rank=self.rank, world_size=self.world_size,
                host=socket.gethostname(), pid=os.getpid(), engine=self.engine,
                agent_id=self.agent_id), timeout=5.0, metadata=self.metadata)
        except grpc.RpcError as e:
            self.lost(e)
            return None
        except Exception as e:  # noqa: BLE001 - a bad address or credentials: say it once
            self._say_once("connect", f"cannot reach the monitor at {self.addr}: {e}")
            self._next_try = time.monotonic() + 5.0
            return None
        self.connected = True
        self._backoff = 0.2
        self._said.discard("unreachable")
        return reply

    def lost(self, error: Exception) -> None:
        """A call failed with ``error``: the connection is down until the next registration."""
        import grpc

        code = error.code() if isinstance(error, grpc.RpcError) else None
        if code == grpc.StatusCode.UNAUTHENTICATED:
            self._say_once("auth", f"the monitor at {self.addr} refused the token: "
                                   f"{error.details()}")
        else:
            self._say_once("unreachable", f"monitor at {self.addr} unreachable ({code}); "
                                          f"{self.lost_note}")
        self.connected = False
        self._next_try = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, 2.0)
        self.on_lost()

    def close(self) -> None:
        """Close the channel (a stream open on it ends)."""
        if self.channel is not None:
            self.channel.close()
