"""Where a run's setup record lives and how it names itself: shared by its writer
(:mod:`probe.engine_adapter.run_config`, in the training process) and its reader
(:mod:`probe.compare.config_diff`, which must not import torch), so this module imports nothing heavy.

>>> config_path("runs/a", 1)
'runs/a/config/rank1.json'
"""

from __future__ import annotations

import os

#: the folder of a run's setup records: ``OUT/config/rank{R}.json``
CONFIG_DIRNAME = "config"
#: the ``format`` field of a record, and the newest ``version`` this code reads and writes
FORMAT = "probe-config"
VERSION = 1


def config_path(out_dir: str, rank: int) -> str:
    """``OUT/config/rank{R}.json``."""
    return os.path.join(out_dir, CONFIG_DIRNAME, f"rank{rank}.json")
