"""nc.onnx.export: netcl → ONNX → onnxruntime agrees with netcl (LeNet, ResNet-20, every layer's exporter on
odd sizes, a symbolic batch), initializers carry the state_dict's names, and what cannot be exported says
so with nc.OnnxError."""
from __future__ import annotations

import numpy as np
import pytest

import netcl as nc
from netcl import nn
from netcl.onnx.export import Value

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")


def run_onnxruntime(model_proto, x: np.ndarray) -> np.ndarray:
    runtime = ort.InferenceSession(model_proto.SerializeToString(), providers=["CPUExecutionProvider"])
    (y,) = runtime.run(None, {runtime.get_inputs()[0].name: x})
    return y


def netcl_eval(model, x: np.ndarray, device) -> np.ndarray:
    model.eval()
    with nc.no_grad():
        return model(nc.tensor(x, device=device)).to_host()


def assert_agrees(ours, theirs, tolerance, what):
    scale = max(np.abs(ours).max(), 1e-30)
    error = np.abs(np.asarray(theirs, np.float64) - ours).max() / scale
    assert error <= tolerance, f"{what}: max relative error {error:.2e} > {tolerance:.0e}"


def randomize_batchnorm(model, rng) -> None:
    """Running statistics and affine terms away from 1/0, as after training (a fresh BN is the identity)."""
    state = {}
    for path, module in model.named_modules():
        if isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d)):
            prefix = f"{path}." if path else ""
            c = module.num_features
            state[prefix + "running_mean"] = rng.normal(0, 0.2, c).astype(np.float32)
            state[prefix + "running_var"] = rng.uniform(0.5, 1.5, c).astype(np.float32)
            if module.affine:
                state[prefix + "weight"] = rng.uniform(0.5, 1.5, c).astype(np.float32)
                state[prefix + "bias"] = rng.normal(0, 0.2, c).astype(np.float32)
    model.load_state_dict(state, strict=False)


def test_lenet_round_trip_with_a_symbolic_batch(device, rng, tmp_path):
    model = nc.models.lenet(seed=int(rng.integers(1 << 30)), device=device)
    example = rng.standard_normal((3, 1, 28, 28)).astype(np.float32)
    proto = nc.onnx.export(model, nc.tensor(example, device=device), tmp_path / "lenet.onnx")
    assert model.training  # the mode is restored
    onnx.checker.check_model(onnx.load(tmp_path / "lenet.onnx"), full_check=True)
    names = {i.name for i in proto.graph.initializer}
    assert names == set(model.state_dict()), names
    assert proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    for batch in (1, 5):  # neither is the example's batch
        x = rng.standard_normal((batch, 1, 28, 28)).astype(np.float32)
        assert_agrees(netcl_eval(model, x, device), run_onnxruntime(proto, x), 1e-5, f"LeNet batch {batch}")


def test_resnet20_round_trip(device, rng):
    model = nc.models.resnet20(seed=int(rng.integers(1 << 30)), device=device)
    randomize_batchnorm(model, rng)
    proto = nc.onnx.export(model, nc.tensor(rng.standard_normal((2, 3, 32, 32)).astype(np.float32), device=device))
    names = {i.name for i in proto.graph.initializer}
    assert names == {k for k in model.state_dict() if not k.endswith("num_batches_tracked")}
    assert sum(node.op_type == "Add" for node in proto.graph.node) == 9  # one residual add per block
    for batch in (1, 3):
        x = rng.standard_normal((batch, 3, 32, 32)).astype(np.float32)
        assert_agrees(netcl_eval(model, x, device), run_onnxruntime(proto, x), 1e-5, f"ResNet-20 batch {batch}")


def layer_cases():
    return {
        "conv grouped strided dilated": (lambda d: nn.Conv2d(6, 9, (3, 2), stride=(2, 1), padding=(1, 2),
                                                             dilation=(1, 2), groups=3, device=d), (2, 6, 11, 9)),
        "depthwise conv, no bias": (lambda d: nn.Conv2d(5, 5, 3, padding=1, groups=5, bias=False, device=d),
                                    (3, 5, 7, 7)),
        "batchnorm2d": (lambda d: nn.BatchNorm2d(5, eps=1e-3, device=d), (3, 5, 7, 6)),
        "batchnorm2d without affine": (lambda d: nn.BatchNorm2d(5, affine=False, device=d), (2, 5, 3, 3)),
        "batchnorm1d": (lambda d: nn.BatchNorm1d(7, device=d), (3, 7)),
        "linear": (lambda d: nn.Linear(13, 7, device=d), (3, 13)),
        "linear over 3-D": (lambda d: nn.Linear(13, 7, device=d), (3, 5, 13)),
        "linear without bias over 3-D": (lambda d: nn.Linear(13, 7, bias=False, device=d), (2, 5, 13)),
        "maxpool padded dilated": (lambda d: nn.MaxPool2d(3, 2, padding=1, dilation=2), (2, 3, 11, 10)),
        "avgpool without padding counted": (lambda d: nn.AvgPool2d(3, 2, padding=1, count_include_pad=False),
                                            (2, 3, 9, 8)),
        "avgpool": (lambda d: nn.AvgPool2d(2), (2, 3, 9, 8)),
        "maxpool ceil_mode": (lambda d: nn.MaxPool2d(3, 2, ceil_mode=True), (2, 3, 10, 9)),
        "avgpool ceil_mode padded": (lambda d: nn.AvgPool2d(3, 2, padding=1, ceil_mode=True), (2, 3, 10, 9)),
        "maxpool asymmetric padding": (lambda d: nn.MaxPool2d(3, 2, padding=(0, 1), padding_end=(1, 0)),
                                       (2, 3, 10, 9)),
        # ceil_mode's last window would start in the end padding along W (dropped), not along H (kept)
        "avgpool asymmetric padding, ceil_mode": (lambda d: nn.AvgPool2d(2, 2, padding=(1, 0), padding_end=(0, 1),
                                                                         ceil_mode=True, count_include_pad=False),
                                                  (2, 3, 8, 8)),
        "maxpool ceil_mode dropping a window on both axes": (lambda d: nn.MaxPool2d(2, 2, padding=(0, 1),
                                                                                     padding_end=(1, 1), ceil_mode=True),
                                                             (2, 3, 8, 7)),
        "adaptive avgpool 1": (lambda d: nn.AdaptiveAvgPool2d(1), (2, 3, 7, 5)),
        "adaptive avgpool (2, 3)": (lambda d: nn.AdaptiveAvgPool2d((2, 3)), (2, 3, 8, 9)),
        "flatten": (lambda d: nn.Flatten(), (2, 3, 4, 5)),
        "flatten from 2": (lambda d: nn.Flatten(2), (2, 3, 4, 5)),
        "leaky relu": (lambda d: nn.LeakyReLU(0.07), (3, 11)),
        "tanh, sigmoid, relu": (lambda d: nn.Sequential(nn.Tanh(), nn.Sigmoid(), nn.ReLU()), (3, 11)),
        "softmax, log-softmax": (lambda d: nn.Sequential(nn.Softmax(1), nn.LogSoftmax(dim=-1)), (3, 11)),
        "dropout and identity": (lambda d: nn.Sequential(nn.Linear(5, 4, device=d), nn.Dropout(0.5), nn.Identity()),
                                 (3, 5)),
    }


@pytest.mark.parametrize("case", list(layer_cases()))
def test_each_layer_against_onnxruntime(device, rng, case):
    make, shape = layer_cases()[case]
    model = make(device)
    randomize_batchnorm(model, rng)
    x = rng.standard_normal(shape).astype(np.float32)
    proto = nc.onnx.export(model, nc.tensor(x, device=device))
    assert_agrees(netcl_eval(model, x, device), run_onnxruntime(proto, x), 1e-5, case)
    if len(shape) > 1:  # another batch through the symbolic one
        x = rng.standard_normal((shape[0] + 2,) + shape[1:]).astype(np.float32)
        assert_agrees(netcl_eval(model, x, device), run_onnxruntime(proto, x), 1e-5, f"{case}, batch {x.shape[0]}")


ACTIVATIONS = {"ReLU6": {}, "Hardtanh": {"min_val": -0.5, "max_val": 1.5}, "Hardswish": {}, "Hardsigmoid": {},
               "SiLU": {}}


@pytest.mark.parametrize("name", ACTIVATIONS)
@pytest.mark.parametrize("opset", [13, 17])
def test_imagenet_activations(device, rng, name, opset):
    model = getattr(nn, name)(**ACTIVATIONS[name])
    x = (4 * rng.standard_normal((3, 5, 7))).astype(np.float32)
    proto = nc.onnx.export(model, nc.tensor(x, device=device), opset=opset)
    assert all(len(i.dims) == 0 for i in proto.graph.initializer)  # Clip's bounds are scalars
    assert_agrees(netcl_eval(model, x, device), run_onnxruntime(proto, x), 1e-5, f"{name} at opset {opset}")


def test_fixed_batch_and_opsets(device, rng):
    model = nn.Sequential(nn.Conv2d(2, 3, 3, device=device), nn.ReLU(), nn.Flatten(),
                          nn.Linear(3 * 25, 4, device=device))
    x = rng.standard_normal((2, 2, 7, 7)).astype(np.float32)
    for opset, example in ((13, nc.tensor(x, device=device)), (21, x)):  # a host array goes to the model's device
        proto = nc.onnx.export(model, example, opset=opset, dynamic_batch=False)
        assert proto.opset_import[0].version == opset
        assert [d.dim_value for d in proto.graph.output[0].type.tensor_type.shape.dim] == [2, 4]
        assert_agrees(netcl_eval(model, x, device), run_onnxruntime(proto, x), 1e-5, f"opset {opset}")


class Doubler(nn.Module):
    def forward(self, x):
        return x + x


class NamedLayers(nn.Sequential):
    """A Sequential that only names its layers: it exports as a Sequential."""


class ReversedLayers(nn.Sequential):
    """A Sequential whose forward differs: no exporter of its base applies."""

    def forward(self, x):
        for module in reversed(list(self._modules.values())):
            x = module(x)
        return x


def test_subclasses_export_as_their_base_only_when_they_keep_its_forward(device, rng):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    model = NamedLayers(nn.Linear(4, 6, device=device), nn.ReLU6())
    proto = nc.onnx.export(model, nc.tensor(x, device=device))
    assert [node.op_type for node in proto.graph.node] == ["Gemm", "Clip"]
    assert_agrees(netcl_eval(model, x, device), run_onnxruntime(proto, x), 1e-5, "a Sequential subclass")
    with pytest.raises(nc.OnnxError, match="no exporter for ReversedLayers"):
        nc.onnx.export(ReversedLayers(nn.ReLU(), nn.Tanh()), nc.tensor(x, device=device))


def test_what_cannot_be_exported_raises_onnx_error(device, rng):
    x = nc.tensor(rng.standard_normal((2, 3, 6, 6)).astype(np.float32), device=device)
    model = nn.Sequential(nn.ReLU(), nn.Sequential(nn.Identity(), Doubler()))
    with pytest.raises(nc.OnnxError, match=r"no exporter for Doubler at '1\.1'.*supported modules: .*Conv2d") as info:
        nc.onnx.export(model, x)
    assert (info.value.node, info.value.op_type, info.value.opset) == ("1.1", "Doubler", 17)
    assert isinstance(info.value, ValueError)
    with pytest.raises(nc.OnnxError, match="opsets 13 to 21, not 12"):
        nc.onnx.export(nn.ReLU(), x, opset=12)
    with pytest.raises(nc.OnnxError, match="6×6 to 4×4, bins of unequal sizes"):
        nc.onnx.export(nn.AdaptiveAvgPool2d(4), x)
    with pytest.raises(nc.OnnxError, match="no running statistics"):
        nc.onnx.export(nn.BatchNorm2d(3, track_running_stats=False, device=device), x)
    with pytest.raises(nc.OnnxError, match="dilations from opset 19"):
        nc.onnx.export(nn.AvgPool2d(2, dilation=2), x)
    with pytest.raises(nc.OnnxError, match="exports a netcl nn.Module"):
        nc.onnx.export(lambda t: t, x)


def test_a_module_of_ones_own_exports_through_export_onnx(device, rng):
    class Scaled(nn.Module):
        def forward(self, x):
            return x * 3.0

        def export_onnx(self, graph, x, path):
            three = graph.initializer(f"{path}.three", np.array(3.0, np.float32))
            return Value(graph.node("Mul", [x.name, three], path), self(x.tensor))

    x = rng.standard_normal((2, 5)).astype(np.float32)
    model = nn.Sequential(nn.Linear(5, 5, device=device), Scaled())
    proto = nc.onnx.export(model, nc.tensor(x, device=device))
    assert_agrees(netcl_eval(model, x, device), run_onnxruntime(proto, x), 1e-5, "a module's own export_onnx")


@pytest.mark.parametrize("make, shape", [(lambda s, d: nc.models.lenet(seed=s, device=d), (2, 1, 28, 28)),
                                         (lambda s, d: nc.models.resnet8(seed=s, device=d), (2, 3, 16, 16))],
                         ids=["lenet", "resnet8"])
def test_export_then_load_gives_the_model_back(device, rng, tmp_path, make, shape):
    """netcl → ONNX → nc.onnx.load: the same state_dict names and values, the same outputs."""
    model = make(int(rng.integers(1 << 30)), device)
    randomize_batchnorm(model, rng)
    x = rng.standard_normal(shape).astype(np.float32)
    nc.onnx.export(model, nc.tensor(x, device=device), tmp_path / "model.onnx")
    back = nc.onnx.load(tmp_path / "model.onnx", device=device)
    ours, theirs = model.state_dict(), back.state_dict()
    names = {k for k in ours if not k.endswith("num_batches_tracked")}
    assert names <= set(theirs), sorted(names - set(theirs))
    for name in names:
        np.testing.assert_array_equal(theirs[name].to_host(), ours[name].to_host(), err_msg=name)
    x = rng.standard_normal((3,) + shape[1:]).astype(np.float32)  # another batch through the symbolic one
    assert_agrees(netcl_eval(model, x, device), netcl_eval(back, x, device), 1e-6, "loaded back")


@pytest.mark.parametrize("name, size", [("resnet18", 64), ("mobilenet_v2", 64),
                                        pytest.param("resnet50", 96, marks=pytest.mark.slow)])
def test_imagenet_models_round_trip(device, rng, name, size):
    """The models of the real-sizes issue (torchvision's ResNets and MobileNetV2) through onnxruntime at two
    batch sizes; their Bottleneck/BasicBlock residual adds and InvertedResidual skips included."""
    model = getattr(nc.models, name)(seed=int(rng.integers(1 << 30)), device=device)
    randomize_batchnorm(model, rng)
    proto = nc.onnx.export(model, nc.tensor(rng.standard_normal((2, 3, size, size)).astype(np.float32), device=device))
    names = {i.name for i in proto.graph.initializer}
    assert {k for k in model.state_dict() if not k.endswith("num_batches_tracked")} <= names
    for batch in (1, 3):
        x = rng.standard_normal((batch, 3, size, size)).astype(np.float32)
        assert_agrees(netcl_eval(model, x, device), run_onnxruntime(proto, x), 1e-5, f"{name} batch {batch}")


def test_an_imported_model_goes_back_out_with_its_current_weights(device, rng, tmp_path):
    """nc.onnx.load, a few SGD steps in train mode, nc.onnx.export: the graph it came in as, with the
    fine-tuned weights and BatchNorm statistics, which onnxruntime runs as netcl does."""
    model = nc.models.resnet8(seed=int(rng.integers(1 << 30)), device=device)
    randomize_batchnorm(model, rng)
    shape = (2, 3, 12, 12)
    source = nc.onnx.export(model, nc.tensor(rng.standard_normal(shape).astype(np.float32), device=device))
    imported = nc.onnx.load(source.SerializeToString(), device=device)
    before = {k: v.to_host() for k, v in imported.state_dict().items()}
    imported.train()
    optimizer = nc.optim.SGD(imported.parameters(), lr=0.05, momentum=0.9)
    for _ in range(3):
        x = nc.tensor(rng.standard_normal(shape).astype(np.float32), device=device)
        labels = nc.tensor(rng.integers(0, 10, shape[0]), device=device)
        optimizer.zero_grad()
        nc.nn.CrossEntropyLoss()(imported(x), labels).backward()
        optimizer.step()
    changed = [k for k, v in imported.state_dict().items() if not np.array_equal(v.to_host(), before[k])]
    assert any(k.endswith("running_mean") for k in changed) and any(k.endswith("weight") for k in changed)
    proto = nc.onnx.export(imported, None, tmp_path / "tuned.onnx")
    assert [n.op_type for n in proto.graph.node] == [n.op_type for n in source.graph.node]
    assert sorted(t.name for t in proto.graph.initializer) == sorted(t.name for t in source.graph.initializer)
    x = rng.standard_normal((3,) + shape[1:]).astype(np.float32)
    assert_agrees(netcl_eval(imported, x, device), run_onnxruntime(proto, x), 1e-5, "fine-tuned import")
    assert_agrees(netcl_eval(nc.onnx.load(tmp_path / "tuned.onnx", device=device), x, device),
                  netcl_eval(imported, x, device), 1e-6, "exported and loaded again")
