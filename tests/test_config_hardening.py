"""Files that must be refused as configuration errors (exit 78, file:line), never crash a command:
TLS material that is not what it claims, YAML bombs, control characters, and bad model metadata."""

from __future__ import annotations

import os
import resource
import signal
import socket
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
from yoloedge.config.yamltree import MAX_ALIAS_VALUES, MAX_DEPTH, MAX_NODES
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


def test_a_file_of_too_many_values_is_refused_where_the_limit_is_crossed(tmp_path):
    """1 MiB of `[0,0,...]` is half a million values: refused on the line where the count passes
    the limit, not after building all of them (the error line is half way into the file)."""
    path = tmp_path / "yoloedge.yaml"
    path.write_text("x:\n" + "- 0\n" * (2 * MAX_NODES))
    assert path.stat().st_size <= MAX_CONFIG_BYTES
    tracemalloc.start()
    try:
        error = refused(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert f"more than {MAX_NODES} values" in str(error), error
    line = int(str(error).split(":")[1])
    assert MAX_NODES - 10 <= line <= MAX_NODES + 2, error
    assert peak < 200 * 1024 * 1024, f"{peak / 1e6:.0f} MB"


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


# -- values without bounds, files that are not files (an adversarial review's cases) ---------------

LONG = "d" * 70_000

UNBOUNDED = [
    # (case, config text after device_id/model, the key reported, words the message must hold)
    ("shutdown-1e300", "shutdown_timeout_s: 1.0e+300\n", "shutdown_timeout_s", "<= 3600"),
    ("backoff-1e300", "cameras: [{name: c, url: rtsp://h/s, backoff_max_s: 1.0e+300}]\n",
     "cameras[0].backoff_max_s", "<= 3600"),
    ("open-timeout-1e300", "cameras: [{name: c, url: rtsp://h/s, open_timeout_s: 1.0e+300}]\n",
     "cameras[0].open_timeout_s", "<= 3600"),
    ("read-timeout-1e300", "cameras: [{name: c, url: rtsp://h/s, read_timeout_s: 1.0e+300}]\n",
     "cameras[0].read_timeout_s", "<= 3600"),
    ("stall-1e300", "health: {stall_timeout_s: 1.0e+300}\n", "health.stall_timeout_s", "<= 3600"),
    ("reconnect-1e300", "mqtt: {reconnect_max_s: 1.0e+300}\n", "mqtt.reconnect_max_s", "<= 3600"),
    ("inference-timeout-1e300", "accelerators: [{inference_timeout_s: 1.0e+300}]\n",
     "accelerators[0].inference_timeout_s", "<= 3600"),
    ("batch-timeout-ms", "accelerators: [{batch_timeout_ms: 1.0e+300}]\n",
     "accelerators[0].batch_timeout_ms", "to 60000"),
    ("fps", "cameras: [{name: c, url: rtsp://h/s, fps: 1.0e+9}]\n", "cameras[0].fps", "<= 1000"),
    ("queue-100000", "cameras: [{name: c, url: rtsp://h/s, queue_size: 100000}]\n", "cameras[0].queue_size",
     "from 1 to 100"),
    ("queue-1e12", "cameras: [{name: c, url: rtsp://h/s, queue_size: 1000000000000}]\n",
     "cameras[0].queue_size", "from 1 to 100"),
    ("event-snapshots-1e12", "cameras: [{name: c, url: rtsp://h/s, event_snapshots_mb: 1000000000000}]\n",
     "cameras[0].event_snapshots_mb", "from 0 to 4096"),
    ("event-snapshots-negative", "cameras: [{name: c, url: rtsp://h/s, event_snapshots_mb: -1}]\n",
     "cameras[0].event_snapshots_mb", "from 0 to 4096"),
    ("intra-op-threads", "accelerators: [{intra_op_threads: 100000}]\n", "accelerators[0].intra_op_threads",
     "from 0 to 256"),
    ("batch", "accelerators: [{batch: 100000}]\n", "accelerators[0].batch", "from 1 to 256"),
    ("device-index", "accelerators: [{devices: [1000000000000]}]\n", "accelerators[0].devices[0]", "to 1023"),
    ("max-det", "model: {max_det: 1000000000000}\n", "model.max_det", "to 100000"),
    ("imgsz", "model: {imgsz: 1000000}\n", "model.imgsz", "from 1 to 8192"),
    ("class-id", "model: {classes: [1000000000000]}\n", "model.classes[0]", "class id from 0 to 99999"),
    ("queue-bytes", "mqtt: {queue_limit_bytes: 1000000000000000}\n", "mqtt.queue_limit_bytes", "to 1073741824"),
    ("device-ms", "accelerators: [{backend: simulated, simulated: {device_ms: 1.0e+300}}]\n",
     "accelerators[0].simulated.device_ms", "to 60000"),
    ("long-device-id", f"device_id: {LONG}\n", "device_id", "longer than 128 bytes"),
    ("long-camera-name", f"cameras: [{{name: {LONG}, url: rtsp://h/s}}]\n", "cameras[0].name",
     "longer than 128 bytes"),
    ("long-accelerator-name", f"accelerators: [{{name: {LONG}}}]\n", "accelerators[0].name", "longer than 128"),
    ("long-topic-prefix", f"mqtt: {{topic_prefix: {LONG}}}\n", "mqtt.topic_prefix", "longer than 256 bytes"),
    ("long-client-id", f"mqtt: {{client_id: {LONG}}}\n", "mqtt.client_id", "longer than 128 bytes"),
    ("long-url", f"cameras: [{{name: c, url: rtsp://h/{LONG}}}]\n", "cameras[0].url", "longer than 8,192 bytes"),
    ("long-username", f"mqtt: {{username: {LONG}}}\n", "mqtt.username", "longer than 4,096 bytes"),
    ("many-cameras", "cameras: [" + ", ".join(f"{{name: c{i}, url: rtsp://h/s}}" for i in range(1001)) + "]\n",
     "cameras", "lists 1,001 cameras; at most 1,000"),
    ("yaml11-exponent", "model: {conf: 5e-1}\n", "model.conf", "YAML 1.1 reads 5e-1 as text: write 0.5"),
    ("yaml11-big-exponent", "shutdown_timeout_s: 1e300\n", "shutdown_timeout_s", "write 1.0e+300"),
]


@pytest.mark.parametrize("case, text, key, words", UNBOUNDED, ids=[c[0] for c in UNBOUNDED])
def test_values_without_a_sane_bound_are_config_errors_naming_key_and_line(tmp_path, model, case, text, key, words):
    if text.startswith("device_id:"):
        full = f"{text}model: {{path: {model}}}\n"
    elif text.startswith("model: {"):
        full = "device_id: e\n" + text.replace("model: {", f"model: {{path: {model}, ")
    else:
        full = f"device_id: e\nmodel: {{path: {model}}}\n{text}"
    error = refused(write(tmp_path, full))
    top = key.split(".")[0].split("[")[0]
    line = next(n for n, row in enumerate(full.splitlines(), 1) if row.startswith(f"{top}:"))
    assert [(i.line, i.key_path) for i in error.issues] == [(line, key)], str(error)
    assert words in str(error), str(error)
    assert LONG not in str(error)


def test_bounded_values_at_their_maximum_still_load(tmp_path, model):
    name = "n" * 128
    path = write(tmp_path, f"""
        device_id: {name}
        model: {{path: {model}, max_det: 100000, imgsz: 8192, conf: 5.0e-1}}
        shutdown_timeout_s: 3600
        accelerators: [{{name: {name}, batch: 256, intra_op_threads: 256, batch_timeout_ms: 60000}}]
        cameras: [{{name: {name}, url: rtsp://h/s, queue_size: 100, fps: 1000, backoff_max_s: 3600}}]
        mqtt: {{topic_prefix: {'p' * 256}, client_id: {name}}}
        """)
    config = load_config(str(path), {})
    assert config.model.conf == 0.5 and config.cameras[0].queue_size == 100 and config.device_id == name


def test_check_cli_refuses_the_review_values_with_78_and_no_traceback(tmp_path, model):
    path = write(tmp_path, f"device_id: {LONG}\nmodel: {{path: {model}}}\nshutdown_timeout_s: 1.0e+300\n"
                           f"cameras: [{{name: c, url: rtsp://h/s, queue_size: 1000000000000}}]\n")
    result = check_cli(path)
    assert result.returncode == EX_CONFIG, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and LONG not in result.stderr
    for where in (f"{path}:1: device_id", f"{path}:3: shutdown_timeout_s", f"{path}:4: cameras[0].queue_size"):
        assert where in result.stderr, result.stderr


def test_a_control_socket_path_held_by_a_file_is_refused(tmp_path, model):
    taken = tmp_path / "control.sock"
    taken.write_text("not a socket")
    path = write(tmp_path, f"device_id: e\nmodel: {{path: {model}}}\ncontrol: {{socket: {taken}}}\n")
    error = refused(path)
    assert [(i.line, i.key_path) for i in error.issues] == [(3, "control.socket")]
    assert f"{taken} exists and is not a socket (a regular file)" in str(error)
    taken.unlink()
    socket.socket(socket.AF_UNIX).bind(str(taken))  # a left-over socket: the daemon replaces it
    assert load_config(str(path), {}).control.socket == str(taken)


# -- files that are not regular files --------------------------------------------------------------

def fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def sparse(path: Path, size: int = 2 * 1024 ** 3) -> Path:
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def check_with(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    """`yoloedge check` with these arguments; the timeout fails the test where the command would hang."""
    return subprocess.run([sys.executable, "-m", "yoloedge", "check", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def test_a_config_path_that_is_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    path = fifo(tmp_path / "yoloedge.yaml")
    result = check_with("-c", str(path))
    assert result.returncode == EX_CONFIG and "Traceback" not in result.stderr, result.stderr
    assert f"{path}: cannot read the config file: not a regular file (a FIFO)" in result.stderr


@pytest.mark.parametrize("case", ["fifo", "utf-16", "binary", "dev-zero", "sparse"])
def test_env_files_that_are_not_text_files_are_config_errors(tmp_path, model, case):
    config = write(tmp_path, f"device_id: e\nmodel: {{path: {model}}}\n")
    env = tmp_path / "yoloedge.env"
    if case == "fifo":
        fifo(env)
    elif case == "utf-16":
        env.write_bytes("CAM_PASSWORD=x\n".encode("utf-16"))
    elif case == "binary":
        env.write_bytes(bytes(range(256)))
    elif case == "sparse":
        sparse(env)
    else:
        env = Path("/dev/zero")
    result = check_with("-c", str(config), "--env-file", str(env))
    assert result.returncode == EX_CONFIG and "Traceback" not in result.stderr, result.stderr
    words = {"fifo": "not a regular file (a FIFO)", "utf-16": "not a UTF-8 text file (byte 0)",
             "binary": "not a UTF-8 text file (byte 128)", "dev-zero": "not a regular file (a device)",
             "sparse": "larger than 1 MiB"}[case]
    assert result.stderr.startswith(f"{env}: ") and words in result.stderr, result.stderr


@pytest.mark.parametrize("case", ["fifo", "sparse", "device", "directory"])
def test_a_labels_file_that_is_not_a_small_regular_file_is_refused_at_check(tmp_path, model, case):
    labels = {"fifo": lambda: fifo(tmp_path / "labels.txt"), "sparse": lambda: sparse(tmp_path / "labels.txt"),
              "device": lambda: Path("/dev/zero"), "directory": lambda: tmp_path}[case]()
    path = write(tmp_path, f"device_id: e\nmodel:\n  path: {model}\n  labels: {labels}\n")
    result = check_cli(path, timeout=30)
    assert result.returncode == EX_CONFIG and "Traceback" not in result.stderr, result.stderr
    words = {"fifo": "not a regular file (a FIFO)", "sparse": "2,147,483,648 bytes, over the bound of 1,048,576",
             "device": "not a regular file (a device)", "directory": "not a regular file (a directory)"}[case]
    assert f"{path}:4: model.labels: {labels}: {words}" in result.stderr, result.stderr


@pytest.mark.parametrize("case", ["fifo", "sparse", "dev-zero"])
def test_reading_labels_never_hangs_or_exhausts_memory(tmp_path, case):
    """The daemon and `detect --labels` read labels through this: a file that changed after the
    check is a ModelError, in bounded memory."""
    from yoloedge.model.labels import read_labels_file

    path = {"fifo": lambda: fifo(tmp_path / "l.txt"), "sparse": lambda: sparse(tmp_path / "l.txt"),
            "dev-zero": lambda: Path("/dev/zero")}[case]()
    tracemalloc.start()
    try:
        with pytest.raises(ModelError, match=f"cannot read labels file {path}: ") as info:
            read_labels_file(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert ("over the bound" if case == "sparse" else "not a regular file") in str(info.value)
    assert peak < 16 * 1024 * 1024


def test_a_model_or_camera_that_is_a_fifo_says_so(tmp_path, model):
    pipe = fifo(tmp_path / "pipe")
    path = write(tmp_path, f"device_id: e\nmodel: {{path: {pipe}}}\n"
                           f"cameras: [{{name: a, url: {pipe}}}, {{name: b, url: 'file://{pipe}'}},\n"
                           f"          {{name: c, url: /dev/null}}]\n")
    result = check_cli(path, timeout=30)
    assert result.returncode == EX_CONFIG, result.stderr
    assert f"{path}:2: model.path: {pipe}: not a regular file (a FIFO)" in result.stderr, result.stderr
    assert f"{path}:3: cameras[0].url: {pipe} is a FIFO" in result.stderr, result.stderr
    assert f"{path}:3: cameras[1].url: {pipe} is a FIFO" in result.stderr, result.stderr
    assert "cameras[2]" not in result.stderr  # a device node is a capture device
    assert "not found" not in result.stderr


@pytest.mark.shared
def test_a_reload_of_a_config_replaced_by_a_fifo_is_rejected_and_sigterm_still_stops(tmp_path, models, mosquitto):
    from daemon_harness import Daemon, NotifySocket, status, write_config

    sock = str(tmp_path / "run" / "control.sock")
    path = write_config(tmp_path / "yoloedge.yaml", {
        "device_id": "edge1", "model": {"path": str(models / "yolov8n_coco_int8.onnx")}, "cameras": [],
        "mqtt": {"host": mosquitto.host, "port": mosquitto.port, "topic_prefix": "yt"},
        "control": {"socket": sock}, "shutdown_timeout_s": 5})
    notify = NotifySocket(tmp_path / "notify.sock")
    daemon = Daemon(path, notify)
    try:
        notify.wait_for("READY", "1", timeout=90)
        path.unlink()
        fifo(path)
        daemon.signal(signal.SIGHUP)
        notify.wait_for("READY", "1", timeout=30, count=2)
        st = status(sock)
        assert daemon.proc.poll() is None, daemon.log[-3000:]
        assert st["daemon"]["generation"] == 1
        assert "not a regular file (a FIFO)" in st["daemon"]["config_error"], st["daemon"]["config_error"]
        assert daemon.stop(timeout=30) == 0, daemon.log[-3000:]
    finally:
        daemon.kill()
        notify.close()
    assert "Traceback" not in daemon.log


# -- second review round: homoglyph keys, kernel pseudo-files ------------------------------------

@pytest.mark.parametrize("key, named", [("p\u0430th", "U+0430 CYRILLIC SMALL LETTER A"),
                                        ("pa\u200bth", "U+200B ZERO WIDTH SPACE")])
def test_an_unknown_key_that_looks_like_a_known_one_names_the_foreign_character(tmp_path, model, key, named):
    path = write(tmp_path, f"device_id: e\nmodel:\n  path: {model}\n  {key}: x\n")
    error = refused(path)
    assert [(i.line, i.key_path) for i in error.issues] == [(4, f"model.{key}")]
    assert f"unknown key {key!r} (it contains {named}; keys are ASCII)" in str(error), error
    assert "did you mean 'path'?" in str(error), error


def test_an_ascii_typo_keeps_the_plain_hint(tmp_path, model):
    error = refused(write(tmp_path, f"device_id: e\nmodel:\n  path: {model}\n  lables: x\n"))
    assert "model.lables: unknown key (did you mean 'labels'?)" in str(error), error


@pytest.mark.parametrize("key, target", [("path", "/proc/self/mem"), ("labels", "/proc/self/environ"),
                                         ("labels", "/sys/kernel/mm/transparent_hugepage/enabled"),
                                         ("labels", "link-to-environ")])
def test_kernel_pseudo_files_are_refused_as_model_or_labels(tmp_path, model, key, target):
    if target == "link-to-environ":
        os.symlink("/proc/self/environ", tmp_path / target)
        target = str(tmp_path / target)
    if not os.path.isfile(target):
        pytest.skip(f"{target} is not on this system")
    model_line = f"  path: {target}\n" if key == "path" else f"  path: {model}\n  labels: {target}\n"
    path = write(tmp_path, f"device_id: e\nmodel:\n{model_line}")
    result = check_cli(path, timeout=30)
    assert result.returncode == EX_CONFIG and "Traceback" not in result.stderr, result.stderr
    line = 3 if key == "path" else 4
    assert f"{path}:{line}: model.{key}: {target}: a kernel pseudo-file (/proc, /sys)" in result.stderr, result.stderr


def test_an_env_file_under_proc_is_refused_unread(tmp_path, model):
    config = write(tmp_path, f"device_id: e\nmodel: {{path: {model}}}\n")
    result = check_with("-c", str(config), "--env-file", "/proc/self/environ")
    assert result.returncode == EX_CONFIG and "a kernel pseudo-file" in result.stderr, result.stderr


# -- env files read as systemd's EnvironmentFile= reads them ---------------------------------------

def env_check(tmp_path: Path, model: Path, env_text: str, uses: str) -> subprocess.CompletedProcess:
    """`check` of a config whose device_id is `${uses}`, with `env_text` as the env file."""
    config = write(tmp_path, f'device_id: "${{{uses}}}"\nmodel: {{path: {model}}}\n')
    env = tmp_path / "yoloedge.env"
    env.write_text(env_text, encoding="utf-8")
    return check_with("-c", str(config), "--env-file", str(env))


def test_env_file_values_are_read_with_systemd_quoting_and_escapes(tmp_path, model):
    """Each value as systemd's env-file parser gives it (src/basic/env-file.c): glued quotes,
    backslash escapes, continued lines, blanks around '=' and '#' only at the start of a line;
    blanks after a closing quote are dropped (D7)."""
    from yoloedge.cli.check import read_env_file
    env = tmp_path / "yoloedge.env"
    env.write_text('D1="a\\"b"\nD2=a\\$c\nD3="ab"cd\n  D4 = v w  \nD5="two\nlines"\nD6=con\\\ntinued\n'
                   "# a comment \\\nD7='it''s' # not a comment\r\nD8=\nD9=x\\ \nD10=\"a\\nb\\\\\"\n"
                   "D11=\u2028kept\u2028\n", encoding="utf-8")
    assert read_env_file(str(env)) == {
        "D1": 'a"b', "D2": "a$c", "D3": "abcd", "D4": "v w", "D5": "two\nlines", "D6": "continued",
        "D7": "its# not a comment", "D8": "", "D9": "x ", "D10": "a\\nb\\", "D11": "\u2028kept\u2028"}


@pytest.mark.parametrize("text, line, words", [
    ("A=1\nexport DEVICE=cam1\n", 2, "'export' is shell syntax"),
    ("A=1\nDEVICE\n", 2, "expected KEY=VALUE (systemd ignores a line without '='"),
    ("1DEVICE=x\n", 1, "expected KEY=VALUE with KEY made of letters, digits and '_'"),
    ('DEVICE="cam1\nB=2\n', 1, "a quote opened in this value is never closed"),
    ('DEVICE="cam\r1"\n', 1, "the value holds a control character"),
])
def test_env_file_lines_systemd_would_drop_are_refused_with_their_line(tmp_path, model, text, line, words):
    """Such a line is dropped by systemd, so the service would exit 78 "DEVICE is not set" after
    check said OK; check refuses it instead."""
    result = env_check(tmp_path, model, text, "DEVICE")
    assert result.returncode == EX_CONFIG and "Traceback" not in result.stderr, result.stderr
    assert f"{tmp_path / 'yoloedge.env'}:{line}: {words}" in result.stderr, result.stderr


def test_env_file_export_error_names_the_variable_but_never_the_value(tmp_path, model):
    result = env_check(tmp_path, model, f"export DEVICE={SECRET}\n", "DEVICE")
    assert "would not get DEVICE" in result.stderr and SECRET not in result.stderr, result.stderr


# -- the spool directory ----------------------------------------------------------------------------

def _spool_config(tmp_path: Path, model: Path, spool_dir: Path | str) -> Path:
    return write(tmp_path, f"device_id: e\nmodel: {{path: {model}}}\nmqtt:\n  spool_dir: {spool_dir}\n")


def test_check_refuses_a_spool_dir_that_holds_other_files_and_touches_none(tmp_path, model):
    """`/etc` as spool_dir was accepted, and the spool then used it as its own."""
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (etc / "hosts").write_text("127.0.0.1 localhost\n")
    (etc / "ssh").mkdir()
    before = {p.name: (p.stat().st_mtime_ns, p.is_dir() or p.read_bytes()) for p in etc.iterdir()}
    path = _spool_config(tmp_path, model, etc)
    result = check_cli(path)
    assert result.returncode == EX_CONFIG and "Traceback" not in result.stderr, result.stderr
    assert (f"{path}:4: mqtt.spool_dir: spool directory refused: {etc} holds files the spool did not "
            f"write ('hosts', 'passwd', 'ssh')") in result.stderr, result.stderr
    assert "move those files away, or use another directory" in result.stderr
    assert {p.name: (p.stat().st_mtime_ns, p.is_dir() or p.read_bytes()) for p in etc.iterdir()} == before
    assert not (etc / "lock").exists()


@pytest.mark.parametrize("system_dir", ["/", "/etc", "/var/lib", "/tmp"])
def test_system_directories_are_refused_as_spool_dir(tmp_path, model, system_dir):
    error = refused(_spool_config(tmp_path, model, system_dir))
    [issue] = error.issues
    assert (issue.line, issue.key_path) == (4, "mqtt.spool_dir")
    assert f"{system_dir} is a system directory" in issue.message and "/var/lib/yoloedge/spool" in issue.hint


def _planted(tmp_path: Path, case: str) -> tuple[Path, str]:
    """A spool directory someone else could control, and the words its refusal must hold."""
    spool = tmp_path / "spool"
    spool.mkdir(mode=0o700)
    if case == "symlink":
        link = tmp_path / "link"
        link.symlink_to(spool)
        return link, f"{link} is a symbolic link (to {spool})"
    if case == "world-writable":
        spool.chmod(0o777)
        return spool, "writable by every user (mode 0777)"
    if case == "fifo segment":
        os.mkfifo(spool / f"{0:020d}.seg")
        return spool, f"not regular files ('{0:020d}.seg')"
    (spool / "lock").symlink_to("/etc/passwd")
    return spool, "not regular files ('lock')"


@pytest.mark.parametrize("case", ["symlink", "world-writable", "fifo segment", "symlink lock"])
def test_a_spool_dir_others_could_plant_files_in_is_refused(tmp_path, model, case):
    spool_dir, words = _planted(tmp_path, case)
    error = refused(_spool_config(tmp_path, model, spool_dir))
    [issue] = error.issues
    assert (issue.line, issue.key_path) == (4, "mqtt.spool_dir") and words in issue.message, issue.message
    if case == "symlink":
        assert f"spool_dir: {tmp_path / 'spool'}" in issue.hint  # the fix names the real directory


def test_a_spool_dir_holding_only_the_spools_own_files_is_accepted(tmp_path, model):
    from yoloedge.publish.spool import Record, Spool

    spool_dir = tmp_path / "spool"
    spool = Spool(str(spool_dir), limit_bytes=1 << 20)
    spool.open()
    spool.append(Record("t", b"x", 1, False))
    spool.close()
    (spool_dir / f"{7:020d}.seg.corrupt-1").write_bytes(b"moved aside")
    (spool_dir / "lost+found").mkdir()
    assert {p.name for p in spool_dir.iterdir()} == {f"{0:020d}.seg", "lock", f"{7:020d}.seg.corrupt-1",
                                                     "lost+found"}
    assert load_config(str(_spool_config(tmp_path, model, spool_dir)), {}).mqtt.spool_dir == str(spool_dir)
