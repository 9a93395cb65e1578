"""Several models on one card: the backends of one device scope (`DeviceScope`, issue 19 item 3).

Two real models of different input sizes (YOLOv8n int8 at 640, YOLOX-nano at 416) are opened on one
fake card in one scope, on one thread as a device worker does, and compared with ONNX Runtime on the
same real images. The strict fakes (tests/fakes) run those ONNX files through ONNX Runtime and refuse
what a second model on the card can get wrong: a dataset or device memory of one model used with
another, a context destroyed under a loaded model, a buffer freed twice, another engine's address;
what they counted allocated is what `memory()` must report.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import cv2
import numpy as np
import pytest

FAKES = Path(__file__).resolve().parent / "fakes"
if str(FAKES) not in sys.path:
    sys.path.insert(0, str(FAKES))

import acl  # noqa: E402  (the fakes: tests/fakes is first on sys.path)
import tensorrt  # noqa: E402

if not hasattr(acl, "_fake") or not hasattr(tensorrt, "_fake"):
    pytest.skip("the real pyACL or TensorRT is already imported in this process; these tests need the fakes",
                allow_module_level=True)

from acl import _fake as acl_fake  # noqa: E402
from cuda.bindings import _fake as cuda_fake  # noqa: E402
from device_helpers import in_thread, make_om  # noqa: E402
from parity import mismatches  # noqa: E402
from tensorrt import _fake as trt_fake  # noqa: E402
from yoloedge.backends import acl_runtime  # noqa: E402
from yoloedge.backends.acl_runtime import AclError  # noqa: E402
from yoloedge.backends.ascend import AscendBackend  # noqa: E402
from yoloedge.backends.base import DeviceScope  # noqa: E402
from yoloedge.backends.onnxruntime import OnnxRuntimeBackend  # noqa: E402
from yoloedge.backends.tensorrt import TensorRTBackend  # noqa: E402
from yoloedge.config import ModelConfig  # noqa: E402
from yoloedge.config.ascend import AscendConfig  # noqa: E402
from yoloedge.config.model import OnnxRuntimeConfig  # noqa: E402
from yoloedge.config.tensorrt import TensorRTConfig  # noqa: E402
from yoloedge.errors import BackendError, ModelError  # noqa: E402
from yoloedge.pipeline.detector import Detector  # noqa: E402

V8 = "yolov8n_coco_int8.onnx"  # 640x640, v8 layout, Ultralytics metadata
YOLOX = "yolox_nano_coco_416.onnx"  # 416x416, raw YOLOX output, no metadata: format yolox
FORMATS = {V8: None, YOLOX: "yolox"}
IMAGES = ("bus.jpg", "zidane.jpg")
#: the one refusal a healthy open makes on purpose: asking a static-batch model for its batch input
PROBES = {"acl.mdl.get_input_index_by_name"}


# -- helpers ------------------------------------------------------------------------------------------


def load_images(media: Path) -> list[np.ndarray]:
    images = [cv2.imread(str(media / name)) for name in IMAGES]
    assert all(image is not None for image in images)
    return images


def detections(detector: Detector, images) -> list[list[dict]]:
    return [d.to_dicts(detector.labels) for d in detector.detect(images)]


def config_for(path: Path, name: str) -> ModelConfig:
    return ModelConfig(path=str(path), format=FORMATS[name])


@pytest.fixture(scope="module")
def expected(models, media, references) -> dict[str, list[list[dict]]]:
    """What ONNX Runtime finds with each model on the real images (the detections to match), checked
    against the upstream references first."""
    images = load_images(media)
    found = {}
    for name in (V8, YOLOX):
        reference = Detector(config_for(models / name, name), OnnxRuntimeBackend(str(models / name)))
        found[name] = detections(reference, images)
        reference.backend.close()
        for dets, image in zip(found[name], IMAGES):
            file = references / f"{Path(name).stem}__{Path(image).stem}__conf25_iou45.json"
            upstream = json.loads(file.read_text())
            assert not mismatches(dets, upstream["detections"]), (name, image)
    # the references are not empty or alike: both models see the bus and people in bus.jpg
    for name in (V8, YOLOX):
        assert {"bus", "person"} <= {d["label"] for d in found[name][0]}, (name, found[name][0])
    assert found[V8] != found[YOLOX]
    return found


def ascend_misuse() -> list:
    return [r for r in acl_fake.STATE.refusals if r[0] not in PROBES]


def ascend_context_of(backend: AscendBackend) -> int:
    return acl_fake.STATE.models[backend._model_id].context


def device_pointers(backend) -> set[int]:
    return {p for t in backend._tensors() for p in (t.device_ptrs or [t.device_ptr])}


# -- the scope itself ----------------------------------------------------------------------------------
def test_a_scope_counts_users_and_releases_after_the_last():
    scope = DeviceScope("card 0")
    made, released = [], []

    def create():
        made.append(len(made))
        return f"context {len(made)}"

    assert scope.shared("ctx", create, released.append) == "context 1"
    assert scope.shared("ctx", create, released.append) == "context 1"
    assert made == [0] and scope.users("ctx") == 2 and scope.keys() == ("ctx",)
    scope.release("ctx")
    assert released == [] and scope.users("ctx") == 1
    scope.release("ctx")
    assert released == ["context 1"] and scope.users("ctx") == 0 and scope.keys() == ()
    with pytest.raises(BackendError, match="released more often"):
        scope.release("ctx")
    assert scope.shared("ctx", create, released.append) == "context 2"  # a new one after the last went


def test_a_failed_create_leaves_nothing_and_close_releases_what_is_left_newest_first():
    scope = DeviceScope("card 1")

    def broken():
        raise BackendError("no device")

    with pytest.raises(BackendError, match="no device"):
        scope.shared("ctx", broken, lambda value: None)
    assert scope.keys() == ()
    order = []
    scope.shared("a", lambda: "a", order.append)
    scope.shared("b", lambda: "b", order.append)
    scope.shared("b", lambda: "b", order.append)
    scope.close()
    assert order == ["b", "a"] and scope.closed and scope.keys() == ()
    with pytest.raises(BackendError, match="closed"):
        scope.shared("a", lambda: "a", order.append)


# -- Ascend: two models in one context -------------------------------------------------------------------
@pytest.fixture
def acl_process(monkeypatch):
    """A fresh pyACL process per test: one acl.init each, counters at zero."""
    state = acl_fake.reset()
    monkeypatch.setattr(acl_runtime, "PROCESS", acl_runtime.AclProcess())
    return state


@pytest.mark.shared
def test_two_models_share_one_context_with_their_own_buffers(acl_process, models, media, expected, tmp_path,
                                                            monkeypatch):
    v8_om = make_om(tmp_path, models / V8, batch=[1, 2])  # dynamic gears: its batch input is counted too
    yolox_om = make_om(tmp_path, models / YOLOX)
    images = load_images(media)
    scope = DeviceScope("ascend device 0, incarnation 1")
    order: list[tuple] = []
    for module, names in ((acl.mdl, ("unload",)), (acl.rt, ("destroy_stream", "destroy_context", "reset_device")),
                          (acl, ("finalize",))):
        for name in names:
            real = getattr(module, name)
            monkeypatch.setattr(module, name, lambda *a, _n=name, _r=real: (order.append((_n, *a)), _r(*a))[1])

    def open_both():
        opened, sizes = [], []
        for om, name in ((v8_om, V8), (yolox_om, YOLOX)):
            before = (acl_fake.STATE.allocated("device"), acl_fake.STATE.allocated("host"))
            backend = AscendBackend(str(om), AscendConfig(device_id=0))
            backend.use_scope(scope)
            opened.append(Detector(config_for(om, name), backend, max_batch=2, input_sets=2, output_sets=2))
            sizes.append((acl_fake.STATE.allocated("device") - before[0], acl_fake.STATE.allocated("host") - before[1]))
        return opened, sizes

    (v8, yolox), sizes = in_thread(open_both)
    state = acl_fake.STATE
    assert state.counts["acl.rt.create_context"] == 1 and state.counts["acl.rt.set_device"] == 1
    assert state.counts["acl.rt.create_stream"] == 1 and state.counts["acl.init"] == 1
    assert len(state.models) == 2 and ascend_context_of(v8.backend) == ascend_context_of(yolox.backend)
    assert v8.input.height == 640 and yolox.input.height == 416
    # each its own buffers and datasets, allocated once; memory() is what the fake counted
    assert not device_pointers(v8.backend) & device_pointers(yolox.backend)
    assert not set(v8.backend._input_datasets) & set(yolox.backend._input_datasets)
    for detector, (device_bytes, host_bytes) in zip((v8, yolox), sizes):
        assert detector.backend.memory() == {"device_bytes": device_bytes, "host_bytes": host_bytes}
        assert device_bytes > 0 and host_bytes > 0
    allocating = sum(state.counts[c] for c in ("acl.rt.malloc", "acl.rt.malloc_host", "acl.mdl.create_dataset"))

    # whichever model has a batch runs, in any order, on the same thread
    def run_interleaved():
        return [detections(d, images) for d in (v8, yolox, v8, yolox)]

    first_v8, first_yolox, again_v8, again_yolox = in_thread(run_interleaved)
    assert first_v8 == again_v8 == expected[V8]
    assert first_yolox == again_yolox == expected[YOLOX]
    assert sum(state.counts[c] for c in ("acl.rt.malloc", "acl.rt.malloc_host", "acl.mdl.create_dataset")) == allocating
    assert set(state.executed_models) == {v8.backend._model_id, yolox.backend._model_id}

    # the 640 model goes first: its own resources only; the context serves the other one on
    v8_id, yolox_id = v8.backend._model_id, yolox.backend._model_id
    in_thread(v8.backend.close)
    assert list(state.models) == [yolox_id] and state.leaks()["contexts"] == 1 and state.leaks()["streams"] == 1
    assert scope.users("ascend device 0") == 1 and v8.backend.memory() is None
    assert in_thread(detections, yolox, images) == expected[YOLOX]
    in_thread(yolox.backend.close)
    names = [entry[0] for entry in order]
    assert names == ["unload", "unload", "destroy_stream", "destroy_context", "reset_device", "finalize"]
    assert [entry[1] for entry in order[:2]] == [v8_id, yolox_id]
    assert not any(state.leaks().values()) and state.finalize_count == 1 and not state.finalize_refused
    assert scope.keys() == () and ascend_misuse() == []
    report = acl_fake.report()
    assert report["contexts_created"] == 1 and report["models_loaded"] == 2


@pytest.mark.shared
def test_a_second_model_that_fails_to_load_leaves_the_first_running(acl_process, models, media, expected,
                                                                    tmp_path):
    om = make_om(tmp_path, models / YOLOX)
    broken = tmp_path / "broken.om"
    broken.write_bytes(b"not a model")  # no pairing: the fake cannot deserialise it (100012)
    images = load_images(media)
    scope = DeviceScope("ascend device 0")

    def scoped(path):
        backend = AscendBackend(str(path), AscendConfig(device_id=0))
        backend.use_scope(scope)
        return backend

    first = in_thread(lambda: Detector(config_for(om, YOLOX), scoped(om)))
    held = acl_fake.leaks()
    memory = (acl_fake.STATE.allocated("device"), acl_fake.STATE.allocated("host"))
    for path, error, match in ((broken, AclError, "acl.mdl.load_from_file failed with 100012"),
                               (tmp_path / "missing.om", ModelError, "not found")):
        with pytest.raises(error, match=match):
            in_thread(scoped(path).open, 1)
        assert acl_fake.leaks() == held, "the failed open left something behind or took the first's"
        assert (acl_fake.STATE.allocated("device"), acl_fake.STATE.allocated("host")) == memory
        assert scope.users("ascend device 0") == 1
    # out of device memory half-way through the second model's buffers: it releases only its own
    acl_fake.fail("acl.rt.malloc", 207001, times=1)
    with pytest.raises(AclError, match="207001"):
        in_thread(scoped(om).open, 1)
    assert acl_fake.leaks() == held and scope.users("ascend device 0") == 1
    assert in_thread(detections, first, images) == expected[YOLOX]
    assert acl_fake.STATE.counts["acl.rt.create_context"] == 1
    in_thread(first.backend.close)
    assert not any(acl_fake.leaks().values()) and acl_fake.STATE.finalize_count == 1
    expected_refusals = {("acl.mdl.load_from_file", 100012), ("acl.rt.malloc", 207001)}
    assert {(name, code) for name, code, _why in ascend_misuse()} == expected_refusals


def test_without_a_scope_each_backend_has_its_own_context_as_before(acl_process, tmp_path):
    from onnx_models import make_dynamic_batch_v8_model

    om = make_om(tmp_path, make_dynamic_batch_v8_model(tmp_path / "tiny.onnx", size=64), batch=[1, 2])

    def open_two():
        backends = [AscendBackend(str(om), AscendConfig()) for _ in range(2)]
        for backend in backends:
            backend.open(2)
        return backends

    backends = in_thread(open_two)
    state = acl_fake.STATE
    assert state.counts["acl.rt.create_context"] == 2 and state.counts["acl.rt.create_stream"] == 2
    assert ascend_context_of(backends[0]) != ascend_context_of(backends[1])
    for backend in backends:
        in_thread(backend.run, 2)
        in_thread(backend.close)
    assert not any(state.leaks().values()) and state.finalize_count == 1 and ascend_misuse() == []


def test_a_new_incarnation_gets_its_own_context_and_leaves_the_old_one_alone(acl_process, tmp_path):
    from onnx_models import make_dynamic_batch_v8_model

    om = make_om(tmp_path, make_dynamic_batch_v8_model(tmp_path / "tiny.onnx", size=64), batch=[1, 2])
    old_scope, new_scope = DeviceScope("incarnation 1"), DeviceScope("incarnation 2")

    def scoped(scope):
        backend = AscendBackend(str(om), AscendConfig())
        backend.use_scope(scope)
        backend.open(2)
        return backend

    old = in_thread(scoped, old_scope)  # a "hung" incarnation: nobody closes it yet
    new = [in_thread(scoped, new_scope) for _ in range(2)]
    assert acl_fake.STATE.counts["acl.rt.create_context"] == 2
    assert ascend_context_of(old) != ascend_context_of(new[0]) == ascend_context_of(new[1])
    for backend in new:
        in_thread(backend.close)
    assert acl_fake.leaks()["contexts"] == 1 and list(acl_fake.STATE.models) == [old._model_id]
    in_thread(old.run, 1)
    in_thread(old.close)
    new_scope.close()
    old_scope.close()
    assert not any(acl_fake.leaks().values()) and acl_fake.STATE.finalize_count == 1 and ascend_misuse() == []


def test_a_recovered_card_runs_in_a_new_context_while_the_old_incarnation_hangs(acl_process, tmp_path):
    """Device recovery: the old worker is stuck in execute; the new incarnation opens every model
    again in a scope of its own, runs, and the old one, when it wakes, finishes in its own context."""
    from onnx_models import make_dynamic_batch_v8_model, make_fixed_batch_v8_model

    oms = [make_om(tmp_path, make_dynamic_batch_v8_model(tmp_path / "a.onnx", size=64), batch=[1, 2]),
           make_om(tmp_path, make_fixed_batch_v8_model(tmp_path / "b.onnx", size=32), batch=1)]

    def incarnation(scope):
        backends = [AscendBackend(str(om), AscendConfig()) for om in oms]
        for backend in backends:
            backend.use_scope(scope)
            backend.open(2)
        return backends

    old = in_thread(incarnation, DeviceScope("incarnation 1"))
    hang = acl_fake.hold("acl.mdl.execute", device=0, times=1)
    stuck = threading.Thread(target=old[0].run, args=(1,))
    stuck.start()
    assert hang.entered.wait(30)
    new = in_thread(incarnation, DeviceScope("incarnation 2"))
    assert acl_fake.STATE.counts["acl.rt.create_context"] == 2
    assert {ascend_context_of(b) for b in old} != {ascend_context_of(b) for b in new}
    assert len({ascend_context_of(b) for b in new}) == 1
    for backend in new:
        outputs = in_thread(backend.run, 1)
        assert outputs[0].shape[0] == 1
    hang.release()
    stuck.join(30)
    assert not stuck.is_alive()
    for backend in (*new, *old):
        in_thread(backend.close)
    assert not any(acl_fake.leaks().values()) and acl_fake.STATE.finalize_count == 1 and ascend_misuse() == []


def test_use_scope_after_open_is_refused(acl_process, tmp_path):
    from onnx_models import make_dynamic_batch_v8_model

    om = make_om(tmp_path, make_dynamic_batch_v8_model(tmp_path / "tiny.onnx", size=64))
    backend = AscendBackend(str(om), AscendConfig())
    backend.open(1)
    with pytest.raises(BackendError, match="use_scope after open"):
        backend.use_scope(DeviceScope())
    backend.close()


def test_the_fake_refuses_what_a_second_model_on_the_card_can_get_wrong(acl_process, tmp_path):
    from onnx_models import make_dynamic_batch_v8_model

    om = make_om(tmp_path, make_dynamic_batch_v8_model(tmp_path / "tiny.onnx", size=64))
    scope = DeviceScope("card 0")

    def open_two():
        backends = [AscendBackend(str(om), AscendConfig()) for _ in range(2)]
        for backend in backends:
            backend.use_scope(scope)
            backend.open(1)
        return backends

    a, b = in_thread(open_two)

    def misuse():
        a.run(1)  # a's datasets and memory are a's from their first run
        codes = {
            # a's datasets with b's model id (same layout: pyACL itself would run it on a's buffers)
            "dataset of another model": acl.mdl.execute(b._model_id, a._input_datasets[0], a._output_dataset),
            # the shared context while both models are loaded in it
            "context under loaded models": acl.rt.destroy_context(a._context),
            # a buffer freed twice
            "double free": acl.rt.free(a._input.device_ptr) or acl.rt.free(a._input.device_ptr),
        }
        return codes

    codes = in_thread(misuse)
    assert codes == {"dataset of another model": 100017, "context under loaded models": 107003,
                     "double free": 107000}
    # the freed buffer is a's own; b is untouched and still runs
    in_thread(b.run, 1)
    with pytest.raises(AclError):  # a's close meets the buffer the test freed: the rest still goes
        in_thread(a.close)
    in_thread(b.close)
    assert not any(acl_fake.leaks().values()) and acl_fake.STATE.finalize_count == 1


# -- TensorRT: two engines and execution contexts on one GPU ------------------------------------------------
@pytest.fixture(params=["8.6.1", "10.3.0"], ids=["trt8.6", "trt10"])
def cuda_process(request):
    trt_fake.reset(request.param)
    return cuda_fake.reset()


def trt_nothing_held() -> dict:
    held = {k: v for k, v in cuda_fake.leaks().items() if v}
    held.update(trt_fake.live())
    return held


@pytest.mark.shared
def test_two_engines_on_one_gpu_share_the_stream_with_their_own_contexts(cuda_process, models, media, expected,
                                                                         tmp_path):
    v8_engine = trt_fake.write_engine(tmp_path / "v8.engine", models / V8, profile=(1, 2, 2))
    yolox_engine = trt_fake.write_engine(tmp_path / "yolox.engine", models / YOLOX, batch=1)
    images = load_images(media)
    scope = DeviceScope("GPU 0, incarnation 1")

    def open_both():
        opened, sizes = [], []
        for path, name in ((v8_engine, V8), (yolox_engine, YOLOX)):
            before = (cuda_fake.STATE.allocated("device"), cuda_fake.STATE.allocated("pinned"))
            backend = TensorRTBackend(str(path), TensorRTConfig(device_id=0))
            backend.use_scope(scope)
            opened.append(Detector(config_for(Path(path), name), backend, max_batch=2, input_sets=2,
                                   output_sets=2))
            sizes.append((cuda_fake.STATE.allocated("device") - before[0],
                          cuda_fake.STATE.allocated("pinned") - before[1]))
        return opened, sizes

    (v8, yolox), sizes = in_thread(open_both)
    counts, trt_counts = cuda_fake.STATE.counts, trt_fake.STATE.counts
    assert counts["cudaStreamCreate"] == 1 and cuda_fake.leaks()["streams"] == 1
    assert trt_counts["Runtime.deserialize_cuda_engine"] == 2
    assert trt_counts["ICudaEngine.create_execution_context"] == 2
    assert trt_fake.live() == {"runtime": 2, "engine": 2, "context": 2}
    assert v8.backend._stream_handle == yolox.backend._stream_handle
    assert v8.backend._context is not yolox.backend._context
    assert not device_pointers(v8.backend) & device_pointers(yolox.backend)
    for detector, (device_bytes, host_bytes) in zip((v8, yolox), sizes):
        assert detector.backend.memory() == {"device_bytes": device_bytes, "host_bytes": host_bytes}
        assert device_bytes > 0 and host_bytes > 0

    def run_interleaved():
        return [detections(d, images) for d in (yolox, v8, yolox, v8)]

    first_yolox, first_v8, again_yolox, again_v8 = in_thread(run_interleaved)
    assert first_v8 == again_v8 == expected[V8] and first_yolox == again_yolox == expected[YOLOX]
    in_thread(yolox.backend.close)  # the other order this time: the stream stays for the 640 model
    assert cuda_fake.leaks()["streams"] == 1 and trt_fake.live() == {"runtime": 1, "engine": 1, "context": 1}
    assert in_thread(detections, v8, images) == expected[V8]
    in_thread(v8.backend.close)
    assert trt_nothing_held() == {} and counts["cudaStreamDestroy"] == 1 and scope.keys() == ()
    assert cuda_fake.STATE.errors == [] and trt_fake.report()["errors"] == []


@pytest.mark.shared
def test_a_second_engine_that_fails_to_load_leaves_the_first_running(cuda_process, models, media, expected,
                                                                     tmp_path):
    path = trt_fake.write_engine(tmp_path / "yolox.engine", models / YOLOX, batch=1)
    broken = tmp_path / "broken.engine"
    broken.write_bytes(b"not an engine")
    images = load_images(media)
    scope = DeviceScope("GPU 0")

    def scoped(engine_path):
        backend = TensorRTBackend(str(engine_path), TensorRTConfig(device_id=0))
        backend.use_scope(scope)
        return backend

    first = in_thread(lambda: Detector(config_for(Path(path), YOLOX), scoped(path)))
    held = trt_nothing_held()
    for engine_path, match in ((broken, "cannot deserialise"), (tmp_path / "missing.engine", "not found")):
        with pytest.raises(ModelError, match=match):
            in_thread(scoped(engine_path).open, 1)
        assert trt_nothing_held() == held and scope.users("cuda stream GPU 0") == 1
    cuda_fake.fail("cudaMallocHost", 2)  # out of pinned memory half-way through the second's buffers
    with pytest.raises(BackendError, match="cudaMallocHost"):
        in_thread(scoped(path).open, 1)
    assert trt_nothing_held() == held
    assert in_thread(detections, first, images) == expected[YOLOX]
    in_thread(first.backend.close)
    assert trt_nothing_held() == {} and cuda_fake.STATE.errors == [("cudaMallocHost", 2)]


def test_the_fake_refuses_an_address_bound_by_another_engine(cuda_process, tmp_path):
    from onnx_models import make_dynamic_batch_v8_model

    onnx = make_dynamic_batch_v8_model(tmp_path / "tiny.onnx", size=64)
    paths = [trt_fake.write_engine(tmp_path / f"{i}.engine", onnx, batch=1) for i in range(2)]
    scope = DeviceScope("GPU 0")

    def open_two():
        backends = [TensorRTBackend(str(p), TensorRTConfig()) for p in paths]
        for backend in backends:
            backend.use_scope(scope)
            backend.open(1)
        return backends

    a, b = in_thread(open_two)
    name = a._input.name
    assert b._context.set_tensor_address(name, a._input.device_ptr) is False
    assert "bound by an execution context of another engine" in trt_fake.report()["errors"][-1]
    assert b._context.set_tensor_address(name, b._input.device_ptr) is True  # its own: fine
    for backend in (a, b):
        in_thread(backend.run, 1)
        in_thread(backend.close)
    assert trt_nothing_held() == {}


def test_without_a_scope_each_engine_has_its_own_stream_as_before(cuda_process, tmp_path):
    from onnx_models import make_dynamic_batch_v8_model

    path = trt_fake.write_engine(tmp_path / "tiny.engine", make_dynamic_batch_v8_model(tmp_path / "t.onnx", size=64),
                                 batch=1)
    backends = [TensorRTBackend(str(path), TensorRTConfig()) for _ in range(2)]
    for backend in backends:
        in_thread(backend.open, 1)
    assert cuda_fake.STATE.counts["cudaStreamCreate"] == 2
    assert backends[0]._stream_handle != backends[1]._stream_handle
    for backend in backends:
        in_thread(backend.close)
    assert trt_nothing_held() == {}


# -- ONNX Runtime: one session per model, nothing shared --------------------------------------------------
@pytest.mark.shared
def test_onnxruntime_accepts_a_scope_and_reports_the_buffers_it_allocated(models):
    backend = OnnxRuntimeBackend(str(models / V8), OnnxRuntimeConfig())
    assert backend.memory() is None
    backend.use_scope(DeviceScope("cpu"))
    backend.open(2, input_sets=2, output_sets=3)
    # from the model's documented shapes: input float32 [1,3,640,640], output float32 [1,84,8400]
    frames = 2
    inputs = 2 * frames * 3 * 640 * 640 * 4
    outputs = 3 * frames * 84 * 8400 * 4
    assert backend.memory() == {"device_bytes": 0, "host_bytes": inputs + outputs}
    backend.close()
    assert backend.memory() is None
