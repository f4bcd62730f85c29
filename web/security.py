"""Who may use the dashboard: a Host allow-list, an origin check and a token, before Dash sees a
request.

:class:`Guard` wraps the Flask app that Dash builds (a WSGI middleware) and decides, in order:

1. The ``Host`` header must name this server: ``localhost``, a loopback address (any IP address
   when bound beyond loopback: an address literal cannot be rebound), the host it was bound to,
   this machine's name when bound to every interface, or a name given with ``--allow-host``.
   Anything else gets 400. This stops DNS rebinding: a page of ``evil.example`` whose name is turned to 127.0.0.1
   still sends ``Host: evil.example``.
2. A request that changes something (any method but GET/HEAD) carrying an ``Origin`` header must
   come from the page it is served as: otherwise 403 (a cross-site form or script).
3. The token arrives as ``?token=...`` (the URL ``probe web`` prints; the reply sets an HttpOnly,
   SameSite=Strict cookie and sends the browser to the same page without the token, so Dash's
   own requests carry it from then on), as that cookie, or as ``Authorization: Bearer ...``. A
   wrong token gets 401.
4. Bound beyond loopback, every request needs the token (401 with one line of text otherwise).
   On loopback only the private pages (``/query``) do; a page's callbacks that act on the
   server call :func:`require` (403 without the token).

Before any of that, a request whose ``Content-Length`` is over :data:`MAX_BODY` gets 413 without
its body being read; a body streamed without a length (chunked) is read up to that size, and
refused with 413 past it.

>>> guard = Guard(flask_app, token="s3cret", host="127.0.0.1",            # doctest: +SKIP
...               private_paths=("/query",))
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
import socket
import ssl
from typing import Any, Callable, Iterable
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

from probe.ground.errors import ProbeError
from probe.monitor.auth import is_loopback

TOKEN_ENV = "PROBE_WEB_TOKEN"
AUTHORIZED = "probe.authorized"
WILDCARDS = ("0.0.0.0", "::", "")
TOKEN_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.~")
#: the largest request body the dashboard reads (bytes); a Dash callback sends a few kilobytes
MAX_BODY = 8 * 1024 * 1024
NEEDS_TOKEN = ("needs the dashboard's token: open the URL that `probe web` printed "
               "(it ends in ?token=...), or send 'Authorization: Bearer TOKEN'")


def new_token() -> str:
    """A fresh random token (URL-safe, 32 characters)."""
    return secrets.token_urlsafe(24)


def tls_context(cert: str | None, key: str | None) -> ssl.SSLContext | None:
    """A server TLS context from PEM certificate and key files (None when neither is given)."""
    if not cert and not key:
        return None
    if not (cert and key):
        raise ProbeError("TLS needs both --tls-cert and --tls-key (PEM files)")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as e:
        raise ProbeError(f"{cert}, {key}: cannot load the TLS certificate and key "
                         f"({getattr(e, 'strerror', None) or e})") from None
    return ctx


def host_name(netloc: str) -> str:
    """The host of a ``Host`` header or URL netloc, without port or IPv6 brackets, lower case.

    >>> host_name("LocalHost:8050"), host_name("[::1]:8050"), host_name("10.0.0.5")
    ('localhost', '::1', '10.0.0.5')
    """
    netloc = netloc.strip().lower()
    if netloc.startswith("["):
        return netloc[1:netloc.find("]")] if "]" in netloc else netloc
    return netloc.rsplit(":", 1)[0] if netloc.count(":") == 1 else netloc


def allowed_names(host: str, extra: Iterable[str] = ()) -> frozenset[str]:
    """The host names (not IP literals, which are always allowed) a server bound to ``host``
    answers to: localhost, the bound name, this machine's names when bound to every interface,
    and ``extra``."""
    names = {"localhost", host_name(host)} | {host_name(n) for n in extra}
    if host in WILDCARDS:
        names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
    return frozenset(n for n in names if n)


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _text(start_response: Callable, status: str, line: str, headers: list | None = None) -> list[bytes]:
    body = (line + "\n").encode()
    start_response(status, [("Content-Type", "text/plain; charset=utf-8"),
                            ("Content-Length", str(len(body))), ("Cache-Control", "no-store"),
                            *(headers or [])])
    return [body]


def _read_streamed(environ: dict) -> bool:
    """A body sent without a length: read it (at most :data:`MAX_BODY` bytes) and hand it on
    with its length; False when it is longer."""
    if "chunked" not in environ.get("HTTP_TRANSFER_ENCODING", "").lower():
        return True
    import io

    stream, parts, size = environ["wsgi.input"], [], 0
    while size <= MAX_BODY and (part := stream.read(min(65536, MAX_BODY + 1 - size))):
        parts.append(part)
        size += len(part)
    if size > MAX_BODY:
        return False
    environ["wsgi.input"], environ["CONTENT_LENGTH"] = io.BytesIO(b"".join(parts)), str(size)
    environ.pop("HTTP_TRANSFER_ENCODING", None)
    environ["wsgi.input_terminated"] = False
    return True


class Guard:
    """WSGI middleware in front of the dashboard: Host allow-list, origin check, token (see the
    module docstring); marks each request it lets through as authorised or not for
    :func:`authorized`."""

    def __init__(self, app: Callable, *, token: str, host: str, allow_hosts: Iterable[str] = (),
                 private_paths: Iterable[str] = (), secure: bool = False) -> None:
        if not token or not set(token) <= TOKEN_CHARS:
            raise ProbeError("--token: give a non-empty token of letters, digits and - _ . ~ only "
                             "(it travels in a URL and a cookie)")
        self.app = app
        self.token = token
        self.names = allowed_names(host, allow_hosts)
        self.everywhere = not is_loopback(host_name(host))
        self.private_paths = frozenset(private_paths)
        self.cookie_flags = "; Path=/; HttpOnly; SameSite=Strict" + ("; Secure" if secure else "")

    def _host_ok(self, netloc: str) -> bool:
        name = host_name(netloc)
        return name in self.names or (_is_ip(name) and (self.everywhere or ipaddress.ip_address(name).is_loopback))

    def _matches(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), self.token.encode())

    def __call__(self, environ: dict, start_response: Callable) -> Any:
        length = environ.get("CONTENT_LENGTH") or "0"
        if not length.isdigit():
            return _text(start_response, "400 Bad Request", f"probe web: bad Content-Length {length[:40]!r}")
        if int(length) > MAX_BODY or (not environ.get("CONTENT_LENGTH") and not _read_streamed(environ)):
            return _text(start_response, "413 Content Too Large",
                         f"probe web: a request body over the limit of {MAX_BODY} bytes is refused")
        host = environ.get("HTTP_HOST", "")
        if not self._host_ok(host):
            return _text(start_response, "400 Bad Request",
                         f"probe web: host {host!r} is not served here; open it by this server's own "
                         "name or address, or start probe web with --allow-host NAME")
        method = environ.get("REQUEST_METHOD", "GET")
        origin = environ.get("HTTP_ORIGIN")
        if origin and method not in ("GET", "HEAD") and urlsplit(origin).netloc.lower() != host.lower():
            return _text(start_response, "403 Forbidden",
                         f"probe web: a request from {origin} (another site) is refused")
        cookie_name = f"probe_web_{environ.get('SERVER_PORT', '')}"
        query = parse_qsl(environ.get("QUERY_STRING", ""), keep_blank_values=True)
        given = next((v for k, v in query if k == "token"), None)
        if given is not None:
            if not self._matches(given):
                return _text(start_response, "401 Unauthorized", "probe web: wrong token; this page " + NEEDS_TOKEN)
            if method in ("GET", "HEAD"):
                rest = urlencode([(k, v) for k, v in query if k != "token"])
                path = environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", "/")
                where = "/" + quote(path.lstrip("/")) + (f"?{rest}" if rest else "")
                return _text(start_response, "303 See Other", f"probe web: signed in; go to {where}", [
                    ("Location", where),
                    ("Set-Cookie", f"{cookie_name}={self.token}{self.cookie_flags}")])
        bearer = environ.get("HTTP_AUTHORIZATION", "")
        cookies = dict(c.strip().split("=", 1) for c in environ.get("HTTP_COOKIE", "").split(";") if "=" in c)
        ok = (self._matches(given) or (bearer.startswith("Bearer ") and self._matches(bearer[7:]))
              or self._matches(cookies.get(cookie_name)))
        if not ok and (self.everywhere or environ.get("PATH_INFO", "/") in self.private_paths):
            return _text(start_response, "401 Unauthorized", "probe web: this page " + NEEDS_TOKEN)
        environ[AUTHORIZED] = ok
        return self.app(environ, start_response)


def authorized() -> bool:
    """Inside a request: did it carry the dashboard's token? (False when no :class:`Guard` is in
    front of the app: a page served some other way stays private.)"""
    import flask

    return bool(flask.has_request_context() and flask.request.environ.get(AUTHORIZED))


def require(what: str) -> None:
    """Inside a request: refuse it with 403 and one line of text unless it carried the token.

    ``what``: the action in words, for the message (``"running SQL"``).
    """
    if not authorized():
        import flask

        flask.abort(flask.Response(f"probe web: {what} {NEEDS_TOKEN}\n", 403, mimetype="text/plain"))
