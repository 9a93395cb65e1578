"""The status page (`GET /`) in a real headless Chromium against the real daemon (mosquitto, the
shared model and video): it loads without console errors (CSP violations and failed requests
included), shows every configured camera under its exact name, and the frame it displays has
the boxes of the detections published on MQTT for that frame.

Chromium is driven through its DevTools protocol over `--remote-debugging-pipe` (NUL-separated
JSON on file descriptors 3 and 4): a few dozen lines, no browser-automation package, no port.
"""

from __future__ import annotations

import base64
import collections
import fcntl
import json
import os
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import warnings
from pathlib import Path
from typing import Any, Callable

import cv2
import numpy as np
import pytest

from conftest import skip_unless_required
from fixtures_media import free_port
import test_daemon
from test_daemon import base_config, detections_by_frame
from test_snapshots import clear_patch, edge_pixels

notify, start_daemon = test_daemon.notify, test_daemon.start_daemon  # the daemon tests' fixtures
VIDEO = "indoor_people_480p_mpeg4.avi"
FRAMES = 84
#: a camera name that markup would change: `<b>` would become an element and `&amp;` an `&`
ODD_NAME = '<b>porch&amp;"x"?%23\u00e9'
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--remote-debugging-pipe")


class CdpError(RuntimeError):
    pass


class Chromium:
    """A headless Chromium and one page of it, spoken to over the DevTools pipe."""

    #: the first reply waits for the browser to start (seconds of CPU on a loaded 2-core machine)
    STARTUP_S = 60.0

    def __init__(self, profile: Path):
        binary = shutil.which("chromium") or shutil.which("chromium-browser")
        if binary is None:
            skip_unless_required("chromium not installed (apt-get install chromium)", "YOLOEDGE_REQUIRE_CHROMIUM")
        commands_r, self._commands = _above_4(os.pipe())
        self._replies, replies_w = _above_4(os.pipe())
        # the browser reads commands on fd 3 and writes replies on fd 4
        self.proc = subprocess.Popen(
            ["bash", "-c", f'exec "$0" "$@" 3<&{commands_r} 4>&{replies_w} {commands_r}<&- {replies_w}>&-',
             binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
            pass_fds=(commands_r, replies_w), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        os.close(commands_r)
        os.close(replies_w)
        self._next_id = 0
        self._results: dict[int, dict] = {}
        self._ended = False  # the reply pipe closed: the browser is gone
        self.events: list[dict] = []
        self.stderr: collections.deque[str] = collections.deque(maxlen=40)
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        # drained, or a chatty browser blocks on a full stderr pipe and answers nothing
        self._stderr_reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._stderr_reader.start()
        try:
            target = self.send("Target.createTarget", {"url": "about:blank"}, timeout=self.STARTUP_S)["targetId"]
            self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Runtime", "Log", "Page"):
                self.send(f"{domain}.enable", session=self.session)
        except CdpError:
            self.close()  # no browser left behind by a failed start
            raise

    def _read_stderr(self) -> None:
        stream = self.proc.stderr
        if stream is not None:
            for line in stream:
                self.stderr.append(line.decode(errors="replace").rstrip())

    def _read(self) -> None:
        buffer = b""
        while chunk := os.read(self._replies, 1 << 16):
            buffer += chunk
            *messages, buffer = buffer.split(b"\0")
            with self._cond:
                for raw in messages:
                    message = json.loads(raw)
                    if "id" in message:
                        self._results[message["id"]] = message
                    else:
                        self.events.append(message)
                self._cond.notify_all()
        with self._cond:
            self._ended = True
            self._cond.notify_all()

    def send(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 30.0) -> dict:
        with self._cond:
            self._next_id += 1
            ident = self._next_id
        message: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._commands, json.dumps(message).encode() + b"\0")
        with self._cond:
            if not self._cond.wait_for(lambda: ident in self._results or self._ended, timeout) \
                    or ident not in self._results:
                why = "the browser exited" if self._ended else f"no reply within {timeout} s"
                raise CdpError(f"{method}: {why}; its stderr ends: " + " | ".join(self.stderr))
            reply = self._results.pop(ident)
        if "error" in reply:
            raise CdpError(f"{method}: {reply['error']}")
        return reply["result"]

    def evaluate(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True}, session=self.session)
        if "exceptionDetails" in result:
            raise CdpError(f"{expression[:60]}...: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_until(self, expression: str, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.2)
        raise TimeoutError(f"not true within {timeout} s: {expression}")

    def errors(self) -> list[str]:
        """Uncaught exceptions, console.error/assert calls, and the browser's own error entries
        (failed requests, CSP violations)."""
        with self._cond:
            events = list(self.events)
        found = []
        for event in events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                found.append(json.dumps(params["exceptionDetails"])[:500])
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                found.append(json.dumps(params.get("args"))[:500])
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                found.append(f"{params['entry'].get('source')}: {params['entry'].get('text')} "
                             f"{params['entry'].get('url', '')}")
        return found

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=5)
        except (CdpError, OSError):
            self.proc.kill()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        os.close(self._commands)
        self._reader.join(5)
        self._stderr_reader.join(5)
        os.close(self._replies)


def _above_4(fds: tuple[int, int]) -> tuple[int, int]:
    """The pipe's ends moved above 4, so that the shell's `3<&N 4>&M` cannot overwrite one with
    the other."""
    moved = tuple(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in fds)
    for fd in fds:
        os.close(fd)
    return moved[0], moved[1]


@pytest.fixture()
def chromium(tmp_path):
    try:
        browser = Chromium(tmp_path / "chromium-profile")
    except CdpError as exc:  # the browser's own start failed (seen once in CI): one fresh try
        warnings.warn(f"chromium did not start, starting it once more: {exc}", stacklevel=2)
        browser = Chromium(tmp_path / "chromium-profile-2")
    yield browser
    browser.close()


def http_get(port: int, path: str) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as reply:
            return reply.status, dict(reply.headers), reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.25)


def camera_card(name: str) -> str:
    """A JS expression for the card of camera `name` (found by its data attribute, not by markup)."""
    return f"[...document.querySelectorAll('.camera')].find((c) => c.dataset.camera === {json.dumps(name)})"


def shown_image(browser: Chromium, name: str) -> tuple[str, np.ndarray] | None:
    """The `src` and the pixels of the image the page shows for `name`, taken from the DOM
    (drawn on a canvas: exactly what the browser decoded and displays)."""
    value = browser.evaluate(f"""(() => {{
        const img = {camera_card(name)}.querySelector('img');
        if (!img.complete || img.naturalWidth === 0 || img.classList.contains('hidden')) return null;
        const canvas = document.createElement('canvas');
        canvas.width = img.naturalWidth; canvas.height = img.naturalHeight;
        canvas.getContext('2d').drawImage(img, 0, 0);
        return [img.getAttribute('src'), canvas.toDataURL('image/png')];
    }})()""")
    if value is None:
        return None
    src, data_url = value
    png = base64.b64decode(data_url.split(",", 1)[1])
    return src, cv2.imdecode(np.frombuffer(png, np.uint8), cv2.IMREAD_COLOR)


def video_frames(path: Path) -> list[np.ndarray]:
    cap = cv2.VideoCapture(str(path))
    frames = []
    while True:
        ok, image = cap.read()
        if not ok:
            break
        frames.append(image)
    cap.release()
    return frames


@pytest.mark.shared
def test_status_page_in_chromium_shows_every_camera_and_the_published_boxes(
        tmp_path, models, media, mosquitto, subscriber, notify, start_daemon, chromium):
    video = media / VIDEO
    port = free_port()
    config = base_config(tmp_path, models, mosquitto, [
        {"name": ODD_NAME, "url": str(video), "loop": True, "fps": 4},
        {"name": "later", "url": "rtsp://127.0.0.1:9/nothing"},  # never delivers a frame
    ], http={"listen": f"127.0.0.1:{port}"})
    daemon, _ = start_daemon(config)
    notify.wait_for("READY", "1", timeout=60)
    image_path = f"/api/cameras/{urllib.parse.quote(ODD_NAME, safe='')}/latest.jpg"
    wait_for(lambda: http_get(port, image_path)[0] == 200, 60, f"no frame at {image_path}; {daemon.log}")

    code, headers, body = http_get(port, "/")
    assert code == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
    assert headers["X-Content-Type-Options"] == "nosniff"
    policy = headers["Content-Security-Policy"]
    assert "default-src 'self'" in policy and "img-src 'self'" in policy and "unsafe-eval" not in policy
    outside = body.replace(b'"http://www.w3.org/2000/svg"', b"")  # the SVG namespace's name: never fetched
    assert b"http://" not in outside and b"https://" not in outside, "the page refers to nothing outside itself"

    chromium.send("Page.navigate", {"url": f"http://127.0.0.1:{port}/"}, session=chromium.session)
    names = chromium.wait_until("document.querySelectorAll('.camera').length === 2 && "
                                "[...document.querySelectorAll('.camera h3')].map((h) => h.textContent)", 20)
    assert sorted(names) == sorted([ODD_NAME, "later"]), "every camera, under its exact name"
    assert chromium.evaluate("document.querySelectorAll('b').length") == 0, "a name became markup"
    assert chromium.evaluate("document.getElementById('mqtt').textContent").startswith("connected")
    assert "onnxruntime" in chromium.evaluate("document.getElementById('devices').textContent")
    problems = chromium.wait_until("[...document.querySelectorAll('#problems li')].map((li) => li.textContent)"
                                   ".join('\\n') || false", 30)
    assert "camera later" in problems, problems

    # The camera without a frame shows the placeholder and never asks for an image.
    later = camera_card("later")
    assert chromium.evaluate(f"{later}.querySelector('img').getAttribute('src')") is None
    assert not chromium.evaluate(f"{later}.querySelector('.placeholder').classList.contains('hidden')")

    # The page's image is one of the video's frames with the published boxes drawn on it.
    seen: list[tuple[str, np.ndarray] | None] = []
    wait_for(lambda: seen.append(shown_image(chromium, ODD_NAME)) or seen[-1] is not None, 20,
             "the page shows no image")
    src, image = seen[-1]
    assert urllib.parse.urlsplit(src).path == image_path
    assert image.shape == (480, 640, 3)
    sources = video_frames(video)
    assert len(sources) == FRAMES
    distances = [float(np.abs(image.astype(np.int16) - s).mean()) for s in sources]
    index = int(np.argmin(distances))
    assert distances[index] < 4, f"the image is none of the video's frames (closest: {distances[index]:.1f})"
    published = [msgs[0]["detections"] for seq, msgs in detections_by_frame(subscriber, ODD_NAME).items()
                 if seq % FRAMES == index]
    assert published, f"no detections published for frame {index}"
    assert all(d == published[0] for d in published), "every pass over the file publishes the same boxes"
    assert published[0], f"frame {index} has no detections to look for"
    diff = np.abs(image.astype(np.int16) - sources[index]).max(axis=2)
    for det in published[0]:
        rows, cols = edge_pixels(det["box"], 640, 480)
        assert diff[rows, cols].mean() > 40, f"no box drawn at {det}"
    patch = clear_patch([d["box"] for d in published[0]], 640, 480)
    assert patch is not None
    x, y = patch
    assert diff[y:y + 48, x:x + 48].mean() < 6, "pixels away from every box changed (beyond JPEG loss)"

    # It refreshes: a later poll shows a newer frame.
    wait_for(lambda: (s := shown_image(chromium, ODD_NAME)) is not None and s[0] != src, 20,
             "the image was not refreshed")

    assert chromium.errors() == [], "console errors on the status page"
    # The policy holds and errors would be seen: a script without the page's nonce is refused.
    chromium.evaluate("(() => { const s = document.createElement('script'); s.textContent = 'window.ran = 1';"
                      " document.body.appendChild(s); })()")
    assert chromium.evaluate("window.ran") is None
    wait_for(lambda: any("Content Security Policy" in e for e in chromium.errors()), 5,
             f"no CSP violation reported: {chromium.errors()}")
    assert daemon.stop() == 0


# -- zones, lines, counts and events: the page against the daemon's endpoint in-process ----------

#: a zone named like markup, a polygon and a line from top A to bottom B (left to right is `in`)
ZONE = {"name": "<b>yard</b>", "polygon": [[0.05, 0.35], [0.35, 0.35], [0.35, 0.95], [0.05, 0.95]],
        "objects": {"person": 2, "car": 1}, "entered": {"person": 5}}
LINE = {"name": "gate", "points": [[0.5, 0.0], [0.5, 1.0]], "in": {"car": 3}, "out": {"car": 1}}


def events_endpoint(log):
    """The daemon's HTTP endpoint with one camera, `gate`, that has published a 320x180 frame
    and whose status carries ZONE and LINE as the router reports them."""
    from yoloedge.config.schema import HttpConfig
    from yoloedge.pipeline.snapshots import SnapshotStore
    from yoloedge.postprocess import Detections
    from yoloedge.sources.frame import Frame
    from yoloedge.web.endpoint import HttpEndpoint

    store = SnapshotStore(clock=lambda: 0.0)
    store.add("gate")
    store.offer(Frame("gate", 1, np.full((180, 320, 3), 70, np.uint8), capture_time=1000.0, capture_mono=1.0))
    store.published("gate", 1, 1.0, 1000.0, Detections.empty(320, 180), ("person",))
    status = {"ok": True, "daemon": {"state": "running", "healthy": True, "version": "0.1.0", "problems": []},
              "cameras": [{"name": "gate", "state": "streaming", "published": 1, "zones": [ZONE], "lines": [LINE]}],
              "accelerators": [], "mqtt": {}}
    endpoint = HttpEndpoint(lambda: status, lambda: None, store, log)
    endpoint.start(HttpConfig(listen=("127.0.0.1", 0)))
    assert endpoint.server is not None
    return endpoint, endpoint.server.address[1]


def test_status_page_draws_zones_and_lines_over_the_frame_and_lists_the_events(chromium):
    from yoloedge.events.recent import EventLog

    log = EventLog()
    base = {"v": 1, "camera": "gate", "label": "car", "start_time": 1000.0, "end_time": None, "frame_time": 1004.0,
            "score": 0.8, "top_score": 0.9, "entered_zones": ["<b>yard</b>"],
            "crossings": [{"line": "gate", "direction": "in", "time": 1003.0}]}
    log.record({**base, "type": "update", "id": "ev-1"})
    log.best_shot("gate", "ev-1", np.full((90, 160, 3), 120, np.uint8), (10, 10, 80, 60), 0.9, 1002.0)
    log.record({**base, "type": "end", "id": "ev-2", "end_time": 1009.0, "crossings": []})
    endpoint, port = events_endpoint(log)
    try:
        chromium.send("Page.navigate", {"url": f"http://127.0.0.1:{port}/"}, session=chromium.session)
        card = camera_card("gate")
        chromium.wait_until(f"{card} && !{card}.querySelector('svg.overlay').classList.contains('hidden')", 20)
        drawn = chromium.evaluate(f"""(() => {{
            const card = {card}, svg = card.querySelector('svg.overlay'), img = card.querySelector('img');
            const r = svg.getBoundingClientRect(), i = img.getBoundingClientRect();
            const zone = svg.querySelector('g.zone'), line = svg.querySelector('g.line');
            const seg = line.querySelector('line.segment'), arrow = line.querySelector('line.in-arrow');
            const num = (node, name) => Number(node.getAttribute(name));
            return {{viewBox: svg.getAttribute('viewBox'), box: [r.x, r.y, r.width, r.height],
                     img: [i.x, i.y, i.width, i.height], zone: zone.dataset.name,
                     polygon: zone.querySelector('polygon').getAttribute('points'),
                     zoneLabel: zone.querySelector('text').textContent,
                     segment: ['x1', 'y1', 'x2', 'y2'].map((n) => num(seg, n)),
                     arrow: ['x1', 'y1', 'x2', 'y2'].map((n) => num(arrow, n)),
                     ends: [...line.querySelectorAll('text.end')].map((t) => [t.textContent, num(t, 'y')]),
                     counts: card.querySelector('.counts').textContent}};
        }})()""")
        assert drawn["viewBox"] == "0 0 320 180", "the overlay is in the frame's own pixels"
        assert drawn["box"] == pytest.approx(drawn["img"], abs=1), "the overlay lies exactly over the image"
        assert drawn["zone"] == "<b>yard</b>" and drawn["zoneLabel"] == "<b>yard</b>: 3"
        corners = [float(v) for pair in drawn["polygon"].split() for v in pair.split(",")]
        assert corners == pytest.approx([16, 63, 112, 63, 112, 171, 16, 171])
        assert drawn["segment"] == pytest.approx([160, 0, 160, 180])
        x1, y1, x2, y2 = drawn["arrow"]
        assert (x1, y1) == pytest.approx((160, 90)) and x2 > x1 + 5 and y2 == pytest.approx(y1), \
            "top-to-bottom line: `in` is left to right"
        (a, ay), (b, by) = drawn["ends"]
        assert (a, b) == ("A", "B") and ay < by
        assert "zone <b>yard</b>: 3 inside (person 2, car 1)" in drawn["counts"]
        assert "entered person 5" in drawn["counts"] and "line gate: in car 3 \u00b7 out car 1" in drawn["counts"]
        assert chromium.evaluate("document.querySelectorAll('b').length") == 0, "a zone name became markup"

        rows = chromium.wait_until("""(() => {
            const rows = [...document.querySelectorAll('#events tr')];
            const img = rows.length && rows[1].querySelector('img');
            if (rows.length !== 2 || !img.complete || img.naturalWidth === 0) return false;
            return rows.map((r) => [r.dataset.event, r.querySelector('img').naturalWidth,
                                    [...r.querySelectorAll('td')].slice(1).map((td) => td.textContent)]);
        })()""", 20)
        assert [(event_id, width) for event_id, width, _ in rows] == [("ev-2", 0), ("ev-1", 160)]
        assert rows[0][2][3:4] == ["ended"] and rows[0][2][5] == "9 s"
        assert rows[1][2][3] == "active" and rows[1][2][6:] == ["<b>yard</b>", "gate in"]
        assert chromium.errors() == [], "console errors on the status page"
    finally:
        endpoint.stop()
