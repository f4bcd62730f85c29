"""Small native helpers compiled once per machine with the system compiler, and the one switch.

The sources ship beside the Python modules that use them (``*.c``/``*.cpp`` package data); a
built library is cached under ``$XDG_CACHE_HOME/probe`` (``~/.cache/probe``) keyed by the
source, the machine and the build flags, so a changed source or another CPU builds anew. Every
native helper has a Python twin that gives the same output: without a compiler, when building
fails, or with ``PROBE_NATIVE=0`` (:func:`native_enabled`, asked by every helper, the two
extensions built at install included), :func:`build_cached` returns None and the caller uses
its twin.

A build runs in a process group of its own and is killed whole on time-out (the compiler
driver and the ``cc1``/``cc1plus`` it started). It says on stderr, through the
``probe.ground.native`` logger, that it is building, and when it fails, why and how to try
again: a compile error is remembered (a ``.failed`` marker beside the cache's libraries, which
names the error; delete it, or run ``python -m probe.native``, to try again), a time-out is not.

>>> lib = build_cached("/path/to/kernel.c", "kernel", [["-fopenmp"], []])   # doctest: +SKIP
>>> native_enabled() == (os.environ.get("PROBE_NATIVE", "1").strip() != "0")
True
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import ctypes
    import subprocess

__all__ = ["native_enabled", "build_cached", "load_cached", "clear_failures", "cache_dir",
           "keep_freed_memory", "BUILD_TIMEOUT_S"]

log = logging.getLogger("probe.ground.native")

#: Seconds one compile may take before its process group is killed (``python -m probe.native
#: --timeout`` gives a slow machine more).
BUILD_TIMEOUT_S = 120.0

#: Lines of the compiler's output kept to say why a build failed
_ERROR_LINES = 8


def native_enabled() -> bool:
    """Whether native helpers may be used: every one asks, and ``PROBE_NATIVE=0`` turns them
    all off (each then uses its Python twin)."""
    return os.environ.get("PROBE_NATIVE", "1").strip() != "0"


def cache_dir() -> str:
    """Where the built libraries (and the markers of failed builds) are kept."""
    return os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "probe")


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((ln for ln in f if ln.startswith("flags")), "")
    except OSError:
        return ""


def build_cached(source: str, prefix: str, variants: Sequence[Sequence[str]] = ((),),
                 key_extra: str = "", what: str = "") -> str | None:
    """Path of the shared library built from ``source`` (cached), or None.

    ``variants`` are extra compiler arguments tried in order (the first that builds is kept,
    e.g. an OpenMP build, then a serial one); ``key_extra`` goes into the cache key (what the
    variants depend on, such as the path of a library linked in); ``what`` names the helper in
    the messages (``"the statistics kernel"``). A build that failed with a compile error is not
    tried again for the same key until its marker is deleted; one that timed out is.
    """
    import hashlib
    import platform
    import shutil
    import tempfile

    if not native_enabled():
        return None
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        log.info("probe: no C compiler here: %s is not built, its Python twin is used", what or prefix)
        return None
    name = f"{what or prefix} ({os.path.basename(source)})"
    try:
        with open(source, "rb") as f:
            text = f.read()
        key = hashlib.sha256(text + (platform.machine() + _cpu_flags() + key_extra).encode()).hexdigest()[:16]
        cache = cache_dir()
        lib = os.path.join(cache, f"{prefix}-{key}.so")
        if os.path.exists(lib):
            if _intact(lib):
                return lib
            os.remove(lib)               # truncated or changed: loading it could crash (SIGBUS)
        failed = lib[:-3] + ".failed"
        if os.path.exists(failed):
            return None
        os.makedirs(cache, exist_ok=True)
        log.warning("probe: building %s, once per machine...", name)
        with tempfile.TemporaryDirectory() as tmp:
            built = os.path.join(tmp, f"{prefix}.so")
            base = [cc, "-O3", "-march=native", "-fno-math-errno", "-shared", "-fPIC", source, "-o", built]
            for extra in variants:
                failure = _compile(base + list(extra), BUILD_TIMEOUT_S)
                if failure is None or failure.timed_out:
                    break
            if failure is not None and failure.timed_out:     # not remembered: a busy machine
                log.warning("probe: building %s %s; its Python twin is used, and the build is "
                            "tried again in the next run (or now: python -m probe.native --timeout 600)",
                            name, failure.why)
                return None
            if failure is not None:
                with open(failed, "w") as f:
                    f.write(f"building {name} failed; delete this file to try again\n{failure.why}\n")
                log.warning("probe: building %s failed, its Python twin is used:\n%s\n"
                            "probe: to try again, delete %s or run python -m probe.native",
                            name, failure.why, failed)
                return None
            _write_sum(built, lib)
            os.replace(built, lib)       # atomic: a concurrent builder sees the whole file or none
        return lib
    except OSError as e:
        log.warning("probe: %s is not built (%s); its Python twin is used", name, e)
        return None


class _Failure(NamedTuple):
    why: str             # the compiler's last output lines, or "timed out after N s"
    timed_out: bool


def _compile(cmd: list[str], timeout: float) -> _Failure | None:
    """Run the compiler ``cmd``: None when it built, else why not. It runs in a process group
    of its own, killed whole on time-out or interruption: killing the driver (``cc``, ``g++``)
    alone leaves the compiler proper it started (``cc1plus``, up to a GB) running."""
    import subprocess

    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
    except OSError as e:
        return _Failure(str(e), False)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        return _Failure(f"timed out after {timeout:g} s", True)
    except BaseException:
        _kill_group(proc)
        raise
    if proc.returncode == 0:
        return None
    lines = out.decode(errors="replace").strip().splitlines()[-_ERROR_LINES:]
    return _Failure("\n".join(lines) or f"the compiler exited with status {proc.returncode}", False)


def _kill_group(proc: "subprocess.Popen") -> None:
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass                             # gone already
    proc.stdout.close()
    proc.wait()                          # reap the driver (its children go to init)


def clear_failures() -> list[str]:
    """Delete the markers of failed builds (so every helper is tried again); their paths."""
    cache = cache_dir()
    try:
        names = [n for n in os.listdir(cache) if n.endswith(".failed")]
    except OSError:
        return []
    for n in names:
        os.remove(os.path.join(cache, n))
    return [os.path.join(cache, n) for n in names]


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


def load_cached(source: str, prefix: str, variants: Sequence[Sequence[str]] = ((),),
                key_extra: str = "", what: str = "") -> "ctypes.CDLL | None":
    """The library built from ``source`` (:func:`build_cached`), loaded; None when
    ``PROBE_NATIVE=0``, there is no compiler, the build failed, or it does not load."""
    import ctypes

    lib = build_cached(source, prefix, variants, key_extra=key_extra, what=what)
    if lib is None:
        return None
    try:
        return ctypes.CDLL(lib)
    except OSError:
        return None
