"""Opening sources (opening.py, opencv.py, synthetic.py): FFmpeg decoder threads per camera, and the synthetic source.

The decoder-thread tests count the process's real threads while real OpenCV/FFmpeg decodes the
shared videos. The synthetic source's pacing is tested with an injected clock and sleep, so no
test depends on how busy the machine is.
"""

from __future__ import annotations

import hashlib
import logging
import os

import cv2
import numpy as np
import pytest

from yoloedge.config.sources import parse_synthetic_url, synthetic_image_problem
from yoloedge.sources import opencv
from yoloedge.sources.base import SourceError, SourceKind, UnsupportedSourceError, source_kind
from yoloedge.sources.opencv import decode_thread_params
from yoloedge.sources.opening import open_source
from yoloedge.sources.synthetic import SyntheticSource, textured_frame

H264 = "street_people_720p.mp4"  # H.264 High, 1280x720, 314 frames
AVI = "indoor_people_480p_mpeg4.avi"  # MPEG-4 Part 2, 640x480, 84 frames


def thread_count() -> int:
    return len(os.listdir("/proc/self/task"))


def threads_added_while_reading(url: str, frames: int, **options) -> int:
    """How many threads the process has more while `url` is open and has decoded `frames` frames."""
    before = thread_count()
    source = open_source(url, **options)
    try:
        for _ in range(frames):
            assert source.read() is not None, source.error
        return thread_count() - before
    finally:
        source.release()


def frame_digests(url: str, frames: int, **options) -> list[str]:
    source = open_source(url, **options)
    try:
        return [hashlib.sha256(source.read().tobytes()).hexdigest() for _ in range(frames)]
    finally:
        source.release()


# -- decoder threads -------------------------------------------------------------------------------

@pytest.mark.shared
def test_one_decode_thread_adds_no_thread_where_the_default_adds_some(media):
    """decode_threads=1 decodes in the reading thread itself; OpenCV's default (decode_threads=0)
    starts one frame thread per core, plus helpers, for every capture."""
    url = str(media / H264)
    assert threads_added_while_reading(url, 10, decode_threads=1) == 0
    assert threads_added_while_reading(url, 10) == 0  # 1 is the default
    if (os.cpu_count() or 1) >= 2:  # with one core OpenCV's default is one thread as well
        assert threads_added_while_reading(url, 10, decode_threads=0) >= 2
        assert threads_added_while_reading(url, 10, decode_threads=2) >= 2


@pytest.mark.shared
def test_a_looping_file_keeps_its_decode_threads_after_the_rewind(media):
    before = thread_count()
    source = open_source(str(media / AVI), loop=True, decode_threads=1)
    try:
        for _ in range(84 + 10):  # past the end: the file is reopened
            assert source.read() is not None, source.error
        assert thread_count() == before
    finally:
        source.release()


@pytest.mark.shared
@pytest.mark.parametrize("video", [H264, AVI])
def test_one_decode_thread_decodes_the_same_frames_as_the_default(media, video):
    url = str(media / video)
    single = frame_digests(url, 40, decode_threads=1)
    assert single == frame_digests(url, 40, decode_threads=0)
    assert len(set(single)) > 30  # real, changing frames


@pytest.mark.shared
def test_a_network_stream_gets_the_decode_threads_too(rtsp_server):
    """The count reaches FFmpeg through the stream's open parameters (the RTSP server is another
    process, so its threads are not counted here)."""
    url = rtsp_server.url()
    assert threads_added_while_reading(url, 5, decode_threads=1, open_timeout_s=10, read_timeout_s=5) == 0
    if (os.cpu_count() or 1) >= 2:
        assert threads_added_while_reading(url, 5, decode_threads=0, open_timeout_s=10, read_timeout_s=5) >= 2


@pytest.mark.shared
@pytest.mark.parametrize("video", [H264, AVI])
def test_reuse_frame_decodes_into_one_array_and_the_same_pixels(media, video):
    """The daemon's readers decode every frame into the previous frame's array (its sink copies
    what it needs first): no 6.2 MB allocation per 1080p frame, and the same pixels."""
    url = str(media / video)
    expected = frame_digests(url, 30)
    source = open_source(url, reuse_frame=True)
    try:
        first = source.read()
        got = [hashlib.sha256(first.tobytes()).hexdigest()]
        for _ in range(29):
            image = source.read()
            assert image is first  # the same array, written in place
            got.append(hashlib.sha256(image.tobytes()).hexdigest())
    finally:
        source.release()
    assert got == expected


def test_decode_thread_params():
    assert decode_thread_params(0) == []
    assert decode_thread_params(3) == [cv2.CAP_PROP_N_THREADS, 3]


@pytest.mark.shared
def test_without_cap_prop_n_threads_files_still_open_and_it_is_said_once(media, monkeypatch, caplog):
    """As with an OpenCV older than 4.7: the parameter is left out (FFmpeg would refuse an unknown
    one) and one debug line says so, however many captures are opened."""
    monkeypatch.setattr(opencv, "_N_THREADS_PROP", None)
    monkeypatch.setattr(opencv, "_noted", set())
    with caplog.at_level(logging.DEBUG, logger=opencv.__name__):
        for _ in range(3):
            source = open_source(str(media / AVI), decode_threads=1)
            try:
                assert source.read() is not None
            finally:
                source.release()
    notes = [r for r in caplog.records if "CAP_PROP_N_THREADS" in r.getMessage()]
    assert len(notes) == 1 and notes[0].levelno == logging.DEBUG


# -- synthetic source: frames ----------------------------------------------------------------------

def test_synthetic_url_is_a_live_source_kind():
    assert source_kind("synthetic://640x480?fps=5") is SourceKind.SYNTHETIC
    assert source_kind("SYNTHETIC://640x480?fps=5") is SourceKind.SYNTHETIC
    assert SourceKind.SYNTHETIC.is_live


def test_synthetic_source_delivers_one_read_only_frame_of_the_size_asked_for():
    source = open_source("synthetic://640x360?fps=1000")
    try:
        assert isinstance(source, SyntheticSource)
        assert source.kind is SourceKind.SYNTHETIC and source.is_live and source.nominal_fps == 1000.0
        first = source.read()
        assert first.shape == (360, 640, 3) and first.dtype == np.uint8 and first.flags.c_contiguous
        assert all(source.read() is first for _ in range(5))  # the same object, never a copy
        assert not first.flags.writeable
        with pytest.raises(ValueError):
            first[0, 0, 0] = 1
        assert not source.eof and source.error is None
    finally:
        source.release()
    assert source.read() is None and source.error == "source released"


def test_default_synthetic_frame_is_deterministic_and_textured():
    frame = SyntheticSource("synthetic://320x240?fps=5").read()
    assert np.array_equal(frame, SyntheticSource("synthetic://320x240?fps=5").read())
    assert np.array_equal(frame, textured_frame(320, 240))
    assert len(np.unique(frame.reshape(-1, 3), axis=0)) > 1000 and frame.std() > 30


@pytest.mark.shared
@pytest.mark.parametrize("image, size, interpolation", [
    ("bus.jpg", (300, 400), cv2.INTER_AREA),  # 810x1080, shrunk 2.7 times
    ("zidane.jpg", (1920, 1080), cv2.INTER_LINEAR),  # 1280x720, enlarged
])
def test_synthetic_frame_is_the_image_resized_once(media, image, size, interpolation):
    path = media / image
    source = open_source(f"synthetic://{size[0]}x{size[1]}?fps=10&image={path}")
    frame = source.read()
    expected = cv2.resize(cv2.imread(str(path)), size, interpolation=interpolation)
    assert frame.shape == (size[1], size[0], 3)
    assert np.array_equal(frame, expected)
    assert source.read() is frame


@pytest.mark.shared
def test_synthetic_image_at_its_own_size_is_unchanged(media):
    frame = open_source(f"synthetic://810x1080?fps=10&image={media / 'bus.jpg'}").read()
    assert np.array_equal(frame, cv2.imread(str(media / "bus.jpg")))


def test_synthetic_image_path_may_be_percent_encoded(tmp_path):
    path = tmp_path / "a frame #1.png"
    cv2.imwrite(str(path), np.full((8, 8, 3), 77, np.uint8))
    frame = open_source("synthetic://4x4?fps=5&image=" + str(path).replace(" ", "%20").replace("#", "%23")).read()
    assert frame.shape == (4, 4, 3) and (frame == 77).all()


# -- synthetic source: bad URLs --------------------------------------------------------------------

@pytest.mark.parametrize("url, fragment", [
    ("synthetic://640x480", "fps=F is missing"),
    ("synthetic://640x480?fps=0", "fps must be a number from 0.1 to 1000, not '0'"),
    ("synthetic://640x480?fps=-5", "fps must be a number from 0.1 to 1000"),
    ("synthetic://640x480?fps=nan", "fps must be a number"),
    ("synthetic://640x480?fps=fast", "not 'fast'"),
    ("synthetic://640x480?fps=5&fps=6", "fps is given twice"),
    ("synthetic://640x480?fps=5&fsp=6", "unknown parameter 'fsp'"),
    ("synthetic://u:s3cret@640x480?fps=5", "the size must be WIDTHxHEIGHT"),
    ("synthetic://640x480?fps=5&image=", "image= is empty"),
    ("synthetic://640?fps=5", "the size must be WIDTHxHEIGHT in pixels, each 1 to 8192, not '640'"),
    ("synthetic://0x480?fps=5", "not '0x480'"),
    ("synthetic://20000x480?fps=5", "each 1 to 8192"),
    ("synthetic://?fps=5", "the size must be WIDTHxHEIGHT"),
])
def test_bad_synthetic_urls_say_what_is_wrong(url, fragment):
    with pytest.raises(UnsupportedSourceError, match="^synthetic://") as info:
        open_source(url)
    assert fragment in str(info.value)
    assert "s3cret" not in str(info.value)


def test_missing_or_undecodable_synthetic_image_is_a_source_error(tmp_path):
    with pytest.raises(SourceError, match="image not found: .*nope.jpg") as info:
        open_source(f"synthetic://64x64?fps=5&image={tmp_path / 'nope.jpg'}")
    assert not isinstance(info.value, UnsupportedSourceError)  # it may appear later: retried
    (tmp_path / "text.jpg").write_text("not an image")
    with pytest.raises(SourceError, match="not an image OpenCV can read"):
        open_source(f"synthetic://64x64?fps=5&image={tmp_path / 'text.jpg'}")


def test_synthetic_url_canonical_form():
    spec = parse_synthetic_url("synthetic://1280X720?image=/srv/a%20b.jpg&fps=29.97")
    assert (spec.width, spec.height, spec.fps, spec.image) == (1280, 720, 29.97, "/srv/a b.jpg")
    assert spec.url == "synthetic://1280x720?fps=29.97&image=/srv/a%20b.jpg"
    assert parse_synthetic_url(spec.url) == spec
    assert parse_synthetic_url("synthetic://8x8?fps=25.0").url == "synthetic://8x8?fps=25"


# -- synthetic source: pacing, with an injected clock ------------------------------------------------

class FakeTime:
    """A monotonic clock that only moves when slept on (plus `oversleep_s` per sleep, as a loaded
    machine oversleeps) or when the test says so (`advance`: work between reads, or a pause)."""

    def __init__(self, oversleep_s: float = 0.0):
        self.now = 1000.0
        self.oversleep_s = oversleep_s
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.sleeps.append(seconds)
        self.now += seconds + self.oversleep_s

    def advance(self, seconds: float) -> None:
        self.now += seconds


def paced(fps: float, fake: FakeTime) -> SyntheticSource:
    return SyntheticSource(f"synthetic://32x24?fps={fps}", clock=fake.clock, sleep=fake.sleep)


def frames_within(source: SyntheticSource, fake: FakeTime, seconds: float, work_s: float = 0.0) -> int:
    """Frames read before `seconds` of fake time have passed, with `work_s` of work after each."""
    end = fake.now + seconds
    count = 0
    while True:
        source.read()
        if fake.now >= end:
            return count
        count += 1
        fake.advance(work_s)


def test_synthetic_source_delivers_fps_frames_per_second():
    fake = FakeTime()
    assert frames_within(paced(25, fake), fake, 1.0) in (24, 25, 26)
    fake = FakeTime()
    assert frames_within(paced(7.5, fake), fake, 2.0, work_s=0.01) in (14, 15, 16)


def test_oversleeping_does_not_accumulate_drift():
    """Each sleep overshoots by 5 ms and each frame takes 10 ms of work: the schedule is kept, so
    10 s at 25 fps are still 250 frames (re-scheduling from the wake-up time would give 222)."""
    fake = FakeTime(oversleep_s=0.005)
    assert abs(frames_within(paced(25, fake), fake, 10.0, work_s=0.01) - 250) <= 2


def test_no_burst_after_a_pause():
    fake = FakeTime()
    source = paced(10, fake)
    for _ in range(5):
        source.read()
    fake.advance(3.0)  # the consumer was away for 30 frame periods
    slept = len(fake.sleeps)
    source.read()
    assert len(fake.sleeps) == slept  # the frame is there at once...
    before = fake.now
    source.read()
    assert fake.now - before == pytest.approx(0.1)  # ...and the next one a full period later
    assert frames_within(source, fake, 1.0) in (9, 10, 11)


def test_a_slow_consumer_gets_frames_at_its_own_pace_without_sleeping():
    fake = FakeTime()
    source = paced(25, fake)
    assert frames_within(source, fake, 2.0, work_s=0.1) in (19, 20, 21)
    assert fake.sleeps == []


def test_a_read_never_sleeps_longer_than_one_frame_period():
    for fps, work_s, oversleep_s in [(25, 0.0, 0.0), (25, 0.039, 0.0), (2, 0.3, 0.2), (0.5, 0.0, 0.0)]:
        fake = FakeTime(oversleep_s)
        source = paced(fps, fake)
        frames_within(source, fake, 20.0, work_s=work_s)
        assert fake.sleeps and max(fake.sleeps) <= 1.0 / fps + 1e-9


def test_the_config_image_signatures_agree_with_opencv(tmp_path):
    """config.sources checks a synthetic camera's image without OpenCV: every image this OpenCV
    writes (and so reads) passes it, as cv2.haveImageReader says, and what is no image fails both."""
    image = np.zeros((16, 16, 3), np.uint8)
    written = []
    for suffix in (".jpg", ".png", ".bmp", ".tif", ".webp", ".ppm", ".pfm", ".pam", ".ras", ".hdr"):
        path = tmp_path / f"image{suffix}"
        pixels = image.astype(np.float32) if suffix in (".pfm", ".hdr") else image
        if cv2.imwrite(str(path), pixels):
            written.append(path)
    assert len(written) >= 6, written  # JPEG, PNG, BMP, TIFF, PNM at least: every build has them
    for path in written:
        assert cv2.haveImageReader(str(path)), path
        assert synthetic_image_problem(str(path)) is None, path
    for name, data in (("text.jpg", b"not an image"), ("model.onnx", b"\x08\x07\x12\x07pytorch"),
                       ("short.jpg", b"\xff\xd8"), ("empty.png", b"")):
        path = tmp_path / name
        path.write_bytes(data)
        assert not cv2.haveImageReader(str(path)), name
        assert synthetic_image_problem(str(path)) == f"not an image OpenCV can read: {path}"
