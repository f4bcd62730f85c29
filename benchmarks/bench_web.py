"""Graph-diff page speed in a real browser, on a synthetic 10k-node dump pair.

Measures, in headless Chromium (timed inside the page with ``performance.now()``):

- first paint: navigation start to the first tree rows on screen;
- expand: click on a node with 100 children to those 100 rows on screen (both sides);
- search hit: a query submitted to the matching row selected;

and, as the anchor run side by side, the smallest Dash round trip of the page: collapsing that
node again (one callback, the short tree re-rendered). Targets: first paint < 1.5 s, expand
< 200 ms, search < 200 ms.

    python benchmarks/bench_web.py [--blocks 96] [--width 99] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGETS_MS = {"first paint": 1500.0, "expand 100 children": 200.0, "search hit": 200.0}

#: Resolves when ``selector`` matches at least ``count`` elements; returns ms since ``t0``.
WAIT_JS = """
const [selector, count, t0key, done] = [arguments[0], arguments[1], arguments[2], arguments[arguments.length - 1]];
const t0 = window[t0key];
function check() {
  if (document.querySelectorAll(selector).length >= count) { done(performance.now() - t0); return true; }
  return false;
}
if (!check()) {
  const obs = new MutationObserver(() => { if (check()) obs.disconnect(); });
  obs.observe(document.body, {childList: true, subtree: true, characterData: true, attributes: true});
}
"""


#: Clicks what ``selector`` matches now (the trees are redrawn, so no element is kept across calls).
CLICK_JS = "window.__t = performance.now(); document.querySelector(arguments[0]).click();"


def build_diff(blocks: int, width: int, out: str, pairs: str = "compare"):
    from visualizer.diff import DiffGraph
    from visualizer.graph import Graph
    from visualizer.synthetic import write_dump_pair

    a, b = write_dump_pair(out, blocks=blocks, width=width, fault_block=blocks // 2)
    t = time.perf_counter()
    if pairs == "compare":
        from compare.api import compare

        diff = DiffGraph.from_result(compare(str(a), str(b)), a, b)
        how = "compare.api.compare"
    else:
        from visualizer.diff import NodePair

        ga, gb = Graph.load(a), Graph.load(b)
        diff = DiffGraph(ga, gb, [NodePair(n, n, "name") for n in ga if n in gb])
        how = "same-name pairs (--pairs name)"
    return diff, time.perf_counter() - t, how


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=96)
    p.add_argument("--width", type=int, default=99)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--pairs", choices=("compare", "name"), default="compare",
                   help="pair the nodes with compare.api (default) or by identical names")
    args = p.parse_args(argv)

    from selenium.webdriver.common.by import By

    from tests.web.conftest import CHROMEDRIVER, CHROMIUM, new_driver, quit_driver, wait_for
    from web.app import ServerThread, create_app

    if not (CHROMIUM and CHROMEDRIVER):
        print("bench_web: chromium/chromedriver not installed; apt-get install chromium chromium-driver")
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        diff, load_s, how = build_diff(args.blocks, args.width, tmp, args.pairs)
        nodes = len(diff.graph("a")) + len(diff.graph("b"))
        t = time.perf_counter()
        app = create_app(diff=diff)
        app_s = time.perf_counter() - t
        srv = ServerThread(app, "127.0.0.1", 0)
        driver = new_driver()
        results: dict[str, list[float]] = {k: [] for k in (*TARGETS_MS, "anchor: collapse round trip")}
        roots = diff.graph("a").roots()
        block = next(r for r in roots if len(diff.graph("a").children(r)) >= 100)
        n_kids = len(diff.graph("a").children(block))
        target = diff.graph("a").children(roots[-2])[-1] if len(roots) > 2 else block
        driver.set_script_timeout(30)
        try:
            driver.get(srv.url + "/")                      # warm the browser cache once
            wait_for(lambda: driver.find_elements(By.CSS_SELECTOR, "#g-tree-b .row"), timeout=120)
            for _ in range(args.repeat):
                driver.get(srv.url + "/")
                ms = driver.execute_async_script(
                    "window.__nav = 0;" + WAIT_JS, "#g-tree-b .row", len(roots), "__nav")
                results["first paint"].append(ms)
                base = len(driver.find_elements(By.CSS_SELECTOR, "#g-tree-a .row"))

                driver.execute_script(CLICK_JS, f"#g-tree-a .row[data-node='{block}'] .tog")
                results["expand 100 children"].append(driver.execute_async_script(
                    WAIT_JS, "#g-tree-b .row", base + n_kids, "__t"))

                box = driver.find_element(By.ID, "g-search")
                box.send_keys(target)
                driver.execute_script("window.__t = performance.now(); arguments[0].blur();", box)
                try:
                    results["search hit"].append(driver.execute_async_script(
                        WAIT_JS, f"#g-tree-a .row.sel[data-node='{target}']", 1, "__t"))
                except Exception:
                    sel = driver.find_elements(By.CSS_SELECTOR, "#g-tree-a .row.sel")
                    print("search did not land:", driver.find_element(By.ID, "g-hit").text,
                          box.get_attribute("value"), [e.get_attribute("data-node") for e in sel])
                    raise

                time.sleep(0.5)                                   # let the detail panel land
                shown = len(driver.find_elements(By.CSS_SELECTOR, "#g-tree-b .row"))
                driver.execute_script(CLICK_JS, f"#g-tree-a .row[data-node='{block}'] .tog")
                results["anchor: collapse round trip"].append(driver.execute_async_script(
                    WAIT_JS.replace(".length >= count", ".length <= count"), "#g-tree-b .row",
                    shown - n_kids, "__t"))
        finally:
            quit_driver(driver)
            srv.stop()

    print(f"bench_web: {nodes} nodes ({nodes // 2} per side), pairs from {how}")
    print(f"  load + pair the dumps: {load_s:.2f} s; create_app: {app_s:.2f} s")
    anchor = statistics.median(results["anchor: collapse round trip"])
    ok = True
    for name, values in results.items():
        med = statistics.median(values)
        line = f"  {name:<28} median {med:7.1f} ms  (min {min(values):.1f}, max {max(values):.1f})"
        if name in TARGETS_MS:
            passed = med < TARGETS_MS[name]
            ok &= passed
            line += f"  {med / anchor:5.1f}× anchor  target < {TARGETS_MS[name]:.0f} ms: {'ok' if passed else 'MISSED'}"
        print(line)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
