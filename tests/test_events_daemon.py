"""Tracking, zones, lines, events and counts through the real daemon, a real mosquitto and the demo
model on the demo clip. The expected counts are computed here from the clip's ground truth
(yoloedge/demo/clip_truth.json: every object's box and track in every frame), with the rules of
docs/integrations/zones-lines-events.md written out again, sharing no code with yoloedge.events.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from broker import Subscriber, free_port
from daemon_harness import Daemon, ctl, status, write_config
from test_http import scrape
from yoloedge.demo import LABELS, MODEL, TRUTH, clip_path

PREFIX, DEVICE = "yt", "edge-ev"
#: a line across the whole frame at 40% of its height, A on the left: going down is `out`
LINE = ((0.0, 0.4), (1.0, 0.4))
#: a square in the middle of the frame
ZONE = ((0.25, 0.25), (0.75, 0.25), (0.75, 0.75), (0.25, 0.75))
INERTIA = 3
HTTP_PORTS: dict[str, int] = {}  # per test directory: a reload keeps its endpoint where it is


def topic(*parts: str) -> str:
    return "/".join((PREFIX, DEVICE, *parts))


# -- the ground truth's counts, computed independently --------------------------------------------

def truth_tracks() -> tuple[dict[int, list[tuple[float, float, str]]], tuple[int, int]]:
    """Per true track its anchors (bottom centre of the box, px) frame after frame, and the size."""
    truth = json.loads(TRUTH.read_text())
    tracks: dict[int, list[tuple[float, float, str]]] = {}
    for frame in truth["frames"]:
        for obj in frame["objects"]:
            x1, _, x2, y2 = obj["box"]
            tracks.setdefault(obj["track"], []).append(((x1 + x2) / 2, y2, obj["label"]))
    width, height = truth["size"]
    return tracks, (width, height)


def truth_crossings() -> tuple[Counter, Counter]:
    """`in` when the anchor goes from cross > 0 to cross < 0 (cross = (Bx-Ax)(Py-Ay) -
    (By-Ay)(Px-Ax)) and stays there for 3 frames (a crossing, not jitter on the line)."""
    tracks, (width, height) = truth_tracks()
    (ax, ay), (bx, by) = ((x * width, y * height) for x, y in LINE)
    inbound, outbound = Counter(), Counter()
    for points in tracks.values():
        label = points[0][2]
        side = [(bx - ax) * (py - ay) - (by - ay) * (px - ax) for px, py, _ in points]
        for k in range(1, len(side) - 2):
            after = side[k:k + 3]
            if side[k - 1] > 0 and all(s < 0 for s in after):
                inbound[label] += 1
            elif side[k - 1] < 0 and all(s > 0 for s in after):
                outbound[label] += 1
    return inbound, outbound


def inside(polygon, x: float, y: float) -> bool:
    crossings = 0
    for (x1, y1), (x2, y2) in zip(polygon, polygon[1:] + polygon[:1]):
        if (y1 > y) != (y2 > y) and x < (x2 - x1) * (y - y1) / (y2 - y1) + x1:
            crossings += 1
    return crossings % 2 == 1


def truth_entries() -> Counter:
    """Tracks whose anchor was inside the zone `INERTIA` frames in a row, once each."""
    tracks, (width, height) = truth_tracks()
    polygon = [(x * width, y * height) for x, y in ZONE]
    entered: Counter = Counter()
    for points in tracks.values():
        run = 0
        for px, py, label in points:
            run = run + 1 if inside(polygon, px, py) else 0
            if run >= INERTIA:
                entered[label] += 1
                break
    return entered


def nonzero(table: dict) -> dict:
    return {label: n for label, n in table.items() if n}


# -- the daemon --------------------------------------------------------------------------------------

def demo_config(tmp_path: Path, broker, camera: dict) -> dict:
    return {
        "device_id": DEVICE,
        "model": {"path": str(MODEL), "labels": str(LABELS)},
        "accelerators": [{"backend": "onnxruntime", "provider": "cpu", "devices": [0], "batch": 1}],
        "cameras": [{"name": "gate", "url": str(clip_path()),
                     "zones": [{"name": "middle", "polygon": [list(p) for p in ZONE]}],
                     "lines": [{"name": "cut", "points": [list(p) for p in LINE]}], **camera}],
        "mqtt": {"host": broker.host, "port": broker.port, "topic_prefix": PREFIX, "stats_interval_s": 60},
        "health": {"stall_timeout_s": 5},
        "control": {"socket": str(tmp_path / "run" / "control.sock")},
        "http": {"listen": f"127.0.0.1:{HTTP_PORTS.setdefault(str(tmp_path), free_port())}"},
        "shutdown_timeout_s": 10,
    }


def start(tmp_path: Path, broker, camera: dict) -> tuple[Daemon, Path, str]:
    config = write_config(tmp_path / "yoloedge.yaml", demo_config(tmp_path, broker, camera))
    state = tmp_path / "state"
    daemon = Daemon(config, None, env={"STATE_DIRECTORY": str(state)})
    return daemon, config, str(tmp_path / "run" / "control.sock")


def events_of(sub: Subscriber) -> list[dict]:
    return sub.payloads(topic("cameras", "gate", "events"))


def retained(broker, *topics: str) -> dict[str, dict]:
    """What a subscriber that comes now gets for `topics`: the retained messages only."""
    late = Subscriber.for_broker(broker, topics).start()
    try:
        assert late.wait_for(lambda got: {m.topic for m in got} >= set(topics), 10), late.messages()
        got = {m.topic: m for m in late.messages()}
        assert all(m.retain for m in got.values())
        return {name: m.json() for name, m in got.items()}
    finally:
        late.stop()


def test_the_clip_gives_events_that_end_and_retained_counts_that_match_its_ground_truth(
        tmp_path, mosquitto, subscriber):
    daemon, _, sock = start(tmp_path, mosquitto, {"realtime": False})
    try:
        # the clip is read faster than its 10 fps; it ends, and every event with it
        assert subscriber.wait_for(lambda got: any(json.loads(m.payload)["type"] == "end" for m in got)
                                   and _all_ended(got), 120, topic("cameras", "gate", "events")), daemon.log
        events = events_of(subscriber)
        new = [e["id"] for e in events if e["type"] == "new"]
        ended = [e["id"] for e in events if e["type"] == "end"]
        assert sorted(new) == sorted(ended) and len(set(new)) == len(new) >= 5
        assert all(e["camera"] == "gate" and e["v"] == 1 for e in events)
        detections = subscriber.payloads(topic("cameras", "gate", "detections"))
        assert len(detections) == 100  # lossless: every frame
        ids = {d["track_id"] for m in detections for d in m["detections"]}
        assert None in ids and ids - {None} <= set(new)  # a confirmed track is an event; unconfirmed: null
        line_topic, zone_topic = topic("cameras", "gate", "lines", "cut"), topic("cameras", "gate", "zones", "middle")
        counts = retained(mosquitto, line_topic, zone_topic)
        inbound, outbound = truth_crossings()
        assert inbound and outbound  # the line is crossed both ways in the clip
        assert (nonzero(counts[line_topic]["in"]), nonzero(counts[line_topic]["out"])) == (inbound, outbound)
        assert nonzero(counts[zone_topic]["entered"]) == truth_entries()
        assert not nonzero(counts[zone_topic]["objects"])  # every event ended: nobody inside
        full = status(sock)
        cam = next(c for c in full["cameras"] if c["name"] == "gate")
        assert cam["lines"][0]["in"] == counts[line_topic]["in"] and cam["zones"][0]["name"] == "middle"
        # every event has its best shot, from a full frame kept for it (none missed: a lossless
        # file's reader waits for a buffer of the frame keeper)
        assert full["events"]["cameras"]["gate"]["snapshots"] == len(new)
        assert full["sinks"]["event_log"]["missed_shots"] == 0 and full["sinks"]["tracking"]["errors"] == 0
        metrics = scrape(HTTP_PORTS[str(tmp_path)])
        exported = {(s.labels["direction"], s.labels["label"]): s.value
                    for s in metrics["yoloedge_line_crossings_total"] if s.value}
        assert exported == {**{("in", label): n for label, n in inbound.items()},
                            **{("out", label): n for label, n in outbound.items()}}
        assert not any(s.value for s in metrics["yoloedge_zone_objects"])
        before = counts[line_topic]["since"]

        result = ctl(sock, "reset-counts", "gate", "cut")
        assert result.returncode == 0, result.stderr
        assert subscriber.wait_for(lambda got: len(got) >= 2 and not nonzero(got[-1].json()["in"]), 10, line_topic)
        zeroed = retained(mosquitto, line_topic)[line_topic]
        assert not nonzero(zeroed["in"]) and not nonzero(zeroed["out"]) and zeroed["since"] > before
        assert ctl(sock, "reset-counts", "gate", "nosuch").returncode == 1
        assert retained(mosquitto, zone_topic)[zone_topic]["entered"] == counts[zone_topic]["entered"]
    finally:
        daemon.stop()
    saved = json.loads((tmp_path / "state" / "counts" / "gate.counts.json").read_text())
    assert saved["zones"]["middle"]["entered"] == counts[zone_topic]["entered"]  # kept for the next start
    assert not nonzero(saved["lines"]["cut"]["in"])


def _all_ended(received) -> bool:
    events = [json.loads(m.payload) for m in received]
    return {e["id"] for e in events if e["type"] == "new"} == {e["id"] for e in events if e["type"] == "end"}


def test_a_reload_that_changes_zones_keeps_the_tracks_and_shutdown_ends_every_event(
        tmp_path, mosquitto, subscriber):
    daemon, config, sock = start(tmp_path, mosquitto, {"loop": True})  # paced at the clip's 10 fps
    try:
        detections = topic("cameras", "gate", "detections")
        assert subscriber.wait_for(lambda got: any(d["track_id"] for m in got for d in m.json()["detections"]),
                                   60, detections), daemon.log
        before = {d["track_id"] for d in subscriber.payloads(detections)[-1]["detections"]} - {None}
        text = json.loads(json.dumps(demo_config(tmp_path, mosquitto, {"loop": True})))
        text["cameras"][0]["zones"].append({"name": "left", "polygon": [[0, 0], [0.5, 0], [0.5, 1], [0, 1]]})
        write_config(config, text)
        states = len(subscriber.messages(topic("cameras", "gate", "state")))
        result = ctl(sock, "reload")
        assert result.returncode == 0, result.stderr
        cam = next(c for c in status(sock)["cameras"] if c["name"] == "gate")
        assert [z["name"] for z in cam["zones"]] == ["middle", "left"]
        seen = len(subscriber.messages(detections))
        assert subscriber.wait_for(lambda got: len(got) > seen + 3, 20, detections)
        after = {d["track_id"] for m in subscriber.payloads(detections)[seen:] for d in m["detections"]}
        assert before & after, (before, after)  # the same tracks, not new ones
        assert retained(mosquitto, topic("cameras", "gate", "zones", "left"))  # counted from the reload on
        assert len(subscriber.messages(topic("cameras", "gate", "state"))) == states  # not restarted
        assert daemon.stop() == 0
    finally:
        daemon.kill()
    events = events_of(subscriber)
    opened = {e["id"] for e in events if e["type"] == "new"}
    assert opened and opened == {e["id"] for e in events if e["type"] == "end"}  # shutdown ended them
    assert opened >= before


@pytest.fixture(autouse=True)
def _needs_demo_model():
    if not MODEL.is_file():
        pytest.skip("the demo model is not in this checkout")
