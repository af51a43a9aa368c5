"""The register-blocked direct strategy beyond the shared sweep: random stride-1 layers (every kernel size,
padding and row width its lane selections must handle), random strided layers (forward and weight
gradient), the blockings other devices get (8 and 4 lanes, 8 accumulators) run here by overriding the
device's reported vector width, and the fused bias."""
from __future__ import annotations

import numpy as np
import pytest

import netcl as nc
from netcl.ops import conv_direct_blocked as blocked
from netcl.ops.conv2d import conv2d
from netcl.ops.conv_common import ConvLayer
from netcl.runtime import tuning_db as db
from util import assert_close, conv2d_grads_ref, conv2d_ref


@pytest.fixture(autouse=True)
def untuned(tmp_path, monkeypatch):
    """A private, empty tuning database: the blockings then follow the reported width these tests set
    (a tuned GEMM's tile width would take precedence, netcl.ops.gemm.register_lanes)."""
    monkeypatch.delenv("NETCL_CACHE", raising=False)
    monkeypatch.setattr(db, "db_path", lambda: tmp_path / "tuning.json")


def _random_layer(rng):
    r, s = int(rng.integers(1, 8)), int(rng.integers(1, 8))
    ph, pw = int(rng.integers(0, r)), int(rng.integers(0, s))  # ≤ kernel − 1: every pass is served
    h, w = int(rng.integers(max(1, r - 2 * ph), 12)), int(rng.integers(max(1, s - 2 * pw), 40))
    return ((int(rng.integers(1, 4)), int(rng.integers(1, 6)), h, w), (int(rng.integers(1, 20)), 0, r, s), (ph, pw))


def check(xs, ws, padding, rng, device, dtype="float32"):
    ws = (ws[0], xs[1], ws[2], ws[3])
    layer = ConvLayer.from_shapes(xs, ws, 1, padding, 1, 1, dtype)
    assert all(blocked.STRATEGY.why_not(layer, p) is None for p in ("forward", "backward_data", "backward_weight"))
    x, w = rng.uniform(-1, 1, xs).astype(dtype), rng.uniform(-1, 1, ws).astype(dtype)
    gy = rng.uniform(-1, 1, layer.output_shape).astype(dtype)
    X = nc.Tensor.from_host(x, device, requires_grad=True)
    W = nc.Tensor.from_host(w, device, requires_grad=True)
    y = conv2d(X, W, padding=padding, strategy="direct_blocked")
    y.backward(nc.Tensor.from_host(gy, device))
    args = ((1, 1), padding, (1, 1), 1)
    gx_ref, gw_ref = conv2d_grads_ref(x, w, gy, *args)
    what = f"x {xs}, w {ws}, padding {padding}"
    assert_close(y.to_host(), conv2d_ref(x, w, *args), 1e-5, f"forward of {what}")
    assert_close(X.grad.to_host(), gx_ref, 1e-4, f"grad input of {what}")
    assert_close(W.grad.to_host(), gw_ref, 1e-4, f"grad weight of {what}")


@pytest.mark.parametrize("index", range(12))
def test_random_stride_one_layers(index, rng, device, canaries):
    check(*_random_layer(rng), rng, device)


def check_strided(xs, ws, stride, padding, rng, device, dtype="float32"):
    """forward and backward_weight of a strided layer (backward_data, a transposed strided convolution,
    is another strategy's), through the strategy itself."""
    layer = ConvLayer.from_shapes(xs, ws, stride, padding, 1, 1, dtype)
    assert blocked.STRATEGY.why_not(layer, "forward") is None
    assert blocked.STRATEGY.why_not(layer, "backward_weight") is None
    assert "transposed convolution" in blocked.STRATEGY.why_not(layer, "backward_data")
    x, w = rng.uniform(-1, 1, xs).astype(dtype), rng.uniform(-1, 1, ws).astype(dtype)
    gy = rng.uniform(-1, 1, layer.output_shape).astype(dtype)
    X, W = nc.Tensor.from_host(x, device), nc.Tensor.from_host(w, device)
    y = blocked.STRATEGY.forward(X, W, layer)
    gw = blocked.STRATEGY.backward_weight(X, nc.Tensor.from_host(gy, device), layer)
    args = ((stride, stride), padding, (1, 1), 1)
    what = f"x {xs}, w {ws}, stride {stride}, padding {padding}, blocking {blocked.blocking(layer, 'forward', device)}"
    assert_close(y.to_host(), conv2d_ref(x, w, *args), 1e-5, f"forward of {what}")
    assert_close(gw.to_host(), conv2d_grads_ref(x, w, gy, *args)[1], 1e-4, f"grad weight of {what}")


@pytest.mark.parametrize("index", range(8))
def test_random_strided_layers(index, rng, device, canaries):
    stride = int(rng.integers(2, 4))
    r, s = int(rng.integers(1, 8)), int(rng.integers(1, 8))
    ph, pw = int(rng.integers(0, r)), int(rng.integers(0, s))
    h, w = int(rng.integers(max(1, r - 2 * ph), 14)), int(rng.integers(max(1, s - 2 * pw), 60))
    xs = (int(rng.integers(1, 4)), int(rng.integers(1, 6)), h, w)
    check_strided(xs, (int(rng.integers(1, 20)), xs[1], r, s), stride, (ph, pw), rng, device)


@pytest.mark.parametrize("xs, ws, padding", [((1, 3, 37, 45), (16, 3, 7, 7), 3),     # a stem's 7×7
                                             ((2, 3, 33, 40), (8, 3, 3, 3), 1)])    # and 3×3, on odd sizes
def test_stems(xs, ws, padding, rng, device, canaries):
    check_strided(xs, ws, 2, (padding, padding), rng, device)


@pytest.mark.parametrize("native", [4, 8])
def test_blockings_of_narrower_devices(native, rng, device, monkeypatch, canaries):
    monkeypatch.setitem(device.native_vector_width, "float32", native)
    layer = ConvLayer.from_shapes((2, 5, 9, 21), (24, 5, 3, 3), 1, 1)
    assert blocked.lanes(device, "float32") == native
    assert blocked.blocking(layer, "forward", device)["KB"] <= 8
    check((2, 5, 9, 21), (24, 5, 3, 3), (1, 1), rng, device)
    check((1, 3, 6, 3), (7, 3, 3, 3), (1, 1), rng, device)
    check_strided((1, 3, 19, 37), (8, 3, 7, 7), 2, (3, 3), rng, device)
    check_strided((2, 4, 11, 29), (6, 4, 3, 3), 3, (1, 1), rng, device)


def test_blocks_follow_the_tuned_gemm_width_on_a_cpu(rng, device, monkeypatch, canaries):
    """Where `netcl tune gemm` found 8-lane tiles fastest on a device reporting 16 lanes (the PoCL wheel's
    AVX2 code on a Zen 4), the blocks are 8 lanes wide too; an untuned device keeps its reported width."""
    from netcl.ops import gemm as gemm_module
    if device.kind != "cpu":
        pytest.skip("register blocks follow the tuned width on CPU devices only")
    monkeypatch.setitem(device.native_vector_width, "float32", 16)
    assert gemm_module.register_lanes(device, "float32") == 16
    assert blocked.lanes(device, "float32") == 16 and blocked.channel_budget(device, "forward", 3) == 16
    tuned = {**gemm_module.params_for(device, np.float32, 1024, 1024, 1024), "VW": 8, "MR": 4, "NV": 2}
    db.store(device, "gemm", tuned, key="float32/large")
    assert gemm_module.register_lanes(device, "float32") == 8
    assert blocked.lanes(device, "float32") == 8 and blocked.channel_budget(device, "forward", 3) == 8
    check((2, 5, 9, 21), (24, 5, 3, 3), (1, 1), rng, device)
    db.forget(device, "gemm")  # and without the measurement, the reported width again
    assert blocked.lanes(device, "float32") == 16


@pytest.mark.parametrize("native", [None, 4, 8, 16])
def test_rows_share_a_vector_when_narrow(native, device, monkeypatch):
    """A 3-wide row shares the vector with the next rows: the whole row in one block where the vector has
    8 or 16 lanes, half of it (the last block shifted back onto the row) where it has 4, as on a GPU.
    ``native``: the vector width the device reports (None: its own)."""
    if native is not None:
        monkeypatch.setitem(device.native_vector_width, "float32", native)
    wide, narrow = (ConvLayer.from_shapes((1, 4, 8, w), (4, 4, 3, 3), 1, 1) for w in (40, 3))
    assert blocked.blocking(wide, "forward", device)["ROWS"] == 1
    block = blocked.blocking(narrow, "forward", device)
    width = blocked.lanes(device, "float32")
    assert block["ROWS"] > 1 and block["QW"] * block["ROWS"] == width
    assert block["QW"] >= min(3, width // 2)


@pytest.mark.parametrize("native", [4, 8, 16])
def test_blocks_that_fill_the_output_exactly(native, rng, device, monkeypatch, canaries):
    # rows a whole number of vectors wide (ResNet's 32/16/8): compiled without the bounds-tested path
    monkeypatch.setitem(device.native_vector_width, "float32", native)
    xs, ws = (3, 4, 2 * native, 2 * native), (8, 4, 3, 3)
    layer = ConvLayer.from_shapes(xs, ws, 1, 1)
    assert not any(blocked.blocking(layer, p, device)["TAIL"] for p in ("forward", "backward_data", "backward_weight"))
    odd = blocked.blocking(ConvLayer.from_shapes((3, 4, 9, 2 * native + 1), ws, 1, 1), "forward", device)
    assert odd["TAIL"] or odd["SHIFT"]
    check(xs, ws, (1, 1), rng, device)
    check((2, 3, native // 2, native // 2), (5, 3, 3, 3), (1, 1), rng, device)  # rows share a vector


@pytest.mark.parametrize("native", [4, 8, 16])
def test_last_blocks_shifted_back_onto_the_output(native, rng, device, monkeypatch, canaries):
    """Outputs wider (higher) than a block but no whole number of blocks, without padding (the MEC
    paper's 222-, 110- and 54-wide rows): the last block of a row, or of the rows, overlaps its neighbour,
    stores whole vectors (forward, backward_data) or weighs the overlap 0 (backward_weight);
    backward_data's rows still load past its narrower input."""
    monkeypatch.setitem(device.native_vector_width, "float32", native)
    xs, ws = (2, 3, 2 * native + 3, 3 * native + 1), (6, 3, 3, 3)
    layer = ConvLayer.from_shapes(xs, ws)
    block = {p: blocked.blocking(layer, p, device) for p in ("forward", "backward_data", "backward_weight")}
    assert block["forward"]["SHIFT"] and not block["forward"]["TAIL"]
    assert block["backward_data"]["SHIFT"] and block["backward_data"]["TAIL"]
    assert block["backward_weight"]["SHIFT"] and not block["backward_weight"]["TAIL"]
    check(xs, ws, (0, 0), rng, device)
    check((1, 2, 11, 2 * native - 1), (5, 2, 2, 4), (0, 1), rng, device)
    # padded wider than the kernel reaches: backward_weight's shifted blocks still load past the input
    padded = ConvLayer.from_shapes((2, 3, 9, 3 * native + 1), ws, 1, (1, 2))
    assert blocked.blocking(padded, "backward_weight", device)["SHIFT"]
    assert blocked.blocking(padded, "backward_weight", device)["TAIL"]
    check((2, 3, 9, 3 * native + 1), ws, (1, 2), rng, device)
    if native == 16:
        # 14-wide rows: half the vector over two rows, the last block of a row shifted
        block = blocked.blocking(ConvLayer.from_shapes((2, 3, 8, 16), ws), "forward", device)
        assert (block["QW"], block["ROWS"], block["SHIFT"], block["TAIL"]) == (8, 2, True, False)
        check((2, 3, 8, 16), ws, (0, 0), rng, device)
        # 8-wide rows sharing the vector, 5 of them: the last pair of rows shifted
        block = blocked.blocking(ConvLayer.from_shapes((2, 3, 7, 10), ws), "forward", device)
        assert (block["QW"], block["ROWS"], block["SHIFT"], block["TAIL"]) == (8, 2, True, False)
        check((2, 3, 7, 10), ws, (0, 0), rng, device)


@pytest.mark.parametrize("pass_", ["forward", "backward_data"])
def test_packed_weight_layout(pass_, rng, device, canaries):
    """The output kernel's weight: KB channels side by side per (input channel, row, column), flipped and
    transposed for backward_data."""
    k, c, r, s = 24, 5, 3, 5
    layer = ConvLayer.from_shapes((2, c, 9, 11), (k, c, r, s), 1, (1, 2))
    block = blocked.blocking(layer, pass_, device)
    w = rng.uniform(-1, 1, (k, c, r, s)).astype(np.float32)
    wt = w[:, :, ::-1, ::-1].transpose(1, 0, 2, 3) if pass_ == "backward_data" else w
    kb, (out_channels, in_channels) = block["KB"], wt.shape[:2]
    expected = wt.reshape(out_channels // kb, kb, in_channels, r, s).transpose(0, 2, 3, 4, 1).ravel()
    packed = blocked.packed_weight(nc.Tensor.from_host(w, device), layer, block)
    np.testing.assert_array_equal(packed.to_host(), expected)


def test_fused_bias(rng, device, canaries):
    x = rng.uniform(-1, 1, (2, 3, 7, 11)).astype(np.float32)
    w = rng.uniform(-1, 1, (6, 3, 3, 3)).astype(np.float32)
    b = rng.uniform(-1, 1, 6).astype(np.float32)
    y = conv2d(nc.Tensor.from_host(x, device), nc.Tensor.from_host(w, device), nc.Tensor.from_host(b, device),
               padding=1, strategy="direct_blocked")
    assert_close(y.to_host(), conv2d_ref(x, w, (1, 1), (1, 1)) + b[None, :, None, None], 1e-5, "forward + bias")


def test_float64(rng, device, canaries):
    if not device.has_fp64:
        pytest.skip(f"{device.describe()} has no float64")
    check((2, 3, 5, 19), (5, 3, 3, 3), (1, 1), rng, device, "float64")


@pytest.mark.parametrize("layer, pass_, words", [
    (((1, 4, 8, 8), (4, 4, 3, 3), 2, 1, 1, 1), "backward_data", "stride"),
    (((1, 4, 8, 8), (4, 4, 3, 3), (2, 1), 1, 1, 1), "forward", "stride"),
    (((1, 4, 8, 8), (4, 4, 3, 3), 1, 2, 2, 1), "forward", "dilation"),
    (((1, 4, 8, 8), (4, 2, 3, 3), 1, 1, 1, 2), "forward", "groups"),
    (((1, 4, 8, 8), (4, 4, 3, 3), 1, 3, 1, 1), "backward_data", "padding"),
])
def test_why_not_names_the_rule(layer, pass_, words):
    reason = blocked.STRATEGY.why_not(ConvLayer.from_shapes(*layer), pass_)
    assert reason and words in reason


def test_backward_data_cost_counts_every_input_position():
    """backward_data computes all H x W input positions with all taps (those in the padding too): a 5x5
    gradient of a 7x7 input without padding issues 49/25 of the forward pass's multiply-adds."""
    layer = ConvLayer.from_shapes((1, 16, 7, 7), (8, 16, 3, 3))
    assert blocked.issued_flops(layer, "forward") == layer.flops
    assert blocked.issued_flops(layer, "backward_weight") == layer.flops
    assert blocked.issued_flops(layer, "backward_data") == layer.flops * 49 / 25
