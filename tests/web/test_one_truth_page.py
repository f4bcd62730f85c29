"""One compare of the bundled engine, read everywhere: the terminal, summary.json, compare.csv
and the graph-diff page agree on the labelled counts; a node is painted by its own verdict
(error, NaN) with where its divergence comes from; the planted fault's backward node is in the
tree and found by search; a compare result of other dumps is refused on the page."""

from __future__ import annotations

import csv
import json
import time
from collections import Counter

import pytest

pytest.importorskip("selenium", reason="browser tests need selenium (pip install -e .[dev])")

from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402

from tests.compare.test_verdict_counts import nonzero, parse_counts  # noqa: E402
from tests.conftest import run_probe  # noqa: E402
from tests.web.conftest import wait_for  # noqa: E402
from probe.web.app import create_app  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.slow]
FAULT_A = "Module.layers.1.mlp.down_proj.Linear.forward.0"
FAULT_B = "Module.decoder.layers.1.mlp.linear_fc2.Linear.forward.0"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("one_truth")
    common = ["dump", "--level", "module", "--preset", "tiny", "--seed", "0", "--steps", "0", "--max-steps", "1"]
    for name, extra in {"ref": ["--engine", "reference"],
                        "fused": ["--engine", "fused", "--fault", "scale:decoder.layers.1.mlp.linear_fc2.weight:3"],
                        "nan": ["--engine", "reference", "--fault", "nan:layers.1.mlp.down_proj:0",
                                "--allow-nan"]}.items():
        r = run_probe(*common, *extra, "--out", str(root / name))
        assert r.returncode == 0, r.stderr
    return root


def _compare(runs, a, b, out):
    r = run_probe("compare", str(runs / a), str(runs / b), "--out", str(runs / out))
    assert r.returncode == 0, r.stderr
    return r.stdout


def _open(browser, serve_app, app):
    browser.get(serve_app(app, "/"))
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#g-tree-a .row")
             and browser.find_elements(By.CSS_SELECTOR, "#g-tree-b .row"), timeout=60, what="both trees")


def _row(browser, side, node):
    return browser.find_element(By.CSS_SELECTOR, f"#g-tree-{side} .row[data-node='{node}']")


def _selected(browser, side):
    found = browser.find_elements(By.CSS_SELECTOR, f"#g-tree-{side} .row.sel")
    return found[0].get_attribute("data-node") if found else None


def test_counts_agree_everywhere_and_nodes_wear_their_own_verdict(browser, serve_app, shot, runs):
    stdout = _compare(runs, "ref", "fused", "cmp")
    summary = json.loads((runs / "cmp" / "summary.json").read_text())
    with open(runs / "cmp" / "compare.csv", newline="") as f:
        from_csv = dict(Counter(r["verdict"] for r in csv.DictReader(f)))
    app = create_app(dump_a=runs / "ref", dump_b=runs / "fused", compare_dir=runs / "cmp")
    _open(browser, serve_app, app)
    header = wait_for(lambda: browser.find_element(By.ID, "g-summary").text, what="header")
    truth = nonzero(summary["counts"])
    assert truth["tensors"] == from_csv and truth["tensors"]["error"]
    assert parse_counts(stdout) == truth == parse_counts(header), (stdout, header)

    # every node of both dumps is in its tree (the dumps' backward trees are mended on reading)
    diff = app.probe_diff
    for side in ("a", "b"):
        assert sorted(diff.graph(side).walk()) == sorted(diff.graph(side))
    # the faulty module is painted error and marked as where the divergence starts
    browser.find_element(By.ID, "g-jump").click()
    wait_for(lambda: _selected(browser, "a") == FAULT_A, what="jump to the fault")
    assert {"band-error", "origin"} <= set(_row(browser, "a", FAULT_A).get_attribute("class").split())
    assert _selected(browser, "b") == FAULT_B
    wait_for(lambda: browser.find_element(By.ID, "g-detail-band").text == "error", what="detail chip")
    detail = browser.find_element(By.ID, "g-detail")
    assert not detail.find_elements(By.CSS_SELECTOR, ".chip.band-pass")
    # a node downstream is painted by its own verdict, error, and names where it comes from
    norm = _row(browser, "a", "Module.norm.RMSNorm.forward.0")
    assert {"band-error", "affected"} <= set(norm.get_attribute("class").split())
    assert norm.find_element(By.CSS_SELECTOR, ".aff").get_attribute("title") == f"affected by {FAULT_A}"
    legend = browser.find_element(By.ID, "g-legend").text
    assert "own verdict" in legend and "origin" in legend and "affected" in legend

    # the planted fault's backward node: found by search, revealed in both trees
    box = browser.find_element(By.ID, "g-search")
    box.send_keys("layers.1.mlp.down_proj backward", Keys.ENTER)
    backward = FAULT_A.replace(".forward.", ".backward.")
    wait_for(lambda: _selected(browser, "a") == backward, what="search finds the backward node")
    assert "band-error" in _row(browser, "a", backward).get_attribute("class")
    assert _selected(browser, "b") == FAULT_B.replace(".forward.", ".backward.")
    assert diff.graph("a").ancestors(backward) == ["Module.layers.1.Block.backward.0",
                                                   "Module.layers.1.mlp.MLP.backward.0"]
    time.sleep(0.2)
    shot("graph_diff_one_truth")


def test_a_nan_node_is_shown_as_nan(browser, serve_app, shot, runs):
    _compare(runs, "ref", "nan", "cmp_nan")
    app = create_app(dump_a=runs / "ref", dump_b=runs / "nan", compare_dir=runs / "cmp_nan")
    _open(browser, serve_app, app)
    browser.find_element(By.ID, "g-jump-nan").click()
    wait_for(lambda: _selected(browser, "b") == FAULT_A, what="jump to the first NaN")
    assert {"band-nan", "origin", "nan"} <= set(_row(browser, "b", FAULT_A).get_attribute("class").split())
    assert "band-nan" in _row(browser, "a", FAULT_A).get_attribute("class").split()
    wait_for(lambda: browser.find_element(By.ID, "g-detail-band").text == "nan", what="detail chip")
    # downstream of the NaN: NaN too, affected by it (never green)
    head = _row(browser, "b", "Module.lm_head.Linear.forward.0")
    assert {"band-nan", "affected"} <= set(head.get_attribute("class").split())
    assert not browser.find_elements(By.CSS_SELECTOR, "#g-tree-b .row.band-pass.nan")
    time.sleep(0.2)
    shot("graph_diff_nan")


def test_a_compare_result_of_other_dumps_is_refused_on_the_page(browser, serve_app, shot, runs):
    if not (runs / "cmp" / "summary.json").exists():
        _compare(runs, "ref", "fused", "cmp")
    app = create_app(dump_a=runs / "ref", dump_b=runs / "nan", compare_dir=runs / "cmp")
    browser.get(serve_app(app, "/"))
    text = wait_for(lambda: browser.find_element(By.ID, "g-refusal").text, what="refusal")
    assert "belongs to other dumps" in text and "side B" in text and str(runs / "cmp") in text
    assert not browser.find_elements(By.CSS_SELECTOR, "#g-tree-a .row")
    shot("graph_diff_refused")
