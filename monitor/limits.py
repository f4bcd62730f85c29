"""The protocol's limits: what one message may hold, agreed by the agent and the service.

The service refuses what is over a limit (``INVALID_ARGUMENT`` or ``RESOURCE_EXHAUSTED``, the
reply naming the limit); the agent keeps under them, so it is never refused for size.
"""

from __future__ import annotations

from typing import Any

#: The most points one metric batch may carry (the service tells agents at registration).
MAX_BATCH_POINTS = 65_536
#: The largest message the service accepts, and the agent sends (bytes).
MAX_MESSAGE_BYTES = 8 * 1024 * 1024
#: The longest job, metric, agent, trace or file name (characters).
MAX_NAME_LEN = 256
#: The largest trace file a rank may upload (bytes).
MAX_TRACE_BYTES = 1 << 31


def check_name(value: str, what: str, context: Any) -> None:
    """Abort the call (``INVALID_ARGUMENT``) unless ``value`` is 1 to ``MAX_NAME_LEN`` characters.

    ``context`` is the call's ``grpc.ServicerContext``; ``what`` names the field in the reply.
    """
    import grpc

    if not value or len(value) > MAX_NAME_LEN:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                      f"{what} must be 1 to {MAX_NAME_LEN} characters (got {len(value)})")
