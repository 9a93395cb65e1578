"""What a new user runs into in the first hour (issue 11, items 7 and 9): a daemon started by hand
as a normal user without `control.socket`, `yoloedge-ctl status -c FILE`, and a first `stats`
message that is healthy, or says why not."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from conftest import REPO
from other_user import NOBODY
from yoloedge.cli import ctl
from yoloedge.config.loader import load_config
from yoloedge.control import location
from yoloedge.demo import DEMO_DIR, LABELS, MODEL, clip_path


# -- where the socket is -------------------------------------------------------------------------


def test_a_user_who_cannot_create_the_system_socket_gets_one_in_the_runtime_dir():
    environ = {"XDG_RUNTIME_DIR": "/run/user/1000"}
    assert location.daemon_socket(environ, creatable=lambda path: False) == \
        "/run/user/1000/yoloedge/control.sock"
    assert location.daemon_socket(environ, creatable=lambda path: True) == "/run/yoloedge/control.sock"
    # no (or a relative) runtime dir: the system path, and the daemon says why it cannot create it
    assert location.daemon_socket({}, creatable=lambda path: False) == "/run/yoloedge/control.sock"
    assert location.daemon_socket({"XDG_RUNTIME_DIR": "run/user"}, creatable=lambda path: False) == \
        "/run/yoloedge/control.sock"


def test_ctl_looks_for_the_users_socket_first_then_the_systems():
    environ = {"XDG_RUNTIME_DIR": "/run/user/1000"}
    mine = "/run/user/1000/yoloedge/control.sock"
    assert location.client_socket(environ, present=lambda p: p == mine) == mine
    assert location.client_socket(environ, present=lambda p: True) == mine
    assert location.client_socket(environ, present=lambda p: p == location.SYSTEM_SOCKET) == \
        location.SYSTEM_SOCKET
    # neither there: where a daemon of this user would put it, so "not running" names that path
    assert location.client_socket(environ, present=lambda p: False, creatable=lambda p: False) == mine
    assert location.client_socket(environ, present=lambda p: False, creatable=lambda p: True) == \
        location.SYSTEM_SOCKET


def test_can_create_looks_at_the_nearest_existing_folder(tmp_path):
    assert location.can_create(str(tmp_path / "a" / "b" / "control.sock"))
    if os.geteuid() != 0:  # root may write anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        assert not location.can_create(str(locked / "yoloedge" / "control.sock"))


def test_an_explicit_control_socket_is_kept_whatever_the_environment(tmp_path):
    path = tmp_path / "y.yaml"
    path.write_text(f"device_id: d\nmodel:\n  path: {MODEL}\n  labels: {LABELS}\n"
                    f"control:\n  socket: {tmp_path}/c.sock\n")
    config = load_config(str(path), {"XDG_RUNTIME_DIR": "/run/user/1000"})
    assert config.control.socket == f"{tmp_path}/c.sock"


def test_ctl_socket_from_a_config_without_control_socket_follows_the_environment(tmp_path):
    path = tmp_path / "y.yaml"
    path.write_text("device_id: d\n")
    runtime = tmp_path / "runtime"
    (runtime / "yoloedge").mkdir(parents=True)
    (runtime / "yoloedge" / "control.sock").touch()  # where this user's daemon put it
    assert ctl.socket_from_config(str(path), {"XDG_RUNTIME_DIR": str(runtime)}) == \
        str(runtime / "yoloedge" / "control.sock")


# -- yoloedge-ctl's options ------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [
    ["-c", "F", "status", "--json"], ["status", "-c", "F", "--json"], ["status", "--json", "--config", "F"],
])
def test_ctl_global_options_go_before_or_after_the_command(argv):
    args = ctl.build_parser().parse_args(argv)
    assert (args.command, args.config, args.json, args.socket) == ("status", "F", True, None)


def test_ctl_options_after_the_command_do_not_drop_those_before():
    args = ctl.build_parser().parse_args(["--timeout", "7", "reload", "-c", "F"])
    assert (args.command, args.timeout, args.config) == ("reload", 7.0, "F")
    args = ctl.build_parser().parse_args(["--socket", "/s", "status"])
    assert args.socket == "/s" and args.config is None


def test_ctl_socket_and_config_on_either_side_is_refused(capsys):
    with pytest.raises(SystemExit) as exc:
        ctl.main(["--socket", "/s", "status", "-c", "F"])
    assert exc.value.code == ctl.EXIT_USAGE
    assert "not allowed with argument --socket" in capsys.readouterr().err


# -- a normal user's daemon, end to end ------------------------------------------------------------


@dataclass
class NormalUser:
    """How to run yoloedge as a normal user: `argv` starts Python, `env` is its environment (with
    `runtime` as XDG_RUNTIME_DIR), `demo` the folder of the demo model and clip it can read."""
    argv: list[str]
    env: dict[str, str]
    runtime: Path
    cwd: Path
    demo: Path


@pytest.fixture()
def normal_user(request):
    """`nobody` when the tests run as root (the daemon must not be able to create /run/yoloedge),
    else this user. As nobody it runs copies that nobody can read (see other_user): the checkout
    may be in a folder only root can enter."""
    runtime = Path(tempfile.mkdtemp(prefix="ye-xdg-", dir="/tmp"))
    if os.geteuid() == 0:
        nobody = request.getfixturevalue("nobody_python")
        os.chown(runtime, NOBODY, NOBODY)
        env = nobody.env(XDG_RUNTIME_DIR=str(runtime), HOME=str(runtime))
        user = NormalUser(nobody.argv(), env, runtime, nobody.home, nobody.package / "demo")
    else:
        if location.can_create(location.SYSTEM_SOCKET):
            pytest.skip("this user can create /run/yoloedge: the fallback cannot be seen here")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "XDG_RUNTIME_DIR": str(runtime),
               "PYTHONPATH": str(REPO), "HOME": str(runtime), "PYTHONDONTWRITEBYTECODE": "1"}
        user = NormalUser([sys.executable], env, runtime, REPO, DEMO_DIR)
    runtime.chmod(0o700)
    yield user
    shutil.rmtree(runtime, ignore_errors=True)


def test_a_normal_users_daemon_without_control_socket_is_found_by_ctl(normal_user, mosquitto, subscriber):
    user = normal_user
    workdir = Path(tempfile.mkdtemp(prefix="ye-cfg-", dir="/tmp"))
    try:
        workdir.chmod(0o755)
        demo = user.demo
        config = {
            "device_id": "firsthour",
            "model": {"path": str(demo / MODEL.name), "labels": str(demo / LABELS.name)},
            "accelerators": [{"backend": "onnxruntime", "provider": "cpu", "devices": [0], "batch": 1}],
            "cameras": [{"name": "demo", "url": str(demo / clip_path().name), "loop": True, "fps": 5}],
            "mqtt": {"host": mosquitto.host, "port": mosquitto.port, "stats_interval_s": 1},
            "logging": {"level": "info", "target": "stderr"},
        }
        config_path = workdir / "yoloedge.yaml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        config_path.chmod(0o644)
        daemon = subprocess.Popen([*user.argv, "-m", "yoloedge", "run", "-c", str(config_path)],
                                  cwd=user.cwd, env=user.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True)
        try:
            expected = user.runtime / "yoloedge" / "control.sock"
            deadline = time.monotonic() + 60
            while not expected.exists() and daemon.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            assert expected.exists(), daemon.stdout.read() if daemon.poll() is not None else "no socket"

            def ctl_status(*argv: str) -> subprocess.CompletedProcess:
                return subprocess.run([*user.argv, "-m", "yoloedge.cli.ctl", *argv], cwd=user.cwd,
                                      env=user.env, capture_output=True, text=True, timeout=30)

            plain = ctl_status("status", "--json")  # no --socket, no -c
            assert plain.returncode in (0, 1), plain.stderr
            assert json.loads(plain.stdout)["daemon"]["config"] == str(config_path)
            after = ctl_status("status", "-c", str(config_path))  # the global option after the command
            assert after.returncode in (0, 1) and "cameras:" in after.stdout, after.stderr

            assert subscriber.wait_for(lambda msgs: any(m.topic.endswith("/stats") for m in msgs), timeout=30)
            first = json.loads(next(m for m in subscriber.messages() if m.topic.endswith("/stats")).payload)
            # the first message comes while the camera may still connect: not a problem yet
            assert first["problems"] == [] and first["healthy"] is True, first
        finally:
            daemon.terminate()
            out, _ = daemon.communicate(timeout=30)
        assert daemon.returncode == 0, out[-3000:]
        assert not expected.exists()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


# -- yoloedge bench ------------------------------------------------------------------------------


def _subparsers(parser):
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()


def test_every_bench_kind_has_a_description():
    from yoloedge.cli.main import build_parser

    bench = dict(_subparsers(build_parser()))["bench"]
    assert bench.description
    kinds = dict(_subparsers(bench))
    assert {"micro", "model", "pipeline", "e2e", "clip", "decode", "memory"} <= set(kinds)
    for name, parser in kinds.items():
        assert parser.description and len(parser.description) > 30, name
        assert parser.format_help().count(parser.description.split()[0]) >= 1


def test_a_peer_that_is_not_installed_reads_n_a_not_nan():
    from yoloedge.bench.micro import Timing, format_table

    table = format_table("t", [Timing("ours", 2.0, 3.0), Timing.not_installed("theirs", "torchvision"),
                               Timing("other", 4.0, 5.0)])
    assert "nan" not in table
    assert "theirs  n/a (not installed: torchvision)" in table
    assert "2.00x" in table  # the others are still compared with the first row
    first_missing = format_table("t", [Timing.not_installed("theirs", "torchvision"), Timing("ours", 2.0, 3.0)])
    assert "nan" not in first_missing and "inf" not in first_missing


# -- two ONNX Runtime builds ---------------------------------------------------------------------


def _fake_distribution(folder: Path, name: str, version: str = "1.20.0") -> None:
    """A distribution's metadata as pip leaves it, without its files: importlib.metadata sees it
    installed, the real `onnxruntime` module stays the one imported."""
    info = folder / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def test_the_clash_is_found_from_the_installed_metadata(tmp_path):
    from yoloedge.backends.ort_install import clash_message, installed_ort_distributions

    _fake_distribution(tmp_path / "one", "onnxruntime")
    assert installed_ort_distributions([str(tmp_path / "one")]) == ["onnxruntime"]
    _fake_distribution(tmp_path / "two", "onnxruntime")
    _fake_distribution(tmp_path / "two", "onnxruntime-gpu")
    _fake_distribution(tmp_path / "two", "onnx")  # not a runtime
    names = installed_ort_distributions([str(tmp_path / "two")])
    assert names == ["onnxruntime", "onnxruntime-gpu"]
    message = clash_message(names)
    assert "pip uninstall -y onnxruntime onnxruntime-gpu" in message and "pip install onnxruntime-gpu" in message
    assert clash_message(["onnxruntime"]) is None and clash_message([]) is None


def _config(tmp_path: Path, backend: str = "onnxruntime", port: int = 9) -> Path:
    path = tmp_path / "yoloedge.yaml"
    accelerator = {"backend": backend, "devices": [0], "batch": 1}
    if backend == "onnxruntime":
        accelerator["provider"] = "cpu"
    path.write_text(yaml.safe_dump({
        "device_id": "clash", "model": {"path": str(MODEL), "labels": str(LABELS)},
        "accelerators": [accelerator], "cameras": [],
        "mqtt": {"host": "127.0.0.1", "port": port},
        "control": {"socket": str(tmp_path / "control.sock")},
        "logging": {"level": "info", "target": "stderr"},
    }, sort_keys=False))
    return path


def _env_with(site: Path | None) -> dict[str, str]:
    paths = [str(site)] if site is not None else []
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths + [str(REPO)])}


def test_yoloedge_check_names_the_clash_and_the_fix(tmp_path):
    site = tmp_path / "site"
    _fake_distribution(site, "onnxruntime-gpu")  # next to the real CPU build of the venv
    config = _config(tmp_path)
    clash = subprocess.run([sys.executable, "-m", "yoloedge", "check", "-c", str(config)], cwd=REPO,
                           env=_env_with(site), capture_output=True, text=True, timeout=60)
    assert clash.returncode == 0, clash.stderr  # a note: the file itself is fine
    assert "onnxruntime and onnxruntime-gpu are both installed" in clash.stderr
    assert "pip uninstall -y onnxruntime onnxruntime-gpu" in clash.stderr
    clean = subprocess.run([sys.executable, "-m", "yoloedge", "check", "-c", str(config)], cwd=REPO,
                           env=_env_with(None), capture_output=True, text=True, timeout=60)
    assert clean.returncode == 0 and "onnxruntime-gpu" not in clean.stderr, clean.stderr


def test_the_daemon_warns_about_the_clash_when_it_starts(tmp_path):
    site = tmp_path / "site"
    _fake_distribution(site, "onnxruntime-gpu")
    daemon = subprocess.Popen([sys.executable, "-m", "yoloedge", "run", "-c", str(_config(tmp_path))], cwd=REPO,
                              env=_env_with(site), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        for line in daemon.stdout:
            lines.append(line)
            if "ONNX Runtime:" in line or len(lines) > 200:
                break
    finally:
        daemon.terminate()
        rest, _ = daemon.communicate(timeout=30)
    assert any("ONNX Runtime: onnxruntime and onnxruntime-gpu are both installed" in line for line in lines), \
        "".join(lines) + rest
