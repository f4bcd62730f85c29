"""The graph-diff page in a real browser: expand/collapse in sync, select, search, filter, jump."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("selenium", reason="browser tests need selenium (pip install -e .[dev])")

from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402

from tests.web.conftest import wait_for
from probe.visualizer.diff import DiffGraph, NodePair
from probe.visualizer.graph import Graph
from probe.visualizer.navigate import first_divergence
from probe.visualizer.synthetic import write_dump_pair
from probe.web.app import create_app

pytestmark = pytest.mark.browser
FAULTY = "Module.layers.3.mlp.MLP.forward.0"


@pytest.fixture(scope="module")
def diff(tmp_path_factory):
    a, b = write_dump_pair(tmp_path_factory.mktemp("pair"), blocks=6, width=9, fault_block=3)
    ga, gb = Graph.load(a), Graph.load(b)
    # the compare pairs of this synthetic pair: the same names on both sides
    return DiffGraph(ga, gb, [NodePair(n, n, "name") for n in ga if n in gb])


def rows(browser, side):
    return browser.find_elements(By.CSS_SELECTOR, f"#g-tree-{side} .row")


def row(browser, side, node):
    return browser.find_element(By.CSS_SELECTOR, f"#g-tree-{side} .row[data-node='{node}']")


def toggle(browser, side, node):
    """Click a node's expand/collapse arrow (retried while Dash re-renders the tree)."""
    wait_for(lambda: row(browser, side, node).find_element(By.CSS_SELECTOR, ".tog").click() or True,
             what=f"click {node}")


def selected(browser, side):
    found = browser.find_elements(By.CSS_SELECTOR, f"#g-tree-{side} .row.sel")
    return found[0].get_attribute("data-node") if found else None


def test_graph_diff_page_expands_selects_searches_filters_and_jumps(browser, serve_app, shot, diff):
    browser.get(serve_app(create_app(diff=diff), "/"))
    wait_for(lambda: len(rows(browser, "a")) == len(diff.graph("a").roots()) and rows(browser, "b"),
             timeout=60, what="both trees")
    block = "Module.layers.3.Block.forward.0"
    # a collapsed block that holds the fault carries an error hint
    assert row(browser, "a", block).find_elements(By.CSS_SELECTOR, ".hint-error")

    # expand on side A: the counterpart on side B expands too
    toggle(browser, "a", block)
    n_kids = len(diff.graph("a").children(block))
    wait_for(lambda: len(rows(browser, "a")) == len(diff.graph("a").roots()) + n_kids, what="expand A")
    wait_for(lambda: len(rows(browser, "b")) == len(rows(browser, "a")), what="expand B in sync")
    assert "band-error" in row(browser, "a", FAULTY).get_attribute("class")

    # collapse on side B: side A follows
    toggle(browser, "b", block)
    wait_for(lambda: len(rows(browser, "a")) == len(diff.graph("a").roots()), what="collapse in sync")

    # search: fuzzy, case-insensitive, with next/previous
    box = browser.find_element(By.ID, "g-search")
    box.send_keys("LAYERS.2 MLP", Keys.ENTER)
    wait_for(lambda: selected(browser, "a") == "Module.layers.2.mlp.MLP.forward.0", what="search hit")
    assert selected(browser, "b") == "Module.layers.2.mlp.MLP.forward.0"
    assert browser.find_element(By.ID, "g-hit").text.startswith("1/")
    box.clear()
    box.send_keys("mlp", Keys.ENTER)
    wait_for(lambda: selected(browser, "a") == "Module.layers.0.mlp.MLP.forward.0", what="first mlp")
    browser.find_element(By.ID, "g-next").click()
    wait_for(lambda: selected(browser, "a") == "Module.layers.1.mlp.MLP.forward.0", what="next hit")
    browser.find_element(By.ID, "g-prev").click()
    wait_for(lambda: selected(browser, "a") == "Module.layers.0.mlp.MLP.forward.0", what="previous hit")

    # the detail panel shows both sides' statistics and the stack
    detail = browser.find_element(By.ID, "g-detail")
    wait_for(lambda: "Module.layers.0.mlp.MLP.forward.0" in detail.text, what="detail")
    assert "Statistics" in detail.text and "Stack A" in detail.text and "Data flow" in detail.text
    assert len(detail.find_elements(By.CSS_SELECTOR, "table.stats tbody tr")) >= 4

    # a data-flow link in the detail panel selects the node it names
    link = detail.find_element(By.CSS_SELECTOR, ".flow-link")
    target = link.get_attribute("data-node")
    link.click()
    wait_for(lambda: selected(browser, "a") == target, what="data-flow link selects")

    # the error filter lists the error nodes in execution order; clicking one selects it
    flt = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#g-filter-list .flt"), what="filter list")
    names = [f.get_attribute("title") for f in flt]
    assert FAULTY in names
    order = diff.graph("a").walk()
    assert names == sorted(names, key=order.index)
    flt[names.index(FAULTY)].click()
    wait_for(lambda: selected(browser, "a") == FAULTY, what="filter click selects")

    # jump to first divergence lands inside the faulty module, coloured error
    browser.find_element(By.ID, "g-search").clear()
    toggle(browser, "a", block)   # collapse again
    wait_for(lambda: not browser.find_elements(By.CSS_SELECTOR, f"#g-tree-a .row[data-node='{FAULTY}']"),
             what="collapsed")
    browser.find_element(By.ID, "g-jump").click()
    first = first_divergence(diff)[1]
    wait_for(lambda: selected(browser, "a") == first, what="jump to first divergence")
    assert diff.graph("a").nodes[first].parent == FAULTY
    assert "band-error" in row(browser, "a", first).get_attribute("class")
    assert selected(browser, "b") == first
    wait_for(lambda: browser.find_element(By.ID, "g-detail-band").text == "error", what="detail band")
    time.sleep(0.2)
    shot("graph_diff")


def test_single_dump_page_shows_one_tree_and_finds_nan(browser, serve_app, shot, tmp_path):
    _, b = write_dump_pair(tmp_path, blocks=3, width=4, fault_block=1, nan=True)
    browser.get(serve_app(create_app(dump_a=b), "/"))
    wait_for(lambda: rows(browser, "a"), what="tree")
    assert not browser.find_element(By.ID, "g-pane-b").is_displayed()
    browser.find_element(By.ID, "g-jump-nan").click()
    wait_for(lambda: selected(browser, "a"), what="first NaN selected")
    node = selected(browser, "a")
    assert "nan" in row(browser, "a", node).get_attribute("class").split()
    assert "NaN/Inf" in browser.find_element(By.ID, "g-detail").text
    shot("graph_single_nan")


@pytest.mark.slow
def test_planted_fault_in_the_bundled_engine_is_red_and_jumped_to(browser, serve_app, shot, tmp_path):
    from tests.conftest import run_probe

    common = ["dump", "--level", "module", "--preset", "tiny", "--seed", "0", "--steps", "0", "--max-steps", "1"]
    fault = "scale:decoder.layers.1.mlp.linear_fc2.weight:3"
    for args in (["--engine", "reference", "--out", str(tmp_path / "ref")],
                 ["--engine", "fused", "--fault", fault, "--out", str(tmp_path / "fused")]):
        r = run_probe(*common, *args)
        assert r.returncode == 0, r.stderr
    r = run_probe("compare", str(tmp_path / "ref"), str(tmp_path / "fused"), "--out", str(tmp_path / "cmp"))
    assert r.returncode in (0, 1), r.stderr
    app = create_app(dump_a=tmp_path / "ref", dump_b=tmp_path / "fused", compare_dir=tmp_path / "cmp")
    browser.get(serve_app(app, "/"))
    wait_for(lambda: rows(browser, "a") and rows(browser, "b"), timeout=60, what="both trees")
    browser.find_element(By.ID, "g-jump").click()
    faulty = "Module.layers.1.mlp.down_proj.Linear.forward.0"
    wait_for(lambda: selected(browser, "a") == faulty, what="jump lands on the faulty module")
    assert "band-error" in row(browser, "a", faulty).get_attribute("class")
    assert selected(browser, "b") == "Module.decoder.layers.1.mlp.linear_fc2.Linear.forward.0"
    assert "band-error" in row(browser, "b", selected(browser, "b")).get_attribute("class")
    detail = browser.find_element(By.ID, "g-detail").text
    assert "matched by structure" in detail and "norm_rel" in detail
    time.sleep(0.2)
    shot("graph_diff_bundled_engine")
