"""Two ONNX Runtime builds installed side by side, a mix nobody asked for.

`onnxruntime` (the CPU build, a base dependency) and `onnxruntime-gpu` (the `gpu` extra) are two
distributions of the same `onnxruntime` package folder, so `pip install .[gpu]` installs both, and
the one installed last overwrites the other's files. Nothing fails at install time; what follows
depends on the order: CUDA providers missing although onnxruntime-gpu is listed, or an import that
breaks once one of the two is uninstalled (both own the shared files). pip has no way to say "this
extra replaces that dependency", so the clash is detected instead, from the installed
distributions' metadata, by `yoloedge check` and at the daemon's start.
"""

from __future__ import annotations

import importlib.metadata
import re
from typing import Iterable, Sequence

from ..config.catalogue import CATALOGUE
from ..config.providers import ORT_DISTRIBUTIONS


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_ort_distributions(path: Sequence[str] | None = None) -> list[str]:
    """The ONNX Runtime distributions installed on `path` (default sys.path), sorted, each once."""
    found = set()
    dists = importlib.metadata.distributions() if path is None else importlib.metadata.distributions(path=list(path))
    for dist in dists:
        name = normalise(dist.metadata["Name"] or "")
        if name in ORT_DISTRIBUTIONS:
            found.add(name)
    return sorted(found)


def clash_message(names: Iterable[str]) -> str | None:
    """What to do when more than one ONNX Runtime distribution is installed; None when fine."""
    names = sorted(set(names))
    if len(names) < 2:
        return None
    keep = next((n for n in names if n != "onnxruntime"), names[-1])
    both = "both" if len(names) == 2 else "all"
    return (f"{', '.join(names[:-1])} and {names[-1]} are {both} installed; they share the "
            f"`onnxruntime` module, so the one installed last overwrote the others' files (GPU providers "
            f"may be missing, or the module may break on the next uninstall). Keep one: pip uninstall -y "
            f"{' '.join(names)} && pip install {keep} (or pip install onnxruntime for the CPU only). "
            f"Uninstalling only onnxruntime would delete files the other one needs.")


def ort_clash(path: Sequence[str] | None = None) -> str | None:
    """The clash message for this interpreter's installation (see the module docstring)."""
    return clash_message(installed_ort_distributions(path))


def config_clash(backends: Iterable[str], path: Sequence[str] | None = None) -> str | None:
    """The clash message where one of `backends` (the config's accelerators) runs on ONNX Runtime;
    an Ascend-only box with both builds installed has nothing to fix."""
    if not any("onnxruntime" in _runtime_modules(backend) for backend in backends):
        return None
    return ort_clash(path)


def _runtime_modules(backend: str) -> tuple[str, ...]:
    entry = CATALOGUE.get(backend)
    return entry.runtime_modules if entry is not None else (backend.split(":", 1)[0],)
