"""GPU telemetry for status: temperature, utilisation, memory and power from the vendor's tool.

* NVIDIA discrete GPUs: `nvidia-smi --query-gpu=index,name,temperature.gpu,utilization.gpu,
  memory.used,memory.total,power.draw --format=csv,noheader,nounits`, one line per GPU:

      0, NVIDIA A2, 41, 7, 1203, 15356, 21.37

  A value the GPU does not report reads `[N/A]` or `[Not Supported]`.
* Jetson (integrated GPU, memory shared with the CPU): `tegrastats`, which prints one line per
  interval until stopped; one line is read, then it is stopped. Older releases:

      RAM 1766/3964MB (lfb 197x4MB) SWAP 0/2048MB (cached 0MB) CPU [24%@1224,...] EMC_FREQ 0%
      GR3D_FREQ 0% PLL@21C CPU@25C PMIC@100C GPU@23.5C AO@33.5C thermal@24.5C POM_5V_IN 2545/2547

  JetPack 6 and later put a timestamp first, write sensors in lower case (`gpu@61.687C`),
  `GR3D_FREQ 1%@[305,305]`, a disabled sensor as `-256C`, and power rails in mW
  (`VDD_IN 3913mW/3922mW`). GR3D_FREQ is the GPU's load; the memory is the board's RAM.
  nvidia-smi on a Jetson reports little (mostly [N/A]), so tegrastats is asked first there.
* AMD: `rocm-smi --showtemp --showuse --showpower --showmeminfo vram --json`:
  `{"card0": {"Temperature (Sensor edge) (C)": "45.0", "GPU use (%)": "3",
  "VRAM Total Memory (B)": "17163091968", "VRAM Total Used Memory (B)": "12398592",
  "Average Graphics Package Power (W)": "31.0", ...}}` (values are strings; newer releases name the
  power "Current Socket Graphics Package Power (W)").

Device numbers are the tools' own: nvidia-smi's index (PCI bus order) and rocm-smi's cardN. Where
CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES list indices, a runtime device is mapped through them;
that CUDA's default order (fastest first) matches the bus order is UNCONFIRMED for mixed GPUs, so
the name is reported with the numbers.

Like npu_smi: one run serves every device and worker for `CACHE_S`, the tool runs under a timeout,
and nothing here raises into the pipeline -- a missing tool, a timeout, an error exit or output
that does not parse all give None (said once in the log).
"""

from __future__ import annotations

import csv
import json
import logging
import os
import re
import selectors
import shutil
import signal
import subprocess
import threading
import time
from enum import Enum
from typing import Callable

log = logging.getLogger(__name__)

CACHE_S = 5.0
TIMEOUT_S = 3.0
#: how often tegrastats is asked to print (ms); one line is read
TEGRASTATS_INTERVAL_MS = 200
#: how long a tool has to exit after SIGTERM before it is killed
STOP_GRACE_S = 0.5
NVIDIA_SMI_QUERY = ("--query-gpu=index,name,temperature.gpu,utilization.gpu,memory.used,memory.total,power.draw",
                    "--format=csv,noheader,nounits")
ROCM_SMI_ARGS = ("--showtemp", "--showuse", "--showpower", "--showmeminfo", "vram", "--json")
_MAX_OUTPUT = 1024 * 1024


class GpuKind(str, Enum):
    """Whose GPU a backend runs on, which decides the tool."""

    CUDA = "cuda"  # NVIDIA: tegrastats on a Jetson, else nvidia-smi
    ROCM = "rocm"  # AMD: rocm-smi


class Tool(str, Enum):
    NVIDIA_SMI = "nvidia-smi"
    TEGRASTATS = "tegrastats"
    ROCM_SMI = "rocm-smi"


def _number(text: object) -> float | int | None:
    """A reading, or None for [N/A], [Not Supported] and anything else that is not a number."""
    try:
        value = float(str(text).strip())
    except ValueError:
        return None
    if value != value or value in (float("inf"), float("-inf")):
        return None
    return int(value) if value.is_integer() else value


def _record(tool: Tool, index: int | None, name: str | None, temperature: object, utilisation: object,
            used_mb: object, total_mb: object, power_w: object) -> dict:
    return {"source": tool.value, "index": index, "name": name, "temperature_c": _number(temperature),
            "utilisation_percent": _number(utilisation), "memory_used_mb": _number(used_mb),
            "memory_total_mb": _number(total_mb), "power_w": _number(power_w)}


# -- parsers: text in, records out; ValueError for output that is not the tool's -------------------

def parse_nvidia_smi(text: str) -> list[dict]:
    records = []
    for row in csv.reader(text.splitlines(), skipinitialspace=True):
        if not row:
            continue
        if len(row) != 7:
            raise ValueError(f"nvidia-smi: expected 7 fields, got {len(row)}")
        index = _number(row[0])
        if not isinstance(index, int):
            raise ValueError("nvidia-smi: the index is not a number")
        records.append(_record(Tool.NVIDIA_SMI, index, row[1].strip() or None, *row[2:]))
    if not records:
        raise ValueError("nvidia-smi listed no GPU")
    return records


_RAM = re.compile(r"\bRAM (\d+)/(\d+)MB")
_GR3D = re.compile(r"\bGR3D_FREQ (\d+(?:\.\d+)?)%")
_GPU_TEMP = re.compile(r"\bgpu@(-?\d+(?:\.\d+)?)C", re.IGNORECASE)
#: the board's input rail: VDD_IN (Orin, Xavier NX), POM_5V_IN (Nano, TX2), VIN_SYS_5V0 (AGX Orin)
_POWER_IN = re.compile(r"\b(?:VDD_IN|POM_5V_IN|VIN_SYS_5V0) (\d+)(?:mW)?/")
#: tegrastats prints -256C for a sensor that is switched off
_LOWEST_REAL_C = -60


def parse_tegrastats(line: str) -> list[dict]:
    ram = _RAM.search(line)
    gr3d = _GR3D.search(line)
    if ram is None or gr3d is None:
        raise ValueError("tegrastats: no RAM or GR3D_FREQ field")
    temperature = _GPU_TEMP.search(line)
    celsius = float(temperature.group(1)) if temperature else None
    power = _POWER_IN.search(line)
    return [_record(Tool.TEGRASTATS, 0, None, celsius if celsius is not None and celsius > _LOWEST_REAL_C else None,
                    gr3d.group(1), ram.group(1), ram.group(2), int(power.group(1)) / 1000 if power else None)]


_CARD = re.compile(r"^card(\d+)$")
_ROCM_TEMPERATURES = ("Temperature (Sensor edge) (C)", "Temperature (Sensor junction) (C)",
                      "Temperature (Sensor memory) (C)")
_ROCM_POWER = ("Average Graphics Package Power (W)", "Current Socket Graphics Package Power (W)")
_MIB = 1024 * 1024


def parse_rocm_smi(text: str) -> list[dict]:
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("rocm-smi: the JSON is not an object")
    records = []
    for key, card in data.items():
        match = _CARD.match(str(key))
        if match is None or not isinstance(card, dict):
            continue  # "system" and the like
        used, total = _number(card.get("VRAM Total Used Memory (B)")), _number(card.get("VRAM Total Memory (B)"))
        records.append(_record(Tool.ROCM_SMI, int(match.group(1)), card.get("Card series") or None,
                               _first(card, _ROCM_TEMPERATURES), card.get("GPU use (%)"), _mib(used), _mib(total),
                               _first(card, _ROCM_POWER)))
    if not records:
        raise ValueError("rocm-smi listed no card")
    return records


def _mib(size: float | int | None) -> int | None:
    return None if size is None else round(size / _MIB)


def _first(card: dict, keys: tuple[str, ...]) -> object:
    for key in keys:
        if _number(card.get(key)) is not None:
            return card[key]
    return None


# -- running the tools ------------------------------------------------------------------------------

class ToolFailed(Exception):
    """The tool did not give a reading; the message says why (for the log)."""


def run_tool(path: str, args: tuple[str, ...], timeout_s: float) -> str:
    """The tool's standard output. It runs in its own process group, so a timeout stops whatever
    it started too (a child left holding the pipe would keep the read waiting)."""
    proc = _start(path, args, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise ToolFailed(f"no answer within {timeout_s:g} s") from None
    finally:
        _stop(proc)
    if proc.returncode != 0:
        raise ToolFailed(f"exited {proc.returncode}: {err.decode('utf-8', 'replace').strip()[:200]}")
    return out[:_MAX_OUTPUT].decode("utf-8", "replace")


def read_first_line(path: str, args: tuple[str, ...], timeout_s: float) -> str:
    """The first line a program that never stops by itself prints; it is stopped then (or at the
    timeout, whichever comes first)."""
    proc = _start(path, args, stderr=subprocess.DEVNULL)
    try:
        return _first_line(proc, timeout_s)
    finally:
        _stop(proc)


def _first_line(proc: subprocess.Popen, timeout_s: float) -> str:
    if proc.stdout is None:  # cannot happen with stdout=PIPE; keeps the type checker honest
        raise ToolFailed("no output pipe")
    deadline = time.monotonic() + timeout_s
    buffer = b""
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        while b"\n" not in buffer and len(buffer) < 65536:
            left = deadline - time.monotonic()
            if left <= 0 or not selector.select(left):
                raise ToolFailed(f"no line within {timeout_s:g} s")
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                raise ToolFailed("ended without printing a line")
            buffer += chunk
    return buffer.split(b"\n", 1)[0].decode("utf-8", "replace")


def _start(path: str, args: tuple[str, ...], stderr: int) -> subprocess.Popen:
    try:
        return subprocess.Popen([path, *args], stdout=subprocess.PIPE, stderr=stderr, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    except OSError as exc:
        raise ToolFailed(str(exc)) from None


def _stop(proc: subprocess.Popen) -> None:
    """Stop the tool's process group (politely first: tegrastats cleans up on SIGTERM) and reap it."""
    if proc.poll() is None:
        _signal_group(proc, signal.SIGTERM)
        try:
            proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
    _signal_group(proc, signal.SIGKILL)  # also what it started, which may outlive it
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
    proc.wait()


def _signal_group(proc: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(proc.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass  # the group is gone already


def _visible(device: int, variable: str) -> int:
    """The tool's number for runtime device `device`, through CUDA/HIP_VISIBLE_DEVICES when they
    list plain indices (UUIDs cannot be mapped here: the device number is used as it is)."""
    listed = [part.strip() for part in os.environ.get(variable, "").split(",") if part.strip()]
    if 0 <= device < len(listed) and all(part.isdigit() for part in listed):
        return int(listed[device])
    return device


class GpuSmi:
    """Runs each tool at most once per `cache_s` for the whole process; failures are cached too,
    so a hanging tool costs one timeout per period, not one per status request."""

    def __init__(self, cache_s: float = CACHE_S, timeout_s: float = TIMEOUT_S,
                 clock: Callable[[], float] = time.monotonic):
        self._cache_s = cache_s
        self._timeout_s = timeout_s
        self._clock = clock
        self._lock = threading.Lock()
        self._taken: dict[Tool, float] = {}
        self._records: dict[Tool, list[dict] | None] = {}
        self._said: set[str] = set()

    def telemetry(self, kind: GpuKind | str, device: int) -> dict | None:
        """The reading of `device`; None where no tool is installed, it failed, or lists no such device."""
        try:
            gpu = GpuKind(kind)
        except ValueError:
            return None
        tools: tuple[Tool, ...]
        if gpu is GpuKind.ROCM:
            tools = (Tool.ROCM_SMI,)
            number = _visible(device, "HIP_VISIBLE_DEVICES")
        else:
            tools = (Tool.TEGRASTATS, Tool.NVIDIA_SMI)
            number = _visible(device, "CUDA_VISIBLE_DEVICES")
        for tool in tools:
            path = shutil.which(tool.value)
            if path is None:
                continue
            records = self._readings(tool, path)
            if records is None:
                return None
            found = [r for r in records if r["index"] == number]
            return dict(found[0]) if found else None
        return None

    def _readings(self, tool: Tool, path: str) -> list[dict] | None:
        with self._lock:
            if self._clock() - self._taken.get(tool, float("-inf")) >= self._cache_s:
                self._records[tool] = self._read(tool, path)
                self._taken[tool] = self._clock()
            return self._records.get(tool)

    def _read(self, tool: Tool, path: str) -> list[dict] | None:
        try:
            if tool is Tool.NVIDIA_SMI:
                return parse_nvidia_smi(run_tool(path, NVIDIA_SMI_QUERY, self._timeout_s))
            if tool is Tool.ROCM_SMI:
                return parse_rocm_smi(run_tool(path, ROCM_SMI_ARGS, self._timeout_s))
            return parse_tegrastats(read_first_line(path, ("--interval", str(TEGRASTATS_INTERVAL_MS)),
                                                    self._timeout_s))
        except (ToolFailed, ValueError) as exc:  # json.JSONDecodeError is a ValueError
            self._say_once(f"{tool.value}: {exc}; no GPU telemetry from it")
            return None
        except Exception as exc:  # noqa: BLE001 - output nobody foresaw: telemetry must not break status
            self._say_once(f"{tool.value}: unreadable output ({type(exc).__name__}: {exc}); no GPU telemetry from it")
            return None

    def _say_once(self, message: str) -> None:
        if message not in self._said:
            self._said.add(message)
            log.warning("%s", message)


#: shared by every GPU backend in the process.
GPU_SMI = GpuSmi()


def gpu_telemetry(kind: GpuKind | str, device: int) -> dict | None:
    """What a GPU backend's telemetry() returns: the device's temperature_c, utilisation_percent,
    memory_used_mb, memory_total_mb and power_w (None where the tool does not report one), its
    name and index, and which tool said so (`source`); None without a working tool."""
    return GPU_SMI.telemetry(kind, device)
