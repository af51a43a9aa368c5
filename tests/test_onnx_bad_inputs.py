"""nc.onnx.load and `netcl run`/`netcl plan` on bad input: every case raises nc.OnnxError (or exits with the
CLI's status) carrying the data to act on; nothing crashes and nothing returns a wrong answer."""
from __future__ import annotations

import json

import numpy as np
import pytest

import netcl as nc

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import helper  # noqa: E402

from onnx_graphs import make_model, ort_run  # noqa: E402
from util import rel_l2  # noqa: E402

from netcl.cli.main import main  # noqa: E402


def conv_relu(rng, opset=17, batch="N"):
    inits = {"conv.weight": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
             "conv.bias": rng.standard_normal(4).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "conv.weight", "conv.bias"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    return make_model(nodes, {"x": (batch, 3, 6, 7)}, ["y"], inits, opset, as_bytes=False)


def test_truncated_and_non_onnx_files(device, rng, tmp_path):
    data = conv_relu(rng).SerializeToString()
    for cut in (len(data) // 3, len(data) - 7, 5):
        with pytest.raises(nc.OnnxError) as info:
            nc.onnx.load(data[:cut], device=device)
        assert isinstance(info.value, ValueError) and isinstance(info.value, nc.NetclError)
    for junk in (b"this is not a model at all", bytes(range(256)) * 4, b""):
        with pytest.raises(nc.OnnxError, match="not an ONNX model"):
            nc.onnx.load(junk, device=device)
    npy = tmp_path / "array.onnx"
    np.save(npy, np.zeros(5))
    with pytest.raises(nc.OnnxError, match="array.onnx"):
        nc.onnx.load(tmp_path / "array.onnx.npy", device=device)
    with pytest.raises(nc.OnnxError, match="cannot read"):
        nc.onnx.load(tmp_path / "missing.onnx", device=device)


def test_unsupported_operator_names_node_operator_opset_and_alternatives(device):
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Einsum", ["r", "r"], ["y"], name="mix",
                                                                      equation="ij,ij->ij")]
    data = make_model(nodes, {"x": (2, 3)}, ["y"], {}, 17)
    with pytest.raises(nc.OnnxError) as info:
        nc.onnx.load(data, device=device)
    err = info.value
    assert (err.node, err.op_type, err.opset) == ("mix", "Einsum", 17)
    assert "Einsum" in str(err) and "mix" in str(err) and "opset 17" in str(err) and "Conv" in str(err)
    assert "Conv" in err.details["supported"]
    custom = helper.make_node("Gadget", ["x"], ["y"], domain="com.example")
    model = make_model([custom], {"x": (2, 3)}, ["y"], {}, 17, as_bytes=False)
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    with pytest.raises(nc.OnnxError, match="com.example"):
        nc.onnx.load(model.SerializeToString(), device=device)


@pytest.mark.parametrize("opset", [7, 22])
def test_opset_outside_the_supported_range(device, rng, opset):
    model = conv_relu(rng)
    model.opset_import[0].version = opset
    with pytest.raises(nc.OnnxError, match=f"opset {opset}") as info:
        nc.onnx.load(model.SerializeToString(), device=device)
    assert info.value.opset == opset and info.value.details["supported"] == (nc.onnx.MIN_OPSET, nc.onnx.MAX_OPSET)


def test_initializers_in_external_data_files(device, rng, tmp_path):
    model = conv_relu(rng)
    inline = model.SerializeToString()  # save_model moves the model's tensors out
    path = tmp_path / "model.onnx"
    onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True, location="weights.bin",
                    size_threshold=0)
    x = rng.standard_normal((2, 3, 6, 7)).astype(np.float32)
    expected = ort_run(inline, {"x": x})[0]
    assert rel_l2(nc.onnx.load(path, device=device)(x).to_host(), expected) < 1e-5
    with pytest.raises(nc.OnnxError, match="external file 'weights.bin'"):
        nc.onnx.load(path.read_bytes(), device=device)
    (tmp_path / "weights.bin").write_bytes((tmp_path / "weights.bin").read_bytes()[:100])
    with pytest.raises(nc.OnnxError, match="weights.bin") as info:
        nc.onnx.load(path, device=device)
    assert info.value.details["initializer"] in ("conv.weight", "conv.bias")
    (tmp_path / "weights.bin").unlink()
    with pytest.raises(nc.OnnxError, match="cannot be read"):
        nc.onnx.load(path, device=device)


def test_input_shape_that_contradicts_the_graph(device, rng):
    model = nc.onnx.load(conv_relu(rng).SerializeToString(), device=device)
    for shape in ((2, 3, 7, 7), (3, 6, 7), (2, 4, 6, 7)):
        with pytest.raises(nc.OnnxError, match="the graph declares") as info:
            model(np.zeros(shape, np.float32))
        assert info.value.details["got"] == shape
    assert model(np.zeros((5, 3, 6, 7), np.float32)).shape == (5, 4, 6, 7)  # the symbolic batch is free
    fixed = nc.onnx.load(conv_relu(rng, batch=2).SerializeToString(), device=device)
    with pytest.raises(nc.OnnxError, match="x"):
        fixed(np.zeros((3, 3, 6, 7), np.float32))
    with pytest.raises(nc.OnnxError, match="float32"):
        fixed(nc.tensor(np.zeros((2, 3, 6, 7), np.int32), device=device))
    with pytest.raises(nc.OnnxError, match="no input"):
        fixed(image=np.zeros((2, 3, 6, 7), np.float32))


def test_cycles_dangling_names_and_double_writes(device):
    cycle = [helper.make_node("Relu", ["x", "b"], ["a"], name="first"), helper.make_node("Relu", ["a"], ["b"], name="second"),
             helper.make_node("Relu", ["a"], ["y"])]
    cycle[0] = helper.make_node("Add", ["x", "b"], ["a"], name="first")
    with pytest.raises(nc.OnnxError, match="cycle") as info:
        nc.onnx.load(make_model(cycle, {"x": (2, 3)}, ["y"], {}, 17), device=device)
    assert set(info.value.details["cycle"]) >= {"first", "second"}
    dangling = [helper.make_node("Add", ["x", "nowhere"], ["y"], name="reader")]
    with pytest.raises(nc.OnnxError, match="nowhere") as info:
        nc.onnx.load(make_model(dangling, {"x": (2, 3)}, ["y"], {}, 17), device=device)
    assert info.value.node == "reader" and info.value.details["missing"] == "nowhere"
    with pytest.raises(nc.OnnxError, match="not computed"):
        nc.onnx.load(make_model([helper.make_node("Relu", ["x"], ["r"])], {"x": (2, 3)}, ["y"], {}, 17), device=device)
    twice = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Sigmoid", ["x"], ["y"])]
    with pytest.raises(nc.OnnxError, match="already"):
        nc.onnx.load(make_model(twice, {"x": (2, 3)}, ["y"], {}, 17), device=device)


def test_unfaithful_attributes_are_refused(device, rng):
    """What netcl cannot compute as the graph says is an error, never an approximation."""
    cases = [
        (helper.make_node("Pad", ["x", "pads"], ["y"], mode="reflect"), {"pads": np.array([0, 0, 1, 1, 0, 0, 1, 1])},
         "reflect"),
        (helper.make_node("Slice", ["x", "s", "e", "a", "st"], ["y"]),
         {"s": np.array([-1]), "e": np.array([-100]), "a": np.array([3]), "st": np.array([-1])}, "positive steps"),
        (helper.make_node("MaxPool", ["x"], ["y", "idx"], kernel_shape=[2, 2]), {}, "indices"),
        (helper.make_node("Conv", ["x", "w"], ["y"]), {}, "stored initializer"),
    ]
    for node, inits, needle in cases:
        inputs = {"x": (1, 3, 6, 7)} | ({"w": (4, 3, 3, 3)} if "w" in node.input else {})
        outputs = list(node.output)
        data = make_model([node], inputs, outputs, {k: np.asarray(v, np.int64) for k, v in inits.items()}, 17)
        with pytest.raises(nc.OnnxError, match=needle):
            nc.onnx.load(data, device=device)


def test_damaged_initializer(device, rng):
    model = conv_relu(rng)
    model.graph.initializer[0].raw_data = model.graph.initializer[0].raw_data[:-8]
    with pytest.raises(nc.OnnxError, match="conv.weight"):
        nc.onnx.load(model.SerializeToString(), device=device)


# ---- the commands -----------------------------------------------------------------------------------------
def test_netcl_run_end_to_end(rng, tmp_path, capsys):
    model = conv_relu(rng)
    path = tmp_path / "model.onnx"
    onnx.save_model(model, path)
    x = rng.standard_normal((5, 3, 6, 7)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    code = main(["run", str(path), "--input", str(tmp_path / "x.npy"), "--output", str(tmp_path / "y.npy"),
                 "--batch", "2", "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["output_shape"] == [5, 4, 6, 7] and report["seconds"] > 0 and report["batches"] == 3
    expected = ort_run(model.SerializeToString(), {"x": x})[0]
    assert rel_l2(np.load(tmp_path / "y.npy"), expected) < 1e-5
    assert main(["run", str(path), "--input", str(tmp_path / "missing.npy")]) == 2
    assert main(["run", str(path), "--input", str(tmp_path / "x.npy"), "--batch", "0"]) == 2
    (tmp_path / "broken.onnx").write_bytes(path.read_bytes()[:50])
    assert main(["run", str(tmp_path / "broken.onnx"), "--input", str(tmp_path / "x.npy")]) == 1
    err = capsys.readouterr().err
    assert "OnnxError" in err and "Traceback" not in err
    np.save(tmp_path / "wrong.npy", x[:, :2])
    assert main(["run", str(path), "--input", str(tmp_path / "wrong.npy")]) == 1
    assert main(["run", str(path), "--input", str(tmp_path / "x.npy"), "--device", "no-such-device"]) == 2


def test_netcl_plan_onnx_model(rng, tmp_path, capsys):
    path = tmp_path / "model.onnx"
    onnx.save_model(conv_relu(rng), path)
    assert main(["plan", str(path), "--batch", "3", "--pass", "forward", "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [(e["name"], e["pass"]) for e in report["layers"]] == [("conv", "forward")]
    assert report["layers"][0]["strategy"] and report["layers"][0]["candidates"] and "(3, 3, 6, 7)" in report["layers"][0]["layer"]
    onnx.save_model(conv_relu(rng, batch=2), tmp_path / "fixed.onnx")
    assert main(["plan", str(tmp_path / "fixed.onnx"), "--batch", "3"]) == 2
    assert main(["plan", str(tmp_path / "fixed.onnx"), "--pass", "backward_data"]) == 0
    assert main(["plan", "resnet1000"]) == 2


def test_integer_division_at_run_time_is_refused(device):
    """ONNX's integer Div truncates; netcl's `/` is true division, so the import refuses it at the call."""
    graph = helper.make_graph([helper.make_node("Div", ["a", "b"], ["y"])], "div",
                              [helper.make_tensor_value_info(n, onnx.TensorProto.INT64, [3]) for n in "ab"],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.INT64, None)])
    model = nc.onnx.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString(),
                         device=device)
    with pytest.raises(nc.OnnxError, match="truncates") as info:
        model(np.array([7, -7, 5]), np.array([2, 2, 3]))
    assert info.value.op_type == "Div"
