"""The graph view in a real browser, on a planted fault in the bundled engine (two ranks, mix
level): the first-divergence button finds the faulty module, opening its parent on one side opens
the counterpart on the other, an edge followed from the faulty module selects its consumer,
the keys walk the nodes, a link reopens the selection, and dumps, compare results and ranks are
switched from the page (a bad choice says why)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("selenium", reason="browser tests need selenium (pip install -e .[dev])")

from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402

from tests.conftest import run_probe  # noqa: E402
from tests.web.conftest import wait_for  # noqa: E402
from probe.web.app import create_app  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.slow]
FAULT = "Module.layers.1.mlp.down_proj.Linear.forward.0"
MLP = "Module.layers.1.mlp.MLP.forward.0"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("graph_view")
    common = ["dump", "--level", "mix", "--preset", "tiny", "--seed", "0", "--steps", "0", "--max-steps", "1",
              "--nproc", "2"]
    runs = {"ref": [], "fault": ["--fault", "scale:layers.1.mlp.down_proj.weight:3"]}
    with ThreadPoolExecutor(2) as pool:          # the two runs at once
        done = pool.map(lambda item: run_probe(*common, *item[1], "--out", str(root / item[0])), runs.items())
        for r in done:
            assert r.returncode == 0, r.stderr
    r = run_probe("compare", str(root / "ref" / "step0" / "rank0"), str(root / "fault" / "step0" / "rank0"),
                  "--out", str(root / "cmp"))
    assert r.returncode in (0, 1), r.stderr
    return root


def js(browser, script, *args):
    return browser.execute_script("var P = window.probe;" + script, *args)


def selected(browser, side):
    return js(browser, "return P.side(arguments[0]).sel;", side)


def drawn(browser, side, node):
    """Whether the graph of ``side`` draws ``node`` (in view), and with which classes."""
    return js(browser, "var e = P.graph.cy(arguments[0]).getElementById(arguments[1]);"
                       "return e.length ? e.classes().join(' ') : null;", side, node)


def at(browser, side, node=None, edge=None):
    """Where to click a node (an open box: the left of its header line, clear of the edges that
    come in) or an edge (its midpoint), relative to the canvas' centre."""
    return js(browser, """
        var cy = P.graph.cy(arguments[0]), edge = arguments[2], p;
        if (edge) { p = cy.getElementById('e|' + edge[0] + '\u2192' + edge[1]).renderedMidpoint(); }
        else {
          var el = cy.getElementById(arguments[1]), b = el.renderedBoundingBox({includeLabels: false});
          p = el.hasClass('box') ? {x: b.x1 + 14 * cy.zoom(), y: b.y1 + 8 * cy.zoom()} : el.renderedPosition();
        }
        return [Math.round(p.x - cy.width() / 2), Math.round(p.y - cy.height() / 2)];""", side, node, edge)


def canvas(browser, side):
    return browser.find_element(By.ID, f"g-graph-{side}")


def opened(browser, side, node):
    return js(browser, "var e = P.side(arguments[0]).nodes.get(arguments[1]); return e ? e.o : null;", side, node)


def choose(browser, dropdown, text):
    """Pick the option ``text`` of a dcc.Dropdown."""
    browser.find_element(By.ID, dropdown).click()
    option = wait_for(lambda: [o for o in browser.find_elements(By.CSS_SELECTOR, ".dash-dropdown-options [role=option]")
                               if o.text.strip() == text], what=f"option {text} of {dropdown}")
    option[0].click()
    wait_for(lambda: text in browser.find_element(By.ID, f"{dropdown}-value").text, what=f"{text} chosen")

    def closed():
        if [o for o in browser.find_elements(By.CSS_SELECTOR, ".dash-dropdown-options [role=option]") if o.is_displayed()]:
            browser.find_element(By.TAG_NAME, "body").send_keys(Keys.ESCAPE)
            return False
        return True
    wait_for(closed, what=f"{dropdown}'s list closed")


def test_the_graph_finds_the_fault_syncs_both_sides_follows_an_edge_and_switches_dumps(browser, serve_app,
                                                                                        shot, runs):
    app = create_app(dump_a=runs / "ref", dump_b=runs / "fault", compare_dir=runs / "cmp")
    url = serve_app(app, "/")
    browser.get(url)
    wait_for(lambda: js(browser, "return P.graph.cy('b') && P.graph.cy('b').nodes().length"), timeout=60,
             what="both graphs drawn")
    assert "Apis_Between_Modules.0" in js(browser, "return P.flat('a');")      # calls between modules grouped

    # the first-divergence button selects the faulty module on both sides, drawn red with its path lit
    browser.find_element(By.ID, "g-jump").click()
    wait_for(lambda: selected(browser, "a") == FAULT and selected(browser, "b") == FAULT, what="jump to the fault")
    classes = wait_for(lambda: drawn(browser, "a", FAULT), what="the faulty box in view").split()
    assert {"band-error", "origin", "sel"} <= set(classes)
    assert "onpath" in drawn(browser, "a", MLP).split()

    # close its parent on side A (select it in the tree, double click its box): B closes it too; open again
    wait_for(lambda: browser.find_element(By.CSS_SELECTOR, f"#g-tree-a .row[data-node='{MLP}'] .lbl").click()
             or True, what="click the parent's row")      # retried: the tree redraws under us
    wait_for(lambda: selected(browser, "a") == MLP and js(browser, """
        var cy = P.graph.cy('a'), b = cy.getElementById(arguments[0]).renderedBoundingBox();
        return b.y1 > 0 && b.y1 < cy.height() - 20;""", MLP), what="the parent's box in view")
    ActionChains(browser).move_to_element_with_offset(canvas(browser, "a"), *at(browser, "a", MLP)).double_click().perform()
    wait_for(lambda: opened(browser, "a", MLP) == 0 and opened(browser, "b", MLP) == 0, what="closed in sync")
    assert js(browser, "return P.side('b').nodes.has(arguments[0]);", FAULT) is False
    wait_for(lambda: "box" not in (drawn(browser, "a", MLP) or "box").split(), what="drawn closed")
    ActionChains(browser).move_to_element_with_offset(canvas(browser, "a"), *at(browser, "a", MLP)).double_click().perform()
    wait_for(lambda: opened(browser, "b", MLP) == 1 and js(browser, "return P.side('b').nodes.has(arguments[0]);", FAULT),
             what="the counterpart opened on side B")
    wait_for(lambda: drawn(browser, "b", FAULT), what="side B draws the faulty module again")

    # follow the data-flow edge out of the faulty module: its consumer is selected
    consumer = app.probe_diff.graph("a").neighbours(FAULT)[1][0]
    edge = wait_for(lambda: js(browser, "return P.side('a').edges.has(arguments[0] + '\u2192' + arguments[1]);",
                               FAULT, consumer) and [FAULT, consumer], what="the edge out of the fault")
    ActionChains(browser).move_to_element_with_offset(canvas(browser, "a"), *at(browser, "a", edge=edge)).click().perform()
    wait_for(lambda: selected(browser, "a") == consumer, what="the edge followed to the consumer")
    assert js(browser, "return P.graph.cy('a').edges('.followed').map(e => e.data('source'));") == [FAULT]

    # keys walk the visible nodes; the URL keeps the selection and reopens it
    browser.find_element(By.TAG_NAME, "body").send_keys(Keys.ARROW_UP)
    above = js(browser, "var f = P.flat('a'); return f[f.indexOf(arguments[0]) - 1];", consumer)
    wait_for(lambda: selected(browser, "a") == above, what="arrow up selects the row above")
    link = wait_for(lambda: "sel=a%3A" in browser.current_url and browser.current_url, what="the URL")
    browser.get(link)
    wait_for(lambda: js(browser, "return P.side && P.side('a').sel;") == above, timeout=30, what="the link reopens it")
    wait_for(lambda: "sel" in (drawn(browser, "a", above) or "").split()
             and browser.find_elements(By.CSS_SELECTOR, f"#g-tree-a .row.sel[data-node='{above}']"),
             what="the reopened view draws the selection in the graph and the tree")
    shot("graph_view_fault")

    # panning side A by hand (a drag on its left margin) moves side B to the counterpart of what A shows
    pan_b = js(browser, "return P.graph.cy('b').pan();")
    ActionChains(browser).move_to_element_with_offset(canvas(browser, "a"), -205, 0).click_and_hold() \
        .move_by_offset(10, -60).move_by_offset(10, -60).release().perform()
    wait_for(lambda: js(browser, "return P.graph.cy('b').pan();") != pan_b, what="side B follows the pan")
    # everything the page loaded came from the dashboard itself: it works with no network
    assert js(browser, "return performance.getEntriesByType('resource')"
                       ".every(e => e.name.startsWith(location.origin));")

    # the fault's verdict on each rank, side by side
    browser.find_element(By.ID, "g-jump").click()
    wait_for(lambda: selected(browser, "a") == FAULT, what="jump again")
    wait_for(lambda: browser.find_element(By.ID, "g-ranks"), what="ranks button").click()
    rows = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#g-ranks-rows tbody tr"), timeout=60,
                    what="verdicts of both ranks")
    assert [r.text.split()[0] for r in rows] == ["0", "1"] and all("error" in r.text for r in rows)

    # a bad choice says why: the compare result of rank 0 does not belong to rank 1's dumps
    choose(browser, "g-open-rank", "rank 1")
    browser.find_element(By.ID, "g-open").click()
    msg = wait_for(lambda: browser.find_element(By.ID, "g-open-msg").text, timeout=30, what="the refusal")
    assert "belongs to other dumps" in msg

    # switch rank (compared now) and then dump B: the page follows
    browser.find_element(By.CSS_SELECTOR, "#g-open-cmp .dash-dropdown-clear").click()
    browser.find_element(By.ID, "g-open").click()
    wait_for(lambda: "rank1" in browser.find_element(By.ID, "g-title-b").text, timeout=60, what="rank 1 shown")
    assert browser.find_element(By.ID, "g-open-msg").text == ""
    wait_for(lambda: FAULT in browser.find_element(By.ID, "g-summary").text, what="rank 1's divergence")
    choose(browser, "g-open-b", str(runs / "ref"))
    browser.find_element(By.ID, "g-open").click()
    wait_for(lambda: "first divergence: none" in browser.find_element(By.ID, "g-summary").text, timeout=60,
             what="ref against itself: no divergence")
    assert js(browser, "return P.side('b').nodes.size") == len(js(browser, "return P.flat('b');"))
    time.sleep(0.2)
    shot("graph_view_switched")
