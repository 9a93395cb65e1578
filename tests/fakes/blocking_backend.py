"""A test backend: the real ONNX Runtime backend, plus faults switched on from outside.

Used by daemon tests through the custom-backend form `backend: blocking_backend:BlockingBackend`
(tests/fakes on PYTHONPATH). Options (the accelerator's `options:` mapping):
* `hang_file`: while this file exists, `run()` blocks (a hung inference);
* `fail_file`: while this file exists, `run()` raises (a failing device);
* `faulty_devices`: the device ids the two files act on (default: every device).
Each device gets a fresh instance whenever its worker opens it, as with a real backend.
"""

from __future__ import annotations

import os
import time

from yoloedge.backends.onnxruntime import OnnxRuntimeBackend
from yoloedge.config import OnnxRuntimeConfig
from yoloedge.errors import BackendError


class BlockingBackend(OnnxRuntimeBackend):
    name = "blocking"

    def __init__(self, model_path: str, options: dict):
        super().__init__(model_path, OnnxRuntimeConfig())
        faulty = options.get("faulty_devices")
        affected = faulty is None or options.get("device_id") in faulty
        self.hang_file = options.get("hang_file") if affected else None
        self.fail_file = options.get("fail_file") if affected else None

    def run(self, n: int, input_set: int = 0, output_set: int = 0):
        while self.hang_file and os.path.exists(self.hang_file):
            time.sleep(0.05)
        if self.fail_file and os.path.exists(self.fail_file):
            raise BackendError("injected device failure")
        return super().run(n, input_set, output_set)
