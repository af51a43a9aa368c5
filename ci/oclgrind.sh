#!/usr/bin/env bash
# The Oclgrind job: run the kernel-level tests (tests/oclgrind, pytest marker `oclgrind`) on the Oclgrind
# simulator with out-of-bounds, data-race and uninitialized-value checks, and fail on
#   - any Oclgrind report (each becomes a failure of the test that launched the kernel, quoting the
#     rendered source line; reports outside any test are caught from the job's stderr),
#   - any failing test (results are checked against float64 NumPy too),
#   - any __kernel in kernels/*.cl that no test ran (coverage: add a test in tests/oclgrind/).
# Prints how many kernels and template variants ran. Tiny shapes keep it within a few minutes.
#
# Usage: bash ci/oclgrind.sh [extra pytest arguments, e.g. -k gemm]
# Environment: NETCL_REQUIRE_OCLGRIND=1  fail (instead of skipping) when oclgrind is not installed
#              NETCL_OCLGRIND_TIMEOUT     seconds before the job is stopped (default 1500)
#              NETCL_OCLGRIND_THREADS     Oclgrind worker threads (default: the number of cores)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

if ! command -v oclgrind >/dev/null 2>&1; then
  if [ "${NETCL_REQUIRE_OCLGRIND:-0}" = 1 ]; then
    echo "[oclgrind] ERROR: oclgrind is not installed (bash ci/setup.sh --with-oclgrind installs it)" >&2
    exit 1
  fi
  echo "[oclgrind] oclgrind is not installed (bash ci/setup.sh --with-oclgrind): skipping the Oclgrind job"
  exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Oclgrind is the only platform the wrapped process sees; the disk cache stays off so that no binary
# built for another device (or by an unchecked build) is ever loaded.
export NETCL_DEVICE=oclgrind NETCL_CACHE=0
export NETCL_OCLGRIND_REPORT="$work/coverage.json"
# a run narrowed by extra pytest arguments cannot cover every kernel
if [ "$#" = 0 ]; then export NETCL_OCLGRIND_REQUIRE_COVERAGE=1; fi
unset PYOPENCL_CTX

threads=${NETCL_OCLGRIND_THREADS:-$(nproc 2>/dev/null || echo 2)}
echo "[oclgrind] $(oclgrind --version 2>&1 | sed -n 2p); checks: api, data races, uninitialized values, memory bounds"
start=$(date +%s)
status=0
# --max-errors: Oclgrind goes silent after 1000 messages by default, which would let later tests pass unchecked;
# -o addopts=-ra: one process (the default suite's addopts add pytest-xdist workers, whose reports and
# kernel coverage this job could not gather);
# --global-mem-size: the tests keep every buffer alive (see tests/oclgrind/conftest.py), 128 MiB is too little
# (the value is read as a 32-bit number: 4 GiB wraps to 0)
timeout "${NETCL_OCLGRIND_TIMEOUT:-1500}" \
  oclgrind --check-api --data-races --uninitialized --max-errors 1000000000 --num-threads "$threads" \
    --global-mem-size 2000000000 \
  "$PYTHON" -m pytest -q -o addopts=-ra -m oclgrind tests/oclgrind -p no:cacheprovider "$@" \
  2> >(tee "$work/stderr.log" >&2) || status=$?
wait  # for tee
elapsed=$(( $(date +%s) - start ))

if [ "$status" = 124 ]; then
  echo "[oclgrind] FAILED: the job ran out of time (NETCL_OCLGRIND_TIMEOUT=${NETCL_OCLGRIND_TIMEOUT:-1500}s)" >&2
fi
if ! "$PYTHON" tests/oclgrind/oclgrind_reports.py "$work/stderr.log" > "$work/stray.txt"; then
  echo "[oclgrind] FAILED: Oclgrind reported problems outside any test:" >&2
  head -c 20000 "$work/stray.txt" >&2
  [ "$status" = 0 ] && status=1
fi
if [ -f "$work/coverage.json" ]; then
  "$PYTHON" - "$work/coverage.json" "$elapsed" "${NETCL_OCLGRIND_REQUIRE_COVERAGE:-0}" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"[oclgrind] {r['kernels_run']} kernels in {r['variants_run']} template variants ran under {r['device']} "
      f"({r['launches']} launches, {sys.argv[2]} s); kernels/*.cl hold {r['kernel_definitions']} __kernel definitions")
if r["never_run"]:
    required = sys.argv[3] == "1"
    print(f"[oclgrind] {'FAILED: ' if required else ''}never ran{'' if required else ' (a narrowed run)'}: "
          + ", ".join(r["never_run"]))
if r["unreferenced"]:
    print("[oclgrind] defined but named by no netcl module (dead code, not run): " + ", ".join(r["unreferenced"]))
PY
fi
if [ "$status" = 0 ]; then echo "[oclgrind] passed"; else echo "[oclgrind] FAILED (status $status)" >&2; fi
exit "$status"
