"""The readable status summary: what `yoloedge-ctl status` prints and SIGUSR1 writes to the log.

Here, not in `cli.ctl`, so the daemon can write it without importing the command-line client.
Every line goes through `printable`: camera names, URLs and errors come from the config and the
network, and must not drive the terminal or the log.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from ..textsafe import printable


def cell(value: Any, fmt: str = "{}") -> str:
    """Table cell: None (unknown / not applicable) shows as '-'. Control characters are escaped
    (`printable`) here, before the columns are measured: camera errors and names come from outside."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    try:
        return printable(fmt.format(value))
    except (TypeError, ValueError):
        return printable(str(value))  # an unexpected type from a newer daemon: show it rather than fail


def format_duration(seconds: float | None) -> str:
    """'3d 04h', '2h 05m', '4m 07s', '12s': the two most significant units."""
    if seconds is None:
        return "-"
    total = int(seconds)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours:02d}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


def format_table(headers: Sequence[str], rows: Iterable[Sequence[str]],
                 right: Iterable[int] = ()) -> list[str]:
    """Columns padded to their widest cell; `right` columns (numbers) right-aligned."""
    rows = [list(row) for row in rows]
    widths = [max([len(h)] + [len(row[i]) for row in rows]) for i, h in enumerate(headers)]
    right = set(right)

    def line(cells: Sequence[str]) -> str:
        padded = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))]
        return "  ".join(padded).rstrip()

    return [line(headers)] + [line(row) for row in rows]


def _health(value: Any) -> str:
    if value is None:
        return "-"
    return "ok" if value else "FAIL"


def _accelerator_lines(accelerators: list[dict]) -> list[str]:
    headers = ("NAME", "BACKEND", "DEVICE", "MODEL", "BATCH", "STATE", "HEALTH", "INF/S", "UTIL %",
               "P50 MS", "P99 MS", "QUEUE", "ERRORS", "RESTARTS", "DESCRIPTION")
    rows = [(cell(a.get("name")), cell(a.get("backend")), cell(a.get("device")), _models(a),
             cell(a.get("batch")), cell(a.get("state")), _health(a.get("healthy")),
             cell(a.get("inferences_per_s"), "{:.1f}"),
             cell(a.get("utilisation") if a.get("utilisation") is None else 100 * a["utilisation"], "{:.0f}"),
             cell(a.get("p50_ms"), "{:.1f}"), cell(a.get("p99_ms"), "{:.1f}"), cell(a.get("queue_depth")),
             cell(a.get("errors")), cell(a.get("restarts")), cell(a.get("description")))
            for a in accelerators]
    return format_table(headers, rows, right=(4, 7, 8, 9, 10, 11, 12, 13))


def _models(accelerator: dict) -> str:
    """The models a device serves, by name (one that could not be loaded: `name(failed)`); the
    model file for a report without them."""
    models = accelerator.get("models")
    if not models:
        return cell(accelerator.get("model"))
    if len(models) == 1 and models[0].get("state") == "running":
        return cell(models[0].get("path"))
    return ",".join(m["name"] if m.get("state") == "running" else f"{m['name']}({m.get('state')})" for m in models)


def _camera_lines(cameras: list[dict]) -> list[str]:
    headers = ("NAME", "STATE", "FPS IN", "FPS OUT", "DROPS", "RECONN", "STALLS", "AGE S", "P50 MS",
               "P99 MS", "URL", "ERROR")
    rows = [(cell(c.get("name")), cell(c.get("state")), cell(c.get("fps_in"), "{:.1f}"),
             cell(c.get("fps_out"), "{:.1f}"), cell(c.get("drops")), cell(c.get("reconnects")),
             cell(c.get("stalls")), cell(c.get("last_frame_age_s"), "{:.1f}"),
             cell(c.get("latency_p50_ms"), "{:.1f}"), cell(c.get("latency_p99_ms"), "{:.1f}"),
             cell(c.get("url")), cell(c.get("error")))
            for c in cameras]
    return format_table(headers, rows, right=(2, 3, 4, 5, 6, 7, 8, 9))


def _labelled(counts: Any) -> str:
    """{label: n} as "car 3, person 1" (labels with 0 left out; "-" for none)."""
    if not isinstance(counts, dict):
        return "-"
    shown = [f"{label} {n}" for label, n in sorted(counts.items(), key=lambda kv: str(kv[0])) if n]
    return ", ".join(shown) or "-"


def _count_lines(cameras: list[dict]) -> list[str]:
    """Each camera's zones (objects inside now, entered) and lines (in, out), by label."""
    rows = []
    for c in cameras:
        for zone in c.get("zones") or ():
            rows.append((cell(c.get("name")), "zone", cell(zone.get("name")),
                         "inside " + _labelled(zone.get("objects")), "entered " + _labelled(zone.get("entered"))))
        for line in c.get("lines") or ():
            rows.append((cell(c.get("name")), "line", cell(line.get("name")),
                         "in " + _labelled(line.get("in")), "out " + _labelled(line.get("out"))))
    return format_table(("CAMERA", "KIND", "NAME", "NOW / IN", "TOTAL / OUT"), rows) if rows else []


def _mqtt_line(mqtt: dict | None) -> str:
    if not mqtt:
        return "mqtt: -"
    link = "connected to" if mqtt.get("connected") else "DISCONNECTED from"
    if mqtt.get("connected") and mqtt.get("ack_stalled"):
        link = "connected (NOT ACKNOWLEDGING) to"
    if mqtt.get("unstable"):
        word = "connected" if mqtt.get("connected") else "DISCONNECTED"
        link = link.replace(word, f"{word} (UNSTABLE)", 1)
    spooled = f", spooled {mqtt['spooled']}" if mqtt.get("spooled") is not None else ""
    return (f"mqtt: {link} {cell(mqtt.get('broker'))}; queued {cell(mqtt.get('queued'))}{spooled}, "
            f"delivered {cell(mqtt.get('delivered'))}, dropped {cell(mqtt.get('dropped'))}")


def format_status(status: dict) -> str:
    """The readable summary `yoloedge-ctl status` prints."""
    daemon = status.get("daemon") or {}
    health = "healthy" if daemon.get("healthy") else "DEGRADED"
    lines = [f"yoloedge {cell(daemon.get('version'))}: {cell(daemon.get('state'))} "
             f"(pid {cell(daemon.get('pid'))}), up {format_duration(daemon.get('uptime_s'))}, {health}",
             f"config: {cell(daemon.get('config'))} (generation {cell(daemon.get('generation'))})"]
    if daemon.get("restart_needed_for"):
        keys = ", ".join(map(str, daemon["restart_needed_for"]))
        lines.append(f"restart needed to apply changes to: {keys}")
    if daemon.get("config_error"):
        lines += ["", "!! LAST RELOAD REJECTED, still running the previous config:"]
        lines += [f"!! {line}" for line in str(daemon["config_error"]).splitlines()]
    accelerators, cameras = status.get("accelerators") or [], status.get("cameras") or []
    lines += ["", "accelerators:"] + _indent(_accelerator_lines(accelerators) if accelerators else ["(none)"])
    lines += ["", "cameras:"] + _indent(_camera_lines(cameras) if cameras else ["(none)"])
    counts = _count_lines(cameras)
    if counts:
        lines += ["", "zones and lines:"] + _indent(counts)
    lines += ["", _mqtt_line(status.get("mqtt"))]
    problems = daemon.get("problems") or []
    lines += [""] + (["problems:"] + [f"  - {p}" for p in problems] if problems else ["problems: none"])
    return "\n".join(printable(line) for line in lines)


def _indent(lines: list[str]) -> list[str]:
    return ["  " + line for line in lines]
