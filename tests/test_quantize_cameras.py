"""`yoloedge quantize --cameras`: calibration frames taken from the configured cameras.

Real cameras of every finite kind, read through the daemon's sources: a folder camera (the two
photos), a video-file camera (the 84-frame corridor clip), a synthetic live camera, and one that
cannot be opened (nothing listens on port 9). The frames are checked against the media decoded
here on their own; one real quantization on a few frames covers the report.
"""

from __future__ import annotations

import io
import json
import re
import threading
from pathlib import Path

import cv2
import numpy as np
import pytest

from yoloedge.cli import check
from yoloedge.cli.main import build_parser, main
from yoloedge.cli.quantize import format_report, pick_cameras
from yoloedge.config.loader import DEFAULT_PATH, load_config
from yoloedge.config.schema import CameraConfig
from yoloedge.quantize.cameras import GRACE_S, Phase, _CameraRun, allocate, even, sample_cameras

MODEL = "yolox_nano_coco_416.onnx"
VIDEO = "indoor_people_480p_mpeg4.avi"  # 84 frames, 640x480
SECRET = "s3cr3t-pw"


def write_config(tmp_path: Path, models: Path, media: Path, extra: str = "") -> Path:
    photos = tmp_path / "photos"
    photos.mkdir(exist_ok=True)
    for name in ("bus.jpg", "zidane.jpg"):
        if not (photos / name).exists():
            (photos / name).symlink_to(media / name)
    path = tmp_path / "yoloedge.yaml"
    path.write_text(f"""device_id: edge-01
model: {{path: {models / MODEL}}}
cameras:
  - {{name: photos, url: {photos}}}
  - {{name: hall, url: {media / VIDEO}}}
  - {{name: gate, url: "rtsp://admin:{SECRET}@127.0.0.1:9/x", open_timeout_s: 0.5, read_timeout_s: 0.5}}
  - {{name: spare, url: "synthetic://64x48?fps=50", enabled: false}}
{extra}""")
    return path


@pytest.fixture
def config_path(tmp_path, models, media) -> Path:
    return write_config(tmp_path, models, media)


def cameras_of(path: Path, *names: str):
    config = load_config(str(path), {})
    return [c for c in config.cameras if c.name in names]


def video_frame(media: Path, index: int) -> np.ndarray:
    cap = cv2.VideoCapture(str(media / VIDEO))
    try:
        for _ in range(index + 1):
            ok, image = cap.read()
            assert ok
    finally:
        cap.release()
    return image


def index_of(name: str) -> int:
    return int(name.rsplit("#", 1)[1])


# -- sharing the frames out ------------------------------------------------------------------------

def test_frames_are_shared_evenly_and_a_short_camera_leaves_its_rest_to_the_others():
    assert even(7, 3) == [3, 2, 2]
    assert allocate(5, [None, None]) == [3, 2]
    assert allocate(6, [2, None]) == [2, 4]  # two photos give two; the live camera the other four
    assert allocate(10, [2, 3]) == [2, 3]  # asked for more than there is: all of it
    assert allocate(4, [0, 84, None]) == [0, 2, 2]
    assert allocate(0, [None]) == [0]
    assert allocate(3, []) == []


# -- reading the cameras ---------------------------------------------------------------------------

def test_file_and_folder_cameras_are_spread_and_a_dead_camera_is_skipped(config_path, media):
    warnings: list[str] = []
    cameras = cameras_of(config_path, "photos", "hall", "gate")
    sample = sample_cameras(cameras, calibrate=6, evaluate=4, interval_s=0.0, warn=warnings.append)
    by_name = {c.name: c for c in sample.cameras}
    photos, hall, gate = by_name["photos"], by_name["hall"], by_name["gate"]
    # 6 over two cameras that opened: the folder holds two images, the clip gives the other four
    assert [f.name for f in photos.calibration] == ["photos#0", "photos#1"]
    np.testing.assert_array_equal(photos.calibration[1].image, cv2.imread(str(media / "zidane.jpg")))
    assert photos.held_out == []
    assert len(hall.calibration) == 4 and len(hall.held_out) == 4
    calib = [index_of(f.name) for f in hall.calibration]
    held = [index_of(f.name) for f in hall.held_out]
    assert not set(calib) & set(held)
    assert calib[0] == 0 and calib[-1] >= 60  # over the whole clip, not its first frames
    assert min(held) > 0 and max(held) >= 60
    # a frame is the clip's frame at that index, decoded here on its own
    np.testing.assert_array_equal(hall.held_out[-1].image, video_frame(media, held[-1]))
    # the dead camera: skipped, said once, with its name and no password
    assert gate.problem is not None and gate.calibration == [] and gate.held_out == []
    assert sample.skipped() == {"gate": gate.problem}
    assert len(warnings) == 1 and "camera gate" in warnings[0] and "skipped" in warnings[0]
    assert SECRET not in warnings[0] and SECRET not in gate.problem
    assert len(sample.calibration) == 6 and len(sample.held_out) == 4


def moments_of(frames, name: str) -> list[float]:
    return sorted(float(re.fullmatch(rf"{name}@([0-9.]+)s", f.name).group(1)) for f in frames)


def test_a_live_camera_gives_frames_an_interval_apart(mjpeg_server):
    web = CameraConfig(name="web", url=mjpeg_server.url, open_timeout_s=5, read_timeout_s=2, jpeg_decoder="cpu")
    interval = 0.2
    sample = sample_cameras([web], calibrate=3, evaluate=2, interval_s=interval, warn=pytest.fail)
    (camera,) = sample.cameras
    frames = camera.calibration + camera.held_out
    assert (len(camera.calibration), len(camera.held_out)) == (3, 2)
    moments = moments_of(frames, "web")
    assert len(set(moments)) == 5  # five moments, none taken twice
    for k, moment in enumerate(moments):  # kept only once the interval has passed: a lower bound
        assert moment >= k * interval - 0.05
    assert frames[0].image.shape == (480, 640, 3)
    # other moments of a moving scene: not one frame five times
    assert len({f.image.tobytes() for f in frames}) == 5


def test_a_live_camera_that_goes_silent_stops_and_the_others_go_on(mjpeg_server, config_path):
    web = CameraConfig(name="web", url=mjpeg_server.url, open_timeout_s=5, read_timeout_s=0.5, jpeg_decoder="cpu")
    (hall,) = cameras_of(config_path, "hall")
    warnings: list[str] = []
    threading.Timer(0.4, mjpeg_server.freeze).start()
    sample = sample_cameras([web, hall], calibrate=12, evaluate=8, interval_s=0.3, warn=warnings.append)
    by_name = {c.name: c for c in sample.cameras}
    web_frames = len(by_name["web"].calibration) + len(by_name["web"].held_out)
    assert web_frames < 10  # its share was ten, three seconds' worth: it stopped when the stream froze
    assert len(warnings) == 1 and "camera web" in warnings[0]
    assert len(by_name["hall"].calibration) == 6 and len(by_name["hall"].held_out) == 4


def test_an_open_or_a_read_past_its_timeout_abandons_the_camera():
    """The watch for sources with no timeout of their own (a V4L2 device, say), on a given clock."""
    camera = CameraConfig(name="cam", url="/dev/video9", open_timeout_s=2.0, read_timeout_s=3.0)
    now = [100.0]
    run = _CameraRun(camera, 1.0, lambda: now[0])  # not started: its phase is what the test sets
    now[0] += 2.0 + GRACE_S
    assert run.overdue(now[0]) is None  # exactly at the limit: not yet
    reason = run.overdue(now[0] + 0.01)
    assert reason is not None and "open_timeout_s (2 s)" in reason
    run._begin(Phase.READING)
    assert run.overdue(now[0] + 3.0 + GRACE_S - 0.01) is None
    reason = run.overdue(now[0] + 3.0 + GRACE_S + 0.01)
    assert reason is not None and "read_timeout_s (3 s)" in reason
    run.abandon(reason)
    assert run.finished() and run.overdue(now[0] + 100) is None
    warnings: list[str] = []
    run.tell(warnings.append)
    run.tell(warnings.append)
    assert warnings == [f"camera cam (/dev/video9) {reason}; skipped"]


# -- the command -----------------------------------------------------------------------------------

def quantize_json(args: list[str], capsys) -> tuple[dict, str]:
    rc = main(["quantize", *args, "--timing-runs", "1", "--json"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    lines = captured.out.splitlines()
    assert len(lines) == 1, "--json prints one line"
    return json.loads(lines[0]), captured.err


def test_quantize_on_the_cameras(config_path, models, tmp_path, capsys):
    out = tmp_path / "int8.onnx"
    report, err = quantize_json([str(models / MODEL), "-o", str(out), "--cameras", str(config_path),
                                 "--frames", "4", "--eval-frames", "3"], capsys)
    assert report["calibration_source"] == f"cameras photos, hall (config {config_path})"
    assert report["eval_source"] == report["calibration_source"]
    assert report["eval_kind"] == "held-out frames of the calibration source"
    # the disabled camera is not read; the dead one is named with why; the folder gives its two
    # images and the clip the rest, held-out frames included
    assert report["cameras"] == {"photos": {"calibration_frames": 2, "eval_frames": 0},
                                 "hall": {"calibration_frames": 2, "eval_frames": 3}}
    assert set(report["skipped_cameras"]) == {"gate"}
    assert (report["calibration_frames"], report["eval_frames"]) == (4, 3)
    assert "warning: camera gate" in err and SECRET not in err + json.dumps(report)
    assert out.is_file() and report["float_boxes"] > 0
    # (no agreement threshold here: calibrating on two bright photos and two frames of the dim
    # corridor measurably costs the corridor's recall, which is what the report is for)


def test_a_camera_calibrates_as_its_file_does(config_path, models, media, tmp_path, capsys):
    """`--camera hall` reads the clip through the daemon's source, `--calibrate` through OpenCV
    here: the same frames, so the same INT8 model and the same figures on the same report frames."""
    common = ["--frames", "4", "--eval", str(tmp_path / "photos"), "--eval-frames", "2"]
    by_camera, _ = quantize_json([str(models / MODEL), "-o", str(tmp_path / "a.onnx"), "--cameras",
                                  str(config_path), "--camera", "hall", *common], capsys)
    by_path, _ = quantize_json([str(models / MODEL), "-o", str(tmp_path / "b.onnx"), "--calibrate",
                                str(media / VIDEO), *common], capsys)
    assert by_camera["calibration_source"] == f"camera hall (config {config_path})"
    assert by_camera["cameras"] == {"hall": {"calibration_frames": 4, "eval_frames": 0}}
    assert by_camera["skipped_cameras"] == {}
    assert (by_camera["eval_kind"], by_camera["eval_frames"]) == ("a separate source", 2)
    for key in ("precision", "recall", "map50", "float_boxes", "int8_boxes", "matched_boxes", "ap_per_class"):
        assert by_camera[key] == by_path[key], key
    assert by_camera["float_boxes"] > 0
    text = format_report(by_camera)
    assert "camera hall: 4 calibration frames, 0 report frames" in text


def test_a_camera_named_is_taken_even_when_disabled(config_path):
    args = build_parser().parse_args(["quantize", "m.onnx", "-o", "o.onnx", "--cameras", str(config_path),
                                      "--camera", "spare", "--camera", "hall", "--camera", "spare"])
    picked = pick_cameras(args, io.StringIO())
    assert [c.name for c in picked] == ["spare", "hall"]
    args = build_parser().parse_args(["quantize", "m.onnx", "-o", "o.onnx", "--cameras", str(config_path)])
    assert [c.name for c in pick_cameras(args, io.StringIO())] == ["photos", "hall", "gate"]


def test_no_camera_gives_a_frame_exits_1(config_path, models, tmp_path, capsys):
    rc = main(["quantize", str(models / MODEL), "-o", str(tmp_path / "o.onnx"), "--cameras", str(config_path),
               "--camera", "gate"])
    err = capsys.readouterr().err
    assert rc == 1, err
    assert "no camera gave a frame" in err and "gate" in err and SECRET not in err
    assert "Traceback" not in err
    assert not (tmp_path / "o.onnx").exists()


def test_no_enabled_camera_exits_1(tmp_path, models, media, capsys):
    path = tmp_path / "off.yaml"
    path.write_text(f"device_id: e\nmodel: {{path: {models / MODEL}}}\n"
                    f"cameras:\n  - {{name: hall, url: {media / VIDEO}, enabled: false}}\n")
    assert main(["quantize", str(models / MODEL), "-o", str(tmp_path / "o.onnx"), "--cameras", str(path)]) == 1
    assert "no enabled camera" in capsys.readouterr().err


def test_a_config_error_exits_78_as_check_prints_it(tmp_path, models, media, capsys):
    path = write_config(tmp_path, models, media, extra="  - {name: porch, url: rtsp://h/s, fsp: 5}\n")
    rc = main(["quantize", str(models / MODEL), "-o", str(tmp_path / "o.onnx"), "--cameras", str(path)])
    err = capsys.readouterr().err
    assert rc == 78
    check_err = io.StringIO()
    assert check.run(build_parser().parse_args(["check", "-c", str(path)]), io.StringIO(), check_err) == 78
    assert check_err.getvalue() == err  # the same lines, FILE:LINE: KEY: MESSAGE
    assert f"{path}:8:" in err and "cameras[4].fsp" in err


def test_cameras_defaults_to_the_daemons_config():
    args = build_parser().parse_args(["quantize", "m.onnx", "-o", "o.onnx", "--cameras"])
    run_args = build_parser().parse_args(["run"])
    assert args.cameras == DEFAULT_PATH == run_args.config


@pytest.mark.parametrize("extra", [
    ["--calibrate", "x", "--cameras", "c.yaml"],  # both
    [],  # neither
])
def test_exactly_one_source_is_required(extra, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["quantize", "m.onnx", "-o", str(tmp_path / "o.onnx"), *extra])
    assert exc.value.code == 2
    assert "--calibrate" in capsys.readouterr().err


def test_camera_options_without_cameras_and_unknown_cameras_are_usage_errors(config_path, tmp_path, capsys):
    base = ["quantize", "m.onnx", "-o", str(tmp_path / "o.onnx")]
    assert main([*base, "--calibrate", "x", "--camera", "hall"]) == 2
    assert "go with --cameras" in capsys.readouterr().err
    assert main([*base, "--calibrate", "x", "--interval", "2"]) == 2
    assert main([*base, "--cameras", str(config_path), "--interval", "-1"]) == 2
    capsys.readouterr()
    assert main([*base, "--cameras", str(config_path), "--camera", "hall", "--camera", "porch"]) == 2
    err = capsys.readouterr().err
    assert "no camera porch" in err and "photos, hall, gate, spare" in err
