"""The DVPP media engine: its pure arithmetic (no pyACL), then the engine against the fake
`acl.media` in tests/fakes/acl (on the shared test media: skipped without ../shared, an error in CI)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import SHARED
from yoloedge.backends import dvpp_limits as lim
from yoloedge.preprocess.letterbox import compute_geometry


# -- geometry on VPC's grid (no pyACL) --------------------------------------------------------------
def _on_grid(p: lim.VpcPaste, dst_w: int, dst_h: int) -> None:
    assert p.left % 16 == 0 and p.top % 2 == 0
    assert p.new_w % 2 == 0 and p.new_h % 2 == 0
    assert p.src_w % 2 == 0 and p.src_h % 2 == 0
    assert 0 <= p.left and p.left + p.new_w <= dst_w
    assert 0 <= p.top and p.top + p.new_h <= dst_h
    left, right, top, bottom = p.paste
    assert right % 2 == 1 and bottom % 2 == 1 and right - left + 1 == p.new_w and bottom - top + 1 == p.new_h
    c_left, c_right, c_top, c_bottom = p.crop
    assert (c_left, c_top) == (0, 0) and c_right == p.src_w - 1 and c_bottom == p.src_h - 1


@pytest.mark.parametrize("src", [(1280, 720), (810, 1080), (1920, 1080), (640, 480)])
def test_common_sizes_match_ultralytics_exactly(src):
    """Sizes whose Ultralytics letterbox already lies on VPC's grid keep it unchanged."""
    p = lim.vpc_letterbox(*src, 640, 640)
    geo = compute_geometry(*src, 640, 640)
    assert p.geometry() == geo
    _on_grid(p, 640, 640)


def test_odd_offsets_move_onto_the_grid():
    # 1000x562 into 640x640: Ultralytics 640x360 at top 140; 562 -> r 0.64, new_h 359.68 -> 360
    p = lim.vpc_letterbox(1000, 563, 640, 640)
    _on_grid(p, 640, 640)
    # a portrait 500x1000 into 416x416: new 208x416, Ultralytics left 104 -> VPC 96 or 112
    p = lim.vpc_letterbox(500, 1000, 416, 416)
    ultra = compute_geometry(500, 1000, 416, 416)
    assert ultra.left == 104
    assert p.left in (96, 112) and p.new_w == 208 and p.top == 0
    _on_grid(p, 416, 416)


def test_odd_source_is_cropped_to_even_and_the_geometry_says_so():
    p = lim.vpc_letterbox(1281, 721, 640, 640)
    assert (p.src_w, p.src_h) == (1280, 720)
    geo = p.geometry()
    assert geo.src_w == 1280 and geo.scale_x == p.new_w / 1280
    _on_grid(p, 640, 640)


@pytest.mark.parametrize("w,h", [(w, h) for w in (130, 333, 641, 999, 1920, 2592, 3840)
                                 for h in (128, 241, 480, 1079, 1944, 2160)])
def test_every_size_lands_on_the_grid_near_ultralytics(w, h):
    p = lim.vpc_letterbox(w, h, 640, 384)
    _on_grid(p, 640, 384)
    ultra = compute_geometry(w & ~1, h & ~1, 640, 384)
    assert abs(p.new_w - ultra.new_w) <= 1 and abs(p.new_h - ultra.new_h) <= 1
    assert abs(p.left - ultra.left) <= 8 and abs(p.top - ultra.top) <= 1


def test_boxes_map_back_with_the_geometry_vpc_used():
    p = lim.vpc_letterbox(500, 1000, 416, 416)
    geo = p.geometry()
    box = np.array([[p.left, p.top, p.left + p.new_w, p.top + p.new_h]], np.float64)
    back = geo.boxes_to_source(box.copy())
    np.testing.assert_allclose(back, [[0, 0, 500, 1000]])


def test_scale_limits_and_canvas_rules():
    with pytest.raises(ValueError, match="1/32 to 16"):
        lim.vpc_letterbox(8192, 100, 128, 128)  # width / 64
    with pytest.raises(ValueError, match="1/32 to 16"):
        lim.vpc_letterbox(4, 4, 640, 640)  # x 160
    with pytest.raises(ValueError, match="multiple of 16"):
        lim.vpc_letterbox(1280, 720, 650, 640)
    with pytest.raises(ValueError, match="multiple of 16"):
        lim.canvas_size(640, 641)
    assert lim.canvas_size(640, 640) == 640 * 640 * 3 // 2


def test_strides():
    assert lim.vdec_strides(1920, 1080) == (1920, 1080)
    assert lim.vdec_strides(1281, 721) == (1296, 722)
    assert lim.jpegd_strides(810, 1080, "Ascend310P3") == (832, 1088)
    assert lim.jpegd_strides(810, 1080, "Ascend310") == (896, 1088)
    assert lim.jpegd_strides(810, 1080, None) == (896, 1088)
    assert lim.nv12_size(1920, 1080) == 1920 * 1080 * 3 // 2


def test_limits_table():
    assert lim.limits_for("Ascend310P3").vdec_channels == 256
    assert lim.limits_for("Ascend310P1") is lim.DVPP_LIMITS["Ascend310P3"]
    assert lim.limits_for("Ascend910B") is lim.DEFAULT_LIMITS
    assert lim.limits_for(None).budget_note()  # every figure is marked unconfirmed


@pytest.mark.parametrize("args,why", [
    (("h264", "High", "yuv420p", 1920, 1080), None),
    (("h264", "Constrained Baseline", "yuvj420p", 640, 480), None),
    (("hevc", "Main", "yuv420p", 3840, 2160), None),
    (("h265", None, None, None, None), None),
    (("mjpeg", None, "yuvj422p", 1280, 720), "H.264 and H.265 only"),
    (("mpeg4", "Simple Profile", "yuv420p", 640, 480), "H.264 and H.265 only"),
    (("h264", "High 4:2:2", "yuv422p", 1920, 1080), "High 4:2:2"),
    (("h264", "High 10", "yuv420p10le", 1920, 1080), "High 10"),
    (("hevc", "Main 10", "yuv420p10le", 1920, 1080), None),  # the 310P's VDEC takes H.265 10-bit
    (("hevc", "Main 10", "yuv420p10le", 1920, 1080, "Ascend310"), "Main 10"),
    (("hevc", None, "yuv420p10le", 1920, 1080, "Ascend310"), "yuv420p10le"),
    (("h264", None, "yuv420p10le", 1920, 1080), "yuv420p10le"),
    (("h264", "High", "yuv444p", 1920, 1080), "yuv444p"),
    (("h264", "High", "yuv420p", 8192, 4320), "larger than"),
    (("h264", "Main", "yuv420p", 96, 96), "smaller than"),
])
def test_dvpp_unsupported(args, why):
    got = lim.dvpp_unsupported(*args[:5], soc=args[5] if len(args) > 5 else "Ascend310P3")
    if why is None:
        assert got is None
    else:
        assert got is not None and why in got


def test_entype():
    assert lim.vdec_entype("hevc") == lim.H265_MAIN_LEVEL
    assert lim.vdec_entype("h264", "Baseline") == lim.H264_BASELINE_LEVEL
    assert lim.vdec_entype("h264", "Main") == lim.H264_MAIN_LEVEL
    assert lim.vdec_entype("avc1", None) == lim.H264_HIGH_LEVEL
    with pytest.raises(ValueError):
        lim.vdec_entype("vp9")


def test_limits_module_imports_no_acl_and_no_opencv():
    import subprocess
    code = ("import sys; import yoloedge.backends.dvpp_limits as m; "
            "m.vpc_letterbox(1280, 720, 640, 640); "
            "print('acl' in sys.modules, 'cv2' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.split() == ["False", "False"]


# -- the engine against the fake acl.media ------------------------------------------------------------
FAKES = Path(__file__).resolve().parent / "fakes"
MEDIA = SHARED / "media"  # read by the tests that take `fake`, which needs the shared data
CLIP = MEDIA / "street_people_720p.mp4"
JPEG = MEDIA / "bus.jpg"
CANVAS = (640, 640)


def _fake_acl():
    if str(FAKES) not in sys.path:
        sys.path.insert(0, str(FAKES))
    import acl
    if not hasattr(acl, "_fake"):
        pytest.skip("the real pyACL is imported in this process; these tests need the fake")
    return acl


@pytest.fixture
def fake(monkeypatch, shared):
    acl = _fake_acl()
    from acl import _fake
    from yoloedge.backends import acl_runtime
    state = _fake.reset()
    monkeypatch.setattr(acl_runtime, "PROCESS", acl_runtime.AclProcess())
    yield state
    assert not _fake.STATE.refusals, _fake.STATE.refusals
    del acl


@pytest.fixture
def card(fake):
    from yoloedge.backends.dvpp import DvppCard
    card = DvppCard(0)
    card.open()
    yield card
    card.close()


def access_units(path: Path, limit: int) -> list[tuple[bytes, float]]:
    """The first `limit` Annex-B access units of `path` with their pts in seconds."""
    av = pytest.importorskip("av")
    from av.bitstream import BitStreamFilterContext
    out: list[tuple[bytes, float]] = []
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        bsf = BitStreamFilterContext("h264_mp4toannexb", stream)
        for packet in container.demux(stream):
            for unit in bsf.filter(packet):
                out.append((bytes(unit), float(unit.pts * stream.time_base)))
            if len(out) >= limit:
                return out[:limit]
    return out


def host_frames(path: Path, limit: int) -> dict[float, np.ndarray]:
    """PyAV's BGR frames by pts (seconds), decoding enough to cover the first `limit` units."""
    av = pytest.importorskip("av")
    frames: dict[float, np.ndarray] = {}
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        for frame in container.decode(stream):
            frames[round(float(frame.pts * stream.time_base), 6)] = frame.to_ndarray(format="bgr24")
            if len(frames) >= limit + 8:
                break
    return frames


def host_nv12(bgr: np.ndarray, geo, full_range: bool = False) -> np.ndarray:
    """The project's host letterbox of `bgr` with the geometry VPC used, as NV12 bytes: BT.601
    limited range (what video carries), or full range (JFIF: what a JPEG holds and JPEGD gives)."""
    import cv2
    from yoloedge.preprocess.letterbox import PAD_VALUE, resize_into
    w, h = CANVAS
    canvas = np.full((h, w, 3), PAD_VALUE, np.uint8)
    src = bgr[:geo.src_h, :geo.src_w]
    resize_into(np.ascontiguousarray(src), geo, canvas[geo.top:geo.top + geo.new_h, geo.left:geo.left + geo.new_w])
    if full_range:
        ycrcb = cv2.cvtColor(canvas, cv2.COLOR_BGR2YCrCb)
        half = cv2.resize(ycrcb, (w // 2, h // 2), interpolation=cv2.INTER_AREA)
        y, u, v = ycrcb[..., 0].reshape(-1), half[..., 2].reshape(-1), half[..., 1].reshape(-1)
    else:
        i420 = cv2.cvtColor(canvas, cv2.COLOR_BGR2YUV_I420).reshape(-1)
        y, u, v = i420[:w * h], i420[w * h:w * h * 5 // 4], i420[w * h * 5 // 4:]
    uv = np.empty(w * h // 2, np.uint8)
    uv[0::2], uv[1::2] = u, v
    return np.concatenate([y, uv])


def read_canvas(ptr: int) -> np.ndarray:
    import acl
    from yoloedge.backends.acl_runtime import ACL_MEMCPY_DEVICE_TO_HOST, check, checked
    w, h = CANVAS
    size = w * h * 3 // 2
    host = checked(acl.rt.malloc_host(size), "acl.rt.malloc_host")
    try:
        check(acl.rt.memcpy(host, size, ptr, size, ACL_MEMCPY_DEVICE_TO_HOST), "acl.rt.memcpy")
        return np.frombuffer(acl.util.ptr_to_bytes(host, size), np.uint8).copy()
    finally:
        check(acl.rt.free_host(host), "acl.rt.free_host")


class Consumer:
    """What a preparer does with VDEC's pictures: letterbox each into a canvas, read it back,
    release the picture (on its own thread, as the daemon's preparers would)."""

    def __init__(self, card, keep: int = 6):
        import queue
        import threading
        self.card, self.keep = card, keep
        self.queue: queue.Queue = queue.Queue()
        self.canvas = card.alloc_canvas(*CANVAS)
        self.results: list[tuple[float, object, np.ndarray | None]] = []
        self.failures: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def on_picture(self, picture) -> None:
        self.queue.put(picture)

    def _run(self) -> None:
        while True:
            picture = self.queue.get()
            if picture is None:
                return
            try:
                geo = self.card.letterbox(picture, self.canvas, *CANVAS)
                data = read_canvas(self.canvas) if len(self.results) < self.keep else None
                self.results.append((picture.pts, geo, data))
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                self.failures.append(exc)
            finally:
                picture.release()

    def stop(self) -> None:
        self.queue.put(None)
        self.thread.join(30)


def test_h264_clip_decodes_and_letterboxes_like_the_host(card, fake):
    units = access_units(CLIP, 40)
    consumer = Consumer(card)
    errors: list[int] = []
    vdec = card.open_vdec("street", "h264", 1280, 720, ring=4, on_picture=consumer.on_picture,
                          on_error=errors.append, profile="High")
    for data, pts in units:
        assert vdec.send(data, pts)
    assert vdec.flush(timeout_s=30)
    consumer.stop()
    assert not consumer.failures, consumer.failures
    assert vdec.stats.sent == len(units) and vdec.stats.dropped == 0 and not errors
    assert vdec.stats.decoded == len(consumer.results) >= len(units) - 4
    assert vdec.free_pictures == 4 and vdec.in_flight == 0  # every picture came back to the ring
    # pictures come out in display order, each with its own pts (the clip has B-frames: sent
    # order differs), so each matches PyAV's frame of that pts and not its neighbours
    shown = [round(pts, 6) for pts, _geo, _data in consumer.results]
    assert shown == sorted(round(pts, 6) for _data, pts in units)[:len(shown)]
    frames = host_frames(CLIP, len(units))
    compared = 0
    for pts, geo, data in consumer.results:
        assert (geo.new_w, geo.new_h, geo.left, geo.top) == (640, 360, 0, 140)
        if data is None:
            continue
        expected = host_nv12(frames[round(pts, 6)], geo)
        diff = np.abs(data.astype(np.int16) - expected.astype(np.int16))
        assert diff.mean() < 1.0, (pts, diff.mean())  # a neighbouring frame differs by 1.4 or more
        w, h = CANVAS
        y = data[:w * h].reshape(h, w)
        assert (y[:geo.top] == 114).all() and (y[geo.top + geo.new_h:] == 114).all()
        assert (data[w * h:w * h + w * geo.top // 2] == 128).all()
        compared += 1
    assert compared == consumer.keep


def test_two_cameras_on_one_card_get_their_own_channels(card, fake):
    units = access_units(CLIP, 12)
    a, b = Consumer(card, keep=0), Consumer(card, keep=0)
    va = card.open_vdec("a", "h264", 1280, 720, ring=8, on_picture=a.on_picture)
    vb = card.open_vdec("b", "h264", 1280, 720, ring=8, on_picture=b.on_picture)
    assert (va.channel_id, vb.channel_id) == (0, 1)
    for data, pts in units:
        assert va.send(data, pts) and vb.send(data, pts)
    assert va.flush(30) and vb.flush(30)
    a.stop()
    b.stop()
    assert len(a.results) == len(b.results) == va.stats.decoded == vb.stats.decoded > 0
    va.close()
    va.close()  # idempotent
    vc = card.open_vdec("c", "h264", 1280, 720, ring=2, on_picture=lambda p: p.release())
    assert vc.channel_id == 0  # a closed camera's channel id is free again


def test_jpeg_decodes_and_letterboxes_like_the_host(card, fake):
    import cv2
    data = JPEG.read_bytes()
    slot = card.jpeg_slot("snap")
    picture = card.decode_jpeg(data, slot)
    assert (picture.width, picture.height) == (810, 1080)
    assert picture.width_stride % 16 == 0 and picture.width_stride >= 810
    canvas = card.alloc_canvas(*CANVAS)
    geo = card.letterbox(picture, canvas, *CANVAS)
    assert (geo.new_w, geo.new_h, geo.left, geo.top) == (480, 640, 80, 0)
    got = read_canvas(canvas)
    expected = host_nv12(cv2.imread(str(JPEG)), geo, full_range=True)  # JPEGD keeps the JPEG's range
    assert np.abs(got.astype(np.int16) - expected.astype(np.int16)).mean() < 3.0
    grown = slot.grown
    card.decode_jpeg(data, slot)  # the same size again: no reallocation
    assert slot.grown == grown


def test_close_releases_everything_and_is_idempotent(fake):
    from acl import _fake
    from yoloedge.backends import acl_runtime
    from yoloedge.backends.dvpp import CardState, DvppCard
    card = DvppCard(0)
    card.open()
    assert card.context and card.report_thread_id and card.soc == "Ascend310P3"
    vdec = card.open_vdec("cam", "h264", 1280, 720, ring=2, on_picture=lambda p: p.release())
    for data, pts in access_units(CLIP, 3):
        vdec.send(data, pts)
    card.decode_jpeg(JPEG.read_bytes(), card.jpeg_slot())
    card.alloc_canvas(*CANVAS)
    card.close()
    card.close()
    assert card.state is CardState.CLOSED
    assert not any(_fake.leaks().values()), _fake.leaks()
    assert not acl_runtime.PROCESS.initialised  # the last user finalised pyACL


def test_a_full_ring_drops_and_counts_instead_of_blocking_the_reader(card, fake):
    held: list = []
    vdec = card.open_vdec("slow", "h264", 1280, 720, ring=1, on_picture=held.append, wait_s=0.05)
    units = access_units(CLIP, 3)
    assert vdec.send(*units[0])
    assert not vdec.send(*units[1])  # the only slot is still in flight or its picture held
    assert vdec.stats.dropped == 1 and vdec.stats.sent == 1
    vdec.close()
    with pytest.raises(Exception, match="closed"):
        vdec.send(*units[2])


def test_a_failed_open_releases_what_it_took(fake):
    from acl import _fake
    from yoloedge.backends import acl_runtime
    from yoloedge.backends.acl_runtime import AclError
    from yoloedge.backends.dvpp import CardState, DvppCard
    _fake.fail("acl.rt.set_device", 507899, times=1)
    card = DvppCard(0)
    with pytest.raises(AclError, match="set_device"):
        card.open()
    assert card.state is CardState.CLOSED
    card.close()
    assert not any(_fake.leaks().values()) and not acl_runtime.PROCESS.initialised
    assert [r[0] for r in _fake.STATE.refusals] == ["acl.rt.set_device"]  # only the injected fault
    _fake.STATE.refusals.clear()


def test_a_reconnect_reuses_the_channel_and_its_memory(card, fake):
    from acl import _fake
    units = access_units(CLIP, 10)
    consumer = Consumer(card, keep=0)
    vdec = card.open_vdec("cam", "h264", 1280, 720, ring=8, on_picture=consumer.on_picture)
    for data, pts in units:
        assert vdec.send(data, pts)
    assert vdec.flush(30)
    first = vdec.stats.decoded
    mallocs = _fake.STATE.counts["acl.media.dvpp_malloc"]
    for data, pts in units:  # the camera came back: the same stream from its start
        assert vdec.send(data, pts)
    assert vdec.flush(30)
    consumer.stop()
    assert vdec.stats.decoded == 2 * first > 0 and not consumer.failures
    assert _fake.STATE.counts["acl.media.dvpp_malloc"] == mallocs  # nothing allocated per frame
    assert vdec.stats.grown == 0


def test_an_access_unit_bigger_than_its_buffer_grows_it_once(card, fake):
    from acl import _fake
    units = access_units(CLIP, 4)
    consumer = Consumer(card, keep=0)
    vdec = card.open_vdec("cam", "h264", 1280, 720, ring=8, on_picture=consumer.on_picture)
    for data, pts in units:
        assert vdec.send(data, pts)
    assert vdec.flush(30)
    assert vdec.stats.grown == 0 and vdec.stats.decoded == len(units)
    mallocs = _fake.STATE.counts["acl.media.dvpp_malloc"]
    big = units[0][0] + bytes(400_000)  # the IDR with trailing_zero_8bits: legal Annex-B padding
    for _ in range(3):  # each time into the slot freed last: it grows the first time only
        assert vdec.send(big, units[0][1]) and vdec.flush(30)
    consumer.stop()
    assert vdec.stats.grown == 1 and vdec.stats.decoded == len(units) + 3 and not consumer.failures
    assert _fake.STATE.counts["acl.media.dvpp_malloc"] == mallocs + 1


def test_a_failed_vdec_open_releases_its_part_only(card, fake):
    from acl import _fake
    before = _fake.leaks()
    _fake.fail("acl.media.dvpp_malloc", 207001, times=1)
    with pytest.raises(Exception, match="dvpp_malloc"):
        card.open_vdec("cam", "h264", 1280, 720, ring=4, on_picture=lambda p: p.release())
    assert _fake.leaks() == before
    assert [r[0] for r in _fake.STATE.refusals] == ["acl.media.dvpp_malloc"]
    _fake.STATE.refusals.clear()
    vdec = card.open_vdec("cam", "h264", 1280, 720, ring=4, on_picture=lambda p: p.release())
    assert vdec.channel_id == 0


def test_preparer_threads_letterbox_in_parallel_on_their_own_lanes(card, fake):
    import threading
    picture = card.decode_jpeg(JPEG.read_bytes(), card.jpeg_slot())
    canvases = [card.alloc_canvas(*CANVAS) for _ in range(3)]
    results: dict[int, object] = {}

    def prepare(i: int) -> None:
        for _ in range(3):
            results[i] = card.letterbox(picture, canvases[i], *CANVAS)

    threads = [threading.Thread(target=prepare, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(set(results.values())) == 1 and len(results) == 3
    images = [read_canvas(c) for c in canvases]
    assert all((img == images[0]).all() for img in images)
    assert 2 <= len(card._lanes) <= 4  # this thread's and the preparers' (a finished one's id may recur)


def test_a_frame_that_decodes_to_nothing_is_an_error_and_its_picture_goes_back(card, fake):
    from acl import _fake
    units = access_units(CLIP, 3)
    pictures: list = []
    errors: list[int] = []
    vdec = card.open_vdec("cam", "h264", 1280, 720, ring=4, on_picture=pictures.append, on_error=errors.append)
    assert vdec.send(*units[2])  # a B-frame with nothing to reference: no picture by EOS
    assert vdec.flush(30)
    assert errors and vdec.stats.errors == len(errors) and not pictures
    assert vdec.free_pictures == 4 and vdec.in_flight == 0
    # the fake records the stream's own decode error with the misuse; it is the stream's, not ours
    assert [r[0] for r in _fake.STATE.refusals] == ["acl.media.vdec (decoder)"]
    _fake.STATE.refusals.clear()
