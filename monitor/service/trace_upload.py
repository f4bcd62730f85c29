"""A rank's trace upload received: each file written where the store says, the upload recorded.

The service writes the files of one ``UploadTrace`` stream (chunks made by
:func:`probe.monitor.trace_transfer.upload_chunks`) and records them together once the stream has
ended, so a reader never sees a rank's trace with some of its files missing. Each file is written
under a temporary name beside its own and renamed into place only once the whole stream has
arrived: an upload refused midway leaves none of its files on disk, and a resent upload that
fails leaves the one acknowledged before untouched.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

from probe.monitor.limits import MAX_TRACE_BYTES, check_name
from probe.monitor.proto import monitor_pb2 as pb
from probe.monitor.service.storage import MonitorStore


def receive_upload(chunks: Iterator[pb.TraceChunk], context: Any, store: MonitorStore, *,
                   log: Callable[[str], None],
                   broadcast: Callable[[dict[str, Any]], None]) -> pb.TraceAck:
    """Store one ``UploadTrace`` stream's files and record them; see the module docstring.

    ``context`` is the call's ``grpc.ServicerContext`` (a malformed stream aborts the call).
    """
    import grpc

    total, current, handle, path = 0, None, None, None
    uploads: dict[tuple, list[tuple[str, str | None, int, str]]] = {}
    parts: dict[Path, Path] = {}          # temporary name -> final name, of the files written
    token = uuid.uuid4().hex
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
                part = path.with_name(f".{path.name}.{token}.part")
                parts[part] = path
                handle = open(part, "wb")
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
        for part, final in parts.items():
            os.replace(part, final)
        parts.clear()
        for upload, files in uploads.items():
            store.add_trace_files(*upload, files)
        uploads.clear()
        for event in events:
            broadcast(event)
    finally:
        if handle is not None:
            handle.close()
        for part in parts:                    # refused: nothing of it stays on disk
            part.unlink(missing_ok=True)
    return pb.TraceAck(ok=True, bytes=total, message="stored")
