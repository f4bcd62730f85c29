"""Resolve a compare input (dump.json, step/rank folder, or run folder with a store) to records.

>>> d = load_dump("/work/shared/data/msprobe/torch_L0")      # doctest: +SKIP
>>> d.source, d.tensors.num_rows                            # doctest: +SKIP
('/work/shared/data/msprobe/torch_L0/step0/proc0/dump.json', 99)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from probe.ground.errors import ProbeError

__all__ = ["Dump", "PendingDump", "load_dump", "load_pair", "start_load"]

# Inputs of at least this many bytes of dump.json together are read in two processes at once
# (below it the fork and the transfer of B's records cost about what they save).
PARALLEL_BYTES = 8 << 20

#: The tensor record columns a compare reads (not the run, rank, step, kind, timestamps).
COLUMNS = ("seq", "node", "direction", "slot", "index", "dtype", "shape", "numel", "max", "min",
           "mean", "l2norm", "nan_count", "inf_count", "hash", "tensor_file", "value")


@dataclass
class Dump:
    """One side of a comparison: its tensor and node records and where they came from.

    ``tensors`` holds the record columns a compare reads (:data:`COLUMNS`); its ``node`` is
    dictionary-encoded when read from dump.json (the entries' names, each record's entry by
    position)."""

    source: str
    tensors: pa.Table
    nodes: pa.Table
    framework: str | None = None
    task: str | None = None
    step: int | None = None
    rank: int | None = None
    note: str | None = None


def load_dump(path: str | os.PathLike) -> Dump:
    """Read one compare input into records; one-line :class:`ProbeError` on bad input.

    A folder is searched for ``dump.json`` files first (the lowest step, then rank, is taken
    and the choice is noted); a folder without any but with ``store/`` is read from the store.
    """
    from probe.collectors.msprobe_layout import find_dump_files
    from probe.collectors.msprobe_reader import read_msprobe_dump

    p = Path(path)
    if not p.exists():
        raise ProbeError(f"{p}: no such file or folder")
    note = None
    if p.is_dir() and p.name == "store" and (p / "tensor").is_dir():
        return _load_store(p.parent)
    if p.is_dir():
        files = find_dump_files(p)
        if not files:
            if (p / "store").is_dir():
                return _load_store(p)
            raise ProbeError(f"{p}: no dump.json under it and no store/ folder; give a dump.json, "
                             "a step/rank folder or a run folder")
        if len(files) > 1:
            note = (f"{p} holds {len(files)} dumps; comparing the first "
                    f"({files[0].relative_to(p).parent}); give a step/rank folder to choose")
        p = files[0]
    d = read_msprobe_dump(p, columns=COLUMNS, node_dictionary=True)
    _hand_back_freed()
    return Dump(source=d.path, tensors=d.tensors, nodes=d.nodes, framework=d.framework,
                task=d.task, step=d.step, rank=d.rank, note=note)


def _hand_back_freed() -> None:
    """Return the heap the reader freed to the system (C library: glibc's malloc_trim): its
    many small Python objects leave free space the allocator would otherwise keep (100k
    entries: the compare process after reading A, 246 -> 185 MB)."""
    import ctypes

    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):           # not glibc: nothing to hand back this way
        pass


class PendingDump:
    """A compare input being read: in a forked child process when the inputs are large
    (reading is CPU-bound, one core per side), else on demand here. :meth:`result` returns the
    :class:`Dump` or raises :func:`load_dump`'s error.

    The child reads the file, puts its tables in Arrow IPC files (:func:`_load_to_file`),
    sends the rest through a pipe and leaves with ``os._exit`` (no interpreter teardown: it
    would free every object the read made, on the parent's critical path). If the child dies
    or its result does not come back, the file is read here instead.
    """

    def __init__(self, path: str | os.PathLike, *, fork: bool, prepare: Any = None) -> None:
        self.path = path
        self._prepare = prepare
        self._pid: int | None = None
        self._fd: int | None = None
        if fork:
            self._start()

    @property
    def forked(self) -> bool:
        """Whether a child process is reading the file (this process is free meanwhile)."""
        return self._pid is not None

    def _start(self) -> None:
        import pickle

        r, w = os.pipe()
        try:
            pid = os.fork()
        except OSError:
            os.close(r)
            os.close(w)
            return
        if pid == 0:                                   # the child
            code = 0
            try:
                os.close(r)
                try:
                    done = _load_to_file(self.path) if self._prepare is None else \
                        _prepare_to_file(self.path, self._prepare)
                    payload = pickle.dumps(("ok", done))
                except ProbeError as e:
                    payload = pickle.dumps(("error", str(e)))
                view = memoryview(payload)
                while view:
                    view = view[os.write(w, view):]
            except BaseException:  # noqa: BLE001 - the parent reads the file itself
                code = 1
                _remove_ipc_files(os.getpid())   # not handed over (the parent gone, Ctrl-C): not left
            finally:
                os._exit(code)
        os.close(w)
        self._pid, self._fd = pid, r

    def result(self) -> Dump:
        if self._prepare is not None:
            raise TypeError("a PendingDump with prepare: call result_prepared()")
        return self._result()

    def result_prepared(self) -> tuple[Dump, dict | None]:
        """(the dump, what ``prepare`` made of it in the child) when the child read it; (the
        dump, None) when it was read here (the caller prepares it). The dump's tables are
        None when the child prepared it (``prepare`` took what it needed of them)."""
        if self._fd is None:
            return load_dump(self.path), None
        done = self._result()
        if isinstance(done, tuple):
            return done
        return done, None

    def _result(self) -> Any:
        if self._fd is None:
            return load_dump(self.path)
        import pickle

        pid = self._pid

        exited, kind, value = False, "died", None
        try:
            chunks = []
            while chunk := os.read(self._fd, 1 << 20):
                chunks.append(chunk)
            exited = True               # its end of the pipe is closed: it is exiting
            kind, value = pickle.loads(b"".join(chunks)) if chunks else ("died", None)
        except (OSError, pickle.UnpicklingError, EOFError, ValueError):
            kind, value = "died", None
        finally:
            self.close(exited=exited, keep_files=exited and kind == "ok")
        if kind == "error":
            raise ProbeError(value)
        if kind != "ok":
            return load_dump(self.path)
        try:
            if isinstance(value, tuple):                  # prepared: (dump, its tables' files)
                return value[0], _from_files(value[1])
            return _from_file(value)
        except (OSError, pa.ArrowException):            # its files are gone: read it here
            return load_dump(self.path)
        finally:                # mapped ones are unlinked already; none left if interrupted
            _remove_ipc_files(pid)

    def close(self, exited: bool = False, keep_files: bool = False) -> None:
        """Stop waiting for the child (killed if still reading) and reap it. Safe to call twice.
        ``exited``: its end of the pipe was seen closed, so it is exiting and is waited for (it
        may not be reapable yet: a child with threads closes its files before it can be
        reaped, and killing it then would remove the files it handed over); ``keep_files``:
        the IPC files it wrote are the parent's now."""
        import signal

        fd, self._fd = self._fd, None
        pid, self._pid = self._pid, None
        if fd is not None:
            os.close(fd)
        if pid is not None and exited:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
            if not keep_files:
                _remove_ipc_files(pid)
        elif pid is not None:
            try:
                if os.waitpid(pid, os.WNOHANG) == (0, 0):
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    _remove_ipc_files(pid)               # what it wrote before it was stopped
            except (ChildProcessError, ProcessLookupError):
                pass


def _remove_ipc_files(pid: int) -> None:
    import glob
    import tempfile

    for folder in ("/dev/shm", tempfile.gettempdir()):
        for name in glob.glob(os.path.join(folder, f"{_IPC_PREFIX}{pid}-*.arrow")):
            try:
                os.unlink(name)
            except OSError:
                pass


#: IPC files of a reading child are named ``<prefix><its pid>-*.arrow`` (found again if it is
#: stopped before it hands them over)
_IPC_PREFIX = "probe-compare-"


def sweep_ipc_files() -> list[str]:
    """Remove the IPC files (``/dev/shm/probe-compare-<pid>-*.arrow``, or in the temporary
    folder) that compares killed outright left behind: this user's files whose process is no
    longer alive. A live process's files, and other users', are left alone. Returns the paths
    removed; every compare calls it as it starts (:func:`start_load`)."""
    import glob
    import tempfile

    removed = []
    uid = os.getuid()
    for folder in dict.fromkeys(("/dev/shm", tempfile.gettempdir())):
        for name in glob.glob(os.path.join(folder, f"{_IPC_PREFIX}*-*.arrow")):
            pid = os.path.basename(name)[len(_IPC_PREFIX):].split("-", 1)[0]
            try:
                if not pid.isdigit() or os.lstat(name).st_uid != uid or _alive(int(pid)):
                    continue
                os.unlink(name)
            except OSError:
                continue
            removed.append(name)
    return removed


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists (a zombie, exited but not yet reaped, counts as gone)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:                     # someone else's: alive
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def _load_to_file(path: str | os.PathLike) -> Dump:
    """In the worker: read ``path`` and put its tables in Arrow IPC files (in /dev/shm where
    there is one), so the parent maps them instead of receiving them through a pipe."""
    d = load_dump(path)
    files = _to_files({"tensors": d.tensors, "nodes": d.nodes})
    d.tensors, d.nodes = files["tensors"], files["nodes"]
    return d


def _prepare_to_file(path: str | os.PathLike, prepare: Any) -> tuple[Dump, dict]:
    """In the worker: read ``path``, hand the dump to ``prepare`` (which returns a dict of
    tables and plain values: what the parent needs of it), and put those tables in IPC files;
    the dump goes back without its own tables."""
    from dataclasses import replace

    d = load_dump(path)
    made = prepare(d)
    return replace(d, tensors=None, nodes=None), _to_files(made)


def _to_files(tables: dict) -> dict:
    """``tables`` with each pyarrow.Table put in an Arrow IPC file (in /dev/shm where there is
    one) and replaced by its name; all of them left as they are when there is no room."""
    import tempfile

    import pyarrow.ipc as ipc

    folder = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    out = dict(tables)
    files: list[str] = []
    try:
        for key, table in tables.items():
            if not isinstance(table, pa.Table):
                continue
            fd, name = tempfile.mkstemp(prefix=f"{_IPC_PREFIX}{os.getpid()}-", suffix=".arrow",
                                        dir=folder)
            files.append(name)
            with os.fdopen(fd, "wb") as f, ipc.new_file(f, table.schema) as w:
                w.write_table(table)
            out[key] = name
    except OSError:                       # no room: the tables go through the pipe
        for name in files:
            os.unlink(name)
        return dict(tables)
    return out


def _from_files(made: dict) -> dict:
    """The worker's tables mapped from their IPC files (then unlinked), by key."""
    import pyarrow.ipc as ipc

    def mapped(name: Any) -> Any:
        try:
            with pa.memory_map(name) as source:
                return ipc.open_file(source).read_all()
        finally:
            os.unlink(name)

    return {k: mapped(v) if isinstance(v, str) and v.endswith(".arrow") and
            os.path.basename(v).startswith(_IPC_PREFIX) else v for k, v in made.items()}


def _from_file(d: Dump) -> Dump:
    """The worker's dump with its tables mapped from their IPC files (then unlinked)."""
    tables = _from_files({"tensors": d.tensors, "nodes": d.nodes})
    d.tensors, d.nodes = tables["tensors"], tables["nodes"]
    return d


def start_load(a: str | os.PathLike, b: str | os.PathLike, fork: bool = True,
               prepare: Any = None) -> PendingDump:
    """Start reading ``b``, the second of the inputs ``a`` and ``b``: in a worker process when
    both together hold at least :data:`PARALLEL_BYTES` of dump.json and there are two cores
    (and ``fork``; else when :meth:`PendingDump.result` is called). ``prepare``: a function the
    worker runs on the dump it read (see :meth:`PendingDump.result_prepared`)."""
    sweep_ipc_files()                   # what a compare killed outright left in /dev/shm
    fork = (fork and (os.cpu_count() or 1) >= 2 and hasattr(os, "fork")
            and _json_bytes(a) + _json_bytes(b) >= PARALLEL_BYTES)
    return PendingDump(b, fork=fork, prepare=prepare)


def load_pair(a: str | os.PathLike, b: str | os.PathLike) -> tuple[Dump, Dump]:
    """Read both compare inputs: ``(load_dump(a), load_dump(b))``, B in a forked worker process
    while A is read here when the two dump.json files are large (see :func:`start_load`).
    Errors are those of :func:`load_dump`, A's first.

    >>> da, db = load_pair("runs/A/dump.json", "runs/B/dump.json")  # doctest: +SKIP
    """
    pending = start_load(a, b)
    try:
        da = load_dump(a)
    except BaseException:
        pending.close()
        raise
    return da, pending.result()


def _json_bytes(path: str | os.PathLike) -> int:
    """Size of the dump.json that :func:`load_dump` would read from ``path`` (0 if none)."""
    from probe.collectors.msprobe_layout import find_dump_files

    p = Path(path)
    try:
        files = find_dump_files(p) if p.exists() else []
        return files[0].stat().st_size if files else 0
    except OSError:
        return 0


def _load_store(root: Path) -> Dump:
    from probe.collectors.store import open_store, read_step

    con = open_store(root)
    tensors, nodes, step, rank = read_step(root, con=con)
    ranks = con.execute("select count(distinct rank), count(distinct step) from tensors").fetchall()[0]
    note = None
    if ranks[0] > 1 or ranks[1] > 1:
        note = f"{root}: store holds {ranks[1]} steps × {ranks[0]} ranks; comparing step {step} rank {rank}"
    return Dump(source=str(root / "store"), tensors=tensors.select(list(COLUMNS)), nodes=nodes, step=step, rank=rank,
                note=note, task="statistics")
