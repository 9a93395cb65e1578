"""`yoloedge quantize`: a float ONNX model -> static INT8 (QDQ), and how far its boxes drift.

ONNX Runtime's quantizer does the quantizing; what this package adds is what makes the result
trustworthy for this project: calibration tensors made by the project's own letterbox (so the
ranges are those of what inference feeds), a report of how the INT8 model's boxes agree with the
float model's on frames it was not calibrated on, the speed of both measured in one run, and the
calibration inputs other toolchains take (TensorRT's calibration table, AMCT's .bin tensors).

    frames     -- the frames of a folder of images or a video, split into calibration and held-out
    cameras    -- the same from the configured cameras, read with the daemon's sources (--cameras)
    agreement  -- precision, recall and mAP@0.5 of one set of boxes against another (VOC all-points)
    calibrate  -- the calibration reader, the quantizer call, the TensorRT table, the AMCT input
    workflow   -- the whole run: quantize, compare, time; its `Report`
"""
