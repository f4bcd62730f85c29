"""Graph-diff and live page speed in a real browser (headless Chromium, timed inside the page).

On a synthetic 10k-node dump pair (visualizer/synthetic.py) and on a real mix-level dump pair of
the bundled engine's small preset (reference against a planted fault), it measures:

- first paint: navigation start to both graphs and trees drawn;
- expand and collapse of a block (one click: both sides' trees and graphs updated and drawn) with
  none, half and all of the other nodes opened (on the 10k pair: about 100, 5,000 and 10,000 nodes
  visible per side);
- jump to first divergence: the button to the faulty node selected and drawn on both sides;

and on the live page (two ranks reporting to a monitor service), the size of one refresh after a
run of 20 steps and after one of 2,000 (each refresh carries only the new steps). Targets: first paint < 1.5 s, expand/collapse
< 200 ms at any size, jump < 300 ms, the refresh the same size at any run length.

    python benchmarks/bench_web.py [--repeat 5] [--real-dir DIR] [--no-real]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGETS_MS = {"first paint": 1500.0, "expand": 200.0, "collapse": 200.0, "jump to first divergence": 300.0}

#: Runs arguments[0] (JS source of an action) and resolves with the ms until the page applied
#: the server's answer and both graphs drew it.
ACT_JS = """
const [action, done] = [arguments[0], arguments[arguments.length - 1]];
const P = window.probe, n0 = P.updates || 0, t0 = performance.now();
function drawn(s) {
  const el = document.getElementById('g-graph-' + s);
  return !el || el.offsetParent === null || el.dataset.version == String(P.side(s).version);
}
(new Function(action))();
(function poll() {
  if ((P.updates || 0) > n0 && drawn('a') && drawn('b')) {
    requestAnimationFrame(() => done(performance.now() - t0));
  } else { setTimeout(poll, 1); }
})();
"""

#: Resolves with performance.now() (ms since navigation start) once both graphs and trees drew.
PAINT_JS = """
const done = arguments[arguments.length - 1];
(function poll() {
  const P = window.probe, a = document.getElementById('g-graph-a'), b = document.getElementById('g-graph-b');
  const ok = P && P.updates && a && a.dataset.drawn > 0 && (b.offsetParent === null || b.dataset.drawn > 0)
             && document.querySelector('#g-tree-a .row');
  if (ok) { requestAnimationFrame(() => done(performance.now())); } else { setTimeout(poll, 2); }
})();
"""


def synthetic_diff(out: str):
    from probe.visualizer.diff import DiffGraph, NodePair
    from probe.visualizer.graph import Graph
    from probe.visualizer.synthetic import write_dump_pair

    a, b = write_dump_pair(out, blocks=96, width=99, fault_block=48)
    ga, gb = Graph.load(a), Graph.load(b)
    return DiffGraph(ga, gb, [NodePair(n, n, "name") for n in ga if n in gb]), "synthetic 10k-node pair"


def real_diff(out: Path):
    """Mix-level dumps of the small preset, reference against a scaled weight, compared."""
    from probe.visualizer.diff import DiffGraph

    common = [sys.executable, "-m", "probe.cli", "dump", "--level", "mix", "--preset", "small", "--seed", "0",
              "--steps", "0", "--max-steps", "1"]
    for name, extra in (("ref", []), ("fault", ["--fault", "scale:layers.2.mlp.down_proj.weight:3"])):
        if not (out / name / "step0").is_dir():
            subprocess.run([*common, *extra, "--out", str(out / name)], check=True, capture_output=True)
    return DiffGraph.from_dumps(out / "ref", out / "fault"), "real mix dump, small preset"


def blocks_of(diff) -> list[str]:
    g = diff.graph("a")
    kids = {r: len(g.children(r)) for r in g.roots()}
    return sorted((r for r in kids if kids[r] and g.nodes[r].kind == "module"), key=lambda r: -kids[r])


def act(driver, js: str) -> float:
    return driver.execute_async_script(ACT_JS, js)


def toggle(node: str) -> str:
    return f"window.probe.send('toggle', 'a', {node!r});"


def bench_graph(diff, title: str, repeat: int) -> dict[str, list[float]]:
    from tests.web.conftest import new_driver, quit_driver
    from probe.web.app import ServerThread, create_app
    from probe.visualizer.navigate import first_divergence

    app = create_app(diff=diff)
    srv = ServerThread(app, "127.0.0.1", 0)
    driver = new_driver()
    driver.set_script_timeout(120)
    results: dict[str, list[float]] = {}
    g = diff.graph("a")
    blocks = blocks_of(diff)
    probe = blocks[len(blocks) // 3]
    try:
        driver.get(srv.url + "/")                      # warm the browser cache once
        driver.execute_async_script(PAINT_JS)
        for _ in range(repeat):
            driver.get(srv.url + "/")
            results.setdefault("first paint", []).append(driver.execute_async_script(PAINT_JS))
        target = first_divergence(diff)
        for _ in range(repeat):
            results.setdefault("jump to first divergence", []).append(
                act(driver, "document.getElementById('g-jump').click();"))
            top = g.ancestors(target[1])
            if top:
                act(driver, toggle(top[0]))
        driver.get(srv.url + "/")
        driver.execute_async_script(PAINT_JS)
        openable = [n for n in g.walk() if g.children(n) and not g.within(n, probe)]
        opened: list[str] = []
        for size in (0.0, 0.5, 1.0):                   # of the nodes with children, opened first
            for n in openable[:int(size * len(openable))]:
                if n not in opened:
                    act(driver, toggle(n))
                    opened.append(n)
            visible = driver.execute_script("return window.probe.flat('a').length;")
            for _ in range(repeat):
                results.setdefault(f"expand at {visible} visible", []).append(act(driver, toggle(probe)))
                results.setdefault(f"collapse at {visible + len(g.children(probe))} visible", []).append(
                    act(driver, toggle(probe)))
    finally:
        quit_driver(driver)
        srv.stop()
    print(f"\n{title}: {len(diff.graph('a'))} + {len(diff.graph('b'))} nodes, the block opened has "
          f"{len(g.children(probe))} children")
    return results


def bench_live(steps: int) -> int:
    """Bytes of one live-page refresh that brings one new step, after a run of ``steps`` steps
    of two ranks reported to a monitor service."""
    from probe.monitor.agent.monitor_agent import MonitorAgent
    from probe.monitor.service.server import MonitorService
    from tests.web.conftest import new_driver, quit_driver
    from probe.web.app import ServerThread, create_app

    def record(agents, step):
        for r, a in enumerate(agents):
            slow = 3.0 if r == 1 else 1.0
            a.record(step, {"step_time_ms": 40.0 * slow, "compute_time_ms": 30.0 * slow, "comm_time_ms": 5.0,
                            "data_time_ms": 1.0, "tokens_per_s": 9000 / slow})

    count = "var g = document.querySelector('#l-step-time .js-plotly-plot'); return g && g.data && g.data.length ? g.data[1].x.length : 0;"
    with tempfile.TemporaryDirectory() as tmp:
        svc = MonitorService(store_path=Path(tmp) / "monitor.duckdb", port=0, detect_interval_s=0.2)
        addr = f"127.0.0.1:{svc.start()}"
        agents = [MonitorAgent(addr, job="bench", rank=r, world_size=2) for r in (0, 1)]
        srv = driver = None
        try:
            for a in agents:
                a.start()
            for step in range(steps):
                record(agents, step)
            srv = ServerThread(create_app(monitor_addr=addr, refresh_ms=300), "127.0.0.1", 0)
            driver = new_driver()
            driver.get(srv.url + "/live")
            while driver.execute_script(count) < steps:
                time.sleep(0.1)
            time.sleep(2.0)                    # the host sampler's first memory point: drawn once
            ticks = "return performance.getEntriesByType('resource').filter(e => e.name.includes('_dash-update'))" \
                    ".map(e => e.encodedBodySize);"
            before = len(driver.execute_script(ticks))
            record(agents, steps)
            while driver.execute_script(count) < steps + 1:
                time.sleep(0.05)
            time.sleep(0.7)
            sizes = driver.execute_script(ticks)[before:]
        finally:
            if driver is not None:
                quit_driver(driver)
            if srv is not None:
                srv.stop()
            for a in agents:
                a.close()
            svc.stop()
    return max(sizes)


def report(results: dict[str, list[float]]) -> bool:
    ok = True
    for name, values in results.items():
        med = statistics.median(values)
        target = next((t for k, t in TARGETS_MS.items() if name.startswith(k)), None)
        line = f"  {name:<32} median {med:7.1f} ms  (min {min(values):.1f}, max {max(values):.1f})"
        if target is not None:
            ok &= med < target
            line += f"  target < {target:.0f} ms: {'ok' if med < target else 'MISSED'}"
        print(line)
    return ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--real-dir", default=None, help="where to keep (and reuse) the real dumps")
    p.add_argument("--no-real", action="store_true", help="skip the real small-preset dumps")
    args = p.parse_args(argv)

    from tests.web.conftest import CHROMEDRIVER, CHROMIUM

    if not (CHROMIUM and CHROMEDRIVER):
        print("bench_web: chromium/chromedriver not installed; apt-get install chromium chromium-driver")
        return 2
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        cases = [synthetic_diff(tmp)]
        if not args.no_real:
            cases.append(real_diff(Path(args.real_dir or tmp) / "real"))
        for diff, title in cases:
            ok &= report(bench_graph(diff, title, args.repeat))
    short, long = bench_live(20), bench_live(2000)
    same = long <= 1.1 * short + 100
    ok &= same
    print(f"\nlive page: one refresh after 20 steps {short} B, after 2,000 steps {long} B: "
          f"{'the same size' if same else 'GROWS with the run'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
