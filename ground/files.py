"""Opening the files a user (or anyone who can hand them a dump) names: regular files only, of a
bounded size, and tensor files whose claimed sizes fit the file and the memory limit.

- :func:`open_regular` opens a file for reading only when it is a regular file: a FIFO, a device
  (``/dev/zero``), a socket or a directory is refused at once with one line, before anything
  blocks or reads without end (the path is opened with ``O_NONBLOCK``, then ``fstat`` decides, so
  a FIFO never waits for a writer and a file swapped in between cannot slip through);
- :func:`read_regular` reads such a file whole, refusing one larger than ``limit`` bytes;
- :func:`max_tensor_bytes` is the most bytes one tensor may take in memory when read from a
  file: ``$PROBE_MAX_TENSOR_BYTES``, else a quarter of this machine's memory, at most 4 GiB;
- :func:`check_tensor_file` checks a tensor file before it is read: a regular file, no larger
  than the limit; a zip (``torch.save``) whose members claim at most the limit in all and expand
  at most :data:`MAX_ZIP_RATIO` times (``torch.save`` stores members uncompressed: a deflated
  member that grows a thousandfold is a zip bomb); a safetensors file whose header's tensors lie
  inside the file, each the size its dtype and shape say.

Every refusal is a :class:`~probe.ground.errors.ProbeError` naming the file (exit 2).

>>> import os, tempfile
>>> fifo = os.path.join(tempfile.mkdtemp(), "dump.json")
>>> os.mkfifo(fifo)
>>> try:
...     open_regular(fifo)
... except ProbeError as e:
...     print(str(e).split(": ", 1)[1])
not a regular file (a FIFO); give a file
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
import zipfile
from typing import IO

from probe.ground.errors import ProbeError

#: the variable that sets the most bytes one tensor read from a file may take
TENSOR_LIMIT_VARIABLE = "PROBE_MAX_TENSOR_BYTES"
#: the default cap of :func:`max_tensor_bytes` (also bounded by a quarter of the memory)
DEFAULT_TENSOR_LIMIT = 4 << 30
#: the most a deflated member of a tensor zip may expand (``torch.save`` stores, ratio 1)
MAX_ZIP_RATIO = 100
#: the largest safetensors header read (the format's own limit)
MAX_SAFETENSORS_HEADER = 100 << 20
#: bytes per element of each safetensors dtype
_SAFETENSORS_WIDTH = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2,
                      "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
                      "C64": 8}
_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a plain file")


def open_regular(path: str | os.PathLike, limit: int | None = None) -> IO[bytes]:
    """``path`` opened for binary reading, when it is a regular file of at most ``limit`` bytes;
    else :class:`ProbeError` naming it. The caller closes it (``with open_regular(p) as f:``)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except IsADirectoryError:
        raise ProbeError(f"{path}: not a regular file (a directory); give a file") from None
    except OSError as e:
        raise ProbeError(f"{path}: cannot read ({e.strerror or e})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ProbeError(f"{path}: not a regular file ({_kind(st.st_mode)}); give a file")
        if limit is not None and st.st_size > limit:
            raise ProbeError(f"{path}: {st.st_size} bytes, more than the {limit} this file may hold")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike, limit: int | None = None) -> bytes:
    """The bytes of the regular file ``path`` (see :func:`open_regular`), at most ``limit``
    (a file that grows past it while read is refused too)."""
    with open_regular(path, limit) as f:
        size = os.fstat(f.fileno()).st_size
        data = f.read(size + 1 if limit is None else min(size, limit) + 1)
        if len(data) > size and (limit is None or len(data) <= limit):
            data += f.read() if limit is None else f.read(limit + 1 - len(data))
    if limit is not None and len(data) > limit:
        raise ProbeError(f"{path}: more than the {limit} bytes this file may hold")
    return data


def check_regular(path: str | os.PathLike) -> os.stat_result:
    """The ``stat`` of ``path`` when it is a regular file, else :class:`ProbeError` (for readers
    that open the file themselves: a library, a memory map)."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise ProbeError(f"{path}: cannot read ({e.strerror or e})") from None
    if not stat.S_ISREG(st.st_mode):
        raise ProbeError(f"{path}: not a regular file ({_kind(st.st_mode)}); give a file")
    return st


def max_tensor_bytes() -> int:
    """The most bytes one tensor read from a file may take: ``$PROBE_MAX_TENSOR_BYTES`` (a whole
    number of bytes), else a quarter of the machine's memory, at most 4 GiB.

    >>> os.environ["PROBE_MAX_TENSOR_BYTES"] = "1000"; max_tensor_bytes()
    1000
    >>> del os.environ["PROBE_MAX_TENSOR_BYTES"]
    """
    given = os.environ.get(TENSOR_LIMIT_VARIABLE, "").strip()
    if given:
        if not given.isdigit() or len(given) > 20 or int(given) <= 0:
            raise ProbeError(f"${TENSOR_LIMIT_VARIABLE}={given[:40]!r}: give a positive whole number of bytes")
        return int(given)
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = 4 * DEFAULT_TENSOR_LIMIT
    return max(min(DEFAULT_TENSOR_LIMIT, memory // 4), 1 << 20)


def _too_big(path: str | os.PathLike, what: str, size: int, limit: int) -> ProbeError:
    return ProbeError(f"{path}: {what} {size} bytes, more than the {limit} one tensor may take "
                      f"(${TENSOR_LIMIT_VARIABLE} raises it); tensor skipped")


def check_tensor_file(path: str | os.PathLike, limit: int | None = None) -> None:
    """Refuse (:class:`ProbeError`) a tensor file that is not a regular file, or whose content
    would take more than ``limit`` bytes (:func:`max_tensor_bytes`) once read: see the module
    docstring. Checks headers only; reads no tensor data."""
    limit = max_tensor_bytes() if limit is None else limit
    st = check_regular(path)
    name = os.fspath(path)
    if zipfile.is_zipfile(name):
        _check_zip(path, limit)
    elif name.endswith(".safetensors"):
        safetensors_entries(path, limit)
    elif name.endswith(".npy"):
        _check_npy(path, st.st_size, limit)
    elif st.st_size > limit:
        raise _too_big(path, "a file of", st.st_size, limit)


def _check_npy(path: str | os.PathLike, size: int, limit: int) -> None:
    """A ``.npy`` file whose header's shape takes at most ``limit`` bytes, all of them in the file."""
    import numpy as np

    try:
        with open_regular(path) as f:
            major, _ = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
            shape, _, dtype = read(f, max_header_size=1 << 20)
            start = f.tell()
    except (ValueError, OSError, SyntaxError, TypeError) as e:
        raise ProbeError(f"{path}: not a readable .npy file ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > limit:
        raise _too_big(path, f"its shape {list(shape)[:8]} claims", nbytes, limit)
    if nbytes > size - start and not dtype.hasobject:
        raise ProbeError(f"{path}: its shape {list(shape)[:8]} claims {nbytes} bytes; the file holds {size - start}")


def _check_zip(path: str | os.PathLike, limit: int) -> None:
    try:
        with zipfile.ZipFile(path) as archive:
            check_zip_members(path, archive.infolist(), limit)
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        raise ProbeError(f"{path}: not a readable tensor file ({e})") from None


def check_zip_members(path: str | os.PathLike, infos: list[zipfile.ZipInfo], limit: int | None = None) -> None:
    """Refuse a tensor zip whose members claim more than ``limit`` bytes in all
    (:func:`max_tensor_bytes`), or a deflated member that expands more than
    :data:`MAX_ZIP_RATIO` times (a zip bomb), before any member is decompressed."""
    limit = max_tensor_bytes() if limit is None else limit
    total = sum(i.file_size for i in infos)
    if total > limit:
        raise _too_big(path, "its members expand to", total, limit)
    for i in infos:
        if i.compress_type != zipfile.ZIP_STORED and i.file_size > MAX_ZIP_RATIO * max(i.compress_size, 1) + (1 << 16):
            raise ProbeError(f"{path}: member {i.filename[:80]!r} expands {i.compress_size} bytes to "
                             f"{i.file_size} (a zip bomb?); tensor skipped")


def safetensors_entries(path: str | os.PathLike, limit: int | None = None) -> dict[str, tuple[str, list[int]]]:
    """``{name: (dtype, shape)}`` of a safetensors file, after checking its header: every tensor
    lies inside the file, takes the bytes its dtype and shape say, and at most ``limit`` bytes
    (:func:`max_tensor_bytes`). :class:`ProbeError` naming the file otherwise."""
    limit = max_tensor_bytes() if limit is None else limit
    with open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 0 < n <= min(MAX_SAFETENSORS_HEADER, size - 8):
            raise ProbeError(f"{path}: not a readable tensor file (a safetensors header of {n} bytes in a file of {size})")
        try:
            header = json.loads(f.read(n))
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise ProbeError(f"{path}: not a readable tensor file (its safetensors header is not JSON)") from None
    if not isinstance(header, dict):
        raise ProbeError(f"{path}: not a readable tensor file (its safetensors header is not an object)")
    data = size - 8 - n
    out = {}
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        try:
            dtype, shape = str(entry["dtype"]), [int(d) for d in entry["shape"]]
            start, end = (int(o) for o in entry["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise ProbeError(f"{path}: tensor {str(key)[:80]!r} has no dtype, shape and data_offsets") from None
        width = _SAFETENSORS_WIDTH.get(dtype)
        if width is None or any(d < 0 for d in shape):
            raise ProbeError(f"{path}: tensor {str(key)[:80]!r}: dtype {dtype[:20]!r}, shape {shape[:8]}: not readable")
        nbytes = width * math.prod(shape)
        if nbytes > limit:
            raise _too_big(path, f"tensor {str(key)[:80]!r} of shape {shape[:8]} claims", nbytes, limit)
        if not 0 <= start <= end <= data or end - start != nbytes:
            raise ProbeError(f"{path}: tensor {str(key)[:80]!r} of shape {shape[:8]} claims {nbytes} bytes "
                             f"at {start}..{end}; the file holds {data} bytes of data")
        out[str(key)] = (dtype, shape)
    return out


#: the errors of a full disk or an exhausted quota
DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


def is_disk_full(error: BaseException) -> bool:
    """Whether ``error`` says the disk (or the user's quota) is full; pyarrow's ``OSError``
    carries the errno only in its text (``[errno 28] No space left on device``).

    >>> is_disk_full(OSError(errno.ENOSPC, "No space left on device")), is_disk_full(ValueError())
    (True, False)
    """
    if not isinstance(error, OSError):
        return False
    if error.errno in DISK_FULL:
        return True
    text = str(error)
    return any(f"[errno {n}]" in text.lower() or os.strerror(n) in text for n in DISK_FULL)


class DiskFull(ProbeError):
    """A full disk (or quota) while writing: :func:`disk_full`'s one line (exit 2). A writer
    that meets it stops writing (what follows would not fit either) and hands it to the
    command, which ends with it."""


def disk_full(folder: str | os.PathLike, error: BaseException) -> DiskFull:
    """The one line for a full disk while writing into ``folder`` (exit 2)."""
    why = "disk quota exceeded" if getattr(error, "errno", None) == errno.EDQUOT or \
        os.strerror(errno.EDQUOT) in str(error) else "no space left on device"
    return DiskFull(f"{folder}: {why}; free space or give another --out (what was written before "
                      "is complete and readable)")
