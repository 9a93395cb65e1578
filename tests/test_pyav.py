"""`decoder: pyav`: FFmpeg through PyAV, converted straight into the reader's buffers.

Real PyAV on the shared videos and on the repo's test RTSP server; the reference pictures come from
a plain `cv2.VideoCapture.read()` of the same file, and must be equal byte for byte, every frame.
Clips in other pixel formats (4:2:2, 4:4:4, 10-bit, grey, an odd height) are made here by PyAV's
own encoders. PyAV is part of the `dev` extra; without it these tests skip, saying so.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import pytest

from test_gstreamer import WITHOUT_GI, write_config
from test_reader_retrieve import Digests, read_digests, run_to
import test_sources
from test_sources import Collector, camera
from yoloedge.config.schema import CameraConfig
from yoloedge.sources import CameraState
from yoloedge.sources.base import SourceError, SourceKind, UnsupportedSourceError
from yoloedge.sources.framepool import FramePool
from yoloedge.config.sources import Decoder, av_installed

pytestmark = pytest.mark.shared

REPO = Path(__file__).resolve().parent.parent
MP4 = "street_people_720p.mp4"  # H.264 High (B-frames), 1280x720, 29.97 fps, 314 frames
AVI = "indoor_people_480p_mpeg4.avi"  # MPEG-4 Part 2, 640x480, 15 fps, 84 frames
FRAMES = {MP4: 314, AVI: 84}

run_reader = test_sources.run_reader  # the fixture: start(config, collector) -> (reader, states)


@pytest.fixture(scope="module")
def av():
    if not av_installed():
        pytest.skip("PyAV is not installed: pip install yoloedge[pyav] (the dev extra installs it)")
    from yoloedge.sources.pyav import load_av
    return load_av()


def open_pyav(url, **settings):
    from yoloedge.sources.opening import open_camera
    source, decoder = open_camera(CameraConfig(name="pyav", url=str(url), decoder="pyav", **settings), camera="pyav")
    assert decoder is Decoder.PYAV
    return source


def opencv_frames(path) -> list[np.ndarray]:
    cap = cv2.VideoCapture(str(path))
    frames = []
    try:
        while True:
            ok, image = cap.read()
            if not ok:
                return frames
            frames.append(image)
    finally:
        cap.release()


def unequal(ours: np.ndarray, reference: np.ndarray) -> str | None:
    if ours.shape != reference.shape:
        return f"is {ours.shape}, not {reference.shape}"
    if np.array_equal(ours, reference):
        return None
    delta = ours.astype(int) - reference
    return f"differs by {delta.mean(axis=(0, 1)).round(2).tolist()} on average, {int(np.abs(delta).max())} at most"


def read_all(source) -> list[np.ndarray]:
    frames = []
    while (image := source.read()) is not None:
        frames.append(image.copy())
    return frames


# -- the same pictures -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", [MP4, AVI])
def test_every_frame_is_opencvs_byte_for_byte_and_the_file_ends_cleanly(media, av, name):
    source = open_pyav(media / name)
    try:
        assert source.kind is SourceKind.FILE and not source.is_live and source.fills_buffers
        assert source.nominal_fps == pytest.approx({MP4: 29.97, AVI: 15.0}[name], abs=0.01)
        ours = read_all(source)
        assert source.eof and source.error is None, source.error
        assert not source.grab() and source.eof  # the end stays the end
    finally:
        source.release()
    reference = opencv_frames(media / name)
    assert len(ours) == len(reference) == FRAMES[name]
    for index, (mine, theirs) in enumerate(zip(ours, reference)):
        problem = unequal(mine, theirs)
        assert problem is None, f"frame {index} {problem}"


def test_grabbed_frames_are_converted_into_the_buffer_they_are_given(media, av):
    """grab() every frame, retrieve() every third into a pool's buffer: the buffer is filled in
    place, with OpenCV's picture of that frame."""
    reference = opencv_frames(media / AVI)
    pool = FramePool()
    source = open_pyav(media / AVI)
    try:
        index = 0
        while source.grab():
            assert source.grabbed_size() == (640, 480)
            if index % 3 == 0:
                lent = pool.take((480, 640, 3))
                image = source.retrieve(lent)
                assert image is lent and unequal(image, reference[index]) is None, index
                pool.give(lent)
            index += 1
        assert index == 84 and source.eof
    finally:
        source.release()
    assert pool.allocated == 1


def test_through_the_reader_kept_frames_are_the_pixels_opencv_reads(media, av):
    """The daemon's path: a reader with a pool, sampled to 5 fps: the kept frames, byte for byte,
    all in the pool's one buffer."""
    url = str(media / MP4)
    expected = read_digests(url)
    sink, pool = Digests(), FramePool()
    reader = run_to(CameraState.ENDED, camera(url, realtime=False, fps=5.0, decoder="pyav"), sink, pool)
    stats = reader.stats()
    assert stats["decoder"] == "pyav" and stats["frames_in"] == 314
    kept = [seq for seq, _, _ in sink.seen]
    assert 0 < len(kept) < 314 / 2
    assert [digest for _, digest, _ in sink.seen] == [expected[seq] for seq in kept]
    assert pool.allocated == 1 and pool.in_use() == 0


def threads_added_while_reading(url, frames: int, **settings) -> int:
    """Threads started while `url` is open and has decoded `frames` frames (by id: a thread of an
    earlier test that ends meanwhile does not count)."""
    before = set(os.listdir("/proc/self/task"))
    source = open_pyav(url, **settings)
    try:
        for _ in range(frames):
            assert source.read() is not None, source.error
        return len(set(os.listdir("/proc/self/task")) - before)
    finally:
        source.release()


def test_decode_threads_are_the_decoders_threads_as_with_opencv(media, av):
    """1 (the default) decodes in the reading thread; 2 and 0 (one per core) start frame threads,
    with the same pictures. PyAV's own default would be FFmpeg's automatic count."""
    url = media / MP4
    assert threads_added_while_reading(url, 10) == 0
    assert threads_added_while_reading(url, 10, decode_threads=1) == 0
    if (os.cpu_count() or 1) >= 2:
        assert threads_added_while_reading(url, 10, decode_threads=2) >= 2
        assert threads_added_while_reading(url, 10, decode_threads=0) >= 2
    source = open_pyav(url, decode_threads=2)
    try:
        threaded = [source.read().copy() for _ in range(20)]
    finally:
        source.release()
    assert [unequal(a, b) for a, b in zip(threaded, opencv_frames(url)[:20])] == [None] * 20


# -- other pixel formats: swscale, as OpenCV calls it ----------------------------------------------
def encode(av, media: Path, out: Path, codec: str, pixel_format: str, size: tuple[int, int]) -> Path:
    """8 frames of the indoor clip in `pixel_format` at `size`, encoded by PyAV."""
    width, height = size
    with av.open(str(media / AVI)) as source, av.open(str(out), "w") as sink:
        stream = sink.add_stream(codec, rate=15)
        stream.width, stream.height, stream.pix_fmt = width, height, pixel_format
        for index, frame in enumerate(source.decode(video=0)):
            if index == 8:
                break
            for packet in stream.encode(frame.reformat(width=width, height=height, format=pixel_format)):
                sink.mux(packet)
        for packet in stream.encode():
            sink.mux(packet)
    return out


@pytest.mark.parametrize("codec, pixel_format, size", [
    ("ffv1", "yuv420p", (320, 181)), ("libx264", "yuv422p", (320, 240)), ("libx264", "yuv444p", (320, 240)),
    ("libx265", "yuv420p10le", (320, 240)), ("ffv1", "gray", (320, 240)), ("ffv1", "yuv420p", (321, 240))])
def test_other_pictures_are_opencvs_too(media, av, tmp_path, caplog, codec, pixel_format, size):
    """An odd height, 4:2:2, 4:4:4, 10-bit and grey go through swscale with OpenCV's flags; an odd
    width through the converter. Byte for byte, and the copy is said once."""
    try:
        clip = encode(av, media, tmp_path / f"{pixel_format}.mkv", codec, pixel_format, size)
    except av.error.FFmpegError as exc:  # an encoder this PyAV build lacks
        pytest.skip(f"PyAV cannot encode {pixel_format} with {codec} here: {exc.strerror}")
    source = open_pyav(clip)
    try:
        with caplog.at_level(logging.INFO, logger="yoloedge.sources.pyav"):
            ours = read_all(source)
        assert source.error is None, source.error
    finally:
        source.release()
    reference = opencv_frames(clip)
    assert len(ours) == len(reference) == 8
    assert [unequal(a, b) for a, b in zip(ours, reference)] == [None] * 8
    said = [r.getMessage() for r in caplog.records if "converted by swscale" in r.getMessage()]
    assert len(said) == (0 if size == (321, 240) else 1), said


def test_nv12_planes_give_the_pictures_of_the_same_samples_in_i420(media, av):
    """A hardware decoder's NV12 (U and V interleaved): the same samples, so the same picture."""
    from yoloedge.sources.pyav import PyAvSource
    with av.open(str(media / AVI)) as container:
        frame = next(container.decode(video=0))
    source = PyAvSource(str(media / AVI))
    try:
        i420 = source._convert(frame, None)
        nv12 = source._convert(frame.reformat(format="nv12"), None)
    finally:
        source.release()
    assert unequal(nv12, i420) is None
    assert unequal(i420, opencv_frames(media / AVI)[0]) is None


# -- loop, end of file, broken files ---------------------------------------------------------------
def test_a_looping_file_starts_again_at_its_first_frame(media, av):
    source = open_pyav(media / AVI, loop=True)
    try:
        frames = [source.read() for _ in range(84 * 2 + 1)]
        assert all(frame is not None for frame in frames) and not source.eof and source.error is None
    finally:
        source.release()
    assert np.array_equal(frames[84], frames[0]) and np.array_equal(frames[168], frames[0])
    assert not np.array_equal(frames[83], frames[0])


def test_realtime_false_file_is_lossless_through_the_reader_and_ends(media, av, run_reader):
    collector = Collector(size=2, lossless=True, delay_s=0.002)
    reader, states = run_reader(camera(media / AVI, decoder="pyav", realtime=False), collector)
    assert states.wait_for(CameraState.ENDED, 60), states.events
    assert collector.wait_count(84, 5)
    assert collector.seqs == list(range(84)) and reader.stats()["decoder"] == "pyav"
    assert states.events[-1][3] == "end of file"


def test_a_missing_file_is_a_clear_error(av, tmp_path):
    with pytest.raises(SourceError, match=r"/missing\.mp4: no such file$"):
        open_pyav(tmp_path / "missing.mp4")


def test_a_file_that_is_not_a_video_is_a_clear_error(av, tmp_path):
    path = tmp_path / "notes.mp4"
    path.write_bytes(b"not a video at all\n" * 200)
    with pytest.raises(SourceError) as info:
        open_pyav(path)
    assert str(info.value) == f"{path}: cannot open video file: Invalid data found when processing input"


def test_a_truncated_file_gives_what_it_has_then_ends_or_says_why(media, av, tmp_path, caplog):
    """The MPEG-4 clip cut in half: the frames before the cut are OpenCV's, then the end (with a
    warning that fewer frames came than the container announced)."""
    data = (media / AVI).read_bytes()
    path = tmp_path / "cut.avi"
    path.write_bytes(data[:len(data) // 2])
    reference = opencv_frames(path)
    source = open_pyav(path)
    try:
        with caplog.at_level(logging.WARNING, logger="yoloedge.sources"):
            ours = read_all(source)
        assert source.eof and source.error is None, source.error
    finally:
        source.release()
    assert 0 < len(ours) == len(reference) < 84
    assert [unequal(a, b) for a, b in zip(ours, reference)] == [None] * len(ours)
    assert any(f"ended after {len(ours)} of 84 frames" in r.getMessage() for r in caplog.records)


def test_a_file_without_video_is_a_clear_error(av, tmp_path):
    path = tmp_path / "tone.wav"
    with av.open(str(path), "w") as sink:
        stream = sink.add_stream("pcm_s16le", rate=8000)
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 800), np.int16), format="s16", layout="mono")
        frame.sample_rate = 8000
        for packet in stream.encode(frame):
            sink.mux(packet)
        for packet in stream.encode():
            sink.mux(packet)
    with pytest.raises(SourceError, match=r"tone\.wav: has no video stream$"):
        open_pyav(path)


def test_pyav_reads_files_and_rtsp_only(av):
    with pytest.raises(UnsupportedSourceError, match="decoder: pyav reads rtsp:// cameras and video files"):
        open_pyav("http://127.0.0.1:9/video.mjpg")


# -- RTSP ------------------------------------------------------------------------------------------
def test_rtsp_gives_the_files_pictures_from_its_first_frame(media, av, rtsp_server):
    """The test server sends the clip's own access units from the first: every frame is OpenCV's
    picture of the same frame of the file, byte for byte."""
    reference = opencv_frames(media / MP4)[:30]
    source = open_pyav(rtsp_server.url(), open_timeout_s=5.0, read_timeout_s=3.0)
    try:
        assert source.kind is SourceKind.RTSP and source.is_live
        ours = [source.read() for _ in range(30)]
        assert all(image is not None for image in ours), source.error
    finally:
        source.release()
    assert [unequal(a, b) for a, b in zip(ours, reference)] == [None] * 30


def test_rtsp_that_refuses_is_a_clear_error_without_the_password(av):
    from fixtures_media import free_port
    url = f"rtsp://viewer:Pyav-Secret-4@127.0.0.1:{free_port()}/stream"
    with pytest.raises(SourceError) as info:
        open_pyav(url, open_timeout_s=2.0)
    message = str(info.value)
    assert "Pyav-Secret-4" not in message and "cannot open stream: Connection refused" in message, message


def test_a_frozen_rtsp_camera_is_a_read_timeout(av, rtsp_server):
    source = open_pyav(rtsp_server.url(), open_timeout_s=5.0, read_timeout_s=1.0)
    try:
        assert source.read() is not None, source.error
        rtsp_server.freeze()
        try:
            started = time.monotonic()
            while source.read() is not None:  # what was in flight, then nothing
                assert time.monotonic() - started < 30, "the frozen server kept delivering"
            assert source.error is not None and "read timed out" in source.error, source.error
        finally:
            rtsp_server.resume()
    finally:
        source.release()


def test_a_killed_rtsp_server_ends_the_stream_as_an_error(av, rtsp_server):
    source = open_pyav(rtsp_server.url(), open_timeout_s=5.0, read_timeout_s=3.0)
    try:
        assert source.read() is not None, source.error
        rtsp_server.kill()
        try:
            started = time.monotonic()
            while source.read() is not None:
                assert time.monotonic() - started < 30
            assert not source.eof and source.error, source.error
        finally:
            rtsp_server.restart()
    finally:
        source.release()


# -- choosing it, checking it ----------------------------------------------------------------------
def test_auto_picks_pyav_for_files_and_rtsp_where_installed(av, media):
    from yoloedge.config.sources import gi_installed
    from yoloedge.sources.gstreamer import element_present
    from yoloedge.sources.opening import choose_decoder
    for element in ("nvv4l2decoder", "nvh264dec", "vah264dec", "vaapih264dec"):
        if gi_installed() and element_present(element):
            pytest.skip(f"this machine has {element}: auto picks hardware")
    for url in (str(media / AVI), "rtsp://192.0.2.1/s"):
        assert choose_decoder(CameraConfig(name="a", url=url, decoder="auto")).decoder is Decoder.PYAV, url
    assert choose_decoder(CameraConfig(name="h", url="http://192.0.2.1/v.mjpg", decoder="auto")).decoder \
        is Decoder.OPENCV


WITHOUT_AV = ("import sys; sys.modules['av'] = None; sys.argv[0] = 'yoloedge'; "
              "from yoloedge.cli.main import main; sys.exit(main())")


def run_check(code: str, path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, "check", "-c", str(path)], cwd=REPO,
                          capture_output=True, text=True, timeout=120, env=dict(os.environ))


def test_check_without_pyav_names_the_extra(tmp_path):
    path = write_config(tmp_path, "- {name: a, url: rtsp://h/s, decoder: pyav}\n")
    result = run_check(WITHOUT_AV, path)
    assert result.returncode == 78, result.stderr
    first = result.stderr.strip().splitlines()[0]
    assert first.startswith(f"{path}:4: cameras[0].decoder: decoder: pyav needs PyAV, which is not installed"), first
    assert "pip install yoloedge[pyav]" in result.stderr and "Traceback" not in result.stderr


def test_check_refuses_pyav_for_an_http_camera(av, tmp_path):
    path = write_config(tmp_path, "- {name: a, url: 'http://h/v.mjpg', decoder: pyav}\n")
    result = run_check(WITHOUT_GI, path)
    assert result.returncode == 78 and "decoder: pyav reads rtsp:// cameras and video files only" in result.stderr, \
        result.stderr


def test_checking_and_other_decoders_never_import_av(tmp_path, media):
    """`check` of a pyav camera finds PyAV without loading it; an opencv camera reads without it."""
    path = write_config(tmp_path, f"- {{name: a, url: {media / AVI}, decoder: pyav}}\n")
    script = ("import sys, runpy\n"
              "from yoloedge.config.loader import load_config\n"
              f"load_config({str(path)!r}, {{}})\n"
              "from yoloedge.sources.opening import open_camera\n"
              "from yoloedge.config.schema import CameraConfig\n"
              f"source, decoder = open_camera(CameraConfig(name='b', url={str(media / AVI)!r}))\n"
              "assert source.read() is not None\n"
              "source.release()\n"
              "print(decoder.value, 'av' in sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.stdout.split() == ["opencv", "False"], result.stderr


def test_pyav_missing_at_run_time_is_an_unsupported_source(monkeypatch):
    from yoloedge.sources import opening
    monkeypatch.setitem(sys.modules, "av", None)
    with pytest.raises(UnsupportedSourceError, match=r"pip install yoloedge\[pyav\]"):
        opening.choose_decoder(CameraConfig(name="a", url="rtsp://h/s", decoder="pyav"))
