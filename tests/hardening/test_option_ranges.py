"""Numeric options and selections out of range: one line, exit 2, before anything runs."""

from __future__ import annotations

import pytest

from tests.conftest import run_probe


@pytest.mark.parametrize("args, said", [
    (("simulate", "--nproc", "1000000000"), "--nproc"),
    (("simulate", "--nproc", "4294967296"), "--nproc"),
    (("simulate", "--seq-len", "10000000000"), "--seq-len"),
    (("simulate", "--seq-len", "0"), "--seq-len"),
    (("simulate", "--global-batch", "-1"), "--global-batch"),
    (("simulate", "--micro-batch", "0"), "--micro-batch"),
    (("simulate", "--zero", "4"), "--zero"),
    (("simulate", "--tp", "0"), "--tp"),
    (("train", "--max-steps", "0"), "--max-steps"),
    (("train", "--seed", "-1"), "--seed"),
    (("dump", "--nproc", "0"), "--nproc"),
    (("dump", "--steps", "0-1000000000"), "selects more than 1000000 values"),
    (("demo", "--port", "70000"), "--port"),
    (("demo", "--slow-factor", "0"), "--slow-factor"),
    (("monitor", "serve", "--port", "-1"), "--port"),
    (("monitor", "interval", "--job", "j", "0"), "SECONDS"),
    (("monitor", "trace", "--job", "j", "--next", "0"), "--next"),
    (("query", ".", "select 1", "--max-rows", "0"), "--max-rows"),
    (("query", ".", "select 1", "--safe", "--timeout", "1e308"), "--timeout"),
    (("check-api", ".", "--top", "-1"), "--top"),
    (("profile", "--peak-tflops", "0"), "--peak-tflops"),
])
def test_a_numeric_option_out_of_range_is_one_line_and_exit_2(tmp_path, args, said):
    res = run_probe(*args, cwd=str(tmp_path), timeout=120)
    assert res.returncode == 2, (res.returncode, res.stdout[-500:], res.stderr[-2000:])
    assert res.stderr.count("\n") == 1 and said in res.stderr, res.stderr
    assert not (tmp_path / "runs").exists()
