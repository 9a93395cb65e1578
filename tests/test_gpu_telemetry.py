"""GPU telemetry (backends/gpu_smi.py) from nvidia-smi, tegrastats and rocm-smi.

The tools are small executables on PATH that print what the real ones print (formats in the
module's docstring), record how they were called, and misbehave on request: garbage, an error
exit, silence past the timeout. PATH holds only them, so a GPU box's real tools are never asked.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import time
from pathlib import Path

import pytest

from yoloedge.backends import gpu_smi
from yoloedge.backends.gpu_smi import GpuSmi, parse_nvidia_smi, parse_rocm_smi, parse_tegrastats

SLEEP = shutil.which("sleep") or "/bin/sleep"

NVIDIA_SMI_OUT = ("0, NVIDIA A2, 41, 7, 1203, 15356, 21.37\n"
                  "1, NVIDIA GeForce RTX 3060, [N/A], [Not Supported], 512, 12288, [N/A]\n")
TEGRASTATS_OLD = ("RAM 1766/3964MB (lfb 197x4MB) SWAP 0/2048MB (cached 0MB) CPU [24%@1224,15%@1224,13%@1224,10%@1224] "
                  "EMC_FREQ 0% GR3D_FREQ 37% PLL@21C CPU@25C PMIC@100C GPU@23.5C AO@33.5C thermal@24.5C "
                  "POM_5V_IN 2545/2547 POM_5V_GPU 0/0 POM_5V_CPU 549/529")
TEGRASTATS_NEW = ("12-23-2024 22:54:11 RAM 3162/7620MB (lfb 4x2MB) SWAP 0/3810MB (cached 0MB) "
                  "CPU [1%@729,0%@729,0%@729,0%@729,off,off] GR3D_FREQ 12%@[305,305] cv0@-256C cpu@62.843C "
                  "soc2@61.968C soc0@60.625C gpu@61.687C tj@62.843C soc1@61.687C VDD_IN 3913mW/3922mW "
                  "VDD_CPU_GPU_CV 598mW/598mW VDD_SOC 1238mW/1237mW")
ROCM_SMI_OUT = json.dumps({
    "card0": {"Temperature (Sensor edge) (C)": "45.0", "Temperature (Sensor junction) (C)": "47.0",
              "Temperature (Sensor memory) (C)": "52.0", "Average Graphics Package Power (W)": "31.0",
              "GPU use (%)": "3", "VRAM Total Memory (B)": "17163091968", "VRAM Total Used Memory (B)": "12398592"},
    "card1": {"Temperature (Sensor edge) (C)": "N/A", "Temperature (Sensor junction) (C)": "60.0",
              "Current Socket Graphics Package Power (W)": "120.5", "GPU use (%)": "99",
              "VRAM Total Memory (B)": "68702699520", "VRAM Total Used Memory (B)": "34351349760"},
    "system": {"Driver version": "6.8.5"}})


class Tools:
    """Fake tools in a folder that is the whole PATH."""

    def __init__(self, folder: Path):
        self.folder = folder
        folder.mkdir()

    def add(self, name: str, body: str) -> Path:
        """A /bin/sh script; it appends its arguments to <name>.calls, one line per run."""
        path = self.folder / name
        calls = self.folder / f"{name}.calls"
        path.write_text(f'#!/bin/sh\necho "$@" >> "{calls}"\necho $$ > "{self.folder / (name + ".pid")}"\n{body}\n')
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
        return path

    def printing(self, name: str, text: str, exit_status: int = 0) -> None:
        data = self.folder / f"{name}.out"
        data.write_text(text)
        self.add(name, f'while IFS= read -r line || [ -n "$line" ]; do printf "%s\\n" "$line"; done < "{data}"\n'
                       f"exit {exit_status}")

    def streaming(self, name: str, line: str) -> None:
        """Prints `line` every 0.1 s until stopped, as tegrastats does."""
        self.add(name, f"while :; do printf '%s\\n' '{line}'; {SLEEP} 0.1; done")

    def calls(self, name: str) -> list[str]:
        path = self.folder / f"{name}.calls"
        return path.read_text().splitlines() if path.exists() else []

    def pid(self, name: str) -> int:
        return int((self.folder / f"{name}.pid").read_text())


@pytest.fixture
def tools(tmp_path, monkeypatch) -> Tools:
    made = Tools(tmp_path / "bin")
    monkeypatch.setenv("PATH", str(made.folder))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("HIP_VISIBLE_DEVICES", raising=False)
    return made


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # a zombie is gone too (its parent is the shell or init, not us)
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


def wait_gone(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not gone(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return gone(pid)


# -- nvidia-smi --------------------------------------------------------------------------------------
def test_nvidia_smi_readings_per_device(tools):
    tools.printing("nvidia-smi", NVIDIA_SMI_OUT)
    smi = GpuSmi()
    assert smi.telemetry("cuda", 0) == {"source": "nvidia-smi", "index": 0, "name": "NVIDIA A2", "temperature_c": 41,
                                        "utilisation_percent": 7, "memory_used_mb": 1203, "memory_total_mb": 15356,
                                        "power_w": 21.37}
    second = smi.telemetry("cuda", 1)
    assert second is not None and second["name"] == "NVIDIA GeForce RTX 3060"
    assert (second["temperature_c"], second["utilisation_percent"], second["power_w"]) == (None, None, None)
    assert second["memory_used_mb"] == 512
    assert smi.telemetry("cuda", 2) is None
    assert tools.calls("nvidia-smi") == [" ".join(gpu_smi.NVIDIA_SMI_QUERY)]  # one run served every device


def test_cuda_visible_devices_maps_the_runtime_device_to_the_tool_index(tools, monkeypatch):
    tools.printing("nvidia-smi", NVIDIA_SMI_OUT)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    reading = GpuSmi().telemetry("cuda", 0)
    assert reading is not None and reading["index"] == 1


# -- tegrastats ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("line, expected", [
    (TEGRASTATS_OLD, {"temperature_c": 23.5, "utilisation_percent": 37, "memory_used_mb": 1766,
                      "memory_total_mb": 3964, "power_w": 2.545}),
    (TEGRASTATS_NEW, {"temperature_c": 61.687, "utilisation_percent": 12, "memory_used_mb": 3162,
                      "memory_total_mb": 7620, "power_w": 3.913}),
])
def test_tegrastats_one_line_is_read_then_the_tool_is_stopped(line, expected, tools):
    tools.streaming("tegrastats", line)
    tools.printing("nvidia-smi", "0, Orin (nvgpu), [N/A], [N/A], [N/A], [N/A], [N/A]\n")
    reading = GpuSmi().telemetry("cuda", 0)
    assert reading == {"source": "tegrastats", "index": 0, "name": None, **expected}
    assert tools.calls("tegrastats") == [f"--interval {gpu_smi.TEGRASTATS_INTERVAL_MS}"]
    assert tools.calls("nvidia-smi") == []  # a Jetson's nvidia-smi says little: tegrastats first
    assert wait_gone(tools.pid("tegrastats"))


def test_tegrastats_has_device_0_only(tools):
    tools.streaming("tegrastats", TEGRASTATS_NEW)
    assert GpuSmi().telemetry("cuda", 1) is None


def test_a_disabled_sensor_is_no_reading():
    record = parse_tegrastats(TEGRASTATS_NEW.replace("gpu@61.687C", "gpu@-256C"))[0]
    assert record["temperature_c"] is None and record["utilisation_percent"] == 12


# -- rocm-smi ------------------------------------------------------------------------------------------
def test_rocm_smi_readings_per_card(tools):
    tools.printing("rocm-smi", ROCM_SMI_OUT)
    smi = GpuSmi()
    assert smi.telemetry("rocm", 0) == {"source": "rocm-smi", "index": 0, "name": None, "temperature_c": 45,
                                        "utilisation_percent": 3, "memory_used_mb": 12, "memory_total_mb": 16368,
                                        "power_w": 31}
    second = smi.telemetry("rocm", 1)
    assert second is not None
    assert (second["temperature_c"], second["power_w"], second["utilisation_percent"]) == (60, 120.5, 99)
    assert (second["memory_used_mb"], second["memory_total_mb"]) == (32760, 65520)
    assert tools.calls("rocm-smi") == [" ".join(gpu_smi.ROCM_SMI_ARGS)]
    assert smi.telemetry("cuda", 0) is None  # no NVIDIA tool here


# -- failures: None, no exception, no longer than the timeout ----------------------------------------
@pytest.mark.parametrize("name, kind, output", [
    ("nvidia-smi", "cuda", "Failed to initialize NVML: Driver/library version mismatch\n"),
    ("nvidia-smi", "cuda", "0, A2, 41\n"),
    ("rocm-smi", "rocm", "not json {\n"),
    ("rocm-smi", "rocm", json.dumps({"system": {}})),
    ("rocm-smi", "rocm", json.dumps(["card0"])),
])
def test_garbage_gives_none_and_one_warning(name, kind, output, tools, caplog):
    tools.printing(name, output)
    clock = Clock()
    smi = GpuSmi(clock=clock)
    assert smi.telemetry(kind, 0) is None
    clock.now += gpu_smi.CACHE_S
    assert smi.telemetry(kind, 0) is None
    assert len(tools.calls(name)) == 2
    assert len([r for r in caplog.records if name in r.getMessage()]) == 1


def test_tegrastats_garbage_gives_none(tools):
    tools.streaming("tegrastats", "tegrastats: permission denied, nothing to show")
    assert GpuSmi().telemetry("cuda", 0) is None


def test_an_error_exit_gives_none(tools, caplog):
    tools.printing("nvidia-smi", NVIDIA_SMI_OUT, exit_status=9)
    assert GpuSmi().telemetry("cuda", 0) is None
    assert "nvidia-smi: exited 9" in caplog.text


@pytest.mark.parametrize("name, kind", [("nvidia-smi", "cuda"), ("rocm-smi", "rocm"), ("tegrastats", "cuda")])
def test_a_hanging_tool_costs_one_timeout_and_is_stopped(name, kind, tools):
    child = tools.folder / "child.pid"
    tools.add(name, f'{SLEEP} 30 & echo $! > "{child}"; wait')  # a child holding the pipe: stopped too
    clock = Clock()
    smi = GpuSmi(timeout_s=0.5, clock=clock)
    started = time.monotonic()
    assert smi.telemetry(kind, 0) is None
    assert time.monotonic() - started < 0.5 + gpu_smi.STOP_GRACE_S + 1.0
    started = time.monotonic()
    assert smi.telemetry(kind, 0) is None  # cached: not run again within CACHE_S
    assert time.monotonic() - started < 0.2 and len(tools.calls(name)) == 1
    assert wait_gone(tools.pid(name)) and wait_gone(int(child.read_text()))


def test_no_tool_gives_none(tools):
    smi = GpuSmi()
    assert smi.telemetry("cuda", 0) is None and smi.telemetry("rocm", 0) is None
    assert smi.telemetry("opencl", 0) is None


def test_readings_are_cached_for_every_caller(tools):
    tools.printing("nvidia-smi", NVIDIA_SMI_OUT)
    clock = Clock()
    smi = GpuSmi(clock=clock)
    for device in (0, 1, 0):
        assert smi.telemetry("cuda", device) is not None
    clock.now += gpu_smi.CACHE_S - 0.1
    smi.telemetry("cuda", 0)
    assert len(tools.calls("nvidia-smi")) == 1
    clock.now += 0.2
    smi.telemetry("cuda", 0)
    assert len(tools.calls("nvidia-smi")) == 2


def test_module_entry_point(tools, monkeypatch):
    tools.printing("nvidia-smi", NVIDIA_SMI_OUT)
    monkeypatch.setattr(gpu_smi, "GPU_SMI", GpuSmi())  # a fresh cache for this test
    reading = gpu_smi.gpu_telemetry("cuda", 0)
    assert reading is not None and reading["temperature_c"] == 41


def test_parsers_refuse_output_that_is_not_the_tools():
    for parse, text in ((parse_nvidia_smi, ""), (parse_tegrastats, "hello"), (parse_rocm_smi, "{}")):
        with pytest.raises(ValueError):
            parse(text)
