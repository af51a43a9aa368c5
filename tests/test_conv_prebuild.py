"""Building a calibration's kernels ahead of its timing: launches that only build (builds_only), the jobs,
the helper process that shares the builds, and what happens when it fails."""
from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path

import numpy as np
import pytest

import netcl as nc
from netcl.ops import conv2d_planner as planner
from netcl.ops import conv_chooser
from netcl.ops import gemm_surface
from netcl.ops.conv_common import ConvLayer
from netcl.ops.conv_profile import CLASS_SHAPES
from netcl.ops.elementwise import copy_into
from netcl.ops.gemm import shape_class
from netcl.runtime import binaries, kernels
from netcl.runtime.observers import builds_only
from netcl.tuning import conv_prebuild

LAYER = ConvLayer.from_shapes((2, 5, 9, 9), (7, 5, 3, 3), padding=1)


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NETCL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("NETCL_CACHE", raising=False)
    conv_chooser.clear_memory_cache()
    yield
    conv_chooser.clear_memory_cache()


def test_builds_only_launches_nothing_in_its_thread_and_everything_in_others(device, rng):
    # strided destinations: a contiguous copy is the driver's memcpy, not a kernel launch
    src = nc.tensor(rng.standard_normal(13).astype(np.float32), device=device)
    canary = np.full(26, 7.0, np.float32)
    inside = nc.tensor(canary, device=device)
    other = nc.tensor(canary, device=device)
    with builds_only(device):
        copy_into(inside[::2], src)
        with builds_only(device):  # nested: still only building
            copy_into(inside[::2], src)
        worker = threading.Thread(target=lambda: copy_into(other[::2], src))
        worker.start()
        worker.join()
    assert np.array_equal(inside.to_host(), canary)
    assert np.array_equal(other.to_host()[::2], src.to_host()) and np.all(other.to_host()[1::2] == 7.0)
    copy_into(inside[::2], src)  # and after the block it runs again
    assert np.array_equal(inside.to_host()[::2], src.to_host())


def test_jobs_are_gemm_shape_classes_then_layers_and_survive_json():
    layers = [LAYER, ConvLayer.from_shapes((1, 3, 7, 7), (4, 3, 1, 1), stride=2)]
    jobs = json.loads(json.dumps(conv_prebuild.jobs(layers, gemm_surface.QUICK_GRID, "float32")))
    gemm_jobs = [j for j in jobs if j[0] == "gemm"]
    assert jobs[:len(gemm_jobs)] == gemm_jobs and len(jobs) == len(gemm_jobs) + len(layers)
    products = [tuple(p) for j in gemm_jobs for p in j[2]]
    assert len(products) == len(set(products)) == len(CLASS_SHAPES) + len(gemm_surface.points(gemm_surface.QUICK_GRID))
    for job in gemm_jobs:  # one shape class a job: products that share programs stay in one process
        assert job[1] == "float32"
        assert len({shape_class(m, n, k, max(batch, 1)) for batch, m, n, k in job[2]}) == 1
    assert [ConvLayer(**j[1]) for j in jobs[len(gemm_jobs):]] == layers


def _layer(salt: int) -> ConvLayer:
    """A layer no other test builds for: its programs are new to this process."""
    return ConvLayer.from_shapes((2, 5, 9 + salt, 11), (7, 5, 3, 3), padding=1)


def _source_builds_of_a_real_run(device, layer) -> int:
    before = kernels.build_stats(device)["source_builds"]
    for pass_ in ("forward", "backward_data", "backward_weight"):
        impls = {a.strategy: planner.strategies()[a.strategy]
                 for a in planner.answers(layer, pass_, device) if a.why_not is None}
        for run in planner.pass_runners(impls, layer, pass_, device).values():
            run()
    device.queue.finish()
    return kernels.build_stats(device)["source_builds"] - before


def test_a_helper_builds_its_jobs_into_the_disk_cache_for_this_process(device, tmp_path, recwarn):
    """The helper process builds what it is handed and writes the binaries; this process's runs load
    them instead of building: nothing is built from source afterwards."""
    layer = _layer(1)
    jobs = [["layer", dataclasses.asdict(layer)]]
    helper = conv_prebuild._Helper(device)
    helper.serve(lambda: jobs.pop() if jobs else None)
    helper.finish(120.0)
    assert helper.jobs == 1 and not jobs and not [w for w in recwarn if "helper" in str(w.message)]
    assert sorted(Path(tmp_path / "cache").glob("kernels/*/*.bin")), "the helper wrote no binaries"
    loads = kernels.build_stats(device)["binary_loads"]
    with binaries.unsaved_builds_discarded():
        assert _source_builds_of_a_real_run(device, layer) == 0
    assert kernels.build_stats(device)["binary_loads"] > loads


def test_compile_ahead_leaves_nothing_for_the_timed_passes_to_build(device, monkeypatch):
    """With the helper (forced here: the device decides by its binaries' cost) every program the
    calibration's passes use is built before the first timed run."""
    layer = _layer(2)
    monkeypatch.setattr(conv_prebuild, "binaries_pay", lambda device: True)
    handed = []
    with binaries.unsaved_builds_discarded():
        done = conv_prebuild.compile_ahead(device, [layer], None, progress=handed.append)
        assert done["helper"] and done["jobs"] == len(conv_prebuild.jobs([layer], None)) == sum(handed)
        assert 0 <= done["helper_jobs"] < done["jobs"]  # the first job, which decides, is built here
        assert _source_builds_of_a_real_run(device, layer) == 0


def test_without_cheap_binaries_only_the_first_job_is_built_ahead(device, monkeypatch):
    monkeypatch.setattr(conv_prebuild, "binaries_pay", lambda device: False)
    built = []
    monkeypatch.setattr(conv_prebuild, "build", lambda device, job: built.append(job))
    done = conv_prebuild.compile_ahead(device, [LAYER], gemm_surface.QUICK_GRID)
    assert not done["helper"] and done["helper_jobs"] == 0 and len(built) == 1 and built[0][0] == "gemm"


def test_a_helper_that_fails_is_reported_with_its_words_and_its_jobs_are_left(device):
    @dataclasses.dataclass
    class Elsewhere:
        identity: str = "a device this machine does not have"

    jobs = [["layer", dataclasses.asdict(LAYER)]]
    helper = conv_prebuild._Helper(Elsewhere())
    helper.serve(lambda: jobs.pop() if jobs else None)
    with pytest.warns(RuntimeWarning, match="(?s)exited with status 2.*no OpenCL device"):
        helper.finish(60.0)
    assert helper.jobs == 0 and jobs  # never handed out: the timed passes build it


def test_binaries_pay_compares_a_binary_s_fetch_with_the_build_time(device, monkeypatch):
    with binaries.unsaved_builds_discarded():
        conv_prebuild.build(device, ["layer", dataclasses.asdict(_layer(3))])  # fresh source builds
        assert binaries.unsaved_programs()
        monkeypatch.setattr(binaries, "fetch_seconds", lambda program: 0.0)
        assert conv_prebuild.binaries_pay(device)
        monkeypatch.setattr(binaries, "fetch_seconds", lambda program: float("inf"))
        assert not conv_prebuild.binaries_pay(device)
        monkeypatch.setattr(binaries, "fetch_seconds", lambda program: 0.0)
        monkeypatch.setenv("NETCL_CACHE", "0")  # nowhere to hand binaries over
        assert not conv_prebuild.binaries_pay(device)


def test_the_driver_hands_over_a_binary_in_finite_time(device):
    with binaries.unsaved_builds_discarded():
        conv_prebuild.build(device, ["layer", dataclasses.asdict(_layer(4))])
        program = list(binaries.unsaved_programs().values())[-1]
        assert 0.0 <= binaries.fetch_seconds(program) < 60.0


def test_an_error_here_stops_the_helper_too(device, monkeypatch):
    monkeypatch.setattr(conv_prebuild, "binaries_pay", lambda device: True)
    started = []
    real_helper = conv_prebuild._Helper
    monkeypatch.setattr(conv_prebuild, "_Helper", lambda device: started.append(real_helper(device)) or started[-1])
    calls = []

    def failing_build(device, job):
        calls.append(job)
        if len(calls) == 2:
            raise KeyboardInterrupt  # the user stops the calibration while the helper works

    monkeypatch.setattr(conv_prebuild, "build", failing_build)
    with pytest.raises(KeyboardInterrupt):
        conv_prebuild.compile_ahead(device, [LAYER, _layer(5)], gemm_surface.QUICK_GRID)
    assert started and started[0].process.poll() is not None  # not left waiting for jobs
