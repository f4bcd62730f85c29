"""The agent's command stream: held open on its own thread, each command handed on.

The stream opens once the agent has registered. When it breaks (the service went away, or was
restarted) the thread waits until the agent is connected again and opens a new one; it ends when
the service ends the stream (another agent registered for the rank) or the agent stops.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable


class CommandListener:
    """Reads one rank's command stream and calls ``handle(cmd)`` for each command.

    ``open_stream()`` opens the stream (an iterator of commands; it raises ``grpc.RpcError``
    when the service is away); ``connected()`` says whether the agent is registered now.
    """

    def __init__(self, open_stream: Callable[[], Any], handle: Callable[[Any], None], *,
                 connected: Callable[[], bool], stop: threading.Event, name: str) -> None:
        self.open_stream, self.handle = open_stream, handle
        self.connected, self.stop = connected, stop
        self.name = name
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the listening thread unless it runs already."""
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._listen, name=self.name, daemon=True)
            self._thread.start()

    def _listen(self) -> None:
        import grpc

        while not self.stop.is_set():
            try:
                for cmd in self.open_stream():
                    self.handle(cmd)
                return
            except grpc.RpcError:
                if self.stop.wait(0.5):
                    return
                while not self.connected() and not self.stop.is_set():
                    time.sleep(0.1)
