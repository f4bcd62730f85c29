"""The agent's spool: an append-only file of the batches the service has not acknowledged yet.

A spool file holds ``[len u32][crc32 u32][payload]`` records; a torn last record (the process
died mid-write) is ignored on reading. A spool file is only ever a regular file owned by this
user: it is opened with ``O_NOFOLLOW`` (and ``O_EXCL`` when created), and an existing one owned
by someone else is neither read nor appended to, so a link planted at its path cannot make the
agent write into (or send) another file.

Default spool files live in a private per-user folder (:func:`private_spool_dir`, mode 0700):
``$XDG_RUNTIME_DIR/probe-monitor-spool`` when that is set, else
``<tmp>/probe-monitor-spool-<uid>``. A folder there that is not this user's own, or that others
may write to, is refused (one warning) and the next one is used; the last resort is a fresh
private folder (then a spool left by an earlier run is not found again).

>>> import tempfile
>>> spool = Spool(Path(tempfile.mkdtemp()) / "r0.spool")
>>> spool.append(b"batch 1"), spool.append(b"batch 2")
(True, True)
>>> list(spool.read())
[b'batch 1', b'batch 2']
>>> spool.remove(); spool.exists()
False
"""

from __future__ import annotations

import errno
import os
import stat
import struct
import tempfile
import zlib
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

SPOOL_ENV = "PROBE_MONITOR_SPOOL"
_REC = struct.Struct("<II")        # spool record header: payload length, crc32
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def _owned(st: os.stat_result) -> bool:
    """``st`` belongs to this user (where there are no uids: anyone's does)."""
    return not hasattr(os, "getuid") or st.st_uid == os.getuid()


def _open_owned(path: Path, flags: int, mode: str) -> BinaryIO:
    """Open ``path`` without following a link; OSError unless it is this user's regular file."""
    fd = os.open(path, flags | _NOFOLLOW, 0o600)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or not _owned(st):
        os.close(fd)
        raise OSError(errno.EPERM, "not a regular file of this user; remove it or pick another "
                                   f"spool with {SPOOL_ENV}", str(path))
    return os.fdopen(fd, mode)


class Spool:
    """An append-only file of serialized batches; see the module docstring."""

    def __init__(self, path: str | os.PathLike, max_bytes: int = 1 << 30) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self._append: BinaryIO | None = None
        own = self._own_file()
        self.size = own.st_size if own else 0

    def _own_file(self) -> os.stat_result | None:
        """The file's status when it is this user's regular file (not a link), else None."""
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return None
        return st if stat.S_ISREG(st.st_mode) and _owned(st) else None

    def exists(self) -> bool:
        """The spool holds records to resend (a link or another user's file never does)."""
        own = self._own_file()
        return own is not None and own.st_size > 0

    def append(self, payload: bytes) -> bool:
        """Append one record; False (nothing written) when the spool is full.

        OSError when the file cannot be written, or is not this user's regular file.
        """
        if self.size + len(payload) + _REC.size > self.max_bytes:
            return False
        if self._append is None:
            os.makedirs(self.path.parent, mode=0o700, exist_ok=True)
            try:
                self._append = _open_owned(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT
                                           | os.O_EXCL, "ab")
            except FileExistsError:
                self._append = _open_owned(self.path, os.O_WRONLY | os.O_APPEND, "ab")
        self._append.write(_REC.pack(len(payload), zlib.crc32(payload)) + payload)
        self._append.flush()
        self.size += len(payload) + _REC.size
        return True

    def read(self) -> Iterator[bytes]:
        """The records in order, up to the first torn one; OSError on another user's file."""
        try:
            f = _open_owned(self.path, os.O_RDONLY, "rb")
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
        """Delete the spool file (every record was acknowledged); a refused path is left alone."""
        if self._append is not None:
            self._append.close()
            self._append = None
        if self._own_file() is not None:
            self.path.unlink(missing_ok=True)
        self.size = 0


def _private_dir_problem(folder: Path) -> str:
    """Why ``folder`` is no private spool folder of this user ("" when it is one)."""
    try:
        st = os.lstat(folder)
    except OSError as e:
        return f"{folder}: {e.strerror}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{folder} is not a folder"
    if not _owned(st):
        return f"{folder} belongs to another user"
    if st.st_mode & 0o022:
        return f"{folder} is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    return ""


def private_spool_dir(*, warn: Callable[[str], None]) -> Path:
    """This user's private spool folder (mode 0700), made when missing; see the module docstring.

    ``warn`` hears, once, why a folder was refused.

    >>> folder = private_spool_dir(warn=print)
    >>> oct(folder.stat().st_mode & 0o777)
    '0o700'
    """
    candidates = []
    if os.environ.get("XDG_RUNTIME_DIR"):
        candidates.append(Path(os.environ["XDG_RUNTIME_DIR"]) / "probe-monitor-spool")
    uid = os.getuid() if hasattr(os, "getuid") else os.getpid()
    candidates.append(Path(tempfile.gettempdir()) / f"probe-monitor-spool-{uid}")
    refused = []
    for folder in candidates:
        try:
            os.mkdir(folder, 0o700)
            os.chmod(folder, 0o700)
        except FileExistsError:
            pass
        except OSError as e:
            refused.append(f"{folder}: {e.strerror}")
            continue
        problem = _private_dir_problem(folder)
        if not problem:
            if refused:
                warn(f"spool folder refused ({'; '.join(refused)}); using {folder}")
            return folder
        refused.append(problem)
    folder = Path(tempfile.mkdtemp(prefix="probe-monitor-spool-"))
    warn(f"spool folder refused ({'; '.join(refused)}); using {folder}, so a spool left by an "
         "earlier run is not resent")
    return folder


def default_spool_path(job: str, rank: int, *, warn: Callable[[str], None]) -> Path:
    """``<job>-rank<R>.spool`` in ``$PROBE_MONITOR_SPOOL`` (a folder) or :func:`private_spool_dir`.

    >>> import os; os.environ[SPOOL_ENV] = "/data/spool"
    >>> default_spool_path("my job", 3, warn=print).as_posix()
    '/data/spool/my_job-rank3.spool'
    >>> del os.environ[SPOOL_ENV]
    """
    chosen = os.environ.get(SPOOL_ENV)
    folder = Path(chosen) if chosen else private_spool_dir(warn=warn)
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in job)
    return folder / f"{safe}-rank{rank}.spool"
