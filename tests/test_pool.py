"""Max and average pooling (kernels/pool.cl): forward and backward against float64 NumPy and finite
differences, over kernel/stride/padding/dilation combinations including the dilated stride-1 pooling
P_{k,d} of the dense-labeling paper, on images narrow enough that every column is an edge column and wide
enough for the vector block kernels (with a shifted last block and edge columns on both sides)."""
from __future__ import annotations

import numpy as np
import pytest

import netcl as nc
from netcl.nn import functional as F
from netcl.ops.pool import PoolGeometry
from nn_reference import finite_difference, pool_ref, scalar_through
from util import assert_close

# (input shape, kernel, stride, padding, dilation); the geometry is compiled into each kernel, so the
# default suite keeps a few representative cases and the rest run with -m slow.
slow = pytest.mark.slow
CASES = [
    ((2, 3, 8, 8), (2, 2), (2, 2), (0, 0), (1, 1)),      # LeNet's pooling: disjoint, covering
    ((1, 2, 7, 9), (2, 2), (2, 2), (0, 0), (1, 1)),      # disjoint, odd sizes leave an uncovered edge
    ((2, 1, 13, 7), (3, 3), (1, 1), (1, 1), (1, 1)),     # overlapping, padded
    ((1, 3, 17, 13), (2, 2), (1, 1), (0, 0), (2, 2)),    # P_{2,2}: dilated, stride 1
    pytest.param((1, 2, 31, 17), (3, 2), (1, 1), (0, 0), (4, 3), marks=slow),   # P_{k,d} with d > k
    pytest.param((3, 2, 9, 11), (3, 3), (2, 3), (1, 0), (2, 1), marks=slow),    # mixed stride/padding/dilation
    pytest.param((1, 1, 9, 9), (9, 9), (1, 1), (0, 0), (1, 1), marks=slow),     # 81 taps: the looped path
    pytest.param((2, 2, 12, 12), (2, 2), (4, 4), (0, 0), (3, 3), marks=slow),   # disjoint, gaps inside windows
    pytest.param((1, 2, 11, 11), (2, 3), (3, 2), (1, 1), (2, 1), marks=slow),   # disjoint and padded
]


def _run(op, x, k, s, p, d, count_include_pad=True):
    if op == "max":
        return F.max_pool2d(x, k, s, p, d)
    return F.avg_pool2d(x, k, s, p, count_include_pad=count_include_pad, dilation=d)


@pytest.mark.parametrize("shape,k,s,p,d", CASES)
@pytest.mark.parametrize("op", ["max", "avg"])
def test_pool_forward_backward_float32(device, rng, canaries, shape, k, s, p, d, op):
    x_host = rng.uniform(-2, 2, size=shape).astype(np.float32)
    x = nc.tensor(x_host, device=device, requires_grad=True)
    y = _run(op, x, k, s, p, d)
    y_ref, grad_ref = pool_ref(x_host, k, s, p, d, op)
    assert y.shape == y_ref.shape
    assert_close(y.to_host(), y_ref, 1e-6, f"{op} pool forward")
    gy = rng.uniform(-2, 2, size=y.shape).astype(np.float32)
    y.backward(nc.tensor(gy, device=device))
    assert_close(x.grad.to_host(), grad_ref(gy), 1e-6, f"{op} pool backward")


@pytest.mark.parametrize("count_include_pad", [True, False])
def test_avg_pool_padding_divisor(device, rng, canaries, count_include_pad):
    x_host = rng.uniform(-2, 2, size=(2, 3, 7, 7)).astype(np.float32)
    x = nc.tensor(x_host, device=device, requires_grad=True)
    y = F.avg_pool2d(x, 3, 2, 1, count_include_pad=count_include_pad)
    y_ref, grad_ref = pool_ref(x_host, (3, 3), (2, 2), (1, 1), (1, 1), "avg", count_include_pad)
    assert_close(y.to_host(), y_ref, 1e-6, "avg pool forward")
    gy = rng.uniform(-2, 2, size=y.shape).astype(np.float32)
    y.backward(nc.tensor(gy, device=device))
    assert_close(x.grad.to_host(), grad_ref(gy), 1e-6, "avg pool backward")


@pytest.mark.parametrize("shape,k,s,p,d", [CASES[1], CASES[2], pytest.param(*CASES[5].values, marks=slow),
                                           ((1, 2, 5, 23), (3, 3), (2, 2), (1, 1), (1, 1))])  # block kernels
@pytest.mark.parametrize("op", ["max", "avg"])
def test_pool_gradient_finite_differences_float64(device, rng, shape, k, s, p, d, op):
    if not device.has_fp64:
        pytest.skip("device has no float64")
    x_host = rng.uniform(-2, 2, size=shape)
    gy = rng.uniform(-1, 1, size=PoolGeometry.make(shape, k, s, p, d).output_shape)
    x = nc.tensor(x_host, device=device, requires_grad=True)
    y = _run(op, x, k, s, p, d)
    y.backward(nc.tensor(gy, device=device))
    numeric = finite_difference(scalar_through(lambda t: _run(op, t, k, s, p, d), gy, device), x_host)
    assert_close(x.grad.to_host(), numeric, 1e-7, f"{op} pool gradient vs finite differences")
    assert_close(x.grad.to_host(), pool_ref(x_host, k, s, p, d, op)[1](gy), 1e-12, f"{op} pool vs float64 ref")


@pytest.mark.parametrize("fused_relu", [False, True])
def test_max_pool_ties_take_first_and_nan_propagates(device, canaries, fused_relu):
    x = np.zeros((1, 1, 2, 4), np.float32)
    x[0, 0, 0, 0] = x[0, 0, 1, 1] = 1.0
    x[0, 0, 1, 3] = np.nan
    t = nc.tensor(x, device=device, requires_grad=True)
    y = F.max_pool2d(t, 2, fused_relu=fused_relu)
    out = y.to_host()
    assert out[0, 0, 0, 0] == 1 and np.isnan(out[0, 0, 0, 1])
    y.backward(nc.tensor(np.ones((1, 1, 1, 2), np.float32), device=device))
    g = t.grad.to_host()[0, 0]
    # the first of the tied maxima; a NaN window's gradient goes to its largest other tap
    assert g[0, 0] == 1 and g[1, 1] == 0 and g[0, 2] == 1 and g.sum() == 2


def test_pool_layers_and_default_stride(device, rng):
    x = nc.tensor(rng.standard_normal((2, 3, 9, 9)).astype(np.float32), device=device)
    assert nc.nn.MaxPool2d(3)(x).shape == (2, 3, 3, 3)
    assert nc.nn.AvgPool2d(3, stride=1, dilation=2)(x).shape == (2, 3, 5, 5)
    assert "dilation=(2, 2)" in repr(nc.nn.MaxPool2d(2, 1, 0, 2))


@pytest.mark.parametrize("kwargs,needle", [
    (dict(kernel_size=0), "kernel_size"),
    (dict(kernel_size=2, stride=0), "stride"),
    (dict(kernel_size=2, padding=2), "half the effective kernel"),
    (dict(kernel_size=3, dilation=5), "larger than the padded input"),
])
def test_pool_bad_geometry_raises_shape_error(device, kwargs, needle):
    x = nc.zeros((1, 1, 6, 6), device=device)
    with pytest.raises(nc.ShapeError, match=needle):
        F.max_pool2d(x, **kwargs)


def test_pool_rejects_wrong_rank_and_dtype(device):
    with pytest.raises(nc.ShapeError, match="4-D"):
        F.max_pool2d(nc.zeros((6, 6), device=device), 2)
    with pytest.raises(nc.DTypeError):
        F.avg_pool2d(nc.tensor(np.zeros((1, 1, 4, 4), np.int32), device=device), 2)


@pytest.mark.parametrize("shape,k,s,p,d", [CASES[0], CASES[2], CASES[3]])
def test_fused_relu_max_pool_equals_relu_then_pool(device, rng, canaries, shape, k, s, p, d):
    x_host = rng.uniform(-2, 2, size=shape).astype(np.float32)
    x_host[0, 0, :3, :3] = -1.0  # a window with no positive value
    gy = rng.uniform(-1, 1, size=PoolGeometry.make(shape, k, s, p, d).output_shape).astype(np.float32)
    results = []
    for fused in (True, False):
        x = nc.tensor(x_host, device=device, requires_grad=True)
        y = F.max_pool2d(x, k, s, p, d, fused_relu=True) if fused else F.max_pool2d(x.relu(), k, s, p, d)
        y.backward(nc.tensor(gy, device=device))
        results.append((y.to_host(), x.grad.to_host()))
    assert np.array_equal(results[0][0], results[1][0])
    assert np.array_equal(results[0][1], results[1][1])
    model = nc.nn.Sequential(nc.nn.ReLU(), nc.nn.MaxPool2d(k, s, p, d))
    assert np.array_equal(model(nc.tensor(x_host, device=device)).to_host(), results[1][0])


# (input shape, kernel, stride, padding, padding_end, dilation, ceil_mode): GoogLeNet's and SqueezeNet's
# ceil_mode pooling, windows reaching past the padded input, and ONNX's asymmetric pads.
CEIL_AND_END_CASES = [
    ((1, 2, 13, 11), (3, 3), (2, 2), (0, 0), None, (1, 1), True),    # overlapping windows, last one clipped
    ((2, 1, 9, 7), (2, 2), (2, 2), (1, 1), None, (1, 1), True),      # a last window in the padding is dropped
    ((1, 2, 10, 9), (3, 3), (2, 2), (1, 0), (0, 1), (1, 1), False),  # asymmetric pads
    ((1, 1, 11, 10), (2, 3), (2, 2), (0, 1), (1, 1), (1, 1), True),  # both, disjoint in height
]


@pytest.mark.parametrize("shape,k,s,p,p_end,d,ceil", CEIL_AND_END_CASES)
@pytest.mark.parametrize("op,count_include_pad", [("max", True), ("avg", True), ("avg", False)])
def test_pool_ceil_mode_and_end_padding(device, rng, canaries, shape, k, s, p, p_end, d, ceil, op,
                                        count_include_pad):
    x_host = rng.uniform(-2, 2, size=shape).astype(np.float32)
    x = nc.tensor(x_host, device=device, requires_grad=True)
    if op == "max":
        y = F.max_pool2d(x, k, s, p, d, ceil_mode=ceil, padding_end=p_end)
    else:
        y = F.avg_pool2d(x, k, s, p, ceil, count_include_pad, dilation=d, padding_end=p_end)
    y_ref, grad_ref = pool_ref(x_host, k, s, p, d, op, count_include_pad, ceil, p_end)
    assert y.shape == y_ref.shape
    assert_close(y.to_host(), y_ref, 1e-6, f"{op} pool forward")
    gy = rng.uniform(-2, 2, size=y.shape).astype(np.float32)
    y.backward(nc.tensor(gy, device=device))
    assert_close(x.grad.to_host(), grad_ref(gy), 1e-6, f"{op} pool backward")


def test_pool_ceil_mode_layers_match_pytorch_sizes(device, rng):
    x = nc.tensor(rng.standard_normal((1, 2, 112, 112)).astype(np.float32), device=device)
    assert nc.nn.MaxPool2d(3, 2, ceil_mode=True)(x).shape == (1, 2, 56, 56)   # GoogLeNet's stem
    assert nc.nn.MaxPool2d(3, 2)(x).shape == (1, 2, 55, 55)
    assert nc.nn.AvgPool2d(2, ceil_mode=True, padding=1)(nc.zeros((1, 1, 5, 5), device=device)).shape == (1, 1, 3, 3)
    assert "ceil_mode=True" in repr(nc.nn.MaxPool2d(3, 2, ceil_mode=True))


# Rows wide enough for the block kernels (at least 8 interior outputs or input cells a row) at odd sizes:
# the last block of a row shifts left and stores part of its lanes, and edge columns remain on both sides.
# (input shape, kernel, stride, padding, padding_end, dilation, ceil_mode)
WIDE_CASES = [
    ((2, 3, 19, 37), (3, 3), (2, 2), (1, 1), None, (1, 1), False),   # ResNet's stem pool
    ((1, 2, 17, 35), (2, 2), (2, 2), (0, 0), None, (1, 1), False),   # disjoint, an uncovered last column
    ((1, 2, 13, 29), (3, 3), (1, 1), (1, 1), None, (1, 1), False),   # stride 1, padded
    ((1, 2, 21, 41), (2, 2), (1, 1), (0, 0), None, (2, 2), False),   # P_{2,2}
    ((1, 2, 21, 53), (3, 2), (2, 3), (1, 0), None, (2, 1), False),   # stride 3: the gathered vector loads
    ((1, 2, 23, 47), (3, 3), (2, 2), (0, 0), None, (1, 1), True),    # ceil_mode
    ((1, 2, 22, 39), (3, 3), (2, 2), (1, 0), (0, 1), (1, 1), False),  # asymmetric pads
    pytest.param((1, 1, 15, 45), (2, 3), (3, 2), (1, 1), None, (2, 1), False, marks=slow),
    pytest.param((1, 1, 12, 40), (2, 2), (4, 4), (0, 0), None, (3, 3), False, marks=slow),
    pytest.param((1, 1, 9, 43), (5, 5), (3, 3), (2, 2), None, (1, 1), False, marks=slow),
]


@pytest.mark.parametrize("shape,k,s,p,p_end,d,ceil", WIDE_CASES)
@pytest.mark.parametrize("op,count_include_pad,relu", [("max", True, False), ("max", True, True),
                                                       ("avg", True, False), ("avg", False, False)])
def test_pool_wide_rows_block_kernels(device, rng, canaries, shape, k, s, p, p_end, d, ceil, op,
                                      count_include_pad, relu):
    x_host = rng.uniform(-2, 2, size=shape).astype(np.float32)
    x = nc.tensor(x_host, device=device, requires_grad=True)
    if op == "max":
        y = F.max_pool2d(x, k, s, p, d, ceil_mode=ceil, padding_end=p_end, fused_relu=relu)
    else:
        y = F.avg_pool2d(x, k, s, p, ceil, count_include_pad, dilation=d, padding_end=p_end)
    source = np.maximum(x_host, 0) if relu else x_host
    y_ref, grad_ref = pool_ref(source, k, s, p, d, op, count_include_pad, ceil, p_end)
    assert y.shape == y_ref.shape
    assert_close(y.to_host(), y_ref, 1e-6, f"{op} pool forward")
    gy = rng.uniform(-2, 2, size=y.shape).astype(np.float32)
    y.backward(nc.tensor(gy, device=device))
    expected = grad_ref(gy) * (x_host > 0) if relu else grad_ref(gy)
    assert_close(x.grad.to_host(), expected, 1e-6, f"{op} pool backward")


def test_max_pool_wide_rows_nan_and_minus_infinity(device, canaries):
    """The block kernels keep the edge kernels' rules: a NaN window outputs NaN, and a window of -inf
    values sends its gradient to its first tap inside the input (padding never wins); without an argmax
    (no graph) the outputs are the same."""
    x = np.full((1, 1, 4, 40), -np.inf, np.float32)
    x[0, 0, 1, 20] = np.nan
    t = nc.tensor(x, device=device, requires_grad=True)
    y = F.max_pool2d(t, 3, 2, 1)
    out = y.to_host()[0, 0]
    nan_windows = np.zeros(out.shape, bool)
    nan_windows[:2, 10] = True  # the windows around (1, 20)
    assert np.isnan(out[nan_windows]).all() and (out[~nan_windows] == -np.inf).all()
    with nc.no_grad():  # no argmax kept: the same outputs
        np.testing.assert_array_equal(F.max_pool2d(t, 3, 2, 1).to_host()[0, 0], out)
    y.backward(nc.tensor(np.ones(y.shape, np.float32), device=device))
    expected = np.zeros((4, 40))
    for oh in range(out.shape[0]):
        for ow in range(out.shape[1]):
            expected[max(2 * oh - 1, 0), max(2 * ow - 1, 0)] += 1
    assert np.array_equal(t.grad.to_host()[0, 0], expected)


@pytest.mark.parametrize("shape,k,s,p,expected", [
    ((2, 3, 8, 8), 2, 2, 0, "disjoint"),      # LeNet's second pooling: rows too narrow for a block
    ((1, 2, 7, 9), 2, 2, 0, "disjoint"),
    ((1, 2, 17, 35), 2, 2, 0, "blocks"),      # a wide disjoint row goes to the block kernel
    ((2, 1, 13, 7), 3, 1, 1, "edges"),        # overlapping and narrow
    ((2, 3, 19, 37), 3, 2, 1, "blocks"),      # ResNet's stem pool
])
def test_pool_backward_path(shape, k, s, p, expected):
    """Which backward kernel a geometry gets (the cases above check each kernel's results): narrow rows of
    disjoint windows scatter a row per work-item instead of gathering one element per work-item."""
    from netcl.ops.pool import backward_path, vector_width
    g = PoolGeometry.make(shape, k, s, p)
    assert backward_path(g, "max", True, vector_width(np.float32))[0] == expected


@pytest.mark.parametrize("relu", [False, True], ids=["plain", "fused_relu"])
def test_max_pool_without_a_graph_writes_no_argmax(device, rng, canaries, relu):
    """Without a recorded graph (no_grad, or an input that needs no gradient) max pooling computes no argmax:
    the same outputs, bit for bit, on the edge and block kernels (ResNet's 3x3/2 stem pooling, padded)."""
    from netcl.ops.pool import pool_forward
    x_host = rng.uniform(-2, 2, size=(2, 3, 19, 37)).astype(np.float32)
    x_host[0, 0, 4, 5] = np.nan
    x = nc.tensor(x_host, device=device)
    g = PoolGeometry.make(x.shape, 3, 2, 1)
    with_arg, arg = pool_forward(x, g, "max", relu=relu)
    without, none = pool_forward(x, g, "max", relu=relu, argmax=False)
    assert arg is not None and none is None
    np.testing.assert_array_equal(without.to_host(), with_arg.to_host())
    y_ref, _ = pool_ref(np.maximum(x_host, 0) if relu else x_host, (3, 3), (2, 2), (1, 1), (1, 1), "max")
    out = without.to_host()
    np.testing.assert_array_equal(np.isnan(out), np.isnan(y_ref))  # the NaN's window, as PyTorch
    assert_close(np.nan_to_num(out), np.nan_to_num(y_ref), 1e-6, "max pool without argmax")
    with nc.no_grad():
        y = F.max_pool2d(nc.tensor(x_host, device=device, requires_grad=True), 3, 2, 1, fused_relu=relu)
    np.testing.assert_array_equal(y.to_host(), with_arg.to_host())
    assert y._grad_node is None
