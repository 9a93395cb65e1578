"""Reading small files that an operator names (config, env files, labels) without trusting what the
path turns out to be.

A path can name a FIFO (open() then waits for a writer, forever: a reload or `yoloedge check` hangs,
and SIGTERM with it), a device (/dev/zero never ends), a directory, or a 2 GB sparse file (read
whole, it ends in MemoryError). So every such read goes through `read_bounded`: it opens with
O_NONBLOCK (a FIFO opens at once and is then refused), requires a regular file by fstat, and reads at
most `max_bytes`. Symlinks are followed on purpose: /etc/yoloedge/yoloedge.yaml may be one.
`regular_file_problem` is the same test without reading, for files checked now and read later.

Files under /proc and /sys pass as regular files of size 0, yet read as whatever the kernel makes
up: /proc/self/mem as a model fails only at run time (not as a config error), /proc/self/environ
as labels would put the environment, secrets included, into detections. They are refused by the
real path (symlinks resolved).
"""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from contextlib import contextmanager
from typing import Iterator

from .errors import YoloedgeError


class FileProblem(YoloedgeError):
    """The file cannot be used; the message starts with the path. `too_large` tells a file over the
    size bound from one that is missing, unreadable or not a regular file."""

    def __init__(self, path: str, reason: str, too_large: bool = False):
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason
        self.too_large = too_large


@contextmanager
def opened_regular(path: str, max_bytes: int | None = None) -> Iterator[tuple[int, os.stat_result]]:
    """(fd, fstat) of the regular file at `path`, closed on exit; FileProblem when it is missing,
    not a regular file (never blocking on a FIFO), a kernel pseudo-file, or over `max_bytes`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except FileNotFoundError:
        raise FileProblem(path, "not found") from None
    except OSError as exc:
        raise FileProblem(path, f"cannot open: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        _check_regular(path, info, max_bytes)
        yield fd, info
    finally:
        os.close(fd)


def read_bounded(path: str, max_bytes: int) -> bytes:
    """The bytes of the regular file at `path`; FileProblem when it is not one, or holds more than
    `max_bytes` (also when it grew past the bound after fstat)."""
    with opened_regular(path, max_bytes) as (fd, info):
        try:
            data = _read_up_to(fd, info.st_size + 1)  # one more: a file that grew since fstat
        except OSError as exc:
            raise FileProblem(path, f"cannot read: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise FileProblem(path, f"over the bound of {max_bytes:,} bytes", too_large=True)
    return data


def write_atomically(path: str, data: bytes, mode: int | None = None, durable: bool = False) -> None:
    """Replace the file at `path` with `data` in one step: a reader (an image viewer reloading a
    snapshot, systemd reading an env file) sees the old file or the new one, never half of one.
    `mode` None: what open() would have made (0666 less the umask), not mkstemp's 0600.
    `durable`: the data and the rename are on disk when this returns (fsync of the file before the
    rename, of the folder after it), so a power cut leaves the old file or the new one, not an
    empty one (state that must survive a restart: line and zone counts)."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, temporary = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.chmod(temporary, 0o666 & ~_umask() if mode is None else mode)
        os.replace(temporary, path)
        if durable:
            _fsync_folder(folder)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def _fsync_folder(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def sha256_of(path: str, chunk: int = 1 << 20) -> str:
    """The hex sha256 of the regular file at `path`, read in chunks (a model of several GB costs no
    memory); FileProblem as for `opened_regular`."""
    digest = hashlib.sha256()
    with opened_regular(path) as (fd, _):
        try:
            while block := os.read(fd, chunk):
                digest.update(block)
        except OSError as exc:
            raise FileProblem(path, f"cannot read: {exc.strerror or exc}") from None
    return digest.hexdigest()


def regular_file_problem(path: str, max_bytes: int | None = None) -> FileProblem | None:
    """Why `path` is not a readable regular file of at most `max_bytes`, or None when it is; stat
    only, so a FIFO is never opened."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return FileProblem(path, "not found")
    except OSError as exc:
        return FileProblem(path, f"cannot read: {exc.strerror or exc}")
    try:
        _check_regular(path, info, max_bytes)
    except FileProblem as problem:
        return problem
    return None


#: where the kernel's pseudo-files live: "regular", size 0, content made up on read.
PSEUDO_FILE_ROOTS = ("/proc/", "/sys/")


def _check_regular(path: str, info: os.stat_result, max_bytes: int | None) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise FileProblem(path, f"not a regular file ({file_type(info.st_mode)})")
    if os.path.realpath(path).startswith(PSEUDO_FILE_ROOTS):
        raise FileProblem(path, "a kernel pseudo-file (/proc, /sys), not a config, model, labels or data file")
    if max_bytes is not None and info.st_size > max_bytes:
        raise FileProblem(path, f"{info.st_size:,} bytes, over the bound of {max_bytes:,} bytes", too_large=True)


def _read_up_to(fd: int, count: int) -> bytes:
    chunks: list[bytes] = []
    left = count
    while left > 0:
        chunk = os.read(fd, left)
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def file_type(mode: int) -> str:
    """What kind of file `mode` (from stat or lstat) describes, in words."""
    for test, name in ((stat.S_ISREG, "a regular file"), (stat.S_ISLNK, "a symlink"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a file"
