"""Builds the one optional C extension (the mstx recording path); everything else is in pyproject.toml.

The extension is optional: without a C compiler the install still succeeds and ``profiler.mstx``
records through its pure-Python path.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("profiler._mstx_native", ["profiler/_mstx_native.c"],
                             extra_compile_args=["-O2"], optional=True)])
