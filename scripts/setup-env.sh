# Shared set-up for scripts/test.sh and the demo: sourced, not run.
# Creates .venv (override with YOLOEDGE_VENV) and installs the package editable with extras;
# reinstalls only when pyproject.toml changed. As root, apt-installs missing system programs.

VENV="${YOLOEDGE_VENV:-$PWD/.venv}"
# The reference ByteTrack the tracking tests compare with (later releases moved it out). Installed
# with --no-deps: its requirements name opencv-python, whose cv2 would overwrite the headless one;
# what its import needs comes with the dev extra (pyproject.toml).
REFERENCE_TRACKER="supervision==0.26.1"

# Debian packages the tests and the demo need (broker, RTSP server, systemd container tooling).
SYSTEM_PACKAGES=(
  mosquitto mosquitto-clients openssl
  python3-gi gir1.2-gst-rtsp-server-1.0 gstreamer1.0-tools gstreamer1.0-plugins-base
  gstreamer1.0-plugins-good gstreamer1.0-plugins-bad gstreamer1.0-rtsp gstreamer1.0-libav
  libgirepository1.0-dev libcairo2-dev
  systemd systemd-container
  chromium
)

ensure_system_packages() {
  local missing=() pkg
  command -v dpkg-query >/dev/null 2>&1 || { echo "warning: not a Debian system; install ${SYSTEM_PACKAGES[*]} yourself" >&2; return 0; }
  for pkg in "${SYSTEM_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    echo "error: missing system packages: ${missing[*]}" >&2
    echo "       install them with: sudo apt-get install -y ${missing[*]}" >&2
    return 1
  fi
  echo "installing system packages: ${missing[*]}" >&2
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
}

ensure_venv() {
  local extras="${1:-}" stamp
  if [ ! -x "$VENV/bin/python" ]; then
    if ! python3 -c "import ensurepip, venv" >/dev/null 2>&1; then
      # Debian and Ubuntu ship venv support separately.
      local saved=("${SYSTEM_PACKAGES[@]}")
      SYSTEM_PACKAGES=(python3-venv)
      ensure_system_packages || return 1
      SYSTEM_PACKAGES=("${saved[@]}")
    fi
    echo "creating virtual environment $VENV" >&2
    python3 -m venv "$VENV"
  fi
  stamp="$VENV/.yoloedge-installed-${extras:-base}"
  if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    echo "installing yoloedge${extras:+[$extras]} into $VENV" >&2
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e ".${extras:+[$extras]}" >&2
    if [[ ",$extras," == *",dev,"* ]]; then
      "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps "$REFERENCE_TRACKER" >&2
    fi
    touch "$stamp"
  fi
}
