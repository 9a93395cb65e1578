"""The reader grabs every frame and converts only the ones it keeps, into buffers lent from a pool.

Real OpenCV captures of the shared videos, wrapped in a `VideoFileSource` subclass that counts
what the reader asks of it; the reference frames come from a plain `cv2.VideoCapture.read()`.
"""

from __future__ import annotations

import hashlib
import threading

import cv2
import pytest

from test_sources import STALL_TIMEOUT_S, StateLog, camera
from yoloedge.sources import CameraReader, CameraState, Frame, SinkClosed
from yoloedge.sources import connection as connection_module
from yoloedge.sources.files import VideoFileSource
from yoloedge.sources.framepool import FramePool
from yoloedge.config.sources import Decoder
from yoloedge.sources.imagesize import ImageLimits

H264 = "street_people_720p.mp4"  # H.264 High, 1280x720, 314 frames at 29.97 fps
AVI = "indoor_people_480p_mpeg4.avi"  # MPEG-4 Part 2, 640x480, 84 frames at 15 fps

pytestmark = pytest.mark.shared


class CountingFile(VideoFileSource):
    """A video file read by a real cv2.VideoCapture, counting the grabs and the retrieves."""

    def __init__(self, path: str, loop: bool, camera: str | None = None):
        super().__init__(path, loop, camera)
        self.grabs = 0
        self.retrieves = 0
        self.lent = 0  # retrieves given a buffer to fill

    def grab(self) -> bool:
        self.grabs += 1
        return super().grab()

    def retrieve(self, out=None):
        self.retrieves += 1
        self.lent += out is not None
        return super().retrieve(out)


@pytest.fixture
def counting(monkeypatch):
    """Every source the reader opens is a CountingFile; the list of them."""
    opened: list[CountingFile] = []

    def open_camera(config, *, camera=None, reuse_frame=False, image_limits=None, media=None):
        source = CountingFile(config.url, config.loop, camera)
        opened.append(source)
        return source, Decoder.OPENCV

    monkeypatch.setattr(connection_module, "open_camera", open_camera)
    return opened


class Digests:
    """A sink that is done with each frame when it returns, as the daemon's: it keeps a digest of
    the pixels and where they were."""

    def __init__(self, close_after: int | None = None):
        self.seen: list[tuple[int, str, int]] = []
        self._close_after = close_after
        self._lock = threading.Lock()

    def __call__(self, frame: Frame, timeout_s: float) -> bool:
        with self._lock:
            self.seen.append((frame.seq, hashlib.sha256(frame.image.tobytes()).hexdigest(), frame.image.ctypes.data))
            if self._close_after is not None and len(self.seen) >= self._close_after:
                raise SinkClosed()
        return True


def read_digests(url: str) -> list[str]:
    """Every frame of the file as OpenCV's own read() gives it."""
    cap = cv2.VideoCapture(url)
    digests = []
    try:
        while True:
            ok, image = cap.read()
            if not ok:
                return digests
            digests.append(hashlib.sha256(image.tobytes()).hexdigest())
    finally:
        cap.release()


def run_to(state: CameraState, config, sink, pool: FramePool | None = None, **kwargs) -> CameraReader:
    states = StateLog()
    reader = CameraReader(config, sink, STALL_TIMEOUT_S, on_state=states, pool=pool, **kwargs)
    reader.start()
    try:
        assert states.wait_for(state, 60) is not None, states.states
    finally:
        reader.stop()
        assert reader.join(10)
    return reader


@pytest.mark.parametrize("video", [H264, AVI])
def test_skipped_frames_are_only_grabbed_and_kept_ones_are_the_pixels_read_gives(media, counting, video):
    url = str(media / video)
    expected = read_digests(url)
    sink, pool = Digests(), FramePool()
    reader = run_to(CameraState.ENDED, camera(url, realtime=False, fps=5.0), sink, pool)

    source, = counting
    stats = reader.stats()
    kept = [seq for seq, _, _ in sink.seen]
    assert stats["frames_in"] == len(expected) and stats["frames_out"] == len(kept)
    assert source.grabs == len(expected) + 1  # the last one found the end
    assert source.retrieves == len(kept) == stats["frames_in"] - stats["sampled_out"]
    assert len(kept) < len(expected) / 2  # 15 or 29.97 fps sampled to 5: most frames skipped
    assert [digest for _, digest, _ in sink.seen] == [expected[seq] for seq in kept]  # byte for byte
    # one reader gives each buffer back before it retrieves the next frame: one buffer for all
    assert source.lent == len(kept) and pool.allocated == 1 and pool.in_use() == 0
    assert len({where for _, _, where in sink.seen}) == 1


def test_without_a_pool_every_kept_frame_is_an_array_of_its_own(media, counting):
    """A sink that keeps frames (tests, tools) gets arrays nobody writes to again."""
    url = str(media / AVI)
    frames: list[Frame] = []
    run_to(CameraState.ENDED, camera(url, realtime=False, fps=5.0), lambda f, t: frames.append(f) or True)
    source, = counting
    assert source.lent == 0 and len(frames) == 28
    assert len({f.image.ctypes.data for f in frames}) == 28
    expected = read_digests(url)
    assert [hashlib.sha256(f.image.tobytes()).hexdigest() for f in frames] == expected[::3]


def test_a_frame_over_the_pixel_bound_is_refused_before_it_is_converted(media, counting):
    url = str(media / AVI)
    sink, pool = Digests(), FramePool()
    reader = run_to(CameraState.BACKOFF, camera(url, realtime=False), sink, pool,
                    limits=ImageLimits(max_pixels=640 * 480 - 1))
    assert "640x480 pixels, over the bound" in (reader.stats()["last_error"] or "")
    assert counting and all(source.grabs == 1 and source.retrieves == 0 for source in counting)
    assert not sink.seen and pool.allocated == 0


def test_the_buffer_goes_back_to_the_pool_when_the_sink_closes(media, counting):
    sink, pool = Digests(close_after=3), FramePool()
    run_to(CameraState.STOPPED, camera(str(media / AVI), realtime=False), sink, pool)
    assert len(sink.seen) == 3
    assert pool.in_use() == 0 and pool.idle() == 1


def test_a_frame_s_buffer_is_its_own_until_the_sink_returns(media, counting):
    """Another camera taking a buffer while this one's sink runs never gets the frame's buffer."""
    pool = FramePool()
    clashes: list[int] = []

    def sink(frame: Frame, timeout_s: float) -> bool:
        other = pool.take(frame.image.shape)  # as another camera's reader would, meanwhile
        if other.ctypes.data == frame.image.ctypes.data:
            clashes.append(frame.seq)
        pool.give(other)
        return True

    reader = run_to(CameraState.ENDED, camera(str(media / AVI), realtime=False, fps=5.0), sink, pool)
    assert reader.stats()["frames_out"] == 28 and not clashes
    assert pool.allocated == 2 and pool.in_use() == 0
