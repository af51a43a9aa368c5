"""nc.onnx.load: every operator of torchvision's classification exports against onnxruntime on odd sizes,
the shape arithmetic folded at load with a free batch, training and state_dicts of imported models.
Graphs are built with onnx.helper; onnxruntime is the reference (both come with the test extra)."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

import netcl as nc

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import helper, numpy_helper  # noqa: E402

from onnx_graphs import make_model, ort_run  # noqa: E402
from util import rel_l2  # noqa: E402

I64 = np.int64


def check(device, data, feeds, tol=1e-5):
    """netcl's outputs within ``tol`` (relative L2) of onnxruntime's; returns the imported model."""
    expected = ort_run(data, feeds)
    model = nc.onnx.load(data, device=device)
    out = model(**feeds)
    out = out if isinstance(out, tuple) else (out,)
    assert len(out) == len(expected)
    for got, want in zip(out, expected):
        assert got.shape == want.shape
        assert rel_l2(got.to_host(), want) <= tol, f"relative error {rel_l2(got.to_host(), want):.2e}"
    return model


def f32(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def single(op, x_shape, rng, opset=17, inits=None, extra_inputs=(), n_out=1, **attrs):
    """A graph of one node reading x (and constant inputs from ``inits``, name -> array)."""
    inits = inits or {}
    inputs = ["x"] + list(extra_inputs)
    outputs = [f"y{k}" for k in range(n_out)]
    node = helper.make_node(op, inputs, outputs, **attrs)
    return make_model([node], {"x": x_shape}, outputs, inits, opset), {"x": f32(rng, *x_shape)}


# ---- convolution and pooling -----------------------------------------------------------------------------
@pytest.mark.parametrize("opset,attrs,w_shape,x_shape,bias", [
    (13, dict(group=3, dilations=[2, 1], strides=[2, 1], pads=[1, 2, 0, 1]), (9, 2, 3, 3), (2, 6, 11, 13), True),
    (17, dict(auto_pad="SAME_UPPER", strides=[2, 2]), (4, 3, 4, 3), (1, 3, 10, 9), False),
    (19, dict(auto_pad="SAME_LOWER", strides=[2, 2]), (4, 3, 4, 3), (1, 3, 10, 9), True),
    (21, dict(auto_pad="VALID", dilations=[1, 2]), (5, 3, 2, 3), (2, 3, 7, 9), True),
    (15, dict(group=5, pads=[1, 1, 1, 1], strides=[2, 2]), (5, 1, 3, 3), (2, 5, 9, 11), True),   # depthwise
])
def test_conv(device, rng, opset, attrs, w_shape, x_shape, bias):
    inits = {"conv.weight": f32(rng, *w_shape, scale=0.3)}
    inputs = ["x", "conv.weight"]
    if bias:
        inits["conv.bias"] = f32(rng, w_shape[0])
        inputs.append("conv.bias")
    data = make_model([helper.make_node("Conv", inputs, ["y"], **attrs)], {"x": x_shape}, ["y"], inits, opset)
    model = check(device, data, {"x": f32(rng, *x_shape)})
    assert isinstance(model.conv, nc.nn.Conv2d)
    assert set(model.state_dict()) == set(inits)


@pytest.mark.parametrize("op,attrs,x_shape", [
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1), (1, 2, 13, 11)),          # GoogLeNet
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), (2, 3, 9, 10)),      # ResNet
    ("MaxPool", dict(kernel_shape=[2, 3], strides=[2, 2], pads=[0, 1, 1, 1]), (1, 2, 9, 8)),       # asymmetric
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1,
                         count_include_pad=1), (1, 2, 10, 9)),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 0, 0, 1], count_include_pad=0),
     (2, 2, 9, 11)),
    ("AveragePool", dict(kernel_shape=[2, 2], strides=[2, 2]), (1, 3, 9, 7)),                      # DenseNet
    ("GlobalAveragePool", {}, (2, 5, 7, 3)),
    ("GlobalMaxPool", {}, (2, 5, 7, 3)),
])
def test_pooling(device, rng, op, attrs, x_shape):
    data, feeds = single(op, x_shape, rng, **attrs)
    check(device, data, feeds)


def test_batchnorm_eval_and_momentum(device, rng):
    c = 5
    inits = {"bn.weight": rng.uniform(0.5, 1.5, c).astype(np.float32), "bn.bias": f32(rng, c),
             "bn.running_mean": f32(rng, c, scale=0.2), "bn.running_var": rng.uniform(0.5, 2, c).astype(np.float32)}
    node = helper.make_node("BatchNormalization", ["x"] + list(inits), ["y"], epsilon=1e-3, momentum=0.8)
    data = make_model([node], {"x": (3, c, 7, 5)}, ["y"], inits, 15)
    model = check(device, data, {"x": f32(rng, 3, c, 7, 5)})
    bn = model.bn
    assert isinstance(bn, nc.nn.BatchNorm2d) and bn.momentum == pytest.approx(0.2) and bn.eps == pytest.approx(1e-3)
    assert set(model.state_dict()) == set(inits) | {"bn.num_batches_tracked"}


# ---- dense layers -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("attrs,a_shape,b_shape,c_shape,linear", [
    (dict(transB=1), (3, 7), (5, 7), (5,), True),                        # nn.Linear's export
    (dict(transA=1, alpha=0.5, beta=2.0), (7, 3), (7, 5), (3, 5), False),
    (dict(alpha=1.5), (3, 7), (7, 5), (1, 5), False),
])
def test_gemm(device, rng, attrs, a_shape, b_shape, c_shape, linear):
    inits = {"fc.weight": f32(rng, *b_shape), "fc.bias": f32(rng, *c_shape)}
    data = make_model([helper.make_node("Gemm", ["x", "fc.weight", "fc.bias"], ["y"], **attrs)], {"x": a_shape},
                      ["y"], inits, 13)
    model = check(device, data, {"x": f32(rng, *a_shape)})
    assert isinstance(model.fc, nc.nn.Linear) == linear
    assert set(model.state_dict()) == set(inits)


def test_matmul_stored_and_batched(device, rng):
    nodes = [helper.make_node("MatMul", ["x", "proj.weight"], ["h"]), helper.make_node("Add", ["h", "proj.bias"], ["p"]),
             helper.make_node("MatMul", ["p", "z"], ["y"])]
    inits = {"proj.weight": f32(rng, 7, 5), "proj.bias": f32(rng, 5)}
    data = make_model(nodes, {"x": (2, 3, 7), "z": (2, 5, 4)}, ["y"], inits, 17)
    model = check(device, data, {"x": f32(rng, 2, 3, 7), "z": f32(rng, 2, 5, 4)})
    assert set(dict(model.named_parameters())) == set(inits)


# ---- element-wise and activations ---------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
def test_broadcasting_arithmetic(device, rng, op):
    nodes = [helper.make_node(op, ["x", "scale"], ["a"]), helper.make_node(op, ["z", "a"], ["y"])]
    data = make_model(nodes, {"x": (2, 3, 4, 5), "z": (1, 4, 1)}, ["y"], {"scale": rng.uniform(1, 2, (3, 1, 1))
                                                                          .astype(np.float32)}, 14)
    check(device, data, {"x": rng.uniform(1, 2, (2, 3, 4, 5)).astype(np.float32),
                         "z": rng.uniform(1, 2, (1, 4, 1)).astype(np.float32)})


@pytest.mark.parametrize("op,attrs", [
    ("Relu", {}), ("Sigmoid", {}), ("Tanh", {}), ("LeakyRelu", dict(alpha=0.1)),
    ("HardSigmoid", {}), ("HardSigmoid", dict(alpha=1 / 6, beta=0.5)), ("HardSwish", {}),
    ("Softmax", dict(axis=1)), ("Softmax", {}), ("LogSoftmax", dict(axis=-1)), ("Identity", {}), ("Exp", {}),
])
def test_activations(device, rng, op, attrs):
    data, feeds = single(op, (2, 5, 3, 7), rng, opset=14, **attrs)
    feeds["x"] *= 4
    check(device, data, feeds)


@pytest.mark.parametrize("bounds,layer", [((0.0, 6.0), "ReLU6"), ((-1.0, None), "Clip"), ((-0.5, 2.0), "Hardtanh"),
                                          ((0.0, None), "ReLU")])
def test_clip_with_input_bounds(device, rng, bounds, layer):
    inits, inputs = {}, []
    for name, value in zip(("lo", "hi"), bounds):
        inputs.append("" if value is None else name)
        if value is not None:
            inits[name] = np.array(value, np.float32)
    while inputs and not inputs[-1]:
        inputs.pop()
    data, feeds = single("Clip", (3, 4, 5), rng, opset=13, inits=inits, extra_inputs=inputs)
    feeds["x"] *= 5
    model = check(device, data, feeds)
    assert not list(model.state_dict())
    assert any(type(m).__name__ == layer for m in model.modules())


def test_dropout_is_identity_at_inference(device, rng):
    data, feeds = single("Dropout", (3, 11), rng, opset=13, inits={"ratio": np.array(0.3, np.float32)},
                         extra_inputs=["ratio"])
    model = check(device, data, feeds)
    assert any(isinstance(m, nc.nn.Dropout) and m.p == pytest.approx(0.3) for m in model.modules())


# ---- shapes ----------------------------------------------------------------------------------------------
def test_channel_shuffle_reshape_with_symbolic_batch(device, rng):
    """ShuffleNetV2's channel shuffle as torch.onnx.export writes it with a dynamic batch: the target shapes
    come from Shape -> Gather -> Unsqueeze -> Concat and are folded at load."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "i0"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "ax0"], ["n1"]),
        helper.make_node("Concat", ["n1", "groups"], ["shape5"], axis=0),
        helper.make_node("Reshape", ["x", "shape5"], ["r"]),
        helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1, 3, 4]),
        helper.make_node("Concat", ["n1", "flat"], ["shape4"], axis=0),
        helper.make_node("Reshape", ["t", "shape4"], ["u"]),
        helper.make_node("Split", ["u", "halves"], ["a", "b"], axis=1),
        helper.make_node("Relu", ["b"], ["rb"]),
        helper.make_node("Concat", ["a", "rb"], ["v"], axis=1),
        # x.chunk(2, dim=1) as exported: the channel count of the reshaped value, read through Shape
        helper.make_node("Shape", ["u"], ["su"]),
        helper.make_node("Gather", ["su", "i1"], ["channels"], axis=0),
        helper.make_node("Add", ["channels", "one"], ["c1"]),
        helper.make_node("Div", ["c1", "two"], ["half"]),
        helper.make_node("Unsqueeze", ["half", "ax0"], ["half1"]),
        helper.make_node("Slice", ["v", "zero1", "half1", "ax1"], ["lo"]),
        helper.make_node("Slice", ["v", "half1", "end", "ax1"], ["hi"]),
        helper.make_node("Sub", ["lo", "hi"], ["y"]),
    ]
    inits = {"i0": np.array(0, I64), "ax0": np.array([0], I64), "groups": np.array([2, 3, 5, 7], I64),
             "flat": np.array([-1, 5, 7], I64), "halves": np.array([2, 4], I64), "i1": np.array(1, I64),
             "one": np.array(1, I64), "two": np.array(2, I64), "zero1": np.array([0], I64),
             "ax1": np.array([1], I64), "end": np.array([np.iinfo(np.int64).max], I64)}
    data = make_model(nodes, {"x": ("batch", 6, 5, 7)}, ["y"], inits, 13)
    model = check(device, data, {"x": f32(rng, 3, 6, 5, 7)})
    assert model(f32(rng, 1, 6, 5, 7)).shape == (1, 3, 5, 7)   # the batch stays free
    assert not any(type(m).__name__ in ("Shape", "Gather") for m in model.modules())


@pytest.mark.parametrize("opset", [11, 13, 18])
def test_split_reduce_squeeze_across_opsets(device, rng, opset):
    """Split, ReduceMean, Squeeze and Unsqueeze take their sizes and axes as attributes or inputs."""
    if opset >= 18:
        split = helper.make_node("Split", ["x"], ["a", "b", "c"], axis=2, num_outputs=3)
        mean = helper.make_node("ReduceMean", ["a", "axes23"], ["m"], keepdims=0)
    elif opset >= 13:
        split = helper.make_node("Split", ["x", "sizes"], ["a", "b", "c"], axis=2)
        mean = helper.make_node("ReduceMean", ["a"], ["m"], axes=[2, 3], keepdims=0)
    else:
        split = helper.make_node("Split", ["x"], ["a", "b", "c"], axis=2, split=[3, 3, 3])
        mean = helper.make_node("ReduceMean", ["a"], ["m"], axes=[2, 3], keepdims=0)
    if opset >= 13:
        squeezes = [helper.make_node("Unsqueeze", ["m", "ax2"], ["mu"]), helper.make_node("Squeeze", ["mu", "ax2"], ["y0"])]
    else:
        squeezes = [helper.make_node("Unsqueeze", ["m"], ["mu"], axes=[2]), helper.make_node("Squeeze", ["mu"], ["y0"], axes=[2])]
    nodes = [split, mean] + squeezes + [
        helper.make_node("ReduceMean", ["b", "axes23"] if opset >= 18 else ["b"], ["y1"],
                         **({} if opset >= 18 else dict(axes=[2, 3]))),
        helper.make_node("Flatten", ["c"], ["y2"], axis=2)]
    inits = {"sizes": np.array([3, 3, 3], I64), "axes23": np.array([2, 3], I64), "ax2": np.array([2], I64)}
    data = make_model(nodes, {"x": (2, 3, 9, 5)}, ["y0", "y1", "y2"], inits, opset)
    check(device, data, {"x": f32(rng, 2, 3, 9, 5)})


def test_slice_pad_transpose_flatten(device, rng):
    nodes = [
        helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["s"]),
        helper.make_node("Pad", ["s", "pads", "value"], ["p"]),
        helper.make_node("Transpose", ["p"], ["t"], perm=[0, 3, 1, 2]),
        helper.make_node("Flatten", ["t"], ["y"], axis=1),
    ]
    big = np.iinfo(np.int64).max
    inits = {"starts": np.array([1, -6], I64), "ends": np.array([big, 11], I64), "axes": np.array([2, 3], I64),
             "steps": np.array([2, 1], I64), "pads": np.array([0, 1, 2, 0, 0, 0, 1, 3], I64),
             "value": np.array(0.5, np.float32)}
    data = make_model(nodes, {"x": (2, 3, 9, 11)}, ["y"], inits, 13)
    check(device, data, {"x": f32(rng, 2, 3, 9, 11)})


def test_googlenet_transform_input(device, rng):
    """GoogLeNet's transform_input: Gather of single channels at run time, scaled by Constant nodes,
    joined by Concat."""
    nodes = []
    parts = []
    for c in range(3):
        nodes += [helper.make_node("Constant", [], [f"i{c}"], value=numpy_helper.from_array(np.array(c, I64))),
                  helper.make_node("Gather", ["x", f"i{c}"], [f"g{c}"], axis=1),
                  helper.make_node("Unsqueeze", [f"g{c}", "ax1"], [f"u{c}"]),
                  helper.make_node("Constant", [], [f"k{c}"], value_float=0.2 + c / 10),
                  helper.make_node("Mul", [f"u{c}", f"k{c}"], [f"m{c}"]),
                  helper.make_node("Add", [f"m{c}", "shift"], [f"a{c}"])]
        parts.append(f"a{c}")
    nodes.append(helper.make_node("Concat", parts, ["y"], axis=1))
    data = make_model(nodes, {"x": ("n", 3, 5, 7)}, ["y"], {"ax1": np.array([1], I64),
                                                            "shift": np.array(-0.03, np.float32)}, 17)
    check(device, data, {"x": f32(rng, 2, 3, 5, 7)})


# ---- whole networks --------------------------------------------------------------------------------------
def small_cnn(rng, opset=17, classes=4, batch="N"):
    """conv-bn-relu-maxpool, an SE-style gate (GlobalAveragePool, Conv, HardSigmoid, Mul), flatten, Gemm:
    a miniature of the families' exports with PyTorch's initializer names."""
    inits = {
        "features.0.weight": f32(rng, 8, 3, 3, 3, scale=0.3),
        "features.1.weight": rng.uniform(0.5, 1.5, 8).astype(np.float32), "features.1.bias": f32(rng, 8, scale=0.1),
        "features.1.running_mean": f32(rng, 8, scale=0.1),
        "features.1.running_var": rng.uniform(0.5, 1.5, 8).astype(np.float32),
        "se.fc.weight": f32(rng, 8, 8, 1, 1, scale=0.3), "se.fc.bias": f32(rng, 8, scale=0.1),
        "classifier.weight": f32(rng, classes, 8 * 4 * 4, scale=0.1), "classifier.bias": f32(rng, classes, scale=0.1),
    }
    nodes = [
        helper.make_node("Conv", ["x", "features.0.weight"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "features.1.weight", "features.1.bias", "features.1.running_mean",
                                                "features.1.running_var"], ["b"]),
        helper.make_node("Relu", ["b"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1),
        helper.make_node("GlobalAveragePool", ["p"], ["g"]),
        helper.make_node("Conv", ["g", "se.fc.weight", "se.fc.bias"], ["gc"]),
        helper.make_node("HardSigmoid", ["gc"], ["gate"], alpha=1 / 6, beta=0.5),
        helper.make_node("Mul", ["p", "gate"], ["s"]),
        helper.make_node("Flatten", ["s"], ["f"], axis=1),
        helper.make_node("Gemm", ["f", "classifier.weight", "classifier.bias"], ["y"], transB=1),
    ]
    return make_model(nodes, {"x": (batch, 3, 7, 8)}, ["y"], inits, opset), inits


@pytest.mark.parametrize("opset", [11, 13, 16, 19, 21])
def test_small_cnn_across_opsets(device, rng, opset):
    data, inits = small_cnn(rng, opset)
    model = check(device, data, {"x": f32(rng, 3, 3, 7, 8)})
    assert set(model.state_dict()) == set(inits) | {"features.1.num_batches_tracked"}
    assert [name for name, _ in model.conv_layers(5)] == ["features.0", "se.fc"]
    assert model.conv_layers(5)[0][1].n == 5


def test_imported_cnn_trains_and_batchnorm_uses_batch_statistics(device, rng):
    data, _ = small_cnn(rng)
    model = nc.onnx.load(data, device=device)
    bn = model.features._modules["1"]
    assert isinstance(bn, nc.nn.BatchNorm2d) and not model.training
    x = nc.tensor(f32(rng, 8, 3, 7, 8), device=device)
    labels = nc.tensor(rng.integers(0, 4, 8), device=device)
    model.train()
    optimizer = nc.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nc.nn.CrossEntropyLoss()
    mean_before = bn.running_mean.to_host().copy()
    losses = []
    for _ in range(6):
        optimizer.zero_grad()
        loss = loss_fn(model(x), labels)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.item()))
    assert losses[-1] < 0.7 * losses[0], losses
    assert int(bn.num_batches_tracked.item()) == 6
    assert not np.allclose(bn.running_mean.to_host(), mean_before)
    assert all(p.grad is not None for p in model.parameters())


def test_state_dict_round_trip_through_nc_save(device, rng, tmp_path):
    data, inits = small_cnn(rng)
    model = nc.onnx.load(data, device=device)
    state = model.state_dict()
    for key, name in inits.items():
        assert np.array_equal(state[key].to_host(), name)
    changed = {k: (v.to_host() * 1.5 if v.dtype == np.float32 else v.to_host()) for k, v in state.items()}
    nc.save(changed, tmp_path / "imported.ckpt")
    other = nc.onnx.load(data, device=device)
    other.load_state_dict(nc.load(tmp_path / "imported.ckpt"))
    x = f32(rng, 2, 3, 7, 8)
    model.load_state_dict(changed)
    assert np.allclose(model(x).to_host(), other(x).to_host(), rtol=1e-6, atol=1e-6)
    assert not np.allclose(model(x).to_host(), nc.onnx.load(data, device=device)(x).to_host())


def test_fallback_names_for_generated_initializers(device, rng):
    """Exporter-generated initializer names (onnx::Conv_12) become valid module names; the model maps the
    keys back."""
    inits = {"onnx::Conv_12": f32(rng, 4, 3, 3, 3), "onnx::Conv_13": f32(rng, 4)}
    data = make_model([helper.make_node("Conv", ["x", "onnx::Conv_12", "onnx::Conv_13"], ["y"])], {"x": (1, 3, 6, 5)},
                      ["y"], inits, 17)
    model = check(device, data, {"x": f32(rng, 1, 3, 6, 5)})
    assert set(model.initializer_names.values()) == set(inits)
    assert set(model.initializer_names) == set(model.state_dict())


def basic_block(rng, opset=17):
    """ResNet's BasicBlock with a projection shortcut, as exported (initializer names PyTorch's)."""
    inits, nodes = {}, []

    def conv_bn(prefix, x, out, c_in, c_out, k, stride):
        inits[f"{prefix}conv.weight"] = f32(rng, c_out, c_in, k, k, scale=0.3)
        for name, value in (("weight", rng.uniform(0.5, 1.5, c_out)), ("bias", 0.1 * rng.standard_normal(c_out)),
                            ("running_mean", 0.1 * rng.standard_normal(c_out)),
                            ("running_var", rng.uniform(0.5, 1.5, c_out))):
            inits[f"{prefix}bn.{name}"] = value.astype(np.float32)
        nodes.append(helper.make_node("Conv", [x, f"{prefix}conv.weight"], [out + "_c"], pads=[k // 2] * 4,
                                      strides=[stride, stride]))
        nodes.append(helper.make_node("BatchNormalization", [out + "_c"] + [f"{prefix}bn.{n}" for n in
                                      ("weight", "bias", "running_mean", "running_var")], [out]))

    conv_bn("layer.0.", "x", "a", 4, 6, 3, 2)
    nodes.append(helper.make_node("Relu", ["a"], ["ar"]))
    conv_bn("layer.1.", "ar", "b", 6, 6, 3, 1)
    conv_bn("layer.down.", "x", "d", 4, 6, 1, 2)
    nodes += [helper.make_node("Add", ["b", "d"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    return make_model(nodes, {"x": ("N", 4, 9, 11)}, ["y"], inits, opset)


def test_basic_block_fuses_like_netcls_models(device, rng, unfused):
    """Conv + BN + ReLU chains and the residual add run through netcl.nn.fusion: the same values as
    onnxruntime in eval, and the same values and gradients as the unfused steps in training."""
    data = basic_block(rng)
    x = f32(rng, 3, 4, 9, 11)
    model = check(device, data, {"x": x})
    assert sorted(len(g.steps) for g in model._groups) == [2, 7]   # down: conv+bn; conv+bn+relu+conv+bn+add+relu
    results = []
    for fused in (True, False):
        m = nc.onnx.load(data, device=device).train()
        xt = nc.tensor(x, device=device, requires_grad=True)
        with contextlib.nullcontext() if fused else unfused():
            y = m(xt)
            y.backward(nc.tensor(np.linspace(-1, 1, y.size, dtype=np.float32).reshape(y.shape), device=device))
        results.append([y.to_host(), xt.grad.to_host()] + [p.grad.to_host() for p in m.parameters()])
    for a, b in zip(*results):
        assert rel_l2(a, b) < 1e-5


def test_identity_copies_of_initializers_become_weights(device, rng):
    """torch.onnx.export stores equal weights once and writes each copy as an Identity node of it."""
    bias = f32(rng, 4)
    inits = {"a.weight": f32(rng, 4, 3, 1, 1), "a.bias": bias, "b.weight": f32(rng, 4, 4, 3, 3)}
    nodes = [helper.make_node("Identity", ["a.bias"], ["b.bias"]),
             helper.make_node("Conv", ["x", "a.weight", "a.bias"], ["h"]),
             helper.make_node("Conv", ["h", "b.weight", "b.bias"], ["y"], pads=[1, 1, 1, 1])]
    data = make_model(nodes, {"x": (2, 3, 5, 6)}, ["y"], inits, 17)
    model = check(device, data, {"x": f32(rng, 2, 3, 5, 6)})
    state = model.state_dict()
    assert set(state) == set(inits) | {"b.bias"} and np.array_equal(state["b.bias"].to_host(), bias)
    assert state["b.bias"] is not state["a.bias"]


def test_reshape_to_an_expression_of_the_batch_is_evaluated_per_call(device, rng):
    """x.view(2 * n, -1): the target cannot be fixed at load, so it is evaluated from the bound batch."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "i0"], ["n"], axis=0),
             helper.make_node("Mul", ["n", "two"], ["n2"]),
             helper.make_node("Unsqueeze", ["n2", "ax0"], ["n2v"]),
             helper.make_node("Concat", ["n2v", "minus1"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"])]
    inits = {"i0": np.array(0, I64), "two": np.array(2, I64), "ax0": np.array([0], I64),
             "minus1": np.array([-1], I64)}
    data = make_model(nodes, {"x": ("n", 6, 5)}, ["y"], inits, 17)
    model = check(device, data, {"x": f32(rng, 3, 6, 5)})
    assert any(type(m).__name__ == "SymbolicReshape" for m in model.modules())
    assert model(f32(rng, 1, 6, 5)).shape == (2, 15)
