"""The `simulated:` section of an accelerator: a stand-in device for dry runs and capacity planning.

    accelerators:
      - backend: simulated
        batch: 8
        simulated:
          device_ms: [4, 2]      # one inference takes 4 ms + 2 ms per frame (here 20 ms for 8)
          image: samples/bus.jpg # the outputs every inference returns were recorded on this image
          input: host            # host: float NCHW like ONNX Runtime; aipp: uint8 NHWC like an .om with AIPP

The simulated device runs nothing: it waits as long as `device_ms` says (without holding the
GIL, as a real device call does) and returns outputs recorded once, at start, by running the real
model (`model.path`, an ONNX file) through ONNX Runtime on `image`. So the whole host pipeline --
readers, letterbox, batching, decode, NMS, MQTT -- does its real work at the rate the device
would allow, which is what a capacity plan needs to know.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .fields import INVALID, Choice, Context, Key, FilePath, Number, sequence_or_report
from .yamltree import Item

INPUT_KINDS = ("host", "aipp")
#: the longest simulated inference part (a minute: no real device is slower per batch).
MAX_DEVICE_MS = 60_000


@dataclass(frozen=True)
class SimulatedConfig:
    """Settings handed to `SimulatedBackend`."""

    device_id: int = 0
    #: milliseconds one inference of n frames takes: base + per_frame * n
    device_ms: tuple[float, float] = (4.0, 2.0)
    #: image the returned outputs are recorded on; None: a mid-grey frame (few or no detections)
    image: str | None = None
    #: "host": the model's own input (float NCHW); "aipp": uint8 NHWC, like an Ascend .om with AIPP
    input: str = "host"


def read_device_ms(ctx: Context, item: Item) -> Any:
    """`[base, per_frame]` in milliseconds, or one number (no per-frame part)."""
    if not item.is_sequence:
        base = Number(ge=0, le=MAX_DEVICE_MS, example="[4, 2]")(ctx, item)
        return INVALID if base is INVALID else (base, 0.0)
    children = sequence_or_report(ctx, item, "milliseconds")
    if children is None or len(children) != 2:
        return ctx.bad_value(item, "must be [base_ms, per_frame_ms] or one number", "e.g. device_ms: [4, 2]")
    values = [Number(ge=0, le=MAX_DEVICE_MS)(ctx, child) for child in children]
    if INVALID in values:
        return INVALID
    if values[0] + values[1] <= 0:
        return ctx.bad_value(item, "must give the device some time per inference", "e.g. device_ms: [4, 2]")
    return (values[0], values[1])


SIMULATED_FIELDS: dict[str, Key] = {
    "device_ms": Key(read_device_ms,
                     "one inference of n frames takes base + per_frame x n milliseconds",
                     type=f"`[base, per_frame]` or one number, ms 0..{MAX_DEVICE_MS}",
                     default="`[4, 2]`"),
    "image": Key(FilePath(optional=True),
                 "the image whose real outputs every inference returns; null: a grey frame (few detections, so "
                 "little decode work)"),
    "input": Key(Choice(INPUT_KINDS),
                 "host: the model's own float NCHW input; aipp: uint8 NHWC, like an Ascend `.om` with AIPP"),
}
