"""The inference epilogue fused into a convolution's store (netcl.ops.conv2d.conv2d_inference): bias, then the
residual, then the activation, in the strategies that fuse it (direct_blocked, implicit_gemm, depthwise,
winograd; gemm for ungrouped layers, im2col for one ungrouped image) and as a separate pass elsewhere.
Each is checked against float64 NumPy on odd sizes with canaries, and bit for bit against the convolution
followed by BatchNorm's folded epilogue pass (the arithmetic they share, netcl.runtime.cl_activation);
eval-mode models fold their BatchNorms into fused convolutions, and a replayed forward computes what the
forward as written does."""
from __future__ import annotations

import numpy as np
import pytest

import netcl as nc
from netcl.nn import fusion
from netcl.ops.batchnorm import batch_norm_apply
from netcl.ops.conv2d import conv2d, conv2d_inference
from netcl.ops.conv_common import ConvLayer
from netcl.ops.conv_registry import strategies
from netcl.runtime.cl_activation import ACTIVATIONS, apply_activation
from bn_reference import batch_norm_ref
from util import activation_ref, assert_close, conv2d_ref, randomize_batchnorm

# (input NCHW, weight KCRS, stride, padding, groups) per fusing strategy: rows and columns that leave
# partial blocks and tiles, and for direct_blocked also whole-vector rows (its path without bounds tests)
LAYERS = {
    "direct_blocked": [((2, 5, 9, 13), (7, 5, 3, 3), 1, 1, 1), ((1, 3, 4, 32), (4, 3, 3, 3), 1, 1, 1),
                       ((1, 6, 5, 7), (9, 6, 1, 1), 1, 0, 1)],
    "implicit_gemm": [((2, 6, 9, 11), (10, 3, 3, 3), 2, 1, 2), ((1, 5, 7, 6), (3, 5, 1, 1), 1, 0, 1)],
    # rows of strips and border columns; rows of one vector each on a CPU (7 and 14 wide, strided)
    "depthwise": [((2, 6, 11, 37), (12, 1, 3, 3), 1, 1, 6), ((1, 5, 9, 23), (5, 1, 3, 3), 2, 1, 5),
                  ((2, 4, 7, 7), (8, 1, 3, 3), 1, 1, 4), ((1, 5, 6, 14), (5, 1, 3, 3), 1, 1, 5)],
    # rows past a row tile, a moved-back last vector, planes narrower than a vector, groups
    "pointwise": [((2, 5, 9, 13), (13, 5, 1, 1), 1, 0, 1), ((1, 6, 3, 2), (9, 2, 1, 1), 1, 0, 3)],
    # GEMM's store (netcl.ops.gemm): ungrouped 1×1 layers (strided ones gather their input first), and
    # im2col's single images; rows past the vector tiles take the product's element-wise tail
    "gemm": [((2, 5, 9, 13), (7, 5, 1, 1), 1, 0, 1), ((1, 6, 7, 9), (9, 6, 1, 1), 2, 0, 1)],
    "im2col": [((1, 5, 9, 13), (7, 5, 3, 3), 1, 1, 1), ((1, 3, 11, 10), (5, 3, 3, 3), 2, 1, 1)],
    # the output transform's store: the tile kernel (partial tiles of four and rows of two) and, on a
    # CPU, the whole-plane kernels with 4 and 8 samples in the lanes (grouped, no padding)
    "winograd": [((2, 5, 9, 13), (7, 5, 3, 3), 1, 1, 1), ((4, 6, 7, 9), (10, 3, 3, 3), 1, 1, 2),
                 ((8, 3, 6, 5), (4, 3, 3, 3), 1, 0, 1)],
    # F(4×4, 3×3)'s store: partial tiles at the bottom and right, a last work-item of fewer tiles, groups
    "winograd4": [((2, 5, 9, 13), (7, 5, 3, 3), 1, 1, 1), ((1, 3, 7, 37), (5, 3, 3, 3), 1, 1, 1),
                  ((2, 6, 6, 10), (4, 3, 3, 3), 1, 0, 2)],
}
TOLERANCE = {"float32": 2e-6, "float64": 1e-13}


def separate_pass(y, bias, residual, activation):
    """BatchNorm's folded epilogue after a convolution: what a fused epilogue must reproduce bit for bit."""
    return batch_norm_apply(y, None, None, None, bias, residual=residual, relu=activation == "relu",
                            relu6=activation == "relu6", hardswish=activation == "hardswish")


def _operands(spec, dtype, rng, device):
    xs, ws, stride, padding, groups = spec
    x = rng.uniform(-1, 1, xs).astype(dtype)
    w = rng.uniform(-1, 1, ws).astype(dtype)
    k = ws[0]
    ref = conv2d_ref(x, w, (stride, stride), (padding, padding), (1, 1), groups)
    # biases across [-7, 7]: every activation's kinks and clamps are crossed whatever the layer's sums
    bias = (rng.permutation(np.linspace(-7, 7, k)) + rng.uniform(-0.5, 0.5, k)).astype(dtype)
    residual = rng.uniform(-3, 3, ref.shape).astype(dtype)
    tensors = [nc.Tensor.from_host(a, device) for a in (x, w, bias, residual)]
    return ref, bias, residual, tensors


def check_fused(strategy, activation, residual_add, dtype, specs, rng, device):
    """conv2d_inference forced onto ``strategy``: the float64 reference's values, and the bits of the
    convolution followed by the separate epilogue pass."""
    for spec in specs:
        ref, bias, residual, (X, W, B, R) = _operands(spec, dtype, rng, device)
        xs, ws, stride, padding, groups = spec
        assert strategies()[strategy].fuses_epilogue_for(ConvLayer.from_shapes(xs, ws, stride, padding, 1, groups))
        shortcut = R if residual_add else None
        y = conv2d_inference(X, W, B, stride, padding, 1, groups, strategy, residual=shortcut, activation=activation)
        z = ref + bias.reshape(1, -1, 1, 1) + (residual if residual_add else 0)
        what = f"{strategy} {activation} residual={residual_add} {dtype} {spec}"
        assert_close(y.to_host(), activation_ref(z, activation), TOLERANCE[dtype], what)
        plain = conv2d(X, W, None, stride, padding, 1, groups, strategy)
        np.testing.assert_array_equal(y.to_host(), separate_pass(plain, B, shortcut, activation).to_host(),
                                      err_msg=f"{what}: fused vs convolution + epilogue pass")
        if activation in ("relu6", "hardswish"):
            assert np.any(z > 6) and np.any(z < -3), "the data reach past the activation's kinks"


@pytest.mark.parametrize("residual_add", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("strategy", sorted(LAYERS))
def test_fused_epilogue_equals_float64_and_the_separate_pass(strategy, activation, residual_add, rng, device,
                                                            canaries):
    check_fused(strategy, activation, residual_add, "float32", LAYERS[strategy], rng, device)


@pytest.mark.parametrize("strategy", sorted(LAYERS))
def test_fused_epilogue_in_float64(strategy, rng, device, canaries):
    """Double vectors: their selects' masks are long lanes (the full matrix: the slow test below)."""
    if not device.has_fp64:
        pytest.skip("the device has no float64")
    check_fused(strategy, "hardswish", True, "float64", LAYERS[strategy][:1], rng, device)
    check_fused(strategy, "relu6", False, "float64", LAYERS[strategy][-1:], rng, device)


@pytest.mark.slow
@pytest.mark.parametrize("residual_add", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("strategy", sorted(LAYERS))
def test_fused_epilogue_in_float64_every_variant(strategy, activation, residual_add, rng, device, canaries):
    if not device.has_fp64:
        pytest.skip("the device has no float64")
    check_fused(strategy, activation, residual_add, "float64", LAYERS[strategy], rng, device)


def test_winograd_epilogue_in_chunks_of_samples(monkeypatch, rng, device, canaries):
    """Winograd's data pass runs a chunk of samples at a time (samples_per_chunk): each chunk's output
    transform adds the residual of its own samples."""
    from netcl.ops import conv_winograd
    spec = ((6, 4, 9, 11), (5, 4, 3, 3), 1, 1, 1)
    monkeypatch.setattr(conv_winograd, "CHUNK_BYTES", 16 * (4 + 5) * 5 * 6 * 4 * 2)  # two samples a chunk
    assert conv_winograd.samples_per_chunk(6, 4, 5, 9, 11, 4) == 2
    for activation in ("relu", "hardswish"):
        check_fused("winograd", activation, True, "float32", [spec], rng, device)


@pytest.mark.parametrize("strategy", sorted(LAYERS))
def test_fused_epilogue_without_a_bias(strategy, rng, device, canaries):
    """No bias: the residual and the activation alone, still in the convolution's store."""
    spec = LAYERS[strategy][0]
    ref, _, residual, (X, W, _, R) = _operands(spec, "float32", rng, device)
    _, _, stride, padding, groups = spec
    y = conv2d_inference(X, W, None, stride, padding, 1, groups, strategy, residual=R, activation="relu6")
    assert_close(y.to_host(), activation_ref(ref + residual, "relu6"), TOLERANCE["float32"], strategy)
    y = conv2d_inference(X, W, None, stride, padding, 1, groups, strategy)
    assert_close(y.to_host(), ref, TOLERANCE["float32"], f"{strategy} without an epilogue")


@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("activation", ["relu", "hardswish"])
def test_a_strategy_that_fuses_nothing_runs_the_epilogue_after_it(activation, with_bias, rng, device, canaries):
    """im2col fuses no epilogue into several images: the convolution, then one pass (with a bias,
    BatchNorm's folded epilogue: the same bits as a fused one)."""
    spec = ((2, 4, 7, 9), (6, 4, 3, 3), 1, 1, 1)
    assert not strategies()["im2col"].fuses_epilogue_for(ConvLayer.from_shapes(spec[0], spec[1], 1, 1, 1, 1))
    ref, bias, residual, (X, W, B, R) = _operands(spec, "float32", rng, device)
    B = B if with_bias else None
    y = conv2d_inference(X, W, B, 1, 1, 1, 1, "im2col", residual=R, activation=activation)
    z = ref + residual + (bias.reshape(1, -1, 1, 1) if with_bias else 0)
    assert_close(y.to_host(), activation_ref(z, activation), TOLERANCE["float32"], f"im2col {activation}")
    if with_bias:
        plain = conv2d(X, W, None, 1, 1, 1, 1, "im2col")
        np.testing.assert_array_equal(y.to_host(), separate_pass(plain, B, R, activation).to_host())
        assert_close(conv2d_inference(X, W, B, 1, 1, strategy="im2col").to_host(), ref + bias.reshape(1, -1, 1, 1),
                     TOLERANCE["float32"], "im2col with its bias alone")


def test_conv2d_inference_rejects_bad_epilogues(rng, device):
    X = nc.Tensor.from_host(rng.uniform(-1, 1, (1, 2, 5, 5)).astype(np.float32), device)
    W = nc.Tensor.from_host(rng.uniform(-1, 1, (3, 2, 3, 3)).astype(np.float32), device)
    with pytest.raises(nc.ShapeError, match="unknown activation 'gelu'"):
        conv2d_inference(X, W, activation="gelu")
    with pytest.raises(nc.ShapeError, match=r"residual of shape \(1, 3, 5, 5\) does not match the output \(1, 3, 3, 3\)"):
        conv2d_inference(X, W, residual=nc.zeros((1, 3, 5, 5), device=device))
    with pytest.raises(nc.DTypeError, match="residual is float64"):
        if not device.has_fp64:
            raise nc.DTypeError("residual is float64 (a device without float64)")
        conv2d_inference(X, W, residual=nc.zeros((1, 3, 3, 3), np.float64, device=device))
    with pytest.raises(nc.DTypeError, match="residual must be a netcl Tensor"):
        conv2d_inference(X, W, residual=np.zeros((1, 3, 3, 3), np.float32))
    with pytest.raises(nc.ShapeError, match="unknown epilogue activation"):
        apply_activation("tanh", "z", "float")


class Bottleneck(nc.nn.Module):
    """A ResNet block (Conv-BN-ReLU, Conv-BN, + x, ReLU), a MobileNetV2 block (1×1 Conv-BN-ReLU6, 3×3 depthwise
    Conv-BN-ReLU6, 1×1 Conv-BN, + its input) and a MobileNetV3 unit (strided Conv-BN-Hardswish), each
    convolution forced onto a strategy that fuses its epilogue."""

    def __init__(self, channels: int = 6, hidden: int = 12):
        super().__init__()
        nn = nc.nn
        self.res1 = nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1, bias=False, strategy="direct_blocked"),
                                  nn.BatchNorm2d(channels), nn.ReLU())
        self.res_conv = nn.Conv2d(channels, channels, 3, padding=1, bias=False, strategy="implicit_gemm")
        self.res_bn = nn.BatchNorm2d(channels)
        self.expand = nn.Sequential(nn.Conv2d(channels, hidden, 1, bias=False, strategy="direct_blocked"),
                                    nn.BatchNorm2d(hidden), nn.ReLU6())
        self.dw = nn.Sequential(nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden, bias=False,
                                          strategy="depthwise"), nn.BatchNorm2d(hidden), nn.ReLU6())
        self.proj_conv = nn.Conv2d(hidden, channels, 1, bias=False, strategy="direct_blocked")
        self.proj_bn = nn.BatchNorm2d(channels)
        self.v3 = nn.Sequential(nn.Conv2d(channels, 5, 3, stride=2, padding=1, bias=False, strategy="implicit_gemm"),
                                nn.BatchNorm2d(5), nn.Hardswish())

    def forward(self, x):
        h = fusion.run([self.res_conv, self.res_bn, fusion.Residual(x), nc.nn.ReLU()], self.res1(x))
        m = fusion.run([self.proj_conv, self.proj_bn, fusion.Residual(h)], self.dw(self.expand(h)))
        return self.v3(m)


def _conv_bn_ref(x, conv, bn, activation="none", residual=None):
    """float64 conv → BatchNorm with running statistics [+ residual] → activation."""
    z = conv2d_ref(x, conv.weight.to_host().astype(np.float64), conv.stride, conv.padding, (1, 1), conv.groups)
    z, _ = batch_norm_ref(z, bn.weight.to_host(), bn.bias.to_host(), eps=bn.eps, mean=bn.running_mean.to_host(),
                          var=bn.running_var.to_host(), residual=residual)
    return activation_ref(z, activation)


def bottleneck_ref(model, x):
    h = _conv_bn_ref(x, model.res1[0], model.res1[1], "relu")
    h = activation_ref(_conv_bn_ref(h, model.res_conv, model.res_bn, residual=x), "relu")
    m = _conv_bn_ref(h, model.expand[0], model.expand[1], "relu6")
    m = _conv_bn_ref(m, model.dw[0], model.dw[1], "relu6")
    m = _conv_bn_ref(m, model.proj_conv, model.proj_bn, residual=h)
    return _conv_bn_ref(m, model.v3[0], model.v3[1], "hardswish")


def _bottleneck(rng, device):
    nc.manual_seed(int(rng.integers(1 << 30)))
    model = Bottleneck()
    randomize_batchnorm(model, rng)
    model.eval()
    return model


def test_eval_models_fold_into_fused_convolutions(rng, device, canaries):
    model = _bottleneck(rng, device)
    x = rng.uniform(-2, 2, (2, 6, 9, 11)).astype(np.float32)
    with nc.no_grad():
        assert [name for name, _ in fusion.plan(list(model.dw))] == ["conv+bn+relu6 (eval: folded)"]
        y = model(nc.Tensor.from_host(x, device)).to_host()
    assert_close(y, bottleneck_ref(model, x.astype(np.float64)), 1e-5, "eval bottleneck vs float64")


def test_replayed_inference_equals_eager_and_launches_only_the_convolutions(rng, device):
    model = _bottleneck(rng, device)
    infer = nc.training.CapturedInference(model)
    inputs = [rng.uniform(-2, 2, (1, 6, 9, 11)).astype(np.float32) for _ in range(6)]
    outputs = [infer(nc.Tensor.from_host(x, device)).to_host() for x in inputs]
    assert infer.replaying and infer.replays == 3, infer.status
    assert infer.launches == 6, f"six fused convolutions and nothing else, got {infer.launches} launches"
    for x, out in zip(inputs, outputs):
        with nc.no_grad():
            np.testing.assert_array_equal(out, model(nc.Tensor.from_host(x, device)).to_host())
