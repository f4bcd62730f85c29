"""Where the monitor service is: the one place env ``PROBE_MONITOR`` is read.

A rank streams to the service when ``PROBE_MONITOR=host:port`` is set (the bundled engine adds the
agent then); the client and the commands fall back on it when no address is given.

>>> from unittest import mock
>>> with mock.patch.dict(os.environ, {ADDR_ENV: "10.0.0.5:50051"}):
...     monitor_address()
'10.0.0.5:50051'
"""

from __future__ import annotations

import os

#: The environment variable naming the service: ``host:port``.
ADDR_ENV = "PROBE_MONITOR"
#: The address of a service started with no ``--host``/``--port``.
DEFAULT_ADDR = "127.0.0.1:50051"


def monitor_address() -> str | None:
    """The service address the environment names (``PROBE_MONITOR``), or None when it names none."""
    return os.environ.get(ADDR_ENV) or None
