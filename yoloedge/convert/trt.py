"""ONNX -> TensorRT engine: the trtexec command line [TensorRT trtexec README, sampleOptions.cpp].

    trtexec --onnx=yolov8n.onnx --saveEngine=yolov8n.engine --fp16
        --minShapes=images:1x3x640x640 --optShapes=images:4x3x640x640 --maxShapes=images:8x3x640x640
        --memPoolSize=workspace:1024

* A model with open axes (dynamic batch, or dynamic size) needs an optimisation profile: the three
  shape flags, `name:AxBxCxD`. A fully static model takes none.
* The builder's workspace limit is `--workspace=N` (MiB) for TensorRT 8.6 and
  `--memPoolSize=workspace:N` (MiB) for 10.x, where `--workspace` was removed. Which one is written
  follows `--trt-version`, by default the version of the trtexec that will run the command (its
  banner, `[TensorRT v100300]` for 10.3.0, `[TensorRT v8601]` for 8.6.1), else of the installed
  `tensorrt` Python package, else 10.x.
* `--fp16` / `--int8` are deprecated from TensorRT 10.15 (superseded by strongly typed networks) and
  absent from the 11.0 help; they still work on the 8.6 / 10.x releases JetPack ships.
* An engine is tied to the GPU and TensorRT version it was built with: build it on the target.
* `--verbose` makes trtexec print its "Engine Layer Information" (one line per engine layer, with
  the tensor types), which `convert trt` saves as MODEL.trtexec.log and summarises: layers left in
  FP32 when --fp16/--int8 was asked, layers run by a plugin or Myelin (see `toollogs.py`).
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
from dataclasses import dataclass, field, replace
from typing import Callable

from .source import ConvertError, SourceModel, fixed_batch_check, parse_batches, resolve_image_shape

#: where JetPack installs trtexec; it is not on PATH there by default.
JETSON_TRTEXEC = "/usr/src/tensorrt/bin/trtexec"
#: the trtexec flag families: 8.6 (and older 8.x) and 10.x.
TRT_VERSIONS = ("8.6", "10")
#: the first line trtexec prints for any command, e.g. `&&&& RUNNING TensorRT.trtexec [TensorRT v100300]`.
BANNER = re.compile(r"\[TensorRT v(\d{4,6})\]")


@dataclass(frozen=True)
class TrtOptions:
    output: str  # the engine file
    fp16: bool = False
    int8: bool = False
    batches: tuple[int, ...] | None = None  # B | MIN,MAX | MIN,OPT,MAX
    imgsz: tuple[int, int] | None = None
    workspace_mb: int | None = None
    trt_version: str = "10"  # one of TRT_VERSIONS: which flags the target's trtexec takes


@dataclass(frozen=True)
class TrtPlan:
    argv: list[str]
    engine_path: str
    script_path: str
    profile: tuple[int, int, int] | None  # (min, opt, max) batch, None for a static model
    batch: int  # the largest batch the engine runs
    notes: list[str] = field(default_factory=list)


def profile_batches(batches: tuple[int, ...] | None) -> tuple[int, int, int]:
    """--batch B (exactly B), MIN,MAX (optimised for MAX) or MIN,OPT,MAX -> (min, opt, max)."""
    if not batches:
        return 1, 1, 1
    if len(batches) == 1:
        return batches[0], batches[0], batches[0]
    if len(batches) == 2:
        return batches[0], batches[1], batches[1]
    if len(batches) == 3:
        return batches[0], batches[1], batches[2]
    raise ConvertError("--batch for TensorRT takes B, MIN,MAX or MIN,OPT,MAX (an engine has one "
                       f"batch range, not gears): got {','.join(map(str, batches))}")


def parse_profile(text: str | None) -> tuple[int, ...] | None:
    """--batch for an engine: B, MIN,MAX or MIN,OPT,MAX, repeats kept (1,1,8 is optimised for 1;
    the sorted set `parse_batches` makes of ATC's gears would turn it into 1,8, optimised for 8)."""
    if parse_batches(text) is None or text is None:  # the same checks: whole numbers, at least 1
        return None
    return tuple(sorted(int(v) for v in text.split(",") if v.strip()))


def build_trtexec(model: SourceModel, opts: TrtOptions) -> TrtPlan:
    """Derive the trtexec command for `model`; touches no file."""
    if opts.workspace_mb is not None and opts.workspace_mb < 1:
        raise ConvertError(f"--workspace-mb must be at least 1, got {opts.workspace_mb}")
    engine = os.path.abspath(opts.output)
    stem = engine[:-len(".engine")] if engine.endswith(".engine") else engine
    channels, h, w = resolve_image_shape(model, opts.imgsz)
    own = fixed_batch_check(model, tuple(sorted(set(opts.batches))) if opts.batches else None)
    argv = ["trtexec", f"--onnx={os.path.abspath(model.path)}", f"--saveEngine={engine}"]
    profile = None
    if -1 in model.shape:
        profile = (own, own, own) if own is not None else profile_batches(opts.batches)
        for flag, n in zip(("--minShapes", "--optShapes", "--maxShapes"), profile):
            dims = (n, channels, h, w) if model.nchw else (n, h, w, channels)
            argv.append(f"{flag}={model.input_name}:{'x'.join(map(str, dims))}")
    if opts.fp16:
        argv.append("--fp16")
    if opts.int8:
        argv.append("--int8")
    if opts.trt_version not in TRT_VERSIONS:
        raise ConvertError(f"--trt-version must be one of {', '.join(TRT_VERSIONS)}, got {opts.trt_version!r}")
    argv.append("--verbose")
    if opts.workspace_mb is not None:
        argv.append(f"--workspace={opts.workspace_mb}" if opts.trt_version == "8.6"
                    else f"--memPoolSize=workspace:{opts.workspace_mb}")
    notes = []
    if opts.int8:
        notes.append("--int8 keeps its accuracy only for a quantised (QDQ) ONNX or with a calibration "
                     "cache; check the engine with `yoloedge verify`")
    batch = profile[2] if profile else model.shape[0]
    return TrtPlan(argv, engine, stem + ".trtexec.sh", profile, batch, notes)


def script_comments(plan: TrtPlan, model: SourceModel) -> list[str]:
    return [f"ONNX -> TensorRT engine for {os.path.basename(model.path)}, written by `yoloedge convert trt`.",
            "Build on the target: an engine only runs on the GPU and TensorRT version that built it.",
            f"Output: {plan.engine_path}"
            + (f" (batch {plan.profile[0]}..{plan.profile[2]}, optimised for {plan.profile[1]})"
               if plan.profile else f" (batch {plan.batch})")]


def config_hint(plan: TrtPlan, model: SourceModel) -> list[str]:
    """The yoloedge.yaml lines that run the engine (and let `yoloedge verify` find its ONNX)."""
    return ["model:", f"  path: {plan.engine_path}",
            "accelerators:", "  - backend: tensorrt", "    devices: [0]", f"    batch: {plan.batch}",
            "    tensorrt:", f"      source_onnx: {os.path.abspath(model.path)}   # for `yoloedge verify`"]


def with_tool(plan: TrtPlan, found: str | None) -> TrtPlan:
    """The plan calling JetPack's trtexec by its full path when only that one is here: it is not
    on PATH on a Jetson, so a script saying just `trtexec` would not run there as written."""
    if found != JETSON_TRTEXEC:
        return plan
    return replace(plan, argv=[JETSON_TRTEXEC, *plan.argv[1:]])


def version_family(version: str) -> str:
    """"10" for TensorRT 10 and later, "8.6" for 8.x (whose trtexec takes --workspace)."""
    major = version.split(".")[0]
    return "10" if major.isdigit() and int(major) >= 10 else "8.6"


def banner_version(text: str) -> str | None:
    """"10.3" from `[TensorRT v100300]`, "8.6" from `[TensorRT v8601]` (10.x encodes MMmmpp, 8.x Mmpp)."""
    found = BANNER.search(text)
    if found is None:
        return None
    n = int(found.group(1))
    major, minor = (n // 10000, n % 10000 // 100) if n >= 10000 else (n // 1000, n % 1000 // 100)
    return f"{major}.{minor}"


def detect_trt_version(trtexec: str | None,
                       run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> tuple[str, str]:
    """(flag family, how it was found): the trtexec that will run the command, else the installed
    `tensorrt` package, else 10.x. `trtexec --help` prints the banner and exits 0 (there is no
    --version flag)."""
    version: str | None = None
    if trtexec is not None:
        try:
            result = run([trtexec, "--help"], capture_output=True, text=True, timeout=60, check=False)
            version = banner_version(f"{result.stdout}\n{result.stderr}")
        except (OSError, subprocess.SubprocessError):
            version = None
        if version is not None:
            return version_family(version), f"{trtexec} is TensorRT {version}"
    try:
        version = importlib.metadata.version("tensorrt")
    except importlib.metadata.PackageNotFoundError:
        found = f"{trtexec} does not say its version" if trtexec else "no TensorRT here"
        return "10", f"{found}; give --trt-version 8.6 for a TensorRT 8.6 target such as JetPack 5"
    return version_family(version), f"the installed tensorrt package is {version}"
