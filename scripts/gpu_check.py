"""The prepared GPU check (run by scripts/gpu-check.sh): what can only be proven on an NVIDIA GPU.

Runs in a few minutes on a machine with an NVIDIA GPU and the shared test data next to the repo:

  cuda-python     device count and name; pinned host -> device -> host round trip of 64 MiB
  tensorrt        the TensorRT backend on real device memory (cuda-python): with a real TensorRT,
                  an engine that `trtexec` builds from the shared ONNX; without one, the test
                  fake engine (it computes through ONNX Runtime) over the same real buffers.
                  Detections against ONNX Runtime on the CPU, allocations after warm-up, leaks.
  jpeg            nvImageCodec and pynvjpeg, where installed, against cv2 on the shared photos
  onnxruntime     every GPU provider of the installed onnxruntime against its CPU provider
                  (python -m yoloedge.backends.ort_gpu_check)

It prints one table row per check and exits 1 when any check mismatches or fails, 0 otherwise
(a part whose library is absent is SKIP, not a failure). The test suite never depends on it;
`--fakes` runs every part on the test fakes instead of the hardware, which is how CI keeps the
script itself working.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

REPO = Path(__file__).resolve().parent.parent
FAKES = REPO / "tests" / "fakes"
sys.path.insert(0, str(REPO))

import cv2  # noqa: E402
import numpy as np  # noqa: E402

OK, MISMATCH, FAIL, SKIP = "OK", "MISMATCH", "FAIL", "SKIP"


@dataclass
class Row:
    check: str
    result: str
    figures: str


def table(rows: list[Row]) -> str:
    width = max(len(r.check) for r in rows)
    lines = [f"{'check':<{width}}  {'result':<8}  figures", f"{'-' * width}  {'-' * 8}  {'-' * 40}"]
    lines += [f"{r.check:<{width}}  {r.result:<8}  {r.figures}" for r in rows]
    return "\n".join(lines)


# -- where the runtimes come from ---------------------------------------------------------------------

@contextmanager
def only_on_path(*packages: Path) -> Iterator[None]:
    """Make exactly these fake packages importable (a folder of links to them first on sys.path),
    so the fake TensorRT can sit beside the real cuda-python without the fake `cuda` shadowing it."""
    with tempfile.TemporaryDirectory(prefix="yoloedge-gpu-check-") as folder:
        for package in packages:
            os.symlink(package, Path(folder) / package.name)
        sys.path.insert(0, folder)
        try:
            yield
        finally:
            sys.path.remove(folder)


def setup_runtimes(fakes: bool) -> None:
    """The real libraries, or with --fakes the test fakes of tensorrt, cuda.bindings and the JPEG
    codecs. Without --fakes, only a missing TensorRT is replaced by its fake (over real memory)."""
    if fakes:
        sys.path.insert(0, str(FAKES))
        sys.path.insert(0, str(FAKES / "jpeg"))


# -- cuda-python ---------------------------------------------------------------------------------------

def check_cuda() -> list[Row]:
    try:
        from cuda.bindings import runtime as cudart
    except ImportError as exc:
        return [Row("cuda-python", SKIP, f"not installed ({exc}); pip install 'yoloedge[jetson]'")]
    from yoloedge.backends.cuda_runtime import checked

    try:
        count = checked(cudart.cudaGetDeviceCount(), "cudaGetDeviceCount")
        props = checked(cudart.cudaGetDeviceProperties(0), "cudaGetDeviceProperties")
        name = props.name.decode(errors="replace").strip("\x00") if isinstance(props.name, bytes) else str(props.name)
        nbytes = 64 << 20
        src = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
        host = checked(cudart.cudaMallocHost(nbytes), "cudaMallocHost")
        device = checked(cudart.cudaMalloc(nbytes), "cudaMalloc")
        try:
            pinned = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(int(host)))
            pinned[:] = src
            started = time.perf_counter()
            checked(cudart.cudaMemcpy(device, int(host), nbytes, cudart.cudaMemcpyKind.cudaMemcpyHostToDevice),
                    "cudaMemcpy")
            pinned[:] = 0
            checked(cudart.cudaMemcpy(int(host), device, nbytes, cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost),
                    "cudaMemcpy")
            seconds = time.perf_counter() - started
            same = bool(np.array_equal(pinned, src))
        finally:
            checked(cudart.cudaFree(device), "cudaFree")
            checked(cudart.cudaFreeHost(host), "cudaFreeHost")
    except Exception as exc:  # noqa: BLE001 - a check reports any failure as its row
        return [Row("cuda-python", FAIL, f"{type(exc).__name__}: {exc}")]
    return [Row("cuda-python", OK if same else MISMATCH,
                f"{count} device(s), device 0: {name}; 64 MiB round trip "
                f"{'identical' if same else 'DIFFERS'}, {2 * nbytes / seconds / 1e9:.1f} GB/s")]


# -- the TensorRT backend --------------------------------------------------------------------------------

class AllocationCounter:
    """Counts cudaMalloc / cudaMallocHost / cudaFree / cudaFreeHost through the module the backend
    calls, real or fake."""

    NAMES = ("cudaMalloc", "cudaMallocHost", "cudaFree", "cudaFreeHost")

    def __init__(self, cudart) -> None:
        self.cudart = cudart
        self.counts = dict.fromkeys(self.NAMES, 0)
        self.originals: dict[str, Callable] = {}

    def __enter__(self) -> "AllocationCounter":
        for name in self.NAMES:
            original = getattr(self.cudart, name)
            self.originals[name] = original

            def counted(*args, _name=name, _original=original):
                self.counts[_name] += 1
                return _original(*args)
            setattr(self.cudart, name, counted)
        return self

    def __exit__(self, *exc) -> None:
        for name, original in self.originals.items():
            setattr(self.cudart, name, original)

    @property
    def allocations(self) -> int:
        return self.counts["cudaMalloc"] + self.counts["cudaMallocHost"]

    @property
    def frees(self) -> int:
        return self.counts["cudaFree"] + self.counts["cudaFreeHost"]


def build_engine(onnx: Path, folder: Path, fp16: bool) -> tuple[Path | None, str]:
    """A real engine from trtexec (batch 1..4), or (None, why)."""
    from shutil import which

    trtexec = which("trtexec") or ("/usr/src/tensorrt/bin/trtexec" if os.path.exists("/usr/src/tensorrt/bin/trtexec")
                                   else None)
    if trtexec is None:
        return None, "TensorRT is installed but trtexec is not on PATH"
    engine = folder / (onnx.stem + (".fp16" if fp16 else "") + ".engine")
    command = [sys.executable, "-m", "yoloedge", "convert", "trt", "--onnx", str(onnx), "--output", str(engine),
               "--batch", "1,4"] + (["--fp16"] if fp16 else [])
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900,
                            env={**os.environ, "PATH": os.path.dirname(trtexec) + os.pathsep + os.environ["PATH"]})
    if result.returncode != 0 or not engine.exists():
        return None, f"trtexec failed: {(result.stderr or result.stdout).strip().splitlines()[-1:]}"
    return engine, ""


def images_for_detection(shared: Path) -> list[tuple[str, np.ndarray]]:
    media = shared / "testdata" / "media"
    frames = [(name, cv2.imread(str(media / name))) for name in ("bus.jpg", "zidane.jpg")]
    cap = cv2.VideoCapture(str(media / "street_people_720p.mp4"))
    for index in range(12):
        ok, image = cap.read()
        if ok:
            frames.append((f"street#{index}", image))
    cap.release()
    return [(name, image) for name, image in frames if image is not None]


def compare_on(frames, ours, reference, batch: int) -> tuple[int, list[str]]:
    from yoloedge.verify import compare_detections

    problems, compared = [], 0
    for start in range(0, len(frames), batch):
        chunk = frames[start:start + batch]
        got = ours.detect([image for _, image in chunk])
        want = reference.detect([image for _, image in chunk])
        for (name, _), g, w in zip(chunk, got, want):
            comparison = compare_detections(g.to_dicts(ours.labels), w.to_dicts(reference.labels))
            compared += 1
            problems += [f"{name}: {p}" for p in comparison.problems()[:2]]
    return compared, problems


def check_tensorrt(shared: Path, fakes: bool) -> list[Row]:
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        return [Row("tensorrt backend", SKIP, "cuda-python is not installed")]
    model = shared / "testdata" / "models" / "yolov8n_coco_int8.onnx"
    rows = []
    with tempfile.TemporaryDirectory(prefix="yoloedge-trt-") as folder:
        import importlib.util

        real_trt = not fakes and importlib.util.find_spec("tensorrt") is not None
        plans = []
        if real_trt:
            source = shared / "testdata" / "models" / "yolox_nano_coco_416.onnx"
            for fp16 in (False, True):
                engine, why = build_engine(source, Path(folder), fp16)
                if engine is None:
                    rows.append(Row(f"tensorrt {'fp16' if fp16 else 'fp32'}", FAIL, why))
                else:
                    plans.append((f"tensorrt {'fp16' if fp16 else 'fp32'} (real)", engine, source))
            context = only_on_path()
        else:
            context = only_on_path(FAKES / "tensorrt") if not fakes else only_on_path()
        with context:
            if not real_trt:
                from tensorrt import _fake  # the test fake: computes through ONNX Runtime

                for precision, dtypes in (("fp32", {}), ("fp16", {"images": "float16"})):
                    engine = _fake.write_engine(Path(folder) / f"fake-{precision}.engine", model,
                                                profile=(1, 2, 4), precision=precision, io_dtypes=dtypes)
                    where = "fake engine, fake memory" if fakes else "fake engine, real GPU memory"
                    plans.append((f"tensorrt {precision} ({where})", Path(engine), model))
            for label, engine, source in plans:
                rows.append(run_tensorrt_plan(label, engine, source, shared, cudart))
    return rows


def run_tensorrt_plan(label: str, engine: Path, source: Path, shared: Path, cudart) -> Row:
    from yoloedge.backends.onnxruntime import OnnxRuntimeBackend
    from yoloedge.backends.tensorrt import TensorRTBackend
    from yoloedge.config import ModelConfig, OnnxRuntimeConfig
    from yoloedge.config.tensorrt import TensorRTConfig
    from yoloedge.pipeline.detector import Detector

    frames = images_for_detection(shared)
    try:
        with AllocationCounter(cudart) as counter:
            started = time.perf_counter()
            ours = Detector(ModelConfig(path=str(engine)), TensorRTBackend(str(engine), TensorRTConfig()),
                            max_batch=4, input_sets=2, output_sets=3)
            opened_s = time.perf_counter() - started
            ours.warm_up()
            after_warmup = counter.allocations
            reference = Detector(ModelConfig(path=str(source)), OnnxRuntimeBackend(str(source), OnnxRuntimeConfig()),
                                 max_batch=4)
            try:
                started = time.perf_counter()
                compared, problems = compare_on(frames, ours, reference, batch=3)
                per_frame_ms = (time.perf_counter() - started) * 1000 / max(1, compared)
                steady = counter.allocations - after_warmup
            finally:
                ours.close()
                reference.close()
            leaked = counter.allocations - counter.frees
    except Exception as exc:  # noqa: BLE001 - a check reports any failure as its row
        return Row(label, FAIL, f"{type(exc).__name__}: {str(exc)[:200]}")
    result = OK if not problems and steady == 0 and leaked == 0 else MISMATCH
    figures = (f"{compared} frames, {len(problems)} disagreeing detections; allocations after warm-up {steady}, "
               f"left at close {leaked}; open {opened_s:.2f} s; {per_frame_ms:.1f} ms/frame with the CPU reference")
    if problems:
        figures += f"; first: {problems[0][:160]}"
    return Row(label, result, figures)


# -- GPU JPEG ------------------------------------------------------------------------------------------------

def check_jpeg(shared: Path) -> list[Row]:
    from yoloedge.config.sources import INSTALL_HINTS, JpegDecoderKind, jpeg_decoder_installed
    from yoloedge.sources import jpeg

    media = shared / "testdata" / "media"
    blobs = [(p.name, p.read_bytes()) for p in sorted(media.glob("*.jpg"))]
    rows = []
    for kind in (JpegDecoderKind.NVIMGCODEC, JpegDecoderKind.NVJPEG):
        if not jpeg_decoder_installed(kind):
            rows.append(Row(f"jpeg {kind.value}", SKIP, f"not installed ({INSTALL_HINTS[kind]})"))
            continue
        try:
            decoder = jpeg.start(kind)
            worst_mean, worst_max, gpu_s, cpu_s = 0.0, 0, 0.0, 0.0
            for _, data in blobs:
                started = time.perf_counter()
                for _ in range(10):
                    got = decoder.decode(data)
                gpu_s += time.perf_counter() - started
                started = time.perf_counter()
                for _ in range(10):
                    want = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
                cpu_s += time.perf_counter() - started
                if got.shape != want.shape:
                    raise ValueError(f"shape {got.shape} != cv2 {want.shape}")
                diff = np.abs(got.astype(np.int16) - want.astype(np.int16))
                worst_mean, worst_max = max(worst_mean, float(diff.mean())), max(worst_max, int(diff.max()))
        except Exception as exc:  # noqa: BLE001 - a check reports any failure as its row
            rows.append(Row(f"jpeg {kind.value}", FAIL, f"{type(exc).__name__}: {str(exc)[:200]}"))
            continue
        fallbacks = getattr(decoder, "fallbacks", 0)
        # libjpeg and the GPU upsample chroma differently: a few levels per pixel on average, no more.
        good = worst_mean < 3.0 and fallbacks == 0
        rows.append(Row(f"jpeg {kind.value}", OK if good else MISMATCH,
                        f"{len(blobs)} photos vs cv2: mean |diff| <= {worst_mean:.2f}, max {worst_max}; "
                        f"{gpu_s * 100 / len(blobs):.2f} ms vs cv2 {cpu_s * 100 / len(blobs):.2f} ms per decode; "
                        f"refused by the GPU: {fallbacks}"))
    return rows


# -- ONNX Runtime GPU providers ----------------------------------------------------------------------------

def check_onnxruntime(shared: Path) -> list[Row]:
    model = shared / "testdata" / "models" / "yolox_nano_coco_416.onnx"
    result = subprocess.run([sys.executable, "-m", "yoloedge.backends.ort_gpu_check", str(model), "--batch", "2"],
                            cwd=REPO, capture_output=True, text=True, timeout=900)
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    if result.returncode == 3:
        return [Row("onnxruntime gpu", SKIP, lines[-1] if lines else "no GPU provider in this onnxruntime build")]
    verdict = OK if result.returncode == 0 else (MISMATCH if lines else FAIL)
    detail = " | ".join(lines[-4:]) or result.stderr.strip()[-300:]
    return [Row("onnxruntime gpu", verdict, detail)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shared", type=Path, default=REPO.parent / "shared", help="the shared test data folder")
    p.add_argument("--fakes", action="store_true", help="run on the test fakes (no GPU needed): checks the script")
    p.add_argument("--skip", default="", help="comma-separated parts to leave out: cuda,tensorrt,jpeg,onnxruntime")
    args = p.parse_args(argv)
    if not (args.shared / "testdata" / "models").is_dir():
        print(f"gpu-check: no shared test data at {args.shared}/testdata", file=sys.stderr)
        return 2
    setup_runtimes(args.fakes)
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    rows: list[Row] = []
    for part, run in (("cuda", lambda: [] if args.fakes else check_cuda()),
                      ("tensorrt", lambda: check_tensorrt(args.shared, args.fakes)),
                      ("jpeg", lambda: check_jpeg(args.shared)),
                      ("onnxruntime", lambda: [] if args.fakes else check_onnxruntime(args.shared))):
        if part not in skip:
            rows += run()
    print(table(rows))
    bad = [r for r in rows if r.result in (MISMATCH, FAIL)]
    print(f"\n{len(rows)} checks: {sum(r.result == OK for r in rows)} OK, {len(bad)} failed, "
          f"{sum(r.result == SKIP for r in rows)} skipped")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
