"""Who may talk to the monitor: a bearer token checked on every call, and optional TLS.

The service binds 127.0.0.1 by default and needs no token there. Binding any other address
requires a token (``--token`` or env ``PROBE_MONITOR_TOKEN``); when a token is set, every call
(registering, pushing, commands, queries, trace requests) must carry it as
``authorization: Bearer <token>`` metadata, or it is refused with ``UNAUTHENTICATED`` and a
message saying what to do. TLS uses a PEM certificate and key on the server and, on the client,
the CA that signed it (``PROBE_MONITOR_CA``).

>>> check_bind("127.0.0.1", None)
>>> check_bind("0.0.0.0", None)
Traceback (most recent call last):
...
probe.ground.errors.ProbeError: --host 0.0.0.0: serving on a non-loopback address needs a token; pass --token or set PROBE_MONITOR_TOKEN
"""

from __future__ import annotations

import hmac
import ipaddress
import os
from pathlib import Path
from typing import Any, Callable

import grpc

from probe.ground.errors import ProbeError

TOKEN_ENV = "PROBE_MONITOR_TOKEN"
CA_ENV = "PROBE_MONITOR_CA"
METADATA_KEY = "authorization"


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses (127.0.0.0/8, ::1)."""
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None) -> None:
    """Refuse to serve on a non-loopback address without a token."""
    if not is_loopback(host) and not token:
        raise ProbeError(f"--host {host}: serving on a non-loopback address needs a token; "
                         f"pass --token or set {TOKEN_ENV}")


def token_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """The call metadata that carries ``token`` (empty without one)."""
    return ((METADATA_KEY, f"Bearer {token}"),) if token else ()


def _read(path: str | os.PathLike, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise ProbeError(f"{path}: cannot read the TLS {what} ({e.strerror})") from None


def server_credentials(cert: str | None, key: str | None) -> grpc.ServerCredentials | None:
    """TLS credentials for the server from PEM files (None when neither is given)."""
    if not cert and not key:
        return None
    if not (cert and key):
        raise ProbeError("TLS needs both --tls-cert and --tls-key (PEM files)")
    return grpc.ssl_server_credentials([(_read(key, "key"), _read(cert, "certificate"))])


def open_channel(addr: str, ca: str | None, options: list[tuple[str, Any]]) -> grpc.Channel:
    """A client channel to ``addr``: TLS trusting the PEM CA in ``ca``, plaintext without one.

    >>> open_channel("127.0.0.1:50051", None, []).close()
    """
    if not ca:
        return grpc.insecure_channel(addr, options=options)
    creds = grpc.ssl_channel_credentials(root_certificates=_read(ca, "CA certificate"))
    return grpc.secure_channel(addr, creds, options=options)


class TokenInterceptor(grpc.ServerInterceptor):
    """Refuses every call whose ``authorization`` metadata is not ``Bearer <token>``."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

        def deny(request: Any, context: grpc.ServicerContext) -> None:
            context.abort(grpc.StatusCode.UNAUTHENTICATED,
                          "missing or wrong token: this monitor requires one; pass --token or set "
                          f"{TOKEN_ENV} to the token the service was started with")

        def deny_stream(request_iterator: Any, context: grpc.ServicerContext) -> None:
            deny(None, context)

        self._deny = {
            (False, False): grpc.unary_unary_rpc_method_handler(deny),
            (False, True): grpc.unary_stream_rpc_method_handler(deny),
            (True, False): grpc.stream_unary_rpc_method_handler(deny_stream),
            (True, True): grpc.stream_stream_rpc_method_handler(deny_stream),
        }

    def intercept_service(self, continuation: Callable, handler_call_details: Any) -> Any:
        for key, value in handler_call_details.invocation_metadata or ():
            if key == METADATA_KEY:
                got = value.encode() if isinstance(value, str) else value
                if hmac.compare_digest(got, self._expected):
                    return continuation(handler_call_details)
                break
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        return self._deny[(handler.request_streaming, handler.response_streaming)]
