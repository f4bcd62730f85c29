"""What differs between two runs' setups, and which differences can explain the runs diverging.

Reads the setup records that :mod:`probe.engine_adapter.run_config` writes (``OUT/config/rank{R}.json``);
JSON only, no torch. ``probe config-check A B`` is a thin front end to :func:`check_configs`.

1. **Load** each side (:func:`load_side`): a record file, a run folder holding
   ``config/rank*.json``, or that ``config`` folder itself.
2. **Pair** the records: two files pair with each other; otherwise by rank number (a file
   against a folder takes the folder's record of the file's rank).
3. **Compare** each pair section by section into findings; each finding has a category, and
   the categories are ranked by how directly they make two runs compute different numbers:

   =====  ===================  ======================================================
   prio   category             what
   =====  ===================  ======================================================
   1      ``data``             model structure, weights at step 0, the first batches
   2      ``seed``             seeds, random states, deterministic-algorithm/cuDNN/TF32 flags
   3      ``framework``        torch's CUDA/cuDNN/NCCL, Python, CPU capability, device,
                               threads, and the numerics packages (torch, numpy, triton ...)
   4      ``hyperparameters``  optimizers and their param_groups, model config, world size
   5      ``environment``      variables read by the numerics libraries (CUDA_*, NCCL_*, OMP_* ...)
   6      ``packages``         every other package
   =====  ===================  ======================================================

   ``run.world_size`` counts as a hyperparameter. Not explaining divergence, listed apart: the
   run's identity (pid, host, time, argv, paths,
   length), every other environment variable (shell, session, launcher rendezvous), and the
   numpy and Python random states (they differ in every process that does not seed them).
4. **Attribute**: when a seed or the torch random state differs, the first of those is the
   root; the other seed findings and the weight and batch differences are listed as following
   from it, not as causes of their own.
5. **Merge** equal findings of several rank pairs into one (with the ranks) and order the causes
   by category priority.

>>> a = {"format": "probe-config", "version": 1, "run": {"rank": 0, "pid": 1},
...      "packages": {"numpy": "1.26.4", "rich": "13.0"}, "determinism": {"seed": 0}}
>>> b = {**a, "run": {"rank": 0, "pid": 2}, "packages": {"numpy": "2.0.0", "rich": "13.0"}}
>>> report = compare_records({0: a}, {0: b}, files=True)
>>> [(f.key, f.a, f.b) for f in report.causes], [f.key for f in report.noise]
([('packages.numpy', '1.26.4', '2.0.0')], ['run.pid'])
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from probe.engine_adapter.config_format import CONFIG_DIRNAME, FORMAT, VERSION
from probe.ground.errors import ProbeError

#: category -> (priority, label); priority 0 is not a cause
CATEGORIES: dict[str, tuple[int, str]] = {
    "data": (1, "data and weights at step 0"),
    "seed": (2, "seed and determinism"),
    "framework": (3, "framework and platform"),
    "hyperparameters": (4, "hyperparameters"),
    "environment": (5, "numerics environment variables"),
    "packages": (6, "other packages"),
    "noise": (0, "not explaining divergence"),
}

#: packages whose version changes the numbers a training step computes
NUMERICS_PACKAGES = re.compile(
    r"^(torch|torch-npu|torchvision|torchaudio|pytorch-triton.*|triton|numpy|scipy|nvidia-.*|"
    r"mindspore.*|jax|jaxlib|tensorflow.*|apex|deepspeed|megatron.*|transformer-engine.*|"
    r"transformers|accelerate|peft|flash-attn.*|xformers|bitsandbytes|liger-kernel|"
    r"mkl|intel-openmp|onnxruntime.*|safetensors|tokenizers|sentencepiece|datasets|timm)$")

#: environment variables read by the numerics libraries (and the library search paths)
NUMERICS_ENV = re.compile(
    r"^(CUDA_|CUBLAS|CUBLASLT|CUDNN_|NCCL_|NVIDIA_TF32|TORCH|PYTORCH_|OMP_|MKL_|KMP_|GOMP_|"
    r"OPENBLAS_|BLIS_|VECLIB_|DNNL_|ONEDNN_|XLA_|TF_|JAX_|TRITON_|HCCL_|ASCEND_|HIP_|ROCM_|HSA_|"
    r"MIOPEN_|MS_|NVTE_|LD_PRELOAD$|LD_LIBRARY_PATH$|PYTHONPATH$)")
#: ... except these, which name the job, its rendezvous, the devices it was given or a cache folder
LAUNCH_ENV = re.compile(r"^(TORCHELASTIC_|TORCH_ELASTIC_|CUDA_VISIBLE_DEVICES$|MASTER_|"
                        r"(LOCAL_|GROUP_|ROLE_)?RANK$|(LOCAL_)?WORLD_SIZE$|.*_CACHE(_DIR|_PATH)?$)")

#: seed findings, most fundamental first: the first that differs is the root of the others
SEED_KEYS = ("determinism.seed", "determinism.torch_initial_seed", "determinism.torch_rng_state",
             "determinism.cuda_rng_states")
#: random states that differ in every process unless the script seeds them
UNSEEDED_KEYS = ("determinism.numpy_rng_state", "determinism.python_rng_state")
ABSENT = "<absent>"


@dataclass
class Finding:
    """One difference between the two setups."""

    key: str                     # dotted path in the record, e.g. "packages.numpy"
    category: str                # a key of CATEGORIES
    a: Any
    b: Any
    ranks: list[int] = field(default_factory=list)
    follows: str | None = None   # key of the finding this one follows from
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def priority(self) -> int:
        """1 explains divergence most directly ... 6 least; 0 does not explain it."""
        return CATEGORIES[self.category][0]

    @property
    def explains(self) -> bool:
        return self.priority > 0


@dataclass
class Report:
    """Findings of a comparison, sorted: causes (best first), what follows from them, noise."""

    a: str
    b: str
    pairs: list[tuple[int, int]]
    causes: list[Finding]
    follows: list[Finding]
    noise: list[Finding]
    notes: list[str]

    @property
    def exit_code(self) -> int:
        """0: nothing that can explain divergence differs; 1: something does."""
        return 1 if self.causes else 0

    def to_json(self) -> dict[str, Any]:
        def rows(findings: list[Finding]) -> list[dict[str, Any]]:
            return [{**asdict(f), "priority": f.priority, "label": CATEGORIES[f.category][1]} for f in findings]

        return {"format": "probe-config-check", "a": self.a, "b": self.b,
                "rank_pairs": [list(p) for p in self.pairs], "exit_code": self.exit_code,
                "verdict": "differs" if self.causes else "same",
                "causes": rows(self.causes), "follows": rows(self.follows),
                "not_explaining": rows(self.noise), "notes": self.notes}


# --------------------------------------------------------------------------- loading
def load_side(path: str) -> tuple[dict[int, dict], bool]:
    """``({rank: record}, is_a_file)`` of a record file, a run folder or its config folder."""
    p = Path(path)
    if p.is_file():
        record = _read(p)
        return {_rank_of(record, p): record}, True
    if not p.is_dir():
        raise ProbeError(f"{path}: no such file or folder; give two run folders or their "
                         f"{CONFIG_DIRNAME}/rank{{R}}.json files")
    folder = p / CONFIG_DIRNAME if (p / CONFIG_DIRNAME).is_dir() else p
    files = sorted(folder.glob("rank*.json"))
    records: dict[int, dict] = {}
    for f in files:
        m = re.fullmatch(r"rank(\d+)\.json", f.name)
        if m:
            records[int(m.group(1))] = _read(f)
    if not records:
        raise ProbeError(f"{path}: no recorded setup ({CONFIG_DIRNAME}/rank{{R}}.json); runs of "
                         "probe train/dump record one, or probe config-check --record OUT -- SCRIPT, "
                         "or record_config(model, optimizer, out) in your script")
    return records, False


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ProbeError(f"{path}: cannot read it ({e.strerror})") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ProbeError(f"{path}: not JSON ({str(e).splitlines()[0]}); give a setup record "
                         f"({CONFIG_DIRNAME}/rank{{R}}.json)") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ProbeError(f"{path}: not a probe setup record (no \"format\": \"{FORMAT}\"); give "
                         f"a run folder or its {CONFIG_DIRNAME}/rank{{R}}.json")
    version = data.get("version")
    if not isinstance(version, int) or version > VERSION:
        raise ProbeError(f"{path}: setup record version {version!r}; this probe reads up to "
                         f"{VERSION}: upgrade probe")
    for name, kind in (("run", dict), ("platform", dict), ("packages", dict), ("environment", dict),
                       ("determinism", dict), ("hyperparameters", dict), ("model", dict),
                       ("batches", list)):
        if name in data and not isinstance(data[name], kind):
            raise ProbeError(f"{path}: its {name!r} is a {type(data[name]).__name__}, not a "
                             f"{kind.__name__}; the record is damaged, record the run again")
    return data


def _rank_of(record: dict, path: Path) -> int:
    rank = record.get("run", {}).get("rank", 0)
    if not isinstance(rank, int) or isinstance(rank, bool):
        raise ProbeError(f"{path}: run.rank is {rank!r}, not an integer; the record is damaged")
    return rank


# --------------------------------------------------------------------------- comparing
def check_configs(a: str, b: str) -> Report:
    """Load and compare two sides (see the module docstring)."""
    side_a, file_a = load_side(a)
    side_b, file_b = load_side(b)
    return compare_records(side_a, side_b, files=file_a and file_b, names=(a, b))


def compare_records(side_a: dict[int, dict], side_b: dict[int, dict], *, files: bool = False,
                    names: tuple[str, str] = ("A", "B")) -> Report:
    """Compare records keyed by rank; ``files``: two single records, paired whatever their ranks."""
    notes: list[str] = []
    if files:
        pairs = [(next(iter(side_a)), next(iter(side_b)))]
    else:
        common = sorted(set(side_a) & set(side_b))
        if not common:
            raise ProbeError(f"{names[0]} has the records of ranks {sorted(side_a)}, {names[1]} of "
                             f"ranks {sorted(side_b)}: none in common; give the files to compare")
        pairs = [(r, r) for r in common]
        for name, side in zip(names, (side_a, side_b)):
            only = sorted(set(side) - set(common))
            if only:
                notes.append(f"ranks only in {name}: {', '.join(map(str, only))}")
    merged: dict[tuple, Finding] = {}
    for ra, rb in pairs:
        for f in compare_pair(side_a[ra], side_b[rb], notes):
            slot = (f.key, json.dumps(f.a, sort_keys=True), json.dumps(f.b, sort_keys=True))
            if slot in merged:
                merged[slot].ranks.append(ra)
            else:
                f.ranks = [ra]
                merged[slot] = f
    findings = list(merged.values())
    _attribute(findings)
    causes = sorted((f for f in findings if f.explains and f.follows is None), key=lambda f: f.priority)
    follows = [f for f in findings if f.explains and f.follows is not None]
    noise = [f for f in findings if not f.explains]
    return Report(names[0], names[1], pairs, causes, follows, noise, list(dict.fromkeys(notes)))


def compare_pair(a: dict, b: dict, notes: list[str]) -> list[Finding]:
    """The findings of one record against another (unattributed, unmerged)."""
    out: list[Finding] = []
    for key, va, vb in _flat_diff(a.get("run", {}), b.get("run", {}), "run"):
        if key != "run.rank":
            out.append(Finding(key, "hyperparameters" if key == "run.world_size" else "noise", va, vb))
    out += [Finding(k, "framework", va, vb) for k, va, vb in _diff_common(a, b, "platform")]
    for key, va, vb in _flat_diff(a.get("packages", {}), b.get("packages", {}), "packages"):
        numerics = NUMERICS_PACKAGES.match(key.split(".", 1)[1])
        out.append(Finding(key, "framework" if numerics else "packages", va, vb))
    for key, va, vb in _flat_diff(a.get("environment", {}), b.get("environment", {}), "environment"):
        name = key.split(".", 1)[1]
        steers = NUMERICS_ENV.match(name) and not LAUNCH_ENV.match(name)
        out.append(Finding(key, "environment" if steers else "noise", va, vb))
    for key, va, vb in _diff_common(a, b, "determinism"):
        out.append(Finding(key, "noise" if key in UNSEEDED_KEYS else "seed", va, vb))
    if "hyperparameters" in a and "hyperparameters" in b:
        out += [Finding(k, "hyperparameters", va, vb) for k, va, vb in
                _flat_diff(a["hyperparameters"], b["hyperparameters"], "hyperparameters")]
    if "model" in a and "model" in b:
        out += _model_findings(a["model"], b["model"])
    elif "model" in a or "model" in b:
        notes.append(f"only {'A' if 'model' in a else 'B'} recorded a model: the weights and the "
                     "batches are not compared")
    out += _batch_findings(a.get("batches") or [], b.get("batches") or [])
    return out


def _model_findings(a: dict, b: dict) -> list[Finding]:
    out: list[Finding] = []
    structure: dict[str, list[str]] = {}
    mods_a, mods_b = _table(a.get("modules")), _table(b.get("modules"))
    _add(structure, "modules only in A", sorted(set(mods_a) - set(mods_b)))
    _add(structure, "modules only in B", sorted(set(mods_b) - set(mods_a)))
    _add(structure, "modules of another class",
         [f"{n}: {mods_a[n]} vs {mods_b[n]}" for n in mods_a if n in mods_b and mods_a[n] != mods_b[n]])
    differ: list[str] = []
    compared = 0
    for kind in ("parameters", "buffers"):
        ta, tb = _tensor_table(a.get(kind)), _tensor_table(b.get(kind))
        _add(structure, f"{kind} only in A", sorted(set(ta) - set(tb)))
        _add(structure, f"{kind} only in B", sorted(set(tb) - set(ta)))
        for name in (n for n in ta if n in tb):
            ea, eb = ta[name], tb[name]
            for attr in ("dtype", "shape", "requires_grad"):
                if attr in ea and attr in eb and ea[attr] != eb[attr]:
                    _add(structure, f"{kind}: {attr}", [f"{name}: {ea[attr]} vs {eb[attr]}"])
            if ea.get("dtype") == eb.get("dtype") and ea.get("shape") == eb.get("shape") \
                    and ea.get("checksum") and eb.get("checksum"):
                compared += 1
                if ea["checksum"] != eb["checksum"]:
                    differ.append(name)
    if structure:
        count = sum(len(v) for v in structure.values())
        out.append(Finding("model.structure", "data", None, count, detail=structure))
    if differ:
        out.append(Finding("model.weights", "data", compared, len(differ), detail={"differ": differ}))
    return out


def _batch_findings(a: list, b: list) -> list[Finding]:
    by_step_a = {x.get("step"): x.get("inputs") or [] for x in a if isinstance(x, dict)}
    by_step_b = {x.get("step"): x.get("inputs") or [] for x in b if isinstance(x, dict)}
    differ: dict[str, list[str]] = {}
    for step in sorted(s for s in by_step_a if s in by_step_b and isinstance(s, int)):
        ia, ib = _inputs(by_step_a[step]), _inputs(by_step_b[step])
        names = [p for p in sorted(set(ia) | set(ib))
                 if p not in ia or p not in ib or ia[p] != ib[p]]
        if names:
            differ[f"step {step}"] = names
    if not differ:
        return []
    return [Finding("batches", "data", None, [int(s.split()[1]) for s in differ], detail=differ)]


def _attribute(findings: list[Finding]) -> None:
    """Mark the seed findings after the root, and the data findings, as following from the root."""
    by_key = {f.key: f for f in findings}
    root = next((by_key[k] for k in SEED_KEYS if k in by_key), None)
    if root is None:
        return
    for f in findings:
        if f is not root and (f.key in SEED_KEYS or f.key in ("model.weights", "batches")):
            f.follows = root.key


# --------------------------------------------------------------------------- summary
def format_summary(report: Report, limit: int = 8) -> list[str]:
    """The human summary: causes best first (with what follows from each), then the rest."""
    pairs = ", ".join(str(a) if a == b else f"{a}/{b}" for a, b in report.pairs)
    lines = [f"probe config-check: {report.a} vs {report.b} (rank {pairs})"]
    if report.causes:
        lines.append(f"{len(report.causes)} difference(s) can explain the runs diverging, "
                     "most likely first:")
        for i, f in enumerate(report.causes[:limit], 1):
            lines.append(f"  {i}. [{f.category}] {_describe(f)}{_ranks(f, report)}")
            after = [g for g in report.follows if g.follows == f.key]
            if after:
                lines.append("     following from it:")
                lines += [f"       - {_describe(g)}" for g in after]
        if len(report.causes) > limit:
            lines.append(f"  ... and {len(report.causes) - limit} more (see --out)")
    else:
        lines.append("no difference that can explain the runs diverging")
    if report.noise:
        keys = [f.key for f in report.noise]
        shown = ", ".join(keys[:limit]) + (f", ... ({len(keys) - limit} more)" if len(keys) > limit else "")
        lines.append(f"not explaining divergence ({len(keys)}): {shown}")
    lines += [f"note: {n}" for n in report.notes]
    return lines


def _describe(f: Finding) -> str:
    if f.key == "model.weights":
        return f"weights at step 0: {f.b} of {f.a} tensors differ ({_some(f.detail['differ'])})"
    if f.key == "model.structure":
        return "model structure: " + "; ".join(f"{k}: {_some(v)}" for k, v in f.detail.items())
    if f.key == "batches":
        return "first batches: " + "; ".join(f"{k} ({_some(v)})" for k, v in f.detail.items())
    return f"{f.key}: {_value(f.a)} vs {_value(f.b)}"


def _ranks(f: Finding, report: Report) -> str:
    return "" if len(report.pairs) == 1 else f" (ranks {', '.join(map(str, f.ranks))})"


def _some(names: list[str], n: int = 3) -> str:
    return ", ".join(names[:n]) + (f", +{len(names) - n}" if len(names) > n else "")


def _value(v: Any) -> str:
    text = v if isinstance(v, str) else json.dumps(v)
    return text if len(text) <= 60 else text[:57] + "..."


# --------------------------------------------------------------------------- helpers
def _flat_diff(a: Any, b: Any, prefix: str) -> Iterable[tuple[str, Any, Any]]:
    """(dotted key, a, b) of every leaf that differs; a missing leaf is :data:`ABSENT`."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            yield from _flat_diff(a.get(k, ABSENT), b.get(k, ABSENT), f"{prefix}.{k}")
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and \
            any(isinstance(x, (dict, list)) for x in a + b):
        for i, (x, y) in enumerate(zip(a, b)):
            yield from _flat_diff(x, y, f"{prefix}[{i}]")
    elif a != b:
        yield prefix, a, b


def _diff_common(a: dict, b: dict, section: str) -> Iterable[tuple[str, Any, Any]]:
    """:func:`_flat_diff` of the keys of ``section`` both records have (a record made without a
    model has no device and no random state: not a difference)."""
    sa, sb = a.get(section, {}), b.get(section, {})
    common = [k for k in sa if k in sb]
    return _flat_diff({k: sa[k] for k in common}, {k: sb[k] for k in common}, section)


def _table(rows: Any) -> dict[str, str]:
    return {str(r[0]): str(r[1]) for r in rows or [] if isinstance(r, list) and len(r) == 2}


def _tensor_table(entries: Any) -> dict[str, dict]:
    return {str(k): v for k, v in (entries or {}).items() if isinstance(v, dict)} \
        if isinstance(entries, dict) else {}


def _inputs(inputs: list) -> dict[str, tuple]:
    return {str(x.get("path")): (x.get("dtype"), x.get("shape"), x.get("checksum"))
            for x in inputs if isinstance(x, dict)}


def _add(table: dict[str, list[str]], what: str, names: list[str]) -> None:
    if names:
        table.setdefault(what, []).extend(names)
