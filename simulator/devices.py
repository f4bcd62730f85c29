"""The devices a simulation is judged against: memory, peak compute, bandwidths, allocator.

Accelerators come from their datasheets (dense peak FLOP/s per dtype as
:data:`probe.profiler.flops.PEAK_TFLOPS` has them, HBM bandwidth, capacity, the per-GPU links inside
a node and between nodes). Their times are roofline times: an op takes the longer of its FLOPs
at the peak and its bytes at the HBM bandwidth, at least one kernel launch. A machine measured
by ``probe simulate --calibrate`` (:mod:`probe.simulator.calibrate`) carries its measured op-time
curves instead, stored in the user cache file :func:`cache_path`; this machine's CPU is
``cpu``, a calibrated GPU its own name (which then replaces the datasheet entry it matches).

>>> h100 = get_device("h100")
>>> h100.name, h100.memory_bytes // 2**30, h100.peak("bfloat16") / 1e12
('H100', 80, 989.0)
>>> sorted(DEVICES)
['910B', 'A100', 'H100', 'H200']
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from probe.ground.errors import ProbeError
from probe.profiler.flops import PEAK_TFLOPS

GiB = 2**30
GB = 10**9
MiB = 2**20


@dataclass(frozen=True)
class Device:
    """One device kind as the simulation models it (see the module docstring)."""

    name: str
    kind: str                        # "cuda", "npu" or "cpu"
    memory_bytes: int
    peak_flops: dict[str, float]     # dtype name -> dense FLOP/s
    memory_bw: float                 # bytes/s
    link_intra_bw: float             # bytes/s one rank sends inside a node
    link_inter_bw: float             # bytes/s one rank sends to another node
    ranks_per_node: int
    link_latency_s: float
    launch_s: float                  # the least time an op takes (kernel launch)
    blas_workspace: int = 0          # bytes the matmul library keeps once it has run
    source: str = "datasheet"
    curves: dict[str, Any] | None = field(default=None, compare=False)

    @property
    def caching_allocator(self) -> bool:
        """Whether memory comes from a caching allocator (CUDA, and Ascend's copy of it)."""
        return self.kind in ("cuda", "npu")

    def peak(self, dtype: str) -> float | None:
        """Dense peak FLOP/s for ``dtype`` (``float32``, ``bfloat16`` ...); None if unknown."""
        return self.peak_flops.get(dtype)


def _nvidia(name: str, memory: int, hbm: float, nvlink: float, network: float,
            workspace: int) -> Device:
    peaks = {k: v * 1e12 for k, v in PEAK_TFLOPS[name].items() if k != "tf32"}
    return Device(name=name, kind="cuda", memory_bytes=memory, peak_flops=peaks, memory_bw=hbm,
                  link_intra_bw=nvlink, link_inter_bw=network, ranks_per_node=8,
                  link_latency_s=10e-6, launch_s=5e-6, blas_workspace=workspace)


#: Datasheet devices. NVLink: bandwidth one GPU sends per direction; network: one 400 Gb/s
#: (H100/H200) or 200 Gb/s (A100, 910B) NIC per device. cuBLAS keeps a workspace per handle:
#: 32 MiB on Hopper (sm90), 8 MiB + 128 KiB before it (PyTorch's CUBLAS_WORKSPACE_CONFIG default).
DEVICES: dict[str, Device] = {
    "H100": _nvidia("H100", 80 * GiB, 3.35e12, 450 * GB, 50 * GB, 32 * MiB),
    "H200": _nvidia("H200", 141 * GB, 4.8e12, 450 * GB, 50 * GB, 32 * MiB),
    "A100": _nvidia("A100", 80 * GiB, 2.039e12, 300 * GB, 25 * GB, 8 * MiB + 128 * 1024),
    "910B": Device(name="910B", kind="npu", memory_bytes=64 * GiB,
                   peak_flops={"float16": 320e12, "bfloat16": 320e12}, memory_bw=1.6e12,
                   link_intra_bw=196 * GB, link_inter_bw=25 * GB, ranks_per_node=8,
                   link_latency_s=10e-6, launch_s=5e-6),
}


def cache_path() -> Path:
    """The user cache file of calibrated devices (``$PROBE_CACHE_DIR`` or ``~/.cache/probe``)."""
    root = os.environ.get("PROBE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "probe")
    return Path(root) / "simulate-devices.json"


def calibrated() -> dict[str, Device]:
    """The calibrated devices in the cache file, by name (empty when there is none)."""
    path = cache_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):
        raise ProbeError(f"{path}: unreadable calibration cache; run 'probe simulate --calibrate' "
                         "again or remove the file") from None
    return {name: _from_json(entry) for name, entry in data.get("devices", {}).items()}


def save_calibrated(device: Device) -> Path:
    """Store ``device`` in the cache file (replacing an entry of the same name); its path."""
    path = cache_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = {}
    data.setdefault("devices", {})[device.name] = _to_json(device)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)
    return path


def all_devices() -> dict[str, Device]:
    """Datasheet devices, each replaced by a calibrated one whose name contains its key, plus
    the calibrated ones (``cpu`` among them once ``--calibrate`` ran here)."""
    table = dict(DEVICES)
    for name, device in calibrated().items():
        match = next((key for key in DEVICES if key in name), None)
        table[match or name] = replace(device, name=match or name) if match else device
    return table


def get_device(name: str) -> Device:
    """The device called ``name`` (any case); a ProbeError lists the known names otherwise."""
    table = all_devices()
    for key, device in table.items():
        if key.lower() == name.lower():
            return device
    hint = "; 'cpu' needs 'probe simulate --calibrate' first" if name.lower() == "cpu" else ""
    raise ProbeError(f"--device {name}: unknown device; known: {', '.join(sorted(table))}{hint}")


def this_cpu() -> Device:
    """This machine's CPU: its calibrated entry, else one that knows only its memory (no times)."""
    found = calibrated().get("cpu")
    if found is not None:
        return found
    import psutil

    return Device(name="cpu", kind="cpu", memory_bytes=psutil.virtual_memory().total, peak_flops={},
                  memory_bw=0.0, link_intra_bw=0.0, link_inter_bw=0.0, ranks_per_node=1,
                  link_latency_s=0.0, launch_s=0.0, source="not calibrated (memory only)")


def _to_json(device: Device) -> dict[str, Any]:
    return {k: getattr(device, k) for k in Device.__dataclass_fields__}


def _from_json(entry: dict[str, Any]) -> Device:
    try:
        return Device(**{k: entry[k] for k in Device.__dataclass_fields__ if k in entry})
    except TypeError as e:
        raise ProbeError(f"{cache_path()}: a calibration entry is incomplete ({e}); run "
                         "'probe simulate --calibrate' again") from None
