"""The `tracking:` keys: top-level defaults, per-camera overrides merged key by key, and bad values
reported with file, line and key like every other key."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from yoloedge.config.errors import ConfigError
from yoloedge.config.loader import load_config
from yoloedge.config.schema import TrackingConfig

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def model(tmp_path) -> Path:
    path = tmp_path / "m.onnx"
    path.write_bytes(b"never opened by the loader")
    return path


def write(tmp_path: Path, model: Path, text: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(f"device_id: e\nmodel: {{path: {model}}}\n" + textwrap.dedent(text).lstrip("\n"))
    return path


def test_defaults_are_upstream_bytetrack_as_documented(tmp_path, model):
    config = load_config(str(write(tmp_path, model, "cameras: [{name: a, url: rtsp://h/s}]\n")), {})
    assert config.tracking == TrackingConfig()
    assert config.cameras[0].tracking == TrackingConfig()
    t = TrackingConfig()
    assert (t.enabled, t.min_hits, t.lost_s, t.high_score, t.low_score, t.match_thresh) == \
           (True, 3, 2.0, 0.25, 0.1, 0.8)
    example = (REPO / "etc" / "yoloedge" / "yoloedge.yaml").read_text()
    assert "\ntracking:\n  enabled: true\n  min_hits: 3 " in example


def test_cameras_override_the_top_level_key_by_key(tmp_path, model):
    path = write(tmp_path, model, """
        tracking: {min_hits: 2, high_score: 0.5}
        cameras:
          - {name: a, url: rtsp://h/s, tracking: {lost_s: 5, low_score: 0.3}}
          - {name: b, url: rtsp://h/s}
          - {name: c, url: rtsp://h/s, tracking: {enabled: false, min_hits: 4}}
        """)
    config = load_config(str(path), {})
    top = TrackingConfig(min_hits=2, high_score=0.5)
    assert config.tracking == top
    a, b, c = (camera.tracking for camera in config.cameras)
    assert a == TrackingConfig(min_hits=2, high_score=0.5, lost_s=5.0, low_score=0.3)
    assert b == top
    assert c == TrackingConfig(enabled=False, min_hits=4, high_score=0.5)


@pytest.mark.parametrize("text, line, key_path, fragment", [
    ("tracking:\n  lost_s: 0\n", 4, "tracking.lost_s", "must be a number > 0 and <= 3600"),
    ("tracking:\n  min_hits: 1.5\n", 4, "tracking.min_hits", "must be a whole number from 1 to 1000"),
    ("tracking:\n  hi_score: 0.3\n", 4, "tracking.hi_score", "did you mean 'high_score'?"),
    ("tracking:\n  low_score: 0.5\n", 4, "tracking.low_score", "low_score (0.5) must be <= high_score (0.25)"),
    ("cameras:\n  - name: a\n    url: rtsp://h/s\n    tracking:\n      match_thresh: 2\n", 7,
     "cameras[0].tracking.match_thresh", "must be a number from 0 to 1"),
    ("cameras:\n  - name: a\n    url: rtsp://h/s\n    tracking: true\n", 6, "cameras[0].tracking",
     "must be a mapping"),
    # the order is checked on what the camera gets: its low_score against the top level's high_score
    ("tracking: {high_score: 0.2}\ncameras:\n  - name: a\n    url: rtsp://h/s\n    tracking:\n"
     "      low_score: 0.22\n", 8, "cameras[0].tracking.low_score", "low_score (0.22) must be <= high_score (0.2)"),
], ids=["lost-zero", "hits-fraction", "unknown-key", "low-above-high", "camera-bound", "camera-not-mapping",
        "camera-low-above-top-high"])
def test_bad_tracking_keys_are_reported_with_their_line(tmp_path, model, text, line, key_path, fragment):
    path = write(tmp_path, model, text)
    with pytest.raises(ConfigError) as info:
        load_config(str(path), {})
    err = info.value
    assert len(err.issues) == 1, str(err)
    assert (err.issues[0].line, err.issues[0].key_path) == (line, key_path), str(err)
    assert fragment in str(err)
