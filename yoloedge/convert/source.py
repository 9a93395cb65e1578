"""What the converters need to know about the source ONNX, and the plumbing they share.

The input tensor's name, layout and open axes decide the conversion flags, so they are read from
the file rather than assumed (`images`, 640x640 is only the Ultralytics default). ONNX Runtime reads
them (the `onnx` package is a development dependency only); graph optimisations are off because
only the signature is wanted.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..errors import ModelError, YoloedgeError
from ..model.spec import DYNAMIC, ModelMetadata, channels_last, normalise_shape, parse_metadata

_ORT_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(uint8)": np.uint8}
#: characters a shell leaves alone inside double quotes (anything else: single-quote the argument).
_DOUBLE_QUOTE_SAFE = re.compile(r"[\w@%+=:,./;-]*")


class ConvertError(YoloedgeError):
    """The source model or the options cannot give a valid conversion; the message says why."""


@dataclass(frozen=True)
class SourceModel:
    """The ONNX model's single image input and its Ultralytics metadata."""

    path: str
    input_name: str
    shape: tuple[int, ...]  # DYNAMIC (-1) for open axes, in the file's order
    dtype: np.dtype
    metadata: ModelMetadata

    @property
    def nchw(self) -> bool:
        """Channels-first unless the last axis looks like channels and the second does not."""
        return not channels_last(self.shape)

    @property
    def batch_is_dynamic(self) -> bool:
        return self.shape[0] == DYNAMIC


def inspect_onnx(path: str) -> SourceModel:
    """Read the input signature and metadata of an ONNX detector (one 4-D image input)."""
    import onnxruntime as ort

    if not os.path.isfile(path):
        raise ConvertError(f"ONNX model not found: {path}")
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3
    try:
        session = ort.InferenceSession(path, sess_options=opts, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ORT raises its own InvalidProtobuf/Fail/... types, all worth one message
        raise ConvertError(f"cannot read {path} as an ONNX model: {str(exc).splitlines()[0]}") from exc
    inputs = session.get_inputs()
    if len(inputs) != 1 or len(inputs[0].shape) != 4:
        raise ConvertError(f"{path}: expected one 4-D image input, got "
                           + ", ".join(f"{i.name} {list(i.shape)}" for i in inputs))
    node = inputs[0]
    dtype = _ORT_TYPES.get(node.type)
    if dtype is None:
        raise ConvertError(f"{path}: input {node.name} has type {node.type}; expected float, float16 or uint8")
    try:
        meta = parse_metadata(session.get_modelmeta().custom_metadata_map or {}, path)
    except ModelError as exc:
        raise ConvertError(str(exc)) from None
    return SourceModel(path, node.name, normalise_shape(node.shape), np.dtype(dtype), meta)


def resolve_image_shape(model: SourceModel, imgsz: Sequence[int] | None) -> tuple[int, int, int]:
    """(channels, height, width) of the converted model's input.

    A fixed spatial size in the file wins (a static graph cannot be resized by a flag; asking for
    another size is an error). Open axes take --imgsz, else the Ultralytics metadata.
    """
    c_axis, h_axis, w_axis = (1, 2, 3) if model.nchw else (3, 1, 2)
    channels = model.shape[c_axis]
    if channels == DYNAMIC:
        channels = model.metadata.channels or 3
    fixed = (model.shape[h_axis], model.shape[w_axis])
    wanted = tuple(imgsz) if imgsz else None
    if DYNAMIC not in fixed:
        if wanted and wanted != fixed:
            raise ConvertError(f"{model.path} has a fixed input size {fixed[0]}x{fixed[1]} (HxW); "
                               f"it cannot be converted at {wanted[0]}x{wanted[1]}: re-export it at that size")
        return channels, fixed[0], fixed[1]
    size = wanted or model.metadata.imgsz
    if not size:
        raise ConvertError(f"{model.path} leaves the input height/width open and has no imgsz metadata: "
                           f"pass --imgsz H W")
    h = fixed[0] if fixed[0] != DYNAMIC else size[0]
    w = fixed[1] if fixed[1] != DYNAMIC else size[1]
    if (h, w) != tuple(size):
        raise ConvertError(f"{model.path}: --imgsz {size[0]} {size[1]} conflicts with the fixed axis of "
                           f"input {list(model.shape)}")
    return channels, h, w


def parse_batches(text: str | None) -> tuple[int, ...] | None:
    """'1,2,4,8' -> (1, 2, 4, 8): sorted, without repeats; None when not given."""
    if text is None:
        return None
    try:
        values = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise ConvertError(f"--batch takes comma-separated whole numbers, e.g. 1,2,4,8 (got {text!r})") from None
    if not values or values[0] < 1:
        raise ConvertError(f"--batch values must be at least 1 (got {text!r})")
    return tuple(values)


def fixed_batch_check(model: SourceModel, batches: tuple[int, ...] | None) -> int | None:
    """The file's own batch when it is fixed (and the request agrees with it), else None.

    A batch baked into the graph (Ultralytics exports with dynamic=False) also sits in Reshape
    constants, so no converter flag can change it.
    """
    if model.batch_is_dynamic:
        return None
    own = model.shape[0]
    if batches and batches != (own,):
        raise ConvertError(f"{model.path} has a fixed batch of {own} (input {model.input_name} "
                           f"{list(model.shape)}); --batch {','.join(map(str, batches))} needs a dynamic "
                           f"batch axis: re-export the ONNX with one (Ultralytics: dynamic=True)")
    return own


# -- commands and scripts ----------------------------------------------------------------------

def shell_line(argv: Sequence[str]) -> str:
    """One shell-ready line; `--flag=value` arguments keep the vendors' documented look
    (`--input_shape="images:1,3,640,640"`) when the value is safe inside double quotes."""
    parts = []
    for arg in argv:
        flag, sep, value = arg.partition("=")
        if sep and flag.startswith("-") and _DOUBLE_QUOTE_SAFE.fullmatch(value) and (";" in value or "," in value):
            parts.append(f'{flag}="{value}"')
        else:
            parts.append(shlex.quote(arg))
    return " ".join(parts)


def write_script(path: str, argv: Sequence[str], comments: Sequence[str]) -> None:
    """A POSIX sh script with the command, so it can be rerun or copied to the target machine."""
    lines = ["#!/bin/sh", *(f"# {c}" if c else "#" for c in comments), "set -e", shell_line(argv), ""]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    os.chmod(path, 0o755)


def find_tool(name: str, fallbacks: Sequence[str] = ()) -> str | None:
    """The tool on PATH, else the first existing executable among `fallbacks`."""
    found = shutil.which(name)
    if found:
        return found
    return next((p for p in fallbacks if os.path.isfile(p) and os.access(p, os.X_OK)), None)


def output_dir_ready(path: str) -> None:
    """Create the output's folder, so the script and the tool have somewhere to write."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise ConvertError(f"cannot create the output folder {folder}: {exc.strerror or exc}") from exc


def run_tool_logged(executable: str, argv: Sequence[str], log_path: str, env: dict[str, str] | None = None) -> int:
    """Run the converter with its stdout and stderr written to `log_path` (the verbose log the
    slow-path summary is read from; too long for the terminal)."""
    try:
        with open(log_path, "w", encoding="utf-8", errors="replace") as log:
            return subprocess.run([executable, *argv[1:]], stdout=log, stderr=subprocess.STDOUT, check=False,
                                  env={**os.environ, **env} if env else None).returncode
    except OSError as exc:
        raise ConvertError(f"cannot run {executable}: {exc.strerror or exc}") from exc


def log_tail(path: str, lines: int = 20) -> list[str]:
    """The last lines of a converter's log, to show why it failed."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().splitlines()[-lines:]
    except OSError:
        return []
