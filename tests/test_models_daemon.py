"""The daemon with two named models (issue 19): two real models of different input sizes on one
accelerator, folder cameras routed to one, the other or both; every published frame carries the
boxes that model's upstream code finds, each camera hears only from its own models, and status
reports per model.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from daemon_harness import ctl, status, write_config
from device_helpers import make_om
from parity import mismatches
from test_daemon import base_config, notify, start_daemon, topic  # noqa: F401  (fixtures)

pytestmark = pytest.mark.shared

V8, YOLOX = "yolov8n_coco_int8.onnx", "yolox_nano_coco_416.onnx"
PHOTOS = ("bus.jpg", "zidane.jpg")  # a folder camera reads them in name order: frames 0 and 1


def photo_folder(tmp_path: Path, media: Path, name: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    for photo in PHOTOS:
        (folder / photo).symlink_to(media / photo)
    return folder


def reference(references: Path, model: str, photo: str) -> list[dict]:
    stem = Path(photo).stem
    return json.loads((references / f"{model[:-5]}__{stem}__conf25_iou45.json").read_text())["detections"]


def two_model_config(tmp_path, models, media, broker, cameras: list[dict], **extra) -> dict:
    config = base_config(tmp_path, models, broker, cameras, **extra)
    del config["model"]
    config["models"] = [{"name": "coco", "path": str(models / V8)},
                        {"name": "nano", "path": str(models / YOLOX)}]
    config["accelerators"][0]["batch"] = 2
    return config


def test_two_models_two_cameras_routed_differently(tmp_path, models, media, references, mosquitto, subscriber,
                                                    notify, start_daemon):
    folder = photo_folder(tmp_path, media, "photos")
    config = two_model_config(tmp_path, models, media, mosquitto, [
        {"name": "door", "url": str(folder), "realtime": False, "models": ["coco"]},
        {"name": "yard", "url": str(folder), "realtime": False, "models": ["nano"]},
        {"name": "gate", "url": str(folder), "realtime": False},  # every model of its accelerator
    ])
    daemon, path = start_daemon(config)
    notify.wait_for("READY", "1", timeout=90)
    expected = {"door": {"coco"}, "yard": {"nano"}, "gate": {"coco", "nano"}}

    def published(camera: str) -> list[dict]:
        return subscriber.payloads(topic("cameras", camera, "detections"))

    assert subscriber.wait_for(lambda ms: all(len(published(c)) >= len(PHOTOS) * len(m)
                                              for c, m in expected.items()), 120), daemon.log
    for camera, wanted in expected.items():
        messages = published(camera)
        assert len(messages) == len(PHOTOS) * len(wanted), camera  # each frame once per model, no more
        assert {m["model"] for m in messages} == wanted, camera
        assert sorted((m["model"], m["frame"]) for m in messages) == sorted(
            (name, frame) for name in wanted for frame in range(len(PHOTOS)))
        for message in messages:
            model = V8 if message["model"] == "coco" else YOLOX
            problems = mismatches(message["detections"], reference(references, model, PHOTOS[message["frame"]]))
            assert not problems, f"{camera} {message['model']} frame {message['frame']}: {problems}"

    st = status(config["control"]["socket"])
    cameras = {c["name"]: c for c in st["cameras"]}
    assert set(cameras["door"]["models"]) == {"coco"} and set(cameras["gate"]["models"]) == {"coco", "nano"}
    assert cameras["gate"]["models"]["nano"]["published"] == len(PHOTOS)
    assert cameras["gate"]["published"] == 2 * len(PHOTOS)  # one result per frame and model
    (worker,) = st["accelerators"]
    rows = {m["name"]: m for m in worker["models"]}
    assert rows["coco"]["state"] == rows["nano"]["state"] == "running"
    assert rows["coco"]["batches"] > 0 and rows["nano"]["batches"] > 0
    assert "coco,nano" in ctl(config["control"]["socket"], "status").stdout

    # models change only on restart: a reload whose camera names a model only the new file has is
    # refused with the camera's name, and everything goes on as it was
    config["models"].append({"name": "extra", "path": str(models / V8)})
    config["cameras"][0]["models"] = ["extra"]
    write_config(path, config)
    result = ctl(config["control"]["socket"], "reload")
    assert result.returncode != 0
    st = status(config["control"]["socket"])
    assert "camera door names a model" in st["daemon"]["config_error"] and st["daemon"]["generation"] == 1
    assert [c["name"] for c in st["cameras"]] == ["door", "yard", "gate"]
    assert daemon.stop(timeout=30) == 0, daemon.log


def test_a_model_that_cannot_be_loaded_does_not_take_the_other_down(tmp_path, models, media, references,
                                                                     mosquitto, subscriber, notify, start_daemon):
    folder = photo_folder(tmp_path, media, "photos")
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"this is no model")
    config = two_model_config(tmp_path, models, media, mosquitto, [
        {"name": "door", "url": str(folder), "realtime": False},
        {"name": "yard", "url": str(folder), "realtime": False, "models": ["nano"]},
    ])
    config["models"][1]["path"] = str(broken)
    daemon, _ = start_daemon(config)
    notify.wait_for("READY", "1", timeout=90)
    assert subscriber.wait_for(
        lambda ms: len(subscriber.payloads(topic("cameras", "door", "detections"))) >= len(PHOTOS), 90), daemon.log
    door = subscriber.payloads(topic("cameras", "door", "detections"))
    assert {m["model"] for m in door} == {"coco"}
    for message in door:
        assert not mismatches(message["detections"], reference(references, V8, PHOTOS[message["frame"]]))
    st = status(config["control"]["socket"])
    cameras = {c["name"]: c for c in st["cameras"]}
    assert "broken.onnx" in (cameras["door"]["models"]["nano"]["error"] or "")
    assert cameras["yard"]["state"] == "failed" and "nano" in (cameras["yard"]["error"] or "")
    assert any("model nano could not be loaded" in p for p in st["daemon"]["problems"])
    (worker,) = st["accelerators"]
    assert {m["name"]: m["state"] for m in worker["models"]} == {"coco": "running", "nano": "failed"}
    assert daemon.stop(timeout=30) == 0, daemon.log


def test_two_models_on_two_fake_ascend_cards_share_each_cards_context(tmp_path, models, media, references,
                                                                       mosquitto, subscriber, notify, start_daemon):
    """On Ascend every model of a device runs in that device's one context (the strict fake counts
    contexts, refuses another model's dataset, and runs each .om's ONNX for real)."""
    folder = photo_folder(tmp_path, media, "photos")
    report = tmp_path / "acl-report.json"
    config = two_model_config(tmp_path, models, media, mosquitto, [
        {"name": "door", "url": str(folder), "realtime": False, "models": ["coco"]},
        {"name": "gate", "url": str(folder), "realtime": False},
    ])
    config["models"] = [{"name": "coco", "path": str(make_om(tmp_path, models / V8, batch=[1, 2]))},
                        {"name": "nano", "path": str(make_om(tmp_path, models / YOLOX))}]
    config["accelerators"] = [{"backend": "ascend", "devices": [0, 1], "batch": 2}]
    daemon, _ = start_daemon(config, env={"YOLOEDGE_FAKE_ACL_REPORT": str(report)})
    notify.wait_for("READY", "1", timeout=90)
    expected = {"door": {"coco"}, "gate": {"coco", "nano"}}

    def published(camera: str) -> list[dict]:
        return subscriber.payloads(topic("cameras", camera, "detections"))

    assert subscriber.wait_for(lambda ms: all(len(published(c)) >= len(PHOTOS) * len(m)
                                              for c, m in expected.items()), 120), daemon.log
    for camera, wanted in expected.items():
        messages = published(camera)
        assert len(messages) == len(PHOTOS) * len(wanted) and {m["model"] for m in messages} == wanted
        for message in messages:
            model = V8 if message["model"] == "coco" else YOLOX
            problems = mismatches(message["detections"], reference(references, model, PHOTOS[message["frame"]]))
            assert not problems, f"{camera} {message['model']} frame {message['frame']}: {problems}"
    workers = status(config["control"]["socket"])["accelerators"]
    for worker in workers:
        rows = {m["name"]: m for m in worker["models"]}
        assert rows["coco"]["state"] == rows["nano"]["state"] == "running"
        assert rows["coco"]["memory"]["device_bytes"] > rows["nano"]["memory"]["device_bytes"] > 0
    assert daemon.stop(timeout=30) == 0, daemon.log
    summary = json.loads(report.read_text())
    assert summary["contexts_created"] == 2, summary["calls"]  # one per card, not one per model
    assert summary["models_loaded"] == 4  # both models on both cards
    assert summary["init_count"] == summary["finalize_count"] == 1
    # the one refusal allowed: the backend asking a static-batch model for its dynamic-batch input
    probe = "acl.mdl.get_input_index_by_name"
    assert not [r for r in summary["refusals"] if r[0] != probe], summary["refusals"]
    assert not [e for e in summary["errors"] if e[0] != probe], summary["errors"]
    assert not any(summary["leaks"].values()), summary["leaks"]
