"""Validating cameras reads no camera: `config.sources` holds the vocabulary, `sources/` the readers.

Loading a config with every kind of camera -- network, file, folder, device, synthetic (with and
without an image), a `pipeline:`, every `decoder:` and `jpeg_decoder:` -- runs in a fresh
interpreter, which then says what it imported: no reader module (`yoloedge.sources`), no device or
pipeline module, no OpenCV, PyGObject, PyAV or ONNX Runtime.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

#: each kind of camera the config accepts; those that need an optional module are valid only
#: where it is installed (else they are reported, which is validation too)
CAMERAS = """\
- {name: rtsp, url: "rtsp://admin:pw@192.0.2.10/stream1"}
- {name: mjpeg, url: "http://192.0.2.11/video.mjpg", jpeg_decoder: cpu}
- {name: file, url: "clips/gate.mp4", loop: true}
- {name: file-url, url: "file:///srv/videos/gate.mp4"}
- {name: folder, url: "frames/"}
- {name: device, url: /dev/video0}
- {name: synthetic, url: "synthetic://640x480?fps=5"}
- {name: synthetic-image, url: "synthetic://320x240?fps=2&image=gate.png"}
- {name: auto, url: "rtsp://192.0.2.12/s", decoder: auto, jpeg_decoder: auto}
"""
OPTIONAL = """\
- {name: gst, url: "rtsp://192.0.2.13/s", decoder: gstreamer}
- {name: vaapi, url: "rtsp://192.0.2.14/s", decoder: vaapi}
- {name: pyav, url: "clips/gate.mp4", decoder: pyav}
- {name: launch, pipeline: "videotestsrc ! videoconvert ! video/x-raw,format=BGR ! appsink"}
- {name: gpu-jpeg, url: "http://192.0.2.15/video.mjpg", jpeg_decoder: nvimgcodec}
- {name: old-gpu-jpeg, url: "http://192.0.2.16/video.mjpg", jpeg_decoder: nvjpeg}
"""

SCRIPT = textwrap.dedent("""\
    import json, sys
    from yoloedge.config.errors import ConfigError
    from yoloedge.config.loader import load_config
    valid = load_config(sys.argv[1], {})
    try:
        load_config(sys.argv[2], {})
        problems = []
    except ConfigError as exc:
        problems = [issue.message for issue in exc.issues]
    print(json.dumps({
        "cameras": [camera.name for camera in valid.cameras],
        "problems": problems,
        "loaded": sorted(name for name in sys.modules
                         if name.split(".")[0] in ("cv2", "gi", "av", "onnxruntime")
                         or name.startswith(("yoloedge.sources", "yoloedge.backends", "yoloedge.pipeline"))),
    }))
""")


def write_config(folder: Path, name: str, cameras: str) -> Path:
    path = folder / name
    path.write_text(f"device_id: edge-01\nmodel: {{path: {folder / 'model.onnx'}}}\ncameras:\n"
                    + textwrap.indent(cameras, "  "), encoding="utf-8")
    return path


def test_validating_every_kind_of_camera_imports_no_reader_gi_av_or_opencv(tmp_path):
    (tmp_path / "model.onnx").write_bytes(b"not opened by the loader")
    (tmp_path / "gate.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(24))  # the signature is what is read
    valid = write_config(tmp_path, "valid.yaml", CAMERAS)
    optional = write_config(tmp_path, "optional.yaml", OPTIONAL)
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(valid), str(optional)], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["cameras"] == ["rtsp", "mjpeg", "file", "file-url", "folder", "device", "synthetic",
                                 "synthetic-image", "auto"]
    assert report["loaded"] == [], report  # no reader or device module, no OpenCV, gi, av, ORT
