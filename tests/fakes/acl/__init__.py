"""A fake pyACL (`import acl`) for tests: the real API's names, argument orders, return shapes,
codes and refusals, with the NPU replaced by ONNX Runtime on the CPU.

Importable as `acl` when tests/fakes is on sys.path (the daemon harness puts it on PYTHONPATH).

Real behaviours modelled (API fact sheet sections 1 and 9):
* return shapes: `ret` only, `(value, ret)`, `(free, total, ret)` for get_mem_info,
  `(type, index, ret)` for get_aipp_type, bare values (create_desc, get_num_inputs,
  create_dataset, create_data_buffer, get_soc_name, ...); handles and pointers are ints;
  pointers/sizes must be Python ints (a numpy integer is a TypeError); no keyword arguments;
* the module defines no constants (acl.ACL_SUCCESS is an AttributeError);
* `acl.init` once per process (a second one, also after finalize, returns 100002); every other
  call before it returns 100001; `acl.finalize` refuses (500001) while memory, models, model
  descriptions, datasets, data buffers, streams, explicit contexts or set devices remain, and
  records what remained; a second finalize returns 100037;
* per-thread current context: set_device binds the device's default context, create_context binds
  the new context, set_context binds; calls that need one return 107002 on a thread without;
  a stream of another context (memcpy_async, destroy_stream, execute_async) gives 107003, a model
  loaded under another context (execute, unload, set_dynamic_batch_size) 107004;
  synchronize_stream switches to the stream's context; free/free_host need no context;
* memory is real (numpy bytes) behind the buffer's own address: malloc rounds the size up to a
  multiple of 32, plus 32 (real memory is not zeroed, the fake's is); malloc(0) is refused (107000);
  malloc_host is pinned host memory (device
  memory when run mode is ACL_DEVICE); free/free_host of an unknown or already freed pointer and
  any copy touching an unknown pointer return 107000; memcpy checks count <= dest_max, both ranges,
  the copy direction against the kind (and the device against the current context's), count 0 is
  a no-op; memcpy_async host-to-host returns 207000;
* models: load_from_file reads `<path>.fake.json` (the test's pairing: the ONNX file, `batch` as an
  int (static) or a list of gears (dynamic: -1 batch dim, sizes for the largest gear, an extra
  INT64 `ascend_mbatch_shape_data` input of 8 bytes), `aipp` (true / "rgb": uint8 NHWC RGB input,
  normalised /255 by the fake as static AIPP would; "yuv420sp": NV12 input of n*h*w*3/2 bytes with
  dims NHWC, converted with ATC's BT.601 CSC block `(M . (yuv - 16/128/128)) >> 8` then /255),
  `outputs` (which ONNX outputs the .om exposes)); get_first_aipp_info gives (dict, ret) with
  pyACL's keys, (None, 145015) for an input without AIPP;
  get_input_index_by_name answers a non-zero ret for unknown names; get_dynamic_batch gives
  {"batchCount", "batch"}; get_*_dims give {"name", "dimCount", "dims"};
* set_dynamic_batch_size: wrong index 145011, buffer under 8 bytes 145012, not a gear 145013; it
  writes the batch into the mbatch buffer, which execute reads back;
* execute refuses dataset buffer counts that differ from the model's (100017/100018), buffers not
  in device memory of the model's card (145007), buffers smaller than the gear needs (145006), a
  batch gear that was not set (145013); it runs the ONNX once per image in the gear (or the whole
  gear when the ONNX batch is dynamic) and writes only what the gear produced;
  execute_async queues the run on the stream: results appear at synchronize_stream, which also
  returns the run's error;
* several models on one card (fake-only strictness, where pyACL would silently run on the wrong
  memory): a dataset belongs to the first model it ran with (another model's id with it: 100017 /
  100018), device memory to the first model whose dataset used it (145007 for another's), a data
  buffer to one dataset (100000 for a second), and one dataset is never both input and output;
  destroy_context under a loaded model or a live stream is refused as pyACL refuses it;
* acl.media: DVPP V1 (dvpp memory, descriptions, JPEGD, VPC, VDEC with callbacks on a report
  thread); the rules and what is UNCONFIRMED are in media.py, media_ops.py and vdec.py;
  acl.rt.process_report / subscribe_report / unsubscribe_report / memset, acl.util.start_thread /
  stop_thread;
* acl.util helpers present or not (reset(util_helpers=...)), ptr_to_numpy is a zero-copy view and
  warns as the current pyACL does; bytes_to_ptr of a bytes object.
"""

from . import _fake, mdl, media, rt, util  # noqa: F401  (submodules are attributes, as in pyACL)
from ._fake import FAILURE, INVALID_PARAM, REPEAT_FINALIZE, REPEAT_INITIALIZE, Refused, api, need_int


@api("acl.init", "ret", needs_init=False)
def init(state, *config_path):
    if len(config_path) > 1:
        raise TypeError("init() takes at most 1 argument")
    if config_path and not isinstance(config_path[0], str):
        raise TypeError("config_path must be a str")
    if state.init_count:
        raise Refused(REPEAT_INITIALIZE, "acl.init may be called once per process")
    state.init_count += 1
    state.initialised = True


@api("acl.finalize", "ret", needs_init=False)
def finalize(state):
    if not state.initialised:
        raise Refused(REPEAT_FINALIZE if state.finalize_count else _fake.UNINITIALIZE)
    held = {k: v for k, v in state.leaks().items() if v}
    if held:
        state.finalize_refused.append(held)
        _fake.write_report()
        raise Refused(FAILURE, f"finalize with resources still held: {held}")
    state.finalize_count += 1
    state.initialised = False
    state.local.__dict__.clear()
    _fake.write_report()


@api("acl.get_soc_name", "bare", default=None)
def get_soc_name(state):
    return state.soc


@api("acl.get_version", "value3", needs_init=False)
def get_version(state):
    return (8, 0, 0)


@api("acl.create_data_buffer", "bare", default=0)
def create_data_buffer(state, ptr, size):
    need_int(ptr, size)
    handle = state.handle()
    state.data_buffers[handle] = (ptr, size)
    return handle


@api("acl.destroy_data_buffer", "ret")
def destroy_data_buffer(state, buffer):
    need_int(buffer)
    if state.data_buffers.pop(buffer, None) is None:
        raise Refused(INVALID_PARAM, "unknown or already destroyed data buffer")


@api("acl.get_data_buffer_addr", "bare", default=0)
def get_data_buffer_addr(state, buffer):
    if buffer not in state.data_buffers:
        raise Refused(INVALID_PARAM)
    return state.data_buffers[buffer][0]


@api("acl.get_data_buffer_size_v2", "bare", default=0)
def get_data_buffer_size_v2(state, buffer):
    if buffer not in state.data_buffers:
        raise Refused(INVALID_PARAM)
    return state.data_buffers[buffer][1]


get_data_buffer_size = get_data_buffer_size_v2  # deprecated name, same answer
