"""The durable MQTT outbox (yoloedge/publish/spool.py) on a real filesystem: order, acks,
torn and corrupt tails, the byte limit, and recovery after a process is killed mid-write."""

from __future__ import annotations

import errno
import os
import re
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import zlib
from pathlib import Path

import pytest

from yoloedge.publish.spool import CORRUPT_KEPT, Record, Spool, SpoolRefused, encode_record

REPO = Path(__file__).resolve().parent.parent


def _record(i: int, size: int = 20) -> Record:
    payload = f"{i:06d}".encode() + b"x" * (size - 6)
    return Record(f"t/cam/{i % 3}", payload, 1, i % 2 == 0)


def _segments(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.seg"))


def _on_disk_size(i: int, size: int = 20) -> int:
    """What one record takes on disk, from the documented format (not from the code under test):
    length u32, crc32 u32, seq u64, flags u8, topic length u16, topic, payload."""
    return 4 + 4 + 8 + 1 + 2 + len(_record(i, size).topic.encode()) + size


def test_order_acks_and_directory_mode(tmp_path):
    directory = tmp_path / "nested" / "spool"
    spool = Spool(str(directory), limit_bytes=1 << 20)
    assert spool.open() == 0
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    seqs = [spool.append(_record(i)) for i in range(10)]
    assert seqs == sorted(seqs) and len(set(seqs)) == 10
    got = spool.read(max_records=4, max_bytes=1 << 20)
    assert [r for _, r in got] == [_record(i) for i in range(4)]
    rest = spool.read(max_records=100, max_bytes=1 << 20)
    assert [r for _, r in rest] == [_record(i) for i in range(4, 10)]
    assert not spool.has_unsent and spool.unacked == 10
    for seq, _ in got + rest:
        spool.ack(seq)
    assert spool.unacked == 0
    spool.sync()
    assert _segments(directory) == []  # everything acknowledged: nothing left on disk
    spool.close()


def test_rewind_sends_again_only_what_was_not_acknowledged(tmp_path):
    spool = Spool(str(tmp_path), limit_bytes=1 << 20)
    spool.open()
    seqs = [spool.append(_record(i)) for i in range(6)]
    spool.read(100, 1 << 20)
    spool.ack(seqs[0])
    spool.ack(seqs[2])
    spool.rewind(seqs[1])
    again = spool.read(100, 1 << 20)
    assert [r for _, r in again] == [_record(i) for i in (1, 3, 4, 5)]
    assert spool.take(spool.append(_record(6)))  # nothing older waits: may go straight out
    later = spool.append(_record(7))
    spool.rewind(seqs[1])
    assert not spool.take(later)  # older records wait again: it must not overtake them
    spool.close()


def test_unacknowledged_records_survive_close_and_reopen_in_order(tmp_path):
    spool = Spool(str(tmp_path), limit_bytes=1 << 20, segment_bytes=200)  # several segments
    seqs = [spool.append(_record(i)) for i in range(12)]
    spool.read(3, 1 << 20)
    for seq in seqs[:3]:
        spool.ack(seq)
    spool.sync()
    spool.close()
    assert len(_segments(tmp_path)) > 1

    again = Spool(str(tmp_path), limit_bytes=1 << 20, segment_bytes=200)
    recovered = again.open()
    records = [r for _, r in again.read(100, 1 << 20)]
    # acknowledgements are not persisted: a segment that was only partly acknowledged is sent again
    assert records[-9:] == [_record(i) for i in range(3, 12)]
    assert records == [_record(i) for i in range(12 - len(records), 12)] and recovered == len(records)
    new_seq = again.append(_record(99))
    assert new_seq > max(seqs)  # numbering continues, so names and order stay monotonic
    again.close()


def test_torn_tail_is_cut_off_and_appending_continues(tmp_path):
    spool = Spool(str(tmp_path), limit_bytes=1 << 20)
    spool.open()
    for i in range(3):
        spool.append(_record(i))
    spool.close()
    [segment] = _segments(tmp_path)
    whole = segment.stat().st_size
    assert whole == sum(_on_disk_size(i) for i in range(3))
    with open(segment, "r+b") as f:
        f.truncate(whole - 5)  # the last record half-written, as at a crash

    again = Spool(str(tmp_path), limit_bytes=1 << 20)
    assert again.open() == 2
    assert again.discarded_bytes == _on_disk_size(2) - 5
    assert segment.stat().st_size == _on_disk_size(0) + _on_disk_size(1)
    again.append(_record(7))
    assert [r for _, r in again.read(100, 1 << 20)] == [_record(0), _record(1), _record(7)]
    again.close()


def test_crc_mismatch_discards_the_rest_of_the_segment(tmp_path):
    spool = Spool(str(tmp_path), limit_bytes=1 << 20)
    spool.open()
    for i in range(3):
        spool.append(_record(i))
    spool.close()
    [segment] = _segments(tmp_path)
    data = bytearray(segment.read_bytes())
    second_payload_end = _on_disk_size(0) + _on_disk_size(1) - 1
    data[second_payload_end] ^= 0xFF  # one flipped bit pattern inside record 1's payload
    segment.write_bytes(bytes(data))
    body = bytes(data[_on_disk_size(0) + 8:_on_disk_size(0) + _on_disk_size(1)])
    stored_crc = int.from_bytes(data[_on_disk_size(0) + 4:_on_disk_size(0) + 8], "big")
    assert zlib.crc32(body) != stored_crc  # the test really corrupted it

    again = Spool(str(tmp_path), limit_bytes=1 << 20)
    assert again.open() == 1
    assert [r for _, r in again.read(100, 1 << 20)] == [_record(0)]
    assert again.discarded_bytes == _on_disk_size(1) + _on_disk_size(2)
    again.close()


def test_byte_limit_deletes_the_oldest_segments_and_counts_them(tmp_path):
    limit = 4096
    spool = Spool(str(tmp_path), limit_bytes=limit)
    spool.open()
    count = 200
    for i in range(count):
        spool.append(_record(i, size=40))
    on_disk = sum(p.stat().st_size for p in _segments(tmp_path))
    assert on_disk <= limit and spool.size_bytes == on_disk
    kept = [r for _, r in spool.read(1000, 1 << 20)]
    assert kept == [_record(i, size=40) for i in range(count - len(kept), count)]  # the newest, in order
    assert spool.dropped == count - len(kept) > 0
    spool.close()


def test_records_written_before_kill_9_are_recovered(tmp_path):
    """A process killed without close(): what append() returned for is in the page cache."""
    child = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(REPO)!r})
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_spool import _record
        from yoloedge.publish.spool import Spool
        spool = Spool({str(tmp_path)!r}, limit_bytes=1 << 20, segment_bytes=300, fsync_interval_s=3600)
        spool.open()
        for i in range(25):
            spool.append(_record(i))
        print("written", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL and "written" in proc.stdout, proc.stderr
    again = Spool(str(tmp_path), limit_bytes=1 << 20)
    assert again.open() == 25
    assert [r for _, r in again.read(100, 1 << 20)] == [_record(i) for i in range(25)]
    again.close()


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_fsync_only_for_records_left_unacknowledged_for_an_interval(tmp_path, monkeypatch):
    """The documented policy: a healthy link (acks within the interval) causes no fsync at all;
    during an outage a record is fsynced by the second tick after it was written."""
    synced: list[int] = []
    real_fsync = os.fsync

    def counting_fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", counting_fsync)
    clock = _Clock()
    spool = Spool(str(tmp_path), limit_bytes=1 << 20, segment_bytes=300, fsync_interval_s=1.0,
                  clock=clock)
    spool.open()
    for _tick in range(5):  # healthy: every record acknowledged well within the interval
        for i in range(10):
            seq = spool.append(_record(i))
            assert spool.take(seq)
            spool.ack(seq)
        clock.now += 1.0
        spool.sync()
    assert synced == [] and _segments(tmp_path) == []

    seq = spool.append(_record(1))  # the broker is gone: never acknowledged
    clock.now += 1.0
    spool.sync()  # written after the previous tick: not due yet
    assert synced == []
    clock.now += 1.0
    spool.sync()
    assert synced  # due now (the file, and the directory for its new name)
    count = len(synced)
    clock.now += 1.0
    spool.sync()
    assert len(synced) == count  # nothing new to make durable
    spool.close()
    assert spool.unacked == 1 and seq == 50


def test_one_process_at_a_time(tmp_path):
    first = Spool(str(tmp_path), limit_bytes=1 << 20)
    first.open()
    second = Spool(str(tmp_path), limit_bytes=1 << 20)
    try:
        second.open()
    except OSError as exc:
        assert "in use" in str(exc)
    else:
        raise AssertionError("a second spool opened a directory in use")
    first.close()
    assert second.open() == 0  # free again after close()
    second.close()


class _DiskFills:
    """os.write as on a disk that fills: call `full_after` writes in full, then one short write
    (half the bytes), then ENOSPC for every call until `free()`."""

    def __init__(self, full_after: int) -> None:
        self.left = full_after
        self.short_done = False
        self.full = True

    def free(self) -> None:
        self.full = False

    def __call__(self, fd: int, data) -> int:
        if self.left > 0 or not self.full:
            self.left -= 1
            return os.write(fd, data)
        if not self.short_done:
            self.short_done = True
            return os.write(fd, bytes(data)[:len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_write_that_fails_midway_leaves_no_torn_record(tmp_path):
    """Disk full in the middle of a record: append raises, the partial bytes are cut off, and the
    records before and after it are all readable in this run and after a reopen."""
    write = _DiskFills(full_after=3)
    spool = Spool(str(tmp_path), limit_bytes=1 << 20, write=write)
    spool.open()
    for i in range(3):
        spool.append(_record(i))
    for i in (3, 4):  # the short write, then ENOSPC
        with pytest.raises(OSError) as failed:
            spool.append(_record(i))
        assert failed.value.errno == errno.ENOSPC
    assert sum(p.stat().st_size for p in _segments(tmp_path)) == sum(_on_disk_size(i) for i in range(3))
    assert spool.unacked == 3
    write.free()
    spool.append(_record(5))
    assert [r for _, r in spool.read(100, 1 << 20)] == [_record(i) for i in (0, 1, 2, 5)]
    assert not spool.has_unsent
    spool.close()

    again = Spool(str(tmp_path), limit_bytes=1 << 20)
    assert again.open() == 4 and again.discarded_bytes == 0
    assert [r for _, r in again.read(100, 1 << 20)] == [_record(i) for i in (0, 1, 2, 5)]
    again.close()


def test_a_real_file_size_limit_mid_record_is_cut_back(tmp_path):
    """The kernel's own short write and EFBIG (RLIMIT_FSIZE, in a child process): the record
    that did not fit is not kept, the next one goes to a new segment, nothing is discarded."""
    limit = 5 * _on_disk_size(0) + _on_disk_size(5) // 2  # the sixth record crosses the limit
    child = textwrap.dedent(f"""
        import errno, resource, signal, sys
        sys.path.insert(0, {str(REPO)!r})
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_spool import _record
        from yoloedge.publish.spool import Spool
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        spool = Spool({str(tmp_path)!r}, limit_bytes=1 << 20)
        spool.open()
        resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, resource.RLIM_INFINITY))
        for i in range(8):
            try:
                spool.append(_record(i))
            except OSError as exc:
                print("failed", i, errno.errorcode[exc.errno], flush=True)
        spool.close()
    """)
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["failed", "5", "EFBIG"]
    again = Spool(str(tmp_path), limit_bytes=1 << 20)
    assert again.open() == 7 and again.discarded_bytes == 0
    assert [r for _, r in again.read(100, 1 << 20)] == [_record(i) for i in (0, 1, 2, 3, 4, 6, 7)]
    again.close()


def test_a_failed_recovery_does_not_keep_the_directory_locked(tmp_path, monkeypatch):
    import yoloedge.publish.spool as spool_module

    first = Spool(str(tmp_path), limit_bytes=1 << 20)
    first.open()
    first.append(_record(0))
    first.close()
    real = spool_module.read_segment

    def failing(path, start=0, **bounds):
        raise OSError(errno.EIO, os.strerror(errno.EIO), path)  # the disk fails while recovering

    monkeypatch.setattr(spool_module, "read_segment", failing)
    with pytest.raises(OSError, match="Input/output error"):
        Spool(str(tmp_path), limit_bytes=1 << 20).open()
    monkeypatch.setattr(spool_module, "read_segment", real)
    again = Spool(str(tmp_path), limit_bytes=1 << 20)  # the same process tries again (a reload)
    assert again.open() == 1
    again.close()


def test_a_failing_fsync_at_close_still_releases_the_directory(tmp_path, monkeypatch):
    spool = Spool(str(tmp_path), limit_bytes=1 << 20)
    spool.open()
    spool.append(_record(1))

    def failing_fsync(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError):
        spool.close()
    monkeypatch.undo()
    again = Spool(str(tmp_path), limit_bytes=1 << 20)
    assert again.open() == 1
    again.close()


def test_fsync_does_not_hold_the_spool_lock(tmp_path, monkeypatch):
    """A slow fsync (an SD card during an outage) must not block append, ack or the counters,
    which the MQTT client calls from its network thread and from every publish."""
    entered, release = threading.Event(), threading.Event()
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        entered.set()
        release.wait(30)
        real_fsync(fd)

    spool = Spool(str(tmp_path), limit_bytes=1 << 20)
    spool.open()
    seq = spool.append(_record(1))
    monkeypatch.setattr(os, "fsync", slow_fsync)
    syncing = threading.Thread(target=spool.sync, kwargs={"force": True})
    syncing.start()
    try:
        assert entered.wait(10)
        done = threading.Event()

        def others() -> None:
            spool.ack(seq)
            spool.append(_record(2))
            assert spool.unacked == 1 and spool.has_unsent
            done.set()

        worker = threading.Thread(target=others)
        worker.start()
        assert done.wait(10), "append/ack/unacked waited for an fsync"
    finally:
        release.set()
        syncing.join(10)
    worker.join(10)
    spool.close()


def test_a_deleted_directory_is_created_again_and_its_records_counted_unreadable(tmp_path):
    import shutil

    directory = tmp_path / "spool"
    spool = Spool(str(directory), limit_bytes=1 << 20)
    spool.open()
    for i in range(5):
        spool.append(_record(i))
    shutil.rmtree(directory)
    for i in range(5, 8):
        spool.append(_record(i))  # not into the deleted file: into a new directory
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700 and (directory / "lock").exists()
    spool.sync(force=True)  # notices the deleted segment
    assert spool.unreadable == 5 and spool.unacked == 3
    assert [r for _, r in spool.read(100, 1 << 20)] == [_record(i) for i in range(5, 8)]
    other = Spool(str(directory), limit_bytes=1 << 20)
    with pytest.raises(OSError, match="in use"):  # the new directory is ours, locked
        other.open()
    spool.close()
    again = Spool(str(directory), limit_bytes=1 << 20)
    assert again.open() == 3
    again.close()


def test_a_truncated_segment_loses_only_its_tail_once(tmp_path):
    spool = Spool(str(tmp_path), limit_bytes=1 << 20)
    spool.open()
    for i in range(6):
        spool.append(_record(i))
    [segment] = _segments(tmp_path)
    os.truncate(segment, 3 * _on_disk_size(0))  # records 0-2 stay whole (same size each)
    assert [r for _, r in spool.read(100, 1 << 20)] == [_record(i) for i in range(3)]
    assert spool.unreadable == 3 and spool.unacked == 3 and not spool.has_unsent
    assert spool.read(100, 1 << 20) == [] and spool.unreadable == 3  # counted once, no retry
    seq = spool.append(_record(6))  # the damaged segment is sealed: a new one takes it
    assert len(_segments(tmp_path)) == 2
    assert spool.read(100, 1 << 20) == [(seq, _record(6))]
    spool.close()


# -- only its own files, bounded ------------------------------------------------------------------

def _segment_name(seq: int) -> str:
    """A segment's name as the module docstring gives it: the first seq in 20 digits, `.seg`."""
    return f"{seq:020d}.seg"


def _write_spool(directory: Path, count: int) -> Path:
    """A spool of `count` records (0..count-1), closed; returns its one segment."""
    spool = Spool(str(directory), limit_bytes=1 << 20)
    spool.open()
    for i in range(count):
        spool.append(_record(i))
    spool.close()
    [segment] = _segments(directory)
    return segment


def _in_child(directory: Path, body: str, timeout: float = 60, memory_mib: int = 256) -> list:
    """Run `body` (with `spool`, a Spool on `directory`, and `_record` at hand) in a child process
    and return what it printed as JSON. A hang fails on the timeout instead of hanging the run, and
    the child's address space is capped `memory_mib` above what it holds before `body`, so an
    unbounded read ends in MemoryError rather than in the machine swapping."""
    child = textwrap.dedent("""
        import json, os, resource, sys
        sys.path.insert(0, {repo!r})
        sys.path.insert(0, {tests!r})
        from test_spool import _record
        from yoloedge.publish.spool import Spool
        with open("/proc/self/statm") as f:
            cap = int(f.read().split()[0]) * resource.getpagesize() + {memory} * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        spool = Spool({directory!r}, limit_bytes=1 << 30)
    """).format(repo=str(REPO), tests=str(Path(__file__).parent), memory=memory_mib, directory=str(directory))
    try:
        proc = subprocess.run([sys.executable, "-c", child + textwrap.dedent(body)], capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the spool did not return within {timeout} s (it hangs)")
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json
    return json.loads(proc.stdout.splitlines()[-1])


_OPEN_READ_APPEND = """
    recovered = spool.open()
    payloads = [int(r.payload[:6]) for _, r in spool.read(1000, 1 << 30)]
    seq = spool.append(_record(99))
    spool.close()
    print(json.dumps([recovered, payloads, seq, spool.skipped]))
"""


def test_a_fifo_named_like_a_segment_is_skipped_without_blocking(tmp_path):
    """open() of a FIFO waits for a writer, forever: start-up never got to READY."""
    _write_spool(tmp_path, 2)
    fifo = tmp_path / _segment_name(5)
    os.mkfifo(fifo)
    recovered, payloads, seq, skipped = _in_child(tmp_path, _OPEN_READ_APPEND)
    assert (recovered, payloads) == (2, [0, 1])
    assert seq == 6  # never a segment under the FIFO's name
    assert len(skipped) == 1 and "FIFO" in skipped[0] and fifo.name in skipped[0]
    assert stat.S_ISFIFO(fifo.lstat().st_mode)  # left as it is


def test_a_segment_that_is_a_symlink_to_a_device_is_not_followed(tmp_path):
    """A symlink to /dev/zero was read without end: gigabytes, then MemoryError, at every start."""
    _write_spool(tmp_path, 2)
    link = tmp_path / _segment_name(7)
    link.symlink_to("/dev/zero")
    recovered, payloads, seq, skipped = _in_child(tmp_path, _OPEN_READ_APPEND)
    assert (recovered, payloads, seq) == (2, [0, 1], 8)
    assert len(skipped) == 1 and "symlink" in skipped[0]
    assert os.readlink(link) == "/dev/zero"


def test_a_huge_segment_is_read_only_within_the_segment_bound(tmp_path):
    """A 3 GiB segment (sparse) holds 3 records, then zeros: the records are recovered in bounded
    memory and the file itself is moved aside as it is, not read whole."""
    segment = _write_spool(tmp_path, 3)
    records_end = segment.stat().st_size
    huge = 3 * 1024 ** 3
    os.truncate(segment, huge)
    recovered, payloads, seq, _ = _in_child(tmp_path, _OPEN_READ_APPEND, memory_mib=256)
    assert (recovered, payloads, seq) == (3, [0, 1, 2], 3)
    aside = tmp_path / f"{segment.name}.corrupt-1"
    assert aside.stat().st_size == huge  # moved aside, not truncated
    with open(segment, "rb") as f:
        fresh = f.read()
    with open(aside, "rb") as f:
        assert f.read(records_end) == fresh[:records_end]


def test_a_segment_replaced_by_a_fifo_while_running_is_lost_without_blocking(tmp_path):
    body = """
        spool = Spool(spool.directory, limit_bytes=1 << 20, segment_bytes=1000)
        spool.open()
        for i in range(60):
            spool.append(_record(i))
        first = sorted(n for n in os.listdir(spool.directory) if n.endswith(".seg"))[0]
        os.unlink(os.path.join(spool.directory, first))
        os.mkfifo(os.path.join(spool.directory, first))
        got = [int(r.payload[:6]) for _, r in spool.read(1000, 1 << 30)]
        spool.sync(force=True)  # fsyncs what is unacknowledged: must not open the FIFO either
        spool.close()
        print(json.dumps([got, spool.unreadable]))
    """
    got, unreadable = _in_child(tmp_path, body)
    assert 0 < unreadable < 60 and got == list(range(unreadable, 60))


def test_foreign_files_are_left_alone_and_the_directory_is_refused(tmp_path):
    """A directory that holds anything the spool did not write is not the spool's: nothing in it
    is truncated, deleted or created (not even the lock)."""
    (tmp_path / "README").write_bytes(b"not a segment")
    (tmp_path / _segment_name(0)).write_bytes(os.urandom(64))  # garbage under a segment name
    (tmp_path / "notes").mkdir()
    for path in tmp_path.iterdir():
        os.utime(path, ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))
    before = {p.name: (p.is_dir() or p.read_bytes(), p.stat().st_mtime_ns) for p in tmp_path.iterdir()}
    with pytest.raises(SpoolRefused, match=r"holds files the spool did not write \('README', 'notes'\)"):
        Spool(str(tmp_path), limit_bytes=1 << 20).open()
    after = {p.name: (p.is_dir() or p.read_bytes(), p.stat().st_mtime_ns) for p in tmp_path.iterdir()}
    assert after == before


def test_garbage_under_a_segment_name_is_moved_aside_not_deleted(tmp_path):
    garbage = b"\xff" * 64  # a record length no record can have
    (tmp_path / _segment_name(0)).write_bytes(garbage)
    spool = Spool(str(tmp_path), limit_bytes=1 << 20)
    assert spool.open() == 0 and spool.discarded_bytes == 64
    assert spool.set_aside == [f"{_segment_name(0)}.corrupt-1"]
    assert (tmp_path / spool.set_aside[0]).read_bytes() == garbage
    spool.append(_record(1))
    assert [r for _, r in spool.read(10, 1 << 20)] == [_record(1)]
    spool.close()


def test_a_corrupt_segment_is_moved_aside_and_its_valid_records_recovered(tmp_path, caplog):
    import logging

    caplog.set_level(logging.WARNING, logger="yoloedge")
    segment = _write_spool(tmp_path, 4)
    data = bytearray(segment.read_bytes())
    data[2 * _on_disk_size(0) + 30] ^= 0xFF  # inside record 2's payload: its CRC fails
    segment.write_bytes(bytes(data))
    mtime = segment.stat().st_mtime_ns

    again = Spool(str(tmp_path), limit_bytes=1 << 20)
    assert again.open() == 2
    assert [r for _, r in again.read(100, 1 << 20)] == [_record(0), _record(1)]
    aside = tmp_path / f"{segment.name}.corrupt-1"
    assert aside.read_bytes() == bytes(data) and aside.stat().st_mtime_ns == mtime  # as it was
    assert segment.read_bytes() == bytes(data[:2 * _on_disk_size(0)])  # the valid records, alone
    assert not list(tmp_path.glob("*.tmp"))
    [line] = [r.getMessage() for r in caplog.records if aside.name in r.getMessage()]
    assert f"{tmp_path}: {segment.name} is damaged (a CRC mismatch at byte {2 * _on_disk_size(0)})" in line
    again.close()

    third = Spool(str(tmp_path), limit_bytes=1 << 20)  # nothing damaged is left: nothing moves
    assert third.open() == 2 and third.set_aside == []
    assert aside.read_bytes() == bytes(data)
    third.close()


def _raw_segment(directory: Path, name_seq: int, seqs: list[int]) -> None:
    """A segment file named for `name_seq` holding records with these seqs, in the documented
    format (encode_record is that format's one implementation; its bytes are checked against the
    documented sizes in the tests above)."""
    data = b"".join(encode_record(seq, _record(seq)) for seq in seqs)
    (directory / _segment_name(name_seq)).write_bytes(data)


def test_seqs_out_of_order_or_overlapping_are_damage_that_keeps_the_rest(tmp_path):
    _raw_segment(tmp_path, 0, [0, 1, 3])  # a gap: 0 and 1 are kept
    _raw_segment(tmp_path, 1, [1])  # overlaps the valid part of the one before
    _raw_segment(tmp_path, 10, [11, 12])  # does not start with the seq in its name
    _raw_segment(tmp_path, 20, [20, 21])  # intact
    spool = Spool(str(tmp_path), limit_bytes=1 << 20)
    assert spool.open() == 4
    assert [seq for seq, _ in spool.read(100, 1 << 20)] == [0, 1, 20, 21]
    assert sorted(spool.set_aside) == [f"{_segment_name(0)}.corrupt-1", f"{_segment_name(1)}.corrupt-2",
                                       f"{_segment_name(10)}.corrupt-3"]
    assert spool.append(_record(22)) == 22
    spool.close()


def test_the_moved_aside_segments_are_bounded(tmp_path):
    """A crash loop that damages a segment at every start must not fill the disk: the newest
    CORRUPT_KEPT moved-aside files are kept."""
    runs = CORRUPT_KEPT + 3
    for run in range(runs):
        (tmp_path / _segment_name(0)).write_bytes(b"\xff" * 64)
        spool = Spool(str(tmp_path), limit_bytes=1 << 20)
        spool.open()
        assert spool.set_aside == [f"{_segment_name(0)}.corrupt-{run + 1}"]
        spool.close()
    kept = sorted(int(p.name.rsplit("-", 1)[1]) for p in tmp_path.glob("*.corrupt-*"))
    assert kept == list(range(runs - CORRUPT_KEPT + 1, runs + 1))
    assert Spool(str(tmp_path), limit_bytes=1 << 20).open() == 0  # none of them counts as a segment


@pytest.mark.parametrize("crashed", ["before the original was moved", "after the original was moved"])
def test_a_crash_while_a_segment_is_moved_aside_loses_nothing(tmp_path, crashed):
    """The documented steps: the valid records are copied to `<name>.tmp` (fsynced), the original
    is renamed to `<name>.corrupt-K`, the copy to `<name>`. A crash between them loses nothing."""
    segment = _write_spool(tmp_path, 3)
    data = segment.read_bytes()
    valid = data[:2 * _on_disk_size(0)]
    tmp = tmp_path / f"{segment.name}.tmp"
    tmp.write_bytes(valid)
    if crashed == "before the original was moved":
        segment.write_bytes(data[:-3])  # torn third record
    else:
        segment.rename(tmp_path / f"{segment.name}.corrupt-1")
    spool = Spool(str(tmp_path), limit_bytes=1 << 20)
    assert spool.open() == 2
    assert [r for _, r in spool.read(100, 1 << 20)] == [_record(0), _record(1)]
    assert not tmp.exists() and segment.read_bytes() == valid
    assert len(list(tmp_path.glob("*.corrupt-*"))) == 1
    spool.close()


@pytest.mark.parametrize("case", ["symlink", "fifo"])
def test_a_lock_file_that_is_not_a_regular_file_is_refused(tmp_path, case):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    directory = tmp_path / "spool"
    directory.mkdir(mode=0o700)
    if case == "symlink":
        (directory / "lock").symlink_to(elsewhere / "target")
    else:
        os.mkfifo(directory / "lock")
    with pytest.raises(SpoolRefused, match="not the spool's lock file"):
        Spool(str(directory), limit_bytes=1 << 20).open()
    assert not (elsewhere / "target").exists()  # a symlink is not followed, not even to create
    assert (directory / "lock").is_symlink() if case == "symlink" else stat.S_ISFIFO((directory / "lock").lstat().st_mode)


@pytest.mark.parametrize("case", ["symlink", "world-writable", "foreign owner"])
def test_a_directory_that_others_control_is_refused(tmp_path, case):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    directory = real
    if case == "symlink":
        directory = tmp_path / "link"
        directory.symlink_to(real)
        words = re.escape(f"is a symbolic link (to {real})")
    elif case == "world-writable":
        real.chmod(0o777)
        words = "writable by every user"
    else:
        if os.geteuid() != 0:
            pytest.skip("giving a directory to another user needs root")
        os.chown(real, 65534, 65534)
        words = "owned by uid 65534"
    with pytest.raises(SpoolRefused, match=words):
        Spool(str(directory), limit_bytes=1 << 20).open()
    assert list(real.iterdir()) == []  # not even the lock
