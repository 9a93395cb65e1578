"""The one retry-delay rule shared by camera readers, device restarts and failing inferences."""

from __future__ import annotations

import random

import pytest

from yoloedge.backoff import Backoff


def test_delays_double_up_to_the_cap():
    backoff = Backoff(1.0, 5.0)
    assert [backoff.next_delay() for _ in range(6)] == [1.0, 2.0, 4.0, 5.0, 5.0, 5.0]


def test_a_long_enough_healthy_run_starts_over_and_a_short_one_does_not():
    backoff = Backoff(0.5, 8.0, reset_after_s=10.0)
    assert [backoff.next_delay() for _ in range(3)] == [0.5, 1.0, 2.0]
    assert backoff.next_delay(healthy_for_s=9.9) == 4.0, "a flapping source keeps backing off"
    assert backoff.next_delay(healthy_for_s=10.0) == 0.5
    assert backoff.next_delay() == 1.0
    backoff.reset()
    assert backoff.next_delay() == 0.5


def test_jitter_stays_within_its_fraction_and_follows_the_injected_rng():
    delays = [Backoff(2.0, 2.0, jitter=0.2, rng=random.Random(7)).next_delay() for _ in range(3)]
    assert len(set(delays)) == 1, "the same seed gives the same delay"
    backoff = Backoff(2.0, 2.0, jitter=0.2, rng=random.Random(1))
    spread = [backoff.next_delay() for _ in range(200)]
    assert all(1.6 <= d <= 2.4 for d in spread) and max(spread) - min(spread) > 0.4


def test_the_cap_wins_over_a_larger_first_delay():
    assert Backoff(10.0, 4.0).next_delay() == 4.0


@pytest.mark.parametrize("args", [(-1.0, 1.0), (1.0, -1.0)])
def test_negative_delays_are_refused(args):
    with pytest.raises(ValueError):
        Backoff(*args)


def test_a_factor_below_one_or_a_jitter_of_one_is_refused():
    with pytest.raises(ValueError):
        Backoff(1.0, 2.0, factor=0.5)
    with pytest.raises(ValueError):
        Backoff(1.0, 2.0, jitter=1.0)
