"""Build and run a real kernel on every OpenCL device; print the first that computes correctly.

Exit status 0 with the device's description on stdout, or 1 with the reason on stderr. It uses plain
pyopencl (not netcl) so that it diagnoses the driver, not our code. With ``--all``, print one JSON object
per working device instead ({"platform", "platform_version", "device", "kind"}), still exiting 1 if none
works; with ``--kind gpu`` only GPUs count.
"""
import json
import sys

import numpy as np

try:
    import pyopencl as cl
except ImportError as exc:
    sys.exit(f"pyopencl is not installed: {exc}")

SOURCE = "__kernel void saxpy(__global const float* x, __global float* y, const float a) {" \
         " const int i = get_global_id(0); y[i] = a * x[i] + y[i]; }"


def main(argv) -> int:
    every = "--all" in argv
    kind = argv[argv.index("--kind") + 1] if "--kind" in argv else None
    working = 0
    try:
        platforms = cl.get_platforms()
    except cl.Error as exc:
        print(f"no OpenCL platform: {exc}", file=sys.stderr)
        return 1
    failures = []
    for platform in platforms:
        for device in platform.get_devices():
            if kind == "gpu" and not device.type & cl.device_type.GPU:
                continue
            label = f"{platform.name.strip()} / {device.name.strip()}"
            try:
                ctx = cl.Context([device])
                queue = cl.CommandQueue(ctx)
                x = np.arange(1000, dtype=np.float32)
                y = np.ones(1000, dtype=np.float32)
                mf = cl.mem_flags
                xb = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=x)
                yb = cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=y)
                cl.Program(ctx, SOURCE).build().saxpy(queue, (1000,), None, xb, yb, np.float32(2))
                cl.enqueue_copy(queue, y, yb)
                if not np.allclose(y, 2 * x + 1):
                    raise RuntimeError("wrong result")
            except Exception as exc:  # any driver failure means "this device does not work"
                failures.append(f"{label}: {str(exc).strip().splitlines()[0] if str(exc).strip() else exc!r}")
                continue
            if not every:
                print(label)
                return 0
            working += 1
            print(json.dumps({"platform": platform.name.strip(), "platform_version": platform.version.strip(),
                              "device": device.name.strip(),
                              "kind": "gpu" if device.type & cl.device_type.GPU else "cpu"}))
    if working:
        return 0
    print("; ".join(failures) or "no OpenCL device found", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
