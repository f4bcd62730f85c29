"""Where ``probe repro`` finds a node's tensors: the compare folder, each side's dump, and (for
a dump of statistics only) a targeted re-run of that step with a tensor dump scoped to the node.

A side's tensors are the node's positional and keyword inputs, the parameters of the module and
of every module inside it (at their first call in the step: parameters do not change within a
forward), and its outputs. A dump made by ``probe dump`` records how it was run
(``config/rank<R>.json``: its command line and folder), so a dump of statistics can be made
again as a tensor dump of that one step, that one rank and that one module
(``--task tensor --steps N --ranks R --scope ^Module\\.<path>\\.``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from probe.checker.calls import TensorFiles, TensorRef, decode, materialise, tensor_refs
from probe.ground.errors import ProbeError
from probe.ground.frameworks import module_prefixes

log = logging.getLogger(__name__)

#: how long a targeted re-run may take
RERUN_TIMEOUT_S = 900


def locate_compare(folder: Path) -> tuple[Path, dict]:
    """The folder of one compared pair and its summary: ``folder`` itself, or for a compare of
    runs of several steps/ranks the pair holding the first divergence."""
    summary_path = folder / "summary.json"
    if not folder.is_dir():
        raise ProbeError(f"{folder}: no such folder; give the --out folder of probe compare")
    if not summary_path.is_file():
        raise ProbeError(f"{summary_path}: no such file; {folder} is not the --out folder of probe compare")
    try:
        summary = json.loads(summary_path.read_text())
    except (OSError, ValueError) as e:
        raise ProbeError(f"{summary_path}: not readable JSON ({e})") from None
    if isinstance(summary.get("ranks"), list) and not (folder / "nodes.parquet").is_file():
        first = summary.get("first_divergence") or {}
        pairs = [p for p in summary["ranks"] if isinstance(p, dict) and "error" not in p]
        pick = [p for p in pairs if p.get("step") == first.get("step") and p.get("rank") == first.get("rank")]
        if not (pick or pairs):
            raise ProbeError(f"{summary_path}: no compared pair to reproduce")
        p = (pick or pairs)[0]
        where = "/".join(x for x in (None if p.get("step") is None else f"step{p['step']}",
                                     None if p.get("rank") is None else f"rank{p['rank']}") if x) or "pair"
        sub = folder / where                      # (the pair's "out" is relative to where the compare ran)
        if not sub.is_dir() and isinstance(p.get("out"), str) and Path(p["out"]).is_dir():
            sub = Path(p["out"])
        return locate_compare(sub)
    for name in ("nodes.parquet", "compare.parquet"):
        if not (folder / name).is_file():
            raise ProbeError(f"{folder / name}: no such file; the compare in {folder} is incomplete")
    return folder, summary


def node_pair(folder: Path, summary: dict, nodes: list[dict], node: str | None) -> dict:
    """The forward node pair to reproduce: the one named (by A's or B's name), or the first
    divergence."""
    forward = [r for r in nodes if r["direction"] == "forward" and r["node_a"] and r["node_b"]]
    if node is None:
        first = summary.get("first_divergence")
        if not first:
            raise ProbeError(f"{folder / 'summary.json'}: the compare found no divergence; name a node with --node")
        if first.get("direction") != "forward":
            raise ProbeError(f"{folder / 'summary.json'}: the first divergence, {first.get('a')}, is in the "
                             "backward pass; name a forward node with --node")
        node = first.get("a")
    hits = [r for r in forward if node in (r["node_a"], r["node_b"])]
    if not hits:
        near = [r["node_a"] for r in forward if node.split(".")[-3:-2] and node.split(".")[-3] in r["node_a"]][:3]
        known = [r for r in nodes if node in (r["node_a"], r["node_b"])]
        why = ("it has no counterpart on the other side" if known and known[0]["verdict"] == "unmatched"
               else "it is not a forward node of this compare")
        raise ProbeError(f"{folder / 'nodes.parquet'}: no node {node!r} ({why})"
                         + (f"; e.g. {', '.join(near)}" if near else ""))
    # a node matched in full before one matched at its nearest matched ancestor (an unfused
    # part compared with the fused whole)
    return sorted(hits, key=lambda r: (r.get("match_method") == "ancestor", r["node_a"] != node))[0]


def read_side(folder: Path, summary: dict, side: str, node: str) -> "Side":
    """Side ``side`` (``a``/``b``) of the compare: its dump folder and the node's entry."""
    given = summary.get(side)
    if not isinstance(given, str):
        raise ProbeError(f"{folder / 'summary.json'}: no path of dump {side.upper()}")
    dump = _find_dump(Path(given), folder)
    if dump is None:
        raise ProbeError(f"{folder / 'summary.json'}: dump {side.upper()} {given!r} is not there any more "
                         f"(looked beside the current folder and {folder})")
    return Side(side, dump, node)


def _find_dump(given: Path, folder: Path) -> Path | None:
    """The dump.json the compare read (its path as given to the compare: relative to where it
    ran, which may be the compare folder's parent)."""
    tries = [given] if given.is_absolute() else [given, *(p / given for p in [folder, *folder.resolve().parents])]
    for t in tries:
        if t.is_file():
            return t
        if t.is_dir():
            found = sorted(t.rglob("dump.json"))
            if len(found) == 1:
                return found[0]
    return None


class Side:
    """One side of the node: its dump entry, config, and (after :meth:`gather`) its tensors."""

    def __init__(self, name: str, dump_json: Path, node: str) -> None:
        self.name, self.node = name, node
        self.dump_json = dump_json
        self.dump_dir = dump_json.parent
        dump = _read_json(dump_json)
        self.header = {k: dump.get(k) for k in ("task", "level", "framework", "dump_data_dir")}
        self.data = dump.get("data") or {}
        if node not in self.data:
            raise ProbeError(f"{dump_json}: no entry {node!r}")
        self.entry = self.data[node]
        self.kind = "module" if node.startswith(tuple(p + "." for p in module_prefixes())) else "api"
        self.path, self.cls, self.call = _module_parts(node) if self.kind == "module" else ("", "", 0)
        self.api = ".".join(node.split(".")[:-2]) if self.kind == "api" else ""
        self.step, self.rank = _step_rank(self.dump_dir)
        self.config = _config(self.dump_dir, self.rank)
        hyper = (self.config or {}).get("hyperparameters") or {}
        self.faults = [str(f) for f in hyper.get("faults") or []]
        #: the bundled engine's bf16 runs its forward under bfloat16 autocast
        self.autocast = "bfloat16" if hyper.get("dtype") == "bf16" else None
        self.source = ""
        self.rerun_note = ""
        self.args_tree: Any = None
        self.kwargs_tree: Any = None
        self.output_paths: list[str] = []
        self.params: dict[str, Any] = {}

    # ------------------------------------------------------------------ which entries
    def _param_refs(self, data: dict) -> dict[str, TensorRef]:
        """The parameters of the node's module and of the modules inside it, by their name in
        the module's ``state_dict`` (the first call of each in the step)."""
        if self.kind != "module":
            return {}
        prefix = self.node.split(".")[0]
        found: dict[str, TensorRef] = {}
        for name, entry in data.items():
            if not isinstance(entry, dict) or not name.startswith(prefix + ".") or ".forward." not in name:
                continue
            path, _, _ = _module_parts(name)
            if path != self.path and not (self.path == "" or path.startswith(self.path + ".")):
                continue
            rel = path[len(self.path) + 1:] if self.path and path != self.path else ("" if path == self.path else path)
            for pname, ref in (decode(entry.get("parameters") or {}) or {}).items():
                if isinstance(ref, TensorRef):
                    found.setdefault(f"{rel}.{pname}" if rel else pname, ref)
        return found

    def _refs(self, data: dict) -> tuple[Any, Any, list, dict]:
        entry = data[self.node]
        args = decode(entry.get("input_args") or [])
        kwargs = decode(entry.get("input_kwargs") or {})
        outputs = decode(entry.get("output") if isinstance(entry.get("output"), list) else [entry.get("output")])
        return args, kwargs, outputs, self._param_refs(data)

    # ------------------------------------------------------------------ the tensors
    def gather(self, into: Path) -> None:
        """Load the node's tensors (from the dump, else from a targeted re-run) and write them
        into ``into`` as safetensors: ``inputs``, ``params``, ``outputs``."""
        from safetensors.torch import save_file

        args, kwargs, outputs, params = self._refs(self.data)
        files = TensorFiles(self.dump_dir, self.header)
        refs = [*tensor_refs(args), *tensor_refs(kwargs), *tensor_refs(outputs), *params.values()]
        missing = [r for r in refs if r.file is None or files.path(r.file) is None]
        self.source = f"the tensor dump ({self.dump_dir})"
        if missing:
            rerun_dir, data, header = self._rerun(missing[0])
            args, kwargs, outputs, params = self._refs(data)
            files = TensorFiles(rerun_dir, header)
            self.source = f"a targeted re-run of step {self.step} (a tensor dump scoped to the node)"
        tensors: dict[str, Any] = {}
        args_v, miss = materialise(args, files)
        kwargs_v, miss_k = materialise(kwargs, files)
        outs_v, miss_o = materialise(outputs, files)
        params_v = {k: files.load(r) for k, r in params.items()}
        lost = miss or miss_k or miss_o or next((k for k, v in params_v.items() if v is None), None)
        if lost:
            raise ProbeError(f"{self.dump_dir}: no tensor file for {lost} of {self.node}; dump with --task tensor")
        self.args_tree = _tree(args_v, tensors, "args")
        self.kwargs_tree = _tree(kwargs_v, tensors, "kwargs")
        flat_out: dict[str, Any] = {}
        self.output_paths = []
        _flat_outputs(outs_v, "", flat_out, self.output_paths)
        self.params = params_v
        self.check = _check_call(self.api, args_v, kwargs_v, outs_v) if self.kind == "api" else None
        if missing:
            import shutil

            shutil.rmtree(self._tmp, ignore_errors=True)     # the re-run's own folder
        into.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(into / "inputs.safetensors"))
        save_file({f"output.{i}": flat_out[p].contiguous() for i, p in enumerate(self.output_paths)},
                  str(into / "outputs.safetensors"))
        save_file({k: v.contiguous() for k, v in params_v.items()}, str(into / "params.safetensors"))

    def output_index(self, index: str | None) -> int | None:
        """The place in the module's flattened outputs of the compare's output ``index``."""
        key = str(index if index is not None else "0")
        if key in self.output_paths:
            return self.output_paths.index(key)
        return None

    # ------------------------------------------------------------------ the re-run
    def _rerun(self, missing: TensorRef) -> tuple[Path, dict, dict]:
        """Dump this node's step again as tensors, scoped to the node (the run's own command
        line, from ``config/rank<R>.json``)."""
        what = f"{self.dump_dir}: the dump holds no tensor file for {self.node} ({self.header.get('task')} dump)"
        run = (self.config or {}).get("run") or {}
        argv = run.get("argv")
        if not isinstance(argv, list) or len(argv) < 2 or argv[1] != "dump" or not is_probe_command(str(argv[0])):
            raise ProbeError(f"{what}, and no way to re-run it: its run folder has no config/rank{self.rank}.json "
                             "recording a 'probe dump' command line; dump with --task tensor")
        cwd = run.get("cwd") or os.getcwd()
        tmp = self._tmp = Path(tempfile.mkdtemp(prefix=f"probe-repro-{self.name}-"))
        scope = (r"^" + re.escape(self.node.split(".")[0] + "." + self.path) + r"\." if self.kind == "module"
                 else r"^" + re.escape(self.api) + r"$")
        extra = ["--task", "tensor", "--tensor-format", "safetensors", "--scope", scope, "--out", str(tmp)]
        if self.step is not None:
            extra += ["--steps", str(self.step)]
        if self.rank is not None:
            extra += ["--ranks", str(self.rank)]
        rest = list(argv[2:])
        cut = rest.index("--") if "--" in rest else len(rest)
        cmd = [sys.executable, "-m", "probe.cli", "dump", *_without(rest[:cut], ("--out", "--scope", "--task",
                                                                             "--tensor-format", "--steps",
                                                                             "--ranks", "--names")),
               *extra, *rest[cut:]]
        log.warning("probe repro: side %s: %s; re-running step %s with a tensor dump scoped to it",
                    self.name.upper(), what, self.step)
        try:
            done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=RERUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise ProbeError(f"{what}; the re-run ({' '.join(cmd[3:])}) took over {RERUN_TIMEOUT_S} s") from None
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise ProbeError(f"{what}; the re-run in {cwd} failed with exit {done.returncode}: {last}")
        found = sorted(tmp.rglob("dump.json"))
        if not found:
            raise ProbeError(f"{what}; the re-run wrote no dump.json into {tmp}")
        dump = _read_json(found[0])
        data = dump.get("data") or {}
        if self.node not in data:
            raise ProbeError(f"{what}; the re-run ({found[0]}) has no entry {self.node}: the run does not "
                             "take the same path again")
        self.rerun_note = (f"Side {self.name.upper()}: the dump held statistics only; its tensors come from a "
                           f"re-run of step {self.step} ({' '.join(str(a) for a in argv)}, with a tensor dump "
                           f"scoped to `{scope}`); {self._agreement(data[self.node])}.")
        return found[0].parent, data, {k: dump.get(k) for k in ("task", "level", "framework", "dump_data_dir")}

    def _agreement(self, entry: dict) -> str:
        """Whether the re-run's outputs have the statistics the original dump recorded."""
        def stats(e: Any) -> list:
            outs = e.get("output") if isinstance(e, dict) else None
            return [[o.get(k) for k in ("Max", "Min", "Mean", "Norm")] for o in _leaves(outs)]
        old, new = stats(self.entry), stats(entry)
        if old and old == new:
            return "the re-run's outputs have exactly the statistics of the original dump"
        close = len(old) == len(new) and all(
            a is None or b is None or abs(a - b) <= 1e-6 * max(abs(a), abs(b), 1e-30)
            for x, y in zip(old, new) for a, b in zip(x, y))
        return ("the re-run's output statistics agree with the original dump's within 1e-6" if close else
                "the re-run's output statistics DIFFER from the original dump's (the run is not deterministic)")


def _check_call(api: str, args: Any, kwargs: Any, outputs: Any) -> dict:
    """The call graded as ``probe check-api`` grades it (replayed on a float64 golden)."""
    from probe.checker.replay import GOLDENS, check_call

    try:
        row = check_call(api, list(args), dict(kwargs), list(outputs), GOLDENS["cpu-fp64"])
    except ProbeError as e:
        return {"verdict": "skipped", "reason": str(e)}
    return {"verdict": row["verdict"], "reason": row["reason"]}


def _read_json(path: Path) -> dict:
    """A dump.json (orjson; the json module for the NaN/Infinity literals a dump may hold)."""
    import orjson

    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ProbeError(f"{path}: cannot read ({e.strerror})") from None
    try:
        dump = orjson.loads(raw)
    except orjson.JSONDecodeError:
        try:
            dump = json.loads(raw.decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            raise ProbeError(f"{path}: not valid JSON ({str(e).splitlines()[0]})") from None
    if not isinstance(dump, dict) or not isinstance(dump.get("data"), dict):
        raise ProbeError(f"{path}: no 'data' object; not a dump.json of probe or msprobe")
    return dump


def _leaves(x: Any) -> list[dict]:
    if isinstance(x, dict) and ("Max" in x or "type" in x):
        return [x] if "Max" in x else []
    if isinstance(x, list):
        return [leaf for v in x for leaf in _leaves(v)]
    return []


def is_probe_command(program: str) -> bool:
    """Whether ``program`` (a recorded ``argv[0]``) is the probe command line."""
    p = Path(program)
    return p.name.startswith("probe") or (p.parent.name == "probe" and p.name in ("cli.py", "__main__.py"))


def _without(args: list[str], options: tuple[str, ...]) -> list[str]:
    """``args`` without the given options (``--out X`` and ``--out=X``).

    >>> _without(["--level", "module", "--out", "runs/a", "--steps=0,2", "--max-steps", "3"], ("--out", "--steps"))
    ['--level', 'module', '--max-steps', '3']
    """
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a in options:
            skip = True
            continue
        if any(a.startswith(o + "=") for o in options):
            continue
        out.append(a)
    return out


def _module_parts(name: str) -> tuple[str, str, int]:
    """``(path, class, call)`` of ``Module.layers.0.attn.Attention.forward.0``.

    >>> _module_parts("Module.layers.0.attn.Attention.forward.0")
    ('layers.0.attn', 'Attention', 0)
    """
    parts = name.split(".")
    if len(parts) < 4 or parts[-2] not in ("forward", "backward"):
        raise ProbeError(f"{name!r} is not a module call's name (Module.<path>.<Class>.forward.<n>)")
    call = int(parts[-1]) if parts[-1].isdigit() else 0
    return ".".join(parts[1:-3]), parts[-3], call


def _step_rank(folder: Path) -> tuple[int | None, int | None]:
    step = rank = None
    for part in (folder.name, folder.parent.name):
        m = re.fullmatch(r"step(\d+)", part)
        if m:
            step = int(m.group(1))
        m = re.fullmatch(r"rank(\d+)", part)
        if m:
            rank = int(m.group(1))
    return step, rank


def _config(dump_dir: Path, rank: int | None) -> dict | None:
    """The run's setup record (``RUN/config/rank<R>.json``), if the dump has one."""
    for root in (dump_dir.parent.parent, dump_dir.parent):
        p = root / "config" / f"rank{rank or 0}.json"
        if p.is_file():
            try:
                return json.loads(p.read_text())
            except (OSError, ValueError):
                return None
    return None


def _tree(x: Any, tensors: dict, key: str) -> Any:
    """``x`` as a JSON tree for ``repro.json``; its tensors go into ``tensors`` under their path."""
    import torch

    if isinstance(x, torch.Tensor):
        tensors[key] = x
        return {"tensor": key}
    if isinstance(x, tuple):
        return {"tuple": [_tree(v, tensors, f"{key}.{i}") for i, v in enumerate(x)]}
    if isinstance(x, list):
        return {"list": [_tree(v, tensors, f"{key}.{i}") for i, v in enumerate(x)]}
    if isinstance(x, dict):
        return {"dict": {k: _tree(v, tensors, f"{key}.{k}") for k, v in x.items()}}
    if isinstance(x, torch.dtype):
        return {"dtype": str(x).replace("torch.", "")}
    if isinstance(x, torch.device):
        return {"device": str(x)}
    if isinstance(x, torch.Size):
        return {"size": list(x)}
    if isinstance(x, slice):
        return {"slice": [x.start, x.stop, x.step]}
    if x is Ellipsis:
        return {"ellipsis": True}
    return {"value": x}


def _flat_outputs(x: Any, path: str, into: dict, order: list[str]) -> None:
    """The output tensors by their index path (``0``, ``1``, ``0.1``), depth first."""
    import torch

    if isinstance(x, torch.Tensor):
        into[path or "0"] = x
        order.append(path or "0")
    elif isinstance(x, (list, tuple)):
        for i, v in enumerate(x):
            _flat_outputs(v, f"{path}.{i}" if path else str(i), into, order)
    elif isinstance(x, dict):
        for k, v in x.items():
            _flat_outputs(v, f"{path}.{k}" if path else str(k), into, order)
