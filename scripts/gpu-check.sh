#!/usr/bin/env bash
# The prepared GPU check: on a machine with an NVIDIA GPU, runs in a few minutes and proves what the
# test suite can only prove on fakes (see scripts/gpu_check.py for the parts). Prints a table; exits
# 1 on a mismatch or failure, 0 otherwise (parts whose library is absent are skipped).
#
#   scripts/gpu-check.sh                 # the real GPU; ../shared next to the repository
#   scripts/gpu-check.sh --fakes         # no GPU: every part on the test fakes (checks the script)
#   scripts/gpu-check.sh --skip jpeg     # leave parts out: cuda,tensorrt,jpeg,onnxruntime
#
# Python: $PYTHON, else the repository's .venv, else python3. On the GPU machine, install what is
# to be checked into it first, e.g. `pip install -e '.[jetson]' onnxruntime-gpu nvidia-nvimgcodec-cu12`.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-}"
if [ -z "$python" ]; then
  if [ -x .venv/bin/python ]; then python=.venv/bin/python; else python=python3; fi
fi
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader || true
fi
exec "$python" scripts/gpu_check.py "$@"
