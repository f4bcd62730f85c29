"""The dump's writer: one background thread that finishes each recorded step and writes it.

A finished step (a :class:`StepBatch`) is queued and the training thread goes on; the writer
gathers the step's statistics (one transfer per device), fills the JSON entries and rows, and
writes msprobe's ``OUT/step{N}/rank{R}/dump.json, construct.json, stack.json`` and the TENSOR
and NODE records of the Arrow store, one step at a time.

The queue (:class:`probe.ground.background.BackgroundQueue`) holds at most :data:`QUEUE_STEPS` steps
(statistics and names, a few hundred KB a step): a disk that stalls for a moment (writeback, a
shared volume) does not stall training, while a disk slower than training for good makes the
training thread wait at the end of a step instead of holding unbounded memory.

The statistics task's writer works while the training thread computes gradients, in the
longest stretch its backward pass spends without calling a hook: the recorder times the
stretches between its backward hooks and, a step later, opens the window
(:meth:`DumpWriter.open_window`) in the hook that began the longest one (a step's backward
makes the same calls as the last one's). The writer's Python holds the GIL; a hook that wants
it while the writer runs waits for it (~0.1 ms a wait on the 2-core reference machine, a
context switch each way), and in that stretch no hook comes. A finished step does not wake
the writer either (the queue ticks every :data:`WINDOW_WAIT_S` instead of waking it on a put:
a wake-up at the end of a step takes the GIL while the training thread runs the optimizer's
Python). The training thread's waits a step (its wall time less its CPU time), module / mix
level of the benchmark's model: window at the first backward hook 0.93 / 1.9 ms, in the
longest stretch 0.38 / 1.35 ms. A step waits at most :data:`WINDOW_WAIT_S`, and not at all
once a second step is waiting or the writer is drained: a forward-only run is written a step
late, never held back.

With ``fsync="step"`` the writer also forces each step to disk, on its own thread: the step's
tensor files (copied by the training thread as the step ran, written here) before dump.json names them, then
dump.json, construct.json, stack.json and the folders that hold them, so a power loss loses at
most the step in flight, as it does for the store.
"""

from __future__ import annotations

import linecache
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from probe.collectors import msprobe_writer
from probe.engine_adapter.base import EngineAdapter
from probe.ground.background import BackgroundQueue
from probe.ground.files import DiskFull, disk_full, is_disk_full
from probe.dumper.config import DumpConfig
from probe.dumper.rows import ROW_COLUMNS, Leaf, TensorTables, apply_statistics, records_statistics
from probe.dumper.tree import CallTree, node_depths

#: finished steps waiting for the writer at most
QUEUE_STEPS = 16
#: the same for the tensor task, whose steps hold a copy of every tensor until it is written
QUEUE_TENSOR_STEPS = 2
#: msprobe's files of a step, in the order :func:`probe.collectors.msprobe_writer.write_step` writes them
STEP_FILES = ("dump.json", "construct.json", "stack.json")
_FILE_COLUMN = ROW_COLUMNS.index("tensor_file")
_FADV_DONTNEED = getattr(os, "POSIX_FADV_DONTNEED", None)
#: how long a finished step waits for the training thread's next backward pass at most
WINDOW_WAIT_S = 1.0


@dataclass
class StepBatch:
    """Everything one finished step hands to the writer thread."""

    step: int
    data: dict
    tree: CallTree
    stacks: dict
    leaves: list[Leaf]
    handles: list
    rows: list[list]
    #: (path, host copy) of the tensor files the step still has to write (the tensor task)
    files: list = field(default_factory=list)
    #: what the training thread let go of with this step, freed here instead of on its thread
    released: Any = None
    #: the step's statistics records when the native row builder read every leaf's
    #: (:func:`probe.dumper.rows.records_statistics`), else None
    records: Any = None


@dataclass(eq=False)
class DumpWriter:
    """Writes the steps :meth:`submit` hands it, in order, on its own thread.

    ``report_error(where, error)`` hears what failed; the step is lost, the writer goes on.
    A full disk is not reported: the writer stops writing (:attr:`disk_full`, what the command
    ends with), with the step it could not finish removed and the steps before it whole, their
    store records included.
    """

    adapter: EngineAdapter
    config: DumpConfig
    rank: int
    run: str
    store: Any
    report_error: Callable[[str, BaseException], None]
    #: the steps whose files are written, in order
    steps_written: list[int] = field(default_factory=list, init=False)
    #: the full disk that stopped the writing (None: none did)
    disk_full: DiskFull | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self._formatted_stacks: dict[tuple, list[str]] = {}
        self._nodes_written: set[str] = set()
        self._last_store_flush = float("-inf")
        self._store_tables: list[Any] = []    # tensor records of steps not yet in the store
        self._store_steps: list[int] = []     # those steps
        self._tables: TensorTables | None = None
        self._last_stacks: tuple[dict, dict, dict] | None = None   # (frames, lines, grouped)
        # set: write now (see the module docstring); the tensor task writes at once
        self._window = threading.Event()
        # 1 while the writer holds a step, waiting for the window (a step handed over between its
        # taking one and setting this is counted late: written at the next window, not lost)
        self._holding = 0
        if self.config.task == "tensor":
            self._window.set()
        # the statistics task's writer is not woken by a finished step (waking takes the GIL
        # while the training thread runs Python): it wakes when the window opens, when steps
        # pile up, or every WINDOW_WAIT_S (a tick: what waits longer is written then)
        tensor = self.config.task == "tensor"
        self._queue: BackgroundQueue[StepBatch] = BackgroundQueue(
            self._handle, name="probe-dump-writer",
            capacity=QUEUE_TENSOR_STEPS if tensor else QUEUE_STEPS, overflow="block",
            max_batch=1, interval_s=None if tensor else WINDOW_WAIT_S)

    def submit(self, batch: StepBatch) -> None:
        """Queue a finished step (waits while :data:`QUEUE_STEPS` steps are waiting)."""
        self._queue.put(batch)
        if self._waiting() > 1:         # falling behind: write without waiting for a window
            self.open_window()

    def _waiting(self) -> int:
        """Finished steps not written yet: those queued and the one the writer holds."""
        return len(self._queue) + self._holding

    def step_started(self) -> None:
        """The training thread began a step: what waits is written in its backward pass."""
        if self.config.task != "tensor" and self._waiting() <= 1:
            self._window.clear()

    def open_window(self) -> None:
        """The training thread starts a stretch of work outside the interpreter (its backward
        pass, see :class:`probe.dumper.recorder.DumpRecorder`): write what waits."""
        self._window.set()
        if len(self._queue):
            self._queue.wake()

    def drain(self) -> None:
        """Wait until every submitted step is on disk (store records included)."""
        self._window.set()
        self._queue.flush()
        if self.store is not None and self.steps_written:
            try:
                self._flush_store(self.steps_written[-1])
            except Exception as e:
                if not (isinstance(e, DiskFull) or is_disk_full(e)):
                    raise
                self._stop_writing(None, e)

    def _handle(self, batches: list[StepBatch]) -> None:
        if not batches:                 # a tick with nothing waiting
            return
        if not self._window.is_set():
            self._holding = 1
            try:
                self._window.wait(WINDOW_WAIT_S)
            finally:
                self._holding = 0
        for batch in batches:
            if self.disk_full is not None:      # the disk is full: the steps after it are dropped
                continue
            try:
                with self.adapter.suspended():
                    self._write(batch)
            except Exception as e:  # noqa: BLE001 - never kill training
                if isinstance(e, DiskFull) or is_disk_full(e):
                    self._stop_writing(batch.step, e)
                else:
                    self.report_error(f"writing step {batch.step}", e)

    def _stop_writing(self, step: int | None, error: BaseException) -> None:
        """The disk is full: keep the error for the command (:attr:`disk_full`), write nothing
        more, and remove what is not whole: the msprobe files of ``step`` (the step being
        written) and of the steps whose store records were lost with the failed segment, so
        that every step left has both its files and its records."""
        if not isinstance(error, DiskFull):
            error = disk_full(getattr(error, "filename", None) and os.path.dirname(error.filename)
                              or self.config.out, error)
        self.disk_full = error
        lost: set[int] = set()
        if not self._store_tables and self._store_steps:    # a segment failed: its steps' records
            lost, self._store_steps = set(self._store_steps), []
        if step is not None:
            lost.add(step)
        for n in sorted(lost):
            _remove_step(msprobe_writer.step_dir(self.config.out, n, self.rank))
        self.steps_written[:] = [n for n in self.steps_written if n not in lost]

    def _write(self, b: StepBatch) -> None:
        b.tree.finish()
        if b.records is not None:      # every entry filled on the training thread
            statistics = records_statistics(b.records, len(b.rows))
        else:
            values = self.adapter.stats.gather(b.handles) if b.handles else []
            statistics = apply_statistics(b.leaves, values, len(b.rows))
        stacks, grouped = self._stacks(b.stacks)
        config = self.config
        folder = msprobe_writer.step_dir(config.out, b.step, self.rank)
        dump_data_dir = None
        if config.task == "tensor":
            dump_data_dir = str(folder / "dump_tensor_data")
            copies, b.files = b.files, []
            self._write_files(b.step, copies)
            del copies
            if config.fsync == "step":
                files = [os.path.join(dump_data_dir, row[_FILE_COLUMN]) for row in b.rows
                         if row[_FILE_COLUMN] is not None]
                self._force_to_disk(b.step, files, [dump_data_dir] if files else [])
        # the Python of the writing (the JSON bytes, the store's records) holds the GIL the
        # training thread's hooks need; the file writing and fsync between them let it go
        msprobe_writer.write_files(folder, msprobe_writer.encode_step(
            data=b.data, construct=b.tree.construct, stacks=stacks, grouped_stacks=grouped,
            task=config.task, level=config.level, framework=self.adapter.framework,
            dump_data_dir=dump_data_dir, finite=True))
        if config.fsync == "step":
            self._force_to_disk(b.step, [str(folder / name) for name in STEP_FILES],
                                [str(folder), str(folder.parent), config.out])
        self.steps_written.append(b.step)
        if self.store is not None:
            self._store_records(b, statistics, grouped)
            now = time.monotonic()
            if now - self._last_store_flush >= config.store_flush_s:
                self._flush_store(b.step)
                self._last_store_flush = now

    def _stacks(self, frames_of: dict) -> tuple[dict, dict]:
        """Each name's stack as msprobe's lines, and stack.json's groups of them; a step that
        makes the same calls as the last one (the recorder reuses each call's frames) reuses them."""
        last = self._last_stacks
        if last is not None and last[0] == frames_of:
            return last[1], last[2]
        formatted = self._formatted_stacks
        stacks = {}
        for name, frames in frames_of.items():
            text = formatted.get(frames)
            if text is None:
                text = formatted[frames] = _format_frames(frames)
            stacks[name] = text
        grouped = msprobe_writer.group_stacks(stacks)
        self._last_stacks = (frames_of, stacks, grouped)
        return stacks, grouped

    def _write_files(self, step: int, files: list) -> None:
        """A step's tensor files from the copies the training thread took (a failed one is
        reported; the others are still written)."""
        save = self.adapter.stats.save
        for path, copy in files:
            try:
                save({"tensor": copy}, path)
            except Exception as e:  # noqa: BLE001 - one file lost, not the step
                if is_disk_full(e):     # the step is lost: none of its files stay behind
                    _remove_files([p for p, _ in files])
                    raise disk_full(os.path.dirname(path), e) from None
                self.report_error(f"writing a tensor file of step {step}", e)

    def _force_to_disk(self, step: int, files: list[str], folders: list[str]) -> None:
        """fsync ``files``, then ``folders`` (the renames and new entries that made them
        visible). A failure is reported; the step is still written."""
        fds: list[int] = []
        try:
            for path in (*files, *folders):
                fds.append(os.open(path, os.O_RDONLY))
            if len(files) > 1 and _FADV_DONTNEED is not None:
                # start the writeback of every file before waiting on the first: the disk
                # takes them as one stream instead of one fsync at a time (Linux starts
                # writing dirty pages on this advice; the tensor task's ~150 files a step)
                for fd in fds[:len(files)]:
                    os.posix_fadvise(fd, 0, 0, _FADV_DONTNEED)
            for fd in fds:
                os.fsync(fd)
        except OSError as e:
            self.report_error(f"forcing step {step} to disk", e)
        finally:
            for fd in fds:
                os.close(fd)

    def _store_records(self, b: StepBatch, statistics: dict[str, Any], grouped: dict[str, list]) -> None:
        """The step's tensor records, kept for the next flush, and the node records of calls
        the store has not seen yet."""
        from probe.collectors.records import table_from_columns

        if self._tables is None:
            self._tables = TensorTables(self.run, self.rank)
        self._store_tables.append(self._tables.table(b.step, time.time_ns(), b.rows, statistics))
        self._store_steps.append(b.step)
        written = self._nodes_written
        construct, node_info = b.tree.construct, b.tree.node_info
        if not written.issuperset(node_info):   # the tree is the same every step
            stack_ids = {}
            for gid, (group, _) in grouped.items():
                for name in group:
                    stack_ids[name] = gid
            depth = node_depths(construct)
            node_rows: dict[str, list] = {k: [] for k in ("node", "parent", "class_name", "depth",
                                                          "order", "stack_ref")}
            for name, (kind, cls, order) in node_info.items():
                if name in written:
                    continue
                written.add(name)
                node_rows["node"].append(name)
                node_rows["parent"].append(construct.get(name))
                node_rows["class_name"].append(cls)
                node_rows["depth"].append(depth.get(name, 0))
                node_rows["order"].append(order)
                node_rows["stack_ref"].append(stack_ids.get(name))
            m = len(node_rows["node"])
            node_rows.update(run=[self.run] * m, rank=[self.rank] * m)
            self.store.write("node", table_from_columns("node", node_rows))

    def _flush_store(self, step: int) -> None:
        """The tensor records of every step written since the last flush as one durable segment."""
        import pyarrow as pa

        pending, self._store_tables = self._store_tables, []
        if pending:
            self.store.write("tensor", pa.concat_tables(pending) if len(pending) > 1 else pending[0])
        self.store.end_step(step)
        self._store_steps = []               # (on a failure above they stay: their records are lost)


def _remove_step(folder: Any) -> None:
    """Remove one step's files of one rank (``step{N}/rank{R}``: msprobe's three files and the
    tensor files) and the folders left empty; another rank's files stay."""
    import shutil

    shutil.rmtree(os.path.join(folder, "dump_tensor_data"), ignore_errors=True)
    for name in STEP_FILES:
        for path in (os.path.join(folder, name), os.path.join(folder, f".{name}.tmp")):
            try:
                os.unlink(path)
            except OSError:
                pass
    for empty in (folder, os.path.dirname(folder)):
        try:
            os.rmdir(empty)
        except OSError:
            break


def _remove_files(paths: list[str]) -> None:
    """Remove what of ``paths`` exists (a step that could not be written whole)."""
    for path in paths:
        try:
            os.unlink(path)
        except OSError:
            pass


def _format_frames(frames: tuple) -> list[str]:
    out = []
    for filename, lineno, func in frames:
        line = linecache.getline(filename, lineno).strip()
        out.append(f"File {filename}, line {lineno}, in {func}, \n {line}")
    return out
