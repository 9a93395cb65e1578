"""`decoder: dvpp` below the daemon (issue 20): the config's rules, the camera source the card
decodes (`sources.dvpp.DvppSource` on the fake pyACL's VDEC through `pipeline.media.GroupMedia`),
the Ascend backend's NV12 input filled on the card, `check`'s channel and budget notes and `bench
decode dvpp`. The fake decodes for real (PyAV) and counts every call; nothing here decodes on the
host except the tests' own oracles."""

from __future__ import annotations

import subprocess
import sys

import av
import numpy as np
import pytest

from conftest import REPO
from device_helpers import fake_acl as import_fake_acl
from device_helpers import make_om

acl = import_fake_acl()  # the strict fake (tests/fakes/acl)

pytestmark = pytest.mark.shared

CLIP = "street_people_720p.mp4"
MODEL = "yolov8n_coco_int8_qdq.onnx"


@pytest.fixture
def fake_acl():
    acl._fake.reset()
    yield acl._fake
    acl._fake.reset()


def _media(devices=(0,)):
    from yoloedge.config.schema import AcceleratorConfig
    from yoloedge.pipeline.media import GroupMedia
    return GroupMedia("npu", AcceleratorConfig(name="npu", backend="ascend", devices=devices))


def _source(media, clip, camera="cam", lossless=True):
    from yoloedge.sources.base import SourceKind
    from yoloedge.sources.dvpp import DvppSource
    return DvppSource(str(clip), SourceKind.FILE, media.for_camera(camera, 2, lossless=lossless), camera=camera)


def test_a_clip_decodes_on_the_card_frame_for_frame_and_everything_is_released(fake_acl, media):
    """Every frame comes out of VDEC in display order with its media time; the pictures copied
    back match PyAV's own decode of the same frames; the ring never runs dry though the reader
    keeps only every 15th picture; closing releases every DVPP buffer and channel."""
    group = _media()
    source = _source(group, media / CLIP)
    with av.open(str(media / CLIP)) as container:
        oracle = [f.to_ndarray(format="bgr24") for i, f in enumerate(container.decode(video=0)) if i % 15 == 0]
    frames, kept, times = 0, [], []
    while source.grab():
        if frames % 15 == 0:
            placeholder = source.retrieve()
            assert placeholder.shape == (720, 1280, 0)  # no pixels on the host
            picture = source.take_picture()
            kept.append(picture.to_bgr())
            times.append(source.position_s())
            picture.release()
        frames += 1
    assert source.eof and source.error is None
    assert frames == 314 and len(kept) == len(oracle)
    for got, want in zip(kept, oracle):
        assert np.abs(got.astype(int) - want.astype(int)).mean() < 2.5  # NV12 round trip, BT.601
    assert times == sorted(times) and times[1] == pytest.approx(15 / 29.97, abs=0.01)
    source.release()
    group.close()
    report = fake_acl.report()
    device = report["media"]["devices"]["0"]
    assert device["vdec_frames"] == 314 and device["vdec_channels_created"] == device["vdec_channels_destroyed"] == 1
    assert not any(fake_acl.STATE.leaks().values()) and not fake_acl.STATE.refusals


def test_cameras_are_spread_over_the_cards_and_a_reconnect_reuses_the_channel(fake_acl, media):
    group = _media(devices=(0, 1))
    first, second = group.for_camera("a"), group.for_camera("b")
    assert (first.device, second.device) == ("npu/0", "npu/1")
    for _ in range(2):  # a reconnect: the same channel, nothing allocated again
        source = _source(group, media / CLIP, camera="a")
        assert source.grab()
        source.release()
    device = fake_acl.report()["media"]["devices"]["0"]
    assert device["vdec_channels_created"] == 1
    group.remove_camera("a")
    assert fake_acl.report()["media"]["devices"]["0"]["vdec_channels_destroyed"] == 1
    status = group.status()
    assert status["npu/0"]["cameras"] == 0 and status["npu/1"]["cameras"] == 1
    group.close()
    assert not any(fake_acl.STATE.leaks().values())


def test_a_stream_the_card_cannot_decode_fails_that_camera_with_the_reason(fake_acl, media):
    from yoloedge.sources.base import UnsupportedSourceError
    group = _media()
    with pytest.raises(UnsupportedSourceError, match="VDEC decodes H.264 and H.265 only"):
        _source(group, media / "indoor_people_480p_mpeg4.avi")
    group.close()


def test_the_nv12_om_takes_its_input_on_the_card_and_finds_what_the_host_path_finds(fake_acl, models, media,
                                                                                     tmp_path):
    """A YUV420SP AIPP .om: input sets in DVPP memory (device_inputs), described as the RGB image
    AIPP makes; a picture letterboxed by VPC into a slot and run gives the host path's boxes."""
    from yoloedge.backends import create_backend
    from yoloedge.config import ModelConfig
    from yoloedge.pipeline.detector import Detector, open_detector
    om = make_om(tmp_path, models / MODEL, batch=[1, 2], aipp="yuv420sp")
    detector = Detector(ModelConfig(path=str(om), input="aipp"), create_backend("ascend", str(om)), 2,
                        input_sets=2)
    backend = detector.backend
    slots = backend.device_inputs
    assert slots is not None and len(slots) == 2 and slots[0][1] == 640 * 640 * 3 // 2
    assert detector.input.height == detector.input.width == 640
    assert fake_acl.STATE.allocated("dvpp", 0) >= 2 * 2 * 640 * 640 * 3 // 2
    detector.warm_up()  # every gear, on what the card's memory holds

    group = _media()
    source = _source(group, media / CLIP)
    assert source.grab()
    source.retrieve()
    picture = source.take_picture()
    geometry = picture.letterbox_into(slots[1][0], 640, 640)
    host = picture.to_bgr()
    picture.release()
    ours = detector.postprocess(backend.run(1, input_set=1), [geometry])[0]
    peer = open_detector(ModelConfig(path=str(models / MODEL))).detect([host])[0]
    confident = [(int(c), b) for c, s, b in zip(peer.class_ids, peer.scores, peer.boxes) if s >= 0.5]
    assert confident
    for cls, box in confident:
        ious = [_iou(box, b) for c, b in zip(ours.class_ids, ours.boxes) if int(c) == cls]
        assert ious and max(ious) >= 0.8
    source.release()
    backend.close()
    group.close()
    assert not any(fake_acl.STATE.leaks().values())


def _iou(a, b) -> float:
    x1, y1, x2, y2 = max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3])
    inter = max(0.0, x2 - x1) * max(0.0, y2 - y1)
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def test_host_frames_into_an_nv12_model_and_dvpp_without_a_card_are_refused(fake_acl, media, tmp_path):
    """A host frame cannot go into the card's input sets, and a dvpp camera without a card's
    media engine says what it needs."""
    from yoloedge.config import CameraConfig
    from yoloedge.sources.base import UnsupportedSourceError
    from yoloedge.sources.opening import open_camera
    with pytest.raises(UnsupportedSourceError, match="convert atc --aipp yuv420sp"):
        open_camera(CameraConfig(name="c", url=str(media / CLIP), decoder="dvpp"))
    source, used = open_camera(CameraConfig(name="c", url=str(media / CLIP), decoder="auto"))
    assert used.value != "dvpp"  # no card: auto decodes on the host
    source.release()


@pytest.mark.parametrize("url, backend, problem", [
    ("rtsp://cam/stream", "onnxruntime", "backend: onnxruntime"),
    ("/dev/video0", "ascend", "reads rtsp:// cameras and video files only"),
    ("http://cam/mjpeg", "ascend", "MJPEG cameras are decoded on the host"),
    ("synthetic://640x480?fps=5", "ascend", "reads rtsp:// cameras"),
])
def test_the_config_refuses_dvpp_where_it_cannot_work(tmp_path, url, backend, problem):
    from yoloedge.config.errors import ConfigError
    from yoloedge.config.loader import load_config
    path = tmp_path / "c.yaml"
    path.write_text(f"device_id: edge1\nmodel:\n  path: {tmp_path / 'm.onnx'}\naccelerators:\n  - backend: {backend}\n"
                    f"cameras:\n  - name: a\n    url: {url}\n    decoder: dvpp\n")
    (tmp_path / "m.onnx").write_bytes(b"x")
    with pytest.raises(ConfigError) as caught:
        load_config(str(path), {})
    assert problem in str(caught.value) and "c.yaml:9: cameras[0].decoder" in str(caught.value), str(caught.value)


def test_check_notes_cameras_over_a_cards_channels_and_budget(tmp_path):
    from yoloedge.cli.check import dvpp_notes
    from yoloedge.config.loader import load_config
    cameras = "".join(f"  - name: c{i}\n    url: rtsp://cam{i}/s\n    decoder: dvpp\n" for i in range(20))
    path = tmp_path / "c.yaml"
    (tmp_path / "m.om").write_bytes(b"x")
    path.write_text(f"device_id: edge1\nmodel:\n  path: {tmp_path / 'm.om'}\n  input: aipp\n"
                    f"accelerators:\n  - backend: ascend\n    devices: [0]\ncameras:\n{cameras}")
    notes = dvpp_notes(load_config(str(path), {}))
    assert any("Ascend310:" not in n and "on an Ascend310," in n and "20 cameras a card" in n for n in notes), notes
    assert not any("Ascend310P3" in n for n in notes), notes  # 20 x 30 fps fits a 310P's 256 channels and budget


def test_bench_decode_runs_dvpp_on_the_fake(media):
    env = {"PYTHONPATH": f"{REPO / 'tests' / 'fakes'}:{REPO}", "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-m", "yoloedge", "bench", "decode", "--clip", str(media / CLIP),
                             "--decoders", "dvpp,opencv", "--rounds", "2"], cwd=REPO, capture_output=True,
                            text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line.split() for line in result.stdout.splitlines()[2:]}
    assert rows["dvpp"][1:3] == ["dvpp", "314"], result.stdout
