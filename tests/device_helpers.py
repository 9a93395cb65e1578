"""Helpers the tests of the device backends share: the strict fake pyACL (tests/fakes/acl) as
`acl`, a call on a thread of its own (as a device worker makes it), and a `.om` for the fake."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from types import ModuleType

import pytest

FAKES = Path(__file__).resolve().parent / "fakes"


def fake_acl() -> ModuleType:
    """`import acl` with tests/fakes first on sys.path: the fake. Called at a test module's import;
    the module is skipped where the real pyACL was imported first (an Atlas machine's run)."""
    if str(FAKES) not in sys.path:
        sys.path.insert(0, str(FAKES))
    import acl
    if not hasattr(acl, "_fake"):
        pytest.skip("the real pyACL is already imported in this process; these tests need the fake",
                    allow_module_level=True)
    return acl


def in_thread(fn, *args, timeout: float = 120.0):
    """Run `fn` on a new thread (as a device worker would) and return its result or raise its error."""
    box = {}

    def target():
        try:
            box["value"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed back to the test thread
            box["error"] = exc

    t = threading.Thread(target=target)
    t.start()
    t.join(timeout)
    if "error" in box:
        raise box["error"]
    return box.get("value")


def make_om(directory: Path, onnx_path: Path, name: str | None = None, batch=1, aipp: bool | str = False,
            outputs: list[str] | None = None) -> Path:
    """A fake `.om` and its pairing: what ONNX it runs, its batch (int) or gears (list), AIPP
    (True: RGB888; "yuv420sp": NV12 from the card's DVPP)."""
    om = Path(directory) / (name or f"{Path(onnx_path).stem}.om")
    om.write_bytes(b"fake om: see the .fake.json next to it")
    pairing = {"onnx": str(onnx_path), "batch": batch, "aipp": aipp}
    if outputs:
        pairing["outputs"] = outputs
    Path(f"{om}.fake.json").write_text(json.dumps(pairing))
    return om
