"""Bad inputs to the core API: each raises the documented nc.*Error with a message naming the problem,
and the device stays usable afterwards."""
import numpy as np
import pytest

import netcl as nc


def f32(*shape):
    return nc.tensor(np.ones(shape, np.float32))


CASES = [
    # (description, callable, error type, text the message must contain)
    ("negative shape", lambda: nc.zeros((2, -1)), nc.ShapeError, "negative"),
    ("shape not ints", lambda: nc.zeros(("a", 2)), nc.ShapeError, "shape"),
    ("unsupported dtype", lambda: nc.zeros(3, dtype=np.complex64), nc.DTypeError, "complex64"),
    ("string array", lambda: nc.tensor(np.array(["a"])), nc.DTypeError, "<U1"),
    ("bad reshape", lambda: f32(2, 3).reshape(4, 2), nc.ShapeError, "(4, 2)"),
    ("two -1 in reshape", lambda: f32(2, 3).reshape(-1, -1), nc.ShapeError, "-1"),
    ("bad permutation", lambda: f32(2, 3).permute(0, 0), nc.ShapeError, "permutation"),
    ("index out of range", lambda: f32(2, 3)[5], nc.ShapeError, "out of bounds"),
    ("too many indices", lambda: f32(2, 3)[0, 0, 0], nc.ShapeError, "too many"),
    ("negative slice step", lambda: f32(4)[::-1], nc.ShapeError, "step"),
    ("fancy index", lambda: f32(4)[[0, 1]], nc.ShapeError, "list"),
    ("broadcast mismatch", lambda: f32(2, 3) + f32(4), nc.ShapeError, "(2, 3) and (4,)"),
    ("matmul mismatch", lambda: f32(2, 3) @ f32(4, 5), nc.ShapeError, "(2, 3) and (4, 5)"),
    ("matmul of a scalar", lambda: f32() @ f32(3), nc.ShapeError, "rank"),
    ("reduce axis out of range", lambda: f32(2, 3).sum(axis=2), nc.ShapeError, "axis 2"),
    ("max of empty", lambda: nc.zeros((0,)).max(), nc.ShapeError, "empty"),
    ("argmax of empty", lambda: nc.zeros((0,)).argmax(), nc.ShapeError, "empty"),
    ("exp of ints", lambda: nc.tensor(np.arange(3)).exp(), nc.DTypeError, "int64"),
    ("grad on ints", lambda: nc.tensor(np.arange(3), requires_grad=True), nc.DTypeError, "int64"),
    ("add a string", lambda: f32(3) + "x", nc.DTypeError, "str"),
    ("item of many", lambda: f32(3).item(), nc.ShapeError, "one element"),
    ("backward gradient shape", lambda: nc.tensor(np.ones(3), requires_grad=True).exp().backward(np.ones(4)),
     nc.ShapeError, "(4,)"),
    ("absurd allocation", lambda: nc.empty((1 << 40,)), nc.DeviceMemoryError, "bytes"),
    ("bad device selector", lambda: nc.set_default_device("definitely-not-a-device"), nc.DeviceError,
     "definitely-not-a-device"),
    ("bad seed", lambda: nc.rand(3, seed=-1), nc.ShapeError, "seed"),
    ("random ints", lambda: nc.rand(3, dtype=np.int32), nc.DTypeError, "int32"),
]


@pytest.mark.parametrize("what,call,error,text", CASES, ids=[c[0] for c in CASES])
def test_bad_input(what, call, error, text):
    with pytest.raises(error) as info:
        call()
    assert isinstance(info.value, nc.NetclError)
    assert text in str(info.value), f"message does not name the problem: {info.value}"
    # the device is still usable
    assert (f32(3) * 2).to_host().tolist() == [2.0, 2.0, 2.0]


def test_out_of_memory_error_carries_sizes():
    with pytest.raises(nc.DeviceMemoryError) as info:
        nc.empty((1 << 40,))
    assert info.value.requested_bytes == 4 << 40
    assert info.value.available_bytes == nc.default_device().max_alloc_bytes
    assert isinstance(info.value, MemoryError)


def test_cli_bad_arguments_exit_2():
    from netcl.cli.main import main
    assert main(["no-such-command"]) == 2
    assert main(["devices", "--bogus-flag"]) == 2
    assert main(["devices"]) == 0
