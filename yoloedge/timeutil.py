"""The one UTC timestamp format every message, status and log field uses."""

from __future__ import annotations

from datetime import datetime, timezone


def utc_timestamp(t: float | None = None) -> str:
    """UTC ISO-8601 with milliseconds and a Z, e.g. 2026-11-29T19:38:21.123Z (`t`: epoch s, default now).

    Milliseconds are truncated, not rounded, so a timestamp never names a later millisecond than
    the one its event happened in.
    """
    dt = datetime.now(timezone.utc) if t is None else datetime.fromtimestamp(t, timezone.utc)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"
