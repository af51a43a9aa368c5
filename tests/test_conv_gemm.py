"""The gemm conv2d strategy on strided 1×1 layers (ResNet's downsample convolutions): the exact workspace
(the subsampled input or input gradient plus GEMM's packing), and the planner's cost terms counting the
gather. Forward and both gradients against float64 are in the strategy sweep (tests/test_conv_strategies)."""
from __future__ import annotations

import pytest

from netcl.ops.conv_common import ConvLayer
from netcl.ops.conv_registry import strategies
from test_conv_implicit_gemm import check_workspace, strategy_errors

# (input NCHW, weight KCRS, stride, padding, dilation, groups, dtype)
STRIDED = [
    ((2, 33, 15, 13), (65, 33, 1, 1), 2, 0, 1, 1, "float32"),   # packs its operands
    ((3, 6, 9, 11), (4, 3, 1, 1), (2, 3), 0, 1, 2, "float32"),
    ((1, 70, 23, 23), (130, 70, 1, 1), 2, 0, 1, 1, "float32"),  # batch 1, wide enough to pack
]


@pytest.mark.parametrize("case", STRIDED, ids=["batch2", "groups", "batch1"])
def test_strided_matches_reference(case, rng, device, canaries):
    errors = strategy_errors("gemm", case, rng, device)
    assert errors["forward"] <= 1e-5, errors
    assert errors["grad_input"] <= 1e-5 and errors["grad_weight"] <= 1e-4, errors


@pytest.mark.parametrize("case", STRIDED, ids=["batch2", "groups", "batch1"])
def test_strided_workspace_is_exact(case, device, monkeypatch):
    check_workspace("gemm", case, device, monkeypatch)
    layer = ConvLayer.from_shapes(*case)
    subsampled = layer.n * layer.c * layer.out_h * layer.out_w * layer.itemsize
    assert all(strategies()["gemm"].workspace_bytes(layer, p) >= subsampled
               for p in ("forward", "backward_data", "backward_weight"))


def test_stride_costs_the_gather(device):
    """The strided layer does the stride-1 layer's products on the subsampled input, plus moving it."""
    gemm = strategies()["gemm"]
    strided = ConvLayer.from_shapes((4, 64, 56, 56), (128, 64, 1, 1), stride=2)
    dense = ConvLayer.from_shapes((4, 64, 28, 28), (128, 64, 1, 1))
    for pass_ in ("forward", "backward_data", "backward_weight"):
        s, d = gemm.cost_terms(strided, pass_, device), gemm.cost_terms(dense, pass_, device)
        assert s.products == d.products
        assert s.bytes_moved > d.bytes_moved and s.launches > d.launches
