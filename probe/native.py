"""Build every native helper now (at install, in CI), instead of at its first use:
``python -m probe.native [--timeout S]``.

Each helper is compiled once per machine into the cache of :mod:`probe.ground.native`; the
markers of builds that failed before are deleted first, so each is tried again. One line per
helper says whether it is in use; exit status 0 when all are, 1 when one fell back to its Python
twin (the reason was said above it), 2 with ``PROBE_NATIVE=0``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable


def _extension(name: str) -> Callable[[], Any]:
    def load() -> Any:
        import importlib

        try:
            return importlib.import_module(name)
        except ImportError:
            return None
    return load


def _helpers() -> list[tuple[str, str, Callable[[], Any]]]:
    """(name, source, loader) of every native helper; a loader gives something true when built."""
    from probe.collectors.msprobe_scan import _scanner
    from probe.compare.csv_native import _formatter
    from probe.engine_adapter.torch_grads import available
    from probe.engine_adapter.torch_stats import native_kernel

    return [
        ("statistics kernel", "engine_adapter/stats_kernel.c", native_kernel),
        ("C++ backward capture", "engine_adapter/torch_grads.cpp", available),
        ("dump.json scanner", "collectors/msprobe_scan.c", _scanner),
        ("CSV formatter", "compare/csv_format.cpp", _formatter),
        ("mstx recorder (built at install)", "profiler/_mstx_native.c",
         _extension("probe.profiler._mstx_native")),
        ("dump row builder (built at install)", "dumper/_rows_native.c",
         _extension("probe.dumper._rows_native")),
    ]


def main(argv: list[str] | None = None) -> int:
    from probe.ground import native

    parser = argparse.ArgumentParser(prog="python -m probe.native", description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=native.BUILD_TIMEOUT_S,
                        help="seconds one compile may take (default %(default)g)")
    args = parser.parse_args(argv)
    if not native.native_enabled():
        print("probe: PROBE_NATIVE=0: every native helper is off", file=sys.stderr)
        return 2
    native.BUILD_TIMEOUT_S = args.timeout
    for path in native.clear_failures():
        print(f"probe: deleted {path}: trying that build again", file=sys.stderr)
    missing = 0
    for name, source, load in _helpers():
        ok = bool(load())
        missing += not ok
        print(f"{name:38} {source:34} {'native' if ok else 'Python twin'}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
