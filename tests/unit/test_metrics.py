"""The one rate meter and latency window behind every figure in status, stats and benchmarks,
on an injected clock (no wall-clock windows)."""

from __future__ import annotations

import pytest

from yoloedge.metrics import LatencyWindow, RateMeter
from yoloedge.timeutil import utc_timestamp


class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_a_young_meter_divides_by_the_time_it_has_lived_not_by_its_window():
    """The bug this replaced: 10 events/s for 2 s read as 4/s from a 5 s window."""
    clock = Clock()
    meter = RateMeter(window_s=5.0, clock=clock)
    for _ in range(20):
        clock.t += 0.1
        meter.mark()
    assert meter.rate() == pytest.approx(10.0, rel=0.01)


def test_the_window_slides_and_old_events_stop_counting():
    clock = Clock()
    meter = RateMeter(window_s=5.0, clock=clock, buckets=20)
    for _ in range(100):  # 20/s for 5 s
        clock.t += 0.05
        meter.mark()
    assert meter.rate() == pytest.approx(20.0, rel=0.06)
    clock.t += 2.5  # half a window of silence
    assert meter.rate() == pytest.approx(10.0, rel=0.12)
    clock.t += 5.0
    assert meter.rate() == 0.0
    assert meter.total == 100


def test_marks_can_carry_amounts_such_as_busy_seconds():
    clock = Clock()
    busy = RateMeter(window_s=4.0, clock=clock)
    for _ in range(40):  # 75 ms of device time every 100 ms
        clock.t += 0.1
        busy.mark(0.075)
    assert busy.rate() == pytest.approx(0.75, rel=0.03)


def test_latency_window_percentiles_and_wrap_around():
    window = LatencyWindow(size=100)
    assert window.percentile(50) is None
    for ms in range(1, 101):
        window.add(float(ms))
    assert window.percentile(50) == pytest.approx(50.0, abs=1)
    assert window.percentile(99) == pytest.approx(99.0, abs=1)
    for _ in range(100):  # the ring now holds only the new values
        window.add(500.0)
    assert window.percentile(1) == 500.0
    assert window.values() == [500.0] * 100


def test_one_utc_timestamp_format_with_truncated_milliseconds():
    assert utc_timestamp(0.5) == "1970-01-01T00:00:00.500Z"
    assert utc_timestamp(1764527901.1239) == "2025-11-30T18:38:21.123Z"
