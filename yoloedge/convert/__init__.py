"""Model conversion helpers: the exact ATC (Ascend `.om`) and trtexec (TensorRT engine) commands.

yoloedge does not convert models itself: the vendors' tools do, on a machine with their toolkits.
What goes wrong in practice is the command line (input shape and name, batch gears, the AIPP block
and its normalisation), so this package reads the ONNX, derives each flag from it, writes the
command into a script next to the output, and runs it when the tool is installed.
"""

from .source import ConvertError, SourceModel, inspect_onnx

__all__ = ["ConvertError", "SourceModel", "inspect_onnx"]
