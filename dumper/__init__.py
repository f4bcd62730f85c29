"""The dump engine: hooks a model through its engine adapter, records each selected step's
tensors (statistics, whole tensors or hashes) and writes them in msprobe's layout and the store.

:mod:`probe.dumper.session` is its front (``probe.dump/start/step/stop`` are its functions);
:mod:`~probe.dumper.recorder` records calls, :mod:`~probe.dumper.rows` turns tensors into rows
(its C twin ``_rows_native.c`` for plain tensors), :mod:`~probe.dumper.writer` writes a step's
files off the training thread, :mod:`~probe.dumper.callback` runs a dump as a training callback
of the bundled engine. It stands below the monitor, whose agent opens a session of its own for
a targeted dump, and below the command line, which only parses options and calls it.
"""
