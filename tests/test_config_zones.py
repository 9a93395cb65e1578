"""`cameras[].zones`, `lines` and `publish` (issue 17): read into ZoneConfig/LineConfig, and every
mistake reported with its file:line and key path, exit 78 from `yoloedge check`."""

from __future__ import annotations

from pathlib import Path

import pytest

from yoloedge.config.schema import CameraConfig
from yoloedge.config.schema import Anchor, LineConfig, PublishMode, ZoneConfig

from test_config import errors, load, run_check, write

HEAD = "device_id: edge-01\nmodel:\n  path: {model}\ncameras:\n  - name: gate\n    url: rtsp://h/s\n"  # lines 1-6


@pytest.fixture
def model(tmp_path) -> Path:
    path = tmp_path / "yolov8n.onnx"
    path.write_bytes(b"not really a model: the loader never opens it")
    return path


def test_zones_lines_and_publish_are_read(tmp_path, model):
    path = write(tmp_path, (HEAD + """\
    publish: events
    zones:
      - name: yard
        polygon: [[0.05, 0.35], [0.35, 0.35], [0.35, 0.95], [0.05, 0.95]]
        objects: [person, car]
        inertia: 5
      - name: door
        polygon: [[0.5, 0.5], [0.6, 0.5], [0.55, 0.6]]
        anchor: center
    lines:
      - name: gate-in
        points: [[0.5, 0], [0.5, 1]]
        objects: [car]
""").format(model=model))
    camera = load(path).cameras[0]
    assert camera.publish is PublishMode.EVENTS
    assert camera.zones == (
        ZoneConfig("yard", ((0.05, 0.35), (0.35, 0.35), (0.35, 0.95), (0.05, 0.95)), ("person", "car"), 5),
        ZoneConfig("door", ((0.5, 0.5), (0.6, 0.5), (0.55, 0.6)), None, 3, Anchor.CENTER))
    assert camera.lines == (LineConfig("gate-in", ((0.5, 0.0), (0.5, 1.0)), ("car",)),)


def test_defaults_are_no_zones_no_lines_and_both(tmp_path, model):
    camera = load(write(tmp_path, HEAD.format(model=model))).cameras[0]
    assert (camera.zones, camera.lines, camera.publish) == ((), (), PublishMode.BOTH)
    assert camera == CameraConfig(name="gate", url="rtsp://h/s")


TRIANGLE = "        polygon: [[0, 0], [1, 0], [0, 1]]\n"

BAD = [
    # id, text after HEAD (line 7 on), line, key path, message fragment
    ("bow-tie", "    zones:\n      - name: yard\n        polygon: [[0, 0], [1, 1], [1, 0], [0, 1]]\n", 9,
     "cameras[0].zones[0].polygon", "edges 1 and 3 cross"),
    ("two-points", "    zones:\n      - name: yard\n        polygon: [[0, 0], [1, 1]]\n", 9,
     "cameras[0].zones[0].polygon", "a polygon needs at least 3 points, not 2"),
    ("outside-the-frame", "    zones:\n      - name: yard\n        polygon:\n          - [0, 0]\n          - [1.5, 0]\n"
     "          - [0, 1]\n", 11, "cameras[0].zones[0].polygon[1]", "must be a point [x, y] with x and y from 0 to 1"),
    ("flat", "    zones:\n      - name: yard\n        polygon: [[0, 0], [0.5, 0.5], [1, 1]]\n", 9,
     "cameras[0].zones[0].polygon", "encloses no area"),
    ("zone-without-polygon", "    zones:\n      - name: yard\n", 8, "cameras[0].zones[0].polygon",
     "required key is missing"),
    ("inertia-0", "    zones:\n      - name: yard\n" + TRIANGLE + "        inertia: 0\n", 10,
     "cameras[0].zones[0].inertia", "0 is not allowed: must be a whole number from 1 to 300 (e.g. inertia: 3)"),
    ("bad-anchor", "    zones:\n      - name: yard\n" + TRIANGLE + "        anchor: top\n", 10,
     "cameras[0].zones[0].anchor", "must be one of: bottom_center, center"),
    ("zone-name-not-topic-safe", "    zones:\n      - name: front/yard\n" + TRIANGLE, 8,
     "cameras[0].zones[0].name", "must not contain '/', '+', '#'"),
    ("same-point-twice", "    lines:\n      - name: gate\n        points: [[0.5, 0.5], [0.5, 0.5]]\n", 9,
     "cameras[0].lines[0].points", "A and B are the same point"),
    ("three-points", "    lines:\n      - name: gate\n        points: [[0, 0], [0.5, 0.5], [1, 1]]\n", 9,
     "cameras[0].lines[0].points", "must be two points A and B"),
    ("name-of-a-zone-and-a-line", "    zones:\n      - name: gate\n" + TRIANGLE +
     "    lines:\n      - name: gate\n        points: [[0, 0], [1, 1]]\n", 11, "cameras[0].lines[0].name",
     "duplicate zone or line name 'gate' (first used at line 8)"),
    ("two-lines-one-name", "    lines:\n      - name: a\n        points: [[0, 0], [1, 1]]\n      - name: a\n"
     "        points: [[0, 1], [1, 0]]\n", 10, "cameras[0].lines[1].name", "duplicate zone or line name 'a'"),
    ("object-not-in-classes", "    classes: [person]\n    lines:\n      - name: gate\n"
     "        points: [[0, 0], [1, 1]]\n        objects: [car]\n", 11, "cameras[0].lines[0].objects[0]",
     "'car' is not allowed: is not in this camera's classes, so it would never count"),
    ("bad-publish", "    publish: all\n", 7, "cameras[0].publish", "must be one of: events, detections, both"),
    ("empty-objects", "    zones:\n      - name: yard\n" + TRIANGLE + "        objects: []\n",
     10, "cameras[0].zones[0].objects", "must be a non-empty list of label names"),
]


@pytest.mark.parametrize("text, line, key_path, fragment", [case[1:] for case in BAD], ids=[case[0] for case in BAD])
def test_bad_zone_or_line_is_reported_with_its_line(tmp_path, model, text, line, key_path, fragment):
    path = write(tmp_path, (HEAD + text).replace("{model}", str(model)))
    err = errors(path)
    assert len(err.issues) == 1, str(err)
    assert str(err).startswith(f"{path}:{line}: {key_path}: "), str(err)
    assert fragment in str(err)


def test_objects_must_be_labels_the_config_gives_the_model(tmp_path, model):
    labels = tmp_path / "labels.txt"
    labels.write_text("person\ncar\n")
    text = (f"device_id: e\nmodel:\n  path: {model}\n  labels: {labels}\ncameras:\n  - name: gate\n    url: rtsp://h/s\n"
            "    zones:\n      - name: yard\n" + TRIANGLE + "        objects: [car, persn]\n")
    err = errors(write(tmp_path, text))
    assert str(err) == (f"{tmp_path / 'yoloedge.yaml'}:11: cameras[0].zones[0].objects[1]: 'persn' is not allowed: "
                        f"is not one of the model's labels (model.labels) (did you mean 'person'?)")
    listed = text.replace(f"  labels: {labels}\n", "  labels: [person, car]\n").replace("persn", "person")
    assert load(write(tmp_path, listed)).cameras[0].zones[0].objects == ("car", "person")


def test_check_command_exits_78_on_a_bad_zone(tmp_path, model):
    path = write(tmp_path, HEAD.format(model=model) + "    zones:\n      - name: yard\n"
                                                      "        polygon: [[0, 0], [1, 1], [1, 0], [0, 1]]\n")
    result = run_check(path)
    assert result.returncode == 78
    assert result.stderr.startswith(f"{path}:9: cameras[0].zones[0].polygon: not a usable zone outline"), result.stderr
