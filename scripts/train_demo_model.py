#!/usr/bin/env python3
"""Train the demo model on synthetic shapes and export it to yoloedge/demo/ (model.onnx, labels.txt).

Reproducible: the data set comes from `demo_data.make_dataset` with a fixed seed, and Ultralytics
trains with `seed` and `deterministic=True` on the CPU. Nothing is downloaded: the model is built
from the YOLOv8 architecture file that ships inside the ultralytics package (no pretrained weights),
with narrower width multipliers than YOLOv8n so the ONNX file stays under 6 MB; the AMP check, plots
(and their font), analytics and automatic `pip install`s are switched off, and a socket guard refuses
every connection to anything but loopback and lists, at the end, whatever tried.

Needs a separate environment with the training tools, NOT yoloedge's runtime one, e.g.:

    python3 -m venv ../train-venv
    ../train-venv/bin/pip install torch==2.14.1 torchvision==0.29.1
    ../train-venv/bin/pip install ultralytics==8.4.190 onnx onnxslim onnxruntime

    nice -n 19 ../train-venv/bin/python scripts/train_demo_model.py      # see docs/demo-model.md

The data set and Ultralytics' run directory go to --work-dir (outside the repository); only the
exported model and its labels are written into the repository (--out). The script prints the final
validation mAP50 and mAP50-95 and the elapsed time.
"""

from __future__ import annotations

import argparse
import copy
import ipaddress
import json
import os
import resource
import shutil
import socket
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import demo_data  # noqa: E402

# -- network guard ------------------------------------------------------------------------------

BLOCKED: list[str] = []


def _caller() -> str:
    """The innermost ultralytics (or torch) function on the stack, to say who tried."""
    import traceback

    for frame in reversed(traceback.extract_stack()[:-3]):
        if "/ultralytics/" in frame.filename or "/torch/" in frame.filename:
            mod = frame.filename.split("site-packages/")[-1]
            return f" (from {mod}:{frame.lineno} {frame.name})"
    return ""


def _loopback(host) -> bool:
    if host in (None, "", "localhost"):
        return True
    try:
        return ipaddress.ip_address(str(host).split("%")[0]).is_loopback
    except ValueError:
        return False


def install_network_guard() -> None:
    """Refuse (and record) every DNS look-up and connection that is not to loopback.

    Installed before ultralytics is imported, inherited by forked data-loader workers. Unix sockets
    (multiprocessing) are untouched.
    """
    real_getaddrinfo = socket.getaddrinfo
    real_connect = socket.socket.connect
    real_connect_ex = socket.socket.connect_ex

    def getaddrinfo(host, *args, **kwargs):
        h = host.decode() if isinstance(host, bytes) else host
        if not _loopback(h):
            BLOCKED.append(f"DNS {h}{_caller()}")
            raise socket.gaierror(socket.EAI_NONAME, f"network disabled for training: {h}")
        return real_getaddrinfo(host, *args, **kwargs)

    def check(sock, address):
        if sock.family in (socket.AF_INET, socket.AF_INET6) and not _loopback(address[0]):
            BLOCKED.append(f"connect {address[0]}:{address[1]}{_caller()}")
            raise ConnectionRefusedError(f"network disabled for training: {address[0]}")

    def connect(self, address):
        check(self, address)
        return real_connect(self, address)

    def connect_ex(self, address):
        check(self, address)
        return real_connect_ex(self, address)

    socket.getaddrinfo = getaddrinfo
    socket.socket.connect = connect
    socket.socket.connect_ex = connect_ex


# -- model --------------------------------------------------------------------------------------

def write_model_yaml(path: Path, nc: int, depth: float, width: float, max_channels: int) -> Path:
    """YOLOv8's own architecture file (from the ultralytics package), with our class count and scale."""
    import yaml
    from ultralytics.utils import ROOT

    cfg = yaml.safe_load((ROOT / "cfg" / "models" / "v8" / "yolov8.yaml").read_text())
    cfg = copy.deepcopy(cfg)
    cfg["nc"] = nc
    cfg["scale"] = "n"
    cfg["scales"] = {"n": [depth, width, max_channels]}
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def pin_spatial_axes(src: Path, dst: Path, imgsz: int) -> None:
    """Keep only the batch axis dynamic: input (batch, 3, imgsz, imgsz), output (batch, 4+nc, anchors)."""
    import onnx
    import onnxslim

    model = onnx.load(str(src))
    (inp,) = model.graph.input
    dims = inp.type.tensor_type.shape.dim
    for axis in (2, 3):
        dims[axis].Clear()
        dims[axis].dim_value = imgsz
    anchors = sum((imgsz // s) ** 2 for s in (8, 16, 32))
    for out in model.graph.output:
        odims = out.type.tensor_type.shape.dim
        odims[2].Clear()
        odims[2].dim_value = anchors
    model = onnxslim.slim(model)  # folds the shape arithmetic the fixed sizes make constant
    onnx.checker.check_model(model)
    (inp,) = model.graph.input
    batch = inp.type.tensor_type.shape.dim[0]
    assert batch.dim_param and not batch.dim_value, "the batch axis must stay dynamic"
    onnx.save(model, str(dst))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--work-dir", default="/tmp/yoloedge-demo-train",
                   help="data set and training runs (outside the repository)")
    p.add_argument("--out", default=str(REPO / "yoloedge" / "demo"), help="where model.onnx and labels.txt go")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train", type=int, default=2000, help="training images")
    p.add_argument("--val", type=int, default=300, help="validation images")
    p.add_argument("--imgsz", type=int, default=320)
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr0", type=float, default=0.002, help="AdamW learning rate")
    p.add_argument("--workers", type=int, default=2, help="data-loader processes (Ultralytics uses 0 on the CPU)")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--depth", type=float, default=0.33, help="depth multiplier (YOLOv8n: 0.33)")
    p.add_argument("--width", type=float, default=0.1875, help="width multiplier (YOLOv8n: 0.25)")
    p.add_argument("--max-channels", type=int, default=512, help="channel cap before width (YOLOv8n: 1024)")
    p.add_argument("--max-mb", type=float, default=6.0, help="fail if the ONNX file is larger")
    args = p.parse_args(argv)
    start = time.monotonic()

    work = Path(args.work_dir).resolve()
    if work == REPO or REPO in work.parents:
        p.error("--work-dir must be outside the repository")
    work.mkdir(parents=True, exist_ok=True)

    install_network_guard()
    os.environ["YOLO_OFFLINE"] = "1"  # ultralytics: no online check, so no download attempts
    os.environ["YOLO_AUTOINSTALL"] = "false"  # ultralytics: never pip install a missing requirement
    os.environ["YOLO_CONFIG_DIR"] = str(work / "config")  # its settings.json, not in ~/.config
    os.environ.setdefault("MPLBACKEND", "Agg")
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))

    # 1. data: regenerated only when its parameters change
    data_dir = work / "data"
    stamp = {"seed": args.seed, "train": args.train, "val": args.val, "imgsz": args.imgsz,
             "generator": _digest(HERE / "demo_data.py")}
    stamp_file = data_dir / "stamp.json"
    if not stamp_file.exists() or json.loads(stamp_file.read_text()) != stamp:
        shutil.rmtree(data_dir, ignore_errors=True)
        t = time.monotonic()
        data_yaml = demo_data.make_dataset(data_dir, args.train, args.val, args.imgsz, args.seed)
        stamp_file.write_text(json.dumps(stamp))
        print(f"data set: {args.train} train + {args.val} val images in {data_dir} "
              f"({time.monotonic() - t:.0f} s)", flush=True)
    else:
        data_yaml = data_dir / "data.yaml"
        print(f"data set: reusing {data_dir}", flush=True)

    import torch
    from ultralytics import YOLO
    from ultralytics.utils import SETTINGS

    SETTINGS.update({"sync": False, "clearml": False, "comet": False, "dvc": False, "mlflow": False,
                     "raytune": False, "tensorboard": False, "wandb": False,
                     "datasets_dir": str(work / "datasets"), "weights_dir": str(work / "weights"),
                     "runs_dir": str(work / "runs")})
    torch.set_num_threads(args.threads)
    # Checking a data set fetches a plotting font (Arial.ttf) from GitHub when it is not on the
    # machine; plots are off, so skip that look-up rather than have the guard refuse it.
    import ultralytics.data.utils as data_utils

    data_utils.check_font = lambda *a, **k: None

    # 2. train from scratch
    # (Ultralytics picks the model class by file name: one with "yoloe" in it would be a YOLOE model)
    model_yaml = write_model_yaml(work / "demo-shapes-yolov8.yaml", len(demo_data.NAMES),
                                  args.depth, args.width, args.max_channels)
    model = YOLO(str(model_yaml), task="detect")
    t = time.monotonic()
    model.train(
        data=str(data_yaml), epochs=args.epochs, imgsz=args.imgsz, batch=args.batch, device="cpu",
        workers=args.workers, seed=args.seed, deterministic=True, pretrained=False, amp=False,
        optimizer="AdamW", lr0=args.lr0, nbs=args.batch,  # an optimizer step every batch (no accumulation)
        plots=False, project=str(work / "runs"), name="train", exist_ok=True, cache="disk",
        warmup_epochs=1, close_mosaic=max(1, args.epochs // 6), patience=args.epochs, verbose=True,
        fliplr=0.5, flipud=0.0, degrees=0.0, hsv_h=0.2, hsv_s=0.5, hsv_v=0.4, mosaic=1.0, mixup=0.0)
    train_s = time.monotonic() - t
    best = work / "runs" / "train" / "weights" / "best.pt"

    # 3. final validation of the weights that are exported
    final = YOLO(str(best), task="detect")
    metrics = final.val(data=str(data_yaml), imgsz=args.imgsz, batch=args.batch, device="cpu",
                        plots=False, workers=args.workers, project=str(work / "runs"), name="val",
                        exist_ok=True, verbose=False)
    map50, map5095 = float(metrics.box.map50), float(metrics.box.map)

    # 4. export: ONNX with a dynamic batch axis, simplified by onnxslim (offline). Ultralytics'
    #    dynamic=True makes height, width and the anchor count dynamic too; they are pinned back to
    #    the training size so the output layout can be recognised from its shape (1, 4+nc, anchors).
    onnx_file = Path(final.export(format="onnx", dynamic=True, simplify=True, imgsz=args.imgsz,
                                  device="cpu", batch=1))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pin_spatial_axes(onnx_file, out / "model.onnx", args.imgsz)
    (out / "labels.txt").write_text("".join(n + "\n" for n in demo_data.NAMES))
    size_mb = (out / "model.onnx").stat().st_size / 1e6

    elapsed = time.monotonic() - start
    print()
    print(f"model: {out / 'model.onnx'} ({size_mb:.2f} MB), labels: {out / 'labels.txt'}")
    print(f"final val mAP50: {map50:.4f}")
    print(f"final val mAP50-95: {map5095:.4f}")
    print(f"training time: {train_s / 60:.1f} min ({args.epochs} epochs); "
          f"elapsed time: {elapsed / 60:.1f} min (data + training + val + export)")
    cpu = resource.getrusage(resource.RUSAGE_SELF)
    print(f"CPU time: {(cpu.ru_utime + cpu.ru_stime) / 60:.1f} min over {os.cpu_count()} cores "
          f"(the wall time above depends on what else the machine runs)")
    print("network attempts blocked: " + ("; ".join(sorted(set(BLOCKED))) if BLOCKED else "none"))
    if size_mb > args.max_mb:
        print(f"error: the model is {size_mb:.2f} MB, over {args.max_mb} MB", file=sys.stderr)
        return 1
    return 0


def _digest(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


if __name__ == "__main__":
    raise SystemExit(main())
