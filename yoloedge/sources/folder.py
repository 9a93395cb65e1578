"""The image files of a folder as a camera: one image per read, unreadable ones skipped and counted."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..errors import ImageError
from .base import Source, SourceError, SourceKind
from .imagesize import DEFAULT_LIMITS, ImageLimits
from .jpeg import CpuJpegDecoder, JpegDecoder
from .jpeg import read_image as read_image_with

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp", ".pgm", ".ppm", ".pbm"})
#: a folder source names this many skipped images in the log, one line each, then only counts them
MAX_SKIPS_LOGGED = 100


class ImageFolderSource(Source):
    """The image files of a folder, in sorted name order, one per read; `loop` rescans and restarts.

    An unreadable image -- corrupt, empty, not a regular file, or over `limits` (a decompression
    bomb) -- is skipped and counted rather than failing the camera: one bad file must not stop a
    folder of thousands. Each is logged once, not on every pass of a loop. A pass that yields no
    image at all is an error, which names the last reason.
    """

    kind = SourceKind.FOLDER
    is_live = False
    nominal_fps = None

    def __init__(self, folder: str, loop: bool, camera: str | None = None,
                 limits: ImageLimits = DEFAULT_LIMITS, decoder: JpegDecoder | None = None):
        super().__init__(folder, camera)
        self._decoder: JpegDecoder = decoder or CpuJpegDecoder()
        self.jpeg_decoder = self._decoder.kind.value
        self._folder = folder
        self._loop = loop
        self._limits = limits
        self._files = list_images(folder)
        if not self._files:
            raise SourceError(f"{folder}: no image files")
        self._index = 0
        self._images_this_pass = 0
        self._logged: set[str] = set()
        self._last_skip: str | None = None

    def read(self) -> np.ndarray | None:
        while True:
            if self._index >= len(self._files):
                if not self._loop or self._images_this_pass == 0:
                    self._note_end()
                    return None
                self._restart()
                continue
            path = self._files[self._index]
            self._index += 1
            try:
                image = read_image_with(path, self._decoder, self._limits)
            except ImageError as exc:
                self._skip(path, str(exc))
                continue
            self._images_this_pass += 1
            return image

    def _skip(self, path: str, reason: str) -> None:
        self.skipped += 1
        self._last_skip = reason
        if path in self._logged or len(self._logged) > MAX_SKIPS_LOGGED:
            return
        self._logged.add(path)
        if len(self._logged) > MAX_SKIPS_LOGGED:
            self._warn("%s: more than %d images skipped; further ones are only counted",
                       self._folder, MAX_SKIPS_LOGGED)
            return
        self._warn("%s, skipped", reason)

    def _restart(self) -> None:
        self._files = list_images(self._folder)
        self._index = 0
        self._images_this_pass = 0

    def _note_end(self) -> None:
        if self._images_this_pass == 0:
            last = f" (the last: {self._last_skip})" if self._last_skip else ""
            self.error = f"{self._folder}: no readable image{last}"
        else:
            self.eof = True


def list_images(folder: str) -> list[str]:
    """Image files directly in `folder`, sorted by name (hidden files ignored)."""
    try:
        names = sorted(os.listdir(folder))
    except OSError as exc:
        raise SourceError(f"{folder}: cannot list folder: {exc.strerror}") from exc
    return [os.path.join(folder, n) for n in names
            if not n.startswith(".") and Path(n).suffix.lower() in IMAGE_SUFFIXES
            and os.path.isfile(os.path.join(folder, n))]

