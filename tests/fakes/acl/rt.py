"""Fake `acl.rt`: devices, contexts, streams, memory and copies (see the package docstring)."""

from __future__ import annotations

from dataclasses import dataclass

from ._fake import (ACL_DEVICE, DEVICE_MEMORY, MEMCPY_DEVICE_TO_DEVICE, MEMCPY_DEVICE_TO_HOST,
                    MEMCPY_HOST_TO_DEVICE, MEMCPY_HOST_TO_HOST, RT_FEATURE_NOT_SUPPORT,
                    RT_INVALID_DEVICEID, RT_MEMORY_ALLOCATION, RT_PARAM_INVALID, RT_STREAM_CONTEXT, Context,
                    Refused, Stream, api, need_int)


def _check_device(state, device):
    need_int(device)
    if not 0 <= device < state.devices:
        raise Refused(RT_INVALID_DEVICEID, f"no device {device} (this fake has {state.devices})")


# -- devices and contexts ----------------------------------------------------------------------
@api("acl.rt.get_device_count", "value")
def get_device_count(state):
    return state.devices


@api("acl.rt.set_device", "ret", device_of=lambda state, device, *rest: device)
def set_device(state, device):
    _check_device(state, device)
    state.fault("acl.rt.set_device", device)
    state.device_refs[device] += 1
    if device not in state.default_context:
        ctx = state.handle()
        state.contexts[ctx] = Context(device, default=True)
        state.default_context[device] = ctx
    state.bind(state.default_context[device])


@api("acl.rt.reset_device", "ret")
def reset_device(state, device):
    _check_device(state, device)
    if state.device_refs[device] <= 0:
        raise Refused(RT_PARAM_INVALID, f"device {device} was not set")
    explicit = [c for c, v in state.contexts.items() if v.device == device and not v.default]
    if explicit and state.device_refs[device] == 1:
        raise Refused(RT_PARAM_INVALID, "reset_device before destroy_context of its contexts")
    state.device_refs[device] -= 1
    if state.device_refs[device] == 0:
        ctx = state.default_context.pop(device)
        for s in [s for s, v in state.streams.items() if v.context == ctx]:
            del state.streams[s]
        del state.contexts[ctx]


@api("acl.rt.create_context", "value", default=0)
def create_context(state, device):
    _check_device(state, device)
    ctx = state.handle()
    state.contexts[ctx] = Context(device, default=False)
    state.bind(ctx)
    return ctx


@api("acl.rt.destroy_context", "ret")
def destroy_context(state, ctx):
    need_int(ctx)
    context = state.contexts.get(ctx)
    if context is None or context.default:
        raise Refused(RT_PARAM_INVALID, "not an explicitly created context")
    if any(s.context == ctx for s in state.streams.values()):
        raise Refused(RT_STREAM_CONTEXT, "destroy_context while its streams exist (destroy_stream first)")
    if any(m.context == ctx for m in state.models.values()):
        raise Refused(RT_PARAM_INVALID, "destroy_context while a model is loaded under it (unload first)")
    del state.contexts[ctx]


@api("acl.rt.set_context", "ret")
def set_context(state, ctx):
    need_int(ctx)
    if ctx not in state.contexts:
        raise Refused(RT_PARAM_INVALID, "unknown context")
    state.bind(ctx)


@api("acl.rt.get_context", "value", default=0)
def get_context(state):
    return state.current_context()


@api("acl.rt.get_run_mode", "value", default=0)
def get_run_mode(state):
    return state.run_mode


# -- streams ------------------------------------------------------------------------------------
@api("acl.rt.create_stream", "value", default=0)
def create_stream(state):
    ctx = state.current_context()
    stream = state.handle()
    state.streams[stream] = Stream(ctx)
    return stream


def _own_stream(state, stream):
    need_int(stream)
    ctx = state.current_context()
    if stream not in state.streams:
        raise Refused(RT_PARAM_INVALID, "unknown stream")
    if state.streams[stream].context != ctx:
        raise Refused(RT_STREAM_CONTEXT, "the stream belongs to another context")
    return state.streams[stream]


@api("acl.rt.destroy_stream", "ret")
def destroy_stream(state, stream):
    _own_stream(state, stream)
    del state.streams[stream]


@api("acl.rt.synchronize_stream", "ret")
def synchronize_stream(state, stream):
    need_int(stream)
    if stream not in state.streams:
        raise Refused(RT_PARAM_INVALID, "unknown stream")
    s = state.streams[stream]
    state.bind(s.context)  # the runtime switches to the stream's context rather than failing
    pending, s.pending = s.pending, []
    codes = [task() for task in pending]
    failed = [c for c in codes if c]
    if failed:
        raise Refused(failed[0], "a task queued on the stream failed")


# -- memory -------------------------------------------------------------------------------------
@api("acl.rt.malloc", "value", default=0)
def malloc(state, size, policy):
    need_int(size, policy)
    ctx = state.current_context()
    if size <= 0:
        raise Refused(RT_PARAM_INVALID, "malloc of 0 bytes")
    device = state.contexts[ctx].device
    state.fault("acl.rt.malloc", device)
    rounded = (size + 31) // 32 * 32 + 32
    if state.device_used[device] + rounded > DEVICE_MEMORY:
        raise Refused(RT_MEMORY_ALLOCATION, "device memory exhausted")
    state.device_used[device] += rounded
    return state.add_region(rounded, "device", device, requested=size).ptr


@api("acl.rt.malloc_host", "value", default=0)
def malloc_host(state, size):
    need_int(size)
    ctx = state.current_context()
    if size <= 0:
        raise Refused(RT_PARAM_INVALID, "malloc_host of 0 bytes")
    state.fault("acl.rt.malloc_host", state.contexts[ctx].device)
    if state.run_mode == ACL_DEVICE:  # the process runs on the card: "host" memory is device memory
        device = state.contexts[ctx].device
        state.device_used[device] += size
        region = state.add_region(size, "host", device)
        region.on_device = True
        return region.ptr
    return state.add_region(size, "host", None).ptr


@api("acl.rt.free", "ret")
def free(state, ptr):
    need_int(ptr)
    state.free(ptr, "device")


@api("acl.rt.free_host", "ret")
def free_host(state, ptr):
    need_int(ptr)
    state.free(ptr, "host")


@api("acl.rt.get_mem_info", "value2", default=0)
def get_mem_info(state, attr):
    need_int(attr)
    device = state.contexts[state.current_context()].device
    return DEVICE_MEMORY - state.device_used[device], DEVICE_MEMORY


def _side(state, region):
    """"device" or "host" as the copy engine sees it (malloc_host memory is device memory in
    ACL_DEVICE run mode)."""
    if region.kind == "device" or region.on_device:
        return "device"
    return "host"


_KINDS = {
    MEMCPY_HOST_TO_HOST: ("host", "host"),
    MEMCPY_HOST_TO_DEVICE: ("device", "host"),  # (dst, src)
    MEMCPY_DEVICE_TO_HOST: ("host", "device"),
    MEMCPY_DEVICE_TO_DEVICE: ("device", "device"),
}


def _plan_copy(state, dst, dest_max, src, count, kind):
    need_int(dst, dest_max, src, count, kind)
    ctx = state.current_context()
    if count == 0:
        return None
    if count > dest_max:
        raise Refused(RT_PARAM_INVALID, f"count {count} > dest_max {dest_max}")
    if kind not in _KINDS:
        raise Refused(RT_PARAM_INVALID, f"unknown memcpy kind {kind}")
    dst_region = state.find(dst, dest_max)
    src_region = state.find(src, count)
    want = _KINDS[kind]
    have = (_side(state, dst_region), _side(state, src_region))
    if have != want:
        raise Refused(RT_PARAM_INVALID, f"memcpy kind {kind} copies {want[1]}->{want[0]}, "
                                        f"the pointers are {have[1]}->{have[0]}")
    device = state.contexts[ctx].device
    for region in (dst_region, src_region):
        if _side(state, region) == "device" and region.device != device:
            raise Refused(RT_PARAM_INVALID, f"device memory of device {region.device} used under a "
                                            f"context of device {device}")
    return dst_region, src_region


@api("acl.rt.memcpy", "ret")
def memcpy(state, dst, dest_max, src, count, kind):
    plan = _plan_copy(state, dst, dest_max, src, count, kind)
    if plan is not None:
        dst_region, src_region = plan
        dst_region.view(dst, count)[...] = src_region.view(src, count)


@api("acl.rt.memcpy_async", "ret")
def memcpy_async(state, dst, dest_max, src, count, kind, stream):
    s = _own_stream(state, stream)
    if kind == MEMCPY_HOST_TO_HOST:
        raise Refused(RT_FEATURE_NOT_SUPPORT, "async host-to-host copy")
    plan = _plan_copy(state, dst, dest_max, src, count, kind)
    if plan is None:
        return
    dst_region, src_region = plan

    def task():
        dst_region.view(dst, count)[...] = src_region.view(src, count)
        return 0

    s.pending.append(task)



# -- events (timing of what the stream ran) ------------------------------------------------------
# pyACL (rt_synchronize.cpp): create_event() -> (event, ret); record_event(event, stream) -> ret;
# synchronize_event(event) -> ret; event_elapsed_time(start, end) -> (ms float, ret);
# destroy_event(event) -> ret. The fake's stream runs its tasks in order at a synchronisation, so a
# recorded event takes its timestamp (`STATE.clock`) when the stream reaches it: the time between
# two events is the real time the fake spent on what was queued between them.
@dataclass
class Event:
    context: int
    stamp: float | None = None  # set when the stream reached the record
    task: object = None  # the record task still pending on its stream
    stream: int = 0


@api("acl.rt.create_event", "value", default=0)
def create_event(state):
    event = state.handle()
    state.events[event] = Event(state.current_context())
    return event


def _event(state, event) -> Event:
    need_int(event)
    if event not in state.events:
        raise Refused(RT_PARAM_INVALID, "unknown or destroyed event")
    return state.events[event]


@api("acl.rt.destroy_event", "ret")
def destroy_event(state, event):
    _event(state, event)
    del state.events[event]


@api("acl.rt.record_event", "ret")
def record_event(state, event, stream):
    ev = _event(state, event)
    s = _own_stream(state, stream)
    ev.stamp = None

    def task():
        ev.stamp = state.clock()
        ev.task = None
        return 0

    ev.task, ev.stream = task, stream
    s.pending.append(task)


def _event_device(state, event, *rest):
    """For holds: the card of the context an event was created in (None for an unknown event)."""
    ev = state.events.get(event) if isinstance(event, int) else None
    ctx = state.contexts.get(ev.context) if ev is not None else None
    return ctx.device if ctx is not None else None


@api("acl.rt.synchronize_event", "ret", device_of=_event_device)
def synchronize_event(state, event):
    ev = _event(state, event)
    if ev.task is None or ev.stream not in state.streams:
        return  # never recorded, or already reached: nothing to wait for
    s = state.streams[ev.stream]
    index = s.pending.index(ev.task)
    done, s.pending = s.pending[:index + 1], s.pending[index + 1:]
    failed = [c for c in (task() for task in done) if c]
    if failed:
        raise Refused(failed[0], "a task queued on the stream before the event failed")


@api("acl.rt.event_elapsed_time", "value", default=0.0)
def event_elapsed_time(state, start, end):
    first, last = _event(state, start), _event(state, end)
    if first.stamp is None or last.stamp is None:
        raise Refused(RT_PARAM_INVALID, "event_elapsed_time of an event the stream has not reached")
    return float((last.stamp - first.stamp) * 1000.0)


# -- report threads and memset (added for acl.media; see media.py) -------------------------------
# process_report runs callbacks (VDEC's, queued by acl.media.vdec_send_frame) on the calling thread.
# It waits without the fake's lock, so it cannot go through `api` as a whole.
def _subscribed(state, tid) -> bool:
    media = state.media
    return (any(c.created and c.thread_id == tid for c in media.vdec_descs.values())
            or tid in media.subscriptions.values() or bool(media.reports.get(tid)))


def process_report(timeout):
    """aclrtProcessReport(timeout ms; -1: no limit): run the callbacks queued for this thread.
    0 when at least one ran, 507012 when none came in time, 107012 when nothing is subscribed to
    this thread (a channel whose thread_id is this thread, or subscribe_report); 107002 on a thread
    without a current context (the samples set one first; UNCONFIRMED that the card needs it). Fake-only: a
    timeout of -1 gives up after `STATE.media.wait_bound_s` (recorded as misuse); timeout 0 or
    below -1 is refused with 107000 (UNCONFIRMED)."""
    import threading
    import time

    from . import _fake

    state = _fake.STATE
    name = "acl.rt.process_report"
    need_int(timeout)
    tid = threading.get_ident()
    with state.lock:
        state.counts[name] += 1
        if not state.initialised:
            return _fake.record(state, name, _fake.UNINITIALIZE, "acl.init has not been called")
        try:
            state.current_context()
        except Refused as refused:
            return _fake.record(state, name, refused.code, str(refused))
        if timeout == 0 or timeout < -1:
            return _fake.record(state, name, RT_PARAM_INVALID, f"timeout {timeout} ms")
        media = state.media
        wait = media.wait_bound_s if timeout == -1 else timeout / 1000.0
        deadline = time.monotonic() + wait
        while not media.reports.get(tid):
            if not _subscribed(state, tid):
                return _fake.record(state, name, _fake.RT_THREAD_SUBSCRIBE, "no channel or stream is "
                                    "subscribed to this thread")
            left = deadline - time.monotonic()
            if left <= 0:
                if timeout == -1:
                    _fake.record(state, name, _fake.RT_REPORT_TIMEOUT, "process_report(-1) found nothing "
                                 f"in {media.wait_bound_s} s (the real call would wait forever)")
                else:
                    state.errors.append((name, _fake.RT_REPORT_TIMEOUT))
                return _fake.RT_REPORT_TIMEOUT
            media.cond.wait(left)
        batch, media.reports[tid] = media.reports[tid], []
        for item in batch:
            item.start(state)
    for item in batch:
        item.run()  # the user's callback, on this thread, without the lock (it calls acl itself)
    with state.lock:
        for item in batch:
            item.finish(state)
        state.media.cond.notify_all()
    return 0


@api("acl.rt.subscribe_report", "ret")
def subscribe_report(state, thread_id, stream):
    need_int(thread_id, stream)
    if stream not in state.streams:
        raise Refused(RT_PARAM_INVALID, "unknown stream")
    from .media import live_thread

    if live_thread(state, thread_id) is None:
        raise Refused(107012, f"thread {thread_id} is not a running thread")
    if stream in state.media.subscriptions:
        raise Refused(107011, "the stream is already subscribed")
    state.media.subscriptions[stream] = thread_id


@api("acl.rt.unsubscribe_report", "ret")
def unsubscribe_report(state, thread_id, stream):
    need_int(thread_id, stream)
    if state.media.subscriptions.get(stream) != thread_id:
        raise Refused(107011, "the stream is not subscribed to this thread")
    del state.media.subscriptions[stream]


@api("acl.rt.memset", "ret")
def memset(state, dev_ptr, max_count, value, count):
    """aclrtMemset(devPtr, maxCount, value, count): device-side memory (malloc, dvpp_malloc, or
    malloc_host in ACL_DEVICE run mode); count > max_count is refused like memcpy's."""
    need_int(dev_ptr, max_count, value, count)
    ctx = state.current_context()
    if count > max_count:
        raise Refused(RT_PARAM_INVALID, f"count {count} > max_count {max_count}")
    region = state.find(dev_ptr, max_count)
    if _side(state, region) != "device" or region.device != state.contexts[ctx].device:
        raise Refused(RT_PARAM_INVALID, "memset of memory that is not device memory of this context's device")
    region.view(dev_ptr, count)[...] = value & 0xFF
