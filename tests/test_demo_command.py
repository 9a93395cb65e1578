"""The README's first command: `scripts/demo.sh` runs the daemon on the demo model and clip with a
private broker, prints detections as they arrive and then `yoloedge-ctl status`."""

from __future__ import annotations

import re
import subprocess

import pytest

from conftest import REPO
from yoloedge.demo import LABELS, MODEL

pytestmark = pytest.mark.usefixtures("mosquitto_available")


@pytest.fixture()
def mosquitto_available():
    from conftest_mqtt import require_programs

    require_programs("mosquitto")


def test_demo_script_shows_detections_and_status():
    result = subprocess.run([str(REPO / "scripts" / "demo.sh"), "--seconds", "14", "--status-after", "7"],
                            cwd=REPO, capture_output=True, text=True, timeout=240)
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    labels = LABELS.read_text().split()
    lines = re.findall(r"^\[demo frame +(\d+) .*\] (.*)$", out, re.M)
    assert len(lines) >= 5, out[-3000:]
    found = [text for _, text in lines if text != "nothing"]
    assert found, "the demo model found nothing in the demo clip"
    assert all(any(label in text for label in labels) for text in found)
    assert "yoloedge-ctl status" in out and "accelerators:" in out and "cameras:" in out
    assert re.search(r"demo\s+streaming", out), out[-3000:]
    assert "status: stopped" in out
    assert MODEL.stat().st_size <= 6 * 1024 * 1024
