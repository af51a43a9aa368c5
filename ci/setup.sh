#!/usr/bin/env bash
# Set up netcl on this machine: install the Python package, then make sure an OpenCL device can build and
# run a kernel, installing one if none can:
#   1. keep whatever driver already works (a GPU vendor driver, an existing PoCL): nothing to do;
#   2. else try the PoCL wheel from PyPI (pocl-binary-distribution) and verify it;
#   3. else (the 3.0 wheel fails on some CPUs with "unknown target CPU 'generic'") remove it again and
#      install Debian's pocl-opencl-icd with apt.
# Options: --with-oclgrind also installs the Oclgrind simulator (Debian package) for ci/oclgrind.sh;
#          --no-package skips installing netcl itself.
# Usage: bash ci/setup.sh [--with-oclgrind] [--no-package]
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
with_oclgrind=0
install_package=1
for arg in "$@"; do
  case "$arg" in
    --with-oclgrind) with_oclgrind=1 ;;
    --no-package) install_package=0 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done

say() { printf '[netcl setup] %s\n' "$*"; }
pip_install() { "$PYTHON" -m pip install --disable-pip-version-check -q "$@"; }

can_apt() { command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; }
apt_updated=0
apt_install() {
  if [ "$apt_updated" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
    apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

if [ "$install_package" = 1 ]; then
  say "installing netcl and its test dependencies"
  pip_install -e ".[test]"
else
  pip_install pyopencl numpy mako tqdm platformdirs
fi

# Builds and runs a kernel on every device; prints the first one that computed the right answer.
probe() {
  "$PYTHON" ci/probe_device.py 2>/tmp/netcl-probe.log
}

if dev=$(probe); then
  say "OpenCL device OK: $dev"
else
  say "no OpenCL device can build and run a kernel yet ($(tail -n 1 /tmp/netcl-probe.log 2>/dev/null))"
  say "trying the PoCL wheel (pocl-binary-distribution)"
  if pip_install pocl-binary-distribution 2>/dev/null && dev=$(probe); then
    say "OpenCL device OK with the PoCL wheel: $dev"
  else
    say "the PoCL wheel does not work here ($(tail -n 1 /tmp/netcl-probe.log 2>/dev/null)); removing it"
    "$PYTHON" -m pip uninstall -y -q pocl-binary-distribution >/dev/null 2>&1 || true
    if can_apt; then
      say "installing Debian's pocl-opencl-icd"
      apt_install pocl-opencl-icd ocl-icd-libopencl1
      if dev=$(probe); then
        say "OpenCL device OK with Debian's PoCL: $dev"
      else
        say "ERROR: even Debian's PoCL cannot run a kernel here:"; cat /tmp/netcl-probe.log >&2; exit 1
      fi
    else
      cat >&2 <<'MSG'
[netcl setup] ERROR: no working OpenCL device, and this script cannot install one (it needs root and apt-get).
  Install an OpenCL driver yourself, then run this script again:
    - Debian/Ubuntu:   sudo apt-get install pocl-opencl-icd      (a CPU device)
    - Fedora:          sudo dnf install pocl
    - conda:           conda install -c conda-forge pocl
    - NVIDIA/AMD/Intel GPUs: the vendor's driver ships an OpenCL ICD.
  Check with: python ci/probe_device.py
MSG
      exit 1
    fi
  fi
fi

if [ "$with_oclgrind" = 1 ]; then
  if command -v oclgrind >/dev/null 2>&1; then
    say "oclgrind present: $(oclgrind --version 2>&1 | head -n 1)"
  elif can_apt; then
    say "installing Debian's oclgrind"
    apt_install oclgrind || say "WARNING: could not install oclgrind; the Oclgrind job will be skipped"
  else
    say "WARNING: oclgrind is missing and cannot be installed here; the Oclgrind job will be skipped"
  fi
fi
say "done"
