"""Real msprobe dumps for the tests, written by msprobe (mindstudio-probe) itself.

The tests that read msprobe's own files (the reader, the native scanner, compare, the graph, the
web app, the fuzzers) need dumps that msprobe wrote, not ours. This module makes them: it runs
msprobe's ``PrecisionDebugger`` on two small networks, one forward and backward step each, in
the Python that has msprobe installed (``.venv-bench``, made by ``scripts/test.sh``), and caches
the folders under ``~/.cache/probe-test-fixtures/`` so a clone of the repository alone runs every
test. The networks are the ones ``../shared/data/msprobe/README.md`` describes:

- **TinyNet** (16 -> 32 -> 8): ``embed`` Linear, ``block`` (``ln1`` LayerNorm, ``attn`` with
  ``q k v o`` and a Softmax module, residual, ``ln2``, ``mlp`` = ``fc1`` GELU ``fc2``, residual),
  ``head``; MSE loss, SGD. Weights and inputs come from NumPy with fixed seeds, so the PyTorch
  and the MindSpore dumps are one network in two frameworks.
- **TinyLlama** (2.1M parameters): ``embed``, 2 x ``layers.N`` (``input_norm`` RMSNorm, ``attn``
  with rotary embedding and a causal mask, ``post_norm``, SwiGLU ``mlp``), ``norm``, ``lm_head``;
  cross-entropy, AdamW (the optimizer step is inside the dump, as msprobe users dump it).

===================== =========== ====================================================
folder                framework   what
===================== =========== ====================================================
``torch_L0``          PyTorch     TinyNet, L0 (modules), statistics
``torch_L0_accum``    PyTorch     TinyNet, L0, two micro-batches accumulated (:func:`accumulate`)
``torch_llama_mix``   PyTorch     TinyLlama, mix (modules and APIs), statistics
``torch_llama_md5_L1`` PyTorch    TinyLlama, L1 (APIs), statistics with md5
``mindspore_L0``      MindSpore   TinyNet, L0 (cells), statistics
``mindspore_mix``     MindSpore   TinyNet, mix (cells and APIs), statistics
===================== =========== ====================================================

Each is ``NAME/step0/proc0/{dump.json,construct.json,stack.json}``: msprobe names the process
folder ``proc<pid>``; it is renamed ``proc0`` and the machine's paths in stack.json are replaced
by ``/home/user/...``, as in the shared copies. The MindSpore dumps are kept in the repository
(``tests/fixtures/msprobe/``: the main test stage has no MindSpore); the MindSpore test stage
writes them again with msprobe and checks that the kept ones are what msprobe writes.

    .venv-bench/bin/python tests/msprobe_fixtures.py OUT torch_L0 torch_llama_mix   # by hand

This file imports nothing of the project, so msprobe's Python can run it as a script.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KEPT = ROOT / "tests" / "fixtures" / "msprobe"
MSPROBE_PY = Path(os.environ.get("PROBE_MSPROBE_PYTHON", ROOT / ".venv-bench" / "bin" / "python"))

#: folder -> (framework, network, msprobe level, summary mode)
DUMPS = {
    "torch_L0": ("pytorch", "tinynet", "L0", "statistics"),
    "torch_L0_accum": ("pytorch", "tinynet_accum", "L0", "statistics"),
    "torch_llama_mix": ("pytorch", "tinyllama", "mix", "statistics"),
    "torch_llama_md5_L1": ("pytorch", "tinyllama", "L1", "md5"),
    "mindspore_L0": ("mindspore", "tinynet", "L0", "statistics"),
    "mindspore_mix": ("mindspore", "tinynet", "mix", "statistics"),
}
TORCH_DUMPS = tuple(n for n, spec in DUMPS.items() if spec[0] == "pytorch")
MINDSPORE_DUMPS = tuple(n for n, spec in DUMPS.items() if spec[0] == "mindspore")


# ---------------------------------------------------------------- weights and inputs (NumPy)

def tinynet_weights(seed: int = 0) -> dict:
    """TinyNet's parameters by PyTorch name, float32 NumPy arrays from a fixed seed."""
    import numpy as np

    rng = np.random.default_rng(seed)
    shapes = {"embed": (32, 16), "block.attn.q": (32, 32), "block.attn.k": (32, 32),
              "block.attn.v": (32, 32), "block.attn.o": (32, 32), "block.mlp.fc1": (64, 32),
              "block.mlp.fc2": (32, 64), "head": (8, 32)}
    w = {}
    for name, shape in shapes.items():
        w[f"{name}.weight"] = rng.normal(0, 1 / math.sqrt(shape[1]), shape).astype(np.float32)
        w[f"{name}.bias"] = rng.normal(0, 0.2, shape[0]).astype(np.float32)
    for ln in ("block.ln1", "block.ln2"):
        w[f"{ln}.weight"] = (1 + rng.normal(0, 0.1, 32)).astype(np.float32)
        w[f"{ln}.bias"] = rng.normal(0, 0.1, 32).astype(np.float32)
    return w


def tinynet_inputs(seed: int = 1):
    """TinyNet's input (4 x 6 x 16) and MSE target (4 x 6 x 8)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return rng.normal(size=(4, 6, 16)).astype(np.float32), rng.normal(size=(4, 6, 8)).astype(np.float32)


# ---------------------------------------------------------------- PyTorch networks

def torch_tinynet():
    """TinyNet in PyTorch with :func:`tinynet_weights` loaded."""
    import torch
    from torch import nn

    class TinyAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v, self.o = (nn.Linear(32, 32) for _ in range(4))
            self.softmax = nn.Softmax(dim=-1)
            self.scale = 1 / math.sqrt(32)

        def forward(self, x):
            q, k, v = self.q(x), self.k(x), self.v(x)
            attn = self.softmax(torch.matmul(q, k.transpose(-1, -2)) * self.scale)
            return self.o(torch.matmul(attn, v))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.act, self.fc2 = nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32)

        def forward(self, x):
            return self.fc2(self.act(self.fc1(x)))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.attn, self.ln2, self.mlp = nn.LayerNorm(32), TinyAttention(), nn.LayerNorm(32), MLP()

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    class TinyNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.block, self.head = nn.Linear(16, 32), Block(), nn.Linear(32, 8)

        def forward(self, x):
            return self.head(self.block(self.embed(x)))

    net = TinyNet()
    net.load_state_dict({k: torch.from_numpy(v) for k, v in tinynet_weights().items()})
    return net


def accumulate(net) -> None:
    """TinyNet's batch as two micro-batches of two samples, their gradients accumulated (each
    loss halved), as a run with gradient accumulation does before its optimizer step."""
    import torch
    import torch.nn.functional as F

    x, y = (torch.from_numpy(a) for a in tinynet_inputs())
    for part in (slice(0, 2), slice(2, 4)):
        (F.mse_loss(net(x[part]), y[part]) / 2).backward()


def torch_tinyllama():
    """TinyLlama in PyTorch (vocab 1000, width 256, 2 layers, 4 heads, SwiGLU 688), seeded."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    vocab, dim, layers, heads, hidden, seq = 1000, 256, 2, 4, 688, 64
    head_dim = dim // heads

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(dim))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight

    def rope(x, cos, sin):
        x1, x2 = x[..., :head_dim // 2], x[..., head_dim // 2:]
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj, self.k_proj, self.v_proj, self.o_proj = (
                nn.Linear(dim, dim, bias=False) for _ in range(4))

        def forward(self, x, cos, sin):
            b, s, _ = x.shape
            q = self.q_proj(x).view(b, s, heads, head_dim).transpose(1, 2)
            k = self.k_proj(x).view(b, s, heads, head_dim).transpose(1, 2)
            v = self.v_proj(x).view(b, s, heads, head_dim).transpose(1, 2)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(head_dim)
            mask = torch.full((s, s), float("-inf")).triu(1)
            probs = F.softmax(scores + mask, dim=-1)
            out = torch.matmul(probs, v).transpose(1, 2).reshape(b, s, dim)
            return self.o_proj(out)

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj = nn.Linear(dim, hidden, bias=False)
            self.up_proj = nn.Linear(dim, hidden, bias=False)
            self.down_proj = nn.Linear(hidden, dim, bias=False)

        def forward(self, x):
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_norm, self.attn, self.post_norm, self.mlp = RMSNorm(), Attention(), RMSNorm(), MLP()

        def forward(self, x, cos, sin):
            x = x + self.attn(self.input_norm(x), cos, sin)
            return x + self.mlp(self.post_norm(x))

    class TinyLlama(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, dim)
            self.layers = nn.ModuleList(Block() for _ in range(layers))
            self.norm = RMSNorm()
            self.lm_head = nn.Linear(dim, vocab, bias=False)
            inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
            angles = torch.outer(torch.arange(seq).float(), inv)
            angles = torch.cat((angles, angles), dim=-1)[None, None]
            self.register_buffer("cos", angles.cos(), persistent=False)
            self.register_buffer("sin", angles.sin(), persistent=False)

        def forward(self, tokens):
            x = self.embed(tokens)
            for layer in self.layers:
                x = layer(x, self.cos, self.sin)
            return self.lm_head(self.norm(x))

    torch.manual_seed(0)
    return TinyLlama()


def torch_tinyllama_batch():
    """Tokens and targets (4 x 64 from a vocabulary of 1000), seeded."""
    import torch

    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 1000, (4, 65), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


# ---------------------------------------------------------------- MindSpore network

def mindspore_tinynet():
    """TinyNet in MindSpore (Dense, LayerNorm gamma/beta) with :func:`tinynet_weights` loaded."""
    import mindspore as ms
    from mindspore import nn, ops

    class TinyAttention(nn.Cell):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v, self.o = (nn.Dense(32, 32) for _ in range(4))
            self.softmax = nn.Softmax(axis=-1)
            self.scale = 1 / math.sqrt(32)

        def construct(self, x):
            q, k, v = self.q(x), self.k(x), self.v(x)
            scores = ops.matmul(q, k.swapaxes(-1, -2)) * self.scale
            attn = self.softmax(scores)
            return self.o(ops.matmul(attn, v))

    class MLP(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc1, self.act, self.fc2 = nn.Dense(32, 64), nn.GELU(approximate=False), nn.Dense(64, 32)

        def construct(self, x):
            return self.fc2(self.act(self.fc1(x)))

    class Block(nn.Cell):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm((32,), begin_norm_axis=-1, begin_params_axis=-1, epsilon=1e-5)
            self.attn = TinyAttention()
            self.ln2 = nn.LayerNorm((32,), begin_norm_axis=-1, begin_params_axis=-1, epsilon=1e-5)
            self.mlp = MLP()

        def construct(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    class TinyNet(nn.Cell):
        def __init__(self):
            super().__init__()
            self.embed, self.block, self.head = nn.Dense(16, 32), Block(), nn.Dense(32, 8)

        def construct(self, x):
            return self.head(self.block(self.embed(x)))

    net = TinyNet()
    params = dict(net.parameters_and_names())
    for name, value in tinynet_weights().items():
        name = re.sub(r"(ln\d)\.weight$", r"\1.gamma", re.sub(r"(ln\d)\.bias$", r"\1.beta", name))
        params[name].set_data(ms.Tensor(value))
    return net


# ---------------------------------------------------------------- one dump, in msprobe's Python

def _config(out: Path, level: str, summary_mode: str) -> Path:
    cfg = {"task": "statistics", "dump_path": str(out), "rank": [], "step": [], "level": level,
           "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": summary_mode}}
    path = out / "config.json"
    path.write_text(json.dumps(cfg, indent=1))
    return path


def _dump_torch(network: str, level: str, summary_mode: str, out: Path) -> None:
    import torch
    import torch.nn.functional as F
    from msprobe.pytorch import PrecisionDebugger

    torch.set_num_threads(1)
    debugger = PrecisionDebugger(config_path=str(_config(out, level, summary_mode)))
    if network == "tinynet_accum":
        net = torch_tinynet()
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        debugger.start(net)
        accumulate(net)
        opt.step()
        debugger.stop()
        debugger.step()
        return
    if network == "tinynet":
        net = torch_tinynet()
        x, y = (torch.from_numpy(a) for a in tinynet_inputs())
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        debugger.start(net)
        loss = F.mse_loss(net(x), y)
    else:
        net = torch_tinyllama()
        tokens, targets = torch_tinyllama_batch()
        opt = torch.optim.AdamW(net.parameters(), lr=1e-2, weight_decay=1e-3, foreach=False)
        debugger.start(net)
        logits = net(tokens)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))
    loss.backward()
    opt.step()
    debugger.stop()
    debugger.step()


def _dump_mindspore(level: str, summary_mode: str, out: Path) -> None:
    import mindspore as ms
    from mindspore import mint, nn, ops

    ms.set_context(mode=ms.PYNATIVE_MODE)
    if ms.get_context("device_target") == "CPU":
        mint.norm = ops.norm    # msprobe takes its Norm with mint.norm, which has no CPU kernel
    from msprobe.mindspore import PrecisionDebugger

    debugger = PrecisionDebugger(config_path=str(_config(out, level, summary_mode)))
    net = mindspore_tinynet()
    x, y = (ms.Tensor(a) for a in tinynet_inputs())
    loss_fn = nn.MSELoss()
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)

    def fwd(x, y):
        return loss_fn(net(x), y)

    grad_fn = ms.value_and_grad(fwd, None, opt.parameters)
    debugger.start(net)
    _, grads = grad_fn(x, y)
    opt(grads)
    debugger.stop()
    debugger.step()


def _tidy(written: Path, dest: Path) -> None:
    """msprobe's ``step0/proc<pid>`` (or ``rank<N>``) as ``dest/step0/proc0``, machine paths
    in stack.json replaced by ``/home/user/...``."""
    (proc,) = [p for p in (written / "step0").iterdir() if p.is_dir()]
    target = dest / "step0" / "proc0"
    target.mkdir(parents=True)
    for name in ("dump.json", "construct.json", "stack.json"):
        text = (proc / name).read_text()
        if name == "stack.json":
            for real, shown in ((sys.prefix, "/home/user/.venv"), (sys.base_prefix, "/home/user/python"),
                                (str(ROOT), "/home/user/work"), (str(Path.home()), "/home/user")):
                text = text.replace(real, shown)
        (target / name).write_text(text)


def dump_one(name: str, dest: Path) -> Path:
    """Write the dump ``name`` (a key of :data:`DUMPS`) to ``dest/name`` with msprobe, in this
    process (msprobe's debugger is one per process: call it once)."""
    framework, network, level, summary_mode = DUMPS[name]
    with tempfile.TemporaryDirectory(prefix=f"msprobe-{name}-") as work:
        work = Path(work)
        if framework == "pytorch":
            _dump_torch(network, level, summary_mode, work)
        else:
            _dump_mindspore(level, summary_mode, work)
        _tidy(work, dest / name)
    return dest / name


def generate(dest: Path, names, python: Path | str = sys.executable, timeout: float = 600) -> None:
    """Write the dumps ``names`` under ``dest``, each by its own process of ``python`` (a Python
    with msprobe), all at once; raises RuntimeError with msprobe's last lines when one fails."""
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    procs = {name: subprocess.Popen([str(python), str(Path(__file__).resolve()), str(dest), name],
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    env=env, cwd=tempfile.gettempdir())
             for name in names}
    failed = []
    for name, proc in procs.items():
        out, _ = proc.communicate(timeout=timeout)
        if proc.returncode != 0 or not (dest / name / "step0" / "proc0" / "dump.json").is_file():
            failed.append(f"{name}: " + " | ".join(out.strip().splitlines()[-5:]))
    if failed:
        raise RuntimeError("msprobe could not write the test dumps: " + "; ".join(failed))


# ---------------------------------------------------------------- the cache the tests read

def msprobe_version(python: Path = MSPROBE_PY) -> str | None:
    """The mindstudio-probe version installed beside ``python`` (from its dist-info folder,
    without starting it), or None when there is none."""
    env = python.parent.parent
    found = sorted(env.glob("lib/python*/site-packages/mindstudio_probe-*.dist-info"))
    if not python.exists() or not found:
        return None
    return found[-1].name[len("mindstudio_probe-"):-len(".dist-info")]


def _fingerprint() -> str:
    """What the dumps depend on here: this file and the kept MindSpore dumps."""
    h = hashlib.blake2b(Path(__file__).read_bytes(), digest_size=6)
    for f in sorted(KEPT.rglob("*.json")):
        h.update(f.relative_to(KEPT).as_posix().encode() + f.read_bytes())
    return h.hexdigest()


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/probe-test-fixtures`` (``~/.cache/probe-test-fixtures``)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "probe-test-fixtures"


def msprobe_dumps(python: Path = MSPROBE_PY) -> Path | None:
    """The folder holding every dump of :data:`DUMPS`: the PyTorch ones written by msprobe in
    ``python`` on first use and cached per msprobe version, the MindSpore ones copied from
    ``tests/fixtures/msprobe``. None when ``python`` has no msprobe. Safe when several test
    runs ask at once: each writes its own folder and the first one renamed into place wins."""
    version = msprobe_version(python)
    if version is None:
        return None
    final = cache_dir() / f"msprobe-{version}-{_fingerprint()}"
    if (final / "README.md").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=final.name + ".part-", dir=final.parent))
    try:
        generate(work, TORCH_DUMPS, python)
        for name in MINDSPORE_DUMPS:
            shutil.copytree(KEPT / name, work / name)
        (work / "README.md").write_text(
            f"Written by tests/msprobe_fixtures.py with mindstudio-probe {version} "
            f"({python}); the MindSpore dumps are copies of tests/fixtures/msprobe.\n")
        try:
            work.rename(final)
        except OSError:                     # another run got there first: use its copy
            if not (final / "README.md").is_file():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return final


if __name__ == "__main__":
    if len(sys.argv) < 3 or any(n not in DUMPS for n in sys.argv[2:]):
        sys.exit(f"usage: {sys.argv[0]} OUT NAME...   (NAME: {' '.join(DUMPS)})")
    out_dir, wanted = Path(sys.argv[1]), sys.argv[2:]
    out_dir.mkdir(parents=True, exist_ok=True)
    if len(wanted) == 1:
        dump_one(wanted[0], out_dir)
    else:
        generate(out_dir, wanted)
