"""Builds the optional C extensions (the mstx recording path, the dump's row building);
everything else is in pyproject.toml.

Both are optional: without a C compiler the install still succeeds, ``profiler.mstx`` records
through its pure-Python path and ``probe.dump_rows.RowBuilder`` builds every row in Python.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("profiler._mstx_native", ["profiler/_mstx_native.c"],
                             extra_compile_args=["-O2"], optional=True),
                   Extension("probe._dump_rows_native", ["probe/_dump_rows_native.c"],
                             extra_compile_args=["-O2"], optional=True)])
