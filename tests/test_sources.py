"""Camera sources and the per-camera reader: files, folders, RTSP, MJPEG, failures and recovery.

The RTSP cases run a real GStreamer RTSP server (tests/servers/rtsp_server.py) and kill, freeze
(SIGSTOP) and restart it; timeouts are shortened so the whole module runs in well under 90 s.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, replace

import cv2
import numpy as np
import pytest

from fixtures_media import free_port
from yoloedge.config.schema import CameraConfig
from yoloedge.pipeline.queues import FrameQueue
from yoloedge.sources import CameraReader, CameraState, Frame
from yoloedge.sources import connection as connection_module
from yoloedge.sources.base import SourceError, SourceKind, source_kind
from yoloedge.sources.opening import open_source
from yoloedge.sources.delivery import IndexSampler, TimeSampler

AVI = "indoor_people_480p_mpeg4.avi"  # 84 frames, 640x480, 15 fps
STALL_TIMEOUT_S = 2.0

pytestmark = pytest.mark.shared


# -- helpers -----------------------------------------------------------------------------------
def camera(url: str, name: str = "cam", **overrides) -> CameraConfig:
    """A camera with test-sized timeouts and backoff."""
    settings = dict(open_timeout_s=2.0, read_timeout_s=1.0, backoff_initial_s=0.2, backoff_max_s=1.0)
    settings.update(overrides)
    return CameraConfig(name=name, url=str(url), **settings)


@dataclass(frozen=True)
class Seen:
    seq: int
    shape: tuple[int, ...]
    mono: float
    image: np.ndarray | None
    time: float = 0.0  # Frame.time: the media time for files


class Collector:
    """Consumes a camera's queue in the background, as the preparers would; the reader's sink is
    the queue's put, as in the daemon."""

    def __init__(self, name: str = "cam", size: int = 2, lossless: bool = False, keep_images: int = 0,
                 delay_s: float = 0.0):
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.queue = FrameQueue(name, size, lossless, self.lock, self.cond)
        self.seen: list[Seen] = []
        self._keep_images = keep_images
        self._delay_s = delay_s
        self._running = True
        self._thread = threading.Thread(target=self._consume, daemon=True)
        self._thread.start()

    def _consume(self) -> None:
        while self._running:
            with self.cond:
                frame = self.queue.get_nowait()
                if frame is None:
                    self.cond.wait(0.05)
                    continue
            self._record(frame)
            if self._delay_s:
                time.sleep(self._delay_s)

    def _record(self, frame: Frame) -> None:
        image = frame.image if len(self.seen) < self._keep_images else None
        self.seen.append(Seen(frame.seq, frame.image.shape, frame.capture_mono, image, frame.time))

    @property
    def seqs(self) -> list[int]:
        return [s.seq for s in self.seen]

    def wait_count(self, count: int, timeout: float) -> bool:
        return wait_until(lambda: len(self.seen) >= count, timeout)

    def close(self) -> None:
        self._running = False
        self._thread.join(2)


class StateLog:
    """Records on_state calls with the time they happened."""

    def __init__(self):
        self.events: list[tuple[float, str, CameraState, str | None]] = []
        self._lock = threading.Lock()

    def __call__(self, camera: str, state: CameraState, reason: str | None) -> None:
        with self._lock:
            self.events.append((time.monotonic(), camera, state, reason))

    @property
    def states(self) -> list[CameraState]:
        with self._lock:
            return [e[2] for e in self.events]

    def wait_for(self, state: CameraState, timeout: float, after: float = 0.0) -> float | None:
        """The time `state` was entered (at or after `after`), or None on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                hits = [t for t, _, s, _ in self.events if s is state and t >= after]
            if hits:
                return hits[0]
            time.sleep(0.02)
        return None


def wait_until(predicate, timeout: float, interval: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


@pytest.fixture
def run_reader():
    """start(config, collector, stall_timeout_s=2) -> (reader, state log); stopped after the test."""
    started: list[tuple[CameraReader, Collector]] = []

    def start(config: CameraConfig, collector: Collector, stall_timeout_s: float = STALL_TIMEOUT_S):
        states = StateLog()
        reader = CameraReader(config, collector.queue.put, stall_timeout_s, on_state=states)
        started.append((reader, collector))
        reader.start()
        return reader, states

    yield start
    for reader, collector in started:
        reader.stop()
    for reader, collector in started:
        reader.join(5)
        collector.close()


# -- sampling (no I/O) ---------------------------------------------------------------------------
def test_time_sampler_gives_the_configured_rate_from_a_faster_camera():
    sampler = TimeSampler(10.0)
    kept = [t for t in np.arange(0, 10, 0.04) if sampler.keep(0, float(t))]  # 25 fps for 10 s
    assert 99 <= len(kept) <= 101
    assert min(np.diff(kept)) >= 0.079  # never two frames of one 40 ms camera period


def test_index_sampler_keeps_evenly_spaced_frames():
    sampler = IndexSampler(15.0, 5.0)
    assert [i for i in range(15) if sampler.keep(i, 0.0)] == [0, 3, 6, 9, 12]
    sampler = IndexSampler(29.97, 10.0)
    assert sum(sampler.keep(i, 0.0) for i in range(2997)) == 1000


def test_source_kind_by_url(tmp_path):
    assert source_kind("rtsp://u:p@cam/x") is SourceKind.RTSP
    assert source_kind("RTSPS://cam/x") is SourceKind.RTSP
    assert source_kind("https://cam/mjpg") is SourceKind.HTTP
    assert source_kind("/dev/video0") is SourceKind.V4L2
    assert source_kind(str(tmp_path)) is SourceKind.FOLDER
    assert source_kind(f"file://{tmp_path}/x.mp4") is SourceKind.FILE
    with pytest.raises(Exception, match="unsupported"):
        source_kind("gopher://u:secret@host/")


def test_file_source_reports_fps_and_eof(media):
    source = open_source(str(media / AVI))
    try:
        assert not source.is_live and source.nominal_fps == pytest.approx(15.0)
        count = 0
        while source.read() is not None:
            count += 1
        assert count == 84 and source.eof and source.error is None
    finally:
        source.release()


def test_missing_v4l2_device_does_not_open():
    with pytest.raises(SourceError, match="/dev/video99"):
        open_source("/dev/video99")


def test_unsupported_url_fails_at_once_without_retrying(run_reader):
    reader, states = run_reader(camera("gopher://u:pw@host/x"), Collector())  # max_retries 0: forever
    assert states.wait_for(CameraState.FAILED, 3)
    assert states.states == [CameraState.CONNECTING, CameraState.FAILED]
    assert "://***@" in reader.stats()["error"]


# -- files and folders ---------------------------------------------------------------------------
def test_file_not_realtime_delivers_every_frame_once_in_order(media, run_reader):
    collector = Collector(size=4, lossless=True, delay_s=0.001)
    reader, states = run_reader(camera(media / AVI, realtime=False), collector)
    assert states.wait_for(CameraState.ENDED, 20)
    assert collector.wait_count(84, 5)
    assert collector.seqs == list(range(84))
    assert {s.shape for s in collector.seen} == {(480, 640, 3)}
    stats = reader.stats()
    assert (stats["frames_in"], stats["frames_out"], collector.queue.dropped, stats["sampled_out"]) == (84, 84, 0, 0)
    assert states.states == [CameraState.CONNECTING, CameraState.STREAMING, CameraState.ENDED]
    assert reader.join(5)


def test_file_with_loop_restarts_and_keeps_counting_seq(media, run_reader):
    collector = Collector(size=4, lossless=True, keep_images=100)
    reader, states = run_reader(camera(media / AVI, realtime=False, loop=True), collector)
    assert collector.wait_count(200, 20)
    reader.stop()
    assert reader.join(5)
    seqs = collector.seqs
    assert seqs == list(range(len(seqs)))  # lossless: no gaps, no repeats, across the restarts
    first, after_restart = collector.seen[0].image, collector.seen[84].image
    assert np.array_equal(first, after_restart)  # frame 84 is frame 0 again
    # read far faster than its 15 fps, yet its frames' times are the file's own, going on in
    # media time across the restarts: what tracking runs on
    times = np.array([s.time for s in collector.seen[:200]])
    assert np.allclose(times - times[0], np.arange(200) / 15.0, atol=1e-3)
    assert abs(times[0] - time.time()) < 60  # counted from the wall clock when the file opened
    assert CameraState.ENDED not in states.states and reader.state is CameraState.STOPPED


def test_file_realtime_is_paced_at_the_files_frame_rate(media, run_reader):
    collector = Collector()
    reader, _ = run_reader(camera(media / AVI), collector)  # realtime defaults to on for files
    assert collector.wait_count(1, 5)
    start = collector.seen[0].mono
    assert collector.wait_count(31, 10)
    elapsed = collector.seen[30].mono - start  # 30 frame periods at 15 fps = 2.0 s
    assert 1.6 < elapsed < 3.0
    assert collector.queue.dropped == 0  # a consumer keeping up never loses paced frames


def test_fps_sampling_by_frame_index_for_files(media, run_reader):
    collector = Collector(size=4, lossless=True)
    reader, states = run_reader(camera(media / AVI, realtime=False, fps=5.0), collector)
    assert states.wait_for(CameraState.ENDED, 20)
    assert collector.wait_count(28, 5)
    assert collector.seqs == list(range(0, 84, 3))  # 15 fps -> 5 fps: every third frame
    stats = reader.stats()
    assert stats["sampled_out"] == 56 and stats["frames_in"] == 84


def test_realtime_file_sampled_to_lower_fps(media, run_reader):
    collector = Collector()
    reader, _ = run_reader(camera(media / AVI, fps=5.0), collector)
    assert collector.wait_count(1, 5)
    time.sleep(2.0)
    seqs = collector.seqs
    assert 8 <= len(seqs) <= 13  # about 5 fps over ~2 s
    assert all(s % 3 == 0 for s in seqs)


def test_lossless_reader_blocked_by_full_queue_is_not_a_stall(media, run_reader):
    collector = Collector(size=1, lossless=True, delay_s=1.5)  # a very slow accelerator
    reader, states = run_reader(camera(media / AVI, realtime=False), collector, stall_timeout_s=1.0)
    time.sleep(3.5)
    assert reader.stats()["stalls"] == 0
    assert reader.state is CameraState.STREAMING
    assert CameraState.STALLED not in states.states


def test_image_folder_source(media, tmp_path, run_reader):
    os.symlink(media / "bus.jpg", tmp_path / "a_bus.jpg")  # linked, not copied
    (tmp_path / "b_broken.jpg").write_bytes(b"not a jpeg")  # skipped with a warning
    os.symlink(media / "zidane.jpg", tmp_path / "c_zidane.jpg")
    cv2.imwrite(str(tmp_path / "d_gray.png"), np.full((48, 64, 3), 128, np.uint8))
    (tmp_path / "notes.txt").write_text("not an image")
    collector = Collector(size=2, lossless=True)
    reader, states = run_reader(camera(tmp_path, realtime=False), collector)
    assert states.wait_for(CameraState.ENDED, 10)
    assert collector.wait_count(3, 5)
    bus, zidane = cv2.imread(str(media / "bus.jpg")), cv2.imread(str(media / "zidane.jpg"))
    assert [s.shape for s in collector.seen] == [bus.shape, zidane.shape, (48, 64, 3)]
    assert collector.seqs == [0, 1, 2]


def test_image_folder_with_loop_starts_again(media, tmp_path, run_reader):
    os.symlink(media / "bus.jpg", tmp_path / "1.jpg")
    os.symlink(media / "zidane.jpg", tmp_path / "2.jpg")
    collector = Collector(size=2, lossless=True)
    reader, _ = run_reader(camera(tmp_path, realtime=False, loop=True), collector)
    assert collector.wait_count(5, 10)
    shapes = [s.shape for s in collector.seen[:5]]
    assert shapes[0] == shapes[2] == shapes[4] != shapes[1] == shapes[3]
    assert collector.seqs[:5] == [0, 1, 2, 3, 4]


def test_missing_file_backs_off_then_fails(tmp_path, run_reader):
    collector = Collector()
    reader, states = run_reader(camera(tmp_path / "nope.mp4", max_retries=2), collector)
    assert states.wait_for(CameraState.FAILED, 5)
    assert "no such file" in reader.stats()["error"]
    assert reader.join(2)


# -- RTSP ------------------------------------------------------------------------------------------
def test_rtsp_stream_delivers_frames_of_the_right_size(rtsp_server, run_reader):
    collector = Collector()
    reader, states = run_reader(camera(rtsp_server.url()), collector)
    assert states.wait_for(CameraState.STREAMING, 10)
    assert collector.wait_count(20, 10)
    assert {s.shape for s in collector.seen} == {(720, 1280, 3)}
    seqs = collector.seqs
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    stats = reader.stats()
    assert stats["last_frame_age_s"] is not None and stats["last_frame_age_s"] < 1.0
    assert stats["frames_in"] >= 20 and stats["reconnects"] == 0


def test_rtsp_server_killed_then_restarted_streams_again(rtsp_server, run_reader):
    collector = Collector()
    reader, states = run_reader(camera(rtsp_server.url()), collector)
    assert states.wait_for(CameraState.STREAMING, 10)
    killed = time.monotonic()
    rtsp_server.kill()
    assert wait_until(lambda: reader.state is not CameraState.STREAMING, 5)
    assert reader.state in (CameraState.STALLED, CameraState.BACKOFF, CameraState.CONNECTING)
    time.sleep(1.0)  # a few refused reconnects
    restarted = time.monotonic()
    rtsp_server.restart()
    back = states.wait_for(CameraState.STREAMING, 10, after=restarted)
    assert back is not None, states.events
    count = len(collector.seen)
    assert collector.wait_count(count + 10, 5)  # and frames flow again
    assert reader.stats()["reconnects"] >= 1
    left = min(t for t, _, s, _ in states.events if t >= killed)
    print(f"left streaming {left - killed:.2f} s after kill; streaming again {back - restarted:.2f} s after restart")


def utc_seconds(timestamp: str) -> float:
    """Epoch seconds of a status timestamp (2026-11-29T19:38:21.123Z)."""
    from datetime import datetime, timezone
    return datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp()


def test_a_recovered_camera_shows_its_failure_as_past_with_its_time(mjpeg_server, run_reader):
    """While the camera is down `error` says why, and so does `last_error`, with `last_error_at`;
    streaming again, `error` is null and the failure stays in `last_error` with its time."""
    reader, states = run_reader(camera(mjpeg_server.url, backoff_initial_s=0.1, backoff_max_s=0.2), Collector())
    assert states.wait_for(CameraState.STREAMING, 5)
    assert reader.stats()["error"] is None and reader.stats()["last_error"] is None
    went_down = time.time()
    mjpeg_server.stop()
    assert wait_until(lambda: reader.stats()["error"] is not None, 10), reader.stats()
    down = reader.stats()
    assert down["state"] != "streaming" and down["last_error"] == down["error"], down
    mjpeg_server.start()
    restarted = time.monotonic()
    assert states.wait_for(CameraState.STREAMING, 10, after=restarted), states.events
    back_at = time.time()
    up = reader.stats()
    assert up["state"] == "streaming" and up["error"] is None, up
    assert up["last_error"] and "://127.0.0.1:" in up["last_error"], up
    assert went_down - 0.01 <= utc_seconds(up["last_error_at"]) <= back_at, (went_down, up["last_error_at"], back_at)


def test_rtsp_server_frozen_is_a_stall_and_recovers_after_sigcont(rtsp_server, run_reader):
    collector = Collector()
    reader, states = run_reader(camera(rtsp_server.url()), collector)
    assert states.wait_for(CameraState.STREAMING, 10)
    assert collector.wait_count(10, 5)
    frozen = time.monotonic()
    rtsp_server.freeze()
    stalled = states.wait_for(CameraState.STALLED, STALL_TIMEOUT_S + 2.0, after=frozen)
    assert stalled is not None, states.events
    assert reader.stats()["stalls"] == 1
    time.sleep(1.0)  # reconnects time out against the frozen server meanwhile
    resumed = time.monotonic()
    rtsp_server.resume()
    back = states.wait_for(CameraState.STREAMING, 10, after=resumed)
    assert back is not None, states.events
    count = len(collector.seen)
    assert collector.wait_count(count + 10, 5)
    print(f"stall detected {stalled - frozen:.2f} s after SIGSTOP; streaming {back - resumed:.2f} s after SIGCONT")


def test_unreachable_url_backs_off_with_growing_delays_then_fails(run_reader):
    collector = Collector()
    config = camera(f"rtsp://127.0.0.1:{free_port()}/stream", backoff_initial_s=0.2, backoff_max_s=5.0,
                    max_retries=4)
    reader, states = run_reader(config, collector)
    assert states.wait_for(CameraState.FAILED, 10), states.events
    events = states.events
    backoffs = [t for t, _, s, _ in events if s is CameraState.BACKOFF]
    connects = [t for t, _, s, _ in events if s is CameraState.CONNECTING]
    assert len(connects) == 4 and len(backoffs) == 3  # 4 failed attempts, then failed
    delays = [c - b for b, c in zip(backoffs, connects[1:])]
    assert delays[0] == pytest.approx(0.2, abs=0.1)
    assert delays[0] < delays[1] < delays[2]  # doubling beats +/-20% jitter
    assert reader.stats()["reconnects"] == 3
    assert reader.join(2)


# -- MJPEG over HTTP ------------------------------------------------------------------------------
def test_mjpeg_over_http_streams_and_samples_to_fps(mjpeg_server, run_reader):
    collector = Collector()
    reader, states = run_reader(camera(mjpeg_server.url, fps=5.0), collector)
    assert states.wait_for(CameraState.STREAMING, 5)
    time.sleep(3.0)
    stats = reader.stats()
    assert {s.shape for s in collector.seen} == {(480, 640, 3)}
    assert 3.5 <= stats["fps_out"] <= 6.0, stats
    assert 11.0 <= stats["fps_in"] <= 17.0, stats
    assert stats["sampled_out"] > 0


def test_mjpeg_server_frozen_is_a_stall(mjpeg_server, run_reader):
    collector = Collector()
    reader, states = run_reader(camera(mjpeg_server.url), collector)
    assert states.wait_for(CameraState.STREAMING, 5)
    frozen = time.monotonic()
    mjpeg_server.freeze()
    assert states.wait_for(CameraState.STALLED, STALL_TIMEOUT_S + 2.0, after=frozen), states.events
    mjpeg_server.resume()
    assert states.wait_for(CameraState.STREAMING, 10, after=frozen)


# -- isolation, safety, control ---------------------------------------------------------------------
def test_a_broken_camera_does_not_slow_another(mjpeg_server_factory, run_reader):
    good_server = mjpeg_server_factory(fps=15.0)
    hung_server = mjpeg_server_factory(fps=15.0)
    good, good_states = run_reader(camera(good_server.url, name="good"), Collector("good"))
    hung, hung_states = run_reader(camera(hung_server.url, name="hung"), Collector("hung"))
    refused, _ = run_reader(camera(f"rtsp://127.0.0.1:{free_port()}/x", name="refused"), Collector("refused"))
    assert hung_states.wait_for(CameraState.STREAMING, 5)
    hung_server.freeze()  # its reader now blocks in read() and gets abandoned
    assert good_states.wait_for(CameraState.STREAMING, 5)
    time.sleep(3.0)
    assert hung_states.wait_for(CameraState.STALLED, 3.0), hung_states.events
    assert good.state is CameraState.STREAMING
    assert good.stats()["fps_in"] >= 12.0, good.stats()
    assert good.stats()["stalls"] == 0
    assert refused.state in (CameraState.BACKOFF, CameraState.CONNECTING)


def test_credentials_never_appear_in_logs_states_or_stats(mjpeg_server, run_reader, caplog):
    secret = "s3cr3t-pw"
    caplog.set_level(logging.DEBUG, logger="yoloedge")
    working_url = mjpeg_server.url.replace("http://", f"http://viewer:{secret}@")
    refused_url = f"rtsp://admin:{secret}@127.0.0.1:{free_port()}/stream"
    working, working_states = run_reader(camera(working_url, name="ok"), Collector("ok"))
    refused, refused_states = run_reader(camera(refused_url, name="bad", max_retries=2), Collector("bad"))
    assert working_states.wait_for(CameraState.STREAMING, 5)
    assert refused_states.wait_for(CameraState.FAILED, 10)
    texts = [r.getMessage() for r in caplog.records]
    texts += [repr(e) for e in working_states.events + refused_states.events]
    texts += [repr(working.stats()), repr(refused.stats())]
    assert not [t for t in texts if secret in t]
    assert "://***@" in refused.stats()["url"] and "://***@" in refused.stats()["error"]
    assert any(getattr(r, "camera", None) == "bad" for r in caplog.records)  # journald's CAMERA=


def test_disabled_camera_never_opens(monkeypatch, media, run_reader):
    opened = []
    monkeypatch.setattr(connection_module, "open_camera", lambda *a, **k: opened.append(a))
    reader, states = run_reader(replace(camera(media / AVI), enabled=False), Collector())
    time.sleep(0.3)
    assert states.states == [CameraState.DISABLED] and reader.state is CameraState.DISABLED
    assert opened == [] and reader.stats()["frames_in"] == 0
    assert reader.join(0.1)
    reader.stop()
    assert reader.state is CameraState.STOPPED


def test_stop_during_backoff_returns_promptly(run_reader):
    collector = Collector()
    config = camera(f"rtsp://127.0.0.1:{free_port()}/x", backoff_initial_s=30.0, backoff_max_s=60.0)
    reader, states = run_reader(config, collector)
    assert states.wait_for(CameraState.BACKOFF, 5)
    started = time.monotonic()
    reader.stop()
    reader.stop()  # idempotent
    assert reader.join(2.0)
    assert time.monotonic() - started < 0.5
    assert states.states[-1] is CameraState.STOPPED and states.states.count(CameraState.STOPPED) == 1


def test_stop_while_a_read_is_blocked_returns_promptly(mjpeg_server, run_reader):
    collector = Collector()
    reader, states = run_reader(camera(mjpeg_server.url, read_timeout_s=3.0), collector, stall_timeout_s=10.0)
    assert states.wait_for(CameraState.STREAMING, 5)
    mjpeg_server.freeze()
    time.sleep(0.5)  # the capture thread is now inside read(), for up to 3 s
    started = time.monotonic()
    reader.stop()
    assert reader.join(1.0) and time.monotonic() - started < 0.5
    queued = len(collector.queue) + len(collector.seen)
    assert wait_until(lambda: reader.open_captures() == 0, 5)  # it released its capture itself
    assert len(collector.queue) + len(collector.seen) == queued  # and queued nothing after join()


def test_stop_before_start_never_opens(media):
    collector = Collector()
    states = StateLog()
    reader = CameraReader(camera(media / AVI), collector.queue.put, 2.0, on_state=states)
    reader.stop()
    reader.start()
    assert reader.state is CameraState.STOPPED and states.states == [CameraState.STOPPED]
    assert reader.join(0.1)
    collector.close()


def test_closed_queue_stops_the_reader(media, run_reader):
    collector = Collector(size=1, lossless=True, delay_s=10.0)
    reader, states = run_reader(camera(media / AVI, realtime=False), collector)
    assert states.wait_for(CameraState.STREAMING, 5)
    collector.queue.close()  # what the daemon does when it removes the camera
    assert states.wait_for(CameraState.STOPPED, 3), states.events
    assert reader.join(2)
