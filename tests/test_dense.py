"""netcl.dense: dense score maps equal patch-by-patch scanning, masked gradients equal patch mini-batch
gradients, the original parameters are shared, and bad models fail with a ShapeError naming the layer."""
from __future__ import annotations

import sys

import numpy as np
import pytest

import netcl as nc
from netcl import nn
from netcl.dense.convert import Spatial
from netcl.runtime import kernels as kernels_module
from nn_reference import pool_ref


def max_rel(actual, expected) -> float:
    """max |a − e| over the map divided by max |e| (the issue's exactness measure)."""
    a, e = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert a.shape == e.shape, f"{a.shape} != {e.shape}"
    assert np.all(np.isfinite(a)), "result contains NaN or Inf"
    assert np.any(e != 0), "the reference is all zeros"
    return float(np.abs(a - e).max() / np.abs(e).max())


def assert_dense_matches_scan(model, patch, image, tol=1e-5):
    model.eval()
    dense = nc.dense.convert(model, patch)
    scores = dense(nc.tensor(image)).to_host()
    _, k, h, w = scores.shape
    assert scores.shape[2:] == image.shape[2:]
    ref = nc.dense.scan_patches(model, image, batch_size=16, patch_size=patch).to_host()
    assert ref.shape == (h * w, k)
    assert max_rel(scores[0], ref.T.reshape(k, h, w)) <= tol
    return dense


def figure3(channels=1):
    """Figure 3 of the paper: conv 2×2, pool 2×2/2, conv 2×2, pool 3×3/3, conv 2×2 on 15×15 patches."""
    return nn.Sequential(nn.Conv2d(channels, 1, 2), nn.MaxPool2d(2, 2), nn.Conv2d(1, 1, 2), nn.MaxPool2d(3, 3),
                         nn.Conv2d(1, 1, 2))


def plain_cnn1():
    """Plain CNN₁ of Table 1 (Pinheiro & Collobert's scene labeller): 133×133 patches, 3 channels."""
    return nn.Sequential(nn.Conv2d(3, 50, 6), nn.MaxPool2d(8, 8), nn.Tanh(), nn.Conv2d(50, 50, 3),
                         nn.MaxPool2d(2, 2), nn.Tanh(), nn.Conv2d(50, 32, 7))


def strided_padded(patch, channels=2, classes=3):
    """Conv strides and paddings ≠ 1, padded max and average pooling, a dilated conv, Linear head."""
    body = [nn.Conv2d(channels, 4, 3, stride=2, padding=1), nn.ReLU(), nn.MaxPool2d(3, 2, padding=1),
            nn.Conv2d(4, 5, (2, 3), stride=(1, 2), padding=(0, 2), dilation=(2, 1)), nn.Tanh(),
            nn.AvgPool2d(2, 1, padding=1, count_include_pad=False)]
    with nc.no_grad():
        x = nc.zeros((1, channels) + tuple(patch))
        for layer in body:
            x = layer(x)
    features = int(np.prod(x.shape[1:]))
    return nn.Sequential(*body, nn.Flatten(), nn.Linear(features, 7), nn.ReLU(), nn.Dropout(0.5),
                         nn.Linear(7, classes))


# ---- dilated pooling with stride 1 (issue 8 item 1, used by every converted pooling layer) -----------
@pytest.mark.parametrize("op", ["max", "avg"])
def test_dilated_pool_stride1_matches_numpy(device, rng, canaries, op):
    x = rng.standard_normal((2, 3, 13, 17)).astype(np.float32)
    xt = nc.tensor(x, requires_grad=True)
    layer = nn.MaxPool2d(3, 1, dilation=4) if op == "max" else nn.AvgPool2d(3, 1, dilation=4)
    y = layer(xt)
    # float64 reference with the exact gradient (max routes to the first maximum): finite differences
    # would be wrong wherever fresh random data puts two taps of a window within the step of each other
    y_ref, grad_ref = pool_ref(x, (3, 3), (1, 1), (0, 0), (4, 4), op)
    np.testing.assert_allclose(y.to_host(), y_ref, rtol=1e-6, atol=1e-6)
    g = rng.standard_normal(y.shape).astype(np.float32)
    (y * nc.tensor(g)).sum().backward()
    np.testing.assert_allclose(xt.grad.to_host(), grad_ref(g), rtol=1e-5, atol=1e-5)


# ---- exactness ---------------------------------------------------------------------------------------
def test_figure3_network(device, rng):
    image = rng.standard_normal((1, 1, 5, 5)).astype(np.float32)
    dense = assert_dense_matches_scan(figure3(), 15, image)
    spatial = [s for s in dense.steps if isinstance(s, Spatial)]
    # kernels W1, P2 at d=1, W3 and P4 2-regularly sparse, W5 6-regularly sparse; all strides 1
    assert [s.dense_dilation for s in spatial] == [(1, 1), (1, 1), (2, 2), (2, 2), (6, 6)]
    # Figure 3 sizes: 19×19 padded input, then 18, 17, 15, 11, 5
    sizes = []
    dense(nc.tensor(image), trace=lambda name, maps: sizes.append(next(iter(maps.values())).shape[-1]))
    assert sizes == [19, 18, 17, 15, 11, 5]


def test_figure3_network_larger_than_patch(device, rng):
    assert_dense_matches_scan(figure3(2), 15, rng.standard_normal((1, 2, 19, 23)).astype(np.float32))


def test_plain_cnn1(device, rng):
    image = rng.standard_normal((1, 3, 4, 5)).astype(np.float32)
    dense = assert_dense_matches_scan(plain_cnn1(), 133, image)
    assert nc.dense.infer_patch_size(plain_cnn1()) == (133, 133)
    assert [s.dense_dilation for s in dense.steps if isinstance(s, Spatial)] == [(1, 1), (1, 1), (8, 8), (8, 8),
                                                                                 (16, 16)]


@pytest.mark.parametrize("patch", [(17, 17), (16, 19)])
def test_strided_padded_network(device, rng, patch):
    """Internal padding: each patch pads its own feature maps; odd, even and rectangular patches."""
    image = rng.standard_normal((1, 2, 7, 10)).astype(np.float32)
    assert_dense_matches_scan(strided_padded(patch), patch, image)


def test_patch_definition_even_size(device, rng):
    """The patch around (i, j) starts at (i − ⌊n/2⌋, j − ⌊n/2⌋), zero outside the image."""
    image = rng.standard_normal((2, 5, 6)).astype(np.float32)
    padded = np.pad(image, ((0, 0), (2, 1), (2, 1)))
    pixels = np.array([[0, 0], [4, 5], [2, 3]])
    patches = nc.dense.crop_patches(image, pixels, 4).to_host()
    for (i, j), patch in zip(pixels, patches):
        np.testing.assert_array_equal(patch, padded[:, i:i + 4, j:j + 4])
    # a classifier reading only one input pixel shows where the dense map's patch sits
    picker = nn.Sequential(nn.Conv2d(2, 1, 4, bias=False))
    w = np.zeros((1, 2, 4, 4), np.float32)
    w[0, 1, 2, 2] = 1.0  # the patch's centre pixel (2 = ⌊4/2⌋) of channel 1
    picker[0].weight = nc.tensor(w, requires_grad=True)
    dense = nc.dense.convert(picker, 4)
    np.testing.assert_array_equal(dense(nc.tensor(image[None])).to_host()[0, 0], image[1])


def test_scan_patches_subset_and_batching(device, rng):
    model = figure3(2).eval()
    image = nc.tensor(rng.standard_normal((1, 2, 6, 7)).astype(np.float32))
    dense = nc.dense.convert(model, 15)
    full = dense(image).to_host()[0, 0]
    pixels = np.array([[5, 6], [0, 0], [3, 2]])
    for batch_size in (1, 2, 64):
        got = nc.dense.scan_patches(dense, image, pixels, batch_size=batch_size).to_host()
        assert got.shape == (3, 1)
        assert max_rel(got[:, 0], full[pixels[:, 0], pixels[:, 1]]) <= 1e-5


# ---- masked backward (Section 4.3) -------------------------------------------------------------------
def _grads(model):
    return {name: p.grad.to_host() for name, p in model.named_parameters()}


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_masked_gradients_equal_patch_minibatch(device, rng, reduction):
    patch = (17, 16)
    model = strided_padded(patch).eval()
    dense = nc.dense.convert(model, patch)
    image = rng.standard_normal((1, 2, 7, 9)).astype(np.float32)
    labels = rng.integers(0, 3, (1, 7, 9))
    mask = rng.random((1, 7, 9)) < 0.3
    mask[0, 6, 8] = True
    labels[~mask] = -1  # unlabelled pixels are ignored
    loss = nc.dense.masked_cross_entropy(dense(nc.tensor(image)), labels, mask, reduction)
    loss.backward()
    dense_grads = _grads(model)
    model.zero_grad()
    pixels = np.argwhere(mask[0])
    patch_loss = nn.CrossEntropyLoss(reduction=reduction)(model(nc.dense.crop_patches(image, pixels, patch)),
                                                labels[0][mask[0]])
    patch_loss.backward()
    assert abs(loss.item() - patch_loss.item()) <= 1e-5 * abs(patch_loss.item())
    for name, ref in _grads(model).items():
        assert max_rel(dense_grads[name], ref) <= 1e-4, name


def test_masked_backward_cost_does_not_depend_on_mask(device, rng, monkeypatch):
    # plans fixed for both runs: training's first steps would otherwise time candidate strategies
    monkeypatch.setenv("NETCL_CONV_PLAN_MODE", "heuristic")
    launches = []

    def counting_launch(device, kernel, global_size, local_size, *args, **kw):
        launches.append((kernel.function_name, tuple(global_size)))
        return real_launch(device, kernel, global_size, local_size, *args, **kw)

    real_launch = kernels_module.launch
    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("netcl") and getattr(module, "launch", None) is real_launch:
            monkeypatch.setattr(module, "launch", counting_launch)
    model = figure3().eval()
    dense = nc.dense.convert(model, 15)
    image = nc.tensor(rng.standard_normal((1, 1, 6, 6)).astype(np.float32))
    labels = np.zeros((1, 6, 6), np.int64)
    one_pixel = np.zeros((1, 6, 6), bool)
    one_pixel[0, 1, 1] = True
    runs = []
    # the first run also does first-call work (plans, prepared operands) that no mask changes
    for mask in (np.ones((1, 6, 6), bool), one_pixel, np.ones((1, 6, 6), bool)):
        model.zero_grad()
        launches.clear()
        nc.dense.masked_cross_entropy(dense(image), labels, mask).backward()
        runs.append(list(launches))
    assert runs[1] == runs[2] and len(runs[1]) > 10


# ---- parameter sharing -------------------------------------------------------------------------------
def test_dense_model_trains_the_original_parameters(device, rng):
    patch = (9, 9)
    model = nn.Sequential(nn.Conv2d(1, 3, 3, stride=2), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 4 * 4, 2)).eval()
    dense = nc.dense.convert(model, patch)
    assert [id(p) for p in dense.parameters()] == [id(p) for p in model.parameters()]
    assert list(dense.state_dict()) == list(model.state_dict())
    linear = [s for s in dense.steps if isinstance(s, Spatial)][-1]
    assert linear.weight().buffer is model[3].weight.buffer  # a view: the Linear's own buffer
    image = rng.standard_normal((1, 1, 5, 6)).astype(np.float32)
    before = nc.dense.scan_patches(model, image, patch_size=patch).to_host()
    opt = nc.optim.SGD(dense.parameters(), lr=0.5)
    loss = nc.dense.masked_cross_entropy(dense(nc.tensor(image)), np.ones((1, 5, 6), np.int64))
    loss.backward()
    opt.step()
    after_patch = nc.dense.scan_patches(model, image, patch_size=patch).to_host()
    assert np.abs(after_patch - before).max() > 1e-3  # the original model moved
    after_dense = dense(nc.tensor(image)).to_host()[0]
    assert max_rel(after_dense, after_patch.T.reshape(2, 5, 6)) <= 1e-5


# ---- errors ------------------------------------------------------------------------------------------
class Custom(nn.Module):
    def forward(self, x):
        return x


@pytest.mark.parametrize("layers,patch,match", [
    ([nn.Conv2d(1, 2, 3), Custom(), nn.Conv2d(2, 1, 3)], 5, r"'1' \(Custom\)"),
    ([nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(18, 4), nn.Conv2d(4, 1, 1)], 5, r"'3' \(Conv2d\)"),
    ([nn.Conv2d(1, 2, 3), nn.Linear(3, 4)], 5, r"'1' \(Linear\).*Flatten"),
    ([nn.Conv2d(1, 2, 3), nn.MaxPool2d(2)], 9, r"3×3 map"),
    ([nn.Conv2d(1, 2, 3), nn.Conv2d(2, 1, 5)], 5, r"'1' \(Conv2d\).*patch size is too small"),
    ([nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(17, 4)], 5, r"'2' \(Linear\) expects 17"),
    ([nn.Conv2d(1, 2, 3), nn.Conv2d(3, 1, 3)], 5, r"'1' \(Conv2d\) expects 3 input channels"),
])
def test_unconvertible_models_raise_shape_error(device, layers, patch, match):
    with pytest.raises(nc.ShapeError, match=match):
        nc.dense.convert(nn.Sequential(*layers), patch)


def test_bad_inputs(device, rng):
    dense = nc.dense.convert(figure3(), 15)
    with pytest.raises(nc.ShapeError, match="expects an"):
        dense(nc.zeros((1, 2, 5, 5)))
    scores = dense(nc.zeros((1, 1, 4, 4)))
    with pytest.raises(nc.ShapeError, match="selects no pixel"):
        nc.dense.masked_cross_entropy(scores, np.zeros((1, 4, 4), np.int64), np.zeros((1, 4, 4), bool))
    with pytest.raises(nc.ClassIndexError, match=r"class index 3 at position 0 is out of range for 1 classes") as info:
        nc.dense.masked_cross_entropy(scores, np.full((1, 4, 4), 3), None)
    assert (info.value.index, info.value.num_classes, info.value.position) == (3, 1, 0)
    labels, mask = np.zeros((1, 4, 4), np.int64), np.ones((1, 4, 4), bool)
    labels[0, 2, 1], labels[0, 3, 3], mask[0, 3, 3] = -5, 7, False  # an unselected pixel may hold anything
    with pytest.raises(nc.ClassIndexError, match="class index -5 at position 9"):
        nc.dense.masked_cross_entropy(scores, labels, mask)
    with pytest.raises(nc.ShapeError, match="target must be integer labels"):
        nc.dense.masked_cross_entropy(scores, np.zeros((4, 4), np.int64))
    with pytest.raises(nc.ShapeError, match="pixels must lie"):
        nc.dense.scan_patches(dense, rng.standard_normal((1, 4, 4)).astype(np.float32), [[4, 0]])
    with pytest.raises(nc.ShapeError, match="batch_size"):
        nc.dense.scan_patches(dense, np.zeros((1, 4, 4), np.float32), batch_size=0)
