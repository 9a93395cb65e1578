"""Hostile media: decompression bombs, files that are not files, and cameras whose frames are too big.

The bombs are real files, written here byte by byte: a PNG whose IHDR declares 60000x60000 over a
few kilobytes of zlib, a JPEG whose SOF0 says 65000x65000. Each must be refused from its header,
before OpenCV allocates anything, and must cost one skipped image, never the camera or the process.
"""

from __future__ import annotations

import logging
import os
import resource
import struct
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import cv2
import numpy as np
import pytest

from conftest import REPO
from servers.mjpeg_server import MjpegServer
from yoloedge.config.schema import CameraConfig
from yoloedge.errors import ImageError
from yoloedge.sources import CameraReader, CameraState, Frame
from yoloedge.sources.synthetic import textured_frame
from yoloedge.sources.imagesize import ImageLimits, ImageTooLarge, image_size, read_image

#: what the subprocess that decodes a bomb may map: well under the 2.7 GB a 30000x30000 BGR image needs
ADDRESS_SPACE_LIMIT = 1536 * 2**20


# -- bombs, byte by byte -------------------------------------------------------------------------
def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_bomb(width: int, height: int, rows: int = 40) -> bytes:
    """An 8-bit RGB PNG declaring width x height, with the first `rows` rows of zeros compressed."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    compressor = zlib.compressobj(9)
    row = b"\x00" * (1 + 3 * width)
    body = b"".join(compressor.compress(row) for _ in range(rows)) + compressor.flush()
    return (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", body)
            + _png_chunk(b"IEND", b""))


def jpeg_bomb(width: int, height: int) -> bytes:
    """A baseline grayscale JPEG whose SOF0 says width x height, with a few bytes of scan."""
    dqt = b"\xff\xdb" + struct.pack(">H", 67) + b"\x00" + bytes([1] * 64)
    sof0 = b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, height, width, 1) + b"\x01\x11\x00"
    one_code = bytes([1] + [0] * 15) + b"\x00"
    dht = (b"\xff\xc4" + struct.pack(">H", 20) + b"\x00" + one_code
           + b"\xff\xc4" + struct.pack(">H", 20) + b"\x10" + one_code)
    sos = b"\xff\xda" + struct.pack(">HB", 8, 1) + b"\x01\x00" + b"\x00\x3f\x00"
    app15 = b"\xff\xef" + struct.pack(">H", 12) + b"\xff\xc0" * 5  # a fake SOF inside an APP segment
    return b"\xff\xd8" + app15 + dqt + sof0 + dht + sos + b"\x00" * 64 + b"\xff\xd9"


def webp_bomb(width: int, height: int) -> bytes:
    """An extended WebP (VP8X) declaring a width x height canvas."""
    vp8x = b"\x00\x00\x00\x00" + (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little")
    body = b"WEBP" + b"VP8X" + struct.pack("<I", len(vp8x)) + vp8x
    return b"RIFF" + struct.pack("<I", len(body)) + body


def bmp_bomb(width: int, height: int) -> bytes:
    """A 24-bit BMP header declaring width x height (top-down: negative height), and no pixels."""
    info = struct.pack("<IiiHHIIiiII", 40, width, -height, 1, 24, 0, 0, 2835, 2835, 0, 0)
    return b"BM" + struct.pack("<IHHI", 14 + len(info), 0, 0, 14 + len(info)) + info


def tiff_bomb(width: int, height: int) -> bytes:
    """A little-endian TIFF whose first IFD has ImageWidth and ImageLength (LONG) and no strips."""
    entries = [(256, 4, 1, width), (257, 4, 1, height), (258, 3, 1, 8), (262, 3, 1, 1)]
    ifd = struct.pack("<H", len(entries)) + b"".join(struct.pack("<HHII", *e) for e in entries) + b"\x00" * 4
    return b"II*\x00" + struct.pack("<I", 8) + ifd


BOMBS = {"png": (png_bomb, 60000, 60000), "jpg": (jpeg_bomb, 65000, 65000), "webp": (webp_bomb, 16000, 16000),
         "bmp": (bmp_bomb, 40000, 30000), "tif": (tiff_bomb, 50000, 50000)}


def write_bomb(path: Path, kind: str) -> tuple[int, int]:
    make, width, height = BOMBS[kind]
    path.write_bytes(make(width, height))
    return width, height


def small_image(width: int = 97, height: int = 61) -> np.ndarray:
    return textured_frame(width, height)


# -- headers ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", sorted(BOMBS))
def test_a_bomb_is_refused_from_its_header_with_the_size_it_declares(tmp_path, kind):
    path = tmp_path / f"bomb.{kind}"
    width, height = write_bomb(path, kind)
    assert path.stat().st_size < 20_000  # a small file...
    assert image_size(path.read_bytes()) == (width, height)  # ...declaring a huge image
    with pytest.raises(ImageTooLarge, match=f"{width}x{height} pixels, over the bound"):
        read_image(str(path))


ENCODINGS = [".png", ".jpg", ".bmp", ".webp", ".tif", ".ppm", ".pgm", ".pam", ".pfm", ".hdr", ".ras", ".jp2",
             ".gif", ".avif"]


@pytest.mark.parametrize("ext", ENCODINGS)
def test_the_header_of_every_format_opencv_writes_gives_its_real_size(ext):
    image = small_image()
    if ext in (".pfm", ".hdr"):
        image = image.astype(np.float32) / 255
    if ext == ".pgm":
        image = cv2.cvtColor(image, cv2.COLOR_BGR2GRAY)
    try:
        ok, data = cv2.imencode(ext, image)
    except cv2.error:
        ok = False
    if not ok:
        pytest.skip(f"this OpenCV has no {ext} encoder")
    decoded = cv2.imdecode(data, cv2.IMREAD_UNCHANGED)
    assert image_size(data.tobytes()) == (decoded.shape[1], decoded.shape[0]) == (97, 61)


def test_progressive_and_exif_jpegs_give_their_size():
    image = small_image(320, 200)
    ok, data = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_PROGRESSIVE, 1])
    assert ok and image_size(data.tobytes()) == (320, 200)
    plain = data.tobytes()
    exif = b"\xff\xe1" + struct.pack(">H", 2 + 4000) + b"\xff\xc0" * 2000  # APP1 full of fake SOF markers
    assert image_size(plain[:2] + exif + plain[2:]) == (320, 200)
    assert read_image_bytes(plain[:2] + exif + plain[2:]).shape == (200, 320, 3)


def read_image_bytes(data: bytes) -> np.ndarray:
    image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    assert image is not None
    return image


def test_a_good_image_reads_as_opencv_reads_it(tmp_path):
    path = tmp_path / "good.jpg"
    cv2.imwrite(str(path), small_image(640, 360))
    assert np.array_equal(read_image(str(path)), cv2.imread(str(path)))


def test_the_bounds_can_be_lowered(tmp_path):
    path = tmp_path / "good.png"
    cv2.imwrite(str(path), small_image(100, 50))
    assert read_image(str(path), ImageLimits(max_pixels=5000)).shape == (50, 100, 3)
    with pytest.raises(ImageTooLarge, match="100x50 pixels, over the bound of 4,999 pixels"):
        read_image(str(path), ImageLimits(max_pixels=4999))
    size = path.stat().st_size
    with pytest.raises(ImageTooLarge, match=f"{size:,} bytes, over the bound of {size - 1:,} bytes"):
        read_image(str(path), ImageLimits(max_bytes=size - 1))


# -- what OpenCV alone does with a bomb (the reason for all this) ---------------------------------
def _run_limited(code: str, path: Path) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter that may map ADDRESS_SPACE_LIMIT bytes at most."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_LIMIT, ADDRESS_SPACE_LIMIT))

    env = {k: v for k, v in os.environ.items() if k != "OPENCV_IO_MAX_IMAGE_PIXELS"}
    return subprocess.run([sys.executable, "-c", code, str(path)], cwd=REPO, env=env, preexec_fn=limit,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("kind", ["png", "jpg"])
def test_opencv_alone_tries_to_allocate_a_bomb_and_read_image_does_not(tmp_path, kind):
    """30000x30000 is under OpenCV's own cap (2^30 pixels), so cv2.imread allocates 2.7 GB for it:
    it fails here only because the address space is limited; on an edge box it is the OOM killer."""
    path = tmp_path / f"b.{kind}"
    path.write_bytes(BOMBS[kind][0](30000, 30000))
    plain = _run_limited("import sys, cv2; cv2.imread(sys.argv[1])", path)
    assert plain.returncode != 0 and "Failed to allocate 2700000000 bytes" in plain.stderr, plain.stderr[-500:]
    ours = _run_limited("import sys\nfrom yoloedge.sources.imagesize import ImageTooLarge, read_image\n"
                        "try:\n    read_image(sys.argv[1])\nexcept ImageTooLarge as exc:\n    print(exc)\n", path)
    assert ours.returncode == 0, ours.stderr[-500:]
    assert "30000x30000 pixels, over the bound" in ours.stdout


def test_under_a_yoloedge_command_opencvs_own_cap_is_the_same_bound(tmp_path):
    """The backstop for a format whose header is not read here: OpenCV refuses by itself. It reads
    its cap when it is loaded, so every command sets it first (`cli.main.main`)."""
    path = tmp_path / "b.png"
    path.write_bytes(png_bomb(30000, 30000))
    proc = _run_limited("import os, sys\nfrom yoloedge.cli.main import cap_opencv_decoders\n"
                        "cap_opencv_decoders(os.environ)\nimport cv2\n"
                        "try:\n    cv2.imread(sys.argv[1])\nexcept cv2.error as exc:\n    print(exc)\n", path)
    assert proc.returncode == 0, proc.stderr[-500:]
    assert "CV_IO_MAX_IMAGE_PIXELS" in proc.stdout and "Failed to allocate" not in proc.stdout


# -- files that are not images, or not files ---------------------------------------------------------
def _not_images(folder: Path) -> dict[str, str]:
    """name -> what the refusal must say, for every kind of bad file made in `folder`."""
    good = folder / "_source.jpg"
    cv2.imwrite(str(good), small_image(640, 480))
    data = good.read_bytes()
    good.unlink()
    (folder / "empty.jpg").write_bytes(b"")
    (folder / "truncated_header.jpg").write_bytes(data[:40])
    (folder / "truncated_png.png").write_bytes(png_bomb(64, 64)[:20])
    (folder / "text.jpg").write_text("this is not a JPEG\n" * 20)
    (folder / "dir.jpg").mkdir()
    os.mkfifo(folder / "fifo.jpg")
    os.symlink(folder / "loop_b.jpg", folder / "loop_a.jpg")
    os.symlink(folder / "loop_a.jpg", folder / "loop_b.jpg")
    os.symlink("/dev/zero", folder / "zero.jpg")
    return {"empty.jpg": "empty file", "truncated_header.jpg": "cannot decode",
            "truncated_png.png": "cannot decode", "text.jpg": "cannot decode",
            "dir.jpg": "not a regular file (a directory)", "fifo.jpg": "not a regular file (a FIFO)",
            "loop_a.jpg": "cannot open", "zero.jpg": "not a regular file (a device)",
            "missing.jpg": "not found"}


def test_every_kind_of_bad_file_is_an_image_error_and_nothing_blocks(tmp_path):
    expected = _not_images(tmp_path)
    results: dict[str, str] = {}

    def read_all() -> None:
        for name in expected:
            try:
                read_image(str(tmp_path / name))
                results[name] = "decoded"
            except ImageError as exc:
                results[name] = str(exc)

    worker = threading.Thread(target=read_all, daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), f"blocked after {sorted(results)}"  # a FIFO must not wait for a writer
    for name, why in expected.items():
        assert results[name].startswith(f"{tmp_path / name}: ") and why in results[name], results[name]


def test_a_truncated_scan_decodes_partly_or_is_an_image_error(tmp_path):
    path = tmp_path / "half.jpg"
    cv2.imwrite(str(path), small_image(640, 480))
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    try:
        image = read_image(str(path))
    except ImageError:
        return
    assert image.shape == (480, 640, 3)  # libjpeg pads the missing rows


# -- an image-folder camera --------------------------------------------------------------------------
class Sink:
    """Takes every frame; the reader's sink, as the camera queue is in the daemon."""

    def __init__(self) -> None:
        self.frames: list[Frame] = []

    def __call__(self, frame: Frame, timeout_s: float) -> bool:
        self.frames.append(frame)
        return True


class States:
    def __init__(self) -> None:
        self.events: list[tuple[CameraState, str | None]] = []

    def __call__(self, camera: str, state: CameraState, reason: str | None) -> None:
        self.events.append((state, reason))

    def wait_for(self, state: CameraState, timeout: float) -> str | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for seen, reason in list(self.events):
                if seen is state:
                    return reason or ""
            time.sleep(0.02)
        return None


def camera(url: str | Path, name: str = "cam", **overrides) -> CameraConfig:
    settings = dict(open_timeout_s=2.0, read_timeout_s=1.0, backoff_initial_s=0.2, backoff_max_s=0.5,
                    realtime=False)
    settings.update(overrides)
    return CameraConfig(name=name, url=str(url), **settings)


@pytest.fixture
def readers():
    started: list[CameraReader] = []

    def start(config: CameraConfig, **kwargs) -> tuple[CameraReader, Sink, States]:
        sink, states = Sink(), States()
        reader = CameraReader(config, sink, 2.0, on_state=states, **kwargs)
        started.append(reader)
        reader.start()
        return reader, sink, states

    yield start
    for reader in started:
        reader.stop()
    for reader in started:
        reader.join(5)


def test_a_folder_camera_skips_and_counts_bombs_and_bad_files_and_logs_each_once(tmp_path, readers, caplog):
    folder = tmp_path / "cam"
    folder.mkdir()
    expected = _not_images(folder)
    for kind in BOMBS:
        write_bomb(folder / f"bomb.{kind}", kind)
    for index in range(2):
        cv2.imwrite(str(folder / f"good{index}.png"), small_image(160 + index, 120))
    listed = [n for n in os.listdir(folder) if (folder / n).is_file() and not n.startswith("good")]
    caplog.set_level(logging.WARNING, logger="yoloedge.sources.base")
    reader, sink, _ = readers(camera(folder, loop=True))
    deadline = time.monotonic() + 15
    while len(sink.frames) < 6 and time.monotonic() < deadline:  # three passes over the folder
        time.sleep(0.02)
    reader.stop()
    assert reader.join(5)
    assert [f.image.shape[1] for f in sink.frames[:6]] == [160, 161] * 3
    assert len(listed) == 9 and expected
    assert reader.stats()["images_skipped"] >= 2 * len(listed)  # the third pass began: two were complete
    for name in listed:
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"{folder / name}: ")]
        assert len(lines) == 1, (name, lines)  # once, not once per pass


def test_a_folder_of_bombs_fails_that_camera_only_and_says_why(tmp_path, readers):
    bombs, good = tmp_path / "bombs", tmp_path / "good"
    bombs.mkdir()
    good.mkdir()
    write_bomb(bombs / "a.png", "png")
    write_bomb(bombs / "b.jpg", "jpg")
    for index in range(3):
        cv2.imwrite(str(good / f"{index}.png"), small_image())
    bad_reader, _, bad_states = readers(camera(bombs, name="bombs", max_retries=2))
    good_reader, good_sink, good_states = readers(camera(good, name="good"))
    reason = bad_states.wait_for(CameraState.FAILED, 10)
    assert reason is not None and "no readable image" in reason
    assert "65000x65000 pixels, over the bound" in reason  # the last file's reason
    assert bad_reader.stats()["images_skipped"] == 2 * 2  # both files, on each of the two attempts
    assert good_states.wait_for(CameraState.ENDED, 10) is not None
    assert len(good_sink.frames) == 3


# -- oversized frames from a stream ------------------------------------------------------------------
def test_an_mjpeg_camera_with_oversized_frames_is_an_error_that_backs_off_and_others_go_on(readers):
    ok, jpg = cv2.imencode(".jpg", small_image(320, 240))
    assert ok
    with MjpegServer([jpg.tobytes()], fps=20) as server:
        limits = ImageLimits(max_pixels=320 * 240 - 1)
        big, big_sink, big_states = readers(camera(server.url, name="big"), limits=limits)
        fine, fine_sink, _ = readers(camera(server.url, name="fine"), limits=ImageLimits(max_pixels=320 * 240))
        reason = big_states.wait_for(CameraState.BACKOFF, 10)
        assert reason is not None and "a frame of 320x240 pixels, over the bound of 76,799 pixels" in reason
        deadline = time.monotonic() + 10
        while big.stats()["reconnects"] < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        stats = big.stats()
        assert stats["reconnects"] >= 2 and "over the bound" in stats["error"]  # retried, with its backoff
        assert big_sink.frames == [] and stats["state"] != CameraState.STREAMING.value
        assert fine.state is CameraState.STREAMING and len(fine_sink.frames) > 5


def test_a_video_file_with_oversized_frames_is_an_error(tmp_path, readers):
    path = tmp_path / "clip.avi"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 10, (200, 100))
    for _ in range(5):
        writer.write(small_image(200, 100))
    writer.release()
    reader, sink, states = readers(camera(path, max_retries=1), limits=ImageLimits(max_pixels=200 * 100 - 1))
    reason = states.wait_for(CameraState.FAILED, 10)
    assert reason is not None and "a frame of 200x100 pixels, over the bound" in reason
    assert sink.frames == []
