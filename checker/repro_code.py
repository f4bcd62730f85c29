"""The code that builds a node's module on one side of a ``probe repro`` folder.

Routes, in the order ``run.py`` tries them (``repro.json``, ``sides.<x>.routes``):

- ``source`` (the bundled engine): ``module.py`` holds the engine's own classes (its config
  dataclass, rotary tables and the model file of that implementation, copied from probe's
  engine with probe's imports left out) and the run's model config; ``build()`` makes the
  whole model on the meta device and returns the node's submodule, materialised on the CPU
  (the parameters come from ``params.safetensors``);
- ``class`` (a user's script): the module's class, imported from where the script imported it
  (the script's own file for a class it defines), with the constructor arguments read off the
  module when the script is re-run up to the module's first call
  (:mod:`probe.checker.repro_capture`), kept only when the class so built has the module's
  parameters and gives its outputs;
- ``export``: the module as a graph, ``torch.export`` of it on the node's recorded inputs
  (``module.pt2``): runs with torch alone, whatever the class needs.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from probe.ground.errors import ProbeError

#: the bundled engine's implementations: their model file and root class
ENGINE_FILES = {"reference": ("model_reference.py", "ReferenceLlama"), "fused": ("model_fused.py", "FusedLlama")}
#: how long the re-run of a script up to the module's first call may take
CAPTURE_TIMEOUT_S = 600


def write_api(side: Any) -> dict:
    """The spec of an API call's side: the API's name (``run.py`` resolves it in torch)."""
    return {"kind": "api", "api": side.api}


def module_routes(side: Any, into: Path) -> list[dict]:
    """Write the code of ``side``'s module into ``into``; the routes to build it."""
    hyper = (side.config or {}).get("hyperparameters") or {}
    if hyper.get("engine") in ENGINE_FILES and isinstance(hyper.get("model_config"), dict):
        (into / "module.py").write_text(engine_source(hyper["engine"], hyper["model_config"], side.path, side.cls))
        return [{"kind": "source", "file": "module.py",
                 "what": f"the bundled engine's {hyper['engine']} implementation and its config"}]
    script = _script_argv(side)
    if script is None:
        raise ProbeError(f"{side.dump_dir}: no way to build {side.node}: the run is neither the bundled engine "
                         "nor a script dumped with 'probe dump -- SCRIPT' (its config/rank<R>.json records no "
                         "command line to re-run)")
    return capture_routes(side, into, script)


# ------------------------------------------------------------------ the bundled engine
def engine_source(engine: str, model_config: dict, path: str, cls: str) -> str:
    """``module.py`` for the bundled engine's module at ``path``: the engine's classes, copied."""
    spec = importlib.util.find_spec("probe.engine")       # the engine's source, read as text
    if spec is None or not spec.submodule_search_locations:
        raise ProbeError("the bundled engine's source is not installed with probe")
    root = Path(list(spec.submodule_search_locations)[0])
    model_file, root_class = ENGINE_FILES[engine]
    imports: list[str] = ["import torch"]
    body: list[str] = []
    for name, keep in (("config.py", {"ModelConfig"}), ("rotary.py", None), (model_file, None)):
        text = (root / name).read_text()
        tree = ast.parse(text)
        lines = text.splitlines()
        for node in tree.body:
            seg = "\n".join(lines[min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))]) - 1:
                                  node.end_lineno])
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                mod = getattr(node, "module", None) or ""
                names = [a.name for a in node.names]
                if mod == "__future__" or mod.startswith("probe") or any(n.startswith("probe") for n in names):
                    continue
                if seg not in imports:
                    imports.append(seg)
            elif isinstance(node, ast.Expr) and isinstance(getattr(node, "value", None), ast.Constant):
                continue                                   # the file's docstring
            elif keep is None or getattr(node, "name", None) in keep:
                body.append(seg)
    fields = {k: v for k, v in model_config.items()}
    return "\n".join([
        f'"""The bundled engine\'s {engine} implementation, copied from probe\'s engine '
        f'(config.py, rotary.py, {model_file}), and the module {path or "(the model)"} ({cls}) of the run.',
        "",
        "``build()`` makes the model on the meta device and returns that module on the CPU, its",
        'parameters uninitialised (run.py loads them from params.safetensors)."""',
        "",
        "from __future__ import annotations",
        "",
        *imports, "", "",
        *[b + "\n\n" for b in body],
        f"CONFIG = {json.dumps(fields, indent=1)}",
        f"PATH = {path!r}",
        f"CLASS = {cls!r}",
        "",
        "",
        "def build() -> nn.Module:",
        f'    """The run\'s {cls} at {path or "the root"}, on the CPU, parameters to be loaded."""',
        "    cfg = ModelConfig(**CONFIG)",
        '    with torch.device("meta"):',
        f"        root = {root_class}(cfg)",
        "    module = root.get_submodule(PATH) if PATH else root",
        "    if type(module).__name__ != CLASS:",
        '        raise TypeError(f"{PATH} is a {type(module).__name__}, not the {CLASS} the dump recorded")',
        '    return module.to_empty(device="cpu")',
        ""])


# ------------------------------------------------------------------ a user's script
def _script_argv(side: Any) -> list[str] | None:
    """The script and its arguments of a run dumped with ``probe dump -- SCRIPT ARGS``."""
    argv = ((side.config or {}).get("run") or {}).get("argv")
    if not isinstance(argv, list) or "--" not in argv or len(argv) < 2 or argv[1] != "dump":
        return None
    from probe.checker.repro_sources import is_probe_command

    if not is_probe_command(str(argv[0])):
        return None
    script = argv[argv.index("--") + 1:]
    return script or None


def capture_routes(side: Any, into: Path, script: list[str]) -> list[dict]:
    """Re-run the script up to the module's first call (:mod:`probe.checker.repro_capture`) and
    take its class, constructor arguments and exported graph."""
    run = (side.config or {}).get("run") or {}
    spec = {"argv": script, "cwd": run.get("cwd") or os.getcwd(), "path": side.path, "cls": side.cls,
            "side_dir": str(into.resolve()), "args": side.args_tree, "kwargs": side.kwargs_tree}
    (into / "capture_spec.json").write_text(json.dumps(spec))
    try:
        done = subprocess.run([sys.executable, "-m", "probe.checker.repro_capture", str(into / "capture_spec.json")],
                              cwd=spec["cwd"], capture_output=True, text=True, timeout=CAPTURE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ProbeError(f"{script[0]}: re-running it up to {side.node} took over {CAPTURE_TIMEOUT_S} s") from None
    finally:
        (into / "capture_spec.json").unlink(missing_ok=True)
    result_path = into / "capture.json"
    if done.returncode != 0 or not result_path.is_file():
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ProbeError(f"{script[0]}: re-running it to build {side.node} failed (exit {done.returncode}): {last}")
    captured = json.loads(result_path.read_text())
    result_path.unlink()
    routes = [r for r in (captured.get("class"), captured.get("export")) if r]
    if not routes:
        raise ProbeError(f"{side.node}: neither its class nor torch.export rebuilds it "
                         f"({'; '.join(captured.get('errors') or ['no reason given'])})")
    return routes
