"""The per-kind de-duplication of repeated errors, and the status fields it gives, on a clock the
test moves."""

from __future__ import annotations

import enum

from yoloedge.health.errorbook import ErrorBook


class Kind(enum.Enum):
    BROKER = "broker"
    DISK = "disk"
    EVENT = "event"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_each_kind_is_warned_once_then_once_per_interval_with_its_count():
    clock = Clock()
    book = ErrorBook(300.0, clock)
    verdicts = []
    for _ in range(5):  # two kinds alternating: each is news once
        verdicts.append(book.report(Kind.BROKER, "broker down"))
        verdicts.append(book.report(Kind.DISK, "disk full"))
    warned = [v for v in verdicts if v is not None]
    assert len(warned) == 2 and all(v.held == 0 and v.suffix() == "" for v in warned)
    clock.now += 299
    assert book.report(Kind.BROKER, "broker down") is None
    clock.now += 2
    again = book.report(Kind.BROKER, "broker still down")
    assert again is not None and again.held == 5 and again.since_s == 301
    assert again.suffix() == " (5 more time(s) in the last 301 s)"
    assert book.report(Kind.DISK, "disk full").held == 4


def test_a_resolved_kind_is_news_again_and_the_status_shows_what_holds():
    clock = Clock()
    book = ErrorBook(300.0, clock)
    assert book.status() == {"last_error": None, "last_error_at": None, "error_active": False}
    book.report(Kind.BROKER, "broker down")
    book.report(Kind.DISK, "disk full")
    assert book.status()["last_error"] == "disk full"
    assert book.resolve(Kind.DISK) is True and book.resolve(Kind.DISK) is False
    status = book.status()
    assert status["last_error"] == "broker down" and status["error_active"], "the one that holds"
    assert book.resolve(Kind.BROKER)
    status = book.status()
    assert status["last_error"] == "disk full" and status["error_active"] is False
    assert status["last_error_at"].endswith("Z")
    assert book.report(Kind.DISK, "disk full") is not None, "over, then back: news"


def test_events_never_hold_and_are_rate_limited_like_the_rest():
    clock = Clock()
    book = ErrorBook(300.0, clock)
    assert book.report(Kind.EVENT, "3 lost", active=False) is not None
    assert book.report(Kind.EVENT, "2 lost", active=False) is None
    assert book.status() == {"last_error": "2 lost", "last_error_at": book.status()["last_error_at"],
                             "error_active": False}
    book.update(Kind.BROKER, "lost; reconnecting", warned=True)  # the caller warned by its own rule
    assert book.report(Kind.BROKER, "cannot connect") is None
    assert book.status()["error_active"]
