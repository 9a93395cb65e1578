"""pytest fixtures for MQTT tests: a real mosquitto broker and a recording subscriber.

Loaded by tests/conftest.py through `pytest_plugins`. Fixtures:

* `mosquitto_factory(**options)` -> a started `broker.Mosquitto` (options: users, tls,
  persistence, port); every broker it made is stopped at the end of the test.
* `mosquitto` -> a started anonymous broker on a free 127.0.0.1 port.
* `subscriber_factory(broker, topics=("#",), **options)` -> a started `broker.Subscriber`.
* `subscriber` -> subscribed to "#" on `mosquitto`.

Without mosquitto installed these tests skip with the reason; CI installs it, and
YOLOEDGE_REQUIRE_MOSQUITTO=1 turns the skip into a failure there.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterator

import pytest

from broker import Mosquitto, Subscriber, find_program


def require_programs(*names: str) -> None:
    """Skip (or fail, under YOLOEDGE_REQUIRE_MOSQUITTO=1) when a program the test needs is missing."""
    missing = [n for n in names if find_program(n) is None]
    if not missing:
        return
    reason = (f"{', '.join(missing)} not installed (apt-get install mosquitto mosquitto-clients "
              "openssl); the MQTT tests need a real broker")
    if os.environ.get("YOLOEDGE_REQUIRE_MOSQUITTO") == "1":
        pytest.fail(reason + " and YOLOEDGE_REQUIRE_MOSQUITTO=1", pytrace=False)
    pytest.skip(reason)


@pytest.fixture
def mosquitto_factory(tmp_path: Path) -> Iterator[Callable[..., Mosquitto]]:
    require_programs("mosquitto")
    brokers: list[Mosquitto] = []

    def make(**options: object) -> Mosquitto:
        if options.get("users"):
            require_programs("mosquitto_passwd")
        if options.get("tls"):
            require_programs("openssl")
        broker = Mosquitto(tmp_path / f"mosquitto{len(brokers)}", **options)  # type: ignore[arg-type]
        brokers.append(broker)
        return broker.start()

    yield make
    for broker in brokers:
        broker.stop()


@pytest.fixture
def mosquitto(mosquitto_factory: Callable[..., Mosquitto]) -> Mosquitto:
    return mosquitto_factory()


@pytest.fixture
def subscriber_factory() -> Iterator[Callable[..., Subscriber]]:
    subscribers: list[Subscriber] = []

    def make(broker: Mosquitto, topics: tuple[str, ...] = ("#",), **options: object) -> Subscriber:
        sub = Subscriber.for_broker(broker, topics, **options)
        subscribers.append(sub)
        return sub.start()

    yield make
    for sub in subscribers:
        sub.stop()


@pytest.fixture
def subscriber(mosquitto: Mosquitto, subscriber_factory: Callable[..., Subscriber]) -> Subscriber:
    return subscriber_factory(mosquitto)
