"""The durable MQTT outbox (yoloedge/publish/spool.py) on a real filesystem: order, acks,
torn and corrupt tails, the byte limit, and recovery after a process is killed mid-write."""

from __future__ import annotations

import errno
import os
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import zlib
from pathlib import Path

import pytest

from yoloedge.publish.spool import Record, Spool

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


def test_foreign_files_in_the_directory_are_left_alone(tmp_path):
    (tmp_path / "README").write_text("not a segment")
    (tmp_path / f"{0:020d}.seg").write_bytes(os.urandom(64))  # garbage under a segment name
    spool = Spool(str(tmp_path), limit_bytes=1 << 20)
    assert spool.open() == 0 and spool.discarded_bytes == 64
    assert (tmp_path / "README").exists()
    spool.append(_record(1))
    assert [r for _, r in spool.read(10, 1 << 20)] == [_record(1)]
    spool.close()


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


def test_a_failed_recovery_does_not_keep_the_directory_locked(tmp_path):
    (tmp_path / f"{0:020d}.seg").mkdir()  # not a file: recovery fails
    with pytest.raises(OSError):
        Spool(str(tmp_path), limit_bytes=1 << 20).open()
    (tmp_path / f"{0:020d}.seg").rmdir()
    again = Spool(str(tmp_path), limit_bytes=1 << 20)  # the same process tries again (a reload)
    assert again.open() == 0
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
