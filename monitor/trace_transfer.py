"""Trace files over the wire, as both sides agree on them: a file sent as a stream of chunks, and
a name from the wire made a safe path.

A file travels as ``TraceChunk`` messages of at most ``CHUNK_BYTES`` bytes, the last one marked
``last`` (an empty file is one empty last chunk). A rank uploads a deep trace's files (or, in a
chunk with ``error``, why there are none) in one ``UploadTrace`` stream
(:func:`upload_chunks`); the service receives it
(:func:`probe.monitor.service.trace_upload.receive_upload`) and sends stored files back to a
client with :func:`file_chunks`; a file name or id from the wire becomes a path only through
:func:`safe_relpath`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Iterator

from probe.monitor.proto import monitor_pb2 as pb

#: The most bytes of a file in one chunk.
CHUNK_BYTES = 1 << 20

_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


def file_chunks(path: str | os.PathLike, **fields: Any) -> Iterator[pb.TraceChunk]:
    """The file at ``path`` as chunks carrying ``fields`` (trace_id, job, rank, filename, ...).

    >>> import tempfile
    >>> with tempfile.NamedTemporaryFile() as f:
    ...     [(len(c.data), c.last, c.filename) for c in file_chunks(f.name, filename="a.json")]
    [(0, True, 'a.json')]
    """
    with open(path, "rb") as f:
        while True:
            data = f.read(CHUNK_BYTES)
            last = len(data) < CHUNK_BYTES
            yield pb.TraceChunk(data=data, last=last, **fields)
            if last:
                return


def upload_chunks(trace_id: str, job: str, rank: int, start_step: int, end_step: int,
                  files: list[str], error: str = "", root: str = "") -> Iterator[pb.TraceChunk]:
    """One rank's upload of a trace: ``files`` (paths relative to ``root``) as chunks, after a
    chunk saying ``error`` when there is one.

    >>> [c.error for c in upload_chunks("t1", "job", 0, 3, 4, [], error="no profiler")]
    ['no profiler']
    """
    common = dict(trace_id=trace_id, job=job, rank=rank, start_step=start_step, end_step=end_step)
    if error:
        yield pb.TraceChunk(error=error, **common)
    for name in files:
        yield from file_chunks(os.path.join(root, name), filename=name, **common)


def safe_relpath(name: str) -> Path:
    """A relative path that stays inside its folder: no '..', no absolute part, tame characters.

    >>> safe_relpath("../../etc/pass wd").as_posix(), safe_relpath("trace/rank3.json").as_posix()
    ('etc/pass_wd', 'trace/rank3.json')
    """
    parts = [_SAFE_NAME.sub("_", p) for p in name.replace("\\", "/").split("/")]
    parts = [p for p in parts if p not in ("", ".", "..")]
    return Path(*parts) if parts else Path("trace")
