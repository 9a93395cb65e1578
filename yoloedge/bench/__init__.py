"""`yoloedge bench`: figures side by side, measured in one run (not tests; CI never times anything).

* `micro`    letterbox and decode + NMS against plain OpenCV/NumPy, cv2.dnn and torchvision;
* `model`    our `detect()` against the bare ONNX Runtime session;
* `pipeline` the real daemon (readers -> batching -> workers -> post -> MQTT to a private mosquitto)
             feeding a simulated device, against the host's own decode + letterbox ceiling;
* `e2e`      the daemon on ONNX Runtime CPU against a bare `session.run` loop (and Ultralytics).
"""
