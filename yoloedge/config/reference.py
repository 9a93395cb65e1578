"""The configuration reference, docs/configuration.md, built from the key declarations.

Every key is declared once, as a `fields.Key` in its section's table (the reader gives its type and
bounds, the Key its meaning); its default is the section dataclass's field default unless the Key
says otherwise. The prose around the tables is docs/configuration.in.md, where a line
`<!-- keys: SECTION -->` stands for the table of that section. So the reference cannot drift
from the loader: `tests/test_config_reference.py` fails when the file differs from what

    python -m yoloedge.config.reference > docs/configuration.md

writes.
"""

from __future__ import annotations

import dataclasses
import enum
import re
import sys
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .accelerators import BACKEND_FIELDS, COMMON_FIELDS
from .ascend import ASCEND_FIELDS, AscendConfig
from .cameras import CAMERA_FIELDS
from .fields import Key
from .http import HTTP_FIELDS
from .loader import (CONTROL_FIELDS, HEALTH_FIELDS, HOMEASSISTANT_FIELDS, LOGGING_FIELDS, MQTT_FIELDS, TLS_FIELDS,
                     TOP_FIELDS)
from .model import ModelConfig, OnnxRuntimeConfig
from .models import MODEL_FIELDS
from .ort import ONNXRUNTIME_FIELDS
from .schema import (AcceleratorConfig, CameraConfig, Config, ControlConfig, HealthConfig, HomeAssistantConfig,
                     HttpConfig, LineConfig, LoggingConfig, MqttConfig, TlsConfig, TrackingConfig, ZoneConfig)
from .simulated import SIMULATED_FIELDS, SimulatedConfig
from .tensorrt import TENSORRT_FIELDS, TensorRTConfig
from .tracking import TRACKING_FIELDS
from .zones import LINE_FIELDS, ZONE_FIELDS

TEMPLATE = "docs/configuration.in.md"
_MARKER = re.compile(r"<!-- keys: (?P<section>\S+) -->")
_HEADER = ("| key | type | default | meaning |", "|-----|------|---------|---------|")


@dataclass(frozen=True)
class Section:
    """One table of the reference: its keys, in the order the file lists them, and the dataclasses
    their defaults come from."""

    name: str  # as the file nests it: `cameras[]`, `mqtt.tls`, `top`
    tables: Sequence[Mapping[str, Key]]
    classes: Sequence[type]

    @property
    def keys(self) -> dict[str, Key]:
        return {key: declared for table in self.tables for key, declared in table.items()}


SECTIONS: tuple[Section, ...] = (
    Section("top", (TOP_FIELDS,), (Config,)),
    Section("model", (MODEL_FIELDS,), (ModelConfig,)),
    Section("accelerators[]", ({"name": COMMON_FIELDS["name"], "backend": BACKEND_FIELDS["backend"]},
                               {k: v for k, v in COMMON_FIELDS.items() if k != "name"}, ONNXRUNTIME_FIELDS,
                               {k: v for k, v in BACKEND_FIELDS.items() if k != "backend"}),
            (AcceleratorConfig, OnnxRuntimeConfig)),
    Section("accelerators[].ascend", (ASCEND_FIELDS,), (AscendConfig,)),
    Section("accelerators[].tensorrt", (TENSORRT_FIELDS,), (TensorRTConfig,)),
    Section("accelerators[].simulated", (SIMULATED_FIELDS,), (SimulatedConfig,)),
    Section("cameras[]", (CAMERA_FIELDS,), (CameraConfig,)),
    Section("cameras[].zones[]", (ZONE_FIELDS,), (ZoneConfig,)),
    Section("cameras[].lines[]", (LINE_FIELDS,), (LineConfig,)),
    Section("mqtt", (MQTT_FIELDS,), (MqttConfig,)),
    Section("mqtt.tls", (TLS_FIELDS,), (TlsConfig,)),
    Section("mqtt.homeassistant", (HOMEASSISTANT_FIELDS,), (HomeAssistantConfig,)),
    Section("health", (HEALTH_FIELDS,), (HealthConfig,)),
    Section("control", (CONTROL_FIELDS,), (ControlConfig,)),
    Section("http", (HTTP_FIELDS,), (HttpConfig,)),
    Section("logging", (LOGGING_FIELDS,), (LoggingConfig,)),
    Section("tracking", (TRACKING_FIELDS,), (TrackingConfig,)),
)


def default_text(section: Section, key: str, declared: Key) -> str:
    """The Key's own default text, else its dataclass field's default as YAML writes it."""
    if declared.default is not None:
        return declared.default
    for cls in section.classes:
        for field in dataclasses.fields(cls):
            if field.name != key:
                continue
            if field.default is not dataclasses.MISSING:
                return yaml_text(field.default)
            if field.default_factory is not dataclasses.MISSING:
                return yaml_text(field.default_factory())
    raise LookupError(f"{section.name}.{key}: no dataclass field gives its default; declare one in its Key")


def yaml_text(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, float) and value.is_integer():
        text = str(int(value))
    elif isinstance(value, (tuple, list)):
        text = "[" + ", ".join(yaml_text(item).strip("`") for item in value) + "]"
    elif isinstance(value, dict) and not value:
        text = "{}"
    else:
        text = str(value)
    return f"`{text}`"


def table(section: Section) -> str:
    rows = [f"| `{key}` | {declared.describe()} | {default_text(section, key, declared)} | {declared.meaning} |"
            for key, declared in section.keys.items()]
    return "\n".join((*_HEADER, *rows))


def render(template: str) -> str:
    by_name = {section.name: section for section in SECTIONS}

    def replace(match: re.Match[str]) -> str:
        return table(by_name[match.group("section")])
    return _MARKER.sub(replace, template)


def main(argv: Sequence[str]) -> int:
    path = argv[0] if argv else TEMPLATE
    with open(path, encoding="utf-8") as file:
        sys.stdout.write(render(file.read()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
