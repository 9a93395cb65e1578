"""VDEC of the fake `acl.media` (callback model; the rules are in media.py's docstring).

vdec_create_channel needs: a current context, a callback, the thread id of a running
acl.util.start_thread thread (otherwise 107012, UNCONFIRMED), entype 0..3 (H265 main, H264
baseline/main/high), out format NV12/NV21, a channel id 0..255 not in use on the card
(UNCONFIRMED range) and a free slot under the card's cap (`_fake.reset(vdec_channels=...)`).
Refusals without a documented code use 100000 (UNCONFIRMED). vdec_destroy_channel flushes the
decoder and waits (without the lock) until the channel's callbacks have run on its report thread;
a report thread that is not running, or that does not drain them within STATE.media.wait_bound_s,
makes it return 500001 and drop the callbacks (recorded as misuse) where the card would hang.
"""

from __future__ import annotations

import threading
import time

from . import _fake
from ._fake import FAILURE, INVALID_PARAM, RT_THREAD_SUBSCRIBE, Refused, api, need_int
from .media import (NV12, NV21, RET_DECODE_FAILED, RET_OUTPUT_SIZE, VDEC_CHANNEL_IDS, Callback, Send, VdecChannel,
                    _align, _dvpp_region, _pic, _sdesc, live_thread)

_CODECS = {0: "hevc", 1: "h264", 2: "h264", 3: "h264"}


@api("acl.media.vdec_create_channel_desc", "bare", default=0)
def vdec_create_channel_desc(state):
    handle = state.handle()
    state.media.vdec_descs[handle] = VdecChannel()
    return handle


def _vdesc(state, desc, created=None) -> VdecChannel:
    need_int(desc)
    channel = state.media.vdec_descs.get(desc)
    if channel is None:
        raise Refused(INVALID_PARAM, "unknown vdec channel description")
    if created is not None and channel.created != created:
        raise Refused(INVALID_PARAM, "the vdec channel is " + ("not created" if created else "already created"))
    return channel


@api("acl.media.vdec_destroy_channel_desc", "ret")
def vdec_destroy_channel_desc(state, desc):
    _vdesc(state, desc, created=False)
    del state.media.vdec_descs[desc]


def _setter(attr, check=None):
    @api(f"acl.media.vdec_set_channel_desc_{attr}", "ret")
    def setter(state, desc, value):
        if attr != "callback":
            need_int(value)
            if value < 0:
                raise OverflowError("can't convert negative value to unsigned int")
        elif not callable(value):
            raise TypeError("parameter must be callable")
        channel = _vdesc(state, desc, created=False)  # fake-only: settings after create do nothing
        if check is not None and not check(value):
            raise Refused(INVALID_PARAM, f"vdec {attr} {value}")
        setattr(channel, attr, value)
        if attr == "callback":
            channel.callback_set = True

    return setter


def _getter(attr):
    @api(f"acl.media.vdec_get_channel_desc_{attr}", "bare", default=0)
    def getter(state, desc):
        return getattr(_vdesc(state, desc), attr)

    return getter


vdec_set_channel_desc_channel_id = _setter("channel_id")
vdec_set_channel_desc_thread_id = _setter("thread_id")
vdec_set_channel_desc_callback = _setter("callback")
vdec_set_channel_desc_entype = _setter("entype", lambda v: v in _CODECS)
vdec_set_channel_desc_out_pic_format = _setter("out_pic_format", lambda v: v in (NV12, NV21))
vdec_set_channel_desc_out_pic_width = _setter("out_pic_width")
vdec_set_channel_desc_out_pic_height = _setter("out_pic_height")
vdec_set_channel_desc_ref_frame_num = _setter("ref_frame_num")
vdec_set_channel_desc_out_mode = _setter("out_mode", lambda v: v in (0, 1))
vdec_set_channel_desc_bit_depth = _setter("bit_depth", lambda v: v in (0, 1))
vdec_get_channel_desc_channel_id = _getter("channel_id")
vdec_get_channel_desc_thread_id = _getter("thread_id")
vdec_get_channel_desc_entype = _getter("entype")
vdec_get_channel_desc_out_pic_format = _getter("out_pic_format")
vdec_get_channel_desc_out_pic_width = _getter("out_pic_width")
vdec_get_channel_desc_out_pic_height = _getter("out_pic_height")
vdec_get_channel_desc_ref_frame_num = _getter("ref_frame_num")
vdec_get_channel_desc_out_mode = _getter("out_mode")
vdec_get_channel_desc_bit_depth = _getter("bit_depth")


def vdec_get_channel_desc_callback(desc):
    """pyACL answers from its own map: RuntimeError when no callback was set on this desc."""
    with _fake.STATE.lock:
        channel = _fake.STATE.media.vdec_descs.get(desc)
        if channel is None or not channel.callback_set:
            raise RuntimeError("did not set callback, failed")
        return channel.callback


@api("acl.media.vdec_create_frame_config", "bare", default=0)
def vdec_create_frame_config(state):
    handle = state.handle()
    state.media.frame_configs.add(handle)
    return handle


@api("acl.media.vdec_destroy_frame_config", "ret")
def vdec_destroy_frame_config(state, cfg):
    need_int(cfg)
    if cfg not in state.media.frame_configs:
        raise Refused(INVALID_PARAM, "unknown or already destroyed frame config")
    state.media.frame_configs.discard(cfg)


@api("acl.media.vdec_create_channel", "ret")
def vdec_create_channel(state, desc):
    import av

    channel = _vdesc(state, desc, created=False)
    device = state.contexts[state.current_context()].device
    if not channel.callback_set:
        raise Refused(INVALID_PARAM, "vdec_create_channel without a callback")
    if live_thread(state, channel.thread_id) is None:
        raise Refused(RT_THREAD_SUBSCRIBE, f"thread_id {channel.thread_id} is not a running thread")
    if channel.channel_id not in VDEC_CHANNEL_IDS:
        raise Refused(INVALID_PARAM, f"vdec channel id {channel.channel_id} outside 0..255")
    live = [c for c in state.media.vdec_descs.values() if c.created and c.device == device]
    if any(c.channel_id == channel.channel_id for c in live):
        raise Refused(INVALID_PARAM, f"vdec channel id {channel.channel_id} already in use on device {device}")
    if len(live) >= state.media.vdec_cap:
        raise Refused(INVALID_PARAM, f"device {device} already runs {len(live)} vdec channels (the cap)")
    channel.codec = av.CodecContext.create(_CODECS[channel.entype], "r")
    channel.created, channel.device, channel.pending, channel.outstanding = True, device, [], 0
    state.media.count(device, "vdec_channels_created")


def _own(state, send: Send, owner) -> None:
    _sdesc(state, send.stream_desc).owner = owner
    if send.pic_desc:
        _pic(state, send.pic_desc).owner = owner


def _queue_callback(state, channel: VdecChannel, send: Send) -> None:
    _own(state, send, channel)  # VDEC's until the callback starts (Callback.start)
    state.media.reports.setdefault(channel.thread_id, []).append(Callback(channel, send))
    channel.outstanding += 1
    state.media.cond.notify_all()


def _deliver_picture(state, channel: VdecChannel, frame) -> None:
    if not channel.pending:
        _fake.record(state, "acl.media.vdec_send_frame", -1, "a picture with no output description left to hold it")
        return
    send = channel.pending.pop(0)
    if send.pic_desc:
        pic = _pic(state, send.pic_desc)
        out_w, out_h = channel.out_pic_width or frame.width, channel.out_pic_height or frame.height
        ws, hs = _align(out_w, 16), _align(out_h, 2)  # VDEC output strides 16x2 (UNCONFIRMED for the 310P)
        need = ws * hs * 3 // 2
        if pic.size < need:
            pic.ret_code = RET_OUTPUT_SIZE
            state.media.count(channel.device, "vdec_errors")
        else:
            nv = frame.reformat(width=out_w, height=out_h, format="nv12").to_ndarray()
            view = _dvpp_region(state, pic.data, need, channel.device, "the VDEC output").view(pic.data, need)
            view = view.reshape(hs * 3 // 2, ws)
            view[:out_h, :out_w] = nv[:out_h]
            uv = nv[out_h:]
            if channel.out_pic_format == NV21:
                uv = uv.reshape(uv.shape[0], -1, 2)[..., ::-1].reshape(uv.shape[0], -1)
            view[hs:hs + uv.shape[0], :out_w] = uv
            pic.width, pic.height, pic.width_stride, pic.height_stride = out_w, out_h, ws, hs
            pic.size, pic.format, pic.ret_code = need, channel.out_pic_format, 0
            state.media.count(channel.device, "vdec_frames")
    _queue_callback(state, channel, send)


def _feed(state, channel: VdecChannel, data: bytes | None) -> None:
    """Parse and decode; each picture goes out with the oldest waiting send."""
    import av

    try:
        packets = channel.codec.parse(data) if data is not None else channel.codec.parse(None)
        if data is None:
            packets = list(packets) + [None]
        for packet in packets:
            for frame in channel.codec.decode(packet):
                _deliver_picture(state, channel, frame)
    except (av.error.FFmpegError, ValueError) as exc:
        if channel.pending:
            send = channel.pending.pop(0)
            if send.pic_desc:
                _pic(state, send.pic_desc).ret_code = RET_DECODE_FAILED
            state.media.count(channel.device, "vdec_errors")
            _queue_callback(state, channel, send)
        _fake.record(state, "acl.media.vdec (decoder)", RET_DECODE_FAILED, f"decode error: {exc}")


def _flush(state, channel: VdecChannel) -> None:
    import av

    _feed(state, channel, None)
    for send in channel.pending:  # sends that never got a picture
        if send.pic_desc:
            _pic(state, send.pic_desc).ret_code = RET_DECODE_FAILED
        _queue_callback(state, channel, send)
    channel.pending = []
    channel.codec = av.CodecContext.create(channel.codec.name, "r")  # a new stream may follow EOS


def _send(state, desc, stream_desc, pic_desc, frame_config, user_data, skipped=False) -> None:
    channel = _vdesc(state, desc, created=True)
    need_int(stream_desc, pic_desc, frame_config)
    if frame_config not in state.media.frame_configs:
        raise Refused(INVALID_PARAM, "unknown frame config (vdec_create_frame_config)")
    sd = _sdesc(state, stream_desc)
    if sd.owner is not None:
        raise Refused(INVALID_PARAM, "this stream description is still waiting for its callback")
    if sd.eos:
        send = Send(stream_desc, pic_desc, user_data)
        if pic_desc:
            _pic(state, pic_desc)
        _flush(state, channel)
        _queue_callback(state, channel, send)
        return
    if sd.size <= 0:
        raise Refused(INVALID_PARAM, "stream size 0 (ERR_INBUF_SIZE)")
    data = _dvpp_region(state, sd.data, sd.size, channel.device, "the VDEC input").view(sd.data, sd.size).tobytes()
    if not skipped:
        pic = _pic(state, pic_desc)
        if pic.owner is not None:
            raise Refused(INVALID_PARAM, "this picture description is still waiting for its callback")
        if pic.format != channel.out_pic_format:  # UNCONFIRMED that the card checks it
            raise Refused(INVALID_PARAM, f"output format {pic.format}, the channel outputs {channel.out_pic_format}")
        if pic.size <= 0:
            raise Refused(INVALID_PARAM, "output size 0")
        _dvpp_region(state, pic.data, pic.size, channel.device, "the VDEC output")
    send = Send(stream_desc, 0 if skipped else pic_desc, user_data)
    channel.pending.append(send)
    _own(state, send, channel)
    _feed(state, channel, data)


def vdec_send_frame(channel_desc, input_desc, output_desc, frame_config, user_data):
    _check_callback(channel_desc)
    return _send_frame(channel_desc, input_desc, output_desc, frame_config, user_data)


def vdec_send_skipped_frame(channel_desc, input_desc, frame_config, user_data):
    _check_callback(channel_desc)
    return _send_skipped(channel_desc, input_desc, frame_config, user_data)


def _check_callback(desc) -> None:
    """pyACL looks its callback map up before calling ACL: RuntimeError without a callback."""
    with _fake.STATE.lock:
        channel = _fake.STATE.media.vdec_descs.get(desc) if isinstance(desc, int) else None
        if channel is None or not channel.callback_set:
            raise RuntimeError("did not set callback, failed")


@api("acl.media.vdec_send_frame", "ret")
def _send_frame(state, desc, stream_desc, pic_desc, frame_config, user_data):
    _send(state, desc, stream_desc, pic_desc, frame_config, user_data)


@api("acl.media.vdec_send_skipped_frame", "ret")
def _send_skipped(state, desc, stream_desc, frame_config, user_data):
    _send(state, desc, stream_desc, 0, frame_config, user_data, skipped=True)


def vdec_destroy_channel(channel_desc):
    """Flush, wait for the channel's callbacks to run on its report thread, destroy."""
    state = _fake.STATE
    name = "acl.media.vdec_destroy_channel"
    with state.lock:
        state.counts[name] += 1
        try:
            if not state.initialised:
                raise Refused(_fake.UNINITIALIZE, "acl.init has not been called")
            channel = _vdesc(state, channel_desc, created=True)
            state.current_context()
            if threading.get_ident() == channel.thread_id:
                raise Refused(FAILURE, "vdec_destroy_channel on the channel's own report thread would deadlock")
            _flush(state, channel)
        except Refused as refused:
            return _fake.record(state, name, refused.code, str(refused))
        worker = live_thread(state, channel.thread_id)
        deadline = time.monotonic() + state.media.wait_bound_s
        while channel.outstanding and worker is not None and worker.is_alive():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            state.media.cond.wait(min(left, 0.05))
        code = 0
        if channel.outstanding:
            queue = state.media.reports.get(channel.thread_id, [])
            for dropped in (c for c in queue if c.channel is channel):
                dropped.start(state)  # the descriptions go back to the user, uncalled
            state.media.reports[channel.thread_id] = [c for c in queue if c.channel is not channel]
            why = ("its report thread is not running" if worker is None or not worker.is_alive()
                   else f"its report thread did not run them within {state.media.wait_bound_s} s")
            code = _fake.record(state, name, FAILURE, f"vdec_destroy_channel with {channel.outstanding} callbacks "
                                                      f"outstanding: {why} (the real call would hang)")
            channel.outstanding = 0
        channel.created, channel.codec = False, None
        state.media.count(channel.device, "vdec_channels_destroyed")
        return code

