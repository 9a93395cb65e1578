"""A durable, bounded, ordered log of MQTT messages on disk (`mqtt.spool_dir`).

Why it exists: the in-memory outbox dies with the process, so a restart during a broker outage
(an update, a watchdog restart, a power cut) used to lose everything queued. With a spool the
publisher writes every QoS >= 1 message here first and sends it from here, so one ordered log
holds every message until the broker acknowledges it, across restarts.

Format: append-only segment files `<first-seq>.seg` (20 digits, so names sort in order). Each
record is `length:u32 crc32:u32 body`, big-endian, with body = `seq:u64 flags:u8 topic_len:u16
topic payload` (flags: QoS in bits 0-1, retain in bit 2). A segment is closed when it reaches
`segment_bytes`; the next append opens the next one. One process at a time: `open()` takes an
exclusive lock on `<dir>/lock` (two daemons sharing a spool would send each other's records).

Recovery (`open`): the spool uses only a directory of its own (`yoloedge.spooldir`: not a
symlink, a system directory, writable by everyone or owned by another user, and holding only the
spool's names); otherwise `open` raises `SpoolRefused` and touches nothing. In it, only regular
files named exactly like segments are read, opened without following a link or blocking (a FIFO,
a device or a symlink under a segment's name is skipped, logged, and left as it is), and read
within bounds: no record may start past the largest segment the spool writes, so a huge or endless
file costs at most that plus one record. Each segment is read record by record; the first record
that is torn (cut short at a crash), fails its CRC, cannot be decoded or is not the next seq (the
first must be the one in the name; a segment whose seqs overlap the one before it is damaged as a
whole) ends its valid part. A damaged segment is never truncated or deleted: its valid records are
copied into a fresh segment of the same name (written as `<name>.tmp` and fsynced first, so a crash
half-way loses nothing) and the original is moved aside as `<name>.corrupt-K` and named in the
log. Moved-aside files are not read again and not counted in the spool's size; the newest
`CORRUPT_KEPT` are kept (older ones are deleted, logged), so a crash loop cannot fill the disk.
Acknowledgements are not written to disk, so every record that survived is sent again after a
restart: delivery is at-least-once across a restart, in order; within one run every record is
delivered once per connection (see publish/mqtt.py).

Durability (fsync policy): the publisher calls `sync()` about once a second (`fsync_interval_s`),
and `close()` at stop. A tick fsyncs each segment holding a record that was written before the
previous tick and is still unacknowledged; `close()` fsyncs every unacknowledged record; the
directory is fsynced with a new segment's first fsync, so its name survives too. A power cut
during an outage therefore loses at most the records appended in the last two intervals (about
2 s) before it; a process crash (kill -9) loses nothing that `append` returned for, because the
data is in the kernel's page cache. On a healthy link records are acknowledged within the
interval and deleted unsynced: the spool costs page-cache writes, not fsyncs. Deletions are not
fsynced: a deleted segment that reappears after a power cut is only sent again (at-least-once).

Bounded: segment files never exceed `limit_bytes` in all; an append that would exceed it first
deletes the oldest segments, and their unacknowledged records are counted in `dropped`.

A failed write (disk full, EIO, a short write): `append` cuts the segment back to its last whole
record, seals it and raises, so the caller keeps that message elsewhere; a torn record in the
middle of a segment would hide every record after it, in this run and after a restart. The next
append starts a new segment, so even when the cut fails the torn bytes end a segment, where
recovery stops without losing anything after them. A new segment is always a new file (O_EXCL,
O_NOFOLLOW): never one that is there already, nor what a symlink points at.

Files changed under it (the directory or a segment deleted, a segment truncated or replaced by
a directory, a FIFO or a symlink, which are never opened, a read error): the records that can no
longer be read are acknowledged as lost and counted in `unreadable` (one already handed to the MQTT
client may still arrive), never retried forever, so delivery goes on with the next readable record.
The directory (and its lock) is created again when it is gone, at the next new segment or `sync()`;
appends never go on into a deleted segment file (its records could not be read back).

Classes: `Spool` is the running log (append, acknowledge, fsync, and the counters); `_Reader` is its
read-back side (the cursor and the decoded records of the segment being read); `_FsyncTicks` says
which records are due for an fsync; `_Recovery` is what `open` reads of a previous run, once;
`SpoolDirectory` is the directory and its lock. All but `Spool` are called only under the spool's
lock (or in `open`, before anyone else can use it).

Thread-safe: one internal lock, a leaf (no callback, log call or other lock is taken while it is
held: what recovery has to say is logged once `open` has released it), held only for memory and
page-cache work, never for an fsync (except in `open`, before anyone else can use the spool, for a
damaged segment's copy): the MQTT client appends, acks and reads the counters from its network
thread and from every publish, and an fsync on an SD card during an outage can take seconds. fsyncs
run on duplicated descriptors outside it, one sync at a time (`_sync_lock`). `unacked`,
`has_unsent` and `size_bytes` read plain counters, lock-free.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import stat
import struct
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Callable

from ..files import file_type
from ..spooldir import (CORRUPT_INFIX, LOCK_NAME, SEGMENT_SUFFIX, TMP_SUFFIX, Kind, classify, corrupt_number,
                        directory_problem, name_seq, segment_name)

__all__ = ["LOCK_NAME", "SEGMENT_SUFFIX", "NotRegularFile", "Record", "SegmentScan", "Spool", "SpoolRefused",
           "encode_record", "read_segment"]

logger = logging.getLogger(__name__)

#: the size of a segment at which the spool starts the next one (less with a small limit_bytes).
DEFAULT_SEGMENT_BYTES = 4 << 20
#: how many damaged segments moved aside are kept (the oldest beyond are deleted).
CORRUPT_KEPT = 8
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_HEADER = struct.Struct(">II")  # body length, crc32(body)
_BODY = struct.Struct(">QBH")  # seq, flags, topic length
_RETAIN = 0x04
#: a record this large cannot be valid (MQTT payload limit + topic + body header): a corrupt length.
_MAX_BODY = 268435455 + 65535 + _BODY.size


@dataclass(frozen=True)
class Record:
    """One spooled message, as it will be handed to the MQTT client."""

    topic: str
    payload: bytes
    qos: int
    retain: bool


@dataclass
class _Segment:
    """Records in one file have consecutive seqs (appends are serialised), so first and count
    describe them; only the acknowledged ones are remembered one by one."""

    first_seq: int
    path: str
    size: int = 0
    count: int = 0
    acked: set[int] = field(default_factory=set)
    synced_upto: int = 0  # records below this seq are fsynced

    @property
    def end_seq(self) -> int:
        return self.first_seq + self.count

    @property
    def done(self) -> bool:
        return self.count > 0 and len(self.acked) == self.count

    @property
    def unacked(self) -> int:
        return self.count - len(self.acked)


def _is_directory(path: str) -> bool:
    """A directory itself, not a symlink to one."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def encode_record(seq: int, record: Record) -> bytes:
    topic = record.topic.encode("utf-8")
    flags = (record.qos & 0x03) | (_RETAIN if record.retain else 0)
    body = _BODY.pack(seq, flags, len(topic)) + topic + bytes(record.payload)
    return _HEADER.pack(len(body), zlib.crc32(body)) + body


def _decode_body(body: bytes) -> tuple[int, Record]:
    seq, flags, topic_len = _BODY.unpack_from(body)
    start = _BODY.size
    topic = body[start:start + topic_len].decode("utf-8")
    return seq, Record(topic, body[start + topic_len:], flags & 0x03, bool(flags & _RETAIN))


class SpoolRefused(OSError):
    """The directory is not one the spool may use (see `yoloedge.spooldir`); the message says why
    and what to do. An OSError, so the publisher treats it as a spool that cannot be opened."""


class NotRegularFile(OSError):
    """A name of the spool's that is not a regular file: a FIFO, a device, a directory, a symlink."""


def _open_regular(path: str) -> int:
    """A read-only descriptor of the regular file at `path`. Unlike `files.opened_regular` (for files
    an operator names), never follows a symlink; never opens what is not a regular file (opening a
    device can have effects of its own), never blocks (a FIFO renamed into place between lstat and
    open); NotRegularFile for anything else."""
    info = os.lstat(path)
    if not stat.S_ISREG(info.st_mode):
        raise NotRegularFile(f"{path} is {file_type(info.st_mode)}, not a regular file")
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # replaced by a symlink since the lstat
            raise NotRegularFile(f"{path} is a symlink, not a regular file") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
    except BaseException:
        os.close(fd)
        raise
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise NotRegularFile(f"{path} is {file_type(mode)}, not a regular file")
    return fd


def _pread(fd: int, count: int, offset: int) -> bytes:
    """Up to `count` bytes at `offset` (fewer only at the end of the file)."""
    chunks: list[bytes] = []
    while count > 0:
        chunk = os.pread(fd, min(count, 1 << 24), offset)
        if not chunk:
            break
        chunks.append(chunk)
        count -= len(chunk)
        offset += len(chunk)
    return b"".join(chunks)


@dataclass
class SegmentScan:
    """What `read_segment` found: the valid records, the byte offset where they end, the file's
    size, and what ended them before the end of the file (None: nothing, it is intact)."""

    records: list[tuple[int, Record]]
    valid_end: int
    size: int
    damage: str | None


def read_segment(path: str, start: int = 0, *, end: int | None = None, first_seq: int | None = None,
                 starts_below: int | None = None) -> SegmentScan:
    """The records of the segment file at `path` from byte `start` on, read within bounds: never
    past `end` (the bytes the spool wrote; default the file's size), and no record may start at or
    past `starts_below` (a segment is closed once it is that long: a record there is not the
    spool's). Stops at the first record that is torn, fails its CRC, cannot be decoded or is not the
    next seq (`first_seq` for the first one): nothing after it can be trusted to be a record.
    NotRegularFile for what is not a regular file; OSError when it cannot be read."""
    fd = _open_regular(path)
    try:
        size = os.fstat(fd).st_size
        stop = size if end is None else min(end, size)
        return _scan(fd, start, stop, first_seq, starts_below, size)
    finally:
        os.close(fd)


def _scan(fd: int, start: int, stop: int, expect: int | None, starts_below: int | None,
          size: int) -> SegmentScan:
    """See read_segment. Reads the part where records may start in one go, and at most the rest
    of one record beyond it."""
    window_end = stop if starts_below is None else min(stop, max(start, starts_below))
    window = _pread(fd, window_end - start, start)

    def span(lo: int, hi: int) -> bytes:
        if hi - start <= len(window):
            return window[lo - start:hi - start]
        head = window[lo - start:] if lo - start < len(window) else b""
        return head + _pread(fd, hi - lo - len(head), lo + len(head))

    records: list[tuple[int, Record]] = []
    offset = start
    damage: str | None = None
    while offset < stop and damage is None:
        if starts_below is not None and offset >= starts_below:
            damage = f"longer than the largest segment ({starts_below} bytes) from byte {offset} on"
            break
        record, length, damage = _record_at(offset, stop, expect, span)
        if record is not None:
            records.append(record)
            expect = record[0] + 1
            offset += length
    return SegmentScan(records, offset, size, damage)


def _record_at(offset: int, stop: int, expect: int | None,
               span: Callable[[int, int], bytes]) -> tuple[tuple[int, Record] | None, int, str | None]:
    """The record at `offset` and its length on disk, or None and what is wrong with it."""
    header = span(offset, min(stop, offset + _HEADER.size))
    if len(header) < _HEADER.size:
        return None, 0, f"a record cut short at byte {offset}"
    length, crc = _HEADER.unpack(header)
    if length < _BODY.size or length > _MAX_BODY:
        return None, 0, f"a record of impossible length {length} at byte {offset}"
    end = offset + _HEADER.size + length
    if end > stop:
        return None, 0, f"a record cut short at byte {offset}"
    body = span(offset + _HEADER.size, end)
    if len(body) < length:
        return None, 0, f"a record cut short at byte {offset}"
    if zlib.crc32(body) != crc:
        return None, 0, f"a CRC mismatch at byte {offset}"
    try:
        record = _decode_body(body)
    except (UnicodeDecodeError, struct.error):
        return None, 0, f"an undecodable record at byte {offset}"
    if expect is not None and record[0] != expect:
        return None, 0, f"seq {record[0]} at byte {offset} where {expect} was due"
    return record, end - offset, None


class SpoolDirectory:
    """The spool's own directory and the lock that keeps it one process's: whether it may be used
    (`yoloedge.spooldir`), its flock, and making its names durable. Not thread-safe: the spool
    calls it under its `_lock` (or in `open`, before anyone else can use the spool)."""

    def __init__(self, path: str):
        self.path = path
        self.lock_fd: int | None = None  # holds the directory's flock while open

    def intact(self) -> bool:
        """Still ours: the lock file is linked and the directory is one (not a symlink to one)."""
        fd = self.lock_fd
        return fd is not None and os.fstat(fd).st_nlink > 0 and _is_directory(self.path)

    def create_and_take(self) -> None:
        """Create the directory (0700) when it is missing, check it and lock it."""
        os.makedirs(self.path, mode=0o700, exist_ok=True)
        self.check()
        self.take()

    def check(self) -> None:
        """SpoolRefused for a directory that is not the spool's own. The spool's names as something
        else than regular files pass here: recovery skips them."""
        problem = directory_problem(self.path, refuse_not_regular=False)
        if problem is not None:
            raise SpoolRefused(str(problem))

    def take(self) -> None:
        """Lock the directory through `lock`: a regular file, never a link followed or a device
        opened (lstat first; O_NOFOLLOW and fstat against a swap in between)."""
        path = os.path.join(self.path, LOCK_NAME)
        try:
            mode: int | None = os.lstat(path).st_mode
        except FileNotFoundError:
            mode = None
        if mode is not None and not stat.S_ISREG(mode):
            raise SpoolRefused(f"{path} is {file_type(mode)}, not the spool's lock file; remove it")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
                         | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise SpoolRefused(f"{path} is a symlink, not the spool's lock file; remove it") from None
            raise
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                raise SpoolRefused(f"{path} is {file_type(mode)}, not the spool's lock file; remove it")
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise OSError(errno.EBUSY, "in use by another process", self.path) from None
        except BaseException:
            os.close(fd)
            raise
        self.lock_fd = fd

    def release(self) -> None:
        if self.lock_fd is not None:
            fd, self.lock_fd = self.lock_fd, None
            os.close(fd)  # releases the directory for the next run

    def sync(self) -> None:
        """Make a created or deleted file name durable (the file's own fsync does not)."""
        fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        except OSError as exc:  # some filesystems refuse fsync on a directory
            if exc.errno not in (errno.EINVAL, errno.ENOTSUP):
                raise
        finally:
            os.close(fd)


class _Recovery:
    """What `open` finds in the directory a previous run left (the module docstring's
    "Recovery"): the segments to go on with, the damaged ones moved aside and what is skipped.
    Runs once per open, under the spool's `_lock`; what it has to say is logged after (`notes`)."""

    def __init__(self, directory: str, read_bound: int, segments: list[_Segment], size: int,
                 next_seq: int, write_all: Callable[[int, bytes], None],
                 sync_directory: Callable[[], None]):
        self.directory = directory
        self._read_bound = read_bound
        self.segments = segments
        self.bytes = size
        self.next_seq = next_seq
        self._write_all = write_all
        self._sync_directory = sync_directory
        self.discarded_bytes = 0
        self.set_aside: list[str] = []  # names of the damaged segments moved aside
        self.skipped: list[str] = []  # the spool's names that are not regular files, left alone
        self.aside: list[tuple[int, str]] = []  # (K, name) of the moved-aside segments, oldest first
        self.notes: list[tuple[int, str, tuple[object, ...]]] = []  # logged once _lock is released

    def note(self, level: int, message: str, *args: object) -> None:
        self.notes.append((level, message, args))

    def run(self) -> None:
        """Read every segment, oldest first; damaged ones are moved aside (module docstring)."""
        self._finish_interrupted(os.listdir(self.directory))
        names = os.listdir(self.directory)
        self.aside = sorted((corrupt_number(n), n) for n in names if classify(n) is Kind.CORRUPT)
        for name in sorted(n for n in names if classify(n) is Kind.SEGMENT):
            self._recover(name)

    def _finish_interrupted(self, names: list[str]) -> None:
        """A `<name>.tmp` left by a crash while a damaged segment was moved aside: when the original
        is still there the copy starts over; when it was moved aside already, the copy (fsynced
        before that) takes its place."""
        for name in names:
            if classify(name) is not Kind.TMP:
                continue
            tmp = os.path.join(self.directory, name)
            if not stat.S_ISREG(os.lstat(tmp).st_mode):
                self._skip(NotRegularFile(f"{tmp} is not a regular file"), name_seq(name))
                continue
            original = tmp[:-len(TMP_SUFFIX)]
            if os.path.lexists(original):
                os.unlink(tmp)
            else:
                os.rename(tmp, original)
                self.note(logging.INFO, "MQTT: spool %s: %s: the valid records of a damaged segment, copied "
                           "out before a crash, take its place", self.directory, os.path.basename(original))

    def _recover(self, name: str) -> None:
        path = os.path.join(self.directory, name)
        seq = name_seq(name)
        try:
            scan = read_segment(path, first_seq=seq, starts_below=self._read_bound)
        except NotRegularFile as exc:
            self._skip(exc, seq)
            return
        if seq < self.next_seq:
            scan = SegmentScan([], 0, scan.size, f"its seqs overlap those of the segment before it "
                                                 f"(up to {self.next_seq - 1})")
        if scan.damage is not None:
            self._set_aside(name, scan)
        elif scan.records:
            self._add_recovered(path, scan)
        else:
            os.unlink(path)  # empty: created just before a crash, nothing in it

    def _skip(self, exc: NotRegularFile, seq: int) -> None:
        """Leave what is not a regular file as it is, and never create a segment of that name."""
        self.skipped.append(str(exc))
        self.next_seq = max(self.next_seq, seq + 1)
        self.note(logging.WARNING, "MQTT: spool %s: skipped: %s; the spool reads and writes only regular "
                   "files of its own, and leaves this one as it is", self.directory, exc)

    def _add_recovered(self, path: str, scan: SegmentScan) -> None:
        records = scan.records
        self.segments.append(_Segment(records[0][0], path, scan.valid_end, len(records),
                                       synced_upto=records[-1][0] + 1))
        self.bytes += scan.valid_end
        self.next_seq = records[-1][0] + 1

    def _set_aside(self, name: str, scan: SegmentScan) -> None:
        """Move a damaged segment aside as `<name>.corrupt-K`, its valid records copied into a
        fresh segment of the same name first (see the module docstring)."""
        path = os.path.join(self.directory, name)
        tmp = path + TMP_SUFFIX
        if scan.records:
            self._copy_prefix(path, tmp, scan.valid_end)
        number = self.aside[-1][0] + 1 if self.aside else 1
        aside = f"{name}{CORRUPT_INFIX}{number}"
        os.rename(path, os.path.join(self.directory, aside))
        self.aside.append((number, aside))
        if scan.records:
            os.rename(tmp, path)
            self._add_recovered(path, scan)
        self._sync_directory()
        self.set_aside.append(aside)
        self.discarded_bytes += scan.size - scan.valid_end
        self.note(logging.WARNING, "MQTT: spool %s: %s is damaged (%s): moved aside as %s, not deleted; "
                   "%d record(s) before the damage are kept and sent, %d byte(s) from there on are not",
                   self.directory, name, scan.damage, aside, len(scan.records), scan.size - scan.valid_end)
        self._prune_aside()

    def _copy_prefix(self, path: str, tmp: str, length: int) -> None:
        """Copy the first `length` bytes of `path` into the new file `tmp`, fsynced."""
        src = _open_regular(path)
        try:
            dst = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                offset = 0
                while offset < length:
                    chunk = os.pread(src, min(1 << 20, length - offset), offset)
                    if not chunk:
                        raise OSError(errno.EIO, "shorter than when it was read", path)
                    self._write_all(dst, chunk)
                    offset += len(chunk)
                os.fsync(dst)
            except BaseException:
                os.close(dst)
                os.unlink(tmp)  # should this fail, the next open deletes the stale copy
                raise
            os.close(dst)
        finally:
            os.close(src)

    def _prune_aside(self) -> None:
        """Keep the newest CORRUPT_KEPT moved-aside segments: a crash loop must not fill the disk."""
        while len(self.aside) > CORRUPT_KEPT:
            _, name = self.aside.pop(0)
            path = os.path.join(self.directory, name)
            try:
                mode = os.lstat(path).st_mode
            except FileNotFoundError:
                continue
            if stat.S_ISREG(mode):
                os.unlink(path)
                self.note(logging.WARNING, "MQTT: spool %s: deleted %s, the oldest damaged segment moved aside "
                           "(the newest %d are kept)", self.directory, name, CORRUPT_KEPT)


class _Reader:
    """The read-back side of the spool: the cursor (the next seq `read` hands out) and the decoded
    records of the segment being read, so a backlog is read from disk once, not per batch. Used
    under the spool's `_lock`; records that can no longer be read back are given up through
    `lose` (the module docstring's "Files changed under it")."""

    def __init__(self, lose: Callable[[_Segment, int], None]):
        self.cursor = 0  # next seq to hand out by read(); read lock-free by Spool.has_unsent
        self._lose = lose
        self._cache: tuple[_Segment, list[tuple[int, Record]], int] | None = None

    def read(self, segments: list[_Segment], max_records: int, max_bytes: int
             ) -> list[tuple[int, Record]]:
        """See Spool.read."""
        out: list[tuple[int, Record]] = []
        size = 0
        for segment in segments:
            if segment.end_seq <= self.cursor:
                continue
            records = self._records(segment)
            for index in range(max(0, self.cursor - segment.first_seq), len(records)):
                seq, record = records[index]
                if out and (len(out) >= max_records or size + len(record.payload) > max_bytes):
                    return out
                self.cursor = seq + 1
                if seq in segment.acked:
                    continue
                out.append((seq, record))
                size += len(record.payload)
            if len(records) < segment.count:  # the rest could not be read: lost, skip it
                self.cursor = max(self.cursor, segment.end_seq)
            if len(out) >= max_records:
                break
        return out

    def _records(self, segment: _Segment) -> list[tuple[int, Record]]:
        """The segment's records, decoded once: the segment being read is cached, and the open
        one is read on from where the cache ends."""
        cache = self._cache
        if cache is None or cache[0] is not segment:
            cache = self._cache = (segment, [], 0)
        _, records, offset = cache
        if offset < segment.size:
            try:
                scan = read_segment(segment.path, offset, end=segment.size,
                                    first_seq=segment.first_seq + len(records))
                more, offset = scan.records, scan.valid_end
            except OSError:  # deleted, replaced by a directory or a FIFO, a read error
                more = []
            records.extend(more)
            self._cache = (segment, records, offset)
            if offset < segment.size:  # truncated, damaged or unreadable from here on
                self._lose(segment, segment.first_seq + len(records))
        return records

    def deleted(self, segment: _Segment, segments: list[_Segment], next_seq: int) -> None:
        """`segment` is gone (already removed from `segments`): forget its records, and move the
        cursor past it."""
        if self._cache is not None and self._cache[0] is segment:
            self._cache = None
        self.cursor = max(self.cursor, segments[0].first_seq) if segments else next_seq

    def take(self, seq: int) -> bool:
        """See Spool.take."""
        if self.cursor != seq:
            return False
        self.cursor = seq + 1
        return True

    def rewind(self, seq: int, segments: list[_Segment]) -> None:
        """See Spool.rewind."""
        self.cursor = min(self.cursor, max(seq, segments[0].first_seq if segments else seq))


class _FsyncTicks:
    """When records are due for an fsync (the module docstring's "Durability"): at a tick, about
    once per `interval_s`, the records written before the previous tick; at a forced sync, all.
    Used under the spool's `_lock`."""

    def __init__(self, interval_s: float, clock: Callable[[], float]):
        self.interval_s = interval_s
        self._clock = clock
        self._last = clock()
        self._watermark = 0  # the spool's next seq at the last tick: older records are due

    def due(self, segments: list[_Segment], next_seq: int, force: bool,
            descriptor: Callable[[_Segment], int]) -> list[tuple[_Segment, int, int]]:
        """The segments to fsync now, each with the seq its fsync makes durable up to and a
        descriptor of its own (`descriptor`), so the fsync can run while appends and deletions
        go on; none when it is not time for a tick yet. `next_seq`: the spool's next seq."""
        now = self._clock()
        if not force and now - self._last < self.interval_s:
            return []
        due: list[tuple[_Segment, int, int]] = []
        try:
            for segment in segments:
                # fsync only for records still unacknowledged a whole interval after they were
                # written: during an outage every record; on a healthy link none, so no disk writes.
                upto = segment.end_seq if force else min(self._watermark, segment.end_seq)
                seqs = range(max(segment.synced_upto, segment.first_seq), upto)
                if any(seq not in segment.acked for seq in seqs):
                    try:
                        fd = descriptor(segment)
                    except OSError:  # changed under us: Spool._verify_locked sees it next tick
                        continue
                    due.append((segment, segment.end_seq, fd))
                elif seqs:
                    segment.synced_upto = seqs.stop  # all acknowledged: never needs an fsync
        except BaseException:
            for _, _, fd in due:
                os.close(fd)
            raise
        if not force:  # a tick went through (a forced sync is not a tick)
            self._watermark, self._last = next_seq, now
        return due


class Spool:
    """See the module docstring. `open()` before use, `close()` at the end."""

    def __init__(self, directory: str, limit_bytes: int, segment_bytes: int = DEFAULT_SEGMENT_BYTES,
                 fsync_interval_s: float = 1.0, clock: Callable[[], float] = time.monotonic,
                 write: Callable[[int, bytes | memoryview], int] = os.write):
        self.directory = directory
        self.limit_bytes = limit_bytes
        self.segment_bytes = max(1, min(segment_bytes, limit_bytes // 4))
        #: no record of a segment starts past this: the largest segment any spool writes (not only
        #: this one: a lowered limit_bytes must not make the previous run's segments damaged).
        self._read_bound = max(self.segment_bytes, DEFAULT_SEGMENT_BYTES)
        self._ticks = _FsyncTicks(fsync_interval_s, clock)
        self._write = write  # injectable: tests make the disk fill in the middle of a record
        self._lock = threading.Lock()
        self._sync_lock = threading.Lock()  # one sync() at a time; taken before _lock, never under it
        self._segments: list[_Segment] = []  # oldest first; the last one may be open for appends
        self._file: int | None = None  # fd of the open (last) segment
        self._dir = SpoolDirectory(directory)  # its flock, held while open
        self._dir_dirty = False  # a segment was created since the directory's last fsync
        self._next_seq = 0
        self._reader = _Reader(self._lose_locked)
        self._bytes = 0
        self._unacked = 0  # records not acknowledged, kept current under _lock, read without it
        self.recovered = 0
        #: bytes of damaged segments not recovered at open (kept in the files moved aside).
        self.discarded_bytes = 0
        self.set_aside: list[str] = []  # names of the damaged segments moved aside at open
        self.skipped: list[str] = []  # the spool's names that are not regular files, left alone
        self.dropped = 0
        self.unreadable = 0  # records lost because their file changed under the spool
        self._closing = False  # close() began: the directory is not taken again

    # ------------------------------------------------------------------ lifecycle

    def open(self) -> int:
        """Create the directory (0700) or recover what a previous run left; returns the number of
        records recovered, all of which count as not yet sent. SpoolRefused, with nothing touched,
        for a directory that is not the spool's own (see the module docstring)."""
        self._dir.create_and_take()
        self._closing = False
        found = _Recovery(self.directory, self._read_bound, self._segments, self._bytes,
                          self._next_seq, self._write_all, self._dir.sync)
        try:
            with self._lock:
                try:
                    found.run()
                finally:
                    self._segments, self._bytes, self._next_seq = found.segments, found.bytes, found.next_seq
                    self.set_aside, self.skipped = found.set_aside, found.skipped
                    self.discarded_bytes += found.discarded_bytes
                self.recovered = self._unacked = sum(s.count for s in self._segments)
                self._reader.cursor = self._segments[0].first_seq if self._segments else self._next_seq
                return self.recovered
        except BaseException:
            # A lock left behind would make every later open in this process (a reload, its
            # fallback) fail as "in use by another process".
            self._segments, self._bytes, self._next_seq, self._unacked = [], 0, 0, 0
            self._dir.release()
            raise
        finally:
            for level, message, args in found.notes:  # outside _lock, which stays a leaf
                logger.log(level, message, *args)  # (logging takes handler locks)

    def _ensure_directory_locked(self) -> None:
        """Create the directory and take its lock again when someone deleted it (or its lock
        file) while we run: otherwise every new segment would fail, or another process could
        take the new directory. What takes its place must pass the same test as at open.
        Caller holds _lock."""
        if self._dir.intact():
            return
        self._dir.release()
        self._dir.create_and_take()
        self._dir_dirty = True

    def close(self) -> None:
        """fsync and close; unacknowledged records stay on disk for the next run. The files and
        the directory lock are released even when the fsync fails (which is then raised)."""
        with self._lock:
            self._closing = True
        try:
            self.sync(force=True)
        finally:
            with self._lock:
                try:
                    self._close_file()
                finally:
                    self._dir.release()

    # ------------------------------------------------------------------ writing

    def append(self, record: Record) -> int:
        """Write one record (not yet fsynced: see the module docstring); returns its seq."""
        with self._lock:
            seq = self._next_seq
            data = encode_record(seq, record)
            self._make_room(len(data))
            segment, fd = self._writable_segment(seq)
            try:
                self._write_all(fd, data)
            except OSError:
                self._cut_back(segment, fd)
                raise
            segment.size += len(data)
            segment.count += 1
            self._bytes += len(data)
            self._unacked += 1
            self._next_seq += 1
            if segment.size >= self.segment_bytes:
                self._seal()
            return seq

    def _write_all(self, fd: int, data: bytes) -> None:
        """os.write may write less than asked (a disk filling up, a file size limit): go on with
        the rest; a write that makes no progress at all is a failure."""
        view = memoryview(data)
        while view:
            written = self._write(fd, view)
            if written <= 0:
                raise OSError(errno.EIO, f"short write ({len(data) - len(view)} of {len(data)} bytes)")
            view = view[written:]

    def _cut_back(self, segment: _Segment, fd: int) -> None:
        """Undo a record that was not completely written and seal its segment (see the module
        docstring); an empty segment is removed, so its name is free for the next append."""
        try:
            os.ftruncate(fd, segment.size)
        finally:
            self._close_file()
            if segment.count == 0:
                self._delete(segment)

    def _writable_segment(self, seq: int) -> tuple[_Segment, int]:
        if self._file is not None and os.fstat(self._file).st_nlink == 0:
            self._close_file()  # deleted under us: what is written there could not be read back
        if self._file is not None:
            return self._segments[-1], self._file
        self._ensure_directory_locked()
        path = os.path.join(self.directory, segment_name(seq))
        try:  # a new file, never one that is there (whatever it is) or a link followed
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            self._next_seq = seq + 1  # the next append takes the next name
            raise
        self._file = fd
        self._segments.append(_Segment(seq, path))
        self._dir_dirty = True
        return self._segments[-1], fd

    def _seal(self) -> None:
        """Close a full segment; the next append opens a new one. Its fsync is left to the
        ticks, like the open segment's: usually it is acknowledged and deleted before."""
        self._close_file()

    def _close_file(self) -> None:
        if self._file is not None:
            os.close(self._file)
            self._file = None

    def _make_room(self, size: int) -> None:
        """Delete the oldest segments until `size` more bytes fit (always keeps room for one)."""
        while self._segments and self._bytes + size > self.limit_bytes:
            oldest = self._segments[0]
            if oldest is self._segments[-1] and self._file is not None:
                self._close_file()
            self.dropped += oldest.unacked
            self._delete(oldest)

    def _delete(self, segment: _Segment) -> None:
        self._segments.remove(segment)
        self._bytes -= segment.size
        self._unacked -= segment.unacked
        try:
            if stat.S_ISREG(os.lstat(segment.path).st_mode):  # a FIFO, link, directory there is not ours
                os.unlink(segment.path)
        except OSError:
            pass  # gone already
        self._reader.deleted(segment, self._segments, self._next_seq)

    # ------------------------------------------------------------------ reading and acks

    def read(self, max_records: int, max_bytes: int) -> list[tuple[int, Record]]:
        """Up to `max_records` not yet handed out (and not acknowledged), oldest first, about
        `max_bytes` of payload at most (always at least one); advances the cursor past them."""
        with self._lock:
            return self._reader.read(self._segments, max_records, max_bytes)

    def _lose_locked(self, segment: _Segment, from_seq: int) -> None:
        """Give up the records of `segment` from `from_seq` on: count the unacknowledged ones in
        `unreadable` and mark them acknowledged, so sync() deletes the segment once the rest is
        acknowledged. An open segment is sealed: a record appended after the damage could not be
        read back either. Caller holds _lock."""
        for seq in range(max(from_seq, segment.first_seq), segment.end_seq):
            if seq not in segment.acked:
                segment.acked.add(seq)
                self._unacked -= 1
                self.unreadable += 1
        if segment is self._segments[-1] and self._file is not None:
            self._close_file()

    def _verify_locked(self) -> None:
        """Notice segments whose file was deleted or replaced (by something that is not a regular
        file) while we run, and the directory itself gone. Caller holds _lock."""
        for segment in self._segments:
            if segment.done:
                continue
            try:
                if segment is self._segments[-1] and self._file is not None:
                    intact = os.fstat(self._file).st_nlink > 0
                else:
                    intact = stat.S_ISREG(os.lstat(segment.path).st_mode)
            except OSError:
                intact = False
            if not intact:
                self._lose_locked(segment, segment.first_seq)
        if not self._closing:
            self._ensure_directory_locked()

    def take(self, seq: int) -> bool:
        """Hand out `seq` without reading it back (the caller has the record): True when it is
        the next one to hand out, i.e. nothing older is waiting."""
        with self._lock:
            return self._reader.take(seq)

    def rewind(self, seq: int) -> None:
        """Hand out records again from `seq` on (after a lost connection); acknowledged ones are
        skipped by read()."""
        with self._lock:
            self._reader.rewind(seq, self._segments)

    def ack(self, seq: int) -> None:
        """The broker acknowledged `seq`; its segment is deleted by sync() once all are."""
        with self._lock:
            for segment in self._segments:
                if segment.first_seq <= seq < segment.end_seq:
                    if seq not in segment.acked:
                        segment.acked.add(seq)
                        self._unacked -= 1
                    return

    def sync(self, force: bool = False) -> None:
        """Delete fully acknowledged segments; fsync what is due (everything, with `force`).
        The fsyncs run on duplicated descriptors outside _lock (see the module docstring)."""
        with self._sync_lock:
            with self._lock:
                self._verify_locked()
                self._delete_done_locked()
                due = self._ticks.due(self._segments, self._next_seq, force, self._descriptor)
                sync_dir = bool(due) and self._dir_dirty
                self._dir_dirty = self._dir_dirty and not sync_dir
            try:
                for segment, end_seq, fd in due:
                    os.fsync(fd)
                    segment.synced_upto = end_seq  # only sync() uses it, under _sync_lock
                if sync_dir:
                    self._dir.sync()
                    sync_dir = False
            finally:
                for _, _, fd in due:
                    os.close(fd)
                if sync_dir:  # not made durable: the next sync tries again
                    with self._lock:
                        self._dir_dirty = True

    def _delete_done_locked(self) -> None:
        for segment in list(self._segments):
            is_open = segment is self._segments[-1] and self._file is not None
            if segment.done and (not is_open or self._reader.cursor >= self._next_seq):
                if is_open:
                    self._close_file()
                self._delete(segment)

    def _descriptor(self, segment: _Segment) -> int:
        if segment is self._segments[-1] and self._file is not None:
            return os.dup(self._file)
        return _open_regular(segment.path)  # fsync works read-only

    # ------------------------------------------------------------------ counters

    @property
    def fsync_interval_s(self) -> float:
        return self._ticks.interval_s

    @property
    def has_unsent(self) -> bool:
        return self._reader.cursor < self._next_seq and bool(self._segments)

    @property
    def unacked(self) -> int:
        return self._unacked

    @property
    def size_bytes(self) -> int:
        return self._bytes
