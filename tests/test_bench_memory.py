"""`yoloedge bench memory`, `bench clip --codec` and `bench decode --decode-threads`: the commands
run end to end on a small clip and print their tables. What they measure is not asserted (a
benchmark's figures belong to the docs): only that every row is there, well formed, and that the
cameras really decoded."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import cv2
import pytest

from conftest_mqtt import require_programs
from daemon_harness import REPO
from yoloedge.config.sources import av_installed

SOURCE = "indoor_people_480p_mpeg4.avi"  # 84 frames at 15 fps
SOURCE_FRAMES = 84
NUMBER = r"-?[0-9]+\.[0-9]"


def bench(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "yoloedge", "bench", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


def fourcc(path) -> str:
    cap = cv2.VideoCapture(str(path))
    try:
        code = int(cap.get(cv2.CAP_PROP_FOURCC))
        return "".join(chr((code >> (8 * i)) & 0xFF) for i in range(4)).lower()
    finally:
        cap.release()


def frame_count(path) -> int:
    cap = cv2.VideoCapture(str(path))
    try:
        frames = 0
        while cap.grab():
            frames += 1
        return frames
    finally:
        cap.release()


def has_openh264() -> bool:
    """What `bench clip` needs for H.264 (gstreamer1.0-plugins-bad)."""
    inspect = shutil.which("gst-inspect-1.0")
    return inspect is not None and subprocess.run([inspect, "openh264enc"], capture_output=True).returncode == 0


@pytest.mark.shared
@pytest.mark.parametrize("decoder", ["opencv", "pyav"])
def test_bench_memory_prints_a_row_per_codec_with_the_daemon_and_the_captures_alone(media, models, decoder):
    require_programs("mosquitto")
    if decoder == "pyav" and not av_installed():
        pytest.skip("PyAV is not installed: pip install yoloedge[pyav]")
    result = bench("memory", "--from", str(media / SOURCE), "--size", "320x240", "--cameras", "2", "--seconds", "2",
                   "--watch", "--model", str(models / "yolov8n_coco_int8.onnx"), "--decoder", decoder)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert f"2 file cameras per clip at fps 5, decoder {decoder}, decode_threads 1, RSS after 2 s" in out, out
    assert re.search(rf"the daemon without cameras: {NUMBER} MB RSS, [0-9]+ threads", out), out
    header = next(line for line in out.splitlines() if line.strip().startswith("codec"))
    assert header.split() == ["codec", "decoded/s", "daemon", "RSS", "per", "camera", "threads", "captures", "alone",
                              "watched"]
    row = rf"\s+({NUMBER})\s+{NUMBER} MB\s+{NUMBER} MB\s+{NUMBER}/camera\s+{NUMBER} MB\s+{NUMBER} MB$"
    codecs = {"MPEG-4 Part 2 (OpenCV mp4v)": True, "H.264 (openh264)": has_openh264()}
    for codec, made in codecs.items():
        match = re.search(re.escape(codec) + row, out, re.MULTILINE)
        if made:
            assert match, f"no row for {codec}:\n{out}"
            assert float(match.group(1)) > 0, f"the {codec} cameras decoded nothing:\n{out}"
        else:
            assert "not run: h264: needs gst-launch-1.0 and the openh264enc element" in out, out


def test_bench_memory_refuses_bad_options_before_running_anything(tmp_path):
    model = tmp_path / "m.onnx"
    model.write_bytes(b"")
    for args, said in ((["--from", str(tmp_path / "none.mp4")], "no such file"),
                       (["--from", str(model), "--codecs", "vp9"], "--codecs takes h264, mpeg4"),
                       (["--from", str(model), "--cameras", "0"], "--cameras and --batch are at least 1"),
                       (["--from", str(model), "--decoder", "ffmpeg"], "--decoder takes opencv, pyav")):
        result = bench("memory", "--model", str(model), *args, timeout=60)
        assert result.returncode == 2 and said in result.stderr, (args, result.stderr)


@pytest.mark.shared
@pytest.mark.parametrize("codec, tags", [("mpeg4", {"mp4v", "fmp4"}), ("h264", {"avc1", "h264"})])
def test_bench_clip_makes_the_codec_asked_for(media, tmp_path, codec, tags):
    if codec == "h264" and not has_openh264():
        pytest.skip("GStreamer's openh264enc is not installed (gstreamer1.0-plugins-bad)")
    out = tmp_path / f"{codec}.mp4"
    result = bench("clip", "--from", str(media / SOURCE), "--size", "320x240", "--codec", codec, "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert fourcc(out) in tags and frame_count(out) == SOURCE_FRAMES
    cap = cv2.VideoCapture(str(out))
    assert (cap.get(cv2.CAP_PROP_FRAME_WIDTH), cap.get(cv2.CAP_PROP_FRAME_HEIGHT)) == (320, 240)
    cap.release()


def test_bench_clip_says_why_a_codec_cannot_be_made(tmp_path):
    result = bench("clip", "--from", str(tmp_path / "missing.avi"), "--codec", "mpeg4", "-o", str(tmp_path / "x.mp4"),
                   timeout=60)
    assert result.returncode == 1 and "cannot make mpeg4 here" in result.stderr, result.stderr


@pytest.mark.shared
def test_bench_decode_runs_each_thread_count(media):
    result = bench("decode", "--clip", str(media / SOURCE), "--decoders", "opencv", "--decode-threads", "1,2",
                   "--rounds", "1")
    assert result.returncode == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines()[2:]]
    assert [(r[0], r[2], r[-1]) for r in rows] == [("opencv", str(SOURCE_FRAMES), "1"),
                                                   ("opencv", str(SOURCE_FRAMES), "2")], result.stdout
