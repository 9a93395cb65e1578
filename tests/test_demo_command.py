"""The README's first command: `scripts/demo.sh` runs the daemon on the demo model and clip with a
private broker, prints detections as they arrive and then `yoloedge-ctl status`."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

from conftest import REPO
from yoloedge.demo import LABELS, MODEL

pytestmark = pytest.mark.usefixtures("mosquitto_available")


@pytest.fixture()
def mosquitto_available():
    from conftest_mqtt import require_programs

    require_programs("mosquitto")


def test_demo_script_shows_detections_and_status():
    result = subprocess.run([str(REPO / "scripts" / "demo.sh"), "--seconds", "14"],
                            cwd=REPO, capture_output=True, text=True, timeout=240,
                            env={**os.environ, "COLUMNS": "100"})
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    labels = LABELS.read_text().split()
    lines = re.findall(r"^\[demo frame +(\d+)  latency +[\d.]+ ms\] (.*)$", out, re.M)
    assert len(lines) >= 5, out[-3000:]
    found = [text for _, text in lines if text != "nothing"]
    assert found, "the demo model found nothing in the demo clip"
    assert all(any(label in text for label in labels) for text in found)
    assert "yoloedge-ctl status" in out and "accelerators:" in out and "cameras:" in out
    assert re.search(r"demo\s+streaming", out), out[-3000:]
    assert "status: stopped" in out
    assert MODEL.stat().st_size <= 6 * 1024 * 1024

    # the table comes once, at the end, after the last detection line, so it stays on screen
    table = out.index("demo: $ yoloedge-ctl status")
    assert out.count("demo: $ yoloedge-ctl status") == 1
    assert not re.search(r"^\[demo frame", out[table:], re.M), out[table:]
    assert all(len(line) <= 100 for line in out[:table].splitlines()
               if line.startswith("[demo frame")), max(out.splitlines(), key=len)


def test_ctrl_c_prints_the_status_table_then_stops_everything():
    """Ctrl-C reaches the terminal's whole process group: the daemon and the broker must still be
    up when the demo asks for the status."""
    demo = subprocess.Popen([sys.executable, "-m", "yoloedge", "demo"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    try:
        for line in demo.stdout:
            lines.append(line)
            if sum(text.startswith("[demo frame") for text in lines) >= 3:
                break
        os.killpg(demo.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
        rest, _ = demo.communicate(timeout=60)
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait(10)
    out = "".join(lines) + rest
    assert demo.returncode == 0, out[-3000:]
    table = rest[rest.index("demo: $ yoloedge-ctl status"):]
    assert re.search(r"demo\s+streaming", table) and "mqtt: connected" in table, table
    assert "daemon exit code 0" in table


# the line for 9 objects: 38 characters of head, 25 per object, 2 between objects, 8 for " +N more"
@pytest.mark.parametrize("count, width, shown", [(0, 120, 0), (2, 120, 2), (3, 120, 3), (9, 200, 3), (9, 125, 3),
                                                 (9, 124, 2), (9, 98, 2), (9, 97, 1), (9, 20, 1)])
def test_a_detection_line_names_what_fits_and_counts_the_rest(count, width, shown):
    from yoloedge.demo.runner import detection_line

    detections = [{"label": f"shape{i}", "score": 0.5 + i / 100, "box": [1.4, 2.6, 300.5, 400.0]}
                  for i in range(count)]
    line = detection_line({"camera": "demo", "frame": 7, "latency_ms": 41.53, "detections": detections}, width)
    assert line.startswith("[demo frame     7  latency   41.5 ms] ")
    named = re.findall(r"shape(\d) 0\.\d\d \[1,3,300,400\]", line)
    assert len(named) == shown
    assert len(line) <= width or shown == 1
    if count > shown:
        assert line.endswith(f" +{count - shown} more")
        assert named == [str(i) for i in range(count - 1, count - 1 - shown, -1)]  # best scores first
    assert ("nothing" in line) == (count == 0)
