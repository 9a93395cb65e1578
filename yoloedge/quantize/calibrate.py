"""Calibration: the letterboxed tensors, ONNX Runtime's static quantizer, and the inputs of the
other toolchains (TensorRT's calibration table, AMCT's .bin tensors).

The tensors come from the float model's own `Detector` letterbox, so the input size, layout,
colour order, normalisation and padding are exactly what inference feeds. They are made once and
kept in memory (a few dozen frames at 640 are tens of MB), so the quantizer and the TensorRT range
pass read the same data.
"""

from __future__ import annotations

import contextlib
import logging
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Sequence

import numpy as np

from ..errors import YoloedgeError
from ..runtime import module_installed

if TYPE_CHECKING:
    from ..pipeline.detector import Detector
    from .frames import Frame

#: the package extra that brings the quantizer's one dependency ONNX Runtime does not
INSTALL_HINT = "pip install 'yoloedge[quantize]'"

#: the calibration methods offered, by ONNX Runtime's names
METHODS = ("minmax", "entropy", "percentile")

#: TensorRT's calibration-cache header names the version that wrote it; trtexec reads a table
#: with another version's header (UNCONFIRMED for every release: see converting-models.md)
TRT_HEADER = "TRT-8601-EntropyCalibration2"


class QuantizeError(YoloedgeError):
    """The model cannot be quantized (not an ONNX float model, or the quantizer failed)."""


def require_onnx() -> None:
    """ONNX Runtime's quantizer imports `onnx`, which is not a run-time dependency."""
    if not module_installed("onnx"):
        raise QuantizeError(f"the quantizer needs the 'onnx' package, which is not installed: {INSTALL_HINT}")


def letterboxed(detector: "Detector", frames: Sequence["Frame"]) -> list[np.ndarray]:
    """Each frame letterboxed into a (1, C, H, W) tensor of the model's input type."""
    buf = detector.backend.input_buffer
    tensors = []
    for frame in frames:
        detector.letterbox(frame.image, buf[0])
        tensors.append(np.array(buf[:1], copy=True))
    return tensors


class TensorReader:
    """ONNX Runtime's `CalibrationDataReader` protocol over tensors in memory; `rewind` to reuse."""

    def __init__(self, input_name: str, tensors: Sequence[np.ndarray]):
        self.input_name = input_name
        self.tensors = list(tensors)
        self._iter: Iterator[np.ndarray] = iter(self.tensors)

    def get_next(self) -> dict[str, np.ndarray] | None:
        tensor = next(self._iter, None)
        return None if tensor is None else {self.input_name: tensor}

    def rewind(self) -> None:
        self._iter = iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)


def _method(name: str):
    from onnxruntime.quantization import CalibrationMethod

    return {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
            "percentile": CalibrationMethod.Percentile}[name]


#: the operators whose speed INT8 is for; what follows the last of them on the way to an output
#: is the head's decoding tail
COMPUTE_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})


#: operators that only a quantized model has
QUANTIZED_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QLinearConv",
                           "QLinearMatMul", "ConvInteger", "MatMulInteger"})


def tail_nodes(model) -> list[str]:
    """The names of the nodes from which no compute operator can be reached: the head's tail
    (sigmoid, reshape, concat, the decode arithmetic). A YOLO head concatenates box coordinates
    (hundreds of pixels) with scores (0..1) into one output; one INT8 scale for both leaves the
    scores a handful of steps, so the tail stays float (it costs next to nothing)."""
    consumers: dict[str, list[int]] = {}
    nodes = list(model.graph.node)
    for index, node in enumerate(nodes):
        for name in node.input:
            consumers.setdefault(name, []).append(index)
    # ONNX keeps nodes in topological order: going backwards, each node's consumers are known
    feeds_compute = [False] * len(nodes)
    for index in range(len(nodes) - 1, -1, -1):
        feeds_compute[index] = any(nodes[c].op_type in COMPUTE_OPS or feeds_compute[c]
                                   for out in nodes[index].output for c in consumers.get(out, ()))
    return [n.name for n, feeds in zip(nodes, feeds_compute) if n.op_type not in COMPUTE_OPS and not feeds]


def quantize(model: str, output: str, reader: TensorReader, method: str = "minmax",
             per_channel: bool = True, keep_tail_float: bool = True) -> None:
    """Static INT8 quantization in QDQ format: uint8 activations, int8 weights (per channel by
    default), the combination ONNX Runtime's CPU kernels fuse into integer convolutions. A model
    below opset 13 is converted to 13 first (per-channel DequantizeLinear needs its `axis`)."""
    require_onnx()
    import onnx
    from onnx import version_converter
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    try:
        proto = onnx.load(model)
        opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
        if opset < 13:
            proto = version_converter.convert_version(proto, 13)
    except Exception as exc:  # onnx raises DecodeError, ValidationError, ... on a file that is not ONNX
        raise QuantizeError(f"{model}: not an ONNX model onnx can read: {type(exc).__name__}: {exc}") from exc
    quantized = sorted({n.op_type for n in proto.graph.node} & QUANTIZED_OPS)
    if quantized:
        raise QuantizeError(f"{model}: already quantized (it has {', '.join(quantized)}): "
                            f"quantize the float model it was made from")
    exclude = tail_nodes(proto) if keep_tail_float else []
    reader.rewind()
    try:
        # the histogram calibrators print progress; the quantizer advises a pre-processing pass
        # (shape inference) the Detector does not need, on the root logger, each run
        with contextlib.redirect_stdout(sys.stderr), _without_advice():
            quantize_static(proto, output, reader, quant_format=QuantFormat.QDQ, per_channel=per_channel,
                            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                            nodes_to_exclude=exclude, calibrate_method=_method(method))
    except YoloedgeError:
        raise
    except Exception as exc:  # the quantizer raises whatever onnx or ORT raised
        raise QuantizeError(f"{model}: ONNX Runtime's quantizer failed: {type(exc).__name__}: {exc}") from exc


def _advice(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("Please consider")


@contextlib.contextmanager
def _without_advice() -> Iterator[None]:
    root = logging.getLogger()
    root.addFilter(_advice)
    try:
        yield
    finally:
        root.removeFilter(_advice)


def tensor_ranges(model: str, reader: TensorReader, method: str = "minmax") -> dict[str, tuple[float, float]]:
    """The (min, max) the calibrator finds for each tensor it calibrates, on `reader`'s tensors."""
    require_onnx()
    import tempfile

    from onnxruntime.quantization import create_calibrator

    reader.rewind()
    with tempfile.TemporaryDirectory(prefix="yoloedge-calib-") as tmp:
        calibrator = create_calibrator(Path(model), augmented_model_path=str(Path(tmp) / "augmented.onnx"),
                                       calibrate_method=_method(method))
        with contextlib.redirect_stdout(sys.stderr):
            calibrator.collect_data(reader)
            data = calibrator.compute_data()
    ranges = {}
    for name, value in data.data.items():
        low, high = value.range_value if hasattr(value, "range_value") else value
        ranges[name] = (float(np.asarray(low).min()), float(np.asarray(high).max()))
    return ranges


def trt_scale_hex(low: float, high: float) -> str:
    """TensorRT's symmetric INT8 scale, max(|min|, |max|) / 127, as the hex of its float32 bits."""
    scale = max(abs(low), abs(high)) / 127.0
    (bits,) = struct.unpack(">I", struct.pack(">f", scale))
    return f"{bits:08x}"


def tensorrt_table(ranges: dict[str, tuple[float, float]], header: str = TRT_HEADER) -> str:
    """The text of a TensorRT calibration cache: a header line, then `name: hexscale` per tensor."""
    lines = [header] + [f"{name}: {trt_scale_hex(*ranges[name])}" for name in sorted(ranges)]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class AmctInput:
    folder: Path
    files: list[Path]
    command: str


def amct_input(model: str, input_name: str, tensors: Sequence[np.ndarray], folder: str) -> AmctInput:
    """The calibration tensors as float32 .bin files (raw, C order) in `folder`, for AMCT's
    `--data_dir`, and the `amct_onnx calibration` command that reads them."""
    import shlex

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for i, tensor in enumerate(tensors):
        path = out / f"calib_{i:04d}.bin"
        np.ascontiguousarray(tensor, np.float32).tofile(path)
        files.append(path)
    shape = ",".join(str(d) for d in tensors[0].shape) if tensors else ""
    save = out / "amct" / Path(model).stem
    command = " ".join(["amct_onnx", "calibration", f"--model={shlex.quote(model)}",
                        f"--save_path={shlex.quote(str(save))}",
                        f"--input_shape={shlex.quote(f'{input_name}:{shape}')}",
                        f"--data_dir={shlex.quote(str(out))}", "--data_types=float32",
                        f"--batch_num={len(files)}"])
    return AmctInput(out, files, command)
