"""Fake `acl.mdl`: .om models (an ONNX file run by ONNX Runtime), descriptions, datasets, execution."""

from __future__ import annotations

import json
import os
import threading

import numpy as np

from ._fake import (DESERIALIZE_MODEL, GE_ADDR_INVALID, GE_AIPP_NOT_EXIST, GE_DATA_SIZE_INVALID,
                    GE_DYNAMIC_BATCH_SIZE_INVALID,
                    GE_DYNAMIC_INPUT_ADDR_INVALID, GE_DYNAMIC_INPUT_LENGTH_INVALID, INVALID_FILE, INVALID_MODEL_ID,
                    INVALID_PARAM, MBATCH_NAME, MODEL_INPUT_NOT_MATCH, MODEL_NOT_DYNAMIC, MODEL_OUTPUT_NOT_MATCH,
                    RT_MODEL_CONTEXT, RT_STREAM_CONTEXT, Model, ModelSpec, Refused, Tensor, api, need_int)

ACL_FLOAT, ACL_FLOAT16, ACL_UINT8, ACL_INT64 = 0, 1, 4, 9
ACL_FORMAT_NCHW, ACL_FORMAT_NHWC, ACL_FORMAT_ND = 0, 1, 2
ACL_DATA_WITHOUT_AIPP, ACL_DATA_WITH_STATIC_AIPP = 0, 1
INVALID_NODE_INDEX = 0xFFFFFFFF
_ORT_TO_ACL = {"tensor(float)": (ACL_FLOAT, np.float32), "tensor(float16)": (ACL_FLOAT16, np.float16),
               "tensor(uint8)": (ACL_UINT8, np.uint8), "tensor(int64)": (ACL_INT64, np.int64)}
_SESSIONS: dict[str, object] = {}
_SESSIONS_LOCK = threading.Lock()


# -- loading: <model>.om + <model>.om.fake.json --------------------------------------------------
def _session(path: str):
    """One ONNX Runtime session per ONNX file for the whole test process (loading is the slow part).
    The options are the ones yoloedge's ONNX Runtime backend builds for its default config (asked
    of the backend, not copied, so they follow its `qdq_fusion` default: fused, ONNX Runtime's own),
    and a test comparing the fake NPU with a default `OnnxRuntimeBackend` compares the same numbers."""
    import onnxruntime as ort

    from yoloedge.backends.onnxruntime import session_options
    from yoloedge.config.model import OnnxRuntimeConfig

    with _SESSIONS_LOCK:
        if path not in _SESSIONS:
            opts = session_options(OnnxRuntimeConfig())
            _SESSIONS[path] = ort.InferenceSession(path, sess_options=opts, providers=["CPUExecutionProvider"])
        return _SESSIONS[path]


def _read_spec(path: str) -> ModelSpec:
    sidecar = f"{path}.fake.json"
    if not os.path.isfile(sidecar):
        raise Refused(DESERIALIZE_MODEL, f"{path} has no {sidecar}: not an .om this fake can run")
    with open(sidecar, encoding="utf-8") as f:
        cfg = json.load(f)
    onnx_path = cfg["onnx"] if os.path.isabs(cfg["onnx"]) else os.path.join(os.path.dirname(path), cfg["onnx"])
    session = _session(onnx_path)
    batch = cfg.get("batch", 1)
    gears = tuple(sorted(batch)) if isinstance(batch, list) else ()
    top = max(gears) if gears else int(batch)
    aipp_cfg = cfg.get("aipp", False)
    if aipp_cfg not in (False, True, "rgb", "yuv420sp"):
        raise Refused(DESERIALIZE_MODEL, f"{sidecar}: aipp must be true/false, \"rgb\" or \"yuv420sp\"")
    aipp_format = "yuv420sp" if aipp_cfg == "yuv420sp" else ("rgb" if aipp_cfg else "")
    aipp = bool(aipp_format)
    onnx_in = session.get_inputs()[0]
    in_code, in_dtype = _ORT_TO_ACL[onnx_in.type]
    c, h, w = (int(d) for d in onnx_in.shape[1:])
    lead = -1 if gears else top
    if aipp_format == "yuv420sp":  # static AIPP, YUV420SP_U8: NV12 pictures (dims NHWC, size h*w*3/2;
        # the reference's reading of get_input_dims/get_input_size_by_index, UNCONFIRMED on a card)
        item = h * w * 3 // 2
        image = Tensor(onnx_in.name, ACL_UINT8, ACL_FORMAT_NHWC, [lead, h, w, c], top * item, item, (h * 3 // 2, w))
    elif aipp:  # static AIPP, input_format RGB888_U8: the model takes uint8 NHWC frames
        image = Tensor(onnx_in.name, ACL_UINT8, ACL_FORMAT_NHWC, [lead, h, w, c], top * h * w * c, h * w * c, (h, w, c))
    else:
        item = c * h * w * np.dtype(in_dtype).itemsize
        image = Tensor(onnx_in.name, in_code, ACL_FORMAT_NCHW, [lead, c, h, w], top * item, item, (c, h, w))
    inputs = [image]
    if gears:
        inputs.append(Tensor(MBATCH_NAME, ACL_INT64, ACL_FORMAT_ND, [1], 8, 8, (1,)))
    wanted = cfg.get("outputs") or [o.name for o in session.get_outputs()]
    by_name = {o.name: o for o in session.get_outputs()}
    outputs = []
    for name in wanted:
        code, dtype = _ORT_TO_ACL[by_name[name].type]
        shape = tuple(int(d) for d in by_name[name].shape[1:])
        item = int(np.prod(shape)) * np.dtype(dtype).itemsize
        fmt = ACL_FORMAT_NCHW if len(shape) == 3 else ACL_FORMAT_ND
        outputs.append(Tensor(name, code, fmt, [top, *shape], top * item, item, shape))
    fixed = isinstance(onnx_in.shape[0], int) and onnx_in.shape[0] == 1
    return ModelSpec(onnx_path, gears, top, aipp, inputs, outputs, onnx_in.name, np.dtype(in_dtype), fixed, wanted,
                     aipp_format)


@api("acl.mdl.load_from_file", "value", default=0)
def load_from_file(state, path):
    if not isinstance(path, str):
        raise TypeError("model path must be a str")
    ctx = state.current_context()
    if not os.path.isfile(path):
        raise Refused(INVALID_FILE, f"no model file {path}")
    spec = _read_spec(path)
    model_id = state.counts["acl.mdl.load_from_file"]  # small ints from 1, never reused
    state.models[model_id] = Model(model_id, ctx, state.contexts[ctx].device, spec)
    return model_id


def _model(state, model_id, same_context=True) -> Model:
    need_int(model_id)
    ctx = state.current_context()
    model = state.models.get(model_id)
    if model is None:
        raise Refused(INVALID_MODEL_ID, f"no model {model_id}")
    if same_context and model.context != ctx:
        raise Refused(RT_MODEL_CONTEXT, "the model was loaded under another context")
    return model


@api("acl.mdl.unload", "ret")
def unload(state, model_id):
    _model(state, model_id)
    del state.models[model_id]
    for desc, owner in state.descs.items():
        if owner == model_id:
            state.descs[desc] = -1  # the description outlives the model, its content does not


# -- descriptions -------------------------------------------------------------------------------
@api("acl.mdl.create_desc", "bare", default=0)
def create_desc(state):
    desc = state.handle()
    state.descs[desc] = None
    return desc


@api("acl.mdl.get_desc", "ret")
def get_desc(state, desc, model_id):
    need_int(desc, model_id)
    if desc not in state.descs:
        raise Refused(INVALID_PARAM, "unknown model description")
    if model_id not in state.models:
        raise Refused(INVALID_MODEL_ID, f"no model {model_id}")
    state.descs[desc] = model_id


@api("acl.mdl.destroy_desc", "ret")
def destroy_desc(state, desc):
    need_int(desc)
    if state.descs.pop(desc, "missing") == "missing":
        raise Refused(INVALID_PARAM, "unknown or already destroyed model description")


def _spec(state, desc) -> ModelSpec:
    need_int(desc)
    model_id = state.descs.get(desc)
    if model_id is None or model_id not in state.models:
        raise Refused(INVALID_PARAM, "the description holds no loaded model")
    return state.models[model_id].spec


def _tensor(state, desc, index, outputs=False) -> Tensor:
    need_int(index)
    tensors = _spec(state, desc).outputs if outputs else _spec(state, desc).inputs
    if not 0 <= index < len(tensors):
        raise Refused(INVALID_PARAM, f"index {index} out of range")
    return tensors[index]


@api("acl.mdl.get_num_inputs", "bare", default=0)
def get_num_inputs(state, desc):
    return len(_spec(state, desc).inputs)


@api("acl.mdl.get_num_outputs", "bare", default=0)
def get_num_outputs(state, desc):
    return len(_spec(state, desc).outputs)


@api("acl.mdl.get_input_size_by_index", "bare", default=0)
def get_input_size_by_index(state, desc, index):
    return _tensor(state, desc, index).size


@api("acl.mdl.get_output_size_by_index", "bare", default=0)
def get_output_size_by_index(state, desc, index):
    return _tensor(state, desc, index, outputs=True).size


def _dims(tensor: Tensor) -> dict:
    return {"name": tensor.name, "dimCount": len(tensor.dims), "dims": list(tensor.dims)}


@api("acl.mdl.get_input_dims", "value", default={})
def get_input_dims(state, desc, index):
    return _dims(_tensor(state, desc, index))


@api("acl.mdl.get_output_dims", "value", default={})
def get_output_dims(state, desc, index):
    return _dims(_tensor(state, desc, index, outputs=True))


@api("acl.mdl.get_cur_output_dims", "value", default={})
def get_cur_output_dims(state, desc, index):
    tensor = _tensor(state, desc, index, outputs=True)
    dims = _dims(tensor)
    dims["dims"][0] = state.last_gear.get(state.descs[desc], dims["dims"][0])
    return dims


@api("acl.mdl.get_input_data_type", "bare", default=-1)
def get_input_data_type(state, desc, index):
    return _tensor(state, desc, index).dtype_code


@api("acl.mdl.get_output_data_type", "bare", default=-1)
def get_output_data_type(state, desc, index):
    return _tensor(state, desc, index, outputs=True).dtype_code


@api("acl.mdl.get_input_format", "bare", default=-1)
def get_input_format(state, desc, index):
    return _tensor(state, desc, index).fmt


@api("acl.mdl.get_output_format", "bare", default=-1)
def get_output_format(state, desc, index):
    return _tensor(state, desc, index, outputs=True).fmt


@api("acl.mdl.get_input_name_by_index", "bare", default="")
def get_input_name_by_index(state, desc, index):
    return _tensor(state, desc, index).name


@api("acl.mdl.get_output_name_by_index", "bare", default="")
def get_output_name_by_index(state, desc, index):
    return _tensor(state, desc, index, outputs=True).name


@api("acl.mdl.get_input_index_by_name", "value", default=0)
def get_input_index_by_name(state, desc, name):
    for i, tensor in enumerate(_spec(state, desc).inputs):
        if tensor.name == name:
            return i
    raise Refused(INVALID_PARAM, f"no input named {name!r}")


@api("acl.mdl.get_dynamic_batch", "value", default={})
def get_dynamic_batch(state, desc):
    gears = list(_spec(state, desc).gears)
    return {"batchCount": len(gears), "batch": gears}


@api("acl.mdl.get_aipp_type", "value2", default=0)
def get_aipp_type(state, model_id, index):
    model = _model(state, model_id, same_context=False)
    need_int(index)
    if not 0 <= index < len(model.spec.inputs):
        raise Refused(INVALID_PARAM, f"index {index} out of range")
    kind = ACL_DATA_WITH_STATIC_AIPP if model.spec.aipp and index == 0 else ACL_DATA_WITHOUT_AIPP
    return kind, INVALID_NODE_INDEX


ACL_RGB888_U8_FORMAT, ACL_YUV420SP_U8_FORMAT = 3, 1  # aclAippInputFormat


@api("acl.mdl.get_first_aipp_info", "value", default=None)
def get_first_aipp_info(state, model_id, index):
    """(info dict, ret) with the keys pyACL's mdl_wrap.cpp builds (it leaves out matrixR0C2, R2C0
    and R2C1); (None, 145015) for an input without AIPP. The values are what the fake's static
    blocks are (UNCONFIRMED: srcFormat/srcDimNum/outDims as a card fills them)."""
    model = _model(state, model_id, same_context=False)
    need_int(index)
    spec = model.spec
    if not 0 <= index < len(spec.inputs):
        raise Refused(INVALID_PARAM, f"index {index} out of range")
    if not spec.aipp or index != 0:
        raise Refused(GE_AIPP_NOT_EXIST, f"input {index} has no AIPP")
    image = spec.inputs[0]
    n, h, w, c = image.dims
    yuv = spec.aipp_format == "yuv420sp"
    m = CSC_MATRIX if yuv else np.zeros((3, 3), np.int64)
    bias = CSC_INPUT_BIAS if yuv else np.zeros(3, np.int64)
    info = {"cscSwitch": int(yuv), "matrixR0C0": int(m[0, 0]), "matrixR0C1": int(m[0, 1]),
            "matrixR1C0": int(m[1, 0]), "matrixR1C1": int(m[1, 1]), "matrixR1C2": int(m[1, 2]),
            "matrixR2C2": int(m[2, 2]), "outputBias0": 0, "outputBias1": 0, "outputBias2": 0,
            "inputBias0": int(bias[0]), "inputBias1": int(bias[1]), "inputBias2": int(bias[2]),
            "rbuvSwapSwitch": 0, "axSwapSwitch": 0, "singleLineMode": 0, "srcImageSizeW": w, "srcImageSizeH": h,
            "srcFormat": ACL_FORMAT_NHWC, "srcDatatype": ACL_UINT8, "srcDimNum": 4, "shapeCount": 1,
            "inputFormat": ACL_YUV420SP_U8_FORMAT if yuv else ACL_RGB888_U8_FORMAT, "aippExtend": 0,
            "cropSwitch": 0, "loadStartPosW": 0, "loadStartPosH": 0, "cropSizeW": 0, "cropSizeH": 0,
            "resizeSwitch": 0, "resizeOutputW": 0, "resizeOutputH": 0, "paddingSwitch": 0, "leftPaddingSize": 0,
            "rightPaddingSize": 0, "topPaddingSize": 0, "bottomPaddingSize": 0,
            "meanChn0": 0, "meanChn1": 0, "meanChn2": 0, "meanChn3": 0,
            "minChn0": 0.0, "minChn1": 0.0, "minChn2": 0.0, "minChn3": 0.0,
            "varReciChn0": 1 / 255, "varReciChn1": 1 / 255, "varReciChn2": 1 / 255, "varReciChn3": 1.0}
    out_item = c * h * w * spec.onnx_input_dtype.itemsize
    info["outDims"] = [{"srcDims": {"name": image.name, "dimCount": 4, "dims": [n, h, w, c]},
                        "srcSize": image.size,
                        "aippOutdims": {"name": image.name, "dimCount": 4, "dims": [n, c, h, w]},
                        "aippOutSize": spec.batch * out_item}]
    return info


# -- datasets -----------------------------------------------------------------------------------
@api("acl.mdl.create_dataset", "bare", default=0)
def create_dataset(state):
    dataset = state.handle()
    state.datasets[dataset] = []
    return dataset


@api("acl.mdl.add_dataset_buffer", "value", default=0)
def add_dataset_buffer(state, dataset, buffer):
    need_int(dataset, buffer)
    if dataset not in state.datasets or buffer not in state.data_buffers:
        raise Refused(INVALID_PARAM, "unknown dataset or data buffer")
    if any(buffer in buffers for buffers in state.datasets.values()):  # fake-only strictness
        raise Refused(INVALID_PARAM, "the data buffer is already in a dataset (one buffer, one dataset)")
    state.datasets[dataset].append(buffer)
    return dataset


@api("acl.mdl.get_dataset_buffer", "bare", default=0)
def get_dataset_buffer(state, dataset, index):
    need_int(dataset, index)
    buffers = state.datasets.get(dataset)
    if buffers is None or not 0 <= index < len(buffers):
        raise Refused(INVALID_PARAM)
    return buffers[index]


@api("acl.mdl.get_dataset_num_buffers", "bare", default=0)
def get_dataset_num_buffers(state, dataset):
    need_int(dataset)
    if dataset not in state.datasets:
        raise Refused(INVALID_PARAM)
    return len(state.datasets[dataset])


@api("acl.mdl.destroy_dataset", "ret")
def destroy_dataset(state, dataset):
    need_int(dataset)
    if state.datasets.pop(dataset, None) is None:
        raise Refused(INVALID_PARAM, "unknown or already destroyed dataset")
    state.dataset_model.pop(dataset, None)


# -- execution ----------------------------------------------------------------------------------
@api("acl.mdl.set_dynamic_batch_size", "ret")
def set_dynamic_batch_size(state, model_id, dataset, index, batch):
    need_int(dataset, index, batch)
    model = _model(state, model_id)
    spec = model.spec
    if not spec.gears:
        raise Refused(MODEL_NOT_DYNAMIC, "the model has no dynamic batch")
    buffers = state.datasets.get(dataset)
    if buffers is None or index != len(spec.inputs) - 1 or index >= len(buffers):
        raise Refused(GE_DYNAMIC_INPUT_ADDR_INVALID, f"index {index} is not the {MBATCH_NAME} input")
    _own_dataset(state, model, dataset, "input")
    ptr, size = state.data_buffers[buffers[index]]
    if size < 8:
        raise Refused(GE_DYNAMIC_INPUT_LENGTH_INVALID, "the batch input buffer is under 8 bytes")
    if batch not in spec.gears:
        raise Refused(GE_DYNAMIC_BATCH_SIZE_INVALID, f"batch {batch} is not one of the gears {list(spec.gears)}")
    region = _device_region(state, model, ptr, 8)
    region.view(ptr, 8)[...] = np.frombuffer(np.int64(batch).tobytes(), np.uint8)


def _device_region(state, model: Model, ptr: int, size: int):
    try:
        region = state.find(ptr, size)
    except Refused:
        raise Refused(GE_ADDR_INVALID, "a data buffer points outside any allocation") from None
    if not (region.kind == "device" or region.on_device) or region.device != model.device:
        raise Refused(GE_ADDR_INVALID, f"a data buffer is not device memory of device {model.device}")
    if region.model is None:
        region.model = model.model_id
    elif region.model != model.model_id:  # fake-only strictness: pyACL would run on the other's memory
        raise Refused(GE_ADDR_INVALID, f"model {model.model_id} runs on device memory that model "
                                       f"{region.model}'s datasets use")
    return region


def _own_dataset(state, model: Model, dataset: int, what: str) -> None:
    """Fake-only strictness: a dataset belongs to the first model it ran with. pyACL checks only the
    buffer count and sizes, so another model of the same layout would run on the wrong buffers."""
    owner = state.dataset_model.setdefault(dataset, model.model_id)
    if owner != model.model_id:
        code = MODEL_INPUT_NOT_MATCH if what == "input" else MODEL_OUTPUT_NOT_MATCH
        raise Refused(code, f"the {what} dataset of model {owner} used with model {model.model_id}")


def _gear(state, model: Model, buffers: list[int]) -> int:
    spec = model.spec
    if not spec.gears:
        return spec.batch
    ptr, _ = state.data_buffers[buffers[-1]]
    gear = int(np.frombuffer(_device_region(state, model, ptr, 8).view(ptr, 8).tobytes(), np.int64)[0])
    if gear not in spec.gears:
        raise Refused(GE_DYNAMIC_BATCH_SIZE_INVALID, "no valid batch gear set (set_dynamic_batch_size)")
    return gear


def _prepare(state, model: Model, in_ds, out_ds):
    """Validate the datasets like the runtime does; returns what the run needs."""
    need_int(in_ds, out_ds)
    spec = model.spec
    ins, outs = state.datasets.get(in_ds), state.datasets.get(out_ds)
    if ins is not None and outs is not None:
        if in_ds == out_ds:
            raise Refused(MODEL_OUTPUT_NOT_MATCH, "the same dataset as input and output")
        _own_dataset(state, model, in_ds, "input")
        _own_dataset(state, model, out_ds, "output")
    if ins is None or len(ins) != len(spec.inputs):
        raise Refused(MODEL_INPUT_NOT_MATCH, f"the input dataset needs {len(spec.inputs)} buffers")
    if outs is None or len(outs) != len(spec.outputs):
        raise Refused(MODEL_OUTPUT_NOT_MATCH, f"the output dataset needs {len(spec.outputs)} buffers")
    gear = _gear(state, model, ins)
    ptr, size = state.data_buffers[ins[0]]
    if size < gear * spec.inputs[0].item_bytes:
        raise Refused(GE_DATA_SIZE_INVALID, f"input buffer of {size} bytes, gear {gear} needs more")
    image = _device_region(state, model, ptr, size).view(ptr, gear * spec.inputs[0].item_bytes)
    targets = []
    for tensor, buffer in zip(spec.outputs, outs):
        optr, osize = state.data_buffers[buffer]
        if osize < gear * tensor.item_bytes:
            raise Refused(GE_DATA_SIZE_INVALID, f"output buffer {tensor.name} of {osize} bytes, gear {gear} needs more")
        targets.append(_device_region(state, model, optr, osize).view(optr, gear * tensor.item_bytes))
    return gear, image.copy(), targets


def _compute(state, model: Model, gear: int, image_bytes: np.ndarray, targets: list) -> None:
    spec = model.spec
    first = spec.inputs[0]
    if spec.aipp_format == "yuv420sp":  # static AIPP: NV12 -> RGB (ATC's CSC), then * (1/255), NCHW
        frames = _nv12_to_rgb(image_bytes.reshape(gear, *first.item_shape)).transpose(0, 3, 1, 2)
        batch = (frames.astype(np.float32) * np.float32(1.0 / 255.0)).astype(spec.onnx_input_dtype)
    elif spec.aipp:  # static AIPP: uint8 RGB NHWC -> (x - 0 - 0) * (1/255), NCHW
        frames = image_bytes.reshape(gear, *first.item_shape).transpose(0, 3, 1, 2)
        batch = (frames.astype(np.float32) * np.float32(1.0 / 255.0)).astype(spec.onnx_input_dtype)
    else:
        batch = image_bytes.view(spec.onnx_input_dtype).reshape(gear, *first.item_shape)
    session = _session(spec.onnx)
    if spec.onnx_batch_fixed:
        runs = [session.run(spec.onnx_outputs, {spec.onnx_input: batch[i:i + 1]}) for i in range(gear)]
        results = [np.concatenate([r[k] for r in runs]) for k in range(len(spec.onnx_outputs))]
    else:
        results = session.run(spec.onnx_outputs, {spec.onnx_input: np.ascontiguousarray(batch)})
    for tensor, result, target in zip(spec.outputs, results, targets):
        target[...] = np.frombuffer(np.ascontiguousarray(result, dtype=_dtype_of(tensor)).tobytes(), np.uint8)
    state.executed_gears.append(gear)
    state.executed_models.append(model.model_id)
    state.last_gear[model.model_id] = gear


# the YUV420SP (BT.601 limited range) -> RGB block ATC documents: out = (M . (yuv - bias)) >> 8
CSC_MATRIX = np.array([[298, 0, 409], [298, -100, -208], [298, 516, 0]], np.int64)
CSC_INPUT_BIAS = np.array([16, 128, 128], np.int64)


def _nv12_to_rgb(nv12: np.ndarray) -> np.ndarray:
    """(n, h*3/2, w) NV12 -> (n, h, w, 3) uint8 RGB, as the AIPP colour conversion computes it."""
    n, rows, w = nv12.shape
    h = rows * 2 // 3
    y = nv12[:, :h].astype(np.int64)
    uv = nv12[:, h:].reshape(n, h // 2, w // 2, 2).repeat(2, axis=1).repeat(2, axis=2).astype(np.int64)
    yuv = np.stack([y, uv[..., 0], uv[..., 1]], axis=-1) - CSC_INPUT_BIAS
    rgb = (yuv @ CSC_MATRIX.T) >> 8
    return np.clip(rgb, 0, 255).astype(np.uint8)


def _dtype_of(tensor: Tensor):
    return {ACL_FLOAT: np.float32, ACL_FLOAT16: np.float16, ACL_UINT8: np.uint8, ACL_INT64: np.int64}[tensor.dtype_code]


def _model_device(state, model_id, *rest):
    """For holds: the card a model runs on (None for an unknown id; the call then refuses it)."""
    model = state.models.get(model_id) if isinstance(model_id, int) else None
    return model.device if model is not None else None


@api("acl.mdl.execute", "ret", device_of=_model_device)
def execute(state, model_id, in_ds, out_ds):
    model = _model(state, model_id)
    state.fault("acl.mdl.execute", model.device)
    gear, image, targets = _prepare(state, model, in_ds, out_ds)
    _compute(state, model, gear, image, targets)


@api("acl.mdl.execute_async", "ret", device_of=_model_device)
def execute_async(state, model_id, in_ds, out_ds, stream):
    need_int(stream)
    model = _model(state, model_id)
    s = state.streams.get(stream)
    if s is None or s.context != model.context:
        raise Refused(RT_STREAM_CONTEXT, "the stream belongs to another context")

    def task():
        try:
            state.fault("acl.mdl.execute_async", model.device)
            gear, image, targets = _prepare(state, model, in_ds, out_ds)
            _compute(state, model, gear, image, targets)
        except Refused as refused:
            state.errors.append(("acl.mdl.execute_async (on the stream)", refused.code))
            return refused.code
        return 0

    s.pending.append(task)
