"""ONNX -> TensorRT engine: the trtexec command line [TensorRT trtexec README, sampleOptions.cpp].

    trtexec --onnx=yolov8n.onnx --saveEngine=yolov8n.engine --fp16
        --minShapes=images:1x3x640x640 --optShapes=images:4x3x640x640 --maxShapes=images:8x3x640x640
        --memPoolSize=workspace:1024

* A model with open axes (dynamic batch, or dynamic size) needs an optimisation profile: the three
  shape flags, `name:AxBxCxD`. A fully static model takes none.
* `--memPoolSize=workspace:N` (MiB) is the spelling TensorRT 10 accepts; the older `--workspace=N`
  was removed in 10.x.
* `--fp16` / `--int8` are deprecated from TensorRT 10.15 (superseded by strongly typed networks) and
  absent from the 11.0 help; they still work on the 8.6 / 10.x releases JetPack ships.
* An engine is tied to the GPU and TensorRT version it was built with: build it on the target.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from .source import ConvertError, SourceModel, fixed_batch_check, resolve_image_shape

#: where JetPack installs trtexec; it is not on PATH there by default.
JETSON_TRTEXEC = "/usr/src/tensorrt/bin/trtexec"


@dataclass(frozen=True)
class TrtOptions:
    output: str  # the engine file
    fp16: bool = False
    int8: bool = False
    batches: tuple[int, ...] | None = None  # B | MIN,MAX | MIN,OPT,MAX
    imgsz: tuple[int, int] | None = None
    workspace_mb: int | None = None


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


def build_trtexec(model: SourceModel, opts: TrtOptions) -> TrtPlan:
    """Derive the trtexec command for `model`; touches no file."""
    if opts.workspace_mb is not None and opts.workspace_mb < 1:
        raise ConvertError(f"--workspace-mb must be at least 1, got {opts.workspace_mb}")
    engine = os.path.abspath(opts.output)
    stem = engine[:-len(".engine")] if engine.endswith(".engine") else engine
    channels, h, w = resolve_image_shape(model, opts.imgsz)
    own = fixed_batch_check(model, opts.batches)
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
    if opts.workspace_mb is not None:
        argv.append(f"--memPoolSize=workspace:{opts.workspace_mb}")
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
