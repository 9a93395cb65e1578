#!/usr/bin/env bash
# Run the whole test suite. Does its own set-up: a virtual environment in .venv with the package
# and its dev extras, and (as root) the system programs the tests need. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup-env.sh
ensure_system_packages
ensure_venv dev
exec "$VENV/bin/python" -m pytest "$@"
