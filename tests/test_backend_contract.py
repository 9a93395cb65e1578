"""One backend catalogue, and the `Backend` contract the pipeline relies on.

The catalogue (`yoloedge.config.catalogue`) is the only list of backends: the schema, `check`,
the workers, `yoloedge detect --backend` and the README must all agree with it. The contract is
held by running the real pipeline on `ContractBackend` (tests/fakes/contract_backend.py), which
subclasses `Backend` directly and refuses everything the contract forbids.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import subprocess
import sys
import threading
from collections import defaultdict
from pathlib import Path

import cv2
import pytest

FAKES = Path(__file__).resolve().parent / "fakes"
if str(FAKES) not in sys.path:
    sys.path.insert(0, str(FAKES))

from contract_backend import ContractBackend, ContractViolation  # noqa: E402
from daemon_harness import REPO, status, write_config  # noqa: E402
from parity import mismatches  # noqa: E402
from test_daemon import base_config, detections_by_frame, notify, start_daemon  # noqa: E402,F401  (fixtures)
from yoloedge.backends import backend_config_for, create_backend  # noqa: E402
from yoloedge.backends.base import Backend  # noqa: E402
from yoloedge.backends.onnxruntime import OnnxRuntimeBackend  # noqa: E402
from yoloedge.config import BACKENDS, ModelConfig, OnnxRuntimeConfig  # noqa: E402
from yoloedge.config.accelerators import ALL_KEYS  # noqa: E402
from yoloedge.config.catalogue import CATALOGUE  # noqa: E402
from yoloedge.config.loader import load_config  # noqa: E402
from yoloedge.pipeline.detector import Detector  # noqa: E402
from yoloedge.errors import BackendUnavailableError  # noqa: E402


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    from onnx_models import make_fixed_batch_v8_model

    return make_fixed_batch_v8_model(tmp_path_factory.mktemp("tiny") / "tiny.onnx", size=64)


# -- the catalogue ---------------------------------------------------------------------------------


def test_the_schema_accepts_exactly_the_catalogued_backends():
    assert BACKENDS == tuple(CATALOGUE)
    assert set(CATALOGUE) >= {"onnxruntime", "ascend", "tensorrt", "simulated"}
    for entry in CATALOGUE.values():
        assert entry.name and entry.summary and entry.install and entry.model_suffixes
        assert importlib.util.find_spec(entry.module) is not None, f"{entry.name}: no module {entry.module}"
        assert set(entry.settings_keys) <= set(ALL_KEYS)


def test_every_catalogued_backend_is_a_backend_subclass():
    # tests/fakes provides `acl`, `tensorrt` and `cuda.bindings` where the real ones are absent.
    for entry in CATALOGUE.values():
        module = importlib.import_module(entry.module)
        cls = getattr(module, entry.class_name)
        assert issubclass(cls, Backend), entry.name
        assert cls.name == entry.name, f"{cls.__name__}.name is {cls.name!r}, catalogued as {entry.name!r}"


@pytest.mark.parametrize("name", list(CATALOGUE))
def test_every_backend_name_validates_and_gets_per_device_settings(tmp_path, name):
    entry = CATALOGUE[name]
    model = tmp_path / f"model{entry.model_suffixes[0]}"
    model.write_bytes(b"never opened by the loader")
    path = tmp_path / "yoloedge.yaml"
    path.write_text(f"device_id: edge\nmodel: {{path: {model}}}\naccelerators:\n  - backend: {name}\n"
                    f"    devices: [3]\n")
    accelerator = load_config(str(path), {}).accelerators[0]
    settings = backend_config_for(accelerator, 3)
    assert getattr(settings, "device_id") == 3


def test_an_unknown_backend_names_the_catalogue():
    with pytest.raises(BackendUnavailableError) as err:
        create_backend("tensorrtx", "m.engine")
    assert ", ".join(CATALOGUE) in str(err.value)


def test_a_custom_backend_must_subclass_backend():
    with pytest.raises(BackendUnavailableError, match="is not a subclass of yoloedge.backends.base.Backend"):
        create_backend("contract_backend:ContractViolation", "m.onnx")


def test_check_notes_a_backend_whose_runtime_is_not_installed(tmp_path):
    model = tmp_path / "yolov8n.engine"
    model.write_bytes(b"x")
    path = tmp_path / "yoloedge.yaml"
    path.write_text(f"device_id: edge\nmodel: {{path: {model}}}\naccelerators:\n"
                    f"  - {{backend: tensorrt, name: gpu}}\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}  # without tests/fakes on the path
    real = subprocess.run([sys.executable, "-c", "import importlib.util as u; print(u.find_spec('tensorrt'))"],
                          env=env, capture_output=True, text=True, timeout=60)
    if real.stdout.strip() != "None":
        pytest.skip("a real TensorRT is installed here")
    result = subprocess.run([sys.executable, "-m", "yoloedge", "check", "-c", str(path)], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "OK (0 cameras, 1 accelerator)" in result.stdout
    assert "note: accelerator gpu (backend tensorrt): the module 'tensorrt' is not installed here" in result.stderr
    assert CATALOGUE["tensorrt"].install in result.stderr


def test_check_says_nothing_when_the_runtime_is_there(tmp_path, tiny_model):
    path = tmp_path / "yoloedge.yaml"
    path.write_text(f"device_id: edge\nmodel: {{path: {tiny_model}}}\n")
    result = subprocess.run([sys.executable, "-m", "yoloedge", "check", "-c", str(path)], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stderr == "", result.stderr


def test_detect_offers_the_catalogued_backends():
    result = subprocess.run([sys.executable, "-m", "yoloedge", "detect", "--help"], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    assert "{" + ",".join(CATALOGUE) + "}" in result.stdout.replace("\n", "").replace(" ", "")
    refused = subprocess.run([sys.executable, "-m", "yoloedge", "detect", "--backend", "tensorrt", "--provider",
                              "cuda", "-m", "m.engine", "x.jpg"], cwd=REPO, capture_output=True, text=True,
                             timeout=60)
    assert refused.returncode == 2
    assert "--provider applies only to --backend onnxruntime" in refused.stderr


def test_the_readme_lists_every_backend():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    for entry in CATALOGUE.values():
        row = f"| `{entry.name}` | {entry.summary} |"
        assert row in readme, f"README backend table lacks: {row}"


# -- the contract, on a backend that subclasses Backend directly ------------------------------------


@pytest.mark.shared
def test_a_direct_backend_subclass_detects_what_onnxruntime_does(models, media):
    model = str(models / "yolov8n_coco_int8.onnx")
    images = [cv2.imread(str(media / "bus.jpg")), cv2.imread(str(media / "zidane.jpg"))]
    ok, frame = cv2.VideoCapture(str(media / "indoor_people_480p_mpeg4.avi")).read()
    assert ok and all(image is not None for image in images)
    images.append(frame)
    config = ModelConfig(path=model)
    ours = Detector(config, ContractBackend(model, {}), max_batch=2, input_sets=2, output_sets=3)
    reference = Detector(config, OnnxRuntimeBackend(model, OnnxRuntimeConfig()), max_batch=2)
    try:
        for image in images:
            got = ours.detect([image])[0].to_dicts(ours.labels)
            want = reference.detect([image])[0].to_dicts(reference.labels)
            assert got, "the photos have people in them"
            assert not mismatches(got, want), mismatches(got, want)
    finally:
        ours.close()
        reference.close()
    assert [e["event"] for e in ours.backend.journal].count("violation") == 0


def test_the_contract_backend_refuses_what_the_contract_forbids(tiny_model):
    backend = ContractBackend(str(tiny_model), {})
    with pytest.raises(ContractViolation):
        backend.run(1)
    backend.open(2, input_sets=2, output_sets=2)
    with pytest.raises(ContractViolation, match="outside 1..max_batch"):
        backend.run(3)
    with pytest.raises(ContractViolation, match="input set 2"):
        backend.run(1, input_set=2)
    errors: list[BaseException] = []

    def elsewhere() -> None:
        try:
            backend.run(1)
        except ContractViolation as exc:
            errors.append(exc)

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert errors and "opened on" in str(errors[0])
    with pytest.raises(ContractViolation, match="open again"):
        backend.open(4)
    backend.close()
    backend.close()
    with pytest.raises(ContractViolation):
        backend.run(1)


@pytest.mark.shared
def test_the_daemon_holds_to_the_contract(tmp_path, models, media, references, mosquitto, subscriber,
                                          start_daemon, notify):
    journal = tmp_path / "journal.jsonl"
    video = media / "indoor_people_480p_mpeg4.avi"
    config = base_config(tmp_path, models, mosquitto, [{"name": "door", "url": str(video), "realtime": False}])
    config["accelerators"] = [{"backend": "contract_backend:ContractBackend", "devices": [0, 1], "batch": 2,
                               "input_buffers": 2, "options": {"journal": str(journal)}}]
    daemon, _ = start_daemon(config)
    notify.wait_for("READY", "1", timeout=60)
    assert subscriber.wait_for(lambda ms: len(detections_by_frame(subscriber, "door")) >= 84, 120), daemon.log
    devices = status(config["control"]["socket"])["accelerators"]
    assert sorted(d["telemetry"]["contract_runs"] > 0 for d in devices) == [True, True], devices
    assert daemon.stop() == 0, daemon.log[-4000:]

    door = detections_by_frame(subscriber, "door")
    assert sorted(door) == list(range(84)) and all(len(m) == 1 for m in door.values())
    ref = json.loads((references / "yolov8n_coco_int8__indoor_people_480p_mpeg4__conf25_iou45.json").read_text())
    for frame in ref["frames"]:
        assert not mismatches(door[frame["index"]][0]["detections"], frame["detections"]), frame["index"]

    events = [json.loads(line) for line in journal.read_text().splitlines()]
    assert not [e for e in events if e["event"] == "violation"], events
    by_instance = defaultdict(list)
    for e in events:
        by_instance[e["id"]].append(e)
    assert len(by_instance) == 2, "one backend per device, opened once"
    for calls in by_instance.values():
        kinds = [e["event"] for e in calls]
        assert kinds[0] == "open" and kinds.count("open") == 1
        assert kinds[-1] == "close" and calls[-1]["first"], "closed last"
        assert calls[0]["input_sets"] >= 2, "at least two input sets, so one fills while one runs"
        assert len({e["thread"] for e in calls}) == 1, "every device call on the thread that opened it"
    # Each device's first run is its warm-up, before READY; the others carry the 84 frames.
    runs = [e for calls in by_instance.values() for e in [c for c in calls if c["event"] == "run"][1:]]
    assert sum(e["n"] for e in runs) == 84
    assert {e["input_set"] for e in runs} == {0, 1}, "the pipeline double-buffers"


@pytest.mark.shared
def test_detect_runs_a_catalogued_backend_by_name(tmp_path, models, media):
    """`yoloedge detect --backend tensorrt` on a (fake) engine prints what ONNX Runtime prints."""
    from tensorrt import _fake

    onnx = models / "yolov8n_coco_int8.onnx"
    engine = _fake.write_engine(tmp_path / "yolov8n.engine", onnx, batch=1)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{FAKES}:{REPO}"}
    runs = {}
    for backend, model in (("onnxruntime", onnx), ("tensorrt", engine)):
        result = subprocess.run([sys.executable, "-m", "yoloedge", "detect", "--json", "--backend", backend,
                                 "-m", str(model), str(media / "bus.jpg")], cwd=REPO, env=env,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        runs[backend] = json.loads(result.stdout)["detections"]
    assert runs["onnxruntime"], "the bus photo has people and a bus"
    assert not mismatches(runs["tensorrt"], runs["onnxruntime"])
