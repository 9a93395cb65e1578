"""Shared fixtures: where the shared test data lives, and how its absence is handled.

A user's clone has no ../shared: tests that need it skip with a clear reason. CI sets
YOLOEDGE_REQUIRE_SHARED=1 (in .ci/run), which turns that skip into a failure.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "testdata"


def _shared_or_skip() -> Path:
    if SHARED.is_dir():
        return SHARED
    reason = f"shared test data not found at ../shared/testdata (relative to the repo root)"
    if os.environ.get("YOLOEDGE_REQUIRE_SHARED") == "1":
        pytest.fail(reason + " and YOLOEDGE_REQUIRE_SHARED=1", pytrace=False)
    pytest.skip(reason)


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
