#!/usr/bin/env bash
# See yoloedge work: the daemon on the CPU with the demo model and demo camera, a local MQTT broker
# on a free port, and the detections printed as they arrive, then `yoloedge-ctl status`.
# Does its own set-up (.venv, pip install, and as root apt-get install mosquitto when missing).
# Runs until Ctrl-C, or for N seconds with --seconds N. Other options: .venv/bin/yoloedge demo --help
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup-env.sh
SYSTEM_PACKAGES=(mosquitto)
ensure_system_packages
ensure_venv
exec "$VENV/bin/yoloedge" demo "$@"
