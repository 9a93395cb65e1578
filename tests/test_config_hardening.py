"""Files that must be refused as configuration errors (exit 78, file:line), never crash a command:
TLS material that is not what it claims, YAML bombs, control characters, and bad model metadata."""

from __future__ import annotations

import resource
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path

import onnx
import pytest

from yoloedge.config.errors import EX_CONFIG, ConfigError
from yoloedge.config.loader import MAX_CONFIG_BYTES, load_config
from yoloedge.config.schema import TlsConfig
from yoloedge.config.tls import TlsMaterialError, client_context
from yoloedge.config.yamltree import MAX_ALIAS_VALUES, MAX_DEPTH
from yoloedge.errors import ModelError
from yoloedge.model.spec import parse_metadata

from conftest import REPO
from tls_files import TlsFiles, make_tls_files

SECRET = "s3cr3t-pw"


@pytest.fixture
def model(tmp_path) -> Path:
    path = tmp_path / "model.onnx"
    path.write_bytes(b"the loader never opens the model")
    return path


@pytest.fixture(scope="module")
def tls(tmp_path_factory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "yoloedge.yaml"
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def refused(path: Path, environ: dict | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(str(path), environ or {})
    return info.value


def check_cli(path: Path, timeout: float = 60, memory_bytes: int | None = None) -> subprocess.CompletedProcess:
    """`yoloedge check` as a separate process (stdin closed: nothing may prompt), optionally
    with its address space capped so that a memory bomb fails the test instead of the machine."""
    def cap() -> None:
        if memory_bytes:
            resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    return subprocess.run([sys.executable, "-m", "yoloedge", "check", "-c", str(path)], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                          preexec_fn=cap)


# -- TLS material ------------------------------------------------------------------------------

def _tls_yaml(model: Path, **tls: Path) -> str:
    lines = "".join(f"    {key}: {value}\n" for key, value in tls.items())
    return f"device_id: e\nmodel: {{path: {model}}}\nmqtt:\n  tls:\n{lines}"


BAD_TLS = [
    # (case, {tls key: TlsFiles attribute}, the key reported, words the message must hold)
    ("der-ca", {"ca_certs": "der"}, "ca_certs", "no PEM certificate"),
    ("empty-ca", {"ca_certs": "empty"}, "ca_certs", "no PEM certificate"),
    ("key-as-ca", {"ca_certs": "key"}, "ca_certs", "no PEM certificate"),
    ("cert-without-key", {"certfile": "cert"}, "certfile", "no private key"),
    ("der-cert", {"certfile": "der", "keyfile": "key"}, "certfile", "no PEM certificate"),
    ("empty-key", {"certfile": "cert", "keyfile": "empty"}, "keyfile", "no PEM private key"),
    ("cert-as-key", {"certfile": "cert", "keyfile": "cert"}, "keyfile", "no PEM private key"),
    ("foreign-key", {"certfile": "cert", "keyfile": "other_key"}, "keyfile", "does not belong"),
    ("encrypted-key", {"certfile": "cert", "keyfile": "encrypted_key"}, "keyfile", "encrypted"),
]


@pytest.mark.parametrize("case, files, key, words", BAD_TLS, ids=[c[0] for c in BAD_TLS])
def test_tls_files_that_are_not_what_they_claim_are_config_errors(tmp_path, model, tls, case, files, key, words):
    path = write(tmp_path, _tls_yaml(model, **{k: getattr(tls, v) for k, v in files.items()}))
    issues = refused(path).issues
    assert len(issues) == 1, issues
    issue = issues[0]
    line = 4 + list(files).index(key) + 1
    assert (issue.line, issue.key_path) == (line, f"mqtt.tls.{key}"), issue
    assert words in issue.message


def test_check_exits_78_on_bad_tls_material_without_prompting(tmp_path, model, tls):
    """An encrypted key would make OpenSSL ask for its passphrase on the terminal."""
    for files, where in (({"ca_certs": tls.der}, "yoloedge.yaml:5: mqtt.tls.ca_certs"),
                         ({"certfile": tls.cert, "keyfile": tls.encrypted_key}, "yoloedge.yaml:6: mqtt.tls.keyfile")):
        result = check_cli(write(tmp_path, _tls_yaml(model, **files)))
        assert result.returncode == EX_CONFIG, result.stderr
        assert where in result.stderr and "Traceback" not in result.stderr


def test_good_tls_material_loads_and_gives_the_clients_context(tmp_path, model, tls):
    config = load_config(str(write(tmp_path, _tls_yaml(model, ca_certs=tls.cert, certfile=tls.cert,
                                                           keyfile=tls.key))), {})
    context = client_context(config.mqtt.tls)
    assert context.cert_store_stats()["x509_ca"] == 1 and context.check_hostname
    combined = load_config(str(write(tmp_path, _tls_yaml(model, certfile=tls.cert_and_key))), {})
    assert combined.mqtt.tls == TlsConfig(certfile=str(tls.cert_and_key))
    assert not client_context(TlsConfig(insecure=True)).check_hostname


def test_tls_error_names_the_key(tls):
    with pytest.raises(TlsMaterialError) as info:
        client_context(TlsConfig(ca_certs=str(tls.cert), certfile=str(tls.cert), keyfile=str(tls.der)))
    assert info.value.key == "keyfile"


# -- YAML bombs --------------------------------------------------------------------------------

def alias_bomb(levels: int = 9, width: int = 9) -> str:
    """"Billion laughs": each anchor repeats the one before `width` times (width**levels values)."""
    lines = ["a0: &a0 [" + ", ".join(["lol"] * width) + "]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def merge_chain(length: int) -> str:
    lines = ["m0: &m0 {k0: 0}"] + [f"m{i}: &m{i} {{<<: [*m{i - 1}, *m{i - 1}], k{i}: {i}}}" for i in range(1, length)]
    return "\n".join(lines) + "\n"


BOMBS = [
    ("alias-bomb", lambda: alias_bomb(), f"more than {MAX_ALIAS_VALUES} values"),
    ("alias-bomb-in-a-key", lambda: alias_bomb().replace("a9:", "device_id:"), f"more than {MAX_ALIAS_VALUES}"),
    ("block-nesting", lambda: "".join(" " * i + "a:\n" for i in range(1000)), f"more than {MAX_DEPTH} levels"),
    ("block-list-nesting", lambda: "a:\n" + "  - " * 5000 + "x\n", f"more than {MAX_DEPTH} levels"),
    ("flow-nesting", lambda: "a: " + "[" * 5000 + "]" * 5000 + "\n", f"more than {MAX_DEPTH} levels"),
    ("flow-mapping-nesting", lambda: "a: " + "{b: " * 5000 + "1" + "}" * 5000 + "\n", f"more than {MAX_DEPTH}"),
    ("alias-chain", lambda: "a0: &a0 [1]\n" + "".join(f"a{i}: &a{i} [*a{i - 1}]\n" for i in range(1, 3000)),
     f"more than {MAX_DEPTH} levels"),
    ("merge-chain", lambda: merge_chain(3000), "more than"),
]


@pytest.mark.parametrize("case, text, words", BOMBS, ids=[b[0] for b in BOMBS])
def test_yaml_bombs_are_refused_in_bounded_memory(tmp_path, case, text, words):
    path = tmp_path / "yoloedge.yaml"
    path.write_text(text())
    tracemalloc.start()
    try:
        error = refused(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert words in str(error) and str(error).startswith(f"{path}:"), error
    assert peak < 100 * 1024 * 1024, f"{peak / 1e6:.0f} MB"


def test_check_refuses_bombs_with_78(tmp_path):
    for text in (alias_bomb(), "a:\n" + "  - " * 5000 + "x\n"):
        path = write(tmp_path, text)
        result = check_cli(path, memory_bytes=2 * 1024 ** 3)
        assert result.returncode == EX_CONFIG, result.stderr[-2000:]
        assert "Traceback" not in result.stderr and str(path) in result.stderr


def test_a_file_over_the_size_limit_is_refused_unread(tmp_path):
    path = tmp_path / "yoloedge.yaml"
    path.write_bytes(b"# padding\n" * (MAX_CONFIG_BYTES // 10 + 1))
    assert "larger than 1 MiB" in str(refused(path))


def test_aliases_and_merges_within_the_limits_still_work(tmp_path, model):
    path = write(tmp_path, f"""
        device_id: e
        model: {{path: {model}}}
        cameras:
          - &a {{name: a, url: /srv/a.mp4, fps: 5, loop: true}}
          - &b {{<<: *a, name: b, url: /srv/b.mp4, fps: 2}}
          - {{<<: *b, name: c}}
        """)
    cameras = load_config(str(path), {}).cameras
    assert [(c.name, c.url, c.fps, c.loop) for c in cameras] == [
        ("a", "/srv/a.mp4", 5, True), ("b", "/srv/b.mp4", 2, True), ("c", "/srv/b.mp4", 2, True)]


# -- control characters ------------------------------------------------------------------------

CONTROL = [("\r", "\\r"), ("\n", "\\n"), ("\x00", "\\x00"), ("\t", "\\t"), ("\x1b", "\\x1b"), ("\x7f", "\\x7f"),
           ("\x85", "\\x85"), ("\x9b", "\\x9b"), ("\u2028", "\\u2028")]


@pytest.mark.parametrize("char, shown", CONTROL, ids=[c[1] for c in CONTROL])
@pytest.mark.parametrize("where", ["url", "host", "password", "env-url", "key"])
def test_control_characters_are_refused_everywhere_without_echoing_the_value(tmp_path, model, char, shown, where):
    environ = {}
    url = f"rtsp://admin:{SECRET}@cam/s"
    injected = f"{url}{char}X-Injected: 1"
    quoted = injected.encode("unicode_escape").decode().replace('"', '\\"')
    camera, mqtt, key_path = f'url: "{url}"', "", "cameras[0].url"
    if where == "url":
        camera = f'url: "{quoted}"'
    elif where == "env-url":
        camera, environ = 'url: "${CAM_URL}"', {"CAM_URL": injected}
    elif where == "host":
        mqtt, key_path = f'mqtt: {{host: "broker{quoted}"}}\n', "mqtt.host"
    elif where == "password":
        pw = f"{SECRET}{char}".encode("unicode_escape").decode()
        mqtt, key_path = f'mqtt: {{username: u, password: "{pw}"}}\n', "mqtt.password"
    elif where == "key":
        camera, key_path = f'"url{char.encode("unicode_escape").decode()}": "{url}"', "cameras[0]"
    path = write(tmp_path, f"device_id: e\nmodel: {{path: {model}}}\n{mqtt}cameras:\n  - {{name: a, {camera}}}\n")
    error = refused(path, environ)
    text = str(error)
    found = [i for i in error.issues if "control characters" in i.message]
    assert len(found) == 1, text
    assert found[0].key_path == key_path and f"found {shown} at position" in found[0].message, text
    assert found[0].line == (3 if where in ("host", "password") else 4 + bool(mqtt)), text
    assert SECRET not in text and "Injected" not in text


def test_the_position_of_the_control_character_is_given(tmp_path, model):
    path = write(tmp_path, f'device_id: e\nmodel: {{path: {model}}}\nmqtt: {{host: "abc\\r\\ndef"}}\n')
    assert "found \\r at position 4" in str(refused(path))


def test_huge_numbers_impossible_dates_and_mistagged_values_are_config_errors(tmp_path, model):
    path = write(tmp_path, f"device_id: e\nmodel: {{path: {model}}}\nshutdown_timeout_s: {'9' * 5000}\n"
                           f"health: {{stall_timeout_s: 1e999}}\nlogging: {{level: 2024-13-45}}\n"
                           f"mqtt: {{port: 9223372036854775808, host: !!timestamp x, qos: !!int \"\"}}\n")
    assert [(i.line, i.key_path) for i in refused(path).issues] == [
        (3, "shutdown_timeout_s"), (4, "health.stall_timeout_s"), (5, "logging.level"),
        (6, "mqtt.port"), (6, "mqtt.host"), (6, "mqtt.qos")]


# -- model metadata ----------------------------------------------------------------------------

BAD_METADATA = [
    ("stride", "1e999"), ("stride", "nan"), ("stride", "0"), ("stride", "[8, -16]"), ("stride", "'32'"),
    ("names", "{0: 'person', 1: "), ("names", "{-1: 'a'}"), ("names", "{10**9: 'a'}"), ("names", "{1000000000: 'a'}"),
    ("names", "'person'"), ("names", "{[]: 1}"), ("names", "[" * 500 + "]" * 500),
    ("imgsz", "[-1, 0]"), ("imgsz", "[640]"), ("imgsz", "10**9"), ("imgsz", "1e300"), ("imgsz", "[640.5, 640]"),
    ("imgsz", "9" * 5000), ("channels", "True"), ("channels", "1e999"), ("end2end", "'yes'"),
    ("task", "detect\r\nX"),
]


@pytest.mark.parametrize("key, value", BAD_METADATA)
def test_bad_metadata_values_are_model_errors_naming_file_and_key(key, value):
    with pytest.raises(ModelError) as info:
        parse_metadata({"task": "detect", key: value}, "/models/m.onnx")
    assert str(info.value).startswith(f"/models/m.onnx: bad model metadata {key} = "), info.value


def test_ultralytics_metadata_still_reads():
    meta = parse_metadata({"stride": "32", "imgsz": "[384, 640]", "names": "{0: 'person', 2: 'car'}",
                           "end2end": "False", "channels": "3", "task": "detect"}, "m.onnx")
    assert (meta.stride, meta.imgsz, meta.names, meta.end2end, meta.channels) == \
        (32, (384, 640), ["person", "class1", "car"], False, 3)
    assert parse_metadata({"imgsz": "640", "stride": "[8, 16, 32.0]"}).imgsz == (640, 640)


@pytest.mark.shared
@pytest.mark.parametrize("key, value", [("stride", "1e999"), ("names", "{0: 'person', 1: "), ("imgsz", "[-1, 0]")])
def test_detect_reports_bad_metadata_of_a_real_model_without_a_traceback(tmp_path, models, media, key, value):
    model = onnx.load(str(models / "yolov8n_coco_int8.onnx"))
    entries = {p.key: p.value for p in model.metadata_props}
    entries[key] = value
    del model.metadata_props[:]
    for k, v in entries.items():
        model.metadata_props.add(key=k, value=v)
    path = tmp_path / "bad_meta.onnx"
    onnx.save(model, str(path))
    result = subprocess.run([sys.executable, "-m", "yoloedge", "detect", "-m", str(path), str(media / "bus.jpg")],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert f"{path}: bad model metadata {key}" in result.stderr and "Traceback" not in result.stderr
