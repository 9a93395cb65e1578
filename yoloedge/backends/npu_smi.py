"""NPU telemetry from `npu-smi info`: health, temperature, power, memory and AI-core use per device.

`npu-smi info` prints one table for every NPU on the machine, two rows per chip:

    | NPU     Name       | Health   | Power(W)   Temp(C)   Hugepages-Usage(page) |
    | Chip    Device     | Bus-Id   | AICore(%)  Memory-Usage(MB)  [HBM-Usage(MB)] |
    +====================+==========+===========================================+
    | 8       310P3      | OK       | NA         43        0    / 0              |
    | 0       0          | 0000:01:00.0 | 0      1782 / 21527                     |

The layout differs per product (a `Device` column only on some, HBM columns on training cards),
so the parser reads cells by position within each row and takes numbers defensively; a field it
cannot read is None rather than an error. One call covers every device, so the output is cached
process-wide for a few seconds and shared by all workers.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
import threading
import time

log = logging.getLogger(__name__)

CACHE_S = 5.0
TIMEOUT_S = 5.0
HEALTH_WORDS = ("OK", "Warning", "Alarm", "Critical", "UNKNOWN", "Unknown")
_PAIR = re.compile(r"(\d+(?:\.\d+)?)\s*/\s*(\d+(?:\.\d+)?)")


def _number(text: str) -> float | int | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return int(value) if value.is_integer() else value


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _is_table_row(line: str) -> bool:
    return line.strip().startswith("|") and line.count("|") >= 4


def parse_npu_smi(text: str) -> list[dict]:
    """One dict per chip row of `npu-smi info` (the process table is ignored)."""
    records: list[dict] = []
    has_device_column = False
    npu: dict | None = None
    for line in text.splitlines():
        if not _is_table_row(line):
            continue
        cells = _cells(line)
        if len(cells) < 3:
            continue
        if any("Process" in c for c in cells):
            break  # the per-process table follows the device table
        first = cells[0].split()
        if first[:1] == ["Chip"]:
            has_device_column = "Device" in first
            continue
        if first[:1] == ["NPU"] or not first:
            continue
        if _is_npu_row(first, cells):
            npu = _npu_row(first, cells)
        elif npu is not None:
            records.append({**npu, **_chip_row(first, cells, has_device_column)})
    return records


def _is_npu_row(first: list[str], cells: list[str]) -> bool:
    """NPU rows carry the health word and a chip name (310P3, 910B); chip rows only numbers."""
    return cells[1] in HEALTH_WORDS or (len(first) >= 2 and _number(first[1]) is None)


def _npu_row(first: list[str], cells: list[str]) -> dict:
    """`| NPU Name | Health | Power Temp Hugepages |`"""
    numbers = cells[2].split()
    return {
        "npu": _number(first[0]),
        "name": " ".join(first[1:]) or None,
        "health": cells[1] or None,
        "power_w": _number(numbers[0]) if numbers else None,
        "temperature_c": _number(numbers[1]) if len(numbers) > 1 else None,
    }


def _chip_row(first: list[str], cells: list[str], has_device_column: bool) -> dict:
    """`| Chip [Device] | Bus-Id | AICore Memory-Usage [HBM-Usage] |`"""
    usage = cells[2]
    pairs = _PAIR.findall(usage)
    aicore = usage.split()[0] if usage.split() else ""
    record = {
        "chip": _number(first[0]),
        "device": _number(first[1]) if has_device_column and len(first) > 1 else None,
        "bus_id": cells[1] or None,
        "aicore_percent": _number(aicore),
        "memory_used_mb": _number(pairs[0][0]) if pairs else None,
        "memory_total_mb": _number(pairs[0][1]) if pairs else None,
    }
    if len(pairs) > 1:
        record["hbm_used_mb"], record["hbm_total_mb"] = _number(pairs[1][0]), _number(pairs[1][1])
    return record


def select_device(records: list[dict], device_id: int) -> dict | None:
    """The chip that ACL calls `device_id`: by the Device column where there is one, else the
    NPU id (cards with one chip and no Device column number NPUs as the runtime does)."""
    if any(r.get("device") is not None for r in records):
        matches = [r for r in records if r.get("device") == device_id]
    else:
        matches = [r for r in records if r.get("npu") == device_id]
    return matches[0] if matches else None


class NpuSmi:
    """Runs `npu-smi info` at most once per `CACHE_S` for the whole process."""

    def __init__(self, executable: str = "npu-smi"):
        self.executable = executable
        self._lock = threading.Lock()
        self._taken = float("-inf")
        self._records: list[dict] = []
        self._error: str | None = None

    def available(self) -> bool:
        return shutil.which(self.executable) is not None

    def device(self, device_id: int) -> dict | None:
        """Telemetry of one device; None without npu-smi; `{"error": ...}` when it fails."""
        path = shutil.which(self.executable)
        if path is None:
            return None
        with self._lock:
            if time.monotonic() - self._taken >= CACHE_S:
                self._refresh(path)
            if self._error is not None:
                return {"error": self._error}
            found = select_device(self._records, device_id)
        if found is None:
            return {"error": f"npu-smi info lists no device {device_id}"}
        return dict(found)

    def _refresh(self, path: str) -> None:
        self._taken = time.monotonic()
        try:
            result = subprocess.run([path, "info"], capture_output=True, text=True, timeout=TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            self._records, self._error = [], f"npu-smi info: {exc}"
            log.warning("%s", self._error)
            return
        if result.returncode != 0:
            self._records = []
            self._error = f"npu-smi info exited {result.returncode}: {result.stderr.strip()[:200]}"
            log.warning("%s", self._error)
            return
        self._records, self._error = parse_npu_smi(result.stdout), None


#: shared by every Ascend backend in the process.
NPU_SMI = NpuSmi()
