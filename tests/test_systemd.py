"""The shipped systemd unit, checked by systemd itself.

1. `systemd-analyze verify` on systemd/yoloedge.service (only ExecStart's binary swapped for this
   venv's script, because verify insists the binary exists).
2. The unit under a real systemd: PID 1 on a test machine is usually not systemd, so the test boots
   one in a container (`systemd-nspawn -b` over the host's root with a volatile /, see
   shared/research/infra.md section 4). A oneshot check unit inside runs CHECK_SCRIPT: it starts a
   mosquitto broker, starts the shipped unit (plus a drop-in for what the container needs), checks
   Type=notify readiness, the watchdog, reload, a watchdog restart of a frozen daemon and a clean
   stop, writes what it saw to /out and powers the container off. This side asserts on those files.

Needs root, systemd-nspawn (package systemd-container), systemd-analyze and mosquitto; skipped
without them, a failure instead where YOLOEDGE_REQUIRE_SYSTEMD=1.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Iterable

import pytest
import yaml

from conftest import REPO, skip_unless_required

UNIT = REPO / "systemd" / "yoloedge.service"
SHIPPED_EXEC = "/opt/yoloedge/bin/yoloedge"
VENV_YOLOEDGE = Path(sys.prefix) / "bin" / "yoloedge"
SWITCH = "YOLOEDGE_REQUIRE_SYSTEMD"

PREFIX = "yt"
DEVICE = "nspawn"
BROKER_PORT = 18830  # the container has its own network namespace: no clash with the host
NSPAWN_TIMEOUT_S = 120  # the whole boot-check-poweroff; takes ~20 s


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        skip_unless_required(f"{name} not installed", SWITCH)
    return path


def _unit_settings(text: str) -> list[tuple[str, str]]:
    """(key, value) for every assignment in a unit file, comments and section headers skipped."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";", "[")) or "=" not in line:
            continue
        key, value = line.split("=", 1)
        out.append((key.strip(), value.strip()))
    return out


# -- 1. static check ---------------------------------------------------------------------------

def test_unit_file_verifies(tmp_path):
    analyze = _tool("systemd-analyze")
    shipped = UNIT.read_text()
    assert shipped.count(SHIPPED_EXEC) == 1, f"ExecStart= should run {SHIPPED_EXEC} (once)"
    assert VENV_YOLOEDGE.is_file(), f"{VENV_YOLOEDGE} missing: is the package installed in this venv?"
    unit = tmp_path / "yoloedge.service"
    unit.write_text(shipped.replace(SHIPPED_EXEC, str(VENV_YOLOEDGE)))

    result = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    # Unknown keys and unparsable values are only warnings (exit 0), so stderr must be empty too.
    assert result.returncode == 0, f"systemd-analyze verify failed:\n{result.stderr}{result.stdout}"
    assert result.stderr == "", f"systemd-analyze verify warned:\n{result.stderr}"

    settings = _unit_settings(shipped)
    values = {}
    for key, value in settings:
        values.setdefault(key, []).append(value)
    assert values.get("Type") == ["notify"]
    assert values.get("WatchdogSec"), "no WatchdogSec="
    assert values.get("Restart") == ["on-failure"]
    assert any("kill -HUP $MAINPID" in v for v in values.get("ExecReload", [])), values.get("ExecReload")
    assert values.get("RuntimeDirectory") == ["yoloedge"]
    assert values.get("User") == ["yoloedge"]
    assert "yes" not in values.get("PrivateDevices", []), "PrivateDevices=yes hides the accelerator's nodes"
    assert values.get("ExecStart") == [f"{SHIPPED_EXEC} run -c /etc/yoloedge/yoloedge.yaml"]
    # CANN's variables (yoloedge ascend-env), then the operator's: optional both, the latter wins.
    assert values.get("EnvironmentFile") == ["-/etc/yoloedge/ascend.env", "-/etc/yoloedge/yoloedge.env"]


#: the most `systemd-analyze security` may rate the shipped unit (0 = locked down, 10 = exposed).
MAX_EXPOSURE = 3.5


def _exposure(report: str) -> float:
    match = re.search(r"Overall exposure level for \S+: ([0-9.]+)", report)
    assert match, f"no overall exposure level in:\n{report}"
    return float(match.group(1))


def test_unit_is_hardened(tmp_path):
    """systemd's own rating of the shipped unit, and the settings the rating cannot see the point of."""
    analyze = _tool("systemd-analyze")
    unit = tmp_path / "yoloedge.service"
    unit.write_text(UNIT.read_text().replace(SHIPPED_EXEC, str(VENV_YOLOEDGE)))
    result = subprocess.run([analyze, "security", "--offline=yes", "--no-pager", str(unit)],
                            capture_output=True, text=True, timeout=60)
    exposure = _exposure(result.stdout)
    assert exposure <= MAX_EXPOSURE, f"exposure {exposure} > {MAX_EXPOSURE}:\n{result.stdout}"
    values: dict[str, list[str]] = {}
    for key, value in _unit_settings(UNIT.read_text()):
        values.setdefault(key, []).append(value)
    assert values.get("CapabilityBoundingSet") == [""], "the daemon needs no capability"
    assert values.get("SystemCallFilter") == ["@system-service"]
    assert values.get("UMask") == ["0077"]
    # Hardening must not lock the daemon out of its accelerators and cameras.
    assert values.get("DevicePolicy") == ["closed"]
    for node in ("char-video4linux rw", "char-drm rw", "/dev/kfd rw", "char-nvidia-frontend rw"):
        assert node in values.get("DeviceAllow", []), f"DeviceAllow={node} missing"
    for setting in ("PrivateDevices", "PrivateUsers", "MemoryDenyWriteExecute", "PrivateNetwork"):
        assert values.get(setting, ["no"]) == ["no"], f"{setting}= would break accelerators or cameras"


# -- 2. under a real systemd -------------------------------------------------------------------

# Installed as /run/systemd/system/yoloedge.service.d/test.conf next to the shipped unit. Only what
# the test environment needs; every other setting (User=yoloedge, the hardening) stays as shipped.
DROP_IN = f"""\
[Service]
# test: run this checkout's venv instead of /opt/yoloedge (the config path stays the shipped one;
# the check script installs the test's config there).
ExecStart=
ExecStart={VENV_YOLOEDGE} run -c /etc/yoloedge/yoloedge.yaml
# test: a short watchdog, so that "still alive after the watchdog period" and "a frozen daemon is
# restarted" take seconds instead of a minute.
WatchdogSec=3
# test only: this machine's Python lives under /root (a real install lives in /opt), and
# ProtectHome=yes would hide it from the service.
ProtectHome=no
"""

CHECK_UNIT = """\
[Unit]
Description=yoloedge systemd test: drives yoloedge.service, writes /out, powers off
After=basic.target
# If the script itself fails, still end the boot instead of waiting for the outer timeout.
FailureAction=poweroff

[Service]
Type=oneshot
ExecStart=/bin/bash /ns/check.sh
TimeoutStartSec=150
StandardOutput=journal+console
StandardError=journal+console
"""

MOSQUITTO_CONF = f"""\
listener {BROKER_PORT} 127.0.0.1
allow_anonymous true
persistence false
log_dest stdout
# started as root inside the container; without this mosquitto switches to a user that the
# container's empty /etc does not have
user root
"""

# The first boot (empty /etc) applies presets to every unit, which would enable and start the
# shipped unit (WantedBy=multi-user.target) before the check script has created its user.
PRESET = "disable yoloedge.service\n"

# Runs inside the container. Every observation goes to /out/<step>.*; check.log has the trace.
# The prelude (shared by the checks): helpers, the user and /etc/yoloedge of docs/operations/systemd.md,
# the broker.
PRELUDE = r"""#!/bin/bash
set -u
exec >>/out/check.log 2>&1
PS4='+ $(date +%T.%3N) '
set -x
OUT=/out
STATUS_TOPIC=@PREFIX@/@DEVICE@/status
PORT=@PORT@
PROPS=ActiveState,SubState,Result,StatusText,MainPID,NRestarts,WatchdogUSec,ExecMainStatus,ExecMainCode

show() { systemctl show -p "$PROPS" yoloedge; }
prop() { systemctl show -p "$1" --value yoloedge; }
now() { date +%s.%N; }
since() { echo "$(now) - $1" | bc; }

finish() {
    journalctl -u yoloedge --no-pager -o short-monotonic >"$OUT/journal.txt" 2>&1
    journalctl -u yoloedge --no-pager -o json >"$OUT/journal.json" 2>&1
    journalctl -b --no-pager -o short-monotonic >"$OUT/journal-all.txt" 2>&1
    echo "$1" >"$OUT/done"
    systemctl --no-block poweroff
    exit 0
}

# The user that the install steps of docs/operations/systemd.md create (the container's /etc is empty;
# --user-group is what Debian's login.defs adds to their useradd line, and the container has no login.defs).
useradd --system --user-group --home-dir /var/lib/yoloedge --shell /usr/sbin/nologin yoloedge
usermod -aG yoloedge,video yoloedge
id yoloedge >"$OUT/setup_user.txt" 2>&1
install -d -m 0750 -o root -g yoloedge /etc/yoloedge
install -m 0640 -o root -g yoloedge /ns/yoloedge.yaml /etc/yoloedge/yoloedge.yaml
# Test only: this machine's Python lives under /root (a real install lives in /opt), and the
# container's throwaway /root is 0750, which User=yoloedge cannot enter.
chmod 0755 /root

# The broker, as its own transient unit (the packaged mosquitto.service is masked).
systemd-run --unit=test-broker /usr/sbin/mosquitto -c /ns/mosquitto.conf
for i in $(seq 50); do
    mosquitto_pub -h 127.0.0.1 -p "$PORT" -t probe -m x && break
    sleep 0.1
done
"""

CHECK_SCRIPT = PRELUDE + r"""
# a) start: Type=notify returns only after READY=1
t=$(now)
timeout 60 systemctl start yoloedge
echo "rc=$?" >"$OUT/a_start.rc"
echo "seconds=$(since "$t")" >>"$OUT/a_start.rc"
show >"$OUT/a_start.txt"
[ "$(prop ActiveState)" = active ] || finish "failed to start"
mosquitto_sub -h 127.0.0.1 -p "$PORT" -C 1 -W 5 -t "$STATUS_TOPIC" >"$OUT/a_status.json" 2>&1
mosquitto_sub -h 127.0.0.1 -p "$PORT" -C 1 -W 20 -t "@PREFIX@/@DEVICE@/cameras/door/detections" \
    >"$OUT/a_detection.json" 2>&1
@CTL@ --socket /run/yoloedge/control.sock status --json >"$OUT/a_ctl.json" 2>"$OUT/a_ctl.err"
stat -c '%U:%G %a' /run/yoloedge /run/yoloedge/control.sock >"$OUT/a_runtime_dir.txt" 2>&1
ps -o user=,group=,supgrp= -p "$(prop MainPID)" >"$OUT/a_ps.txt" 2>&1
grep -E '^(CapBnd|CapEff|Seccomp|NoNewPrivs):' "/proc/$(prop MainPID)/status" >"$OUT/a_proc_status.txt" 2>&1
systemd-analyze security --no-pager yoloedge >"$OUT/a_security.txt" 2>&1

# b) alive after more than the watchdog period: the daemon pets the watchdog
sleep 8
show >"$OUT/b_watchdog.txt"

# c) reload: ExecReload sends SIGHUP, the daemon reloads in place
t=$(now)
timeout 30 systemctl reload yoloedge
echo "rc=$?" >"$OUT/c_reload.rc"
echo "seconds=$(since "$t")" >>"$OUT/c_reload.rc"
for i in $(seq 50); do
    [ "$(prop SubState)" = running ] && journalctl -u yoloedge -q --no-pager | grep -q "configuration reloaded" \
        && break
    sleep 0.2
done
show >"$OUT/c_reload.txt"

# d) a frozen daemon stops petting the watchdog; systemd kills and restarts it
pid=$(prop MainPID)
echo "frozen_pid=$pid" >"$OUT/d_freeze.rc"
t=$(now)
kill -STOP "$pid"
for i in $(seq 150); do
    if [ "$(prop NRestarts)" -ge 1 ] && [ "$(prop SubState)" = running ] && [ "$(prop MainPID)" != "$pid" ]; then
        break
    fi
    sleep 0.2
done
echo "seconds=$(since "$t")" >>"$OUT/d_freeze.rc"
show >"$OUT/d_freeze.txt"

# e) stop: clean exit 0 and a retained "stopped" status. An inactive unit that nothing refers
# to is unloaded at once, so `systemctl show` afterwards sees a fresh unit (ExecMainCode=0,
# NRestarts=0); systemd's debug log has the real exit ("Main process exited, code=exited, ...").
systemctl log-level debug
t=$(now)
timeout 60 systemctl stop yoloedge
echo "rc=$?" >"$OUT/e_stop.rc"
echo "seconds=$(since "$t")" >>"$OUT/e_stop.rc"
systemctl log-level info
show >"$OUT/e_stop.txt"
systemctl show yoloedge >"$OUT/e_show_all.txt"
mosquitto_sub -h 127.0.0.1 -p "$PORT" -C 1 -W 5 -t "$STATUS_TOPIC" >"$OUT/e_status.json" 2>&1

finish complete
"""


def _props(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


class Observations:
    """The files the check script wrote to /out, with the context for failure messages."""

    def __init__(self, out: Path, console: Path):
        self.out = out
        self.console = console

    def text(self, name: str) -> str:
        path = self.out / name
        return path.read_text(errors="replace") if path.exists() else ""

    def props(self, name: str) -> dict[str, str]:
        return _props(self.text(name))

    def context(self) -> str:
        journal = self.text("journal.txt").splitlines()
        check = self.text("check.log").splitlines()
        console = self.console.read_text(errors="replace").splitlines() if self.console.exists() else []
        return ("\n--- journalctl -u yoloedge (last 60 lines) ---\n" + "\n".join(journal[-60:])
                + "\n--- check script trace (last 40 lines) ---\n" + "\n".join(check[-40:])
                + "\n--- container console (last 30 lines) ---\n" + "\n".join(console[-30:]))


def _daemon_config(models: Path, media: Path) -> dict:
    return {
        "device_id": DEVICE,
        "model": {"path": str(models / "yolov8n_coco_int8.onnx")},
        "accelerators": [{"backend": "onnxruntime", "provider": "cpu", "devices": [0], "batch": 1}],
        "cameras": [{"name": "door", "url": str(media / "indoor_people_480p_mpeg4.avi"),
                     "loop": True, "fps": 5}],
        "mqtt": {"host": "127.0.0.1", "port": BROKER_PORT, "topic_prefix": PREFIX,
                 "stats_interval_s": 2, "reconnect_min_s": 0.5, "reconnect_max_s": 2},
        "health": {"stall_timeout_s": 5, "status_interval_s": 1},
        "control": {"socket": "/run/yoloedge/control.sock"},
        "logging": {"level": "info", "target": "auto"},
        "shutdown_timeout_s": 10,
    }


def _require_container_tools() -> None:
    if os.geteuid() != 0:
        skip_unless_required("booting a systemd container needs root", SWITCH)
    _tool("systemd-nspawn")
    _tool("systemd-analyze")
    for name in ("mosquitto", "mosquitto_sub", "mosquitto_pub"):
        _tool(name)
    assert VENV_YOLOEDGE.is_file(), f"{VENV_YOLOEDGE} missing: is the package installed in this venv?"


class Container:
    """One boot of systemd-nspawn over the host's root with the shipped unit, the test's drop-in
    and a check unit that runs `script` (see the module docstring). Files for the container go
    into `ns` (read-only at /ns in it) before `boot()`."""

    def __init__(self, tmp_path: Path, config: dict):
        self.tmp_path = tmp_path
        self.tag = uuid.uuid4().hex[:8]
        self.ns = tmp_path / f"ns-{self.tag}"        # read-only in the container at /ns
        self.units = tmp_path / f"units-{self.tag}"  # /run/systemd/system in the container
        self.out = tmp_path / f"out-{self.tag}"      # /out, written by the check script
        for d in (self.ns, self.units, self.units / "yoloedge.service.d", self.out):
            d.mkdir()
            d.chmod(0o755)
        (self.ns / "yoloedge.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        (self.ns / "mosquitto.conf").write_text(MOSQUITTO_CONF)
        (self.ns / "test.preset").write_text(PRESET)
        shutil.copyfile(UNIT, self.units / "yoloedge.service")  # the shipped unit, unchanged
        drop_in = DROP_IN
        if any(Path(p).resolve().is_relative_to("/tmp") for p in (REPO, REPO.parent / "shared", sys.base_prefix)):
            # test only: CI may clone the checkout (and its venv, and the shared data) under /tmp,
            # which PrivateTmp=yes replaces with an empty directory for the service.
            drop_in += "PrivateTmp=no\n"
        (self.units / "yoloedge.service.d" / "test.conf").write_text(drop_in)
        (self.units / "yoloedge-check.service").write_text(CHECK_UNIT)

    def boot(self, script: str, timeout_s: float, must_see: Iterable[Path] = ()) -> Observations:
        """Run `script` in a booted container; asserts that it finished and the container powered off."""
        for name, value in (("@PREFIX@", PREFIX), ("@DEVICE@", DEVICE), ("@PORT@", str(BROKER_PORT)),
                            ("@CTL@", str(VENV_YOLOEDGE.parent / "yoloedge-ctl")), ("@YOLOEDGE@", str(VENV_YOLOEDGE))):
            script = script.replace(name, value)
        (self.ns / "check.sh").write_text(script)
        for f in self.ns.iterdir():
            if f.is_file():
                f.chmod(0o644)
        binds_ro = [str(REPO), str(REPO.parent / "shared")]
        # Where either is a symlink, its target must be visible in the container too.
        binds_ro += [str(Path(b).resolve()) for b in binds_ro if str(Path(b).resolve()) not in binds_ro]
        if not Path(sys.base_prefix).resolve().is_relative_to("/usr"):
            binds_ro.append(str(Path(sys.base_prefix).resolve()))
        for path in (Path(sys.prefix), VENV_YOLOEDGE.resolve(), *must_see):
            assert any(path.resolve().is_relative_to(b) or str(path).startswith("/usr") for b in binds_ro), \
                f"{path} is not inside a path bound into the container {binds_ro}"
        machine = f"yoloedge-test-{self.tag}"
        cmd = [
            "timeout", "--kill-after=15", str(timeout_s),
            _tool("systemd-nspawn"), "--quiet", "-D", "/", "--volatile=yes", "--keep-unit", "--register=no",
            "--private-network", f"--machine={machine}", "--console=read-only", "-b",
            *[f"--bind-ro={p}" for p in binds_ro],
            f"--bind-ro={self.ns}:/ns",
            f"--bind-ro={self.ns / 'test.preset'}:/run/systemd/system-preset/00-yoloedge-test.preset",
            f"--bind-ro={self.units}:/run/systemd/system", f"--bind={self.out}:/out",
            "systemd.firstboot=off",               # else the empty /etc starts the First Boot Wizard
            "systemd.mask=mosquitto.service",      # presets enable it; the test runs its own broker
            # The unit wants network-online.target; with only lo, networkd-wait-online would hold it (and
            # `systemctl start yoloedge`) for its 2-minute timeout.
            "systemd.mask=systemd-networkd-wait-online.service",
            "systemd.wants=yoloedge-check.service",
        ]
        console = self.tmp_path / f"console-{self.tag}.log"
        t0 = time.monotonic()
        with console.open("w") as log:
            proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=timeout_s + 30)
        elapsed = time.monotonic() - t0
        obs = Observations(self.out, console)
        print(f"\nnspawn run: {elapsed:.1f} s, rc {proc.returncode}; files in {self.out}")
        for name in sorted(self.out.glob("*.rc")):
            print(f"  {name.name}: {' '.join(obs.text(name.name).split())}")
        assert proc.returncode != 124, f"the container did not power off within {timeout_s} s{obs.context()}"
        assert obs.text("done").strip() == "complete", \
            f"the check script did not finish ({obs.text('done').strip() or 'no /out/done'}){obs.context()}"
        assert proc.returncode == 0, f"systemd-nspawn exited {proc.returncode}{obs.context()}"
        return obs


@pytest.mark.shared
def test_unit_under_real_systemd(tmp_path, models, media):
    _require_container_tools()
    container = Container(tmp_path, _daemon_config(models, media))
    obs = container.boot(CHECK_SCRIPT, NSPAWN_TIMEOUT_S, must_see=(models, media))

    # a) `systemctl start` returned after READY=1: already active/running, with our STATUS=.
    start_rc = obs.props("a_start.rc")
    a = obs.props("a_start.txt")
    assert start_rc.get("rc") == "0", f"systemctl start yoloedge failed: {start_rc}{obs.context()}"
    assert (a.get("ActiveState"), a.get("SubState")) == ("active", "running"), f"after start: {a}{obs.context()}"
    assert a.get("StatusText", "").startswith(("starting", "running")), f"no STATUS= from the daemon: {a}"
    assert a.get("WatchdogUSec") == "3s", f"drop-in WatchdogSec=3 not applied: {a}"
    assert a.get("NRestarts") == "0", a
    assert "online" in obs.text("a_status.json"), f"retained status after start: {obs.text('a_status.json')!r}"
    detection = obs.text("a_detection.json")
    assert detection.startswith("{") and json.loads(detection)["camera"] == "door", \
        f"no detection message from the running service: {detection!r}{obs.context()}"
    ctl = json.loads(obs.text("a_ctl.json") or "{}")
    assert ctl.get("ok") and ctl["daemon"]["state"] == "running", \
        f"yoloedge-ctl status over /run/yoloedge/control.sock: {obs.text('a_ctl.json')!r} {obs.text('a_ctl.err')!r}"
    assert obs.text("a_runtime_dir.txt").split("\n")[0].startswith("yoloedge:yoloedge 750"), \
        f"RuntimeDirectory=yoloedge: {obs.text('a_runtime_dir.txt')!r}"
    proc = dict(line.split(":", 1) for line in obs.text("a_proc_status.txt").splitlines() if ":" in line)
    assert int(proc.get("CapBnd", "-1").strip(), 16) == 0, f"capabilities left: {proc}{obs.context()}"
    assert proc.get("Seccomp", "").strip() == "2", f"no system call filter in force: {proc}{obs.context()}"
    # The loaded unit as systemd sees it (with the test's drop-in, which only relaxes ProtectHome=).
    assert _exposure(obs.text("a_security.txt")) <= MAX_EXPOSURE + 0.5, obs.text("a_security.txt")
    assert obs.text("a_ps.txt").split()[:2] == ["yoloedge", "yoloedge"], \
        f"the daemon does not run as User=yoloedge: {obs.text('a_ps.txt')!r}"

    # b) still running after more than the watchdog period: the daemon pets the watchdog.
    b = obs.props("b_watchdog.txt")
    assert (b.get("ActiveState"), b.get("SubState"), b.get("NRestarts")) == ("active", "running", "0"), \
        f"8 s after start with WatchdogSec=3: {b}{obs.context()}"
    assert b.get("MainPID") == a.get("MainPID"), f"the daemon was replaced: {a} -> {b}{obs.context()}"

    # c) reload = SIGHUP, in place.
    reload_rc = obs.props("c_reload.rc")
    c = obs.props("c_reload.txt")
    journal = obs.text("journal.txt")
    assert reload_rc.get("rc") == "0", f"systemctl reload yoloedge failed: {reload_rc}{obs.context()}"
    assert (c.get("ActiveState"), c.get("SubState")) == ("active", "running"), f"after reload: {c}{obs.context()}"
    assert c.get("MainPID") == a.get("MainPID") and c.get("NRestarts") == "0", \
        f"reload restarted the daemon: {a} -> {c}{obs.context()}"
    assert "configuration reloaded: generation 2" in journal, f"no reload log line{obs.context()}"

    # d) frozen daemon: watchdog timeout, killed, restarted.
    d = obs.props("d_freeze.txt")
    frozen = obs.props("d_freeze.rc")
    assert "Watchdog timeout" in journal, f"no watchdog timeout after SIGSTOP{obs.context()}"
    assert int(d.get("NRestarts", "0")) >= 1, f"not restarted after the watchdog timeout: {d}{obs.context()}"
    assert d.get("MainPID") not in ("0", frozen.get("frozen_pid")), f"same/no main PID: {frozen} -> {d}"
    assert (d.get("ActiveState"), d.get("SubState")) == ("active", "running"), f"after restart: {d}{obs.context()}"
    assert float(frozen.get("seconds", "99")) < 20, f"watchdog restart took {frozen}{obs.context()}"

    # e) clean stop: STOPPING=1, exit 0 (not killed by the SIGTERM), Result=success, retained `stopped`.
    stop_rc = obs.props("e_stop.rc")
    e = obs.props("e_stop.txt")
    assert stop_rc.get("rc") == "0", f"systemctl stop yoloedge failed: {stop_rc}{obs.context()}"
    assert (e.get("ActiveState"), e.get("Result")) == ("inactive", "success"), f"after stop: {e}{obs.context()}"
    if e.get("MainPID") == "0" and e.get("ExecMainCode") == "0":
        # systemd unloads ("Collecting.") an inactive unit nothing refers to, so `show` reports a
        # fresh one: read the exit from systemd's own (debug) log of the stop instead.
        stop_log = journal[journal.rfind("Stopping yoloedge.service"):]
        assert "yoloedge.service: Main process exited, code=exited, status=0/SUCCESS" in stop_log, \
            f"the daemon did not exit 0 on SIGTERM{obs.context()}"
        assert "yoloedge.service: Deactivated successfully." in stop_log, f"stop result{obs.context()}"
        assert "Failed with result" not in stop_log, f"stop result{obs.context()}"
        assert "STOPPING=1" in stop_log, f"no STOPPING=1 from the daemon on SIGTERM{obs.context()}"
    else:
        # code 1 = CLD_EXITED: the daemon exited by itself with 0, it was not killed by the SIGTERM.
        assert (e.get("ExecMainCode"), e.get("ExecMainStatus")) == ("1", "0"), f"exit after stop: {e}{obs.context()}"
    status = obs.text("e_status.json")
    assert status.startswith("{") and json.loads(status).get("state") == "stopped", \
        f"retained status after stop: {status!r}{obs.context()}"
    assert "stopped" in journal and "ready:" in journal, f"daemon log lines missing from the journal{obs.context()}"
    assert "but the mode is different" not in journal, \
        f"the unit's *DirectoryMode= disagrees with the directories docs/operations/systemd.md creates{obs.context()}"

    # Logging target auto under systemd writes to the journal's native socket with our fields.
    entries = [json.loads(line) for line in obs.text("journal.json").splitlines() if line.startswith("{")]
    ours = [m for m in entries if m.get("CODE_FUNC") or m.get("THREAD_NAME")]
    assert ours, f"no structured journal entries from the daemon{obs.context()}"
    assert any(m.get("CAMERA") == "door" for m in entries), \
        f"no journal entry with CAMERA=door: fields seen {sorted({k for m in ours for k in m})}"


# -- an Atlas host: CANN's set_env.sh through `yoloedge ascend-env` ---------------------------------

ASCEND_TIMEOUT_S = 240  # three starts of the daemon in one boot
TOOLKIT_HOME = "/ns/Ascend/ascend-toolkit/latest"

#: a stand-in for CANN's ascend-toolkit/set_env.sh, in its style; the last two exports are the test's
STAND_IN_SET_ENV = r"""#!/bin/bash
path="${BASH_SOURCE[0]}"
if [[ -f "$path" ]] && [[ "$path" =~ set_env.sh ]]; then
    toolkit_path=$(cd "$(dirname "$path")"; pwd)
    export ASCEND_TOOLKIT_HOME=${toolkit_path}/latest
    export LD_LIBRARY_PATH=/usr/local/Ascend/driver/lib64:/usr/local/Ascend/driver/lib64/common:$LD_LIBRARY_PATH
    export LD_LIBRARY_PATH=${ASCEND_TOOLKIT_HOME}/lib64:${ASCEND_TOOLKIT_HOME}/lib64/plugin/opskernel:${LD_LIBRARY_PATH}
    export PYTHONPATH=${ASCEND_TOOLKIT_HOME}/opp/built-in/op_impl/ai_core/tbe:$PYTHONPATH
    export PYTHONPATH=${ASCEND_TOOLKIT_HOME}/python/site-packages:$PYTHONPATH
    export PATH=${ASCEND_TOOLKIT_HOME}/bin:$PATH
    export ASCEND_AICPU_PATH=${ASCEND_TOOLKIT_HOME}
    export ASCEND_OPP_PATH=${ASCEND_TOOLKIT_HOME}/opp
fi
if [ -d "${ASCEND_TOOLKIT_HOME}/tools/aml" ]; then
    export LD_LIBRARY_PATH=${ASCEND_TOOLKIT_HOME}/tools/aml/lib64:$LD_LIBRARY_PATH
fi
# test only: where the fake pyACL reports what the daemon did with it, and a value that needs quoting
export YOLOEDGE_FAKE_ACL_REPORT=/var/lib/yoloedge/acl-report.json
export YOLOEDGE_TEST_QUOTING="two  spaces \$HOME \"double\" 'single' back\\slash
second line"
"""

#: what the daemon's environment must hold, from the script above (written out by hand)
STAND_IN_VARIABLES = {
    "ASCEND_TOOLKIT_HOME": TOOLKIT_HOME,
    "LD_LIBRARY_PATH": f"{TOOLKIT_HOME}/lib64:{TOOLKIT_HOME}/lib64/plugin/opskernel:/usr/local/Ascend/driver/lib64:"
                       "/usr/local/Ascend/driver/lib64/common",
    "PYTHONPATH": f"{TOOLKIT_HOME}/python/site-packages:{TOOLKIT_HOME}/opp/built-in/op_impl/ai_core/tbe",
    "ASCEND_AICPU_PATH": TOOLKIT_HOME,
    "ASCEND_OPP_PATH": f"{TOOLKIT_HOME}/opp",
    "YOLOEDGE_FAKE_ACL_REPORT": "/var/lib/yoloedge/acl-report.json",
    "YOLOEDGE_TEST_QUOTING": "two  spaces $HOME \"double\" 'single' back\\slash\nsecond line",
}

ASCEND_SCRIPT = PRELUDE + r"""
SET_ENV=/ns/Ascend/ascend-toolkit/set_env.sh
DETECTIONS=@PREFIX@/@DEVICE@/cameras/door/detections

# a) the shipped unit without ascend.env: pyACL is not found, the start fails and says what to do
timeout 60 systemctl start yoloedge
echo "rc=$?" >"$OUT/a_start.rc"
systemctl stop yoloedge
systemctl reset-failed yoloedge
journalctl -u yoloedge --no-pager -o cat >"$OUT/a_journal.txt" 2>&1

# b) docs/hardware/ascend.md's one-time step; then the same unit starts the Ascend daemon
@YOLOEDGE@ ascend-env --set-env "$SET_ENV" -o /etc/yoloedge/ascend.env >"$OUT/b_generate.txt" 2>&1
echo "rc=$?" >"$OUT/b_generate.rc"
cp /etc/yoloedge/ascend.env "$OUT/b_ascend.env"
stat -c '%U:%G %a' /etc/yoloedge/ascend.env >"$OUT/b_mode.txt"
timeout 60 systemctl start yoloedge
echo "rc=$?" >"$OUT/b_start.rc"
show >"$OUT/b_start.txt"
[ "$(prop ActiveState)" = active ] || finish "the Ascend daemon did not start with ascend.env"
cat "/proc/$(prop MainPID)/environ" >"$OUT/b_environ.bin"
mosquitto_sub -h 127.0.0.1 -p "$PORT" -C 1 -W 60 -t "$DETECTIONS" >"$OUT/b_detection.json" 2>&1
@CTL@ --socket /run/yoloedge/control.sock status --json >"$OUT/b_ctl.json" 2>"$OUT/b_ctl.err"
timeout 60 systemctl stop yoloedge
echo "rc=$?" >"$OUT/b_stop.rc"
cp /var/lib/yoloedge/acl-report.json "$OUT/b_acl_report.json"

# c) docs/hardware/ascend.md's optional drop-in: the file is written again before each start
rm /etc/yoloedge/ascend.env
install -d /etc/systemd/system/yoloedge.service.d
install -m 0644 /ns/ascend-env.conf /etc/systemd/system/yoloedge.service.d/ascend-env.conf
systemctl daemon-reload
timeout 60 systemctl start yoloedge
echo "rc=$?" >"$OUT/c_start.rc"
show >"$OUT/c_start.txt"
cat "/proc/$(prop MainPID)/environ" >"$OUT/c_environ.bin"
ls /etc/yoloedge >"$OUT/c_files.txt"
timeout 60 systemctl stop yoloedge
echo "rc=$?" >"$OUT/c_stop.rc"

finish complete
"""


def docs_drop_in() -> str:
    """The optional drop-in as docs/hardware/ascend.md shows it, for this container's paths."""
    readme = (REPO / "docs" / "hardware" / "ascend.md").read_text()
    match = re.search(r"```ini\n(\[Service\]\nExecStartPre=\+/opt/yoloedge/bin/yoloedge ascend-env [^\n]*\n)```",
                      readme)
    assert match, "docs/hardware/ascend.md has no ExecStartPre= drop-in for `yoloedge ascend-env`"
    return (match.group(1).replace(SHIPPED_EXEC, str(VENV_YOLOEDGE))
            .replace("/usr/local/Ascend/ascend-toolkit/set_env.sh", "/ns/Ascend/ascend-toolkit/set_env.sh"))


def stand_in_cann(ns: Path, models: Path) -> None:
    """/ns/Ascend/ascend-toolkit: the stand-in set_env.sh, and the fake pyACL where CANN keeps
    pyACL (python/site-packages); /ns/model.om, a fake .om running the shared ONNX."""
    toolkit = ns / "Ascend" / "ascend-toolkit"
    site = toolkit / "latest" / "python" / "site-packages"
    shutil.copytree(REPO / "tests" / "fakes" / "acl", site / "acl", ignore=shutil.ignore_patterns("__pycache__"))
    (toolkit / "set_env.sh").write_text(STAND_IN_SET_ENV)
    (ns / "model.om").write_bytes(b"fake om: see the .fake.json next to it")
    (ns / "model.om.fake.json").write_text(json.dumps({"onnx": str(models / "yolov8n_coco_int8.onnx"), "batch": 1,
                                                       "aipp": False}))
    (ns / "ascend-env.conf").write_text(docs_drop_in())
    for folder, _dirs, files in os.walk(ns / "Ascend"):
        os.chmod(folder, 0o755)
        for name in files:
            os.chmod(os.path.join(folder, name), 0o644)


def _environ(data: bytes) -> dict[str, str]:
    return dict(entry.split("=", 1) for entry in data.decode().split("\0") if "=" in entry)


@pytest.mark.shared
def test_an_ascend_daemon_starts_under_the_unit_with_cann_variables_from_ascend_env(tmp_path, models, media):
    _require_container_tools()
    config = _daemon_config(models, media)
    config["model"] = {"path": "/ns/model.om"}
    config["accelerators"] = [{"backend": "ascend", "devices": [0], "batch": 1}]
    container = Container(tmp_path, config)
    stand_in_cann(container.ns, models)
    obs = container.boot(ASCEND_SCRIPT, ASCEND_TIMEOUT_S, must_see=(models, media))

    # a) without the file the shipped unit cannot import acl, and the journal says what to run
    assert obs.props("a_start.rc").get("rc") != "0", f"started without CANN's variables{obs.context()}"
    assert "yoloedge ascend-env -o /etc/yoloedge/ascend.env" in obs.text("a_journal.txt"), obs.text("a_journal.txt")

    # b) written once, read by the unit's EnvironmentFile=: READY, and the stand-in's acl at work
    assert obs.props("b_generate.rc").get("rc") == "0", obs.text("b_generate.txt")
    assert obs.text("b_mode.txt").strip() == "root:root 644"
    assert obs.props("b_start.rc").get("rc") == "0", f"systemctl start failed with ascend.env{obs.context()}"
    b = obs.props("b_start.txt")
    assert (b.get("ActiveState"), b.get("SubState")) == ("active", "running"), f"{b}{obs.context()}"
    assert b.get("StatusText", "").startswith(("starting", "running")), f"no READY/STATUS from the daemon: {b}"
    environ = _environ((obs.out / "b_environ.bin").read_bytes())
    for name, value in STAND_IN_VARIABLES.items():
        assert environ.get(name) == value, f"{name} in the daemon's environment: {environ.get(name)!r}"
    assert environ["PATH"].startswith(f"{TOOLKIT_HOME}/bin:/usr/local/sbin:"), environ["PATH"]
    detection = obs.text("b_detection.json")
    assert detection.startswith("{") and json.loads(detection)["camera"] == "door", \
        f"no detection message from the Ascend daemon: {detection!r}{obs.context()}"
    workers = json.loads(obs.text("b_ctl.json") or "{}").get("accelerators", [])
    assert [(w["backend"], w["state"]) for w in workers] == [("ascend", "running")], obs.text("b_ctl.json")
    assert obs.props("b_stop.rc").get("rc") == "0"
    report = json.loads(obs.text("b_acl_report.json") or "{}")  # written by the stand-in acl only
    assert report.get("init_count") == 1 and report.get("finalize_count") == 1, \
        f"the daemon did not run the stand-in pyACL: {report}{obs.context()}"
    assert report["calls"].get("acl.mdl.execute", 0) >= 1, report["calls"]

    # c) the docs' drop-in: the file removed, written again by ExecStartPre=+, read for the daemon
    assert obs.props("c_start.rc").get("rc") == "0", f"start with the ExecStartPre= drop-in failed{obs.context()}"
    c = obs.props("c_start.txt")
    assert (c.get("ActiveState"), c.get("SubState")) == ("active", "running"), f"{c}{obs.context()}"
    assert "ascend.env" in obs.text("c_files.txt").split()
    again = _environ((obs.out / "c_environ.bin").read_bytes())
    assert {name: again.get(name) for name in STAND_IN_VARIABLES} == STAND_IN_VARIABLES
    assert obs.props("c_stop.rc").get("rc") == "0"
