"""Shared fixtures: where the shared test data lives, and how its absence is handled.

A user's clone has no ../shared: tests that need it skip with a clear reason. CI sets
YOLOEDGE_REQUIRE_SHARED=1 (in .ci/run), which turns that skip into a failure.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

pytest_plugins = ["conftest_mqtt", "fixtures_media", "other_user"]

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "testdata"


def skip_unless_required(reason: str, switch: str) -> None:
    """Skip a test whose environment is missing; fail instead where CI requires it (`switch`=1)."""
    if os.environ.get(switch) == "1":
        pytest.fail(f"{reason} (and {switch}=1)", pytrace=False)
    pytest.skip(reason)


def _shared_or_skip() -> Path:
    if SHARED.is_dir():
        return SHARED
    skip_unless_required("shared test data not found at ../shared/testdata (relative to the repo root)",
                         "YOLOEDGE_REQUIRE_SHARED")


@pytest.fixture(scope="session")
def shared() -> Path:
    return _shared_or_skip()


@pytest.fixture(scope="session")
def models(shared) -> Path:
    return shared / "models"


@pytest.fixture(scope="session")
def media(shared) -> Path:
    return shared / "media"


@pytest.fixture(scope="session")
def references(shared) -> Path:
    return shared / "reference"


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A short directory for sockets: AF_UNIX paths must stay under 108 bytes, and pytest's
    tmp_path may not."""
    path = Path(tempfile.mkdtemp(prefix="ye-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
