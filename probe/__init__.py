"""probe: the dump API (``probe.start/stop/step``, a context manager) and the ``probe`` command.

Importing ``probe`` is cheap: the dump machinery loads on first use.
"""
