"""msprobe's own graph builder (``msprobe graph_visualize``) reads our module and mix dumps into
a graph that holds every node we wrote, with the same module tree as our construct.json."""

from __future__ import annotations

import json
import sqlite3
import subprocess

import pytest

from tests.conftest import ROOT, run_probe

MSPROBE = ROOT / ".venv-bench" / "bin" / "msprobe"


def _msprobe_ready() -> bool:
    if not MSPROBE.exists():
        return False
    r = subprocess.run([str(MSPROBE.parent / "python"), "-c", "import torch, msprobe.pytorch"],
                       capture_output=True)
    return r.returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(not _msprobe_ready(), reason=f"mindstudio-probe with torch not found at {MSPROBE}")
@pytest.mark.parametrize("level, engine", [("module", "reference"), ("mix", "fused")])
def test_msprobe_graph_builder_holds_every_node_we_wrote_in_our_tree(tmp_path, level, engine):
    out = tmp_path / "dump"
    r = run_probe("dump", "--level", level, "--engine", engine, "--steps", "0", "--out", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    vis = subprocess.run([str(MSPROBE), "graph_visualize", "-tp", str(out / "step0"), "-o",
                          str(tmp_path / "vis")], capture_output=True, text=True, timeout=600)
    assert vis.returncode == 0, vis.stdout[-2000:] + vis.stderr[-2000:]
    [db_path] = list((tmp_path / "vis").glob("*.vis.db"))
    db = sqlite3.connect(db_path)
    up = dict(db.execute("select node_name, up_node from tb_nodes").fetchall())
    rank = out / "step0" / "rank0"
    construct = json.loads((rank / "construct.json").read_text())
    written = set(construct) | set(json.loads((rank / "dump.json").read_text())["data"])
    missing = written - set(up)
    assert not missing, f"{len(missing)} of our {len(written)} nodes are not in msprobe's graph: {sorted(missing)[:5]}"
    # module nodes: msprobe's parent is ours (our roots hang under its model root)
    modules = [n for n in construct if n.startswith("Module.")]
    differ = [(n, construct[n], up[n]) for n in modules
              if (construct[n] or "DefaultModel") != up[n]]
    assert not differ, f"{len(differ)} module nodes have another parent in msprobe's graph: {differ[:3]}"
