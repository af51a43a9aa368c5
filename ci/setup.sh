#!/usr/bin/env bash
# Set up netcl on this machine: install the Python package and an OpenCL driver that runs it fast.
#
#   bash ci/setup.sh [--driver pocl-debian|pocl-wheel|intel] [--with-oclgrind] [--no-package]
#
# Without --driver: a working GPU is kept as it is (netcl's default is the first GPU). On a CPU-only
# machine every CPU driver that works or can be installed is tried:
#   pocl-debian  Debian's pocl-opencl-icd (apt, needs root; kept if already installed),
#   intel        Intel's OpenCL CPU runtime from PyPI (intel-opencl-rt, intel-cmplr-lib-rt, tbb 2023),
#   pocl-wheel   the PoCL wheel from PyPI (pocl-binary-distribution),
# then `netcl devices --bench` measures netcl's GEMM (512^3 float32) and copy bandwidth on each device and
# stores the figures; nc.default_device() then picks the fastest measured device. The script prints the
# figures, what it chose and why. The PoCL wheel is removed again unless it is the fastest: it shares
# PoCL's platform name with Debian's PoCL and ran netcl up to 7x slower on the same CPU
# (docs/howto/devices-and-drivers.md).
# With --driver NAME only that driver is installed (then measured the same way).
#
# Intel's runtime is made visible through an OpenCL vendors directory that this script writes under
# netcl's configuration directory ($NETCL_CONFIG_DIR, else ~/.config/netcl): opencl/vendors/ holds an
# .icd naming the installed libintelocl.so next to copies of the system's .icd files (OCL_ICD_VENDORS
# replaces /etc/OpenCL/vendors, it does not add to it), and opencl/env.sh exports OCL_ICD_VENDORS and
# LD_LIBRARY_PATH for other OpenCL programs (`source ~/.config/netcl/opencl/env.sh`). netcl itself uses
# the directory without sourcing anything whenever OCL_ICD_VENDORS is unset. Re-run this script after
# installing another driver system-wide, so that the directory holds its .icd too.
#
# Options: --with-oclgrind also installs the Oclgrind simulator (Debian package) for ci/oclgrind.sh;
#          --no-package skips installing netcl itself (its dependencies are still installed).
# Environment: PYTHON (default python3) is the interpreter to install into.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
with_oclgrind=0
install_package=1
driver=""
while [ "$#" -gt 0 ]; do
  case "$1" in
    --with-oclgrind) with_oclgrind=1 ;;
    --no-package) install_package=0 ;;
    --driver) shift; driver=${1:-} ;;
    --driver=*) driver=${1#--driver=} ;;
    -h|--help) sed -n '2,29p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
case "$driver" in
  ""|pocl-debian|pocl-wheel|intel) ;;
  *) echo "setup.sh: unknown driver '$driver' (pocl-debian, pocl-wheel or intel)" >&2; exit 2 ;;
esac

say() { printf '[netcl setup] %s\n' "$*"; }
pip_install() { "$PYTHON" -m pip install --disable-pip-version-check -q "$@"; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

can_apt() { command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; }
apt_updated=0
apt_install() {
  if [ "$apt_updated" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
    apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

config_dir=$("$PYTHON" -c 'import os, pathlib
c = os.environ.get("NETCL_CONFIG_DIR")
if not c:
    try:
        from platformdirs import user_config_dir
        c = user_config_dir("netcl", appauthor=False)
    except ImportError:
        c = pathlib.Path.home() / ".config" / "netcl"
print(pathlib.Path(c).expanduser())' 2>/dev/null || echo "$HOME/.config/netcl")
vendors="$config_dir/opencl/vendors"
system_vendors=/etc/OpenCL/vendors

if [ "$install_package" = 1 ]; then
  say "installing netcl and its test dependencies"
  pip_install -e ".[test]"
else
  pip_install pyopencl numpy mako tqdm platformdirs
fi

# probe [--all] [--kind gpu]: the working devices as the ICD loader sees them with the current environment
probe() { "$PYTHON" ci/probe_device.py "$@" 2>"$work/probe.log"; }
probe_reason() { tail -n 1 "$work/probe.log" 2>/dev/null; }
# probe_only DIR [...]: the devices of the .icd files in DIR alone (plus the PoCL wheel, which pyopencl's
# bundled loader always adds)
probe_only() { local dir=$1; shift; OCL_ICD_VENDORS="$dir" probe "$@"; }

install_pocl_debian() {
  if [ -f "$system_vendors/pocl.icd" ]; then say "Debian's PoCL is installed"; return 0; fi
  if ! can_apt; then say "cannot install Debian's PoCL here (needs root and apt-get)"; return 1; fi
  say "installing Debian's pocl-opencl-icd (apt)"
  apt_install pocl-opencl-icd ocl-icd-libopencl1 || { say "apt could not install pocl-opencl-icd"; return 1; }
}

# Registers the installed libintelocl.so in $vendors (with copies of the system's .icd files) and writes
# env.sh. The wheel's own .icd names a build machine's placeholder path, so it cannot be used as it is.
install_intel() {
  say "installing Intel's OpenCL CPU runtime from PyPI (intel-opencl-rt, intel-cmplr-lib-rt, tbb 2023)"
  if ! pip_install intel-opencl-rt intel-cmplr-lib-rt "tbb==2023.*" 2>"$work/pip-intel.log"; then
    say "pip could not install Intel's runtime: $(tail -n 1 "$work/pip-intel.log")"; return 1
  fi
  local lib
  lib=$("$PYTHON" -c 'import importlib.metadata as m
d = m.distribution("intel-opencl-rt")
print(next(str(d.locate_file(f).resolve()) for f in d.files if f.name == "libintelocl.so"))' 2>/dev/null) || {
    say "installed intel-opencl-rt holds no libintelocl.so"; return 1; }
  mkdir -p "$vendors"
  rm -f "$vendors"/*.icd
  for icd in "$system_vendors"/*.icd; do [ -e "$icd" ] && cp "$icd" "$vendors/"; done
  echo "$lib" > "$vendors/intel-cpu-netcl.icd"
  cat > "$config_dir/opencl/env.sh" <<ENV
# Written by netcl's ci/setup.sh: the OpenCL drivers it installed, for any OpenCL program.
# (netcl uses $vendors by itself whenever OCL_ICD_VENDORS is unset.)
export OCL_ICD_VENDORS="$vendors"
export LD_LIBRARY_PATH="$(dirname "$lib")\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
ENV
  say "registered $lib in $vendors (environment for other programs: source $config_dir/opencl/env.sh)"
  mkdir -p "$work/intel-only" && cp "$vendors/intel-cpu-netcl.icd" "$work/intel-only/"
  # The probe's whole output is read before it is searched: the PoCL wheel, when installed, is listed too,
  # and a reader that stops at the first match would break the probe's pipe.
  if probe_only "$work/intel-only" --all > "$work/intel.json" && grep -q '"Intel(R) OpenCL"' "$work/intel.json"; then
    return 0
  fi
  say "Intel's runtime does not run a kernel here ($(probe_reason)); unregistering it"
  rm -f "$vendors/intel-cpu-netcl.icd"
  return 1
}

install_pocl_wheel() {
  say "installing the PoCL wheel from PyPI (pocl-binary-distribution)"
  if ! pip_install pocl-binary-distribution 2>/dev/null; then say "pip could not install the PoCL wheel"; return 1; fi
  mkdir -p "$work/none"
  if probe_only "$work/none" --all > "$work/wheel.json"; then return 0; fi
  say "the PoCL wheel does not run a kernel here ($(probe_reason)); removing it"
  "$PYTHON" -m pip uninstall -y -q pocl-binary-distribution >/dev/null 2>&1 || true
  return 1
}

no_driver_help() {
  cat >&2 <<'MSG'
[netcl setup] ERROR: no working OpenCL device, and this script could not install one.
  Install an OpenCL driver yourself, then run this script again:
    - Debian/Ubuntu:   sudo apt-get install pocl-opencl-icd      (a CPU device)
    - Fedora:          sudo dnf install pocl
    - conda:           conda install -c conda-forge pocl
    - NVIDIA/AMD/Intel GPUs: the vendor's driver ships an OpenCL ICD.
  Check with: python ci/probe_device.py
MSG
}

# Measure every device, store the figures, and report the default that follows from them.
measure_and_choose() {
  say "measuring netcl's GEMM (512^3 float32) and copy bandwidth on every device (netcl devices --bench)"
  if ! env -u NETCL_DEVICE -u PYOPENCL_CTX "$PYTHON" -m netcl devices --bench --json > "$work/devices.json" \
      2> "$work/bench.log"; then
    cat "$work/bench.log" >&2; say "WARNING: the measurement failed; the default stays the first device"; return 0
  fi
  "$PYTHON" - "$work/devices.json" "$work/wheel.json" <<'PY'
import json, sys
devices = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])["devices"]
try:
    wheel = {json.loads(l)["platform_version"] for l in open(sys.argv[2]) if l.strip()}
except OSError:
    wheel = set()
say = lambda s: print(f"[netcl setup] {s}")
def label(d):
    driver = "PoCL wheel" if d["platform_version"] in wheel else d["platform"]
    return f"[{d['index']}] {driver} / {d['name']} ({d['platform_version'].split('  ')[0]})"
for d in devices:
    measured = d.get("gemm_gflops") is not None
    say(f"  {label(d)}: " + (f"GEMM {d['gemm_gflops']:.1f} GFLOP/s, copy {d['copy_gbps']:.1f} GB/s" if measured
                             else "not measured"))
chosen = next(d for d in devices if d["default"])
rated = sorted((d for d in devices if d.get("gemm_gflops")), key=lambda d: -d["gemm_gflops"])
if chosen["kind"] == "gpu":
    say(f"default: {label(chosen)}, the first GPU")
elif rated and chosen is rated[0]:
    others = ", ".join(f"{r['gemm_gflops'] / chosen['gemm_gflops']:.2f}x on {label(r)}" for r in rated[1:])
    say(f"default: {label(chosen)}, the fastest measured device" + (f" (the others: {others})" if others else ""))
else:
    say(f"default: {label(chosen)}")
with open(sys.argv[1] + ".wheel_loses", "w") as f:
    f.write("1" if wheel and chosen["platform_version"] not in wheel else "0")
PY
}

if [ -n "$driver" ]; then
  case "$driver" in
    pocl-debian) install_pocl_debian && probe_only "$system_vendors" >/dev/null || {
                   say "ERROR: Debian's PoCL does not work here ($(probe_reason))"; exit 1; } ;;
    intel)       install_intel || { say "ERROR: Intel's runtime cannot be installed or does not work"; exit 1; } ;;
    pocl-wheel)  install_pocl_wheel || { say "ERROR: the PoCL wheel cannot be installed or does not work"; exit 1; } ;;
  esac
  say "$driver works"
  measure_and_choose
elif gpu=$(probe --kind gpu); then
  say "OpenCL GPU OK: $gpu; keeping it (netcl's default is the first GPU)"
else
  working=0
  install_pocl_debian && probe_only "$system_vendors" >/dev/null && working=$((working + 1)) || true
  install_intel && working=$((working + 1)) || true
  install_pocl_wheel && working=$((working + 1)) || true
  if [ "$working" = 0 ] && ! probe >/dev/null; then no_driver_help; exit 1; fi
  measure_and_choose
  if [ "$(cat "$work/devices.json.wheel_loses" 2>/dev/null)" = 1 ]; then
    say "removing the PoCL wheel: another driver ran netcl's GEMM faster (see above)"
    "$PYTHON" -m pip uninstall -y -q pocl-binary-distribution >/dev/null 2>&1 || true
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
