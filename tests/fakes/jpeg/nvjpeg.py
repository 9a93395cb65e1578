"""A fake pynvjpeg (`import nvjpeg`) for tests: the binding's API to the letter, with nvJPEG replaced
by OpenCV on the CPU.

Importable as `nvjpeg` only where a test puts tests/fakes/jpeg on sys.path (not tests/fakes: the
daemon harness puts that on every daemon's PYTHONPATH, and a fake GPU decoder there would change
how every MJPEG and folder camera is read).

Real behaviours modelled (API fact sheet section 4, pynvjpeg 0.0.13):
* `NvJpeg()` takes no arguments;
* `decode(data)`: the argument is parsed with "y*" -- any bytes-like object (bytes, bytearray,
  memoryview, a contiguous numpy array), a str is a TypeError; returns a new uint8 H x W x 3 BGR
  array that owns its memory (NVJPEG_OUTPUT_BGRI: a grey JPEG gives 3 channels too); it does not
  read EXIF, so the orientation tag is ignored; data nvJPEG cannot decode raises
  ValueError("NvJpeg Decoder Error, Code: N") (3: NVJPEG_STATUS_BAD_JPEG);
* `read(path)` (IOError when the file cannot be opened), `encode(bgr, quality=70)` (H x W x 3 only,
  quality clamped to 100), `write(path, image[, quality])` -> bytes written.

`calls` counts decode() calls and NvJpeg instances, so tests can see which decoder did the work.
"""

from __future__ import annotations

import cv2
import numpy as np

NVJPEG_STATUS_BAD_JPEG = 3
calls = {"decode": 0, "instances": 0}


def reset() -> None:
    calls.update(decode=0, instances=0)


class NvJpeg:
    def __init__(self) -> None:
        calls["instances"] += 1

    def decode(self, data) -> np.ndarray:
        if isinstance(data, str):
            raise TypeError("a bytes-like object is required, not 'str'")
        buffer = memoryview(data).cast("B")  # "y*": the buffer protocol, contiguous
        calls["decode"] += 1
        raw = np.frombuffer(buffer, np.uint8)
        image = None
        if raw[:2].tobytes() == b"\xff\xd8":  # nvJPEG decodes JPEG only
            image = cv2.imdecode(raw, cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION)
        if image is None:
            raise ValueError(f"NvJpeg Decoder Error, Code: {NVJPEG_STATUS_BAD_JPEG}")
        return np.ascontiguousarray(image)

    def read(self, path: str) -> np.ndarray:
        try:
            with open(path, "rb") as handle:
                data = handle.read()
        except OSError as exc:
            raise IOError(f"Cannot open file: {path}") from exc
        return self.decode(data)

    def encode(self, image: np.ndarray, quality: int = 70) -> bytes:
        if not isinstance(image, np.ndarray) or image.ndim != 3 or image.shape[2] != 3:
            raise ValueError("NvJpeg Encoder Error: image must be HxWx3")
        ok, jpg = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, min(int(quality), 100)])
        if not ok:
            raise ValueError("NvJpeg Encoder Error")
        return jpg.tobytes()

    def write(self, path: str, image: np.ndarray, quality: int = 70) -> int:
        data = self.encode(image, quality)
        with open(path, "wb") as handle:
            return handle.write(data)
