"""Operators that ATC or trtexec put on a slow path, read from the converter's own log.

A model converts "successfully" with some operators on the Ascend AI CPU instead of the AI Core, or
with TensorRT layers left in FP32 (or handed to a plugin / Myelin) although FP16/INT8 was asked.
Both cost throughput without any error, so `convert` keeps the log at a level that names them,
saves it next to the output and prints one summary line per kind.

ATC: CANN names the AI CPU engine `DNN_VM_AICPU` (the AI Core one `AIcoreEngine`) in its option
reference (`stream_max_parallel_num`). The exact wording of the per-operator engine lines is
UNCONFIRMED (no public log text was found); the parser takes any line naming an AI CPU engine
(`DNN_VM_AICPU`, `aicpu`, `AI CPU`) or saying an operator is not supported by the AI Core, and
reads the operator type from `type[X]`, `op_type[X]`, `OpType: X` or `op[X]`.

trtexec --verbose: the "Engine Layer Information" section, one line per engine layer, in the form
NVIDIA's issue threads show (TensorRT 7/8.2, NVIDIA/TensorRT#2011, #444):
`Layer(CaskConvolution): NAME, Tactic: N, IN[Half(1,256,128,150)] -> OUT[Half(1,64,128,150)]`;
8.6/10.x write `IN (Half[1,3,640,640])` (brackets swapped; UNCONFIRMED beyond the thread excerpts).
A layer whose outputs are all `Float` when FP16/INT8 was asked ran in FP32; a layer of type
`Myelin`, `PluginV2`/`PluginV3` or `ForeignNode` is a plugin or a Myelin-compiled subgraph.
Reformat/Shuffle/shape layers are left out: they move data, their precision costs little.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

_AICPU_MARKERS = re.compile(r"DNN_VM_AICPU|\baicpu\b|\bAI ?CPU\b|not supported (?:by|in|on) (?:the )?AI ?Core",
                            re.IGNORECASE)
_OP_TYPE = re.compile(r"(?:op_?type\[|\btype\[|OpType:\s*|optype:\s*)([A-Za-z_][\w.]*)", re.IGNORECASE)
_OP_NAME = re.compile(r"\bop(?:name)?\[([^\]]+)\]", re.IGNORECASE)

_TRT_LAYER = re.compile(r"Layer\((?P<kind>[\w]+)\):\s*(?P<name>.*?),\s*Tactic:\s*\S+?,\s*(?P<io>.*)$")
_DTYPE = re.compile(r"\b(Float|Half|Int8|Int32|Int64|BFloat16|FP8|Bool|UInt8)[\[(]")
_PLUGIN_KINDS = ("Myelin", "PluginV2", "PluginV3", "ForeignNode")
_DATA_MOVERS = ("Reformat", "Shuffle", "NoOp", "Shape", "Slice", "Constant", "Concatenation", "Gather",
                "Identity", "Cast")


@dataclass(frozen=True)
class SlowPaths:
    """What one log says: operator types (ATC) or layer names (trtexec) per kind of slow path."""

    aicpu: tuple[str, ...] = ()  # ATC: operator types on the AI CPU, in first-seen order
    fp32: tuple[str, ...] = ()  # trtexec: layers left in FP32 when FP16/INT8 was asked
    plugin: tuple[str, ...] = ()  # trtexec: layers run by a plugin or Myelin

    def summary(self) -> list[str]:
        lines = []
        if self.aicpu:
            lines.append(f"{len(self.aicpu)} operator{'s' if len(self.aicpu) != 1 else ''} run on the AI CPU "
                         f"(slow path, not the AI Core): {', '.join(self.aicpu)}")
        if self.fp32:
            lines.append(f"{len(self.fp32)} layer{'s' if len(self.fp32) != 1 else ''} run in FP32 although "
                         f"reduced precision was asked: {_few(self.fp32)}")
        if self.plugin:
            lines.append(f"{len(self.plugin)} layer{'s' if len(self.plugin) != 1 else ''} run by a plugin "
                         f"or Myelin: {_few(self.plugin)}")
        return lines


def _few(names: tuple[str, ...], limit: int = 5) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")


def parse_atc_log(text: str) -> SlowPaths:
    """Operator types ATC placed on the AI CPU, each once."""
    found: dict[str, None] = {}
    for line in text.splitlines():
        if not _AICPU_MARKERS.search(line):
            continue
        typed = _OP_TYPE.search(line)
        if typed:
            found.setdefault(typed.group(1), None)
            continue
        named = _OP_NAME.search(line)
        if named:
            found.setdefault(named.group(1), None)
    return SlowPaths(aicpu=tuple(found))


def parse_trtexec_log(text: str, reduced_precision: bool) -> SlowPaths:
    """Engine layers left in FP32 (only when FP16/INT8 was asked) and layers run by plugins/Myelin."""
    fp32: list[str] = []
    plugin: list[str] = []
    for line in text.splitlines():
        m = _TRT_LAYER.search(line)
        if m is None:
            continue
        kind, name, io = m.group("kind"), m.group("name").strip(), m.group("io")
        if any(kind.startswith(p) for p in _PLUGIN_KINDS) or name.startswith("{ForeignNode"):
            plugin.append(name)
            continue
        if not reduced_precision or kind in _DATA_MOVERS:
            continue
        _, arrow, outputs = io.partition("->")
        types = Counter(_DTYPE.findall(outputs if arrow else io))
        if types and set(types) == {"Float"}:
            fp32.append(name)
    return SlowPaths(fp32=tuple(dict.fromkeys(fp32)), plugin=tuple(dict.fromkeys(plugin)))
