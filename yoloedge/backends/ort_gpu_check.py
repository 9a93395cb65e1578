"""Check ONNX Runtime's GPU providers against its CPU provider on real models (for scripts/gpu-check.sh).

    python -m yoloedge.backends.ort_gpu_check MODEL.onnx [...] [--providers cuda,tensorrt] [--batch 2]

For every model and every GPU provider this onnxruntime build has (or those named), it opens the
backend as the daemon does (input sets staged in device OrtValues, engine cache in `--cache-dir`),
runs the same random batch through it and through the CPU provider, full and partial, and compares
the outputs element by element (|gpu - cpu| <= atol + rtol * |cpu|). It then opens the model a
second time from the cache and reports both opening times, so a rebuild at start-up shows. One
line per model and provider; exit status 0 when all match, 1 on a mismatch or a failure to open,
3 when this build has none of the providers asked for (nothing was checked).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from ..config.model import OnnxRuntimeConfig
from ..config.providers import GPU_PROVIDERS, PROVIDERS
from ..errors import YoloedgeError
from .onnxruntime import OnnxRuntimeBackend

NO_PROVIDER = 3


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m yoloedge.backends.ort_gpu_check", description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+", type=Path, help="ONNX models to check")
    p.add_argument("--providers", default="", help="comma-separated, e.g. cuda,tensorrt (default: every GPU "
                                                   "provider this onnxruntime build has)")
    p.add_argument("--batch", type=int, default=2, help="frames per run (default 2); a partial batch of 1 runs too")
    p.add_argument("--cache-dir", default="", help="engine cache root (default: a new temporary folder, so the "
                                                   "first opening builds)")
    p.add_argument("--rtol", type=float, default=1e-2, help="relative tolerance (default 1e-2)")
    p.add_argument("--atol", type=float, default=1e-2, help="absolute tolerance (default 1e-2)")
    return p.parse_args(argv)


def worst_excess(got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> tuple[float, float]:
    """(largest |got - want|, largest amount by which it exceeds atol + rtol * |want|)."""
    diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
    excess = diff - (atol + rtol * np.abs(want.astype(np.float64)))
    return float(diff.max(initial=0.0)), float(excess.max(initial=-np.inf))


def check(model: Path, provider: str, args: argparse.Namespace, cache_dir: str) -> tuple[bool, str]:
    """(matches, one table line) for one model on one provider."""
    cpu = OnnxRuntimeBackend(str(model), OnnxRuntimeConfig())
    config = OnnxRuntimeConfig(provider=provider, cache_dir=cache_dir)
    started = time.monotonic()
    gpu = OnnxRuntimeBackend(str(model), config)
    try:
        gpu.open(args.batch)
        first_open = time.monotonic() - started
        cpu.open(args.batch)
        rng = np.random.default_rng(2024)
        data = rng.random(cpu.input_buffer.shape).astype(cpu.input_buffer.dtype)
        cpu.input_buffer[...] = data
        gpu.input_buffer[...] = data
        largest, ok = 0.0, True
        for n in sorted({args.batch, 1}, reverse=True):
            for got, want in zip(gpu.run(n), cpu.run(n)):
                diff, excess = worst_excess(got, want, args.rtol, args.atol)
                largest = max(largest, diff)
                ok = ok and excess <= 0
        staged = gpu._input_device
    finally:
        gpu.close()
        cpu.close()
    started = time.monotonic()
    again = OnnxRuntimeBackend(str(model), config)
    try:
        again.open(args.batch)
    finally:
        again.close()
    second_open = time.monotonic() - started
    line = (f"{model.name:<32} {provider:<9} {'OK' if ok else 'MISMATCH':<8} max|diff| {largest:<10.3g} "
            f"inputs on {staged or 'host'}  open {first_open:6.1f} s, again {second_open:6.1f} s")
    return ok, line


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    available = ort.get_available_providers()
    asked = [p.strip() for p in args.providers.split(",") if p.strip()] or list(GPU_PROVIDERS)
    unknown = [p for p in asked if p not in GPU_PROVIDERS]
    if unknown:
        print(f"unknown provider(s) {', '.join(unknown)}: choose from {', '.join(GPU_PROVIDERS)}", file=sys.stderr)
        return 2
    providers = [p for p in asked if PROVIDERS[p].ort_name in available]
    print(f"onnxruntime {ort.__version__}: providers {', '.join(available)}")
    if not providers:
        print(f"none of {', '.join(asked)} is in this onnxruntime build: nothing checked")
        return NO_PROVIDER
    all_ok = True
    with tempfile.TemporaryDirectory(prefix="yoloedge-ort-cache-") as scratch:
        for model in args.models:
            for provider in providers:
                try:
                    ok, line = check(model, provider, args, args.cache_dir or scratch)
                except (YoloedgeError, OSError) as exc:
                    ok, line = False, f"{model.name:<32} {provider:<9} FAILED   {exc}"
                except Exception as exc:  # noqa: BLE001 - ONNX Runtime's own errors (EPFail, RuntimeError ...)
                    # on one provider must not cost the lines of the others: device time is scarce
                    why = f"{type(exc).__name__}: {_first_line(exc)}"
                    ok, line = False, f"{model.name:<32} {provider:<9} FAILED   {why}"
                all_ok = all_ok and ok
                print(line, flush=True)
    return 0 if all_ok else 1


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else ""


if __name__ == "__main__":
    sys.exit(main())
