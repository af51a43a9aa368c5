"""The kernel pipeline: templates render with defaults, programs are built once and cached on disk,
the cache survives concurrent writers and damaged entries, and build failures carry their data."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import netcl as nc
from netcl.runtime import kernels

SCRIPT = textwrap.dedent("""
    import json, numpy as np, netcl as nc
    from netcl.runtime import kernels
    x = nc.tensor(np.arange(5, dtype=np.float32))
    y = (x * {factor} + 1).to_host()
    assert np.array_equal(y, np.arange(5) * {factor} + 1), y
    print(json.dumps(kernels.build_stats(nc.default_device())))
""")


def run_process(cache_dir, factor=3.0, extra_env=None):
    env = dict(os.environ, NETCL_CACHE_DIR=str(cache_dir), **(extra_env or {}))
    out = subprocess.run([sys.executable, "-c", SCRIPT.format(factor=factor)], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    import json
    return json.loads(out.stdout.strip().splitlines()[-1])


def binaries(cache_dir):
    return sorted(Path(cache_dir).glob("kernels/*/*.bin"))


def test_every_template_renders_with_defaults():
    for path in kernels.kernels_dir().glob("*.cl"):
        source = kernels.render(path.name)
        if path.name.startswith("_"):  # a library of Mako defs that kernel templates import
            assert "__kernel" not in source and "<%def" in path.read_text(), path.name
        else:
            assert "__kernel" in source, path.name


def test_a_template_edited_within_a_second_is_compiled_again(tmp_path, monkeypatch, request):
    """Mako's compiled templates on disk are keyed by the templates' content: its own staleness test
    compares whole-second mtimes and kept running an edited template's old code."""
    folder = tmp_path / "templates"
    folder.mkdir()
    template = folder / "probe.cl"
    template.write_text("old ${x}")
    monkeypatch.setenv("NETCL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(kernels, "kernels_dir", lambda: folder)
    request.addfinalizer(kernels.templates_digest.cache_clear)
    for text in ("old", "new"):
        if text == "new":
            stamp = template.stat().st_mtime
            template.write_text("new ${x}")
            os.utime(template, (stamp, stamp))  # the same second as the first compilation
        monkeypatch.setattr(kernels, "_lookup", None)  # what a new process starts with
        kernels.templates_digest.cache_clear()
        assert kernels.render("probe.cl", x=1) == f"{text} 1"


def test_disk_cache_cold_then_warm(tmp_path):
    cold = run_process(tmp_path)
    assert cold["source_builds"] >= 1 and cold["binary_loads"] == 0
    assert binaries(tmp_path), "no binary written"
    warm = run_process(tmp_path)
    assert warm["source_builds"] == 0 and warm["binary_loads"] == cold["source_builds"]


def test_cache_off_writes_nothing(tmp_path):
    stats = run_process(tmp_path, extra_env={"NETCL_CACHE": "0"})
    assert stats["source_builds"] >= 1 and not binaries(tmp_path)


def test_damaged_entry_is_rebuilt(tmp_path):
    run_process(tmp_path)
    for path in binaries(tmp_path):
        path.write_bytes(path.read_bytes()[:100] + b"garbage")  # truncated + corrupted
    stats = run_process(tmp_path)
    assert stats["source_builds"] >= 1
    assert run_process(tmp_path)["source_builds"] == 0  # and the rebuilt entry is good again


def test_kernel_names_are_read_from_the_source():
    from netcl.runtime.binaries import kernel_names
    source = ("__kernel void plain(__global float* x) {}\n"
              "__kernel __attribute__((reqd_work_group_size(64, 1, 1)))\nvoid fixed(__global float* x) {}\n"
              "inline void helper(void) {}\n")
    assert kernel_names(source) == {"plain", "fixed"}


def test_a_binary_without_all_its_kernels_is_refused(tmp_path, monkeypatch, device):
    """The PoCL wheel gave back cached programs that lacked some of their kernels (clCreateKernel then
    fails with INVALID_KERNEL_NAME): a stored binary must hold every kernel its source defines."""
    import time
    from netcl.runtime import binaries as binary_cache
    monkeypatch.setenv("NETCL_CACHE_DIR", str(tmp_path))
    tag = time.time_ns()
    one = f"__kernel void first(__global float* x) {{ x[0] = 1.0f; }}\n// {tag}"
    kernels.build_program(device, one)
    kernels.save_binaries()
    [path] = binaries(tmp_path)
    options = kernels.build_options()
    assert binary_cache.load(device.context, device.cl_device, path, options, one) is not None
    two = one + "\n__kernel void second(__global float* x) { x[0] = 2.0f; }"
    assert binary_cache.load(device.context, device.cl_device, path, options, two) is None


def test_a_source_build_without_all_its_kernels_is_a_build_error(monkeypatch, device):
    import time
    from netcl.runtime import binaries as binary_cache
    monkeypatch.setattr(binary_cache, "missing_kernels", lambda program, source: {"lost_kernel"})
    source = f"__kernel void lost_kernel(__global float* x) {{ x[0] = 1.0f; }}\n// {time.time_ns()}"
    with pytest.raises(nc.KernelBuildError, match="without its kernels lost_kernel") as info:
        kernels.build_program(device, source)
    assert info.value.source_path and "lost_kernel" in Path(info.value.source_path).read_text()


def test_concurrent_processes_share_the_cache(tmp_path):
    env = dict(os.environ, NETCL_CACHE_DIR=str(tmp_path))
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT.format(factor=f)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for f in (2.0, 2.0, 5.0, 5.0)]
    for p in procs:
        _, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
    assert not list(Path(tmp_path).rglob("*.tmp")), "temporary files left behind"
    assert run_process(tmp_path, factor=2.0)["source_builds"] == 0


def test_build_error_carries_log_options_and_source(device):
    with pytest.raises(nc.KernelBuildError) as info:
        kernels.build_program(device, "__kernel void broken(__global float* x) { x[0] = undefined_name; }",
                              ("-cl-mad-enable", "-DNETCL_TEST=1"))
    err = info.value
    assert isinstance(err, RuntimeError) and isinstance(err, nc.NetclError)
    assert "undefined_name" in err.log
    assert "-DNETCL_TEST=1" in err.options
    assert err.source_path and "undefined_name" in Path(err.source_path).read_text()


def test_missing_template_is_a_build_error(device):
    with pytest.raises(nc.KernelBuildError, match="no_such_template"):
        kernels.get_kernel(device, "no_such_template.cl", "k")


def test_memoized_per_device(device):
    a = kernels.get_kernel(device, "elementwise.cl", "elementwise", EXPR="a0 * 2")
    b = kernels.get_kernel(device, "elementwise.cl", "elementwise", EXPR="a0 * 2")
    assert a is b


def test_binaries_are_written_by_save_binaries_not_during_the_build(tmp_path, monkeypatch, device):
    import time
    from netcl.runtime import binaries as binary_cache
    monkeypatch.setenv("NETCL_CACHE_DIR", str(tmp_path))
    source = f"__kernel void later(__global float* x) {{ x[0] = 1.0f; }}\n// {time.time_ns()}"
    kernels.build_program(device, source)
    assert not binaries(tmp_path), "the binary was fetched during the build (PoCL compiles it all again)"
    assert binary_cache.pending() >= 1
    assert kernels.save_binaries() >= 1
    assert len(binaries(tmp_path)) == 1 and binary_cache.pending() == 0


def test_discarded_programs_get_no_binary(tmp_path, monkeypatch, device):
    """What a search built and threw away (the GEMM tuner's candidates) is not written at exit."""
    import time
    from netcl.runtime import binaries as binary_cache
    monkeypatch.setenv("NETCL_CACHE_DIR", str(tmp_path))
    kernels.save_binaries()
    source = f"__kernel void candidate(__global float* x) {{ x[0] = 2.0f; }}\n// {time.time_ns()}"
    kernels.build_program(device, source)
    assert binary_cache.discard_unsaved() >= 1 and binary_cache.pending() == 0
    assert kernels.save_binaries() == 0 and not binaries(tmp_path)


def test_builds_inside_a_search_are_discarded_and_earlier_ones_kept(tmp_path, monkeypatch, device):
    """unsaved_builds_discarded() (the conv calibration, the GEMM tuner) drops the binaries of what was
    built inside it, also when it ends by an exception, and leaves those pending before it to be written."""
    import time
    from netcl.runtime import binaries as binary_cache
    monkeypatch.setenv("NETCL_CACHE_DIR", str(tmp_path))
    kernels.save_binaries()
    stamp = time.time_ns()
    kernels.build_program(device, f"__kernel void kept(__global float* x) {{ x[0] = 3.0f; }}\n// {stamp}")
    with pytest.raises(RuntimeError):
        with binary_cache.unsaved_builds_discarded():
            kernels.build_program(device, f"__kernel void dropped(__global float* x) {{ x[0] = 4.0f; }}\n// {stamp}")
            assert binary_cache.pending() == 2
            raise RuntimeError("the search was interrupted")
    assert binary_cache.pending() == 1
    assert kernels.save_binaries() == 1 and len(binaries(tmp_path)) == 1


# A kernel with a fixed work-group size, launched many times without waiting, and the program's binary
# fetched while launches may still be queued: PoCL 3.1 aborted the process when the fetch overlapped a
# launch (the background binary writer did that). Run in a child process, since the failure is an abort.
_IN_FLIGHT_SCRIPT = """
import sys, time
import numpy as np
import netcl as nc
from netcl.runtime import kernels
from netcl.runtime.kernels import build_program, launch
device = nc.default_device()
source = ("__kernel __attribute__((reqd_work_group_size(1, 1, 1))) void fixed(__global float* x) "
          "{ x[get_global_id(0)] += 1.0f; }\\n// " + sys.argv[1])
buf = nc.Tensor.from_host(np.zeros(64, np.float32), device)
for round in range(4):
    kernel = build_program(device, source + str(round)).fixed
    for _ in range(200):
        launch(device, kernel, (64,), (1,), buf.buffer)
    kernels.save_binaries()
device.queue.finish()
assert float(buf.to_host()[0]) == 800.0
print("ok")
"""


def test_saving_binaries_while_kernels_are_in_flight_does_not_abort(tmp_path):
    import os
    import subprocess
    import sys
    import time
    env = dict(os.environ, NETCL_CACHE_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", _IN_FLIGHT_SCRIPT, str(time.time_ns())], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-2000:]
    assert len(binaries(tmp_path)) == 4


def test_prepared_launch_sets_what_changed(device):
    """A PreparedLaunch repeats one launch with new values for its varying arguments: each call's buffers
    and scalars reach the kernel, and a wrong count of values is a TypeError."""
    import numpy as np

    from netcl.ops.elementwise import fill
    kernel = kernels.get_kernel(device, "im2col.cl", "copy_bandwidth", VEC=1)
    n = 37
    sources = [nc.tensor(np.arange(n, dtype=np.float32) * (i + 1), device=device) for i in range(2)]
    dst = nc.Tensor.empty((n,), np.float32, device)
    copy = kernels.PreparedLaunch(device, kernel, (n,), None, (kernels.VARYING, dst.buffer, kernels.VARYING))
    for src, count in ((sources[0], n), (sources[1], n), (sources[1], 5), (sources[0], 5)):
        fill(dst, -1.0)
        copy(src.buffer, np.int64(count))
        expected = np.full(n, -1.0, np.float32)
        expected[:count] = src.to_host()[:count]
        assert np.array_equal(dst.to_host(), expected)
    with pytest.raises(TypeError):
        kernels.PreparedLaunch(device, kernel, (n,), None, (kernels.VARYING, dst.buffer, kernels.VARYING))(
            sources[0].buffer)


WARNING_SCRIPT = textwrap.dedent("""
    import numpy as np, netcl as nc
    from netcl.runtime import kernels
    device = nc.default_device()
    # two warnings on clang-based drivers: a double literal narrowed to int, an assignment as a condition
    source = ("__kernel void chatty(__global float* x) {{ int n = 1.5; float v = x[0];"
              " if (v = {value}.5f) x[get_global_id(0)] = v * n; }}")
    program = kernels.build_program(device, source.format(value=np.random.default_rng().integers(1, 1000)))
    log = program.get_build_info(device.cl_device, __import__("pyopencl").program_build_info.LOG)
    print("LOG", repr(log))
""")


def _build_with_warning(tmp_path, debug: bool):
    env = dict(os.environ, NETCL_CACHE="0", POCL_KERNEL_CACHE="0", NETCL_DEBUG="1" if debug else "0")
    return subprocess.run([sys.executable, "-c", WARNING_SCRIPT], env=env, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)


def test_compiler_warnings_never_reach_stderr(tmp_path):
    quiet = _build_with_warning(tmp_path, debug=False)
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stderr == "", f"the compiler wrote on stderr: {quiet.stderr!r}"
    assert "LOG" in quiet.stdout


def test_netcl_debug_shows_the_build_log(tmp_path):
    loud = _build_with_warning(tmp_path, debug=True)
    assert loud.returncode == 0, loud.stderr
    if "warning" not in loud.stdout.lower():
        pytest.skip(f"{nc.default_device().describe()} reports no warning for this source")
    assert "[netcl] build log of program" in loud.stderr and "warning" in loud.stderr.lower()


def test_build_options_are_quiet_unless_debugging(monkeypatch):
    monkeypatch.setenv("NETCL_DEBUG", "0")
    assert kernels.build_options(("-DX=1",))[-2:] == ("-w", "-DX=1")
    monkeypatch.setenv("NETCL_DEBUG", "1")
    assert "-w" not in kernels.build_options(("-DX=1",))


def test_only_templates_a_convolution_launches_invalidate_its_measurements(tmp_path, monkeypatch, request):
    """The conv planner's plans and calibration carry a digest of the templates a convolution may launch:
    a new loss or optimizer kernel must not send every device back to the uncalibrated fallback."""
    folder = tmp_path / "templates"
    folder.mkdir()
    for name in ("gemm.cl", "im2col.cl", "optim.cl"):
        (folder / name).write_text(f"// {name}")
    monkeypatch.setattr(kernels, "kernels_dir", lambda: folder)
    request.addfinalizer(kernels.templates_digest.cache_clear)

    def digests():
        kernels.templates_digest.cache_clear()
        return kernels.templates_digest(), kernels.convolution_templates_digest()

    everything, convolution = digests()
    (folder / "optim.cl").write_text("// optim.cl, edited")
    (folder / "mean_rows.cl").write_text("// a new kernel no convolution launches")
    edited_everything, edited_convolution = digests()
    assert edited_everything != everything and edited_convolution == convolution
    (folder / "im2col.cl").write_text("// im2col.cl, edited")
    after_im2col = digests()[1]
    assert after_im2col != convolution
    (folder / "new_strategy.cl").write_text("// a template not known to stay out of convolutions")
    assert digests()[1] != after_im2col
