"""The runtime: devices (device.py) and their state (device_state.py), buffers (memory.py), the kernel pipeline
(kernels.py, launching.py, observers.py), caches (cache.py, binaries.py), the tuning database (tuning_db.py)."""
