"""The tensor task's files in msprobe's formats, framework-free: a new file opened without
following a link, and a host array as ``.npy`` (what msprobe's MindSpore dump writes).

A symbolic link planted under the dump's file name is refused (``O_NOFOLLOW``) instead of
followed out of the dump folder; the file is made afresh (``O_TRUNC``) with mode 0644.

>>> import os, tempfile, numpy as np
>>> p = os.path.join(tempfile.mkdtemp(), "t.npy")
>>> write_npy(np.arange(6.0).reshape(2, 3), p)
>>> np.load(p, allow_pickle=False).tolist()
[[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
>>> os.symlink(p, p + ".link.npy")
>>> write_npy(np.zeros(2), p + ".link.npy")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
OSError: ...t.npy.link.npy: a symbolic link, not followed
"""

from __future__ import annotations

import os
from typing import IO, Any

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def open_new(path: str) -> IO[bytes]:
    """``path`` opened for writing as a new regular file (its old contents gone); a symbolic
    link there raises :class:`OSError` naming it."""
    try:
        fd = os.open(path, _FLAGS, 0o644)
    except OSError:
        if os.path.islink(path):            # ELOOP on Linux, EMLINK or EFTYPE elsewhere
            raise OSError(f"{path}: a symbolic link, not followed") from None
        raise
    return os.fdopen(fd, "wb")


def write_npy(array: Any, path: str) -> None:
    """``array`` (a NumPy array) as a ``.npy`` file at ``path``, never pickled."""
    import numpy as np

    with open_new(path) as f:
        np.save(f, np.ascontiguousarray(array), allow_pickle=False)
