"""The per-rank monitor agent: streams step metrics to the monitor service, never in the way.

The training thread calls :meth:`MonitorAgent.record` once per step: it puts one tuple on a
bounded queue and returns (no network, no disk, no lock held across I/O). A background sender
thread drains the queue, packs the points into columnar batches, numbers them (``seq`` 1, 2,
... per agent) and pushes them; the service acknowledges a batch only once it is durable and
acknowledges a resent one without storing it again. While the service is away every
unacknowledged batch goes to a local spool file, in order; on reconnect the spool is resent
first, then deleted. So a restart of the service (or of the rank, when the spool file is
found again) neither loses nor doubles a point. If the training thread ever outruns the sender
so far that the queue fills, the point is dropped and counted, and the count travels to the
service with the next batch (``dropped``).

The sender also samples host CPU and memory (psutil; at most every ``host_interval_s``, on the
latest step), heartbeats when idle,
and holds the rank's command stream open: a ``trace`` command makes
:class:`monitor.agent_callback.MonitorAgentCallback` run a profiler session for exactly the
asked steps on the training thread, and the trace files go back to the service in the
background.

>>> agent = MonitorAgent("127.0.0.1:50051", job="demo", rank=0, world_size=1)  # doctest: +SKIP
>>> agent.start()                                                                # doctest: +SKIP
>>> agent.record(0, {"loss": 2.3, "step_time_ms": 41.0})                         # doctest: +SKIP
>>> agent.close()                                                                # doctest: +SKIP
"""

from __future__ import annotations

import array
import numbers
import os
import socket
import struct
import sys
import tempfile
import threading
import time
import uuid
import zlib
from collections import deque
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping


ADDR_ENV = "PROBE_MONITOR"
JOB_ENV = "PROBE_MONITOR_JOB"
SPOOL_ENV = "PROBE_MONITOR_SPOOL"
_REC = struct.Struct("<II")        # spool record header: payload length, crc32


def _warn(message: str) -> None:
    print(f"probe monitor agent: {message}", file=sys.stderr, flush=True)


class Spool:
    """An append-only file of serialized batches: ``[len u32][crc32 u32][payload]`` records.

    A torn last record (the process died mid-write) is ignored on reading.
    """

    def __init__(self, path: str | os.PathLike, max_bytes: int = 1 << 30) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self._append = None
        self.size = self.path.stat().st_size if self.path.exists() else 0

    def exists(self) -> bool:
        return self.path.exists() and self.path.stat().st_size > 0

    def append(self, payload: bytes) -> bool:
        """Append one record; False (nothing written) when the spool is full."""
        if self.size + len(payload) + _REC.size > self.max_bytes:
            return False
        if self._append is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._append = open(self.path, "ab")
        self._append.write(_REC.pack(len(payload), zlib.crc32(payload)) + payload)
        self._append.flush()
        self.size += len(payload) + _REC.size
        return True

    def read(self) -> Iterator[bytes]:
        try:
            f = open(self.path, "rb")
        except FileNotFoundError:
            return
        with f:
            while True:
                head = f.read(_REC.size)
                if len(head) < _REC.size:
                    return
                n, crc = _REC.unpack(head)
                payload = f.read(n)
                if len(payload) < n or zlib.crc32(payload) != crc:
                    return
                yield payload

    def remove(self) -> None:
        if self._append is not None:
            self._append.close()
            self._append = None
        self.path.unlink(missing_ok=True)
        self.size = 0


def default_spool_path(job: str, rank: int) -> Path:
    """``$PROBE_MONITOR_SPOOL`` (a folder) or the temp dir, ``<job>-rank<R>.spool`` in it."""
    folder = os.environ.get(SPOOL_ENV) or os.path.join(tempfile.gettempdir(), "probe-monitor-spool")
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in job)
    return Path(folder) / f"{safe}-rank{rank}.spool"


class MonitorAgent:
    """Streams one rank's metric points to the monitor service; see the module docstring.

    ``on_command(cmd)`` is called on the command thread for each command received.
    """

    def __init__(self, addr: str, job: str, rank: int, world_size: int = 0, engine: str = "",
                 *, token: str | None = None, ca: str | None = None,
                 spool_path: str | os.PathLike | None = None, queue_size: int = 65_536,
                 flush_interval_s: float = 0.2, max_batch_points: int = 16_384,
                 sample_host: bool = True, on_command: Callable[[Any], None] | None = None,
                 push_timeout_s: float = 10.0, exit_wait_s: float = 5.0,
                 host_interval_s: float = 1.0, max_spool_bytes: int = 1 << 30) -> None:
        from monitor import auth

        self.addr, self.job, self.rank = addr, job, int(rank)
        self.world_size, self.engine = int(world_size), engine
        self.agent_id = uuid.uuid4().hex
        self.token = token if token is not None else os.environ.get(auth.TOKEN_ENV)
        self.ca = ca if ca is not None else os.environ.get(auth.CA_ENV)
        self.spool = Spool(spool_path or default_spool_path(job, rank), max_spool_bytes)
        self.flush_interval_s = flush_interval_s
        self.max_batch_points = max_batch_points
        self.sample_host = sample_host
        self.on_command = on_command
        self.push_timeout_s = push_timeout_s
        self.exit_wait_s = exit_wait_s
        self._queue: deque = deque()            # bounded by queue_size in record()
        self.queue_size = queue_size
        self._uploads: deque = deque()
        self._unacked: deque = deque()          # batches in memory, not yet acknowledged
        self._spooling = self.spool.exists()    # batches go to the spool file until it drains
        self._seq = 0
        self._dropped = 0
        self._dropped_reported = 0
        self._stop = threading.Event()
        self._final = False
        self._final_made = False
        self._replayed = 0                      # spool records already acknowledged
        self._thread: threading.Thread | None = None
        self._cmd_thread: threading.Thread | None = None
        self._channel = None
        self._stub = None
        self._connected = False
        self._next_connect = 0.0
        self._backoff = 0.2
        self._last_push = 0.0
        self._last_sampled_step = -1
        self._last_sample_time = 0.0
        self.host_interval_s = host_interval_s
        self._last_step = -1
        self._warned: set[str] = set()
        self._proc = None
        self.stats = {"points": 0, "acked_points": 0, "batches": 0, "acked_batches": 0,
                      "duplicates": 0, "spooled_batches": 0, "resent_batches": 0,
                      "reconnects": 0, "rejected_batches": 0, "commands": 0, "uploads": 0,
                      "sender_cpu_s": 0.0}

    # -- the training thread's side ------------------------------------------------------------

    def start(self) -> "MonitorAgent":
        """Start the sender thread (connecting happens there, never here)."""
        self._thread = threading.Thread(target=self._run, name=f"monitor-agent-r{self.rank}",
                                        daemon=True)
        self._thread.start()
        return self

    def record(self, step: int, metrics: Mapping[str, Any], time_ns: int | None = None) -> bool:
        """Queue one step's metrics (non-numeric values are skipped later); never blocks.

        Returns False when ``queue_size`` steps are already waiting: the point is dropped and
        counted, and the count reaches the service with the next batch.
        """
        if len(self._queue) >= self.queue_size:
            self._dropped += len(metrics)
            return False
        self._queue.append((step, time_ns or time.time_ns(), metrics))
        return True

    def upload_trace(self, trace_id: str, start_step: int, end_step: int,
                     files: list[str] | None = None, error: str = "", root: str = "") -> None:
        """Queue trace files (paths relative to ``root``; or the reason there are none) to send."""
        self._uploads.append((trace_id, start_step, end_step, list(files or []), error, root))

    def close(self, timeout: float = 10.0) -> None:
        """Send what is queued and stop; waits up to ``timeout``.

        What the service has not acknowledged after ``exit_wait_s`` stays in the spool file,
        for the next agent of this job and rank to send.
        """
        self._final = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def dropped(self) -> int:
        return self._dropped

    @property
    def uploading(self) -> bool:
        """Trace files are queued or being sent (on the sender thread, which takes CPU time)."""
        return bool(self._uploads)

    # -- the sender thread ---------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._loop()
        except Exception as e:  # noqa: BLE001 - the agent must never take training down
            _warn(f"rank {self.rank}: sender stopped ({type(e).__name__}: {e}); metrics from "
                  f"now on are not sent; spool: {self.spool.path}")
        finally:
            if self._channel is not None:
                self._channel.close()

    def _loop(self) -> None:
        deadline = None
        if self.sample_host:
            try:
                self._host_sample()               # primes the CPU counters
            except Exception as e:  # noqa: BLE001 - sampling is optional
                self._warn_once("psutil", f"host sampling off ({e})")
                self.sample_host = False
        while True:
            stopping = self._stop.is_set()
            if stopping and deadline is None:
                deadline = time.monotonic() + self.exit_wait_s
            items = self._drain(0 if stopping else self.flush_interval_s)
            final = stopping and self._final and not self._final_made and not self._queue
            if items or self._dropped != self._dropped_reported or final:
                self._make_batches(items, final=final)
                self._final_made = self._final_made or final
            self._send()
            self.stats["sender_cpu_s"] = time.thread_time()
            if stopping and not self._queue:
                if self._connected and not self._unacked and not self._spooling:
                    self._send_uploads()
                    return
                if time.monotonic() > deadline:
                    self._to_spool()
                    if self._unacked or self._spooling:
                        _warn(f"rank {self.rank}: service at {self.addr} unreachable at exit; "
                              f"{self.stats['points'] - self.stats['acked_points']} points kept "
                              f"in {self.spool.path} (sent on the next run with this spool)")
                    return
                time.sleep(0.02)                  # waiting for the service; do not spin

    def _drain(self, wait: float) -> list:
        """Wait ``wait`` seconds (or until stopped), then take what has been recorded."""
        if wait:
            self._stop.wait(wait)
        items = []
        popleft = self._queue.popleft
        while self._queue and len(items) < 100_000:
            items.append(popleft())
        return items

    def _host_sample(self) -> dict[str, float]:
        import psutil

        if self._proc is None:
            self._proc = psutil.Process()
            self._proc.cpu_percent(None)
            psutil.cpu_percent(None)
            return {}
        mem = self._proc.memory_info()
        return {"host_cpu_percent": psutil.cpu_percent(None),
                "host_mem_percent": psutil.virtual_memory().percent,
                "proc_cpu_percent": self._proc.cpu_percent(None),
                "proc_rss_mb": mem.rss / 2**20}

    def _make_batches(self, items: list, final: bool = False) -> None:
        from monitor.proto import monitor_pb2 as pb

        names: dict[str, int] = {}
        idx, steps, times, values = array.array("i"), array.array("q"), array.array("q"), array.array("d")
        batches = []

        def flush() -> None:
            nonlocal names, idx, steps, times, values
            if not len(values) and not batches and not final and \
                    self._dropped == self._dropped_reported:
                return
            if sys.byteorder != "little":
                for a in (idx, steps, times, values):
                    a.byteswap()
            self._seq += 1
            batches.append(pb.MetricBatch(
                job=self.job, rank=self.rank, agent_id=self.agent_id, seq=self._seq,
                names=list(names), name_index=idx.tobytes(), steps=steps.tobytes(),
                time_ns=times.tobytes(), values=values.tobytes(),
                dropped=self._dropped - self._dropped_reported))
            self._dropped_reported = self._dropped
            names, idx = {}, array.array("i")
            steps, times, values = array.array("q"), array.array("q"), array.array("d")

        def add(step: int, t: int, metrics: Mapping[str, Any]) -> None:
            if step < 0:
                self._warn_once("step", f"negative step {step} is not sent")
                return
            for name, value in metrics.items():
                if isinstance(value, bool) or not isinstance(value, (int, float, numbers.Real)):
                    continue
                if not isinstance(name, str) or not 0 < len(name) <= 256:
                    self._warn_once(f"name{name!r}"[:80], f"metric name {name!r} is not sent "
                                    "(names are 1 to 256 characters)")
                    continue
                i = names.get(name)
                if i is None:
                    i = names[name] = len(names)
                idx.append(i)
                steps.append(int(step))
                times.append(t)
                values.append(float(value))
            if len(values) >= self.max_batch_points:
                flush()

        for step, t, metrics in items:
            add(step, t, metrics)
            self._last_step = max(self._last_step, step)
        if (self.sample_host and self._last_step > self._last_sampled_step
                and time.monotonic() - self._last_sample_time >= self.host_interval_s):
            self._last_sampled_step = self._last_step
            self._last_sample_time = time.monotonic()
            try:
                add(self._last_step, time.time_ns(), self._host_sample())
            except Exception as e:  # noqa: BLE001 - sampling is optional
                self._warn_once("psutil", f"host sampling off ({e})")
                self.sample_host = False
        if len(values) or not batches:
            flush()
        if final and batches:
            batches[-1].final = True
        for b in batches:
            self.stats["batches"] += 1
            self.stats["points"] += len(b.values) // 8
            if self._spooling:
                self._spool_batch(b)
            else:
                self._unacked.append(b)

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            _warn(f"rank {self.rank}: {message}")

    def _connect(self) -> bool:
        import grpc

        from monitor import auth
        from monitor.proto import monitor_pb2 as pb
        from monitor.proto import monitor_pb2_grpc as pb_grpc

        if time.monotonic() < self._next_connect:
            return False
        try:
            if self._channel is None:
                creds = auth.channel_credentials(self.ca)
                opts = [("grpc.max_send_message_length", 8 * 1024 * 1024)]
                self._channel = (grpc.secure_channel(self.addr, creds, options=opts) if creds
                                 else grpc.insecure_channel(self.addr, options=opts))
                self._stub = pb_grpc.MonitorStub(self._channel)
            reply = self._stub.Register(pb.RegisterRequest(
                job=self.job, rank=self.rank, world_size=self.world_size,
                host=socket.gethostname(), pid=os.getpid(), engine=self.engine,
                agent_id=self.agent_id), timeout=5.0, metadata=auth.token_metadata(self.token))
        except grpc.RpcError as e:
            self._disconnected(e)
            return False
        except Exception as e:  # noqa: BLE001 - a bad address or credentials: say it once
            self._warn_once("connect", f"cannot reach the monitor at {self.addr}: {e}")
            self._next_connect = time.monotonic() + 5.0
            return False
        self.max_batch_points = min(self.max_batch_points, reply.max_batch_points or 65_536)
        self._connected = True
        self._backoff = 0.2
        self.stats["reconnects"] += 1
        self._warned.discard("unreachable")
        if self._cmd_thread is None or not self._cmd_thread.is_alive():
            self._cmd_thread = threading.Thread(target=self._commands, daemon=True,
                                                name=f"monitor-cmd-r{self.rank}")
            self._cmd_thread.start()
        return True

    def _disconnected(self, error: Exception) -> None:
        import grpc

        code = error.code() if isinstance(error, grpc.RpcError) else None
        if code == grpc.StatusCode.UNAUTHENTICATED:
            self._warn_once("auth", f"the monitor at {self.addr} refused the token: "
                                    f"{error.details()}")
        else:
            self._warn_once("unreachable", f"monitor at {self.addr} unreachable ({code}); "
                                           f"spooling to {self.spool.path}")
        self._connected = False
        self._next_connect = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, 2.0)
        self._to_spool()

    def _to_spool(self) -> None:
        """Move every in-memory unacknowledged batch to the spool file, in order."""
        while self._unacked:
            self._spool_batch(self._unacked.popleft())
            self._spooling = True

    def _spool_batch(self, batch: Any) -> None:
        """Write one batch to the spool; when the spool is full or the disk refuses, drop it
        and count its points (the count reaches the service with a later batch)."""
        try:
            ok = self.spool.append(batch.SerializeToString())
        except OSError as e:
            ok = False
            self._warn_once("spool-io", f"cannot write the spool {self.spool.path} ({e.strerror})")
        if ok:
            self.stats["spooled_batches"] += 1
            return
        self._warn_once("spool-full", f"spool {self.spool.path} is full "
                                      f"({self.spool.max_bytes >> 20} MiB); dropping points "
                                      "until the service is back (they are counted)")
        self._dropped += len(batch.values) // 8
        self._dropped_reported -= batch.dropped      # its drop count must travel again

    def _push(self, batch: Any) -> bool:
        import grpc

        from monitor import auth

        try:
            ack = self._stub.Push(batch, timeout=self.push_timeout_s,
                                  metadata=auth.token_metadata(self.token))
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.INVALID_ARGUMENT:
                self.stats["rejected_batches"] += 1
                self._warn_once("rejected", f"the monitor rejected a batch: {e.details()}")
                return True
            self._disconnected(e)
            return False
        self._last_push = time.monotonic()
        if ack.duplicate:
            self.stats["duplicates"] += 1
        self.stats["acked_batches"] += 1
        self.stats["acked_points"] += len(batch.values) // 8
        return True

    def _send(self) -> None:
        from monitor.proto import monitor_pb2 as pb

        if not self._connected and not self._connect():
            return
        if self._spooling:
            self._replay_spool()
            if self._spooling:
                return
        while self._unacked:
            if not self._push(self._unacked[0]):
                return
            self._unacked.popleft()
        if self._connected and time.monotonic() - self._last_push > 1.0:
            self._push(pb.MetricBatch(job=self.job, rank=self.rank, agent_id=self.agent_id,
                                      seq=0))
        if self._connected and self._uploads:
            self._send_uploads()

    def _replay_spool(self) -> None:
        """Resend the spool in order; delete it once every record is acknowledged."""
        from monitor.proto import monitor_pb2 as pb

        self._to_spool()
        for i, payload in enumerate(self.spool.read()):
            if i < self._replayed:
                continue
            batch = pb.MetricBatch.FromString(payload)
            if not self._push(batch):
                return
            self._replayed += 1
            self.stats["resent_batches"] += 1
            if batch.agent_id != self.agent_id:      # a previous run's leftovers
                self.stats["acked_points"] -= len(batch.values) // 8
        self.spool.remove()
        self._spooling = False
        self._replayed = 0

    def _send_uploads(self) -> None:
        import grpc

        from monitor import auth
        from monitor.proto import monitor_pb2 as pb

        while self._uploads:
            trace_id, start, end, files, error, root = self._uploads[0]

            def chunks() -> Iterator[Any]:
                common = dict(trace_id=trace_id, job=self.job, rank=self.rank,
                              start_step=start, end_step=end)
                if error:
                    yield pb.TraceChunk(error=error, **common)
                for name in files:
                    with open(os.path.join(root, name), "rb") as f:
                        while True:
                            data = f.read(1 << 20)
                            last = len(data) < (1 << 20)
                            yield pb.TraceChunk(filename=name, data=data, last=last, **common)
                            if last:
                                break

            try:
                self._stub.UploadTrace(chunks(), timeout=120.0,
                                       metadata=auth.token_metadata(self.token))
            except grpc.RpcError as e:
                self._disconnected(e)
                return
            except OSError as e:
                self._warn_once(f"upload{trace_id}", f"trace {trace_id}: cannot read a file ({e})")
            self._uploads.popleft()
            self.stats["uploads"] += 1

    def _commands(self) -> None:
        import grpc

        from monitor import auth
        from monitor.proto import monitor_pb2 as pb

        while not self._stop.is_set():
            try:
                stream = self._stub.Commands(
                    pb.CommandStreamRequest(job=self.job, rank=self.rank, agent_id=self.agent_id),
                    metadata=auth.token_metadata(self.token))
                for cmd in stream:
                    self.stats["commands"] += 1
                    if self.on_command is not None:
                        try:
                            self.on_command(cmd)
                        except Exception as e:  # noqa: BLE001 - a bad command never stops us
                            self._warn_once(f"cmd{cmd.id}", f"command {cmd.kind} failed: {e}")
                return
            except grpc.RpcError:
                if self._stop.wait(0.5):
                    return
                while not self._connected and not self._stop.is_set():
                    time.sleep(0.1)
