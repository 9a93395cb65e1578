"""GPU JPEG decode (`jpeg_decoder`) for image folders and HTTP MJPEG cameras.

The GPU decoders run as strict fakes (tests/fakes/jpeg: `nvjpeg`, `nvidia.nvimgcodec`) that decode
with OpenCV, so pixels must match cv2.imdecode exactly: what is tested is our plumbing -- colour
order, device-to-host copy, header checks, fallbacks, the choice and its report -- over a real
folder of the shared photos and a real MJPEG HTTP server. The fakes are put on sys.path only for
the test that asks for them, and removed after. Tests marked `gpu` run the real libraries where
they are installed.
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
import shutil
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import cv2
import numpy as np
import pytest

from servers.mjpeg_server import MjpegServer, encode_video
from yoloedge.config.errors import ConfigError
from yoloedge.config.loader import load_config
from yoloedge.config.schema import CameraConfig
from yoloedge.sources import CameraReader, CameraState
from yoloedge.config.sources import MODULES, JpegDecoderKind
from yoloedge.sources import jpeg
from yoloedge.sources.base import SourceError, UnsupportedSourceError
from yoloedge.sources.folder import ImageFolderSource
from yoloedge.sources.opening import open_source
from yoloedge.sources.imagesize import ImageLimits
from yoloedge.sources.mjpeg import MjpegSource

FAKES = Path(__file__).resolve().parent / "fakes" / "jpeg"
PHOTOS = ("bus.jpg", "zidane.jpg")
MJPEG_VIDEO = "indoor_people_480p_mpeg4.avi"
GPU_KINDS = ("nvimgcodec", "nvjpeg")
_FAKE_MODULES = ("nvjpeg", "nvidia.nvimgcodec", "nvidia")

pytestmark = pytest.mark.shared


# -- fakes on sys.path -------------------------------------------------------------------------------
@pytest.fixture
def gpu_fakes(tmp_path, monkeypatch):
    """install(*kinds): make only those fake decoders importable; returns the fake modules by kind."""
    added: list[str] = []

    def install(*kinds: str) -> dict:
        root = tmp_path / "fakes"
        root.mkdir()
        if "nvjpeg" in kinds:
            (root / "nvjpeg.py").symlink_to(FAKES / "nvjpeg.py")
        if "nvimgcodec" in kinds:
            (root / "nvidia").mkdir()
            (root / "nvidia" / "nvimgcodec").symlink_to(FAKES / "nvidia" / "nvimgcodec", target_is_directory=True)
        _forget_fakes()
        monkeypatch.syspath_prepend(str(root))
        added.append(str(root))
        modules = {kind: importlib.import_module(MODULES[JpegDecoderKind(kind)]) for kind in kinds}
        for module in modules.values():
            module.reset()
        return modules

    yield install
    _forget_fakes()


def _forget_fakes() -> None:
    for name in _FAKE_MODULES:
        sys.modules.pop(name, None)
    importlib.invalidate_caches()


@pytest.fixture
def photo_folder(media, tmp_path) -> Path:
    folder = tmp_path / "photos"
    folder.mkdir()
    for name in PHOTOS:
        shutil.copy(media / name, folder / name)
    return folder


def cv2_reference(path: Path) -> np.ndarray:
    return cv2.imdecode(np.fromfile(str(path), np.uint8), cv2.IMREAD_COLOR)


def read_all(source) -> list[np.ndarray]:
    images = []
    while (image := source.read()) is not None:
        images.append(image)
    return images


# -- image folders -----------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["nvimgcodec", "nvjpeg", "cpu"])
def test_folder_decoded_by_each_decoder_equals_opencv(kind, gpu_fakes, photo_folder):
    fakes = gpu_fakes(*GPU_KINDS)
    png = photo_folder / "zz.png"  # not a JPEG: stays on OpenCV whatever the decoder
    cv2.imwrite(str(png), cv2_reference(photo_folder / "bus.jpg")[:200, :300])
    source = open_source(str(photo_folder), jpeg_decoder=kind)
    images = read_all(source)
    assert source.eof and source.skipped == 0
    assert source.jpeg_decoder == kind
    expected = [cv2_reference(photo_folder / name) for name in PHOTOS] + [cv2_reference(png)]
    assert len(images) == len(expected)
    for image, reference in zip(images, expected):
        assert image.dtype == np.uint8 and image.flags.c_contiguous
        assert np.array_equal(image, reference)
    decoded_on_gpu = {"nvimgcodec": fakes["nvimgcodec"].calls["decode"], "nvjpeg": fakes["nvjpeg"].calls["decode"]}
    assert decoded_on_gpu == {k: (len(PHOTOS) if k == kind else 0) for k in GPU_KINDS}


def test_a_wrong_colour_order_would_fail_the_comparison(gpu_fakes, media):
    """The pixel comparison above can fail: nvImageCodec's own output (RGB) is not OpenCV's BGR."""
    fakes = gpu_fakes("nvimgcodec")
    data = (media / "bus.jpg").read_bytes()
    rgb = np.asarray(fakes["nvimgcodec"].Decoder().decode(data).cpu())
    reference = cv2_reference(media / "bus.jpg")
    assert rgb.shape == reference.shape
    assert not np.array_equal(rgb, reference)
    assert np.array_equal(rgb[:, :, ::-1], reference)


def test_device_images_are_copied_to_the_host_and_freed(gpu_fakes, media):
    """The decoder reads the device image only through .cpu(): the fake refuses numpy on device
    memory (the real one would hand numpy a device pointer). Nothing stays allocated."""
    fakes = gpu_fakes("nvimgcodec")
    device = fakes["nvimgcodec"].device
    decoder = jpeg.choose("nvimgcodec")
    image = fakes["nvimgcodec"].Decoder().decode((media / "zidane.jpg").read_bytes())
    with pytest.raises(RuntimeError, match="device pointer"):
        np.asarray(image)
    del image
    before = device.total_allocations
    for _ in range(3):
        jpeg.decode((media / "zidane.jpg").read_bytes(), "zidane", decoder)
    gc.collect()
    assert device.total_allocations == before + 3 and device.live == 0


def test_corrupt_jpeg_in_a_folder_is_skipped_and_counted(gpu_fakes, photo_folder, media, caplog):
    fakes = gpu_fakes("nvjpeg")
    (photo_folder / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0" + bytes(range(256)) * 8)
    source = open_source(str(photo_folder), jpeg_decoder="nvjpeg")
    images = read_all(source)
    assert len(images) == len(PHOTOS) and source.skipped == 1 and source.eof and source.error is None
    assert fakes["nvjpeg"].calls["decode"] == 3  # the corrupt one went to the GPU, then to OpenCV
    assert "broken.jpg: cannot decode image" in caplog.text


def test_reader_keeps_a_folder_camera_running_past_a_corrupt_jpeg(gpu_fakes, photo_folder):
    gpu_fakes("nvimgcodec")
    (photo_folder / "broken.jpg").write_bytes(b"\xff\xd8\xff\xdb" + b"\x00" * 4000)
    reader, frames = run_reader(CameraConfig(name="photos", url=str(photo_folder), realtime=False,
                                             jpeg_decoder="nvimgcodec"))
    assert reader.state is CameraState.ENDED
    stats = reader.stats()
    assert len(frames) == len(PHOTOS) and stats["images_skipped"] == 1 and stats["jpeg_decoder"] == "nvimgcodec"


def test_pixel_bound_is_checked_on_the_header_before_the_gpu_decodes(gpu_fakes, photo_folder):
    fakes = gpu_fakes("nvimgcodec")
    bus = 810 * 1080  # zidane.jpg is 1280x720: more pixels
    source = ImageFolderSource(str(photo_folder), False, limits=ImageLimits(max_pixels=bus),
                               decoder=jpeg.choose("nvimgcodec"))
    images = read_all(source)
    assert [i.shape[:2] for i in images] == [(1080, 810)] and source.skipped == 1
    assert fakes["nvimgcodec"].calls["decode"] == 1


def test_exif_orientation_is_applied_by_every_decoder(gpu_fakes, media):
    fakes = gpu_fakes(*GPU_KINDS)
    data = with_exif_orientation((media / "zidane.jpg").read_bytes(), 6)  # turned 90 degrees clockwise
    reference = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    assert reference.shape[:2] == (1280, 720)
    for kind in ("nvimgcodec", "nvjpeg", "cpu"):
        assert np.array_equal(jpeg.decode(data, "x", jpeg.choose(kind)), reference), kind
    assert fakes["nvimgcodec"].calls["decode"] == 1  # nvImageCodec applies EXIF itself
    assert fakes["nvjpeg"].calls["decode"] == 0  # pynvjpeg cannot: OpenCV decodes those


def test_exif_orientation_behind_fill_bytes_is_read():
    """Any marker may be preceded by 0xFF fill bytes (JPEG, B.1.1.2); OpenCV reads past them."""
    data = bytearray(with_exif_orientation(b"\xff\xd8\xff\xdb\x00\x02", 6))
    assert jpeg.exif_orientation(bytes(data)) == 6
    padded = data[:2] + b"\xff\xff\xff" + data[2:]
    assert jpeg.exif_orientation(bytes(padded)) == 6


def with_exif_orientation(data: bytes, orientation: int) -> bytes:
    """`data` with an APP1 Exif segment holding only an orientation tag (big-endian TIFF)."""
    ifd = (b"MM\x00\x2a" + (8).to_bytes(4, "big") + (1).to_bytes(2, "big")
           + (0x0112).to_bytes(2, "big") + (3).to_bytes(2, "big") + (1).to_bytes(4, "big")
           + orientation.to_bytes(2, "big") + b"\x00\x00" + (0).to_bytes(4, "big"))
    body = b"Exif\x00\x00" + ifd
    return data[:2] + b"\xff\xe1" + (len(body) + 2).to_bytes(2, "big") + body + data[2:]


# -- the choice ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("importable, chosen", [(("nvimgcodec", "nvjpeg"), "nvimgcodec"), (("nvjpeg",), "nvjpeg"),
                                                ((), "cpu")])
def test_auto_picks_the_best_installed_decoder_and_status_says_which(importable, chosen, gpu_fakes, photo_folder):
    gpu_fakes(*importable)
    reader, frames = run_reader(CameraConfig(name="photos", url=str(photo_folder), realtime=False))
    assert reader.state is CameraState.ENDED and len(frames) == len(PHOTOS)
    assert reader.stats()["jpeg_decoder"] == chosen


def test_auto_skips_a_decoder_that_does_not_start(gpu_fakes, monkeypatch, caplog):
    fakes = gpu_fakes(*GPU_KINDS)

    def no_gpu(*args, **kwargs):
        raise RuntimeError("CUDA driver version is insufficient for CUDA runtime version")

    monkeypatch.setattr(fakes["nvimgcodec"], "Decoder", no_gpu)
    assert jpeg.choose("auto").kind is JpegDecoderKind.NVJPEG
    assert "nvimgcodec did not start: RuntimeError: CUDA driver version" in caplog.text
    with pytest.raises(jpeg.JpegDecoderUnavailable, match="nvimgcodec did not start"):
        jpeg.choose("nvimgcodec")


@pytest.mark.parametrize("kind, package", [("nvimgcodec", "nvidia-nvimgcodec-cu12"), ("nvjpeg", "pynvjpeg")])
def test_an_explicit_decoder_that_is_not_installed_is_a_config_error(kind, package, gpu_fakes, tmp_path):
    gpu_fakes()  # neither importable
    model = tmp_path / "m.onnx"
    model.write_bytes(b"never opened")
    path = tmp_path / "yoloedge.yaml"
    path.write_text(f"device_id: e\nmodel: {{path: {model}}}\ncameras:\n  - name: a\n    url: {tmp_path}\n"
                    f"    jpeg_decoder: {kind}\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(path), {})
    text = str(info.value)
    assert f"{path}:6: cameras[0].jpeg_decoder" in text and f"pip install {package}" in text
    with pytest.raises(UnsupportedSourceError, match=f"pip install {package}"):
        open_source(str(tmp_path), jpeg_decoder=kind)


def test_an_unknown_decoder_name_is_a_config_error(tmp_path):
    path = tmp_path / "yoloedge.yaml"
    path.write_text(f"device_id: e\nmodel: {{path: {tmp_path / 'm.onnx'}}}\ncameras:\n  - name: a\n"
                    f"    url: {tmp_path}\n    jpeg_decoder: nvjpg\n")
    with pytest.raises(ConfigError, match="must be one of: auto, nvimgcodec, nvjpeg, cpu"):
        load_config(str(path), {})


# -- MJPEG over HTTP -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mjpeg_frames(shared) -> list[bytes]:
    return encode_video(shared / "media" / MJPEG_VIDEO, 8)


@pytest.fixture
def mjpeg(mjpeg_frames):
    server = MjpegServer(mjpeg_frames, fps=60).start()
    yield server
    server.stop()


def read_frames(source, count: int) -> list[np.ndarray]:
    frames = []
    try:
        for _ in range(count):
            image = source.read()
            assert image is not None, source.error
            frames.append(image.copy())
    finally:
        source.release()
    return frames


@pytest.mark.parametrize("kind", GPU_KINDS)
def test_mjpeg_camera_on_a_gpu_decoder_gives_the_frames_the_cpu_path_gives(kind, gpu_fakes, mjpeg, mjpeg_frames):
    fakes = gpu_fakes(*GPU_KINDS)
    source = open_source(mjpeg.url, jpeg_decoder=kind, open_timeout_s=5, read_timeout_s=5)
    assert isinstance(source, MjpegSource) and source.jpeg_decoder == kind
    gpu = read_frames(source, len(mjpeg_frames))
    assert fakes[kind].calls["decode"] == len(mjpeg_frames)
    cpu_source = open_source(mjpeg.url, jpeg_decoder="cpu", open_timeout_s=5, read_timeout_s=5)
    assert not isinstance(cpu_source, MjpegSource) and cpu_source.jpeg_decoder == "cpu"
    cpu = read_frames(cpu_source, len(mjpeg_frames))
    for index, (ours, ffmpeg, jpg) in enumerate(zip(gpu, cpu, mjpeg_frames)):
        assert np.array_equal(ours, cv2.imdecode(np.frombuffer(jpg, np.uint8), cv2.IMREAD_COLOR)), index
        # FFmpeg's JPEG decoder rounds differently from libjpeg: the same frame, within a level or two
        assert ours.shape == ffmpeg.shape and np.abs(ours.astype(np.int16) - ffmpeg).mean() < 2.0, index


def test_mjpeg_corrupt_frame_is_skipped_and_counted(gpu_fakes, mjpeg_frames):
    gpu_fakes("nvjpeg")
    frames = [mjpeg_frames[0], b"\xff\xd8\xff\xe0" + b"\x13" * 3000, mjpeg_frames[1]]
    with MjpegServer(frames, fps=60) as server:
        source = open_source(server.url, jpeg_decoder="nvjpeg", open_timeout_s=5, read_timeout_s=5)
        images = read_frames(source, 4)
    expected = [cv2.imdecode(np.frombuffer(frames[i], np.uint8), cv2.IMREAD_COLOR) for i in (0, 2, 0, 2)]
    assert all(np.array_equal(a, b) for a, b in zip(images, expected))
    assert source.skipped == 2


def test_reader_streams_an_mjpeg_camera_through_the_gpu_decoder(gpu_fakes, mjpeg):
    gpu_fakes(*GPU_KINDS)
    config = CameraConfig(name="lobby", url=mjpeg.url, open_timeout_s=5, read_timeout_s=5)
    reader, frames = run_reader(config, until=lambda seen: len(seen) >= 5)
    assert len(frames) >= 5 and reader.stats()["jpeg_decoder"] == "nvimgcodec"


class _Handler(BaseHTTPRequestHandler):
    """A tiny camera: /auth needs Basic user:p@ss, /page is HTML; both send one MJPEG frame."""

    frame = b""
    seen_auth: list[str | None] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        if self.path == "/page":
            self._reply(200, "text/html", b"<html>not a camera</html>")
            return
        self.seen_auth.append(self.headers.get("Authorization"))
        if self.headers.get("Authorization") != "Basic dXNlcjpwQHNz":  # user:p@ss
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="cam"')
            self.end_headers()
            return
        body = (b"--x\r\nContent-Type: image/jpeg\r\n\r\n" + self.frame + b"\r\n--x--\r\n")  # no Content-Length
        self._reply(200, "multipart/x-mixed-replace;boundary=x", body)

    def _reply(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@pytest.fixture
def tiny_camera(mjpeg_frames):
    _Handler.frame = mjpeg_frames[3]
    _Handler.seen_auth = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_mjpeg_credentials_from_the_url_go_as_basic_auth_and_never_into_errors(gpu_fakes, tiny_camera,
                                                                             mjpeg_frames):
    gpu_fakes("nvjpeg")
    source = open_source(f"http://user:p%40ss@{tiny_camera}/auth", jpeg_decoder="nvjpeg")
    image = source.read()
    assert np.array_equal(image, cv2.imdecode(np.frombuffer(mjpeg_frames[3], np.uint8), cv2.IMREAD_COLOR))
    assert source.read() is None and "closed the stream" in (source.error or "")
    source.release()
    with pytest.raises(SourceError) as info:
        open_source(f"http://user:wrong-secret@{tiny_camera}/auth", jpeg_decoder="nvjpeg")
    assert "HTTP 401" in str(info.value) and "wrong-secret" not in str(info.value)
    assert _Handler.seen_auth[0] == "Basic dXNlcjpwQHNz"


def test_a_non_mjpeg_url_is_refused_explicitly_and_left_to_ffmpeg_under_auto(gpu_fakes, tiny_camera):
    gpu_fakes("nvjpeg")
    with pytest.raises(UnsupportedSourceError, match="not an MJPEG stream.*reads MJPEG cameras only"):
        open_source(f"http://{tiny_camera}/page", jpeg_decoder="nvjpeg")
    with pytest.raises(SourceError) as info:  # auto: FFmpeg gets it (and cannot read HTML either)
        open_source(f"http://{tiny_camera}/page", jpeg_decoder="auto", open_timeout_s=3, read_timeout_s=3)
    assert "cannot open stream" in str(info.value)


def test_mjpeg_bounds_an_oversized_part_and_a_silent_camera(gpu_fakes, mjpeg_frames):
    gpu_fakes("nvjpeg")
    with MjpegServer(mjpeg_frames[:1], fps=60) as server:
        huge = open_source(server.url, jpeg_decoder="nvjpeg", image_limits=ImageLimits(max_bytes=1000))
        assert huge.read() is None and "over the bound of 1,000 bytes" in (huge.error or "")
        huge.release()
        source = open_source(server.url, jpeg_decoder="nvjpeg", read_timeout_s=0.5)
        assert source.read() is not None
        server.freeze()
        started = time.monotonic()
        assert source.read() is None
        assert time.monotonic() - started < 3.0 and "read timed out" in (source.error or "")
        source.release()
        server.resume()


# -- helpers ---------------------------------------------------------------------------------------------
def run_reader(config: CameraConfig, until=None, timeout: float = 20.0):
    """Run a CameraReader to its end (or until `until(frames)`); returns it (stopped) and its frames."""
    frames: list = []

    def sink(frame, timeout_s: float) -> bool:
        frames.append(frame)
        return True

    reader = CameraReader(config, sink, stall_timeout_s=5.0)
    reader.start()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if reader.state.terminal or (until is not None and until(frames)):
                break
            time.sleep(0.02)
    finally:
        if until is not None:
            reader.stop()
        reader.join(5)
    return reader, frames


# -- the real libraries -----------------------------------------------------------------------------------
def _real_or_skip(kind: str):
    module = MODULES[JpegDecoderKind(kind)]
    try:
        found = importlib.util.find_spec(module) is not None
    except ImportError:
        found = False
    if not found:
        pytest.skip(f"{module} is not installed (GPU JPEG decode)")
    try:
        return jpeg.start(JpegDecoderKind(kind))
    except jpeg.JpegDecoderUnavailable as exc:
        pytest.skip(f"no usable GPU JPEG decoder: {exc}")


@pytest.mark.gpu
@pytest.mark.parametrize("kind", GPU_KINDS)
def test_real_gpu_decoder_matches_opencv_on_the_shared_photos(kind, media):
    decoder = _real_or_skip(kind)
    for name in PHOTOS:
        data = (media / name).read_bytes()
        reference = cv2_reference(media / name)
        image = jpeg.decode(data, name, decoder)
        assert image.shape == reference.shape and image.dtype == np.uint8
        # other IDCT and chroma upsampling than libjpeg-turbo: close, not identical
        assert np.abs(image.astype(np.int16) - reference).mean() < 3.0, name
        assert not np.abs(image[:, :, ::-1].astype(np.int16) - reference).mean() < 3.0, "colour order"
    assert getattr(decoder, "fallbacks", 0) == 0
