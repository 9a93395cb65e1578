"""Small ONNX models built on the fly for the batching and backend tests (needs the `onnx` package).

Synthetic "colour meter" detector (`make_dynamic_batch_v8_model`, `make_fixed_batch_v8_model`)
-----------------------------------------------------------------------------------------------
A YOLOv8-layout model whose output is an exact, hand-checkable function of its input::

    images   float32 [N, 3, size, size]          (N = "batch" dim_param, or a fixed int)
    output0  float32 [N, 4 + nc, A]               A = (size/8)^2 + (size/16)^2 + (size/32)^2

Graph (opset 17, IR version 9)::

    r     = Squeeze(ReduceMean(Slice(images, channel 0), axes=[1,2,3], keepdims=1), 1)  -> [N, 1, 1]
    b     = Squeeze(ReduceMean(Slice(images, channel 2), axes=[1,2,3], keepdims=1), 1)  -> [N, 1, 1]
    cls0  = Mul(r, MASK0)     MASK0 [1, 1, A]: 1 on the stride-8 anchors, 0 elsewhere
    cls1  = Mul(b, MASK1)     MASK1 [1, 1, A]: 1 on the stride-16 anchors, 0 elsewhere
    clsK  = Mul(r, ZERO)      (only when nc > 2: classes 2..nc-1, all zero)
    boxes = Expand(BOXES [1, 4, A], Concat(Shape(images)[0:1], [4, A]))    -> [N, 4, A]
    output0 = Concat(boxes, cls0, cls1, ..., axis=1)                        -> [N, 4+nc, A]

BOXES holds cx, cy, w, h in input pixels, one constant box per pyramid level (see
`synthetic_boxes_cxcywh(size)`): every stride-8 anchor has the class-0 box (centre size/2, size/2;
side size/2), every stride-16 anchor the class-1 box (centre size/4, 3*size/4; side size/4), the
stride-32 anchors a third box whose class scores are all 0. At size 64 the xyxy boxes are
class 0 (16, 16, 48, 48) and class 1 (8, 40, 24, 56).

So, for each batch item independently, after the usual decode + class-aware NMS:

* class 0 is found once, at the class-0 box, with score = mean of input channel 0;
* class 1 is found once, at the class-1 box, with score = mean of input channel 2.

yoloedge letterboxes BGR frames into RGB planes scaled by 1/255 with pad value 114, so channel 0 is
the frame's red and channel 2 its blue: a pure red frame (BGR 0,0,255) that fills the input scores
1.0 for class 0 and 0 for class 1; padding contributes 114/255 to both means.

Real-model dynamic-batch copy (`make_dynamic_batch_copy_of`)
------------------------------------------------------------
Ultralytics exports with batch 1 bake the batch into Reshape shape constants ([1, 64, -1],
[1, 4, 16, 8400], ...). The copy sets dim 0 of every graph input/output to "batch", replaces the
leading 1 of those shape constants by 0 (Reshape with allowzero=0: "copy this dim from the
input"), and drops the stale intermediate `value_info`. Only Reshapes whose data comes from the
image input are touched: the dynamically quantised model also reshapes per-channel weight scales
with [1, -1, 1, 1], where a 0 would copy the channel count instead.

Outcome on the shared models (onnxruntime 1.32, CPU), checked by tests/test_batching.py:

* ``yolov8n_coco_int8_qdq.onnx`` (static QDQ: every scale is a constant) and
  ``yolov5n_coco_fp16.onnx`` (fp16, no quantisation) convert, and a batch of [bus, zidane] gives
  the same outputs as two batch-1 runs (bit-identical here, with and without ONNX Runtime's QDQ
  fusion; the tests require it bit-identical for the QDQ model, 1e-4 relative for fp16).
* ``yolov8n_coco_int8.onnx`` (dynamic quantisation) converts and runs, but is NOT batch-consistent:
  DynamicQuantizeLinear picks one scale / zero point per tensor from the min and max over the whole
  batch, so every frame is quantised with a scale that depends on the other frames. Measured on
  [bus, zidane]: class scores move by up to 0.67 on some anchors, and the final detections miss the
  parity rule (zidane's tie 0.394 -> 0.464, a person 0.834 -> 0.866). At batch 1 the copy is
  identical to the original model.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 9
STRIDES = (8, 16, 32)


def anchor_count(size: int) -> int:
    return sum((size // s) ** 2 for s in STRIDES)


def level_slices(size: int) -> list[slice]:
    """Anchor index range of each pyramid level (stride 8, 16, 32), in output order."""
    out, start = [], 0
    for s in STRIDES:
        n = (size // s) ** 2
        out.append(slice(start, start + n))
        start += n
    return out


def synthetic_boxes_cxcywh(size: int) -> tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]:
    """(class-0 box, class-1 box, unused box) as cx, cy, w, h in input pixels."""
    return (
        (size * 0.50, size * 0.50, size * 0.50, size * 0.50),  # centred square, half the input
        (size * 0.25, size * 0.75, size * 0.25, size * 0.25),  # small box lower left
        (size * 0.75, size * 0.25, size * 0.25, size * 0.25),  # small box upper right (score 0)
    )


def synthetic_boxes_xyxy(size: int) -> tuple[tuple[float, ...], ...]:
    return tuple((cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2)
                 for cx, cy, w, h in synthetic_boxes_cxcywh(size))


def _colour_meter_graph(size: int, nc: int, batch: int | str) -> onnx.ModelProto:
    if size % 32:
        raise ValueError("size must be a multiple of 32")
    if nc < 2:
        raise ValueError("nc must be at least 2")
    a = anchor_count(size)
    levels = level_slices(size)
    boxes = np.zeros((1, 4, a), np.float32)
    for level, box in zip(levels, synthetic_boxes_cxcywh(size)):
        boxes[0, :, level] = np.array(box, np.float32)[:, None]
    mask0 = np.zeros((1, 1, a), np.float32)
    mask0[0, 0, levels[0]] = 1.0
    mask1 = np.zeros((1, 1, a), np.float32)
    mask1[0, 0, levels[1]] = 1.0
    zero = np.zeros((1, 1, a), np.float32)

    def i64(name, values):
        return numpy_helper.from_array(np.array(values, np.int64), name)

    inits = [
        numpy_helper.from_array(boxes, "BOXES"),
        numpy_helper.from_array(mask0, "MASK0"),
        numpy_helper.from_array(mask1, "MASK1"),
        i64("c0_start", [0]), i64("c0_end", [1]),
        i64("c2_start", [2]), i64("c2_end", [3]),
        i64("axis1", [1]), i64("axis0", [0]),
        i64("tail_shape", [4, a]),
    ]
    nodes = [
        helper.make_node("Slice", ["images", "c0_start", "c0_end", "axis1"], ["red"]),
        helper.make_node("Slice", ["images", "c2_start", "c2_end", "axis1"], ["blue"]),
        helper.make_node("ReduceMean", ["red"], ["red_mean4"], axes=[1, 2, 3], keepdims=1),
        helper.make_node("ReduceMean", ["blue"], ["blue_mean4"], axes=[1, 2, 3], keepdims=1),
        # [N,1,1,1] -> [N,1,1]
        helper.make_node("Squeeze", ["red_mean4", "axis1"], ["red_mean"]),
        helper.make_node("Squeeze", ["blue_mean4", "axis1"], ["blue_mean"]),
        helper.make_node("Mul", ["red_mean", "MASK0"], ["cls0"]),
        helper.make_node("Mul", ["blue_mean", "MASK1"], ["cls1"]),
        helper.make_node("Shape", ["images"], ["in_shape"]),
        helper.make_node("Slice", ["in_shape", "c0_start", "c0_end", "axis0"], ["n"]),
        helper.make_node("Concat", ["n", "tail_shape"], ["box_shape"], axis=0),
        helper.make_node("Expand", ["BOXES", "box_shape"], ["boxes"]),
    ]
    class_outputs = ["cls0", "cls1"]
    if nc > 2:
        inits.append(numpy_helper.from_array(zero, "ZERO"))
    for k in range(2, nc):
        nodes.append(helper.make_node("Mul", ["red_mean", "ZERO"], [f"cls{k}"]))
        class_outputs.append(f"cls{k}")
    nodes.append(helper.make_node("Concat", ["boxes", *class_outputs], ["output0"], axis=1))
    graph = helper.make_graph(
        nodes, "colour_meter",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [batch, 3, size, size])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, [batch, 4 + nc, a])],
        initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="yoloedge-tests")
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    return model


def make_dynamic_batch_v8_model(path, size: int = 64, nc: int = 2) -> Path:
    """The colour-meter model (module docstring) with a dynamic batch axis named "batch"."""
    path = Path(path)
    onnx.save(_colour_meter_graph(size, nc, "batch"), str(path))
    return path


def make_fixed_batch_v8_model(path, size: int = 64, nc: int = 2, batch: int = 1) -> Path:
    """The colour-meter model with a static batch axis (1 unless `batch` says otherwise)."""
    path = Path(path)
    onnx.save(_colour_meter_graph(size, nc, int(batch)), str(path))
    return path


def expected_scores(input_batch: np.ndarray) -> np.ndarray:
    """[N, 2]: what the colour meter scores for classes 0 and 1, computed with numpy."""
    x = np.asarray(input_batch, np.float64)
    return np.stack([x[:, 0].mean(axis=(1, 2)), x[:, 2].mean(axis=(1, 2))], axis=1)


def _drop_unused_constants(graph: onnx.GraphProto) -> None:
    used = {name for node in graph.node for name in node.input}
    used.update(o.name for o in graph.output)
    keep = [node for node in graph.node if node.op_type != "Constant" or node.output[0] in used]
    del graph.node[:]
    graph.node.extend(keep)
    inits = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(inits)


# -- real models ----------------------------------------------------------------------------------
def _downstream_of(graph: onnx.GraphProto, sources: set[str]) -> set[str]:
    """Names of all tensors that depend on any of `sources` (nodes are topologically sorted)."""
    reached = set(sources)
    for node in graph.node:
        if any(i in reached for i in node.input if i):
            reached.update(o for o in node.output if o)
    return reached


def make_dynamic_batch_copy_of(src, dst, dim_param: str = "batch") -> Path:
    """Copy an Ultralytics-style batch-1 ONNX model to `dst` with a dynamic batch axis.

    Returns `dst`. Raises ValueError when a Reshape that carries the image batch has a shape that
    is not a constant starting with 1 (so the batch cannot be freed this simple way).
    """
    model = onnx.load(str(src))
    graph = model.graph
    init_names = {i.name for i in graph.initializer}
    image_inputs = {i.name for i in graph.input if i.name not in init_names}
    for vi in list(graph.input) + list(graph.output):
        if vi.name in init_names:
            continue
        dim = vi.type.tensor_type.shape.dim[0]
        dim.Clear()
        dim.dim_param = dim_param
    del graph.value_info[:]

    carries_batch = _downstream_of(graph, image_inputs)
    initializers = {i.name: i for i in graph.initializer}
    constants = {n.output[0]: n for n in graph.node if n.op_type == "Constant"}
    uses: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1

    for node in graph.node:
        if node.op_type != "Reshape" or node.input[0] not in carries_batch:
            continue
        shape_name = node.input[1]
        if shape_name in initializers:
            tensor = initializers[shape_name]
        elif shape_name in constants and constants[shape_name].attribute[0].name == "value":
            tensor = constants[shape_name].attribute[0].t
        else:
            raise ValueError(f"Reshape {node.name}: shape {shape_name} is computed, not a constant")
        shape = numpy_helper.to_array(tensor).astype(np.int64)
        if shape.size == 0 or shape[0] != 1:
            raise ValueError(f"Reshape {node.name}: shape {shape.tolist()} does not start with the batch 1")
        if any(a.name == "allowzero" and a.i for a in node.attribute):
            raise ValueError(f"Reshape {node.name} sets allowzero: 0 would mean a zero-sized axis")
        new = shape.copy()
        new[0] = 0
        new_name = f"{shape_name}__batch0"
        if uses.get(shape_name, 0) == 1 and shape_name in initializers:
            tensor.CopyFrom(numpy_helper.from_array(new, shape_name))
            continue
        if new_name not in initializers:
            t = numpy_helper.from_array(new, new_name)
            graph.initializer.append(t)
            initializers[new_name] = t
        node.input[1] = new_name

    _drop_unused_constants(graph)
    onnx.checker.check_model(model)
    dst = Path(dst)
    onnx.save(model, str(dst))
    return dst
