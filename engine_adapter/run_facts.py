"""The facts of a run that :mod:`probe.engine_adapter.run_config` records beside the model: who and
where (``run``), the platform, the installed packages, the environment (secrets redacted), the
determinism flags and digests of the random states.

>>> env = environment("/tmp/out")
>>> all(v == REDACTED for k, v in env.items() if "TOKEN" in k.upper())
True
>>> len(digest(b"abc"))
16
"""

from __future__ import annotations

import hashlib
import os
import platform
import socket
import sys
import time
from typing import Any

import torch

SECRET_MARKERS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")
REDACTED = "<redacted>"
#: environment variables recorded under ``determinism`` instead of ``environment``
DETERMINISM_ENV = ("CUBLAS_WORKSPACE_CONFIG", "PYTHONHASHSEED")


def run_info(out_dir: str, run: str | None) -> dict[str, Any]:
    return {"run": run or os.path.basename(out_dir), "out_dir": out_dir, "pid": os.getpid(),
            "host": socket.gethostname(), "kernel": platform.release(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "argv": list(sys.argv),
            "cwd": os.getcwd(), "executable": sys.executable}


def platform_info() -> dict[str, Any]:
    cuda = torch.cuda.is_available()
    info: dict[str, Any] = {
        "python": platform.python_version(), "implementation": platform.python_implementation(),
        "system": platform.system(), "machine": platform.machine(),
        "cuda": torch.version.cuda, "hip": getattr(torch.version, "hip", None),
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_threads": torch.get_num_threads(),
    }
    if cuda:
        try:
            info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except (AttributeError, RuntimeError):
            info["nccl"] = None
    if torch.cuda.is_initialized():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


def packages() -> dict[str, str]:
    import importlib.metadata
    import re

    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"] if dist.metadata else None
        if name:
            found.setdefault(re.sub(r"[-_.]+", "-", name).lower(), dist.version)
    return dict(sorted(found.items()))


def environment(out_dir: str) -> dict[str, str]:
    env = {}
    for name, value in sorted(os.environ.items()):
        if name in DETERMINISM_ENV:
            continue
        if any(marker in name.upper() for marker in SECRET_MARKERS):
            env[name] = REDACTED
        else:
            env[name] = value.replace(out_dir, "{OUT}") if out_dir else value
    return env


def determinism_flags() -> dict[str, Any]:
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    flags: dict[str, Any] = {
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "cudnn_enabled": cudnn.enabled, "cudnn_benchmark": cudnn.benchmark,
        "cudnn_deterministic": cudnn.deterministic, "cudnn_allow_tf32": cudnn.allow_tf32,
        "matmul_allow_tf32": matmul.allow_tf32,
        "matmul_fp16_reduced_precision": matmul.allow_fp16_reduced_precision_reduction,
        "matmul_bf16_reduced_precision": matmul.allow_bf16_reduced_precision_reduction,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }
    for name in DETERMINISM_ENV:
        flags[name] = os.environ.get(name)
    return flags


def random_state() -> dict[str, Any]:
    import random

    state: dict[str, Any] = {"torch_initial_seed": torch.initial_seed(),
                             "torch_rng_state": digest(bytes(torch.get_rng_state().tolist())),
                             "python_rng_state": digest(repr(random.getstate()).encode())}
    if torch.cuda.is_initialized():
        state["cuda_rng_states"] = [digest(bytes(s.tolist())) for s in torch.cuda.get_rng_state_all()]
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        kind, keys, pos, *rest = numpy.random.get_state()
        state["numpy_rng_state"] = digest(keys.tobytes() + repr((kind, pos, *rest)).encode())
    return state


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]
