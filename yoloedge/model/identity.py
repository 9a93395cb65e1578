"""What a device opening loaded: the sha256 of the model file and of the labels file, if any.

A device that fails is opened again from the files on disk (see `pipeline.worker`). A model change
needs a restart of the service, so a reopening must load what the first opening loaded: a different
model copied over `model.path` would otherwise come back on one card only, with an input shape the
group's letterbox does not fit (every frame to it lost) or with other classes (one camera's
detections alternating between two models). So the first opening records the files' digests and
every reopening compares them first. Content, not mtime or size: a copy with `cp -p` or a model of
the same size keeps both. Read in chunks, so a model of several GB costs no memory; opened
non-blocking and required to be a regular file, so a FIFO put in its place cannot hang the check.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Sequence

from ..errors import ModelError
from ..files import FileProblem, sha256_of

#: hex digits of a digest shown in messages: enough to tell two files apart by eye
SHOWN = 16


class ModelFiles(Protocol):
    """What names the files an opening reads: `config.ModelConfig` (the config imports `model`,
    not the other way round)."""

    @property
    def path(self) -> str: ...

    @property
    def labels(self) -> str | Sequence[str] | None: ...


class ModelFileChanged(ModelError):
    """A file the first opening loaded is no longer the same: the device is not opened again."""


@dataclass(frozen=True)
class FileDigest:
    what: str  # "model file", "labels file"
    path: str
    sha256: str


def model_files(config: ModelFiles) -> list[tuple[str, str]]:
    """(what, path) of every file an opening reads: the model, and the labels file when labels
    are given as a path (a list in the config, or names in the model's metadata, read none)."""
    files = [("model file", str(config.path))]
    if isinstance(config.labels, (str, Path)):
        files.append(("labels file", str(config.labels)))
    return files


def record(config: ModelFiles) -> tuple[FileDigest, ...]:
    """The digests of the files an opening of `config` reads, as they are now."""
    return tuple(FileDigest(what, path, _sha256(what, path)) for what, path in model_files(config))


def check_unchanged(recorded: tuple[FileDigest, ...]) -> None:
    """Raise ModelFileChanged naming the first file whose content is not what was recorded."""
    for digest in recorded:
        try:
            now = _sha256(digest.what, digest.path)
        except ModelError as exc:
            raise ModelFileChanged(f"{exc} (it held sha256 {digest.sha256[:SHOWN]} when the service started); "
                                   f"put the original back, or restart the service to load a new one") from None
        if now != digest.sha256:
            raise ModelFileChanged(
                f"{digest.what} {digest.path} changed since the service started (sha256 "
                f"{digest.sha256[:SHOWN]}, now {now[:SHOWN]}); restart the service to load it, "
                f"or put the original back")


def _sha256(what: str, path: str) -> str:
    try:
        return sha256_of(path)
    except FileProblem as exc:
        raise ModelError(f"cannot read {what} {exc}") from None
