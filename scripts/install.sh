#!/usr/bin/env bash
# Install railover from this source tree on Debian 12 (or another apt system), as root:
#
#   ./scripts/install.sh            system packages, then the Python package; then: railover demo
#   ./scripts/install.sh --test     also the test tools; then: python3 -m pytest -q -ra tests
#
# 1. apt-get installs the Debian packages listed in src/railover/prereqs.py (the one list:
#    iproute2, nftables, iperf3, ..., the compiler and cmake that build the plugin, QEMU and
#    rdma-core for the RDMA test bed, and with --test GoogleTest, binutils and clang). python3 itself is installed first when missing.
# 2. pip installs this tree into $PYTHON (default: python3), which builds the plugin and
#    railover-perf (scikit-build-core + cmake); with --test the [test] extra (pytest, pytest-timeout).
#    Debian's own python3 refuses pip installs (PEP 668, "externally-managed-environment").
#    For that interpreter only, the script passes --break-system-packages: pip then installs
#    into /usr/local/lib/python3.X/dist-packages and the railover command into /usr/local/bin,
#    and leaves the packages apt manages in /usr/lib/python3 alone. To keep it out of the
#    system interpreter, point PYTHON at a virtual environment's python instead.
#
# Options: --test; --no-apt (the system packages are there already, or not an apt system:
# install the packages named by 'python3 src/railover/prereqs.py --packages run build rdma');
# -h/--help. Environment: PYTHON (interpreter to install into).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3}
TEST=0 APT=1
for arg in "$@"; do
  case "$arg" in
    --test) TEST=1 ;;
    --no-apt) APT=0 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install.sh: unknown option '$arg' (see --help)" >&2; exit 2 ;;
  esac
done
groups=(python run build rdma); [ "$TEST" = 1 ] && groups+=(test)

if [ "$APT" = 1 ]; then
  if ! command -v apt-get >/dev/null; then
    echo "install.sh: no apt-get here; install the equivalents of these Debian packages yourself," \
         "then rerun with --no-apt: $(python3 "$ROOT/src/railover/prereqs.py" --packages "${groups[@]}" 2>/dev/null | tr '\n' ' ')" >&2
    exit 2
  fi
  if [ "$(id -u)" != 0 ]; then
    echo "install.sh: apt-get needs root: run it as root (railover's test bed and demo need root too)," \
         "or install the packages yourself and rerun with --no-apt" >&2
    exit 2
  fi
  export DEBIAN_FRONTEND=noninteractive
  echo "== apt-get update"
  apt-get update -qq
  if ! command -v python3 >/dev/null; then  # the package list is read with python3
    echo "== apt-get install python3"
    apt-get install -y -qq --no-install-recommends python3 >/dev/null
  fi
  mapfile -t pkgs < <(python3 "$ROOT/src/railover/prereqs.py" --packages "${groups[@]}")
  echo "== apt-get install ${pkgs[*]}"
  apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
fi

if ! "$PYTHON" -m pip --version >/dev/null 2>&1; then
  echo "install.sh: $PYTHON has no pip module: run without --no-apt (on Debian it installs pip), or install pip for it" >&2
  exit 2
fi
pipargs=(install --progress-bar off)
if "$PYTHON" - <<'EOF'
import os, sys, sysconfig
marker = os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")
sys.exit(0 if os.path.exists(marker) and sys.prefix == sys.base_prefix else 1)
EOF
then
  echo "== $PYTHON is the system's, marked externally managed (PEP 668): installing with --break-system-packages" \
       "(into /usr/local; apt's Python packages are left alone)"
  pipargs+=(--break-system-packages)
fi
target="$ROOT"; [ "$TEST" = 1 ] && target="$ROOT[test]"
echo "== $PYTHON -m pip ${pipargs[*]} $target (builds the plugin and railover-perf)"
PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1 "$PYTHON" -m pip "${pipargs[@]}" "$target"

# pyenv puts commands on PATH through shims, made by 'pyenv rehash'.
if ! command -v railover >/dev/null && command -v pyenv >/dev/null; then pyenv rehash || true; fi
bindir=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
if command -v railover >/dev/null; then
  echo "== installed: $(command -v railover) ($(railover version)); next: railover demo"
else
  echo "== installed into $bindir, which is not on PATH: export PATH=$bindir:\$PATH (then: railover demo)"
fi
