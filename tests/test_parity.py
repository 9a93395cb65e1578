"""Parity with each family's upstream inference code, on every shared model x image x setting and
on the two shared videos frame by frame (references made by Ultralytics, YOLOv5 and YOLOX)."""

from __future__ import annotations

import json

import cv2
import pytest

from parity import mismatches
from yoloedge.config import ModelConfig
from yoloedge.detector import open_detector

pytestmark = pytest.mark.shared


def _reference_files(references, kind):
    files = []
    for path in sorted(references.glob("*.json")):
        data = json.loads(path.read_text())
        if ("frames" in data) == (kind == "video"):
            files.append(path)
    return files


def _detector(models, ref, **extra):
    iou = ref["iou"] if ref["iou"] is not None else 0.45
    return open_detector(ModelConfig(path=str(models / ref["model"]), conf=ref["conf"], iou=iou, **extra))


def test_every_shared_model_and_image_has_a_reference(models, media, references):
    """Guards the parametrisation below: a new model or image without references is noticed."""
    have = {(p.name.split("__")[0], p.name.split("__")[1]) for p in references.glob("*.json")}
    for model in models.glob("*.onnx"):
        for image in media.glob("*.jpg"):
            assert (model.stem, image.stem) in have, f"no reference for {model.name} x {image.name}"


@pytest.mark.parametrize("ref_name", [
    p.name for p in _reference_files(__import__("conftest").SHARED / "reference", "image")
] if (__import__("conftest").SHARED / "reference").is_dir() else ["missing"])
def test_image_parity(ref_name, models, media, references):
    ref = json.loads((references / ref_name).read_text())
    detector = _detector(models, ref)
    image = cv2.imread(str(media / ref["media"]))
    assert [image.shape[0], image.shape[1]] == ref["image_size"]
    ours = detector.detect([image])[0].to_dicts(detector.labels)
    assert ours, "no detections at all"
    problems = mismatches(ours, ref["detections"])
    assert not problems, "\n".join(problems)
    assert {d["label"] for d in ours} >= {d["label"] for d in ref["detections"] if d["score"] >= 0.3}


@pytest.mark.parametrize("ref_name", [
    "yolov8n_coco_int8__street_people_720p__conf25_iou45.json",
    "yolov8n_coco_int8__indoor_people_480p_mpeg4__conf25_iou45.json",
])
def test_video_parity_frame_by_frame(ref_name, models, media, references):
    ref = json.loads((references / ref_name).read_text())
    video = next(media.glob(ref["media"]))
    detector = _detector(models, ref)
    cap = cv2.VideoCapture(str(video))
    failures, index = [], 0
    try:
        while True:
            ok, frame = cap.read()
            if not ok:
                break
            expected = ref["frames"][index]
            assert expected["index"] == index
            ours = detector.detect([frame])[0].to_dicts(detector.labels)
            failures += [f"frame {index}: {p}" for p in mismatches(ours, expected["detections"])]
            index += 1
    finally:
        cap.release()
    assert index == len(ref["frames"]), f"decoded {index} frames, reference has {len(ref['frames'])}"
    assert not failures, f"{len(failures)} mismatches:\n" + "\n".join(failures[:20])
