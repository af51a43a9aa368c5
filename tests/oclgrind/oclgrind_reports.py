"""Find Oclgrind's diagnostics in captured stderr (used by conftest.py and by ci/oclgrind.sh on the
job's whole stderr): ``python3 tests/oclgrind/oclgrind_reports.py FILE`` prints them and exits 1 if any.

Oclgrind separates its messages with empty lines; a kernel diagnostic (invalid read/write, data race,
uninitialized value, divergence) carries a "Kernel:" line, an API error starts with "Oclgrind - ", fatal
conditions with "OCLGRIND FATAL ERROR". A few OpenCL API "errors" are pyopencl probing optional device
properties Oclgrind does not implement, or looking up Python attributes on programs as kernel names:
they never involve netcl's kernels and are dropped (BENIGN_API_ERRORS).
"""
from __future__ import annotations

import re
import sys

BENIGN_API_ERRORS = (
    re.compile(r"Function: clGetDeviceInfo\s+Error:\s+CL_INVALID_VALUE\s+For argument 'param_name'"),
    re.compile(r"Function: clGetPlatformInfo\s+Error:\s+CL_INVALID_VALUE\s+For argument 'param_name'"),
    re.compile(r"Function: clCreateKernel\s+Error:\s+CL_INVALID_KERNEL_NAME\s+Kernel '_\w*' not found"),
)
_KERNEL_DIAGNOSTIC = re.compile(r"(Invalid (read|write)|.*data race|Uninitiali[sz]ed|Controlflow depends|"
                                r"Work-(group|item) divergence)")


def oclgrind_reports(text: str) -> list[str]:
    """The Oclgrind diagnostics in a chunk of stderr, benign API noise removed."""
    reports = []
    # messages are separated by empty lines; lines inside a message that look empty hold a tab
    for block in re.split(r"\n *\n", text):
        body = block.strip("\n")
        if not body.strip():
            continue
        lines = body.splitlines()
        first = lines[0].strip()
        is_report = (first.upper().startswith("OCLGRIND") or _KERNEL_DIAGNOSTIC.match(first) is not None
                     or any(line.strip().startswith("Kernel:") for line in lines))
        if not is_report:
            continue
        flat = " ".join(line.strip() for line in lines)
        if any(p.search(flat) for p in BENIGN_API_ERRORS):
            continue
        reports.append(body.strip())
    return reports


if __name__ == "__main__":
    with open(sys.argv[1], errors="replace") as f:
        found = oclgrind_reports(f.read())
    for r in found[:20]:
        print(r, end="\n\n")
    if len(found) > 20:
        print(f"... and {len(found) - 20} more")
    sys.exit(1 if found else 0)
