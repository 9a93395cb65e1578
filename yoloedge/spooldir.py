"""The MQTT spool's files by name, and which directories the spool may use (`mqtt.spool_dir`).

One home for these rules, applied by config validation (`yoloedge check`, the daemon's start and
every reload) and by the spool itself when it opens (`publish/spool.py`). Standard library only:
config validation imports this module without loading the MQTT client.

Why: the spool reads, renames and deletes files in its directory. Pointed at a directory that
holds anything else (`/etc`, `/`, the folder of the models), it would treat those files as its own;
a directory someone else can write lets them plant messages the daemon then publishes with its
credentials, or a FIFO or a device under a segment's name. So the spool uses only a directory of its
own, and in it only these names:

* `NNNNNNNNNNNNNNNNNNNN.seg` (exactly 20 digits: the segment's first sequence number),
* `NNNNNNNNNNNNNNNNNNNN.seg.tmp` (the valid part of a damaged segment, being written),
* `NNNNNNNNNNNNNNNNNNNN.seg.corrupt-K` (a damaged segment, moved aside; K counts up),
* `lock` (held while a daemon uses the directory), and `lost+found` (the spool's own filesystem).

A directory is refused when it is a symbolic link, a well-known system directory or the service's
own state or config directory, writable by every user, owned by another user (neither the
process's user nor root), or when it holds any other name, or one of these names as something other
than a regular file (a FIFO, a symlink, a device). A directory that does not exist yet is fine: the
spool creates it (0700).
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from enum import Enum, auto

SEGMENT_SUFFIX = ".seg"
LOCK_NAME = "lock"
LOST_AND_FOUND = "lost+found"
TMP_SUFFIX = ".tmp"
CORRUPT_INFIX = ".corrupt-"
#: the largest sequence number a name may carry: seqs are u64 on disk and count up from 0, so a
#: larger one was not written by the spool (and would overflow the next record's seq).
MAX_SEQ = 2 ** 63 - 1

_SEGMENT = re.compile(r"([0-9]{20})\.seg", re.ASCII)
_TMP = re.compile(r"([0-9]{20})\.seg\.tmp", re.ASCII)
_CORRUPT = re.compile(r"([0-9]{20})\.seg\.corrupt-([0-9]{1,9})", re.ASCII)

#: directories that are never a spool directory, whatever they hold (an empty /mnt, /srv or /media
#: would otherwise pass), nor the service's own state, cache, runtime and config directories.
SYSTEM_DIRS = frozenset({
    "/", "/bin", "/boot", "/dev", "/dev/shm", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32",
    "/media", "/mnt", "/opt", "/proc", "/root", "/run", "/run/user", "/sbin", "/srv", "/sys", "/tmp",
    "/usr", "/usr/bin", "/usr/lib", "/usr/local", "/usr/sbin", "/usr/share", "/var", "/var/cache",
    "/var/lib", "/var/lib/private", "/var/log", "/var/mail", "/var/spool", "/var/tmp",
    "/etc/yoloedge", "/var/lib/yoloedge", "/var/cache/yoloedge", "/run/yoloedge", "/opt/yoloedge",
})

#: how many offending names a refusal quotes.
_SHOWN_NAMES = 5

#: what a refusal suggests.
SPOOL_DIR_EXAMPLE = "/var/lib/yoloedge/spool"


class Kind(Enum):
    """What a name in the spool directory is to the spool."""

    SEGMENT = auto()
    TMP = auto()  # the valid records of a damaged segment, being copied out of it
    CORRUPT = auto()  # a damaged segment moved aside: kept for the operator, never read again
    LOCK = auto()
    LOST_AND_FOUND = auto()
    FOREIGN = auto()  # not the spool's: the directory is not used


def classify(name: str) -> Kind:
    for pattern, kind in ((_SEGMENT, Kind.SEGMENT), (_TMP, Kind.TMP), (_CORRUPT, Kind.CORRUPT)):
        match = pattern.fullmatch(name)
        if match is not None:
            return kind if int(match.group(1)) <= MAX_SEQ else Kind.FOREIGN
    if name == LOCK_NAME:
        return Kind.LOCK
    if name == LOST_AND_FOUND:
        return Kind.LOST_AND_FOUND
    return Kind.FOREIGN


def name_seq(name: str) -> int:
    """The sequence number in a SEGMENT, TMP or CORRUPT name."""
    return int(name[:20])


def corrupt_number(name: str) -> int:
    """K of a CORRUPT name: the order in which damaged segments were moved aside."""
    return int(name.rsplit("-", 1)[1])


def segment_name(seq: int) -> str:
    return f"{seq:020d}{SEGMENT_SUFFIX}"


def shown(name: str) -> str:
    """A file name as a message quotes it: bytes that are not UTF-8 as escapes, never an error."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


@dataclass(frozen=True)
class DirectoryProblem:
    """Why the spool must not use a directory, and what to do about it."""

    message: str
    fix: str

    def __str__(self) -> str:
        return f"{self.message}; {self.fix}"


def directory_problem(path: str, check_owner: bool = True,
                      refuse_not_regular: bool = True) -> DirectoryProblem | None:
    """Why the spool must not use `path`, or None (also when it does not exist yet). `check_owner`
    False skips the owner test: `yoloedge check` run as root cannot know the service's user (the
    spool tests it again when it opens). `refuse_not_regular` False lets the spool's own names
    pass as anything: the spool opens them without following links or blocking, and skips them."""
    try:
        info = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):  # to be created (whether it can be is not asked here)
        return None
    except OSError as exc:
        return DirectoryProblem(f"{path} cannot be examined ({exc.strerror or exc})",
                                "make it readable by the daemon's user, or pick another spool_dir")
    problem = _kind_problem(path, info) or _access_problem(path, info, check_owner)
    return problem or _contents_problem(path, refuse_not_regular)


def _kind_problem(path: str, info: os.stat_result) -> DirectoryProblem | None:
    if stat.S_ISLNK(info.st_mode):
        target = os.path.realpath(path)
        return DirectoryProblem(f"{path} is a symbolic link (to {target}): the spool does not follow "
                                f"one, as whoever can replace it could point the spool at any directory",
                                f"name the directory itself (spool_dir: {target})")
    if not stat.S_ISDIR(info.st_mode):
        return DirectoryProblem(f"{path} exists and is not a directory",
                                f"spool_dir names a directory of its own, e.g. spool_dir: {SPOOL_DIR_EXAMPLE}")
    if os.path.realpath(path) in SYSTEM_DIRS:
        return DirectoryProblem(f"{path} is a system directory, not one for the spool alone",
                                f"use a directory of its own (created 0700 when missing), e.g. "
                                f"spool_dir: {SPOOL_DIR_EXAMPLE}")
    return None


def _access_problem(path: str, info: os.stat_result, check_owner: bool) -> DirectoryProblem | None:
    if info.st_mode & stat.S_IWOTH:
        return DirectoryProblem(f"{path} is writable by every user (mode {stat.S_IMODE(info.st_mode):04o}): "
                                f"anyone could plant messages the daemon would publish",
                                f"chmod o-w {path}, or use a directory of its own (created 0700 when "
                                f"missing), e.g. spool_dir: {SPOOL_DIR_EXAMPLE}")
    euid = os.geteuid()
    if check_owner and info.st_uid not in (euid, 0):
        return DirectoryProblem(f"{path} is owned by uid {info.st_uid}, not by this user (uid {euid}) or root: "
                                f"its owner could plant messages the daemon would publish",
                                "chown it to the daemon's user, or use a directory of the daemon's own")
    return None


def _contents_problem(path: str, refuse_not_regular: bool) -> DirectoryProblem | None:
    try:
        foreign, not_regular = entries_not_ours(path)
    except OSError as exc:
        return DirectoryProblem(f"{path} cannot be listed ({exc.strerror or exc})",
                                "make it readable by the daemon's user, or pick another spool_dir")
    if foreign:
        return DirectoryProblem(f"{path} holds files the spool did not write ({_names(foreign)})",
                                f"spool_dir must be a directory of its own, holding only the spool's "
                                f"NNNNNNNNNNNNNNNNNNNN.seg files and its lock: move those files away, or "
                                f"use another directory, e.g. spool_dir: {SPOOL_DIR_EXAMPLE}")
    if not_regular and refuse_not_regular:
        return DirectoryProblem(f"{path} holds entries under the spool's names that are not regular "
                                f"files ({_names(not_regular)}): the spool writes only regular files",
                                "remove them (the spool skips them, and does not delete what it did not write)")
    return None


def entries_not_ours(path: str) -> tuple[list[str], list[str]]:
    """(names that are not the spool's, the spool's names that are not regular files (or, for
    lost+found, not a directory)); each list stops after a few, as a refusal quotes only those.
    OSError when the directory cannot be listed."""
    foreign: list[str] = []
    not_regular: list[str] = []
    with os.scandir(path) as entries:
        for entry in entries:
            kind = classify(entry.name)
            if kind is Kind.FOREIGN:
                foreign.append(entry.name)
            elif kind is Kind.LOST_AND_FOUND:
                if not entry.is_dir(follow_symlinks=False):
                    not_regular.append(entry.name)
            elif not entry.is_file(follow_symlinks=False):
                not_regular.append(entry.name)
            if len(foreign) > _SHOWN_NAMES or len(not_regular) > _SHOWN_NAMES:
                break
    return sorted(foreign), sorted(not_regular)


def _names(names: list[str]) -> str:
    quoted = ", ".join(repr(shown(n)) for n in names[:_SHOWN_NAMES])
    return quoted + (", ..." if len(names) > _SHOWN_NAMES else "")
