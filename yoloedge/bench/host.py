"""What the benchmarks measure outside the daemon: a process's CPU, memory, threads and files from
/proc, and the host's own decode + letterbox ceiling (plain OpenCV threads, no pipeline)."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

import numpy as np

from ..preprocess import Letterboxer, LetterboxStyle
from ..sources.files import open_video_file

_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ProcSample:
    at: float  # time.monotonic()
    cpu_s: float  # user + system CPU seconds so far
    rss_mb: float
    threads: int
    fds: int


def sample_process(pid: int) -> ProcSample:
    """One reading of /proc/PID (Linux)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime (fields 14 and 15 of stat)
    rss_kb = threads = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss_kb = int(line.split()[1])
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    return ProcSample(time.monotonic(), cpu, rss_kb / 1024, threads, fds)


def cpu_percent(first: ProcSample, last: ProcSample) -> float:
    """CPU use between two samples, in % of one core (200 = two cores busy)."""
    wall = last.at - first.at
    return 100 * (last.cpu_s - first.cpu_s) / wall if wall > 0 else 0.0


@dataclass(frozen=True)
class Ceiling:
    frames: int
    seconds: float
    threads: int
    what: str

    @property
    def fps(self) -> float:
        return self.frames / self.seconds if self.seconds else 0.0


def host_ceiling(threads: int, seconds: float, size: tuple[int, int], frame: np.ndarray | None = None,
                 clip: str | None = None, decode_threads: int = 1, nhwc: bool = False) -> Ceiling:
    """Frames per second `threads` plain OpenCV threads get through: decode the clip (or take the
    pre-decoded frame) and letterbox it into a private model-input buffer, as fast as they can.
    No queues, no batching, no device, no MQTT: the most this host could feed a device."""
    height, width = size
    stop = threading.Event()
    counts = [0] * threads

    if (frame is None) == (clip is None):
        raise ValueError("give either a pre-decoded frame or a clip")

    def work(index: int) -> None:
        letterbox = Letterboxer(height, width, 3, nhwc=nhwc, style=LetterboxStyle())
        slot = np.zeros((height, width, 3), np.uint8) if nhwc else np.zeros((3, height, width), np.float32)
        cap = open_video_file(clip, decode_threads) if clip is not None else None
        try:
            while not stop.is_set():
                image = frame
                if cap is not None and clip is not None:
                    ok, image = cap.read()
                    if not ok:
                        cap.release()
                        cap = open_video_file(clip, decode_threads)
                        continue
                if image is not None:
                    letterbox(image, slot)
                counts[index] += 1
        finally:
            if cap is not None:
                cap.release()

    workers = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(threads)]
    started = time.monotonic()
    for w in workers:
        w.start()
    time.sleep(seconds)
    stop.set()
    done = sum(counts)
    elapsed = time.monotonic() - started
    for w in workers:
        w.join(10)
    what = f"decode {os.path.basename(clip)} + letterbox" if clip else "letterbox of a pre-decoded frame"
    return Ceiling(done, elapsed, threads, what)
