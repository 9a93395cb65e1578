"""The daemon end to end, as a subprocess, with real parts: mosquitto, a GStreamer RTSP server,
the shared YOLOv8 model and video files, and a test-owned NOTIFY_SOCKET in place of systemd."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import cv2
import pytest

from daemon_harness import REPO, Daemon, NotifySocket, ctl, status, write_config
from parity import mismatches, without_track_ids

pytestmark = pytest.mark.shared

PREFIX = "yt"
DEVICE = "edge1"
TS_PATTERN = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")


def topic(*parts: str) -> str:
    return "/".join((PREFIX, DEVICE, *parts))


def base_config(tmp_path: Path, models: Path, broker, cameras: list[dict], **extra) -> dict:
    config = {
        "device_id": DEVICE,
        "model": {"path": str(models / "yolov8n_coco_int8.onnx")},
        "accelerators": [{"backend": "onnxruntime", "provider": "cpu", "devices": [0], "batch": 1}],
        "cameras": cameras,
        "mqtt": {"host": broker.host, "port": broker.port, "topic_prefix": PREFIX,
                 "stats_interval_s": 1, "reconnect_min_s": 0.5, "reconnect_max_s": 2},
        "health": {"stall_timeout_s": 3, "status_interval_s": 1},
        "control": {"socket": str(tmp_path / "run" / "control.sock")},
        "shutdown_timeout_s": 10,
    }
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key].update(value)
        else:
            config[key] = value
    return config


@pytest.fixture()
def notify(tmp_path):
    sock = NotifySocket(tmp_path / "notify.sock")
    yield sock
    sock.close()


@pytest.fixture()
def start_daemon(tmp_path, notify):
    daemons: list[Daemon] = []

    def start(config: dict, **kwargs) -> tuple[Daemon, Path]:
        path = write_config(tmp_path / "yoloedge.yaml", config)
        daemon = Daemon(path, notify, **kwargs)
        daemons.append(daemon)
        return daemon, path

    yield start
    for d in daemons:
        d.kill()


def detections_by_frame(sub, camera: str) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for payload in sub.payloads(topic("cameras", camera, "detections")):
        out.setdefault(payload["frame"], []).append(payload)
    return out


def states(sub, camera: str) -> list[str]:
    return [p["state"] for p in sub.payloads(topic("cameras", camera, "state"))]


def check_message_schema(msg: dict, camera: str, width: int, height: int) -> None:
    assert set(msg) == {"v", "camera", "frame", "ts", "width", "height", "model", "latency_ms", "detections"}
    assert msg["v"] == 1 and msg["camera"] == camera and msg["model"] == "yolov8n_coco_int8"
    assert (msg["width"], msg["height"]) == (width, height)
    assert TS_PATTERN.match(msg["ts"]), msg["ts"]
    assert isinstance(msg["frame"], int) and msg["latency_ms"] >= 0
    for det in msg["detections"]:
        assert set(det) == {"label", "class_id", "score", "box", "track_id"}  # tracking is on by default
        assert det["track_id"] is None or isinstance(det["track_id"], str)
        x1, y1, x2, y2 = det["box"]
        assert 0 <= x1 <= x2 <= width and 0 <= y1 <= y2 <= height
        assert 0 < det["score"] <= 1


def test_two_cameras_end_to_end_then_clean_stop(tmp_path, models, media, references, mosquitto,
                                                subscriber, rtsp_server, notify, start_daemon):
    video = media / "indoor_people_480p_mpeg4.avi"
    config = base_config(tmp_path, models, mosquitto, [
        {"name": "door", "url": str(video), "realtime": False},
        {"name": "street", "url": rtsp_server.url(), "fps": 2},
    ])
    daemon, _ = start_daemon(config)
    notify.wait_for("READY", "1", timeout=60)
    assert subscriber.wait_for(lambda ms: len(detections_by_frame(subscriber, "door")) >= 84, 90), daemon.log
    assert subscriber.wait_for(lambda ms: len(detections_by_frame(subscriber, "street")) >= 3, 30), daemon.log

    door = detections_by_frame(subscriber, "door")
    assert sorted(door) == list(range(84)), "every frame of the file published"
    assert all(len(msgs) == 1 for msgs in door.values()), "no frame published twice"
    for msgs in door.values():
        check_message_schema(msgs[0], "door", 640, 480)
    for msgs in detections_by_frame(subscriber, "street").values():
        check_message_schema(msgs[0], "street", 1280, 720)

    # The boxes are Ultralytics' on every frame...
    ref = json.loads((references / "yolov8n_coco_int8__indoor_people_480p_mpeg4__conf25_iou45.json").read_text())
    for frame in ref["frames"]:
        problems = mismatches(door[frame["index"]][0]["detections"], frame["detections"])
        assert not problems, f"frame {frame['index']}: {problems}"
    # ...and exactly what `yoloedge detect` says about the same frames.
    cap = cv2.VideoCapture(str(video))
    picked = {0: None, 41: None, 83: None}
    for index in range(84):
        ok, image = cap.read()
        assert ok
        if index in picked:
            picked[index] = tmp_path / f"frame{index}.png"
            cv2.imwrite(str(picked[index]), image)
    cap.release()
    cli = subprocess.run([sys.executable, "-m", "yoloedge", "detect", "--json",
                          "--model", config["model"]["path"], *map(str, picked.values())],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    for (index, _), line in zip(picked.items(), cli.stdout.splitlines()):
        assert json.loads(line)["detections"] == without_track_ids(door[index][0]["detections"])

    # Retained status and camera states; yoloedge-ctl sees both cameras.
    assert subscriber.payloads(topic("status"))[-1]["state"] == "online"
    assert "streaming" in states(subscriber, "street") and states(subscriber, "door")[-1] == "ended"
    assert subscriber.wait_for(lambda ms: len(ms) >= 1, 5, topic=topic("stats"))
    result = ctl(config["control"]["socket"], "status")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "door" in result.stdout and "street" in result.stdout
    st = status(config["control"]["socket"])
    assert st["daemon"]["state"] == "running" and st["mqtt"]["connected"]
    assert {c["name"]: c["state"] for c in st["cameras"]} == {"door": "ended", "street": "streaming"}
    assert notify.with_key("STATUS")

    t0 = time.monotonic()
    assert daemon.stop(timeout=30) == 0, daemon.log
    assert time.monotonic() - t0 < config["shutdown_timeout_s"]
    assert notify.with_key("STOPPING", "1")
    assert subscriber.wait_for(lambda ms: ms and json.loads(ms[-1].payload)["state"] == "stopped", 5,
                               topic=topic("status"))
    assert not Path(config["control"]["socket"]).exists()


def test_rtsp_freeze_and_restart_are_detected_and_recovered(tmp_path, models, mosquitto, subscriber,
                                                            rtsp_server, notify, start_daemon):
    config = base_config(tmp_path, models, mosquitto, [
        {"name": "street", "url": rtsp_server.url(), "fps": 2, "read_timeout_s": 2, "open_timeout_s": 3,
         "backoff_initial_s": 0.5, "backoff_max_s": 2},
    ])
    stall_timeout = config["health"]["stall_timeout_s"]
    daemon, _ = start_daemon(config)
    notify.wait_for("READY", "1", timeout=60)
    state_topic = topic("cameras", "street", "state")
    assert subscriber.wait_for(lambda ms: "streaming" in states(subscriber, "street"), 30), daemon.log

    rtsp_server.freeze()
    frozen_at = time.monotonic()
    assert subscriber.wait_for(lambda ms: "stalled" in states(subscriber, "street"), stall_timeout + 10), daemon.log
    stalled_after = time.monotonic() - frozen_at
    assert stalled_after <= stall_timeout + 2, f"stall seen after {stalled_after:.1f} s"
    rtsp_server.resume()
    n = len(states(subscriber, "street"))
    assert subscriber.wait_for(lambda ms: "streaming" in states(subscriber, "street")[n:], 30), daemon.log

    rtsp_server.kill()
    n = len(states(subscriber, "street"))
    assert subscriber.wait_for(lambda ms: set(states(subscriber, "street")[n:]) & {"stalled", "backoff"}, 15)
    rtsp_server.restart()
    n2 = len(states(subscriber, "street"))
    assert subscriber.wait_for(lambda ms: "streaming" in states(subscriber, "street")[n2:], 30), daemon.log
    frames_before = len(detections_by_frame(subscriber, "street"))
    assert subscriber.wait_for(lambda ms: len(detections_by_frame(subscriber, "street")) > frames_before + 2, 15)
    st = status(config["control"]["socket"])
    cam = st["cameras"][0]
    assert cam["reconnects"] >= 1 and cam["stalls"] >= 1
    assert state_topic in {m.topic for m in subscriber.messages()}
    assert daemon.stop() == 0, daemon.log[-4000:]


def test_broker_outage_loses_and_duplicates_nothing(tmp_path, models, media, mosquitto_factory,
                                                     subscriber_factory, notify, start_daemon):
    broker = mosquitto_factory(persistence=True)
    camera_topic = topic("cameras", "door", "detections")
    sub = subscriber_factory(broker, (camera_topic,), client_id="outage-sub", clean_session=False)
    config = base_config(tmp_path, models, broker, [
        {"name": "door", "url": str(media / "indoor_people_480p_mpeg4.avi"), "realtime": False},
    ], mqtt={"queue_limit": 1000})
    daemon, _ = start_daemon(config)
    notify.wait_for("READY", "1", timeout=60)
    assert sub.wait_for(lambda ms: len(ms) >= 3, 30), daemon.log
    broker.stop()
    before = {json.loads(m.payload)["frame"] for m in sub.messages(camera_topic)}
    time.sleep(10)
    during = status(config["control"]["socket"])["mqtt"]
    assert during["connected"] is False and during["queued"] > 0
    broker.start()
    assert sub.wait_for(lambda ms: len({json.loads(m.payload)["frame"] for m in ms}) >= 84, 60), daemon.log
    time.sleep(1)
    frames = [json.loads(m.payload)["frame"] for m in sub.messages(camera_topic)]
    assert sorted(set(frames)) == list(range(84))
    # QoS 1 is at-least-once: a message in flight when the broker went down (sent, PUBACK not
    # yet back) is sent again after the reconnect. Everything published while the broker was
    # away must arrive exactly once.
    queued_in_outage = set(range(84)) - before
    repeated = {f for f in set(frames) if frames.count(f) > 1}
    assert not (repeated & queued_in_outage), f"duplicated by our side: {sorted(repeated & queued_in_outage)}"
    assert all(frames.count(f) <= 2 for f in repeated)
    after = status(config["control"]["socket"])["mqtt"]
    assert after["dropped"] == 0 and after["connected"]
    assert daemon.stop() == 0, daemon.log[-4000:]


def test_hung_inference_stops_the_watchdog_pings(tmp_path, models, media, mosquitto, notify, start_daemon):
    hang = tmp_path / "hang"
    config = base_config(tmp_path, models, mosquitto, [
        {"name": "door", "url": str(media / "indoor_people_480p_mpeg4.avi"), "loop": True, "fps": 5},
    ])
    config["accelerators"] = [{"backend": "blocking_backend:BlockingBackend", "devices": [0], "batch": 1,
                               "inference_timeout_s": 2, "options": {"hang_file": str(hang)}}]
    daemon, _ = start_daemon(config, watchdog_usec=1_000_000)
    notify.wait_for("READY", "1", timeout=60)
    notify.wait_for("WATCHDOG", "1", timeout=10, count=3)
    assert ctl(config["control"]["socket"], "status").returncode == 0

    hang.touch()
    hung_at = time.monotonic()
    time.sleep(4)
    late_pings = [t for t, _ in notify.with_key("WATCHDOG", "1") if t > hung_at + 2.5]
    assert late_pings == [], "watchdog still petted while the inference hangs"
    degraded = ctl(config["control"]["socket"], "status")
    assert degraded.returncode == 1, degraded.stdout
    assert "running for" in degraded.stdout
    # Said once, not on every tick of the main loop (it flooded the journal, ~10 lines a second).
    assert daemon.log.count("not petting the systemd watchdog") == 1, daemon.log[-4000:]

    hang.unlink()
    resumed = time.monotonic()
    deadline = resumed + 10
    while time.monotonic() < deadline and not [t for t, _ in notify.with_key("WATCHDOG", "1") if t > resumed]:
        time.sleep(0.1)
    assert [t for t, _ in notify.with_key("WATCHDOG", "1") if t > resumed], "pings did not resume"
    assert daemon.stop() == 0, daemon.log[-4000:]


def test_second_signal_forces_exit(tmp_path, models, media, mosquitto, notify, start_daemon):
    hang = tmp_path / "hang"
    config = base_config(tmp_path, models, mosquitto, [
        {"name": "door", "url": str(media / "indoor_people_480p_mpeg4.avi"), "loop": True, "fps": 5},
    ], shutdown_timeout_s=60)
    config["accelerators"] = [{"backend": "blocking_backend:BlockingBackend", "devices": [0],
                               "inference_timeout_s": 30, "options": {"hang_file": str(hang)}}]
    daemon, _ = start_daemon(config)
    notify.wait_for("READY", "1", timeout=60)
    hang.touch()
    time.sleep(1)
    daemon.signal(signal.SIGTERM)
    notify.wait_for("STOPPING", "1", timeout=5)
    time.sleep(0.5)
    assert daemon.proc.poll() is None  # still draining: the inference hangs
    daemon.signal(signal.SIGTERM)
    assert daemon.proc.wait(5) == 1
    assert "second signal" in daemon.log


def test_sighup_adds_and_removes_cameras_and_rejects_a_broken_file(tmp_path, models, media, mosquitto,
                                                                    subscriber, notify, start_daemon):
    avi = str(media / "indoor_people_480p_mpeg4.avi")
    config = base_config(tmp_path, models, mosquitto, [
        {"name": "first", "url": avi, "loop": True, "fps": 3},
    ])
    daemon, path = start_daemon(config)
    notify.wait_for("READY", "1", timeout=60)
    sock = config["control"]["socket"]
    assert subscriber.wait_for(lambda ms: detections_by_frame(subscriber, "first"), 20)

    config["cameras"] = [{"name": "second", "url": avi, "loop": True, "fps": 3}]
    write_config(path, config)
    daemon.signal(signal.SIGHUP)
    notify.wait_for("READY", "1", timeout=20, count=2)
    assert notify.with_key("RELOADING", "1")
    assert subscriber.wait_for(lambda ms: detections_by_frame(subscriber, "second"), 20), daemon.log
    st = status(sock)
    assert [c["name"] for c in st["cameras"]] == ["second"]
    assert st["daemon"]["generation"] == 2 and st["daemon"]["config_error"] is None
    # The removed camera's retained state is cleared; it publishes nothing more.
    assert subscriber.wait_for(lambda ms: any(not m.payload for m in ms), 5,
                               topic=topic("cameras", "first", "state"))
    count = len(subscriber.messages(topic("cameras", "first", "detections")))
    time.sleep(1.5)
    assert len(subscriber.messages(topic("cameras", "first", "detections"))) == count

    path.write_text(path.read_text().replace("fps: 3", "fps: -3"))
    daemon.signal(signal.SIGHUP)
    notify.wait_for("READY", "1", timeout=20, count=3)
    st = status(sock)
    assert st["daemon"]["generation"] == 2
    assert "fps" in st["daemon"]["config_error"] and "yoloedge.yaml" in st["daemon"]["config_error"]
    assert st["daemon"]["healthy"] is False
    rejected = ctl(sock, "status")
    assert rejected.returncode == 1 and "fps" in rejected.stdout
    n = len(detections_by_frame(subscriber, "second"))
    assert subscriber.wait_for(lambda ms: len(detections_by_frame(subscriber, "second")) > n + 2, 10)

    write_config(path, config)  # fixed again; `yoloedge-ctl reload` applies it
    result = ctl(sock, "reload")
    assert result.returncode == 0, result.stdout + result.stderr
    st = status(sock)
    assert st["daemon"]["generation"] == 3 and st["daemon"]["config_error"] is None
    assert daemon.stop() == 0, daemon.log[-4000:]


def test_config_error_exits_78_before_starting_anything(tmp_path, models, mosquitto, notify, start_daemon):
    config = base_config(tmp_path, models, mosquitto, [{"name": "x", "url": "rtsp://h/x", "fpss": 3}])
    daemon, _ = start_daemon(config)
    assert daemon.proc.wait(30) == 78
    assert "fpss" in daemon.log and "did you mean" in daemon.log
    assert notify.messages == []
    assert not Path(config["control"]["socket"]).exists()


def test_a_dry_run_on_the_simulated_device_publishes_the_models_real_detections(
        tmp_path, mosquitto, subscriber, notify, start_daemon):
    """`backend: simulated` with synthetic cameras: no card, no camera, and still every camera's
    messages carry what the model really finds on the image (the demo model on a demo frame),
    mapped back to the camera's frame size, in frame order, from a device that reports busy time."""
    from yoloedge import demo
    from yoloedge.config import ModelConfig
    from yoloedge.pipeline.detector import open_detector

    cap = cv2.VideoCapture(str(demo.clip_path()))
    ok, shot = cap.read()
    cap.release()
    assert ok
    image = tmp_path / "shot.png"
    cv2.imwrite(str(image), shot)
    height, width = shot.shape[:2]
    real = open_detector(ModelConfig(path=str(demo.MODEL), labels=str(demo.LABELS)))
    expected = real.detect([shot])[0].to_dicts(real.labels)
    real.close()
    assert expected

    config = base_config(tmp_path, Path("unused"), mosquitto, [
        {"name": f"sim{i}", "url": f"synthetic://{width}x{height}?fps=20&image={image}"} for i in range(3)])
    config["model"] = {"path": str(demo.MODEL), "labels": str(demo.LABELS)}
    config["accelerators"] = [{"name": "plan", "backend": "simulated", "batch": 4,
                               "simulated": {"device_ms": [2, 1], "image": str(image)}}]
    daemon, _ = start_daemon(config)
    notify.wait_for("READY", "1", timeout=60)
    assert subscriber.wait_for(
        lambda ms: all(len(detections_by_frame(subscriber, f"sim{i}")) >= 20 for i in range(3)), 60), daemon.log
    for i in range(3):
        frames = detections_by_frame(subscriber, f"sim{i}")
        assert list(frames) == sorted(frames), "published in frame order"
        for msgs in frames.values():
            msg = msgs[0]
            assert (msg["width"], msg["height"]) == (width, height) and msg["model"] == "model"
            assert not mismatches(msg["detections"], expected), mismatches(msg["detections"], expected)
    report = status(config["control"]["socket"])
    worker = report["accelerators"][0]
    assert worker["backend"] == "simulated" and worker["busy_s"] > 0 and worker["healthy"]
    assert "simulated device 0" in worker["description"]
    assert daemon.stop() == 0


def test_stop_with_every_card_hung_is_bounded_by_one_shutdown_timeout(tmp_path, models, media, mosquitto,
                                                                      notify, start_daemon):
    """Workers used to be joined one after another with the whole remaining time each, so four cards
    hung while reopening stretched a 3 s stop to 12 s and more: past TimeoutStopSec with defaults."""
    hang, fail = tmp_path / "hang", tmp_path / "fail"
    config = base_config(tmp_path, models, mosquitto, [
        {"name": "door", "url": str(media / "indoor_people_480p_mpeg4.avi"), "loop": True, "fps": 20},
    ], shutdown_timeout_s=3)
    config["accelerators"] = [{"backend": "blocking_backend:BlockingBackend", "devices": [0, 1, 2, 3],
                               "batch": 1, "inference_timeout_s": 60, "max_consecutive_errors": 1,
                               "options": {"hang_file": str(hang), "fail_file": str(fail)}}]
    daemon, _ = start_daemon(config)
    notify.wait_for("READY", "1", timeout=60)
    sock = config["control"]["socket"]

    def states() -> list[str]:
        return [a["state"] for a in status(sock)["accelerators"]]

    fail.touch()  # every card fails and is let go ...
    deadline = time.monotonic() + 60
    while not all(s in ("backoff", "restarting") for s in states()):
        assert time.monotonic() < deadline, states()
        time.sleep(0.1)
    hang.touch()  # ... and its reopening hangs in the warm-up
    while states() != ["restarting"] * 4:
        assert time.monotonic() < deadline, states()
        time.sleep(0.2)
    started = time.monotonic()
    daemon.signal(signal.SIGTERM)
    assert daemon.proc.wait(60) == 0, daemon.log[-4000:]
    # 3 s for everything, plus the noise of a loaded machine; the old code took over 12 s.
    assert time.monotonic() - started < 9, daemon.log[-4000:]


# -- the daemon's own state ----------------------------------------------------------------------

def test_the_daemon_state_changes_only_along_its_table():
    from yoloedge.daemon.state import DaemonState as S, IllegalTransition, checked

    state = S.STARTING
    for after in (S.RUNNING, S.RELOADING, S.RUNNING, S.STOPPING, S.STOPPED):  # a life with one reload
        state = checked(state, after)
    assert state is S.STOPPED
    for before, after in ((S.STARTING, S.RELOADING), (S.RELOADING, S.RELOADING), (S.STOPPED, S.RUNNING),
                          (S.STOPPING, S.RUNNING), (S.RUNNING, S.STARTING), (S.RUNNING, S.STOPPED)):
        with pytest.raises(IllegalTransition, match=f"{before} -> {after} is not allowed"):
            checked(before, after)
    assert checked(S.STARTING, S.STOPPING) is S.STOPPING  # a stop during start-up


def test_a_daemon_refuses_an_illegal_state_change_and_keeps_its_state(tmp_path):
    """A reload belongs to a running daemon (the main loop starts only once it runs); one asked of
    a daemon still starting is a bug and raises before anything changed. A shutdown from any
    state ends in `stopped`, once."""
    from yoloedge import demo
    from yoloedge.config import AcceleratorConfig, ModelConfig
    from yoloedge.config.schema import Config, ControlConfig
    from yoloedge.daemon import Daemon as InProcessDaemon, DaemonState
    from yoloedge.daemon.state import IllegalTransition

    config = Config(device_id="t", model=ModelConfig(path=str(demo.MODEL)), accelerators=(AcceleratorConfig(),),
                    control=ControlConfig(socket=str(tmp_path / "c.sock")))
    daemon = InProcessDaemon(config, str(tmp_path / "unused.yaml"), {})
    with pytest.raises(IllegalTransition):
        daemon.reloader.reload()
    assert daemon.state is DaemonState.STARTING and daemon.reloader.generation == 1
    daemon._shutdown()
    assert daemon.state is DaemonState.STOPPED and daemon.status()["daemon"]["state"] == "stopped"
    daemon._shutdown()  # idempotent: no second stopping
    assert daemon.state is DaemonState.STOPPED
