#!/usr/bin/env bash
# Check that a regular (non-editable) `pip install .` ships the kernel templates: install into a fresh
# virtual environment outside the repository and build and run a kernel from there.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --disable-pip-version-check -q "$repo"
cd "$work"
NETCL_CACHE=0 "$work/venv/bin/python" - <<'PY'
import numpy as np, netcl as nc, netcl.runtime.kernels as k
assert "site-packages" in nc.__file__, nc.__file__
x = nc.Tensor.from_host(np.arange(7, dtype=np.float32))
y = (x * 2 + 1).to_host()
assert np.array_equal(y, np.arange(7) * 2 + 1), y
print(f"[check_install] installed netcl {nc.__version__} from {nc.__file__} built and ran a kernel "
      f"(templates in {k.kernels_dir()})")
PY
