"""The simulated accelerator: the real model's outputs for one image, at a chosen device speed.

The demo model and a frame of the demo clip (both ship with the package) are the real parts: what
the simulated device returns must be what ONNX Runtime computes for that frame, and the time it
takes must be what `device_ms` says (measured on an injected clock, never on the wall clock).
"""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from yoloedge import demo
from yoloedge.backends import backend_config_for, create_backend
from yoloedge.backends.simulated import SimulatedBackend
from yoloedge.config import AcceleratorConfig, ModelConfig
from yoloedge.config.simulated import SimulatedConfig
from yoloedge.pipeline.detector import Detector, open_detector
from yoloedge.errors import BackendError


@pytest.fixture(scope="module")
def shot(tmp_path_factory):
    cap = cv2.VideoCapture(str(demo.clip_path()))
    ok, frame = cap.read()
    cap.release()
    assert ok
    path = tmp_path_factory.mktemp("sim") / "shot.png"
    cv2.imwrite(str(path), frame)
    return path, frame


class SleepClock:
    """time.perf_counter and time.sleep for the backend, advancing only when it sleeps."""

    def __init__(self):
        self.now = 0.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def as_dicts(dets, labels):
    return [(d["label"], round(d["score"], 5), [round(v, 2) for v in d["box"]]) for d in dets.to_dicts(labels)]


def test_it_returns_the_real_models_detections_for_its_image(shot):
    path, frame = shot
    real = open_detector(ModelConfig(path=str(demo.MODEL)))
    expected = as_dicts(real.detect([frame])[0], real.labels)
    assert expected, "the demo frame has shapes in it"
    sim = Detector(ModelConfig(path=str(demo.MODEL)),
                   SimulatedBackend(str(demo.MODEL), SimulatedConfig(device_ms=(0.0, 0.1), image=str(path))),
                   max_batch=4)
    # Whatever is letterboxed in, the device "saw" the recorded frame: every slot gives its detections.
    grey = np.full_like(frame, 114)
    for dets in sim.detect([grey, frame, grey]):
        assert as_dicts(dets, sim.labels) == expected
    real.close()
    sim.close()


def test_a_run_takes_base_plus_per_frame_time_on_the_injected_clock(shot):
    path, _ = shot
    clock = SleepClock()
    backend = SimulatedBackend(str(demo.MODEL), SimulatedConfig(device_ms=(4.0, 2.0), image=str(path)),
                               sleep=clock.sleep, clock=clock.clock)
    backend.open(8, input_sets=2, output_sets=3)
    for n, expected_ms in ((8, 20.0), (1, 6.0), (3, 10.0)):
        before = clock.now
        outs = backend.run(n, input_set=1, output_set=2)
        assert clock.now - before == pytest.approx(expected_ms / 1000)
        assert outs[0].shape[0] == n
    assert backend.runs == 3
    backend.close()


def test_buffers_are_allocated_once_per_set_and_runs_return_views_of_them(shot):
    path, _ = shot
    backend = SimulatedBackend(str(demo.MODEL), SimulatedConfig(device_ms=(0.0, 0.01), image=str(path)))
    spec = backend.open(4, input_sets=3, output_sets=2)
    assert len(backend.input_buffers) == 3
    assert len({b.ctypes.data for b in backend.input_buffers}) == 3  # three distinct buffers
    assert backend.input_buffers[0].shape == spec.input.shape == (4, 3, 320, 320)
    first = backend.run(4, 0, 1)[0]
    again = backend.run(2, 2, 1)[0]
    assert np.shares_memory(first, again)
    other = backend.run(2, 2, 0)[0]
    assert not np.shares_memory(first, other)
    with pytest.raises(BackendError):
        backend.run(5, 0, 0)
    with pytest.raises(BackendError):
        backend.run(1, 3, 0)
    backend.close()


def test_aipp_input_is_uint8_nhwc_and_gives_the_same_detections(shot):
    path, frame = shot
    config = SimulatedConfig(device_ms=(0.0, 0.01), image=str(path), input="aipp")
    det = Detector(ModelConfig(path=str(demo.MODEL)), SimulatedBackend(str(demo.MODEL), config), max_batch=2)
    assert det.backend.input_buffer.dtype == np.uint8 and det.backend.input_buffer.shape == (2, 320, 320, 3)
    assert det.input.nhwc
    host = Detector(ModelConfig(path=str(demo.MODEL)),
                    SimulatedBackend(str(demo.MODEL), SimulatedConfig(device_ms=(0.0, 0.01), image=str(path))))
    assert as_dicts(det.detect([frame])[0], det.labels) == as_dicts(host.detect([frame])[0], host.labels)
    det.close()
    host.close()


def test_the_registry_and_config_make_one_per_device(shot, tmp_path):
    path, _ = shot
    acc = AcceleratorConfig(backend="simulated", devices=(0, 1),
                            options={"device_ms": (1.0, 0.5), "image": str(path), "input": "host"})
    config = backend_config_for(acc, 1)
    assert config == SimulatedConfig(device_id=1, device_ms=(1.0, 0.5), image=str(path))
    backend = create_backend("simulated", str(demo.MODEL), config)
    assert isinstance(backend, SimulatedBackend)
    backend.open(1)
    assert "simulated device 1" in backend.description and "0.5 ms/frame" in backend.description
    backend.close()
