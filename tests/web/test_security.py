"""Who may use the dashboard, over real HTTP to a real server: the Host allow-list, the token
and its cookie, the origin check, and the Query page's SQL sandbox behind them."""

from __future__ import annotations

import http.client
import json
import re
import subprocess
import sys

import pytest

from probe.collectors.store import StoreWriter, find_segments
from tests.conftest import run_probe
from probe.web.app import ServerThread, create_app

TOKEN = "t0ken-for-tests"


def _store(run_dir):
    with StoreWriter(run_dir, rank=0, run="r") as w:
        for step in range(3):
            w.write_rows("metric", [{"job": "r", "rank": 0, "step": step, "name": "loss", "value": 2.0}])
            w.end_step(step)
        w.write_rows("tensor", [{"run": "r", "rank": 0, "step": 0, "seq": i, "node": f"Module.m{i}.forward.0",
                                 "node_kind": "module", "direction": "forward", "slot": "output"}
                                for i in range(4)])
    return str(run_dir)


@pytest.fixture
def server():
    """``server(app, host=...)`` serves ``app`` with the token ``TOKEN``; the servers stop after."""
    started = []

    def start(app, host="127.0.0.1", token=TOKEN, **kw):
        srv = ServerThread(app, host, 0, token=token, **kw)
        started.append(srv)
        return srv
    yield start
    for srv in started:
        srv.stop()


def request(srv, method, path, headers=None, body=None):
    """``(status, headers, body text)`` of one request to ``srv`` over loopback."""
    con = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
    try:
        con.request(method, path, body=body, headers=headers or {})
        r = con.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read().decode()
    finally:
        con.close()


def sign_in(srv):
    """The cookie header value a browser holds after opening the printed URL."""
    status, headers, _ = request(srv, "GET", f"/?token={TOKEN}")
    assert status == 303 and headers["location"] == "/"
    assert "HttpOnly" in headers["set-cookie"] and "SameSite=Strict" in headers["set-cookie"]
    return headers["set-cookie"].split(";")[0]


def run_sql(srv, store, sql, cookie=None, origin=None):
    """What the Query page's Run button sends (Dash's callback request), as ``request`` returns."""
    body = json.dumps({
        "output": "..q-table.data...q-table.columns...q-chart.figure...q-error.children...q-count.children..",
        "outputs": [{"id": i, "property": p} for i, p in (("q-table", "data"), ("q-table", "columns"),
                                                            ("q-chart", "figure"), ("q-error", "children"),
                                                            ("q-count", "children"))],
        "inputs": [{"id": "q-run", "property": "n_clicks", "value": 1}],
        "changedPropIds": ["q-run.n_clicks"],
        "state": [{"id": "q-sql", "property": "value", "value": sql},
                  {"id": "q-store", "property": "value", "value": store}]})
    headers = {"Content-Type": "application/json"}
    headers.update({"Cookie": cookie} if cookie else {})
    headers.update({"Origin": origin} if origin else {})
    return request(srv, "POST", "/_dash-update-component", headers, body)


def answer(text):
    """The table rows and the error text of a Query callback reply."""
    out = json.loads(text)["response"]
    return out["q-table"]["data"], out["q-error"]["children"], out["q-count"]["children"]


def test_the_query_page_and_its_sql_need_the_token_on_loopback(server, tmp_path):
    store = _store(tmp_path)
    srv = server(create_app(store_dirs=[store]))
    assert request(srv, "GET", "/")[0] == 200                 # the other pages are open on loopback
    status, _, text = request(srv, "GET", "/query")
    assert status == 401 and "token" in text and text.count("\n") == 1
    status, _, text = run_sql(srv, store, "select content from read_text('/etc/hostname')")
    assert status == 403 and "running SQL needs the dashboard's token" in text and text.count("\n") == 1
    assert request(srv, "GET", "/query?token=wrong")[0] == 401
    cookie = sign_in(srv)
    assert request(srv, "GET", "/query", {"Cookie": cookie})[0] == 200
    assert request(srv, "GET", "/query", {"Authorization": f"Bearer {TOKEN}"})[0] == 200
    status, _, text = run_sql(srv, store, "select count(*) as n from tensors", cookie)
    assert status == 200 and answer(text)[0] == [{"n": 4}]


def test_two_dashboards_on_one_machine_keep_their_own_cookies(server, tmp_path):
    store = _store(tmp_path)
    one, two = server(create_app(store_dirs=[store])), server(create_app(store_dirs=[store]))
    assert sign_in(one).split("=")[0] != sign_in(two).split("=")[0]
    assert run_sql(two, store, "select 1", sign_in(one))[0] == 403


def test_beyond_loopback_every_request_needs_the_token(server):
    srv = server(create_app(), host="0.0.0.0")
    for path in ("/", "/_dash-layout", "/_dash-dependencies", "/assets/style.css"):
        status, _, text = request(srv, "GET", path)
        assert status == 401 and text.startswith("probe web:"), path
    cookie = sign_in(srv)
    assert request(srv, "GET", "/_dash-layout", {"Cookie": cookie})[0] == 200
    assert srv.signed_url().endswith(f":{srv.port}/?token={TOKEN}")


@pytest.mark.parametrize("host, status", [
    ("evil.example", 400), ("evil.example:8050", 400), ("127.0.0.1.evil.example", 400), ("10.1.2.3", 400),
    ("127.0.0.1", 200), ("localhost:8050", 200), ("[::1]:8050", 200), ("dash.lab.example", 200),
])
def test_only_requests_naming_this_server_are_answered(server, host, status):
    srv = server(create_app(), allow_hosts=("dash.lab.example",))
    got, _, text = request(srv, "GET", "/", {"Host": host})
    assert got == status, text
    if status == 400:
        assert f"host '{host}' is not served here" in text and "--allow-host" in text


def test_a_cross_site_post_is_refused_even_with_the_cookie(server, tmp_path):
    store = _store(tmp_path)
    srv = server(create_app(store_dirs=[store]))
    cookie = sign_in(srv)
    status, _, text = run_sql(srv, store, "select 1", cookie, origin="http://evil.example")
    assert status == 403 and "another site" in text
    assert run_sql(srv, store, "select 1", cookie, origin=f"http://127.0.0.1:{srv.port}")[0] == 200


@pytest.mark.parametrize("sql", ["select content from read_text('/etc/hostname')",
                                 "copy (select 1) to '{tmp}/written.csv'",
                                 "attach '{tmp}/written.duckdb' as other",
                                 "set enable_external_access = true"])
def test_the_query_page_refuses_files_and_settings_even_signed_in(server, tmp_path, sql):
    store = _store(tmp_path / "run")
    srv = server(create_app(store_dirs=[store]))
    status, _, text = run_sql(srv, store, sql.format(tmp=tmp_path), sign_in(srv))
    rows, error, _ = answer(text)
    assert status == 200 and rows == [] and error.startswith("SQL refused")
    assert not list(tmp_path.glob("written*"))


def test_the_query_page_answers_past_a_corrupt_segment_and_says_so(server, tmp_path):
    store = _store(tmp_path)
    bad = find_segments(tmp_path)["metric"][0]
    with open(bad, "wb") as f:
        f.write(b"PAR1 half a segment")
    srv = server(create_app(store_dirs=[store]))
    status, _, text = run_sql(srv, store, "select count(*) as n from steps", sign_in(srv))
    rows, error, count = answer(text)
    assert status == 200 and rows == [{"n": 2}] and not error and bad in count
    assert request(srv, "GET", "/live")[0] == 200


def test_the_trace_file_is_readable_cross_site_by_perfetto_alone(server, tmp_path):
    trace = tmp_path / "trace.json"
    trace.write_text('{"traceEvents": []}')
    srv = server(create_app(trace_file=trace))
    _, headers, _ = request(srv, "GET", "/files/trace.json")
    assert headers["access-control-allow-origin"] == "https://ui.perfetto.dev"


def test_a_token_that_cannot_travel_in_a_url_is_refused_in_one_line():
    r = run_probe("web", "--token", "a b;c", "--port", "0", timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--token" in r.stderr


def test_probe_web_prints_a_url_that_signs_in(tmp_path):
    import urllib.error
    import urllib.request

    store = _store(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "probe.cli", "web", "--store", store, "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        m = re.search(r"serving on (http://127\.0\.0\.1:\d+)/\?token=([\w.~-]{20,})", line)
        assert m, (line, proc.stderr.read() if proc.poll() is not None else "")
        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
        with pytest.raises(urllib.error.HTTPError) as refused:
            browser.open(m.group(1) + "/query", timeout=30)
        assert refused.value.code == 401
        with browser.open(f"{m.group(1)}/query?token={m.group(2)}", timeout=30) as r:
            assert r.status == 200 and r.url == m.group(1) + "/query"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_with_tls_the_dashboard_speaks_https_and_its_cookie_is_secure(server, tmp_path):
    import shutil
    import ssl

    if not shutil.which("openssl"):
        pytest.skip("openssl is needed to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    srv = server(create_app(), tls_cert=str(cert), tls_key=str(key))
    assert srv.signed_url().startswith(f"https://127.0.0.1:{srv.port}/?token=")
    con = http.client.HTTPSConnection("127.0.0.1", srv.port, timeout=30,
                                      context=ssl.create_default_context(cafile=str(cert)))
    con.request("GET", f"/?token={TOKEN}")
    r = con.getresponse()
    assert r.status == 303 and "; Secure" in r.getheader("Set-Cookie")
    with pytest.raises((http.client.HTTPException, ConnectionError)):    # plain HTTP gets no page
        request(srv, "GET", "/")


def test_a_missing_tls_key_is_one_line(tmp_path):
    r = run_probe("web", "--tls-cert", str(tmp_path / "cert.pem"), "--port", "0", timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--tls-key" in r.stderr


def press_trace(srv, ranks, steps, cookie=None):
    """What the live page's "Request trace" button sends, as ``request`` returns."""
    body = json.dumps({
        "output": "l-trace-msg.children", "outputs": {"id": "l-trace-msg", "property": "children"},
        "inputs": [{"id": "l-trace", "property": "n_clicks", "value": 1}],
        "changedPropIds": ["l-trace.n_clicks"],
        "state": [{"id": "l-ranks", "property": "value", "value": ranks},
                  {"id": "l-steps", "property": "value", "value": steps}]})
    headers = {"Content-Type": "application/json", **({"Cookie": cookie} if cookie else {})}
    return request(srv, "POST", "/_dash-update-component", headers, body)


def test_the_live_pages_trace_button_needs_the_dashboards_token(server, monkeypatch):
    from probe.web.pages.live_source import LiveSource

    asked = []
    monkeypatch.setattr(LiveSource, "request_trace", lambda self, r, a, b: asked.append((r, a, b)) or "requested")
    srv = server(create_app(monitor_addr="127.0.0.1:9", monitor_token="monitor-secret"))
    status, _, text = press_trace(srv, "0,1", "5-7")
    assert status == 200 and "needs the dashboard's token" in text and asked == []
    status, _, text = request(srv, "GET", "/live")
    assert status == 200                                 # the page itself: it renders "needs the token"
    status, _, text = press_trace(srv, "0,1", "5-7", sign_in(srv))
    assert status == 200 and "requested" in text and asked == [([0, 1], 5, 7)]


def test_the_live_page_of_a_token_protected_monitor_shows_nothing_without_the_token(server):
    srv = server(create_app(monitor_addr="127.0.0.1:9", monitor_token="monitor-secret"))
    body = json.dumps({"output": "page.children", "outputs": {"id": "page", "property": "children"},
                       "inputs": [{"id": "url", "property": "pathname", "value": "/live"}],
                       "changedPropIds": ["url.pathname"], "state": [{"id": "url", "property": "search", "value": ""}]})
    _, _, text = request(srv, "POST", "/_dash-update-component", {"Content-Type": "application/json"}, body)
    assert "needs a token" in text and "l-tick" not in text
    _, _, text = request(srv, "POST", "/_dash-update-component",
                         {"Content-Type": "application/json", "Cookie": sign_in(srv)}, body)
    assert "l-tick" in text


def test_the_live_pages_rank_box_is_capped(server, monkeypatch):
    from probe.web.pages.live_source import LiveSource

    monkeypatch.setattr(LiveSource, "request_trace", lambda self, r, a, b: "requested")
    srv = server(create_app(monitor_addr="127.0.0.1:9"))
    status, _, text = press_trace(srv, "0-10000000", "5-7", sign_in(srv))
    assert status == 200 and "selects more than 65536 values" in text


def test_a_too_large_body_is_refused_before_it_is_read_and_pages_still_answer(server):
    import socket
    import time

    from probe.web.security import MAX_BODY

    srv = server(create_app())
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
    try:
        sock.sendall((f"POST /_dash-update-component HTTP/1.1\r\nHost: 127.0.0.1:{srv.port}\r\n"
                      f"Content-Type: application/json\r\nContent-Length: {400 * 1024 * 1024}\r\n\r\n").encode()
                     + b"{" * 65536)                  # 64 KB of the 400 MB it announces
        started = time.monotonic()
        reply = b""
        while b"over the limit" not in reply and (chunk := sock.recv(4096)):
            reply += chunk
        reply = reply.decode()
        assert reply.startswith("HTTP/1.1 413") and f"over the limit of {MAX_BODY} bytes" in reply
        assert time.monotonic() - started < 5
        assert request(srv, "GET", "/")[0] == 200         # the dashboard answers meanwhile
    finally:
        sock.close()
    status, _, text = request(srv, "POST", "/_dash-update-component",
                              {"Content-Type": "application/json", "Content-Length": "abc"}, b"")
    assert status == 400 and "bad Content-Length" in text


def test_a_body_streamed_without_a_length_is_cut_at_the_limit(server):
    from probe.web.security import MAX_BODY

    srv = server(create_app())
    con = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
    try:
        chunks = (b"[" + b"0," * (1024 * 1024) for _ in range(MAX_BODY // (1024 * 1024) + 2))
        con.request("POST", "/_dash-update-component", body=chunks,
                    headers={"Content-Type": "application/json", "Transfer-Encoding": "chunked"},
                    encode_chunked=True)
        assert con.getresponse().status == 413
    finally:
        con.close()
    small = json.dumps({"output": "x"}).encode()
    con = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
    try:                                          # a small one streamed the same way still arrives
        con.request("POST", "/_dash-update-component", body=iter([small]),
                    headers={"Content-Type": "application/json", "Transfer-Encoding": "chunked"},
                    encode_chunked=True)
        response = con.getresponse()
        assert response.status not in (400, 413), response.read()
    finally:
        con.close()


@pytest.mark.parametrize("path", ["/_dash-component-suites/nope/x.js", "/_dash-component-suites/dash/x.js",
                                  "/_dash-component-suites/../x", "/_dash-component-suites/dash/%00",
                                  "/assets/nope.css", "/assets/..%2f..%2fetc/passwd", "/assets/%00"])
def test_a_bad_path_under_the_static_folders_is_404_without_a_traceback(server, path, caplog):
    srv = server(create_app())
    status, _, text = request(srv, "GET", path)
    assert status == 404 and "Traceback" not in text
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]
