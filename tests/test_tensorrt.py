"""The TensorRT backend against the fake `tensorrt` and `cuda.bindings.runtime` in tests/fakes.

The fakes keep the real APIs' names, return shapes and refusals (None from deserialize_cuda_engine,
False from set_input_shape / set_tensor_address / execute_async_v3, cudaError_t tuples, addresses
outside live allocations, wrong copy kinds, double frees, the APIs TensorRT 10 removed) and run the
ONNX each fake engine names through ONNX Runtime, so detections can be compared with the ONNX
Runtime backend's on the same images. Every backend test runs as TensorRT 8.6 and as 10.x.
"""

from __future__ import annotations

import json
import signal
import sys
import warnings
from pathlib import Path

import cv2
import numpy as np
import pytest

FAKES = Path(__file__).resolve().parent / "fakes"
if str(FAKES) not in sys.path:
    sys.path.insert(0, str(FAKES))

import tensorrt  # noqa: E402  (the fake: tests/fakes is first on sys.path)
from cuda.bindings import runtime as cudart  # noqa: E402

if not hasattr(tensorrt, "_fake"):
    pytest.skip("the real TensorRT is already imported in this process; these tests need the fake",
                allow_module_level=True)

from cuda.bindings import _fake as cuda_fake  # noqa: E402
from onnx_models import expected_scores, make_dynamic_batch_v8_model, make_fixed_batch_v8_model  # noqa: E402
from device_helpers import in_thread  # noqa: E402
from parity import mismatches, without_track_ids  # noqa: E402
from tensorrt import _fake as trt_fake  # noqa: E402
from yoloedge.backends import backend_config_for, create_backend  # noqa: E402
from yoloedge.backends.cuda_runtime import CudaError  # noqa: E402
from yoloedge.backends.onnxruntime import OnnxRuntimeBackend  # noqa: E402
from yoloedge.backends.tensorrt import TensorRTBackend, TensorRTError  # noqa: E402
from yoloedge.config import ModelConfig  # noqa: E402
from yoloedge.config.errors import ConfigError  # noqa: E402
from yoloedge.config.loader import load_config  # noqa: E402
from yoloedge.config.tensorrt import TensorRTConfig  # noqa: E402
from yoloedge.pipeline.detector import Detector  # noqa: E402
from yoloedge.errors import BackendError, ModelError  # noqa: E402

SIZE = 64
ANCHORS = (SIZE // 8) ** 2 + (SIZE // 16) ** 2 + (SIZE // 32) ** 2
VERSIONS = ["8.6.1", "10.3.0"]
#: what must not happen after `open`: allocations, frees, new streams, engines or contexts.
ALLOCATING = ("cudaMalloc", "cudaMallocHost", "cudaFree", "cudaFreeHost", "cudaStreamCreate", "cudaStreamDestroy")
TRT_ALLOCATING = ("Runtime", "Runtime.deserialize_cuda_engine", "ICudaEngine.create_execution_context")
REMOVED_IN_10 = {"engine": ("num_bindings", "get_binding_shape", "binding_is_input", "get_binding_name",
                            "get_binding_index", "get_binding_dtype", "get_profile_shape", "max_batch_size",
                            "has_implicit_batch_dimension"),
                 "context": ("set_binding_shape", "get_binding_shape", "execute_async_v2", "execute_async",
                             "execute"),
                 "builder": ("build_engine",), "config": ("max_workspace_size",)}


# -- fixtures and helpers ---------------------------------------------------------------------------
@pytest.fixture(params=VERSIONS, ids=["trt8.6", "trt10"])
def version(request) -> str:
    """Every backend test as a fresh process of each TensorRT version, with a fresh CUDA."""
    trt_fake.reset(request.param)
    cuda_fake.reset()
    return request.param


@pytest.fixture(scope="module")
def tiny_onnx(tmp_path_factory) -> Path:
    return make_dynamic_batch_v8_model(tmp_path_factory.mktemp("tiny") / "tiny_dynamic.onnx", size=SIZE)


def engine(directory: Path, onnx_path: Path, name: str = "model.engine", **how) -> Path:
    """A fake engine built from `onnx_path` by this (fake) TensorRT: batch=B or profile=(min, opt, max)."""
    return Path(trt_fake.write_engine(Path(directory) / name, onnx_path, **how))


def opened(path: Path, max_batch: int = 1, input_sets: int = 1, output_sets: int = 1, **config) -> TensorRTBackend:
    backend = TensorRTBackend(str(path), TensorRTConfig(**config))
    backend.open(max_batch, input_sets=input_sets, output_sets=output_sets)
    return backend


def class_scores(out: np.ndarray) -> np.ndarray:
    """Synthetic model: class 0 score on anchor 0, class 1 on the first stride-16 anchor."""
    return np.stack([out[:, 4, 0], out[:, 5, (SIZE // 8) ** 2]], axis=1)


def nothing_held() -> dict:
    """What the fakes still hold: empty when every allocation, stream and TensorRT object is gone."""
    held = {k: v for k, v in cuda_fake.leaks().items() if v}
    held.update(trt_fake.live())
    return held


def load_image(media: Path, name: str) -> np.ndarray:
    image = cv2.imread(str(media / name))
    assert image is not None
    return image


def detections(detector: Detector, images) -> list[list[dict]]:
    return [d.to_dicts(detector.labels) for d in detector.detect(images)]


# -- the engine drives the spec -----------------------------------------------------------------------
def test_dynamic_batch_engine_spec_and_pinned_buffers(version, tmp_path, tiny_onnx):
    backend = opened(engine(tmp_path, tiny_onnx, profile=(1, 2, 4)), max_batch=4, input_sets=2, output_sets=3)
    try:
        spec = backend.open(4)  # already open: the same spec again
        assert spec.input.shape == (4, 3, SIZE, SIZE) and spec.input.dtype == np.float32
        assert [o.shape for o in spec.outputs] == [(-1, 6, ANCHORS)]
        assert backend.max_batch == 4 and backend.batch_sizes == (1, 2, 3, 4)
        assert backend.description == f"tensorrt {version} GPU 0 fp32 (batch 1..4)"
        assert len(backend.input_buffers) == 2
        # What the letterbox fills is the pinned memory itself, one buffer per input set.
        for buf in backend.input_buffers:
            region = cuda_fake.STATE.region_at(buf.ctypes.data, buf.nbytes)
            assert region is not None and region.kind == "pinned" and region.ptr == buf.ctypes.data
        calls = cuda_fake.STATE.counts
        assert calls["cudaMallocHost"] == 2 + 3 and calls["cudaMalloc"] == 2 and calls["cudaStreamCreate"] == 1
    finally:
        backend.close()
    assert not nothing_held()


def test_the_real_batch_runs_within_the_profile(version, tmp_path, tiny_onnx):
    backend = opened(engine(tmp_path, tiny_onnx, profile=(2, 2, 4)), max_batch=4)
    try:
        assert backend.batch_sizes == (2, 3, 4)
        buf = backend.input_buffer
        buf[...] = np.random.default_rng(7).random(buf.shape, dtype=np.float32)
        trt_fake.STATE.executed_batches.clear()
        for n in (1, 2, 3, 4, 3):
            out = backend.run(n)[0]
            assert out.shape == (n, 6, ANCHORS)
            np.testing.assert_allclose(class_scores(out), expected_scores(buf[:n]), rtol=1e-5)
        assert trt_fake.STATE.executed_batches == [2, 2, 3, 4, 3], "the real batch, raised to the profile's min"
    finally:
        backend.close()


def test_capacity_follows_the_requested_batch_within_the_profile(version, tmp_path, tiny_onnx):
    path = engine(tmp_path, tiny_onnx, profile=(1, 4, 8))
    three, many = opened(path, max_batch=3), opened(path, max_batch=20, device_id=1)
    try:
        assert three.max_batch == 3 and three.batch_sizes == (1, 2, 3)
        assert three.input_buffer.shape[0] == 3
        assert many.max_batch == 8 and many.input_buffer.shape[0] == 8
        regions = [r for r in cuda_fake.STATE.regions.values() if r.kind == "device"]
        for device, batch in ((0, 3), (1, 8)):  # device buffers for the largest batch each runs
            assert sorted(r.size for r in regions if r.device == device) == sorted(
                [batch * 3 * SIZE * SIZE * 4, batch * 6 * ANCHORS * 4])
    finally:
        three.close()
        many.close()


def test_static_engine_runs_its_fixed_batch(version, tmp_path):
    onnx_path = make_fixed_batch_v8_model(tmp_path / "fixed1.onnx", size=SIZE)
    backend = opened(engine(tmp_path, onnx_path, batch=2), max_batch=4)
    try:
        assert backend.max_batch == 2 and backend.batch_sizes == (2,)
        assert backend.open(4).outputs[0].shape == (2, 6, ANCHORS)
        buf = backend.input_buffer
        buf[...] = np.random.default_rng(3).random(buf.shape, dtype=np.float32)
        trt_fake.STATE.executed_batches.clear()
        out = backend.run(1)[0]
        assert out.shape == (1, 6, ANCHORS)
        np.testing.assert_allclose(class_scores(out), expected_scores(buf[:1]), rtol=1e-5)
        assert trt_fake.STATE.executed_batches == [2]
        assert trt_fake.STATE.counts["IExecutionContext.set_input_shape"] == 0
        assert trt_fake.STATE.counts["ICudaEngine.get_tensor_profile_shape"] == 0
    finally:
        backend.close()


def test_only_the_real_frames_are_copied(version, tmp_path, tiny_onnx, monkeypatch):
    backend = opened(engine(tmp_path, tiny_onnx, profile=(1, 4, 4)), max_batch=4)
    copies = []
    real = cudart.cudaMemcpyAsync

    def spy(dst, src, count, kind, stream):
        copies.append((int(kind), count))
        return real(dst, src, count, kind, stream)

    monkeypatch.setattr(cudart, "cudaMemcpyAsync", spy)
    try:
        backend.run(3)
        assert copies == [(1, 3 * 3 * SIZE * SIZE * 4), (2, 3 * 6 * ANCHORS * 4)]
    finally:
        backend.close()


def test_fp16_input_engine_takes_the_letterbox_in_float16(version, tmp_path, tiny_onnx):
    path = engine(tmp_path, tiny_onnx, profile=(1, 2, 2), precision="fp16",
                  io_dtypes={"images": "float16", "output0": "float16"})
    backend = opened(path, max_batch=2)
    try:
        spec = backend.open(2)
        assert spec.input.dtype == np.float16 and backend.input_buffer.dtype == np.float16
        assert spec.outputs[0].dtype == np.float16
        assert backend.description == f"tensorrt {version} GPU 0 fp16 (batch 1..2)"
        buf = backend.input_buffer
        buf[...] = np.random.default_rng(5).random(buf.shape).astype(np.float16)
        out = backend.run(2)[0]
        assert out.dtype == np.float16
        np.testing.assert_allclose(class_scores(out).astype(np.float32), expected_scores(buf.astype(np.float32)),
                                   rtol=2e-3)
    finally:
        backend.close()


def test_run_outside_the_capacity_is_refused(version, tmp_path, tiny_onnx):
    backend = opened(engine(tmp_path, tiny_onnx, profile=(1, 2, 4)), max_batch=4, input_sets=2)
    try:
        for n in (0, 5):
            with pytest.raises(Exception, match=r"outside 1\.\.4"):
                backend.run(n)
        with pytest.raises(Exception, match=r"input set 2 outside 0\.\.1"):
            backend.run(1, input_set=2)
    finally:
        backend.close()


# -- the hot path -----------------------------------------------------------------------------------
def test_thousands_of_runs_allocate_nothing(version, tmp_path, tiny_onnx):
    backend = opened(engine(tmp_path, tiny_onnx, profile=(1, 4, 8)), max_batch=8, input_sets=2, output_sets=2)
    try:
        rng = np.random.default_rng(11)
        for buf in backend.input_buffers:
            buf[...] = rng.random(buf.shape, dtype=np.float32)
        bases = [backend.run(8, output_set=o)[0].ctypes.data for o in (0, 1)]
        for n in range(1, 9):  # warm-up: every batch size once
            backend.run(n)
        before = ({c: cuda_fake.STATE.counts[c] for c in ALLOCATING},
                  {c: trt_fake.STATE.counts[c] for c in TRT_ALLOCATING})
        for i in range(1000):
            outs = backend.run(i % 8 + 1, input_set=i % 2, output_set=(i // 2) % 2)
            assert outs[0].ctypes.data == bases[(i // 2) % 2]
        after = ({c: cuda_fake.STATE.counts[c] for c in ALLOCATING},
                 {c: trt_fake.STATE.counts[c] for c in TRT_ALLOCATING})
        assert after == before, "the hot path allocated or freed"
        assert trt_fake.STATE.counts["IExecutionContext.set_tensor_address"] == 2, "addresses are set once"
        buf = backend.input_buffers[1]
        np.testing.assert_allclose(class_scores(backend.run(8, input_set=1)[0]), expected_scores(buf), rtol=1e-5)
        assert cuda_fake.STATE.pageable_async == 0, "every async copy from or to pinned memory"
        assert cuda_fake.STATE.default_stream_ops == 0 and trt_fake.STATE.default_stream_executes == 0
        assert not cuda_fake.STATE.errors and not trt_fake.report()["errors"]
    finally:
        backend.close()
    assert not nothing_held()


def test_results_appear_only_after_the_stream_is_synchronised(version, tmp_path, tiny_onnx, monkeypatch):
    """The fake queues work on the stream until cudaStreamSynchronize: without it the backend
    would hand back last batch's outputs. This is what makes the other tests able to fail there."""
    backend = opened(engine(tmp_path, tiny_onnx, profile=(1, 1, 1)), max_batch=1)
    try:
        backend.input_buffer[...] = 0.25
        np.testing.assert_allclose(class_scores(backend.run(1)[0]), 0.25, rtol=1e-5)
        monkeypatch.setattr(cudart, "cudaStreamSynchronize", lambda stream: (cudart.cudaError_t.cudaSuccess,))
        backend.input_buffer[...] = 0.75
        stale = backend.run(1)[0]
        np.testing.assert_allclose(class_scores(stale), 0.25, rtol=1e-5)
    finally:
        monkeypatch.undo()
        backend.close()


def test_the_stream_handle_comes_from_get_cuda_native_handle(version, tmp_path, tiny_onnx):
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # int(cudaStream_t) warns from cuda-python 12.9.1
        backend = opened(engine(tmp_path, tiny_onnx, profile=(1, 1, 2)), max_batch=2)
        backend.run(2)
        backend.close()
    cuda_fake.reset(native_handle=False)  # before 12.9.1: no helper, int() is the way
    backend = opened(engine(tmp_path, tiny_onnx, profile=(1, 1, 2)), max_batch=2)
    try:
        backend.input_buffer[...] = 0.5
        np.testing.assert_allclose(class_scores(backend.run(2)[0]), 0.5, rtol=1e-5)
    finally:
        backend.close()


# -- teardown ---------------------------------------------------------------------------------------------
def test_close_releases_everything_in_reverse_order(version, tmp_path, tiny_onnx, monkeypatch):
    order: list[str] = []
    for name in ("cudaFree", "cudaFreeHost", "cudaStreamDestroy"):
        real = getattr(cudart, name)
        monkeypatch.setattr(cudart, name, lambda *a, _n=name, _r=real: (order.append(_n), _r(*a))[1])
    backend = opened(engine(tmp_path, tiny_onnx, profile=(1, 2, 2)), max_batch=2, input_sets=2, output_sets=2)
    backend.run(2)
    trt_fake.STATE.events = order  # TensorRT objects record their destruction into the same list
    backend.close()
    assert order == ["cudaFreeHost", "cudaFreeHost", "cudaFree",  # the output's sets, then its device buffer
                     "cudaFreeHost", "cudaFreeHost", "cudaFree",  # the input's
                     "destroy context", "destroy engine", "destroy runtime", "cudaStreamDestroy"]
    assert not nothing_held()
    backend.close()  # idempotent: nothing more is called
    assert len(order) == 10


def test_a_failed_open_releases_what_it_took(version, tmp_path, tiny_onnx):
    cuda_fake.fail("cudaMallocHost", int(cudart.cudaError_t.cudaErrorMemoryAllocation))
    backend = TensorRTBackend(str(engine(tmp_path, tiny_onnx, profile=(1, 2, 2))), TensorRTConfig())
    with pytest.raises(CudaError) as info:
        backend.open(2)
    err = info.value
    assert (err.call, err.code, err.code_name) == ("cudaMallocHost", 2, "cudaErrorMemoryAllocation")
    assert "out of GPU or pinned host memory" in str(err)
    assert not nothing_held()
    backend.close()  # nothing to do, no error
    assert cuda_fake.STATE.counts["cudaStreamDestroy"] == 1


def test_a_gpu_that_is_not_there_is_named(version, tmp_path, tiny_onnx):
    with pytest.raises(CudaError, match=r"cudaSetDevice failed with 101 \(cudaErrorInvalidDevice: no GPU with "
                                        r"this index\); GPU 7"):
        opened(engine(tmp_path, tiny_onnx, profile=(1, 2, 2)), device_id=7)
    assert not nothing_held()


# -- engines TensorRT cannot load -------------------------------------------------------------------------
def test_an_engine_that_does_not_deserialise_is_a_model_error(version, tmp_path, tiny_onnx):
    broken = tmp_path / "broken.engine"
    broken.write_bytes(b"not a plan")
    with pytest.raises(ModelError) as info:
        opened(broken)
    text = str(info.value)
    assert str(broken) in text and f"TensorRT {version} cannot deserialise" in text
    assert "Magic tag does not match" in text and "yoloedge convert trt" in text
    other = "10.3" if version.startswith("8") else "8.6"
    with pytest.raises(ModelError, match=f"built with TensorRT {other}"):
        opened(engine(tmp_path, tiny_onnx, "old.engine", profile=(1, 2, 2), version=other))
    assert not nothing_held()
    with pytest.raises(ModelError, match="not found"):
        opened(tmp_path / "missing.engine")


def test_a_profile_the_engine_lacks_is_a_model_error(version, tmp_path, tiny_onnx):
    with pytest.raises(ModelError, match=r"tensorrt.profile 1 asked for, the engine has 1 optimisation profile"):
        opened(engine(tmp_path, tiny_onnx, profile=(1, 2, 2)), profile=1)
    assert not nothing_held()


def test_a_static_engine_refuses_a_profile_past_its_only_one(version, tmp_path):
    onnx = make_fixed_batch_v8_model(tmp_path / "fixed.onnx", batch=2, size=SIZE)
    with pytest.raises(ModelError, match=r"tensorrt.profile 1 asked for, the engine has 1 optimisation profile"):
        opened(engine(tmp_path, onnx, batch=2), profile=1)
    assert not nothing_held()


def test_the_second_profile_is_selected_before_any_input_shape(version, tmp_path, tiny_onnx):
    """Profile 1 allows batches 5..8, profile 0 only 1..2: every shape set must fall in profile 1,
    which only holds if the context switched to it first."""
    path = engine(tmp_path, tiny_onnx, profiles=[(1, 2, 2), (5, 6, 8)])
    backend = opened(path, max_batch=8, profile=1)
    try:
        assert backend.batch_sizes == (5, 6, 7, 8) and backend.max_batch == 8
        assert backend._context.active_optimization_profile == 1
        backend.input_buffers[0][:] = 0.5
        assert [o.shape for o in backend.run(8)] == [(8, 6, ANCHORS)]
        assert [o.shape for o in backend.run(3)] == [(3, 6, ANCHORS)]  # raised to the profile's minimum
        assert trt_fake.STATE.executed_batches == [8, 5]
        assert not [m for s, m in trt_fake.STATE.log if s == "ERROR"]
    finally:
        backend.close()
    assert not nothing_held()


def test_tensorrt_before_8_5_is_named_before_any_device_call(tmp_path, tiny_onnx):
    """JetPack 5.0's TensorRT 8.4 lacks the name-based API: a clear refusal, not an AttributeError
    half-way through opening."""
    trt_fake.reset("8.4.1")
    cuda_fake.reset()
    try:
        assert not hasattr(tensorrt.ICudaEngine, "num_io_tensors")
        with pytest.raises(BackendError, match=r"TensorRT 8\.4\.1 is too old for the tensorrt backend, which needs "
                                               r"8\.5 or later"):
            opened(engine(tmp_path, tiny_onnx, profile=(1, 1, 1)))
        assert not cuda_fake.STATE.counts and not trt_fake.STATE.counts
    finally:
        trt_fake.reset()
    assert hasattr(tensorrt.ICudaEngine, "num_io_tensors")


def pooled_onnx(path: Path, *, second_input: bool = False, dets_axis: bool = False) -> Path:
    """images [batch, 3, S, S] -> output0 [batch, 3] (the channel means); `dets_axis` declares the
    output's second axis by name, as a data-dependent NMS output is; `second_input` adds an input
    passed through, as RT-DETR's orig_target_sizes is."""
    import onnx
    from onnx import TensorProto, helper
    from onnx_models import IR_VERSION, OPSET

    inputs = [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 3, SIZE, SIZE])]
    outputs = [helper.make_tensor_value_info("output0", TensorProto.FLOAT, ["batch", "dets" if dets_axis else 3])]
    nodes = [helper.make_node("GlobalAveragePool", ["images"], ["pooled"]),
             helper.make_node("Flatten", ["pooled"], ["flat" if dets_axis else "output0"], axis=1)]
    inits = []
    if dets_axis:  # the top k channels, k computed from the pixels: no shape inference can know it
        inits.append(helper.make_tensor("one", TensorProto.INT64, [1], [1]))
        nodes += [helper.make_node("ReduceMax", ["flat"], ["peak"], keepdims=1),
                  helper.make_node("Reshape", ["peak", "one"], ["peak1"]),
                  helper.make_node("Cast", ["peak1"], ["k"], to=TensorProto.INT64),
                  helper.make_node("TopK", ["flat", "k"], ["output0", "order"], axis=1)]
    if second_input:
        inputs.append(helper.make_tensor_value_info("sizes", TensorProto.FLOAT, ["batch", 2]))
        outputs.append(helper.make_tensor_value_info("sizes_out", TensorProto.FLOAT, ["batch", 2]))
        nodes.append(helper.make_node("Identity", ["sizes"], ["sizes_out"]))
    model = helper.make_model(helper.make_graph(nodes, "pooled", inputs, outputs, initializer=inits),
                              opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize("kind, how, message", [
    ("plain", {"io_dtypes": {"output0": "bfloat16"}},
     r"tensor output0 has type DataType.BF16, which numpy cannot hold"),
    ("dets", {}, r"output output0 has shape \[2, -1\] for a batch of 2; outputs must be \[batch, \.\.\.\] with "
                 r"sizes known before the run"),
    ("two_inputs", {}, r"expected one image input and at least one output, the engine has inputs "
                       r"\['images', 'sizes'\]"),
])
def test_engines_the_backend_cannot_feed_are_refused_before_any_allocation(version, tmp_path, kind, how, message):
    onnx_path = pooled_onnx(tmp_path / f"{kind}.onnx", second_input=kind == "two_inputs", dets_axis=kind == "dets")
    with pytest.raises(ModelError, match=message):
        opened(engine(tmp_path, onnx_path, profile=(1, 2, 2), **how), max_batch=2)
    assert not nothing_held()
    assert cuda_fake.STATE.counts["cudaMalloc"] == cuda_fake.STATE.counts["cudaMallocHost"] == 0


def test_a_plain_pooled_engine_runs(version, tmp_path):
    """The control for the test above: the same graph, fed as it should be, runs."""
    backend = opened(engine(tmp_path, pooled_onnx(tmp_path / "plain.onnx"), profile=(1, 2, 2)), max_batch=2)
    try:
        backend.input_buffers[0][:] = np.arange(3, dtype=np.float32)[None, :, None, None]
        assert backend.run(2)[0].tolist() == [[0.0, 1.0, 2.0]] * 2
    finally:
        backend.close()


def test_a_profile_switch_the_runtime_refuses_names_the_call(version, tmp_path, tiny_onnx, monkeypatch):
    """The bindings raise RuntimeError for a refused switch (never False); it must come out as the
    backend's error, with what TensorRT logged, and release everything."""
    real = tensorrt.IExecutionContext.set_optimization_profile_async

    def busy(self, index, stream):
        _ = real(self, 0, stream)  # the real argument checks, then the refusal a busy profile gets
        tensorrt._emit(self.engine.logger, tensorrt.ILogger.ERROR, "profile 1 is in use by another context")
        raise RuntimeError("Error in set optimization profile async.")

    monkeypatch.setattr(tensorrt.IExecutionContext, "set_optimization_profile_async", busy)
    with pytest.raises(TensorRTError, match="profile 1 is in use by another context") as info:
        opened(engine(tmp_path, tiny_onnx, profiles=[(1, 1, 1), (1, 2, 2)]), max_batch=2, profile=1)
    call = info.value.call
    del info  # its traceback holds `busy`'s frame, and with it the context
    assert call == "IExecutionContext.set_optimization_profile_async"
    assert not nothing_held()


def test_an_execute_the_runtime_refuses_names_the_call(version, tmp_path, tiny_onnx):
    backend = opened(engine(tmp_path, tiny_onnx, profile=(1, 2, 2)), max_batch=2)
    output = backend._outputs[0].device_ptr
    assert cudart.cudaFree(output) == (cudart.cudaError_t.cudaSuccess,)  # freed behind the backend's back
    with pytest.raises(TensorRTError) as info:
        backend.run(1)
    assert info.value.call == "IExecutionContext.execute_async_v3"
    assert "tensor output0" in str(info.value) and "not inside a live device allocation" in str(info.value)
    with pytest.raises(CudaError, match=r"cudaFree failed with 1 \(cudaErrorInvalidValue"):
        backend.close()  # the double free is refused and reported; everything else is still released
    assert not nothing_held()


def test_an_input_shape_outside_the_profile_names_the_call(version, tmp_path, tiny_onnx, monkeypatch):
    backend = opened(engine(tmp_path, tiny_onnx, profile=(1, 2, 4)), max_batch=4)
    try:
        monkeypatch.setattr(backend, "_profile", (1, 2, 8))  # as if the backend misread the profile
        backend.run(4)
        with pytest.raises(TensorRTError) as info:
            backend._set_batch(5)
        assert info.value.call == "IExecutionContext.set_input_shape"
        assert "batch 5 is outside the optimization profile [1, 4]" in str(info.value)
    finally:
        backend.close()


# -- one code path for 8.6 and 10.x ---------------------------------------------------------------------------
def test_the_backend_never_touches_the_apis_tensorrt_10_removed(version, tmp_path, tiny_onnx):
    backend = opened(engine(tmp_path, tiny_onnx, profile=(1, 2, 2)), max_batch=2)
    try:
        backend.run(2)
        assert not trt_fake.STATE.legacy_calls, "the backend used an API TensorRT 10 removed"
        engine_obj, context = backend._engine, backend._context
        builder = tensorrt.Builder(tensorrt.Logger())
        objects = {"engine": engine_obj, "context": context, "builder": builder,
                   "config": builder.create_builder_config()}
        for kind, names in REMOVED_IN_10.items():
            for name in names:
                assert hasattr(type(objects[kind]), name) == version.startswith("8."), (kind, name)
        if not version.startswith("8."):
            with pytest.raises(AttributeError):
                engine_obj.num_bindings  # noqa: B018 - TensorRT 10 removed it
        else:
            with pytest.warns(DeprecationWarning):
                assert engine_obj.num_bindings == 2
            assert trt_fake.STATE.legacy_calls == {"num_bindings": 1}, "and the fake counts every use"
    finally:
        backend.close()


def test_two_gpus_each_run_on_their_own_device(version, tmp_path, tiny_onnx):
    path = engine(tmp_path, tiny_onnx, profile=(1, 1, 1))
    cards = [TensorRTBackend(str(path), TensorRTConfig(device_id=d)) for d in (0, 1)]
    for card in cards:  # each opened on its own thread, like the device workers
        in_thread(card.open, 1)
    try:
        for i in range(3):
            for card in cards:  # interleaved on one thread: the current device must switch every time
                card.input_buffer[...] = 0.1 * (i + 1)
                np.testing.assert_allclose(class_scores(card.run(1)[0]), 0.1 * (i + 1), rtol=1e-5)
        assert {r.device for r in cuda_fake.STATE.regions.values() if r.kind == "device"} == {0, 1}
    finally:
        for card in cards:
            in_thread(card.close)  # and closed from yet another thread
    assert not nothing_held() and not cuda_fake.STATE.errors


# -- the fakes refuse what the real libraries refuse ------------------------------------------------------
def test_the_fake_cuda_refuses_what_cuda_refuses(version):
    ok = (cudart.cudaError_t.cudaSuccess,)
    err, dev = cudart.cudaMalloc(1024)
    assert err == 0 and dev >= 2 ** 47, "device addresses are never host addresses"
    err, host = cudart.cudaMallocHost(1024)
    assert err == 0
    err, stream = cudart.cudaStreamCreate()
    H2D, D2H = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice, cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
    assert cudart.cudaMemcpyAsync(dev, host, 1024, H2D, stream) == ok
    invalid = (cudart.cudaError_t.cudaErrorInvalidValue,)
    assert cudart.cudaMemcpyAsync(host, dev, 1024, H2D, stream) == invalid, "wrong kind for the pointers"
    assert cudart.cudaMemcpyAsync(dev, host, 1025, H2D, stream) == invalid, "overruns both buffers"
    assert cudart.cudaMemcpy(dev + 2048, host, 16, H2D) == invalid, "not inside a live device allocation"
    assert cudart.cudaMemcpy(host, dev, 16, 7) == (cudart.cudaError_t.cudaErrorInvalidMemcpyDirection,)
    assert cudart.cudaMemcpy(host, dev, 16, D2H) == ok
    assert cudart.cudaSetDevice(9) == (cudart.cudaError_t.cudaErrorInvalidDevice,)
    assert cudart.cudaMalloc(16)[1] is not None and cudart.cudaSetDevice(9)[0] != 0
    assert cudart.cudaStreamSynchronize(stream) == ok and cudart.cudaStreamDestroy(stream) == ok
    assert cudart.cudaStreamSynchronize(stream) == (cudart.cudaError_t.cudaErrorInvalidResourceHandle,)
    assert cudart.cudaFree(dev) == ok and cudart.cudaFree(dev) == invalid, "double free"
    assert cudart.cudaMemcpy(host, dev, 16, D2H) == invalid, "use after free"
    assert cudart.cudaFreeHost(host) == ok and cudart.cudaFreeHost(host) == invalid
    assert cudart.cudaMalloc(2 ** 40) == (cudart.cudaError_t.cudaErrorMemoryAllocation, None)
    assert cuda_fake.leaks() == {"device_memory": 1, "pinned_memory": 0, "streams": 0}


def test_the_fake_tensorrt_refuses_what_tensorrt_refuses(version, tmp_path, tiny_onnx):
    logger = tensorrt.Logger(tensorrt.Logger.ERROR)
    runtime = tensorrt.Runtime(logger)
    assert runtime.deserialize_cuda_engine(b"junk") is None, "None, not an exception"
    eng = runtime.deserialize_cuda_engine(engine(tmp_path, tiny_onnx, profile=(1, 2, 4)).read_bytes())
    ctx = eng.create_execution_context()
    shape = eng.get_tensor_shape("images")
    assert not isinstance(shape, tuple) and tuple(shape) == (-1, 3, SIZE, SIZE)
    assert [tuple(d) for d in eng.get_tensor_profile_shape("images", 0)] == [(1, 3, SIZE, SIZE), (2, 3, SIZE, SIZE),
                                                                            (4, 3, SIZE, SIZE)]
    assert eng.get_tensor_mode("output0") == tensorrt.TensorIOMode.OUTPUT
    assert eng.get_tensor_mode("nothing") == tensorrt.TensorIOMode.NONE
    with pytest.raises(TypeError):
        tensorrt.nptype(tensorrt.DataType.BF16)
    assert ctx.set_input_shape("images", (5, 3, SIZE, SIZE)) is False, "outside the profile"
    with pytest.raises(TypeError):
        ctx.set_input_shape("images", (2.0, 3, SIZE, SIZE))  # a float is no dimension
    with pytest.raises(RuntimeError, match="Error in set optimization profile async"):
        ctx.set_optimization_profile_async(1, 0)  # refused by raising, never by returning False
    assert ctx.set_input_shape("images", (2, 3, SIZE, SIZE + 1)) is False, "a static axis"
    err, stream = cudart.cudaStreamCreate()
    from cuda.bindings.utils import get_cuda_native_handle

    handle = get_cuda_native_handle(stream)
    assert ctx.execute_async_v3(handle) is False, "no shape, no addresses"
    assert ctx.set_input_shape("images", (2, 3, SIZE, SIZE)) is True
    assert tuple(ctx.get_tensor_shape("output0")) == (2, 6, ANCHORS)
    assert ctx.execute_async_v3(handle) is False, "shapes set, addresses not"
    assert ctx.set_tensor_address("images", 0x1000) is False, "host memory is not device memory"
    small = cudart.cudaMalloc(64)[1]
    ins = cudart.cudaMalloc(2 * 3 * SIZE * SIZE * 4)[1]
    assert ctx.set_tensor_address("images", ins) and ctx.set_tensor_address("output0", small)
    assert ctx.execute_async_v3(handle) is False, "64 bytes for two outputs"
    out = cudart.cudaMalloc(2 * 6 * ANCHORS * 4)[1]
    assert ctx.set_tensor_address("output0", out)
    with pytest.raises(TypeError):
        ctx.execute_async_v3(stream)  # a size_t: the handle, not the cudaStream_t object
    assert stream.getPtr() != handle
    assert ctx.execute_async_v3(stream.getPtr()) is False, "getPtr() is where the handle is kept, not the handle"
    assert ctx.execute_async_v3(handle) is True
    assert ctx.execute_async_v3(0) is True and trt_fake.STATE.default_stream_executes == 1
    assert cudart.cudaSetDevice(1)[0] == 0
    assert ctx.execute_async_v3(handle) is False, "the current device is not the engine's"
    assert cudart.cudaSetDevice(0)[0] == 0
    errors = [m for s, m in trt_fake.STATE.log if s == "ERROR"]
    assert len(errors) == 10 and "Magic tag does not match" in errors[0]
    assert "no address set for tensor(s) images, output0" in errors[5]
    for ptr in (small, ins, out):
        cudart.cudaFree(ptr)
    cudart.cudaStreamDestroy(stream)
    del ctx, eng, runtime
    assert not nothing_held()


# -- telemetry -------------------------------------------------------------------------------------------------
def test_telemetry_comes_from_nvidia_smi_without_a_cuda_call(tmp_path, tiny_onnx, monkeypatch):
    from yoloedge.backends import gpu_smi

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "nvidia-smi"
    tool.write_text("#!/bin/sh\necho '0, NVIDIA A2, 41, 7, 1203, 15356, 21.37'\n"
                    "echo '1, NVIDIA A2, 77, 99, 15000, 15356, 60'\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(gpu_smi, "GPU_SMI", gpu_smi.GpuSmi())
    path = engine(tmp_path, tiny_onnx, profile=(1, 1, 1))
    calls = sum(cuda_fake.STATE.counts.values())
    second = TensorRTBackend(str(path), TensorRTConfig(device_id=1)).telemetry()
    assert second is not None and (second["temperature_c"], second["memory_used_mb"]) == (77, 15000)
    assert TensorRTBackend(str(path), TensorRTConfig(device_id=0)).telemetry()["temperature_c"] == 41
    assert TensorRTBackend(str(path), TensorRTConfig(telemetry=False)).telemetry() is None
    assert sum(cuda_fake.STATE.counts.values()) == calls, "telemetry made a CUDA call"


# -- configuration ------------------------------------------------------------------------------------------
def write_config(tmp_path: Path, model: Path, section: str) -> Path:
    path = tmp_path / "yoloedge.yaml"
    path.write_text(f"device_id: edge\nmodel: {{path: {model}}}\naccelerators:\n  - backend: tensorrt\n"
                    f"    devices: [0, 1]\n{section}")
    return path


def test_the_tensorrt_section_is_validated(tmp_path, tiny_onnx):
    model = engine(tmp_path, tiny_onnx, profile=(1, 1, 1))
    config = load_config(str(write_config(tmp_path, model, "    tensorrt:\n      profile: 0\n"
                                                                "      source_onnx: models/y.onnx\n"
                                                                "      telemetry: false\n")), {})
    (acc,) = config.accelerators
    assert acc.options == {"profile": 0, "source_onnx": str(tmp_path / "models" / "y.onnx"), "telemetry": False}
    assert backend_config_for(acc, 1) == TensorRTConfig(device_id=1, source_onnx=str(tmp_path / "models" / "y.onnx"),
                                                        telemetry=False)
    plain = load_config(str(write_config(tmp_path, model, "")), {})
    assert backend_config_for(plain.accelerators[0], 0) == TensorRTConfig()
    with pytest.raises(ConfigError) as info:
        load_config(str(write_config(tmp_path, model, "    tensorrt:\n      profile: -1\n      fp16: true\n")), {})
    text = str(info.value)
    assert "accelerators[0].tensorrt.profile" in text and "accelerators[0].tensorrt.fp16" in text
    assert "unknown key" in text


def test_create_backend_builds_it_from_the_catalogue(version, tmp_path, tiny_onnx):
    backend = create_backend("tensorrt", str(engine(tmp_path, tiny_onnx, profile=(1, 1, 1))), TensorRTConfig())
    assert isinstance(backend, TensorRTBackend)
    backend.open(1)
    backend.close()
    assert not nothing_held()


# -- detections: the same as ONNX Runtime's -----------------------------------------------------------------
@pytest.mark.shared
@pytest.mark.parametrize("model_name", ["yolov8n_coco_int8.onnx", "yolov5n_coco_fp16.onnx"])
def test_same_detections_as_onnxruntime(version, model_name, models, media, references, tmp_path):
    source = models / model_name
    path = engine(tmp_path, source, batch=1, precision="fp16" if "fp16" in model_name else "int8")
    images = [load_image(media, "bus.jpg"), load_image(media, "zidane.jpg")]
    reference = Detector(ModelConfig(path=str(source)), OnnxRuntimeBackend(str(source)))
    ours = Detector(ModelConfig(path=str(path)), TensorRTBackend(str(path), TensorRTConfig()))
    try:
        assert ours.spec.input.dtype == reference.spec.input.dtype  # float16 for the fp16 export
        assert ours.layout.format == reference.layout.format
        found, expected = detections(ours, images), detections(reference, images)
        assert found == expected
        for dets, image in zip(found, ("bus", "zidane")):
            ref = json.loads((references / f"{source.stem}__{image}__conf25_iou45.json").read_text())
            assert not mismatches(dets, ref["detections"])
    finally:
        ours.close()
        reference.close()
    assert not nothing_held()


@pytest.mark.shared
def test_dynamic_batch_engine_detects_like_onnxruntime(version, models, media, tmp_path):
    source = models / "yolov5n_coco_fp16.onnx"
    path = engine(tmp_path, source, profile=(1, 2, 4), precision="fp16")
    images = [load_image(media, "bus.jpg"), load_image(media, "zidane.jpg"), load_image(media, "bus.jpg")]
    reference = Detector(ModelConfig(path=str(source)), OnnxRuntimeBackend(str(source)))
    ours = Detector(ModelConfig(path=str(path)), TensorRTBackend(str(path), TensorRTConfig()), max_batch=4)
    try:
        trt_fake.STATE.executed_batches.clear()
        assert detections(ours, images) == detections(reference, images)
        assert trt_fake.STATE.executed_batches == [3], "one run at the real batch of 3 (profile max 4)"
    finally:
        ours.close()


@pytest.mark.shared
def test_fp16_input_engine_of_a_float32_model_agrees(version, models, media, references, tmp_path):
    """trtexec --fp16 --inputIOFormats=fp16:chw: the letterbox writes float16 into the pinned input."""
    source = models / "yolov8n_coco_int8.onnx"
    path = engine(tmp_path, source, batch=1, precision="fp16", io_dtypes={"images": "float16"})
    ours = Detector(ModelConfig(path=str(path)), TensorRTBackend(str(path), TensorRTConfig()))
    try:
        assert ours.spec.input.dtype == np.float16 and ours.backend.input_buffer.dtype == np.float16
        for image in ("bus", "zidane"):
            dets = detections(ours, [load_image(media, f"{image}.jpg")])[0]
            ref = json.loads((references / f"{source.stem}__{image}__conf25_iou45.json").read_text())
            problems = mismatches(dets, ref["detections"])
            assert not problems, "\n".join(problems)
    finally:
        ours.close()


# -- the daemon on two fake GPUs ------------------------------------------------------------------------------
from test_daemon import base_config, detections_by_frame, notify, start_daemon  # noqa: E402,F401  (fixtures)
from daemon_harness import status as daemon_status  # noqa: E402


@pytest.mark.shared
def test_daemon_on_two_fake_gpus_publishes_what_onnxruntime_finds(tmp_path, models, media, mosquitto, subscriber,
                                                                   notify, start_daemon):  # noqa: F811
    trt_fake.reset("10.3.0")
    source = models / "yolov8n_coco_int8.onnx"
    path = engine(tmp_path, source, profile=(1, 2, 4), precision="int8", version="10.3")
    video = media / "indoor_people_480p_mpeg4.avi"
    reports = {"trt": tmp_path / "trt-report.json", "cuda": tmp_path / "cuda-report.json"}
    config = base_config(tmp_path, models, mosquitto, [{"name": "door", "url": str(video), "realtime": False}])
    config["model"] = {"path": str(path)}
    config["accelerators"] = [{"backend": "tensorrt", "devices": [0, 1], "batch": 2,
                               "tensorrt": {"source_onnx": str(source)}}]
    daemon, _ = start_daemon(config, env={"YOLOEDGE_FAKE_TRT_VERSION": "10.3.0",
                                          "YOLOEDGE_FAKE_TRT_REPORT": str(reports["trt"]),
                                          "YOLOEDGE_FAKE_CUDA_REPORT": str(reports["cuda"])})

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
        assert w["backend"] == "tensorrt" and w["state"] == "running"
        assert w["description"] == f"tensorrt 10.3.0 GPU {w['device']} fp32 (batch 1..2)"

    daemon.signal(signal.SIGTERM)
    assert daemon.proc.wait(30) == 0, daemon.log[-4000:]
    trt_report, cuda_report = (json.loads(reports[k].read_text()) for k in ("trt", "cuda"))
    assert not trt_report["live"] and not trt_report["legacy_calls"] and not trt_report["errors"], trt_report
    assert trt_report["default_stream_executes"] == 0
    assert sum(trt_report["executed_batches"].values()) >= 84 // 2
    assert not any(cuda_report["leaks"].values()), cuda_report
    assert not cuda_report["errors"] and cuda_report["pageable_async"] == 0, cuda_report
    calls = cuda_report["calls"]
    assert calls["cudaStreamCreate"] == calls["cudaStreamDestroy"] == 2
    assert calls["cudaMalloc"] == calls["cudaFree"] and calls["cudaMallocHost"] == calls["cudaFreeHost"]
