"""ONNX Runtime's own provider fallbacks, and the engine cache folder's ownership.

ONNX Runtime's Python layer falls back to the CPU on its own in two places: when a provider fails
to start (it prints "EP Error ... Falling back" and re-creates the session) and when a provider
fails inside `session.run()` (it prints the same and re-creates the session on the CPU for every
later run). The backend must not let the second happen behind its back, and must say which of
"not in this build" and "in this build but did not start" stopped the first. The failing GPU
provider is absent here, so its failure is raised where the real one surfaces: ONNX Runtime's
EPFail from the compiled session's run, on a real session.
"""

from __future__ import annotations

import os
import stat

import numpy as np
import onnxruntime as ort
import pytest
from onnxruntime.capi.onnxruntime_pybind11_state import EPFail

pytest.importorskip("onnx")

from onnx_models import make_dynamic_batch_v8_model  # noqa: E402
from yoloedge.backends.onnxruntime import OnnxRuntimeBackend  # noqa: E402
from yoloedge.backends.ort_cache import CacheKey, cache_folder  # noqa: E402
from yoloedge.config import OnnxRuntimeConfig  # noqa: E402
from yoloedge.errors import BackendError  # noqa: E402


@pytest.fixture(scope="module")
def dynamic_model(tmp_path_factory):
    return make_dynamic_batch_v8_model(tmp_path_factory.mktemp("m") / "dynamic.onnx", size=64)


class FailingRuns:
    """The compiled session with its run() failing as a provider's kernel does (EPFail)."""

    def __init__(self, real):
        self._real = real
        self.runs = 0

    def run(self, *args, **kwargs):
        self.runs += 1
        raise EPFail("[ONNXRuntimeError] : 11 : EP_FAIL : CUDA error cudaErrorLaunchFailure (simulated)")

    def __getattr__(self, name):
        return getattr(self._real, name)


def test_a_provider_failing_inside_a_run_fails_the_batch_and_the_session_stays(dynamic_model, capsys):
    """io_binding: false runs through session.run(), where ONNX Runtime would otherwise re-create
    the session on the CPU and carry on, saying so on stdout only."""
    backend = OnnxRuntimeBackend(str(dynamic_model), OnnxRuntimeConfig(io_binding=False))
    backend.open(2)
    backend.input_buffer[...] = np.random.default_rng(1).random(backend.input_buffer.shape, dtype=np.float32)
    session = backend._session
    failing = FailingRuns(session._sess)
    session._sess = failing
    with pytest.raises(EPFail, match="simulated"):
        backend.run(2)
    assert session._sess is failing, "the session was re-created behind the backend's back"
    assert "Falling back" not in capsys.readouterr().out
    with pytest.raises(EPFail):
        backend.run(1)
    assert failing.runs == 2
    backend.close()


def test_a_listed_provider_that_did_not_start_is_not_told_to_install_a_package(dynamic_model, monkeypatch, tmp_path):
    """A build with CUDA whose CUDA provider did not start (no GPU, a missing cuDNN): the session
    runs on the CPU. That is not 'not available', and another package is not the fix."""
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this build has CUDA: its provider would start or fail for real")
    listed = [*ort.get_available_providers(), "CUDAExecutionProvider"]
    monkeypatch.setattr(ort, "get_available_providers", lambda: listed)
    backend = OnnxRuntimeBackend(str(dynamic_model), OnnxRuntimeConfig(provider="cuda", cache_dir=str(tmp_path)))
    with pytest.raises(BackendError) as err:
        backend.open(1)
    text = str(err.value)
    assert "CUDAExecutionProvider ('cuda') is in this build but did not start" in text
    assert "Install the matching onnxruntime package" not in text and "allow_fallback" in text


def test_a_provider_this_build_lacks_still_says_what_to_install(dynamic_model, tmp_path):
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this build has CUDA")
    with pytest.raises(BackendError, match="is not available .*Install the matching onnxruntime package"):
        OnnxRuntimeBackend(str(dynamic_model), OnnxRuntimeConfig(provider="cuda")).open(1)


def key() -> CacheKey:
    return CacheKey(model_sha256="ab" * 32, batch=2, input_hw=None, precision="fp16", device="tensorrt0",
                    runtime="1.22.1")


def test_a_cache_folder_left_open_to_others_is_made_private(tmp_path):
    """Whoever can write the folder chooses the engine the GPU runs."""
    folder = tmp_path / "onnxruntime" / key().folder_name
    folder.mkdir(parents=True)
    folder.chmod(0o777)
    assert cache_folder(str(tmp_path), key()) == str(folder)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


@pytest.mark.skipif(os.getuid() != 0, reason="giving a folder to another user needs root")
def test_a_cache_folder_of_another_user_is_refused(tmp_path):
    folder = tmp_path / "onnxruntime" / key().folder_name
    folder.mkdir(parents=True, mode=0o755)
    os.chown(folder, 65534, 65534)
    with pytest.raises(BackendError, match="belongs to another user .*cache_dir"):
        cache_folder(str(tmp_path), key())


def test_the_gpu_check_goes_on_past_a_provider_that_raises_onnx_runtimes_own_errors(dynamic_model, monkeypatch,
                                                                                   capsys):
    """scripts/gpu-check.sh runs on a lent GPU for minutes at most: an EPFail or RuntimeError on one
    provider must leave a FAILED line and the other providers' lines, not a traceback."""
    from yoloedge.backends import ort_gpu_check

    listed = [*ort.get_available_providers(), "CUDAExecutionProvider", "TensorrtExecutionProvider"]
    monkeypatch.setattr(ort, "get_available_providers", lambda: listed)
    checked = []

    def check(model, provider, args, cache_dir):
        checked.append(provider)
        if provider == "cuda":
            raise EPFail("[ONNXRuntimeError] : 11 : EP_FAIL : simulated\nsecond line")
        return True, f"{model.name} {provider} OK"

    monkeypatch.setattr(ort_gpu_check, "check", check)
    assert ort_gpu_check.main([str(dynamic_model), "--providers", "cuda,tensorrt"]) == 1
    out = capsys.readouterr().out
    assert checked == ["cuda", "tensorrt"]
    assert "cuda      FAILED   EPFail: [ONNXRuntimeError] : 11 : EP_FAIL : simulated" in out
    assert "second line" not in out and "tensorrt OK" in out


def test_a_device_this_build_cannot_copy_into_fails_the_opening_with_its_remedy(dynamic_model, monkeypatch):
    """Some onnxruntime builds allocate an OrtValue on the GPU but refuse update_inplace on it
    ("Unsupported GPU device: Cannot find the supported GPU device.", MIGraphX-only builds of
    some releases): that must stop open() with the remedy, not fail every batch later."""
    def refuse(self, data):
        raise RuntimeError("Unsupported GPU device: Cannot find the supported GPU device.")

    monkeypatch.setattr(ort.OrtValue, "update_inplace", refuse)
    backend = OnnxRuntimeBackend(str(dynamic_model), OnnxRuntimeConfig(), device_type="cpu")
    with pytest.raises(BackendError, match="update_inplace on 'cpu' 0 failed: Unsupported GPU.*io_binding: false"):
        backend.open(2)
