#!/usr/bin/env bash
# The GPU check: on a machine with an OpenCL GPU and no package index, run
#   1. `netcl devices --bench` (the GPU's GEMM rate and copy bandwidth, stored),
#   2. the suite's kernel tests (every op against its float64 reference) on the GPU, in parallel
#      processes where pytest-xdist is installed,
#   3. `netcl tune all --quick` (GEMM tuning and the conv planner's calibration),
#   4. benchmarks/depthwise.py (the depthwise layer against the copy kernel),
#   5. `netcl bench imagenet` once per model (a step each, so one slow model leaves the others' figures),
#      against PyTorch on the same GPU where the interpreter's PyTorch sees CUDA (NETCL_REFERENCE_DEVICE),
# each under its own time limit, then print one summary. Nothing comes from the network: runtime
# dependencies the machine lacks are installed from wheels (default shared/device-wheels, see its
# README) into a temporary folder, and NVIDIA's OpenCL library (libnvidia-opencl.so.1, which the driver
# ships without an .icd file) is registered through an .icd file in a temporary vendors folder.
#
# Usage: bash ci/device_check.sh
# Environment: NETCL_DEVICE          which device (default: gpu, the first GPU)
#              NETCL_CHECK_KIND      the kind of device the check requires (default: gpu)
#              NETCL_DEVICE_WHEELS   the wheels folder (default: shared/device-wheels)
#              NETCL_CHECK_OUT       where logs, JSON and the tuned cache go (default: $OUT if set, else a
#                                    temporary folder that is removed at the end)
#              NETCL_CHECK_TESTS     the test files of step 2 (default: the kernel tests listed below)
#              NETCL_CHECK_WORKERS   pytest-xdist processes for step 2 (default: the cores, at most 8)
#              NETCL_CHECK_MODELS    the models of step 5 (default "resnet18 mobilenet_v2 resnet50")
#              NETCL_CHECK_BATCHES   their batch sizes (default 1,8)
#              NETCL_CHECK_LIMITS    seconds for steps 1-4 and for each model of step 5, space-separated
#                                    (default "90 240 240 60 150")
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
out=${NETCL_CHECK_OUT:-${OUT:-$work/out}}
mkdir -p "$out"
read -r limit_devices limit_tests limit_tune limit_depthwise limit_model <<<"${NETCL_CHECK_LIMITS:-90 240 240 60 150}"
models=${NETCL_CHECK_MODELS:-resnet18 mobilenet_v2 resnet50}
batches=${NETCL_CHECK_BATCHES:-1,8}
export NETCL_DEVICE=${NETCL_DEVICE:-gpu}
export NETCL_CACHE_DIR="$out/cache"   # a fresh cache: the tuning below is this device's, from nothing
export PYTHONFAULTHANDLER=1            # a crash inside the driver leaves the Python stack in the step's log

# Dependencies: whatever imports already is used; the rest comes from the wheels, without an index.
if ! "$PYTHON" -c "import pyopencl, mako, platformdirs, tqdm, numpy" 2>/dev/null; then
  wheels=${NETCL_DEVICE_WHEELS:-shared/device-wheels}
  if ! ls "$wheels"/*.whl >/dev/null 2>&1; then
    echo "[device_check] netcl's dependencies are missing and $wheels holds no wheels" >&2
    exit 1
  fi
  "$PYTHON" -m pip install -q --no-index --no-deps --target "$work/site" "$wheels"/*.whl || exit 1
  export PYTHONPATH="$work/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

# NVIDIA's OpenCL library, registered for pyopencl's ICD loader beside the vendors the system lists.
nvidia=$(find /usr/local/nvidia /usr/lib64 /usr/lib /usr/local/lib -name 'libnvidia-opencl.so.1' 2>/dev/null | head -n 1)
if [ -n "$nvidia" ]; then
  mkdir -p "$work/vendors"
  cp /etc/OpenCL/vendors/*.icd "$work/vendors/" 2>/dev/null || true
  echo "$nvidia" > "$work/vendors/nvidia-netcl-check.icd"
  export OCL_ICD_VENDORS="$work/vendors"
fi

kind=${NETCL_CHECK_KIND:-gpu}
device=$("$PYTHON" ci/probe_device.py --kind "$kind" 2>"$out/probe.err")
if [ -z "$device" ]; then
  echo "[device_check] no working OpenCL device of kind $kind: $(cat "$out/probe.err")" >&2
  exit 1
fi
echo "[device_check] $kind: $device; NVIDIA library: ${nvidia:-none found}; results in $out"
host_cpu=$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//')
gpu_driver=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)
# PyTorch on the same GPU is the fair reference where this interpreter's PyTorch has CUDA.
if [ -z "${NETCL_REFERENCE_DEVICE:-}" ] && "$PYTHON" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
  export NETCL_REFERENCE_DEVICE=cuda
fi

TESTS=${NETCL_CHECK_TESTS:-"tests/test_gemm.py tests/test_conv_strategies.py tests/test_conv_depthwise.py tests/test_conv_pointwise.py \
tests/test_conv_direct_blocked.py tests/test_conv_implicit_gemm.py tests/test_conv_winograd.py tests/test_conv_mec.py \
tests/test_im2col.py tests/test_pool.py tests/test_bias.py tests/test_transpose.py tests/test_tensor_reduce.py \
tests/test_nn_activation.py tests/test_nn_batchnorm.py tests/test_nn_loss.py tests/test_optim.py tests/test_random.py \
tests/test_fuzz_conv.py tests/test_fuzz_ops.py"}

declare -A status seconds
step() {  # step NAME LIMIT COMMAND...: run with a time limit, log to $out/NAME.log
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  seconds[$name]=$((SECONDS - start))
  case $rc in
    0) status[$name]=passed ;;
    124) status[$name]="stopped after ${limit} s" ;;
    *) status[$name]="failed (exit $rc)" ;;
  esac
  echo "[device_check] $name: ${status[$name]} in ${seconds[$name]} s"
}

# without pytest-xdist the suite's addopts (which ask for its workers) give way to the marker alone
parallel=(-o "addopts=-m 'not slow and not oclgrind' -ra")
if "$PYTHON" -c "import xdist" 2>/dev/null; then
  workers=${NETCL_CHECK_WORKERS:-$(( $(nproc) < 8 ? $(nproc) : 8 ))}
  parallel=(-n "$workers")
fi

step devices "$limit_devices" "$PYTHON" -m netcl devices --bench --json
# shellcheck disable=SC2086  # TESTS is a list of paths
step tests "$limit_tests" "$PYTHON" -m pytest -q -p no:cacheprovider "${parallel[@]}" $TESTS
step tune "$limit_tune" "$PYTHON" -m netcl tune all --quick --json
step depthwise "$limit_depthwise" "$PYTHON" benchmarks/depthwise.py --strategies depthwise,im2col --json "$out/depthwise.json"
steps=(devices tests tune depthwise)
for model in $models; do
  step "imagenet-$model" "$limit_model" "$PYTHON" -m netcl bench imagenet --model "$model" --batch "$batches" \
    --repeat 2 --json
  steps+=("imagenet-$model")
done

echo
echo "==== device check: $device"
echo "host:       ${host_cpu:-unknown CPU}, $(nproc) cores; GPU driver: ${gpu_driver:-not reported}"
"$PYTHON" - "$out" $models <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
models = sys.argv[2:]


def last_json(name):
    """The last line of a step's log that is a JSON object (the CLI's --json result)."""
    path = out / f"{name}.log"
    for line in reversed(path.read_text(errors="replace").splitlines() if path.exists() else []):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


tests = (out / "tests.log").read_text(errors="replace").strip().splitlines() if (out / "tests.log").exists() else []
print("tests:      " + (tests[-1] if tests else "no output"))
devices = last_json("devices") or {}
for d in devices.get("devices", []):
    if d.get("default"):
        print(f"device:     {d.get('platform')} / {d.get('name')} ({d.get('kind')}, {d.get('compute_units')} units)")
        print(f"rates:      GEMM {d.get('gemm_gflops')} GFLOP/s, copy {d.get('copy_gbps')} GB/s")
tune = last_json("tune") or {}
if tune:
    print("tune:       " + ", ".join(f"{k} {v}" for k, v in tune.items() if isinstance(v, (int, float, str)))[:300])
depthwise = out / "depthwise.json"
if depthwise.exists():
    for row in json.loads(depthwise.read_text()).get("rows", []):
        if "ms" in row:
            print(f"depthwise:  {row['pass']:<15} {row['strategy']:<10} {row['ms']:8.3f} ms {row['gb_s']:7.1f} GB/s "
                  f"= {100 * row['share_of_copy']:.0f} % of the copy's {row['copy_gb_s']} GB/s")

def ratio(entry, key):
    value = entry.get(key)
    return "-" if value is None else f"{value:.2f}x"


for model in models:
    bench = last_json(f"imagenet-{model}") or {}
    for e in bench.get("results", []):
        print(f"imagenet:   {e['model']:<13} batch {e['batch']:<3} inference {e['inference_images_per_second']:8.1f} img/s "
              f"({e['inference_ms_per_batch']:.2f} ms), {ratio(e, 'inference_ratio_to_torch')} PyTorch on "
              f"{bench.get('torch_device')}, {ratio(e, 'inference_ratio_to_onnxruntime')} onnxruntime (CPU); "
              f"training {e['training_images_per_second']:7.1f} img/s, {ratio(e, 'training_ratio_to_torch')} PyTorch")
PY
for name in "${steps[@]}"; do
  printf '%-22s %s%s\n' "$name:" "${status[$name]:-not run}" "${seconds[$name]:+ (${seconds[$name]} s)}"
done
failed=0
for name in "${steps[@]}"; do
  case ${status[$name]:-} in passed) ;; *) failed=1 ;; esac
done
exit $failed
