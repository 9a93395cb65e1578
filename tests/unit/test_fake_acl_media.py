"""The fake pyACL's DVPP (`acl.media`): real pictures out of VDEC, JPEGD and VPC, and the refusals
and leak accounting that make a daemon test of the `decoder: dvpp` path mean something."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import SHARED, skip_unless_required

FAKES = Path(__file__).resolve().parents[1] / "fakes"
if str(FAKES) not in sys.path:
    sys.path.insert(0, str(FAKES))

import acl  # noqa: E402  (the fake: tests/fakes is first on sys.path)
from acl import _fake  # noqa: E402

av = pytest.importorskip("av")
cv2 = pytest.importorskip("cv2")

MEDIA = SHARED / "media"
NV12 = 1
H2D, D2H = 1, 2
INVALID_PARAM, RT_PARAM_INVALID, FAILURE = 100000, 107000, 500001


def _need(name: str) -> Path:
    """A shared test file: skipped in a clone without ../shared, a failure where CI requires it."""
    path = MEDIA / name
    if not path.is_file():
        skip_unless_required(f"no test media {name} in ../shared/testdata/media", "YOLOEDGE_REQUIRE_SHARED")
    return path


@pytest.fixture
def card():
    """A fresh fake process with device 0, a context and a stream."""
    _fake.reset()
    assert acl.init() == 0
    assert acl.rt.set_device(0) == 0
    ctx, ret = acl.rt.create_context(0)
    assert ret == 0
    stream, ret = acl.rt.create_stream()
    assert ret == 0
    return ctx, stream


def _teardown(ctx, stream):
    assert acl.rt.destroy_stream(stream) == 0
    assert acl.rt.destroy_context(ctx) == 0
    assert acl.rt.reset_device(0) == 0
    assert acl.finalize() == 0


def _to_dvpp(data: bytes) -> int:
    ptr, ret = acl.media.dvpp_malloc(len(data))
    assert ret == 0
    host = acl.util.bytes_to_ptr(data)
    assert acl.rt.memcpy(ptr, len(data), host, len(data), H2D) == 0
    return ptr


def _read(ptr: int, size: int) -> np.ndarray:
    return np.frombuffer(acl.util.ptr_to_bytes(ptr, size), np.uint8)


def _pic(ptr, size, width, height, ws, hs, fmt=NV12):
    desc = acl.media.dvpp_create_pic_desc()
    for setter, value in (("data", ptr), ("size", size), ("format", fmt), ("width", width), ("height", height),
                          ("width_stride", ws), ("height_stride", hs)):
        assert getattr(acl.media, f"dvpp_set_pic_desc_{setter}")(desc, value) == 0
    return desc


class ReportLoop:
    """The report thread a VDEC user starts: set the context, loop on process_report until told."""

    def __init__(self, ctx):
        self.running = True
        self.codes: list[int] = []
        self.tid, ret = acl.util.start_thread(self._loop, [ctx])
        assert ret == 0

    def _loop(self, args):
        acl.rt.set_context(args[0])
        while self.running:
            code = acl.rt.process_report(20)
            self.codes.append(code)
            if code == 107012:  # nothing subscribed yet
                time.sleep(0.005)

    def stop(self):
        self.running = False
        assert acl.util.stop_thread(self.tid) == 0


def _annexb_units(path: Path, count: int) -> list[bytes]:
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        bsf = av.bitstream.BitStreamFilterContext("h264_mp4toannexb", stream)
        units: list[bytes] = []
        for packet in container.demux(stream):
            units.extend(bytes(p) for p in bsf.filter(packet))
            if len(units) >= count:
                break
    return units[:count]


def _vdec_channel(thread_id, callback, channel_id=0):
    desc = acl.media.vdec_create_channel_desc()
    assert acl.media.vdec_set_channel_desc_channel_id(desc, channel_id) == 0
    assert acl.media.vdec_set_channel_desc_thread_id(desc, thread_id) == 0
    assert acl.media.vdec_set_channel_desc_callback(desc, callback) == 0
    assert acl.media.vdec_set_channel_desc_entype(desc, 3) == 0  # H264 high
    assert acl.media.vdec_set_channel_desc_out_pic_format(desc, NV12) == 0
    return desc


def test_vdec_decodes_h264_like_ffmpeg_on_the_report_thread(card):
    ctx, stream = card
    units = _annexb_units(_need("street_people_720p.mp4"), 24)
    width, height = 1280, 720
    ws, hs = 1280, 720
    out_size = ws * hs * 3 // 2
    got: dict[int, np.ndarray] = {}
    threads: set[int] = set()
    eos_seen = threading.Event()

    def callback(input_desc, output_desc, user_data):
        threads.add(threading.get_ident())
        assert acl.media.dvpp_destroy_stream_desc(input_desc) == 0
        if user_data == "eos":
            assert output_desc == 0
            eos_seen.set()
            return
        assert acl.media.dvpp_get_pic_desc_ret_code(output_desc) == 0
        data = acl.media.dvpp_get_pic_desc_data(output_desc)
        size = acl.media.dvpp_get_pic_desc_size(output_desc)
        assert (acl.media.dvpp_get_pic_desc_width(output_desc), acl.media.dvpp_get_pic_desc_height(output_desc)) == (
            width, height)
        got[user_data] = _read(data, size).copy()
        assert acl.media.dvpp_destroy_pic_desc(output_desc) == 0
        assert acl.media.dvpp_free(data) == 0

    loop = ReportLoop(ctx)
    desc = _vdec_channel(loop.tid, callback)
    assert acl.media.vdec_create_channel(desc) == 0
    config = acl.media.vdec_create_frame_config()
    biggest = max(len(u) for u in units)
    in_buf, ret = acl.media.dvpp_malloc(biggest)
    assert ret == 0
    for i, unit in enumerate(units):
        host = acl.util.bytes_to_ptr(unit)
        assert acl.rt.memcpy(in_buf, biggest, host, len(unit), H2D) == 0
        sd = acl.media.dvpp_create_stream_desc()
        assert acl.media.dvpp_set_stream_desc_data(sd, in_buf) == 0
        assert acl.media.dvpp_set_stream_desc_size(sd, len(unit)) == 0
        out, ret = acl.media.dvpp_malloc(out_size)
        assert ret == 0
        pd = acl.media.dvpp_create_pic_desc()
        acl.media.dvpp_set_pic_desc_data(pd, out)
        acl.media.dvpp_set_pic_desc_size(pd, out_size)
        acl.media.dvpp_set_pic_desc_format(pd, NV12)
        assert acl.media.vdec_send_frame(desc, sd, pd, config, i) == 0
    eos = acl.media.dvpp_create_stream_desc()
    assert acl.media.dvpp_set_stream_desc_eos(eos, 1) == 0
    assert acl.media.vdec_send_frame(desc, eos, 0, config, "eos") == 0
    assert eos_seen.wait(20)
    assert acl.media.vdec_destroy_channel(desc) == 0
    assert acl.media.vdec_destroy_channel_desc(desc) == 0
    assert acl.media.vdec_destroy_frame_config(config) == 0
    assert acl.media.dvpp_free(in_buf) == 0
    loop.stop()

    assert threads == {loop.tid}  # callbacks only on the report thread
    assert sorted(got) == list(range(len(units)))
    reference = av.CodecContext.create("h264", "r")
    frames = []
    for unit in [*units, None]:
        for packet in (reference.parse(unit) if unit is not None else [*reference.parse(None), None]):
            frames.extend(reference.decode(packet))
    assert len(frames) == len(units)
    for i, frame in enumerate(frames):  # display order, one per output description in send order
        nv12 = got[i].reshape(hs * 3 // 2, ws)
        assert np.array_equal(nv12, frame.reformat(format="nv12").to_ndarray())
        bgr = cv2.cvtColor(nv12, cv2.COLOR_YUV2BGR_NV12)
        diff = np.abs(bgr.astype(np.int16) - frame.to_ndarray(format="bgr24").astype(np.int16)).mean()
        assert diff < 2.0
    media = _fake.report()["media"]["devices"]["0"]
    assert media["vdec_frames"] == len(units)
    assert media["vdec_callbacks"] == len(units) + 1
    assert media["vdec_channels_created"] == media["vdec_channels_destroyed"] == 1
    assert "dvpp_live_allocations" not in media
    _teardown(ctx, stream)
    assert not any(_fake.leaks().values())


def test_vdec_destroy_without_a_running_report_thread_is_refused_not_hung(card):
    ctx, stream = card
    units = _annexb_units(_need("street_people_720p.mp4"), 3)
    _fake.STATE.media.wait_bound_s = 0.3
    loop = ReportLoop(ctx)
    desc = _vdec_channel(loop.tid, lambda *a: None)
    assert acl.media.vdec_create_channel(desc) == 0
    loop.stop()  # the report thread is gone before the channel
    config = acl.media.vdec_create_frame_config()
    buf = _to_dvpp(units[0])
    sd = acl.media.dvpp_create_stream_desc()
    acl.media.dvpp_set_stream_desc_data(sd, buf)
    acl.media.dvpp_set_stream_desc_size(sd, len(units[0]))
    out, _ = acl.media.dvpp_malloc(1280 * 720 * 3 // 2)
    pd = _pic(out, 1280 * 720 * 3 // 2, 0, 0, 0, 0)
    assert acl.media.vdec_send_frame(desc, sd, pd, config, None) == 0
    assert acl.media.dvpp_destroy_pic_desc(pd) == INVALID_PARAM  # VDEC owns it until the callback
    assert acl.media.dvpp_free(out) == INVALID_PARAM
    assert acl.media.vdec_destroy_channel(desc) == FAILURE
    assert any("report thread is not running" in r[2] for r in _fake.STATE.refusals)
    # the undelivered callbacks are dropped: the descriptions and buffers are the caller's again
    for cleanup in (lambda: acl.media.dvpp_destroy_pic_desc(pd), lambda: acl.media.dvpp_free(out),
                    lambda: acl.media.dvpp_destroy_stream_desc(sd), lambda: acl.media.dvpp_free(buf),
                    lambda: acl.media.vdec_destroy_channel_desc(desc),
                    lambda: acl.media.vdec_destroy_frame_config(config)):
        assert cleanup() == 0
    _teardown(ctx, stream)


def test_vdec_takes_any_running_thread_as_report_thread(card):
    """A pthread id is all VDEC is given: a plain Python thread that loops on process_report works."""
    ctx, stream = card
    units = _annexb_units(_need("street_people_720p.mp4"), 2)
    done = threading.Event()
    running = threading.Event()
    running.set()
    calls = []

    def loop():
        acl.rt.set_context(ctx)
        while running.is_set():
            if acl.rt.process_report(20) == 107012:
                time.sleep(0.005)

    worker = threading.Thread(target=loop)
    worker.start()

    def callback(input_desc, output_desc, user_data):
        calls.append((threading.get_ident(), user_data))
        if user_data == "eos":
            done.set()

    desc = _vdec_channel(worker.ident, callback)
    assert acl.media.vdec_create_channel(desc) == 0
    config = acl.media.vdec_create_frame_config()
    bufs, descs = [], []
    for i, unit in enumerate(units):
        buf = _to_dvpp(unit)
        sd = acl.media.dvpp_create_stream_desc()
        acl.media.dvpp_set_stream_desc_data(sd, buf)
        acl.media.dvpp_set_stream_desc_size(sd, len(unit))
        out, _ = acl.media.dvpp_malloc(1280 * 720 * 3 // 2)
        pd = _pic(out, 1280 * 720 * 3 // 2, 0, 0, 0, 0)
        assert acl.media.vdec_send_frame(desc, sd, pd, config, i) == 0
        assert acl.media.dvpp_destroy_stream_desc(sd) == INVALID_PARAM  # VDEC's until the callback
        bufs += [buf, out]
        descs.append((sd, pd))
    eos = acl.media.dvpp_create_stream_desc()
    acl.media.dvpp_set_stream_desc_eos(eos, 1)
    assert acl.media.vdec_send_frame(desc, eos, 0, config, "eos") == 0
    assert done.wait(20)
    assert acl.media.vdec_destroy_channel(desc) == 0
    running.clear()
    worker.join()
    assert calls == [(worker.ident, 0), (worker.ident, 1), (worker.ident, "eos")]
    for sd, pd in descs:
        assert acl.media.dvpp_destroy_stream_desc(sd) == 0 and acl.media.dvpp_destroy_pic_desc(pd) == 0
    for buf in bufs:
        assert acl.media.dvpp_free(buf) == 0
    for cleanup in (lambda: acl.media.dvpp_destroy_stream_desc(eos), lambda: acl.media.vdec_destroy_channel_desc(desc),
                    lambda: acl.media.vdec_destroy_frame_config(config)):
        assert cleanup() == 0
    _teardown(ctx, stream)


def test_vdec_channel_rules(card):
    ctx, stream = card
    desc = acl.media.vdec_create_channel_desc()
    with pytest.raises(RuntimeError):
        acl.media.vdec_send_frame(desc, 0, 0, 0, None)  # pyACL: no callback set
    assert acl.media.vdec_set_channel_desc_callback(desc, lambda *a: None) == 0
    assert acl.media.vdec_create_channel(desc) == 107012  # thread id 0 is no running thread
    assert acl.media.vdec_set_channel_desc_entype(desc, 7) == INVALID_PARAM
    _fake.STATE.media.vdec_cap = 1
    loop = ReportLoop(ctx)
    assert acl.media.vdec_set_channel_desc_thread_id(desc, loop.tid) == 0
    assert acl.media.vdec_set_channel_desc_channel_id(desc, 300) == 0
    assert acl.media.vdec_create_channel(desc) == INVALID_PARAM  # id outside 0..255
    assert acl.media.vdec_set_channel_desc_channel_id(desc, 5) == 0
    assert acl.media.vdec_create_channel(desc) == 0
    assert acl.media.vdec_set_channel_desc_out_mode(desc, 1) == INVALID_PARAM  # after create
    other = _vdec_channel(loop.tid, lambda *a: None, channel_id=6)
    assert acl.media.vdec_create_channel(other) == INVALID_PARAM  # the card's cap
    assert acl.media.vdec_destroy_channel_desc(desc) == INVALID_PARAM  # channel still created
    assert acl.finalize() == FAILURE
    assert _fake.STATE.finalize_refused[-1]["vdec_channels"] == 1
    assert acl.media.vdec_destroy_channel(desc) == 0
    assert acl.media.vdec_destroy_channel_desc(desc) == 0
    assert acl.media.vdec_destroy_channel_desc(other) == 0
    loop.stop()
    _teardown(ctx, stream)


def _full_range_bgr(nv12: np.ndarray, width: int, height: int) -> np.ndarray:
    y = nv12[:height, :width].astype(np.float32)
    hs = nv12.shape[0] * 2 // 3
    uv = nv12[hs:hs + height // 2, :width].reshape(height // 2, width // 2, 2).astype(np.float32) - 128
    u = np.repeat(np.repeat(uv[..., 0], 2, 0), 2, 1)
    v = np.repeat(np.repeat(uv[..., 1], 2, 0), 2, 1)
    bgr = np.stack((y + 1.772 * u, y - 0.344136 * u - 0.714136 * v, y + 1.402 * v), axis=-1)
    return np.clip(np.rint(bgr), 0, 255).astype(np.uint8)


def test_jpegd_decodes_a_photo_like_opencv(card):
    ctx, stream = card
    jpeg = _need("bus.jpg").read_bytes()
    host = acl.util.bytes_to_ptr(jpeg)
    assert acl.media.dvpp_jpeg_get_image_info(host, len(jpeg)) == (810, 1080, 3, 0)
    size, ret = acl.media.dvpp_jpeg_predict_dec_size(host, len(jpeg), NV12)
    ws, hs = 832, 1088  # 310P3: width stride 64-aligned, height stride 16-aligned
    assert (size, ret) == (ws * hs * 3 // 2, 0)
    channel = acl.media.dvpp_create_channel_desc()
    assert acl.media.dvpp_create_channel(channel) == 0
    out, _ = acl.media.dvpp_malloc(size)
    pd = _pic(out, size, 810, 1080, ws, hs)
    assert acl.media.dvpp_jpeg_decode_async(channel, host, len(jpeg), pd, stream) == INVALID_PARAM  # host memory
    data = _to_dvpp(jpeg)
    bad = _pic(out, size, 810, 1080, 816, hs)  # 16-aligned is not enough for JPEGD on the 310P
    assert acl.media.dvpp_jpeg_decode_async(channel, data, len(jpeg), bad, stream) == INVALID_PARAM
    small = _pic(out, size - 1, 810, 1080, ws, hs)
    assert acl.media.dvpp_jpeg_decode_async(channel, data, len(jpeg), small, stream) == INVALID_PARAM
    assert acl.media.dvpp_jpeg_decode_async(channel, data, len(jpeg), pd, stream) == 0
    assert _read(out, 16).max() == 0  # nothing before synchronize_stream
    assert acl.rt.synchronize_stream(stream) == 0
    nv12 = _read(out, size).reshape(hs * 3 // 2, ws)
    expected = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
    diff = np.abs(_full_range_bgr(nv12, 810, 1080).astype(np.int16) - expected.astype(np.int16)).mean()
    assert diff < 3.0
    assert _fake.report()["media"]["devices"]["0"]["jpegd"] == 1
    for d in (pd, bad, small):
        assert acl.media.dvpp_destroy_pic_desc(d) == 0
    assert acl.media.dvpp_destroy_pic_desc(pd) == INVALID_PARAM  # twice
    assert acl.media.dvpp_destroy_channel(channel) == 0
    assert acl.media.dvpp_destroy_channel_desc(channel) == 0
    assert acl.finalize() == FAILURE  # dvpp memory still held
    assert _fake.STATE.finalize_refused[-1] == {"dvpp_memory": 2, "streams": 1, "contexts": 1, "devices_set": 1}
    assert acl.rt.free(out) == RT_PARAM_INVALID  # dvpp memory is not acl.rt.malloc memory
    assert acl.media.dvpp_free(out) == 0
    assert acl.media.dvpp_free(data) == 0
    assert acl.media.dvpp_free(data) == RT_PARAM_INVALID
    _teardown(ctx, stream)


def _nv12_of(bgr: np.ndarray) -> np.ndarray:
    h, w = bgr.shape[:2]
    i420 = cv2.cvtColor(bgr, cv2.COLOR_BGR2YUV_I420)
    u = i420[h:h + h // 4].reshape(h // 2, w // 2)
    v = i420[h + h // 4:].reshape(h // 2, w // 2)
    return np.concatenate((i420[:h], np.stack((u, v), -1).reshape(h // 2, w)))


def test_vpc_crop_and_paste_letterboxes_and_leaves_the_rest(card):
    ctx, stream = card
    photo = cv2.imread(str(_need("zidane.jpg")))
    src_nv12 = _nv12_of(photo)  # 1280x720
    src = _to_dvpp(src_nv12.tobytes())
    in_pd = _pic(src, src_nv12.size, 1280, 720, 1280, 720)
    out_size = 640 * 640 * 3 // 2
    dst, _ = acl.media.dvpp_malloc(out_size)
    assert acl.rt.memset(dst, out_size, 114, out_size) == 0
    out_pd = _pic(dst, out_size, 640, 640, 640, 640)
    channel = acl.media.dvpp_create_channel_desc()
    assert acl.media.dvpp_create_channel(channel) == 0
    crop = acl.media.dvpp_create_roi_config(0, 1279, 0, 719)
    paste = acl.media.dvpp_create_roi_config(0, 639, 140, 499)
    assert acl.media.dvpp_vpc_crop_and_paste_async(channel, in_pd, out_pd, crop, paste, stream) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    out = _read(dst, out_size).reshape(960, 640)
    assert (out[:140] == 114).all() and (out[500:640] == 114).all()  # Y outside the paste area untouched
    assert (out[640:640 + 70] == 114).all() and (out[640 + 250:] == 114).all()  # UV likewise
    want_y = cv2.resize(src_nv12[:720], (640, 360), interpolation=cv2.INTER_LINEAR)
    assert np.abs(out[140:500].astype(int) - want_y).max() <= 1

    for roi, why in (((8, 647, 140, 499), "paste left edge not 16-aligned"), ((0, 638, 140, 499), "even right"),
                     ((0, 639, 141, 500), "odd top"), ((0, 639, 140, 641), "outside the output")):
        assert acl.media.dvpp_set_roi_config(paste, *roi) == 0
        code = acl.media.dvpp_vpc_crop_and_paste_async(channel, in_pd, out_pd, crop, paste, stream)
        assert code == INVALID_PARAM, why
    assert acl.media.dvpp_set_roi_config(paste, 0, 639, 0, 639) == 0
    assert acl.media.dvpp_set_roi_config(crop, 0, 15, 0, 15) == 0  # 16 -> 640 is a scale of 40
    assert acl.media.dvpp_vpc_crop_and_paste_async(channel, in_pd, out_pd, crop, paste, stream) == INVALID_PARAM
    assert acl.media.dvpp_set_roi_config(crop, 0, 1279, 0, 719) == 0
    assert acl.media.dvpp_set_pic_desc_width_stride(out_pd, 648) == 0  # not a multiple of 16
    assert acl.media.dvpp_vpc_crop_and_paste_async(channel, in_pd, out_pd, crop, paste, stream) == INVALID_PARAM
    host = acl.util.bytes_to_ptr(src_nv12.tobytes())
    assert acl.media.dvpp_set_pic_desc_data(in_pd, host) == 0  # host memory as VPC input
    assert acl.media.dvpp_set_pic_desc_width_stride(out_pd, 640) == 0
    assert acl.media.dvpp_vpc_crop_and_paste_async(channel, in_pd, out_pd, crop, paste, stream) == INVALID_PARAM
    assert acl.media.dvpp_destroy_roi_config(paste) == 0
    assert acl.media.dvpp_destroy_roi_config(paste) == INVALID_PARAM
    assert _fake.report()["media"]["devices"]["0"]["vpc"] == 1
    assert _fake.leaks()["roi_configs"] == 1
    for cleanup in (lambda: acl.media.dvpp_destroy_roi_config(crop), lambda: acl.media.dvpp_destroy_pic_desc(in_pd),
                    lambda: acl.media.dvpp_destroy_pic_desc(out_pd), lambda: acl.media.dvpp_destroy_channel(channel),
                    lambda: acl.media.dvpp_destroy_channel_desc(channel), lambda: acl.media.dvpp_free(src),
                    lambda: acl.media.dvpp_free(dst)):
        assert cleanup() == 0
    _teardown(ctx, stream)


def test_dvpp_memory_counts_and_types(card):
    ctx, stream = card
    ptr, ret = acl.media.dvpp_malloc(1000)
    assert ret == 0 and ptr % 128 == 0
    assert _fake.STATE.allocated("dvpp", 0) == 1000 and _fake.STATE.allocated("device", 0) == 0
    assert acl.media.dvpp_malloc(0)[1] == RT_PARAM_INVALID
    with pytest.raises(TypeError):
        acl.media.dvpp_malloc(np.int64(10))
    dev, _ = acl.rt.malloc(64, 0)
    assert acl.media.dvpp_free(dev) == RT_PARAM_INVALID
    assert acl.rt.memcpy(dev, 64, ptr, 64, 3) == 0  # dvpp memory is device memory to the copy engine
    assert acl.media.dvpp_free(ptr) == 0 and acl.rt.free(dev) == 0
    assert acl.media.dvpp_get_pic_desc_width(12345) == 0  # unknown handle: the getter's 0
    assert acl.media.dvpp_destroy_stream_desc(12345) == INVALID_PARAM
    assert acl.util.stop_thread(99) == 3
    _teardown(ctx, stream)


def _identity_onnx(path: Path, h: int, w: int) -> Path:
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Identity", ["images"], ["out"])], "identity",
                              [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, h, w])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 3, h, w])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _om(tmp_path: Path, onnx_path: Path, aipp, name: str) -> str:
    om = tmp_path / name
    om.write_bytes(b"fake om")
    (tmp_path / f"{name}.fake.json").write_text(json.dumps({"onnx": str(onnx_path), "batch": 1, "aipp": aipp}))
    return str(om)


def test_yuv420sp_aipp_model_takes_nv12_from_dvpp_and_sees_atc_rgb(card, tmp_path):
    ctx, stream = card
    h, w = 16, 32
    onnx_path = _identity_onnx(tmp_path / "id.onnx", h, w)
    yuv_model, ret = acl.mdl.load_from_file(_om(tmp_path, onnx_path, "yuv420sp", "yuv.om"))
    assert ret == 0
    rgb_model, _ = acl.mdl.load_from_file(_om(tmp_path, onnx_path, True, "rgb.om"))
    plain_model, _ = acl.mdl.load_from_file(_om(tmp_path, onnx_path, False, "plain.om"))
    desc = acl.mdl.create_desc()
    assert acl.mdl.get_desc(desc, yuv_model) == 0
    assert acl.mdl.get_input_size_by_index(desc, 0) == h * w * 3 // 2
    dims, ret = acl.mdl.get_input_dims(desc, 0)
    assert ret == 0 and dims["dims"] == [1, h, w, 3]
    info, ret = acl.mdl.get_first_aipp_info(yuv_model, 0)
    assert ret == 0 and info["inputFormat"] == 1 and info["cscSwitch"] == 1 and info["matrixR1C1"] == -100
    assert "matrixR0C2" not in info  # pyACL's wrapper does not hand it out
    info, ret = acl.mdl.get_first_aipp_info(rgb_model, 0)
    assert ret == 0 and info["inputFormat"] == 3 and info["cscSwitch"] == 0
    assert acl.mdl.get_first_aipp_info(plain_model, 0) == (None, 145015)

    rng = np.random.default_rng(7)
    bgr = rng.integers(0, 256, (h, w, 3), np.uint8)
    bgr = cv2.GaussianBlur(bgr, (5, 5), 0)
    nv12 = _nv12_of(bgr)
    src = _to_dvpp(nv12.tobytes())  # the model reads DVPP memory directly
    out, _ = acl.rt.malloc(3 * h * w * 4, 0)
    ins, outs = acl.mdl.create_dataset(), acl.mdl.create_dataset()
    in_buf, out_buf = acl.create_data_buffer(src, nv12.size), acl.create_data_buffer(out, 3 * h * w * 4)
    acl.mdl.add_dataset_buffer(ins, in_buf)
    acl.mdl.add_dataset_buffer(outs, out_buf)
    assert acl.mdl.execute(yuv_model, ins, outs) == 0
    got = (_read(out, 3 * h * w * 4).view(np.float32).reshape(3, h, w).transpose(1, 2, 0) * 255).round()
    expected = cv2.cvtColor(nv12, cv2.COLOR_YUV2RGB_NV12).astype(np.float32)
    assert np.abs(got - expected).max() <= 2  # ATC's integer CSC vs OpenCV's, both BT.601 limited
    for cleanup in (lambda: acl.destroy_data_buffer(in_buf), lambda: acl.destroy_data_buffer(out_buf),
                    lambda: acl.mdl.destroy_dataset(ins), lambda: acl.mdl.destroy_dataset(outs),
                    lambda: acl.mdl.destroy_desc(desc), lambda: acl.mdl.unload(yuv_model),
                    lambda: acl.mdl.unload(rgb_model), lambda: acl.mdl.unload(plain_model),
                    lambda: acl.media.dvpp_free(src), lambda: acl.rt.free(out)):
        assert cleanup() == 0
    _teardown(ctx, stream)


def test_vdec_skipped_frames_nv21_and_a_stream_after_eos(card):
    ctx, stream = card
    units = _annexb_units(_need("street_people_720p.mp4"), 6)
    calls: list[tuple] = []

    def callback(input_desc, output_desc, user_data):
        fmt = acl.media.dvpp_get_pic_desc_format(output_desc) if output_desc else None
        code = acl.media.dvpp_get_pic_desc_ret_code(output_desc) if output_desc else None
        calls.append((user_data, output_desc != 0, fmt, code))
        acl.media.dvpp_destroy_stream_desc(input_desc)

    loop = ReportLoop(ctx)
    desc = _vdec_channel(loop.tid, callback)
    assert acl.media.vdec_set_channel_desc_out_pic_format(desc, 2) == 0  # NV21
    assert acl.media.vdec_create_channel(desc) == 0
    config = acl.media.vdec_create_frame_config()
    size = 1280 * 720 * 3 // 2
    outs, pics, bufs = [], [], []
    for round_ in range(2):  # a second stream after the first one's EOS
        for i, unit in enumerate(units):
            buf = _to_dvpp(unit)
            bufs.append(buf)
            sd = acl.media.dvpp_create_stream_desc()
            acl.media.dvpp_set_stream_desc_data(sd, buf)
            acl.media.dvpp_set_stream_desc_size(sd, len(unit))
            if i % 2:
                assert acl.media.vdec_send_skipped_frame(desc, sd, config, (round_, i)) == 0
                continue
            out, _ = acl.media.dvpp_malloc(size)
            pd = _pic(out, size, 0, 0, 0, 0, fmt=NV12)
            assert acl.media.vdec_send_frame(desc, sd, pd, config, (round_, i)) == INVALID_PARAM  # NV12 vs NV21
            acl.media.dvpp_set_pic_desc_format(pd, 2)
            assert acl.media.vdec_send_frame(desc, sd, pd, config, (round_, i)) == 0
            outs.append(out)
            pics.append(pd)
        eos = acl.media.dvpp_create_stream_desc()
        acl.media.dvpp_set_stream_desc_eos(eos, 1)
        assert acl.media.vdec_send_frame(desc, eos, 0, config, (round_, "eos")) == 0
    assert acl.media.vdec_destroy_channel(desc) == 0  # waits for the callbacks on the report thread
    loop.stop()
    assert [c[0] for c in calls] == [(r, i) for r in range(2) for i in [*range(6), "eos"]]
    assert all(c[1:] == (True, 2, 0) for c in calls if c[0][1] in (0, 2, 4))
    assert all(c[1] is False for c in calls if c[0][1] in (1, 3, 5, "eos"))
    assert _fake.report()["media"]["devices"]["0"]["vdec_frames"] == 6
    for pd in pics:
        assert acl.media.dvpp_destroy_pic_desc(pd) == 0
    for buf in outs + bufs:
        assert acl.media.dvpp_free(buf) == 0
    assert acl.media.vdec_destroy_channel_desc(desc) == 0
    assert acl.media.vdec_destroy_frame_config(config) == 0
    _teardown(ctx, stream)


def test_report_threads_follow_pyacl(card):
    ctx, stream = card
    assert acl.rt.process_report(10) == 107012  # nothing subscribed to this thread
    assert acl.rt.process_report(0) == RT_PARAM_INVALID
    seen = []

    def boom(args):
        seen.append(args)
        raise ValueError("in the thread")

    tid, ret = acl.util.start_thread(boom, [1, 2])
    assert ret == 0
    with pytest.raises(RuntimeError, match="exception=ValueError,msg=thread call failed;"):
        acl.util.stop_thread(tid)
    assert seen == [[1, 2]]  # func(args), the list itself
    stop = threading.Event()
    tid, _ = acl.util.start_thread(lambda: stop.wait(5), None)  # args None: func()
    assert acl.rt.subscribe_report(tid, stream) == 0
    assert acl.rt.subscribe_report(tid, stream) == 107011
    assert acl.rt.unsubscribe_report(tid, stream) == 0
    _fake.STATE.media.wait_bound_s = 0.2
    with pytest.raises(RuntimeError, match="would block forever"):
        acl.util.stop_thread(tid)  # joins: the function has not returned
    stop.set()
    assert acl.util.stop_thread(tid) == 0
    _teardown(ctx, stream)


def test_vpc_resize_scales_the_whole_picture(card):
    ctx, stream = card
    bgr = cv2.resize(cv2.imread(str(_need("bus.jpg"))), (320, 240))
    nv12 = _nv12_of(bgr)
    src = _to_dvpp(nv12.tobytes())
    dst, _ = acl.media.dvpp_malloc(160 * 120 * 3 // 2)
    in_pd = _pic(src, nv12.size, 320, 240, 320, 240)
    out_pd = _pic(dst, 160 * 120 * 3 // 2, 160, 120, 160, 120)
    channel = acl.media.dvpp_create_channel_desc()
    assert acl.media.dvpp_vpc_resize_async(channel, in_pd, out_pd, 0, stream) == INVALID_PARAM  # not created
    assert acl.media.dvpp_create_channel(channel) == 0
    assert acl.media.dvpp_vpc_resize_async(channel, in_pd, out_pd, 0, stream) == INVALID_PARAM  # no resize config
    cfg = acl.media.dvpp_create_resize_config()
    assert acl.media.dvpp_vpc_resize_async(channel, in_pd, out_pd, cfg, stream) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    out = _read(dst, 160 * 180).reshape(180, 160)
    want = cv2.resize(nv12[:240], (160, 120), interpolation=cv2.INTER_LINEAR)
    assert np.abs(out[:120].astype(int) - want).max() <= 1
    for cleanup in (lambda: acl.media.dvpp_destroy_resize_config(cfg), lambda: acl.media.dvpp_destroy_pic_desc(in_pd),
                    lambda: acl.media.dvpp_destroy_pic_desc(out_pd), lambda: acl.media.dvpp_destroy_channel(channel),
                    lambda: acl.media.dvpp_destroy_channel_desc(channel), lambda: acl.media.dvpp_free(src),
                    lambda: acl.media.dvpp_free(dst)):
        assert cleanup() == 0
    _teardown(ctx, stream)


def test_vdec_garbage_gets_a_failed_callback_and_jpegd_refuses_non_jpeg(card):
    ctx, stream = card
    codes = []
    done = threading.Event()

    def callback(input_desc, output_desc, user_data):
        if output_desc:
            codes.append(acl.media.dvpp_get_pic_desc_ret_code(output_desc))
        if user_data == "eos":
            done.set()

    loop = ReportLoop(ctx)
    desc = _vdec_channel(loop.tid, callback)
    assert acl.media.vdec_create_channel(desc) == 0
    config = acl.media.vdec_create_frame_config()
    garbage = bytes(range(256)) * 8
    buf = _to_dvpp(garbage)
    sd = acl.media.dvpp_create_stream_desc()
    acl.media.dvpp_set_stream_desc_data(sd, buf)
    acl.media.dvpp_set_stream_desc_size(sd, len(garbage))
    out, _ = acl.media.dvpp_malloc(64 * 64 * 3 // 2)
    pd = _pic(out, 64 * 64 * 3 // 2, 0, 0, 0, 0)
    assert acl.media.vdec_send_frame(desc, sd, pd, config, 0) == 0
    eos = acl.media.dvpp_create_stream_desc()
    acl.media.dvpp_set_stream_desc_eos(eos, 1)
    assert acl.media.vdec_send_frame(desc, eos, 0, config, "eos") == 0
    assert done.wait(20)
    assert codes == [1]  # "decode failed"
    assert acl.media.vdec_destroy_channel(desc) == 0
    loop.stop()

    channel = acl.media.dvpp_create_channel_desc()
    assert acl.media.dvpp_create_channel(channel) == 0
    assert acl.media.dvpp_jpeg_decode_async(channel, buf, len(garbage), pd, stream) == INVALID_PARAM
    assert acl.media.dvpp_jpeg_get_image_info(buf, len(garbage)) == (0, 0, 0, INVALID_PARAM)
    for cleanup in (lambda: acl.media.dvpp_destroy_channel(channel),
                    lambda: acl.media.dvpp_destroy_channel_desc(channel), lambda: acl.media.dvpp_destroy_pic_desc(pd),
                    lambda: acl.media.dvpp_destroy_stream_desc(sd),
                    lambda: acl.media.dvpp_destroy_stream_desc(eos), lambda: acl.media.dvpp_free(out),
                    lambda: acl.media.dvpp_free(buf), lambda: acl.media.vdec_destroy_channel_desc(desc),
                    lambda: acl.media.vdec_destroy_frame_config(config)):
        assert cleanup() == 0
    _teardown(ctx, stream)
