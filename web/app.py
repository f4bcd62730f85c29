"""The Dash app: graph diff, live cluster, timeline and query pages in one server.

>>> app = create_app(dump_a="/work/shared/data/msprobe/torch_L0",        # doctest: +SKIP
...                  dump_b="/work/shared/data/msprobe/mindspore_L0")
>>> serve(app, "127.0.0.1", 8050)                                        # doctest: +SKIP
probe web: serving on http://127.0.0.1:8050/?token=...  (Ctrl-C to stop)

Pages: ``/`` (graph diff), ``/live``, ``/timeline``, ``/query``. The app reads its data through
:mod:`probe.visualizer`, ``monitor.client`` and ``collectors.store``; it computes no numerics itself.
Served, it sits behind :class:`probe.web.security.Guard`: a Host allow-list, and a token for every
request when bound beyond loopback, for the SQL page everywhere (docs/SECURITY.md).
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path
from typing import Any

from dash import Dash, Input, Output, State, dcc, html
from dash.exceptions import DependencyException

from probe.ground.errors import ProbeError
from probe.visualizer.diff import DiffGraph
from probe.web.pages import graph_diff, live, query, timeline
from probe.web.pages.live_source import LiveSource
from probe.web.security import TOKEN_ENV, WILDCARDS, Guard, new_token, tls_context

PAGES = [("/", "Graph diff"), ("/live", "Live cluster"), ("/timeline", "Timeline"), ("/query", "Query")]
PRIVATE_PATHS = ("/query",)           # need the token on loopback too
ASSETS = Path(__file__).with_name("assets")


def create_app(dump_a: str | os.PathLike | None = None, dump_b: str | os.PathLike | None = None,
               compare_dir: str | os.PathLike | None = None, monitor_addr: str | None = None,
               store_dirs: tuple[str | os.PathLike, ...] | list = (),
               trace_file: str | os.PathLike | None = None, *, job: str | None = None,
               refresh_ms: int = 2000, monitor_token: str | None = None,
               diff: DiffGraph | None = None, check_dirs: tuple[str | os.PathLike, ...] | list = ()) -> Dash:
    """Build the dashboard.

    ``dump_a``/``dump_b``: msprobe-format dumps (two: a diff; one: a single graph);
    ``compare_dir``: a ``probe compare --out`` directory for that pair (else they are compared
    now; alone, the dumps it names are opened); ``monitor_addr``: ``host:port`` of ``probe monitor serve`` for the live page;
    ``store_dirs``: run directories whose record store the live, timeline and query pages read;
    ``trace_file``: a merged Chrome/Perfetto trace JSON for the timeline; ``job``: the job the
    live page follows (default: the latest the monitor knows); ``diff``: a diff graph already
    built (instead of the dumps); ``check_dirs``: ``probe check-api --out`` folders of dump A
    (and B), whose flagged calls the graph marks (else a ``check/`` folder next to a dump is used).
    """
    if dump_a is None and dump_b is not None:
        dump_a, dump_b = dump_b, None
    if diff is None and (dump_a is not None or compare_dir is not None):
        diff = DiffGraph.from_dumps(dump_a, dump_b, compare_dir)
    stores = tuple(str(s) for s in store_dirs)
    for s in stores:
        if not Path(s).is_dir():
            raise ProbeError(f"{s}: no such run directory for the record store")
    if trace_file is not None and not Path(trace_file).is_file():
        raise ProbeError(f"{trace_file}: no such trace file")
    source = LiveSource(monitor_addr=monitor_addr, store_dirs=stores, job=job, token=monitor_token)

    app = Dash(__name__, title="probe", assets_folder=str(ASSETS), suppress_callback_exceptions=True,
               update_title=None)
    app.server.register_error_handler(DependencyException, _no_such_file)
    app.layout = html.Div([
        dcc.Location(id="url"),
        html.Nav([html.Span("probe", className="brand")]
                 + [dcc.Link(title, href=path, className="nav", id=f"nav-{path.strip('/') or 'graph'}")
                    for path, title in PAGES], className="topnav"),
        html.Div(id="page"),
    ])
    graph = graph_diff.GraphDiffPage(diff, dump_a, dump_b, compare_dir, check_dirs)
    pages = {
        "/": graph.layout,
        "/live": lambda: live.layout(source, refresh_ms),
        "/timeline": lambda: timeline.layout(trace_file, stores),
        "/query": lambda: query.layout(stores),
    }

    @app.callback(Output("page", "children"), Input("url", "pathname"), State("url", "search"))
    def route(path: str | None, search: str | None) -> Any:
        if (path or "/") == "/":
            return graph.layout(search)          # a link may name the dump to open
        build = pages.get(path or "/")
        return build() if build else html.Div([html.H2("Not found"), html.P(f"no page {path}")])

    graph.register(app)
    live.register(app, source, graph.catalog)
    timeline.register(app, trace_file, stores)
    query.register(app, stores)
    app.probe_diff = diff            # for tests and the demo's summary
    app.probe_source = source
    return app


def _no_such_file(e: Exception) -> tuple[str, int, dict[str, str]]:
    """A path under ``/_dash-component-suites`` that names no file Dash serves: 404, no traceback."""
    return "probe web: no such file\n", 404, {"Content-Type": "text/plain; charset=utf-8"}


class ServerThread:
    """Serve ``app`` behind its guard from a background thread (tests, the demo); ``stop()``
    ends it.

    ``token``: the dashboard's token (default: ``$PROBE_WEB_TOKEN``, else a fresh random one);
    ``allow_hosts``: more names the server may be reached by (the Host allow-list);
    ``tls_cert``/``tls_key``: PEM files to serve HTTPS with.

    >>> srv = ServerThread(create_app(), "127.0.0.1", 0)    # doctest: +SKIP
    >>> srv.url, srv.signed_url("/query")                     # doctest: +SKIP
    ('http://127.0.0.1:40123', 'http://127.0.0.1:40123/query?token=...')
    """

    def __init__(self, app: Dash, host: str = "127.0.0.1", port: int = 8050, *, token: str | None = None,
                 allow_hosts: tuple[str, ...] | list = (), tls_cert: str | None = None,
                 tls_key: str | None = None) -> None:
        import logging

        from werkzeug.serving import make_server

        self.token = token or os.environ.get(TOKEN_ENV) or new_token()
        tls = tls_context(tls_cert, tls_key)
        guard = Guard(app.server, token=self.token, host=host, allow_hosts=allow_hosts,
                      private_paths=PRIVATE_PATHS, secure=tls is not None)
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        try:
            self._server = make_server(host, port, guard, threaded=True, ssl_context=tls)
        except OSError as e:
            raise ProbeError(f"{host}:{port}: cannot listen ({e.strerror}); pick another --port") from None
        self.host, self.port = host, self._server.server_port
        shown = socket.gethostname() if host in WILDCARDS else host
        self.url = f"http{'s' if tls else ''}://{f'[{shown}]' if ':' in shown else shown}:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="probe-web", daemon=True)
        self._thread.start()

    def signed_url(self, path: str = "/") -> str:
        """The URL of page ``path`` with the token: opening it signs the browser in."""
        return f"{self.url}{path}?token={self.token}"

    def stop(self) -> None:
        self._server.shutdown()
        self._thread.join(timeout=5)


def serve(app: Dash, host: str = "127.0.0.1", port: int = 8050, *, token: str | None = None,
          allow_hosts: tuple[str, ...] | list = (), tls_cert: str | None = None,
          tls_key: str | None = None) -> None:
    """Serve ``app`` until interrupted (Ctrl-C: the server stops and ``KeyboardInterrupt`` goes
    on to the caller, so ``probe web`` exits 130), printing the URL to open (it carries the
    token; see :class:`ServerThread` for the options)."""
    srv = ServerThread(app, host, port, token=token, allow_hosts=allow_hosts, tls_cert=tls_cert,
                       tls_key=tls_key)
    print(f"probe web: serving on {srv.signed_url()}  (Ctrl-C to stop)", flush=True)
    try:
        threading.Event().wait()
    finally:
        srv.stop()
