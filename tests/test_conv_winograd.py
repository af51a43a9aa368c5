"""winograd F(2×2,3×3) conv2d strategy: forward and both gradients against float64 (odd and tiny sizes,
so partial border tiles everywhere; channels 1/3/5/17; batch 1; groups; padding 0..4; canaries), the
refusals that name the failed rule, and the exact workspace."""
from __future__ import annotations

import numpy as np
import pytest

import netcl as nc
from netcl.ops.conv2d import conv2d
from netcl.ops.conv_common import ConvLayer
from netcl.ops.conv_registry import strategies
from test_conv_implicit_gemm import check_workspace, strategy_errors

# operands past the GEMM's L1 threshold, so that netcl.ops.gemm allocates packing buffers
PACKED = ((2, 32, 20, 20), (64, 32, 3, 3), 1, 1, 1, 1, "float32")

CASES = [
    ((1, 1, 7, 9), (3, 1, 3, 3), 1, 1, 1, 1, "float32"),
    ((2, 3, 13, 11), (5, 3, 3, 3), 1, 0, 1, 1, "float32"),
    ((1, 5, 15, 13), (17, 5, 3, 3), 1, 2, 1, 1, "float32"),
    ((3, 17, 9, 7), (5, 17, 3, 3), 1, (1, 0), 1, 1, "float32"),
    ((1, 6, 5, 3), (9, 2, 3, 3), 1, 1, 1, 3, "float32"),                    # groups 3
    ((2, 4, 6, 6), (4, 1, 3, 3), 1, 1, 1, 4, "float32"),                    # depthwise
    ((1, 4, 2, 2), (3, 4, 3, 3), 1, 2, 1, 1, "float32"),                    # smaller than one tile
    ((1, 2, 5, 4), (3, 2, 3, 3), 1, 4, 1, 1, "float32"),                    # padding > 2: negative in backward
    ((1, 3, 9, 7), (5, 3, 3, 3), 1, 1, 1, 1, "float64"),
    # 17×16 = 272 tiles per plane: the tile kernels walk planes image-major (CMAJOR = 0), the rest above
    # channel-major; two groups keep the 16 matrices unpadded (matrix_stride)
    ((2, 3, 35, 33), (5, 3, 3, 3), 1, 0, 1, 1, "float32"),
    ((1, 4, 33, 35), (6, 2, 3, 3), 1, 1, 1, 2, "float32"),
    # batches of 4k samples on a CPU device: the whole-plane transforms (plane_lanes), 8 and 4 lanes
    ((8, 3, 7, 9), (5, 3, 3, 3), 1, 1, 1, 1, "float32"),
    ((4, 6, 5, 7), (4, 3, 3, 3), 1, (0, 2), 1, 2, "float32"),
    ((4, 2, 5, 4), (3, 2, 3, 3), 1, 4, 1, 1, "float32"),
    ((12, 5, 6, 5), (3, 5, 3, 3), 1, 1, 1, 1, "float64"),
    # input channels per group a multiple of 8: the forward filter transform's vector kernel
    ((3, 24, 5, 7), (5, 24, 3, 3), 1, 1, 1, 1, "float32"),
    ((2, 16, 6, 5), (6, 8, 3, 3), 1, 1, 1, 2, "float64"),
]


@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
def test_winograd_matches_reference(case, rng, device, canaries):
    forward_tol, grad_tol = (1e-4, 5e-4) if case[-1] == "float32" else (1e-12, 1e-12)
    errors = strategy_errors("winograd", case, rng, device)
    assert errors["forward"] <= forward_tol, errors
    assert errors["grad_input"] <= grad_tol and errors["grad_weight"] <= grad_tol, errors


@pytest.mark.parametrize("weight, kw, rule", [
    ((4, 3, 5, 5), {}, "needs a 3×3 kernel"),
    ((4, 3, 3, 3), {"stride": 2}, "needs stride 1"),
    ((4, 3, 3, 3), {"stride": (1, 2)}, "needs stride 1"),
    ((4, 3, 3, 3), {"dilation": 2}, "needs dilation 1"),
    ((4, 3, 1, 3), {}, "needs a 3×3 kernel"),
])
@pytest.mark.parametrize("name", ["winograd", "winograd4"])
def test_forcing_winograd_where_it_cannot_run_names_the_rule(name, weight, kw, rule, device):
    x = nc.Tensor.from_host(np.ones((1, 3, 11, 11), np.float32), device)
    w = nc.Tensor.from_host(np.ones(weight, np.float32), device)
    with pytest.raises(nc.ShapeError, match=rule) as info:
        conv2d(x, w, strategy=name, **kw)
    assert f"'{name}'" in str(info.value) or f"{name} " in str(info.value)


def test_workspace_formula(device):
    layer = ConvLayer.from_shapes((2, 6, 9, 7), (4, 3, 3, 3), padding=1, groups=2)
    tiles = 2 * 5 * 4
    impl = strategies()["winograd"]
    assert impl.workspace_bytes(layer, "forward") >= 4 * 16 * (4 * 3 + 6 * tiles + 4 * tiles)
    assert impl.workspace_bytes(layer, "backward_weight") >= 4 * 16 * (6 * tiles + 4 * tiles + 4 * 3)


@pytest.mark.parametrize("case", [CASES[2], CASES[4], CASES[7], PACKED],
                         ids=["plain", "grouped", "pad4", "gemm_packs"])
def test_workspace_is_exact(case, device, monkeypatch):
    check_workspace("winograd", case, device, monkeypatch)


def test_transformed_matrices_are_padded_off_cache_set_multiples():
    from netcl.ops.conv_winograd import matrix_stride
    # 512 × 288 floats is a multiple of 4 KiB: padded to an odd number of 64-byte lines
    stride = matrix_stride(512, 288, 1, 4)
    assert stride >= 512 * 288 and stride % 16 == 0 and (stride // 16) % 2 == 1
    assert matrix_stride(512, 288, 2, 4) == 512 * 288  # groups: one uniform batch, no padding
    assert matrix_stride(3, 5, 1, 8) % 8 == 0 and (matrix_stride(3, 5, 1, 8) // 8) % 2 == 1


# 6 samples of 13×11 inputs: with 1 KiB chunks the data passes run a few samples at a time
CHUNKED = ((6, 3, 13, 11), (5, 3, 3, 3), 1, 1, 1, 1, "float32")


@pytest.fixture
def small_chunks(monkeypatch):
    from netcl.ops import conv_winograd
    monkeypatch.setattr(conv_winograd, "CHUNK_BYTES", 1 << 10)


def test_chunks_divide_the_batch_and_only_small_filters_are_chunked(small_chunks):
    from netcl.ops.conv_winograd import CHUNK_MAX_FILTER_BYTES, samples_per_chunk
    assert samples_per_chunk(6, 3, 5, 13, 11, 4) in (1, 2, 3)
    assert samples_per_chunk(7, 3, 5, 13, 11, 4) == 1  # prime batch: single samples
    assert samples_per_chunk(1, 3, 5, 13, 11, 4) == 1
    channels = int((CHUNK_MAX_FILTER_BYTES // 64) ** 0.5) + 1  # U = 16·ch²·4 bytes just past the limit
    assert samples_per_chunk(6, channels, channels, 13, 11, 4) == 6


def test_chunked_passes_match_reference(small_chunks, rng, device, canaries):
    errors = strategy_errors("winograd", CHUNKED, rng, device)
    assert errors["forward"] <= 1e-4, errors
    assert errors["grad_input"] <= 5e-4 and errors["grad_weight"] <= 5e-4, errors


def test_chunked_workspace_is_exact(small_chunks, device, monkeypatch):
    check_workspace("winograd", CHUNKED, device, monkeypatch)


PLANE_CASES = [((8, 5, 7, 7), (6, 5, 3, 3), 1, 0, 1, 1), ((4, 3, 9, 6), (4, 3, 3, 3), 1, (3, 1), 1, 1),
               ((12, 4, 5, 5), (4, 2, 3, 3), 1, 1, 1, 2),
               # 7×6 and 8×7 tiles: the tile rows inside the plane run as a loop in both transforms
               ((4, 3, 13, 11), (5, 3, 3, 3), 1, 1, 1, 1), ((8, 2, 16, 13), (3, 2, 3, 3), 1, (2, 0), 1, 1)]


@pytest.mark.parametrize("case", PLANE_CASES,
                         ids=["lanes8", "lanes4_pad3", "lanes4_grouped", "row_loop", "row_loop_pad2"])
def test_plane_kernels_equal_the_tile_kernels_bit_for_bit(case, rng, device, canaries, monkeypatch):
    """The whole-plane transforms order the tiles differently but compute every element with the same
    operations, and the GEMM's columns are independent: forward and both gradients are identical."""
    from netcl.ops import conv_winograd
    if conv_winograd.plane_lanes(device, case[0][0], 4, 4) == 0:
        pytest.skip(f"{device.describe()} does not use the whole-plane kernels")
    xs, ws, st, pd, dl, g = case
    x = rng.uniform(-1, 1, xs).astype(np.float32)
    w = rng.uniform(-1, 1, ws).astype(np.float32)
    results = []
    for lanes in (conv_winograd.plane_lanes, lambda *args: 0):
        monkeypatch.setattr(conv_winograd, "plane_lanes", lanes)
        X = nc.Tensor.from_host(x, device, requires_grad=True)
        W = nc.Tensor.from_host(w, device, requires_grad=True)
        y = conv2d(X, W, stride=st, padding=pd, dilation=dl, groups=g, strategy="winograd")
        y.backward(nc.Tensor.from_host(np.ones(y.shape, np.float32), device))
        results.append([y.to_host(), X.grad.to_host(), W.grad.to_host()])
    for name, planes, tiles in zip(("forward", "grad input", "grad weight"), *results):
        assert np.array_equal(planes, tiles), name


def test_plane_lanes_rule(device, monkeypatch):
    from netcl.ops.conv_winograd import PLANE_MAX_TILES, plane_lanes
    monkeypatch.setattr(device, "kind", "cpu")
    assert plane_lanes(device, 32, 3, 3) == 8 and plane_lanes(device, 12, 3, 3) == 4
    assert plane_lanes(device, 6, 3, 3) == 0 and plane_lanes(device, 1, 3, 3) == 0
    assert plane_lanes(device, 32, 8, PLANE_MAX_TILES // 8 + 1) == 0
    monkeypatch.setattr(device, "kind", "gpu")
    assert plane_lanes(device, 32, 3, 3) == 0
