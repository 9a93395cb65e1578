"""The Ascend (pyACL) backend against the fake pyACL in tests/fakes/acl.

The fake keeps pyACL's return shapes, codes and refusals (no context on a thread, too-small
buffers, bad gears, double frees, finalize with resources held) and runs the ONNX file a test pairs
with each fake `.om` through ONNX Runtime, so the detections can be compared with the ONNX Runtime
backend's on the same images. The daemon tests at the end run `yoloedge run` on two fake cards.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import pytest

from device_helpers import fake_acl, in_thread, make_om

acl = fake_acl()  # the strict fake (tests/fakes/acl)
pytest.importorskip("onnx")

from acl import _fake  # noqa: E402
from onnx_models import expected_scores, make_dynamic_batch_v8_model, make_fixed_batch_v8_model  # noqa: E402
from parity import mismatches, without_track_ids  # noqa: E402
from yoloedge.backends import acl_runtime, backend_config_for, create_backend  # noqa: E402
from yoloedge.backends import npu_smi as npu_smi_module  # noqa: E402
from yoloedge.backends.acl_runtime import AclError  # noqa: E402
from yoloedge.backends.ascend import AscendBackend  # noqa: E402
from yoloedge.backends.onnxruntime import OnnxRuntimeBackend  # noqa: E402
from yoloedge.config import ModelConfig  # noqa: E402
from yoloedge.config.ascend import AscendConfig  # noqa: E402
from yoloedge.config.errors import ConfigError  # noqa: E402
from yoloedge.config.loader import load_config  # noqa: E402
from yoloedge.pipeline.detector import Detector  # noqa: E402
from yoloedge.errors import BackendUnavailableError, ModelError  # noqa: E402

SIZE = 64
ANCHORS = (SIZE // 8) ** 2 + (SIZE // 16) ** 2 + (SIZE // 32) ** 2
ALLOCATING_CALLS = ("acl.rt.malloc", "acl.rt.malloc_host", "acl.rt.free", "acl.rt.free_host",
                    "acl.mdl.create_dataset", "acl.create_data_buffer", "acl.mdl.add_dataset_buffer",
                    "acl.mdl.create_desc", "acl.rt.create_stream", "acl.rt.create_context")
GEARS = [1, 2, 4, 8]


# -- fixtures and helpers ---------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def fake_process(monkeypatch):
    """Every test is a fresh process for pyACL: one acl.init each, counters at zero."""
    state = _fake.reset()
    monkeypatch.setattr(acl_runtime, "PROCESS", acl_runtime.AclProcess())
    yield state


def opened(om: Path, max_batch: int = 1, **config) -> AscendBackend:
    backend = AscendBackend(str(om), AscendConfig(**config))
    backend.open(max_batch)
    return backend


def class_scores(out: np.ndarray) -> np.ndarray:
    """Synthetic model: class 0 score on anchor 0, class 1 on the first stride-16 anchor."""
    return np.stack([out[:, 4, 0], out[:, 5, (SIZE // 8) ** 2]], axis=1)


@pytest.fixture(scope="module")
def tiny_onnx(tmp_path_factory) -> Path:
    return make_dynamic_batch_v8_model(tmp_path_factory.mktemp("tiny") / "tiny_dynamic.onnx", size=SIZE)


@pytest.fixture
def tiny_om(tmp_path, tiny_onnx) -> Path:
    return make_om(tmp_path, tiny_onnx, "tiny.om", batch=GEARS)


def load_image(media: Path, name: str) -> np.ndarray:
    image = cv2.imread(str(media / name))
    assert image is not None
    return image


def detections(detector: Detector, images) -> list[list[dict]]:
    return [d.to_dicts(detector.labels) for d in detector.detect(images)]


# -- the model description drives the spec --------------------------------------------------------
def test_dynamic_batch_model_spec_and_buffers(tiny_om):
    backend = opened(tiny_om, max_batch=8)
    try:
        spec = backend.open(8)  # already open: the same spec again
        assert spec.input.shape == (8, 3, SIZE, SIZE) and spec.input.dtype == np.float32
        assert [o.shape for o in spec.outputs] == [(-1, 6, ANCHORS)]
        assert backend.max_batch == 8 and backend.batch_sizes == (1, 2, 4, 8)
        assert "gears 1/2/4/8" in backend.description and "Ascend310P3" in backend.description
        # The input buffer the letterbox fills is the pinned host memory itself.
        region = _fake.STATE.find(backend.input_buffer.ctypes.data, backend.input_buffer.nbytes)
        assert region.kind == "host" and region.ptr == backend.input_buffer.ctypes.data
    finally:
        backend.close()


def test_capacity_follows_the_requested_batch_within_the_gears(tiny_om):
    three, many = opened(tiny_om, max_batch=3), opened(tiny_om, max_batch=20, device_id=1)
    try:
        assert three.max_batch == 3 and three.batch_sizes == (1, 2, 4)
        assert three.input_buffer.shape[0] == 3
        assert many.max_batch == 8 and many.batch_sizes == (1, 2, 4, 8)
    finally:
        three.close()
        many.close()


def test_static_batch_model(tmp_path):
    onnx_path = make_fixed_batch_v8_model(tmp_path / "fixed1.onnx", size=SIZE)
    om = make_om(tmp_path, onnx_path, batch=2)
    backend = opened(om, max_batch=4)
    try:
        assert backend.max_batch == 2 and backend.batch_sizes == (2,)
        assert _fake.STATE.counts["acl.mdl.set_dynamic_batch_size"] == 0
        buf = backend.input_buffer
        buf[...] = np.random.default_rng(3).random(buf.shape, dtype=np.float32)
        out = backend.run(1)[0]
        assert out.shape == (1, 6, ANCHORS)
        np.testing.assert_allclose(class_scores(out), expected_scores(buf[:1]), rtol=1e-5)
        assert _fake.STATE.counts["acl.mdl.set_dynamic_batch_size"] == 0
    finally:
        backend.close()


# -- dynamic batch gears ----------------------------------------------------------------------------
def test_batches_pick_the_smallest_gear_that_fits(tiny_om, monkeypatch):
    calls = []
    real = acl.mdl.set_dynamic_batch_size

    def spy(model_id, dataset, index, batch):
        calls.append(batch)
        return real(model_id, dataset, index, batch)

    monkeypatch.setattr(acl.mdl, "set_dynamic_batch_size", spy)
    backend = opened(tiny_om, max_batch=8)
    try:
        buf = backend.input_buffer
        buf[...] = np.random.default_rng(7).random(buf.shape, dtype=np.float32)
        _fake.STATE.executed_gears.clear()
        for n in (1, 2, 3, 5, 8):
            out = backend.run(n)[0]
            assert out.shape == (n, 6, ANCHORS)
            np.testing.assert_allclose(class_scores(out), expected_scores(buf[:n]), rtol=1e-5)
        assert calls == [1, 2, 4, 8, 8]
        assert _fake.STATE.executed_gears == [1, 2, 4, 8, 8]
    finally:
        backend.close()


def test_only_the_real_frames_are_copied(tiny_om, monkeypatch):
    sizes = []
    real = acl.rt.memcpy

    def spy(dst, dest_max, src, count, kind):
        sizes.append((kind, count))
        return real(dst, dest_max, src, count, kind)

    backend = opened(tiny_om, max_batch=8)
    monkeypatch.setattr(acl.rt, "memcpy", spy)
    try:
        backend.run(3)
        item_in = 3 * SIZE * SIZE * 4
        item_out = 6 * ANCHORS * 4
        assert sizes == [(1, 3 * item_in), (2, 3 * item_out)]  # host->device 3 frames, device->host 3
    finally:
        backend.close()


def test_run_outside_the_capacity_is_refused(tiny_om):
    backend = opened(tiny_om, max_batch=4)
    try:
        for n in (0, 5):
            with pytest.raises(Exception, match="outside 1..4"):
                backend.run(n)
    finally:
        backend.close()


# -- the hot path ------------------------------------------------------------------------------------
@pytest.mark.parametrize("execute", ["sync", "async"])
def test_thousands_of_runs_allocate_nothing(tiny_om, execute):
    backend = opened(tiny_om, max_batch=8, execute=execute)
    try:
        buf = backend.input_buffer
        rng = np.random.default_rng(11)
        buf[...] = rng.random(buf.shape, dtype=np.float32)
        first = backend.run(8)[0]
        base = first.ctypes.data
        for n in range(1, 9):  # warm-up: every gear once
            backend.run(n)
        before = {c: _fake.STATE.counts[c] for c in ALLOCATING_CALLS}
        for i in range(2000):
            n = i % 8 + 1
            outs = backend.run(n)
            assert outs[0].ctypes.data == base
        after = {c: _fake.STATE.counts[c] for c in ALLOCATING_CALLS}
        assert after == before, "the hot path allocated or freed"
        assert backend.input_buffer is buf
        np.testing.assert_allclose(class_scores(backend.run(8)[0]), expected_scores(buf), rtol=1e-5)
        assert _fake.STATE.counts["acl.mdl.execute" if execute == "sync" else "acl.mdl.execute_async"] >= 2000
    finally:
        backend.close()


# -- teardown and the process-wide init/finalize ---------------------------------------------------------
def test_close_releases_everything_in_reverse_order(tiny_om, monkeypatch):
    order = []
    for module, names in ((acl.mdl, ("destroy_dataset", "unload", "destroy_desc")),
                          (acl.rt, ("free", "free_host", "destroy_stream", "destroy_context", "reset_device")),
                          (acl, ("destroy_data_buffer", "finalize"))):
        for name in names:
            real = getattr(module, name)
            monkeypatch.setattr(module, name, lambda *a, _n=name, _r=real: (order.append(_n), _r(*a))[1])
    backend = opened(tiny_om, max_batch=2)
    backend.run(2)
    backend.close()
    collapsed = [n for i, n in enumerate(order) if i == 0 or order[i - 1] != n]
    collapsed = ["memory" if n in ("free", "free_host") else n for n in collapsed]
    collapsed = [n for i, n in enumerate(collapsed) if i == 0 or collapsed[i - 1] != n]
    assert collapsed == ["destroy_dataset", "destroy_data_buffer", "memory", "unload", "destroy_desc",
                         "destroy_stream", "destroy_context", "reset_device", "finalize"]
    assert not any(_fake.leaks().values())
    assert _fake.STATE.finalize_count == 1
    backend.close()  # idempotent: nothing more is called
    assert _fake.STATE.counts["acl.finalize"] == 1


def test_two_cards_finalize_once_after_the_last_close(tiny_om):
    cards = [AscendBackend(str(tiny_om), AscendConfig(device_id=d)) for d in (0, 1)]
    for card in cards:  # each on its own thread, like the device workers
        in_thread(card.open, 4)
    assert _fake.STATE.init_count == 1
    for card in cards:
        in_thread(card.run, 3)
    in_thread(cards[0].close)
    assert _fake.STATE.finalize_count == 0, "finalised while card 1 still runs"
    in_thread(cards[1].run, 4)
    in_thread(cards[1].close)
    assert _fake.STATE.finalize_count == 1 and _fake.STATE.counts["acl.finalize"] == 1
    assert not any(_fake.leaks().values()), _fake.leaks()
    assert not _fake.STATE.finalize_refused


def test_a_failed_open_releases_what_it_took_and_finalizes(tiny_om):
    _fake.fail("acl.rt.set_device", 107001, device=1)
    backend = AscendBackend(str(tiny_om), AscendConfig(device_id=1))
    with pytest.raises(AclError) as info:
        backend.open(2)
    assert info.value.call == "acl.rt.set_device" and info.value.code == 107001
    assert "ACL_ERROR_RT_INVALID_DEVICEID" in str(info.value)
    assert _fake.STATE.finalize_count == 1 and not any(_fake.leaks().values())
    backend.close()  # nothing to do, no error


def test_a_model_the_runtime_cannot_load_fails_cleanly(tmp_path):
    om = tmp_path / "broken.om"
    om.write_bytes(b"not a model")  # no pairing: the fake cannot deserialise it
    with pytest.raises(AclError, match=r"acl\.mdl\.load_from_file failed with 100012 \(ACL_ERROR_DESERIALIZE_MODEL"):
        opened(om)
    assert not any(_fake.leaks().values()) and _fake.STATE.finalize_count == 1
    with pytest.raises(ModelError, match="not found"):
        opened(tmp_path / "missing.om")


def test_an_execute_error_on_one_card_leaves_the_other_serving(tiny_om):
    cards = [opened(tiny_om, max_batch=2, device_id=d) for d in (0, 1)]
    try:
        _fake.fail("acl.mdl.execute", 507011, device=1, times=1)
        with pytest.raises(AclError) as info:
            cards[1].run(1)
        err = info.value
        assert (err.call, err.code, err.code_name) == ("acl.mdl.execute", 507011, "ACL_ERROR_RT_MODEL_EXECUTE")
        assert "acl.mdl.execute failed with 507011" in str(err) and err.device_fault
        buf = cards[0].input_buffer
        buf[...] = 0.5
        np.testing.assert_allclose(class_scores(cards[0].run(2)[0]), 0.5, rtol=1e-5)
        cards[1].input_buffer[...] = 0.25
        np.testing.assert_allclose(class_scores(cards[1].run(1)[0]), 0.25, rtol=1e-5)  # recovered
    finally:
        for card in cards:
            card.close()
    assert _fake.STATE.finalize_count == 1


def test_async_execution_errors_surface_at_synchronize(tiny_om):
    backend = opened(tiny_om, max_batch=2, execute="async")
    try:
        _fake.fail("acl.mdl.execute_async", 507015, times=1)
        with pytest.raises(AclError, match=r"acl\.rt\.synchronize_event failed with 507015 \(ACL_ERROR_RT_AICORE_EXCEPTION"):
            backend.run(2)
        backend.run(2)
    finally:
        backend.close()


# -- threads and contexts ------------------------------------------------------------------------------
def test_the_fake_refuses_acl_calls_from_a_thread_without_a_context(tiny_om):
    backend = opened(tiny_om, max_batch=2)  # opened on this thread
    try:
        ptr = backend.input_buffer.ctypes.data
        assert in_thread(acl.rt.malloc, 64, 0) == (0, 107002)
        assert in_thread(acl.rt.memcpy, ptr, 64, ptr, 64, 0) == 107002
        assert in_thread(acl.rt.get_context) == (0, 107002)
        # ...yet the backend runs from another thread, because it sets its context first.
        backend.input_buffer[...] = 0.75
        out = in_thread(backend.run, 2)
        np.testing.assert_allclose(class_scores(out[0]), 0.75, rtol=1e-5)
        assert _fake.STATE.counts["acl.rt.set_context"] >= 1
    finally:
        in_thread(backend.close)  # and closes from yet another one
    assert not any(_fake.leaks().values())


def test_two_cards_on_one_thread_each_run_under_their_own_context(tiny_om):
    cards = [opened(tiny_om, max_batch=1, device_id=d) for d in (0, 1)]
    try:
        for i in range(4):
            for card in cards:  # interleaved: the current context must switch every time
                card.input_buffer[...] = 0.1 * (i + 1)
                np.testing.assert_allclose(class_scores(card.run(1)[0]), 0.1 * (i + 1), rtol=1e-5)
    finally:
        for card in cards:
            card.close()
    assert not [e for e in _fake.STATE.errors if e[1] in (107002, 107003, 107004, 107000)]


# -- pyACL variants ------------------------------------------------------------------------------------------
def test_device_run_mode_copies_device_to_device(tiny_om, monkeypatch):
    _fake.reset(run_mode=_fake.ACL_DEVICE)
    kinds = set()
    real = acl.rt.memcpy
    monkeypatch.setattr(acl.rt, "memcpy", lambda d, m, s, c, k: (kinds.add(k), real(d, m, s, c, k))[1])
    backend = opened(tiny_om, max_batch=2)
    try:
        backend.input_buffer[...] = 0.5
        np.testing.assert_allclose(class_scores(backend.run(2)[0]), 0.5, rtol=1e-5)
        assert kinds == {3}
    finally:
        backend.close()


def test_without_ptr_to_numpy_the_view_comes_from_the_address(tiny_om):
    _fake.reset(util_helpers=("bytes_to_ptr", "ptr_to_bytes"))
    assert not hasattr(acl.util, "ptr_to_numpy")
    backend = opened(tiny_om, max_batch=2)
    try:
        assert not backend._input.hosts[0].staged
        backend.input_buffer[...] = 0.5
        np.testing.assert_allclose(class_scores(backend.run(2)[0]), 0.5, rtol=1e-5)
    finally:
        backend.close()


def test_a_pyacl_whose_views_do_not_share_memory_is_staged_through_bytes(tiny_om, monkeypatch):
    real = acl.util.ptr_to_numpy
    monkeypatch.setattr(acl.util, "ptr_to_numpy", lambda p, s, t: real(p, s, t).copy())
    backend = opened(tiny_om, max_batch=4)
    try:
        assert backend._input.hosts[0].staged
        buf = backend.input_buffer
        buf[...] = np.random.default_rng(5).random(buf.shape, dtype=np.float32)
        np.testing.assert_allclose(class_scores(backend.run(3)[0]), expected_scores(buf[:3]), rtol=1e-5)
    finally:
        backend.close()


def test_the_module_has_no_constants_and_takes_only_ints():
    with pytest.raises(AttributeError):
        acl.ACL_SUCCESS  # noqa: B018 - pyACL defines none; yoloedge keeps its own
    assert acl.init() == 0
    assert acl.rt.set_device(0) == 0
    with pytest.raises(TypeError):
        acl.rt.malloc(np.int64(64), 0)
    with pytest.raises(TypeError):
        acl.rt.malloc(size=64, policy=0)
    assert acl.rt.reset_device(0) == 0 and acl.finalize() == 0
    assert acl.init() == 100002, "one acl.init per process"


def test_the_fake_refuses_what_pyacl_refuses(tiny_om):
    """The fake is only useful if it fails where the runtime fails; these are the refusals the
    backend is tested against."""
    assert acl.rt.set_device(0) == 100001, "nothing before acl.init"
    assert acl.init() == 0 and acl.rt.set_device(0) == 0
    model_id, ret = acl.mdl.load_from_file(str(tiny_om))
    assert ret == 0
    desc = acl.mdl.create_desc()
    assert acl.mdl.get_desc(desc, model_id) == 0
    assert acl.mdl.get_input_index_by_name(desc, "no-such-input")[1] != 0
    assert acl.mdl.get_input_index_by_name(desc, "ascend_mbatch_shape_data") == (1, 0)
    assert acl.mdl.get_dynamic_batch(desc) == ({"batchCount": 4, "batch": GEARS}, 0)
    assert acl.rt.get_mem_info(1)[2] == 0 and len(acl.rt.get_mem_info(1)) == 3
    small, _ = acl.rt.malloc(64, 0)
    mbatch, _ = acl.rt.malloc(8, 0)
    out, _ = acl.rt.malloc(acl.mdl.get_output_size_by_index(desc, 0), 0)
    buffers = [acl.create_data_buffer(p, n) for p, n in ((small, 64), (mbatch, 8),
                                                          (out, acl.mdl.get_output_size_by_index(desc, 0)))]
    inputs, outputs = acl.mdl.create_dataset(), acl.mdl.create_dataset()
    assert acl.mdl.add_dataset_buffer(inputs, buffers[0]) == (inputs, 0)
    acl.mdl.add_dataset_buffer(inputs, buffers[1])
    acl.mdl.add_dataset_buffer(outputs, buffers[2])
    assert acl.mdl.set_dynamic_batch_size(model_id, inputs, 1, 3) == 145013, "3 is not a gear"
    assert acl.mdl.set_dynamic_batch_size(model_id, inputs, 0, 2) == 145011, "not the batch input"
    assert acl.mdl.execute(model_id, inputs, outputs) == 145013, "no gear set"
    assert acl.mdl.set_dynamic_batch_size(model_id, inputs, 1, 2) == 0
    assert acl.mdl.execute(model_id, inputs, outputs) == 145006, "64 bytes for two images"
    host, _ = acl.rt.malloc_host(64)
    assert acl.rt.memcpy(small, 64, host, 64, 2) == 107000, "device->host kind for a host->device copy"
    assert acl.rt.memcpy(small, 64, host, 128, 1) == 107000, "count over dest_max"
    assert acl.rt.memcpy(16, 64, host, 64, 1) == 107000, "unknown pointer"
    assert acl.rt.memcpy(small, 64, host, 0, 1) == 0, "count 0 copies nothing"
    assert acl.finalize() == 500001, "finalize with everything still allocated"
    assert _fake.STATE.finalize_refused[-1]["device_memory"] == 3
    assert acl.rt.free_host(host) == 0 and acl.rt.free_host(host) == 107000, "double free"
    for d in (inputs, outputs):
        assert acl.mdl.destroy_dataset(d) == 0
    for b in buffers:
        assert acl.destroy_data_buffer(b) == 0
    for p in (small, mbatch, out):
        assert acl.rt.free(p) == 0
    assert acl.mdl.unload(model_id) == 0 and acl.mdl.destroy_desc(desc) == 0
    assert acl.rt.reset_device(0) == 0 and acl.finalize() == 0 and acl.finalize() == 100037
    assert not any(_fake.leaks().values())


def test_acl_errors_name_the_call_the_code_and_its_meaning():
    err = AclError("acl.mdl.set_dynamic_batch_size", 145013, "batch 3")
    assert str(err) == ("acl.mdl.set_dynamic_batch_size failed with 145013 (ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID: "
                        "the batch size is not one of the model's gears); batch 3")
    assert not err.device_fault
    unknown = AclError("acl.rt.memcpy", 599999)
    assert "unknown code" in str(unknown) and "internal or driver fault" in str(unknown)


def test_a_missing_acl_module_names_cann(monkeypatch, tiny_om):
    monkeypatch.setitem(sys.modules, "acl", None)  # import acl -> ImportError
    for name in ("yoloedge.backends.ascend", "yoloedge.backends.acl_runtime"):
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(BackendUnavailableError) as info:
        create_backend("ascend", str(tiny_om), AscendConfig())
    message = str(info.value)
    assert "set_env.sh" in message and "NOT the PyPI package 'pyacl'" in message


# -- detections: the same as ONNX Runtime's ----------------------------------------------------------------
@pytest.mark.shared
@pytest.mark.parametrize("model_name", ["yolov8n_coco_int8.onnx", "yolov5n_coco_fp16.onnx"])
def test_same_detections_as_onnxruntime(model_name, models, media, references, tmp_path):
    source = models / model_name
    om = make_om(tmp_path, source, batch=1)
    images = [load_image(media, "bus.jpg"), load_image(media, "zidane.jpg")]
    reference = Detector(ModelConfig(path=str(source)), OnnxRuntimeBackend(str(source)))
    ascend = Detector(ModelConfig(path=str(om)), AscendBackend(str(om), AscendConfig()))
    try:
        assert ascend.layout.format == reference.layout.format
        ours, theirs = detections(ascend, images), detections(reference, images)
        assert ours == theirs
        for dets, image in zip(ours, ("bus", "zidane")):
            ref = json.loads((references / f"{source.stem}__{image}__conf25_iou45.json").read_text())
            assert not mismatches(dets, ref["detections"])
    finally:
        ascend.close()


@pytest.mark.shared
def test_dynamic_batch_om_batches_frames_like_single_runs(models, media, tmp_path):
    source = models / "yolov5n_coco_fp16.onnx"
    om = make_om(tmp_path, source, batch=[1, 2, 4])
    images = [load_image(media, "bus.jpg"), load_image(media, "zidane.jpg"), load_image(media, "bus.jpg")]
    reference = Detector(ModelConfig(path=str(source)), OnnxRuntimeBackend(str(source)))
    ascend = Detector(ModelConfig(path=str(om)), AscendBackend(str(om), AscendConfig(execute="async")), max_batch=4)
    try:
        _fake.STATE.executed_gears.clear()
        assert detections(ascend, images) == detections(reference, images)
        assert _fake.STATE.executed_gears == [4]
    finally:
        ascend.close()


@pytest.mark.shared
@pytest.mark.parametrize("model_name", ["yolov8n_coco_int8.onnx", "yolov5n_coco_fp16.onnx"])
def test_aipp_model_takes_uint8_nhwc_and_matches(model_name, models, media, references, tmp_path):
    source = models / model_name
    om = make_om(tmp_path, source, batch=1, aipp=True)
    ascend = Detector(ModelConfig(path=str(om)), AscendBackend(str(om), AscendConfig()))
    try:
        assert ascend.backend.aipp
        assert ascend.spec.input.dtype == np.uint8 and ascend.spec.input.shape == (1, 640, 640, 3)
        assert ascend.input.nhwc
        for image in ("bus", "zidane"):
            dets = detections(ascend, [load_image(media, f"{image}.jpg")])[0]
            ref = json.loads((references / f"{source.stem}__{image}__conf25_iou45.json").read_text())
            problems = mismatches(dets, ref["detections"])
            assert not problems, "\n".join(problems)
    finally:
        ascend.close()


def raw_head_names(model) -> list[str]:
    """The three Conv outputs feeding YOLOv5's Detect layer: the convs with na*(5+nc) = 255 filters."""
    weights = {init.name: list(init.dims) for init in model.graph.initializer}
    heads = [n.output[0] for n in model.graph.node
             if n.op_type == "Conv" and weights.get(n.input[1], [0])[0] == 255]
    assert len(heads) == 3, heads
    return heads


@pytest.fixture(scope="module")
def yolov5_raw_heads(models, tmp_path_factory) -> Path:
    import onnx
    import onnx.utils

    source = models / "yolov5n_coco_fp16.onnx"
    heads = raw_head_names(onnx.load(str(source)))
    out = tmp_path_factory.mktemp("raw") / "yolov5n_raw_heads.onnx"
    onnx.utils.extract_model(str(source), str(out), ["images"], heads)
    return out


@pytest.mark.shared
@pytest.mark.parametrize("fmt", ["raw", None])
def test_raw_three_head_om_decodes_like_upstream(fmt, yolov5_raw_heads, media, references, tmp_path):
    om = make_om(tmp_path, yolov5_raw_heads, "yolov5n_raw.om", batch=[1, 2])
    ascend = Detector(ModelConfig(path=str(om), format=fmt), AscendBackend(str(om), AscendConfig()), max_batch=2)
    try:
        assert sorted(o.shape for o in ascend.spec.outputs) == [(-1, 255, 20, 20), (-1, 255, 40, 40), (-1, 255, 80, 80)]
        assert all(o.dtype == np.float16 for o in ascend.spec.outputs)
        assert ascend.layout.format == "raw" and ascend.layout.num_classes == 80
        ref = json.loads((references / "yolov5n_coco_fp16__bus__conf25_iou45.json").read_text())
        dets = detections(ascend, [load_image(media, "bus.jpg")])[0]
        problems = mismatches(dets, ref["detections"])
        assert not problems, "\n".join(problems)
    finally:
        ascend.close()


# -- telemetry --------------------------------------------------------------------------------------
NPU_SMI_310P = """\
+--------------------------------------------------------------------------------------------------------+
| npu-smi 23.0.0                                   Version: 23.0.0                                      |
+-------------------------------+-----------------+------------------------------------------------------+
| NPU     Name                  | Health          | Power(W)     Temp(C)           Hugepages-Usage(page) |
| Chip    Device                | Bus-Id          | AICore(%)    Memory-Usage(MB)                        |
+===============================+=================+======================================================+
| 8       310P3                 | OK              | NA           43                0     / 0             |
| 0       0                     | 0000:01:00.0    | 12           1782 / 21527                            |
+===============================+=================+======================================================+
| 9       310P3                 | Warning         | NA           71                0     / 0             |
| 0       1                     | 0000:02:00.0    | 97           20011 / 21527                           |
+===============================+=================+======================================================+
+-------------------------------+-----------------+------------------------------------------------------+
| NPU     Chip                  | Process id      | Process name             | Process memory(MB)        |
+===============================+=================+======================================================+
| 8       0                     | 4242            | python3                  | 1200                      |
+===============================+=================+======================================================+
"""

NPU_SMI_910 = """\
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
+===========================+===============+====================================================+
| 0     910B                | OK            | 67.5        35                0    / 0             |
| 0                         | 0000:C1:00.0  | 3           2090 / 15039      3012 / 32768         |
+===========================+===============+====================================================+
"""

NPU_SMI_200I_A2 = """\
| NPU     Name                 | Health          | Power(W)     Temp(C)           Hugepages-Usage(page) |
| Chip    Device               | Bus-Id          | AICore(%)    Memory-Usage(MB)                        |
+==============================+=================+======================================================+
| 0       310B4                | Alarm           | 0.0          57                15    / 15            |
| 0       0                    | NA              | 0            1706 / 7545                             |
+==============================+=================+======================================================+
"""


def test_npu_smi_tables_are_parsed_per_device():
    rows = npu_smi_module.parse_npu_smi(NPU_SMI_310P)
    assert len(rows) == 2
    second = npu_smi_module.select_device(rows, 1)
    assert second == {"npu": 9, "name": "310P3", "health": "Warning", "power_w": None, "temperature_c": 71,
                      "chip": 0, "device": 1, "bus_id": "0000:02:00.0", "aicore_percent": 97,
                      "memory_used_mb": 20011, "memory_total_mb": 21527}
    assert npu_smi_module.select_device(rows, 2) is None
    (big,) = npu_smi_module.parse_npu_smi(NPU_SMI_910)
    assert (big["health"], big["power_w"], big["hbm_used_mb"], big["hbm_total_mb"]) == ("OK", 67.5, 3012, 32768)
    assert npu_smi_module.select_device([big], 0) is big
    (board,) = npu_smi_module.parse_npu_smi(NPU_SMI_200I_A2)
    assert (board["health"], board["bus_id"], board["temperature_c"], board["memory_total_mb"]) == ("Alarm", "NA", 57, 7545)
    assert npu_smi_module.parse_npu_smi("npu-smi: command failed\n") == []


def fake_npu_smi(directory: Path, table: str = NPU_SMI_310P) -> Path:
    """An `npu-smi` on PATH that prints `table` and counts its calls in calls.log."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "npu-smi"
    script.write_text(f"#!/bin/sh\necho x >> {directory / 'calls.log'}\ncat <<'EOF'\n{table}EOF\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return directory


def test_telemetry_reads_npu_smi_and_caches_it(tiny_om, tmp_path, monkeypatch):
    bin_dir = fake_npu_smi(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(npu_smi_module, "NPU_SMI", npu_smi_module.NpuSmi())
    monkeypatch.setattr(sys.modules["yoloedge.backends.ascend"], "NPU_SMI", npu_smi_module.NPU_SMI)
    cards = [AscendBackend(str(tiny_om), AscendConfig(device_id=d)) for d in (0, 1)]
    assert cards[0].telemetry()["temperature_c"] == 43
    assert cards[1].telemetry()["health"] == "Warning"
    assert (bin_dir / "calls.log").read_text().count("x") == 1, "one npu-smi call serves every card"
    assert AscendBackend(str(tiny_om), AscendConfig(device_id=5)).telemetry() == {
        "error": "npu-smi info lists no device 5"}
    assert AscendBackend(str(tiny_om), AscendConfig(telemetry=False)).telemetry() is None


def test_no_npu_smi_no_telemetry(tiny_om, monkeypatch):
    monkeypatch.setattr(npu_smi_module.NPU_SMI, "executable", "npu-smi-that-does-not-exist")
    assert AscendBackend(str(tiny_om), AscendConfig()).telemetry() is None


# -- configuration ----------------------------------------------------------------------------------
def write_config(tmp_path: Path, model: Path, ascend_section: str) -> Path:
    path = tmp_path / "yoloedge.yaml"
    path.write_text(f"device_id: edge\nmodel: {{path: {model}}}\naccelerators:\n  - backend: ascend\n"
                    f"    devices: [0, 1]\n{ascend_section}")
    return path


def test_the_ascend_section_is_validated(tmp_path, tiny_om):
    config = load_config(str(write_config(tmp_path, tiny_om, "    ascend:\n      execute: async\n"
                                                              "      source_onnx: models/y.onnx\n"
                                                              "      telemetry: false\n")), {})
    (acc,) = config.accelerators
    assert acc.options == {"execute": "async", "source_onnx": str(tmp_path / "models" / "y.onnx"),
                           "telemetry": False}
    assert backend_config_for(acc, 1) == AscendConfig(device_id=1, execute="async",
                                                      source_onnx=str(tmp_path / "models" / "y.onnx"), telemetry=False)
    plain = load_config(str(write_config(tmp_path, tiny_om, "")), {})
    assert backend_config_for(plain.accelerators[0], 0) == AscendConfig()
    with pytest.raises(ConfigError) as info:
        load_config(str(write_config(tmp_path, tiny_om, "    ascend:\n      execute: later\n      precision: fp16\n")), {})
    text = str(info.value)
    assert "accelerators[0].ascend.execute" in text and "must be one of: sync, async" in text
    assert "accelerators[0].ascend.precision" in text and "unknown key" in text


# -- the daemon on two fake cards -------------------------------------------------------------------------
from test_daemon import base_config, detections_by_frame, notify, start_daemon  # noqa: E402,F401  (fixtures)
from daemon_harness import status as daemon_status  # noqa: E402


@pytest.mark.shared
def test_daemon_on_two_fake_cards_publishes_what_onnxruntime_finds(tmp_path, models, media, mosquitto, subscriber,
                                                                    notify, start_daemon):
    source = models / "yolov8n_coco_int8.onnx"
    om = make_om(tmp_path, source, batch=[1, 2, 4])
    video = media / "indoor_people_480p_mpeg4.avi"
    report = tmp_path / "acl-report.json"
    bin_dir = fake_npu_smi(tmp_path / "bin")
    config = base_config(tmp_path, models, mosquitto, [{"name": "door", "url": str(video), "realtime": False}])
    config["model"] = {"path": str(om)}
    config["accelerators"] = [{"backend": "ascend", "devices": [0, 1], "batch": 2,
                               "ascend": {"execute": "async", "source_onnx": str(source)}}]
    daemon, _ = start_daemon(config, env={"YOLOEDGE_FAKE_ACL_REPORT": str(report),
                                          "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})

    expected = {}  # what the ONNX Runtime backend finds, frame by frame, while the daemon runs
    reference = Detector(ModelConfig(path=str(source)), OnnxRuntimeBackend(str(source)))
    cap = cv2.VideoCapture(str(video))
    while True:
        ok, frame = cap.read()
        if not ok:
            break
        expected[len(expected)] = detections(reference, [frame])[0]
    cap.release()
    assert len(expected) == 84

    notify.wait_for("READY", "1", timeout=90)
    assert subscriber.wait_for(lambda ms: len(detections_by_frame(subscriber, "door")) >= 84, 120), daemon.log
    door = detections_by_frame(subscriber, "door")
    assert sorted(door) == list(range(84))
    for index, dets in expected.items():
        assert without_track_ids(door[index][0]["detections"]) == dets, f"frame {index}"

    workers = daemon_status(config["control"]["socket"])["accelerators"]
    assert sorted(w["device"] for w in workers) == [0, 1]
    for w in workers:
        assert w["backend"] == "ascend" and w["state"] == "running" and "gears 1/2" in w["description"]
        assert w["telemetry"]["health"] in ("OK", "Warning") and w["telemetry"]["device"] == w["device"]
    assert not report.exists(), "pyACL finalised while the daemon runs"

    daemon.signal(signal.SIGTERM)
    assert daemon.proc.wait(30) == 0, daemon.log[-4000:]
    summary = json.loads(report.read_text())
    assert summary["init_count"] == 1 and summary["finalize_count"] == 1, summary
    assert not any(summary["leaks"].values()) and not summary["finalize_refused"], summary
    assert summary["calls"]["acl.rt.set_device"] == 2 and summary["calls"]["acl.rt.reset_device"] == 2
    assert not summary["errors"], summary["errors"]
    assert sum(summary["executed_gears"].values()) >= 84 // 2


@pytest.mark.shared
def test_daemon_with_a_card_that_fails_to_open_still_finalizes(tmp_path, models, media, mosquitto, notify,
                                                               start_daemon):
    om = make_om(tmp_path, models / "yolov8n_coco_int8.onnx", batch=1)
    report = tmp_path / "acl-report.json"
    config = base_config(tmp_path, models, mosquitto, [])
    config["model"] = {"path": str(om)}
    config["accelerators"] = [{"backend": "ascend", "devices": [0, 7]}]  # the fake has cards 0 and 1
    daemon, _ = start_daemon(config, env={"YOLOEDGE_FAKE_ACL_REPORT": str(report)})
    notify.wait_for("READY", "1", timeout=90)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        workers = daemon_status(config["control"]["socket"])["accelerators"]
        if {w["state"] for w in workers} == {"running", "failed"}:
            break
        time.sleep(0.2)
    failed = [w for w in workers if w["state"] == "failed"]
    assert len(failed) == 1 and "acl.rt.set_device failed with 107001" in failed[0]["error"]
    assert daemon.stop() == 0, daemon.log[-4000:]
    summary = json.loads(report.read_text())
    assert summary["finalize_count"] == 1 and not any(summary["leaks"].values()), summary
