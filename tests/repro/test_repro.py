"""``probe repro``: a compare's divergence as a folder that runs with torch and safetensors alone.

Each reproducer's ``run.py`` runs in a fresh ``python -I`` from its folder with an import hook
that refuses probe (and transformers, pyarrow, duckdb): it needs torch and safetensors only.
Its verdict and metrics are held to the compare's (``compare.parquet``), within 1e-6 relative.
"""

from __future__ import annotations

import ast
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

HERE = Path(__file__).resolve().parent
#: run.py under an import hook that refuses everything but torch, safetensors and the stdlib
#: (what torch itself imports passes)
ISOLATED = """
import sys
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('probe', 'transformers', 'pyarrow', 'duckdb', 'orjson'):
            raise ImportError('run.py must not import ' + name)
sys.meta_path.insert(0, Refuse())
import runpy
sys.argv = ['run.py'] + sys.argv[1:]
runpy.run_path('run.py', run_name='__main__')
"""


def probe(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "probe.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600)


def run_py(folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-I", "-c", ISOLATED, *args], cwd=folder, capture_output=True,
                          text=True, timeout=300)


def dump(cwd: Path, out: str, *args: str) -> None:
    done = probe("dump", "--steps", "0", "--out", out, *args, cwd=cwd)
    assert done.returncode == 0, done.stderr[-2000:]


def compare(cwd: Path, a: str, b: str, out: str) -> None:
    done = probe("compare", a, b, "--out", out, cwd=cwd)
    assert done.returncode == 0, done.stderr[-2000:]


def probe_here(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``probe ARGS`` in this process (as ``main`` runs it), in ``cwd``."""
    import contextlib
    import io
    import os

    from probe.cli import main

    out, err, was = io.StringIO(), io.StringIO(), os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(list(args))
    finally:
        os.chdir(was)
    return subprocess.CompletedProcess(args, rc, out.getvalue(), err.getvalue())


def repro(cwd: Path, cmp: str, out: str, *args: str) -> subprocess.CompletedProcess:
    done = probe_here("repro", cmp, "--out", out, *args, cwd=cwd)
    assert done.returncode == 0, done.stderr[-2000:] + done.stdout[-2000:]
    return done


def compare_row(cmp: Path, node: str) -> dict:
    """The compare's worst forward output row of ``node`` (A's name)."""
    rows = [r for r in pq.read_table(cmp / "compare.parquet").to_pylist()
            if r["node_a"] == node and r["slot"] == "output" and r["direction"] == "forward"]
    order = {"pass": 0, "warning": 1, "error": 2, "nan": 3}
    return max(rows, key=lambda r: (order[r["verdict"]], r["err"]))


def assert_reproduces(folder: Path, cmp: Path, node: str) -> dict:
    """run.py --json gives the compare's verdict and metrics; exit 1 as it diverges."""
    source = (folder / "run.py").read_text()
    imported = {a.name.split(".")[0] for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ImportFrom) and n.module}
    assert "probe" not in imported and imported <= {"__future__", "argparse", "importlib", "json", "math", "os",
                                                    "sys", "copy", "torch", "safetensors"}, imported
    done = run_py(folder, "--json")
    assert done.returncode in (0, 1), done.stderr
    got = json.loads(done.stdout)
    assert set(got) == {"node", "verdict", "max_abs_error", "max_rel_error", "cosine"}
    want = compare_row(cmp, node)
    assert got["node"] == node
    assert got["verdict"] == want["verdict"]
    assert done.returncode == (0 if want["verdict"] == "pass" else 1)
    for mine, theirs in (("max_abs_error", "max_abs_err"), ("max_rel_error", "max_rel_err"), ("cosine", "cosine")):
        assert math.isclose(got[mine], want[theirs], rel_tol=1e-6), (mine, got[mine], want[theirs])
    return got


# ------------------------------------------------------------------ the bundled engine
@pytest.fixture(scope="module")
def engine_pair(tmp_path_factory) -> Path:
    """Reference vs fused (tiny), tensor dumps of step 0, B with a weight scaled by 1.5."""
    root = tmp_path_factory.mktemp("engine")
    common = ["--level", "module", "--task", "tensor", "--tensor-format", "safetensors", "--max-steps", "1"]
    dump(root, "ref", *common)
    dump(root, "fused", *common, "--engine", "fused", "--fault", "scale:decoder.layers.1.mlp.linear_fc2.weight:1.5")
    done = probe_here("compare", "ref/step0/rank0/dump.json", "fused/step0/rank0/dump.json", "--out", "cmp", cwd=root)
    assert done.returncode == 0, done.stderr
    return root


def test_engine_first_divergence_reproduces(engine_pair: Path) -> None:
    done = repro(engine_pair, "cmp", "r1")
    assert "tensors from the tensor dump" in done.stdout
    assert "bundled engine's reference implementation" in done.stdout
    assert "bundled engine's fused implementation" in done.stdout
    folder = engine_pair / "r1"
    for side in ("a", "b"):
        assert {p.name for p in (folder / side).iterdir()} >= {"inputs.safetensors", "params.safetensors",
                                                                "outputs.safetensors", "module.py"}
    got = assert_reproduces(folder, engine_pair / "cmp", "Module.layers.1.mlp.down_proj.Linear.forward.0")
    assert got["verdict"] == "error"
    swap = run_py(folder, "--swap-inputs")
    assert swap.returncode == 1, swap.stderr
    assert swap.stdout.startswith("the module diverges")
    # the folder runs from anywhere: copied elsewhere, it still reproduces
    moved = engine_pair / "elsewhere" / "r1"
    shutil.copytree(folder, moved)
    plain = run_py(moved)
    assert plain.returncode == 1 and "the divergence reproduces" in plain.stdout
    assert "built  A from module.py (the bundled engine's reference implementation" in plain.stdout


def test_engine_downstream_node_inherits_the_divergence(engine_pair: Path) -> None:
    """The final norm diverges only because its inputs do: --swap-inputs says so and names
    the origin upstream."""
    repro(engine_pair, "cmp", "r2", "--node", "Module.norm.RMSNorm.forward.0")
    folder = engine_pair / "r2"
    assert_reproduces(folder, engine_pair / "cmp", "Module.norm.RMSNorm.forward.0")
    swap = run_py(folder, "--swap-inputs")
    assert swap.returncode == 0, swap.stderr
    assert swap.stdout.strip() == ("the module agrees; its inputs carry the divergence (look upstream at "
                                   "Module.layers.1.mlp.down_proj.Linear.forward.0)")
    # B's name names the node too
    repro(engine_pair, "cmp", "r3", "--node", "Module.decoder.layers.1.mlp.FusedMLP.forward.0")
    spec = json.loads((engine_pair / "r3" / "repro.json").read_text())
    assert spec["node"] == "Module.layers.1.mlp.MLP.forward.0"
    assert spec["sides"]["b"]["node"] == "Module.decoder.layers.1.mlp.FusedMLP.forward.0"


def test_bad_input_is_one_line(engine_pair: Path, tmp_path: Path) -> None:
    done = probe_here("repro", "cmp", "--node", "Module.nothing.Linear.forward.0", "--out", "bad", cwd=engine_pair)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "nodes.parquet: no node 'Module.nothing.Linear.forward.0'" in done.stderr
    done = probe_here("repro", str(tmp_path), "--out", str(tmp_path / "o"), cwd=engine_pair)
    assert done.returncode == 2 and "summary.json: no such file" in done.stderr
    assert done.stderr.count("\n") == 1


def test_statistics_dump_without_a_way_to_rerun(tmp_path: Path, engine_pair: Path) -> None:
    """A statistics dump whose run records no command line: one line, exit 2."""
    for side in ("ref", "fused"):
        shutil.copytree(engine_pair / side / "step0", tmp_path / side / "step0")
        for f in (tmp_path / side / "step0").rglob("dump_tensor_data"):
            shutil.rmtree(f)
    compare(tmp_path, "ref/step0/rank0/dump.json", "fused/step0/rank0/dump.json", "cmp")
    done = probe_here("repro", "cmp", "--out", "o", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "no way to re-run it" in done.stderr and done.stderr.count("\n") == 1


# ------------------------------------------------------------------ an API call (mix level)
def _mix_dump(out: Path, scale: float) -> None:
    """A small network dumped at mix level (tensors), its last layer's weight scaled."""
    import torch

    import probe as probe_api

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 8))
    with torch.no_grad():
        net[2].weight.mul_(scale)
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
    with probe_api.dump(net, out=str(out), level="mix", task="tensor", tensor_format="safetensors",
                        auto_step=False, store=False, quiet=True):
        net(x).sum().backward()


def test_mix_level_api_call(tmp_path: Path) -> None:
    import probe as probe_api

    _mix_dump(tmp_path / "ma", 1.0)
    _mix_dump(tmp_path / "mb", 1.5)
    probe_api.compare(str(tmp_path / "ma"), str(tmp_path / "mb")).write(tmp_path / "cmp")
    nodes = pq.read_table(tmp_path / "cmp" / "nodes.parquet").to_pylist()
    inside = [r["node_a"] for r in nodes if r["direction"] == "forward" and r["kind"] == "api"
              and r["parent_a"] == "Module.2.Linear.forward.0"]
    call = next(n for n in inside if n.startswith("Functional.linear."))
    done = repro(tmp_path, "cmp", "r", "--node", call)
    assert "(api)" in done.stdout and "check-api on a float64 golden: pass" in done.stdout
    got = assert_reproduces(tmp_path / "r", tmp_path / "cmp", call)
    assert got["verdict"] == "error"
    plain = run_py(tmp_path / "r")
    assert plain.returncode == 1
    assert "replayed in float32: identical to the recorded one; against float64" in plain.stdout
    swap = run_py(tmp_path / "r", "--swap-inputs")   # the same linear on either side's inputs: the
    assert swap.returncode == 0                       # scaled weight is an input of the call
    assert swap.stdout.strip() == ("the module agrees; its inputs carry the divergence "
                                   "(look upstream at Module.2.Linear.forward.0)")


# ------------------------------------------------------------------ heavier: re-run, Hugging Face
@pytest.mark.slow
def test_statistics_dumps_are_rerun(tmp_path: Path) -> None:
    dump(tmp_path, "sa", "--level", "module", "--max-steps", "1")
    dump(tmp_path, "sb", "--level", "module", "--max-steps", "1", "--engine", "fused",
         "--fault", "scale:decoder.layers.1.mlp.linear_fc2.weight:1.5")
    compare(tmp_path, "sa", "sb", "cmp")
    done = repro(tmp_path, "cmp", "r")
    assert done.stdout.count("a targeted re-run of step 0") == 2
    assert "exactly the statistics of the original dump" in done.stdout
    got = json.loads(run_py(tmp_path / "r", "--json").stdout)
    assert got["verdict"] == compare_row(tmp_path / "cmp", got["node"])["verdict"] == "error"
    assert not list(tmp_path.glob("probe-repro-*"))


@pytest.mark.slow
def test_hugging_face_llama_with_a_weight_fault(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    script = str(HERE / "hf_llama_train.py")
    common = ["--level", "module", "--task", "tensor", "--tensor-format", "safetensors"]
    dump(tmp_path, "hfa", *common, "--", script)
    dump(tmp_path, "hfb", *common, "--", script, "--scale", "model.layers.0.mlp.down_proj.weight:1.5")
    compare(tmp_path, "hfa", "hfb", "cmp")
    first = json.loads((tmp_path / "cmp" / "summary.json").read_text())["first_divergence"]["a"]
    assert first == "Module.model.layers.0.mlp.down_proj.Linear.forward.0"
    done = repro(tmp_path, "cmp", "r1")
    assert "class torch.nn.modules.linear.Linear(in_features=64, out_features=32, bias=False)" in done.stdout
    assert_reproduces(tmp_path / "r1", tmp_path / "cmp", first)
    assert run_py(tmp_path / "r1", "--swap-inputs").stdout.startswith("the module diverges")
    # a class that does not import here: run.py falls back to the exported graph
    spec_path = tmp_path / "r1" / "repro.json"
    spec = json.loads(spec_path.read_text())
    assert [r["kind"] for r in spec["sides"]["a"]["routes"]] == ["class", "export"]
    spec["sides"]["a"]["routes"][0]["module"] = "no_such_package.modules"
    spec_path.write_text(json.dumps(spec))
    plain = run_py(tmp_path / "r1")
    assert plain.returncode == 1 and "built  A from the graph exported with torch.export" in plain.stdout
    node = "Module.model.layers.1.mlp.LlamaMLP.forward.0"          # a transformers class: exported
    done = repro(tmp_path, "cmp", "r2", "--node", node)
    assert "exported with torch.export" in done.stdout
    assert_reproduces(tmp_path / "r2", tmp_path / "cmp", node)
    swap = run_py(tmp_path / "r2", "--swap-inputs")
    assert swap.returncode == 0 and swap.stdout.strip() == (
        f"the module agrees; its inputs carry the divergence (look upstream at {first})")


@pytest.mark.slow
def test_bf16_autocast_run_gets_the_compares_verdict(tmp_path: Path) -> None:
    """The bundled engine's bf16 (forward under bfloat16 autocast): run.py replays under the
    same autocast and grades as the compare does (its rounding-noise floor included)."""
    common = ["--level", "module", "--task", "tensor", "--tensor-format", "safetensors", "--max-steps", "1",
              "--dtype", "bf16"]
    dump(tmp_path, "a", *common)
    dump(tmp_path, "b", *common, "--engine", "fused", "--fault", "scale:decoder.layers.1.mlp.linear_fc2.weight:1.5")
    compare(tmp_path, "a/step0/rank0/dump.json", "b/step0/rank0/dump.json", "cmp")
    for node, out in (("Module.layers.1.mlp.down_proj.Linear.forward.0", "r1"), ("Module.norm.RMSNorm.forward.0", "r2")):
        repro(tmp_path, "cmp", out, "--node", node)
        assert json.loads((tmp_path / out / "repro.json").read_text())["sides"]["a"]["autocast"] == "bfloat16"
        assert_reproduces(tmp_path / out, tmp_path / "cmp", node)
