"""The Ascend backend on a real NPU with CANN's pyACL. Skipped everywhere else.

Runs where `import acl` works in a clean interpreter (CANN's set_env.sh sourced, tests/fakes NOT on
the path) and the runtime reports at least one device. Each check runs in its own subprocess:
pyACL allows one acl.init per process, and test_ascend.py puts the fake `acl` on sys.path of this one.

What it needs besides the NPU:
* YOLOEDGE_ASCEND_OM: an .om converted from one of the shared models, e.g.
  `yoloedge convert atc ../shared/testdata/models/yolov8n_coco_int8.onnx --batch 1,2,4`;
* YOLOEDGE_ASCEND_ONNX (optional): the ONNX it came from; when set, detections on the shared
  images must agree with the ONNX Runtime backend's under the parity rule;
* YOLOEDGE_ASCEND_DEVICE (optional, default 0).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.ascend

REPO = Path(__file__).resolve().parent.parent
FAKES = str(REPO / "tests" / "fakes")


def clean_env() -> dict[str, str]:
    """The environment without the fake pyACL: tests/fakes is dropped from PYTHONPATH."""
    env = dict(os.environ)
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.abspath(p) != FAKES]
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "tests"), *parts])
    return env


def run_python(code: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, env=clean_env(),
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def npu() -> int:
    probe = run_python("""
        import acl, json
        init = acl.init()
        count, ret = acl.rt.get_device_count() if init == 0 else (0, init)
        print(json.dumps({"file": getattr(acl, "__file__", "") or "", "count": count if ret == 0 else 0, "ret": ret}))
        if init == 0:
            acl.finalize()
    """, timeout=120)
    if probe.returncode != 0:
        pytest.skip("no real pyACL here (source /usr/local/Ascend/ascend-toolkit/set_env.sh on an Atlas machine)")
    info = json.loads(probe.stdout.strip().splitlines()[-1])
    if info["file"].startswith(FAKES):
        pytest.skip("only the fake pyACL is importable")
    if info["count"] < 1:
        pytest.skip(f"pyACL found no NPU (acl.init / get_device_count returned {info['ret']})")
    return int(os.environ.get("YOLOEDGE_ASCEND_DEVICE", "0"))


@pytest.fixture(scope="module")
def om_path(npu) -> str:
    path = os.environ.get("YOLOEDGE_ASCEND_OM")
    if not path or not os.path.isfile(path):
        pytest.skip("set YOLOEDGE_ASCEND_OM to an .om converted from a shared model")
    return path


def test_open_run_close_on_the_npu(npu, om_path):
    result = run_python(f"""
        import json
        import numpy as np
        from yoloedge.backends import acl_runtime
        from yoloedge.backends.ascend import AscendBackend
        from yoloedge.config.ascend import AscendConfig

        out = {{}}
        for execute in ("sync", "async"):
            backend = AscendBackend({om_path!r}, AscendConfig(device_id={npu}, execute=execute))
            spec = backend.open(8)
            buf = backend.input_buffer
            buf[...] = 0
            views = None
            for n in backend.batch_sizes + (backend.max_batch,):
                n = min(n, backend.max_batch)
                outs = backend.run(n)
                assert all(o.shape[0] == n for o in outs)
                views = views or [o.ctypes.data for o in outs]
                assert [o.ctypes.data for o in outs] == views, "outputs are views of the same buffers"
            out[execute] = {{"gears": list(backend.batch_sizes), "max": backend.max_batch,
                            "aipp": backend.aipp, "telemetry": backend.telemetry(),
                            "description": backend.description}}
            if execute == "sync":
                keep = backend  # the second backend opens while this one holds pyACL
            else:
                backend.close()
        keep.close()
        assert not acl_runtime.PROCESS.initialised, "pyACL finalised after the last close"
        print(json.dumps(out))
    """)
    assert result.returncode == 0, result.stdout + result.stderr
    print(result.stdout)


def test_detections_agree_with_onnxruntime(npu, om_path):
    source = os.environ.get("YOLOEDGE_ASCEND_ONNX")
    media = REPO.parent / "shared" / "testdata" / "media"
    if not source or not media.is_dir():
        pytest.skip("set YOLOEDGE_ASCEND_ONNX to the ONNX the .om came from (and keep ../shared/testdata)")
    aipp = os.environ.get("YOLOEDGE_ASCEND_AIPP", "") == "1"
    result = run_python(f"""
        import cv2
        from parity import mismatches
        from yoloedge.backends.ascend import AscendBackend
        from yoloedge.backends.onnxruntime import OnnxRuntimeBackend
        from yoloedge.config import ModelConfig
        from yoloedge.config.ascend import AscendConfig
        from yoloedge.pipeline.detector import Detector

        npu = Detector(ModelConfig(path={om_path!r}, input={"aipp" if aipp else "host"!r}),
                       AscendBackend({om_path!r}, AscendConfig(device_id={npu})))
        cpu = Detector(ModelConfig(path={source!r}), OnnxRuntimeBackend({source!r}))
        problems = []
        for name in ("bus.jpg", "zidane.jpg"):
            image = cv2.imread({str(media)!r} + "/" + name)
            ours = npu.detect([image])[0].to_dicts(npu.labels)
            theirs = cpu.detect([image])[0].to_dicts(cpu.labels)
            problems += [name + ": " + p for p in mismatches(ours, theirs)]
        npu.close()
        print("\\n".join(problems))
        raise SystemExit(1 if problems else 0)
    """)
    assert result.returncode == 0, result.stdout + result.stderr
