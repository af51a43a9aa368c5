"""The runtime: devices (device.py), buffers (memory.py), the kernel pipeline (kernels.py), caches (cache.py)."""
