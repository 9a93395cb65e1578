"""Fuzzing the config loader: whatever the file holds, loading it gives a Config or a ConfigError,
never another exception, in a few seconds and well under 300 MB.

Three sources of files: random text, structural mutations of the shipped example (values swapped
for other types, keys deleted or added, deep nesting, huge numbers, unicode and control
characters) and textual mutations of it (bytes replaced, YAML bombs and odd YAML spliced in).
Runs are derandomised so that CI is reproducible; the "ci" profile bounds the whole test to
about 30 s. `HYPOTHESIS_PROFILE=long` searches harder.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import yaml

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from yoloedge.config.errors import ConfigError  # noqa: E402
from yoloedge.config.loader import MAX_SPOOL_BYTES, load_config  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "etc" / "yoloedge" / "yoloedge.yaml"
EXAMPLE_MODEL = "/var/lib/yoloedge/models/yolov8n.onnx"
ENVIRON = {"CAM_GATE_PASSWORD": "gate-secret", "MQTT_PASSWORD": "pw"}
PEAK_LIMIT_BYTES = 300 * 1024 * 1024

_COMMON = dict(derandomize=True, deadline=5000, suppress_health_check=[HealthCheck.too_slow,
                                                                       HealthCheck.function_scoped_fixture])
settings.register_profile("ci", max_examples=100, **_COMMON)
settings.register_profile("long", max_examples=5000, **_COMMON)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("fuzz")
    (folder / "model.onnx").write_bytes(b"the loader never opens the model")
    return folder


@pytest.fixture(scope="module")
def example(workdir) -> str:
    text = EXAMPLE.read_text(encoding="utf-8").replace(EXAMPLE_MODEL, str(workdir / "model.onnx"))
    path = workdir / "example.yaml"
    path.write_text(text, encoding="utf-8")
    load_config(str(path), ENVIRON)  # the unmutated example is valid: mutations start from a good file
    return text


def load_bounded(folder: Path, data: str | bytes) -> None:
    """Load `data` as a config file: only ConfigError may come out, and memory stays bounded."""
    path = folder / "fuzzed.yaml"
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass"))
    tracemalloc.start()
    try:
        try:
            assert_bounded(load_config(str(path), ENVIRON))
        except ConfigError as exc:
            assert exc.issues and all(issue.file == str(path) for issue in exc.issues)
            str(exc)  # the message itself must build
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < PEAK_LIMIT_BYTES, f"loading took {peak / 1e6:.0f} MB"


def assert_bounded(node: Any, where: str = "config") -> None:
    """What the loader accepts is bounded: no number is infinite, NaN or past the largest maximum
    (spool bytes; a 1e300 timeout overflows a wait), no string past the longest a key takes (8 KiB,
    a camera URL, plus the config folder for a resolved path)."""
    if dataclasses.is_dataclass(node):
        for f in dataclasses.fields(node):
            assert_bounded(getattr(node, f.name), f"{where}.{f.name}")
    elif isinstance(node, dict):
        for key, value in node.items():
            assert_bounded(key, f"{where} key")
            assert_bounded(value, f"{where}[{key!r}]")
    elif isinstance(node, (list, tuple)):
        for index, value in enumerate(node):
            assert_bounded(value, f"{where}[{index}]")
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        assert math.isfinite(node) and abs(node) <= MAX_SPOOL_BYTES, f"{where} = {node!r}"
        if where.endswith(("_s", "_ms")):  # durations: far below threading.TIMEOUT_MAX
            assert node <= 86_400 * (1000 if where.endswith("_ms") else 1), f"{where} = {node!r}"
    elif isinstance(node, str):
        assert len(node.encode("utf-8", "surrogatepass")) <= 8192 + 4096, f"{where}: {len(node)} characters"


# -- random text ---------------------------------------------------------------------------------

YAML_ALPHABET = st.sampled_from(list(":-[]{},&*!|>'\"#%@`?<= \n\t\r\x00\x85\u2028${}0123456789.eE+abcxyz~"))


@settings(settings.get_profile(PROFILE))
@given(st.one_of(st.text(max_size=400), st.text(YAML_ALPHABET, max_size=400), st.binary(max_size=400)))
def test_random_text_gives_a_config_or_a_config_error(workdir, data):
    load_bounded(workdir, data)


# -- structural mutations of the example -----------------------------------------------------------

def _deep(depth: int) -> Any:
    value: Any = "x"
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=10 ** 30, max_value=10 ** 4000),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40),
    st.text(st.characters(codec="utf-8"), max_size=40),
    st.sampled_from(["rtsp://u:p@h/s\r\nX: 1", "\x00", "a\tb", "\u202e", "${UNSET}", "${X:-1}", "$${", "${",
                     "0o777", "0x1F", "1e999", "-.inf", ".nan", "2024-13-45", "~", "yes", "on", "", " ",
                     "5e-1", "1e300", 1.0e300, 10 ** 12, "x" * 70_000, "é" * 5000]))
VALUES = st.one_of(SCALARS, st.lists(SCALARS, max_size=4), st.dictionaries(st.text(max_size=8), SCALARS, max_size=3),
                   st.integers(min_value=1, max_value=300).map(_deep))


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    found = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            found += _paths(value, prefix + (key,))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += _paths(value, prefix + (index,))
    return found


def _mutate(tree: Any, path: tuple, action: str, value: Any) -> Any:
    if not path:
        return value if action == "replace" else tree
    parent = tree
    for step in path[:-1]:
        parent = parent[step]
    last = path[-1]
    if action == "replace":
        parent[last] = value
    elif action == "delete":
        del parent[last]
    elif action == "add" and isinstance(parent, dict):
        parent[f"x{len(parent)}" if not isinstance(value, str) else value[:12] or "k"] = value
    elif action == "add" and isinstance(parent, list):
        parent.append(value)
    return tree


@settings(settings.get_profile(PROFILE))
@given(data=st.data())
def test_mutated_example_gives_a_config_or_a_config_error(workdir, example, data):
    tree = yaml.safe_load(example)
    for _ in range(data.draw(st.integers(min_value=1, max_value=4), label="mutations")):
        paths = _paths(tree)
        path = data.draw(st.sampled_from(paths), label="path")
        action = data.draw(st.sampled_from(["replace", "delete", "add"]), label="action")
        tree = _mutate(copy.deepcopy(tree), path, action, data.draw(VALUES, label="value"))
    load_bounded(workdir, yaml.safe_dump(tree, allow_unicode=True, sort_keys=False))


# -- textual mutations of the example ------------------------------------------------------------

def _bomb(levels: int) -> str:
    lines = ["a0: &a0 [l, l, l, l, l, l, l, l, l]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


SPLICES = st.one_of(
    st.integers(min_value=1, max_value=12).map(_bomb),
    st.integers(min_value=1, max_value=3000).map(lambda n: "[" * n + "]" * n),
    st.integers(min_value=1, max_value=3000).map(lambda n: "x:\n" + "  - " * n + "y\n"),
    st.sampled_from(["<<: *nope\n", "&a [*a]\n", "x: &a {<<: *a}\n", "!!python/object:os.system\n",
                     "!!binary AAAA\n", "? [a, b]\n: c\n", "--- \n...\n---\n", "%YAML 1.1\n---\n", "\t", "\ufeff",
                     "x: !!float nan\n", "x: !!int 99999999999999999999999999\n", "x: !!timestamp 2024-02-30\n",
                     "x: !!timestamp x\n", 'x: !!int ""\n', "!!float x: 1\n", "x: !!set {a, b}\n", "x: !!omap [a]\n"]),
    st.text(YAML_ALPHABET, max_size=30),
)


@settings(settings.get_profile(PROFILE))
@given(data=st.data())
def test_spliced_example_gives_a_config_or_a_config_error(workdir, example, data):
    text = example
    for _ in range(data.draw(st.integers(min_value=1, max_value=3), label="splices")):
        at = data.draw(st.integers(min_value=0, max_value=len(text)), label="at")
        cut = data.draw(st.integers(min_value=0, max_value=20), label="cut")
        text = text[:at] + data.draw(SPLICES, label="splice") + text[at + cut:]
    load_bounded(workdir, text)
