#!/usr/bin/env bash
# Run the whole test suite. Does its own set-up: a virtual environment in .venv with the package
# and its dev extras, and (as root) the system programs the tests need. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup-env.sh
ensure_system_packages
ensure_venv dev
# One pytest worker per CPU core (pytest-xdist): the suite is CPU-bound (real models, real daemons),
# so two cores halve it. YOLOEDGE_TEST_WORKERS=0 runs it in one process (for -x, pdb, -s).
exec "$VENV/bin/python" -m pytest -n "${YOLOEDGE_TEST_WORKERS:-auto}" "$@"
