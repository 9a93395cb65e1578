"""Post-processing asked for a tracker's low-score candidates (`floor`): one decode and NMS whose
confident part is exactly what the model's thresholds alone give."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from yoloedge.config import ModelConfig
from yoloedge.demo import LABELS, MODEL, clip_path
from yoloedge.pipeline.detector import open_detector


@pytest.fixture(scope="module")
def frames() -> list[np.ndarray]:
    cap = cv2.VideoCapture(str(clip_path()))
    out = []
    for _ in range(12):  # objects come and go over the first second of the clip
        ok, frame = cap.read()
        assert ok
        out.append(frame)
    cap.release()
    return out


@pytest.mark.parametrize("class_conf", [{}, {"circle": 0.6, "star": 0.3}])
def test_the_confident_candidates_are_exactly_the_detections_without_a_floor(frames, class_conf):
    detector = open_detector(ModelConfig(path=str(MODEL), labels=str(LABELS), conf=0.4, class_conf=class_conf))
    lows = 0
    for frame in frames:
        geometry = detector.preprocess([frame])[0]
        outputs = [o[0] for o in detector.infer(1)]
        plain = detector.postprocess_one(outputs, geometry)
        floored = detector.postprocess_one(outputs, geometry, 0.1)
        assert plain.confident is None and floored.confident is not None
        sure = floored.take(floored.confident)
        np.testing.assert_array_equal(sure.boxes, plain.boxes)
        np.testing.assert_array_equal(sure.scores, plain.scores)
        np.testing.assert_array_equal(sure.class_ids, plain.class_ids)
        low = floored.scores[~floored.confident]
        assert np.all(low > 0.1)
        lows += len(low)
    assert lows > 0  # the floor did keep candidates the thresholds drop
