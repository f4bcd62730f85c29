"""The graph page marks the calls the API precision check flagged (``probe web --check DIR``), in
a real browser: the module holding them wears a count badge, the call its verdict, and the detail
panel gives the check's reason."""

from __future__ import annotations

import shutil

import pytest

pytest.importorskip("selenium", reason="browser tests need selenium (pip install -e .[dev])")

from selenium.webdriver.common.by import By  # noqa: E402

from tests.visualizer.test_check_marks import BLOCK, CALL, checked_run
from tests.web.conftest import wait_for
from probe.web.app import create_app

pytestmark = pytest.mark.browser


def _label(row) -> str:
    return row.find_element(By.CSS_SELECTOR, ".lbl").text


def _row(browser, node):
    found = browser.find_elements(By.CSS_SELECTOR, f"#g-tree-a .row[data-node='{node}']")
    return found[0] if found else None


def test_flagged_calls_are_marked_in_the_graph_page_with_the_reason(browser, serve_app, shot, tmp_path):
    run = checked_run(tmp_path / "runs" / "run")
    given = tmp_path / "check-result"
    shutil.move(str(run / "check"), given)             # given with --check, not found next to the dump
    browser.get(serve_app(create_app(dump_a=run, check_dirs=[given]), "/"))
    block = wait_for(lambda: _row(browser, BLOCK), timeout=60, what="the tree")
    assert "check-in" in block.get_attribute("class").split() and _label(block).startswith("✗1 ")
    wait_for(lambda: block.find_element(By.CSS_SELECTOR, ".tog").click() or True, what="open the block")
    proj = wait_for(lambda: _row(browser, "Module.0.proj.Linear.forward.0"), what="the block's children")
    wait_for(lambda: proj.find_element(By.CSS_SELECTOR, ".tog").click() or True, what="open the linear")
    call = wait_for(lambda: _row(browser, CALL), what="the flagged call")
    assert "check-error" in call.get_attribute("class").split() and _label(call).startswith("✗ error Functional.linear.0")
    wait_for(lambda: call.find_element(By.CSS_SELECTOR, ".lbl").click() or True, what="select the call")
    detail = browser.find_element(By.ID, "g-detail")
    wait_for(lambda: "API precision check" in detail.text, what="the check in the detail panel")
    assert "computed in bfloat16 from float32 inputs" in detail.text
    assert browser.find_element(By.ID, "g-detail-check").text == "✗ error" and "cpu-fp64" in detail.text
    assert "A: 2 calls flagged by the API precision check" in browser.find_element(By.ID, "g-summary").text
    shot("graph_check_marks")
