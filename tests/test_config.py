"""The config loader: the shipped example loads, defaults are the documented ones, ${ENV} works,
and every kind of mistake is reported with its file:line, key path and a clear message."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import cv2
import numpy as np
import pytest

from yoloedge.config.errors import EX_CONFIG, ConfigError, ConfigIssue
from yoloedge.config.loader import load_config
from yoloedge.config.model import ModelConfig, OnnxRuntimeConfig
from yoloedge.config.schema import (AcceleratorConfig, CameraConfig, Config, ControlConfig, HealthConfig,
                                    LoggingConfig, MqttConfig, TlsConfig)
from yoloedge.errors import YoloedgeError
from yoloedge.redact import redact, redact_url

from tls_files import make_tls_files

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "etc" / "yoloedge" / "yoloedge.yaml"
EXAMPLE_MODEL = "/var/lib/yoloedge/models/yolov8n.onnx"
EXAMPLE_ENV = {"CAM_GATE_PASSWORD": "gate-secret"}


@pytest.fixture
def model(tmp_path) -> Path:
    path = tmp_path / "yolov8n.onnx"
    path.write_bytes(b"not really a model: the loader never opens it")
    return path


def write(tmp_path: Path, text: str, name: str = "yoloedge.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def load(path: Path, environ=None) -> Config:
    return load_config(str(path), environ or {})


def errors(path: Path, environ=None) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load(path, environ)
    return info.value


# -- good files ----------------------------------------------------------------------------------

def test_example_file_loads_when_its_model_exists(tmp_path, model):
    text = EXAMPLE.read_text(encoding="utf-8")
    assert EXAMPLE_MODEL in text
    path = write(tmp_path, text.replace(EXAMPLE_MODEL, str(model)))
    config = load(path, EXAMPLE_ENV)
    assert config.device_id == "edge-01"
    assert config.model.path == str(model)
    assert [c.name for c in config.cameras] == ["gate", "lobby", "archive", "usb", "snapshots", "bench"]
    assert config.cameras[5].url == "synthetic://1920x1080?fps=25" and config.cameras[5].enabled is False
    gate = config.cameras[0]
    assert gate.url == "rtsp://viewer:gate-secret@192.0.2.10:554/Streaming/Channels/101"
    assert gate.classes == ("person", "car", "truck") and gate.accelerator == "cpu"
    assert config.cameras[2].realtime is False and config.cameras[3].enabled is False
    assert [a.name for a in config.accelerators] == ["cpu"]
    assert config.control.mode == 0o660
    assert config.source == str(path)


def test_example_file_states_every_default(tmp_path, model):
    """Every value the example spells out is the dataclass default, except the example's choices."""
    text = EXAMPLE.read_text(encoding="utf-8").replace(EXAMPLE_MODEL, str(model))
    config = load(write(tmp_path, text), EXAMPLE_ENV)
    assert config.model == ModelConfig(path=str(model))
    assert config.accelerators[0] == AcceleratorConfig(name="cpu")
    assert config.mqtt == MqttConfig()
    assert config.health == HealthConfig()
    assert config.control == ControlConfig()
    assert config.logging == LoggingConfig()
    assert config.shutdown_timeout_s == Config(device_id="x", model=ModelConfig("m"), accelerators=()).shutdown_timeout_s
    gate = config.cameras[0]
    defaults = CameraConfig(name="gate", url=gate.url, fps=5, classes=("person", "car", "truck"),
                            min_score=0.4, accelerator="cpu")
    assert gate == defaults


def test_example_mentions_reload(tmp_path):
    text = EXAMPLE.read_text(encoding="utf-8")
    assert "systemctl reload yoloedge" in text and "SIGHUP" in text


def test_minimal_config_takes_the_documented_defaults(tmp_path, model):
    path = write(tmp_path, f"""
        device_id: edge-01
        model:
          path: {model}
        """)
    config = load(path)
    assert config == Config(
        device_id="edge-01",
        model=ModelConfig(path=str(model)),
        accelerators=(AcceleratorConfig(name="onnxruntime0"),),  # no key: one ONNX Runtime CPU accelerator
        source=str(path),
    )
    # The documented defaults, spelled out (docs/configuration.md and etc/yoloedge/yoloedge.yaml):
    assert config.cameras == ()
    m = config.model
    assert (m.format, m.labels, m.conf, m.iou, m.max_det, m.agnostic_nms, m.classes, m.class_conf,
            m.imgsz, m.anchors, m.input, m.letterbox, m.color, m.normalize) == \
           (None, None, 0.25, 0.45, 300, None, None, {}, None, None, "host", None, None, None)
    a = config.accelerators[0]
    assert (a.backend, a.devices, a.batch, a.batch_timeout_ms, a.inference_timeout_s,
            a.max_consecutive_errors, a.options) == ("onnxruntime", (0,), 1, 10.0, 10.0, 5, {})
    assert a.onnxruntime == OnnxRuntimeConfig(provider="cpu", device_id=0, provider_options={}, intra_op_threads=0,
                                              allow_fallback=False, graph_optimization="all", qdq_fusion=True,
                                              io_binding=True)
    q = config.mqtt
    assert (q.host, q.port, q.username, q.password, q.tls, q.topic_prefix, q.qos, q.client_id, q.keepalive_s,
            q.queue_limit, q.stats_interval_s, q.reconnect_min_s, q.reconnect_max_s, q.drain_rate) == \
           ("localhost", 1883, None, None, None, "yoloedge", 1, None, 30, 10000, 10.0, 1.0, 30.0, 100.0)
    assert (config.health.stall_timeout_s, config.health.watchdog, config.health.status_interval_s) == (10.0, True, 5.0)
    assert (config.control.socket, config.control.mode) == ("/run/yoloedge/control.sock", 0o660)
    assert (config.logging.level, config.logging.target) == ("info", "auto")
    assert config.shutdown_timeout_s == 10.0


def test_minimal_camera_takes_the_documented_defaults(tmp_path, model):
    path = write(tmp_path, f"""
        device_id: edge-01
        model: {{path: {model}}}
        cameras:
          - {{name: gate, url: "rtsp://cam.local/stream"}}
        """)
    camera = load(path).cameras[0]
    assert camera == CameraConfig(name="gate", url="rtsp://cam.local/stream")
    assert (camera.enabled, camera.fps, camera.realtime, camera.loop, camera.classes, camera.min_score,
            camera.open_timeout_s, camera.read_timeout_s, camera.backoff_initial_s, camera.backoff_max_s,
            camera.max_retries, camera.queue_size, camera.publish_empty, camera.accelerator,
            camera.event_snapshots_mb) == \
           (True, None, None, False, None, None, 10.0, 10.0, 1.0, 30.0, 0, 2, True, None, 16.0)


def test_empty_sections_take_their_defaults(tmp_path, model):
    path = write(tmp_path, f"""
        device_id: edge-01
        model: {{path: {model}}}
        accelerators:
        cameras:
        mqtt:
        health:
        control:
        logging:
        """)
    config = load(path)
    assert config.cameras == () and config.mqtt == MqttConfig() and len(config.accelerators) == 1


def test_accelerators_backends_and_sections(tmp_path):
    # One model for three kinds of backend only loads with a suffix none of them claims (an .onnx on
    # the Ascend accelerator is refused: see test_model_file_kind_must_suit_the_backend).
    model = tmp_path / "yolov8n.model"
    model.write_bytes(b"not really a model: the loader never opens it")
    path = write(tmp_path, f"""
        device_id: edge-01
        model: {{path: {model}}}
        accelerators:
          - backend: onnxruntime
            provider: cuda
            devices: [0, 1]
            batch: 4
            batch_timeout_ms: 5
            provider_options: {{trt_fp16_enable: "1", gpu_mem_limit: 2147483648}}
            allow_fallback: true
            intra_op_threads: 2
            graph_optimization: basic
            qdq_fusion: true
          - backend: ascend
            devices: [0]
            ascend: {{execute: async, telemetry: false}}
          - backend: mycompany.backends:FpgaBackend
            options: {{bitstream: /opt/yolo.bit}}
        cameras:
          - {{name: a, url: "rtsp://h/s", accelerator: ascend1}}
        """)
    ort, ascend, plugin = load(path).accelerators
    assert ort.name == "onnxruntime0" and ort.devices == (0, 1) and ort.batch == 4
    assert ort.onnxruntime == OnnxRuntimeConfig(provider="cuda", provider_options={"trt_fp16_enable": "1",
                                                                                  "gpu_mem_limit": 2147483648},
                                                allow_fallback=True, intra_op_threads=2,
                                                graph_optimization="basic", qdq_fusion=True)
    assert ort.onnxruntime.device_id == 0  # taken from `devices` per worker at run time
    assert (ascend.name, ascend.backend, ascend.options) == ("ascend1", "ascend", {"execute": "async", "telemetry": False})
    assert (plugin.name, plugin.options) == ("fpgabackend2", {"bitstream": "/opt/yolo.bit"})


def test_model_settings(tmp_path, model):
    labels = tmp_path / "labels.txt"
    labels.write_text("person\ncar\n")
    path = write(tmp_path, """
        device_id: edge-01
        model:
          path: yolov8n.onnx          # relative: from the config file's folder
          labels: labels.txt
          format: raw
          classes: [person, 2]
          class_conf: {person: 0.5, 2: 0.6}
          imgsz: [384, 640]
          anchors: [[10,13, 16,30, 33,23], [[30,61], [62,45], [59,119]], [116,90, 156,198, 373,326]]
          agnostic_nms: true
        """)
    m = load(path).model
    assert m.path == str(model) and m.labels == str(labels)
    assert m.classes == ("person", 2) and m.class_conf == {"person": 0.5, 2: 0.6}
    assert m.imgsz == (384, 640) and m.agnostic_nms is True
    assert m.anchors[1] == (30.0, 61.0, 62.0, 45.0, 59.0, 119.0)


def test_tls_true_means_system_cas_and_files_are_resolved(tmp_path, model):
    shutil.copy(make_tls_files(tmp_path / "tls").cert, tmp_path / "ca.pem")
    base = f"device_id: e\nmodel: {{path: {model}}}\n"
    assert load(write(tmp_path, base + "mqtt: {tls: true, port: 8883}")).mqtt.tls == TlsConfig()
    assert load(write(tmp_path, base + "mqtt: {tls: false}")).mqtt.tls is None
    tls = load(write(tmp_path, base + "mqtt: {tls: {ca_certs: ca.pem}}")).mqtt.tls
    assert tls == TlsConfig(ca_certs=str(tmp_path / "ca.pem"))


def test_camera_url_forms(tmp_path, model):
    path = write(tmp_path, f"""
        device_id: edge-01
        model: {{path: {model}}}
        cameras:
          - {{name: a, url: "rtsps://u:p@cam/s"}}
          - {{name: b, url: "https://cam/video.mjpg"}}
          - {{name: c, url: "file:///srv/v.mp4", realtime: false, loop: true}}
          - {{name: d, url: /dev/video2}}
          - {{name: e, url: clips/, realtime: false}}
          - {{name: f, url: /srv/snapshots}}
        """)
    urls = [c.url for c in load(path).cameras]
    assert urls == ["rtsps://u:p@cam/s", "https://cam/video.mjpg", "file:///srv/v.mp4", "/dev/video2",
                    str(tmp_path / "clips"), "/srv/snapshots"]


def test_decode_threads(tmp_path, model):
    path = write(tmp_path, f"""
        device_id: edge-01
        model: {{path: {model}}}
        cameras:
          - {{name: a, url: "rtsp://h/1"}}
          - {{name: b, url: "rtsp://h/2", decode_threads: 0}}
          - {{name: c, url: clip.mp4, decode_threads: 16}}
        """)
    assert [c.decode_threads for c in load(path).cameras] == [1, 0, 16]
    assert CameraConfig(name="x", url="y").decode_threads == 1


def test_synthetic_camera_urls(tmp_path, model):
    (tmp_path / "frames").mkdir()
    cv2.imwrite(str(tmp_path / "frames" / "gate 1.png"), np.zeros((4, 4, 3), np.uint8))
    path = write(tmp_path, f"""
        device_id: edge-01
        model: {{path: {model}}}
        cameras:
          - {{name: a, url: "synthetic://1920x1080?fps=25"}}
          - {{name: b, url: "SYNTHETIC://640X480?image=frames/gate%201.png&fps=12.5", fps: 5}}
          - {{name: c, url: "synthetic://64x48?fps=30&image={tmp_path}/frames/gate%201.png"}}
        """)
    a, b, c = load(path).cameras
    assert a.url == "synthetic://1920x1080?fps=25"
    assert b.url == f"synthetic://640x480?fps=12.5&image={tmp_path}/frames/gate%201.png"  # resolved here
    assert c.url == f"synthetic://64x48?fps=30&image={tmp_path}/frames/gate%201.png"


def test_yaml_anchors_and_merge_keys(tmp_path, model):
    path = write(tmp_path, f"""
        device_id: edge-01
        model: {{path: {model}}}
        cameras:
          - &base {{name: a, url: "rtsp://h/1", fps: 2, max_retries: 3}}
          - <<: *base
            name: b
            url: rtsp://h/2
        """)
    a, b = load(path).cameras
    assert (b.name, b.url, b.fps, b.max_retries) == ("b", "rtsp://h/2", 2.0, 3)


# -- ${ENV} --------------------------------------------------------------------------------------

def test_env_substitution(tmp_path, model):
    path = write(tmp_path, f"""
        device_id: ${{DEVICE:-edge-01}}
        model: {{path: "${{MODELS}}/yolov8n.onnx"}}
        cameras:
          - name: gate
            url: rtsp://viewer:${{CAM_PASSWORD}}@cam.local/s
            fps: ${{FPS:-5}}
        mqtt:
          username: yoloedge
          password: ${{MQTT_PASSWORD}}
          client_id: "$${{literal}}"
        """)
    environ = {"MODELS": str(model.parent), "CAM_PASSWORD": "c@m", "MQTT_PASSWORD": "s3cret"}
    config = load(path, environ)
    assert config.device_id == "edge-01"
    assert config.model.path == str(model)
    assert config.cameras[0].url == "rtsp://viewer:c@m@cam.local/s"
    assert config.cameras[0].fps == 5.0  # unquoted: typed after substitution
    assert config.mqtt.password == "s3cret"
    assert config.mqtt.client_id == "${literal}"


def test_env_is_only_read_from_the_mapping_given(tmp_path, model, monkeypatch):
    monkeypatch.setenv("MQTT_PASSWORD", "from-os-environ")
    path = write(tmp_path, f"device_id: e\nmodel: {{path: {model}}}\nmqtt:\n  username: u\n  password: ${{MQTT_PASSWORD}}\n")
    err = errors(path, {})
    assert "environment variable MQTT_PASSWORD is not set" in str(err)


# -- bad files: one problem each, with its line, key path and message --------------------------

HEAD = "device_id: edge-01\nmodel:\n  path: {model}\n"  # lines 1-3; case text starts at line 4

BAD = [
    # id, text after HEAD, line, key path, message fragment
    ("unknown-key-did-you-mean", "cameras:\n  - name: a\n    url: rtsp://h/s\n    fsp: 5\n",
     7, "cameras[0].fsp", "unknown key (did you mean 'fps'?)"),
    ("unknown-top-level-key", "camera: []\n", 4, "camera", "unknown key (did you mean 'cameras'?)"),
    ("string-for-number", "mqtt:\n  port: \"1883\"\n", 5, "mqtt.port",
     "'1883' is not allowed: must be a whole number from 1 to 65535"),
    ("list-for-mapping", "mqtt: [localhost, 1883]\n", 4, "mqtt", "a list is not allowed: must be a mapping"),
    ("negative-fps", "cameras:\n  - name: a\n    url: rtsp://h/s\n    fps: -5\n", 7, "cameras[0].fps",
     "-5 is not allowed: must be a number > 0 and <= 1000 or null (e.g. fps: 5)"),
    ("qos-3", "mqtt:\n  qos: 3\n", 5, "mqtt.qos", "3 is not allowed: must be a whole number from 0 to 2"),
    ("duplicate-camera-name", "cameras:\n  - name: gate\n    url: rtsp://h/1\n  - name: gate\n    url: rtsp://h/2\n",
     7, "cameras[1].name", "duplicate camera name 'gate' (first used at line 5)"),
    ("duplicate-key", "  conf: 0.3\n  conf: 0.4\n", 5, "model.conf", "duplicate key (first given at line 4"),
    ("bad-backend", "accelerators:\n  - backend: openvino\n", 5, "accelerators[0].backend",
     "'openvino' is not allowed: must be one of: onnxruntime, ascend, tensorrt, simulated, or a custom backend"),
    ("one-input-buffer", "accelerators:\n  - input_buffers: 1\n", 5, "accelerators[0].input_buffers",
     "1 is not allowed: must be a whole number from 2 to 8"),
    ("simulated-device-ms", "accelerators:\n  - backend: simulated\n    simulated:\n      device_ms: [4]\n", 7,
     "accelerators[0].simulated.device_ms", "must be [base_ms, per_frame_ms] or one number"),
    ("simulated-no-time", "accelerators:\n  - backend: simulated\n    simulated:\n      device_ms: [0, 0]\n", 7,
     "accelerators[0].simulated.device_ms", "must give the device some time per inference"),
    ("simulated-image-missing", "accelerators:\n  - backend: simulated\n    simulated:\n      image: nowhere.jpg\n",
     7, "accelerators[0].simulated.image", "file not found"),
    ("simulated-unknown-key", "accelerators:\n  - backend: simulated\n    simulated:\n      device_m: 3\n", 7,
     "accelerators[0].simulated.device_m", "unknown key (did you mean 'device_ms'?)"),
    ("simulated-section-elsewhere", "accelerators:\n  - backend: onnxruntime\n    simulated: {}\n", 6,
     "accelerators[0].simulated", "the simulated section applies only to backend simulated"),
    ("bad-provider", "accelerators:\n  - provider: cude\n", 5, "accelerators[0].provider",
     "must be one of: cpu, cuda, tensorrt, migraphx, rocm (did you mean 'cuda'?)"),
    ("ort-key-on-other-backend", "accelerators:\n  - backend: simulated\n    provider: cuda\n", 6,
     "accelerators[0].provider", "provider applies only to backend onnxruntime"),
    ("onnx-model-on-ascend", "accelerators:\n  - backend: ascend\n", 5, "accelerators[0].backend",
     "backend ascend runs .om files, but model.path is a .onnx file (for onnxruntime, simulated); "
     "convert the model with `yoloedge convert atc`"),
    ("onnx-model-on-tensorrt", "accelerators:\n  - backend: tensorrt\n", 5, "accelerators[0].backend",
     "backend tensorrt runs .engine/.plan/.trt files, but model.path is a .onnx file (for onnxruntime, "
     "simulated); build an engine with "
     "`yoloedge convert trt`"),
    ("tensorrt-section-on-ort", "accelerators:\n  - provider: cpu\n    tensorrt: {}\n", 6,
     "accelerators[0].tensorrt", "the tensorrt section applies only to backend tensorrt (this accelerator's "
     "backend is onnxruntime)"),
    ("unknown-backend", "accelerators:\n  - backend: tensorrtx\n", 5, "accelerators[0].backend",
     "must be one of: onnxruntime, ascend, tensorrt, simulated, or a custom backend as package.module:ClassName "
     "(did you mean 'tensorrt'?)"),
    ("realtime-false-on-rtsp", "cameras:\n  - name: a\n    url: rtsp://h/s\n    realtime: false\n", 7,
     "cameras[0].realtime", "false is not allowed: only for files and folders"),
    ("loop-on-device", "cameras:\n  - name: a\n    url: /dev/video0\n    loop: true\n", 7,
     "cameras[0].loop", "only for files and folders"),
    ("unknown-camera-accelerator", "cameras:\n  - name: a\n    url: rtsp://h/s\n    accelerator: gpu\n", 7,
     "cameras[0].accelerator", "'gpu' is not allowed: names no accelerator; defined: onnxruntime0"),
    ("missing-env-var", "mqtt:\n  username: u\n  password: ${MQTT_PASSWORD}\n", 6, "mqtt.password",
     "environment variable MQTT_PASSWORD is not set"),
    ("unclosed-env-reference", "mqtt:\n  host: ${BROKER\n", 5, "mqtt.host", "'${' is not closed"),
    ("tls-ca-missing", "mqtt:\n  tls:\n    ca_certs: /nonexistent/ca.pem\n", 6, "mqtt.tls.ca_certs",
     "file not found: /nonexistent/ca.pem"),
    ("keyfile-without-certfile", "mqtt:\n  tls:\n    keyfile: {model}\n", 6, "mqtt.tls.keyfile",
     "a keyfile needs a certfile"),
    ("conf-out-of-range", "  conf: 1.5\n", 4, "model.conf", "1.5 is not allowed: must be a number from 0 to 1"),
    ("class-conf-out-of-range", "  class_conf: {person: 2}\n", 4, "model.class_conf.person",
     "2 is not allowed: must be a number from 0 to 1"),
    ("bad-format", "  format: v9\n", 4, "model.format", "must be one of: v5, v8, e2e, yolox, raw, raw_v8, or null"),
    ("bad-imgsz", "  imgsz: [640]\n", 4, "model.imgsz", "must be N or [H, W]"),
    ("batch-0", "accelerators:\n  - batch: 0\n", 5, "accelerators[0].batch", "0 is not allowed: must be a whole number from 1 to 256"),
    ("empty-accelerators", "accelerators: []\n", 4, "accelerators", "must list at least one accelerator"),
    ("device-twice", "accelerators:\n  - devices: [0, 1, 0]\n", 5, "accelerators[0].devices", "lists device 0 more than once"),
    ("duplicate-accelerator-name", "accelerators:\n  - name: npu\n  - name: npu\n", 6, "accelerators[1].name",
     "duplicate accelerator name 'npu'"),
    ("camera-name-not-topic-safe", "cameras:\n  - name: front/door\n    url: rtsp://h/s\n", 5, "cameras[0].name",
     "'front/door' is not allowed: must not contain '/', '+', '#'"),
    ("camera-missing-url", "cameras:\n  - name: a\n", 5, "cameras[0].url", "required key is missing"),
    ("bad-scheme", "cameras:\n  - name: a\n    url: rtmp://h/live\n", 6, "cameras[0].url", "unsupported scheme rtmp://"),
    ("decode-threads-negative", "cameras:\n  - name: a\n    url: rtsp://h/s\n    decode_threads: -1\n", 7,
     "cameras[0].decode_threads", "-1 is not allowed: must be a whole number from 0 to 16 (e.g. decode_threads: 1)"),
    ("decode-threads-fraction", "cameras:\n  - name: a\n    url: a.mp4\n    decode_threads: 1.5\n", 7,
     "cameras[0].decode_threads", "must be a whole number from 0 to 16"),
    ("decode-threads-too-many", "cameras:\n  - name: a\n    url: a.mp4\n    decode_threads: 32\n", 7,
     "cameras[0].decode_threads", "32 is not allowed: must be a whole number from 0 to 16"),
    ("synthetic-bad-size", "cameras:\n  - name: a\n    url: synthetic://1920x0?fps=25\n", 6, "cameras[0].url",
     "is not allowed: the size must be WIDTHxHEIGHT in pixels, each 1 to 8192, not '1920x0' (e.g. url: synthetic://"),
    ("synthetic-without-fps", "cameras:\n  - name: a\n    url: synthetic://640x480\n", 6, "cameras[0].url",
     "fps=F is missing"),
    ("synthetic-fps-zero", "cameras:\n  - name: a\n    url: synthetic://640x480?fps=0\n", 6, "cameras[0].url",
     "fps must be a number from 0.1 to 1000"),
    ("synthetic-unknown-parameter", "cameras:\n  - name: a\n    url: synthetic://640x480?fps=5&imgae=x.jpg\n", 6,
     "cameras[0].url", "unknown parameter 'imgae'"),
    ("synthetic-image-missing", "cameras:\n  - name: a\n    url: synthetic://640x480?fps=5&image=nope.jpg\n", 6,
     "cameras[0].url", "synthetic camera: image not found: "),
    ("synthetic-image-not-an-image", "cameras:\n  - name: a\n    url: synthetic://640x480?fps=5&image={model}\n", 6,
     "cameras[0].url", "synthetic camera: not an image OpenCV can read: "),
    ("loop-on-synthetic", "cameras:\n  - name: a\n    url: synthetic://640x480?fps=5\n    loop: true\n", 7,
     "cameras[0].loop", "only for files and folders"),
    ("realtime-false-on-synthetic", "cameras:\n  - name: a\n    url: synthetic://640x480?fps=5\n    realtime: false\n", 7,
     "cameras[0].realtime", "only for files and folders"),
    ("camera-index", "cameras:\n  - name: a\n    url: \"0\"\n", 6, "cameras[0].url", "write the device: url: /dev/video0"),
    ("backoff-order", "cameras:\n  - name: a\n    url: rtsp://h/s\n    backoff_initial_s: 5\n    backoff_max_s: 2\n", 8,
     "cameras[0].backoff_max_s", "must be >= backoff_initial_s (5)"),
    ("mode-without-leading-zero", "control:\n  mode: 660\n", 5, "control.mode", "octal permissions with a leading 0"),
    ("relative-socket", "control:\n  socket: control.sock\n", 5, "control.socket", "must be an absolute path"),
    ("bad-log-level", "logging:\n  level: verbose\n", 5, "logging.level", "must be one of: debug, info, warning, error"),
    ("bad-topic-prefix", "mqtt:\n  topic_prefix: site/#\n", 5, "mqtt.topic_prefix", "without '+', '#'"),
    ("password-without-username", "mqtt:\n  password: s3cret\n", 5, "mqtt.password", "a password needs a username"),
    ("string-where-bool", "health:\n  watchdog: \"yes\"\n", 5, "health.watchdog", "must be true or false"),
    ("zero-timeout", "shutdown_timeout_s: 0\n", 4, "shutdown_timeout_s", "0 is not allowed: must be a number > 0"),
]


@pytest.mark.parametrize("text, line, key_path, fragment", [case[1:] for case in BAD], ids=[case[0] for case in BAD])
def test_bad_config_is_reported_with_its_line(tmp_path, model, text, line, key_path, fragment):
    path = write(tmp_path, (HEAD + text).replace("{model}", str(model)))
    err = errors(path)
    assert len(err.issues) == 1, str(err)
    expected_start = f"{path}:{line}: {key_path}: "
    assert str(err).startswith(expected_start), str(err)
    assert fragment in str(err)
    issue = err.issues[0]
    assert (issue.file, issue.line, issue.key_path) == (str(path), line, key_path)


def test_missing_device_id(tmp_path, model):
    path = write(tmp_path, f"model:\n  path: {model}\n")
    assert str(errors(path)) == f"{path}:1: device_id: required key is missing"


def test_device_id_must_be_topic_safe(tmp_path, model):
    path = write(tmp_path, f"device_id: edge/01\nmodel: {{path: {model}}}\n")
    assert str(errors(path)).startswith(f"{path}:1: device_id: 'edge/01' is not allowed: must not contain '/'")


def test_device_id_number_must_be_quoted(tmp_path, model):
    path = write(tmp_path, f"device_id: 42\nmodel: {{path: {model}}}\n")
    assert str(errors(path)) == f"{path}:1: device_id: 42 is not allowed: must be a string (put it in quotes)"


def test_missing_model_path(tmp_path):
    path = write(tmp_path, "device_id: edge-01\nmodel:\n  conf: 0.3\n")
    assert str(errors(path)) == f"{path}:2: model.path: required key is missing"


def test_model_file_not_found(tmp_path):
    path = write(tmp_path, "device_id: edge-01\nmodel:\n  path: models/missing.onnx\n")
    expected = f"{path}:3: model.path: file not found: {tmp_path / 'models' / 'missing.onnx'}"
    assert str(errors(path)) == expected


def test_yaml_syntax_error_reports_line_and_column(tmp_path):
    path = write(tmp_path, "device_id: edge-01\nmodel:\n  path: m.onnx\n   conf: 0.3\n")
    err = errors(path)
    assert len(err.issues) == 1
    assert str(err).startswith(f"{path}:4: YAML syntax error at column 8: ")
    assert err.issues[0].line == 4 and err.issues[0].column == 8


def test_tabs_get_a_hint(tmp_path):
    path = write(tmp_path, "device_id: edge-01\nmodel:\n\tpath: m.onnx\n")
    assert "indent with spaces" in str(errors(path))


def test_missing_file(tmp_path):
    path = tmp_path / "absent.yaml"
    err = errors(path)
    assert str(err) == f"{path}: cannot read the config file: not found"
    assert isinstance(err, YoloedgeError) and err.exit_code == EX_CONFIG == 78


def test_empty_file(tmp_path):
    path = write(tmp_path, "# nothing yet\n")
    assert "the file is empty" in str(errors(path))


def test_top_level_must_be_a_mapping(tmp_path):
    path = write(tmp_path, "- device_id: edge-01\n")
    assert str(errors(path)) == f"{path}:1: a list is not allowed: must be a mapping (key: value lines)"


def test_all_errors_are_reported_together_in_file_order(tmp_path, model):
    path = write(tmp_path, f"""
        device_id: edge-01
        model:
          path: {model}
          conf: 2
        cameras:
          - name: a
            url: rtsp://h/s
            fps: 0
            realtime: false
          - name: a
            url: /srv/v.mp4
        mqtt:
          qos: 3
          prot: 1883
        """)
    err = errors(path)
    lines = str(err).splitlines()
    assert [(i.line, i.key_path) for i in err.issues] == [
        (4, "model.conf"), (8, "cameras[0].fps"), (9, "cameras[0].realtime"), (10, "cameras[1].name"),
        (13, "mqtt.qos"), (14, "mqtt.prot")]
    assert len(lines) == 6 and all(line.startswith(f"{path}:") for line in lines)
    assert "did you mean 'port'?" in lines[-1]


def test_secrets_never_appear_in_messages(tmp_path, model):
    path = write(tmp_path, f"""
        device_id: edge-01
        model: {{path: {model}}}
        cameras:
          - name: gate
            url: rtmp://admin:hunter2@cam.local/live
          - name: lobby
            url: rtmp://admin:${{CAM_PASSWORD}}@cam.local/live
        mqtt:
          username: yoloedge
          password: [hunter3]
        """)
    err = errors(path, {"CAM_PASSWORD": "hunter4"})
    text = str(err) + repr(err.issues)
    for secret in ("hunter2", "hunter3", "hunter4"):
        assert secret not in text
    assert f"{path}:5: cameras[0].url: 'rtmp://***@cam.local/live' is not allowed" in text
    assert f"{path}:10: mqtt.password: *** is not allowed: must be a string" in text


def test_issue_format():
    issue = ConfigIssue("/etc/yoloedge/yoloedge.yaml", 14, 5, "cameras[1].fps", "-5",
                        "must be a number > 0", "e.g. fps: 5")
    assert str(issue) == "/etc/yoloedge/yoloedge.yaml:14: cameras[1].fps: -5 is not allowed: must be a number > 0 (e.g. fps: 5)"
    assert str(ConfigIssue("f.yaml", 0, 0, "cameras", None, "not running", None)) == "f.yaml: cameras: not running"


def test_redact_helpers():
    assert redact_url("rtsp://admin:secret@10.0.0.5/stream") == "rtsp://***@10.0.0.5/stream"
    assert redact_url("rtsp://admin@10.0.0.5/stream") == "rtsp://***@10.0.0.5/stream"
    assert redact_url("http://cam/video.mjpg") == "http://cam/video.mjpg"
    assert redact("s3cret") == "***"


# -- yoloedge check ------------------------------------------------------------------------------

def run_check(path: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("CAM_GATE_PASSWORD", "MQTT_PASSWORD")}
    return subprocess.run([sys.executable, "-m", "yoloedge", "check", "-c", str(path), *extra],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def test_check_command_accepts_a_good_file(tmp_path, model):
    path = write(tmp_path, f"""
        device_id: edge-01
        model: {{path: {model}}}
        cameras:
          - {{name: gate, url: "rtsp://h/s"}}
        """)
    result = run_check(path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{path}: OK (1 camera, 1 accelerator)"


def test_check_command_reports_every_issue_and_exits_78(tmp_path, model):
    path = write(tmp_path, f"""
        device_id: edge-01
        model: {{path: {model}}}
        mqtt: {{qos: 3, port: 0}}
        """)
    result = run_check(path)
    assert result.returncode == 78
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith(f"{path}:3: mqtt.qos: 3 is not allowed")
    assert lines[1].startswith(f"{path}:3: mqtt.port: 0 is not allowed")


def test_check_command_exits_78_on_missing_file_and_syntax_errors(tmp_path):
    assert run_check(tmp_path / "absent.yaml").returncode == 78
    bad = write(tmp_path, "device_id: [\n")
    result = run_check(bad)
    assert result.returncode == 78 and f"{bad}:2: YAML syntax error" in result.stderr


def test_check_command_reads_env_files(tmp_path, model):
    text = EXAMPLE.read_text(encoding="utf-8").replace(EXAMPLE_MODEL, str(model))
    path = write(tmp_path, text)
    assert run_check(path).returncode == 78
    env_file = tmp_path / "yoloedge.env"
    env_file.write_text("# the service's EnvironmentFile\nCAM_GATE_PASSWORD='gate-secret'\n")
    result = run_check(path, "--env-file", str(env_file))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{path}: OK (6 cameras, 1 accelerator)"
