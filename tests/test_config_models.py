"""`models:` (issue 19): several named models in one config, which accelerator group loads which,
which camera goes to which; a single `model:` still loads as before; every mistake in them is
reported with its file:line, key path and the fix."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from yoloedge.config.errors import ConfigError
from yoloedge.config.model import ModelConfig
from yoloedge.config.schema import AcceleratorConfig, CameraConfig, Config

from test_config import errors, load, run_check, write

V8 = "yolov8n_coco_int8.onnx"  # 640x640, COCO-80 in its metadata
YOLOX = "yolox_nano_coco_416.onnx"  # 416x416, no metadata


@pytest.fixture
def linked(tmp_path, models) -> Path:
    """The shared models as `m/...` next to the config file: relative paths in the tests below."""
    os.symlink(models, tmp_path / "m")
    return tmp_path / "m"


def head(*extra: str) -> str:
    """Two models (lines 2-8): coco (given labels) and faces (given labels), then `extra` lines."""
    return ("device_id: edge-01\n"
            "models:\n"
            f"  - name: coco\n    path: m/{V8}\n    labels: [person, car]\n"
            f"  - name: faces\n    path: m/{YOLOX}\n    labels: [face]\n" + "".join(extra))


# -- good files --------------------------------------------------------------------------------

def test_models_list_loads_every_key_per_model_with_relative_paths_resolved(tmp_path, linked):
    path = write(tmp_path, f"""
        device_id: edge-01
        models:
          - name: coco
            path: m/{V8}
            conf: 0.3
            classes: [person, 2]
          - path: m/{YOLOX}
            format: yolox
            imgsz: 416
            agnostic_nms: true
        """)
    config = load(path)
    assert [m.name for m in config.models] == ["coco", "yolox_nano_coco_416"]
    coco, yolox = config.models
    assert coco.path == str(tmp_path / "m" / V8) and yolox.path == str(tmp_path / "m" / YOLOX)
    assert (coco.conf, coco.classes, coco.format) == (0.3, ("person", 2), None)
    assert (yolox.conf, yolox.format, yolox.imgsz, yolox.agnostic_nms) == (0.25, "yolox", (416, 416), True)
    assert config.model is coco  # single-model tools use the first
    # no models: anywhere: the default group loads both, and a camera-less config has nothing else
    assert config.group_models("onnxruntime0") == (coco, yolox)


def test_single_model_is_todays_config_with_models_holding_it(tmp_path, models):
    path = write(tmp_path, f"device_id: edge-01\nmodel:\n  path: {models / V8}\n  conf: 0.4\n"
                           "cameras:\n  - {name: gate, url: rtsp://h/s}\n")
    config = load(path)
    expected = Config(device_id="edge-01", model=ModelConfig(path=str(models / V8), conf=0.4),
                      accelerators=(AcceleratorConfig(name="onnxruntime0"),),
                      cameras=(CameraConfig(name="gate", url="rtsp://h/s"),), source=str(path), control=config.control)
    assert config == expected
    assert config.models == (config.model,)
    assert config.model.name == "yolov8n_coco_int8"
    assert config.camera_models(config.cameras[0]) == (config.model,)


def test_a_single_model_may_be_named_and_referred_to(tmp_path, models):
    path = write(tmp_path, f"device_id: e\nmodel:\n  name: coco\n  path: {models / V8}\n"
                           "accelerators:\n  - {name: cpu, models: [coco]}\n"
                           "cameras:\n  - {name: gate, url: rtsp://h/s, models: [coco]}\n")
    config = load(path)
    assert config.model.name == "coco" and config.models == (config.model,)
    assert config.camera_models(config.cameras[0]) == (config.model,)


def test_defaults_every_model_per_group_and_the_groups_models_per_camera(tmp_path, linked):
    path = write(tmp_path, head("accelerators:\n  - name: a\n    models: [faces]\n  - name: b\n"
                                "cameras:\n  - {name: door, url: rtsp://h/1}\n"
                                "  - {name: yard, url: rtsp://h/2, accelerator: b}\n"))
    config = load(path)
    coco, faces = config.models
    assert config.accelerators[0].models == ("faces",) and config.accelerators[1].models is None
    assert config.group_models("a") == (faces,)
    assert config.group_models("b") == (coco, faces)  # no models: every model
    door, yard = config.cameras
    assert door.models is None and yard.models is None
    assert config.camera_models(door) == (faces,)  # its group's (the first accelerator)
    assert config.camera_models(yard) == (coco, faces)


def test_two_groups_with_their_own_models_and_cameras_routed_to_each(tmp_path, linked):
    path = write(tmp_path, head("accelerators:\n"
                                "  - name: big\n    models: [faces, coco]\n"
                                "  - name: small\n    models: [coco]\n"
                                "cameras:\n"
                                "  - {name: door, url: rtsp://h/1, accelerator: big, models: [faces, coco]}\n"
                                "  - {name: hall, url: rtsp://h/2, accelerator: big, models: [faces]}\n"
                                "  - {name: yard, url: rtsp://h/3, accelerator: small}\n"))
    config = load(path)
    coco, faces = config.models
    assert config.group_models("big") == (coco, faces)  # `models:` order, not the list's
    assert config.group_models("small") == (coco,)
    door, hall, yard = config.cameras
    assert door.models == ("faces", "coco") and config.camera_models(door) == (coco, faces)
    assert config.camera_models(hall) == (faces,)
    assert config.camera_models(yard) == (coco,)


def test_camera_classes_may_be_labels_of_any_model_it_gets(tmp_path, linked):
    path = write(tmp_path, head("cameras:\n  - name: door\n    url: rtsp://h/1\n    classes: [face, person]\n"
                                "    zones:\n      - name: z\n        polygon: [[0, 0], [1, 0], [1, 1]]\n"
                                "        objects: [face]\n"))
    camera = load(path).cameras[0]
    assert camera.classes == ("face", "person") and camera.zones[0].objects == ("face",)


def test_labels_are_not_judged_when_a_model_of_the_camera_has_them_only_in_its_file(tmp_path, linked):
    text = head("cameras:\n  - {name: door, url: rtsp://h/1, classes: [bus]}\n").replace("    labels: [face]\n", "")
    assert load(write(tmp_path, text)).cameras[0].classes == ("bus",)


def test_check_command_accepts_a_models_file(tmp_path, linked):
    path = write(tmp_path, head("cameras:\n  - {name: door, url: rtsp://h/1, models: [faces]}\n"))
    result = run_check(path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{path}: OK (1 camera, 1 accelerator)"


# -- bad files: one problem each, with its line, key path and message ---------------------------

BAD = [
    # id, text after head() (which ends at line 8), line, key path, message fragment
    ("accelerator-models-empty", "accelerators:\n  - name: a\n    models: []\n", 11, "accelerators[0].models",
     "[] is not allowed: must not be empty (leave it out for every model)"),
    ("accelerator-models-unknown", "accelerators:\n  - name: a\n    models: [coco, facez]\n", 11,
     "accelerators[0].models[1]", "'facez' is not allowed: names no model; defined: coco, faces "
                                  "(did you mean 'faces'?)"),
    ("accelerator-models-twice", "accelerators:\n  - name: a\n    models:\n      - coco\n      - coco\n", 13,
     "accelerators[0].models[1]", "'coco' is not allowed: is listed twice (first at line 12)"),
    ("accelerator-models-not-a-list", "accelerators:\n  - name: a\n    models: coco\n", 11, "accelerators[0].models",
     "must be a list of model names"),
    ("camera-models-unknown", "cameras:\n  - name: door\n    url: rtsp://h/1\n    models: [cocoa]\n", 12,
     "cameras[0].models[0]", "'cocoa' is not allowed: names no model; defined: coco, faces (did you mean 'coco'?)"),
    ("camera-models-empty", "cameras:\n  - name: door\n    url: rtsp://h/1\n    models: []\n", 12,
     "cameras[0].models", "must not be empty (leave it out for every model its accelerator loads)"),
    ("camera-model-its-group-does-not-load",
     "accelerators:\n  - name: a\n    models: [coco]\ncameras:\n  - name: door\n    url: rtsp://h/1\n"
     "    models: [faces]\n", 15, "cameras[0].models[0]",
     "'faces' is not allowed: is not loaded by this camera's accelerator a (its models: coco) (add faces to that "
     "accelerator's models: (accelerators[0].models)"),
    ("camera-model-its-named-group-does-not-load",
     "accelerators:\n  - name: a\n  - name: b\n    models: [faces]\ncameras:\n  - name: door\n    url: rtsp://h/1\n"
     "    accelerator: b\n    models: [coco]\n", 17, "cameras[0].models[0]",
     "is not loaded by this camera's accelerator b (its models: faces) (add coco to that accelerator's models: "
     "(accelerators[1].models)"),
    ("camera-class-no-model-of-it-has",
     "cameras:\n  - name: door\n    url: rtsp://h/1\n    models: [faces]\n    classes: [person]\n", 13,
     "cameras[0].classes[0]", "'person' is not allowed: is not one of the labels of this camera's models "
                              "(faces: models[1].labels), so the camera would never publish it"),
    ("zone-object-no-model-of-it-has",
     "cameras:\n  - name: door\n    url: rtsp://h/1\n    models: [coco]\n    zones:\n      - name: z\n"
     "        polygon: [[0, 0], [1, 0], [1, 1]]\n        objects: [fac]\n", 16,
     "cameras[0].zones[0].objects[0]", "'fac' is not allowed: is not one of the labels of this camera's models "
                                       "(coco: models[0].labels)"),
    ("onnx-model-in-an-ascend-group", "accelerators:\n  - name: npu\n    backend: ascend\n    models: [faces]\n", 11,
     "accelerators[0].backend", "backend ascend runs .om files, but models[1].path (model faces) is a .onnx file "
                                "(for onnxruntime, simulated); convert the model with `yoloedge convert atc` and "
                                "point models[1].path at the .om"),
]


@pytest.mark.parametrize("text, line, key_path, fragment", [case[1:] for case in BAD], ids=[case[0] for case in BAD])
def test_bad_reference_is_reported_with_its_line(tmp_path, linked, text, line, key_path, fragment):
    path = write(tmp_path, head(text))
    err = errors(path)
    assert len(err.issues) == 1, str(err)
    assert str(err).startswith(f"{path}:{line}: {key_path}: "), str(err)
    assert fragment in str(err), str(err)


MODEL_BAD = [
    # id, the whole models: section (from line 2), line, key path, message fragment
    ("empty-list", "models: []\n", 2, "models", "[] is not allowed: must list at least one model"),
    ("not-a-list", f"models:\n  path: m/{V8}\n", 2, "models", "a mapping is not allowed: must be a list of models"),
    ("name-with-slash", f"models:\n  - name: coco/v8\n    path: m/{V8}\n", 3, "models[0].name",
     "'coco/v8' is not allowed: must not contain '/', '+', '#', spaces"),
    ("name-too-long", f"models:\n  - name: {'n' * 129}\n    path: m/{V8}\n", 3, "models[0].name",
     "is longer than 128 bytes"),
    ("name-a-number", f"models:\n  - name: 7\n    path: m/{V8}\n", 3, "models[0].name",
     "7 is not allowed: must be a string (put it in quotes)"),
    ("duplicate-name", f"models:\n  - name: coco\n    path: m/{V8}\n  - name: coco\n    path: m/{YOLOX}\n", 5,
     "models[1].name", "duplicate model name 'coco' (first used at line 3); names must be unique "
                       "(give each model its own name:)"),
    ("duplicate-stem", f"models:\n  - path: m/{V8}\n  - path: ./m/{V8}\n    conf: 0.5\n", 4, "models[1]",
     "duplicate model name 'yolov8n_coco_int8' (first used at line 3); names must be unique (a model without "
     "name: is named after its file's stem; give one of them a name:)"),
    ("stem-against-a-name", f"models:\n  - name: yolox_nano_coco_416\n    path: m/{V8}\n  - path: m/{YOLOX}\n", 5,
     "models[1]", "duplicate model name 'yolox_nano_coco_416' (first used at line 3)"),
    ("missing-path", "models:\n  - name: coco\n", 3, "models[0].path", "required key is missing"),
    ("unknown-model-key", f"models:\n  - name: coco\n    path: m/{V8}\n    cnof: 0.3\n", 5, "models[0].cnof",
     "unknown key (did you mean 'conf'?)"),
    ("bad-model-value", f"models:\n  - name: coco\n    path: m/{V8}\n  - name: faces\n    path: m/{YOLOX}\n"
                        "    iou: 2\n", 7, "models[1].iou", "2 is not allowed: must be a number from 0 to 1"),
    ("file-not-found", "models:\n  - name: coco\n    path: m/nowhere.onnx\n", 4, "models[0].path", "file not found: "),
    ("both-forms-model-first", f"model:\n  path: m/{V8}\nmodels:\n  - path: m/{YOLOX}\n", 4, "models",
     "model: and models: are both given (model: at line 2); a config gives one model (model:) or a list of named "
     "models (models:) (keep models: and move the model: mapping into it"),
    ("both-forms-models-first", f"models:\n  - path: m/{YOLOX}\nmodel:\n  path: m/{V8}\n", 4, "model",
     "model: and models: are both given (models: at line 2)"),
    ("neither", "cameras: []\n", 1, "model",
     "required key is missing: a config needs model: (one model) or models: (a list of named models)"),
]


@pytest.mark.parametrize("text, line, key_path, fragment", [case[1:] for case in MODEL_BAD],
                         ids=[case[0] for case in MODEL_BAD])
def test_bad_models_section_is_reported_with_its_line(tmp_path, linked, text, line, key_path, fragment):
    path = write(tmp_path, "device_id: edge-01\n" + text)
    err = errors(path)
    assert len(err.issues) == 1, str(err)
    assert str(err).startswith(f"{path}:{line}: {key_path}: "), str(err)
    assert fragment in str(err), str(err)


def test_a_reference_to_a_model_with_other_problems_is_not_called_unknown(tmp_path, linked):
    """The bad `iou` is the one problem: `faces` is still a model the camera may name."""
    text = head("cameras:\n  - {name: door, url: rtsp://h/1, models: [faces]}\n").replace(
        "    labels: [face]\n", "    labels: [face]\n    iou: 2\n")
    err = errors(write(tmp_path, text))
    assert [(issue.line, issue.key_path) for issue in err.issues] == [(9, "models[1].iou")], str(err)


def test_every_problem_of_a_file_is_reported_at_once(tmp_path, linked):
    text = head("accelerators:\n"
                "  - name: a\n    models: [coco, cocco]\n"  # 10-11
                "  - name: npu\n    backend: ascend\n    models: [coco]\n"  # 12-14
                "cameras:\n"
                "  - {name: door, url: rtsp://h/1, models: [face]}\n"  # 16
                "  - {name: yard, url: rtsp://h/2, accelerator: npu, models: [faces]}\n"  # 17
                "  - {name: hall, url: rtsp://h/3, classes: [persn]}\n")  # 18
    err = errors(write(tmp_path, text))
    found = [(issue.line, issue.key_path) for issue in err.issues]
    assert found == [(11, "accelerators[0].models[1]"), (13, "accelerators[1].backend"),
                     (16, "cameras[0].models[0]"), (17, "cameras[1].models[0]"), (18, "cameras[2].classes[0]")], str(err)
    assert "'face' is not allowed: names no model; defined: coco, faces (did you mean 'faces'?)" in str(err)
    assert "is not loaded by this camera's accelerator npu (its models: coco)" in str(err)
    assert "but models[0].path (model coco) is a .onnx file" in str(err)


def test_a_group_is_checked_only_against_the_models_it_loads(tmp_path, linked):
    """An `.om` for the Ascend group, the ONNX models for the CPU group: valid."""
    om = tmp_path / "coco.om"
    om.write_bytes(b"an offline model: the loader never opens it")
    text = head("  - name: coco_npu\n    path: coco.om\n",
                "accelerators:\n  - name: npu\n    backend: ascend\n    models: [coco_npu]\n"
                "  - name: cpu\n    models: [coco, faces]\n"
                "cameras:\n  - {name: door, url: rtsp://h/1, accelerator: npu}\n")
    config = load(write(tmp_path, text))
    assert [m.name for m in config.group_models("npu")] == ["coco_npu"]
    assert config.camera_models(config.cameras[0]) == config.group_models("npu")
    every = head("  - name: coco_npu\n    path: coco.om\n", "accelerators:\n  - name: npu\n    backend: ascend\n")
    err = errors(write(tmp_path, every))
    assert [(issue.line, issue.key_path) for issue in err.issues] == [(13, "accelerators[0].backend")] * 2, str(err)
    assert "models[0].path (model coco)" in str(err) and "models[1].path (model faces)" in str(err)


def test_check_command_exits_78_on_a_camera_routed_to_a_model_its_group_does_not_load(tmp_path, linked):
    path = write(tmp_path, head("accelerators:\n  - {name: a, models: [coco]}\n"
                                "cameras:\n  - {name: door, url: rtsp://h/1, models: [faces]}\n"))
    result = run_check(path)
    assert result.returncode == 78
    assert result.stderr.startswith(f"{path}:12: cameras[0].models[0]: 'faces' is not allowed: is not loaded by "
                                    f"this camera's accelerator a"), result.stderr


# -- Config built in code ----------------------------------------------------------------------

def test_group_and_camera_models_of_a_config_built_in_code():
    coco, faces = ModelConfig("/m/coco.onnx"), ModelConfig("/m/faces.onnx", name="faces")
    config = Config(device_id="e", model=coco, models=(coco, faces),
                    accelerators=(AcceleratorConfig(), AcceleratorConfig(backend="simulated", models=("faces",))))
    assert coco.name == "coco"
    # unnamed groups answer to the name the daemon gives them
    assert config.group_models("onnxruntime0") == (coco, faces)
    assert config.group_models("simulated1") == (faces,)
    assert config.camera_models(CameraConfig(name="a", url="x")) == (coco, faces)
    assert config.camera_models(CameraConfig(name="b", url="x", models=("faces",))) == (faces,)
    assert config.camera_models(CameraConfig(name="c", url="x", accelerator="simulated1")) == (faces,)
    with pytest.raises(KeyError, match="no accelerator named 'gpu'"):
        config.group_models("gpu")
    with pytest.raises(KeyError, match="camera 'd' names models accelerator 'simulated1' does not load: coco"):
        config.camera_models(CameraConfig(name="d", url="x", accelerator="simulated1", models=("coco",)))
    broken = dataclasses.replace(config, accelerators=(AcceleratorConfig(name="a", models=("ocr",)),))
    with pytest.raises(KeyError, match="names models that are not configured: ocr"):
        broken.group_models("a")


def test_a_camera_of_a_config_without_accelerators_gets_no_model():
    config = Config(device_id="e", model=ModelConfig("/m/coco.onnx"), accelerators=())
    assert config.camera_models(CameraConfig(name="a", url="x")) == ()
    with pytest.raises(KeyError, match="no accelerator named 'cpu'"):
        config.camera_models(CameraConfig(name="a", url="x", accelerator="cpu"))


def test_a_config_built_with_one_model_has_it_as_its_models():
    model = ModelConfig("/m/yolo11n 320.onnx")
    config = Config(device_id="e", model=model, accelerators=(AcceleratorConfig(name="cpu"),))
    assert config.models == (model,) and model.name == "yolo11n_320"
    assert config.group_models("cpu") == (model,)


def test_errors_are_config_errors_with_exit_78(tmp_path, linked):
    err = errors(write(tmp_path, "device_id: e\n"))
    assert isinstance(err, ConfigError) and err.exit_code == 78


def test_the_documented_example_loads_and_routes_as_documented(tmp_path):
    """The `models:` example of docs/configuration.md, with its model files made here."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "configuration.md").read_text(encoding="utf-8")
    example = text.split("```yaml\nmodels:\n", 1)[1].split("```", 1)[0]
    for stem in ("yolo11n_320", "yolo11n_face"):
        (tmp_path / f"{stem}.om").write_bytes(b"an offline model: the loader never opens it")
    example = example.replace("/opt/models/", f"{tmp_path}/")
    config = load(write(tmp_path, "device_id: edge-01\nmodels:\n" + example))
    coco, faces = config.models
    assert (coco.name, coco.conf, faces.name) == ("coco", 0.3, "faces")
    assert config.group_models("npu") == (coco, faces)
    door, yard = config.cameras
    assert config.camera_models(door) == (coco, faces) and config.camera_models(yard) == (coco,)
