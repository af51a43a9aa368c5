"""implicit_gemm conv2d strategy: forward and both gradients against the float64 references (odd sizes,
channels 1/3/5/17, batch 1, strides, padding, dilation, groups, canaries), tile variants, and the exact
workspace (0 bytes: nothing but the result is allocated).

The helpers here (strategy_errors, allocated_bytes) are shared with the winograd and mec tests."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

import netcl as nc
from netcl.ops import conv_implicit_gemm
from netcl.ops import gemm as gemm_module
from netcl.ops.conv2d import conv2d
from netcl.ops.conv_common import ConvLayer
from netcl.ops.conv_registry import strategies
from netcl.runtime import memory
from util import assert_close, conv2d_grads_ref, conv2d_ref, rel_l2


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def strategy_errors(name, case, rng, device) -> dict:
    """conv2d forced to ``name`` (through autograd) against float64 NumPy on fresh data: the relative L2
    error of the output and of both gradients, keyed "forward", "grad_input", "grad_weight"."""
    xs, ws, st, pd, dl, g, dt = case
    if dt == "float64" and not device.has_fp64:
        pytest.skip(f"{device.describe()} has no float64")
    layer = ConvLayer.from_shapes(xs, ws, st, pd, dl, g, dt)
    for pass_ in ("forward", "backward_data", "backward_weight"):
        assert strategies()[name].why_not(layer, pass_) is None, f"{name} refuses {pass_} of {layer.describe()}"
    x = rng.uniform(-1, 1, xs).astype(dt)
    w = rng.uniform(-1, 1, ws).astype(dt)
    gy = rng.uniform(-1, 1, layer.output_shape).astype(dt)
    X = nc.Tensor.from_host(x, device, requires_grad=True)
    W = nc.Tensor.from_host(w, device, requires_grad=True)
    y = conv2d(X, W, stride=st, padding=pd, dilation=dl, groups=g, strategy=name)
    args = (_pair(st), _pair(pd), _pair(dl), g)
    assert y.shape == layer.output_shape
    forward = rel_l2(y.to_host(), conv2d_ref(x, w, *args))
    y.backward(nc.Tensor.from_host(gy, device))
    gx_ref, gw_ref = conv2d_grads_ref(x, w, gy, *args)
    return {"forward": forward, "grad_input": rel_l2(X.grad.to_host(), gx_ref),
            "grad_weight": rel_l2(W.grad.to_host(), gw_ref)}


@contextlib.contextmanager
def allocated_bytes(monkeypatch):
    """Collects the size of every device allocation made inside the block (Tensor.empty and any
    buffer an op allocates directly) into the yielded list."""
    sizes = []
    real = memory.allocate

    def counting(device, nbytes):
        sizes.append(int(nbytes))
        return real(device, nbytes)

    monkeypatch.setattr(memory, "allocate", counting)
    try:
        yield sizes
    finally:
        monkeypatch.setattr(memory, "allocate", real)


def check_workspace(name, case, device, monkeypatch, passes=("forward", "backward_data", "backward_weight"),
                    call=None):
    """Each pass allocates exactly workspace_bytes besides its result. Every pass runs once first (to build
    its kernels); the measured run starts from an empty GEMM packing cache, whose buffers count."""
    xs, ws, st, pd, dl, g, dt = case
    layer = ConvLayer.from_shapes(xs, ws, st, pd, dl, g, dt)
    impl = strategies()[name]
    x = nc.Tensor.from_host(np.ones(xs, dt), device)
    w = nc.Tensor.from_host(np.ones(ws, dt), device)
    gy = nc.Tensor.from_host(np.ones(layer.output_shape, dt), device)
    run = call or {
        "forward": lambda: impl.forward(x, w, layer),
        "backward_data": lambda: impl.backward_data(gy, w, layer),
        "backward_weight": lambda: impl.backward_weight(x, gy, layer),
    }.__getitem__
    for pass_ in passes:
        run(pass_)()  # build the kernels first
        device.synchronize()
        gemm_module.release_workspaces(device)
        with allocated_bytes(monkeypatch) as sizes:
            out = run(pass_)()
            device.synchronize()
        extra = sum(sizes) - out.nbytes
        assert extra == impl.workspace_bytes(layer, pass_), (
            f"{name} {pass_}: allocated {sizes} (result {out.nbytes} bytes) but workspace_bytes says "
            f"{impl.workspace_bytes(layer, pass_)}")


# (input NCHW, weight KCRS, stride, padding, dilation, groups, dtype)
CASES = [
    ((1, 1, 7, 9), (3, 1, 3, 3), 1, 1, 1, 1, "float32"),
    ((2, 3, 13, 11), (5, 3, 5, 5), 2, 2, 1, 1, "float32"),
    ((1, 5, 15, 13), (17, 5, 3, 3), 1, 0, 2, 1, "float32"),
    ((3, 17, 9, 7), (5, 17, 1, 1), 1, 0, 1, 1, "float32"),
    ((1, 6, 11, 9), (9, 2, 3, 3), (2, 1), (1, 0), 1, 3, "float32"),
    ((2, 5, 8, 7), (5, 1, 3, 3), 1, 1, 1, 5, "float32"),                    # depthwise
    ((1, 3, 33, 31), (17, 3, 7, 7), 3, 3, (1, 2), 1, "float32"),
    ((1, 3, 9, 7), (5, 3, 3, 3), 1, 1, 1, 1, "float64"),
]


@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
def test_implicit_gemm_matches_reference(case, rng, device, canaries):
    errors = strategy_errors("implicit_gemm", case, rng, device)
    assert errors["forward"] <= 1e-5, errors
    assert errors["grad_input"] <= 1e-4 and errors["grad_weight"] <= 1e-4, errors


@pytest.mark.parametrize("tile", [(4, 4, 4), (8, 8, 8)])
@pytest.mark.parametrize("pass_", ["forward", "backward_data", "backward_weight"])
def test_every_tile_variant(tile, pass_, rng, device, canaries):
    """Tiles that do not divide the problem (partial tiles in every dimension) stay exact."""
    layer = ConvLayer.from_shapes((2, 5, 11, 9), (7, 5, 3, 3), stride=2, padding=1)
    x = rng.uniform(-1, 1, layer.input_shape).astype(np.float32)
    w = rng.uniform(-1, 1, layer.weight_shape).astype(np.float32)
    gy = rng.uniform(-1, 1, layer.output_shape).astype(np.float32)
    X, W, GY = (nc.Tensor.from_host(a, device) for a in (x, w, gy))
    gx_ref, gw_ref = conv2d_grads_ref(x, w, gy, (2, 2), (1, 1))
    a, b, shape, ref = {"forward": (W, X, layer.output_shape, conv2d_ref(x, w, (2, 2), (1, 1))),
                        "backward_data": (W, GY, layer.input_shape, gx_ref),
                        "backward_weight": (GY, X, layer.weight_shape, gw_ref)}[pass_]
    out = conv_implicit_gemm.run_pass(pass_, a, b, nc.Tensor.empty(shape, np.float32, device), layer, tile)
    assert_close(out.to_host(), ref, 1e-5, f"{pass_} with tile {tile}")


@pytest.mark.parametrize("case", [CASES[1], CASES[4]], ids=["strided", "grouped"])
def test_workspace_is_zero_and_exact(case, device, monkeypatch):
    check_workspace("implicit_gemm", case, device, monkeypatch)
    layer = ConvLayer.from_shapes(*case)
    assert all(strategies()["implicit_gemm"].workspace_bytes(layer, p) == 0
               for p in ("forward", "backward_data", "backward_weight"))


@pytest.mark.parametrize("spec", [
    ((2, 3, 13, 7), (5, 3, 3, 3), 1, 1, 1),   # one class, every tap
    ((1, 4, 28, 28), (8, 4, 1, 1), 2, 0, 1),  # 1x1 at stride 2: three of four classes have no tap
    ((1, 2, 17, 31), (4, 2, 7, 5), 2, 3, 1),  # a 7x5 kernel at stride 2 with padding
    ((1, 2, 15, 13), (2, 2, 3, 3), 3, 1, 2),  # stride 3, dilation 2
])
def test_backward_data_cost_counts_the_taps_each_residue_class_runs(spec):
    """The flops priced for backward_data are the multiply-adds its kernel does: per input position, the
    taps whose output index the stride divides (counted here position by position), not every tap."""
    x_shape, w_shape, stride, pad, dil = spec
    layer = ConvLayer.from_shapes(x_shape, w_shape, stride=stride, padding=pad, dilation=dil)
    taps_h = sum((h + pad - r * dil) % stride == 0 for h in range(layer.h) for r in range(layer.r))
    taps_w = sum((w + pad - s * dil) % stride == 0 for w in range(layer.w) for s in range(layer.s))
    expected = 2.0 * layer.n * layer.c * layer.k * taps_h * taps_w
    assert conv_implicit_gemm.useful_flops(layer, "backward_data") == expected
    rows, cols, inner = conv_implicit_gemm.gemm_dims(layer, "backward_data")
    classes = conv_implicit_gemm.residue_classes(layer)
    assert len(classes) == stride * stride and sum(p for p, _ in classes) == layer.h * layer.w
    assert (rows, cols, inner) == (layer.c, layer.n * max(p for p, _ in classes), layer.k * max(t for _, t in classes))
    if stride == 1:
        assert expected == layer.flops * layer.h * layer.w / (layer.out_h * layer.out_w)


def test_gathering_is_priced_per_row_tile():
    """Each row tile gathers its columns' whole inner dimension: a layer with one input channel gathers
    as much for backward_data as one with sixteen (both fit one row tile), so its multiply-adds are not
    the whole cost; a layer with more rows than a tile gathers once per tile."""
    one = ConvLayer.from_shapes((2, 1, 12, 12), (8, 1, 3, 3))
    sixteen = ConvLayer.from_shapes((2, 16, 12, 12), (8, 16, 3, 3))
    gathered = conv_implicit_gemm.gathered_bytes
    assert gathered(one, "backward_data") == gathered(sixteen, "backward_data") > 0
    flops = conv_implicit_gemm.useful_flops
    assert flops(sixteen, "backward_data") == 16 * flops(one, "backward_data")
    wide = ConvLayer.from_shapes((1, 4, 9, 9), (600, 4, 3, 3))
    tiles = -(-600 // conv_implicit_gemm.choose_tile(wide, "forward")[0])
    rows, cols, inner = conv_implicit_gemm.gemm_dims(wide, "forward")
    assert tiles > 1 and gathered(wide, "forward") == tiles * cols * inner * wide.itemsize


def test_row_tile_follows_rows_and_fills_the_device():
    """The row tile holds every row up to ROW_TILES[-1] (each further tile gathers B again); a tile above
    SPLIT_ROW_TILE is halved while the launch has fewer work-groups than the device has compute units."""
    deep = ConvLayer.from_shapes((1, 512, 7, 7), (512, 512, 3, 3), padding=1)  # 512 rows, 4 column tiles
    assert conv_implicit_gemm.choose_tile(deep, "forward")[0] == 512
    assert conv_implicit_gemm.choose_tile(deep, "forward", units=2)[0] == 512
    assert conv_implicit_gemm.choose_tile(deep, "forward", units=8)[0] == 256  # 8 groups, not 4
    assert conv_implicit_gemm.choose_tile(deep, "forward", units=132)[0] == conv_implicit_gemm.SPLIT_ROW_TILE
    wider = ConvLayer.from_shapes((1, 64, 7, 7), (2048, 64, 1, 1))  # 2048 rows: four tiles of the largest
    assert conv_implicit_gemm.choose_tile(wider, "forward", units=2)[0] == conv_implicit_gemm.ROW_TILES[-1]
    small = ConvLayer.from_shapes((1, 8, 7, 7), (24, 8, 3, 3))
    assert conv_implicit_gemm.choose_tile(small, "forward", units=132)[0] == 32
    # the cost model prices the gathering of the tiles that run
    assert conv_implicit_gemm.gathered_bytes(deep, "forward", 8) == 2 * conv_implicit_gemm.gathered_bytes(deep, "forward", 2)
