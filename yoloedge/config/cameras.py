"""The `cameras:` list: sources, how to read them, and what to publish.

A url is rtsp(s)://, http(s):// (MJPEG), file:///path, /dev/videoN (or any /dev/ capture device),
a file or folder path, or synthetic://WIDTHxHEIGHT?fps=F[&image=PATH] (one pre-decoded frame at a
fixed rate, for benchmarks and dry runs). Camera files and folders are not checked for existence:
media may be mounted or recorded later, and the source reports a missing file at run time. A
synthetic camera's image is checked: it is part of the configuration, not media.

Instead of a url, a camera may give `pipeline:`, a GStreamer launch string ending in an appsink;
`decoder:` chooses who decodes a url's video (config.sources).
"""

from __future__ import annotations

import dataclasses
import os
import stat
from typing import Any
from urllib.parse import urlsplit

from ..redact import SECRETS, schemeless_userinfo
from ..files import file_type
from ..model.labels import MAX_CLASSES
from .fields import (INVALID, MAX_NAME_BYTES, Boolean, Choice, Context, Key, Integer, Number, Text, did_you_mean,
                     range_order_ok, read_fields, read_string_list, report_duplicate_names, sequence_or_report)
from .modelrefs import ModelNames
from .schema import AcceleratorConfig, CameraConfig
from .tracking import read_camera_tracking
from .yamltree import Item
from .zones import MAX_ZONES, objects_in_classes_ok, read_lines, read_publish, read_zones, zone_names_ok

NETWORK_SCHEMES = ("rtsp", "rtsps", "http", "https")
SYNTHETIC_SCHEME = "synthetic"
#: URL schemes of sources that never end, so they cannot be read losslessly.
LIVE_SCHEMES = NETWORK_SCHEMES + (SYNTHETIC_SCHEME,)
FILE_SCHEME = "file"
UNSUPPORTED_SCHEME = ("use rtsp://, rtsps://, http://, https://, file://, synthetic://, /dev/videoN, "
                      "or a file or folder path")
SYNTHETIC_HINT = "e.g. url: synthetic://1920x1080?fps=25 or synthetic://1280x720?fps=10&image=frames/gate.jpg"


def read_camera_url(ctx: Context, item: Item) -> Any:
    """The source; a relative path is resolved from the config file's folder."""
    url = Text(max_bytes=MAX_URL_BYTES)(ctx, item)
    if url is INVALID:
        return INVALID
    SECRETS.add_url(url)  # before any check: a message about a bad URL must not quote its secrets
    scheme, sep, rest = url.partition("://")
    if not sep:
        return _local_path(ctx, item, url)
    scheme = scheme.lower()
    if scheme == FILE_SCHEME:
        if not rest.startswith("/"):
            return ctx.bad_value(item, "a file:// URL needs an absolute path", "e.g. file:///srv/videos/gate.mp4")
        return _not_a_pipe(ctx, item, urlsplit(url).path, url)
    if scheme == SYNTHETIC_SCHEME:
        return _synthetic_url(ctx, item, url)
    if scheme not in NETWORK_SCHEMES:
        return ctx.bad_value(item, f"unsupported scheme {scheme}://: {UNSUPPORTED_SCHEME}")
    return _network_url(ctx, item, url)


def _local_path(ctx: Context, item: Item, url: str) -> Any:
    # `rtsp//admin:pw@cam/s` would be opened as a file path and show the password wherever the path
    # is shown. Its secrets were registered by the caller, so a rejected reload's log is scrubbed
    # too; the message shows none of the value.
    if schemeless_userinfo(url) is not None:
        return ctx.problem(item, "looks like a camera address with a missing or mistyped scheme "
                                 "(user:password@host)",
                           "start it with rtsp://, rtsps://, http:// or https://")
    if url.strip().isdigit():
        return ctx.bad_value(item, "a camera index is not a source",
                             f"write the device: url: /dev/video{url.strip()}")
    path = url if url.startswith("/dev/") else ctx.resolve_path(url)
    return _not_a_pipe(ctx, item, path, path)


def _not_a_pipe(ctx: Context, item: Item, path: str, value: str) -> Any:
    """`value`, unless `path` exists and is a FIFO or a socket: OpenCV's open would wait for a
    writer without a timeout, and a pipe cannot be reopened after a failure. Capture devices
    (/dev/video0), files and folders pass; a path that does not exist yet passes too."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return value
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        return ctx.problem(item, f"{path} is {file_type(mode)}, not a file, folder or capture device; "
                                 f"pipes are not supported", "write the stream to a file, or serve it over RTSP")
    return value


def _network_url(ctx: Context, item: Item, url: str) -> Any:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- raises ValueError for a port that is not a number
    except ValueError:
        # not `exc`: urllib quotes the part it could not read, which may be the password
        return ctx.bad_value(item, "not a valid URL (a port that is not a number, or a bad [IPv6] host)",
                             "write '@', '/', '?', '#' and ':' in a user name or password as %40, %2F, %3F, %23, %3A")
    if not parts.hostname:
        return ctx.bad_value(item, "a host name is missing",
                             "e.g. url: rtsp://192.0.2.10/stream1, with user:${CAM_PASSWORD}@ before the host")
    return url


def _synthetic_url(ctx: Context, item: Item, url: str) -> Any:
    """The URL in canonical form, its image path resolved from the config file's folder; the image
    must exist and look like an image (its signature is read, not the whole file)."""
    from .sources import SyntheticUrlError, parse_synthetic_url, synthetic_image_problem
    try:
        spec = parse_synthetic_url(url)
    except SyntheticUrlError as exc:
        return ctx.bad_value(item, str(exc), SYNTHETIC_HINT)
    if spec.image is None:
        return spec.url
    image = ctx.resolve_path(spec.image)
    spec = dataclasses.replace(spec, image=image)
    problem = synthetic_image_problem(image)
    if problem is not None:
        return ctx.problem(item, f"synthetic camera: {problem}")
    return spec.url


def read_camera_classes(ctx: Context, item: Item) -> Any:
    if item.value is None:
        return None
    names = read_string_list(ctx, item, "label names", MAX_CLASSES)
    return INVALID if names is INVALID else tuple(names)


def read_jpeg_decoder(ctx: Context, item: Item) -> Any:
    """One of `config.sources.JPEG_DECODERS`; a GPU decoder must be installed (found, not imported:
    that would start CUDA), so a camera that cannot work is refused before anything starts."""
    from .sources import INSTALL_HINTS, JPEG_DECODERS, MODULES, JpegDecoderKind, jpeg_decoder_installed
    value = Choice(JPEG_DECODERS)(ctx, item)
    if value is INVALID:
        return INVALID
    kind = JpegDecoderKind(value)
    if not jpeg_decoder_installed(kind):
        return ctx.bad_value(item, f"needs {MODULES[kind]}, which is not installed",
                             f"{INSTALL_HINTS[kind]}; or jpeg_decoder: auto (a GPU decoder where one is installed)")
    return value


#: the longest wait a camera key takes (see config.loader.MAX_WAIT_S), the highest frame rate
#: (no camera delivers more), the most retries before giving up (0: never give up).
MAX_WAIT_S = 3600
MAX_FPS = 1000
MAX_RETRIES = 1_000_000
#: frames buffered per camera: decoded frames (6 MB at 1080p, 24 MB at 4K), so 100 is already
#: 2.4 GB at 4K; a live camera keeps only the latest anyway, and a file read losslessly needs a few.
MAX_QUEUE_SIZE = 100
#: the longest camera URL: an RTSP URL with credentials and query is a few hundred bytes.
MAX_URL_BYTES = 8192
#: the most MiB of event best shots per camera (a 1080p shot is about 0.3 MB)
MAX_EVENT_SNAPSHOTS_MB = 4096

CAMERA_FIELDS: dict[str, Key] = {
    "name": Key(Text(topic_safe=True, max_bytes=MAX_NAME_BYTES),
                "topic level, status and logs",
                default="required, unique"),
    "url": Key(read_camera_url,
               "`rtsp://`, `rtsps://`, `http://`/`https://` (MJPEG), `file:///path`, `/dev/videoN`, a video file, a"
               " folder of images, or `synthetic://WIDTHxHEIGHT?fps=F[&image=PATH]` (below)",
               type=f"string, <= {MAX_URL_BYTES} bytes",
               default="required unless `pipeline`"),
    "enabled": Key(Boolean(),
                   "false: configured but not started"),
    "fps": Key(Number(gt=0, le=MAX_FPS, optional=True, example=5),
               "frames per second to process; null: every frame"),
    "realtime": Key(Boolean(optional=True),
                    "files/folders: false reads every frame, lossless, as fast as the accelerator allows; null/true"
                    " paces files at their frame rate. `false` is an error for live sources"),
    "loop": Key(Boolean(),
                "files/folders: start again at the end (an error for live sources)"),
    "classes": Key(read_camera_classes,
                   "publish only these labels",
                   type="non-empty list of labels, or null"),
    "min_score": Key(Number(ge=0, le=1, optional=True, example=0.5),
                     "publish only detections at least this confident"),
    "open_timeout_s": Key(Number(gt=0, le=MAX_WAIT_S, example=10),
                          "wait for the source to open"),
    "read_timeout_s": Key(Number(gt=0, le=MAX_WAIT_S, example=10),
                          "wait for each frame"),
    "decode_threads": Key(Integer(ge=0, le=16, example=1),
                          "FFmpeg decoder threads (files and network streams); 0: OpenCV's default, one per CPU "
                          "core. Raise it only for a camera one core cannot decode (e.g. 4K H.265): each thread "
                          "more costs a thread and a picture or two more per camera, and a frame of delay (see "
                          "\"Memory per camera\")"),
    "decoder": Key(lambda ctx, item: read_camera_decoder(ctx, item),
                   "who decodes an `rtsp://` camera or a video file: OpenCV (FFmpeg), FFmpeg through PyAV (about 6 "
                   "MB less per 1080p camera), GStreamer in software or on the hardware (below), or an Atlas "
                   "card's VDEC (`dvpp`, on a `backend: ascend` accelerator whose .om takes YUV420SP). Status "
                   "shows the one in use",
                   type="`opencv`, `pyav`, `gstreamer`, `jetson`, `vaapi`, `nvidia`, `dvpp`, `auto`"),
    "pipeline": Key(lambda ctx, item: read_camera_pipeline(ctx, item),
                    "a GStreamer launch string ending in an `appsink`, instead of `url` (below)",
                    type=f"string, <= {MAX_URL_BYTES} bytes"),
    "backoff_initial_s": Key(Number(gt=0, le=MAX_WAIT_S, example=1),
                             "first reconnect delay"),
    "backoff_max_s": Key(Number(gt=0, le=MAX_WAIT_S, example=30),
                         "longest reconnect delay"),
    "max_retries": Key(Integer(ge=0, le=MAX_RETRIES, example=0),
                       "reconnects before the camera is failed; 0: forever"),
    "queue_size": Key(Integer(ge=1, le=MAX_QUEUE_SIZE, example=2),
                      "frames buffered before the accelerator (live: newest kept); pictures already resized to the "
                      "model's input, 0.7 MB each from 1080p into 640"),
    "jpeg_decoder": Key(read_jpeg_decoder,
                        "who decodes the JPEGs of an image folder or an HTTP MJPEG camera: `nvimgcodec` (NVIDIA "
                        "nvImageCodec, on the GPU), `nvjpeg` (pynvjpeg, on the GPU), `cpu` (OpenCV); `auto`: the "
                        "first GPU decoder installed that starts, else OpenCV. Status shows the one in use",
                        type="`auto`, `nvimgcodec`, `nvjpeg`, `cpu`"),
    "publish_empty": Key(Boolean(),
                         "publish frames without detections"),
    "accelerator": Key(Text(optional=True, max_bytes=MAX_NAME_BYTES),
                       "accelerator name; null: the first"),
    "models": Key(ModelNames("every model its accelerator loads"),
                  "names of the models this camera's frames go to (each decoded frame once, then to each); "
                  "they must be models its accelerator loads (see [Several models](#several-models))",
                  default="every model its accelerator loads"),
    "zones": Key(read_zones,
                 "polygons whose tracks are counted and reported in events",
                 type=f"list of zones (below), at most {MAX_ZONES}"),
    "lines": Key(read_lines,
                 "counting lines: crossings in and out by label",
                 type=f"list of lines (below), at most {MAX_ZONES}"),
    "publish": Key(read_publish,
                   "what goes to MQTT: per-frame detections, events and counts, or both",
                   type="`events`, `detections`, `both`"),
    "event_snapshots_mb": Key(Number(ge=0, le=MAX_EVENT_SNAPSHOTS_MB, example=16),
                              "MiB of event best shots (one JPEG per event, box drawn; 0.3-0.5 MB at 1080p) kept "
                              "for `/api/events` and the status page; past it the oldest events' shots go first; 0:"
                              " none (see \"Events: reading them back\")"),
    "tracking": Key(read_camera_tracking,
                    "this camera's tracking keys (table below), each over the top level's",
                    type="mapping or null",
                    default="the top-level `tracking`"),  # merged over the top level's by config.tracking
}


def read_cameras(ctx: Context, item: Item) -> Any:
    if item.value is None:
        return ()
    children = sequence_or_report(ctx, item, "cameras")
    if children is None:
        return INVALID
    cameras = [read_camera(ctx, child) for child in children]
    report_duplicate_names(ctx, children, [_name_of(child) for child in children], "camera")
    return INVALID if INVALID in cameras else tuple(cameras)


def _name_of(item: Item) -> Any:
    return item.value["name"].value if item.is_mapping and "name" in item.value else None


def read_camera(ctx: Context, item: Item) -> Any:
    values = read_fields(ctx, item, CAMERA_FIELDS, required=("name",))
    if values is None:
        return INVALID
    sound = one_source_ok(ctx, item)
    sound = ("url" not in values or live_source_options_ok(ctx, item.value, values)) and sound
    sound = decoder_ok(ctx, item.value, values) and sound
    sound = range_order_ok(ctx, item.value, "backoff_initial_s", "backoff_max_s", values) and sound
    zone_names_ok(ctx, item.value)
    sound = objects_in_classes_ok(ctx, item.value, values) and sound
    if not sound or "name" not in values or ("url" not in values and "pipeline" not in values):
        return INVALID
    if "pipeline" in values:  # read as written, by GStreamer; url stays empty
        values.update(url="", decoder="gstreamer")
    return CameraConfig(**values)


#: what a camera reads, when neither or both are given
SOURCE_KEYS_HINT = ("give url: (a camera address, file or folder; decoder: chooses who decodes it) or "
                    "pipeline: (a GStreamer launch string ending in an appsink)")
PIPELINE_EXAMPLE = ('e.g. pipeline: "v4l2src device=/dev/video0 ! videoconvert ! video/x-raw,format=BGR '
                    '! appsink"')


def read_camera_decoder(ctx: Context, item: Item) -> Any:
    from .sources import DECODERS
    return Choice(DECODERS)(ctx, item)


def read_camera_pipeline(ctx: Context, item: Item) -> Any:
    """A launch string ending in an appsink; the credentials of URLs in it are registered first."""
    from .sources import launch_problem, register_launch_secrets
    if isinstance(item.value, str):
        register_launch_secrets(item.value)  # before any check: a message must not quote them
    launch = Text(max_bytes=MAX_URL_BYTES)(ctx, item)
    if launch is INVALID:
        return INVALID
    problem = launch_problem(launch)
    if problem is not None:
        return ctx.bad_value(item, problem, PIPELINE_EXAMPLE)
    return launch


def one_source_ok(ctx: Context, item: Item) -> bool:
    """Exactly one of url: and pipeline:."""
    entries = item.value
    if "url" in entries and "pipeline" in entries:
        ctx.problem(entries["pipeline"], "url: and pipeline: are both given; a camera reads one source",
                    SOURCE_KEYS_HINT)
        return False
    if "url" not in entries and "pipeline" not in entries:
        ctx.problem(item, "required key is missing", SOURCE_KEYS_HINT, path=f"{item.path}.url")
        return False
    return True


def decoder_ok(ctx: Context, entries: dict, values: dict) -> bool:
    """A GStreamer decoder needs PyGObject, and its presets read rtsp:// cameras and video files;
    a pipeline: names its own decoder elements. decoder: pyav needs PyAV (`_pyav_ok`)."""
    if "decoder" not in entries and "pipeline" not in entries:
        return True
    from .sources import GSTREAMER_HINT, Decoder, gi_installed
    if "decoder" in entries and "decoder" not in values:
        return False  # its value was reported
    pipeline = "pipeline" in entries
    decoder = Decoder(values.get("decoder", "gstreamer" if pipeline else "opencv"))
    if pipeline and decoder not in (Decoder.GSTREAMER, Decoder.AUTO):
        ctx.bad_value(entries["decoder"], "a pipeline: camera is decoded by the elements of its launch string",
                      "leave decoder: out (or write decoder: gstreamer) and put the decoder into the pipeline")
        return False
    if decoder is Decoder.PYAV:
        return _pyav_ok(ctx, entries, values)
    if decoder is Decoder.DVPP:
        return _dvpp_ok(ctx, entries, values)
    if not (pipeline or decoder.uses_gstreamer):
        return True
    if not gi_installed():
        what = "pipeline:" if pipeline else f"decoder: {decoder}"
        ctx.problem(entries["pipeline" if pipeline else "decoder"],
                    f"{what} needs GStreamer's Python bindings (PyGObject), which are not installed", GSTREAMER_HINT)
        return False
    url = values.get("url")
    if not pipeline and url is not None and not _preset_reads(url):
        ctx.bad_value(entries["decoder"], f"decoder: {decoder} reads rtsp:// cameras and video files only",
                      "use decoder: opencv (or auto), or give a pipeline: launch string instead of url:")
        return False
    return True


def _pyav_ok(ctx: Context, entries: dict, values: dict) -> bool:
    """decoder: pyav needs PyAV (found, not imported), and reads rtsp:// cameras and video files."""
    from .sources import PYAV_HINT, av_installed
    if not av_installed():
        ctx.problem(entries["decoder"], "decoder: pyav needs PyAV, which is not installed", PYAV_HINT)
        return False
    url = values.get("url")
    if url is not None and not _preset_reads(url):
        ctx.bad_value(entries["decoder"], "decoder: pyav reads rtsp:// cameras and video files only",
                      "use decoder: opencv (or auto) for this source")
        return False
    return True


def _dvpp_ok(ctx: Context, entries: dict, values: dict) -> bool:
    """decoder: dvpp reads rtsp:// cameras and video files (demultiplexed by PyAV, decoded by
    VDEC; a folder is told from a file only when the camera opens); that its group is an Ascend one
    is checked with the accelerators (`modelrefs.check_camera_decoders`)."""
    from .sources import PYAV_HINT, av_installed
    url = values.get("url")
    if url is None:
        return True
    scheme, sep, _ = url.partition("://")
    if not _preset_reads(url):
        ctx.bad_value(entries["decoder"], "decoder: dvpp reads rtsp:// cameras and video files only (JPEG "
                                          "folders and MJPEG cameras are decoded on the host)",
                      "use decoder: opencv (or auto) for this source")
        return False
    if sep and scheme.lower() in ("rtsp", "rtsps") and not av_installed():
        ctx.problem(entries["decoder"], "decoder: dvpp demultiplexes rtsp:// streams with PyAV, which is not "
                                        "installed", PYAV_HINT)
        return False
    return True


def _preset_reads(url: str) -> bool:
    """Whether the GStreamer presets can read `url`: rtsp(s):// or a video file (that a path is a
    folder is only known at run time)."""
    scheme, sep, _ = url.partition("://")
    if sep:
        return scheme.lower() in ("rtsp", "rtsps") or (scheme.lower() == FILE_SCHEME and not is_live_url(url))
    return not url.startswith("/dev/")


def is_live_url(url: str) -> bool:
    """Network streams, synthetic sources and capture devices (also as file:///dev/...) never end;
    files and folders do."""
    scheme, sep, _ = url.partition("://")
    if sep and scheme.lower() in LIVE_SCHEMES:
        return True
    path = urlsplit(url).path if sep else url
    return path.startswith("/dev/")


def live_source_options_ok(ctx: Context, entries: dict, values: dict) -> bool:
    """`realtime: false` and `loop` only make sense for a source that ends."""
    if not is_live_url(values["url"]):
        return True
    ok = True
    if values.get("realtime") is False:
        ctx.bad_value(entries["realtime"], "only for files and folders "
                                           "(a live stream cannot wait for the accelerator)")
        ok = False
    if values.get("loop") is True:
        ctx.bad_value(entries["loop"], "only for files and folders")
        ok = False
    return ok


def check_camera_accelerators(ctx: Context, cameras: Item, accelerators: tuple[AcceleratorConfig, ...]) -> None:
    """Run once the accelerators are valid, so the list of names is complete; works on the Items,
    so a camera with other problems is still checked."""
    names = [a.name for a in accelerators]
    for camera in cameras.value if cameras.is_sequence else ():
        ref = camera.value.get("accelerator") if camera.is_mapping else None
        if ref is not None and isinstance(ref.value, str) and ref.value not in names:
            ctx.bad_value(ref, f"names no accelerator; defined: {', '.join(names)}",
                          did_you_mean(ref.value, names))
