"""A fake nvImageCodec (`from nvidia import nvimgcodec`) for tests: the Python binding's names,
defaults, memory kinds and failure modes, with the GPU replaced by OpenCV and a fake device heap.

Importable only where a test puts tests/fakes/jpeg on sys.path (see ../../nvjpeg.py for why not
tests/fakes). `nvidia` stays a namespace package, as it is in the real wheels.

Real behaviours modelled (nvImageCodec python/decoder.cpp, image.cpp, decode_params.cpp,
code_stream.cpp, decode_source.cpp):
* `Decoder(device_id=-1, max_num_cpu_threads=0, backends=None, options=":fancy_upsampling=0")`;
  `decode(src, params=None, cuda_stream=0)` takes bytes or a uint8 numpy array (converted
  implicitly to a DecodeSource/CodeStream), a CodeStream, or a DecodeSource; a str is a file name
  (that conversion exists too). Data that is not an image format nvImageCodec parses (jpeg,
  jpeg2000, tiff, bmp, png, pnm, webp) cannot become a CodeStream: the CodeStream constructor
  raises RuntimeError("Failed to create code stream"), and pybind11, trying the implicit
  conversion for decode(), clears that error and reports TypeError (incompatible function
  arguments) [UNCONFIRMED on a real installation: our code catches both];
* a parsed stream that fails to decode gives None (the real one logs "Something went wrong
  during decoding image #0 it will not be included in output"; so does this fake, as a warning);
* default DecodeParams: apply_exif_orientation=True, color_spec=ColorSpec.RGB, allow_any_depth
  False -> interleaved uint8 RGB, 3 channels (a grey JPEG too), EXIF orientation applied;
* the decoded Image lives in device memory: `__cuda_array_interface__` is a dict (shape, strides
  None, typestr '|u1', data (device pointer, False), version 3, stream 1) whose pointer lies in a
  live allocation of the fake device heap; `buffer_kind` STRIDED_DEVICE. The real Image also
  answers `__array_interface__` for a device image -- with the device pointer, which numpy would
  read as host memory and crash; this fake raises instead, so such a mistake fails a test;
* `cpu()` copies to a new host Image (pinned memory) whose `__array_interface__` points at host
  memory numpy can read; on a host Image it returns the Image itself; `cuda()` the reverse;
* device memory is freed when its Image is garbage-collected.

`calls` counts decoders created and decode() calls; `device` is the fake device heap (live
allocations, total allocations), so tests can see which decoder did the work and that nothing
leaks.
"""

from __future__ import annotations

import logging
import os
import threading
from enum import Enum

import cv2
import numpy as np

__version__ = "0.0.0-fake"

log = logging.getLogger("nvimgcodec")

NVIMGCODEC_DEVICE_CURRENT = -1
calls = {"decoders": 0, "decode": 0}

_MAGIC = (b"\xff\xd8", b"\x89PNG\r\n\x1a\n", b"BM", b"II*\x00", b"MM\x00*", b"\x00\x00\x00\x0cjP  ",
          b"\xff\x4f\xff\x51", b"P1", b"P2", b"P3", b"P4", b"P5", b"P6")


class ColorSpec(Enum):
    UNCHANGED = 0
    RGB = 1
    GRAY = 2


class ImageBufferKind(Enum):
    STRIDED_DEVICE = 1
    STRIDED_HOST = 2


class _DeviceHeap:
    """Fake device memory: numpy buffers at addresses no host code can use."""

    BASE = 0x7F00_0000_0000

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next = self.BASE
        self.buffers: dict[int, np.ndarray] = {}
        self.total_allocations = 0

    def malloc(self, size: int) -> int:
        with self._lock:
            ptr = self._next
            self._next += (size + 0xFFFF) & ~0xFFFF  # 64 KiB apart, like a real allocator's granules
            self.buffers[ptr] = np.empty(size, np.uint8)
            self.total_allocations += 1
            return ptr

    def free(self, ptr: int) -> None:
        with self._lock:
            if self.buffers.pop(ptr, None) is None:
                raise RuntimeError(f"CUDA Runtime failure: '#1' (cudaFree of unknown pointer {ptr:#x})")

    def view(self, ptr: int, size: int) -> np.ndarray:
        with self._lock:
            buffer = self.buffers.get(ptr)
        if buffer is None or buffer.size < size:
            raise RuntimeError(f"CUDA Runtime failure: '#1' (pointer {ptr:#x} is not a live device allocation)")
        return buffer[:size]

    @property
    def live(self) -> int:
        return len(self.buffers)


device = _DeviceHeap()


def reset() -> None:
    calls.update(decoders=0, decode=0)


class DecodeParams:
    def __init__(self, apply_exif_orientation: bool = True, color_spec: ColorSpec = ColorSpec.RGB,
                 allow_any_depth: bool = False):
        self.apply_exif_orientation = apply_exif_orientation
        self.color_spec = color_spec
        self.allow_any_depth = allow_any_depth


class CodeStream:
    def __init__(self, src):
        if isinstance(src, (str, os.PathLike)):
            try:
                with open(src, "rb") as handle:
                    src = handle.read()
            except OSError:
                raise RuntimeError("Failed to create code stream") from None
        if isinstance(src, np.ndarray):
            if src.dtype != np.uint8 or src.ndim != 1:
                raise TypeError("__init__(): incompatible constructor arguments")
            src = src.tobytes()
        if not isinstance(src, bytes):
            raise TypeError("__init__(): incompatible constructor arguments")
        if not src.startswith(_MAGIC) and not (src[:4] == b"RIFF" and src[8:12] == b"WEBP"):
            raise RuntimeError("Failed to create code stream")
        self._data = src


class DecodeSource:
    def __init__(self, code_stream, region=None):
        self.code_stream = code_stream if isinstance(code_stream, CodeStream) else CodeStream(code_stream)
        self.region = region


class Image:
    """Pixels in fake device memory (`_ptr` in `device`) or in host memory (`_host`)."""

    def __init__(self, shape: tuple[int, int, int], *, host: np.ndarray | None = None, stream: int = 0):
        self._shape = shape
        self._size = shape[0] * shape[1] * shape[2]
        self._stream = stream
        self._host = host
        self._ptr: int | None = None if host is not None else device.malloc(self._size)

    def __del__(self) -> None:
        ptr, self._ptr = getattr(self, "_ptr", None), None
        if ptr is not None:
            device.free(ptr)

    @property
    def buffer_kind(self) -> ImageBufferKind:
        return ImageBufferKind.STRIDED_HOST if self._host is not None else ImageBufferKind.STRIDED_DEVICE

    @property
    def shape(self) -> tuple[int, int, int]:
        return self._shape

    @property
    def height(self) -> int:
        return self._shape[0]

    @property
    def width(self) -> int:
        return self._shape[1]

    @property
    def ndim(self) -> int:
        return 3

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.uint8)

    @property
    def strides(self) -> tuple[int, int, int]:
        return (self._shape[1] * self._shape[2], self._shape[2], 1)

    def _interface(self, pointer: int) -> dict:
        return {"shape": self._shape, "strides": None, "typestr": "|u1", "data": (pointer, False), "version": 3}

    @property
    def __cuda_array_interface__(self) -> dict:
        if self._ptr is None:
            raise RuntimeError("fake nvimgcodec: this Image is in host memory; use __array_interface__")
        return {**self._interface(self._ptr), "stream": self._stream or 1}

    @property
    def __array_interface__(self) -> dict:
        if self._host is None:
            # The real one hands numpy the device pointer here, and numpy crashes reading it.
            raise RuntimeError("fake nvimgcodec: __array_interface__ of an Image in device memory would give "
                               "numpy a device pointer; call .cpu() first")
        return self._interface(self._host.__array_interface__["data"][0])

    def _device_pixels(self) -> np.ndarray:
        assert self._ptr is not None
        return device.view(self._ptr, self._size).reshape(self._shape)

    def cpu(self) -> "Image":
        if self._host is not None:
            return self
        return Image(self._shape, host=self._device_pixels().copy())

    def cuda(self, synchronize: bool = True) -> "Image":
        if self._host is None:
            return self
        image = Image(self._shape, stream=self._stream)
        image._device_pixels()[...] = self._host
        return image


class Decoder:
    def __init__(self, device_id: int = NVIMGCODEC_DEVICE_CURRENT, max_num_cpu_threads: int = 0,
                 backends=None, options: str = ":fancy_upsampling=0"):
        calls["decoders"] += 1
        self.device_id = device_id
        self.options = options

    def decode(self, src, params: DecodeParams | None = None, cuda_stream: int = 0):
        if isinstance(src, list):
            return [image for image in (self._one(s, params, cuda_stream) for s in src) if image is not None]
        return self._one(src, params, cuda_stream)

    def read(self, path, params: DecodeParams | None = None, cuda_stream: int = 0):
        return self.decode(path, params, cuda_stream)

    def _one(self, src, params: DecodeParams | None, cuda_stream: int):
        calls["decode"] += 1
        if not isinstance(src, DecodeSource):
            try:
                src = DecodeSource(src)
            except (RuntimeError, TypeError):
                # pybind11: a failed implicit conversion is no match for any overload
                raise TypeError("decode(): incompatible function arguments. The following argument types are "
                                "supported:\n    1. (self: nvidia.nvimgcodec.Decoder, src: "
                                "nvidia.nvimgcodec.DecodeSource, params: Optional[nvidia.nvimgcodec.DecodeParams] "
                                "= None, cuda_stream: int = 0) -> object") from None
        params = params or DecodeParams()
        flags = cv2.IMREAD_COLOR if params.apply_exif_orientation else cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION
        bgr = cv2.imdecode(np.frombuffer(src.code_stream._data, np.uint8), flags)
        if bgr is None:
            log.warning("Something went wrong during decoding image #0 it will not be included in output")
            return None
        if params.color_spec is ColorSpec.GRAY:
            pixels = cv2.cvtColor(bgr, cv2.COLOR_BGR2GRAY)[:, :, None]
        else:
            pixels = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
        image = Image(pixels.shape, stream=cuda_stream)
        image._device_pixels()[...] = pixels
        return image
