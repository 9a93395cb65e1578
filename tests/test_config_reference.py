"""docs/configuration.md and etc/yoloedge/yoloedge.yaml against the key declarations.

Each key is declared once, as a `Key` in its section's table (config.fields); the reference is
generated from those tables and the example must list exactly the declared keys, so neither can
drift from what the loader reads.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from yoloedge.config import accelerators, cameras, http, loader, models, ort, reference, tracking, zones
from yoloedge.config import ascend, simulated, tensorrt
from yoloedge.config.fields import Key

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "etc" / "yoloedge" / "yoloedge.yaml"
COMMAND = "python -m yoloedge.config.reference > docs/configuration.md"

#: where a section's key holds another section: (section, key) -> (child section, is a list)
CHILDREN = {
    ("top", "model"): ("model", False),
    ("top", "models"): ("model", True),
    ("top", "accelerators"): ("accelerators[]", True),
    ("top", "cameras"): ("cameras[]", True),
    ("top", "mqtt"): ("mqtt", False),
    ("top", "health"): ("health", False),
    ("top", "control"): ("control", False),
    ("top", "http"): ("http", False),
    ("top", "logging"): ("logging", False),
    ("top", "tracking"): ("tracking", False),
    ("accelerators[]", "ascend"): ("accelerators[].ascend", False),
    ("accelerators[]", "tensorrt"): ("accelerators[].tensorrt", False),
    ("accelerators[]", "simulated"): ("accelerators[].simulated", False),
    ("cameras[]", "zones"): ("cameras[].zones[]", True),
    ("cameras[]", "lines"): ("cameras[].lines[]", True),
    ("cameras[]", "tracking"): ("tracking", False),
    ("mqtt", "tls"): ("mqtt.tls", False),
    ("mqtt", "homeassistant"): ("mqtt.homeassistant", False),
}

_KEY_LINE = re.compile(r"^(?P<lead>\s*)# (?P<text>(- )?[a-z_][a-z0-9_]*:( .*)?)$")


def sections() -> dict[str, dict[str, Key]]:
    return {section.name: section.keys for section in reference.SECTIONS}


def test_the_reference_is_what_the_command_generates():
    template = (ROOT / reference.TEMPLATE).read_text(encoding="utf-8")
    written = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert written == reference.render(template), f"docs/configuration.md is out of date: run {COMMAND}"


def test_every_section_of_the_template_is_a_declared_one_and_every_declared_one_is_shown():
    template = (ROOT / reference.TEMPLATE).read_text(encoding="utf-8")
    shown = re.findall(r"<!-- keys: (\S+) -->", template)
    assert sorted(shown) == sorted(sections())


def test_every_key_has_a_type_a_default_and_a_meaning():
    for section in reference.SECTIONS:
        for key, declared in section.keys.items():
            assert declared.describe(), (section.name, key)
            assert reference.default_text(section, key, declared), (section.name, key)
            assert declared.meaning.strip(), (section.name, key)
            assert "|" not in declared.meaning + declared.describe(), (section.name, key)


def test_the_reference_shows_every_table_the_loader_reads():
    tables = [loader.TOP_FIELDS, models.MODEL_FIELDS, loader.MQTT_FIELDS, loader.TLS_FIELDS,
              loader.HOMEASSISTANT_FIELDS, loader.HEALTH_FIELDS, loader.CONTROL_FIELDS, loader.LOGGING_FIELDS,
              http.HTTP_FIELDS, cameras.CAMERA_FIELDS, accelerators.COMMON_FIELDS, accelerators.BACKEND_FIELDS,
              ort.ONNXRUNTIME_FIELDS, ascend.ASCEND_FIELDS, tensorrt.TENSORRT_FIELDS, simulated.SIMULATED_FIELDS,
              tracking.TRACKING_FIELDS, zones.ZONE_FIELDS, zones.LINE_FIELDS]
    shown = [id(declared) for section in reference.SECTIONS for declared in section.keys.values()]
    for table in tables:
        for key, declared in table.items():
            assert id(declared) in shown, key
    assert set(sections()["accelerators[]"]) == set(accelerators.ALL_KEYS)


def test_number_readers_describe_their_bounds_as_their_messages_do():
    declared = loader.TOP_FIELDS["shutdown_timeout_s"]
    assert declared.describe() == "number > 0 and <= 3600"
    assert declared.reader.requirement == "must be a number > 0 and <= 3600"


def starts_block(text: str) -> bool:
    """A commented-out key (`# fps: 5`, `# - name: plan`), not prose that starts with `word:`."""
    if text.endswith("."):
        return False
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return False
    return isinstance(value, (dict, list))


def uncommented(text: str) -> str:
    """The example with its commented-out keys (and the lines indented under them) put back."""
    out = []
    column = None
    for line in text.split("\n"):
        if column is not None and line.startswith(" " * column + "#   "):
            out.append(" " * column + line[column + 2:])
            continue
        column = None
        match = _KEY_LINE.match(line)
        if match and starts_block(match.group("text")):
            column = len(match.group("lead"))
            out.append(" " * column + match.group("text"))
            continue
        out.append(line)
    return "\n".join(out)


def undeclared(declared: dict[str, dict[str, Key]], section: str, value: object, where: str) -> list[str]:
    if not isinstance(value, dict):
        return []
    found = []
    for key, child in value.items():
        path = f"{where}.{key}" if where else str(key)
        if key not in declared[section]:
            found.append(f"{path} (not a key of {section})")
            continue
        inner = CHILDREN.get((section, key))
        if inner is None:
            continue
        name, is_list = inner
        for item in (child or []) if is_list else [child]:
            found += undeclared(declared, name, item, path)
    return found


def test_every_key_of_the_example_is_a_declared_key_of_its_section():
    text = EXAMPLE.read_text(encoding="utf-8")
    assert "tensorrt:\n" in uncommented(text)  # the commented-out accelerators are read too
    declared = sections()
    for version in (text, uncommented(text)):
        assert undeclared(declared, "top", yaml.safe_load(version), "") == []


def test_the_example_finds_a_key_it_does_not_declare():
    declared = sections()
    example = yaml.safe_load("mqtt:\n  tls:\n    cafile: x\ncameras:\n  - name: a\n    fsp: 5\n")
    assert undeclared(declared, "top", example, "") == ["mqtt.tls.cafile (not a key of mqtt.tls)",
                                                        "cameras.fsp (not a key of cameras[])"]


def test_every_declared_key_is_in_the_example():
    text = EXAMPLE.read_text(encoding="utf-8")
    missing = [f"{name}.{key}" for name, keys in sections().items() for key in keys
               if not re.search(rf"(?<![\w.]){re.escape(key)}:", text)]
    assert missing == []
