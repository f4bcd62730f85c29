"""Small C helpers compiled once per machine with the system C compiler and loaded with ctypes.

The sources ship beside the Python modules that use them (``*.c`` package data); a built library
is cached under ``$XDG_CACHE_HOME/probe`` (``~/.cache/probe``) keyed by the source, the machine
and the build flags, so a changed source or another CPU builds anew. Without a compiler, or when
building fails, :func:`build_cached` returns None and the caller uses its pure-Python path.

>>> lib = build_cached("/path/to/kernel.c", "kernel", [["-fopenmp"], []])   # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import ctypes

__all__ = ["build_cached", "load_cached", "keep_freed_memory"]


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((ln for ln in f if ln.startswith("flags")), "")
    except OSError:
        return ""


def build_cached(source: str, prefix: str, variants: Sequence[Sequence[str]] = ((),),
                 key_extra: str = "", remember_failure: bool = False) -> str | None:
    """Path of the shared library built from ``source`` (cached), or None.

    ``variants`` are extra compiler arguments tried in order (the first that builds is kept,
    e.g. an OpenMP build, then a serial one); ``key_extra`` goes into the cache key (what the
    variants depend on, such as the path of a library linked in). ``remember_failure``: a
    build that failed is not tried again for the same key (a marker file beside the cache's
    libraries; for a slow build, such as a C++ file against a framework's headers).
    """
    import hashlib
    import platform
    import shutil
    import subprocess
    import tempfile

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    try:
        with open(source, "rb") as f:
            text = f.read()
        key = hashlib.sha256(text + (platform.machine() + _cpu_flags() + key_extra).encode()).hexdigest()[:16]
        cache = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "probe")
        lib = os.path.join(cache, f"{prefix}-{key}.so")
        if os.path.exists(lib):
            if _intact(lib):
                return lib
            os.remove(lib)               # truncated or changed: loading it could crash (SIGBUS)
        failed = lib[:-3] + ".failed"
        if remember_failure and os.path.exists(failed):
            return None
        os.makedirs(cache, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            built = os.path.join(tmp, f"{prefix}.so")
            base = [cc, "-O3", "-march=native", "-fno-math-errno", "-shared", "-fPIC", source, "-o", built]
            for extra in variants:
                try:
                    subprocess.run(base + list(extra), check=True, capture_output=True, timeout=120)
                    break
                except (OSError, subprocess.SubprocessError):
                    continue
            else:
                if remember_failure:
                    with open(failed, "w") as f:
                        f.write("the build failed; delete this file to try again\n")
                return None
            _write_sum(built, lib)
            os.replace(built, lib)       # atomic: a concurrent builder sees the whole file or none
        return lib
    except OSError:
        return None


def _digest(path: str) -> str:
    import hashlib

    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _write_sum(built: str, lib: str) -> None:
    """The digest of the library about to become ``lib``, beside it (``lib + ".sha256"``)."""
    tmp = f"{lib}.sha256.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(_digest(built))
    os.replace(tmp, lib + ".sha256")


def _intact(lib: str) -> bool:
    """Whether the cached ``lib`` is the file that was built (its digest): a truncated or
    damaged shared library makes the process crash as it loads it, not raise."""
    try:
        with open(lib + ".sha256") as f:
            return f.read().strip() == _digest(lib)
    except OSError:
        return False


def keep_freed_memory(limit: int = 1 << 30) -> bool:
    """Let glibc keep freed memory for reuse instead of handing it back to the kernel.

    A compare allocates and frees buffers of megabytes in a loop (DuckDB vectors, Arrow
    arrays); glibc serves each from a fresh mmap that the kernel must fault in and zero, then
    unmaps it on free (a fifth of a compare's CPU time on a VM). Raising the mmap and trim
    thresholds to ``limit`` makes those buffers come from the heap and be reused. For a process
    that does one job and exits (``probe compare``): the resident size then stays at its peak.
    Returns whether the C library took the settings (not glibc: nothing changes).
    """
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(mallopt(m_mmap_threshold, limit)) and bool(mallopt(m_trim_threshold, limit))


def load_cached(source: str, prefix: str, disable_env: str, variants: Sequence[Sequence[str]] = ((),),
                key_extra: str = "") -> "ctypes.CDLL | None":
    """The library built from ``source`` (:func:`build_cached`), loaded; None when the
    environment variable ``disable_env`` is set, there is no compiler, or it does not load."""
    import ctypes

    if os.environ.get(disable_env):
        return None
    lib = build_cached(source, prefix, variants, key_extra=key_extra)
    if lib is None:
        return None
    try:
        return ctypes.CDLL(lib)
    except OSError:
        return None
