"""ONNX -> Ascend `.om`: the ATC command line, derived from the model [CANN ATC docs].

    atc --model=yolov8n.onnx --framework=5 --output=yolov8n --soc_version=Ascend310P3
        --input_format=NCHW --input_shape="images:-1,3,640,640" --dynamic_batch_size="1,2,4,8"
        --insert_op_conf=yolov8n.aipp.cfg --output_type=FP32 --log=info

* `--framework=5` is ONNX; `--output` is a basename, ATC appends `.om`.
* `--input_shape` names the ONNX input; a `-1` batch plus `--dynamic_batch_size` compiles one
  "gear" per listed batch (2 to 100 gears, each 1 to 2048); otherwise the batch is fixed.
* `--insert_op_conf` adds AIPP (see `aipp.py`): the `.om` input becomes uint8 NHWC whatever
  `--input_format` says, and the daemon must letterbox to uint8 (model.input: aipp).
* `--soc_version` must name the chip the `.om` will run on; `npu-smi info` shows it on the target.
* `--log=info`, not `error`: the info log is where ATC says which operators it placed on the AI CPU
  engine (slow) rather than the AI Core; `convert atc` saves it as OUT.atc.log and summarises it
  (see `toollogs.py`). `ASCEND_SLOG_PRINT_TO_STDOUT=1` sends CANN's log to stdout instead of the log
  files (CANN environment-variable reference), where `convert` catches it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ..backends.npu_smi import parse_npu_smi
from .aipp import AippSettings, aipp_config
from .source import ConvertError, SourceModel, fixed_batch_check, resolve_image_shape

FRAMEWORK_ONNX = "5"
OUTPUT_TYPES = ("FP32", "FP16")
MIN_GEARS, MAX_GEARS = 2, 100
MAX_GEAR = 2048
AUTO = "auto"
#: the ATC log level that still names the operators placed on the AI CPU (see the module docstring).
LOG_LEVEL = "info"
#: CANN sends its log to stdout (instead of only ~/ascend/log) with this set.
LOG_ENV = {"ASCEND_SLOG_PRINT_TO_STDOUT": "1"}

# -- soc_version -------------------------------------------------------------------------------

def chip_names(npu_smi_info: str) -> list[str]:
    """Chip names of every device listed by `npu-smi info` (e.g. ['310P3', '310P3'])."""
    return [r["name"] for r in parse_npu_smi(npu_smi_info) if r.get("name")]


def soc_version_from_npu_smi(npu_smi_info: str) -> str:
    """`--soc_version` for the chips `npu-smi info` lists: "310P3" -> "Ascend310P3"."""
    names = sorted(set(chip_names(npu_smi_info)))
    if not names:
        raise ConvertError("cannot find a chip name in the output of `npu-smi info`: pass --soc-version "
                           "(e.g. Ascend310P3)")
    if len(names) > 1:
        raise ConvertError(f"npu-smi lists different chips ({', '.join(names)}): pass --soc-version "
                           f"for the one the model will run on")
    name = names[0]
    return name if name.lower().startswith("ascend") else f"Ascend{name}"


def detect_soc_version(run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> str:
    """Ask this machine's `npu-smi info` which chip it has (only works on the target itself)."""
    tool = shutil.which("npu-smi")
    if tool is None:
        raise ConvertError("--soc-version auto needs npu-smi, which is not on PATH (not an Ascend machine, or "
                           "the driver tools are not installed): pass --soc-version, e.g. Ascend310P3, "
                           "as `npu-smi info` on the target shows it (Name 310P3 -> Ascend310P3)")
    try:
        proc = run([tool, "info"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConvertError(f"npu-smi info failed ({exc}): pass --soc-version") from exc
    if proc.returncode != 0:
        raise ConvertError(f"npu-smi info exited with {proc.returncode}: {proc.stderr.strip()[:200]}; "
                           f"pass --soc-version")
    return soc_version_from_npu_smi(proc.stdout)


# -- the command -------------------------------------------------------------------------------

@dataclass(frozen=True)
class AtcOptions:
    output: str  # basename; ".om" is appended by ATC
    soc_version: str
    batches: tuple[int, ...] | None = None  # None: the model's fixed batch, or 1
    imgsz: tuple[int, int] | None = None
    aipp: bool = True
    aipp_input: str = "rgb"  # convert.aipp.INPUTS: "yuv420sp" for cameras with decoder: dvpp
    frame_color: str = "rgb"
    model_color: str = "rgb"
    mean: tuple[float, float, float] = (0.0, 0.0, 0.0)
    std: tuple[float, float, float] = (1.0, 1.0, 1.0)
    normalize: bool = True
    output_type: str = "FP32"


@dataclass(frozen=True)
class AtcPlan:
    """Everything `convert atc` writes and runs."""

    argv: list[str]
    om_path: str
    script_path: str
    input_shape: str
    gears: tuple[int, ...]  # empty for a fixed batch
    batch: int  # the fixed batch, or the largest gear
    aipp_path: str | None = None
    aipp_text: str | None = None
    notes: list[str] = field(default_factory=list)


def output_basename(output: str) -> tuple[str, str | None]:
    """ATC wants the name without `.om`; a given `.om` is dropped, with a note saying so."""
    if output.lower().endswith(".om"):
        return output[:-3], f"--output is a basename (ATC appends .om): using {output[:-3]}"
    return output, None


def batch_plan(model: SourceModel, batches: tuple[int, ...] | None) -> tuple[int, tuple[int, ...]]:
    """(batch dim for --input_shape, gears): -1 and the gears for several batches, else fixed."""
    own = fixed_batch_check(model, batches)
    if own is not None:
        return own, ()
    if not batches or len(batches) == 1:
        return (batches[0] if batches else 1), ()
    if not MIN_GEARS <= len(batches) <= MAX_GEARS:
        raise ConvertError(f"ATC takes {MIN_GEARS} to {MAX_GEARS} batch gears, got {len(batches)}")
    if batches[-1] > MAX_GEAR:
        raise ConvertError(f"ATC batch gears go up to {MAX_GEAR}, got {batches[-1]}")
    return -1, batches


def build_atc(model: SourceModel, opts: AtcOptions) -> AtcPlan:
    """Derive the ATC command (and the AIPP file) for `model`; touches no file."""
    if not model.nchw:
        raise ConvertError(f"{model.path}: input {model.input_name} {list(model.shape)} is channels-last; "
                           "ATC takes ONNX inputs as NCHW: export the model with a [N, 3, H, W] input")
    if opts.output_type not in OUTPUT_TYPES:
        raise ConvertError(f"--output-type must be one of {', '.join(OUTPUT_TYPES)}, got {opts.output_type!r}")
    base, note = output_basename(opts.output)
    base = os.path.abspath(base)
    channels, h, w = resolve_image_shape(model, opts.imgsz)
    dim0, gears = batch_plan(model, opts.batches)
    input_shape = f"{model.input_name}:{dim0},{channels},{h},{w}"
    argv = ["atc", f"--model={os.path.abspath(model.path)}", f"--framework={FRAMEWORK_ONNX}",
            f"--output={base}", f"--soc_version={opts.soc_version}", "--input_format=NCHW",
            f"--input_shape={input_shape}"]
    if gears:
        argv.append(f"--dynamic_batch_size={','.join(map(str, gears))}")
    aipp_path = aipp_text = None
    if opts.aipp:
        if channels != 3:
            raise ConvertError(f"AIPP with RGB888_U8 needs a 3-channel input; {model.path} has {channels}: "
                               "use --no-aipp")
        aipp_path = base + ".aipp.cfg"
        aipp_text = aipp_config(AippSettings(w, h, opts.frame_color, opts.model_color, opts.mean, opts.std,
                                             opts.normalize, opts.aipp_input), os.path.basename(model.path))
        argv.append(f"--insert_op_conf={aipp_path}")
    argv += [f"--output_type={opts.output_type}", f"--log={LOG_LEVEL}"]
    return AtcPlan(argv=argv, om_path=base + ".om", script_path=base + ".atc.sh", input_shape=input_shape,
                   gears=gears, batch=gears[-1] if gears else dim0, aipp_path=aipp_path, aipp_text=aipp_text,
                   notes=[note] if note else [])


def config_hint(plan: AtcPlan, model: SourceModel, opts: AtcOptions) -> list[str]:
    """The yoloedge.yaml lines that match the converted model."""
    lines = ["model:", f"  path: {plan.om_path}"]
    if opts.aipp and opts.aipp_input == "yuv420sp":
        lines.append("  input: aipp      # the .om takes NV12 from the card's DVPP; AIPP converts and normalises")
    elif opts.aipp:
        lines.append("  input: aipp      # the .om takes uint8 NHWC frames; AIPP normalises")
        lines.append(f"  color: {opts.frame_color}       # the channel order the AIPP block expects to receive")
    lines += ["accelerators:", "  - backend: ascend", "    devices: [0]", f"    batch: {plan.batch}",
              "    ascend:", f"      source_onnx: {os.path.abspath(model.path)}   # for `yoloedge verify`"]
    return lines


def script_comments(plan: AtcPlan, model: SourceModel) -> list[str]:
    return [f"ONNX -> Ascend .om for {os.path.basename(model.path)}, written by `yoloedge convert atc`.",
            "Needs the CANN toolkit: source its set_env.sh first "
            "(e.g. /usr/local/Ascend/ascend-toolkit/set_env.sh).",
            f"Output: {plan.om_path}"
            + (f" (batch gears {','.join(map(str, plan.gears))})" if plan.gears else f" (batch {plan.batch})")]


def write_aipp(plan: AtcPlan) -> None:
    if plan.aipp_path and plan.aipp_text is not None:
        with open(plan.aipp_path, "w", encoding="utf-8") as f:
            f.write(plan.aipp_text)


def normalise_soc(value: str, detect: Callable[[], str] = detect_soc_version) -> str:
    """`auto` asks npu-smi; a bare chip name ("310P3") gets the "Ascend" prefix ATC wants."""
    if value.lower() == AUTO:
        return detect()
    if not re.fullmatch(r"[A-Za-z0-9_]+", value):
        raise ConvertError(f"--soc-version {value!r} is not a chip name such as Ascend310P3")
    return value if value.lower().startswith("ascend") else f"Ascend{value}"


def parse_triple(values: Sequence[float] | None, default: tuple[float, float, float]) -> tuple[float, float, float]:
    return default if values is None else (float(values[0]), float(values[1]), float(values[2]))
