"""End-to-end truth: the daemon processes the demo clip (file source, realtime: false), a test
subscriber collects the detections over MQTT, and they are scored against the clip's ground truth.
mAP@0.5 must be >= 0.90 and every frame must be published exactly once."""

from __future__ import annotations

import json

import pytest

from daemon_harness import Daemon, NotifySocket, write_config
from map_eval import average_precision
from yoloedge.demo import LABELS, MODEL, TRUTH, clip_path


@pytest.fixture()
def notify(tmp_path):
    sock = NotifySocket(tmp_path / "notify.sock")
    yield sock
    sock.close()


def test_daemon_over_mqtt_matches_the_demo_ground_truth(tmp_path, mosquitto, subscriber, notify):
    truth = json.loads(TRUTH.read_text())
    n_frames = len(truth["frames"])
    config = {
        "device_id": "truth",
        "model": {"path": str(MODEL), "labels": str(LABELS)},
        "accelerators": [{"backend": "onnxruntime", "devices": [0], "batch": 4, "batch_timeout_ms": 20}],
        "cameras": [{"name": "clip", "url": str(clip_path()), "realtime": False}],
        "mqtt": {"host": mosquitto.host, "port": mosquitto.port, "topic_prefix": "t"},
        "control": {"socket": str(tmp_path / "ctl.sock")},
    }
    daemon = Daemon(write_config(tmp_path / "c.yaml", config), notify)
    try:
        notify.wait_for("READY", "1", timeout=60)
        topic = "t/truth/cameras/clip/detections"
        assert subscriber.wait_for(lambda ms: len(ms) >= n_frames, 120, topic=topic), daemon.log[-3000:]
        assert daemon.stop() == 0, daemon.log[-3000:]
    finally:
        daemon.kill()
    messages = subscriber.payloads(topic)
    frames = [m["frame"] for m in messages]
    assert sorted(frames) == list(range(n_frames)), "every frame exactly once"
    predictions = {m["frame"]: m["detections"] for m in messages}
    truths = {f["index"]: f["objects"] for f in truth["frames"]}
    mean_ap, per_class = average_precision(predictions, truths, iou=0.5)
    print(f"\ndemo clip over MQTT: mAP@0.5 = {mean_ap:.3f}; per class {per_class}")
    assert mean_ap >= 0.90, per_class
