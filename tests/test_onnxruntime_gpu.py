"""ONNX Runtime on GPU providers: input sets staged in device OrtValues allocated once, engine and
compile caches keyed by what they depend on, provider options by ONNX Runtime version.

The device path takes its device type as a parameter, so here it runs on the CPU ("cpu" OrtValues)
through exactly the code that runs on "cuda" on a GPU; the tests marked `gpu` run it on a real GPU
provider and skip only where this onnxruntime build has none.
"""

from __future__ import annotations

import gc
import os
import tracemalloc
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

pytest.importorskip("onnx")

from onnx_models import make_dynamic_batch_v8_model, make_fixed_batch_v8_model  # noqa: E402
from yoloedge.backends import ort_gpu_check  # noqa: E402
from yoloedge.backends.onnxruntime import OnnxRuntimeBackend  # noqa: E402
from yoloedge.backends.ort_cache import CacheKey, cache_folder, model_digest  # noqa: E402
from yoloedge.backends.ort_providers import (cache_options, migraphx_cache_options, parse_version,  # noqa: E402
                                             precision, provider_entry)
from yoloedge.config import OnnxRuntimeConfig  # noqa: E402
from yoloedge.config.model import default_cache_dir  # noqa: E402
from yoloedge.config.providers import GPU_PROVIDERS as ALL_GPU_PROVIDERS, PROVIDERS  # noqa: E402
from yoloedge.errors import BackendError  # noqa: E402

SIZE = 64
GPU_PROVIDERS = ("cuda", "tensorrt", "migraphx", "rocm")


@pytest.fixture(scope="module")
def dynamic_model(tmp_path_factory):
    return make_dynamic_batch_v8_model(tmp_path_factory.mktemp("m") / "dynamic.onnx", size=SIZE)


@pytest.fixture(scope="module")
def fixed2_model(tmp_path_factory):
    """A fixed batch of 2: a request for 3 frames runs as two chunks, the second half empty."""
    return make_fixed_batch_v8_model(tmp_path_factory.mktemp("m") / "fixed2.onnx", size=SIZE, batch=2)


def shared_models(models: Path) -> list[Path]:
    found = sorted(models.glob("*.onnx"))
    assert found, f"no models in {models}"
    return found


def open_pair(path, max_batch, sets=2, **config):
    """The plain host-bound backend and the device-staged one on "cpu", same model and settings."""
    plain = OnnxRuntimeBackend(str(path), OnnxRuntimeConfig(**config))
    staged = OnnxRuntimeBackend(str(path), OnnxRuntimeConfig(**config), device_type="cpu")
    for backend in (plain, staged):
        backend.open(max_batch, input_sets=sets, output_sets=sets)
    return plain, staged


def fill_both(plain, staged, rng):
    for s, buf in enumerate(plain.input_buffers):
        data = rng.random(buf.shape).astype(buf.dtype)
        buf[...] = data
        staged.input_buffers[s][...] = data


class CountingOrtValues:
    """Counts every Python OrtValue made (factories, IOBinding outputs, anything): its __init__."""

    def __init__(self, monkeypatch):
        self.count = 0
        real = ort.OrtValue.__init__

        def counting(value, *args, **kwargs):
            self.count += 1
            real(value, *args, **kwargs)

        monkeypatch.setattr(ort.OrtValue, "__init__", counting)


# -- the device path, on "cpu" -----------------------------------------------------------------------
@pytest.mark.shared
def test_staged_outputs_are_identical_to_the_plain_path_on_the_shared_models(models):
    rng = np.random.default_rng(7)
    for path in shared_models(models):
        plain, staged = open_pair(path, max_batch=2)
        assert staged._input_device == "cpu" and len(staged._device_inputs) == 2
        assert plain._input_device is None and not plain._device_inputs
        fill_both(plain, staged, rng)
        for n, i, o in ((2, 0, 0), (1, 1, 1)):
            want = [a.copy() for a in plain.run(n, i, o)]
            got = staged.run(n, i, o)
            assert [g.shape for g in got] == [w.shape for w in want]
            for g, w in zip(got, want):
                np.testing.assert_array_equal(g, w, err_msg=f"{path.name} n={n} sets {i}/{o}")
        plain.close()
        staged.close()


@pytest.mark.parametrize("model", ["dynamic_model", "fixed2_model"])
def test_staged_partial_batches_equal_the_plain_path(model, request):
    """n < max_batch: a dynamic batch binds an n-frame view of the device tensor, a fixed batch of
    2 runs ceil(n/2) chunks at their offsets in it."""
    plain, staged = open_pair(request.getfixturevalue(model), max_batch=3)
    assert staged.batch_sizes == plain.batch_sizes
    rng = np.random.default_rng(3)
    for n in (1, 2, 3, 1):
        fill_both(plain, staged, rng)
        want = [a.copy() for a in plain.run(n)]
        got = staged.run(n)
        assert got[0].shape[0] == n
        np.testing.assert_array_equal(got[0], want[0])
    plain.close()
    staged.close()


def test_the_model_reads_the_device_tensor_not_the_host_buffer(dynamic_model, monkeypatch):
    """With the copy into the device tensor switched off, a run computes on what the tensor held
    from the run before, not on the new host data: the binding points at the device memory."""
    plain, staged = open_pair(dynamic_model, max_batch=2, sets=1)
    rng = np.random.default_rng(5)
    fill_both(plain, staged, rng)
    staged.run(2)  # the device tensor now holds this batch
    held = staged.input_buffer.copy()
    fill_both(plain, staged, rng)  # new host data ...
    with monkeypatch.context() as patch:
        patch.setattr(ort.OrtValue, "update_inplace", lambda self, data: None)  # ... never copied
        stale = staged.run(2)[0].copy()
    fresh = plain.run(2)[0].copy()
    assert not np.array_equal(stale, fresh)
    plain.input_buffer[...] = held
    np.testing.assert_array_equal(stale, plain.run(2)[0])
    np.testing.assert_array_equal(staged.run(2)[0], fresh)  # copying again: the new data
    plain.close()
    staged.close()


@pytest.mark.parametrize("model", ["dynamic_model", "fixed2_model"])
def test_device_tensors_are_made_once_per_input_set_and_never_per_batch(model, request, monkeypatch):
    counter = CountingOrtValues(monkeypatch)
    backend = OnnxRuntimeBackend(str(request.getfixturevalue(model)), OnnxRuntimeConfig(), device_type="cpu")
    backend.open(3, input_sets=3, output_sets=2)
    assert counter.count == 3, "one device tensor per input set, made in open"
    tensors = list(backend._device_inputs)
    addresses = [t.data_ptr() for t in tensors]
    for _round in range(3):
        for n in (1, 2, 3):
            for i in range(3):
                backend.run(n, input_set=i, output_set=(n + i) % 2)
    assert counter.count == 3, f"{counter.count - 3} OrtValues made by runs"
    assert [t.data_ptr() for t in backend._device_inputs] == addresses
    assert all(a is b for a, b in zip(backend._device_inputs, tensors))
    backend.close()
    assert not backend._device_inputs


def test_staged_runs_do_not_grow_the_heap(dynamic_model):
    """As the plain path's heap test (test_onnxruntime_backend): the smallest of three windows."""
    backend = OnnxRuntimeBackend(str(dynamic_model), OnnxRuntimeConfig(), device_type="cpu")
    backend.open(4)
    backend.input_buffer[...] = np.random.default_rng(1).random(backend.input_buffer.shape, dtype=np.float32)
    for n in (1, 2, 3, 4) * 100:
        backend.run(n)
    gc.collect()
    mine = [tracemalloc.Filter(True, __file__, all_frames=True)]
    growths = []
    tracemalloc.start(64)
    try:
        for _window in range(3):
            before = tracemalloc.take_snapshot().filter_traces(mine)
            for i in range(200):
                backend.run(1 + i % 4)
            gc.collect()
            after = tracemalloc.take_snapshot().filter_traces(mine)
            growths.append(sum(stat.size_diff for stat in after.compare_to(before, "filename")))
    finally:
        tracemalloc.stop()
    assert min(growths) < 4 * 1024, f"Python heap grew by {growths} bytes per 200 runs"
    backend.close()


def test_io_binding_off_stages_nothing(dynamic_model):
    backend = OnnxRuntimeBackend(str(dynamic_model), OnnxRuntimeConfig(io_binding=False), device_type="cpu")
    backend.open(2)
    assert not backend._device_inputs
    assert backend.run(2)[0].shape[0] == 2
    backend.close()


def test_a_device_this_build_cannot_allocate_on_is_a_backend_error(dynamic_model):
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime build can allocate CUDA memory")
    backend = OnnxRuntimeBackend(str(dynamic_model), OnnxRuntimeConfig(), device_type="cuda")
    with pytest.raises(BackendError, match="ortvalue_from_shape_and_type.*'cuda'"):
        backend.open(1)


# -- provider options by version ---------------------------------------------------------------------
@pytest.mark.parametrize("text, want", [
    ("1.22.1", (1, 22, 1)), ("1.22.2.post1", (1, 22, 2)), ("1.23.0", (1, 23, 0)),
    ("1.24.0.dev20251104", (1, 24, 0)), ("1.27", (1, 27, 0)), ("2.0.0rc1", (2, 0, 0)),
])
def test_parse_version(text, want):
    assert parse_version(text) == want


def test_parse_version_refuses_what_is_not_a_version():
    with pytest.raises(ValueError):
        parse_version("unknown")


@pytest.mark.parametrize("version", [(1, 17, 0), (1, 22, 1), (1, 22, 2)])
def test_migraphx_up_to_1_22_saves_then_loads_one_program_file(version, tmp_path):
    program = str(tmp_path / "model.mxr")
    first = migraphx_cache_options(version, str(tmp_path))
    assert first == {"migraphx_save_compiled_model": "True", "migraphx_save_model_path": program}
    Path(program).write_bytes(b"compiled program")
    later = migraphx_cache_options(version, str(tmp_path))
    assert later == {"migraphx_load_compiled_model": "True", "migraphx_load_model_path": program}
    assert "migraphx_model_cache_dir" not in first | later


@pytest.mark.parametrize("version", [(1, 23, 0), (1, 23, 2), (1, 27, 1), (2, 0, 0)])
def test_migraphx_from_1_23_takes_a_cache_folder(version, tmp_path):
    (tmp_path / "model.mxr").write_bytes(b"left over from 1.22")
    assert migraphx_cache_options(version, str(tmp_path)) == {"migraphx_model_cache_dir": str(tmp_path)}


def test_tensorrt_caches_engines_and_timings_in_the_folder(tmp_path):
    options = cache_options("tensorrt", (1, 22, 1), str(tmp_path))
    assert options == {"trt_engine_cache_enable": "True", "trt_engine_cache_path": str(tmp_path),
                       "trt_timing_cache_enable": "True", "trt_timing_cache_path": str(tmp_path)}
    assert cache_options("cuda", (1, 22, 1), str(tmp_path)) == {}


def test_provider_entry_spells_flags_as_every_ep_reads_them(tmp_path):
    name, options = provider_entry("tensorrt", 1, {"trt_fp16_enable": True, "trt_int8_enable": False,
                                                   "trt_max_workspace_size": 1 << 30},
                                   cache_options("tensorrt", (1, 22, 1), str(tmp_path)))
    assert name == "TensorrtExecutionProvider"
    assert options["device_id"] == "1"
    assert options["trt_fp16_enable"] == "True" and options["trt_int8_enable"] == "False"
    assert options["trt_max_workspace_size"] == str(1 << 30)
    assert options["trt_engine_cache_path"] == str(tmp_path)
    assert all(isinstance(v, str) for v in options.values())
    assert provider_entry("cpu", 0, {}, {}) == "CPUExecutionProvider"
    # "1" is how the CUDA and MIGraphX EPs document flags; TensorRT's parser would refuse it.
    _, options = provider_entry("tensorrt", 0, {"trt_fp16_enable": "1", "trt_int8_enable": 0,
                                                "trt_dla_enable": "maybe"}, {})
    assert (options["trt_fp16_enable"], options["trt_int8_enable"], options["trt_dla_enable"]) == ("True", "False",
                                                                                                   "maybe")
    _, options = provider_entry("cuda", 0, {"enable_cuda_graph": "1"}, {})
    assert options["enable_cuda_graph"] == "1", "other EPs get the config's spelling"


def test_the_configs_provider_options_win_over_the_cache_keys(tmp_path):
    _, options = provider_entry("tensorrt", 0, {"trt_engine_cache_path": "/srv/engines"},
                                cache_options("tensorrt", (1, 22, 1), str(tmp_path)))
    assert options["trt_engine_cache_path"] == "/srv/engines"


@pytest.mark.parametrize("provider, options, want", [
    ("tensorrt", {}, "fp32"),
    ("tensorrt", {"trt_fp16_enable": True}, "fp16"),
    ("tensorrt", {"trt_fp16_enable": "1", "trt_int8_enable": "true"}, "fp16+int8"),
    ("tensorrt", {"trt_fp16_enable": "False"}, "fp32"),
    ("migraphx", {"migraphx_fp16_enable": 1}, "fp16"),
    ("migraphx", {"migraphx_int8_enable": "True", "migraphx_fp8_enable": 0}, "int8"),
    ("cuda", {"trt_fp16_enable": True}, "fp32"),
])
def test_precision_from_the_provider_options(provider, options, want):
    assert precision(provider, options) == want


# -- the cache key and folder ------------------------------------------------------------------------
def key(**changes):
    values = dict(model_sha256="ab" * 32, batch=4, input_hw=(640, 640), precision="fp16",
                  device="tensorrt0", runtime="1.22.1")
    values.update(changes)
    return CacheKey(**values)


def test_the_cache_folder_changes_with_everything_the_engine_depends_on():
    base = key().folder_name
    assert key().folder_name == base
    for change in ({"model_sha256": "cd" * 32}, {"batch": 8}, {"input_hw": (480, 640)}, {"input_hw": None},
                   {"precision": "fp32"}, {"device": "tensorrt1"}, {"device": "migraphx0"},
                   {"runtime": "1.23.0"}):
        assert key(**change).folder_name != base, change


def test_the_model_digest_follows_the_content_not_the_name(dynamic_model, fixed2_model, tmp_path):
    copy = tmp_path / "renamed.onnx"
    copy.write_bytes(Path(dynamic_model).read_bytes())
    assert model_digest(str(copy)) == model_digest(str(dynamic_model))
    assert model_digest(str(fixed2_model)) != model_digest(str(dynamic_model))
    changed = tmp_path / "changed.onnx"
    changed.write_bytes(Path(dynamic_model).read_bytes() + b"\0")
    assert model_digest(str(changed)) != model_digest(str(dynamic_model))
    with pytest.raises(BackendError, match="missing.onnx"):
        model_digest(str(tmp_path / "missing.onnx"))


def test_cache_folder_is_made_private_under_the_root(tmp_path):
    folder = cache_folder(str(tmp_path / "cache"), key())
    assert folder == str(tmp_path / "cache" / "onnxruntime" / key().folder_name)
    assert os.path.isdir(folder)
    assert os.stat(folder).st_mode & 0o777 == 0o700
    assert cache_folder(str(tmp_path / "cache"), key()) == folder  # already there: fine


def test_a_cache_root_that_cannot_hold_folders_names_the_setting(tmp_path):
    root = tmp_path / "a-file"
    root.write_text("not a folder")
    with pytest.raises(BackendError, match="cache_dir") as err:
        cache_folder(str(root), key())
    assert str(root) in str(err.value)


@pytest.mark.parametrize("environ, want", [
    ({"CACHE_DIRECTORY": "/var/cache/yoloedge", "HOME": "/home/u"}, "/var/cache/yoloedge"),
    ({"CACHE_DIRECTORY": "/var/cache/a:/var/cache/b"}, "/var/cache/a"),
    ({"XDG_CACHE_HOME": "/data/cache", "HOME": "/home/u"}, "/data/cache/yoloedge"),
    ({"XDG_CACHE_HOME": "relative/cache", "HOME": "/home/u"}, "/home/u/.cache/yoloedge"),
    ({"CACHE_DIRECTORY": "", "HOME": "/home/u"}, "/home/u/.cache/yoloedge"),
])
def test_default_cache_dir(environ, want):
    assert default_cache_dir(environ) == want


def test_the_default_cache_dir_is_read_when_a_config_is_built(monkeypatch):
    monkeypatch.setenv("CACHE_DIRECTORY", "/var/cache/first")
    first = OnnxRuntimeConfig()
    monkeypatch.setenv("CACHE_DIRECTORY", "/var/cache/second")
    assert first.cache_dir == "/var/cache/first"
    assert OnnxRuntimeConfig().cache_dir == "/var/cache/second"
    assert OnnxRuntimeConfig(cache_dir="/srv/c").cache_dir == "/srv/c"


# -- providers this build lacks ----------------------------------------------------------------------
def missing_gpu_providers() -> list[str]:
    return [p for p in ("cuda", "tensorrt", "migraphx") if PROVIDERS[p].ort_name not in ort.get_available_providers()]


@pytest.mark.parametrize("provider", missing_gpu_providers())
def test_a_missing_provider_is_refused_without_allow_fallback(provider, dynamic_model, tmp_path):
    backend = OnnxRuntimeBackend(str(dynamic_model), OnnxRuntimeConfig(provider=provider, cache_dir=str(tmp_path)))
    with pytest.raises(BackendError) as err:
        backend.open(2)
    assert PROVIDERS[provider].ort_name in str(err.value) and "allow_fallback" in str(err.value)
    assert list(tmp_path.iterdir()) == [], "no cache folder for a provider that is not there"


@pytest.mark.parametrize("provider", missing_gpu_providers())
def test_an_accepted_fallback_runs_the_plain_cpu_path(provider, dynamic_model, tmp_path):
    backend = OnnxRuntimeBackend(str(dynamic_model), OnnxRuntimeConfig(provider=provider, allow_fallback=True,
                                                                        cache_dir=str(tmp_path)))
    backend.open(3)
    assert backend.active_provider == "CPUExecutionProvider"
    assert backend._input_device is None and not backend._device_inputs
    assert backend.batch_sizes == (1, 2, 3), "a fallback to the CPU keeps the dynamic batch"
    assert backend.telemetry() is None
    assert backend.run(2)[0].shape[0] == 2
    backend.close()


def test_a_listed_provider_that_does_not_load_is_refused_after_its_cache_is_keyed(dynamic_model, tmp_path,
                                                                                    monkeypatch):
    """A build that lists TensorRT whose libraries then fail to load falls back inside ONNX Runtime
    with a warning only: the session's providers tell, and the backend refuses. The provider entry
    it asked for carried the cache keys for this model."""
    if "TensorrtExecutionProvider" in ort.get_available_providers():
        pytest.skip("this build has TensorRT")
    listed = [*ort.get_available_providers(), "TensorrtExecutionProvider"]
    monkeypatch.setattr(ort, "get_available_providers", lambda: listed)
    seen = []
    real_session = ort.InferenceSession

    def recording(path, sess_options=None, providers=None, **kwargs):
        seen.append(providers)
        return real_session(path, sess_options=sess_options, providers=providers, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", recording)
    backend = OnnxRuntimeBackend(str(dynamic_model), OnnxRuntimeConfig(
        provider="tensorrt", cache_dir=str(tmp_path), provider_options={"trt_fp16_enable": True}))
    with pytest.raises(BackendError, match="TensorrtExecutionProvider"):
        backend.open(4)
    (name, options), cpu = seen[0]
    folder = backend.cache_folder
    assert name == "TensorrtExecutionProvider" and cpu == "CPUExecutionProvider"
    assert folder.startswith(str(tmp_path / "onnxruntime") + os.sep) and os.path.isdir(folder)
    assert model_digest(str(dynamic_model))[:16] in folder and "-b4-" in folder and "-fp16-" in folder
    assert "-tensorrt0-" in folder and folder.endswith(ort.__version__)
    assert options["trt_engine_cache_path"] == folder and options["trt_engine_cache_enable"] == "True"
    assert options["trt_fp16_enable"] == "True"


# -- on a real GPU provider --------------------------------------------------------------------------
def gpu_provider_or_skip(provider: str) -> None:
    if PROVIDERS[provider].ort_name not in ort.get_available_providers():
        pytest.skip(f"this onnxruntime build has no {PROVIDERS[provider].ort_name}")


@pytest.mark.gpu
@pytest.mark.shared
@pytest.mark.parametrize("provider", GPU_PROVIDERS)
def test_gpu_provider_matches_the_cpu_and_reuses_its_cache(provider, models, tmp_path):
    gpu_provider_or_skip(provider)
    # float32 and without ConvInteger (which the GPU providers hand back to the CPU)
    path = models / "yolox_nano_coco_416.onnx"
    cpu = OnnxRuntimeBackend(str(path), OnnxRuntimeConfig())
    cpu.open(2)
    config = OnnxRuntimeConfig(provider=provider, cache_dir=str(tmp_path))
    gpu = OnnxRuntimeBackend(str(path), config)
    gpu.open(2)
    assert gpu.active_provider == PROVIDERS[provider].ort_name
    assert gpu._input_device == "cuda"
    assert all(t.device_name().lower() == "cuda" for t in gpu._device_inputs)
    data = np.random.default_rng(11).random(cpu.input_buffer.shape).astype(cpu.input_buffer.dtype)
    cpu.input_buffer[...] = data
    gpu.input_buffer[...] = data
    for n in (2, 1):
        for g, c in zip(gpu.run(n), cpu.run(n)):
            np.testing.assert_allclose(g, c, rtol=1e-2, atol=1e-2)
    gpu.close()
    if PROVIDERS[provider].compiles:
        before = sorted(p.name for p in Path(gpu.cache_folder).iterdir())
        assert before, f"{provider} left nothing in {gpu.cache_folder}"
        again = OnnxRuntimeBackend(str(path), config)
        again.open(2)
        assert again.cache_folder == gpu.cache_folder
        assert sorted(p.name for p in Path(gpu.cache_folder).iterdir()) == before, "rebuilt at the second start"
        again.close()
    cpu.close()


# -- the GPU check's command (scripts/gpu-check.sh) ----------------------------------------------------
def test_gpu_check_compares_element_by_element():
    want = np.array([[0.5, 300.0]], np.float32)
    assert ort_gpu_check.worst_excess(want + np.float32(0.004), want, rtol=1e-2, atol=1e-2)[1] <= 0
    diff, excess = ort_gpu_check.worst_excess(np.array([[0.53, 300.0]], np.float32), want, rtol=1e-2, atol=1e-2)
    assert diff == pytest.approx(0.03, abs=1e-6) and excess > 0
    assert ort_gpu_check.worst_excess(np.array([[0.5, 302.0]], np.float32), want, 1e-2, 1e-2)[1] <= 0


def test_gpu_check_runs_its_comparison_and_second_opening(dynamic_model, tmp_path):
    """Its per-provider check, run on the CPU provider: same numbers both ways, a line to read."""
    args = ort_gpu_check.parse_args([str(dynamic_model), "--batch", "3"])
    ok, line = ort_gpu_check.check(Path(dynamic_model), "cpu", args, str(tmp_path))
    assert ok, line
    assert "OK" in line and "max|diff| 0" in line and "again" in line


def test_gpu_check_says_when_this_build_has_no_gpu_provider(dynamic_model, capsys):
    absent = [p for p in ALL_GPU_PROVIDERS if PROVIDERS[p].ort_name not in ort.get_available_providers()]
    if not absent:
        pytest.skip("this build has every GPU provider")
    assert ort_gpu_check.main([str(dynamic_model), "--providers", absent[0]]) == ort_gpu_check.NO_PROVIDER
    assert "nothing checked" in capsys.readouterr().out


@pytest.mark.parametrize("provider, kind", [("cuda", "cuda"), ("tensorrt", "cuda"), ("migraphx", "rocm"),
                                            ("rocm", "rocm")])
def test_telemetry_asks_the_gpu_tool_for_the_providers_device(provider, kind, dynamic_model, monkeypatch):
    """Wiring only (the tools' parsing is tested with gpu_smi): a session on a GPU provider asks
    for its own device, one on the CPU asks nothing."""
    import yoloedge.backends.onnxruntime as backend_module

    asked = []
    monkeypatch.setattr(backend_module, "gpu_telemetry", lambda k, d: asked.append((k, d)) or {"source": "x"})
    backend = OnnxRuntimeBackend(str(dynamic_model), OnnxRuntimeConfig(provider=provider, device_id=1))
    assert backend.telemetry() is None, "not open: no session, nothing to ask"
    backend.active_provider = PROVIDERS[provider].ort_name  # as after a session on that provider opened
    assert backend.telemetry() == {"source": "x"}
    backend.active_provider = "CPUExecutionProvider"  # as after an accepted fallback
    assert backend.telemetry() is None
    assert asked == [(kind, 1)]
