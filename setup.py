"""Maps the repository's rooms under the one import root ``probe`` and builds the optional C
extensions (the mstx recording path, the dump's row building); everything else is in
pyproject.toml.

Each room stays a folder at the repository root (``compare/``, ``monitor/``, ...) and installs as
``probe.<room>`` (``probe.compare``, ``probe.monitor``, ...); ``probe/`` itself is the root. So
installing the project adds the one top-level import name ``probe``, for the wheel and the
editable install alike (``tests/architecture/test_packaging.py`` holds it to that).

Both extensions are optional: without a C compiler the install still succeeds,
``probe.profiler.mstx`` records through its pure-Python path and the dump builds every row in
Python.
"""

from pathlib import Path

from setuptools import Extension, setup

HERE = Path(__file__).resolve().parent
ROOT_PACKAGE = "probe"
#: The rooms installed under ``probe.<room>``, each a folder at the repository root.
ROOMS = ("ground", "collectors", "engine_adapter", "profiler", "compare", "checker",
         "visualizer", "dumper", "monitor", "engine", "simulator", "web")


def _packages(folder: str, name: str) -> list[str]:
    """``name`` and the dotted names of the packages below it (folders with ``__init__.py``)."""
    base = HERE / folder
    return [".".join([name, *p.parent.relative_to(base).parts])
            for p in sorted(base.rglob("__init__.py"))]


package_dir = {ROOT_PACKAGE: ROOT_PACKAGE, **{f"{ROOT_PACKAGE}.{room}": room for room in ROOMS}}
packages = [pkg for name, folder in package_dir.items() for pkg in _packages(folder, name)]

setup(package_dir=package_dir, packages=packages,
      ext_modules=[Extension("probe.profiler._mstx_native", ["profiler/_mstx_native.c"],
                             extra_compile_args=["-O2"], optional=True),
                   Extension("probe.dumper._rows_native", ["dumper/_rows_native.c"],
                             extra_compile_args=["-O2"], optional=True)])
