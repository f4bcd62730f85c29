"""The ground floor: what every package needs and that needs nothing of the project.

- :mod:`probe.ground.errors`: :class:`~probe.ground.errors.ProbeError`, the one user-facing error, and the
  exit codes;
- :mod:`probe.ground.native`: the build-and-load cache of the small C helpers;
- :mod:`probe.ground.selection`: ``--steps``/``--ranks`` selections (``0,2-4``);
- :mod:`probe.ground.background`: the one bounded background queue with a worker thread that every
  writer and sender uses.
- :mod:`probe.ground.frameworks`: the framework table (names, module prefixes, adapter modules)
  that every package naming a framework reads.

Nothing here imports another package of this project (a test checks it).
"""
