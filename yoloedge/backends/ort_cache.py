"""Where a TensorRT engine or MIGraphX program compiled by ONNX Runtime is kept between starts.

Building a TensorRT engine takes minutes on a Jetson, a MIGraphX compile tens of seconds; either
done at every start would keep the service from READY that long, on every restart. So the compiled
result goes to a folder named after everything it depends on: the model's content (sha256, so a
model replaced under the same name gets a new folder, and a copy elsewhere finds the old one), the
input shape it was compiled for (batch and size), the precision and the device, and the ONNX
Runtime version (an engine from another TensorRT is refused by the runtime, a program from another
MIGraphX may not load). Nothing in a folder is ever reused for something else, so a stale file
cannot be loaded for a changed model; old folders are left for the operator to delete.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import BackendError
from ..files import FileProblem, sha256_of

#: the folder under the cache root that holds ONNX Runtime's caches.
ORT_SUBDIR = "onnxruntime"
#: hex digits of the model's sha256 in a folder name: unique for any set of models one keeps.
HASH_DIGITS = 16


@dataclass(frozen=True)
class CacheKey:
    model_sha256: str
    #: frames per run the engine is compiled for.
    batch: int
    #: (height, width) asked for a model with dynamic input axes; None: the model's own size (which
    #: its content, hence the hash, fixes).
    input_hw: tuple[int, int] | None
    #: "fp32", "fp16", "fp16+int8", ... (`ort_providers.precision`).
    precision: str
    #: "tensorrt0", "migraphx1": the provider and device index (devices may differ in model).
    device: str
    #: the ONNX Runtime version, e.g. "1.22.1".
    runtime: str

    @property
    def folder_name(self) -> str:
        size = "modelsize" if self.input_hw is None else "{}x{}".format(*self.input_hw)
        return (f"{self.model_sha256[:HASH_DIGITS]}-b{self.batch}-{size}-{self.precision}"
                f"-{self.device}-ort{self.runtime}")


def model_digest(path: str) -> str:
    """The model's sha256, read in chunks; BackendError naming the file if it cannot be read."""
    try:
        return sha256_of(path)
    except FileProblem as exc:
        raise BackendError(f"cannot read the model to key its engine cache: {exc}") from None


def cache_folder(root: str, key: CacheKey) -> str:
    """The folder for `key` under `root`, created (0700: an engine is code the GPU runs) if missing.
    BackendError naming the folder and the setting when it cannot be made."""
    folder = os.path.join(root, ORT_SUBDIR, key.folder_name)
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        _make_private(folder)
    except OSError as exc:
        raise BackendError(
            f"cannot create the engine cache folder {folder}: {exc.strerror or exc}; set cache_dir on the "
            f"accelerator to a folder this user can write (under systemd, CacheDirectory=yoloedge "
            f"provides one)") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise BackendError(f"the engine cache folder {folder} is not writable by this user; set cache_dir "
                           f"on the accelerator to a folder it can write")
    return folder


def _make_private(folder: str) -> None:
    """The folder as makedirs would have made it: 0700, ours. One that was already there (made by
    hand, or by an older release under a wide umask) may be open to others, and whoever can write
    it chooses the engine the GPU runs: it is made 0700 if it is ours and refused if it is not."""
    info = os.stat(folder)
    if info.st_uid != os.getuid():
        raise BackendError(f"the engine cache folder {folder} belongs to another user (uid {info.st_uid}); "
                           f"remove it, or set cache_dir on the accelerator to a folder of this user")
    if info.st_mode & 0o077:
        os.chmod(folder, 0o700)
