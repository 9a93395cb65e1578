"""Which ONNX opsets ATC and TensorRT's ONNX parser document, and the one-line warning outside them.

A model exported at an opset the converter does not know fails late (an unknown operator version
deep in the parse) or converts with a slow fallback; the fix is cheap (re-export with `opset=N`), so
it is said before the converter runs. The ranges, with where they come from:

| converter | opsets | source |
|---|---|---|
| ATC, CANN 5.0.4 / 6.0.1 | 9..13 | CANN "ATC tool" guide, "ONNX operator specifications" (canncommercial 5046, 601) |
| ATC, CANN 7.0 | 9..18 | the same page, canncommercial 700 (ONNX 1.12.0, ONNX Runtime 1.14.0) |
| ATC, CANN 8.x | 9..18 UNCONFIRMED | the 8.x operator list gives the opset per operator only (ONNX 1.12.0) |
| TensorRT 8.5 | up to 17 | onnx-tensorrt docs/operators.md, release 8.5 |
| TensorRT 8.6 | 9..17 UNCONFIRMED | assumed equal to 8.5; lower bound from the 10.x/11.x statement |
| TensorRT 10.0 | 9..20 | onnx-tensorrt docs/operators.md, release 10.0 |
| TensorRT 11.x | 9..25 | NVIDIA TensorRT "ONNX Opset Guide" |

The file's opset is read from the protobuf itself (ModelProto field 8, OperatorSetIdProto version),
so the check needs neither the `onnx` package (a development dependency only) nor a graph load.
"""

from __future__ import annotations

from dataclasses import dataclass

#: the default (empty) domain's name; "ai.onnx" is its long form.
ONNX_DOMAINS = ("", "ai.onnx")


@dataclass(frozen=True)
class OpsetRange:
    tool: str  # as the warning names it
    low: int
    high: int


#: `convert atc`: CANN 7.0's documented range (the CANN version of the build machine is unknown
#: here; 5.x/6.x accept only 9..13, which the warning text says).
ATC = OpsetRange("ATC (CANN 7.0+)", 9, 18)
#: `convert trt`, by the flag family of `--trt-version`.
TRT = {"8.6": OpsetRange("TensorRT 8.5/8.6", 9, 17), "10": OpsetRange("TensorRT 10.0", 9, 20)}


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _fields(data: bytes):
    """(field number, wire type, value) of one protobuf message; value: int or bytes."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            yield number, wire, value
        elif wire == 2:
            size, pos = _varint(data, pos)
            yield number, wire, data[pos:pos + size]
            pos += size
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")


def model_opset(path: str) -> int | None:
    """The default-domain opset the ONNX file imports; None when it cannot be read."""
    try:
        with open(path, "rb") as f:
            data = f.read()
        for number, wire, value in _fields(data):
            if number == 8 and wire == 2 and isinstance(value, bytes):
                domain, version = "", None
                for n, w, v in _fields(value):
                    if n == 1 and w == 2 and isinstance(v, bytes):
                        domain = v.decode("utf-8", "replace")
                    elif n == 2 and w == 0 and isinstance(v, int):
                        version = v
                if domain in ONNX_DOMAINS and version is not None:
                    return version
    except (OSError, ValueError):
        return None
    return None


def opset_warning(opset: int | None, supported: OpsetRange) -> str | None:
    """One line when `opset` is outside what the converter documents, else None."""
    if opset is None or supported.low <= opset <= supported.high:
        return None
    extra = " (CANN 5.x/6.x: 9..13)" if supported is ATC else ""
    return (f"the model's ONNX opset {opset} is outside {supported.low}..{supported.high} that "
            f"{supported.tool} supports{extra}: re-export it with opset={supported.high} "
            f"(Ultralytics: model.export(format='onnx', opset={supported.high}))")
