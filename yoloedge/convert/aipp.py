"""The AIPP configuration ATC inserts in front of the model (`--insert_op_conf=aipp.cfg`).

With AIPP the `.om` takes the letterboxed uint8 frame (NHWC, RGB888_U8) and normalises it on the
NPU, so the host skips the float conversion and sends a quarter of the bytes. The block must
reproduce the model's training normalisation exactly; a wrong value does not fail, it silently
moves every score (`yoloedge verify` is what notices).

ATC's normalisation, per output channel i [CANN ATC docs, AIPP]:

    out_i = (in_i - mean_chn_i - min_chn_i) * var_reci_chn_i

A model trained on `(pixel / 255 - mean) / std` (mean and std as fractions of 1, the torchvision
convention) therefore needs `mean_chn_i = 0`, `min_chn_i = 255 * mean_i` and
`var_reci_chn_i = 1 / (255 * std_i)`; a model that takes raw 0-255 pixels (YOLOX) uses mean and std
in pixel units: `min_chn_i = mean_i`, `var_reci_chn_i = 1 / std_i`. `mean_chn` stays 0 because it
takes whole numbers only and `min_chn` takes fractions (123.675 for ImageNet's red).
YOLO (Ultralytics, YOLOv5): mean 0, std 1, /255 -> var_reci_chn = 1/255 = 0.00392157.

`rbuv_swap_switch` swaps R and B of the incoming frame before normalisation, so it is on exactly
when the frames sent are in the other order than the model was trained on; the per-channel values
above are in the model's order.
"""

from __future__ import annotations

from dataclasses import dataclass

from .source import ConvertError

COLORS = ("rgb", "bgr")
#: what the .om takes: letterboxed RGB/BGR frames from the host, or NV12 (YUV420SP) pictures that
#: the card's DVPP decoded and letterboxed itself (`decoder: dvpp`)
INPUTS = ("rgb", "yuv420sp")
#: YUV420SP (BT.601, limited range: what FFmpeg and OpenCV assume for SD and untagged streams, so
#: the NPU sees the RGB the host path would have made) -> RGB, in ATC's fixed-point form
#: `out = (M . (yuv - input_bias)) >> 8` [CANN ATC docs, AIPP colour space conversion]. Rows in
#: R, G, B order; columns Y, U, V.
YUV_TO_RGB_MATRIX = ((298, 0, 409), (298, -100, -208), (298, 516, 0))
YUV_INPUT_BIAS = (16, 128, 128)


@dataclass(frozen=True)
class AippSettings:
    """What the AIPP block must do: frame size and order in, the model's normalisation out."""

    width: int
    height: int
    #: channel order of the uint8 frames yoloedge sends (model.color in the daemon's config).
    frame_color: str = "rgb"
    #: channel order the model was trained on (Ultralytics/YOLOv5: rgb; YOLOX: bgr).
    model_color: str = "rgb"
    #: per channel, in the model's order; fractions of 1 when `normalize`, else pixel units.
    mean: tuple[float, float, float] = (0.0, 0.0, 0.0)
    std: tuple[float, float, float] = (1.0, 1.0, 1.0)
    #: the model takes pixel / 255 (YOLO) rather than 0-255 pixels (YOLOX).
    normalize: bool = True
    #: one of INPUTS: "rgb" (frames in `frame_color`) or "yuv420sp" (NV12, converted on the NPU)
    input: str = "rgb"

    def __post_init__(self) -> None:
        if self.width < 1 or self.height < 1:
            raise ConvertError(f"AIPP image size must be positive, got {self.width}x{self.height}")
        for name in ("frame_color", "model_color"):
            if getattr(self, name) not in COLORS:
                raise ConvertError(f"{name} must be one of {', '.join(COLORS)}, got {getattr(self, name)!r}")
        if self.input not in INPUTS:
            raise ConvertError(f"AIPP input must be one of {', '.join(INPUTS)}, got {self.input!r}")
        if self.input == "yuv420sp" and (self.width % 2 or self.height % 2):
            raise ConvertError(f"YUV420SP needs an even image size, got {self.width}x{self.height}")
        if len(self.mean) != 3 or len(self.std) != 3:
            raise ConvertError("mean and std take three values (one per channel)")
        if any(s <= 0 for s in self.std):
            raise ConvertError(f"std values must be positive, got {self.std}")

    @property
    def swap(self) -> bool:
        """R and B swapped before normalisation (RGB input only: YUV's rows are in model order)."""
        return self.input == "rgb" and self.frame_color != self.model_color

    @property
    def matrix(self) -> tuple[tuple[int, int, int], ...]:
        """The YUV -> colour rows, in the model's channel order."""
        r, g, b = YUV_TO_RGB_MATRIX
        return (r, g, b) if self.model_color == "rgb" else (b, g, r)

    @property
    def scale(self) -> float:
        """Pixel units per unit of the training normalisation's mean/std."""
        return 255.0 if self.normalize else 1.0

    @property
    def min_chn(self) -> tuple[float, float, float]:
        scale = self.scale
        r, g, b = self.mean
        return r * scale, g * scale, b * scale

    @property
    def var_reci_chn(self) -> tuple[float, float, float]:
        scale = self.scale
        r, g, b = self.std
        return 1.0 / (r * scale), 1.0 / (g * scale), 1.0 / (b * scale)


def number(value: float) -> str:
    """Ten significant digits: exact for the usual values (123.675, 1/255 to ~1e-12), and free of
    binary noise such as 123.67499999999998. The NPU computes in FP16 anyway."""
    text = f"{value:.10g}"
    return "0" if text == "-0" else text


def aipp_config(settings: AippSettings, source: str = "") -> str:
    """The text of aipp.cfg (protobuf text format, one `aipp_op` block for the image input)."""
    s = settings
    order = f"{s.frame_color.upper()} frames, model trained on {s.model_color.upper()}"
    norm = ("pixel / 255" if s.normalize else "0-255 pixels") + (
        f", mean {_triple(s.mean)}, std {_triple(s.std)}")
    if s.input == "yuv420sp":
        what = (f"# Input: {s.width}x{s.height} letterboxed NV12 (YUV420SP) pictures from the card's DVPP "
                f"(decoder: dvpp), converted to {s.model_color.upper()} here (BT.601 limited range).")
    else:
        what = (f"# Input: {s.width}x{s.height} letterboxed uint8 frames, NHWC, {order}"
                + (" (R and B swapped here)." if s.swap else "."))
    header = [
        "# AIPP configuration for ATC (--insert_op_conf), written by `yoloedge convert atc`"
        + (f" for {source}" if source else "") + ".",
        what,
        f"# Model normalisation: {norm}.",
        "# ATC applies, per channel i: out_i = (in_i - mean_chn_i - min_chn_i) * var_reci_chn_i",
    ]
    fields = [
        ("aipp_mode", "static"),
        ("related_input_rank", "0"),
        ("input_format", "YUV420SP_U8" if s.input == "yuv420sp" else "RGB888_U8"),
        ("src_image_size_w", str(s.width)),
        ("src_image_size_h", str(s.height)),
        ("crop", "false"),
        ("csc_switch", "true" if s.input == "yuv420sp" else "false"),
        ("rbuv_swap_switch", "true" if s.swap else "false"),
    ]
    if s.input == "yuv420sp":
        fields += [(f"matrix_r{r}c{c}", str(v)) for r, row in enumerate(s.matrix) for c, v in enumerate(row)]
        fields += [(f"output_bias_{i}", "0") for i in range(3)]
        fields += [(f"input_bias_{i}", str(v)) for i, v in enumerate(YUV_INPUT_BIAS)]
    fields += [(f"mean_chn_{i}", "0") for i in range(3)]
    fields += [(f"min_chn_{i}", number(v)) for i, v in enumerate(s.min_chn)]
    fields += [(f"var_reci_chn_{i}", number(v)) for i, v in enumerate(s.var_reci_chn)]
    body = [f"    {key} : {value}" for key, value in fields]
    return "\n".join([*header, "aipp_op {", *body, "}", ""])


def _triple(values) -> str:
    return "(" + ", ".join(number(v) for v in values) + ")"
