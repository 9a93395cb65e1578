"""yoloedge run as another user (uid 65534, `nobody`) by tests that run as root (a pytest plugin:
tests/conftest.py loads it, so its fixture needs no import).

A test that starts the daemon or yoloedge-ctl as `nobody` used to run this checkout's venv Python
with PYTHONPATH pointing into the checkout. Cloned into a folder other users cannot read (a clone
under /root, or in a `mktemp -d` folder), that process found neither the package (`No module named
yoloedge`) nor, where the venv lives inside the checkout, numpy or even the interpreter. The
session fixture `nobody_python` makes what such a process needs readable by `nobody`, whatever the
checkout's permissions:

* a copy of the `yoloedge` package (with the demo model and clip) in a folder under /tmp;
* an interpreter `nobody` can run and that imports the base dependencies: this venv's, when it
  does so for `nobody` in place; else, with copies (hard links where the file is readable by
  everyone already) of the installed distributions yoloedge requires, this venv's interpreter,
  the base interpreter it was made from, or the system's Python of the same version.

Where none works it skips with the reason, and fails where CI sets YOLOEDGE_REQUIRE_OTHER_USER=1
(.ci/run), so that a checkout in which these tests cannot run is noticed rather than skipped.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from conftest import REPO, skip_unless_required

NOBODY = 65534
SWITCH = "YOLOEDGE_REQUIRE_OTHER_USER"
#: argv prefix that runs a command as uid/gid 65534 with no supplementary groups.
AS_NOBODY = ("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--")
#: what the daemon and yoloedge-ctl import (onnxruntime and cv2 lazily, hence named here).
PROBE_MODULES = ("yoloedge.daemon", "yoloedge.cli.ctl", "numpy", "cv2", "onnxruntime", "paho.mqtt.client",
                 "yaml", "prometheus_client")
PROBE_TIMEOUT_S = 120


@dataclass(frozen=True)
class NobodyPython:
    """How to run yoloedge as `nobody`: `argv(...)` and `env(...)`; `package` is the copy of the
    yoloedge package it imports (the demo files a nobody process reads are in it)."""

    python: str
    pythonpath: tuple[str, ...]
    home: Path  # the folder everything lives in, readable by nobody; a fine cwd

    @property
    def package(self) -> Path:
        return self.home / "lib" / "yoloedge"

    def argv(self, *args: str) -> list[str]:
        return [*AS_NOBODY, self.python, *args]

    def env(self, **extra: str) -> dict[str, str]:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": os.pathsep.join(self.pythonpath),
               "PYTHONDONTWRITEBYTECODE": "1", "HOME": str(self.home)}
        env.update(extra)
        return env


@pytest.fixture(scope="session")
def nobody_python() -> Iterator[NobodyPython]:
    if os.geteuid() != 0:
        pytest.skip("running a process as another user needs root")
    if shutil.which("setpriv") is None:
        skip_unless_required("setpriv (util-linux) is needed to run a process as another user", SWITCH)
    home = Path(tempfile.mkdtemp(prefix="ye-nobody-", dir="/tmp"))
    try:
        home.chmod(0o755)
        found, tried = _prepare(home)
        if found is None:
            skip_unless_required("uid 65534 cannot run yoloedge from here; tried:\n  " + "\n  ".join(tried),
                                 SWITCH)
        yield found
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _prepare(home: Path) -> tuple[NobodyPython | None, list[str]]:
    """The first interpreter that imports everything as nobody: in place, then with copies."""
    lib = home / "lib"
    _copy_tree(REPO / "yoloedge", lib / "yoloedge")
    tried: list[str] = []
    in_place = NobodyPython(sys.executable, (str(lib),), home)
    why = _probe(in_place)
    if why is None:
        return in_place, tried
    tried.append(f"{sys.executable} with its own site-packages: {why}")
    site = home / "site"
    _copy_distributions(site)
    for python in _interpreters():
        candidate = NobodyPython(python, (str(lib), str(site)), home)
        why = _probe(candidate)
        if why is None:
            return candidate, tried
        tried.append(f"{python} with copies of the dependencies: {why}")
    return None, tried


def _probe(candidate: NobodyPython) -> str | None:
    """None when `candidate` imports PROBE_MODULES as nobody, from the copy, in this Python's
    version (the copied extension modules are built for it); else why not."""
    code = ("import importlib, sys\n"
            f"for name in {PROBE_MODULES!r}: importlib.import_module(name)\n"
            "import yoloedge\n"
            "print(sys.version_info[:2], yoloedge.__file__)\n")
    try:
        result = subprocess.run(candidate.argv("-c", code), cwd=candidate.home, env=candidate.env(),
                                capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if result.returncode != 0:
        return (result.stderr.strip().splitlines() or [f"exit {result.returncode}"])[-1]
    expected = f"{tuple(sys.version_info[:2])} {candidate.package / '__init__.py'}"
    if result.stdout.strip() != expected:
        return f"imported {result.stdout.strip()!r}, not {expected!r}"
    return None


def _interpreters() -> list[str]:
    """This venv's Python, the one it was made from, the system's of the same version."""
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    names = [sys.executable, os.path.realpath(sys.executable), getattr(sys, "_base_executable", ""),
             f"/usr/bin/{version}", f"/usr/local/bin/{version}"]
    out: list[str] = []
    for name in names:
        if name and name not in out and os.path.isfile(name):
            out.append(name)
    return out


def _copy_distributions(site: Path) -> None:
    """The installed distributions yoloedge requires (not its extras), recursively, file by file."""
    seen: set[str] = set()
    todo = list(_requirements("yoloedge"))
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # a requirement for another platform or Python version
        root = Path(str(dist.locate_file(""))).resolve()
        for entry in dist.files or ():
            source = Path(str(dist.locate_file(entry))).resolve()
            if not source.is_relative_to(root) or "__pycache__" in source.parts or not source.is_file():
                continue  # console scripts in ../../bin, byte code
            _copy_file(source, site / source.relative_to(root))
        todo += _requirements(name)


def _requirements(name: str) -> list[str]:
    """Names of `name`'s requirements outside its extras."""
    try:
        requires = importlib.metadata.requires(name) or []
    except importlib.metadata.PackageNotFoundError:
        return []
    names = []
    for requirement in requires:
        if re.search(r"\bextra\s*==", requirement):
            continue
        match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
        if match:
            names.append(match.group(0))
    return names


def _copy_tree(source: Path, target: Path) -> None:
    for folder, dirs, files in os.walk(source):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            path = Path(folder) / name
            _copy_file(path, target / path.relative_to(source))


def _copy_file(source: Path, target: Path) -> None:
    """A hard link where everyone may read the file already (its mode is shared with the original),
    else a copy made readable by everyone; folders on the way are made searchable."""
    for folder in reversed([target.parent, *target.parent.parents]):
        if not folder.exists():
            folder.mkdir()
            folder.chmod(0o755)
    mode = source.stat().st_mode
    if mode & stat.S_IROTH:
        try:
            os.link(source, target)
            return
        except OSError:
            pass  # another file system, or links not allowed: copy
    shutil.copyfile(source, target)
    target.chmod(0o755 if mode & stat.S_IXUSR else 0o644)
