"""scripts/gpu-check.sh, run here on the test fakes: the script a GPU machine runs must itself work.

On a GPU machine the same script runs the real libraries (see docs/hardware/tested-on.md); here
`--fakes` puts the fake TensorRT, cuda-python and JPEG codecs in their place, so every part runs
and must come out OK: the TensorRT backend against ONNX Runtime with no allocation after warm-up
and nothing left at close, and both GPU JPEG decoders against cv2.
"""

from __future__ import annotations

import subprocess

import pytest

from daemon_harness import REPO

pytestmark = pytest.mark.shared


def test_the_gpu_check_passes_on_the_fakes(shared):
    result = subprocess.run([str(REPO / "scripts" / "gpu-check.sh"), "--fakes", "--shared", str(shared.parent)],
                            cwd=REPO, capture_output=True, text=True, timeout=600, env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {line.split("  ")[0].strip(): line for line in result.stdout.splitlines()[2:] if "  " in line}
    for check in ("tensorrt fp32 (fake engine, fake memory)", "tensorrt fp16 (fake engine, fake memory)",
                  "jpeg nvimgcodec", "jpeg nvjpeg"):
        assert check in rows, result.stdout
        assert "  OK  " in rows[check], rows[check]
    assert "allocations after warm-up 0, left at close 0" in rows["tensorrt fp32 (fake engine, fake memory)"]
    assert "4 checks: 4 OK, 0 failed, 0 skipped" in result.stdout


def test_the_gpu_check_refuses_to_run_without_the_shared_data(tmp_path):
    result = subprocess.run([str(REPO / "scripts" / "gpu-check.sh"), "--fakes", "--shared", str(tmp_path)],
                            cwd=REPO, capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 2 and "no shared test data" in result.stderr
