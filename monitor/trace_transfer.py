"""Trace files over the wire: a file sent as a stream of chunks, and an upload received.

A file travels as ``TraceChunk`` messages of at most ``CHUNK_BYTES`` bytes, the last one marked
``last`` (an empty file is one empty last chunk). A rank uploads a deep trace's files (or, in a
chunk with ``error``, why there are none) in one ``UploadTrace`` stream
(:func:`upload_chunks`); the service
(:func:`receive_upload`) writes each file where the store says, and records the upload's files
together once the stream has ended, so a reader never sees a rank's trace with some of its files
missing. An upload refused midway leaves none of its files on disk.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from probe.monitor.limits import MAX_TRACE_BYTES, check_name
from probe.monitor.proto import monitor_pb2 as pb

if TYPE_CHECKING:                       # the agent sends files without loading the store
    from probe.monitor.storage import MonitorStore

#: The most bytes of a file in one chunk.
CHUNK_BYTES = 1 << 20


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


def receive_upload(chunks: Iterator[pb.TraceChunk], context: Any, store: "MonitorStore", *,
                   log: Callable[[str], None],
                   broadcast: Callable[[dict[str, Any]], None]) -> pb.TraceAck:
    """Store one ``UploadTrace`` stream's files and record them; see the module docstring.

    ``context`` is the call's ``grpc.ServicerContext`` (a malformed stream aborts the call).
    """
    import grpc

    total, current, handle, path = 0, None, None, None
    uploads: dict[tuple, list[tuple[str, str | None, int, str]]] = {}
    events: list[dict[str, Any]] = []
    try:
        for chunk in chunks:
            upload = (chunk.trace_id, chunk.job, chunk.rank, chunk.start_step, chunk.end_step)
            if chunk.error:
                log(f"trace {chunk.trace_id} job {chunk.job} rank {chunk.rank}: no trace: "
                    f"{chunk.error[:200]}")
                uploads.setdefault(upload, []).append(("", None, 0, chunk.error[:2000]))
                events.append({"type": "trace", "trace_id": chunk.trace_id, "job": chunk.job,
                               "rank": chunk.rank, "error": chunk.error[:2000]})
                continue
            key = (chunk.trace_id, chunk.job, chunk.rank, chunk.filename)
            if current != key:
                if handle is not None:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                  f"file {current[3]} was not finished before {chunk.filename}")
                check_name(chunk.trace_id, "trace_id", context)
                check_name(chunk.job, "job", context)
                check_name(chunk.filename, "filename", context)
                current = key
                path = store.trace_file_path(chunk.job, chunk.trace_id, chunk.rank, chunk.filename)
                path.parent.mkdir(parents=True, exist_ok=True)
                handle = open(path, "wb")
                size = 0
            handle.write(chunk.data)
            size += len(chunk.data)
            total += len(chunk.data)
            if size > MAX_TRACE_BYTES:
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                              f"trace file {chunk.filename} is over {MAX_TRACE_BYTES} bytes")
            if chunk.last:
                handle.close()
                handle = None
                uploads.setdefault(upload, []).append((chunk.filename, str(path), size, ""))
                log(f"trace {chunk.trace_id} job {chunk.job} rank {chunk.rank} steps "
                    f"{chunk.start_step}-{chunk.end_step}: {chunk.filename} ({size} bytes)")
                events.append({"type": "trace", "trace_id": chunk.trace_id, "job": chunk.job,
                               "rank": chunk.rank, "file": chunk.filename, "path": str(path),
                               "bytes": size, "start_step": chunk.start_step,
                               "end_step": chunk.end_step})
                current = None
        if handle is not None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"the upload ended inside file {current[3]}")
        for upload, files in uploads.items():
            store.add_trace_files(*upload, files)
        uploads.clear()
        for event in events:
            broadcast(event)
    finally:
        if handle is not None:
            handle.close()
            if path is not None:
                path.unlink(missing_ok=True)
        for files in uploads.values():        # refused: nothing of it stays on disk either
            for _, done, _, _ in files:
                if done:
                    Path(done).unlink(missing_ok=True)
    return pb.TraceAck(ok=True, bytes=total, message="stored")
