"""Wrong calls across the public API beyond the core Tensor (tests/test_bad_inputs_core.py has those): layers,
losses, optimizers, conv2d and its strategies, gemm, im2col/col2im, the planner, checkpoints, MNIST files,
cached files and the command line. Each raises the documented nc.*Error with a message naming the problem;
none may crash the process, hang (each call runs under an alarm), or leave the device unusable (a small op
runs after each). Rows named `bug_*` are regression tests for bugs this table found (all fixed in
62f0a1c); BUGS says what each bug was, and a failure of such a row quotes it.
"""
from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
import signal
import warnings
from pathlib import Path

import numpy as np
import pytest

import netcl as nc
from netcl.nn import functional as F
from netcl.ops.conv2d import conv2d
from netcl.ops.conv2d_planner import plan_conv2d
from netcl.ops.gemm import gemm
from netcl.ops.im2col import col2im, im2col
from netcl.runtime.device import Device

MNIST = Path("/work/shared/data/mnist")
HANG_SECONDS = 120


@contextlib.contextmanager
def no_hang(what: str, seconds: int = HANG_SECONDS):
    """Fail (instead of hanging the suite) when a call takes longer than ``seconds``."""
    if not hasattr(signal, "SIGALRM"):
        yield
        return

    def expire(signum, frame):
        raise TimeoutError(f"{what} did not return within {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


class Env:
    """What the table's calls need: the default device, a second context on the same device, a scratch
    directory, and small tensors."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.device = nc.default_device()
        self.other = Device(self.device.cl_device)  # its own context: tensors on it must not mix

    def f32(self, *shape):
        return nc.Tensor.from_host(np.ones(shape, np.float32), self.device)

    def o32(self, *shape):
        return nc.Tensor.from_host(np.ones(shape, np.float32), self.other)

    def ints(self, *shape, dtype=np.int64):
        return nc.Tensor.from_host(np.zeros(shape, dtype), self.device)

    def param(self, n=3):
        return nc.Tensor.from_host(np.ones(n, np.float32), self.device, requires_grad=True)

    def checkpoint(self, mutate) -> Path:
        """A valid checkpoint, altered by ``mutate(bytes) -> bytes``."""
        path = self.tmp / "model.ckpt"
        nc.save({"w": np.arange(10, dtype=np.float32), "step": 3}, path)
        path.write_bytes(mutate(path.read_bytes()))
        return path

    def mnist(self, images=None, labels=None) -> Path:
        """A directory with the MNIST test split, its raw IDX bytes altered by ``images``/``labels``."""
        directory = self.tmp / "mnist"
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir()
        for stem, mutate in (("t10k-images-idx3-ubyte", images), ("t10k-labels-idx1-ubyte", labels)):
            raw = gzip.decompress((MNIST / f"{stem}.gz").read_bytes())
            (directory / f"{stem}.gz").write_bytes(gzip.compress(mutate(raw) if mutate else raw, compresslevel=1))
        return directory


def _flip_last_byte(blob: bytes) -> bytes:
    return blob[:-1] + bytes([blob[-1] ^ 0xFF])


def _lr(opt_class, **kw):
    return lambda e: opt_class([e.param()], **kw)


BUGS = {
    "bug_layer_init_allocates_on_host_before_checking_the_device":
        "nn.Linear/Conv2d draw their initial weights as a float64 host array before any size check, so an "
        "absurd layer raises NumPy's MemoryError instead of nc.DeviceMemoryError (netcl/nn/layers.py, init)",
    "bug_optimizer_accepts_nan_hyperparameters":
        "SGD/Adam validate with `value < 0`, which is False for NaN: lr=nan is accepted and turns every "
        "parameter into NaN at the first step (netcl/optim/sgd.py, adam.py)",
    "bug_save_to_unwritable_path_raises_raw_oserror":
        "nc.save lets the OSError of the atomic write escape (IsADirectoryError for a directory) instead of "
        "nc.CheckpointError naming the path (netcl/serialization.py, save)",
    "bug_planner_accepts_integer_dtype":
        "plan_conv2d(dtype='int32') returns a plan although conv2d only takes float32/float64 "
        "(netcl/ops/conv_common.py ConvLayer.from_shapes or the planner should raise nc.DTypeError)",
    "bug_planner_nan_budget_raises_raw_valueerror":
        "plan_conv2d(budget_bytes=nan) raises Python's 'cannot convert float NaN to integer' (int(nan) in "
        "plan_conv2d_layer) instead of nc.ShapeError naming budget_bytes",
}

# (id, call(env), error type, text the message must contain (or a function of env giving it))
def _batch_beyond_max_alloc() -> int:
    """A batch whose im2col lowering (64·11·11 × 54·54 floats per image) exceeds the device's largest
    allocation; PoCL derives that limit from the memory free at start-up, so it is read, not assumed."""
    per_image = 64 * 11 * 11 * 54 * 54 * 4
    return nc.default_device().max_alloc_bytes // per_image + 1


CASES = [
    # ---- layers and losses
    ("conv_layer_wrong_rank", lambda e: nc.nn.Conv2d(3, 4, 3)(e.f32(3, 8, 8)), nc.ShapeError, "(3, 8, 8)"),
    ("conv_layer_channel_mismatch", lambda e: nc.nn.Conv2d(3, 4, 3)(e.f32(1, 2, 8, 8)), nc.ShapeError, "(1, 2, 8, 8)"),
    ("conv_layer_groups_do_not_divide", lambda e: nc.nn.Conv2d(3, 4, 3, groups=2), nc.ShapeError, "groups=2"),
    ("conv_layer_zero_out_channels", lambda e: nc.nn.Conv2d(3, 0, 3), nc.ShapeError, "out_ch"),
    ("conv_layer_negative_kernel", lambda e: nc.nn.Conv2d(3, 4, -1), nc.ShapeError, "kernel_size"),
    ("conv_layer_kernel_larger_than_padded_input", lambda e: nc.nn.Conv2d(1, 1, 5)(e.f32(1, 1, 3, 3)),
     nc.ShapeError, "larger than the padded input"),
    ("conv_layer_unknown_strategy", lambda e: nc.nn.Conv2d(1, 1, 3, strategy="fft")(e.f32(1, 1, 5, 5)),
     nc.ShapeError, "fft"),
    ("conv_layer_float64_input", lambda e: nc.nn.Conv2d(1, 1, 3)(nc.tensor(np.ones((1, 1, 4, 4)))),
     nc.DTypeError, "float64"),
    ("conv_layer_other_context", lambda e: nc.nn.Conv2d(1, 1, 3)(e.o32(1, 1, 4, 4)), nc.DeviceError, "context"),
    ("linear_wrong_features", lambda e: nc.nn.Linear(4, 2)(e.f32(3, 5)), nc.ShapeError, "(3, 5)"),
    ("linear_int_input", lambda e: nc.nn.Linear(4, 2)(e.ints(3, 4, dtype=np.int32)), nc.DTypeError, "int32"),
    ("linear_zero_features", lambda e: nc.nn.Linear(0, 2), nc.ShapeError, "in_features"),
    ("linear_numpy_input", lambda e: nc.nn.Linear(2, 2)(np.ones((1, 2), np.float32)), nc.DTypeError, "ndarray"),
    ("linear_other_context", lambda e: nc.nn.Linear(3, 2)(e.o32(2, 3)), nc.DeviceError, "context"),
    ("maxpool_kernel_larger_than_input", lambda e: nc.nn.MaxPool2d(5)(e.f32(1, 1, 3, 3)), nc.ShapeError, "larger"),
    ("maxpool_padding_over_half_kernel", lambda e: nc.nn.MaxPool2d(2, padding=2)(e.f32(1, 1, 8, 8)),
     nc.ShapeError, "padding 2"),
    ("avgpool_wrong_rank", lambda e: nc.nn.AvgPool2d(2)(e.f32(1, 8, 8)), nc.ShapeError, "(1, 8, 8)"),
    ("pool_integer_input", lambda e: nc.nn.MaxPool2d(2)(e.ints(1, 1, 4, 4)), nc.DTypeError, "int64"),
    ("dropout_probability_above_one", lambda e: nc.nn.Dropout(1.5), nc.ShapeError, "1.5"),
    ("dropout_probability_nan", lambda e: nc.nn.Dropout(float("nan")), nc.ShapeError, "nan"),
    ("cross_entropy_float_targets", lambda e: nc.nn.CrossEntropyLoss()(e.f32(2, 3), e.f32(2)), nc.DTypeError,
     "float32"),
    ("cross_entropy_row_mismatch", lambda e: nc.nn.CrossEntropyLoss()(e.f32(4, 3), e.ints(5)), nc.ShapeError,
     "(4, 3) and (5,)"),
    ("cross_entropy_other_context",
     lambda e: F.cross_entropy(e.f32(2, 3), nc.Tensor.from_host(np.zeros(2, np.int64), e.other)),
     nc.DeviceError, "context"),
    ("state_dict_missing_keys", lambda e: nc.nn.Linear(2, 2).load_state_dict({}), nc.CheckpointError, "weight"),
    ("state_dict_unexpected_key",
     lambda e: nc.nn.Linear(2, 2).load_state_dict({**nc.nn.Linear(2, 2).state_dict(), "extra": np.ones(1)}),
     nc.CheckpointError, "extra"),
    ("state_dict_wrong_shape", lambda e: nc.nn.Linear(2, 2).load_state_dict(
        {"weight": np.ones((3, 3), np.float32), "bias": np.ones(2, np.float32)}), nc.ShapeError, "(3, 3)"),
    ("lenet_wrong_image_size", lambda e: nc.models.lenet()(e.f32(1, 1, 20, 20)), nc.ShapeError, "(1, 200)"),
    ("bug_layer_init_allocates_on_host_before_checking_the_device",
     lambda e: nc.nn.Linear(1 << 18, 1 << 18), nc.DeviceMemoryError, "bytes"),
    # ---- conv2d, gemm, im2col
    ("conv2d_integer_input", lambda e: conv2d(e.ints(1, 1, 4, 4), e.f32(1, 1, 3, 3)), nc.DTypeError, "int64"),
    ("conv2d_mixed_dtypes", lambda e: conv2d(nc.tensor(np.ones((1, 1, 4, 4))), e.f32(1, 1, 3, 3)), nc.DTypeError,
     "float64"),
    ("conv2d_other_context", lambda e: conv2d(e.f32(1, 1, 4, 4), e.o32(1, 1, 3, 3)), nc.DeviceError, "context"),
    ("conv2d_bias_shape", lambda e: conv2d(e.f32(1, 1, 4, 4), e.f32(2, 1, 3, 3), e.f32(3)), nc.ShapeError, "(3,)"),
    ("conv2d_forced_strategy_cannot_serve", lambda e: conv2d(e.f32(1, 1, 8, 8), e.f32(1, 1, 5, 5),
                                                              strategy="winograd"), nc.ShapeError, "3×3"),
    ("conv2d_zero_stride", lambda e: conv2d(e.f32(1, 1, 4, 4), e.f32(1, 1, 3, 3), stride=0), nc.ShapeError,
     "stride"),
    ("conv2d_negative_padding", lambda e: conv2d(e.f32(1, 1, 4, 4), e.f32(1, 1, 3, 3), padding=-1),
     nc.ShapeError, "padding"),
    ("conv2d_zero_dilation", lambda e: conv2d(e.f32(1, 1, 4, 4), e.f32(1, 1, 3, 3), dilation=0), nc.ShapeError,
     "dilation"),
    ("conv2d_zero_groups", lambda e: conv2d(e.f32(1, 1, 4, 4), e.f32(1, 1, 3, 3), groups=0), nc.ShapeError,
     "groups"),
    ("conv2d_three_strides", lambda e: conv2d(e.f32(1, 1, 4, 4), e.f32(1, 1, 3, 3), stride=(1, 1, 1)),
     nc.ShapeError, "(1, 1, 1)"),
    ("conv2d_empty_batch", lambda e: conv2d(nc.zeros((0, 1, 4, 4)), e.f32(1, 1, 3, 3)), nc.ShapeError,
     "(0, 1, 4, 4)"),
    ("conv2d_numpy_input", lambda e: conv2d(np.ones((1, 1, 4, 4)), e.f32(1, 1, 3, 3)), nc.DTypeError, "ndarray"),
    ("conv2d_lowering_exceeds_device", lambda e: conv2d(nc.zeros((_batch_beyond_max_alloc(), 64, 64, 64)),
                                                         e.f32(64, 64, 11, 11), strategy="im2col"),
     nc.ShapeError, "bytes"),
    ("gemm_other_context", lambda e: gemm(e.f32(2, 3), e.o32(3, 2)), nc.DeviceError, "context"),
    ("gemm_integer_operands", lambda e: gemm(e.ints(2, 3, dtype=np.int32), e.ints(3, 2, dtype=np.int32)),
     nc.DTypeError, "int32"),
    ("gemm_wrong_rank", lambda e: gemm(e.f32(2, 3, 1), e.f32(3, 2)), nc.ShapeError, "(2, 3, 1)"),
    ("gemm_output_shape", lambda e: gemm(e.f32(2, 3), e.f32(3, 2), e.f32(3, 3)), nc.ShapeError, "(3, 3)"),
    ("im2col_wrong_rank", lambda e: im2col(e.f32(1, 4, 4), 3, 3), nc.ShapeError, "(1, 4, 4)"),
    ("im2col_zero_kernel", lambda e: im2col(e.f32(1, 1, 4, 4), 0, 3), nc.ShapeError, "kernel_h"),
    ("im2col_kernel_larger_than_input", lambda e: im2col(e.f32(1, 1, 4, 4), 7, 7), nc.ShapeError, "7×7"),
    ("col2im_columns_do_not_match", lambda e: col2im(e.f32(5, 9), (1, 1, 4, 4), 3, 3), nc.ShapeError, "(5, 9)"),
    # ---- optimizers
    ("sgd_empty_parameters", lambda e: nc.optim.SGD([], lr=0.1), nc.ShapeError, "empty"),
    ("sgd_negative_lr", _lr(nc.optim.SGD, lr=-1), nc.ShapeError, "lr"),
    ("sgd_nesterov_without_momentum", _lr(nc.optim.SGD, lr=0.1, nesterov=True), nc.ShapeError, "nesterov"),
    ("sgd_integer_parameter", lambda e: nc.optim.SGD([e.ints(3, dtype=np.int32)], lr=0.1), nc.DTypeError, "int32"),
    ("adam_beta_above_one", _lr(nc.optim.Adam, betas=(1.5, 0.9)), nc.ShapeError, "betas"),
    ("optimizer_state_dict_garbage", lambda e: nc.optim.SGD([e.param()], lr=0.1).load_state_dict({"x": 1}),
     nc.CheckpointError, "param_groups"),
    ("optimizer_state_wrong_shape", lambda e: nc.optim.SGD([e.param()], lr=0.1, momentum=0.9).load_state_dict(
        {"state": {0: {"momentum_buffer": np.ones(5, np.float32)}}, "param_groups": [{"lr": 0.1, "params": [0]}]}),
     nc.CheckpointError, "(5,)"),
    ("bug_optimizer_accepts_nan_hyperparameters", _lr(nc.optim.SGD, lr=float("nan")), nc.ShapeError, "lr"),
    # ---- planner
    ("plan_unknown_pass", lambda e: plan_conv2d((1, 1, 8, 8), (1, 1, 3, 3), pass_="sideways"), nc.ShapeError,
     "sideways"),
    ("plan_unknown_mode", lambda e: plan_conv2d((1, 1, 8, 8), (1, 1, 3, 3), mode="guess"), nc.ShapeError, "guess"),
    ("plan_negative_budget", lambda e: plan_conv2d((1, 1, 8, 8), (1, 1, 3, 3), budget_bytes=-5), nc.ShapeError,
     "-5"),
    ("plan_kernel_larger_than_input", lambda e: plan_conv2d((1, 1, 2, 2), (1, 1, 3, 3)), nc.ShapeError, "3×3"),
    ("plan_channel_mismatch", lambda e: plan_conv2d((1, 2, 8, 8), (1, 3, 3, 3)), nc.ShapeError, "(1, 3, 3, 3)"),
    ("bug_planner_accepts_integer_dtype", lambda e: plan_conv2d((1, 1, 8, 8), (1, 1, 3, 3), dtype="int32"),
     nc.DTypeError, "int32"),
    ("bug_planner_nan_budget_raises_raw_valueerror",
     lambda e: plan_conv2d((1, 1, 8, 8), (1, 1, 3, 3), budget_bytes=float("nan")), nc.ShapeError, "budget"),
    # ---- checkpoints
    ("load_missing_checkpoint", lambda e: nc.load(e.tmp / "nope.ckpt"), nc.CheckpointError, "nope.ckpt"),
    ("load_flipped_byte", lambda e: nc.load(e.checkpoint(_flip_last_byte)), nc.CheckpointError, "damaged"),
    ("load_truncated", lambda e: nc.load(e.checkpoint(lambda b: b[:-7])), nc.CheckpointError, "damaged"),
    ("load_foreign_file", lambda e: nc.load(e.checkpoint(lambda b: b"hello, not a checkpoint at all" * 3)),
     nc.CheckpointError, "not a netcl checkpoint"),
    ("load_future_version", lambda e: nc.load(e.checkpoint(lambda b: b[:8] + (99).to_bytes(4, "little") + b[12:])),
     nc.CheckpointError, "version 99"),
    ("save_unsupported_value", lambda e: nc.save({"f": object()}, e.tmp / "o.ckpt"), nc.CheckpointError, "object"),
    ("save_tuple_key", lambda e: nc.save({(1, 2): 1}, e.tmp / "o.ckpt"), nc.CheckpointError, "tuple"),
    ("bug_save_to_unwritable_path_raises_raw_oserror", lambda e: nc.save({"a": 1}, e.tmp), nc.CheckpointError,
     lambda e: str(e.tmp)),
    # ---- MNIST files
    ("mnist_unknown_split", lambda e: nc.data.mnist.load_mnist("validation", data_dir=e.tmp), nc.DataError,
     "validation"),
    ("mnist_missing_files", lambda e: nc.data.mnist.load_mnist("test", data_dir=e.tmp), nc.DataError, "t10k"),
    ("mnist_wrong_magic", lambda e: nc.data.mnist.load_mnist(
        "test", data_dir=e.mnist(images=lambda r: b"\0\0\x08\x01" + r[4:])), nc.DataError, "magic"),
    ("mnist_truncated_images", lambda e: nc.data.mnist.load_mnist(
        "test", data_dir=e.mnist(images=lambda r: r[:5000])), nc.DataError, "truncated"),
    ("mnist_corrupt_gzip", lambda e: nc.data.mnist.load_mnist(
        "test", data_dir=_corrupt_gzip(e.mnist())), nc.DataError, "t10k-images"),
    ("mnist_label_out_of_range", lambda e: nc.data.mnist.load_mnist(
        "test", data_dir=e.mnist(labels=lambda r: r[:8] + bytes([12]) + r[9:])), nc.DataError, "12"),
    ("mnist_count_mismatch", lambda e: nc.data.mnist.load_mnist(
        "test", data_dir=e.mnist(labels=lambda r: r[:4] + (9999).to_bytes(4, "big") + r[8:8 + 9999])),
     nc.DataError, "9999"),
    ("batch_loader_zero_batch", lambda e: nc.data.BatchLoader(np.zeros((4, 28, 28), np.uint8), np.zeros(4, np.int64),
                                                              batch_size=0), nc.ShapeError, "batch_size"),
    ("batch_loader_label_count", lambda e: nc.data.BatchLoader(np.zeros((4, 28, 28), np.uint8),
                                                               np.zeros(5, np.int64), batch_size=2),
     nc.ShapeError, "(5,)"),
]


def _corrupt_gzip(directory: Path) -> Path:
    (directory / "t10k-images-idx3-ubyte.gz").write_bytes(b"\x1f\x8b\x08\x00garbage")
    return directory


def _params():
    for case in CASES:
        yield pytest.param(*case, id=case[0])


def device_still_works(device) -> None:
    x = nc.Tensor.from_host(np.arange(5, dtype=np.float32), device)
    assert ((x * 2.0) + 1.0).to_host().tolist() == [1.0, 3.0, 5.0, 7.0, 9.0]


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("NETCL_CACHE_DIR", str(tmp_path / "cache"))
    return Env(tmp_path)


@pytest.mark.parametrize("what,call,error,text", list(_params()))
def test_bad_call(what, call, error, text, env):
    regression = f" (regression of: {BUGS[what]})" if what in BUGS else ""
    with no_hang(what), pytest.raises(nc.NetclError) as info:
        call(env)
    assert isinstance(info.value, error), \
        f"{what}: raised {type(info.value).__name__}, expected {error.__name__}{regression}"
    text = text(env) if callable(text) else text
    assert text in str(info.value), \
        f"{what}: the message does not name the problem ({text!r}): {info.value}{regression}"
    device_still_works(env.device)


def test_table_is_large_enough():
    assert len(CASES) >= 40


# ---- damaged cache files: ignored with a warning, the operation still right ---------------------------

def _damage_json_files(root: Path) -> list[Path]:
    damaged = [p for p in root.rglob("*.json")]
    for p in damaged:
        p.write_text('{"devices": {"truncated json')
    return damaged


def test_damaged_tuning_database_is_ignored_with_a_warning(env, rng):
    from netcl.runtime import tuning_db as db
    path = db.db_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{ this is not json")
    a, b = rng.uniform(-1, 1, (5, 7)).astype(np.float32), rng.uniform(-1, 1, (7, 3)).astype(np.float32)
    with pytest.warns(RuntimeWarning, match="tuning"), no_hang("gemm with a damaged tuning database"):
        out = gemm(nc.tensor(a), nc.tensor(b)).to_host()
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-6)
    device_still_works(env.device)


PLAN_ARGS = ["plan", "conv", "--input", "1x2x9x9", "--weight", "3x2x3x3", "--pass", "forward", "--mode", "measure",
             "--json"]


def test_damaged_plan_caches_are_ignored_with_a_warning(env):
    """A measured plan and the planner's calibration are kept on disk; a new process that finds them
    damaged warns, plans again and still answers."""
    import subprocess
    import sys

    def plan():
        with no_hang("netcl plan --mode measure"):
            done = subprocess.run([sys.executable, "-m", "netcl"] + PLAN_ARGS, capture_output=True, text=True,
                                  timeout=HANG_SECONDS, env=dict(os.environ))
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr

    first, _ = plan()
    damaged = _damage_json_files(Path(os.environ["NETCL_CACHE_DIR"]))
    assert damaged, "netcl plan --mode measure wrote no cache file to damage"
    second, stderr = plan()
    assert "damaged" in stderr and "RuntimeWarning" in stderr, f"no warning for {damaged}: {stderr}"
    assert [layer["pass"] for layer in second["layers"]] == [layer["pass"] for layer in first["layers"]]
    assert all(layer["strategy"] for layer in second["layers"])
    for path in damaged:
        json.loads(path.read_text())  # the second run rewrote each file whole
    device_still_works(env.device)


def test_damaged_kernel_binaries_are_rebuilt(env, rng):
    from netcl.runtime import kernels
    source = "__kernel void twice(__global float* x) { x[get_global_id(0)] *= 2.0f; }\n// damaged-cache test"
    kernels.build_program(env.other, source)  # a fresh context: nothing memoized
    kernels.save_binaries()
    bins = list(Path(os.environ["NETCL_CACHE_DIR"]).rglob("*.bin"))
    assert bins, "the kernel cache wrote no binary"
    for p in bins:
        p.write_bytes(p.read_bytes()[:40] + b"\0" * 64)
    fresh = Device(env.device.cl_device)
    program = kernels.build_program(fresh, source)
    x = nc.Tensor.from_host(np.arange(4, dtype=np.float32), fresh)
    kernels.launch(fresh, program.twice, (4,), None, x.buffer)
    assert x.to_host().tolist() == [0.0, 2.0, 4.0, 6.0]
    device_still_works(env.device)


# ---- the command line: bad arguments exit 2 with one line on stderr, no traceback ----------------------

CLI_CASES = [
    ("unknown_model", ["train", "resnet"], "resnet"),
    ("epochs_not_a_number", ["train", "lenet", "--epochs", "abc"], "abc"),
    ("input_shape_malformed", ["plan", "conv", "--input", "1x2x3"], "--input"),
    ("channel_mismatch", ["plan", "conv", "--input", "1x3x8x8", "--weight", "4x5x3x3"], "(4, 5, 3, 3)"),
    ("unknown_mode", ["plan", "lenet", "--mode", "fast"], "fast"),
    ("unknown_pass", ["plan", "lenet", "--pass", "sideways"], "sideways"),
    ("negative_budget", ["plan", "lenet", "--budget", "-3"], "-3"),
    ("unknown_benchmark", ["bench", "nope"], "nope"),
    ("unknown_tuner", ["tune", "nope"], "nope"),
    ("stray_argument", ["devices", "--json", "extra"], "extra"),
    ("bug_cli_train_negative_epochs_exits_1", ["train", "lenet", "--epochs", "-1"], "-1"),
    ("bug_cli_train_zero_batch_size_exits_1", ["train", "lenet", "--batch-size", "0"], "0"),
]
CLI_BUGS = {
    "bug_cli_train_negative_epochs_exits_1":
        "`netcl train lenet --epochs -1` exits 1 (a ShapeError from the training loop) where API.md says bad "
        "arguments exit 2 (netcl/training/cli.py should reject it while parsing)",
    "bug_cli_train_zero_batch_size_exits_1":
        "`netcl train lenet --batch-size 0` exits 1 instead of 2, as --epochs -1 (netcl/training/cli.py)",
}


@pytest.mark.parametrize("what,argv,text", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_cli_bad_arguments_exit_2(what, argv, text, env, capsys):
    from netcl.cli.main import main
    with no_hang(f"netcl {' '.join(argv)}"):
        code = main(argv + ["--data-dir", str(MNIST)] if argv[0] == "train" else argv)
    err = capsys.readouterr().err.strip()
    regression = f" (regression of: {CLI_BUGS[what]})" if what in CLI_BUGS else ""
    assert code == 2, f"netcl {' '.join(argv)} exited {code}: {err}{regression}"
    assert len(err.splitlines()) == 1 and "Traceback" not in err, f"not one line: {err}"
    assert text in err, f"the message does not name the problem ({text!r}): {err}"
    device_still_works(env.device)


def test_cli_damaged_checkpoint_exits_1_with_one_line(env, capsys):
    from netcl.cli.main import main
    path = env.checkpoint(_flip_last_byte)
    with no_hang("netcl eval"):
        code = main(["eval", str(path), "--data-dir", str(MNIST)])
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1 and "damaged" in err, (code, err)
    json.dumps({"stderr": err})  # a message a wrapper can log as is
