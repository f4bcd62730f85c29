"""A newcomer's first hour: busy ports fail first and in one line, ``--port 0`` serves on a real
free port, a script's steps are its optimizer steps, engine options do not silently do nothing
with a script, a script's error is one line (``PROBE_DEBUG=1``: its traceback), and what the
verbs print reads as sentences."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.conftest import ROOT, run_probe

SCRIPT = ROOT / "examples" / "train.py"


@pytest.fixture
def busy_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.mark.parametrize("verb", [["web"], ["demo"], ["monitor", "serve"]])
def test_a_busy_port_is_one_line_and_exit_2_before_any_work(verb, busy_port, tmp_path):
    extra = ["--out", str(tmp_path / "demo")] if verb == ["demo"] else []
    if verb == ["monitor", "serve"]:
        extra = ["--store", str(tmp_path / "m.duckdb")]
    r = run_probe(*verb, "--port", str(busy_port), *extra, timeout=120, cwd=str(tmp_path))
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        f"probe: error: port {busy_port} on 127.0.0.1 is in use; pass --port 0 (a free port) or another --port"]
    assert not (tmp_path / "demo").exists() and not (tmp_path / "m.duckdb").exists()   # no work done


def test_web_on_port_0_prints_the_real_url_once_and_answers(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "probe.cli", "web", "--port", "0"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"), start_new_session=True)
    try:
        line = proc.stdout.readline()
        m = re.search(r"serving on (http://127\.0\.0\.1:(\d+)/\?token=\S+)", line)
        assert m and int(m.group(2)) != 0, line
        with urllib.request.urlopen(m.group(1), timeout=60) as resp:
            assert resp.status == 200
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            rest = proc.communicate(timeout=30)[0]
        except subprocess.TimeoutExpired:
            # (say what still runs)
            exited = proc.poll()
            group = subprocess.run(["ps", "-o", "pid,stat,etime,wchan:20,cmd", "-g", str(proc.pid)],
                                   capture_output=True, text=True).stdout
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise AssertionError(f"probe web did not stop 30 s after Ctrl-C (exit status: {exited}); "
                                 f"its process group:\n{group}") from None
    assert "serving on" not in rest                  # the URL is printed once
    assert proc.returncode == 130 and "probe: interrupted" in rest, (proc.returncode, rest)


def _steps(folder):
    return sorted(int(p.name[4:]) for p in folder.glob("step*") if p.name[4:].isdigit())


def test_a_four_step_script_dumps_four_steps_and_no_set_up_calls_in_step_0(tmp_path):
    out = tmp_path / "d"
    r = run_probe("dump", "--level", "mix", "--out", str(out), "--", str(SCRIPT), "--steps", "4")
    assert r.returncode == 0, r.stderr
    assert _steps(out) == [0, 1, 2, 3]
    step0 = json.loads((out / "step0" / "rank0" / "dump.json").read_text())["data"]
    step1 = json.loads((out / "step1" / "rank0" / "dump.json").read_text())["data"]
    # model construction (empty + uniform_ of each Linear's init) is set-up, not step 0
    assert not any(k.startswith(("Torch.empty", "Tensor.uniform_")) for k in step0), list(step0)[:5]
    assert set(step1) <= set(step0)
    assert "4 steps (0-3) on 1 rank" in r.stdout and "(s)" not in r.stdout


def test_a_four_step_script_profiles_four_steps_whose_step_0_excludes_set_up(tmp_path):
    out = tmp_path / "p"
    r = run_probe("profile", "--out", str(out), "--", str(SCRIPT), "--steps", "4")
    assert r.returncode == 0, r.stderr
    p = subprocess.run([sys.executable, "-m", "probe.cli", "query", str(out),
                        "select step, value from metrics where name = 'step_time_ms' order by step"],
                       capture_output=True, text=True)
    rows = [ln.split() for ln in p.stdout.splitlines() if ln.strip()[:1].isdigit()]
    assert [int(s) for s, _ in rows] == [0, 1, 2, 3]
    # step 0 used to start at the script's first line (imports, model construction: seconds)
    assert float(rows[0][1]) < 1000, rows
    # the script's closing mark comes after its last optimizer step: said so, not a step 4
    assert "events over steps 0-3 (1 after the last step)" in r.stdout, r.stdout


@pytest.mark.parametrize("verb", ["dump", "profile"])
def test_engine_options_with_a_script_are_refused_in_one_line(verb, tmp_path):
    r = run_probe(verb, "--nproc", "2", "--preset", "tiny", "--out", str(tmp_path / "x"), "--",
                  str(SCRIPT), "--steps", "1")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "probe: error: --preset, --nproc apply to the bundled engine, not to a SCRIPT (the script sets "
        f"its own model, steps and ranks); drop them or drop the script: probe {verb} ... -- SCRIPT"]
    assert not (tmp_path / "x").exists()


def test_a_script_error_is_one_line_and_probe_debug_shows_its_traceback(tmp_path):
    script = tmp_path / "bad.py"
    script.write_text("def f():\n    raise ValueError('boom')\n\nf()\n")
    r = run_probe("dump", "--out", str(tmp_path / "d"), "--", str(script))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "probe: error: " in r.stderr and "raised ValueError: boom at bad.py:2" in r.stderr
    d = run_probe("dump", "--out", str(tmp_path / "d"), "--", str(script), env={"PROBE_DEBUG": "1"})
    assert d.returncode == 1
    assert "Traceback (most recent call last)" in d.stderr
    assert f'File "{script}", line 4, in <module>' in d.stderr and "line 2, in f" in d.stderr
    assert "runpy" not in d.stderr


def test_engine_summaries_are_sentences_not_dicts_or_plural_placeholders(tmp_path):
    d = run_probe("dump", "--steps", "1", "--quiet", "--out", str(tmp_path / "d"))
    assert d.returncode == 0, d.stderr
    assert "probe dump: module/statistics: step 1 on 1 rank," in d.stdout
    p = run_probe("profile", "--steps", "1-2", "--max-steps", "3", "--quiet", "--out", str(tmp_path / "p"))
    assert p.returncode == 0, p.stderr
    assert "trained reference/tiny on 1 rank for 3 steps (0-2); recording steps 1-2" in p.stdout
    for text in (d.stdout, d.stderr, p.stdout, p.stderr):
        assert "(s)" not in text and "{'" not in text
